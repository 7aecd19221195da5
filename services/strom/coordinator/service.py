"""The group-coordinator service: shard ownership in etcd, durable group state in
``__consumer_offsets``, and the CoordinatorService RPCs (DESIGN §2, §3, §7).

Shards. Group ``g`` lives in shard ``shard_for_group(g, S)``, partition ``s`` of the compacted
internal topic ``__consumer_offsets`` (the first coordinator creates it through the controller,
``cleanup.policy=compact``, replication factor min(3, live nodes)). A coordinator owns a shard
while its lease-bound key ``coordinators/<s>`` exists; it takes free shards by creating the key
(create-if-absent), so any number of coordinators can run and a dead one's shards are taken by
the others once its lease expires. All shard keys of one process share one lease: revoking it
on shutdown hands every shard over at once.

Loading (why it is safe to take over a shard a deposed owner may still write to): the new owner
replays the partition from its start (:class:`ShardState`, latest record per key wins), then
asks InitProducerId to bump the epoch of the producer id found there, and appends a *fence*
batch with that epoch (acks=all). From then on the leader refuses the previous owner's writes
(INVALID_PRODUCER_EPOCH). Whatever the previous owner appended before the fence is replayed
too; then the owner checks its etcd key is still its own, publishes the epoch in it and only
then serves. Until then requests are answered COORDINATOR_LOAD_IN_PROGRESS; requests for shards
owned elsewhere NOT_COORDINATOR.

Writes. Every change the engines return (:class:`ConsumerGroup` ``records``) is appended as one
batch, acks=all, with the owner's producer id, epoch and the next sequence, *before* the RPC is
answered; operations of one shard are serialised by a lock, so sequences are consecutive. A
write that cannot be completed (fenced, leader gone for too long) leaves the in-memory state
possibly ahead of the log, so the shard is reloaded from the log (which also re-fences), and
the caller gets a retriable error.

Timers. A loop expires members that missed the session timeout (or did not revoke in time)
using the engine's ``next_deadline_ms``/``expire``, persisting the removals like any change,
and refreshes the lag gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter, Gauge

from strom.api import (
    controller_pb2,
    controller_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from strom.api import metadata_pb2 as md
from strom.clock import wall_ms
from strom.coordinator import metrics
from strom.coordinator.group import ConsumerGroup, GroupConfig, GroupState
from strom.coordinator.lookup import find_coordinator, shard_count
from strom.coordinator.offsets_log import (
    CONSUMER_OFFSETS_TOPIC,
    GroupRecord,
    OffsetAndMetadata,
    ShardState,
    encode_group_batch,
    shard_for_group,
)
from strom.coordinator.replay import ReplayState
from strom.coordinator.shards import Shard, ShardKind
from strom.coordinator.txn_service import TransactionRpcs
from strom.coordinator.txn_state import MAX_TIMEOUT_MS, TRANSACTION_STATE_TOPIC, TxnShardState
from strom.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    ErrorCode,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    NotCoordinatorError,
    RequestTimedOutError,
    StromError,
    UnknownServerError,
    error_name,
)
from strom.metadata import (
    ClusterView,
    KeepAlive,
    Keys,
    MetadataStore,
    MetadataUnavailableError,
    WatchEvent,
)
from strom.security import default_channel
from strom.service.runtime import GRPC_OPTIONS

log = logging.getLogger("strom.coordinator")
E = ErrorCode
T = TypeVar("T")

#: Key of the fence record a new owner appends: a ``GroupRecordKey`` whose only field is the
#: unknown field 15 (empty), so replay skips it as "a kind this version does not know", and
#: compaction keeps just the latest one. (A documented oneof kind would be nicer: see the
#: issue note.)
FENCE_KEY = b"\x7a\x00"
#: Metadata key that lets CreateTopics create an internal (``__``) topic (controller/service.py).
INTERNAL_TOPICS_METADATA_KEY = "strom-internal-topics"
#: How long a write keeps retrying leader moves before the shard is reloaded.
WRITE_RETRY_S = 10.0
#: How often lag gauges are refreshed, by default.
LAG_INTERVAL_S = 10.0

RPC_ERRORS = Counter(
    "strom_coordinator_request_errors_total",
    "Coordinator RPC answers with a group-level error, by RPC and error",
    ["rpc", "error"],
)
SHARDS_OWNED = Gauge("strom_coordinator_shards_owned", "Shards this coordinator owns (loaded)")
SHARD_LOADS = Counter("strom_coordinator_shard_loads_total", "Shard (re)loads completed")
MEMBERS = Gauge("strom_coordinator_members", "Members of the groups in the loaded shards")
EXPIRED = Counter(
    "strom_coordinator_members_expired_total", "Members removed by a timer, by reason", ["reason"]
)
WRITES = Counter("strom_coordinator_writes_total", "Batches appended to __consumer_offsets")
SUPERSEDED_COMMITS = Counter(
    "strom_coordinator_superseded_commits_total",
    "Partition offsets an OffsetCommit left alone because a newer commit of the same committer "
    "had already set them (a delayed or late-retried request)",
)
LAG = Gauge(
    "strom_coordinator_consumer_lag",
    "High watermark minus committed offset, per group and partition",
    ["group", "topic", "partition"],
)


class CoordinatorStartupError(RuntimeError):
    """The coordinator cannot start (etcd unreachable, bad settings)."""


class _ShardLost(Exception):
    """The shard is no longer this process's (fenced, key gone): stop using it."""


def _now_ms() -> int:
    return wall_ms()


def _client_host(peer: str | None) -> str:
    """``ipv4:127.0.0.1:5555`` / ``ipv6:[::1]:5555`` → the host part."""
    if not peer:
        return ""
    _, _, rest = peer.partition(":")
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or rest


