"""``strom.v1.StorageService`` for one storage node (grpc.aio): the servicer and its wiring.

The handlers are grouped by concern, mixed into :class:`StorageServicer` here:

- this module: Produce and WriteTxnMarkers (the append paths) and the server wiring;
- :mod:`~strom.storage.fetch_rpcs`: Fetch (consumers and followers, long polling);
- :mod:`~strom.storage.stream_rpcs`: ProduceStream and FetchStream (the same on streams);
- :mod:`~strom.storage.offsets_rpcs`: ListOffsets, OffsetForLeaderEpoch, DeleteRecords;
- :mod:`~strom.storage.cluster_rpcs`: Metadata, InitProducerId, FindCoordinator;
- :mod:`~strom.storage.rpc_base`: per-partition refusals and lookups they all share.

Every request covers many topic-partitions and every partition gets its own error code: a
failure of one (unknown, not leader, corrupt batch, disk error, a bug) is caught and
answered for that partition alone (DESIGN §8). The produce and fetch paths work on whole
batches: the log validates headers and CRCs and writes/reads the bytes as they are, so no
code here looks at individual records (record counts for metrics come from batch headers).

What runs where: partition state is only read and changed on the event loop (no locks).
Appends run on one writer thread in arrival order (:mod:`strom.storage.writer`; small ones
inline), so a slow page-cache write never stalls the loop. fsync (``flush.messages``/
``flush.ms``) runs in worker threads. Produce requests bypass the generated protobuf code for
the record bytes (:mod:`strom.storage.wire`), so a batch is never copied in Python.

Idempotent producers (DESIGN §6): every produced batch, whatever ``acks``, goes through the
partition log's sequence check (:mod:`strom.log.producer_state`) in the same locked step as
the append: a refused batch (OUT_OF_ORDER_SEQUENCE, INVALID_PRODUCER_EPOCH,
UNKNOWN_PRODUCER_ID, DUPLICATE_SEQUENCE) appends nothing for its partition, and a retry of a
batch already in the log is answered NONE with the batch's original base offset (acks=-1
still waits for that offset to be committed) without writing it again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from strom.api import storage_pb2, storage_pb2_grpc
from strom.errors import ErrorCode, error_name
from strom.log import (
    AppendInfo,
    InvalidAppendError,
    InvalidTimestampError,
    Log,
    ProducerStateError,
)
from strom.metadata import ClusterView
from strom.record import InvalidBatchError
from strom.security import QUOTAS, server_security
from strom.service.headers import INTERNAL_TOPICS_METADATA_KEY, is_internal_call
from strom.service.limits import Admission, ProduceShed
from strom.service.stream_writes import writes_answers
from strom.storage import metrics
from strom.storage.cluster_rpcs import ClusterRpcs
from strom.storage.disk_errors import is_disk_error, note_append_failure
from strom.storage.fetch_rpcs import FetchRpcs
from strom.storage.manager import PartitionManager
from strom.storage.offsets_rpcs import OffsetRpcs
from strom.storage.partition import Partition
from strom.storage.producer_ids import ProducerIdAllocator
from strom.storage.producers_rpcs import ProducerRpcs
from strom.storage.rpc_base import (
    _charge,
    _hold,
    _owing_principal,
    _Refusal,
    _timed,
    _unexpected,
    _wait_out_debt,
    add_handlers,
)
from strom.storage.stream_rpcs import StreamRpcs
from strom.storage.wire import ProduceRequestView, decode_produce_request
from strom.storage.writer import AppendWriter

log = logging.getLogger("strom.storage.servicer")

pb = storage_pb2
E = ErrorCode

_PRODUCE_RESULTS: dict[int, Any] = {}

#: An acks=-1 partition's wait for its commit: (answer, partition, offset the high watermark
#: must pass, the refusal to answer once it has: DUPLICATE_SEQUENCE's; None = the append's).
_CommitWait = tuple[pb.ProducePartitionResponse, Partition, int, _Refusal | None]


def _internal_topic_refusal(topic: str) -> _Refusal:
    """INVALID_TOPIC for a write to an internal ``__`` topic by anyone but strom's own
    coordinators (service.headers.is_internal_call), as Kafka refuses it even to super users.
    One client record in ``__consumer_offsets`` whose key was not a group
    record kept its shard from loading, and every group on it unavailable, for good."""
    return _Refusal(
        E.INVALID_TOPIC,
        f"topic {topic!r} is internal: only strom's coordinators write to it (committed "
        "offsets, transaction state); clients cannot, super users included",
    )


#: Seconds between two log lines about internal-topic writes accepted from old coordinators.
OLD_COORDINATOR_LOG_INTERVAL_S = 60.0


def _count_produce(code: int) -> None:
    child = _PRODUCE_RESULTS.get(code)
    if child is None:
        child = _PRODUCE_RESULTS[code] = metrics.PRODUCE_REQUESTS.labels(error_name(code))
    child.inc()


class StorageServicer(
    FetchRpcs,
    OffsetRpcs,
    ProducerRpcs,
    ClusterRpcs,
    StreamRpcs,
    storage_pb2_grpc.StorageServiceServicer,
):
    """The data plane of one node (see the module docstring)."""

    def __init__(self, node_id: int, manager: PartitionManager, view: ClusterView) -> None:
        self.node_id = node_id
        self.manager = manager
        self.view = view
        self.writer = AppendWriter()
        self.shutting_down = False
        self.stream_readers = set()
        #: Called when a follower outside the ISR fetches, or a read of a led partition finds
        #: damaged data (the ISR manager checks soon: an expansion, or a resignation).
        self.on_out_of_sync_fetch: Callable[[], None] | None = None
        #: Where InitProducerId gets new ids (the node wires it to the controller).
        self.producer_ids: ProducerIdAllocator | None = None
        #: Produce admission (in-flight bytes, memory mark); None admits everything.
        self.admission: Admission | None = None
        #: When a headerless internal-topic write of an old coordinator was last logged.
        self._old_coordinator_logged = -OLD_COORDINATOR_LOG_INTERVAL_S

    # -- Produce ---------------------------------------------------------------------------

    @_timed("Produce")
    async def Produce(
        self, request: pb.ProduceRequest | ProduceRequestView, context: Any
    ) -> pb.ProduceResponse:
        """Works on a generated ProduceRequest (in-process callers) or on the zero-copy
        :class:`ProduceRequestView` the server's deserializer produces."""
        admitted = 0
        owing = None
        if self.admission is not None:
            admitted = sum(len(pd.records) for td in request.topics for pd in td.partitions)
            owing = _owing_principal("produce")
            refusal = self.admission.try_admit(admitted, owing)
            if refusal is not None:
                metrics.PRODUCE_SHED.inc()
                if context is None:  # an in-process caller (RecordService)
                    raise ProduceShed(refusal)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        try:
            return await self._produce(request, context)
        finally:
            if self.admission is not None:
                self.admission.release(admitted, owing)

    async def _produce(
        self, request: pb.ProduceRequest | ProduceRequestView, context: Any
    ) -> pb.ProduceResponse:
        # First, before anything is appended: a caller still ahead of its produce quota
        # waits until it is not, then is charged (nothing yields from here to the append:
        # order is kept, and concurrent requests each see the charges before them).
        waited, delay = await self._charge_produce(request) if QUOTAS.active else (0, 0.0)
        charged = asyncio.get_running_loop().time()
        acks = request.acks
        resp = pb.ProduceResponse()
        hints: set[int] = set()
        pending: list[tuple[pb.ProducePartitionResponse, Partition, Any]] = []
        for td in request.topics:
            topic = td.topic
            tr = resp.topics.add(topic=topic)
            refused = self._internal_topic_check(topic, context)
            topic_id = td.topic_id
            if refused is None and topic_id:
                refused = self._topic_id_refusal(topic, topic_id)
            for pd in td.partitions:
                pr = tr.partitions.add(partition=pd.partition, base_offset=-1)
                pr.log_append_time_ms = -1
                pr.log_start_offset = -1
                try:
                    if refused is not None:
                        raise refused
                    part = self._produce_target(topic, pd, acks, hints)
                    if topic_id and part.topic_id and part.topic_id != topic_id:
                        # The view has the new topic, but the replica hosted is still the
                        # deleted one's (the reconcile replaces it in a moment).
                        raise _Refusal(
                            E.REPLICA_NOT_AVAILABLE,
                            f"the replica of {topic}-{pd.partition} on node {self.node_id} is "
                            f"still the deleted topic's (id {part.topic_id}), not the one of "
                            f"id {topic_id}",
                        )
                except Exception as exc:
                    self._produce_failed(pr, _unexpected("produce to", topic, pd.partition, exc))
                    continue
                pending.append((pr, part, pd.records))
        appended = 0
        if pending:
            # Transactional batches need the request's transactional_id only where there is
            # something to check with it: with ACLs on, WRITE on the id. With ACLs off, a
            # request without one (a client from before ProduceRequest.transactional_id) is
            # appended as it was then (a rolling upgrade failed every
            # transaction of old producers on an upgraded leader; Kafka serves old clients).
            named = bool(request.transactional_id) or not server_security().acls
            appended = await self._append_all(pending, acks, request.timeout_ms, named)
            if appended:
                metrics.client_counter(metrics.CLIENT_BYTES_IN, metrics.client_id_of(context)).inc(
                    appended
                )
        if QUOTAS.active or waited:
            # The hold counts from the charge; never into the end of the caller's deadline
            # (what is not held, its next request waits out first).
            remaining = delay - (asyncio.get_running_loop().time() - charged)
            resp.throttle_time_ms = await _hold("produce", remaining, waited, context)
        if acks == 0:
            return pb.ProduceResponse()
        if hints:
            resp.node_endpoints.extend(self._endpoints(hints))
        return resp

    @staticmethod
    async def _charge_produce(request: pb.ProduceRequest | ProduceRequestView) -> tuple[int, float]:
        """Before a Produce (unary or on a stream) appends anything: the wait while its
        caller owes, then the charge of the request's record bytes to its produce quota;
        (ms waited, seconds its answer is to be held). As ProduceRecords charges
        (RecordService._admit_and_charge) and as Kafka charges a produce request's size,
        whatever its partitions' outcomes. Charged after the
        append, concurrent requests of a principal owing nothing all passed the wait at
        once, each appended before any was charged. Counted per batch, never per record."""
        waited = await _wait_out_debt("produce")
        nbytes = sum(len(pd.records) for td in request.topics for pd in td.partitions)
        return waited, _charge("produce", nbytes)

    def _internal_topic_check(self, topic: str, context: Any) -> _Refusal | None:
        """The refusal of a write to an internal ``__`` topic without the coordinators'
        header, unless a coordinator of an older version holds a shard (a version gate, as
        Kafka enables a feature once every broker supports it): coordinators from before the
        header never send it, and refusing them made every shard led by an upgraded node
        COORDINATOR_LOAD_IN_PROGRESS until the last coordinator was upgraded (found from
        outside, rolling upgrade). In-process callers (RecordService) are always refused. With
        ACLs on, such a call still needs CLUSTER_ACTION (strom.security.rules)."""
        if not topic.startswith("__") or is_internal_call(context):
            return None
        if context is not None:
            old = self._old_coordinator()
            if old is not None:
                self._note_old_coordinator_write(topic, old)
                return None
        return _internal_topic_refusal(topic)

    def _old_coordinator(self) -> Any:
        """A shard owner (``coordinators/<s>``, ``txn_coordinators/<s>``) in this node's view
        whose process has no ``coordinator_members/<incarnation>`` key: a coordinator from
        before that registration, which is also before the internal-topics header. Every
        coordinator that sends the header registers (before it claims a shard, on the same
        lease), so None means the header can be required. Only headerless internal writes
        ask, so the scan of the shard owners is off the produce path."""
        view = self.view
        with view.lock:
            members = view.coordinator_members
            for owners in (view.coordinators, view.txn_coordinators):
                for owner in owners.values():
                    if owner.value.incarnation_id not in members:
                        return owner.value
        return None

    def _note_old_coordinator_write(self, topic: str, owner: Any) -> None:
        """Count a headerless internal write accepted for an old coordinator; log it at most
        once a minute, naming one such coordinator so operators know what to upgrade."""
        metrics.OLD_COORDINATOR_WRITES.inc()
        now = time.monotonic()
        if now - self._old_coordinator_logged < OLD_COORDINATOR_LOG_INTERVAL_S:
            return
        self._old_coordinator_logged = now
        log.warning(
            "accepting writes to %s without the %s header: coordinator %d (%s:%d, incarnation "
            "%s) owns a shard and has no coordinator_members registration, so it is of an "
            "older version that does not send it; upgrade it (the header is required again "
            "once every shard owner is registered)",
            topic,
            INTERNAL_TOPICS_METADATA_KEY,
            owner.coordinator_id,
            owner.host,
            owner.port,
            owner.incarnation_id or "none",
        )

    def _topic_id_refusal(self, topic: str, topic_id: str) -> _Refusal | None:
        """INCONSISTENT_TOPIC_ID for a request entry whose ``topic_id`` is not the id the
        topic of that name has now (checked once per topic of the request, before anything
        is appended): the batches were made for a topic since deleted and re-created under
        the same name (Kafka's Produce v13, KIP-516). Produce
        carried only the name, and a producer with stale metadata wrote records meant for the
        deleted topic into the new one. A topic this node does not know is left to the
        partition lookup (UNKNOWN_TOPIC_OR_PARTITION)."""
        meta = self.view.topic(topic)
        if meta is None or not meta.topic_id or meta.topic_id == topic_id:
            return None
        return _Refusal(
            E.INCONSISTENT_TOPIC_ID,
            f"topic {topic} now has id {meta.topic_id}, not {topic_id}: it was deleted and "
            "re-created; nothing appended",
        )

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
        transactional: bool = False,
    ) -> int:
        """Append every accepted partition's batches (one writer-thread hop per request),
        then, back on the loop, publish offsets, advance watermarks and wake fetches.
        Returns the record bytes written. ``transactional``: transactional batches may be
        appended (the request names a transactional id, or ACLs are off); refused if not."""
        jobs = [
            (part.log, records, part.leader_epoch, transactional, part.topic.startswith("__"))
            for _, part, records in pending
        ]
        size = sum(len(records) for _, _, records in pending)
        # Published as soon as the appends are done, even if the client has gone meanwhile
        # (strom.storage.writer): what is in the log must reach the watermark and the fetches.
        appended, flushes, commits = await self.writer.run(
            functools.partial(_append_jobs, jobs),
            size,
            functools.partial(self._publish, pending, acks),
        )
        if flushes:
            await asyncio.gather(*(self._flush(pr, part) for pr, part in flushes))
        if commits:
            timeout = max(timeout_ms, 0) / 1000.0
            await asyncio.gather(
                *(
                    self._await_commit(pr, p, o, timeout)
                    if held is None
                    else self._answer_when_committed(pr, p, o, timeout, held)
                    for pr, p, o, held in commits
                )
            )
        return appended

    def _publish(
        self,
        pending: list[tuple[pb.ProducePartitionResponse, Partition, Any]],
        acks: int,
        outcomes: list[Any],
    ) -> tuple[
        int,
        list[tuple[pb.ProducePartitionResponse, Partition]],
        list[_CommitWait],
    ]:
        """Back on the loop after the appends: answers, metrics, watermarks, woken fetches;
        returns the bytes appended and the partitions still to flush and to wait for."""
        flushes: list[tuple[pb.ProducePartitionResponse, Partition]] = []
        commits: list[_CommitWait] = []
        appended = 0
        for (pr, part, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                refusal = self._append_failed(part, outcome, "producing")
                written_by = _duplicate_written_by(outcome) if acks == -1 else -1
                if written_by >= 0:
                    # DUPLICATE_SEQUENCE says "written": under acks=all only once committed.
                    commits.append((pr, part, written_by, refusal))
                else:
                    self._produce_failed(pr, refusal)
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
                self._announce(part, info, produced=True)
                if lg.needs_flush():
                    flushes.append((pr, part))
            if acks == -1:
                # A duplicate too: the first attempt may not be committed yet.
                commits.append((pr, part, info.last_offset, None))
        return appended, flushes, commits

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
        self,
        pr: pb.ProducePartitionResponse | pb.TxnMarkerPartitionResult,
        part: Partition,
        last_offset: int,
        timeout: float,
        what: str = "records",
    ) -> None:
        """acks=-1 (and every transaction marker): wait until the high watermark passes the
        appended ``what``, with at least ``min.insync.replicas`` in sync at that moment."""
        if pr.error_code:
            return
        be = "were" if what.endswith("s") else "was"
        in_sync = await part.wait_for_high_watermark(last_offset, timeout)
        if in_sync is not None:
            min_isr = part.log.config.min_insync_replicas
            if in_sync < min_isr:
                pr.error_code = E.NOT_ENOUGH_REPLICAS_AFTER_APPEND  # type: ignore[assignment]
                pr.error_message = (
                    f"appended, but {part.topic}-{part.index} had {in_sync} in-sync replicas "
                    f"when the {what} {be} committed, fewer than min.insync.replicas={min_isr}"
                )
            return
        if part.is_leader and not part.deleted and not part.stopping:
            pr.error_code = E.REQUEST_TIMED_OUT  # type: ignore[assignment]
            pr.error_message = f"the in-sync replicas did not confirm the {what} in time"
        else:
            pr.error_code = E.NOT_LEADER_OR_FOLLOWER  # type: ignore[assignment]
            pr.error_message = f"leadership moved before the {what} {be} committed"

    async def _answer_when_committed(
        self,
        pr: pb.ProducePartitionResponse,
        part: Partition,
        written_by: int,
        timeout: float,
        answer: _Refusal,
    ) -> None:
        """acks=-1 for a batch answered DUPLICATE_SEQUENCE (written before, offsets no longer
        known): ``answer`` only once the high watermark passes ``written_by``, at or after the
        batch's last record, as a duplicate answered NONE waits for its original offsets
        (design §6; Kafka's duplicate answer waits as any acks=all append). Otherwise the
        error the wait gives (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        NOT_LEADER_OR_FOLLOWER), all retriable: it was answered at
        once while the first attempt was on the leader alone, and lost with it."""
        await self._await_commit(pr, part, written_by, timeout, "repeated records")
        if pr.error_code:
            _count_produce(pr.error_code)
        else:
            self._produce_failed(pr, answer)

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
            bad = _marker_error(m)
            for tp in m.topics:
                tr = mr.topics.add(topic=tp.topic)
                for index in tp.partitions:
                    pr = tr.partitions.add(partition=index)
                    if bad is not None:
                        self._marker_failed(pr, _Refusal(E.INVALID_REQUEST, bad))
                        continue
                    try:
                        part = self._leader(tp.topic, index, -1, hints)
                    except Exception as exc:
                        self._marker_failed(pr, _unexpected("marker to", tp.topic, index, exc))
                        continue
                    min_isr = part.log.config.min_insync_replicas
                    if len(part.isr) < min_isr:
                        # As acks=-1 Produce (Kafka's rule for markers too): a marker only
                        # the leader holds is lost with it, and the transaction then stays
                        # open on the partition for good. The coordinator retries.
                        self._marker_failed(
                            pr,
                            _Refusal(
                                E.NOT_ENOUGH_REPLICAS,
                                f"{tp.topic}-{index} has {len(part.isr)} in-sync replicas, "
                                f"fewer than min.insync.replicas={min_isr}",
                            ),
                        )
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
                        info: AppendInfo = await self.writer.run(
                            job, 128, functools.partial(self._marker_written, m.committed, part)
                        )
                    except Exception as exc:
                        self._marker_failed(pr, self._append_failed(part, exc, "writing a marker"))
                        continue
                    waits.append(self._await_commit(pr, part, info.last_offset, timeout, "marker"))
        if waits:
            await asyncio.gather(*waits)
        return resp

    def _append_failed(self, part: Partition, exc: BaseException, what: str) -> _Refusal:
        """The refusal for an append that raised ``exc``. A disk error (full, failing) is
        counted and logged at most once a minute (strom.storage.disk_errors), and has this
        node hand the partition's leadership over at once (the ISR manager resigns it):
        every later append would fail the same way, while in-sync replicas on other disks
        could take them (a leader on a full disk refused every produce
        with STORAGE_ERROR and kept leading)."""
        if not is_disk_error(exc):
            return _append_error(part, exc)
        assert isinstance(exc, OSError)
        note_append_failure(what, part.topic, part.index, exc)
        part.note_append_failure(exc)
        if self.on_out_of_sync_fetch is not None:
            self.on_out_of_sync_fetch()  # the ISR manager acts on it now
        return _Refusal(E.STORAGE_ERROR, f"disk error: {exc}")

    def _marker_written(self, committed: bool, part: Partition, info: AppendInfo) -> AppendInfo:
        """Back on the loop after a marker's append (even if the caller has gone meanwhile)."""
        metrics.TXN_MARKERS.labels("COMMIT" if committed else "ABORT").inc()
        self._announce(part, info, produced=False)
        return info

    def _announce(self, part: Partition, info: AppendInfo, produced: bool) -> None:
        """Make a written append known: metrics, the high watermark, woken fetches.

        Never raises: the records are in the log whatever happens here, and an exception
        would answer the writer "failed" (a producer would retry what was written, a
        coordinator would think a durable marker missing). A failure is logged; a
        parked fetch it did not wake still answers at its max wait, and the next append
        or follower fetch advances the watermark (metrics come last: the least needed).
        """
        try:
            part.note_append_ok()
            self.manager.appended.notify(part.tp, info.bytes)
            if part.maybe_advance_high_watermark():
                self.manager.committed.notify(part.tp, info.bytes)
            if not produced:
                self.manager.refresh_gauges(part)
                return
            m = self.manager.metrics.get(part.tp)
            if m is not None:
                m.bytes_in.inc(info.bytes)
                m.records_in.inc(info.record_count)
                m.log_end_offset.set(part.log.log_end_offset)
                m.log_size.inc(info.bytes)
        except Exception:
            log.exception(
                "%s-%d: records written at %d-%d but announcing them failed",
                part.topic,
                part.index,
                info.first_offset,
                info.last_offset,
            )

    @staticmethod
    def _marker_failed(pr: pb.TxnMarkerPartitionResult, r: _Refusal) -> None:
        pr.error_code = r.code  # type: ignore[assignment]
        pr.error_message = r.message
        metrics.TXN_MARKERS.labels(error_name(r.code)).inc()


