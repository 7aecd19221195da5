"""``strom.v1.RecordService`` (records.proto): record-level produce and subscribe on every node.

The API for clients in any language. What happens to a call, and where the work goes:

* **ProduceRecords**: the request is parsed by protobuf (upb, C) and its columns become Arrow
  arrays in a handful of C calls (:mod:`strom.storage.record_columns`); keys are hashed with
  a vectorized murmur2 (:func:`strom.client.partitioner.partitions_for_keys`), records are
  grouped by partition with one stable argsort, and each partition's records become one
  record batch for its leader (appended in-process when this node leads the partition),
  sent by the node's idempotent per-partition sender or under the caller's own producer
  sequence (:mod:`strom.storage.record_producers`); all of it on the event loop, except
  that a large call (OFFLOAD_BYTES and up) is parsed, turned into Arrow and encoded in a
  worker thread, and a call above MAX_PRODUCE_REQUEST_BYTES is refused before it is parsed.
  Each record's offset is the batch's base offset plus its place (numpy). No Python code runs
  per record.
* **Subscribe**: one strom Consumer per stream, run by a pump thread
  (:mod:`strom.storage.subscriptions`), which also makes the stream a group member when it
  names a group. The handler only moves serialized messages from the pump's bounded outbox
  to ``context.write``, so gRPC flow control reaches all the way back to fetching.
* **CommitOffsets**: into the stream's own ordered commit queue (one committer per stream).

Whole-request problems (a malformed request) are gRPC INVALID_ARGUMENT (NOT_FOUND for unknown
topics in Subscribe) with a serialized ``strom.v1.Error`` in the ``strom-error-bin`` trailer,
as common.proto's conventions say; partition-level outcomes are ErrorCodes in the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Histogram

from strom.api import common_pb2, records_pb2, storage_pb2
from strom.client.partitioner import partitions_for_keys
from strom.client.types import TopicPartition
from strom.clock import wall_ms
from strom.controller.validation import validate_topic_name
from strom.errors import (
    ErrorCode,
    InvalidTimestampError,
    InvalidTopicError,
    RequestTimedOutError,
    StromError,
    error_for,
    error_name,
)
from strom.grpc_options import MAX_BATCH_BYTES, MAX_PRODUCE_RECORDS_REQUEST_BYTES
from strom.log.config import LONG_MAX
from strom.metadata import RESYNC, ClusterView, WatchEvent
from strom.protowire import encode_varint
from strom.record.codecs import CODEC_NAMES
from strom.security import CURRENT_PRINCIPAL, QUOTAS
from strom.security.interceptor import STREAM_REQUEST_DENIED
from strom.service import stream_writes
from strom.service.limits import Admission
from strom.storage.metrics import PRODUCE_SHED, client_id_of
from strom.storage.record_columns import ColumnsError, columns_to_table
from strom.storage.record_producers import LeaderRoute, NodeProducer, SequencedSender
from strom.storage.rpc_base import (
    _call_left,
    _charge,
    _hold,
    _owing_principal,
    _throttle,
    _wait_out_debt,
    add_handlers,
    isolation_error,
)
from strom.storage.subscriptions import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_RECORDS,
    MAX_STALL_S,
    Subscription,
    SubscriptionSpec,
)

log = logging.getLogger("strom.storage.records")
E = ErrorCode
rp = records_pb2
R = TypeVar("R")

SERVICE_NAME = rp.DESCRIPTOR.services_by_name["RecordService"].full_name
#: How often an idle Subscribe stream checks that its caller may still read (with ACLs on;
#: the services apply an ACL change within a second, so a revoke ends it within ~2 s), and
#: that the topics of its explicit partitions still exist.
ACL_RECHECK_S = 1.0
#: What the Subscribe loop has when the outbox had nothing within ACL_RECHECK_S.
_NOTHING_YET: Any = object()
#: records.proto's Acks -> the acks of a Produce request.
ACKS = {rp.ACKS_ALL: -1, rp.ACKS_LEADER: 1, rp.ACKS_NONE: 0}
DEFAULT_TIMEOUT_MS = 30_000
#: How much of the caller's gRPC deadline a ProduceRecords call leaves for its answer (a
#: quarter of what is left when that is less): its wait ends that much before the deadline,
#: so a call not acknowledged in time gets the node's REQUEST_TIMED_OUT ("may or may not
#: have been written") rather than a bare DEADLINE_EXCEEDED. The
#: wait ran to the deadline itself, so with the docs' settings (timeout_ms 30 s, a 30 s call
#: deadline) a hung leader always gave "Deadline exceeded after 30.000s".
ANSWER_MARGIN_S = 1.0
#: Largest ProduceRecords request a node parses. A 200 MB call
#: (the wire limit, grpc_options, is 256 MiB for the batch API's stored batches) held the
#: node's GIL for seconds while protobuf parsed it and ``columns_to_table`` copied its values
#: (both hold the GIL throughout: measured 0.1-0.3 s and 0.2-1.4 s per 200 MB on a loaded
#: 2-core machine), the node's etcd lease keepalive thread starved, the node lost its lease
#: and the controller failed its partitions over; and the call ended in MESSAGE_TOO_LARGE
#: anyway (max.message.bytes is 16 MiB by default). Checked on the raw size, before parsing,
#: so such a call costs nothing; a topic whose max.message.bytes is raised above this takes
#: its largest batches through the batch API (StorageService.Produce).
MAX_PRODUCE_REQUEST_BYTES = MAX_PRODUCE_RECORDS_REQUEST_BYTES
#: The most records one ProduceRecords call may carry. 20 M
#: one-byte values fit in 60 MB, and the answer's per-record partition and offset arrays,
#: built on the event loop, made a 220 MB response (beyond any default client's 4 MiB
#: receive limit, so the caller saw only RESOURCE_EXHAUSTED) while the node stalled for
#: seconds and lost its etcd lease. 250,000 records answer in about 2.5 MB at most.
MAX_PRODUCE_RECORDS = 250_000
#: A ProduceRecords request at least this large is parsed and turned into Arrow in a worker
#: thread (and its batches encoded in one, record_producers), so the event loop goes on
#: serving other calls meanwhile; smaller calls stay on the loop (a thread hop costs more
#: than they do).
OFFLOAD_BYTES = 1 << 20
#: Errors of a commit that concern single partitions (everything else is the group's).
_PARTITION_COMMIT_ERRORS = frozenset({E.OFFSET_METADATA_TOO_LARGE, E.UNKNOWN_TOPIC_OR_PARTITION})

PRODUCED_RECORDS = Counter(
    "strom_storage_records_produced_records",
    "Records of ProduceRecords calls by partition result (NONE = written; UNKNOWN = sent "
    "with ACKS_NONE, which the leader does not answer)",
    ["error"],
)
RPC_LATENCY = Histogram(
    "strom_storage_records_request_latency_seconds",
    "Time to answer a RecordService call (ProduceRecords, CommitOffsets)",
    ["rpc"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


class BadRequest(Exception):
    """A whole-request problem: answered with a gRPC status naming what was wrong."""

    def __init__(
        self,
        message: str,
        status: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
        code: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code or {
            grpc.StatusCode.NOT_FOUND: E.UNKNOWN_TOPIC_OR_PARTITION,
            grpc.StatusCode.UNAVAILABLE: E.BROKER_NOT_AVAILABLE,
            grpc.StatusCode.RESOURCE_EXHAUSTED: E.BROKER_NOT_AVAILABLE,
        }.get(status, E.INVALID_REQUEST)


async def _abort(context: Any, status: grpc.StatusCode, message: str, code: int) -> NoReturn:
    err = common_pb2.Error(code=code, message=message)  # type: ignore[arg-type]
    await context.abort(
        status, message, trailing_metadata=(("strom-error-bin", err.SerializeToString()),)
    )
    raise AssertionError("context.abort returned")  # pragma: no cover


def _timed(rpc: str) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    hist = RPC_LATENCY.labels(rpc)

    def deco(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: Any) -> R:
            t0 = time.perf_counter()
            try:
                return await fn(self, request, context)
            finally:
                hist.observe(time.perf_counter() - t0)

        return wrapper

    return deco


def _parse(cls: Any, raw: bytes, what: str) -> Any:
    try:
        return cls.FromString(raw)
    except DecodeError as exc:
        raise BadRequest(f"{what} does not parse as strom.v1.{cls.__name__}: {exc}") from None


def group_by_partition(parts: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(partition, record indexes in input order) per partition, ascending, from one stable
    argsort: the order of records within a partition is the order of the call."""
    n = len(parts)
    if n and bool((parts == parts[0]).all()):
        return [(int(parts[0]), np.arange(n))]
    order = np.argsort(parts, kind="stable")
    ranked = parts[order]
    cuts = np.flatnonzero(np.diff(ranked)) + 1
    bounds = [0, *cuts.tolist(), n]
    return [(int(ranked[s]), order[s:e]) for s, e in itertools.pairwise(bounds)]


