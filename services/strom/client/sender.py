"""The producer's sender thread: it ships the batches ``send`` fills and settles the answers.

:class:`SenderLoop` is mixed into :class:`strom.client.producer.Producer`; its loop
(``_run``) closes batches, drains them into one Produce request per node and completes,
retries or fails them from the answer (those in :mod:`strom.client.produce_answers`, the
sequence numbers and epochs in :mod:`strom.client.sequences`, AddPartitionsToTxn in
:mod:`strom.client.add_partitions`, the watch over requests to a hung leader in
:mod:`strom.client.produce_overdue`: mixins of ``SenderLoop``). How, and why:

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
- A request unanswered :data:`OVERDUE_GRACE_S` (1 s) has its partitions' leaders looked up
  again (on the metadata thread), every :data:`OVERDUE_RECHECK_S` while it stays so, and its
  node is asked last for metadata; once one of its partitions' leader moved (another node,
  or a higher leader epoch) the request is given up as a whole, exactly as an attempt that
  reached its deadline: "may have been written", retried in sequence order (the new leader
  answers a batch it already has with its original offsets), its late answer ignored
  (``SenderLoop._overdue``). The normal path pays one look at the oldest request in flight
  per wake-up, no timer per request. Otherwise batches in flight to a hung leader (and,
  with idempotence, every batch behind them) would wait out ``request_timeout_ms`` though
  the controller moves the partition in 2-3 s. Without idempotence the same rule holds: a
  retry after no answer may write a batch twice, as after a timeout.
- A batch that fails after an attempt that may have appended it (no answer, or an answer
  given after the append) fails saying it "may have been written", and its sequence is never
  given to another batch: the leader would take that batch for a retry and answer with the
  old offset, reporting a record written that is nowhere in the log.
  The partition goes on once a later sequence is acknowledged, or renumbers from 0 under a
  new epoch (Kafka's KIP-360 bump; ``Sequences._settle``). Only batches refused before any
  append (``_REFUSED_BEFORE_APPEND``) hand their sequences on.
- Batches made for a topic since deleted and re-created without their partition fail at once
  as not written (``SenderLoop._replaced``), as a ``send`` to a missing partition does. Every
  request entry carries the topic id its batches were made for (``ProduceTopicData.topic_id``):
  the leader refuses them (INCONSISTENT_TOPIC_ID) if the topic has another id now, and they
  fail as not written once our metadata has the new id too, instead of landing in the new
  topic of the same name.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import grpc

from strom.api import storage_pb2
from strom.client import trace
from strom.client.accumulator import BATCH_OVERHEAD, PartitionQueue, ProducerBatch
from strom.client.add_partitions import AddPartitions
from strom.client.cluster import MIN_ATTEMPT_S, ClusterClient
from strom.client.downgrades import Downgrades
from strom.client.metadata import MetadataCache, PartitionLeader
from strom.client.produce_answers import (
    RETRY_LOG_INTERVAL_S,
    RETRY_QUIET_S,
    ProduceAnswers,
    _earlier,
    _Shipment,
    request_too_large,
)
from strom.client.produce_overdue import (
    OVERDUE_GRACE_S,
    OVERDUE_RECHECK_S,
    OverdueRequests,
    _Outstanding,
)
from strom.client.sequences import Sequences
from strom.client.spin import SpinKeeper
from strom.client.stats import ProducerStats
from strom.client.streams import PRODUCE_STREAM_METHOD, RequestStream, StreamError
from strom.client.transactions import TransactionManager
from strom.client.types import TopicPartition
from strom.client.wire import PRODUCE_METHOD, encode_produce_request
from strom.errors import (
    InvalidRequestError,
    StromError,
    UnknownTopicOrPartitionError,
)

# The producer's logger, not this module's: users filter the producer's lines on
# "strom.client.producer", and the sender's were always among them.
log = logging.getLogger("strom.client.producer")

__all__ = [
    "NODE_WAIT_MARGIN_S",
    "OVERDUE_GRACE_S",
    "OVERDUE_RECHECK_S",
    "RETRY_LOG_INTERVAL_S",
    "RETRY_QUIET_S",
    "STREAM_HANDSHAKE_S",
    "SenderLoop",
    "request_too_large",
]

#: How long the sender waits for a new stream's headers before sending on it anyway (a
#: healthy node answers them in well under a millisecond; a paused one must not hold the
#: sender, which serves every node, for long).
STREAM_HANDSHAKE_S = 0.25

#: How much sooner than a Produce attempt's deadline the node is asked to answer (its wait
#: for acks=all replicas), so that its answer is back before the deadline cancels the call:
#: a quarter of the attempt when that is less (see ``SenderLoop._attempt_deadline``).
NODE_WAIT_MARGIN_S = 1.0


class SenderLoop(ProduceAnswers, Sequences, AddPartitions, OverdueRequests):
    """The sender thread's side of the Producer: the loop and the requests it sends. Their
    answers, retries and failures are :class:`ProduceAnswers`' (strom.client.produce_answers),
    the producer id, epochs and sequence numbers :class:`Sequences`' (strom.client.sequences).

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
    delivery_timeout_s: float
    request_timeout_s: float
    max_in_flight: int
    max_request_size: int
    retry_backoff_s: float
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
    _space_waiters: int
    _queues: dict[tuple[str, int], PartitionQueue]
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
    _epoch_victims: list[tuple[PartitionQueue, list[ProducerBatch]]]
    _wake: threading.Event
    _completions: queue.SimpleQueue[Any]
    _stats: ProducerStats
    _refresher: threading.Thread | None
    #: Requests in flight, oldest first (``_overdue``); touched by the sender thread only.
    _outstanding: dict[_Outstanding, None]

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
                overdue_in = self._overdue(now) if self._outstanding else None
                if now >= self._metadata_due:
                    self._metadata_due = now + self.metadata_max_age_s
                    for topic in list(self._counts):
                        self._metadata.mark_stale(topic)
                self._refresh_metadata(now)
                timeout = self._send_ready(now)
                due_in = self._metadata_due - now
                timeout = due_in if timeout is None else min(timeout, due_in)
                if overdue_in is None and self._outstanding:
                    overdue_in = OVERDUE_GRACE_S  # (all sent just now: due within that)
                if overdue_in is not None:
                    timeout = min(timeout, overdue_in)
            except Exception:  # never let the sender die silently
                log.exception("producer sender loop failed")
                timeout = self.retry_backoff_s
            # (never past threading.TIMEOUT_MAX, which would end this thread: every wait
            # above comes from a setting that int_option bounds by LONG_MS_MAX)
            self._wake.wait(timeout)
            self._wake.clear()

    def _refresh_metadata(self, now: float) -> None:
        """Look up the stale topics' leaders on a thread of its own (one at a time), which
        wakes the loop when it is done.

        Never on the sender thread: the sender serves every node, and a Metadata call can
        take up to an attempt's deadline when the node asked hangs (SIGSTOP, a GC pause, a
        network partition), which would hold up sends to healthy nodes and fire delivery
        timeouts late. Kafka's sender, too, never blocks on metadata."""
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

        They fail at once, as a new ``send`` to a partition the topic lacks does, rather
        than being retried until delivery_timeout_ms. Only a changed id
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
        tracked = _Outstanding(addr, entries, sent + OVERDUE_GRACE_S)
        self._outstanding[tracked] = None

        def done(f: Any) -> None:  # a finished unary future, or a stream's answer
            self._completions.put((addr, entries, f, None, sent, tracked))
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
            self._outstanding.pop(tracked, None)
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
        been written" and its sequence is never reused (see the module docstring).

        The node is told to stop waiting a little before that deadline
        (:data:`NODE_WAIT_MARGIN_S`): its answer (REQUEST_TIMED_OUT when the replicas are
        slow) must come before the deadline, which
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