def _marker_error(m: pb.TxnMarker) -> str | None:
    """Why a WriteTxnMarkers marker cannot be written (for INVALID_REQUEST), else None.

    The batch header holds the producer epoch as an int16, and the coordinator never sends
    a negative producer id or coordinator epoch: anything else is a caller's mistake, not
    a struct.error deep in the header packing."""
    if m.producer_id < 0:
        return f"TxnMarker.producer_id must be >= 0, got {m.producer_id}"
    if not 0 <= m.producer_epoch <= 32767:
        return f"TxnMarker.producer_epoch must be in 0..32767, got {m.producer_epoch}"
    if m.coordinator_epoch < 0:
        return f"TxnMarker.coordinator_epoch must be >= 0, got {m.coordinator_epoch}"
    return None


def add_to_server(servicer: StorageServicer, server: grpc.aio.Server) -> None:
    """Register the servicer under ``strom.v1.StorageService``.

    Like the generated ``add_StorageServiceServicer_to_server``, except for the two bulk
    methods: Produce requests are parsed by :func:`decode_produce_request` (a large one's
    record bytes not copied) and Fetch answers are pre-serialized bytes from
    :meth:`StorageServicer.fetch_raw`.
    """
    unary = grpc.unary_unary_rpc_method_handler

    def std(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
        return unary(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    handlers = {
        "Produce": unary(
            servicer.Produce,
            request_deserializer=decode_produce_request,
            response_serializer=pb.ProduceResponse.SerializeToString,
        ),
        "Fetch": unary(servicer.fetch_raw, request_deserializer=pb.FetchRequest.FromString),
        "ProduceStream": grpc.stream_stream_rpc_method_handler(
            servicer.produce_stream,
            request_deserializer=decode_produce_request,
            response_serializer=pb.ProduceResponse.SerializeToString,
        ),
        # Written by stream_writes: a consumer or follower that cancels its stream (closing,
        # seeking, a follow it ends) is no ERROR in the log.
        "FetchStream": grpc.stream_stream_rpc_method_handler(
            writes_answers(servicer.fetch_stream), request_deserializer=pb.FetchRequest.FromString
        ),
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
        "DescribeProducers": std(
            servicer.DescribeProducers, pb.DescribeProducersRequest, pb.DescribeProducersResponse
        ),
    }
    add_handlers(server, pb.DESCRIPTOR.services_by_name["StorageService"], handlers)


def _append_jobs(
    jobs: list[tuple[Log, Any, int, bool, bool]],
) -> list[AppendInfo | BaseException]:
    """Append each (log, records, leader epoch, transactional id given, internal topic); an
    exception is that partition's result.

    An internal ``__`` topic's batches skip the ``message.timestamp.*`` checks: only strom's
    coordinators write there (``_internal_topic_check``), stamping the batches with their own
    clock, and a coordinator whose clock is ahead of (or behind) this node's by more than the
    topic's limit (after.max.ms is 1 h by default) had every group and transaction write
    refused INVALID_TIMESTAMP, its shards reloading in a loop. Kafka's coordinators write
    with the leader broker's own clock, so skew cannot do that there. Decided here, per
    request, rather than by configs on the internal topics: it holds for clusters whose
    topics exist already and whatever an operator alters on them (docs/topic-configs.md)."""
    out: list[AppendInfo | BaseException] = []
    for lg, records, epoch, transactional, internal in jobs:
        try:
            out.append(
                lg.append(
                    records,
                    leader_epoch=epoch,
                    transactional=transactional,
                    check_timestamps=not internal,
                )
            )
        except Exception as exc:
            out.append(exc)
    return out


def _duplicate_written_by(exc: BaseException) -> int:
    """The offset a DUPLICATE_SEQUENCE refusal's records are in the log by (see
    ``ProducerStateError.written_by``); -1 for every other failure."""
    if isinstance(exc, ProducerStateError) and exc.reason == "DUPLICATE_SEQUENCE":
        return exc.written_by
    return -1


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
