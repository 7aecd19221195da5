"""What every StorageService handler shares: per-partition refusals, finding the partition
a request names (and the leader hints a refusal carries), request latency and quota
throttling (DESIGN §8).

Every request covers many topic-partitions and every partition gets its own error code: a
failure of one (unknown, not leader, corrupt batch, disk error, a bug) is caught and
answered for that partition alone, as a :class:`_Refusal`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc

from strom.api import common_pb2, metadata_pb2, storage_pb2
from strom.errors import ErrorCode
from strom.log import CorruptLogError, UndecodableBatchError
from strom.metadata import ClusterView
from strom.security import CURRENT_PRINCIPAL, QUOTAS
from strom.security.quotas import CHARGED_BY_CALLER
from strom.service.limits import Admission
from strom.service.metrics import result_code, timed
from strom.storage import metrics
from strom.storage.manager import PartitionManager
from strom.storage.partition import Partition
from strom.storage.producer_ids import ProducerIdAllocator
from strom.storage.writer import AppendWriter

log = logging.getLogger("strom.storage.servicer")

E = ErrorCode
R = TypeVar("R")


#: The first partition error of the Fetch being answered (its answer is bytes, so the
#: latency wrapper cannot read it from the response).
_FETCH_RESULT: contextvars.ContextVar[int] = contextvars.ContextVar("fetch_result", default=0)


def _result(resp: Any) -> int:
    """The whole-request error, else the first partition's (a Fetch answers bytes: its
    result comes through :data:`_FETCH_RESULT`)."""
    return _FETCH_RESULT.get() if isinstance(resp, bytes) else result_code(resp)


def _timed(rpc: str) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Record the RPC's latency in strom_storage_request_latency_seconds{rpc, result}: the
    result is the whole-request error, else the first partition's error (NONE = success)."""
    return timed(rpc, metrics.REQUEST_LATENCY, _result)


