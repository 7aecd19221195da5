"""What the coordinator's concerns share: the started view, finding a group's shard, and
running a group engine call durably (DESIGN §7).

The concern modules (shard_ownership, storage_io, group_rpcs, offset_rpcs, timers and the
transaction RPCs of txn_service) are mixins over :class:`CoordinatorCore`, joined into one
servicer in :mod:`strom.coordinator.service`.

Writes. Every change the engines return (:class:`ConsumerGroup` ``records``) is made durable,
acks=all, with the owner's producer id, epoch and the next sequence, *before* the RPC is
answered. Engine steps of one shard are serialised by a lock; their records go through the
shard's write queue, one append in flight, what queued meanwhile appended together as the next
batch (:mod:`strom.coordinator.shard_writes`), so sequences are consecutive. A write that
cannot be completed (fenced, leader gone for too long) leaves the in-memory state possibly
ahead of the log, so the shard is reloaded from the log (which also re-fences), and the callers
of it and of every write queued after it get a retriable error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from google.protobuf.message import Message

from strom.api import coordinator_pb2
from strom.clock import wall_ms
from strom.coordinator import metrics
from strom.coordinator.group import ConsumerGroup, GroupConfig, GroupState
from strom.coordinator.lookup import shard_count
from strom.coordinator.node_sessions import NodeSessions
from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC, GroupRecord, shard_for_group
from strom.coordinator.produce_streams import ProduceStreams
from strom.coordinator.shards import RELEASE_AFTER_S, Shard, ShardKind
from strom.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    ErrorCode,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    NotCoordinatorError,
    StromError,
    error_name,
)
from strom.metadata import ClusterView, KeepAlive, MetadataStore, WatchEvent
from strom.security.channel import ChannelCache

log = logging.getLogger("strom.coordinator")
E = ErrorCode
T = TypeVar("T")


def rpc(*, with_context: bool = False) -> Callable[[Callable[..., Awaitable[None]]], Any]:
    """Make ``body(self, request, response)`` the handler of the RPC it is named after: a
    fresh ``<Name>Response`` filled in place by the body and returned. ``with_context``
    passes the gRPC context as a fourth argument. Errors are the body's to answer
    (:meth:`CoordinatorCore._fail`): one group's failure is that group's error code."""

    def decorate(body: Callable[..., Awaitable[None]]) -> Any:
        response_type = getattr(coordinator_pb2, f"{body.__name__}Response")

        @functools.wraps(body)
        async def handler(self: CoordinatorCore, request: Any, context: Any) -> Message:
            response = response_type()
            await body(self, request, response, *((context,) if with_context else ()))
            return response

        return handler

    return decorate


class CoordinatorCore:
    """State and plumbing every concern mixin uses; the attributes are set in
    :meth:`strom.coordinator.service.CoordinatorService.__init__`."""

    coordinator_id: int
    advertise_host: str
    advertise_port: int
    metrics_port: int
    incarnation_id: str
    lease_ttl_s: int
    lag_interval_s: float
    group_config: GroupConfig
    store: MetadataStore | None
    view: ClusterView | None
    group_kind: ShardKind
    txn_kind: ShardKind
    kinds: tuple[ShardKind, ...]
    #: The group shards this process owns (the transaction ones: ``txn_kind.shards``).
    shards: dict[int, Shard]
    _lease: Any
    _keepalive: KeepAlive | None
    _loop: asyncio.AbstractEventLoop | None
    _wake: asyncio.Event | None
    _tasks: set[asyncio.Task[Any]]
    _channels: ChannelCache
    #: The appends to the internal topics, on one ProduceStream per node.
    _appends: ProduceStreams
    _stopping: bool
    _topics_cache: tuple[int, dict[str, int], dict[str, str]]
    #: The live storage node registrations, for fencing the members they host.
    _node_sessions: NodeSessions

    # Implemented by the mixins (shard_ownership, shard_writes); declared for the others.
    def _unload(self, shard: Shard) -> None:
        raise NotImplementedError

    def _start_load(self, shard: Shard) -> None:
        raise NotImplementedError

    def _forget_lag(self, group_ids: Iterable[str]) -> None:
        raise NotImplementedError  # strom.coordinator.timers.Timers

    def _queue_write(self, shard: Shard, records: list[GroupRecord]) -> asyncio.Future[None]:
        raise NotImplementedError

    async def _write(self, shard: Shard, records: list[GroupRecord]) -> None:
        raise NotImplementedError

    async def _durable(self, shard: Shard) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_view_events(self, events: list[WatchEvent]) -> None:
        """Watch thread: something changed in etcd (owners, topics, nodes): re-check shards,
        and follow the storage nodes' registrations (:mod:`strom.coordinator.node_sessions`)."""
        view = self.view
        if view is not None:
            live = {n: reg.incarnation_id for n, reg in view.live_nodes().items()}
            self._node_sessions.update(view.keys.nodes_prefix, events, live)
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(wake.set)

    def _from_thread(self, fn: Callable[[], Awaitable[None]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lambda: self._spawn(fn()))

    def _started_view(self) -> ClusterView:
        """The cluster view, or COORDINATOR_NOT_AVAILABLE (retriable) while the process is
        still starting: the gRPC port is bound before etcd is reached, and a client that
        calls in that moment must be told to retry, not handed an internal error."""
        if self.view is None:
            raise CoordinatorNotAvailableError(
                f"coordinator {self.coordinator_id} is starting; retry shortly"
            )
        return self.view

    def _lease_live(self) -> bool:
        """False once the lease of our shard keys has surely expired (see
        :meth:`KeepAlive.surely_expired`), before the keeper reports the loss."""
        keepalive = self._keepalive
        return keepalive is None or not keepalive.surely_expired()

    def _check_lease(self, shard: int, topic: str = CONSUMER_OFFSETS_TOPIC) -> None:
        """Raise NOT_COORDINATOR while our lease has surely expired: the lease is the
        shard's leadership (Kafka's offsets partition leader), and a process back from a
        pause must not answer from memory another coordinator has since moved on from."""
        if not self._lease_live():
            raise NotCoordinatorError(
                f"coordinator {self.coordinator_id} cannot renew its lease on {topic} shard "
                f"{shard} (it was paused or cannot reach etcd); ask the cluster again"
            )

    def _shard_of(self, group_id: str) -> Shard:
        """The loaded shard holding ``group_id``; raises the group-level errors."""
        if not group_id:
            raise InvalidGroupIdError("group id must not be empty")
        return self._loaded_shard(self.group_kind, group_id)

    def _loaded_shard(self, kind: ShardKind, key: str) -> Shard:
        """The loaded shard of ``kind`` holding ``key`` (a group or transactional id);
        NOT_COORDINATOR when this process does not serve it, else :meth:`_raise_not_loaded`."""
        shards = shard_count(self._started_view(), topic=kind.topic)
        if shards is None:
            raise NotCoordinatorError(f"{kind.topic} does not exist yet")
        s = shard_for_group(key, shards)
        shard = kind.shards.get(s)
        if shard is None or self._stopping:
            raise NotCoordinatorError(
                f"coordinator {self.coordinator_id} does not own {kind.topic} shard {s}"
            )
        self._check_lease(s, kind.topic)
        self._raise_not_loaded(shard)
        return shard

    def _raise_not_loaded(self, shard: Shard) -> None:
        """For a shard not served (yet): COORDINATOR_LOAD_IN_PROGRESS with its last load
        failure, or COORDINATOR_NOT_AVAILABLE when that load could not reach the storage
        nodes, so the client looks its coordinator up again and finds whoever took the
        shard over once this one released it (``shard_ownership``)."""
        if shard.loaded:
            return
        if shard.unreachable is None:
            raise CoordinatorLoadInProgressError(
                f"{shard.topic} shard {shard.index} is still loading{shard.load_failure()}"
            )
        since = shard.unserved_since
        unserved_s = time.monotonic() - since if since is not None else 0.0
        if self._other_coordinators():
            then = (
                f"it gives the shard up to another coordinator once unserved for "
                f"{RELEASE_AFTER_S:.0f} s; look the coordinator up again"
            )
        else:
            then = "no other coordinator runs to take the shard over; it keeps retrying"
        raise CoordinatorNotAvailableError(
            f"coordinator {self.coordinator_id} cannot reach the storage nodes for "
            f"{shard.topic}-{shard.index} (not served for {unserved_s:.0f} s; last attempt: "
            f"{shard.unreachable}); {then}"
        )

    def _other_coordinators(self) -> set[str]:
        """Incarnations of the other registered coordinator processes (their lease-bound
        ``coordinator_members/`` keys): who could take a shard this one gives up."""
        view = self.view
        if view is None:
            return set()
        with view.lock:
            members = {v.value.incarnation_id for v in view.coordinator_members.values()}
        return members - {self.incarnation_id}

    def _check_serving(self, shard: Shard) -> None:
        """Raise the retriable error for a shard that stopped being served while a request
        waited for it (its lock, a write): call right after taking ``shard.lock``, before
        reading its state. ``_unload`` empties the tables without the lock, and an answer
        made from them (INVALID_PRODUCER_ID_MAPPING) would fence a healthy producer; Kafka
        answers NOT_COORDINATOR during a move, and the client looks it up again."""
        kind = shard.kind
        if self._stopping or kind is None or kind.shards.get(shard.index) is not shard:
            raise NotCoordinatorError(
                f"coordinator {self.coordinator_id} gave up {shard.topic} shard {shard.index} "
                "meanwhile; ask the cluster for its new coordinator"
            )
        self._check_lease(shard.index, shard.topic)
        self._raise_not_loaded(shard)

    async def _mutate(
        self,
        group_id: str,
        fn: Callable[[ConsumerGroup], T],
        records_of: Callable[[T], list[GroupRecord]],
        *,
        create: bool = True,
    ) -> T:
        """Run an engine call on the group and return once its records are durable.

        The engine step runs under the shard lock; its records join the shard's write queue
        and the lock is let go, so the commits and changes of many members go to the log
        together (:mod:`strom.coordinator.shard_writes`). A call that changes nothing still
        waits for the writes queued before it: it may have read what they changed. The engine
        raises (changing nothing) for protocol errors. If a write fails, the in-memory state
        may be ahead of the log: the shard is reloaded from the log and the call fails with a
        retriable error.
        """
        shard = self._shard_of(group_id)
        refused: Exception | None = None
        written: asyncio.Future[None] | None = None
        async with shard.lock:
            self._check_serving(shard)
            try:
                group = shard.groups.get(group_id)
                fresh = group is None
                if group is None:
                    if not create:
                        raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
                    group = ConsumerGroup(group_id, config=self.group_config, now_ms=wall_ms())
                result = fn(group)
            except Exception as exc:
                refused = exc  # answered once what it was decided from is durable (below)
            else:
                records = records_of(result)
                written = self._queue_write(shard, records) if records else None
                if fresh and records:
                    shard.groups[group_id] = group
                if group.state is GroupState.DEAD:
                    shard.groups.pop(group_id, None)
            if refused is not None or written is None:
                # A refusal or an answer that changes nothing was decided from state that
                # writes still in flight made (a group being deleted, a member leaving): if
                # they fail, the answer would be wrong, so it waits for them, and fails too.
                written = shard.write_tail
        if written is not None:
            await asyncio.shield(written)
        if refused is not None:
            raise refused
        return result

    def _topics(self) -> dict[str, int]:
        """The cluster's live topics → partition counts (cached per view revision)."""
        return self._live_topics()[0]

    def _topic_ids(self) -> dict[str, str]:
        """The cluster's live topics → topic ids: a committed offset belongs to the topic
        whose id it was committed with, not to a later topic of the same name."""
        return self._live_topics()[1]

    def _live_topics(self) -> tuple[dict[str, int], dict[str, str]]:
        view = self._started_view()
        with view.lock:
            rev = view.revision
            if self._topics_cache[0] == rev:
                return self._topics_cache[1], self._topics_cache[2]
            live = [(n, v.value) for n, v in view.topics.items() if not v.value.deleting]
        topics = {n: t.partition_count for n, t in live}
        ids = {n: t.topic_id for n, t in live}
        self._topics_cache = (rev, topics, ids)
        return topics, ids

    @staticmethod
    def _fail(rpc: str, resp: Any, exc: BaseException) -> None:
        if isinstance(exc, StromError):
            resp.error_code = exc.code if exc.code is not None else E.UNKNOWN_SERVER_ERROR
            resp.error_message = exc.message
        else:
            log.exception("%s failed", rpc, exc_info=exc)
            resp.error_code = E.UNKNOWN_SERVER_ERROR
            resp.error_message = f"{type(exc).__name__}: {exc}"
        metrics.RPC_ERRORS.labels(rpc, error_name(resp.error_code)).inc()
