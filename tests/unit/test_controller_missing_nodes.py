"""strom_controller_missing_node_replicas from a cluster view fed by hand: the series the
StromNodeMissing alert reads when a storage node's pod is gone from Prometheus' targets."""

from __future__ import annotations

from prometheus_client import REGISTRY

from strom.api import metadata_pb2 as md
from strom.controller.metrics import update_gauges
from strom.metadata import ClusterView, Keys, WatchEvent, encode


class _FakeStore:
    def __init__(self) -> None:
        self.keys = Keys("unit")


def missing() -> dict[str, float]:
    return {
        s.labels["node"]: s.value
        for m in REGISTRY.collect()
        if m.name == "strom_controller_missing_node_replicas"
        for s in m.samples
    }


def test_nodes_holding_replicas_but_not_registered_are_reported_by_id() -> None:
    """A node that holds replicas and has no registration gets a series (its replica count),
    which goes away when it registers again; a node holding nothing is not missing."""
    view = ClusterView(_FakeStore())  # type: ignore[arg-type]
    keys = view.keys
    rev = 0

    def feed(*evs: tuple[str, object]) -> None:
        nonlocal rev
        rev += 1
        view._on_events(
            [WatchEvent(k, None if v is None else encode(v).encode(), rev) for k, v in evs],
            rev,
        )
        update_gauges(view)

    def node(i: int) -> tuple[str, md.NodeRegistration]:
        return keys.node(i), md.NodeRegistration(node_id=i, host="127.0.0.1", port=9000 + i)

    def state(*replicas: int) -> md.PartitionState:
        return md.PartitionState(
            replicas=list(replicas), leader=replicas[0], isr=list(replicas), topic_id="id-mn"
        )

    feed(
        node(1),
        node(2),
        node(4),  # holds no replica: never missing
        (keys.topic("mn"), md.TopicMetadata(name="mn", topic_id="id-mn", partition_count=3)),
        (keys.partition("mn", 0), state(1, 2)),
        (keys.partition("mn", 1), state(2, 3)),
        (keys.partition("mn", 2), state(3, 1)),
    )
    assert missing() == {"3": 2}
    feed(node(3))
    assert missing() == {}
    feed((keys.node(2), None))  # its lease expired: the pod is gone
    assert missing() == {"2": 2}
    feed((keys.node(4), None))
    assert missing() == {"2": 2}
