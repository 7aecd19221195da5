"""How an idempotent producer numbers a partition's batches after one failed for good
(``Producer._fail`` and ``Producer._settle``): a sequence that may be in the log is never
given to another batch; the partition renumbers under a new epoch instead, unless an
acknowledgement of a later sequence shows the failed batch is in the log, or every failed
batch was refused before any append and none left may have been written.

Found from outside: a batch appended, then expired while waiting for its retry, was reported
"not sent", and its sequence went to the next batch: the leader took that one for a retry
and answered with the first batch's offset, so its record was reported written and was
nowhere in the log. And a batch refused NOT_ENOUGH_REPLICAS kept its sequence, so every
later batch of the partition was refused OUT_OF_ORDER_SEQUENCE.

The producer here reaches no node (nothing is sent): the answers are handed to it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future

import pyarrow as pa
import pytest

from strom import Producer
from strom.api import common_pb2, storage_pb2
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.futures import BatchResult, FutureRecordMetadata
from strom.client.produce_answers import _Shipment
from strom.client.transactions import TxnPhase
from strom.errors import (
    InconsistentTopicIdError,
    MessageTooLargeError,
    NotEnoughReplicasError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    StromError,
)
from strom.log import Log, LogConfig, ProducerStateError
from strom.record import InvalidBatchError
from tests.unit.test_log import T0, make_log, read_all

NOWHERE = "127.0.0.1:1"
PID = 7


@pytest.fixture
def producer() -> Iterator[Producer]:
    p = Producer(NOWHERE, delivery_timeout_ms=5000, retries=0)
    p._producer_id, p._producer_epoch = PID, 0
    try:
        yield p
    finally:
        p.close(timeout=1)


def _queue() -> PartitionQueue:
    pq = PartitionQueue("t", 0)
    pq.producer_id, pq.producer_epoch = PID, 0
    return pq


def _batch(pq: PartitionQueue, seq: int = -1, *, maybe: bool = False) -> ProducerBatch:
    """A one-record batch queued on ``pq``; with ``seq``, sent before with that sequence."""
    b = ProducerBatch("t", 0, pa.table({"value": pa.array([b"v%d" % seq], pa.binary())}))
    pq.add_closed(b)
    b.base_sequence = seq
    b.maybe_written = maybe
    if seq >= 0:
        b.attempts = 1
        pq.next_sequence = seq + 1
    return b


def _fail(p: Producer, pq: PartitionQueue, b: ProducerBatch, err: Exception) -> Exception:
    """Fail ``b`` as the sender would (it was in flight); returns what its record raised."""
    b.sent = True
    pq.in_flight += 1
    p._fail(pq, [b], err)  # type: ignore[arg-type]
    with pytest.raises(type(err) if not b.maybe_written else RequestTimedOutError) as failed:
        FutureRecordMetadata(b.result, 0).result(timeout=1)
    return failed.value


def _settle(p: Producer, pq: PartitionQueue) -> bool:
    with p._lock:
        return p._settle(pq)


def test_a_batch_that_may_be_in_the_log_fails_so_and_the_next_one_gets_a_new_epoch(
    producer: Producer,
) -> None:
    pq = _queue()
    a = _batch(pq, 1, maybe=True)  # appended, answer lost or NOT_ENOUGH_REPLICAS_AFTER_APPEND
    b = _batch(pq)  # never sent
    err = _fail(producer, pq, a, RequestTimedOutError("t-0: not acknowledged in time"))
    assert "may have been written" in str(err)

    assert not _settle(producer, pq)  # sequence 1 is not given to b: a new epoch first
    assert producer._bump_wanted and b.base_sequence == -1
    producer._producer_epoch = 1  # what the bump (InitProducerId with id 7, epoch 0) gives
    assert _settle(producer, pq)
    assert (pq.producer_id, pq.producer_epoch, b.base_sequence, pq.next_sequence) == (
        PID,
        1,
        0,
        1,
    )
    assert not pq.unresolved


def test_a_later_acknowledgement_shows_the_failed_batch_is_in_the_log(
    producer: Producer,
) -> None:
    pq = _queue()
    a = _batch(pq, 1, maybe=True)
    b = _batch(pq, 2)
    _fail(producer, pq, a, RequestTimedOutError("t-0: not acknowledged in time"))
    assert pq.unresolved
    producer._acked(pq, [b])  # the leader appends sequence 2 only after 1
    assert not pq.unresolved and pq.reseq_from is None
    assert (pq.producer_epoch, b.base_sequence) == (0, 2)


def test_a_batch_that_may_be_in_the_log_is_resent_as_it_was(producer: Producer) -> None:
    pq = _queue()
    a = _batch(pq, 1, maybe=True)
    c = _batch(pq, 2, maybe=True)  # timed out too, waiting for its retry
    _fail(producer, pq, a, RequestTimedOutError("t-0: not acknowledged in time"))
    assert _settle(producer, pq)  # c goes again unchanged: its answer settles both
    assert (pq.producer_epoch, c.base_sequence) == (0, 2) and not producer._bump_wanted


def test_a_batch_refused_before_append_gives_its_sequence_to_the_next(
    producer: Producer,
) -> None:
    pq = _queue()
    a = _batch(pq, 1)
    b = _batch(pq)
    a.sent = True
    pq.in_flight += 1
    producer._retry(pq, [a], NotEnoughReplicasError("t-0: ISR [1]"), time.monotonic())
    with pytest.raises(NotEnoughReplicasError):
        FutureRecordMetadata(a.result, 0).result(timeout=1)
    assert _settle(producer, pq)
    assert (pq.producer_epoch, b.base_sequence) == (0, 1) and not producer._bump_wanted


def test_a_refused_batch_with_a_later_one_that_may_be_in_the_log_needs_a_new_epoch(
    producer: Producer,
) -> None:
    pq = _queue()
    a = _batch(pq, 1)
    c = _batch(pq, 2, maybe=True)  # a stale copy of it may still reach the leader
    _fail(producer, pq, a, NotEnoughReplicasError("t-0: ISR [1]"))
    # Given sequence 1, c could be appended twice (its stale copy as 2 right behind it).
    assert not _settle(producer, pq) and producer._bump_wanted
    producer._producer_epoch = 1
    assert _settle(producer, pq)
    assert (pq.producer_epoch, c.base_sequence, c.maybe_written) == (1, 0, False)


def _refused_out_of_order(p: Producer, pq: PartitionQueue, b: ProducerBatch, seq: int) -> None:
    """Send ``b`` with ``seq`` (as the sender's drain would) and have the leader refuse it
    OUT_OF_ORDER_SEQUENCE."""
    b.base_sequence = seq
    _answered(p, pq, b, common_pb2.ErrorCode.OUT_OF_ORDER_SEQUENCE, "expected sequence 1")


def test_a_transactional_producer_goes_on_only_if_the_failed_batch_is_in_the_log() -> None:
    p = Producer(NOWHERE, transactional_id="seq-txn", delivery_timeout_ms=5000)
    try:
        assert p._txn is not None
        p._producer_id, p._producer_epoch = PID, 0
        p._txn.phase = TxnPhase.IN_TRANSACTION
        pq = _queue()
        a = _batch(pq, 1, maybe=True)
        b = _batch(pq)
        c = _batch(pq)
        _fail(p, pq, a, RequestTimedOutError("t-0: not acknowledged in time"))
        assert p._txn.phase is TxnPhase.ABORTABLE_ERROR
        assert p._txn.epoch_bump_required  # (the abort gets a new epoch: KIP-360)
        # It cannot bump (its coordinator owns the epoch): b goes with the next sequence,
        # which the leader takes only if a is in the log.
        assert _settle(p, pq) and not p._bump_wanted and b.base_sequence == -1
        _refused_out_of_order(p, pq, b, 2)
        with pytest.raises(OutOfOrderSequenceError):
            FutureRecordMetadata(b.result, 0).result(timeout=1)
        assert not _settle(p, pq) and not p._bump_wanted
        p._fail_epoch_victims()
        with pytest.raises(OutOfOrderSequenceError, match="call abort_transaction"):
            FutureRecordMetadata(c.result, 0).result(timeout=1)
        # The abort's new epoch (TransactionManager.bump_epoch) numbers the partition from 0.
        p._queues[("t", 0)] = pq
        p._adopt(PID, 1)
        assert (pq.producer_epoch, pq.next_sequence, pq.unresolved) == (1, 0, False)
        d = _batch(pq)
        assert _settle(p, pq) and d.base_sequence == -1  # (numbered from 0 when first sent)
    finally:
        p._txn.phase = TxnPhase.READY  # type: ignore[union-attr]
        p.close(timeout=1)


def test_an_oldest_batch_refused_for_a_gap_fails_and_the_partition_goes_on(
    producer: Producer,
) -> None:
    """The leader lacks what came before our oldest batch (records lost in an unclean
    election): that batch fails, and the partition renumbers under a new epoch instead of
    handing the refused sequence on to be refused again, batch after batch."""
    pq = _queue()
    pq.next_sequence = 3
    b = _batch(pq)
    c = _batch(pq)
    producer._in_flight["leader"] = 1
    _refused_out_of_order(producer, pq, b, 3)
    with pytest.raises(OutOfOrderSequenceError):
        FutureRecordMetadata(b.result, 0).result(timeout=1)
    assert not _settle(producer, pq) and producer._bump_wanted
    producer._producer_epoch = 1
    assert _settle(producer, pq)
    assert (pq.producer_epoch, c.base_sequence, pq.next_sequence) == (1, 0, 1)


def _answered(
    p: Producer,
    pq: PartitionQueue,
    b: ProducerBatch,
    code: int,
    message: str = "",
    base_offset: int = 0,
) -> None:
    """Send ``b`` (as the sender's drain would) and have the leader answer ``code``."""
    b.sent = True
    pq.in_flight += 1
    p._in_flight["leader"] = 1
    answer: Future[storage_pb2.ProduceResponse] = Future()
    answer.set_result(
        storage_pb2.ProduceResponse(
            topics=[
                storage_pb2.ProduceTopicResponse(
                    topic="t",
                    partitions=[
                        storage_pb2.ProducePartitionResponse(
                            partition=0,
                            error_code=code,
                            error_message=message,
                            base_offset=base_offset,
                        )
                    ],
                )
            ]
        )
    )
    p._complete("leader", [_Shipment(pq, [b], -1, False)], answer, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "maybe"),
    [
        # The node gives these only from its checks before the append.
        ("UNKNOWN_TOPIC_OR_PARTITION", False),
        ("FENCED_LEADER_EPOCH", False),
        ("UNKNOWN_LEADER_EPOCH", False),
        ("LEADER_NOT_AVAILABLE", False),
        ("REPLICA_NOT_AVAILABLE", False),
        ("NOT_ENOUGH_REPLICAS", False),
        # These may follow an append (leadership moved while the records waited for the ISR).
        ("NOT_LEADER_OR_FOLLOWER", True),
        ("REQUEST_TIMED_OUT", True),
        ("NOT_ENOUGH_REPLICAS_AFTER_APPEND", True),
    ],
)
def test_only_answers_given_after_an_append_leave_a_batch_maybe_written(
    code: str, maybe: bool
) -> None:
    """FIX (found from outside): records for a partition of a deleted topic, answered
    UNKNOWN_TOPIC_OR_PARTITION at every attempt, failed as "may have been written" and had
    the partition renumbered under a new epoch, though nothing had been appended."""
    p = Producer(NOWHERE, delivery_timeout_ms=5000, retries=1)
    p._producer_id, p._producer_epoch = PID, 0
    try:
        pq = _queue()
        b = _batch(pq, 1)
        b.attempts = 0
        _answered(p, pq, b, common_pb2.ErrorCode.Value(code))  # retried
        assert b.maybe_written is maybe and not b.result.done
        _answered(p, pq, b, common_pb2.ErrorCode.Value(code))  # retries used up: fails
        with pytest.raises(StromError) as failed:
            FutureRecordMetadata(b.result, 0).result(timeout=1)
        assert ("may have been written" in str(failed.value)) is maybe
        assert pq.unresolved is maybe
    finally:
        p.close(timeout=1)


def test_a_refusal_for_another_topic_id_fails_only_batches_made_for_a_replaced_topic() -> None:
    """INCONSISTENT_TOPIC_ID appends nothing. Batches made for the id our metadata still has
    are retried (our metadata or the leader's view lags a delete and re-create: the refresh
    tells which); once our metadata has the topic's new id, they fail as not written."""
    p = Producer(NOWHERE, delivery_timeout_ms=5000, retries=5)
    p._producer_id, p._producer_epoch = PID, 0
    try:
        p._metadata._topic_ids["t"] = "id-old"
        pq = _queue()
        b = _batch(pq, 1)
        b.attempts, b.topic_id = 0, "id-old"
        _answered(p, pq, b, common_pb2.ErrorCode.INCONSISTENT_TOPIC_ID)
        assert not b.result.done and not b.maybe_written and pq.retrying
        p._metadata._topic_ids["t"] = "id-new"  # the refresh: the topic was re-created
        _answered(p, pq, b, common_pb2.ErrorCode.INCONSISTENT_TOPIC_ID)
        with pytest.raises(InconsistentTopicIdError, match="not written: the topic was deleted"):
            FutureRecordMetadata(b.result, 0).result(timeout=1)
        assert not pq.unresolved and not pq.batches
    finally:
        p.close(timeout=1)


# -- a batch refused MESSAGE_TOO_LARGE after an attempt that may have written it ------------
# Found from outside: lowering max.message.bytes while a leader failed over failed whole
# batches of records that each fit ("may have been written", RequestTimedOutError) because
# a batch an earlier attempt may have written was never split.


def _records(
    pq: PartitionQueue, seq: int, n: int, *, maybe: bool = True, pad: bytes = b""
) -> ProducerBatch:
    """A closed batch of ``n`` records (as send() fills), sent before with ``seq``."""
    b = ProducerBatch("t", 0)
    b.values = [b"r%d" % i + pad for i in range(n)]
    b.keys = [None] * n
    b.timestamps.extend([float(T0)] * n)
    b.result = BatchResult("t", 0, b.timestamps)
    b.count, b.size, b.limit, b.closed = n, 100 * n, 100 * n, True
    pq.add_closed(b)
    b.base_sequence, b.attempts, b.maybe_written = seq, 1, maybe
    pq.next_sequence = seq + n
    return b


def _failure(b: ProducerBatch, index: int) -> BaseException:
    with pytest.raises(StromError) as failed:
        FutureRecordMetadata(b.result, index).result(timeout=1)
    return failed.value


_TOO_LARGE = common_pb2.ErrorCode.MESSAGE_TOO_LARGE
_OUT_OF_ORDER = common_pb2.ErrorCode.OUT_OF_ORDER_SEQUENCE


def test_a_batch_that_may_be_in_the_log_is_split_keeping_its_sequences(
    producer: Producer,
) -> None:
    """Idempotent: split, the halves take its sequences and stay "may have been written".
    If the whole batch is in the log after all, the leader refuses each half
    OUT_OF_ORDER_SEQUENCE (strom.log: no half repeats a batch it remembers), and their
    records fail saying so, with the refusal's class: nothing timed out."""
    pq = _queue()
    b = _records(pq, 4, 4)
    _answered(producer, pq, b, _TOO_LARGE, "t-0: batch at byte 0 is 9000 bytes, more than ...")
    first, second = pq.batches
    assert [(h.base_sequence, h.count, h.maybe_written) for h in (first, second)] == [
        (4, 2, True),
        (6, 2, True),
    ]
    assert not b.result.done and pq.retrying
    pq.retrying = False  # what the sender's next pass does as it sends the first half
    _answered(producer, pq, first, _OUT_OF_ORDER, "t-0: expected sequence 8, got 4..5")
    err = _failure(first, 0)
    assert isinstance(err, OutOfOrderSequenceError) and "may have been written" in str(err)
    assert pq.unresolved and list(pq.batches) == [second] and not b.result.done
    assert _settle(producer, pq)  # the second half goes again as it was: it may be in the log
    assert (second.base_sequence, second.maybe_written, producer._bump_wanted) == (6, True, False)
    pq.retrying = False
    _answered(producer, pq, second, _OUT_OF_ORDER, "t-0: expected sequence 8, got 6..7")
    assert isinstance(_failure(b, 3), OutOfOrderSequenceError)
    assert "may have been written" in str(_failure(b, 3))


def test_halves_of_a_batch_that_was_not_written_are_acknowledged(producer: Producer) -> None:
    pq = _queue()
    b = _records(pq, 4, 4)
    _answered(producer, pq, b, _TOO_LARGE, "t-0: too large")
    first, second = pq.batches
    pq.retrying = False
    _answered(producer, pq, first, common_pb2.ErrorCode.NONE)
    _answered(producer, pq, second, common_pb2.ErrorCode.NONE)
    assert b.result.done and b.result.error is None and not pq.batches


def test_without_idempotence_a_batch_that_may_be_in_the_log_is_not_split() -> None:
    """Without sequences a half could be appended beside the whole batch: it fails, as the
    leader's refusal (MessageTooLargeError), saying it may have been written."""
    p = Producer(NOWHERE, delivery_timeout_ms=5000, retries=0, enable_idempotence=False)
    try:
        pq = PartitionQueue("t", 0)
        b = _records(pq, -1, 4)
        _answered(p, pq, b, _TOO_LARGE, "t-0: batch at byte 0 is 9000 bytes, more than ...")
        err = _failure(b, 0)
        assert isinstance(err, MessageTooLargeError) and not isinstance(err, RequestTimedOutError)
        assert "9000 bytes" in str(err) and "may have been written" in str(err)
        assert not pq.batches
    finally:
        p.close(timeout=1)


def test_a_single_record_that_may_be_in_the_log_fails_as_too_large(producer: Producer) -> None:
    """One record cannot be split: it fails with the leader's MESSAGE_TOO_LARGE, saying an
    earlier attempt may have written it (was RequestTimedOutError "no answer settled")."""
    pq = _queue()
    b = _records(pq, 4, 1)
    _answered(producer, pq, b, _TOO_LARGE, "t-0: batch at byte 0 is 9000 bytes, more than ...")
    err = _failure(b, 0)
    assert isinstance(err, MessageTooLargeError) and not err.retriable
    assert "9000 bytes" in str(err) and "may have been written" in str(err)


def _leader(p: Producer, pq: PartitionQueue, log: Log, b: ProducerBatch) -> int:
    """Send ``b`` as the producer encodes it to a real partition log as its leader, and hand
    the log's answer back to the producer; returns the answer's code."""
    code, message, offset = common_pb2.ErrorCode.NONE, "", -1
    try:
        data = b.encode("none", pq.producer_id, pq.producer_epoch, b.base_sequence)
        offset = log.append(data).first_offset
    except ProducerStateError as exc:
        code, message = common_pb2.ErrorCode.Value(exc.reason), f"t-0: {exc.message}"
    except InvalidBatchError as exc:
        code, message = (
            _TOO_LARGE if exc.too_large else common_pb2.ErrorCode.CORRUPT_MESSAGE,
            str(exc),
        )
    pq.retrying = False  # (the sender's pass that sends it)
    _answered(p, pq, b, code, message, offset)
    return code


def test_halves_meeting_a_log_that_holds_the_whole_batch_write_nothing_twice(
    producer: Producer, tmp_path
) -> None:
    """The producer's halves against the node's own checks: the whole batch was appended
    (by an attempt whose answer was lost), then refused MESSAGE_TOO_LARGE by a leader
    without it; the halves meet a log holding it (leadership moved back): each is refused
    OUT_OF_ORDER_SEQUENCE, nothing is appended, and the records fail saying they may have
    been written."""
    log = make_log(tmp_path / "t-0")
    pq = _queue()
    b = _records(pq, 0, 4, pad=bytes(500))
    whole = b.encode("none", PID, 0, 0)
    log.append(whole)  # the earlier attempt, its answer lost
    limit = len(whole) - 500  # a half fits, the whole batch does not
    log.update_config(LogConfig.from_dict({"max.message.bytes": limit}))
    _answered(producer, pq, b, _TOO_LARGE, f"t-0: batch at byte 0 is {len(whole)} bytes, ...")
    first, second = pq.batches
    assert _leader(producer, pq, log, first) == _OUT_OF_ORDER
    assert _settle(producer, pq)  # the second half may be in the log too: sent as it was
    assert _leader(producer, pq, log, second) == _OUT_OF_ORDER
    assert [r.value[:2] for r in read_all(log)] == [b"r0", b"r1", b"r2", b"r3"]
    for index in range(4):
        err = _failure(b, index)
        assert isinstance(err, OutOfOrderSequenceError) and "may have been written" in str(err)


def test_halves_meeting_a_log_without_the_batch_are_written_in_order(
    producer: Producer, tmp_path
) -> None:
    """The same split against a log that never got the batch (the attempt's leader died
    before its followers copied it): the halves are appended in sequence, once each, and
    every record is acknowledged at its offset."""
    log = make_log(tmp_path / "t-0")
    pq = _queue()
    b = _records(pq, 0, 4, pad=bytes(500))
    whole = b.encode("none", PID, 0, 0)
    log.update_config(LogConfig.from_dict({"max.message.bytes": len(whole) - 500}))
    assert _leader(producer, pq, log, b) == _TOO_LARGE
    first, second = pq.batches
    assert _leader(producer, pq, log, first) == common_pb2.ErrorCode.NONE
    assert _leader(producer, pq, log, second) == common_pb2.ErrorCode.NONE
    assert [r.value[:2] for r in read_all(log)] == [b"r0", b"r1", b"r2", b"r3"]
    offsets = [FutureRecordMetadata(b.result, i).result(timeout=1).offset for i in range(4)]
    assert offsets == [0, 1, 2, 3] and not pq.batches and not pq.unresolved
