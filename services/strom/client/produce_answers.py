"""The answers to the producer's Produce requests, and what becomes of their batches.

:class:`ProduceAnswers` is mixed into :class:`strom.client.producer.Producer` (through
:class:`strom.client.sender.SenderLoop`): the sender thread hands it each request's answer,
or the error that ended the attempt, and it completes the batches, retries them after a
backoff, resends them in order (a refusal for a gap an older batch left), splits a batch
refused as too large, expires those past ``delivery_timeout_ms`` and fails them, saying
whether they may have been written (the rules are in strom.client.sender's docstring).
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from strom.api import common_pb2
from strom.client import trace
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.bulk import part_of
from strom.client.cluster import refused
from strom.client.metadata import MetadataCache
from strom.client.stats import ProducerStats
from strom.client.streams import StreamError
from strom.client.transactions import TransactionManager
from strom.errors import (
    BrokerNotAvailableError,
    InconsistentTopicIdError,
    InvalidRequestError,
    MessageTooLargeError,
    ProducerClosedError,
    ProducerFencedError,
    RequestTimedOutError,
    StromError,
    error_for,
    is_retriable,
)
from strom.lograte import LogLimiter

# The producer's logger, not this module's: users filter the producer's lines on
# "strom.client.producer", and the sender's were always among them.
log = logging.getLogger("strom.client.producer")

NONE = common_pb2.ErrorCode.NONE
OUT_OF_ORDER = common_pb2.ErrorCode.OUT_OF_ORDER_SEQUENCE
DUPLICATE = common_pb2.ErrorCode.DUPLICATE_SEQUENCE
UNKNOWN_PRODUCER = common_pb2.ErrorCode.UNKNOWN_PRODUCER_ID
INCONSISTENT_TOPIC_ID = common_pb2.ErrorCode.INCONSISTENT_TOPIC_ID
#: Answers that prove the attempt appended nothing. A strom node gives each of these only
#: from its checks before the append (strom.storage.servicer ``_produce_target`` and
#: strom.storage.rpc_base ``_partition`` / ``_leader``): NOT_ENOUGH_REPLICAS (acks=all with
#: the ISR under min.insync.replicas, DESIGN §6 "Acks"), UNKNOWN_TOPIC_OR_PARTITION (no such
#: partition in its view), REPLICA_NOT_AVAILABLE (its replica not open yet, or still a
#: deleted topic's: the topic-id check in ``_produce``),
#: LEADER_NOT_AVAILABLE, and FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH
#: (``Partition.check_epoch`` on the request's current_leader_epoch). Every other retriable
#: answer may follow an append: NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT, and
#: NOT_LEADER_OR_FOLLOWER, which ``_await_commit`` answers when leadership moved while
#: appended records waited for the ISR (and ``_append_error`` for a log whose epoch is
#: ahead of the node's view), as may no answer at all. Records for a partition of a deleted
#: topic (UNKNOWN_TOPIC_OR_PARTITION at every attempt) then fail as not written, without
#: renumbering the partition under a new epoch.
_REFUSED_BEFORE_APPEND = frozenset(
    {
        common_pb2.ErrorCode.NOT_ENOUGH_REPLICAS,
        common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        common_pb2.ErrorCode.REPLICA_NOT_AVAILABLE,
        common_pb2.ErrorCode.LEADER_NOT_AVAILABLE,
        common_pb2.ErrorCode.FENCED_LEADER_EPOCH,
        common_pb2.ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)
#: Non-retriable answers given after records were appended (a flush that failed).
_FAILED_AFTER_APPEND = frozenset(
    {common_pb2.ErrorCode.UNKNOWN_SERVER_ERROR, common_pb2.ErrorCode.STORAGE_ERROR}
)
#: The leader's refusals of a batch itself (its size, sequence or content): what a batch that
#: may be in the log fails with when one ends it (``ProduceAnswers._maybe_written_error``).
_BATCH_REFUSALS = frozenset(
    {
        common_pb2.ErrorCode.MESSAGE_TOO_LARGE,
        common_pb2.ErrorCode.OUT_OF_ORDER_SEQUENCE,
        common_pb2.ErrorCode.CORRUPT_MESSAGE,
        common_pb2.ErrorCode.INVALID_RECORD,
        common_pb2.ErrorCode.INVALID_TIMESTAMP,
    }
)
_SEQ_MASK = 0x7FFFFFFF
#: Least time between two WARNING lines about one partition's retries (``_log_retry``).
RETRY_LOG_INTERVAL_S = 10.0
#: A batch retried within this long of its creation is logged at DEBUG only (``_log_retry``).
RETRY_QUIET_S = 1.0

_TRANSPORT_RETRIABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


_TOO_LARGE_FOR_GRPC = re.compile(r"(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")
#: A request whose batches leave this much below the limit gRPC named cannot have been the
#: one too large (its other fields are a few dozen bytes a partition): one that shared its
#: stream with the culprit, sent again as before.
_REQUEST_FIELDS_BYTES = 64 * 1024


def request_too_large(error: BaseException, batch_bytes: int) -> MessageTooLargeError | None:
    """MessageTooLargeError when ``error`` is gRPC refusing a message over its size limit
    (this client's "Sent message larger than max", or the node's "Received ...") and this
    request, carrying ``batch_bytes`` of batches, is the one too large; else None. Such a
    request no retry can send, unlike a leader shedding load: Kafka fails such a record at
    once (RecordTooLarge)."""
    if not isinstance(error, grpc.RpcError) or error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    m = _TOO_LARGE_FOR_GRPC.search(error.details() or "")
    if m is None:
        return None
    limit = int(m.group(3))
    if batch_bytes + _REQUEST_FIELDS_BYTES < limit:
        return None
    side = "this client's channel" if m.group(1) == "Sent" else "the node"
    return MessageTooLargeError(
        f"the produce request ({m.group(2)} bytes) is larger than {side} allows for a gRPC "
        f"message ({limit} bytes): not retried; send smaller records (max_request_size)"
    )


def _seq_before(a: int, b: int) -> bool:
    """Whether sequence ``a`` comes strictly before ``b`` (they wrap at 2**31 - 1)."""
    return 0 < (b - a) & _SEQ_MASK < (1 << 30)


def _earlier(a: float | None, b: float) -> float:
    b = max(b, 0.0)
    return b if a is None else min(a, b)


class _Shipment(NamedTuple):
    """One partition's part of a Produce request."""

    pq: PartitionQueue
    batches: list[ProducerBatch]
    leader_epoch: int
    #: Sent while an older batch of the partition was still unanswered. gRPC orders nothing
    #: between separate calls (DESIGN §6, "Order on the wire"), so the leader may have seen
    #: this request first: a sequence refusal of it says nothing about the log.
    behind: bool


