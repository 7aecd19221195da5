"""``strom.v1.StorageService`` for one storage node (grpc.aio).

Every request covers many topic-partitions and every partition gets its own error code: a
failure of one (unknown, not leader, corrupt batch, disk error, a bug) is caught and
answered for that partition alone (DESIGN §8). The produce and fetch paths work on whole
batches: the log validates headers and CRCs and writes/reads the bytes as they are, so no
code here looks at individual records (record counts for metrics come from batch headers).

What runs where: partition state is only read and changed on the event loop (no locks).
Appends run on one writer thread in arrival order (:mod:`strom.storage.writer`; small ones
inline), so a slow page-cache write never stalls the loop. Reads are one ``pread`` on the
loop, or in a thread when a writer holds that log's lock. fsync (``flush.messages``/
``flush.ms``), DeleteRecords (unlinks segment files) and timestamp lookups (decode one batch)
run in worker threads. Produce requests and Fetch responses bypass the generated protobuf
code for the record bytes (:mod:`strom.storage.wire`), so a batch is never copied in Python.

Idempotent producers (DESIGN §6): InitProducerId hands out producer ids from blocks the
active controller reserves (:mod:`strom.storage.producer_ids`) and bumps epochs. Every
produced batch, whatever ``acks``, goes through the partition log's sequence check
(:mod:`strom.log.producer_state`) in the same locked step as the append: a refused batch
(OUT_OF_ORDER_SEQUENCE, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID, DUPLICATE_SEQUENCE)
appends nothing for its partition, and a retry of a batch already in the log is answered
NONE with the batch's original base offset (acks=-1 still waits for that offset to be
committed) without writing it again.

FindCoordinator answers from the node's etcd view of the coordinator shard owners
(:mod:`strom.coordinator.lookup`), as any node can.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from strom.api import common_pb2, metadata_pb2, storage_pb2, storage_pb2_grpc
from strom.coordinator.lookup import find_coordinator
from strom.errors import ErrorCode, error_name
from strom.log import (
    AppendInfo,
    CorruptLogError,
    InvalidAppendError,
    InvalidTimestampError,
    Log,
    OffsetOutOfRangeError,
    ProducerStateError,
)
from strom.metadata import ClusterView
from strom.record import InvalidBatchError
from strom.security import CURRENT_PRINCIPAL, QUOTAS
from strom.service.limits import Admission, ProduceShed
from strom.service.metrics import result_code
from strom.storage import metrics
from strom.storage.manager import PartitionManager
from strom.storage.partition import Partition
from strom.storage.producer_ids import ProducerIdAllocator, ProducerIdUnavailableError
from strom.storage.wire import (
    FetchPartitionOut,
    FetchTopicOut,
    ProduceRequestView,
    encode_fetch_response,
    parse_produce_request,
)
from strom.storage.writer import AppendWriter

log = logging.getLogger("strom.storage.servicer")

pb = storage_pb2
E = ErrorCode
R = TypeVar("R")

#: Kafka's defaults for a fetch that does not bound its size (fetch.max.bytes,
#: max.partition.fetch.bytes are always sent by real clients; 0 means "unset" in proto3).
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
#: ListOffsets sentinels.
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3

_PRODUCE_RESULTS: dict[int, Any] = {}


def _count_produce(code: int) -> None:
    child = _PRODUCE_RESULTS.get(code)
    if child is None:
        child = _PRODUCE_RESULTS[code] = metrics.PRODUCE_REQUESTS.labels(error_name(code))
    child.inc()


#: The first partition error of the Fetch being answered (its answer is bytes, so the
#: latency wrapper cannot read it from the response).
_FETCH_RESULT: contextvars.ContextVar[int] = contextvars.ContextVar("fetch_result", default=0)


def _timed(rpc: str) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Record the RPC's latency in strom_storage_request_latency_seconds{rpc, result}: the
    result is the whole-request error, else the first partition's error (NONE = success)."""
    children: dict[str, Any] = {}

    def observe(result: str, seconds: float) -> None:
        child = children.get(result)
        if child is None:
            child = children[result] = metrics.REQUEST_LATENCY.labels(rpc, result)
        child.observe(seconds)

    def deco(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: Any) -> R:
            t0 = time.perf_counter()
            result = "NONE"
            try:
                resp = await fn(self, request, context)
                code = _FETCH_RESULT.get() if isinstance(resp, bytes) else result_code(resp)
                if code:
                    result = error_name(code)
                return resp
            except BaseException as exc:
                result = type(exc).__name__
                raise
            finally:
                observe(result, time.perf_counter() - t0)

        return wrapper

    return deco


