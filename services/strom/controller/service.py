"""The controller service: election, admin RPCs and metrics, wired to etcd (DESIGN §2, §3).

Several controllers run; one is active. Each campaigns through :class:`strom.metadata.Election`
on the ``controller`` key with its :class:`ControllerInfo`; the winner rewrites the key (same
lease) with ``epoch`` = the key's create revision, which increases with every new winner.
Standbys answer every RPC with NOT_CONTROLLER and the active controller's address.

Why writes are safe with a deposed controller still running: every etcd transaction the
active controller commits also compares the ``controller`` key's mod_revision with the one it
wrote when it won. Once its lease expires (or it resigns) that key is gone or someone else's,
so its late writes fail as a whole and it steps down, whatever it believes about its lease.

Reads (Describe*, List*) come from a :class:`ClusterView` that follows etcd by watch; writes
read the keys they change straight from etcd (admin traffic is rare, and CAS needs the
current mod_revision anyway) and then wait until the view shows the change, so a caller
that describes right after creating sees what it created. Writes are serialised by one
asyncio lock, as Kafka's controller serialises events: placement sees the previous topic's
partitions, and shutdown can wait for the write in flight before resigning.

etcd limits a transaction to ``--max-txn-ops`` operations (128 by default). A topic whose
partitions fit (up to 127 with the default) is written in one transaction with its
partitions. A larger one is written partition keys first, in chunks, and the topic key last;
the topic key is the commit point. Until it exists the partition keys belong to no topic, and
readers ignore partition keys whose topic is missing, has another topic_id, or has fewer
partitions (that is also how a deleted-and-re-created topic's stale state is told apart). A
controller that dies half-way leaves such orphans; the next active controller deletes them.

Leadership (DESIGN §6): the decisions are the pure functions of :mod:`strom.controller.leadership`.
The active controller reconciles every partition whenever the view reports a change of nodes,
topics or partition states (and once when it becomes active, since a node may have died while
no controller was): a node whose key vanished (lease expired) or that is SHUTTING_DOWN loses
its leaderships and ISR memberships, finished reassignments complete, and (with
``auto_leader_rebalance``) a preferred replica back in the ISR leads again. Wake-ups are
coalesced; a pass reads the nodes, topics and partitions from etcd and writes the changed
states in transactions of up to 100 partitions, each comparing every key's mod_revision and
the controller key; a failed compare re-runs the pass. Nothing sleeps on this path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter as _Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from prometheus_client import Counter, Gauge, Histogram

from strom.api import common_pb2, controller_pb2, controller_pb2_grpc
from strom.api import metadata_pb2 as md
from strom.clock import wall_ms
from strom.controller import leadership, metrics
from strom.controller.acls import AclRpcs
from strom.controller.configs import _effective, apply_config_ops, describe_topic_configs
from strom.controller.placement import PlacementNode, assign_replicas
from strom.controller.prober import NodeProber
from strom.controller.validation import (
    colliding_topic,
    is_internal_topic,
    validate_assignments,
    validate_new_topic,
    validate_partition_increase,
)
from strom.errors import (
    BrokerNotAvailableError,
    ErrorCode,
    InvalidRequestError,
    InvalidTopicError,
    PolicyViolationError,
    ReassignmentInProgressError,
    RequestTimedOutError,
    StromError,
    TopicAlreadyExistsError,
    TopicDeletionInProgressError,
    UnknownTopicOrPartitionError,
    error_name,
)
from strom.metadata import (
    ClusterView,
    Election,
    MetadataStore,
    MetadataUnavailableError,
    Versioned,
    WatchEvent,
    decode,
    encode,
)
from strom.service.metrics import timed_rpcs

log = logging.getLogger("strom.controller")
R = TypeVar("R", bound=Message)
E = ErrorCode

#: gRPC metadata key that lets a caller create topics in the internal ``__`` namespace (the
#: group coordinator creating ``__consumer_offsets``). CreatableTopic has no field for it yet.
INTERNAL_TOPICS_METADATA_KEY = "strom-internal-topics"
#: Version of the etcd layout written into ClusterInfo.
METADATA_VERSION = 1

ACTIVE = Gauge("strom_controller_active", "1 while this controller is the active one, else 0")
ADMIN_REQUESTS = Counter(
    "strom_controller_admin_requests",
    "Controller RPCs by name and result (the whole-request error, else the first item error)",
    ["rpc", "error"],
)
TOPICS = Gauge(
    "strom_controller_topics", "Topics in the cluster (every controller reports; use max())"
)
PARTITIONS = Gauge(
    "strom_controller_partitions",
    "Partitions in the cluster (every controller reports; use max())",
)
LIVE_NODES = Gauge(
    "strom_controller_live_nodes",
    "Registered storage nodes (every controller reports; use max())",
)


OFFLINE_PARTITIONS = Gauge(
    "strom_controller_offline_partitions",
    "Partitions without a leader (every controller reports; use max())",
)
UNDER_REPLICATED = Gauge(
    "strom_controller_under_replicated_partitions",
    "Partitions whose ISR is smaller than their replica set (every controller reports)",
)
LEADER_ELECTIONS = Counter(
    "strom_controller_leader_elections",
    "Leader changes committed by this controller, by reason",
    ["reason"],
)
FAILOVER_SECONDS = Histogram(
    "strom_controller_failover_seconds",
    "From a storage node's registration disappearing to the new partition states committed",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
)
NODES_FENCED = Counter(
    "strom_controller_nodes_fenced",
    "Storage nodes whose lease this controller revoked because they refused connections",
)
FOLLOWING_ACTIVE = Gauge(
    "strom_controller_following_active",
    "1 while this standby holds a health stream to the active controller (fast takeover on)",
)
CONTROLLERS_FENCED = Counter(
    "strom_controller_active_fenced",
    "Active controllers whose election lease this standby revoked because they refused connections",
)
for _reason in ("failure", "preferred", "controlled_shutdown", "unclean", "reassignment"):
    LEADER_ELECTIONS.labels(_reason)
#: Most partition states one reconciliation transaction writes.
RECONCILE_BATCH = 100


class ControllerStartupError(RuntimeError):
    """The controller cannot start (etcd unreachable, wrong cluster); the message says why."""


class _Fenced(Exception):
    """This controller's election key changed under it: it is no longer the active one."""


@dataclass(frozen=True)
class _Leadership:
    """What this controller holds while active."""

    create_revision: int
    #: mod_revision of the controller key after this controller rewrote it; every write
    #: transaction compares it (the fencing token).
    mod_revision: int
    epoch: int
    elected_ms: int


def _now_ms() -> int:
    return wall_ms()


def _rack(node: md.NodeRegistration) -> str | None:
    return node.rack if node.HasField("rack") else None