class RecordService:
    """The servicer (see the module docstring). ``local_produce`` and ``local_init_ids`` are
    this node's in-process StorageService Produce and InitProducerId; ``bootstrap`` returns
    addresses of live nodes (this one first) for the node's Subscribe consumers."""

    def __init__(
        self,
        node_id: int,
        view: ClusterView,
        local_produce: Callable[[storage_pb2.ProduceRequest], Awaitable[Any]],
        local_init_ids: Callable[[storage_pb2.InitProducerIdRequest], Awaitable[Any]],
        bootstrap: Callable[[], list[str]],
        *,
        subscribe_max_stall_s: float = MAX_STALL_S,
        incarnation: Callable[[], str] | None = None,
    ) -> None:
        self.node_id = node_id
        #: This node process's incarnation id (its registration's): group streams' members
        #: carry it so the coordinator drops them once this process leaves the cluster.
        self._incarnation = incarnation
        self.subscribe_max_stall_s = subscribe_max_stall_s
        self.view = view
        self._bootstrap = bootstrap
        self._local_init_ids = local_init_ids
        self.route = LeaderRoute(node_id, view, local_produce)
        self.producer = NodeProducer(self.route, self._init_ids)
        self.sequenced = SequencedSender(self.route)
        self.subscriptions: dict[str, Subscription] = {}
        #: Topic -> next round-robin partition of its keyless records (deleted topics go).
        self._round_robin: dict[str, int] = {}
        self.shutting_down = False
        #: The node's produce admission (strom.service.limits), which ProduceRecords calls
        #: take part in under their caller's principal; None admits everything.
        self.admission: Admission | None = None
        #: The event loop ProduceRecords runs on (set by its first call): where the state
        #: of deleted topics is dropped.
        self._loop: asyncio.AbstractEventLoop | None = None
        view.add_listener(self._on_view_events)

    def _on_view_events(self, events: list[WatchEvent]) -> None:
        """Watch thread: hand the topics deleted from the view to the event loop, which drops
        their senders and round-robin positions (both were kept for every
        topic ever written to). A resync looks at every topic held against the view."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # nothing was produced yet: nothing is held
        prefix = self.view.keys.topics_prefix
        resync = any(ev is RESYNC for ev in events)
        gone = {
            ev.key[len(prefix) :]
            for ev in events
            if ev is not RESYNC and ev.value is None and ev.key.startswith(prefix)
        }
        if gone or resync:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self.forget_topics, gone, resync)

    def forget_topics(self, gone: set[str], resync: bool = False) -> None:
        """Event loop: drop what is held for the deleted topics ``gone`` (``resync``: and for
        every held topic the view no longer has)."""
        if resync:
            held = self.producer.topics() | set(self._round_robin)
            gone = gone | {t for t in held if self.view.topic(t) is None}
        for topic in gone:
            self._round_robin.pop(topic, None)
        self.producer.forget_topics(gone)

    async def _init_ids(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """A producer id for a PartitionSender (or the next epoch of its id), from this node."""
        resp = await self._local_init_ids(
            storage_pb2.InitProducerIdRequest(producer_id=producer_id, producer_epoch=epoch)
        )
        if resp.error_code != E.NONE:
            raise error_for(resp.error_code, f"no producer id: {resp.error_message}")
        return int(resp.producer_id), int(resp.producer_epoch)

    # -- ProduceRecords --------------------------------------------------------------------

    @_timed("ProduceRecords")
    async def ProduceRecords(self, raw: bytes, context: Any) -> rp.ProduceRecordsResponse:
        self._loop = loop = asyncio.get_running_loop()
        try:
            if self.shutting_down:
                raise BadRequest("the node is shutting down", grpc.StatusCode.UNAVAILABLE)
            if len(raw) > MAX_PRODUCE_REQUEST_BYTES:
                raise BadRequest(
                    f"the request is {len(raw)} bytes, above the node's limit of "
                    f"{MAX_PRODUCE_REQUEST_BYTES} bytes for a ProduceRecords call: send fewer "
                    "records per call",
                    code=E.MESSAGE_TOO_LARGE,
                )
            waited, delay = await self._admit_and_charge(len(raw))
            charged = loop.time()
            big = len(raw) >= OFFLOAD_BYTES
            if big:
                req = await asyncio.to_thread(_parse, rp.ProduceRecordsRequest, raw, "the request")
            else:
                req = _parse(rp.ProduceRecordsRequest, raw, "the request")
            resp = await self._produce(req, big, client_id_of(context), _call_left(context))
        except BadRequest as exc:
            await _abort(context, exc.status, exc.message, exc.code)
        # The hold counts from the charge; never into the end of the caller's deadline (what
        # is not held, its next call waits out first).
        remaining = delay - (loop.time() - charged)
        resp.throttle_time_ms = await _hold("produce", remaining, waited, context)
        return resp

    async def _admit_and_charge(self, nbytes: int) -> tuple[int, float]:
        """Before a ProduceRecords call is served: its admission under the caller's principal
        (the node's in-flight budget, of which the calls of a principal over its quota may
        hold a quarter while they wait: beyond that RESOURCE_EXHAUSTED, nothing written), the
        wait while the principal owes, and the charge of its ``nbytes`` to the produce quota;
        (ms waited, seconds its answer is to be held).

        The record API's callers are charged here, by their own principal: what this node
        does for them runs as the node (forwards, a Subscribe's Consumer) or gathers several
        callers in one inner Produce, which is not charged again (CHARGED_BY_CALLER). They
        are charged when served, before the write, with nothing yielding between the wait and
        the charge: charged after the write, concurrent calls of a
        principal owing nothing all passed the wait (14 calls of 8 MiB at 10 KB/s all written
        within 35 s), and calls waiting out a debt took no part in admission (24 such calls
        held their bytes until their deadlines instead of being refused)."""
        owing = _owing_principal("produce")
        admission = self.admission
        if admission is not None:
            refusal = admission.try_admit(nbytes, owing)
            if refusal is not None:
                PRODUCE_SHED.inc()
                raise BadRequest(refusal, grpc.StatusCode.RESOURCE_EXHAUSTED)
        try:
            # A caller still ahead of its produce quota waits before it is served.
            waited = await _wait_out_debt("produce")
            return waited, _charge("produce", nbytes)
        finally:
            # Past the wait the call's batches go through the node's own Produce, which
            # admits them (held here too, they would count twice).
            if admission is not None:
                admission.release(nbytes, owing)

    async def _produce(
        self,
        req: rp.ProduceRecordsRequest,
        big: bool = False,
        client_id: str = "",
        call_left_s: float | None = None,
    ) -> rp.ProduceRecordsResponse:
        """The call's work, bounded by ``timeout_ms`` and by ``call_left_s`` (what is left of
        the caller's gRPC deadline) less :data:`ANSWER_MARGIN_S`: past the deadline nobody
        reads the answer, and records sent after it would be written behind the back of a
        caller told DEADLINE_EXCEEDED; the margin lets the node's own answer (written, or
        REQUEST_TIMED_OUT) reach the caller before the deadline does."""
        if not req.topic:
            raise BadRequest("topic is empty")
        acks = ACKS.get(req.acks)
        if acks is None:
            raise BadRequest(f"acks {req.acks} is not one of ACKS_ALL, ACKS_LEADER, ACKS_NONE")
        codec = CODEC_NAMES.get(req.compression)
        if codec is None:
            raise BadRequest(f"compression {req.compression} is not a Compression value")
        if req.timeout_ms < 0:
            raise BadRequest(f"timeout_ms must be >= 0, got {req.timeout_ms}")
        explicit = req.partition if req.HasField("partition") else None
        if explicit is not None and explicit < 0:
            raise BadRequest(f"partition must be >= 0 (or unset to choose by key), got {explicit}")
        seq = req.producer if req.HasField("producer") else None
        if seq is not None:
            _check_sequence(seq, explicit, acks)
        if len(req.records.values) > MAX_PRODUCE_RECORDS:
            raise BadRequest(
                f"the call has {len(req.records.values)} records, above the node's limit of "
                f"{MAX_PRODUCE_RECORDS} per ProduceRecords call: send fewer records per call",
                code=E.MESSAGE_TOO_LARGE,
            )
        try:
            if big:
                table = await asyncio.to_thread(columns_to_table, req.records)
            else:
                table = columns_to_table(req.records)
        except ColumnsError as exc:
            raise BadRequest(str(exc)) from None

        resp = rp.ProduceRecordsResponse()
        meta = self.view.topic(req.topic)
        if meta is None and (why := _malformed_topic(req.topic)) is not None:
            # Answered UNKNOWN_TOPIC_OR_PARTITION, which callers
            # retry; no such topic can ever exist (Kafka answers INVALID_TOPIC_EXCEPTION).
            resp.error_code = E.INVALID_TOPIC  # type: ignore[assignment]
            resp.error_message = why
            return resp
        if meta is None or meta.deleting:
            resp.error_code = E.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[assignment]
            resp.error_message = (
                f"unknown topic {req.topic!r} (if it was just created, this node may not "
                "know it yet: retry)"
            )
            return resp
        if meta.internal:
            resp.error_code = E.INVALID_TOPIC  # type: ignore[assignment]
            resp.error_message = f"{req.topic!r} is an internal topic; clients cannot write to it"
            return resp
        count = meta.partition_count
        if explicit is not None and explicit >= count:
            # A mistake in the call, not a retriable unknown (it was
            # the topic-level UNKNOWN_TOPIC_OR_PARTITION, which the docs call retriable, so
            # their example retried partition 99 forever); Kafka's producer fails at once too.
            raise BadRequest(
                f"topic {req.topic!r} has no partition {explicit} (it has {count}: 0..{count - 1})"
            )

        n = table.num_rows
        parts = self._partitions(req.topic, table, explicit, count)
        groups = group_by_partition(parts)
        loop = asyncio.get_running_loop()
        timeout_s = (req.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000.0
        if call_left_s is not None:
            timeout_s = min(timeout_s, call_left_s - min(ANSWER_MARGIN_S, call_left_s / 4))
        deadline = loop.time() + timeout_s
        too_old = _too_old(table, meta.configs)
        tasks = []
        for p, idx in groups:
            if too_old is not None and (refusal := _old_record(too_old, idx, req.topic, p)):
                tasks.append(_failed(refusal))
                continue
            sub = table if len(idx) == n else table.take(pa.array(idx))
            if seq is not None:
                coro: Awaitable[Any] = self.sequenced.send(
                    req.topic,
                    p,
                    sub,
                    acks=acks,
                    compression=codec,
                    producer_id=seq.producer_id,
                    producer_epoch=seq.producer_epoch,
                    base_sequence=seq.base_sequence,
                    deadline=deadline,
                    client_id=client_id,
                )
            else:
                coro = self.producer.send(req.topic, p, sub, acks, codec, deadline, client_id)
            tasks.append(asyncio.ensure_future(coro))
        try:
            _, pending = await asyncio.wait(tasks, timeout=max(deadline - loop.time(), 0))
        except asyncio.CancelledError:
            # The caller cancelled the call (or gRPC did, at its deadline): what has not
            # been sent to a leader yet is dropped (record_producers).
            for t in tasks:
                t.cancel()
            raise
        for t in pending:
            t.cancel()

        offsets = np.full(n, -1, dtype=np.int64)
        for (p, idx), task in zip(groups, tasks, strict=True):
            pr = resp.results.add(partition=p, base_offset=-1, record_count=len(idx))
            err: BaseException | None
            if task in pending:
                err = RequestTimedOutError(
                    f"{req.topic}-{p}: not acknowledged within the call's timeout; the records "
                    "may or may not have been written"
                )
            else:
                err = task.exception()
            if err is None:
                base = task.result()
                if base >= 0:
                    offsets[idx] = base + np.arange(len(idx), dtype=np.int64)
                pr.base_offset = int(offsets[idx[0]])
                if base < 0 and acks != 0:
                    # The node's own producer retried a request the leader had written
                    # before its last five batches: written once, offsets unknown. Said so
                    # (-1 came with nothing to explain it).
                    pr.error_message = "written (a retry of it found it written); offsets unknown"
                # ACKS_NONE records the leader refused (too large,
                # say) were counted as written: with acks=0 the leader answers nothing.
                PRODUCED_RECORDS.labels("NONE" if acks else "UNKNOWN").inc(len(idx))
                continue
            code = err.code if isinstance(err, StromError) and err.code else E.UNKNOWN_SERVER_ERROR
            if not isinstance(err, StromError):
                log.error("ProduceRecords to %s-%d failed", req.topic, p, exc_info=err)
            pr.error_code = code  # type: ignore[assignment]
            pr.error_message = err.message if isinstance(err, StromError) else str(err)
            PRODUCED_RECORDS.labels(error_name(code)).inc(len(idx))
        resp.partitions.extend(parts.tolist())
        resp.offsets.extend(offsets.tolist())
        return resp

    def _partitions(
        self, topic: str, table: pa.Table, explicit: int | None, count: int
    ) -> np.ndarray:
        """Each record's partition: the explicit one, else murmur2 of its key, else one
        round-robin partition per call for the keyless records."""
        n = table.num_rows
        if explicit is not None:
            return np.full(n, explicit, dtype=np.int32)
        if "key" in table.column_names:
            parts = partitions_for_keys(table.column("key").combine_chunks(), count)
        else:
            parts = np.full(n, -1, dtype=np.int32)
        keyless = parts < 0
        if keyless.any():
            rr = self._round_robin.get(topic, self.node_id)
            self._round_robin[topic] = rr + 1
            parts[keyless] = rr % count
        return parts

    # -- Subscribe -------------------------------------------------------------------------

    async def Subscribe(self, raw: bytes, context: Any) -> None:
        try:
            if self.shutting_down:
                raise BadRequest("the node is shutting down", grpc.StatusCode.UNAVAILABLE)
            req = _parse(rp.SubscribeRequest, raw, "the request")
            spec = self._spec(req)
        except BadRequest as exc:
            await _abort(context, exc.status, exc.message, exc.code)
        # With ACLs on: why the caller may no longer read what it subscribed to. The stream's
        # Consumer reads as this node, so the caller's rights are checked again before each
        # message and at least every ACL_RECHECK_S (records kept coming
        # after the READ ACL was removed), and a revoke ends the stream as it ends a
        # followed Fetch (PERMISSION_DENIED).
        denied = STREAM_REQUEST_DENIED.get()
        if QUOTAS.active and (quota_bytes := QUOTAS.fetch_limit(CURRENT_PRINCIPAL.get())):
            # At most the caller's quota window of bytes per message, as a Fetch answer
            # (QuotaManager.fetch_limit; a larger record still goes, alone): one message
            # must not put the caller hundreds of seconds ahead.
            spec.max_bytes = min(spec.max_bytes, quota_bytes)
        # Explicit partitions: the topics as they were at the start, checked as often as the
        # ACLs. A topic deleted mid-stream left the stream open and
        # silent until the caller's deadline (the Consumer just finds no leader); a group
        # stream learns it from its assignment. A topic re-created under the same name is
        # another topic (a new id): the offsets read so far mean nothing in it.
        topic_ids = {} if spec.group_id else self._topic_ids(spec.topics)
        recheck_s = ACL_RECHECK_S if denied is not None or topic_ids else None
        loop = asyncio.get_running_loop()
        next_check = loop.time() + ACL_RECHECK_S
        sub = Subscription(
            spec,
            self._bootstrap(),
            asyncio.get_running_loop(),
            # The caller's client id, else one for every such stream of this node: the
            # leaders count the stream's fetches by it. An id per
            # stream made a per-client series on each leader for every Subscribe call.
            client_id=client_id_of(context) or f"strom-node-{self.node_id}-subscribe",
            max_stall_s=self.subscribe_max_stall_s,
            topic_live=lambda topic: self.view.topic(topic) is not None,
            partition_count=self._live_partition_count,
            host_node=(
                (self.node_id, self._incarnation()) if self._incarnation is not None else None
            ),
        )
        self.subscriptions[sub.id] = sub
        sub.start()
        try:
            while True:
                try:
                    item = await sub.outbox.get(recheck_s)
                except TimeoutError:
                    item = _NOTHING_YET
                if item is None:
                    return
                if denied is not None and (why := denied(req)) is not None:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
                if topic_ids and (item is _NOTHING_YET or loop.time() >= next_check):
                    next_check = loop.time() + ACL_RECHECK_S
                    if (gone := self._gone_topic(topic_ids)) is not None:
                        await _abort(
                            context,
                            grpc.StatusCode.NOT_FOUND,
                            f"topic {gone!r} was deleted while the stream read it",
                            E.UNKNOWN_TOPIC_OR_PARTITION,
                        )
                if item is _NOTHING_YET:
                    continue
                if item.error is not None:
                    status = getattr(grpc.StatusCode, item.error.status)
                    await _abort(context, status, item.error.message, item.error.code)
                held_ms = await self._hold_for_quota(sub, item, req, denied, context)
                if denied is not None and (why := denied(req)) is not None:
                    # Checked again right before the write: the quota may have held the
                    # message for seconds (records of a revoked reader
                    # were delivered up to minutes after the revocation).
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
                # A caller gone mid-stream ends it here, quietly (stream_writes).
                await stream_writes.write(context, _with_throttle_time(item.data, held_ms))
                sub.delivered(item)
        finally:
            sub.stop()
            self.subscriptions.pop(sub.id, None)

    async def _hold_for_quota(
        self,
        sub: Subscription,
        item: Any,
        req: rp.SubscribeRequest,
        denied: Callable[[Any], str | None] | None,
        context: Any,
    ) -> int:
        """The caller's fetch quota, before a message goes out (the stream's Consumer fetches
        as this node): wait out what earlier messages' capped holds did not cover, charge
        this one and hold it, as a Fetch answer is held; the ms it was held (0: not).

        The time held does not count as the reader stalling (Outbox.held: found from
        outside, a quota-held group stream was expelled as a stalled reader), and with ACLs
        on a revocation ends the hold within ACL_RECHECK_S (PERMISSION_DENIED). An
        assignment message is charged but never held: a group's handover waits for it."""
        if not QUOTAS.active:
            return 0
        if item.tp is None:
            _charge("fetch", len(item.data))
            return 0

        async def hold() -> int:
            waited = await _wait_out_debt("fetch")
            return await _throttle("fetch", len(item.data), waited, context)

        with sub.outbox.held():
            if denied is None:
                return await hold()
            task = asyncio.ensure_future(hold())
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=ACL_RECHECK_S)
                    if done:
                        return task.result()
                    if (why := denied(req)) is not None:
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
            finally:
                task.cancel()

    def _spec(self, req: rp.SubscribeRequest) -> SubscriptionSpec:
        if req.start not in (rp.START_POSITION_LATEST, rp.START_POSITION_EARLIEST):
            raise BadRequest(f"start {req.start} is not a StartPosition value")
        if req.max_records_per_message < 0 or req.max_bytes_per_message < 0:
            raise BadRequest("max_records_per_message and max_bytes_per_message must be >= 0")
        if (bad_isolation := isolation_error(req)) is not None:
            raise BadRequest(bad_isolation)
        spec = SubscriptionSpec(
            group_id=req.group_id or None,
            topics=list(dict.fromkeys(req.topics)),
            earliest=req.start == rp.START_POSITION_EARLIEST,
            auto_commit=req.auto_commit,
            max_records=req.max_records_per_message or DEFAULT_MAX_RECORDS,
            # (bounded: a message must stay under the gRPC limit, with room for what
            # split_records does not count: offsets, timestamps, headers, framing)
            max_bytes=min(req.max_bytes_per_message or DEFAULT_MAX_BYTES, MAX_BATCH_BYTES // 2),
            read_committed=req.isolation_level == storage_pb2.ISOLATION_LEVEL_READ_COMMITTED,
        )
        for t in [*spec.topics, *(ps.topic for ps in req.partitions)]:
            # A name no topic can have is a mistake in the request, before any unknown topic.
            if t and self.view.topic(t) is None and (why := _malformed_topic(t)) is not None:
                raise BadRequest(why, code=E.INVALID_TOPIC)
        for t in spec.topics:
            self._partition_count(t)
        if spec.group_id:
            # Partitions first (group_id with partitions and no
            # topics was told it "needs topics", not that partitions are the mistake).
            if len(req.partitions):
                raise BadRequest(
                    "partitions cannot be given with a group_id: the group assigns partitions "
                    "(give topics)"
                )
            if not spec.topics:
                raise BadRequest("a group subscription needs topics")
            return spec
        if req.auto_commit:
            raise BadRequest("auto_commit needs a group_id (offsets are stored per group)")
        if not spec.topics and not len(req.partitions):
            raise BadRequest("nothing to read: give topics, partitions or a group_id")
        default = ("position", int(req.start))
        spec.whole_topics = list(spec.topics)
        for t in spec.topics:
            for p in range(self._partition_count(t)):
                spec.starts[TopicPartition(t, p)] = default
        listed: set[TopicPartition] = set()
        for ps in req.partitions:
            tp = TopicPartition(ps.topic, ps.partition)
            if ps.partition < 0:
                raise BadRequest(f"topic {tp.topic!r}: partition must be >= 0, got {ps.partition}")
            if tp in listed:  # The last start silently won
                raise BadRequest(
                    f"{tp.topic}-{tp.partition} is listed twice in partitions: give each "
                    "partition one start"
                )
            listed.add(tp)
            count = self._partition_count(ps.topic)
            if ps.partition >= count:
                raise BadRequest(
                    f"topic {ps.topic!r} has no partition {ps.partition} (it has {count})",
                    grpc.StatusCode.NOT_FOUND,
                )
            how = ps.WhichOneof("start")
            value = getattr(ps, how) if how else None
            if how in ("offset", "timestamp_ms") and value < 0:  # type: ignore[operator]
                raise BadRequest(f"{tp.topic}-{tp.partition}: {how} must be >= 0, got {value}")
            if how == "position" and value not in (
                rp.START_POSITION_LATEST,
                rp.START_POSITION_EARLIEST,
            ):
                raise BadRequest(f"{tp.topic}-{tp.partition}: position {value} is not valid")
            kind = {"offset": "offset", "timestamp_ms": "timestamp"}.get(how or "", "position")
            spec.starts[tp] = default if how is None else (kind, int(value))  # type: ignore[arg-type]
        spec.topics = sorted({tp.topic for tp in spec.starts})
        return spec

    def _topic_ids(self, topics: list[str]) -> dict[str, str]:
        return {t: meta.topic_id for t in topics if (meta := self.view.topic(t)) is not None}

    def _gone_topic(self, topic_ids: dict[str, str]) -> str | None:
        """The first of the stream's topics that was deleted (or re-created) since it began."""
        for t, topic_id in topic_ids.items():
            meta = self.view.topic(t)
            if meta is None or meta.deleting or meta.topic_id != topic_id:
                return t
        return None

    def _live_partition_count(self, topic: str) -> int | None:
        """The topic's partition count in the node's view; None when it is gone."""
        meta = self.view.topic(topic)
        return None if meta is None or meta.deleting else meta.partition_count

    def _partition_count(self, topic: str) -> int:
        if not topic:  # malformed, not an unknown topic to retry
            raise BadRequest("a topic name is empty (in topics or partitions)")
        meta = self.view.topic(topic)
        if meta is None or meta.deleting:
            raise BadRequest(f"unknown topic {topic!r}", grpc.StatusCode.NOT_FOUND)
        return meta.partition_count

    # -- CommitOffsets ---------------------------------------------------------------------

    @_timed("CommitOffsets")
    async def CommitOffsets(self, raw: bytes, context: Any) -> rp.CommitOffsetsResponse:
        try:
            req = _parse(rp.CommitOffsetsRequest, raw, "the request")
            seen: set[tuple[str, int]] = set()
            for po in req.offsets:
                if po.partition < 0:  # malformed, like a negative offset (was "no partition")
                    raise BadRequest(
                        f"topic {po.topic!r}: partition must be >= 0, got {po.partition}"
                    )
                if po.offset < 0:
                    raise BadRequest(
                        f"{po.topic}-{po.partition}: offset must be >= 0, got {po.offset}"
                    )
                # [p1:3, p1:2] answered NONE twice and committed 2,
                # the last one winning (moving the offset back, which commits never do).
                if (po.topic, po.partition) in seen:
                    raise BadRequest(
                        f"{po.topic}-{po.partition} is listed twice in offsets: commit one "
                        "offset per partition"
                    )
                seen.add((po.topic, po.partition))
        except BadRequest as exc:
            await _abort(context, exc.status, exc.message, exc.code)
        return await self._commit(req)

    async def _commit(self, req: rp.CommitOffsetsRequest) -> rp.CommitOffsetsResponse:
        resp = rp.CommitOffsetsResponse()
        sub = self.subscriptions.get(req.subscription_id)
        if sub is None or not sub.spec.group_id:
            resp.error_code = E.UNKNOWN_MEMBER_ID  # type: ignore[assignment]
            resp.error_message = (
                f"no group subscription {req.subscription_id!r} is open on node {self.node_id} "
                "(it ended, or another node serves it: commit on the stream's channel)"
            )
            return resp
        offsets = {TopicPartition(po.topic, po.partition): po.offset for po in req.offsets}
        metadata = {TopicPartition(po.topic, po.partition): po.metadata for po in req.offsets}
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[BaseException | None, dict[TopicPartition, int]]]
        fut = loop.create_future()

        def done(err: BaseException | None, sent: dict[TopicPartition, int]) -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_result((err, sent))

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        decided = sub.commit(offsets, done, metadata=metadata)
        try:
            err, sent = await asyncio.wait_for(fut, DEFAULT_TIMEOUT_MS / 1000.0)
        except TimeoutError:
            err, sent = RequestTimedOutError("the coordinator did not confirm in time"), {}
            sent = {tp: o for tp, o in offsets.items() if tp not in decided}
        code, message = E.NONE, ""
        if err is not None:
            code = err.code if isinstance(err, StromError) and err.code else E.UNKNOWN_SERVER_ERROR
            message = err.message if isinstance(err, StromError) else str(err)
            if code not in _PARTITION_COMMIT_ERRORS:
                resp.error_code = code  # type: ignore[assignment]
                resp.error_message = message
        for po in req.offsets:
            tp = TopicPartition(po.topic, po.partition)
            r = resp.results.add(topic=po.topic, partition=po.partition)
            if tp in decided:
                r.error_code = decided[tp]  # type: ignore[assignment]
                meta = self.view.topic(tp.topic)
                if decided[tp] != E.NONE and (
                    meta is None or not 0 <= tp.partition < meta.partition_count
                ):
                    r.error_code = E.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[assignment]
                    r.error_message = f"there is no partition {tp.topic}-{tp.partition}"
                elif decided[tp] != E.NONE:
                    r.error_code, r.error_message = _not_owned(sub, tp)  # type: ignore[assignment]
            elif tp in sent and code != E.NONE:
                r.error_code = code  # type: ignore[assignment]
                r.error_message = message
        return resp

    # -- lifecycle -------------------------------------------------------------------------

    async def close(self, timeout_s: float = 5.0) -> None:
        """Node shutdown: end every stream (UNAVAILABLE: subscribe again elsewhere), leave
        the groups, flush and stop the node's producers."""
        self.shutting_down = True
        subs = list(self.subscriptions.values())
        for sub in subs:
            sub.end_with(
                "UNAVAILABLE", "the node is shutting down: subscribe again", E.BROKER_NOT_AVAILABLE
            )
        await asyncio.gather(
            *(asyncio.to_thread(s.join, timeout_s) for s in subs), return_exceptions=True
        )
        await self.producer.close(timeout_s)
        await self.route.close()


