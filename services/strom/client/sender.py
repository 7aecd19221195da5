"""The producer's sender thread: it ships the batches ``send`` fills and settles the answers.

:class:`SenderLoop` is mixed into :class:`strom.client.producer.Producer`; its loop
(``_run``) closes batches, drains them into one Produce request per node and completes,
retries or fails them from the answer. How, and why:

- Nagle's rule, for batches: while a partition has a request in flight, only *full* batches
  are sent beside it; a batch still filling waits for the answer (or ``flush``). A gRPC call
  costs a node ~0.4 ms of CPU whatever it carries (docs/benchmarks.md), so at ``linger_ms=0``
  a steady trickle used to cost a call per handful of records and the calls' CPU was the
  latency: with the rule it costs one call per round trip. Measured (10,000 records/s, one
  node): p99 5.3-7.0 -> 4.2-4.5 ms; RF=3 acks=all p99 13.5-16 -> 7.9-10.4 ms; at 50,000/s
  p99 10.5 -> 4.8-5.3 ms. A lone record with nothing in flight still goes at once.
- With idempotence (default) each batch carries producer id, epoch and a sequence fixed at
  its first send, so a retry of a batch the leader already appended (response lost, leader
  changed) is answered with the original offsets instead of appended twice (DESIGN §6), and
  up to ``max_in_flight`` requests per partition are pipelined. gRPC orders nothing between
  separate calls (DESIGN §6, "Order on the wire"): the leader may see a later request first
  and refuse it for the gap (OUT_OF_ORDER_SEQUENCE, or UNKNOWN_PRODUCER_ID for a producer it
  has not met yet), appending nothing of it. Such a refusal of a request sent while an older
  batch of the partition was unanswered is never the user's error: the partition drains its
  in-flight requests and resends from its oldest unanswered batch, in order. Only a refusal
  of the oldest unanswered batch itself says the leader's state disagrees with ours. Without
  idempotence a partition has one request in flight, so a retry cannot overtake a later batch.
- Retriable errors (leader moved, not enough replicas, timeouts, node unreachable) refresh the
  metadata (retried or not) and retry with exponential backoff until ``delivery_timeout_ms``;
  other errors fail the batch's futures with a :class:`strom.errors.StromError`. An attempt
  ends by ``request_timeout_ms`` or when its oldest batch passes ``delivery_timeout_ms``,
  whichever is first (``SenderLoop._attempt_deadline``), and metadata is looked up on a
  thread of its own (``SenderLoop._refresh_metadata``): a hung node holds neither its own
  batches past their delivery timeout nor the partitions of other nodes.
- A batch that fails after an attempt that may have appended it (no answer, or an answer
  given after the append) fails saying it "may have been written", and its sequence is never
  given to another batch: the leader would take that batch for a retry and answer with the
  old offset, reporting a record written that is nowhere in the log (found from outside).
  The partition goes on once a later sequence is acknowledged, or renumbers from 0 under a
  new epoch (Kafka's KIP-360 bump; ``SenderLoop._settle``). Only batches refused before any
  append (``_REFUSED_BEFORE_APPEND``) hand their sequences on.
- Batches made for a topic since deleted and re-created without their partition fail at once
  as not written (``SenderLoop._replaced``), as a ``send`` to a missing partition does. Every
  request entry carries the topic id its batches were made for (``ProduceTopicData.topic_id``):
  the leader refuses them (INCONSISTENT_TOPIC_ID) if the topic has another id now, and they
  fail as not written once our metadata has the new id too, instead of landing in the new
  topic of the same name (found from outside).
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client import trace
from strom.client.accumulator import BATCH_OVERHEAD, PartitionQueue, ProducerBatch
from strom.client.bulk import part_of
from strom.client.cluster import MIN_ATTEMPT_S, ClusterClient, refused
from strom.client.downgrades import Downgrades
from strom.client.metadata import MetadataCache, PartitionLeader
from strom.client.spin import SpinKeeper
from strom.client.stats import ProducerStats
from strom.client.streams import PRODUCE_STREAM_METHOD, RequestStream, StreamError
from strom.client.transactions import TransactionManager, TxnPhase
from strom.client.types import TopicPartition
from strom.client.wire import PRODUCE_METHOD, encode_produce_request
from strom.errors import (
    BrokerNotAvailableError,
    InconsistentTopicIdError,
    InvalidRequestError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    ProducerClosedError,
    ProducerFencedError,
    RequestTimedOutError,
    StromError,
    UnknownTopicOrPartitionError,
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
#: ahead of the node's view), as may no answer at all. FIX (found from outside): records
#: for a partition of a deleted topic, answered UNKNOWN_TOPIC_OR_PARTITION at every
#: attempt, failed as "may have been written" though nothing was, and renumbered the
#: partition under a new epoch.
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
#: may be in the log fails with when one ends it (``SenderLoop._maybe_written_error``).
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
#: How long the sender waits for a new stream's headers before sending on it anyway (a
#: healthy node answers them in well under a millisecond; a paused one must not hold the
#: sender, which serves every node, for long).
STREAM_HANDSHAKE_S = 0.25
#: Least time between two WARNING lines about one partition's retries (``_log_retry``).
RETRY_LOG_INTERVAL_S = 10.0
#: A batch retried within this long of its creation is logged at DEBUG only (``_log_retry``).
RETRY_QUIET_S = 1.0

#: How much sooner than a Produce attempt's deadline the node is asked to answer (its wait
#: for acks=all replicas), so that its answer is back before the deadline cancels the call:
#: a quarter of the attempt when that is less (see ``SenderLoop._attempt_deadline``).
NODE_WAIT_MARGIN_S = 1.0

_TRANSPORT_RETRIABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


class _Shipment(NamedTuple):
    """One partition's part of a Produce request."""

    pq: PartitionQueue
    batches: list[ProducerBatch]
    leader_epoch: int
    #: Sent while an older batch of the partition was still unanswered. gRPC orders nothing
    #: between separate calls (DESIGN §6, "Order on the wire"), so the leader may have seen
    #: this request first: a sequence refusal of it says nothing about the log.
    behind: bool


