"""The group-coordinator service: one gRPC servicer over the coordinator's concerns, wired
to etcd (DESIGN §2, §3, §7).

Each concern is a module of its own, mixed into :class:`CoordinatorService` here:

- :mod:`~strom.coordinator.shard_ownership`: claiming, loading (fencing) and dropping shards;
- :mod:`~strom.coordinator.storage_io`: replay, produce and end offsets on the storage nodes;
- :mod:`~strom.coordinator.group_rpcs`: ConsumerGroupHeartbeat, List/Describe/DeleteGroups;
- :mod:`~strom.coordinator.offset_rpcs`: OffsetCommit, OffsetFetch, DeleteOffsets;
- :mod:`~strom.coordinator.timers`: member expiry, transaction timeouts, lag gauges;
- :mod:`~strom.coordinator.txn_service`: the transaction coordinator's RPCs.

They share :class:`~strom.coordinator.core.CoordinatorCore` (finding a group's shard, running
a group engine call durably). This module holds construction, the service lifecycle and
FindCoordinator (the lookup itself is :mod:`strom.coordinator.lookup`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import grpc

from strom.api import coordinator_pb2, coordinator_pb2_grpc, storage_pb2
from strom.coordinator import metrics
from strom.coordinator.core import CoordinatorCore
from strom.coordinator.group import GroupConfig
from strom.coordinator.group_rpcs import GroupRpcs
from strom.coordinator.lookup import find_coordinator, shard_count
from strom.coordinator.node_sessions import NodeSessions
from strom.coordinator.offset_rpcs import OffsetRpcs
from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC, ShardState
from strom.coordinator.produce_streams import ProduceStreams
from strom.coordinator.shard_ownership import (
    LOAD_FAILURE_LOG_INTERVAL_S,
    RELEASE_BACKOFF_S,
    ShardOwnership,
)
from strom.coordinator.shard_writes import MAX_BATCH_RECORDS
from strom.coordinator.shards import Shard, ShardKind
from strom.coordinator.storage_io import INTERNAL_WRITER
from strom.coordinator.timers import EMPTY_GROUP_RETENTION_MS, OFFSETS_RETENTION_MS, Timers
from strom.coordinator.txn_service import TransactionRpcs
from strom.coordinator.txn_state import MAX_TIMEOUT_MS, TRANSACTION_STATE_TOPIC, TxnShardState
from strom.errors import ErrorCode
from strom.grpc_options import GRPC_OPTIONS
from strom.lograte import LogLimiter
from strom.metadata import ClusterView, KeepAlive, Keys, MetadataStore
from strom.security.channel import ChannelCache
from strom.service.etcd_start import follow_cluster, reach_etcd

log = logging.getLogger("strom.coordinator")
E = ErrorCode

#: How often lag gauges are refreshed, by default.
LAG_INTERVAL_S = 10.0


class CoordinatorStartupError(RuntimeError):
    """The coordinator cannot start (etcd unreachable, bad settings)."""


class CoordinatorService(
    TransactionRpcs,
    GroupRpcs,
    OffsetRpcs,
    Timers,
    ShardOwnership,
    CoordinatorCore,
    coordinator_pb2_grpc.CoordinatorServiceServicer,
):
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
        max_write_batch_records: int = MAX_BATCH_RECORDS,
        empty_group_retention_ms: int = EMPTY_GROUP_RETENTION_MS,
        offsets_retention_ms: int = OFFSETS_RETENTION_MS,
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
        self.max_write_batch_records = max_write_batch_records
        self.empty_group_retention_ms = empty_group_retention_ms
        self.offsets_retention_ms = offsets_retention_ms
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
        self._channels = ChannelCache(GRPC_OPTIONS)
        self._appends = ProduceStreams(self._channels.get, INTERNAL_WRITER)
        self._stopping = False
        self._topics_cache: tuple[int, dict[str, int], dict[str, str]] = (-1, {}, {})
        self._node_sessions = NodeSessions()
        self._lag_labels: set[tuple[str, str, str]] = set()
        self._past_end_labels: set[tuple[str, str, str]] = set()
        self._swept: tuple[dict[str, str], frozenset[tuple[int, int]]] | None = None
        self._empty_since: dict[str, int] = {}
        self._next_empty_check = 0
        self._waiting_logged: dict[str, bool] = {}
        self._free_since: dict[tuple[str, int], float] = {}
        self._handed_over: set[tuple[str, int]] = set()
        self._next_hand_over = 0.0
        self._members_at_pause = None
        self._handed_with = {}
        self._released = {}
        self._last_owner = {}
        self._release_backoff_s = RELEASE_BACKOFF_S
        self._troubled_until = 0.0
        self._releases_paused_until = 0.0
        self._releases_paused_with = None
        #: Shards whose load keeps failing: logged first, then once a while (LogLimiter).
        self._load_failures = LogLimiter(LOAD_FAILURE_LOG_INTERVAL_S)
        metrics.count_at_scrape(
            self.group_kind.shards,
            self.txn_kind.shards,
            self._cluster_group_shards,
            self._lease_live,
        )

    def _cluster_group_shards(self) -> int:
        """Partitions of ``__consumer_offsets`` as the view sees them (0 before it exists or
        before the view started): the shards the coordinators together should serve."""
        view = self.view
        return 0 if view is None else shard_count(view, 0) or 0

    # -- Service protocol --------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> list[str]:
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(self, server)
        return [coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name]

    async def start(self) -> None:
        """Reach etcd, follow the cluster's keys, take a lease; shards are claimed and loaded
        in the background (requests meanwhile get NOT_COORDINATOR / LOAD_IN_PROGRESS)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.store = await reach_etcd(
            self.etcd, self.cluster, self.connect_timeout_s, CoordinatorStartupError
        )
        self.view = follow_cluster(self.store, self._on_view_events)
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
        await self._appends.close()
        await self._channels.close()

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


# Latency by result for every RPC, groups by state, rebalances (strom.coordinator.metrics).
metrics.instrument(CoordinatorService)
