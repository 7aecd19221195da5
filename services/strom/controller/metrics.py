"""Prometheus metrics of the controller: its role, admin requests and elections, RPC latency
by result, and the cluster-health gauges computed from the cluster view.

Every controller (active or standby) follows the whole cluster view, so every controller
reports the cluster-wide gauges; dashboards and alerts take ``max()`` over them.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from strom.api import controller_pb2_grpc
from strom.controller import leadership
from strom.log.config import CONFIG_KEYS
from strom.service.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from strom.api import metadata_pb2 as md
    from strom.metadata import ClusterView

#: Every RPC the controller serves (the generated servicer's methods).
RPCS = tuple(
    name for name in vars(controller_pb2_grpc.ControllerServiceServicer) if not name.startswith("_")
)

REQUEST_LATENCY = Histogram(
    "strom_controller_request_latency_seconds",
    "Time to answer a ControllerService RPC, by RPC and result (the whole-request error, else "
    "the first item's error; NONE = success, CANCELLED = the client cancelled the call)",
    ["rpc", "result"],
    buckets=LATENCY_BUCKETS,
)
UNDER_MIN_ISR = Gauge(
    "strom_controller_under_min_isr_partitions",
    "Partitions whose ISR is smaller than their topic's min.insync.replicas (every controller "
    "reports; use max())",
)
PREFERRED_IMBALANCE = Gauge(
    "strom_controller_preferred_replica_imbalance",
    "Partitions led by a replica other than their preferred (first) replica (every controller "
    "reports; use max())",
)
ACTIVE = Gauge(
    "strom_controller_active",
    "1 while this controller is the active one, else 0 (0 too once its election lease has "
    "surely expired: no refresh for longer than its TTL, an etcd outage or a pause, even "
    "before it hears of the loss)",
)
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
MISSING_NODE_REPLICAS = Gauge(
    "strom_controller_missing_node_replicas",
    "Replicas assigned to a storage node that is not registered (down, fenced, its pod deleted "
    "or pending), by node id; a series exists only while its node is missing (every "
    "controller reports; use max())",
    ["node"],
)
OFFLINE_PARTITIONS = Gauge(
    "strom_controller_offline_partitions",
    "Partitions without a leader (every controller reports; use max())",
)
UNDER_REPLICATED = Gauge(
    "strom_controller_under_replicated_partitions",
    "Partitions with fewer replicas in sync than they have, not counting replicas a "
    "reassignment is adding (Kafka's rule; every controller reports)",
)
REASSIGNING = Gauge(
    "strom_controller_reassigning_partitions",
    "Partitions whose replicas a reassignment is moving (every controller reports; use max())",
)
LEADER_ELECTIONS = Counter(
    "strom_controller_leader_elections",
    "Leader changes committed by this controller, by reason: failure (the leader died, or "
    "registered again and is still starting), controlled_shutdown (it is shutting down), "
    "preferred, unclean, reassignment, damaged_replica (the leader's data failed a check on "
    "read and it handed the partition to another in-sync replica), storage_error (the "
    "leader's disk refused an append, full or failing, or it could not open the log for "
    "want of file descriptors, and it handed the partition over)",
    ["reason"],
)
FAILOVER_SECONDS = Histogram(
    "strom_controller_failover_seconds",
    "From a storage node's registration disappearing to the new partition states committed",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
)
RECONCILE_PASSES = Counter(
    "strom_controller_reconcile_passes",
    "Reconciliation passes by what they read: every partition (scope=all: nodes changed, "
    "activation, a failed pass) or only the topics that changed (scope=topics)",
    ["scope"],
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
for _reason in leadership.REASONS:
    LEADER_ELECTIONS.labels(_reason)
#: min.insync.replicas of a topic that does not override it.
DEFAULT_MIN_ISR = int(CONFIG_KEYS["min.insync.replicas"].default)


_Flags = dict[tuple[str, int], tuple[int, int, tuple[int, int, int, int, int], tuple[int, ...]]]
#: Per view: (topic, partition) -> (state mod_revision, topic mod_revision, its gauge flags,
#: its replicas).
_FLAGS: weakref.WeakKeyDictionary[ClusterView, _Flags] = weakref.WeakKeyDictionary()
#: The node ids MISSING_NODE_REPLICAS has a series for (dropped when the node is back).
_MISSING: set[int] = set()


def _flags(st: md.PartitionState, meta: md.TopicMetadata) -> tuple[int, int, int, int, int]:
    """(offline, under-replicated, under min ISR, not led by its preferred replica, being
    reassigned)."""
    wanted = leadership.targets(st)
    try:
        min_isr = int(meta.configs.get("min.insync.replicas", DEFAULT_MIN_ISR))
    except ValueError:
        min_isr = DEFAULT_MIN_ISR
    return (
        int(st.leader < 0),
        # Kafka's rule: fewer in sync than the replicas not being added by a reassignment
        # (a move copying to new replicas while the old ones are in sync is not a problem).
        int(len(st.isr) < len(st.replicas) - len(st.adding_replicas)),
        int(len(st.isr) < min_isr),
        int(bool(wanted) and st.leader >= 0 and st.leader != wanted[0]),
        int(bool(st.adding_replicas or st.removing_replicas)),
    )


def update_gauges(view: ClusterView) -> None:
    """Recompute the view-derived gauges (watch thread, after every batch of changes).

    A partition's flags are recomputed only when its state or its topic changed (by
    mod_revision): reading the protobuf fields of every partition on every batch cost ~20 ms
    at 5,000 partitions, and a topic creation delivers several batches."""
    offline = under = under_min = imbalance = moving = 0
    cache = _FLAGS.setdefault(view, {})
    seen: _Flags = {}
    missing: dict[int, int] = {}
    with view.lock:
        topics = {n: v for n, v in view.topics.items() if not v.value.deleting}
        live = view.nodes
        LIVE_NODES.set(len(live))
        for tp, v in view.partitions.items():
            t = topics.get(tp[0])
            if t is None or tp[1] >= t.value.partition_count:
                continue
            hit = cache.get(tp)
            if hit is not None and hit[0] == v.mod_revision and hit[1] == t.mod_revision:
                flags, replicas = hit[2], hit[3]
            else:
                flags, replicas = _flags(v.value, t.value), tuple(v.value.replicas)
            seen[tp] = (v.mod_revision, t.mod_revision, flags, replicas)
            for r in replicas:
                if r not in live:
                    missing[r] = missing.get(r, 0) + 1
            offline += flags[0]
            under += flags[1]
            under_min += flags[2]
            imbalance += flags[3]
            moving += flags[4]
    cache.clear()
    cache.update(seen)
    OFFLINE_PARTITIONS.set(offline)
    UNDER_REPLICATED.set(under)
    TOPICS.set(len(topics))
    PARTITIONS.set(sum(t.value.partition_count for t in topics.values()))
    UNDER_MIN_ISR.set(under_min)
    PREFERRED_IMBALANCE.set(imbalance)
    REASSIGNING.set(moving)
    _export_missing(missing)


def _export_missing(missing: dict[int, int]) -> None:
    """One series per storage node that holds replicas but is not registered. Why from the
    controller's view: Prometheus' ``up`` only covers targets it still discovers, and a
    storage pod that is deleted or stuck Pending drops out of the ServiceMonitor's endpoints,
    so no ``up == 0`` series exists to alert on."""
    for node in _MISSING - missing.keys():
        with contextlib.suppress(KeyError):
            MISSING_NODE_REPLICAS.remove(str(node))
    for node, count in missing.items():
        MISSING_NODE_REPLICAS.labels(str(node)).set(count)
    _MISSING.clear()
    _MISSING.update(missing)