def _assignment_pb(parts: Mapping[str, Iterable[int]]) -> coordinator_pb2.Assignment:
    a = coordinator_pb2.Assignment()
    for t in sorted(parts):
        ps = sorted(parts[t])
        if ps:
            a.topic_partitions.add(topic=t, partitions=ps)
    return a


class CoordinatorService(TransactionRpcs, coordinator_pb2_grpc.CoordinatorServiceServicer):
    """A group- and transaction-coordinator process (see the module docstring and
    :mod:`strom.coordinator.txn_service`)."""

    name = "coordinator"

    def __init__(
        self,
        *,
        etcd: str,
        cluster: str,
        coordinator_id: int,
        advertise_host: str,
        advertise_port: int,
        metrics_port: int = 0,
        offsets_partitions: int = 8,
        offsets_replication_factor: int = 3,
        lease_ttl_s: int = 2,
        group_config: GroupConfig | None = None,
        connect_timeout_s: float = 10.0,
        lag_interval_s: float = LAG_INTERVAL_S,
        txn_partitions: int = 8,
        txn_max_timeout_ms: int = MAX_TIMEOUT_MS,
    ) -> None:
        self.etcd = etcd
        self.cluster = cluster
        self.coordinator_id = coordinator_id
        self.advertise_host = advertise_host
        self.advertise_port = advertise_port
        self.metrics_port = metrics_port
        self.offsets_partitions = offsets_partitions
        self.offsets_replication_factor = offsets_replication_factor
        self.lease_ttl_s = lease_ttl_s
        self.group_config = group_config or GroupConfig()
        self.connect_timeout_s = connect_timeout_s
        self.lag_interval_s = lag_interval_s
        self.txn_max_timeout_ms = txn_max_timeout_ms
        self.incarnation_id = str(uuid.uuid4())
        self.store: MetadataStore | None = None
        self.view: ClusterView | None = None
        self.group_kind = ShardKind(
            "group",
            CONSUMER_OFFSETS_TOPIC,
            offsets_partitions,
            offsets_replication_factor,
            Keys.coordinator,
            lambda view: view.coordinators,
            ShardState,
        )
        self.txn_kind = ShardKind(
            "transaction",
            TRANSACTION_STATE_TOPIC,
            txn_partitions,
            offsets_replication_factor,
            Keys.txn_coordinator,
            lambda view: view.txn_coordinators,
            TxnShardState,
        )
        self.kinds = (self.group_kind, self.txn_kind)
        #: The group shards this process owns (the transaction ones: ``txn_kind.shards``).
        self.shards: dict[int, Shard] = self.group_kind.shards
        self._lease: Any = None
        self._keepalive: KeepAlive | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stopping = False
        self._topics_cache: tuple[int, dict[str, int]] = (-1, {})
        self._lag_labels: set[tuple[str, str, str]] = set()
        self._waiting_logged: dict[str, bool] = {}

    # -- Service protocol --------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> list[str]:
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(self, server)
        return [coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name]

    async def start(self) -> None:
        """Reach etcd, follow the cluster's keys, take a lease; shards are claimed and loaded
        in the background (requests meanwhile get NOT_COORDINATOR / LOAD_IN_PROGRESS)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        try:
            store = MetadataStore(self.etcd, self.cluster)
        except ValueError as exc:
            raise CoordinatorStartupError(str(exc)) from None
        self.store = store
        try:
            await asyncio.to_thread(store.retry, store.revision, deadline_s=self.connect_timeout_s)
        except MetadataUnavailableError as exc:
            store.close()
            raise CoordinatorStartupError(
                f"cannot reach etcd at {self.etcd} within {self.connect_timeout_s:.0f}s ({exc})"
            ) from None
        self.view = ClusterView(store)
        self.view.add_listener(self._on_view_events)
        await asyncio.to_thread(self.view.start)
        await self._new_lease()
        self._spawn(self._ownership_loop())
        self._spawn(self._timer_loop())
        log.info(
            "coordinator %d started in cluster %r",
            self.coordinator_id,
            self.cluster,
            extra={"fields": {"coordinator_id": self.coordinator_id, "cluster": self.cluster}},
        )

    async def stop(self) -> None:
        """Stop serving shards and revoke the lease, so other coordinators take them at once."""
        self._stopping = True
        for shard in self._all_shards():
            self._unload(shard)
        for task in list(self._tasks):
            task.cancel()
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            # Revoking the lease deletes every coordinators/<s> key bound to it.
            await asyncio.to_thread(keepalive.stop, revoke=True)
        log.info("coordinator %d released its shards", self.coordinator_id)
        if self.view is not None:
            await asyncio.to_thread(self.view.stop)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        for ch in list(self._channels.values()):
            with contextlib.suppress(Exception):
                await ch.close()
        self._channels.clear()

    # -- plumbing ------------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_view_events(self, events: list[WatchEvent]) -> None:
        """Watch thread: something changed in etcd (owners, topics, nodes): re-check shards."""
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

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = default_channel().aio_channel(address, GRPC_OPTIONS)
        return ch

    async def _new_lease(self) -> None:
        assert self.store is not None
        store = self.store
        lease = await asyncio.to_thread(
            store.retry, lambda: store.grant_lease(self.lease_ttl_s), deadline_s=60
        )
        self._lease = lease
        self._keepalive = store.keep_alive(lease, lambda: self._from_thread(self._lease_lost))

    async def _lease_lost(self) -> None:
        """etcd dropped our lease (we could not refresh it in time): every shard key is gone,
        another coordinator may own the shards now. Drop them all and start over."""
        if self._stopping:
            return
        log.warning("coordinator %d lost its etcd lease; releasing all shards", self.coordinator_id)
        for shard in self._all_shards():
            self._unload(shard)
        await self._new_lease()
        if self._wake is not None:
            self._wake.set()

    def _owner(self, shard: Shard, epoch: int, producer_id: int) -> md.CoordinatorShardOwner:
        return md.CoordinatorShardOwner(
            shard=shard.index,
            coordinator_id=self.coordinator_id,
            host=self.advertise_host,
            port=self.advertise_port,
            epoch=epoch,
            producer_id=producer_id,
            acquired_ms=shard.acquired_ms,
            incarnation_id=self.incarnation_id,
            metrics_port=self.metrics_port,
        )

    def _all_shards(self) -> list[Shard]:
        return [s for kind in self.kinds for s in kind.shards.values()]

    def _update_gauges(self) -> None:
        loaded = [s for s in self.shards.values() if s.loaded]
        SHARDS_OWNED.set(len(loaded))
        metrics.set_transaction_states(
            t for s in self.txn_kind.shards.values() if s.loaded for t in s.transactions.values()
        )
        metrics.set_group_states(g for s in loaded for g in s.groups.values())
        MEMBERS.set(sum(len(g.members) for s in loaded for g in s.groups.values()))

    # -- shard ownership -----------------------------------------------------------------------

    async def _ownership_loop(self) -> None:
        """Create ``__consumer_offsets`` and ``__transaction_state`` if needed, claim free
        shards, drop lost ones; woken by every etcd change, with a slow tick as a safety net."""
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            for kind in self.kinds:
                try:
                    if await self._ensure_topic(kind):
                        await self._claim_shards(kind)
                except asyncio.CancelledError:
                    raise
                except MetadataUnavailableError as exc:  # etcd away or our lease just expired
                    log.warning("%s shard ownership pass: %s; retrying", kind.name, exc)
                except Exception:
                    log.exception("%s shard ownership pass failed", kind.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)

    async def _ensure_topic(self, kind: ShardKind) -> bool:
        """True once the kind's topic exists; asks the active controller to create it."""
        assert self.view is not None
        view = self.view
        if shard_count(view, topic=kind.topic) is not None:
            return True
        nodes = view.live_nodes()
        controller = view.controller_info()
        if not nodes or controller is None:
            return False  # woken again when they appear
        if len(nodes) < kind.replication_factor:
            # As Kafka: an internal topic is created with its full replication factor, never
            # a smaller one because some nodes were not up yet (a node loss would then take
            # every group or transaction of its shards offline).
            if not self._waiting_logged.get(kind.topic):
                log.warning(
                    "waiting for %d live storage nodes (%d now) to create %s with "
                    "replication factor %d (--offsets-replication-factor)",
                    kind.replication_factor,
                    len(nodes),
                    kind.topic,
                    kind.replication_factor,
                )
                self._waiting_logged[kind.topic] = True
            return False
        req = controller_pb2.CreateTopicsRequest(timeout_ms=10_000)
        req.topics.add(
            name=kind.topic,
            num_partitions=kind.partitions,
            replication_factor=kind.replication_factor,
            configs={"cleanup.policy": "compact"},
        )
        stub = controller_pb2_grpc.ControllerServiceStub(
            self._channel(f"{controller.host}:{controller.port}")
        )
        try:
            resp = await stub.CreateTopics(
                req, timeout=15.0, metadata=((INTERNAL_TOPICS_METADATA_KEY, "true"),)
            )
        except grpc.aio.AioRpcError as exc:
            log.info("CreateTopics %s: %s", kind.topic, exc.code().name)
            return False
        if resp.error_code != E.NONE:
            log.info("CreateTopics %s: %s", kind.topic, error_name(resp.error_code))
            return False
        for t in resp.topics:
            if t.error_code not in (E.NONE, E.TOPIC_ALREADY_EXISTS):
                log.warning(
                    "cannot create %s: %s %s",
                    kind.topic,
                    error_name(t.error_code),
                    t.error_message,
                )
                return False
            if t.error_code == E.NONE:
                log.info("created %s with %d partitions", kind.topic, t.num_partitions)
        return shard_count(view, topic=kind.topic) is not None

    async def _claim_shards(self, kind: ShardKind) -> None:
        assert self.view is not None and self.store is not None
        view, store = self.view, self.store
        shards = shard_count(view, topic=kind.topic) or 0
        owned = kind.shards
        with view.lock:
            owners = {s: v.value for s, v in kind.owners(view).items()}
            revision = view.revision
        # Lost: our key vanished (lease expired) or belongs to someone else now.
        for s, shard in list(owned.items()):
            owner = owners.get(s)
            if revision >= shard.create_revision and (
                owner is None or owner.incarnation_id != self.incarnation_id
            ):
                log.warning("%s shard %d is no longer ours; dropping it", kind.name, s)
                self._unload(shard)
        # Spread shards: take free ones, but no more than a fair share of the coordinators
        # seen owning shards (a lone coordinator takes them all; nothing is moved later).
        owners_seen = {o.incarnation_id for o in owners.values()} | {self.incarnation_id}
        fair = math.ceil(shards / max(1, len(owners_seen)))
        free = [s for s in range(shards) if s not in owners and s not in owned]
        mine = len(owned)
        for s in free:
            if self._stopping or self._lease is None:
                return
            if len(owners_seen) > 1 and mine >= fair:
                break
            if s in owners:
                continue
            shard = Shard(s, kind, acquired_ms=_now_ms())
            key = kind.key(store.keys, s)
            lease = self._lease
            created = await asyncio.to_thread(
                store.create, key, self._owner(shard, -1, -1), lease=lease
            )
            if not created:
                continue
            current = await asyncio.to_thread(store.get, key, md.CoordinatorShardOwner)
            if current is None or current.value.incarnation_id != self.incarnation_id:
                continue
            shard.create_revision = current.create_revision
            owned[s] = shard
            mine += 1
            log.info("took %s shard %d", kind.name, s, extra={"fields": {"shard": s}})
            self._start_load(shard)
            # One shard at a time, re-reading the owners: coordinators started together
            # interleave their claims instead of the first one taking everything.
            await asyncio.sleep(0.02)
            with view.lock:
                owners = {s2: v.value for s2, v in kind.owners(view).items()}
            owners_seen = {o.incarnation_id for o in owners.values()} | {self.incarnation_id}
            fair = math.ceil(shards / max(1, len(owners_seen)))

    def _start_load(self, shard: Shard) -> None:
        shard.loaded = False
        shard.generation += 1
        if shard.loader is not None and not shard.loader.done():
            shard.loader.cancel()
        shard.loader = self._spawn(self._load_until_done(shard, shard.generation))
        self._update_gauges()

    def _unload(self, shard: Shard) -> None:
        shard.loaded = False
        shard.generation += 1
        shard.groups = {}
        shard.transactions = {}
        for done in shard.completing.values():  # waiters look again (and find it moved)
            done.set()
        shard.completing.clear()
        if shard.loader is not None and not shard.loader.done():
            shard.loader.cancel()
        assert shard.kind is not None
        if shard.kind.shards.get(shard.index) is shard:
            del shard.kind.shards[shard.index]
        self._update_gauges()

    async def _load_until_done(self, shard: Shard, generation: int) -> None:
        delay = 0.1
        while not self._stopping and shard.generation == generation:
            try:
                await self._load(shard, generation)
                return
            except asyncio.CancelledError:
                raise
            except _ShardLost as exc:
                log.warning("shard %d lost while loading: %s", shard.index, exc)
                if shard.generation == generation:
                    self._unload(shard)
                return
            except Exception as exc:
                log.info("loading shard %d failed (%s); retrying", shard.index, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _load(self, shard: Shard, generation: int) -> None:
        """Replay, bump the producer epoch, fence, replay the rest, publish, serve."""
        assert self.store is not None and shard.kind is not None
        kind = shard.kind
        t0 = time.monotonic()
        state = kind.new_state()
        position = await self._replay(shard.index, state, 0, until=None, topic=kind.topic)
        pid, epoch = await self._init_producer(state.producer_id, state.producer_epoch)
        self._check_generation(shard, generation)
        fence = self._owner(shard, epoch, pid).SerializeToString()
        batch = encode_group_batch(
            [GroupRecord(FENCE_KEY, fence)], producer_id=pid, producer_epoch=epoch, base_sequence=0
        )
        fence_offset = await self._produce(shard.index, batch, kind.topic)
        # What the previous owner appended between our replay and the fence is state too.
        await self._replay(shard.index, state, position, until=fence_offset + 1, topic=kind.topic)
        self._check_generation(shard, generation)
        now = _now_ms()
        groups = {
            gid: ConsumerGroup.from_snapshot(snap, now_ms=now, config=self.group_config)
            for gid, snap in getattr(state, "groups", {}).items()
        }
        store = self.store
        key = kind.key(store.keys, shard.index)
        current = await asyncio.to_thread(store.get, key, md.CoordinatorShardOwner)
        if current is None or current.value.incarnation_id != self.incarnation_id:
            raise _ShardLost("the shard key is not ours any more")
        await asyncio.to_thread(store.put, key, self._owner(shard, epoch, pid), lease=self._lease)
        self._check_generation(shard, generation)
        shard.groups = groups
        shard.transactions = dict(getattr(state, "transactions", {}))
        shard.durable = state
        shard.producer_id, shard.producer_epoch, shard.next_sequence = pid, epoch, 1
        shard.loaded = True
        SHARD_LOADS.inc()
        self._update_gauges()
        if shard.transactions:
            self._resume_transactions(shard)
        log.info(
            "loaded %s shard %d: %d groups, %d transactional ids, producer %d epoch %d, %.0f ms",
            kind.name,
            shard.index,
            len(groups),
            len(shard.transactions),
            pid,
            epoch,
            (time.monotonic() - t0) * 1000,
            extra={"fields": {"shard": shard.index, "producer_epoch": epoch}},
        )

    @staticmethod
    def _check_generation(shard: Shard, generation: int) -> None:
        if shard.generation != generation:
            raise asyncio.CancelledError()

    # -- talking to storage nodes ----------------------------------------------------------------

    def _leader(self, partition: int, topic: str = CONSUMER_OFFSETS_TOPIC) -> tuple[str, int]:
        """(address, leader epoch) of a partition's leader from the view; raises if none."""
        assert self.view is not None
        state = self.view.partition(topic, partition)
        if state is None or state.value.leader < 0:
            raise StromError(f"{topic}-{partition} has no leader", retriable=True)
        node = self.view.live_nodes().get(state.value.leader)
        if node is None:
            raise StromError(f"leader of {topic}-{partition} is not live", retriable=True)
        return f"{node.host}:{node.port}", state.value.leader_epoch

    def _any_node(self) -> str:
        assert self.view is not None
        nodes = self.view.live_nodes()
        if not nodes:
            raise StromError("no live storage node", retriable=True)
        n = nodes[min(nodes)]
        return f"{n.host}:{n.port}"

    async def _replay(
        self,
        partition: int,
        state: ReplayState,
        position: int,
        *,
        until: int | None,
        topic: str = CONSUMER_OFFSETS_TOPIC,
    ) -> int:
        """Apply the partition's batches from ``position`` up to ``until`` (None: the high
        watermark seen by the first fetch); returns the offset replay ended at."""
        target = until
        deadline = time.monotonic() + 30.0
        while True:
            if time.monotonic() > deadline:
                raise StromError(
                    f"replay of {topic}-{partition} stuck at {position} (want {target})",
                    retriable=True,
                )
            addr, _epoch = self._leader(partition, topic)
            stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))
            req = storage_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=8 << 20)
            req.topics.add(topic=topic).partitions.add(
                partition=partition,
                fetch_offset=position,
                current_leader_epoch=-1,
                partition_max_bytes=8 << 20,
            )
            resp = await stub.Fetch(req, timeout=10.0)
            pr = resp.topics[0].partitions[0]
            if pr.error_code == E.OFFSET_OUT_OF_RANGE and pr.log_start_offset > position:
                position = pr.log_start_offset
                continue
            if pr.error_code != E.NONE:
                raise StromError(
                    f"fetch {topic}-{partition}@{position}: "
                    f"{error_name(pr.error_code)} {pr.error_message}",
                    retriable=True,
                )
            if target is None:
                target = pr.high_watermark
            if pr.records:
                state.apply_batches(pr.records)
                position = max(position, state.next_offset)
            if position >= target:
                return position
            if not pr.records:
                if until is None:
                    return position  # nothing left below the high watermark
                await asyncio.sleep(0.05)  # the fence is acknowledged; its HW is on its way

    async def _init_producer(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """A bumped epoch of the shard's producer id (or a new id for a fresh shard)."""
        req = storage_pb2.InitProducerIdRequest(
            producer_id=producer_id if producer_id >= 0 else -1,
            producer_epoch=max(epoch, 0) if producer_id >= 0 else -1,
        )
        stub = storage_pb2_grpc.StorageServiceStub(self._channel(self._any_node()))
        resp = await stub.InitProducerId(req, timeout=10.0)
        if resp.error_code != E.NONE:
            raise StromError(
                f"InitProducerId: {error_name(resp.error_code)} {resp.error_message}",
                retriable=True,
            )
        return resp.producer_id, resp.producer_epoch

    async def _produce(
        self, partition: int, batch: bytes, topic: str = CONSUMER_OFFSETS_TOPIC
    ) -> int:
        """Append one batch with acks=all; its base offset. Leader moves and timeouts are
        retried with the same bytes (the idempotent producer makes a resend safe).

        Raises:
            _ShardLost: the leader fenced this producer (a newer owner exists).
            RequestTimedOutError: no leader took the batch within WRITE_RETRY_S.
        """
        deadline = time.monotonic() + WRITE_RETRY_S
        last = ""
        while True:
            try:
                addr, leader_epoch = self._leader(partition, topic)
                stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))
                req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
                req.topics.add(topic=topic).partitions.add(
                    partition=partition, records=batch, current_leader_epoch=leader_epoch
                )
                resp = await stub.Produce(req, timeout=10.0)
                pr = resp.topics[0].partitions[0]
                if pr.error_code == E.NONE:
                    WRITES.inc()
                    return pr.base_offset
                if pr.error_code in (E.INVALID_PRODUCER_EPOCH, E.OUT_OF_ORDER_SEQUENCE):
                    raise _ShardLost(f"{error_name(pr.error_code)}: {pr.error_message}")
                last = f"{error_name(pr.error_code)} {pr.error_message}"
                if pr.error_code not in (
                    E.NOT_LEADER_OR_FOLLOWER,
                    E.LEADER_NOT_AVAILABLE,
                    E.FENCED_LEADER_EPOCH,
                    E.UNKNOWN_LEADER_EPOCH,
                    E.NOT_ENOUGH_REPLICAS,
                    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                    E.REQUEST_TIMED_OUT,
                    E.UNKNOWN_TOPIC_OR_PARTITION,
                ):
                    raise UnknownServerError(f"append to {topic}: {last}")
            except grpc.aio.AioRpcError as exc:
                last = exc.code().name
            except StromError as exc:
                if not exc.retriable:
                    raise
                last = exc.message
            if time.monotonic() >= deadline:
                raise RequestTimedOutError(f"could not append to {topic}-{partition}: {last}")
            await asyncio.sleep(0.1)

    # -- operations ----------------------------------------------------------------------------

    def _started_view(self) -> ClusterView:
        """The cluster view, or COORDINATOR_NOT_AVAILABLE (retriable) while the process is
        still starting: the gRPC port is bound before etcd is reached, and a client that
        calls in that moment must be told to retry, not handed an internal error."""
        if self.view is None:
            raise CoordinatorNotAvailableError(
                f"coordinator {self.coordinator_id} is starting; retry shortly"
            )
        return self.view

    def _shard_of(self, group_id: str) -> Shard:
        """The loaded shard holding ``group_id``; raises the group-level errors."""
        if not group_id:
            raise InvalidGroupIdError("group id must not be empty")
        shards = shard_count(self._started_view())
        if shards is None:
            raise NotCoordinatorError(f"{CONSUMER_OFFSETS_TOPIC} does not exist yet")
        s = shard_for_group(group_id, shards)
        shard = self.shards.get(s)
        if shard is None or self._stopping:
            raise NotCoordinatorError(f"coordinator {self.coordinator_id} does not own shard {s}")
        if not shard.loaded:
            raise CoordinatorLoadInProgressError(f"shard {s} is still loading")
        return shard

    async def _mutate(
        self,
        group_id: str,
        fn: Callable[[ConsumerGroup], T],
        records_of: Callable[[T], list[GroupRecord]],
        *,
        create: bool = True,
    ) -> T:
        """Run an engine call on the group and make its records durable before returning.

        The engine raises (changing nothing) for protocol errors. If the write fails, the
        in-memory state may be ahead of the log: the shard is reloaded from the log.
        """
        shard = self._shard_of(group_id)
        async with shard.lock:
            if not shard.loaded or self.shards.get(shard.index) is not shard:
                raise NotCoordinatorError(f"shard {shard.index} moved")
            group = shard.groups.get(group_id)
            fresh = group is None
            if group is None:
                if not create:
                    raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
                group = ConsumerGroup(group_id, config=self.group_config, now_ms=_now_ms())
            result = fn(group)
            records = records_of(result)
            if records:
                await self._write(shard, records)
            if fresh and records:
                shard.groups[group_id] = group
            if group.state is GroupState.DEAD:
                shard.groups.pop(group_id, None)
            return result

    async def _write(self, shard: Shard, records: list[GroupRecord]) -> None:
        batch = encode_group_batch(
            records,
            producer_id=shard.producer_id,
            producer_epoch=shard.producer_epoch,
            base_sequence=shard.next_sequence,
        )
        try:
            await self._produce(shard.index, batch, shard.topic)
        except _ShardLost as exc:
            log.warning("shard %d fenced (%s); dropping it", shard.index, exc)
            self._unload(shard)
            raise NotCoordinatorError(f"shard {shard.index} moved to another coordinator") from None
        except Exception as exc:
            log.warning("write to shard %d failed (%s); reloading it", shard.index, exc)
            self._start_load(shard)
            if isinstance(exc, StromError):
                raise RequestTimedOutError(exc.message) from None
            raise RequestTimedOutError(f"write failed: {exc}") from None
        shard.next_sequence = (shard.next_sequence + len(records)) & 0x7FFFFFFF
        shard.durable.apply_records(records)
        self._update_gauges()

    def _topics(self) -> dict[str, int]:
        """The cluster's live topics → partition counts (cached per view revision)."""
        view = self._started_view()
        with view.lock:
            rev = view.revision
            if self._topics_cache[0] == rev:
                return self._topics_cache[1]
            topics = {
                name: v.value.partition_count
                for name, v in view.topics.items()
                if not v.value.deleting
            }
        self._topics_cache = (rev, topics)
        return topics

    async def _timed(self, rpc: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run an RPC's body (its latency is observed by the wrapper metrics.instrument puts
        around every RPC, labelled with the result)."""
        return await fn()

    @staticmethod
    def _fail(rpc: str, resp: Any, exc: BaseException) -> None:
        if isinstance(exc, StromError):
            resp.error_code = exc.code if exc.code is not None else E.UNKNOWN_SERVER_ERROR
            resp.error_message = exc.message
        else:
            log.exception("%s failed", rpc, exc_info=exc)
            resp.error_code = E.UNKNOWN_SERVER_ERROR
            resp.error_message = f"{type(exc).__name__}: {exc}"
        RPC_ERRORS.labels(rpc, error_name(resp.error_code)).inc()

    # -- RPCs -----------------------------------------------------------------------------------

    async def ConsumerGroupHeartbeat(
        self,
        request: coordinator_pb2.ConsumerGroupHeartbeatRequest,
        context: grpc.aio.ServicerContext,
    ) -> coordinator_pb2.ConsumerGroupHeartbeatResponse:
        resp = coordinator_pb2.ConsumerGroupHeartbeatResponse(
            member_id=request.member_id, member_epoch=-1
        )
        meta = dict(context.invocation_metadata() or ())
        client_id = str(meta.get("strom-client-id", ""))
        client_host = _client_host(context.peer())
        owned = {tp.topic: list(tp.partitions) for tp in request.owned_topic_partitions}

        def beat(group: ConsumerGroup) -> Any:
            return group.heartbeat(
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                now_ms=_now_ms(),
                topics=self._topics(),
                instance_id=request.instance_id if request.HasField("instance_id") else None,
                rack_id=request.rack_id if request.HasField("rack_id") else None,
                subscribed_topic_names=request.subscribed_topic_names,
                subscribed_topic_regex=(
                    request.subscribed_topic_regex
                    if request.HasField("subscribed_topic_regex")
                    else None
                ),
                server_assignor=(
                    request.server_assignor if request.HasField("server_assignor") else None
                ),
                owned_partitions=owned,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                client_id=client_id,
                client_host=client_host,
            )

        async def body() -> None:
            try:
                result = await self._mutate(request.group_id, beat, lambda r: r.records)
            except Exception as exc:
                self._fail("ConsumerGroupHeartbeat", resp, exc)
                return
            resp.member_id = result.member_id
            resp.member_epoch = result.member_epoch
            resp.heartbeat_interval_ms = result.heartbeat_interval_ms
            if result.assignment is not None:
                resp.assignment.CopyFrom(_assignment_pb(result.assignment))

        await self._timed("ConsumerGroupHeartbeat", body)
        return resp

    async def OffsetCommit(
        self, request: coordinator_pb2.OffsetCommitRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.OffsetCommitResponse:
        resp = coordinator_pb2.OffsetCommitResponse()
        offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        for t in request.topics:
            for p in t.partitions:
                offsets[(t.topic, p.partition)] = OffsetAndMetadata(
                    offset=p.committed_offset,
                    leader_epoch=p.committed_leader_epoch,
                    metadata=p.metadata,
                )

        def commit(group: ConsumerGroup) -> Any:
            return group.commit_offsets(
                request.member_id,
                request.member_epoch,
                offsets,
                now_ms=_now_ms(),
                topics=self._topics(),
                committer_id=request.committer_id,
                commit_sequence=request.commit_sequence,
            )

        async def body() -> None:
            try:
                result = await self._mutate(
                    request.group_id, commit, lambda r: r.records, create=request.member_epoch < 0
                )
            except GroupIdNotFoundError:
                resp.error_code = E.UNKNOWN_MEMBER_ID  # type: ignore[assignment]
                resp.error_message = (
                    f"group {request.group_id!r} has no member {request.member_id!r}"
                )
                RPC_ERRORS.labels("OffsetCommit", "UNKNOWN_MEMBER_ID").inc()
                return
            except Exception as exc:
                self._fail("OffsetCommit", resp, exc)
                return
            if result.superseded:
                SUPERSEDED_COMMITS.inc(result.superseded)
            for t in request.topics:
                tr = resp.topics.add(topic=t.topic)
                for p in t.partitions:
                    code = result.errors.get((t.topic, p.partition), E.NONE)
                    pr = tr.partitions.add(partition=p.partition, error_code=code)
                    if code != E.NONE:
                        pr.error_message = error_name(code)

        await self._timed("OffsetCommit", body)
        return resp

    async def OffsetFetch(
        self, request: coordinator_pb2.OffsetFetchRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.OffsetFetchResponse:
        resp = coordinator_pb2.OffsetFetchResponse()

        async def body() -> None:
            try:
                shard = self._shard_of(request.group_id)
                group = shard.groups.get(request.group_id)
                if group is not None:
                    group.validate_fetch(request.member_id, request.member_epoch)
            except Exception as exc:
                self._fail("OffsetFetch", resp, exc)
                return
            committed = dict(group.offsets) if group is not None else {}
            wanted: dict[str, list[int]] = {}
            if request.topics:
                for tp in request.topics:
                    ps = list(tp.partitions) or [p for t, p in committed if t == tp.topic]
                    wanted.setdefault(tp.topic, []).extend(ps)
            else:
                for t, p in committed:
                    wanted.setdefault(t, []).append(p)
            for topic in sorted(wanted):
                tr = resp.topics.add(topic=topic)
                for p in sorted(set(wanted[topic])):
                    om = committed.get((topic, p))
                    pr = tr.partitions.add(
                        partition=p, committed_offset=-1, committed_leader_epoch=-1
                    )
                    if request.require_stable and group is not None and group.unstable(topic, p):
                        pr.error_code = E.UNSTABLE_OFFSET_COMMIT  # type: ignore[assignment]
                        pr.error_message = "a transaction has an offset pending for it"
                        continue
                    if om is not None:
                        pr.committed_offset = om.offset
                        pr.committed_leader_epoch = om.leader_epoch
                        pr.metadata = om.metadata

        await self._timed("OffsetFetch", body)
        return resp

    async def ListGroups(
        self, request: coordinator_pb2.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.ListGroupsResponse:
        resp = coordinator_pb2.ListGroupsResponse()
        states = set(request.states_filter)
        loading = []
        listed = []
        for s, shard in sorted(self.shards.items()):
            if not shard.loaded:
                loading.append(s)
                continue
            resp.shards.append(s)
            for gid, g in shard.groups.items():
                state = int(g.state)
                if state == coordinator_pb2.GROUP_STATE_DEAD or (states and state not in states):
                    continue
                listed.append(
                    coordinator_pb2.ListedGroup(
                        group_id=gid, state=state, shard=s, member_count=len(g.members)
                    )
                )
        resp.groups.extend(sorted(listed, key=lambda g: g.group_id))
        if loading:
            resp.error_code = E.COORDINATOR_LOAD_IN_PROGRESS  # type: ignore[assignment]
            resp.error_message = f"shards {loading} are still loading"
        return resp

    async def DescribeGroups(
        self, request: coordinator_pb2.DescribeGroupsRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.DescribeGroupsResponse:
        resp = coordinator_pb2.DescribeGroupsResponse()
        for gid in request.group_ids:
            d = resp.groups.add(group_id=gid)
            try:
                shard = self._shard_of(gid)
                group = shard.groups.get(gid)
                if group is None or group.state is GroupState.DEAD:
                    raise GroupIdNotFoundError(f"group {gid!r} does not exist")
            except Exception as exc:
                self._fail("DescribeGroups", d, exc)
                continue
            d.state = int(group.state)  # type: ignore[assignment]
            d.group_epoch = group.group_epoch
            d.assignment_epoch = group.assignment_epoch
            d.assignor_name = group.assignor_name
            for mid in sorted(group.members):
                m = group.members[mid]
                dm = d.members.add(
                    member_id=mid,
                    client_id=m.metadata.client_id,
                    client_host=m.metadata.client_host,
                    member_epoch=m.member_epoch,
                    state=int(m.state),
                    subscribed_topic_names=list(m.metadata.subscribed_topic_names),
                )
                if m.metadata.instance_id is not None:
                    dm.instance_id = m.metadata.instance_id
                if m.metadata.rack_id is not None:
                    dm.rack_id = m.metadata.rack_id
                if m.metadata.subscribed_topic_regex is not None:
                    dm.subscribed_topic_regex = m.metadata.subscribed_topic_regex
                dm.assignment.CopyFrom(_assignment_pb(m.assigned))
                dm.target_assignment.CopyFrom(_assignment_pb(group.target.get(mid, {})))
            if request.include_offsets:
                await self._describe_offsets(group, d)
        return resp

    async def _describe_offsets(
        self, group: ConsumerGroup, d: coordinator_pb2.DescribedGroup
    ) -> None:
        parts = set(group.offsets)
        for m in group.members.values():
            for t, ps in m.assigned.items():
                parts.update((t, p) for p in ps)
        ends = await self._end_offsets(parts)
        for t, p in sorted(parts):
            om = group.offsets.get((t, p))
            end = ends.get((t, p), -1)
            committed = om.offset if om is not None else -1
            if end < 0:
                lag = -1
            elif committed >= 0:
                lag = max(0, end - committed)
            else:
                lag = 0 if end == 0 else -1
            d.offsets.add(
                topic=t,
                partition=p,
                committed_offset=committed,
                committed_leader_epoch=om.leader_epoch if om is not None else -1,
                metadata=om.metadata if om is not None else "",
                end_offset=end,
                lag=lag,
                member_id=group.owner_of(t, p) or "",
            )

    async def _end_offsets(self, parts: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """High watermarks by ListOffsets(LATEST) to each leader; missing = unknown."""
        by_leader: dict[str, list[tuple[str, int]]] = {}
        for t, p in parts:
            try:
                addr, _ = self._leader(p, t)
            except StromError:
                continue
            by_leader.setdefault(addr, []).append((t, p))

        async def ask(addr: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
            req = storage_pb2.ListOffsetsRequest(replica_id=-1)
            topics: dict[str, Any] = {}
            for t, p in tps:
                if t not in topics:
                    topics[t] = req.topics.add(topic=t)
                topics[t].partitions.add(partition=p, current_leader_epoch=-1, timestamp=-1)
            stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))
            try:
                r = await stub.ListOffsets(req, timeout=5.0)
            except grpc.aio.AioRpcError:
                return {}
            return {
                (tr.topic, pr.partition): pr.offset
                for tr in r.topics
                for pr in tr.partitions
                if pr.error_code == E.NONE
            }

        out: dict[tuple[str, int], int] = {}
        for found in await asyncio.gather(*(ask(a, tps) for a, tps in by_leader.items())):
            out.update(found)
        return out

    async def DeleteGroups(
        self, request: coordinator_pb2.DeleteGroupsRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.DeleteGroupsResponse:
        resp = coordinator_pb2.DeleteGroupsResponse()
        for gid in request.group_ids:
            r = resp.results.add(group_id=gid)
            try:
                await self._mutate(gid, lambda g: g.delete(), lambda recs: recs, create=False)
            except Exception as exc:
                self._fail("DeleteGroups", r, exc)
        return resp

    async def DeleteOffsets(
        self, request: coordinator_pb2.DeleteOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.DeleteOffsetsResponse:
        resp = coordinator_pb2.DeleteOffsetsResponse()
        parts = [(tp.topic, p) for tp in request.topics for p in tp.partitions]
        try:
            result = await self._mutate(
                request.group_id,
                lambda g: g.delete_offsets(parts),
                lambda r: r.records,
                create=False,
            )
        except Exception as exc:
            self._fail("DeleteOffsets", resp, exc)
            return resp
        for tp in request.topics:
            tr = resp.topics.add(topic=tp.topic)
            for p in tp.partitions:
                code = result.errors.get((tp.topic, p), E.NONE)
                tr.partitions.add(partition=p, error_code=code)
        return resp

    async def FindCoordinator(
        self, request: storage_pb2.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.FindCoordinatorResponse:
        if self.view is None:  # still starting (see _started_view)
            resp = storage_pb2.FindCoordinatorResponse()
            for key in request.keys:
                c = resp.coordinators.add(
                    key=key,
                    shard=-1,
                    error_code=E.COORDINATOR_NOT_AVAILABLE,
                    error_message=f"coordinator {self.coordinator_id} is starting; retry shortly",
                )
                c.node.node_id = -1
            return resp
        return find_coordinator(self.view, request)

    # -- timers ---------------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        """Expire members past their deadlines (persisting the removal), abort transactions
        past their timeout, refresh lag gauges."""
        next_lag = time.monotonic() + self.lag_interval_s
        while not self._stopping:
            now = _now_ms()
            wake_at = now + 1000
            for shard in list(self.shards.values()):
                if not shard.loaded:
                    continue
                for gid, group in list(shard.groups.items()):
                    deadline = group.next_deadline_ms()
                    if deadline is None:
                        continue
                    if deadline <= now:
                        await self._expire(gid)
                    else:
                        wake_at = min(wake_at, deadline)
            await self._abort_expired()
            if time.monotonic() >= next_lag:
                next_lag = time.monotonic() + self.lag_interval_s
                with contextlib.suppress(Exception):
                    await self._refresh_lag()
            await asyncio.sleep(max(0.02, (wake_at - _now_ms()) / 1000.0))

    async def _expire(self, group_id: str) -> None:
        try:
            result = await self._mutate(
                group_id, lambda g: g.expire(_now_ms()), lambda r: r.records, create=False
            )
        except StromError as exc:
            log.info("expiring members of %s failed: %s", group_id, exc)
            return
        for m in result.expired:
            EXPIRED.labels(m.reason).inc()
            log.info(
                "removed member %s of group %s (%s timeout)",
                m.member_id,
                group_id,
                m.reason,
                extra={"fields": {"group": group_id, "member": m.member_id}},
            )

    async def _refresh_lag(self) -> None:
        committed: dict[tuple[str, str, int], int] = {}
        for shard in list(self.shards.values()):
            if shard.loaded:
                for gid, g in shard.groups.items():
                    for (t, p), om in g.offsets.items():
                        committed[(gid, t, p)] = om.offset
        ends = await self._end_offsets({(t, p) for _, t, p in committed})
        labels = set()
        for (gid, t, p), off in committed.items():
            end = ends.get((t, p))
            if end is None:
                continue
            key = (gid, t, str(p))
            labels.add(key)
            LAG.labels(*key).set(max(0, end - off))
        for key in self._lag_labels - labels:
            with contextlib.suppress(KeyError):
                LAG.remove(*key)
        self._lag_labels = labels


# Latency by result for every RPC, groups by state, rebalances (strom.coordinator.metrics).
metrics.instrument(CoordinatorService)