class _Refusal(Exception):
    """A per-partition error answer, raised from the lookup helpers."""

    def __init__(self, code: int, message: str, hint: common_pb2.LeaderAndEpoch | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


#: Seconds between two log lines about the same partition's unreadable data.
CORRUPT_LOG_INTERVAL_S = 60.0
#: (kind, topic, partition) -> (when its last line was logged, refusals since then not logged).
_corrupt_logged: dict[tuple[str, str, int], tuple[float, int]] = {}


def _log_limited(kind: str, level: int, what: str, topic: str, partition: int, text: str) -> None:
    """Log ``text`` about a partition at most once per CORRUPT_LOG_INTERVAL_S per ``kind``:
    every fetch or lookup of a reader stuck at the same batch fails the same way, many times
    a second, and one line each buries the logs."""
    key = (kind, topic, partition)
    now = time.monotonic()
    last, suppressed = _corrupt_logged.get(key, (-CORRUPT_LOG_INTERVAL_S, 0))
    if now - last < CORRUPT_LOG_INTERVAL_S:
        _corrupt_logged[key] = (last, suppressed + 1)
        return
    _corrupt_logged[key] = (now, 0)
    more = f" ({suppressed} more refusals since the last report)" if suppressed else ""
    log.log(level, "%s %s-%d: %s%s", what, topic, partition, text, more)


def _corrupt(what: str, topic: str, partition: int, exc: CorruptLogError) -> _Refusal:
    """A read found damaged data: counted (strom_storage_corrupt_reads_total, so that a
    damaged replica shows) and logged, rate-limited."""
    metrics.CORRUPT_READS.labels(topic, str(partition)).inc()
    at = f" at offset {exc.offset}" if exc.offset >= 0 else ""
    _log_limited(
        "corrupt",
        logging.ERROR,
        what,
        topic,
        partition,
        f"stored data{at} failed a check, refused: {exc}",
    )
    return _Refusal(E.STORAGE_ERROR, f"stored data{at} failed a check: {exc}")


def _undecodable(what: str, topic: str, partition: int, exc: UndecodableBatchError) -> _Refusal:
    """A batch readers cannot decode: what a consumer meets there, CORRUPT_MESSAGE, logged
    rate-limited without a traceback. Not disk damage (every replica holds the same bytes)."""
    _log_limited("undecodable", logging.WARNING, what, topic, partition, str(exc))
    return _Refusal(E.CORRUPT_MESSAGE, f"{topic}-{partition}: {exc}")


def _unexpected(what: str, topic: str, partition: int, exc: BaseException) -> _Refusal:
    """Map an exception escaping a partition's work to its error code (and log it)."""
    if isinstance(exc, _Refusal):
        return exc
    if isinstance(exc, UndecodableBatchError):
        return _undecodable(what, topic, partition, exc)
    if isinstance(exc, CorruptLogError):
        return _corrupt(what, topic, partition, exc)
    if isinstance(exc, OSError):
        log.error("%s %s-%d: disk error: %s", what, topic, partition, exc)
        return _Refusal(E.STORAGE_ERROR, f"disk error: {exc}")
    log.error("%s %s-%d failed", what, topic, partition, exc_info=exc)
    return _Refusal(E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")


def _fail_partition(pr: Any, what: str, topic: str, partition: int, exc: BaseException) -> _Refusal:
    """Answer one partition of a response with the error ``exc`` maps to; the refusal."""
    r = _unexpected(what, topic, partition, exc)
    pr.error_code = r.code
    pr.error_message = r.message
    return r


#: What a held answer leaves of the caller's deadline, at least: the answer's way back (and
#: a loaded node's slack) must fit in it, or a written request is reported as timed out.
HOLD_MARGIN_S = 1.0


def _call_left(context: Any) -> float | None:
    """Seconds left before the deadline of the call ``context`` serves; None without one
    (no deadline, or an in-process caller with no context)."""
    time_remaining = getattr(context, "time_remaining", None)
    if time_remaining is None:
        return None
    left = time_remaining()
    # gRPC answers a huge number (not None) for a call without a deadline.
    return None if left is None or left > 1e9 else max(float(left), 0.0)


def _charge(kind: str, nbytes: int) -> float:
    """Charge the caller's quota of ``kind`` with ``nbytes`` now; the seconds its answer
    should be held (0: within quota; at most quotas.MAX_THROTTLE_S, the rest stays owed).
    Nothing when an outer handler charged the caller already (CHARGED_BY_CALLER)."""
    if CHARGED_BY_CALLER.get() or not QUOTAS.active:
        return 0.0
    return QUOTAS.throttle(CURRENT_PRINCIPAL.get(), kind, nbytes)


async def _hold(kind: str, delay: float, waited_ms: int = 0, context: Any = None) -> int:
    """Hold an answer ``delay`` seconds, but never into the last HOLD_MARGIN_S of the
    caller's deadline: the work is done, and an answer lost to the deadline is a written
    request reported as a timeout, which the caller retries (a 350 KB
    ProduceRecords at 10,000 B/s written, then DEADLINE_EXCEEDED, then written again). What
    is not held stays owed: the caller's next request waits it out first
    (:func:`_wait_out_debt`). The ms held, with the ``waited_ms`` waited before the request
    was served, for ``throttle_time_ms``."""
    left = _call_left(context)
    if left is not None:
        delay = min(delay, max(left - HOLD_MARGIN_S, 0.0))
    if delay <= 0 and not waited_ms:
        return 0
    metrics.THROTTLED.labels(kind).inc()
    if delay > 0:
        await asyncio.sleep(delay)
    return waited_ms + int(max(delay, 0.0) * 1000)


async def _throttle(kind: str, nbytes: int, waited_ms: int = 0, context: Any = None) -> int:
    """Hold the answer back while the caller is over its quota (Kafka's throttling: delay,
    never drop), within the call's deadline (:func:`_hold`); the ms it was held, with the
    ``waited_ms`` it waited before it was served (:func:`_wait_out_debt`), for
    ``throttle_time_ms``."""
    if CHARGED_BY_CALLER.get():
        return 0
    return await _hold(kind, _charge(kind, nbytes), waited_ms, context)


class _Gate:
    """The requests of one principal and kind waiting for it to pay what it owes."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # FIFO: the waiters go on in the order they came
        self.users = 0


#: (principal, kind) -> the gate its requests wait at while it owes (none: it owes nothing).
_GATES: dict[tuple[str, str], _Gate] = {}


def _owing_principal(kind: str) -> str | None:
    """The caller's principal when it is over its quota of ``kind`` now (its request will
    wait before it is served: see :func:`_wait_out_debt`), else None. For admission's
    per-principal share of the in-flight budget (strom.service.limits.Admission)."""
    if not QUOTAS.active or CHARGED_BY_CALLER.get():
        return None
    principal = CURRENT_PRINCIPAL.get()
    return principal if QUOTAS.owed(principal, kind) > 0.001 else None


async def _wait_out_debt(kind: str) -> int:
    """Before a request of ``kind`` is served: wait while its caller is still ahead of its
    quota (what earlier answers' capped holds did not cover, or what requests in flight
    together put it ahead); the ms waited, for ``throttle_time_ms``.

    The cap of an answer's hold (quotas.MAX_THROTTLE_S, below a client's timeout) then
    forgives nothing: the work of a principal that owes waits until it has paid. Its
    requests wait one after another, in the order they came, and each is served at once
    after the one before it (nothing yields between leaving the gate and the append), so a
    producer's batches in flight keep their order. A caller that gives up while it waits
    has had nothing done."""
    if not QUOTAS.active or CHARGED_BY_CALLER.get():
        return 0
    principal = CURRENT_PRINCIPAL.get()
    key = (principal, kind)
    gate = _GATES.get(key)
    if gate is None:
        if QUOTAS.owed(principal, kind) <= 0:
            return 0
        gate = _GATES[key] = _Gate()
    loop = asyncio.get_running_loop()
    start = loop.time()
    gate.users += 1
    try:
        async with gate.lock:
            while (owed := QUOTAS.owed(principal, kind)) > 0.001:
                await asyncio.sleep(owed)
    finally:
        gate.users -= 1
        if gate.users == 0 and _GATES.get(key) is gate:
            del _GATES[key]
    return int((loop.time() - start) * 1000)


def _node(reg: metadata_pb2.NodeRegistration) -> common_pb2.Node:
    node = common_pb2.Node(node_id=reg.node_id, host=reg.host, port=reg.port)
    if reg.HasField("rack"):
        node.rack = reg.rack
    return node


#: The IsolationLevel values (storage.proto); any other number is a caller's mistake.
ISOLATION_LEVELS = (
    storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
    storage_pb2.ISOLATION_LEVEL_READ_COMMITTED,
)


def isolation_error(request: Any) -> str | None:
    """Why a request's ``isolation_level`` is not an IsolationLevel, else None: proto3 keeps
    an unknown enum number as it is, and it must not pass as read_uncommitted."""
    level = request.isolation_level
    if level in ISOLATION_LEVELS:
        return None
    return (
        f"isolation_level {level} is not an IsolationLevel: 0 (READ_UNCOMMITTED) or "
        "1 (READ_COMMITTED)"
    )


def per_partition(
    request_topics: Iterable[Any], response_topics: Any, **initial: Any
) -> Iterator[tuple[str, Any, Any]]:
    """Walk a request's topics and partitions, adding each to the response in the same order
    with the ``initial`` fields set: yields (topic, request partition, response partition)."""
    for rt in request_topics:
        tr = response_topics.add(topic=rt.topic)
        for rp in rt.partitions:
            yield rt.topic, rp, tr.partitions.add(partition=rp.partition, **initial)


def add_handlers(server: grpc.aio.Server, service: Any, handlers: dict[str, Any]) -> None:
    """Register ``handlers`` (method name -> RpcMethodHandler) for ``service`` (a service
    descriptor), refusing to start with a method left unhandled."""
    missing = {m.name for m in service.methods} - set(handlers)
    assert not missing, f"{service.name} methods without a handler: {missing}"
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(service.full_name, handlers)


class StorageCore:
    """State and partition lookups every handler mixin uses; the attributes are set in
    :meth:`strom.storage.servicer.StorageServicer.__init__`."""

    node_id: int
    manager: PartitionManager
    view: ClusterView
    writer: AppendWriter
    shutting_down: bool
    #: Called when a follower outside the ISR fetches, or a read of a led partition finds
    #: damaged data (the ISR manager checks soon: an expansion, or a resignation).
    on_out_of_sync_fetch: Callable[[], None] | None
    #: Where InitProducerId gets new ids (the node wires it to the controller).
    producer_ids: ProducerIdAllocator | None
    #: Produce admission (in-flight bytes, memory mark); None admits everything.
    admission: Admission | None

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