def _not_owned(sub: Subscription, tp: TopicPartition) -> tuple[int, str]:
    """The code and text of a commit refused because ``sub`` does not own ``tp``.

    Every such refusal said STALE_MEMBER_EPOCH "the group moved it
    to another member", also for a partition of a topic the stream never subscribed to, which
    was never assigned to it. The coordinator itself would take any commit carrying the
    member's epoch (as Kafka's does); the stream refuses what its member does not own, so that
    a reader cannot overwrite the offsets of the partition's real owner. A topic outside the
    stream's subscription is the caller's mistake (UNKNOWN_TOPIC_OR_PARTITION for this stream:
    fix the commit); a subscribed partition not owned now is STALE_MEMBER_EPOCH (drop it),
    said as moved only when the group did take it from this stream."""
    name = f"{tp.topic}-{tp.partition}"
    if tp.topic not in sub.spec.topics:
        topics = ", ".join(sorted(sub.spec.topics))
        return E.UNKNOWN_TOPIC_OR_PARTITION, (
            f"{name} is not a partition of this stream's subscription (topics: {topics}), so "
            "the group never assigned it to this stream's member: commit only partitions an "
            "assignment message listed"
        )
    if sub.ever_revoked(tp):
        why = "the group moved it to another member"
    else:
        why = "the group has not assigned it to this stream's member; another member may own it"
    return E.STALE_MEMBER_EPOCH, (
        f"{name} is not assigned to this subscription ({why}): drop the commit"
    )


