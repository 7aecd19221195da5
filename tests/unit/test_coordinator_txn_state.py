"""The transaction coordinator's state machine (strom.coordinator.txn_state), alone: every
move of a transactional id, fencing by epoch, and replay of its records."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from strom.coordinator.offsets_log import GroupRecord, encode_group_batch
from strom.coordinator.txn_state import (
    MAX_EPOCH,
    TxnMetadata,
    TxnShardState,
    TxnState,
    check_epoch,
    check_txn_offsets,
    decode_txn_log_key,
    init_producer_id,
    txn_log_key,
)
from strom.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)

ids = itertools.count(100)


def fresh(tid: str = "tx", timeout_ms: int = 60_000) -> TxnMetadata:
    return init_producer_id(None, tid, timeout_ms, 0, lambda: next(ids)).metadata


def test_a_transaction_from_init_to_commit() -> None:
    m = fresh()
    assert (m.state, m.producer_epoch) == (TxnState.EMPTY, 0)
    pid = m.producer_id
    m1 = m.add(pid, 0, 10, partitions=[("t", 0), ("t", 1)])
    assert m1 is not None and m1.state is TxnState.ONGOING and m1.start_ms == 10
    assert m1.add(pid, 0, 11, partitions=[("t", 0)]) is None  # nothing new: no write
    m2 = m1.add(pid, 0, 12, groups=["g"])
    assert m2 is not None and m2.groups == {"g"} and m2.start_ms == 10
    m3 = m2.end(pid, 0, True, 13)
    assert m3 is not None and m3.state is TxnState.PREPARE_COMMIT
    assert m3.end(pid, 0, True, 14) is None  # a retried EndTxn
    with pytest.raises(InvalidTxnStateError):
        m3.end(pid, 0, False, 14)  # abort after commit was decided
    with pytest.raises(ConcurrentTransactionsError):
        m3.add(pid, 0, 14, partitions=[("t", 2)])
    m4 = m3.complete(15)
    assert m4.state is TxnState.COMPLETE_COMMIT and not m4.partitions and m4.start_ms == -1
    assert m4.end(pid, 0, True, 16) is None  # retry after completion
    # The next transaction starts from an empty set.
    m5 = m4.add(pid, 0, 20, partitions=[("u", 0)])
    assert m5 is not None and m5.partitions == {("u", 0)} and m5.start_ms == 20


def test_fencing_by_epoch_and_producer_id() -> None:
    m = fresh()
    pid = m.producer_id
    again = init_producer_id(m, "tx", 60_000, 5, lambda: next(ids)).metadata
    assert (again.producer_id, again.producer_epoch) == (pid, 1)
    with pytest.raises(ProducerFencedError):
        again.add(pid, 0, 6, partitions=[("t", 0)])
    with pytest.raises(InvalidProducerIdMappingError):
        again.add(pid + 1, 1, 6, partitions=[("t", 0)])
    # Past the 16-bit epoch space the id is replaced.
    last = TxnMetadata("tx", pid, MAX_EPOCH, 60_000)
    nxt = init_producer_id(last, "tx", 60_000, 7, lambda: 999).metadata
    assert (nxt.producer_id, nxt.producer_epoch) == (999, 0)


def test_a_new_instance_aborts_the_open_transaction_first() -> None:
    m = fresh()
    pid = m.producer_id
    open_ = m.add(pid, 0, 1, partitions=[("t", 0)])
    assert open_ is not None
    r = init_producer_id(open_, "tx", 60_000, 2, lambda: next(ids))
    assert r.retry_later and r.metadata.state is TxnState.PREPARE_ABORT
    assert r.metadata.producer_epoch == 1 and r.metadata.partitions == {("t", 0)}
    with pytest.raises(ConcurrentTransactionsError):
        init_producer_id(r.metadata, "tx", 60_000, 3, lambda: next(ids))
    done = r.metadata.complete(4)
    fresh_epoch = init_producer_id(done, "tx", 60_000, 5, lambda: next(ids)).metadata
    assert fresh_epoch.producer_epoch == 2 and fresh_epoch.state is TxnState.EMPTY
    # The old instance (epoch 0) learns why it is fenced.
    with pytest.raises(ProducerFencedError, match="new producer instance"):
        r.metadata.end(pid, 0, True, 6)


def test_timeouts_and_bad_requests() -> None:
    with pytest.raises(InvalidTransactionTimeoutError):
        fresh(timeout_ms=0)
    m = fresh(timeout_ms=100)
    pid = m.producer_id
    open_ = m.add(pid, 0, 1000, partitions=[("t", 0)])
    assert open_ is not None and not open_.expired(1100) and open_.expired(1101)
    aborted = open_.abort_fencing(1101, "transaction.timeout.ms passed")
    assert aborted.producer_epoch == 1 and aborted.state is TxnState.PREPARE_ABORT
    with pytest.raises(InvalidTxnStateError):
        m.end(pid, 0, True, 5)  # commit with nothing open
    assert m.end(pid, 0, False, 5) is None  # abort with nothing open: nothing to do


def test_the_producer_a_timeout_abort_fenced_takes_its_id_back() -> None:
    """Kafka's KIP-588: after the coordinator aborted a transaction for its timeout (and
    bumped the epoch), that producer's requests are INVALID_PRODUCER_EPOCH (abortable,
    saying why), not PRODUCER_FENCED, and InitProducerId with its id and old epoch gives it
    a new epoch, while no other instance has initialised the id since; the mark survives a
    reload of the log."""
    m = fresh(timeout_ms=100)
    pid = m.producer_id
    open_ = m.add(pid, 0, 1000, partitions=[("t", 0)])
    assert open_ is not None
    aborted = open_.abort_fencing(1101, "timeout", timed_out=True)
    assert (aborted.producer_epoch, aborted.timed_out_epoch) == (1, 0)
    done = aborted.complete(1102)
    assert TxnMetadata.from_value("tx", done.to_value()).timed_out_epoch == 0
    assert TxnMetadata.from_value("tx", m.to_value()).timed_out_epoch is None
    for call in (
        lambda: done.end(pid, 0, True, 1103),
        lambda: done.add(pid, 0, 1103, partitions=[("t", 1)]),
    ):
        with pytest.raises(InvalidProducerEpochError, match=r"transaction\.timeout\.ms=100"):
            call()

    def take_back(current: TxnMetadata, epoch: int) -> TxnMetadata:
        r = init_producer_id(current, "tx", 100, 1104, lambda: next(ids), expected=(pid, epoch))
        assert not r.retry_later
        return r.metadata

    back = take_back(done, 0)
    assert (back.producer_id, back.producer_epoch, back.timed_out_epoch) == (pid, 2, None)
    assert back.state is TxnState.EMPTY
    # Once only: the same request again (its answer lost) gets the same answer, no new bump.
    assert take_back(back, 0) is back
    # A new instance after it: the retry is fenced.
    with pytest.raises(ProducerFencedError, match="epoch 3 took over"):
        take_back(init_producer_id(back, "tx", 100, 1104, lambda: next(ids)).metadata, 0)
    with pytest.raises(InvalidProducerIdMappingError):
        take_back(replace(done, producer_id=pid + 1), 0)
    # A new instance initialised the id after the timeout: the old producer is fenced.
    newer = init_producer_id(done, "tx", 100, 1105, lambda: next(ids)).metadata
    assert (newer.producer_epoch, newer.timed_out_epoch) == (2, None)
    with pytest.raises(ProducerFencedError):
        take_back(newer, 0)
    with pytest.raises(ProducerFencedError):
        newer.end(pid, 0, False, 1106)
    # Fenced by a new instance, not a timeout: no way back either.
    by_instance = init_producer_id(open_, "tx", 100, 1107, lambda: next(ids)).metadata
    assert by_instance.timed_out_epoch is None
    with pytest.raises(ProducerFencedError):
        take_back(by_instance.complete(1108), 0)
    # The current producer may bump its own epoch (its open transaction is aborted first).
    r = init_producer_id(open_, "tx", 100, 1109, lambda: next(ids), expected=(pid, 0))
    assert r.retry_later and r.metadata.producer_epoch == 1


def test_a_retried_take_back_gets_the_same_epoch_until_the_epoch_moves_on() -> None:
    """Found from outside: when the answer to the InitProducerId that takes the id back
    (KIP-588) was lost, the producer's retry of it (same id and epoch) was PRODUCER_FENCED,
    and the producer was lost for good. As Kafka's lastProducerEpoch rule: the retry gets
    the same answer (on a coordinator that loaded the log too), requests of that epoch stay
    INVALID_PRODUCER_EPOCH (abortable), and once the epoch moves on the retry is fenced."""
    m = fresh(timeout_ms=100)
    pid = m.producer_id
    open_ = m.add(pid, 0, 1000, partitions=[("t", 0)])
    assert open_ is not None
    done = open_.abort_fencing(1101, "timeout", timed_out=True).complete(1102)

    def take_back(current: TxnMetadata, epoch: int = 0) -> TxnMetadata:
        r = init_producer_id(current, "tx", 100, 1104, lambda: next(ids), expected=(pid, epoch))
        assert not r.retry_later
        return r.metadata

    back = take_back(done)
    assert (back.producer_epoch, back.granted_from_epoch) == (2, 0)
    reloaded = TxnMetadata.from_value("tx", back.to_value())
    assert reloaded.granted_from_epoch == 0
    assert take_back(reloaded) == reloaded  # the retry: the same epoch, nothing written
    # The lost answer's epoch is still this producer's: its abort probe is abortable.
    with pytest.raises(InvalidProducerEpochError, match="gave it epoch 2 already"):
        back.end(pid, 0, False, 1105)
    # The producer went on under epoch 2: a late retry changes nothing of its transaction.
    going = back.add(pid, 2, 1106, partitions=[("t", 0)])
    assert going is not None and take_back(going) is going
    # The epoch moved on (a timeout abort, a new instance): the retry is fenced.
    aborted = going.abort_fencing(1300, "timeout", timed_out=True)
    assert aborted.granted_from_epoch is None
    with pytest.raises(ProducerFencedError):
        take_back(aborted.complete(1301))
    newer = init_producer_id(back, "tx", 100, 1107, lambda: next(ids)).metadata
    assert newer.granted_from_epoch is None
    with pytest.raises(ProducerFencedError):
        take_back(newer)
    # A take-back from the current epoch is retried alike (it asked from epoch 2).
    again = take_back(back, 2)
    assert (again.producer_epoch, again.granted_from_epoch) == (3, 2)
    assert take_back(again, 2) is again


def test_a_loader_counts_times_ahead_of_its_clock_from_the_load() -> None:
    """A transaction whose start lies ahead of the loading coordinator's clock (the previous
    owner's clock ran ahead) times out its timeout after the load, not after the clocks meet;
    times behind the clock stay (an old transaction is still old)."""
    m = fresh(timeout_ms=100)
    pid = m.producer_id
    ahead = m.add(pid, 0, 600_000, partitions=[("t", 0)])
    assert ahead is not None
    loaded = ahead.seen_at(1000)
    assert (loaded.start_ms, loaded.last_update_ms) == (1000, 1000)
    assert not loaded.expired(1100) and loaded.expired(1101)
    assert not ahead.expired(1101)  # what the unclamped start would have done: wait 10 minutes
    behind = m.add(pid, 0, 500, partitions=[("t", 0)])
    assert behind is not None and behind.seen_at(1000) is behind and behind.expired(1000)


def test_a_loader_reads_a_slewing_writers_start_through_the_wall_clock() -> None:
    """The previous owner's wall clock had just been stepped 7 minutes forward: its steady
    clock (strom.clock.steady_ms, which the start is written with) trails its wall clock by
    7 minutes, slewing. A new owner with an unslewed clock used to read the transaction,
    begun 10 s before, as 7 minutes old and abort it at once; the batch time (the writer's
    wall clock) tells the skew, and the start is read on the loader's clock."""
    wall = 1_700_000_000_000
    writer_steady = wall - 420_000
    m = fresh("slewed", timeout_ms=60_000)
    begun = m.add(m.producer_id, 0, writer_steady, partitions=[("t", 0)])
    assert begun is not None
    state = TxnShardState()
    batch = encode_group_batch([GroupRecord(txn_log_key("slewed"), begun.to_value())], now_ms=wall)
    state.apply_batches(batch)
    loader_now = wall + 10_000  # the loader's steady clock, which agrees with its wall clock
    loaded = state.transactions["slewed"].seen_at(loader_now, state.shift_for("slewed", 0))
    assert loaded.start_ms == wall and not loaded.expired(loader_now)
    assert not loaded.expired(wall + 60_000) and loaded.expired(wall + 60_001)
    assert state.transactions["slewed"].seen_at(loader_now).expired(loader_now)  # unshifted
    # A loader whose own steady clock trails its wall clock by 2 minutes reads it 2 minutes
    # earlier on that clock: the same moment.
    behind = state.transactions["slewed"].seen_at(
        loader_now - 120_000, state.shift_for("slewed", 120_000)
    )
    assert behind.start_ms == wall - 120_000
    # Records replayed without a batch time (the live mirror) are not shifted.
    live = TxnShardState()
    live.apply_records([(txn_log_key("slewed"), begun.to_value())])
    assert live.shift_for("slewed", 0) == 0