class _Refusal(Exception):
    """A per-partition error answer, raised from the lookup helpers."""

    def __init__(self, code: int, message: str, hint: common_pb2.LeaderAndEpoch | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


def _unexpected(what: str, topic: str, partition: int, exc: BaseException) -> _Refusal:
    """Map an exception escaping a partition's work to its error code (and log it)."""
    if isinstance(exc, _Refusal):
        return exc
    if isinstance(exc, CorruptLogError):
        log.error("%s %s-%d: log data failed a check: %s", what, topic, partition, exc)
        return _Refusal(E.STORAGE_ERROR, f"stored data failed a check: {exc}")
    if isinstance(exc, OSError):
        log.error("%s %s-%d: disk error: %s", what, topic, partition, exc)
        return _Refusal(E.STORAGE_ERROR, f"disk error: {exc}")
    log.error("%s %s-%d failed", what, topic, partition, exc_info=exc)
    return _Refusal(E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")


class StorageServicer(storage_pb2_grpc.StorageServiceServicer):
    """The data plane of one node (see the module docstring)."""

    def __init__(self, node_id: int, manager: PartitionManager, view: ClusterView) -> None:
        self.node_id = node_id
        self.manager = manager
        self.view = view
        self.writer = AppendWriter()
        self.shutting_down = False
        #: Called when a follower outside the ISR fetches (the ISR manager checks soon).
        self.on_out_of_sync_fetch: Callable[[], None] | None = None
        #: Where InitProducerId gets new ids (the node wires it to the controller).
        self.producer_ids: ProducerIdAllocator | None = None
        #: Produce admission (in-flight bytes, memory mark); None admits everything.
        self.admission: Admission | None = None

    # -- lookups ---------------------------------------------------------------------------

    def _hint(self, leader: int, epoch: int, hints: set[int]) -> common_pb2.LeaderAndEpoch:
        if leader >= 0:
            hints.add(leader)
        return common_pb2.LeaderAndEpoch(leader_id=leader, leader_epoch=epoch)

    def _endpoints(self, hints: set[int]) -> list[common_pb2.Node]:
        if not hints:
            return []
        nodes = self.view.live_nodes()
        out = []
        for node_id in sorted(hints):
            reg = nodes.get(node_id)
            if reg is not None:
                out.append(_node(reg))
        return out

    def _partition(
        self, topic: str, index: int, current_leader_epoch: int, hints: set[int]
    ) -> Partition:
        """The hosted partition, or a refusal: unknown, not hosted here, wrong epoch."""
        part = self.manager.partitions.get((topic, index))
        if part is None:
            state = self.view.partition(topic, index)
            meta = self.view.topic(topic)
            if state is None or meta is None or meta.deleting:
                raise _Refusal(
                    E.UNKNOWN_TOPIC_OR_PARTITION,
                    f"unknown topic or partition {topic}-{index}",
                )
            s = state.value
            if self.node_id in s.replicas:
                # Assigned here, but the reconcile has not opened the log yet.
                raise _Refusal(
                    E.REPLICA_NOT_AVAILABLE,
                    f"the replica of {topic}-{index} on node {self.node_id} is still being created",
                    self._hint(s.leader, s.leader_epoch, hints),
                )
            raise _Refusal(
                E.NOT_LEADER_OR_FOLLOWER,
                f"node {self.node_id} does not host {topic}-{index}; its leader is {s.leader}",
                self._hint(s.leader, s.leader_epoch, hints),
            )
        bad = part.check_epoch(current_leader_epoch)
        if bad is not None:
            raise _Refusal(bad.code, bad.message, self._hint(part.leader, part.leader_epoch, hints))
        return part

    def _leader(
        self, topic: str, index: int, current_leader_epoch: int, hints: set[int]
    ) -> Partition:
        part = self._partition(topic, index, current_leader_epoch, hints)
        if part.leader < 0:
            raise _Refusal(
                E.LEADER_NOT_AVAILABLE,
                f"{topic}-{index} has no leader at epoch {part.leader_epoch}",
                self._hint(part.leader, part.leader_epoch, hints),
            )
        if not part.is_leader:
            raise _Refusal(
                E.NOT_LEADER_OR_FOLLOWER,
                f"node {self.node_id} is not the leader of {topic}-{index} "
                f"(leader {part.leader}, epoch {part.leader_epoch})",
                self._hint(part.leader, part.leader_epoch, hints),
            )
        return part

    # -- Produce ---------------------------------------------------------------------------

    @_timed("Produce")
    async def Produce(
        self, request: pb.ProduceRequest | ProduceRequestView, context: Any
    ) -> pb.ProduceResponse:
        """Works on a generated ProduceRequest (in-process callers) or on the zero-copy
        :class:`ProduceRequestView` the server's deserializer produces."""
        admitted = 0
        if self.admission is not None:
            admitted = sum(len(pd.records) for td in request.topics for pd in td.partitions)
            refusal = self.admission.try_admit(admitted)
            if refusal is not None:
                metrics.PRODUCE_SHED.inc()
                if context is None:  # an in-process caller (RecordService)
                    raise ProduceShed(refusal)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            return await self._produce(request, context)
        finally:
            if self.admission is not None:
                self.admission.release(admitted)

    async def _produce(
        self, request: pb.ProduceRequest | ProduceRequestView, context: Any
    ) -> pb.ProduceResponse:
        acks = request.acks
        resp = pb.ProduceResponse()
        hints: set[int] = set()
        pending: list[tuple[pb.ProducePartitionResponse, Partition, Any]] = []
        for td in request.topics:
            topic = td.topic
            tr = resp.topics.add(topic=topic)
            for pd in td.partitions:
                pr = tr.partitions.add(partition=pd.partition, base_offset=-1)
                pr.log_append_time_ms = -1
                pr.log_start_offset = -1
                try:
                    part = self._produce_target(topic, pd, acks, hints)
                except Exception as exc:
                    self._produce_failed(pr, _unexpected("produce to", topic, pd.partition, exc))
                    continue
                pending.append((pr, part, pd.records))
        appended = 0
        if pending:
            appended = await self._append_all(pending, acks, request.timeout_ms)
            if appended:
                metrics.client_counter(metrics.CLIENT_BYTES_IN, metrics.client_id_of(context)).inc(
                    appended
                )
        if QUOTAS.active:
            resp.throttle_time_ms = await _throttle("produce", appended)
        if acks == 0:
            return pb.ProduceResponse()
        if hints:
            resp.node_endpoints.extend(self._endpoints(hints))
        return resp

    def _produce_target(self, topic: str, pd: Any, acks: int, hints: set[int]) -> Partition:
        """Everything checked before an append: acks, leadership, epoch, ISR size, data."""
        if acks not in (0, 1, -1):
            raise _Refusal(E.INVALID_REQUEST, f"acks must be 0, 1 or -1, not {acks}")
        part = self._leader(topic, pd.partition, pd.current_leader_epoch, hints)
        # The watch may already know what the reconcile has not applied yet: a leader whose
        # partition state in etcd moved on (a paused old leader waking up) takes no writes.
        current = self.view.partition(topic, pd.partition)
        if current is not None and (
            current.value.leader != self.node_id or current.value.leader_epoch != part.leader_epoch
        ):
            s = current.value
            raise _Refusal(
                E.NOT_LEADER_OR_FOLLOWER,
                f"node {self.node_id} no longer leads {topic}-{pd.partition} "
                f"(leader {s.leader}, epoch {s.leader_epoch})",
                self._hint(s.leader, s.leader_epoch, hints),
            )
        min_isr = part.log.config.min_insync_replicas
        if acks == -1 and len(part.isr) < min_isr:
            raise _Refusal(
                E.NOT_ENOUGH_REPLICAS,
                f"{topic}-{pd.partition} has {len(part.isr)} in-sync replicas, fewer than "
                f"min.insync.replicas={min_isr}",
            )
        if not len(pd.records):
            raise _Refusal(E.CORRUPT_MESSAGE, "no record batches in the request")
        return part

    @staticmethod
    def _produce_failed(pr: pb.ProducePartitionResponse, r: _Refusal) -> None:
        pr.error_code = r.code  # type: ignore[assignment]
        pr.error_message = r.message
        if r.hint is not None:
            pr.current_leader.CopyFrom(r.hint)
        _count_produce(r.code)

    async def _append_all(
        self,
        pending: list[tuple[pb.ProducePartitionResponse, Partition, Any]],
        acks: int,
        timeout_ms: int,
    ) -> int:
        """Append every accepted partition's batches (one writer-thread hop per request),
        then, back on the loop, publish offsets, advance watermarks and wake fetches.
        Returns the record bytes written."""
        jobs = [(part.log, records, part.leader_epoch) for _, part, records in pending]
        size = sum(len(records) for _, _, records in pending)
        outcomes = await self.writer.run(functools.partial(_append_jobs, jobs), size)
        flushes: list[tuple[pb.ProducePartitionResponse, Partition]] = []
        commits: list[tuple[pb.ProducePartitionResponse, Partition, int]] = []
        appended = 0
        for (pr, part, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._produce_failed(pr, _append_error(part, outcome))
                continue
            info: AppendInfo = outcome
            _count_produce(E.NONE)
            lg = part.log
            # For retried idempotent batches: their original offsets (nothing re-written).
            pr.base_offset = info.first_offset
            pr.log_append_time_ms = info.log_append_time_ms
            pr.log_start_offset = lg.log_start_offset
            if info.duplicates:
                metrics.PRODUCER_DUPLICATE_BATCHES.inc(info.duplicates)
            if info.bytes:
                appended += info.bytes
                m = self.manager.metrics.get(part.tp)
                if m is not None:
                    m.bytes_in.inc(info.bytes)
                    m.records_in.inc(info.record_count)
                    m.log_end_offset.set(lg.log_end_offset)
                    m.log_size.inc(info.bytes)
                self.manager.appended.notify(part.tp, info.bytes)
                if part.maybe_advance_high_watermark():
                    self.manager.committed.notify(part.tp, info.bytes)
                if lg.needs_flush():
                    flushes.append((pr, part))
            if acks == -1:
                # A duplicate too: the first attempt may not be committed yet.
                commits.append((pr, part, info.last_offset))
        if flushes:
            await asyncio.gather(*(self._flush(pr, part) for pr, part in flushes))
        if commits:
            timeout = max(timeout_ms, 0) / 1000.0
            await asyncio.gather(*(self._await_commit(pr, p, o, timeout) for pr, p, o in commits))
        return appended

    async def _flush(self, pr: pb.ProducePartitionResponse, part: Partition) -> None:
        """fsync in a thread when flush.messages / flush.ms ask for it; the answer waits so
        that a topic configured for it really is durable when acknowledged."""
        try:
            await self.manager.flush(part)
        except Exception as exc:
            r = _unexpected("flush of", part.topic, part.index, exc)
            pr.error_code = r.code  # type: ignore[assignment]
            pr.error_message = f"appended at offset {pr.base_offset} but not flushed: {r.message}"

    async def _await_commit(
        self, pr: pb.ProducePartitionResponse, part: Partition, last_offset: int, timeout: float
    ) -> None:
        """acks=-1: wait until the high watermark passes the appended records."""
        if pr.error_code:
            return
        if await part.wait_for_high_watermark(last_offset, timeout):
            return
        if part.is_leader and not part.deleted and not part.stopping:
            pr.error_code = E.REQUEST_TIMED_OUT  # type: ignore[assignment]
            pr.error_message = "the in-sync replicas did not confirm the records in time"
        else:
            pr.error_code = E.NOT_LEADER_OR_FOLLOWER  # type: ignore[assignment]
            pr.error_message = "leadership moved before the records were committed"

    # -- WriteTxnMarkers --------------------------------------------------------------------

    @_timed("WriteTxnMarkers")
    async def WriteTxnMarkers(
        self, request: pb.WriteTxnMarkersRequest, context: Any
    ) -> pb.WriteTxnMarkersResponse:
        """Append each marker to its partitions (leader only) and answer once the in-sync
        replicas have it, like acks=-1: the transaction coordinator completes a transaction
        only when every marker is durable, so a read_committed consumer of any replica that
        becomes leader sees the outcome."""
        resp = pb.WriteTxnMarkersResponse()
        timeout = max(request.timeout_ms, 0) / 1000.0 or 30.0
        hints: set[int] = set()
        waits: list[Awaitable[None]] = []
        for m in request.markers:
            mr = resp.markers.add(producer_id=m.producer_id)
            for tp in m.topics:
                tr = mr.topics.add(topic=tp.topic)
                for index in tp.partitions:
                    pr = tr.partitions.add(partition=index)
                    try:
                        part = self._leader(tp.topic, index, -1, hints)
                    except Exception as exc:
                        self._marker_failed(pr, _unexpected("marker to", tp.topic, index, exc))
                        continue
                    job = functools.partial(
                        part.log.append_marker,
                        m.producer_id,
                        m.producer_epoch,
                        m.committed,
                        m.coordinator_epoch,
                        leader_epoch=part.leader_epoch,
                    )
                    try:
                        info: AppendInfo = await self.writer.run(job, 128)
                    except Exception as exc:
                        self._marker_failed(pr, _append_error(part, exc))
                        continue
                    metrics.TXN_MARKERS.labels("COMMIT" if m.committed else "ABORT").inc()
                    self.manager.appended.notify(part.tp, info.bytes)
                    if part.maybe_advance_high_watermark():
                        self.manager.committed.notify(part.tp, info.bytes)
                    self.manager.refresh_gauges(part)
                    waits.append(self._marker_committed(pr, part, info.last_offset, timeout))
        if waits:
            await asyncio.gather(*waits)
        return resp

    @staticmethod
    def _marker_failed(pr: pb.TxnMarkerPartitionResult, r: _Refusal) -> None:
        pr.error_code = r.code  # type: ignore[assignment]
        pr.error_message = r.message
        metrics.TXN_MARKERS.labels(error_name(r.code)).inc()

    async def _marker_committed(
        self, pr: pb.TxnMarkerPartitionResult, part: Partition, offset: int, timeout: float
    ) -> None:
        if await part.wait_for_high_watermark(offset, timeout):
            return
        if part.is_leader and not part.deleted and not part.stopping:
            pr.error_code = E.REQUEST_TIMED_OUT  # type: ignore[assignment]
            pr.error_message = "the in-sync replicas did not confirm the marker in time"
        else:
            pr.error_code = E.NOT_LEADER_OR_FOLLOWER  # type: ignore[assignment]
            pr.error_message = "leadership moved before the marker was committed"

    # -- Fetch -----------------------------------------------------------------------------

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        """In-process form of :meth:`fetch_raw` (the server is wired to the raw one)."""
        return pb.FetchResponse.FromString(await self.fetch_raw(request, context))

    @_timed("Fetch")
    async def fetch_raw(self, request: pb.FetchRequest, context: Any) -> bytes:
        """Fetch, answered as serialized FetchResponse bytes (records spliced in uncopied).

        Long poll: the waiter is parked *before* each read pass (wake on any byte), so an
        append that lands while a read is in progress (a read may hop to a thread) is never
        missed; if one did land, the pass is simply repeated. Otherwise the waiter is told
        how many bytes are still missing and the fetch sleeps on its future until they
        arrive, a state change wakes it, or max_wait_ms passes.
        """
        follower = request.replica_id >= 0
        metrics.FETCH_REQUESTS.labels("follower" if follower else "consumer").inc()
        registry = self.manager.appended if follower else self.manager.committed
        keys = _fetch_keys(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000.0
        min_bytes = max(request.min_bytes, 1)
        last_pass = False
        while True:
            waiter = registry.park(keys, 1)
            try:
                topics, total, done, hints = await self._fetch_once(request)
                if done or total >= min_bytes or last_pass or self.shutting_down:
                    break
                if registry.closed:
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                if not waiter.woken:  # nothing landed during the read
                    waiter.remaining = min_bytes - total
                    # After a timeout, one more pass answers with whatever is there now.
                    last_pass = not await registry.wait(waiter, remaining)
            finally:
                registry.unpark(waiter)
        endpoints = None
        if hints:
            endpoints = pb.FetchResponse(node_endpoints=self._endpoints(hints))
        for tout in topics:
            for pout in tout.partitions:
                if pout.message.error_code:
                    _FETCH_RESULT.set(pout.message.error_code)
                    break
        if total and not follower:
            metrics.client_counter(metrics.CLIENT_BYTES_OUT, metrics.client_id_of(context)).inc(
                total
            )
        if QUOTAS.active and not follower:
            throttled = await _throttle("fetch", total)
            if throttled:
                endpoints = endpoints or pb.FetchResponse()
                endpoints.throttle_time_ms = throttled
        return encode_fetch_response(topics, endpoints)

    async def _fetch_once(
        self, request: pb.FetchRequest
    ) -> tuple[list[FetchTopicOut], int, bool, set[int]]:
        """One pass over the requested partitions: (answer, record bytes, answer now?, hints)."""
        replica_id = request.replica_id
        follower = replica_id >= 0
        read_committed = (
            not follower and request.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED
        )
        budget = request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        out: list[FetchTopicOut] = []
        hints: set[int] = set()
        total = 0
        answer_now = False
        for ft in request.topics:
            topic = ft.topic
            tout = FetchTopicOut(topic)
            out.append(tout)
            for fp in ft.partitions:
                pr = pb.FetchPartitionResponse(partition=fp.partition, preferred_read_replica=-1)
                pout = FetchPartitionOut(pr)
                tout.partitions.append(pout)
                try:
                    part = self._leader(topic, fp.partition, fp.current_leader_epoch, hints)
                    if ft.topic_id and part.topic_id and ft.topic_id != part.topic_id:
                        raise _Refusal(
                            E.INCONSISTENT_TOPIC_ID,
                            f"topic {topic} now has id {part.topic_id}, not {ft.topic_id}",
                        )
                    if follower and not self._follower_position(part, replica_id, fp, pr):
                        answer_now = True
                        continue
                    n = await self._read(
                        part, fp, follower, budget - total, total == 0, pout, read_committed
                    )
                except Exception as exc:
                    r = _unexpected("fetch from", topic, fp.partition, exc)
                    pr.error_code = r.code  # type: ignore[assignment]
                    pr.error_message = r.message
                    if r.code != E.OFFSET_OUT_OF_RANGE:
                        pr.high_watermark = pr.last_stable_offset = pr.log_start_offset = -1
                    if r.hint is not None:
                        pr.current_leader.CopyFrom(r.hint)
                    answer_now = True
                    continue
                total += n
        return out, total, answer_now, hints

    async def _read(
        self,
        part: Partition,
        fp: pb.FetchPartition,
        follower: bool,
        budget: int,
        first: bool,
        pout: FetchPartitionOut,
        read_committed: bool = False,
    ) -> int:
        """Read one partition into ``pout``; returns the record bytes added.

        read_committed reads stop at the last stable offset, and the answer lists the
        aborted transactions that may have batches in what was read (the consumer drops
        them batch by batch; nothing here looks inside a batch).

        The read is one pread of page-cache data and runs on the loop, unless a worker
        thread holds the log's lock (an append being written, a flush snapshot, a cleaner
        swap): then it runs in a thread instead of stalling every other request behind it.
        """
        pr = pout.message
        hw = part.high_watermark
        lso = part.last_stable_offset
        pr.high_watermark = hw
        pr.last_stable_offset = lso
        pr.log_start_offset = part.log_start_offset
        limit = fp.partition_max_bytes if fp.partition_max_bytes > 0 else budget
        limit = min(limit, budget)
        if limit <= 0 and not first:
            return 0
        lg = part.log
        # Kafka semantics: the first partition with data returns at least one whole batch
        # even when it exceeds max_bytes / partition_max_bytes, so consumers progress.
        read = functools.partial(
            lg.read,
            fp.fetch_offset,
            max(limit, 0),
            max_offset=None if follower else lso if read_committed else hw,
            min_one=first,
        )
        try:
            if lg.lock.acquire(blocking=False):
                try:
                    result = read()
                finally:
                    lg.lock.release()
            else:
                result = await asyncio.to_thread(read)
        except OffsetOutOfRangeError as exc:
            raise _Refusal(
                E.OFFSET_OUT_OF_RANGE,
                f"fetch offset {exc.offset} is outside the log of {part.topic}-{part.index}: "
                f"log start offset {exc.log_start_offset}, high watermark {hw}, "
                f"log end offset {exc.log_end_offset}",
            ) from None
        n = len(result.data)
        if n and read_committed and lg.aborted:
            for a in lg.aborted_transactions(fp.fetch_offset, result.next_offset):
                pr.aborted_transactions.add(producer_id=a.producer_id, first_offset=a.first_offset)
        if n:
            pout.records = result.data
            if follower:
                metrics.REPLICATION_BYTES_OUT.inc(n)
            else:
                m = self.manager.metrics.get(part.tp)
                if m is not None:
                    m.bytes_out.inc(n)
                    # Offsets sent: from the first batch's base offset (header bytes 0-8).
                    m.records_out.inc(result.next_offset - int.from_bytes(result.data[:8], "big"))
        return n

    def _follower_position(
        self,
        part: Partition,
        replica_id: int,
        fp: pb.FetchPartition,
        pr: pb.FetchPartitionResponse,
    ) -> bool:
        """Leader side of a follower fetch: check the follower's log against our epoch
        history and record its position (which may advance the high watermark). Returns
        False when the answer is a diverging epoch instead of data."""
        if replica_id not in part.replicas:
            raise _Refusal(
                E.NOT_LEADER_OR_FOLLOWER,
                f"node {replica_id} is not a replica of {part.topic}-{part.index}",
            )
        if fp.last_fetched_epoch >= 0:
            epoch, end = part.log.epochs.end_offset_for(
                fp.last_fetched_epoch, part.log.log_end_offset
            )
            if epoch != fp.last_fetched_epoch or end < fp.fetch_offset:
                pr.diverging_epoch.epoch = epoch
                pr.diverging_epoch.end_offset = end
                pr.high_watermark = part.high_watermark
                pr.last_stable_offset = part.last_stable_offset
                pr.log_start_offset = part.log_start_offset
                return False
        if part.record_follower_end_offset(replica_id, fp.fetch_offset):
            self.manager.committed.notify(part.tp, 1 << 30)
        if replica_id not in part.isr and self.on_out_of_sync_fetch is not None:
            self.on_out_of_sync_fetch()
        return True

    # -- ListOffsets -----------------------------------------------------------------------

    @_timed("ListOffsets")
    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        resp = pb.ListOffsetsResponse()
        hints: set[int] = set()
        read_committed = request.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED
        for lt in request.topics:
            tr = resp.topics.add(topic=lt.topic)
            for lp in lt.partitions:
                pr = tr.partitions.add(partition=lp.partition, timestamp=-1, offset=-1)
                pr.leader_epoch = -1
                try:
                    await self._list_offset(
                        lt.topic, lp, request.replica_id, pr, hints, read_committed
                    )
                except Exception as exc:
                    r = _unexpected("list offsets of", lt.topic, lp.partition, exc)
                    pr.error_code = r.code  # type: ignore[assignment]
                    pr.error_message = r.message
                    pr.timestamp = pr.offset = -1
                    pr.leader_epoch = -1
        return resp

    async def _list_offset(
        self,
        topic: str,
        lp: pb.ListOffsetsPartition,
        replica_id: int,
        pr: pb.ListOffsetsPartitionResponse,
        hints: set[int],
        read_committed: bool = False,
    ) -> None:
        part = self._leader(topic, lp.partition, lp.current_leader_epoch, hints)
        lg = part.log
        ts = lp.timestamp
        if ts == LATEST:
            if replica_id >= 0:
                pr.offset = lg.log_end_offset
            elif read_committed:
                pr.offset = part.last_stable_offset
            else:
                pr.offset = part.high_watermark
            pr.leader_epoch = part.leader_epoch
        elif ts == EARLIEST:
            pr.offset = lg.log_start_offset
            pr.leader_epoch = lg.epochs.epoch_for(pr.offset)
        elif ts == MAX_TIMESTAMP:
            found = lg.max_timestamp_offset()
            if found is not None and (replica_id >= 0 or found[0] < part.high_watermark):
                pr.offset, pr.timestamp = found
                pr.leader_epoch = lg.epochs.epoch_for(found[0])
        elif ts >= 0:
            # Decodes (at most) the batch holding the match: a worker thread, not the loop.
            hit = await asyncio.to_thread(lg.offset_for_timestamp, ts)
            if hit is not None and (replica_id >= 0 or hit[0] < part.high_watermark):
                pr.offset, pr.timestamp, pr.leader_epoch = hit
        else:
            raise _Refusal(E.INVALID_REQUEST, f"timestamp {ts} is not -1, -2, -3 or >= 0")

    # -- OffsetForLeaderEpoch --------------------------------------------------------------

    @_timed("OffsetForLeaderEpoch")
    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetForLeaderEpochResponse:
        resp = pb.OffsetForLeaderEpochResponse()
        hints: set[int] = set()
        for ot in request.topics:
            tr = resp.topics.add(topic=ot.topic)
            for op in ot.partitions:
                pr = tr.partitions.add(partition=op.partition, leader_epoch=-1, end_offset=-1)
                try:
                    part = self._leader(ot.topic, op.partition, op.current_leader_epoch, hints)
                    epoch, end = part.log.epochs.end_offset_for(
                        op.leader_epoch, part.log.log_end_offset
                    )
                    pr.leader_epoch, pr.end_offset = epoch, end
                except Exception as exc:
                    r = _unexpected("epoch lookup of", ot.topic, op.partition, exc)
                    pr.error_code = r.code  # type: ignore[assignment]
                    pr.error_message = r.message
        return resp

    # -- DeleteRecords ---------------------------------------------------------------------

    @_timed("DeleteRecords")
    async def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRecordsResponse:
        resp = pb.DeleteRecordsResponse()
        hints: set[int] = set()
        for dt in request.topics:
            tr = resp.topics.add(topic=dt.topic)
            for dp in dt.partitions:
                pr = tr.partitions.add(partition=dp.partition, low_watermark=-1)
                try:
                    part = self._leader(dt.topic, dp.partition, -1, hints)
                    hw = part.high_watermark
                    offset = hw if dp.offset == -1 else dp.offset
                    if offset < 0 or offset > hw:
                        raise _Refusal(
                            E.OFFSET_OUT_OF_RANGE,
                            f"cannot delete below offset {dp.offset} of {dt.topic}-"
                            f"{dp.partition}: it must be -1 or in [0, {hw}] (high watermark)",
                        )
                    # Unlinks whole segments below the new start: a worker thread.
                    pr.low_watermark = await asyncio.to_thread(part.log.delete_records, offset)
                    part.maybe_advance_high_watermark()
                    self.manager.refresh_gauges(part)
                except Exception as exc:
                    r = _unexpected("delete records of", dt.topic, dp.partition, exc)
                    pr.error_code = r.code  # type: ignore[assignment]
                    pr.error_message = r.message
                    pr.low_watermark = -1
        return resp

    # -- Metadata --------------------------------------------------------------------------

    @_timed("Metadata")
    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        view = self.view
        with view.lock:
            cluster = view.cluster
            nodes = {i: v.value for i, v in view.nodes.items()}
            controller = view.controller.value if view.controller else None
            topics = {} if request.skip_topics else {n: v.value for n, v in view.topics.items()}
            states = (
                {} if request.skip_topics else {tp: v.value for tp, v in view.partitions.items()}
            )
        resp = pb.MetadataResponse(cluster_id=cluster.cluster_id if cluster else "")
        resp.nodes.extend(_node(nodes[i]) for i in sorted(nodes))
        if controller is not None:
            resp.controller.CopyFrom(
                common_pb2.Node(
                    node_id=controller.controller_id, host=controller.host, port=controller.port
                )
            )
        else:
            resp.controller.node_id = -1
        if request.skip_topics:
            return resp
        by_topic: dict[str, list[tuple[int, metadata_pb2.PartitionState]]] = {}
        for (t, p), s in states.items():
            by_topic.setdefault(t, []).append((p, s))
        names = sorted(set(request.topics)) if request.topics else sorted(topics)
        for name in names:
            meta = topics.get(name)
            mt = resp.topics.add(name=name)
            if meta is None or meta.deleting:
                mt.error_code = E.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[assignment]
                mt.error_message = f"unknown topic {name}"
                continue
            mt.topic_id = meta.topic_id
            mt.is_internal = meta.internal
            for p, s in sorted(by_topic.get(name, ()), key=lambda x: x[0]):
                if s.topic_id and meta.topic_id and s.topic_id != meta.topic_id:
                    continue  # a leftover of an earlier topic with this name
                mp = mt.partitions.add(
                    partition=p,
                    leader=s.leader,
                    leader_epoch=s.leader_epoch,
                    replicas=s.replicas,
                    isr=s.isr,
                    offline_replicas=[r for r in s.replicas if r not in nodes],
                )
                if s.leader < 0:
                    mp.error_code = E.LEADER_NOT_AVAILABLE  # type: ignore[assignment]
                    mp.error_message = f"{name}-{p} has no leader"
        return resp

    # -- InitProducerId --------------------------------------------------------------------

    @_timed("InitProducerId")
    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: Any
    ) -> pb.InitProducerIdResponse:
        """A new producer id at epoch 0 (producer_id -1), or the next epoch of the given id
        (a new id at epoch 0 when the epoch would pass 32767). Any node answers."""
        resp = pb.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)

        def fail(code: int, message: str) -> pb.InitProducerIdResponse:
            resp.error_code = code  # type: ignore[assignment]
            resp.error_message = message
            metrics.INIT_PRODUCER_ID.labels(error_name(code)).inc()
            return resp

        if request.HasField("transactional_id"):
            return fail(
                E.INVALID_REQUEST,
                "a transactional producer gets its producer id from its transaction "
                "coordinator (CoordinatorService.InitProducerId): leave transactional_id unset "
                "here",
            )
        if self.producer_ids is None:
            return fail(E.UNKNOWN_SERVER_ERROR, "this node does not hand out producer ids")
        try:
            got = await self.producer_ids.init(request.producer_id, request.producer_epoch)
        except ValueError as exc:
            return fail(E.INVALID_REQUEST, str(exc))
        except ProducerIdUnavailableError as exc:
            return fail(exc.code, exc.message)
        except Exception as exc:
            log.error("InitProducerId failed", exc_info=exc)
            return fail(E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        resp.producer_id = got.producer_id
        resp.producer_epoch = got.epoch
        metrics.INIT_PRODUCER_ID.labels("new" if got.new_id else "bump").inc()
        return resp

    # -- FindCoordinator -------------------------------------------------------------------

    @_timed("FindCoordinator")
    async def FindCoordinator(
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        """The shard owner of each group from this node's etcd view (``coordinators/<s>``);
        COORDINATOR_NOT_AVAILABLE while a shard has no owner."""
        return find_coordinator(self.view, request)


def add_to_server(servicer: StorageServicer, server: grpc.aio.Server) -> None:
    """Register the servicer under ``strom.v1.StorageService``.

    Like the generated ``add_StorageServiceServicer_to_server``, except for the two bulk
    methods: Produce requests are parsed by :func:`parse_produce_request` (record bytes not
    copied) and Fetch answers are pre-serialized bytes from :meth:`StorageServicer.fetch_raw`.
    """
    unary = grpc.unary_unary_rpc_method_handler

    def std(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
        return unary(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    handlers = {
        "Produce": unary(
            servicer.Produce,
            request_deserializer=parse_produce_request,
            response_serializer=pb.ProduceResponse.SerializeToString,
        ),
        "Fetch": unary(servicer.fetch_raw, request_deserializer=pb.FetchRequest.FromString),
        "ListOffsets": std(servicer.ListOffsets, pb.ListOffsetsRequest, pb.ListOffsetsResponse),
        "OffsetForLeaderEpoch": std(
            servicer.OffsetForLeaderEpoch,
            pb.OffsetForLeaderEpochRequest,
            pb.OffsetForLeaderEpochResponse,
        ),
        "DeleteRecords": std(
            servicer.DeleteRecords, pb.DeleteRecordsRequest, pb.DeleteRecordsResponse
        ),
        "Metadata": std(servicer.Metadata, pb.MetadataRequest, pb.MetadataResponse),
        "InitProducerId": std(
            servicer.InitProducerId, pb.InitProducerIdRequest, pb.InitProducerIdResponse
        ),
        "FindCoordinator": std(
            servicer.FindCoordinator, pb.FindCoordinatorRequest, pb.FindCoordinatorResponse
        ),
        "WriteTxnMarkers": std(
            servicer.WriteTxnMarkers, pb.WriteTxnMarkersRequest, pb.WriteTxnMarkersResponse
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["StorageService"]
    missing = {m.name for m in service.methods} - set(handlers)
    assert not missing, f"StorageService methods without a handler: {missing}"
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(service.full_name, handlers)


async def _throttle(kind: str, nbytes: int) -> int:
    """Hold the answer back while the caller is over its quota (Kafka's throttling: delay,
    never drop); the ms it was held, for ``throttle_time_ms``."""
    delay = QUOTAS.throttle(CURRENT_PRINCIPAL.get(), kind, nbytes)
    if delay <= 0:
        return 0
    metrics.THROTTLED.labels(kind).inc()
    await asyncio.sleep(delay)
    return int(delay * 1000)


def _append_jobs(jobs: list[tuple[Log, Any, int]]) -> list[AppendInfo | BaseException]:
    """Append each (log, records, leader epoch); an exception is that partition's result."""
    out: list[AppendInfo | BaseException] = []
    for lg, records, epoch in jobs:
        try:
            out.append(lg.append(records, leader_epoch=epoch))
        except Exception as exc:
            out.append(exc)
    return out


def _append_error(part: Partition, exc: BaseException) -> _Refusal:
    if isinstance(exc, ProducerStateError):
        code = ErrorCode.Value(exc.reason)
        metrics.PRODUCER_REJECTED_BATCHES.labels(exc.reason).inc()
        return _Refusal(code, f"{part.topic}-{part.index}: {exc.message}")
    if isinstance(exc, InvalidBatchError):
        code = E.MESSAGE_TOO_LARGE if exc.too_large else E.CORRUPT_MESSAGE
        return _Refusal(code, f"{part.topic}-{part.index}: {exc}")
    if isinstance(exc, InvalidTimestampError):
        return _Refusal(E.INVALID_TIMESTAMP, f"{part.topic}-{part.index}: {exc}")
    if isinstance(exc, InvalidAppendError):
        # The log holds a newer epoch than this node's view of the leadership: the view lags
        # etcd. The client refreshes metadata and retries.
        return _Refusal(E.NOT_LEADER_OR_FOLLOWER, str(exc))
    return _unexpected("produce to", part.topic, part.index, exc)


def _node(reg: metadata_pb2.NodeRegistration) -> common_pb2.Node:
    node = common_pb2.Node(node_id=reg.node_id, host=reg.host, port=reg.port)
    if reg.HasField("rack"):
        node.rack = reg.rack
    return node


def _fetch_keys(request: pb.FetchRequest) -> list[tuple[str, int]]:
    return [(ft.topic, fp.partition) for ft in request.topics for fp in ft.partitions]