def _too_old(table: pa.Table, configs: Mapping[str, str]) -> np.ndarray | None:
    """The call's ``message.timestamp.before.max.ms`` check, made on the request's
    timestamps column before any batch is built (vectorized): the bound each record's
    timestamp must not be below, as an array of timestamps to compare, or None when the
    topic sets no before limit (Kafka's default), uses LogAppendTime, or the call gave no
    timestamps (the node's clock stamps them). The leader checks again on append with its
    own clock (``Log._check_bodies``): this one spares the round trip and names the
    record by its index in the call."""
    if "timestamp" not in table.column_names:
        return None
    if configs.get("message.timestamp.type") == "LogAppendTime":
        return None
    raw = configs.get("message.timestamp.before.max.ms")
    try:
        before = int(raw) if raw is not None else LONG_MAX
    except ValueError:  # the leader ignores an unparsable override too (usable_configs)
        return None
    if before >= LONG_MAX:
        return None
    ts = table.column("timestamp").to_numpy()
    return np.where(ts < wall_ms() - before, ts, -1)


def _old_record(too_old: np.ndarray, idx: np.ndarray, topic: str, partition: int) -> str | None:
    """The refusal of one partition's records when one of them is too old (else None)."""
    mine = too_old[idx]
    hit = np.flatnonzero(mine >= 0)
    if not len(hit):
        return None
    first = int(hit[0])
    return (
        f"{topic}-{partition}: record {int(idx[first])} of the call has timestamp "
        f"{int(mine[first])}, further before the node's time than the topic's "
        "message.timestamp.before.max.ms allows"
    )