def test_replay_keeps_the_latest_state_per_id_and_skips_fences() -> None:
    a = fresh("a")
    b = fresh("b")
    a1 = a.add(a.producer_id, 0, 5, partitions=[("t", 0)], groups=["g"])
    assert a1 is not None
    records = [
        GroupRecord(txn_log_key("a"), a.to_value()),
        GroupRecord(txn_log_key("b"), b.to_value()),
        GroupRecord(b"\x7a\x00", b"fence"),
        GroupRecord(txn_log_key("a"), a1.to_value()),
        GroupRecord(txn_log_key("b"), None),
    ]
    state = TxnShardState()
    state.apply_batches(encode_group_batch(records, producer_id=3, producer_epoch=2))
    assert state.transactions == {"a": a1} and state.skipped == 1
    assert (state.producer_id, state.producer_epoch) == (3, 2)
    assert decode_txn_log_key(txn_log_key("a")) == "a" and decode_txn_log_key(b"\x7a\x00") is None


def test_a_transaction_value_that_does_not_decode_is_skipped() -> None:
    """A record no coordinator wrote must not fail every load of its shard (found from
    outside, on __consumer_offsets): it is skipped and counted."""
    a = fresh("a")
    buf = encode_group_batch([GroupRecord(txn_log_key("bad"), b"\xff")]) + encode_group_batch(
        [GroupRecord(txn_log_key("a"), a.to_value())]
    )
    state = TxnShardState()
    assert state.apply_batches(buf) == 1
    assert state.transactions == {"a": a} and state.undecodable == 1