_TOO_LARGE_FOR_GRPC = re.compile(r"(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")
#: A request whose batches leave this much below the limit gRPC named cannot have been the
#: one too large (its other fields are a few dozen bytes a partition): one that shared its
#: stream with the culprit, sent again as before.
_REQUEST_FIELDS_BYTES = 64 * 1024


def request_too_large(error: BaseException, batch_bytes: int) -> MessageTooLargeError | None:
    """MessageTooLargeError when ``error`` is gRPC refusing a message over its size limit
    (this client's "Sent message larger than max", or the node's "Received ...") and this
    request, carrying ``batch_bytes`` of batches, is the one too large; else None.

    FIX (found from outside): every RESOURCE_EXHAUSTED was taken for the leader shedding
    load and retried as BROKER_NOT_AVAILABLE until delivery_timeout_ms, including a request
    that no retry could ever send. Kafka fails such a record at once (RecordTooLarge)."""
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


#: Transaction phases in which a partition's first batch is still added to the transaction
#: and sent (an abort sends what is queued, within its timeout).
_ADDING_PHASES = (
    TxnPhase.IN_TRANSACTION,
    TxnPhase.COMMITTING,
    TxnPhase.ABORTING,
    TxnPhase.ABORTABLE_ERROR,
)


def _seq_before(a: int, b: int) -> bool:
    """Whether sequence ``a`` comes strictly before ``b`` (they wrap at 2**31 - 1)."""
    return 0 < (b - a) & _SEQ_MASK < (1 << 30)


def _earlier(a: float | None, b: float) -> float:
    b = max(b, 0.0)
    return b if a is None else min(a, b)