def _failed(message: str) -> asyncio.Future[int]:
    """A finished task carrying an INVALID_TIMESTAMP refusal, in the place of a send."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    fut.set_exception(InvalidTimestampError(message))
    return fut


def _malformed_topic(name: str) -> str | None:
    """Why ``name`` can be no topic's name (Kafka's rules; internal names allowed), or None."""
    try:
        validate_topic_name(name, allow_internal=True)
    except InvalidTopicError as exc:
        return f"invalid topic name: {exc.message}"
    return None


def _with_throttle_time(data: bytes, held_ms: int) -> bytes:
    """A serialized SubscribeResponse with its ``throttle_time_ms`` (field 3, varint) set:
    appended to the bytes the pump serialized (a field after the others parses as set), so
    the message is not parsed again."""
    if held_ms <= 0:
        return data
    return data + _THROTTLE_TAG + encode_varint(min(held_ms, 2**31 - 1))


#: The tag of SubscribeResponse.throttle_time_ms (field 3, wire type 0).
_THROTTLE_TAG = bytes([3 << 3])


def _check_sequence(seq: rp.ProducerSequence, partition: int | None, acks: int) -> None:
    if partition is None:
        raise BadRequest(
            "producer needs partition set: sequence numbers count per partition, so "
            "compute the key's partition (murmur2, see docs/grpc-clients.md) and give it"
        )
    if acks == 0:
        raise BadRequest("producer needs acks ACKS_ALL or ACKS_LEADER (ACKS_NONE confirms nothing)")
    if seq.producer_id < 0:
        raise BadRequest(
            f"producer.producer_id must be >= 0 (from InitProducerId), got {seq.producer_id}"
        )
    if not 0 <= seq.producer_epoch <= 32767:
        raise BadRequest(f"producer.producer_epoch must be in 0..32767, got {seq.producer_epoch}")
    if seq.base_sequence < 0:
        raise BadRequest(f"producer.base_sequence must be >= 0, got {seq.base_sequence}")


def add_to_server(service: RecordService, server: grpc.aio.Server) -> None:
    """Register ``strom.v1.RecordService``. Requests arrive as bytes (parsed in the
    handlers, so a malformed one is INVALID_ARGUMENT naming the problem, not a generic
    deserialization failure); Subscribe messages leave pre-serialized by the pump."""
    handlers = {
        "ProduceRecords": grpc.unary_unary_rpc_method_handler(
            service.ProduceRecords,
            response_serializer=rp.ProduceRecordsResponse.SerializeToString,
        ),
        "Subscribe": grpc.unary_stream_rpc_method_handler(service.Subscribe),
        "CommitOffsets": grpc.unary_unary_rpc_method_handler(
            service.CommitOffsets,
            response_serializer=rp.CommitOffsetsResponse.SerializeToString,
        ),
    }
    add_handlers(server, rp.DESCRIPTOR.services_by_name["RecordService"], handlers)


__all__ = ["SERVICE_NAME", "RecordService", "add_to_server"]