class ProduceAnswers:
    """The sender's side that settles answers: completions, retries, resends in order,
    splits, expiry and failures (with the sequence bookkeeping a failure leaves).

    A mixin, as :class:`strom.client.sender.SenderLoop` is, for the same reason: the
    answers share the Producer's lock, partition queues and buffer accounting with
    ``send()``. Every attribute is set up by ``Producer.__init__``; the annotations say
    which ones the answers use.
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    acks: int
    idempotent: bool
    retries: int
    delivery_timeout_s: float
    retry_backoff_s: float
    retry_backoff_max_s: float
    _metadata: MetadataCache
    _txn: TransactionManager | None
    _adding: frozenset[tuple[str, int]]
    _lock: threading.Lock
    _space: threading.Condition
    _space_waiters: int
    _buffered: int
    _queues: dict[tuple[str, int], PartitionQueue]
    _open: dict[tuple[str, int], ProducerBatch]
    _in_flight: dict[str, int]
    _fatal: StromError | None
    _failing_threads: set[int]
    _retry_lines: LogLimiter
    _stats: ProducerStats
    #: The sender's requests in flight (strom.client.sender ``_Outstanding``), oldest first.
    _outstanding: dict[Any, None]

    if TYPE_CHECKING:  # the Producer's, called with the lock held (see there)

        def _close_open(self, topic: str, partition: int) -> None: ...

    if TYPE_CHECKING:  # the SenderLoop's (a node without ProduceStream)

        def _no_streams(self, addr: str) -> None: ...

    def _complete(
        self,
        addr: str,
        entries: list[_Shipment],
        fut: grpc.Future | None,
        error: BaseException | None,
        sent: float | None = None,
        tracked: Any = None,
    ) -> None:
        if tracked is not None:
            if tracked not in self._outstanding:
                # Given up already (its leader moved while it went unanswered: the
                # sender's ``_overdue``), its batches retried: this late answer settles
                # nothing.
                return
            del self._outstanding[tracked]
        if trace.sink is not None:
            trace.emit("produce.acked", entries)
        with self._lock:
            self._in_flight[addr] = max(self._in_flight.get(addr, 0) - 1, 0)
        results: dict[tuple[str, int], Any] = {}
        if error is None and fut is not None:
            try:
                resp = fut.result()
            except grpc.RpcError as exc:
                error = exc
                oversized = request_too_large(
                    exc, sum(len(b.encoded or b"") for e in entries for b in e.batches)
                )
                if oversized is not None:
                    # Never retried: the same request would be refused again, for the
                    # whole delivery timeout. Only the partitions too
                    # large on their own fail (all, if none is); the others rode along, were
                    # not sent either, and go again.
                    now = time.monotonic()
                    alone = {
                        id(e)
                        for e in entries
                        if request_too_large(exc, sum(len(b.encoded or b"") for b in e.batches))
                    }
                    for e in entries:
                        if not alone or id(e) in alone:
                            self._fail(e.pq, e.batches, oversized)
                        else:
                            self._requeue(e.pq, e.batches, now)
                    return
                if isinstance(exc, StreamError) and exc.unsent:
                    # The node read none of this request (a stream it does not know: an
                    # older version, so unary calls from now on; or a request before it on the
                    # stream was refused): nothing was appended, nothing was tried. Send it
                    # again, in order, without counting an attempt or backing off.
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self._no_streams(addr)
                    now = time.monotonic()
                    for pq, batches, _, _ in entries:
                        self._requeue(pq, batches, now)
                    return
            else:
                if sent is not None:
                    self._stats.answered(time.monotonic() - sent, resp.throttle_time_ms)
                for t in resp.topics:
                    for r in t.partitions:
                        results[(t.topic, r.partition)] = r
        now = time.monotonic()
        for pq, batches, _, behind in entries:
            if error is not None:
                code = error.code() if isinstance(error, grpc.RpcError) else None
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # The leader is shedding load (or the request was too large for it): it
                    # read none of the request.
                    detail = error.details() if isinstance(error, grpc.RpcError) else ""
                    self._retry(
                        pq,
                        batches,
                        BrokerNotAvailableError(f"leader {addr} refused: {code.name}: {detail}"),
                        now,
                    )
                elif code in _TRANSPORT_RETRIABLE:
                    for b in batches:  # no answer: the leader may have appended them
                        b.maybe_written = True
                    self._retry(
                        pq,
                        batches,
                        BrokerNotAvailableError(f"leader {addr} unreachable: {code.name}"),
                        now,
                    )
                elif isinstance(error, StromError):
                    self._fail(pq, batches, error)
                elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    assert isinstance(error, grpc.RpcError)
                    self._fail(pq, batches, refused(error))
                else:
                    detail = error.details() if isinstance(error, grpc.RpcError) else str(error)
                    for b in batches:  # the call broke somewhere: it may have been appended
                        b.maybe_written = True
                    self._fail(
                        pq, batches, InvalidRequestError(f"produce to {addr} failed: {detail}")
                    )
                continue
            r = results.get((pq.topic, pq.partition))
            if self.acks == 0:  # the leader answers before appending and reports nothing
                for b in batches:
                    b.result.complete(-1)
                self._done(pq, batches)
            elif r is None:
                self._fail(
                    pq, batches, InvalidRequestError("the leader's answer left out the partition")
                )
            elif r.error_code == DUPLICATE:
                # Appended long ago (older than the leader remembers, and not found by its
                # header in the leader's log): success, offset unknown.
                for b in batches:
                    b.result.complete(-1, r.log_append_time_ms)
                if pq.unresolved:
                    self._acked(pq, batches)
                self._done(pq, batches)
            elif r.error_code == NONE:
                pq.last_error = None
                if pq.unresolved:
                    self._acked(pq, batches)
                base = r.base_offset
                for b in batches:
                    b.result.complete(base, r.log_append_time_ms)
                    if base >= 0:
                        base += b.count
                self._done(pq, batches)
            elif r.error_code in (OUT_OF_ORDER, UNKNOWN_PRODUCER) and (
                behind or self._behind_trouble(pq, batches)
            ):
                # Refused for a gap an older batch leaves: that one was in flight beside this
                # request (the leader may run separate calls in any order) or is being retried
                # or renumbered. Nothing of this request was appended; resend it in order once
                # every older batch is answered. This is never the user's error.
                self._requeue(pq, batches, now)
            elif r.error_code == UNKNOWN_PRODUCER and batches[0].attempts < 3:
                # The leader forgot this producer (its batches were all deleted by retention
                # or DeleteRecords, or it expired): nothing was appended, and an unknown
                # producer must start again at sequence 0 for this partition.
                with self._lock:
                    pq.reseq_from = 0
                for b in batches:
                    b.attempts += 1
                self._requeue(pq, batches, now)
            elif r.error_code == INCONSISTENT_TOPIC_ID and batches[0].topic_id == (
                self._metadata.topic_id(pq.topic)
            ):
                # The leader has another id for the topic than the one we have and made these
                # batches for: our metadata or the leader's view lags a delete and re-create.
                # Nothing was appended; retried after a refresh, which tells which.
                self._retry(pq, batches, error_for(r.error_code, r.error_message), now)
            elif r.error_code == INCONSISTENT_TOPIC_ID:
                # Made for a topic since deleted and re-created under the same name (our
                # metadata has its new id). The leader appended
                # nothing; they fail, as not written, instead of landing in the new topic.
                self._metadata.mark_stale(pq.topic)
                self._fail(
                    pq,
                    batches,
                    InconsistentTopicIdError(
                        f"{pq.topic}-{pq.partition}: not written: the topic was deleted and "
                        f"re-created since these records were sent ({r.error_message})"
                    ),
                )
            elif is_retriable(r.error_code):
                if r.error_code not in _REFUSED_BEFORE_APPEND:
                    for b in batches:
                        b.maybe_written = True
                self._retry(pq, batches, error_for(r.error_code, r.error_message), now)
            elif len(batches) > 1:
                # Find the batch at fault: resend them one by one (nothing was appended).
                for b in batches:
                    b.attempts = max(b.attempts, 1)
                self._requeue(pq, batches, now)
            elif r.error_code == common_pb2.ErrorCode.MESSAGE_TOO_LARGE and self._split(
                pq, batches[0], now
            ):
                pass  # its parts go again in its place, with its sequence numbers
            else:
                err = error_for(r.error_code, r.error_message or f"{pq.topic}-{pq.partition}")
                if r.error_code == common_pb2.ErrorCode.MESSAGE_TOO_LARGE:
                    # The topic's limit may have been lowered: batches opened from now on
                    # learn it (_batch_bytes).
                    self._metadata.mark_stale(pq.topic)
                if r.error_code in _FAILED_AFTER_APPEND:
                    batches[0].maybe_written = True
                elif r.error_code == OUT_OF_ORDER and self.idempotent:
                    # Our oldest batch does not follow what the leader has (records lost in
                    # an unclean election, or the leader's state disagrees): its sequence
                    # cannot be reused; the partition goes on under a new epoch.
                    with self._lock:
                        pq.unresolved = True
                        pq.unresolved_seq = -1
                if r.error_code == common_pb2.ErrorCode.INVALID_PRODUCER_EPOCH:
                    if self._txn is None:
                        self._fatal = ProducerClosedError(f"producer fenced: {err.message}")
                    else:  # Kafka's ProducerFencedException, or abortable (KIP-588)
                        err = self._txn.epoch_error(err)
                        if isinstance(err, ProducerFencedError):
                            self._fatal = err
                self._fail(pq, batches, err)
        if self._fatal is not None:
            self._fail_all(self._fatal)

    def _split(self, pq: PartitionQueue, b: ProducerBatch, now: float) -> bool:
        """A batch of several records the leader refused as MESSAGE_TOO_LARGE (the topic's
        max.message.bytes was lowered after it was made): split it in two halves that take
        its place in the queue and are sent again, as Kafka's Sender does
        (``splitAndReenqueue``); a half still too large is split again, down to a single
        record, which alone fails. False (not split) for a single record, a bulk
        (send_batch) batch, or, without idempotence, one an earlier attempt may have written
        (its halves could be appended beside it).

        Safe with idempotence: the leader appended nothing of the refused batch, and every
        batch behind it waits (or is refused for the gap) until it is settled, so the halves
        take its sequence numbers (first half from its base sequence, second half after
        it), as Kafka re-sequences split batches; the batches behind keep theirs. That holds
        for a batch an earlier attempt may have written too (an answer lost to a failover),
        and the halves inherit ``maybe_written``. A leader holding the whole batch among
        the ones it remembers answers its retry with its offsets even over the lowered limit
        (DESIGN §4), so the refusal came from a leader without it, or one that forgot it.
        Should the halves meet a log holding the whole batch (a forgotten one, or leadership
        moving back), neither repeats a batch the leader remembers: the first is refused
        OUT_OF_ORDER_SEQUENCE (it overlaps the written sequences without following them), or
        DUPLICATE_SEQUENCE when older than every batch the leader keeps (answered as
        written); the second likewise, sent alone (``_settle`` resends a batch that may be in
        the log as it was). Nothing is appended twice, and refused halves fail saying the
        records may have been written (:meth:`_maybe_written_error`). So lowering
        max.message.bytes while a producer runs (even during a failover) fails no record that
        fits on its own."""
        if b.count < 2 or b.arrow is not None or (b.maybe_written and not self.idempotent):
            return False
        half = b.count // 2
        parts = [part_of(b, 0, half), part_of(b, half, b.count)]
        parts[1].limit = b.limit - parts[0].limit  # (what b reserved, shared out)
        for part in parts:
            part.maybe_written = b.maybe_written
        if b.base_sequence >= 0:
            parts[1].base_sequence = (b.base_sequence + half) & _SEQ_MASK
        with self._lock:
            try:
                at = pq.batches.index(b)
            except ValueError:
                return False  # already failed by close()
            del pq.batches[at]
            pq.batches.insert(at, parts[1])
            pq.batches.insert(at, parts[0])
            pq.in_flight = max(pq.in_flight - 1, 0)
            pq.retrying = True
            pq.retry_at = min(pq.retry_at, now) if pq.retry_at > now else pq.retry_at
        b.result.split([(0, parts[0].result), (half, parts[1].result)])
        self._metadata.mark_stale(pq.topic)  # batches opened from now on learn the limit
        log.info(
            "%s-%d: a batch of %d records was refused as too large: sent again in two",
            pq.topic,
            pq.partition,
            b.count,
        )
        return True

    def _acked(self, pq: PartitionQueue, batches: list[ProducerBatch]) -> None:
        """Acknowledged: a batch that failed "may have been written" before these is in the
        log (the leader appends in sequence only), so their sequences are settled."""
        if pq.unresolved and pq.unresolved_seq >= 0 and batches[0].base_sequence >= 0:
            with self._lock:
                if pq.unresolved_seq >= 0 and _seq_before(
                    pq.unresolved_seq, batches[0].base_sequence
                ):
                    pq.unresolved = False
                    pq.unresolved_seq = -1

    def _behind_trouble(self, pq: PartitionQueue, batches: list[ProducerBatch]) -> bool:
        with self._lock:
            first = batches[0]
            if pq.retrying:
                return True
            if pq.reseq_from is not None and _seq_before(pq.reseq_from, first.base_sequence):
                return True
            if pq.unresolved and not first.maybe_written and pq.batches[0] is not first:
                return True  # behind a batch being settled: renumbered if need be
            for b in pq.batches:  # an older batch still unacknowledged and not in flight
                if b is first:
                    return False
                if not b.sent:
                    return True
            return False

    def _requeue(self, pq: PartitionQueue, batches: list[ProducerBatch], now: float) -> None:
        with self._lock:
            for b in batches:
                b.sent = False
            pq.in_flight = max(pq.in_flight - 1, 0)
            pq.retrying = True
            pq.retry_at = min(pq.retry_at, now) if pq.retry_at > now else pq.retry_at

    def _done(self, pq: PartitionQueue, batches: list[ProducerBatch]) -> None:
        """Acknowledged or failed for good: forget the batches and free their memory."""
        with self._lock:
            for b in batches:
                b.sent = False
                if pq.batches and pq.batches[0] is b:
                    pq.batches.popleft()
                else:
                    try:
                        pq.batches.remove(b)
                    except ValueError:
                        continue  # already dropped, and its memory freed, by _fail_all
                self._buffered -= b.limit
            pq.in_flight = max(pq.in_flight - 1, 0)
            if self._space_waiters:
                self._space.notify_all()

    def _fail(self, pq: PartitionQueue, batches: list[ProducerBatch], err: BaseException) -> None:
        """Fail ``batches`` for good. Those that may have been written (an attempt got no
        clear answer: ``maybe_written``) fail saying so, and their sequences stay used: the
        partition is unresolved until a later sequence is acknowledged or it renumbers under
        a new epoch (:meth:`_settle`). The sequences of the others (refused before any
        append) may be taken over by the batches behind them once nothing is in flight."""
        maybe = [b for b in batches if b.maybe_written]
        if self.idempotent and batches and batches[0].base_sequence >= 0:
            with self._lock:
                if maybe:
                    last = maybe[-1]
                    end = (last.base_sequence + last.count - 1) & _SEQ_MASK
                    if not pq.unresolved:
                        pq.unresolved, pq.unresolved_seq = True, end
                    elif pq.unresolved_seq >= 0 and _seq_before(pq.unresolved_seq, end):
                        pq.unresolved_seq = end
                if len(maybe) < len(batches):
                    seq = next(b for b in batches if not b.maybe_written).base_sequence
                    if pq.reseq_from is None or _seq_before(seq, pq.reseq_from):
                        pq.reseq_from = seq
        failure = err
        if maybe and isinstance(err, StromError):
            failure = self._maybe_written_error(pq, err)
        if self._txn is not None and isinstance(err, StromError):
            # (the abort then gets a new epoch: TransactionManager.batch_failed)
            self._txn.batch_failed(failure if isinstance(failure, StromError) else err)
        for b in batches:
            b.result.fail(failure if b.maybe_written else err)
        self._stats.failed(pq.topic, sum(b.count for b in batches))
        self._done(pq, batches)

    def _maybe_written_error(self, pq: PartitionQueue, err: StromError) -> StromError:
        """The error a batch that may be in the log fails with: a timeout, as for records in
        flight at close(), saying that it may have been written (so that a user does not
        resend it into a duplicate); the leader's error when it says the records were
        appended.

        The leader's refusal of the batch itself (``_BATCH_REFUSALS``: MESSAGE_TOO_LARGE,
        OUT_OF_ORDER_SEQUENCE, ...) ended it, and no time ran out: it keeps its class, its
        message saying that an attempt may have written the records. Refusals of the
        producer itself (its epoch fenced) keep the timeout, as before: a transaction
        reads those codes as fencing (``TransactionManager.fail``)."""
        if isinstance(err, RequestTimedOutError) and "may have been written" in err.message:
            return err
        if err.code == common_pb2.ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            return error_for(err.code, f"{err.message}: the records may have been written")
        if err.code in _BATCH_REFUSALS:
            return error_for(
                err.code,
                f"{err.message}; the records may have been written (an attempt to send them "
                "got no clear answer)",
            )
        return RequestTimedOutError(
            f"{pq.topic}-{pq.partition}: no answer settled whether the records were "
            f"written: they may have been written (last error: {err})"
        )

    def _retry(
        self, pq: PartitionQueue, batches: list[ProducerBatch], err: StromError, now: float
    ) -> None:
        """After a retriable error: send the batches again after a backoff, or fail them when
        the retries or the delivery timeout have run out.

        Either way the topic's metadata is looked up again first: a retriable error is how a
        moved leader or a dead node shows, and the next batches need the new leader whether
        or not these are retried, as Kafka's client asks for a metadata update on any
        InvalidMetadataException or disconnect; first, so that it happens with
        ``retries=0`` too."""
        self._metadata.mark_stale(pq.topic)
        first = batches[0]
        timed_out = now - first.created >= self.delivery_timeout_s
        if timed_out or first.attempts >= self.retries:
            self._give_up(pq, batches, err, timed_out=timed_out)
            return
        for b in batches:
            b.attempts += 1
        self._stats.retried(pq.topic, sum(b.count for b in batches))
        backoff = min(self.retry_backoff_s * (2 ** (first.attempts - 1)), self.retry_backoff_max_s)
        with self._lock:
            for b in batches:
                b.sent = False
            pq.in_flight = max(pq.in_flight - 1, 0)
            pq.retrying = True
            pq.last_error = str(err)
            pq.retry_at = max(pq.retry_at, now + backoff * random.uniform(0.8, 1.2))
        self._log_retry(pq, batches, err, now)

    def _log_retry(
        self, pq: PartitionQueue, batches: list[ProducerBatch], err: StromError, now: float
    ) -> None:
        """A WARNING for a retried partition, as Kafka's producer logs each retry ("Got error
        produce response ... retrying (N attempts left)"), so a producer retrying for its
        whole delivery timeout is not silent until its final error. At most one
        line per partition every :data:`RETRY_LOG_INTERVAL_S`, counting the retries not
        logged: a partition retrying every 100 ms for two minutes is one line per 10 s. A
        batch younger than :data:`RETRY_QUIET_S` retries at DEBUG: a leader election or a
        topic just created answers within that, and every short-lived tool (the console
        producer, a test) would print a warning for it."""
        first = batches[0]
        if now - first.created < RETRY_QUIET_S:
            log.debug("retrying %s-%d after %s", pq.topic, pq.partition, err)
            return
        unlogged = self._retry_lines.occurred((pq.topic, pq.partition), now)
        if unlogged is None:
            return
        left = self.delivery_timeout_s - (now - first.created)
        log.warning(
            "%s-%d: retrying %d record(s) (retry %d, %.1f s of delivery_timeout_ms left%s): %s",
            pq.topic,
            pq.partition,
            sum(b.count for b in batches),
            first.attempts,
            max(left, 0.0),
            f"; {unlogged} more retries since the last line" if unlogged else "",
            err,
        )

    def _give_up(
        self,
        pq: PartitionQueue,
        batches: list[ProducerBatch],
        err: StromError,
        *,
        timed_out: bool = True,
    ) -> None:
        """Stop retrying batches after a retriable error (:meth:`_fail` tells apart those that
        may have been written).

        Past delivery_timeout_ms they fail with a timeout naming the last error; when the
        retries ran out first, with the error the leader gave, as Kafka does (a
        ``retries=0`` send to a partition under min.insync.replicas raised a 5 s timeout at
        its first answer instead of NotEnoughReplicasError)."""
        failure: StromError = err
        if timed_out:
            failure = self._expired_error(pq, batches, time.monotonic(), str(err))
        self._fail(pq, batches, failure)

    def _expire(self, now: float) -> None:
        """Fail batches that waited longer than delivery_timeout_ms without an answer (nothing
        of the partition in flight). Those sent before fail as "may have been written"
        unless every attempt was refused before any append.

        Batches in flight are left to their attempt, whose deadline is at the latest their
        delivery timeout (:meth:`_attempt_deadline`): it then fails them through
        :meth:`_retry`, as "may have been written", with the sequence bookkeeping an answer
        gets (an answer that came after they were failed here could not be matched)."""
        expired: list[tuple[PartitionQueue, list[ProducerBatch]]] = []
        with self._lock:
            for pq in self._queues.values():
                if pq.in_flight or not pq.batches:
                    continue
                old = [b for b in pq.batches if now - b.created >= self.delivery_timeout_s]
                if old and old[0] is pq.batches[0]:
                    if pq.open in old:
                        self._close_open(pq.topic, pq.partition)
                    for b in old:
                        b.sent = True  # _done below counts one request per call
                    pq.in_flight += 1
                    expired.append((pq, old))
        for pq, old in expired:
            self._fail(pq, old, self._expired_error(pq, old, now, self._last_error(pq)))

    def _last_error(self, pq: PartitionQueue) -> str | None:
        """What a partition's expiring batches last waited for: a transactional partition not
        added to its transaction yet waited for AddPartitionsToTxn (whose call runs beside
        the sender and may still be out), not for its leader."""
        txn = self._txn
        if txn is not None and (pq.topic, pq.partition) not in txn.added:
            waiting = "in flight" if (pq.topic, pq.partition) in self._adding else "not sent"
            return (
                "the partition was not added to the transaction yet: AddPartitionsToTxn "
                f"({waiting}) had no answer from the transaction coordinator"
            )
        return pq.last_error

    def _expired_error(
        self, pq: PartitionQueue, old: list[ProducerBatch], now: float, last_error: str | None
    ) -> RequestTimedOutError:
        """The error of batches that passed delivery_timeout_ms, in Kafka's words: the time
        counts from the batch's creation, so a record appended to it a moment ago fails with
        it; the message says so, since a record sent a moment ago may be among them."""
        last = f"(last error: {last_error})" if last_error else "(no reachable leader)"
        records = sum(b.count for b in old)
        head = (
            f"{pq.topic}-{pq.partition}: expiring {records} record(s): "
            f"{(now - old[0].created) * 1000:.0f} ms has passed since batch creation "
            f"(delivery_timeout_ms={self.delivery_timeout_s * 1000:.0f})"
        )
        if any(b.maybe_written for b in old):
            return RequestTimedOutError(f"{head}: the records may have been written {last}")
        return RequestTimedOutError(f"{head}, not written {last}")

    def _fail_all(self, err: StromError, in_flight: StromError | None = None) -> None:
        """Fail every queued batch with ``err``; with ``in_flight``, the batches sent at least
        once (in flight now, or waiting to be retried) fail with that instead."""
        me = threading.get_ident()
        nested = me in self._failing_threads
        self._failing_threads.add(me)
        try:
            self._fail_batches(err, in_flight)
        finally:
            if not nested:
                self._failing_threads.discard(me)

    def _fail_batches(self, err: StromError, in_flight: StromError | None) -> None:
        with self._lock:
            victims = [
                (pq, [(b, b.sent or b.maybe_written) for b in pq.batches])
                for pq in self._queues.values()
                if pq.batches
            ]
        for pq, marked in victims:
            batches = [b for b, _ in marked]
            for b, was_sent in marked:
                b.result.fail(in_flight if was_sent and in_flight is not None else err)
            self._stats.failed(pq.topic, sum(b.count for b in batches))
            with self._lock:
                for b in batches:
                    if b in pq.batches:
                        pq.batches.remove(b)
                        self._buffered -= b.limit
                if pq.open in batches:
                    pq.open = None
                    self._open.pop((pq.topic, pq.partition), None)
                if self._space_waiters:
                    self._space.notify_all()