class ControllerService(AclRpcs, controller_pb2_grpc.ControllerServiceServicer):
    """A controller process: campaigns for leadership and serves ControllerService."""

    name = "controller"

    def __init__(
        self,
        *,
        etcd: str,
        cluster: str,
        controller_id: int,
        advertise_host: str,
        advertise_port: int,
        metrics_port: int = 0,
        session_timeout_s: int = 2,
        default_partitions: int = 1,
        default_replication_factor: int = 1,
        max_txn_ops: int = 128,
        producer_id_block_size: int = 1000,
        connect_timeout_s: float = 10.0,
        auto_leader_rebalance: bool = True,
        fast_failure_detection: bool = True,
    ) -> None:
        self.etcd = etcd
        self.cluster = cluster
        self.controller_id = controller_id
        self.advertise_host = advertise_host
        self.advertise_port = advertise_port
        self.metrics_port = metrics_port
        self.session_timeout_s = session_timeout_s
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self.max_txn_ops = max(max_txn_ops, 3)
        self.producer_id_block_size = producer_id_block_size
        self.connect_timeout_s = connect_timeout_s
        self.auto_leader_rebalance = auto_leader_rebalance
        #: Health streams to every node while active (see prober.py); None when disabled.
        self._prober: NodeProber | None = None
        #: Decoded partition states by key: (mod_revision, state), see get_prefix_cached.
        self._state_cache: dict[str, tuple[int, md.PartitionState]] = {}
        #: While a standby: a health stream to the active controller (see _follow_active).
        self._active_prober: NodeProber | None = None
        self.fast_failure_detection = fast_failure_detection
        self.incarnation_id = str(uuid.uuid4())
        #: Set (from the watch thread) when nodes or partitions changed; the reconcile loop
        #: runs a pass for each wake-up. _node_gone_at = monotonic time a node key vanished.
        self._reconcile_wanted: asyncio.Event | None = None
        self._node_gone_at: float | None = None
        #: Nodes in a controlled shutdown (node id -> incarnation) not yet SHUTTING_DOWN in etcd.
        self._shutting_down: dict[int, str] = {}
        self.store: MetadataStore | None = None
        self.view: ClusterView | None = None
        self._election: Election | None = None
        self._leadership: _Leadership | None = None
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write_lock: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- Service protocol --------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> list[str]:
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(self, server)
        return [controller_pb2.DESCRIPTOR.services_by_name["ControllerService"].full_name]

    async def start(self) -> None:
        """Check etcd, follow the cluster's keys, then campaign (standby until elected)."""
        self._loop = asyncio.get_running_loop()
        self._write_lock = asyncio.Lock()
        self._reconcile_wanted = asyncio.Event()
        try:
            store = MetadataStore(self.etcd, self.cluster)
        except ValueError as exc:
            raise ControllerStartupError(str(exc)) from None
        self.store = store
        try:
            await asyncio.to_thread(store.retry, store.revision, deadline_s=self.connect_timeout_s)
        except MetadataUnavailableError as exc:
            store.close()
            raise ControllerStartupError(
                f"cannot reach etcd at {self.etcd} within {self.connect_timeout_s:.0f}s ({exc})"
            ) from None
        self.view = ClusterView(store)
        self.view.add_listener(self._on_view_events)
        await asyncio.to_thread(self.view.start)
        self._update_gauges()
        self._start_election()
        self._follow_active()
        log.info(
            "controller %d started as a standby, campaigning in cluster %r",
            self.controller_id,
            self.cluster,
            extra={"fields": {"controller_id": self.controller_id, "cluster": self.cluster}},
        )

    async def stop(self) -> None:
        """Finish the write in flight, resign (a standby takes over at once), disconnect."""
        self._stopping = True
        assert self._write_lock is not None
        async with self._write_lock:
            was_active = self._leadership is not None
            self._leadership = None
            ACTIVE.set(0)
            self._stop_prober()
            self._stop_following_active()
            election, self._election = self._election, None
            if election is not None:
                await asyncio.to_thread(election.resign)
        if was_active:
            log.info("controller %d resigned", self.controller_id)
        for task in list(self._tasks):
            task.cancel()
        if self.view is not None:
            await asyncio.to_thread(self.view.stop)  # cancels the etcd watch
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    # -- election ----------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._leadership is not None and not self._stopping

    def _candidate_info(self) -> md.ControllerInfo:
        return md.ControllerInfo(
            controller_id=self.controller_id,
            host=self.advertise_host,
            port=self.advertise_port,
            metrics_port=self.metrics_port,
            epoch=-1,  # set to the key's create revision right after winning
            incarnation_id=self.incarnation_id,
        )

    def _start_election(self) -> None:
        assert self.store is not None
        election = Election(
            self.store,
            self.store.keys.controller,
            self._candidate_info(),
            ttl_s=self.session_timeout_s,
            on_elected=lambda rev: self._from_thread(self._activate, election, rev),
            on_lost=lambda: self._from_thread(self._lose, election, "lease lost"),
        )
        self._election = election
        election.start()

    def _from_thread(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run coroutine function ``fn(*args)`` on the service loop (called from etcd threads)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closing
            loop.call_soon_threadsafe(self._spawn, fn(*args))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _activate(self, election: Election, create_revision: int) -> None:
        """Won the election: stamp the epoch, catch the view up, then serve as active."""
        assert self._write_lock is not None and self.store is not None and self.view is not None
        async with self._write_lock:
            if not self._still_elected(election, create_revision):
                return  # superseded: resigned, stopping, or lost and won again since
            store, view = self.store, self.view
            info = self._candidate_info()
            info.epoch = create_revision
            info.elected_ms = _now_ms()
            try:
                current = await asyncio.to_thread(
                    store.retry,
                    lambda: self._stamp_epoch(election, create_revision, info),
                    deadline_s=max(self.session_timeout_s, 2),
                )
            except MetadataUnavailableError as exc:
                current = None
                log.warning("could not confirm leadership: %s", exc)
            if current is None:
                if self._still_elected(election, create_revision):
                    # The key is gone or someone else's: campaign again from scratch.
                    await self._restart_election(election, "election key lost before activation")
                return
            # Catch up with everything committed up to our own write before acting on the view.
            await asyncio.to_thread(
                view.wait_for, lambda: view.revision >= current.mod_revision, 10.0
            )
            lead = _Leadership(
                create_revision=create_revision,
                mod_revision=current.mod_revision,
                epoch=create_revision,
                elected_ms=info.elected_ms,
            )
            try:
                await asyncio.to_thread(self._cleanup_sync, lead)
            except _Fenced:
                await self._restart_election(election, "fenced while activating")
                return
            except MetadataUnavailableError as exc:
                log.warning("startup housekeeping failed, continuing: %s", exc)
            if not self._still_elected(election, create_revision):
                return  # the lease was lost meanwhile; a later on_elected will come
            self._leadership = lead
            ACTIVE.set(1)
            self._stop_following_active()
            self._start_prober()
            # A node may have died while no controller was active: reconcile everything now.
            self._reconcile_wanted_now()
            self._spawn(self._reconcile_loop(lead))
            log.info(
                "controller %d is now active (epoch %d)",
                self.controller_id,
                lead.epoch,
                extra={"fields": {"controller_id": self.controller_id, "epoch": lead.epoch}},
            )

    # -- fast failure detection -------------------------------------------------------------

    def _start_prober(self) -> None:
        if self.fast_failure_detection and self._prober is None:
            self._prober = NodeProber(self._node_dead)
            self._update_prober()

    def _stop_prober(self) -> None:
        prober, self._prober = self._prober, None
        if prober is not None:
            prober.stop()

    def _update_prober(self) -> None:
        """Follow the registered nodes (event loop only)."""
        if self._prober is None or self.view is None:
            return
        with self.view.lock:
            nodes = {
                nid: (f"{v.value.host}:{v.value.port}", v.value.incarnation_id)
                for nid, v in self.view.nodes.items()
            }
        self._prober.update(nodes)

    async def _node_dead(self, node_id: int, incarnation_id: str) -> None:
        """The prober proved a node dead: end its registration now (as lease expiry would)."""
        if self._leadership is None or self.store is None:
            return
        try:
            revoked = await asyncio.to_thread(
                self.store.revoke_lease_if,
                self.store.keys.node(node_id),
                md.NodeRegistration,
                lambda reg: reg.incarnation_id == incarnation_id,
            )
        except MetadataUnavailableError as exc:
            log.warning("could not revoke the lease of dead node %d: %s", node_id, exc)
            return
        if revoked:
            NODES_FENCED.inc()
            log.warning("revoked the lease of node %d, which refuses connections", node_id)

    # -- a standby's fast detection of a dead active controller ------------------------------

    def _follow_active(self) -> None:
        """While a standby, hold a health stream to the active controller (event loop only).

        The election key lives on the active's etcd lease, so without this a standby takes
        over only when that lease expires (TTL 2 s + up to a keepalive interval). A killed
        process closes its sockets at once: when the stream breaks and every fresh connection
        is *refused* (the same proof the node prober uses), the standby revokes the lease of
        the election key — only while the key still holds that same incarnation — which
        deletes the key exactly as expiry would, and the standbys campaign at once.

        Safety does not rest on this judgement: a controller that were alive after all finds
        its election key gone, and every write it tries compares that key's mod_revision, so
        it commits nothing more and steps down (as after an expiry). Two controllers never
        both commit.
        """
        if not self.fast_failure_detection or self.view is None or self._stopping:
            return
        if self._leadership is not None:
            self._stop_following_active()
            return
        with self.view.lock:
            current = self.view.controller
        target: dict[int, tuple[str, str]] = {}
        if current is not None and current.value.incarnation_id != self.incarnation_id:
            info = current.value
            if info.host and info.port:
                target[info.controller_id] = (f"{info.host}:{info.port}", info.incarnation_id)
        if not target:
            FOLLOWING_ACTIVE.set(0)
        if self._active_prober is None:
            if not target:
                return
            self._active_prober = NodeProber(
                self._active_dead,
                kind="active controller",
                on_reached=lambda _cid, up: FOLLOWING_ACTIVE.set(1 if up else 0),
            )
        self._active_prober.update(target)

    def _stop_following_active(self) -> None:
        prober, self._active_prober = self._active_prober, None
        if prober is not None:
            prober.stop()
        FOLLOWING_ACTIVE.set(0)

    async def _active_dead(self, controller_id: int, incarnation_id: str) -> None:
        """The active controller refuses connections: end its election lease now."""
        if self._leadership is not None or self.store is None or self._stopping:
            return
        try:
            revoked = await asyncio.to_thread(
                self.store.revoke_lease_if,
                self.store.keys.controller,
                md.ControllerInfo,
                lambda info: info.incarnation_id == incarnation_id,
            )
        except MetadataUnavailableError as exc:
            log.warning("could not revoke the lease of dead controller %d: %s", controller_id, exc)
            return
        if revoked:
            CONTROLLERS_FENCED.inc()
            log.warning(
                "revoked the election lease of controller %d, which refuses connections",
                controller_id,
            )

    def _still_elected(self, election: Election, create_revision: int) -> bool:
        return (
            election is self._election
            and not self._stopping
            and election.leader
            and election.create_revision == create_revision
        )

    def _stamp_epoch(
        self, election: Election, create_revision: int, info: md.ControllerInfo
    ) -> Versioned | None:
        """Rewrite our election key with the epoch, keeping its lease (blocking)."""
        assert self.store is not None
        store, key = self.store, self.store.keys.controller
        keepalive = election._keepalive  # the lease the key is bound to
        if keepalive is None:
            return None
        # First, so that the view has the cluster id once it has caught up with the stamp.
        self._ensure_cluster_key()
        t = store.client.transactions
        ok, _ = store._call(
            store.client.transaction,
            compare=[t.create(key) == create_revision],
            success=[t.put(key, encode(info), lease=keepalive.lease)],
            failure=[],
        )
        if not ok:
            return None
        current = store.get(key, md.ControllerInfo)
        if current is None or current.create_revision != create_revision:
            return None
        return current

    def _ensure_cluster_key(self) -> None:
        assert self.store is not None
        info = md.ClusterInfo(
            cluster_id=str(uuid.uuid4()), created_ms=_now_ms(), metadata_version=METADATA_VERSION
        )
        if self.store.create(self.store.keys.cluster, info):
            log.info("created cluster %r with id %s", self.cluster, info.cluster_id)

    async def _lose(self, election: Election, reason: str) -> None:
        if election is not self._election:
            return
        if self._leadership is not None:
            log.warning("controller %d is no longer active: %s", self.controller_id, reason)
        self._leadership = None
        ACTIVE.set(0)
        self._stop_prober()
        self._follow_active()

    async def _restart_election(self, election: Election, reason: str) -> None:
        """Drop ``election`` (its key is no longer ours) and campaign with a fresh one."""
        await self._lose(election, reason)
        if election is not self._election or self._stopping:
            return
        self._election = None
        await asyncio.to_thread(election.resign)  # deletes only a key it created itself
        if not self._stopping:
            self._start_election()

    def _on_view_events(self, events: list[WatchEvent]) -> None:
        """Watch thread: keep gauges current and notice when our election key changes."""
        self._update_gauges()
        assert self.store is not None
        keys = self.store.keys
        node_gone = any(ev.key.startswith(keys.nodes_prefix) and ev.value is None for ev in events)
        if self._prober is not None and any(ev.key.startswith(keys.nodes_prefix) for ev in events):
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._update_prober)
        if self._leadership is not None and any(
            ev.key.startswith((keys.nodes_prefix, keys.partitions_prefix, keys.topics_prefix))
            for ev in events
        ):
            loop = self._loop
            if loop is not None and not loop.is_closed():
                now = time.monotonic()
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(
                        self._reconcile_wanted_now, now if node_gone else None
                    )
        if any(ev.key == self.store.keys.controller for ev in events):
            self._from_thread(self._check_election_key)
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._follow_active)

    async def _check_election_key(self) -> None:
        lead, view, election = self._leadership, self.view, self._election
        if lead is None or view is None or election is None:
            return
        with view.lock:
            current = view.controller
            caught_up = view.revision >= lead.mod_revision
        if caught_up and (current is None or current.mod_revision != lead.mod_revision):
            async with self._locked():
                if self._leadership is lead:
                    await self._restart_election(election, "election key deleted or replaced")

    @contextlib.asynccontextmanager
    async def _locked(self) -> Any:
        assert self._write_lock is not None
        async with self._write_lock:
            yield

    def _update_gauges(self) -> None:
        view = self.view
        if view is None:
            return
        with view.lock:
            topics = {n: v.value for n, v in view.topics.items() if not v.value.deleting}
            LIVE_NODES.set(len(view.nodes))
            offline = under = 0
            for (name, p), v in view.partitions.items():
                meta = topics.get(name)
                if meta is None or p >= meta.partition_count:
                    continue
                offline += v.value.leader < 0
                under += any(r not in v.value.isr for r in leadership.targets(v.value))
        OFFLINE_PARTITIONS.set(offline)
        UNDER_REPLICATED.set(under)
        TOPICS.set(len(topics))
        PARTITIONS.set(sum(t.partition_count for t in topics.values()))
        metrics.update_gauges(view)

    # -- shared plumbing ---------------------------------------------------------------------

    def _controller_node(self) -> common_pb2.Node:
        """The active controller as this process knows it (node_id -1 = unknown)."""
        if self.active:
            return common_pb2.Node(
                node_id=self.controller_id, host=self.advertise_host, port=self.advertise_port
            )
        info = self.view.controller_info() if self.view is not None else None
        if info is None or info.incarnation_id == self.incarnation_id:
            # Our own key while we are not active: stale (fenced, resigning) or we are still
            # activating; either way the caller should look again shortly.
            return common_pb2.Node(node_id=-1)
        return common_pb2.Node(node_id=info.controller_id, host=info.host, port=info.port)

    async def _handle(
        self,
        rpc: str,
        response: R,
        body: Callable[[_Leadership], Awaitable[None]],
        *,
        write: bool,
    ) -> R:
        """Run ``body`` as the active controller and fill the whole-request fields.

        ``body`` fills ``response`` in place, so items already handled keep their results
        when a later item fails the whole request (NOT_CONTROLLER, REQUEST_TIMED_OUT).
        """
        resp: Any = response
        lead = self._leadership
        try:
            if lead is None or self._stopping:
                raise _Fenced()
            if write:
                async with self._locked():
                    lead = self._leadership
                    if lead is None or self._stopping:
                        raise _Fenced()
                    await body(lead)
            else:
                await body(lead)
        except _Fenced:
            election = self._election
            if lead is not None and self._leadership is lead and election is not None:
                # A write found the election key changed: step down before answering, so the
                # answer names the new controller (from the view), not this one.
                async with self._locked():
                    if self._leadership is lead:
                        await self._restart_election(election, "fenced by a newer controller")
            resp.error_code = E.NOT_CONTROLLER
            active = self._controller_node()
            resp.error_message = f"controller {self.controller_id} is not the active controller" + (
                f"; the active one is {active.node_id} at {active.host}:{active.port}"
                if active.node_id >= 0
                else "; no active controller is known right now"
            )
        except MetadataUnavailableError as exc:
            resp.error_code = E.REQUEST_TIMED_OUT
            resp.error_message = f"etcd did not answer: {exc}"
        except StromError as exc:  # a whole-request problem raised by the body
            resp.error_code = exc.code if exc.code is not None else E.UNKNOWN_SERVER_ERROR
            resp.error_message = exc.message
        except Exception as exc:
            log.exception("%s failed", rpc)
            resp.error_code = E.UNKNOWN_SERVER_ERROR
            resp.error_message = f"{type(exc).__name__}: {exc}"
        resp.controller.CopyFrom(self._controller_node())
        ADMIN_REQUESTS.labels(rpc, error_name(self._result_code(resp))).inc()
        return response

    @staticmethod
    def _result_code(resp: Any) -> int:
        if resp.error_code != E.NONE:
            return int(resp.error_code)
        for field in ("topics", "results", "partitions"):
            for item in getattr(resp, field, ()):
                if getattr(item, "error_code", E.NONE) != E.NONE:
                    return int(item.error_code)
        return E.NONE

    def _txn(
        self,
        lead: _Leadership,
        compares: Iterable[tuple[str, int]],
        *,
        puts: Iterable[tuple[str, Message]] = (),
        deletes: Iterable[str] = (),
        delete_prefixes: Iterable[str] = (),
    ) -> bool:
        """A write fenced by our election key (blocking). False = a compare of ours failed.

        Raises:
            _Fenced: the election key is no longer the one we wrote.
        """
        assert self.store is not None
        store = self.store
        ok = store.txn(
            [(store.keys.controller, lead.mod_revision), *compares],
            puts=puts,
            deletes=deletes,
            delete_prefixes=delete_prefixes,
        )
        if ok:
            return True
        current = store.get(store.keys.controller, md.ControllerInfo)
        if current is None or current.mod_revision != lead.mod_revision:
            raise _Fenced()
        return False

    async def _await_view(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait until the view reflects a write we committed (read-your-writes)."""
        assert self.view is not None
        if not await asyncio.to_thread(self.view.wait_for, predicate, 10.0):
            log.warning("the cluster view did not show %s within 10s", what)

    def _topic_visible(self, name: str) -> md.TopicMetadata | None:
        """A topic as clients see it: absent while being deleted."""
        assert self.view is not None
        topic = self.view.topic(name)
        return None if topic is None or topic.deleting else topic

    def _leader_load(self) -> dict[int, int]:
        """How many partitions each node currently leads (for placement)."""
        assert self.view is not None
        counts: dict[int, int] = {}
        with self.view.lock:
            for (topic, p), v in self.view.partitions.items():
                meta = self.view.topics.get(topic)
                if meta is None or meta.value.deleting or p >= meta.value.partition_count:
                    continue
                if v.value.leader >= 0:
                    counts[v.value.leader] = counts.get(v.value.leader, 0) + 1
        return counts

    async def _nodes(self) -> dict[int, md.NodeRegistration]:
        """Registered nodes, read from etcd (a node that just registered counts)."""
        assert self.store is not None
        store = self.store
        _, items = await asyncio.to_thread(
            store.get_prefix, store.keys.nodes_prefix, md.NodeRegistration
        )
        return {v.value.node_id: v.value for v in items.values()}

    # -- topics ------------------------------------------------------------------------------

    async def CreateTopics(
        self, request: controller_pb2.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreateTopicsResponse:
        response = controller_pb2.CreateTopicsResponse()
        metadata = dict(context.invocation_metadata() or ())
        allow_internal = str(metadata.get(INTERNAL_TOPICS_METADATA_KEY, "")).lower() == "true"

        async def body(lead: _Leadership) -> None:
            await self._create_topics(lead, request, response, allow_internal)

        return await self._handle("CreateTopics", response, body, write=True)

    async def _create_topics(
        self,
        lead: _Leadership,
        request: controller_pb2.CreateTopicsRequest,
        response: controller_pb2.CreateTopicsResponse,
        allow_internal: bool,
    ) -> None:
        assert self.store is not None and self.view is not None
        store, view = self.store, self.view
        counts = _Counter(t.name for t in request.topics)
        nodes = await self._nodes()
        eligible = [
            PlacementNode(n.node_id, _rack(n))
            for n in nodes.values()
            if n.state != md.NODE_STATE_SHUTTING_DOWN
        ]
        load = self._leader_load()
        with view.lock:
            names = {n for n, v in view.topics.items() if not v.value.deleting}
        created: dict[str, str] = {}
        for item in request.topics:
            result = response.topics.add(name=item.name, num_partitions=-1, replication_factor=-1)
            try:
                if counts[item.name] > 1:
                    raise InvalidRequestError(
                        f"topic {item.name!r} is named {counts[item.name]} times in the request"
                    )
                plan = validate_new_topic(
                    item.name,
                    item.num_partitions,
                    item.replication_factor,
                    [(a.partition, list(a.replicas)) for a in item.assignments],
                    dict(item.configs),
                    live_nodes=nodes.keys(),
                    default_partitions=self.default_partitions,
                    default_replication_factor=self.default_replication_factor,
                    allow_internal=allow_internal,
                )
                existing = await asyncio.to_thread(
                    store.get, store.keys.topic(plan.name), md.TopicMetadata
                )
                self._check_absent(plan.name, existing)
                other = colliding_topic(plan.name, names)
                if other is not None:
                    raise InvalidTopicError(
                        f"topic {plan.name!r} collides with existing topic {other!r} "
                        "(names may not differ only by '.' versus '_')"
                    )
                replicas = plan.assignments or assign_replicas(
                    eligible,
                    plan.num_partitions,
                    plan.replication_factor,
                    start_index=sum(load.values()),
                    shift=len(names),
                    leader_load=load,
                )
                result.num_partitions = plan.num_partitions
                result.replication_factor = plan.replication_factor
                if request.validate_only:
                    continue
                meta = md.TopicMetadata(
                    topic_id=str(uuid.uuid4()),
                    name=plan.name,
                    partition_count=plan.num_partitions,
                    replication_factor=plan.replication_factor,
                    configs=plan.configs,
                    created_ms=_now_ms(),
                    internal=plan.internal,
                )
                states = [self._initial_state(r, meta.topic_id) for r in replicas]
                ok = await asyncio.to_thread(self._write_new_topic, lead, meta, states)
                if not ok:
                    existing = await asyncio.to_thread(
                        store.get, store.keys.topic(plan.name), md.TopicMetadata
                    )
                    self._check_absent(plan.name, existing)
                    raise RequestTimedOutError(f"topic {plan.name!r} could not be written")
                result.topic_id = meta.topic_id
                created[meta.name] = meta.topic_id
                names.add(meta.name)
                for r in replicas:
                    load[r[0]] = load.get(r[0], 0) + 1
                log.info(
                    "created topic %s (%d partitions, replication factor %d)",
                    meta.name,
                    meta.partition_count,
                    meta.replication_factor,
                    extra={"fields": {"topic": meta.name, "topic_id": meta.topic_id}},
                )
            except StromError as exc:
                result.error_code = exc.code or E.UNKNOWN_SERVER_ERROR
                result.error_message = exc.message
                result.num_partitions = -1
                result.replication_factor = -1
        if created:
            await self._await_view(
                lambda: all(
                    (v := view.topics.get(n)) is not None and v.value.topic_id == tid
                    for n, tid in created.items()
                ),
                f"topics {sorted(created)}",
            )

    @staticmethod
    def _check_absent(name: str, existing: Versioned | None) -> None:
        if existing is None:
            return
        if existing.value.deleting:
            raise TopicDeletionInProgressError(f"topic {name!r} is still being deleted")
        raise TopicAlreadyExistsError(f"topic {name!r} already exists")

    @staticmethod
    def _initial_state(replicas: list[int], topic_id: str) -> md.PartitionState:
        return md.PartitionState(
            replicas=replicas,
            leader=replicas[0],
            leader_epoch=0,
            isr=replicas,
            partition_epoch=0,
            leader_recovery_state=md.LEADER_RECOVERY_STATE_RECOVERED,
            topic_id=topic_id,
        )

    def _write_new_topic(
        self, lead: _Leadership, meta: md.TopicMetadata, states: list[md.PartitionState]
    ) -> bool:
        """Write a new topic and its partitions (blocking); False if the name is taken."""
        assert self.store is not None
        keys = self.store.keys
        topic_key = keys.topic(meta.name)
        absent = [(topic_key, 0)]
        # Partition keys left by an interrupted creation of the same name must not survive.
        # (etcd refuses a put and a delete of the same key in one transaction, hence apart.)
        if not self._txn(lead, absent, delete_prefixes=[keys.partitions_of(meta.name)]):
            return False
        puts = [(keys.partition(meta.name, p), s) for p, s in enumerate(states)]
        if len(puts) + 1 <= self.max_txn_ops:
            return self._txn(lead, absent, puts=[(topic_key, meta), *puts])
        for i in range(0, len(puts), self.max_txn_ops):
            if not self._txn(lead, absent, puts=puts[i : i + self.max_txn_ops]):
                return False
        return self._txn(lead, absent, puts=[(topic_key, meta)])

    async def DeleteTopics(
        self, request: controller_pb2.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteTopicsResponse:
        response = controller_pb2.DeleteTopicsResponse()

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            view = self.view
            deleted: list[str] = []
            for name in request.topics:
                result = response.topics.add(name=name)
                try:
                    topic_id = await asyncio.to_thread(self._delete_topic, lead, name)
                    result.topic_id = topic_id
                    deleted.append(name)
                    log.info(
                        "deleted topic %s",
                        name,
                        extra={"fields": {"topic": name, "topic_id": topic_id}},
                    )
                except StromError as exc:
                    result.error_code = exc.code or E.UNKNOWN_SERVER_ERROR
                    result.error_message = exc.message
            if deleted:
                await self._await_view(
                    lambda: not any(n in view.topics for n in deleted),
                    f"deletion of {deleted}",
                )

        return await self._handle("DeleteTopics", response, body, write=True)

    def _delete_topic(self, lead: _Leadership, name: str) -> str:
        """Remove a topic's key and all its partition keys in one transaction (blocking)."""
        assert self.store is not None
        keys = self.store.keys
        for _ in range(5):
            current = self.store.get(keys.topic(name), md.TopicMetadata)
            if current is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            if current.value.internal or is_internal_topic(name):
                raise PolicyViolationError(f"topic {name!r} is internal and cannot be deleted")
            if self._txn(
                lead,
                [(keys.topic(name), current.mod_revision)],
                deletes=[keys.topic(name)],
                delete_prefixes=[keys.partitions_of(name)],
            ):
                return str(current.value.topic_id)
        raise RequestTimedOutError(f"topic {name!r} kept changing while being deleted")

    async def CreatePartitions(
        self,
        request: controller_pb2.CreatePartitionsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.CreatePartitionsResponse:
        response = controller_pb2.CreatePartitionsResponse()

        async def body(lead: _Leadership) -> None:
            await self._create_partitions(lead, request, response)

        return await self._handle("CreatePartitions", response, body, write=True)

    async def _create_partitions(
        self,
        lead: _Leadership,
        request: controller_pb2.CreatePartitionsRequest,
        response: controller_pb2.CreatePartitionsResponse,
    ) -> None:
        assert self.store is not None and self.view is not None
        store, view = self.store, self.view
        counts = _Counter(t.name for t in request.topics)
        nodes = await self._nodes()
        eligible = [
            PlacementNode(n.node_id, _rack(n))
            for n in nodes.values()
            if n.state != md.NODE_STATE_SHUTTING_DOWN
        ]
        load = self._leader_load()
        grown: dict[str, int] = {}
        for item in request.topics:
            result = response.topics.add(name=item.name)
            try:
                if counts[item.name] > 1:
                    raise InvalidRequestError(f"topic {item.name!r} is named twice in the request")
                current = await asyncio.to_thread(
                    store.get, store.keys.topic(item.name), md.TopicMetadata
                )
                if current is None or current.value.deleting:
                    raise UnknownTopicOrPartitionError(f"topic {item.name!r} does not exist")
                meta: md.TopicMetadata = current.value
                validate_partition_increase(item.name, meta.partition_count, item.count)
                self._check_no_reassignment(item.name)
                new = item.count - meta.partition_count
                rf = meta.replication_factor
                if item.assignments:
                    replicas = validate_assignments(
                        [(a.partition, list(a.replicas)) for a in item.assignments],
                        first_partition=meta.partition_count,
                        count=new,
                        live_nodes=nodes.keys(),
                        replication_factor=rf,
                    )
                else:
                    replicas = assign_replicas(
                        eligible,
                        new,
                        rf,
                        start_index=sum(load.values()),
                        shift=meta.partition_count,
                        leader_load=load,
                    )
                if request.validate_only:
                    continue
                updated = md.TopicMetadata()
                updated.CopyFrom(meta)
                updated.partition_count = item.count
                states = [self._initial_state(r, meta.topic_id) for r in replicas]
                ok = await asyncio.to_thread(self._write_partitions, lead, current, updated, states)
                if not ok:
                    raise RequestTimedOutError(
                        f"topic {item.name!r} changed while adding partitions; retry"
                    )
                grown[item.name] = item.count
                for r in replicas:
                    load[r[0]] = load.get(r[0], 0) + 1
                log.info(
                    "topic %s grew from %d to %d partitions",
                    item.name,
                    meta.partition_count,
                    item.count,
                    extra={"fields": {"topic": item.name}},
                )
            except StromError as exc:
                result.error_code = exc.code or E.UNKNOWN_SERVER_ERROR
                result.error_message = exc.message
        if grown:
            await self._await_view(
                lambda: all(
                    (v := view.topics.get(n)) is not None and v.value.partition_count >= c
                    for n, c in grown.items()
                ),
                f"new partitions of {sorted(grown)}",
            )

    def _check_no_reassignment(self, name: str) -> None:
        assert self.view is not None
        for p, v in sorted(self.view.partitions_of(name).items()):
            if v.value.adding_replicas or v.value.removing_replicas:
                raise ReassignmentInProgressError(
                    f"partition {p} of topic {name!r} is being reassigned"
                )

    def _write_partitions(
        self,
        lead: _Leadership,
        current: Versioned,
        updated: md.TopicMetadata,
        states: list[md.PartitionState],
    ) -> bool:
        """Write new partition keys and the grown topic, CAS on the topic (blocking)."""
        assert self.store is not None
        keys = self.store.keys
        topic_key = keys.topic(updated.name)
        first = current.value.partition_count
        same = [(topic_key, current.mod_revision)]
        puts = [(keys.partition(updated.name, first + i), s) for i, s in enumerate(states)]
        if len(puts) + 1 <= self.max_txn_ops:
            return self._txn(lead, same, puts=[(topic_key, updated), *puts])
        for i in range(0, len(puts), self.max_txn_ops):
            if not self._txn(lead, same, puts=puts[i : i + self.max_txn_ops]):
                return False
        return self._txn(lead, same, puts=[(topic_key, updated)])

    # -- configs -----------------------------------------------------------------------------

    async def DescribeConfigs(
        self,
        request: controller_pb2.DescribeConfigsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.DescribeConfigsResponse:
        response = controller_pb2.DescribeConfigsResponse()

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            for res in request.resources:
                result = response.results.add(
                    resource_type=res.resource_type, resource_name=res.resource_name
                )
                try:
                    entries = self._describe_resource(res, request.include_documentation)
                    result.configs.extend(entries)
                except StromError as exc:
                    result.error_code = exc.code or E.UNKNOWN_SERVER_ERROR
                    result.error_message = exc.message

        return await self._handle("DescribeConfigs", response, body, write=False)

    def _describe_resource(
        self, res: controller_pb2.DescribeConfigsResource, include_documentation: bool
    ) -> list[controller_pb2.ConfigEntry]:
        assert self.view is not None
        if res.resource_type == controller_pb2.RESOURCE_TYPE_TOPIC:
            topic = self._topic_visible(res.resource_name)
            if topic is None:
                raise UnknownTopicOrPartitionError(f"topic {res.resource_name!r} does not exist")
            return describe_topic_configs(
                dict(topic.configs),
                list(res.config_names),
                include_documentation=include_documentation,
            )
        if res.resource_type == controller_pb2.RESOURCE_TYPE_NODE:
            if not res.resource_name.isdigit():
                raise InvalidRequestError(
                    f"node resource name must be a node id in decimal, not {res.resource_name!r}"
                )
            node = self.view.live_nodes().get(int(res.resource_name))
            if node is None:
                raise BrokerNotAvailableError(f"node {res.resource_name} is not registered")
            return self._node_configs(node, list(res.config_names), include_documentation)
        raise InvalidRequestError(
            f"resource type {res.resource_type} is not supported (use TOPIC or NODE)"
        )

    @staticmethod
    def _node_configs(
        node: md.NodeRegistration, names: list[str], include_documentation: bool
    ) -> list[controller_pb2.ConfigEntry]:
        """What the controller knows of a node's static config: its registration."""
        values: dict[str, tuple[str | None, str]] = {
            "advertised.host": (node.host, "host clients and other nodes connect to"),
            "metrics.port": (str(node.metrics_port), "Prometheus /metrics HTTP port"),
            "node.id": (str(node.node_id), "the node's id, stable across restarts"),
            "port": (str(node.port), "gRPC port of the storage service"),
            "rack": (_rack(node), "rack or availability zone, for rack-aware placement"),
            "software.version": (node.software_version, "strom version the node runs"),
        }
        out = []
        for name in sorted(values):
            if names and name not in names:
                continue
            value, doc = values[name]
            entry = controller_pb2.ConfigEntry(
                name=name, source=controller_pb2.CONFIG_SOURCE_STATIC_NODE_CONFIG, read_only=True
            )
            if value is not None:
                entry.value = value
            if include_documentation:
                entry.documentation = doc
            out.append(entry)
        return out

    async def AlterConfigs(
        self, request: controller_pb2.AlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.AlterConfigsResponse:
        response = controller_pb2.AlterConfigsResponse()

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            view = self.view
            changed: dict[str, dict[str, str]] = {}
            for res in request.resources:
                result = response.results.add(
                    resource_type=res.resource_type, resource_name=res.resource_name
                )
                try:
                    new = await asyncio.to_thread(
                        self._alter_topic_configs, lead, res, request.validate_only
                    )
                    if new is not None:
                        changed[res.resource_name] = new
                except StromError as exc:
                    result.error_code = exc.code or E.UNKNOWN_SERVER_ERROR
                    result.error_message = exc.message
            if changed:
                await self._await_view(
                    lambda: all(
                        (v := view.topics.get(n)) is not None and dict(v.value.configs) == c
                        for n, c in changed.items()
                    ),
                    f"new configs of {sorted(changed)}",
                )

        return await self._handle("AlterConfigs", response, body, write=True)

    def _alter_topic_configs(
        self, lead: _Leadership, res: controller_pb2.AlterConfigsResource, validate_only: bool
    ) -> dict[str, str] | None:
        """Apply one resource's changes with CAS (blocking); the new overrides, or None."""
        assert self.store is not None
        if res.resource_type == controller_pb2.RESOURCE_TYPE_NODE:
            raise InvalidRequestError("node configs are static and cannot be altered")
        if res.resource_type != controller_pb2.RESOURCE_TYPE_TOPIC:
            raise InvalidRequestError(
                f"resource type {res.resource_type} cannot be altered (use TOPIC)"
            )
        key = self.store.keys.topic(res.resource_name)
        ops = [(c.name, c.op, c.value if c.HasField("value") else None) for c in res.configs]
        for _ in range(5):
            current = self.store.get(key, md.TopicMetadata)
            if current is None or current.value.deleting:
                raise UnknownTopicOrPartitionError(f"topic {res.resource_name!r} does not exist")
            new = apply_config_ops(dict(current.value.configs), ops)
            if validate_only:
                return None
            updated = md.TopicMetadata()
            updated.CopyFrom(current.value)
            updated.ClearField("configs")
            updated.configs.update(new)
            if self._txn(lead, [(key, current.mod_revision)], puts=[(key, updated)]):
                log.info(
                    "altered configs of topic %s",
                    res.resource_name,
                    extra={"fields": {"topic": res.resource_name, "configs": new}},
                )
                return new
        raise RequestTimedOutError(f"topic {res.resource_name!r} kept changing; retry")

    # -- cluster and topic descriptions ------------------------------------------------------

    async def DescribeCluster(
        self,
        request: controller_pb2.DescribeClusterRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.DescribeClusterResponse:
        response = controller_pb2.DescribeClusterResponse(controller_epoch=-1)

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            view = self.view
            with view.lock:
                response.cluster_id = view.cluster.cluster_id if view.cluster else ""
                response.nodes.extend(v.value for _, v in sorted(view.nodes.items()))
                if request.include_coordinators:
                    response.coordinator_shards.extend(
                        v.value for _, v in sorted(view.coordinators.items())
                    )
                    response.transaction_shards.extend(
                        v.value for _, v in sorted(view.txn_coordinators.items())
                    )
            response.controller_epoch = lead.epoch

        return await self._handle("DescribeCluster", response, body, write=False)

    async def ListTopics(
        self, request: controller_pb2.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ListTopicsResponse:
        response = controller_pb2.ListTopicsResponse()

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            with self.view.lock:
                topics = [v.value for _, v in sorted(self.view.topics.items())]
            for t in topics:
                internal = t.internal or is_internal_topic(t.name)
                if t.deleting or (internal and not request.include_internal):
                    continue
                response.topics.add(
                    name=t.name,
                    topic_id=t.topic_id,
                    partition_count=t.partition_count,
                    internal=internal,
                )

        return await self._handle("ListTopics", response, body, write=False)

    async def DescribeTopics(
        self, request: controller_pb2.DescribeTopicsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DescribeTopicsResponse:
        response = controller_pb2.DescribeTopicsResponse()

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            view = self.view
            with view.lock:
                names = list(request.topics) or sorted(
                    n for n, v in view.topics.items() if not v.value.deleting
                )
                live = set(view.nodes)
                for name in names:
                    desc = response.topics.add(name=name)
                    topic = view.topics.get(name)
                    if topic is None or topic.value.deleting:
                        desc.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                        desc.error_message = f"topic {name!r} does not exist"
                        continue
                    meta = topic.value
                    desc.metadata.CopyFrom(meta)
                    for p in range(meta.partition_count):
                        v = view.partitions.get((name, p))
                        part = desc.partitions.add(partition=p)
                        if v is None:
                            continue  # not written yet (or lost): an empty state says so
                        part.state.CopyFrom(v.value)
                        part.offline_replicas.extend(r for r in v.value.replicas if r not in live)

        return await self._handle("DescribeTopics", response, body, write=False)

    # -- partition state ---------------------------------------------------------------------

    async def AlterPartition(
        self, request: controller_pb2.AlterPartitionRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.AlterPartitionResponse:
        response = controller_pb2.AlterPartitionResponse()

        async def body(lead: _Leadership) -> None:
            nodes = await self._nodes()
            for node_id, incarnation in self._shutting_down.items():
                reg = nodes.get(node_id)
                if reg is not None and reg.incarnation_id == incarnation:
                    reg.state = md.NODE_STATE_SHUTTING_DOWN  # ControlledShutdown came first
            me = nodes.get(request.leader_id)
            if me is None or me.incarnation_id != request.leader_incarnation:
                response.error_code = E.STALE_NODE_INCARNATION
                response.error_message = (
                    f"node {request.leader_id} is not registered"
                    if me is None
                    else f"incarnation {request.leader_incarnation!r} of node "
                    f"{request.leader_id} is not the registered one"
                )
                return
            committed: dict[tuple[str, int], int] = {}
            for item in request.partitions:
                result = response.partitions.add(topic=item.topic, partition=item.partition)
                state = await asyncio.to_thread(
                    self._alter_partition, lead, request.leader_id, item, nodes, result
                )
                if state is not None:
                    committed[(item.topic, item.partition)] = state.partition_epoch
            if committed:
                assert self.view is not None
                view = self.view
                await self._await_view(
                    lambda: all(
                        (v := view.partitions.get(tp)) is not None and v.value.partition_epoch >= e
                        for tp, e in committed.items()
                    ),
                    "committed partition states",
                )

        return await self._handle("AlterPartition", response, body, write=True)

    def _alter_partition(
        self,
        lead: _Leadership,
        leader_id: int,
        item: controller_pb2.AlterPartitionItem,
        nodes: dict[int, md.NodeRegistration],
        result: controller_pb2.AlterPartitionResult,
    ) -> md.PartitionState | None:
        """Validate one ISR proposal and commit it with CAS (blocking, DESIGN §6).

        Returns the committed state when a write happened, else None (``result`` says why).
        """
        assert self.store is not None
        keys = self.store.keys
        topic = self.store.get(keys.topic(item.topic), md.TopicMetadata)
        current = self.store.get(keys.partition(item.topic, item.partition), md.PartitionState)
        if (
            topic is None
            or topic.value.deleting
            or item.partition < 0
            or item.partition >= topic.value.partition_count
            or current is None
        ):
            result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
            result.error_message = f"partition {item.topic}-{item.partition} does not exist"
            return None
        if item.topic_id and item.topic_id != topic.value.topic_id:
            result.error_code = E.INCONSISTENT_TOPIC_ID
            result.error_message = (
                f"topic {item.topic!r} now has id {topic.value.topic_id}, not {item.topic_id}"
            )
            return None
        st: md.PartitionState = current.value
        problem = self._check_proposal(leader_id, item, st, nodes)
        if problem is not None:
            code, message = problem
            result.error_code = code
            result.error_message = message
            if code != E.INVALID_REQUEST:
                result.state.CopyFrom(st)
            return None
        order = {r: i for i, r in enumerate(st.replicas)}
        new = md.PartitionState()
        new.CopyFrom(st)
        new.ClearField("isr")
        new.isr.extend(sorted(set(item.new_isr), key=order.__getitem__))
        new.leader_recovery_state = item.leader_recovery_state
        if list(new.isr) == list(st.isr) and new.leader_recovery_state == st.leader_recovery_state:
            result.state.CopyFrom(st)  # nothing changes: already committed
            return None
        new.partition_epoch = st.partition_epoch + 1
        key = keys.partition(item.topic, item.partition)
        if not self._txn(lead, [(key, current.mod_revision)], puts=[(key, new)]):
            latest = self.store.get(key, md.PartitionState)
            result.error_code = E.INVALID_PARTITION_EPOCH
            result.error_message = "the partition state changed while committing; resync"
            if latest is not None:
                result.state.CopyFrom(latest.value)
            return None
        result.state.CopyFrom(new)
        log.info(
            "partition %s-%d ISR %s -> %s (partition epoch %d)",
            item.topic,
            item.partition,
            list(st.isr),
            list(new.isr),
            new.partition_epoch,
        )
        return new

    @staticmethod
    def _check_proposal(
        leader_id: int,
        item: controller_pb2.AlterPartitionItem,
        st: md.PartitionState,
        nodes: dict[int, md.NodeRegistration],
    ) -> tuple[int, str] | None:
        """The error (code, message) an AlterPartition proposal earns, or None if valid."""
        if st.leader != leader_id or item.leader_epoch != st.leader_epoch:
            return (
                E.FENCED_LEADER_EPOCH,
                f"node {leader_id} in leader epoch {item.leader_epoch} is not the leader; "
                f"node {st.leader} leads in epoch {st.leader_epoch}",
            )
        if item.partition_epoch != st.partition_epoch:
            return (
                E.INVALID_PARTITION_EPOCH,
                f"partition epoch {item.partition_epoch} is not the committed {st.partition_epoch}",
            )
        isr = list(item.new_isr)
        if len(set(isr)) != len(isr) or not set(isr) <= set(st.replicas):
            return (
                E.INVALID_REQUEST,
                f"proposed ISR {isr} must be distinct replicas of {list(st.replicas)}",
            )
        if leader_id not in isr:
            return E.INVALID_REQUEST, f"proposed ISR {isr} does not contain the leader {leader_id}"
        recovering = md.LEADER_RECOVERY_STATE_RECOVERING
        if st.leader_recovery_state != recovering and item.leader_recovery_state == recovering:
            return E.INVALID_REQUEST, "a RECOVERED partition cannot go back to RECOVERING"
        if item.leader_recovery_state == recovering and len(isr) > 1:
            return (
                E.INVALID_REQUEST,
                "a RECOVERING leader cannot add followers to the ISR before it has recovered",
            )
        for node_id in sorted(set(isr) - set(st.isr)):
            node = nodes.get(node_id)
            if node is None or node.state != md.NODE_STATE_RUNNING:
                state = "not registered" if node is None else md.NodeState.Name(node.state)
                return (
                    E.INELIGIBLE_REPLICA,
                    f"replica {node_id} cannot join the ISR: it is {state}",
                )
        return None

    # -- producer ids ------------------------------------------------------------------------

    async def AllocateProducerIds(
        self,
        request: controller_pb2.AllocateProducerIdsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.AllocateProducerIdsResponse:
        response = controller_pb2.AllocateProducerIdsResponse(first_producer_id=-1, count=0)

        async def body(lead: _Leadership) -> None:
            nodes = await self._nodes()
            node = nodes.get(request.node_id)
            if node is None or node.incarnation_id != request.incarnation_id:
                response.error_code = E.STALE_NODE_INCARNATION
                response.error_message = (
                    f"node {request.node_id} is not registered"
                    if node is None
                    else f"incarnation {request.incarnation_id!r} of node {request.node_id} "
                    "is not the registered one"
                )
                return
            first = await asyncio.to_thread(self._allocate_producer_ids, lead, request.node_id)
            response.first_producer_id = first
            response.count = self.producer_id_block_size

        return await self._handle("AllocateProducerIds", response, body, write=True)

    def _allocate_producer_ids(self, lead: _Leadership, node_id: int) -> int:
        """Advance the cluster-wide counter by one block with CAS (blocking); its first id."""
        assert self.store is not None
        key = self.store.keys.producer_ids
        size = self.producer_id_block_size
        for _ in range(20):
            current = self.store.get(key, md.ProducerIdBlock)
            first = int(current.value.next_producer_id) if current else 0
            block = md.ProducerIdBlock(
                next_producer_id=first + size,
                block_size=size,
                last_assigned_to=node_id,
                updated_ms=_now_ms(),
            )
            if self._txn(
                lead, [(key, current.mod_revision if current else 0)], puts=[(key, block)]
            ):
                log.info("producer ids %d..%d to node %d", first, first + size - 1, node_id)
                return first
        raise RequestTimedOutError("the producer id counter kept changing; retry")

    # -- leadership: reconciliation, elections, controlled shutdown, reassignment ------------

    def _reconcile_wanted_now(self, gone_at: float | None = None) -> None:
        if gone_at is not None and self._node_gone_at is None:
            self._node_gone_at = gone_at
        if self._reconcile_wanted is not None:
            self._reconcile_wanted.set()

    async def _reconcile_loop(self, lead: _Leadership) -> None:
        """While ``lead`` is ours: one reconciliation pass per wake-up (coalesced), no sleeps."""
        wanted = self._reconcile_wanted
        assert wanted is not None
        while self._leadership is lead and not self._stopping:
            await wanted.wait()
            if self._leadership is not lead:
                return  # leave the wake-up to the loop of a later leadership
            wanted.clear()
            gone_at, self._node_gone_at = self._node_gone_at, None
            try:
                async with self._locked():
                    if self._leadership is not lead:
                        self._reconcile_wanted_now(gone_at)
                        return
                    changed = await asyncio.to_thread(self._reconcile_sync, lead)
                if gone_at is not None:
                    elapsed = time.monotonic() - gone_at
                    FAILOVER_SECONDS.observe(elapsed)
                    if changed:
                        log.info(
                            "failover: %d partition states committed %.3fs after a node left",
                            changed,
                            elapsed,
                        )
            except _Fenced:
                election = self._election
                if election is not None:
                    async with self._locked():
                        if self._leadership is lead:
                            await self._restart_election(election, "fenced while reconciling")
                return
            except MetadataUnavailableError as exc:
                log.warning("reconciliation failed, retrying on the next change: %s", exc)
                self._reconcile_wanted_now(gone_at)
                await asyncio.sleep(0.2)  # etcd unreachable: do not spin
            except Exception:
                log.exception("reconciliation failed")

    def _liveness(
        self, exclude: Iterable[int] = ()
    ) -> tuple[dict[int, md.NodeRegistration], set[int], set[int]]:
        """(registered nodes, alive ids, eligible ids) from etcd (blocking)."""
        assert self.store is not None
        _, items = self.store.get_prefix(self.store.keys.nodes_prefix, md.NodeRegistration)
        nodes = {v.value.node_id: v.value for v in items.values()}
        alive = set(nodes)
        stopping = {
            n
            for n, inc in self._shutting_down.items()
            if n in nodes and nodes[n].incarnation_id == inc
        }
        eligible = {
            n
            for n, reg in nodes.items()
            if reg.state == md.NODE_STATE_RUNNING and n not in stopping
        } - set(exclude)
        return nodes, alive, eligible

    def _partitions_sync(
        self, wanted: set[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], tuple[str, Versioned, md.TopicMetadata]]:
        """Live partitions from etcd: (topic, p) -> (key, versioned state, topic) (blocking)."""
        assert self.store is not None
        store, keys = self.store, self.store.keys
        _, topics = store.get_prefix(keys.topics_prefix, md.TopicMetadata)
        by_name = {v.value.name: v.value for v in topics.values()}
        _, parts = store.get_prefix_cached(
            keys.partitions_prefix, md.PartitionState, self._state_cache
        )
        out: dict[tuple[str, int], tuple[str, Versioned, md.TopicMetadata]] = {}
        for key, v in parts.items():
            tp = keys.parse_partition(key)
            if tp is None or (wanted is not None and tp not in wanted):
                continue
            topic = by_name.get(tp[0])
            if (
                topic is None
                or topic.deleting
                or tp[1] >= topic.partition_count
                or (v.value.topic_id and v.value.topic_id != topic.topic_id)
            ):
                continue
            out[tp] = (key, v, topic)
        return out

    @staticmethod
    def _unclean(topic: md.TopicMetadata) -> bool:
        return _effective(dict(topic.configs), "unclean.leader.election.enable").lower() == "true"

    def _commit_decisions(
        self, lead: _Leadership, decisions: list[tuple[str, int, leadership.Decision]]
    ) -> tuple[int, bool]:
        """Write decisions in batches with CAS (blocking): (states written, any conflict)."""
        batch = max(1, min(RECONCILE_BATCH, self.max_txn_ops - 1))
        written, conflict = 0, False
        for i in range(0, len(decisions), batch):
            chunk = decisions[i : i + batch]
            if self._txn(
                lead,
                [(key, rev) for key, rev, _ in chunk],
                puts=[(key, d.state) for key, _, d in chunk],
            ):
                written += len(chunk)
                changes = []
                for key, _, d in chunk:
                    if d.election is not None:
                        LEADER_ELECTIONS.labels(d.election).inc()
                    st = d.state
                    changes.append(
                        f"{key.rsplit('/', 2)[-2]}-{key.rsplit('/', 1)[-1]}: leader {st.leader} "
                        f"(epoch {st.leader_epoch}), isr {list(st.isr)}, replicas "
                        f"{list(st.replicas)} ({d.election or 'isr change'})"
                    )
                # One record per transaction: at 1,000 partitions a record per partition was
                # most of a failover's controller time.
                log.info("%d partition states committed: %s", len(chunk), "; ".join(changes))
            else:
                conflict = True
        return written, conflict

    def _reconcile_sync(self, lead: _Leadership, exclude: Iterable[int] = ()) -> int:
        """Bring every partition in line with node liveness (blocking); states written."""
        total = 0
        for _ in range(20):
            _, alive, eligible = self._liveness(exclude)
            decisions = []
            for key, v, topic in self._partitions_sync().values():
                d = leadership.reconcile(
                    v.value,
                    alive,
                    eligible,
                    unclean=self._unclean(topic),
                    auto_preferred=self.auto_leader_rebalance,
                )
                if d is not None:
                    decisions.append((key, v.mod_revision, d))
            written, conflict = self._commit_decisions(lead, decisions)
            total += written
            if not conflict:
                return total
        raise RequestTimedOutError("partition states kept changing during reconciliation")

    async def _after_write(self, committed: dict[tuple[str, int], int]) -> None:
        if not committed:
            return
        assert self.view is not None
        view = self.view
        await self._await_view(
            lambda: all(
                (v := view.partitions.get(tp)) is not None and v.value.partition_epoch >= e
                for tp, e in committed.items()
            ),
            "committed partition states",
        )

    async def ElectLeaders(
        self, request: controller_pb2.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ElectLeadersResponse:
        response = controller_pb2.ElectLeadersResponse()
        unclean = request.election_type == controller_pb2.ELECTION_TYPE_UNCLEAN

        async def body(lead: _Leadership) -> None:
            committed = await asyncio.to_thread(self._elect_sync, lead, request, unclean, response)
            await self._after_write(committed)

        return await self._handle("ElectLeaders", response, body, write=True)

    def _elect_sync(
        self,
        lead: _Leadership,
        request: controller_pb2.ElectLeadersRequest,
        unclean: bool,
        response: controller_pb2.ElectLeadersResponse,
    ) -> dict[tuple[str, int], int]:
        committed: dict[tuple[str, int], int] = {}
        wanted = [(tp.topic, tp.partition) for tp in request.partitions]
        for _ in range(20):
            del response.partitions[:]
            _, alive, eligible = self._liveness()
            parts = self._partitions_sync()
            decisions = []
            for tp in wanted or sorted(parts):
                result = response.partitions.add(
                    topic=tp[0], partition=tp[1], leader=-1, leader_epoch=-1
                )
                found = parts.get(tp)
                if found is None:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    result.error_message = f"partition {tp[0]}-{tp[1]} does not exist"
                    continue
                key, v, _ = found
                if unclean:
                    d, code = leadership.unclean_election(v.value, alive, eligible)
                else:
                    d, code = leadership.preferred(v.value, eligible)
                state = d.state if d is not None else v.value
                result.leader, result.leader_epoch = state.leader, state.leader_epoch
                if code != E.NONE:
                    result.error_code = code
                    result.error_message = error_name(code)
                if d is not None:
                    decisions.append((key, v.mod_revision, d))
                    committed[tp] = d.state.partition_epoch
            _, conflict = self._commit_decisions(lead, decisions)
            if not conflict:
                return committed
            committed.clear()
        raise RequestTimedOutError("partition states kept changing; retry")

    async def ControlledShutdown(
        self, request: controller_pb2.ControlledShutdownRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ControlledShutdownResponse:
        response = controller_pb2.ControlledShutdownResponse()

        async def body(lead: _Leadership) -> None:
            nodes = await self._nodes()
            node = nodes.get(request.node_id)
            if node is None:
                response.error_code = E.BROKER_NOT_AVAILABLE
                response.error_message = f"node {request.node_id} is not registered"
                return
            if node.incarnation_id != request.incarnation_id:
                response.error_code = E.STALE_NODE_INCARNATION
                response.error_message = (
                    f"incarnation {request.incarnation_id!r} of node {request.node_id} "
                    "is not the registered one"
                )
                return
            # A STARTING node asks to have its previous life fenced (storage/node.py): it is
            # not eligible while STARTING anyway, and must become so once RUNNING.
            if node.state != md.NODE_STATE_STARTING:
                self._shutting_down[request.node_id] = request.incarnation_id
            await asyncio.to_thread(self._reconcile_sync, lead)
            parts = await asyncio.to_thread(self._partitions_sync)
            for (topic, p), (_, v, _) in sorted(parts.items()):
                if v.value.leader == request.node_id:
                    response.remaining_partitions.add(topic=topic, partition=p)
            if self.view is not None:
                view = self.view
                epochs = {tp: v.value.partition_epoch for tp, (_, v, _) in parts.items()}
                await self._await_view(
                    lambda: all(
                        (x := view.partitions.get(tp)) is not None and x.value.partition_epoch >= e
                        for tp, e in epochs.items()
                    ),
                    "controlled shutdown states",
                )

        return await self._handle("ControlledShutdown", response, body, write=True)

    async def AlterPartitionReassignments(
        self,
        request: controller_pb2.AlterPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.AlterPartitionReassignmentsResponse:
        response = controller_pb2.AlterPartitionReassignmentsResponse()

        async def body(lead: _Leadership) -> None:
            committed = await asyncio.to_thread(self._reassign_sync, lead, request, response)
            await self._after_write(committed)

        return await self._handle("AlterPartitionReassignments", response, body, write=True)

    def _reassign_sync(
        self,
        lead: _Leadership,
        request: controller_pb2.AlterPartitionReassignmentsRequest,
        response: controller_pb2.AlterPartitionReassignmentsResponse,
    ) -> dict[tuple[str, int], int]:
        counts = _Counter((r.topic, r.partition) for r in request.partitions)
        committed: dict[tuple[str, int], int] = {}
        for _ in range(20):
            del response.partitions[:]
            nodes, _, eligible = self._liveness()
            parts = self._partitions_sync()
            decisions = []
            for item in request.partitions:
                tp = (item.topic, item.partition)
                result = response.partitions.add(topic=item.topic, partition=item.partition)
                found = parts.get(tp)
                if found is None:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    result.error_message = f"partition {tp[0]}-{tp[1]} does not exist"
                    continue
                if counts[tp] > 1:
                    result.error_code = E.INVALID_REQUEST
                    result.error_message = f"partition {tp[0]}-{tp[1]} is named more than once"
                    continue
                key, v, _ = found
                if item.cancel:
                    d, code = leadership.cancel_reassignment(v.value, eligible)
                    if code != E.NONE:
                        result.error_code = code
                        result.error_message = f"no reassignment of {tp[0]}-{tp[1]} is in progress"
                else:
                    target = list(item.replicas)
                    problem = None
                    if not target:
                        problem = "the target replica set is empty (replication factor >= 1)"
                    elif len(set(target)) != len(target):
                        problem = f"target replicas {target} contain duplicates"
                    elif missing := sorted(set(target) - set(nodes)):
                        problem = f"target replicas {missing} are not registered nodes"
                    if problem is not None:
                        result.error_code = E.INVALID_REPLICA_ASSIGNMENT
                        result.error_message = problem
                        continue
                    d = leadership.start_reassignment(v.value, target, eligible)
                if d is not None:
                    decisions.append((key, v.mod_revision, d))
                    committed[tp] = d.state.partition_epoch
            _, conflict = self._commit_decisions(lead, decisions)
            if not conflict:
                return committed
            committed.clear()
        raise RequestTimedOutError("partition states kept changing; retry")

    async def ListPartitionReassignments(
        self,
        request: controller_pb2.ListPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.ListPartitionReassignmentsResponse:
        response = controller_pb2.ListPartitionReassignmentsResponse()

        async def body(lead: _Leadership) -> None:
            assert self.view is not None
            view = self.view
            wanted = {(tp.topic, tp.partition) for tp in request.partitions}
            with view.lock:
                for (name, p), v in sorted(view.partitions.items()):
                    topic = view.topics.get(name)
                    if topic is None or topic.value.deleting or p >= topic.value.partition_count:
                        continue
                    if wanted and (name, p) not in wanted:
                        continue
                    st = v.value
                    if st.adding_replicas or st.removing_replicas:
                        response.reassignments.add(
                            topic=name,
                            partition=p,
                            replicas=st.replicas,
                            adding_replicas=st.adding_replicas,
                            removing_replicas=st.removing_replicas,
                        )

        return await self._handle("ListPartitionReassignments", response, body, write=False)

    # -- housekeeping when becoming active ---------------------------------------------------

    def _cleanup_sync(self, lead: _Leadership) -> None:
        """Finish what a previous controller left half-done (blocking).

        Topics marked ``deleting`` lose their keys; partition keys that belong to no topic
        (an interrupted multi-transaction creation or growth) are deleted.
        """
        assert self.store is not None
        store, keys = self.store, self.store.keys
        _, topics = store.get_prefix(keys.topics_prefix, md.TopicMetadata)
        by_name = {v.value.name or k[len(keys.topics_prefix) :]: v for k, v in topics.items()}
        for name, v in by_name.items():
            if v.value.deleting:
                self._txn(
                    lead,
                    [(keys.topic(name), v.mod_revision)],
                    deletes=[keys.topic(name)],
                    delete_prefixes=[keys.partitions_of(name)],
                )
                log.info("finished deleting topic %s", name)
        _, parts = store.get_prefix_raw(keys.partitions_prefix)
        orphans: list[str] = []
        for ev in parts:
            tp = keys.parse_partition(ev.key)
            if tp is None or ev.value is None:
                continue
            topic = by_name.get(tp[0])
            try:
                state = decode(ev.value, md.PartitionState)
            except Exception:
                continue
            if (
                topic is None
                or topic.value.deleting
                or tp[1] >= topic.value.partition_count
                or (state.topic_id and state.topic_id != topic.value.topic_id)
            ):
                orphans.append(ev.key)
        for i in range(0, len(orphans), self.max_txn_ops):
            self._txn(lead, [], deletes=orphans[i : i + self.max_txn_ops])
        if orphans:
            log.info("deleted %d orphaned partition keys", len(orphans))


# RPC latency by result for every RPC (strom_controller_request_latency_seconds).
timed_rpcs(ControllerService, metrics.REQUEST_LATENCY, metrics.RPCS)