class SenderLoop:
    """The sender thread's side of the Producer: the loop, the requests, their answers,
    retries, sequence numbers and failures.

    A mixin rather than an object of its own (Kafka's Sender is one) because the loop and
    the caller's API share one lock, the partition queues, the open batches and the buffer
    accounting: as one object, ``send()`` (the measured hot path, ~1 µs a record) keeps
    its attribute lookups as they are, with no second object to reach through. Every
    attribute is set up by ``Producer.__init__``; the annotations say which ones the loop
    uses.
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    acks: int
    compression: str
    linger_s: float
    idempotent: bool
    retries: int
    delivery_timeout_s: float
    request_timeout_s: float
    max_in_flight: int
    max_request_size: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    metadata_max_age_s: float
    client_id: str
    _metadata_due: float
    _client_md: tuple[tuple[str, str], ...]
    _client: ClusterClient
    _metadata: MetadataCache
    _txn: TransactionManager | None
    _add_future: Future[None] | None
    _adding: frozenset[tuple[str, int]]
    _adding_generation: int
    _lock: threading.Lock
    _space: threading.Condition
    _space_waiters: int
    _buffered: int
    _queues: dict[tuple[str, int], PartitionQueue]
    _open: dict[tuple[str, int], ProducerBatch]
    _counts: dict[str, int]
    _leaders: dict[TopicPartition, PartitionLeader]
    _in_flight: dict[str, int]
    _drain_start: dict[str, int]
    _produce_calls: dict[str, Any]
    _streams: dict[str, RequestStream]
    _unary_only: Downgrades
    _spin: SpinKeeper
    _flushing: int
    _closing: bool
    _closed: bool
    _fatal: StromError | None
    _producer_id: int
    _producer_epoch: int
    _bump_wanted: bool
    _bump_via: str | None
    _bump_retry_at: float
    _epoch_victims: list[tuple[PartitionQueue, list[ProducerBatch]]]
    _wake: threading.Event
    _completions: queue.SimpleQueue[Any]
    _failing_threads: set[int]
    _retry_lines: LogLimiter
    _stats: ProducerStats
    _refresher: threading.Thread | None

    if TYPE_CHECKING:  # the Producer's, called with the lock held (see there)

        def _close_open(self, topic: str, partition: int) -> None: ...

    def _run(self) -> None:
        while True:
            try:
                while True:
                    try:
                        item = self._completions.get_nowait()
                    except queue.Empty:
                        break
                    self._complete(*item)
                now = time.monotonic()
                if self._closing and (not self._has_pending() or self._closed):
                    return
                self._expire(now)
                if now >= self._metadata_due:
                    self._metadata_due = now + self.metadata_max_age_s
                    for topic in list(self._counts):
                        self._metadata.mark_stale(topic)
                self._refresh_metadata(now)
                timeout = self._send_ready(now)
                due_in = self._metadata_due - now
                timeout = due_in if timeout is None else min(timeout, due_in)
            except Exception:  # never let the sender die silently
                log.exception("producer sender loop failed")
                timeout = self.retry_backoff_s
            self._wake.wait(timeout)
            self._wake.clear()

    def _refresh_metadata(self, now: float) -> None:
        """Look up the stale topics' leaders on a thread of its own (one at a time), which
        wakes the loop when it is done.

        Never on the sender thread: the sender serves every node, and a Metadata call can
        take up to an attempt's deadline when the node asked hangs (SIGSTOP, a GC pause, a
        network partition). FIX (found from outside): the loop made the call itself, and
        while one node was paused, sends to partitions led by healthy nodes took 6 s, and
        delivery timeouts fired late. Kafka's sender, too, never blocks on metadata."""
        refresher = self._refresher
        if refresher is not None and refresher.is_alive():
            return
        due_in = self._metadata.next_refresh_in(now)
        if due_in is None or due_in > 0:
            return
        self._refresher = threading.Thread(
            target=self._refresh_stale,
            name=f"strom-producer-metadata-{self.client_id}",
            daemon=True,
        )
        self._refresher.start()

    def _refresh_stale(self) -> None:
        """The metadata thread (see :meth:`_refresh_metadata`)."""
        try:
            self._metadata.refresh_stale()
        except Exception:  # (refresh_stale raises for nothing it expects)
            if not self._closed:  # (close() closes the channels under a lookup in flight)
                log.exception("producer metadata refresh failed")
        finally:
            self._wake.set()

    def _has_pending(self) -> bool:
        with self._lock:
            return any(pq.batches for pq in self._queues.values())

    def _ensure_producer_id(self) -> bool:
        if not self.idempotent or self._producer_id >= 0:
            if self._bump_wanted:
                self._bump_epoch()
            return True
        if self._txn is not None:
            return False  # init_transactions() sets it
        return self._init_producer_id(-1, -1)

    def _bump_epoch(self) -> None:
        """A new epoch for a partition that must renumber (see :meth:`_settle`): InitProducerId
        with the current id and epoch answers the same id with epoch + 1 (a new id when the
        epoch space is used up; DESIGN §6 "Idempotent producers"), as Kafka's KIP-360 bump.
        Only partitions that ask for it move to the new epoch, each once nothing of it is in
        flight; the others keep theirs, so nothing else has to wait for the bump. A node that
        cannot bump (refuses the id) gives a new id instead, which serves as well: a new id
        also starts every partition at sequence 0."""
        now = time.monotonic()
        if now < self._bump_retry_at:
            return
        if not self._init_producer_id(
            self._producer_id, self._producer_epoch, bump=True, first=self._bump_via
        ):
            self._bump_retry_at = now + self.retry_backoff_s  # no node answered: not in a loop
        else:
            self._bump_wanted = False
            log.info(
                "producer %s: new epoch %d (producer id %d) for partitions whose sequences "
                "cannot continue",
                self.client_id,
                self._producer_epoch,
                self._producer_id,
            )

    def _init_producer_id(
        self, pid: int, epoch: int, *, bump: bool = False, first: str | None = None
    ) -> bool:
        req = storage_pb2.InitProducerIdRequest(producer_id=pid, producer_epoch=epoch)
        candidates = self._client._candidates()
        if first is not None and not self._client.demoted(first):
            # (the partition's leader, unless it failed lately: then it stays last)
            candidates = list(dict.fromkeys([first, *candidates]))
        for addr in candidates:
            try:
                resp = self._client.storage(addr).InitProducerId(
                    req, timeout=self.request_timeout_s
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._fatal = ProducerClosedError(
                        f"node {addr} does not support idempotent producers; "
                        "use enable_idempotence=False"
                    )
                    self._fail_all(self._fatal)
                    return False
                if exc.code() in (
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNAUTHENTICATED,
                ):
                    # Fatal, as Kafka's ClusterAuthorizationException here: no node will
                    # answer otherwise (an idempotent producer needs WRITE on some topic).
                    self._fatal = refused(exc)
                    self._fail_all(self._fatal)
                    return False
                self._client.demote(addr)  # (asked last next time: it may be hung)
                continue
            if resp.error_code == NONE:
                self._producer_id, self._producer_epoch = resp.producer_id, resp.producer_epoch
                return True
            if bump and not is_retriable(resp.error_code):
                return self._init_producer_id(-1, -1)
            if not is_retriable(resp.error_code):
                self._fatal = error_for(resp.error_code, resp.error_message)
                self._fail_all(self._fatal)
                return False
        return False

    def _send_ready(self, now: float) -> float | None:
        """Ship every ready partition; returns how long the sender may sleep.

        A node with a ready partition (a closed batch, ``linger_ms`` passed, or a flush) gets
        one request that also carries the records waiting in its other partitions, as Kafka's
        accumulator drains a ready node; ``max_in_flight`` such requests per node.
        A partition's batches go out in sequence order: with idempotence up to
        ``max_in_flight`` requests per partition are pipelined, but only full batches beside a
        request in flight (Nagle's rule, see the module docstring; the leader refuses a batch whose
        predecessor is missing, so a failed request cannot be overtaken silently); without it,
        one at a time. After an error the partition drains its in-flight requests and resends
        from its oldest unacknowledged batch.
        """
        if not self._ensure_producer_id():
            return self.retry_backoff_s
        if self._add_future is not None and self._add_future.done():
            self._added_to_transaction()  # (its partitions' batches go in this pass)
        next_wake: float | None = None
        force = self._flushing > 0 or self._closing
        # A caller waiting for buffer_memory makes every batch due (as Kafka's accumulator
        # when its pool is exhausted): batches waiting out linger_ms would otherwise hold
        # the memory it waits for until they expire. (Nagle's rule still holds: the answer
        # in flight frees memory too.)
        hurry = force or self._space_waiters > 0
        depth = self.max_in_flight if self.idempotent else 1
        requests: list[tuple[str, list[_Shipment]]] = []
        #: leader address -> [any partition due?, (queue, unsent batches, epoch, due) ...]
        candidates: dict[str, list[Any]] = {}
        txn_adds: set[tuple[str, int]] = set()
        #: Partitions of a topic since deleted and re-created without them (_replaced).
        replaced: list[tuple[PartitionQueue, list[ProducerBatch]]] = []
        #: Partitions whose batches raised here (a bug, or a batch no check caught): they
        #: fail alone instead of stopping the sender for every other partition.
        broken: list[tuple[PartitionQueue, list[ProducerBatch], Exception]] = []
        with self._lock:
            for pq in self._queues.values():
                try:
                    if not pq.batches:
                        continue
                    if pq.retrying or pq.reseq_from is not None or pq.unresolved:
                        if pq.in_flight:
                            continue  # let every outstanding answer come back first
                        if pq.retry_at > now:
                            next_wake = _earlier(next_wake, pq.retry_at - now)
                            continue
                        if (pq.reseq_from is not None or pq.unresolved) and not self._settle(pq):
                            next_wake = _earlier(next_wake, self.retry_backoff_s)
                            continue  # waits for a new epoch
                        pq.retrying = False
                    if pq.in_flight >= depth:
                        continue
                    queued = [b for b in pq.batches if not b.sent]
                    if not queued:
                        continue
                    first = queued[0]
                    due = first.closed or hurry or now - first.created >= self.linger_s
                    if pq.in_flight and not (first.closed or force):
                        continue  # Nagle: a batch still filling waits for the answer in flight
                    if not due:  # it may still ride along with a request to its leader (below)
                        next_wake = _earlier(next_wake, first.created + self.linger_s - now)

                    leader = self._leaders.get((pq.topic, pq.partition))  # tuple == TopicPartition
                    if leader is None or leader.address is None:
                        if not pq.in_flight and (gone := self._replaced(pq)):
                            if pq.open in gone:
                                self._close_open(pq.topic, pq.partition)
                            for b in gone:
                                b.sent = True  # _done counts one request per call
                            pq.in_flight += 1
                            replaced.append((pq, gone))
                            continue
                        if due:
                            self._metadata.mark_stale(pq.topic)
                            next_wake = _earlier(next_wake, self.retry_backoff_s)
                        continue
                    if self._txn is not None and (pq.topic, pq.partition) not in self._txn.added:
                        if due and (pq.topic, pq.partition) not in self._adding:
                            txn_adds.add((pq.topic, pq.partition))
                        continue  # registered with the coordinator first (below)
                    node = candidates.get(leader.address)
                    if node is None:
                        node = candidates[leader.address] = [False]
                    node[0] = node[0] or due
                    node.append((pq, queued, leader.epoch, due))
                except Exception as exc:  # (see `broken`)
                    broken.append((pq, self._take_unsent(pq), exc))
            for addr, node in candidates.items():
                # A node with a due partition gets a request holding every partition of it
                # that has records (as Kafka's drain), up to max_request_size in all:
                # partitions filling at different paces share calls instead of each costing
                # its own when its linger expires. What does not fit goes in a further
                # request while the node has a free slot and something due is left.
                pending = node[1:]
                # Due partitions first, and each round starting one partition further (as
                # Kafka's drain index): a node whose slots free one at a time under load
                # would otherwise always fill its requests from the same first partitions.
                if len(pending) > 1:
                    start = self._drain_start.get(addr, 0) % len(pending)
                    self._drain_start[addr] = start + 1
                    pending = pending[start:] + pending[:start]
                    pending.sort(key=lambda item: not item[3])  # stable: keeps the rotation
                while node[0] and self._in_flight.get(addr, 0) < self.max_in_flight:
                    entries, pending = self._drain(pending)
                    requests.append((addr, entries))
                    # One request: one of the node's max_in_flight slots (_complete gives
                    # it back).
                    self._in_flight[addr] = self._in_flight.get(addr, 0) + 1
                    node[0] = any(due for *_, due in pending)
        for addr, entries in requests:
            self._send_request(addr, entries)
        for pq, gone in replaced:
            count = self._counts.get(pq.topic, 0)
            self._fail(
                pq,
                gone,
                UnknownTopicOrPartitionError(
                    f"{pq.topic}-{pq.partition}: not written: the topic was deleted and "
                    f"re-created with {count} partition{'s' if count != 1 else ''}, and this "
                    "partition no longer exists",
                    retriable=False,
                ),
            )
        for pq, gone, exc in broken:
            log.error(
                "producer %s: failing %s-%s's queued batches: the sender could not handle them",
                self.client_id,
                pq.topic,
                pq.partition,
                exc_info=exc,
            )
            self._fail(
                pq,
                gone,
                InvalidRequestError(
                    f"{pq.topic}-{pq.partition}: not written: the producer could not send "
                    f"this partition's batches ({type(exc).__name__}: {exc})",
                    retriable=False,
                ),
            )
        if self._epoch_victims:
            self._fail_epoch_victims()
        if txn_adds:
            return self._add_to_transaction(txn_adds, next_wake)
        return next_wake

    def _take_unsent(self, pq: PartitionQueue) -> list[ProducerBatch]:
        """With the lock held: the partition's batches not in flight, taken out of the
        sending (marked sent, one request counted, as :meth:`_done` expects) so that the
        caller can :meth:`_fail` them after releasing the lock."""
        gone = [b for b in pq.batches if not b.sent]
        if pq.open in gone:
            self._close_open(pq.topic, pq.partition)
        for b in gone:
            b.sent = True
        pq.in_flight += 1
        return gone

    def _replaced(self, pq: PartitionQueue) -> list[ProducerBatch]:
        """With the lock held, for a partition without a known leader: its batches made for
        a topic that has since been deleted and re-created without this partition (the
        topic's id changed and its partition count no longer covers it), which can never be
        delivered.

        FIX (found from outside): they were retried until delivery_timeout_ms, though a new
        ``send`` to a partition the topic does not have fails at once. Only a changed id
        proves the partition gone: under one id partitions are only ever added, and a node
        that has not learnt the added ones yet answers a smaller count for a while."""
        count = self._counts.get(pq.topic)
        current = self._metadata.topic_id(pq.topic)
        if count is None or pq.partition < count or not current:
            return []
        return [b for b in pq.batches if b.topic_id and b.topic_id != current]

    def _drain(self, pending: list[Any]) -> tuple[list[_Shipment], list[Any]]:
        """With the lock held: one request's shipments from ``pending`` partitions (queue,
        unsent batches, leader epoch, due), up to ``max_request_size`` in all (a first batch
        always goes); returns them and the partitions left for another request."""
        entries: list[_Shipment] = []
        rest: list[Any] = []
        total = 0
        limit = self.max_request_size
        for item in pending:
            pq, queued, epoch, _ = item
            first = queued[0]
            if entries and total + first.size + BATCH_OVERHEAD > limit:
                rest.append(item)
                continue
            take: list[ProducerBatch] = []
            behind = pq.batches[0] is not first  # an older batch is in flight
            for b in queued:
                if take and (
                    first.attempts
                    or b.attempts
                    or total + b.size + BATCH_OVERHEAD > limit
                    or b.topic_id != first.topic_id  # (one topic id per request entry)
                ):
                    break  # (a retry goes alone, as it went the first time)
                if b is pq.open:
                    self._close_open(pq.topic, pq.partition)
                take.append(b)
                total += b.size + BATCH_OVERHEAD
                b.sent = True
                if b.base_sequence < 0 and self.idempotent:
                    if pq.producer_id < 0:
                        pq.producer_id, pq.producer_epoch = self._producer_id, self._producer_epoch
                    b.base_sequence = pq.next_sequence
                    pq.next_sequence = (pq.next_sequence + b.count) & 0x7FFFFFFF
            pq.in_flight += 1
            entries.append(_Shipment(pq, take, epoch, behind))
        return entries, rest

    def _add_to_transaction(
        self, parts: set[tuple[str, int]], next_wake: float | None
    ) -> float | None:
        """Send AddPartitionsToTxn for partitions about to get their first batch of the
        transaction, as one more request in flight: it runs on a thread of its own and wakes
        the sender when it ends (:meth:`_added_to_transaction`), one at a time; partitions
        due meanwhile go in the next one. FIX (found from outside): the sender made the call
        itself and, with the coordinator down or stopped, sent nothing else until it gave up
        (up to delivery_timeout_ms): partitions already added, delivery timeouts and
        callbacks all waited, and so did flush(), close() and abort_transaction() (Kafka's
        sender, too, keeps polling while its AddPartitionsToTxn is in flight).

        The call may retry until the oldest of those batches is due to expire
        (delivery_timeout_ms after its creation), each attempt for up to request_timeout_ms
        (DESIGN §8). Nothing is added once the transaction has ended (an abort fails the
        batches of partitions still not added once its flush is over: see
        :meth:`abort_transaction`)."""
        txn = self._txn
        assert txn is not None
        if self._add_future is not None:
            # (these wait for the next one; the sender wakes to expire them in time)
            return _earlier(next_wake, self._add_budget(parts))
        if txn.phase not in _ADDING_PHASES:
            self._fail_unadded(parts, self._unadded_error(txn))
            return next_wake
        budget = self._add_budget(parts)
        future: Future[None] = Future()
        self._add_future, self._adding = future, frozenset(parts)
        self._adding_generation = txn.generation
        threading.Thread(
            target=self._add_partitions,
            args=(txn, parts, budget, future),
            name=f"strom-producer-add-partitions-{self.client_id}",
            daemon=True,
        ).start()
        return next_wake

    def _add_partitions(
        self,
        txn: TransactionManager,
        parts: set[tuple[str, int]],
        budget: float,
        future: Future[None],
    ) -> None:
        """The AddPartitionsToTxn thread (see :meth:`_add_to_transaction`)."""
        try:
            txn.add_partitions(parts, budget)
        except BaseException as exc:  # (handed to the sender, which fails the batches)
            future.set_exception(exc)
        else:
            future.set_result(None)
        self._wake.set()

    def _added_to_transaction(self) -> None:
        """On the sender thread, once the AddPartitionsToTxn in flight has ended: its
        partitions were added (their batches go now), or it failed, and so do their
        batches and the transaction. An answer to a transaction that has ended since (it
        was aborted meanwhile; its batches failed then) changes nothing, unless it fenced
        the producer."""
        txn, future, parts = self._txn, self._add_future, self._adding
        assert txn is not None and future is not None
        self._add_future, self._adding = None, frozenset()
        exc = future.exception()
        if exc is None:
            return
        if not isinstance(exc, StromError):
            exc = StromError(f"AddPartitionsToTxn failed: {type(exc).__name__}: {exc}")
        if txn.generation != self._adding_generation and txn.phase is not TxnPhase.FATAL_ERROR:
            return
        txn.fail(exc)
        err = txn.error or exc
        self._fail_unadded(parts, err, fail_txn=True)
        if isinstance(err, ProducerFencedError):
            self._fatal = err
            self._fail_all(err)

    @staticmethod
    def _unadded_error(txn: TransactionManager) -> StromError:
        """What a batch of a partition not added to its transaction fails with when the
        transaction fails or is aborted first."""
        why = (
            f"the transaction failed ({txn.error})" if txn.error else "the transaction was aborted"
        )
        return StromError(
            f"not written: {why} before the record's partition was added to it "
            f"(AddPartitionsToTxn); the record belongs to the aborted transaction"
        )

    def _fail_unadded(
        self, parts: Iterable[tuple[str, int]], err: StromError, *, fail_txn: bool = False
    ) -> None:
        """Fail the unsent batches of ``parts`` (partitions not added to the transaction:
        nothing of them was sent). ``fail_txn``: the transaction fails with ``err`` too (see
        :meth:`_fail`); else (an abort) it is left as it is, and only batches never given a
        sequence fail (no sequence bookkeeping is needed for them)."""
        wanted = set(parts)
        with self._lock:
            victims = [
                (pq, [b for b in pq.batches if not b.sent and (fail_txn or b.base_sequence < 0)])
                for (t, p), pq in self._queues.items()
                if (t, p) in wanted
            ]
            victims = [(pq, batches) for pq, batches in victims if batches]
            for pq, batches in victims:
                if pq.open in batches:
                    self._close_open(pq.topic, pq.partition)
                for b in batches:
                    b.sent = True
                pq.in_flight += 1
        for pq, batches in victims:
            if fail_txn:
                self._fail(pq, batches, err)
            else:
                for b in batches:
                    b.result.fail(err)
                self._stats.failed(pq.topic, sum(b.count for b in batches))
                self._done(pq, batches)

    def _add_budget(self, parts: set[tuple[str, int]]) -> float:
        """How long AddPartitionsToTxn for ``parts`` may take: until the oldest unsent batch
        of those partitions passes delivery_timeout_ms (it fails then anyway)."""
        now = time.monotonic()
        with self._lock:
            created = [
                b.created
                for (t, p), pq in self._queues.items()
                if (t, p) in parts
                for b in pq.batches
                if not b.sent
            ]
        return max(min(created, default=now) + self.delivery_timeout_s - now, MIN_ATTEMPT_S)

    def _settle(self, pq: PartitionQueue) -> bool:
        """With the lock held and nothing of the partition in flight, after a batch failed for
        good: decide how the batches behind it are numbered. Returns False while the
        partition waits for a new epoch.

        A sequence that may be in the log is never given to another batch (found from
        outside: a batch that was appended, then expired while waiting for its retry, had its
        sequence handed to the next batch; the leader took that for a retry and answered with
        the old offset, so the new record was reported written and was nowhere in the log).
        In order:

        - the oldest batch may itself be in the log (an earlier attempt had no clear answer)
          and nothing before it provably is not: it is resent as it was sent; its
          acknowledgement settles everything before it (the leader appends only in
          sequence), a refusal fails it as "may have been written";
        - every batch that failed was refused before any append and none left may be in the
          log: the batches behind take over the failed sequences (no stale copy of a later
          sequence can land after them);
        - otherwise the partition renumbers from 0 under a new epoch (Kafka's KIP-360), which
          the leader takes (DESIGN §6): everything from the first batch that is provably not
          in the log on can never be appended under the old epoch. A transactional producer
          cannot bump on its own (its coordinator owns the epoch): it sends its next new
          batch with the next sequence, which the leader takes if the failed batch is in the
          log; when that is refused too, its batches fail (:meth:`_fail_for_epoch`) until
          the transaction's abort, which gets a new epoch from the coordinator since a batch
          failed (``TransactionManager.bump_epoch``, KIP-360): the partition then renumbers
          from 0 as below.
        """
        head = pq.batches[0]
        if head.maybe_written and (
            pq.reseq_from is None or _seq_before(head.base_sequence, pq.reseq_from)
        ):
            return True
        if not pq.unresolved and not any(b.maybe_written for b in pq.batches):
            if pq.reseq_from is not None:
                self._resequence(pq)
            return True
        if (pq.producer_id, pq.producer_epoch) == (self._producer_id, self._producer_epoch):
            if self._txn is not None and head.base_sequence < 0 and pq.unresolved_seq >= 0:
                # A transactional producer, which cannot bump, goes on with the next
                # sequence: if the batch that failed is in the log (an aborted transaction
                # keeps it there), the leader takes it and that settles the partition.
                return True
            if self._txn is None:
                if not self._bump_wanted:
                    self._bump_wanted = True
                    leader = self._leaders.get((pq.topic, pq.partition))  # == TopicPartition
                    if leader is not None and leader.address is not None:
                        self._bump_via = leader.address
                    self._wake.set()
                return False
            self._fail_for_epoch(pq)
            return False
        # The producer has a newer id or epoch than this partition's sequences: start over.
        pq.producer_id, pq.producer_epoch = self._producer_id, self._producer_epoch
        for b in pq.batches:
            b.maybe_written = False  # (under the new epoch; the old can append none of them)
        pq.reseq_from = 0
        self._resequence(pq)
        pq.unresolved = False
        pq.unresolved_seq = -1
        return True

    def _fail_for_epoch(self, pq: PartitionQueue) -> None:
        """With the lock held: a transactional producer's partition whose sequences cannot
        continue under its epoch; its queued batches (none of which was appended: see
        :meth:`_settle`) fail once the lock is released (the transaction can only abort)."""
        batches = [b for b in pq.batches if not b.sent]
        if not batches:
            return
        if pq.open in batches:
            self._close_open(pq.topic, pq.partition)
        for b in batches:
            b.sent = True
        pq.in_flight += 1  # _done counts one request per call
        self._epoch_victims.append((pq, batches))

    def _fail_epoch_victims(self) -> None:
        while self._epoch_victims:
            pq, batches = self._epoch_victims.pop()
            self._fail(
                pq,
                batches,
                OutOfOrderSequenceError(
                    f"{pq.topic}-{pq.partition}: not written: a record sent before may or may "
                    "not be in the log, so this producer epoch's sequence numbers cannot go "
                    "on; call abort_transaction(): it gets a new epoch, from which the next "
                    "transaction goes on"
                ),
            )

    @staticmethod
    def _resequence(pq: PartitionQueue) -> None:
        """With the lock held and nothing in flight: after a batch failed for good, the ones
        behind it (none of which was appended) take over its sequence numbers."""
        assert pq.reseq_from is not None
        seq = pq.reseq_from
        for b in pq.batches:
            if b is pq.open:  # still taking records: numbered when it is first sent
                b.base_sequence = -1
                break
            b.base_sequence = seq
            seq = (seq + b.count) & 0x7FFFFFFF
        pq.next_sequence = seq
        pq.reseq_from = None

    def _send_request(self, addr: str, entries: list[_Shipment]) -> None:
        #: (topic, the id its batches were made for) -> partitions: the leader refuses them
        #: if the topic has been deleted and re-created since (INCONSISTENT_TOPIC_ID).
        topics: dict[str | tuple[str, str], list[tuple[int, int, list[bytes]]]] = {}
        try:
            for pq, batches, epoch, _ in entries:
                data = [
                    b.encode(
                        self.compression,
                        pq.producer_id if self.idempotent else -1,
                        pq.producer_epoch if self.idempotent else -1,
                        b.base_sequence if self.idempotent else -1,
                        self._txn is not None,
                    )
                    for b in batches
                ]
                topic_id = batches[0].topic_id
                key = (pq.topic, topic_id) if topic_id else pq.topic
                topics.setdefault(key, []).append((pq.partition, epoch, data))
            timeout_s, node_wait_ms = self._attempt_deadline(entries, time.monotonic())
            req = encode_produce_request(
                self.acks,
                node_wait_ms,
                topics,
                self._txn.transactional_id if self._txn is not None else "",
            )
        except Exception as exc:  # bad input that escaped send()'s checks: fail, don't loop
            self._failed_to_send(
                addr, entries, InvalidRequestError(f"could not encode a batch: {exc}")
            )
            return
        self._count_request(entries)
        sent = time.monotonic()

        def done(f: Any) -> None:  # a finished unary future, or a stream's answer
            self._completions.put((addr, entries, f, None, sent))
            self._wake.set()

        try:
            channel = self._client.channel(addr)
            if addr not in self._unary_only:
                if trace.sink is not None:
                    trace.emit("produce.sent", entries)
                for _ in range(2):  # a stream that just ended is replaced once
                    stream = self._streams.get(addr)
                    if stream is None or stream.closed:
                        stream = self._streams[addr] = RequestStream(
                            channel,
                            PRODUCE_STREAM_METHOD,
                            storage_pb2.ProduceResponse.FromString,
                            self._client_md,
                            f"strom-produce-stream-{self.client_id}",
                        )
                        # A node that does not know the stream says so before anything is
                        # sent on it: its requests then go as unary calls in their order (one
                        # round trip once per node; a node slow to answer is not waited for).
                        if stream.wait_ready(STREAM_HANDSHAKE_S) == grpc.StatusCode.UNIMPLEMENTED:
                            self._no_streams(addr)
                            break
                    if stream.send(req, timeout_s, done):
                        return
                    if stream.ended_with == grpc.StatusCode.UNIMPLEMENTED:
                        self._no_streams(addr)
                        break
                else:
                    raise StreamError(grpc.StatusCode.UNAVAILABLE, f"no stream to {addr}")
            self._spin.keep(channel)
            call = self._produce_calls.get(addr)
            if call is None:
                call = self._produce_calls[addr] = channel.unary_unary(
                    PRODUCE_METHOD,
                    request_serializer=None,
                    response_deserializer=storage_pb2.ProduceResponse.FromString,
                )
            fut = call.future(req, timeout=timeout_s, metadata=self._client_md)
        except Exception as exc:  # channel closed under us
            self._failed_to_send(addr, entries, exc)
            return

        if trace.sink is not None:
            trace.emit("produce.sent", entries)
        fut.add_done_callback(done)

    def _count_request(self, entries: list[_Shipment]) -> None:
        """The metrics of a request about to go (``metrics()``): per batch, never per
        record. The uncompressed size is the producer's own count (``batch_size``'s);
        without compression the ratio is 1, as Kafka's."""
        self._stats.request_sent(
            [
                (
                    pq.topic,
                    b.count,
                    len(b.encoded or b""),
                    b.size,
                    b.created if not b.attempts else None,
                )
                for pq, batches, _, _ in entries
                for b in batches
            ],
            compressed=self.compression != "none",
        )

    def _attempt_deadline(self, entries: list[_Shipment], now: float) -> tuple[float, int]:
        """How long this attempt waits for its answer (seconds), and how long the node may
        hold it waiting for acks=all replicas (the request's ``timeout_ms``).

        The attempt ends by ``request_timeout_ms`` or when its oldest batch passes
        ``delivery_timeout_ms``, whichever is first, so a batch in flight to a node that
        hangs fails on time (Kafka expires in-flight batches too); it fails as "may have
        been written" and its sequence is never reused (see the module docstring). FIX
        (found from outside): each attempt had ``request_timeout_ms`` + 5 s, and in-flight
        batches were never expired, so with delivery_timeout_ms=3000 a batch sent to a
        paused leader failed after 6 s (35 s with the default request timeout).

        The node is told to stop waiting a little before that deadline
        (:data:`NODE_WAIT_MARGIN_S`), which is why the 5 s were there: its answer
        (REQUEST_TIMED_OUT when the replicas are slow) must come before the deadline, which
        otherwise cancels the node's stream with every other request on it."""
        oldest = min(b.created for e in entries for b in e.batches)
        left = oldest + self.delivery_timeout_s - now
        attempt_s = max(MIN_ATTEMPT_S, min(self.request_timeout_s, left))
        node_wait_s = attempt_s - min(NODE_WAIT_MARGIN_S, attempt_s / 4)
        return attempt_s, max(1, int(node_wait_s * 1000))

    def _failed_to_send(self, addr: str, entries: list[_Shipment], error: BaseException) -> None:
        """A request that never left: handled as an answer is, by the sender loop (which
        then sees the retry time it sets; handled here, inside _send_ready, the loop would
        sleep on the wake time it had computed before)."""
        self._completions.put((addr, entries, None, error))
        self._wake.set()

    def _no_streams(self, addr: str) -> None:
        if addr not in self._unary_only:
            log.info("node %s has no ProduceStream (an older version): unary calls", addr)
            self._unary_only.add(addr)

    def _complete(
        self,
        addr: str,
        entries: list[_Shipment],
        fut: grpc.Future | None,
        error: BaseException | None,
        sent: float | None = None,
    ) -> None:
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
                    # whole delivery timeout (found from outside). Only the partitions too
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
                # FIX (found from outside): made for a topic since deleted and re-created
                # under the same name (our metadata has its new id). The leader appended
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
        records may have been written (:meth:`_maybe_written_error`).

        FIX (found from outside): lowering max.message.bytes while a producer ran failed
        every record already batched (40 of 40 records of 100 KB in 4 MiB batches under a
        new 1 MiB limit), although each fit. And (found from outside) a batch an earlier
        attempt may have written was never split: lowering the limit while a leader failed
        over failed whole batches of records that each fit (212 records in one run), most of
        them not in the log."""
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
        flight at close(), saying that it may have been written (found from outside: a batch
        appended and then expired was reported "not sent", and a user resending it wrote it
        twice); the leader's error when it says the records were appended.

        The leader's refusal of the batch itself (``_BATCH_REFUSALS``: MESSAGE_TOO_LARGE,
        OUT_OF_ORDER_SEQUENCE, ...) ended it, and no time ran out: it keeps its class, its
        message saying that an attempt may have written the records. FIX (found from
        outside): a batch refused MESSAGE_TOO_LARGE after its first attempt's answer was lost
        to a failover failed as RequestTimedOutError ("no answer settled ..."). Refusals of
        the producer itself (its epoch fenced) keep the timeout, as before: a transaction
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
        InvalidMetadataException or disconnect. FIX (found from outside): with ``retries=0``
        the refresh came after the give-up's return, so after a leader change every send
        failed (stale leader epoch, or the dead leader unreachable) until
        metadata_max_age_ms, 5 minutes."""
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
        produce response ... retrying (N attempts left)"). FIX (found from outside): a
        producer retrying for its whole delivery timeout (a follower down under
        min.insync.replicas) logged nothing before its final error, 45 s later. At most one
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
        its first answer instead of NotEnoughReplicasError; found from outside)."""
        failure: StromError = err
        if timed_out:
            failure = self._expired_error(pq, batches, time.monotonic(), str(err))
        self._fail(pq, batches, failure)

    def _expire(self, now: float) -> None:
        """Fail batches that waited longer than delivery_timeout_ms without an answer (nothing
        of the partition in flight). Those sent before fail as "may have been written"
        unless every attempt was refused before any append (found from outside: a batch
        appended, then waiting for its retry, was reported "not sent").

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
        it. FIX (found from outside): "not written within delivery_timeout_ms=20000" was
        said of records sent 0.1 s before."""
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