def test_epochs_no_producer_can_hold_are_invalid_requests_not_timeouts() -> None:
    """-1 was also the "unset" value of ``timed_out_epoch``: a request with epoch -1 was told
    its transaction had timed out (found from outside). Unset is now None, and an epoch
    outside 0..MAX_EPOCH is refused (by the RPCs, before any comparison)."""
    m = fresh()
    for bad in (-1, -2, MAX_EPOCH + 1, 40000, 2**31 - 1):
        with pytest.raises(InvalidRequestError, match=f"producer_epoch={bad} is outside"):
            check_epoch(bad)
    check_epoch(0)
    check_epoch(MAX_EPOCH)
    assert (m.timed_out_epoch, m.granted_from_epoch) == (None, None)
    v = TxnMetadata.from_value("tx", m.to_value())
    assert (v.timed_out_epoch, v.granted_from_epoch) == (None, None)


def test_txn_offsets_belong_to_the_open_transaction_that_added_the_group() -> None:
    m = fresh()
    pid = m.producer_id
    with pytest.raises(InvalidProducerIdMappingError):
        check_txn_offsets(None, "tx", pid, 0, "g")
    with pytest.raises(InvalidTxnStateError, match="EMPTY"):
        check_txn_offsets(m, "tx", pid, 0, "g")  # nothing open
    other = m.add(pid, 0, 1, groups=["other"])
    assert other is not None
    with pytest.raises(InvalidTxnStateError, match="has not added it"):
        check_txn_offsets(other, "tx", pid, 0, "g")
    open_ = other.add(pid, 0, 2, groups=["g"])
    assert open_ is not None
    check_txn_offsets(open_, "tx", pid, 0, "g")  # the real producer's
    with pytest.raises(ProducerFencedError):
        check_txn_offsets(open_, "tx", pid, 1, "g")  # newer than the coordinator's
    with pytest.raises(InvalidProducerIdMappingError):
        check_txn_offsets(open_, "tx", pid + 1, 0, "g")
    prepared = open_.end(pid, 0, True, 3)
    assert prepared is not None
    with pytest.raises(InvalidTxnStateError, match="PREPARE_COMMIT"):
        check_txn_offsets(prepared, "tx", pid, 0, "g")
    # An older epoch: fenced when the state is this process's own; abortable when it is
    # another coordinator's copy (which lacks the timed-out epoch).
    bumped = open_.abort_fencing(4, "a new producer instance initialised the id")
    newer = replace(bumped.complete(5), state=TxnState.ONGOING, groups=frozenset({"g"}))
    with pytest.raises(ProducerFencedError):
        check_txn_offsets(newer, "tx", pid, 0, "g")
    with pytest.raises(InvalidProducerEpochError):
        check_txn_offsets(newer, "tx", pid, 0, "g", full=False)
