"""The controller service: one gRPC servicer over the controller's concerns, wired to etcd
(DESIGN §2, §3, §6).

Each concern is a module of its own, mixed into :class:`ControllerService` here:

- :mod:`~strom.controller.activation`: campaigning, becoming active, stepping down, probers;
- :mod:`~strom.controller.topics_admin`: CreateTopics, DeleteTopics, CreatePartitions;
- :mod:`~strom.controller.descriptions`: DescribeCluster, ListTopics, DescribeTopics;
- :mod:`~strom.controller.configs_admin`: DescribeConfigs, AlterConfigs;
- :mod:`~strom.controller.isr`: AlterPartition (ISR commits);
- :mod:`~strom.controller.elections`: ElectLeaders, ControlledShutdown;
- :mod:`~strom.controller.reassignment`: Alter/ListPartitionReassignments;
- :mod:`~strom.controller.reconcile`: partitions following node liveness;
- :mod:`~strom.controller.producer_ids`: AllocateProducerIds;
- :mod:`~strom.controller.acls`: ACL and client-quota RPCs.

They share :class:`~strom.controller.core.ControllerCore` (the fenced write, the request
wrapper, read-your-writes); writes that read before they write go through
:func:`strom.controller.cas.commit_with_retry`. This module holds only construction and the
service lifecycle.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import grpc

from strom.api import controller_pb2, controller_pb2_grpc
from strom.api import metadata_pb2 as md
from strom.controller import metrics
from strom.controller.acls import AclRpcs
from strom.controller.activation import ActiveRole
from strom.controller.configs_admin import ConfigRpcs
from strom.controller.core import Leadership
from strom.controller.descriptions import DescriptionRpcs
from strom.controller.elections import ElectionRpcs
from strom.controller.isr import IsrRpcs
from strom.controller.node_changes import NodeChanges
from strom.controller.prober import NodeProber
from strom.controller.producer_ids import ProducerIdRpcs
from strom.controller.reassignment import ReassignmentRpcs
from strom.controller.topics_admin import TopicRpcs
from strom.metadata import ClusterView, Election, MetadataStore
from strom.service.etcd_start import follow_cluster, reach_etcd
from strom.service.metrics import timed_rpcs

log = logging.getLogger("strom.controller")


class ControllerStartupError(RuntimeError):
    """The controller cannot start (etcd unreachable, wrong cluster); the message says why."""


class ControllerService(
    ActiveRole,
    ElectionRpcs,
    ReassignmentRpcs,
    TopicRpcs,
    DescriptionRpcs,
    ConfigRpcs,
    IsrRpcs,
    ProducerIdRpcs,
    AclRpcs,
    controller_pb2_grpc.ControllerServiceServicer,
):
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
        #: The registered storage nodes as last seen, to log who registered and who left.
        self._node_changes = NodeChanges()
        self.store: MetadataStore | None = None
        self.view: ClusterView | None = None
        self._election: Election | None = None
        self._leadership: Leadership | None = None
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
        self.export_active_gauge()
        self.store = await reach_etcd(
            self.etcd, self.cluster, self.connect_timeout_s, ControllerStartupError
        )
        self.view = follow_cluster(self.store, self._on_view_events)
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


# RPC latency by result for every RPC (strom_controller_request_latency_seconds).
timed_rpcs(ControllerService, metrics.REQUEST_LATENCY, metrics.RPCS)
