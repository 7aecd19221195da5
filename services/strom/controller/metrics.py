"""Prometheus metrics of the controller that the service module does not define itself:
RPC latency by result, and the partition-health gauges computed from the cluster view.

Every controller (active or standby) follows the whole cluster view, so every controller
reports the cluster-wide gauges; dashboards and alerts take ``max()`` over them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Gauge, Histogram

from strom.api import controller_pb2_grpc
from strom.controller import leadership
from strom.log.config import CONFIG_KEYS
from strom.service.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from strom.metadata import ClusterView

#: Every RPC the controller serves (the generated servicer's methods).
RPCS = tuple(
    name for name in vars(controller_pb2_grpc.ControllerServiceServicer) if not name.startswith("_")
)

REQUEST_LATENCY = Histogram(
    "strom_controller_request_latency_seconds",
    "Time to answer a ControllerService RPC, by RPC and result (the whole-request error, else "
    "the first item's error; NONE = success)",
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
#: min.insync.replicas of a topic that does not override it.
DEFAULT_MIN_ISR = int(CONFIG_KEYS["min.insync.replicas"].default)


def update_gauges(view: ClusterView) -> None:
    """Recompute the view-derived gauges (watch thread, after every batch of changes)."""
    under_min = imbalance = 0
    with view.lock:
        topics = {n: v.value for n, v in view.topics.items() if not v.value.deleting}
        for (name, p), v in view.partitions.items():
            meta = topics.get(name)
            if meta is None or p >= meta.partition_count:
                continue
            st = v.value
            try:
                min_isr = int(meta.configs.get("min.insync.replicas", DEFAULT_MIN_ISR))
            except ValueError:
                min_isr = DEFAULT_MIN_ISR
            under_min += len(st.isr) < min_isr
            wanted = leadership.targets(st)
            imbalance += bool(wanted) and st.leader >= 0 and st.leader != wanted[0]
    UNDER_MIN_ISR.set(under_min)
    PREFERRED_IMBALANCE.set(imbalance)
