"""The cluster view's per-topic index of partition states, and what is built on it: one
topic's partitions without a scan of the cluster's (Metadata, the node's narrow reconcile)
and the node's offline-partitions gauge, recounted only for the topics a change touched."""

from __future__ import annotations

import random

from strom.api import metadata_pb2 as md
from strom.metadata import ClusterView, Keys, WatchEvent, encode
from strom.storage import metrics


class _FakeStore:
    def __init__(self) -> None:
        self.keys = Keys("unit")


def _view() -> ClusterView:
    return ClusterView(_FakeStore())  # type: ignore[arg-type]


def _put(view: ClusterView, key: str, msg: object, rev: int) -> list[WatchEvent]:
    evs = [WatchEvent(key, encode(msg).encode(), rev)]  # type: ignore[arg-type]
    view._on_events(evs, rev)
    return evs


def _delete(view: ClusterView, key: str, rev: int) -> list[WatchEvent]:
    evs = [WatchEvent(key, None, rev)]
    view._on_events(evs, rev)
    return evs


def _full_offline(view: ClusterView) -> int:
    """The gauge as the node computed it before: a scan of every partition."""
    topics = {n: v.value for n, v in view.topics.items() if not v.value.deleting}
    return sum(
        1
        for (name, p), v in view.partitions.items()
        if (m := topics.get(name)) is not None and p < m.partition_count and v.value.leader < 0
    )


def test_the_index_follows_puts_and_deletes() -> None:
    view = _view()
    k = view.keys
    _put(view, k.partition("a", 0), md.PartitionState(leader=1), 1)
    _put(view, k.partition("a", 1), md.PartitionState(leader=2), 2)
    _put(view, k.partition("b", 0), md.PartitionState(leader=3), 3)
    assert {p: v.value.leader for p, v in view.partitions_of("a").items()} == {0: 1, 1: 2}
    _put(view, k.partition("a", 1), md.PartitionState(leader=5), 4)
    assert view.partitions_of("a")[1].value.leader == 5
    _delete(view, k.partition("a", 0), 5)
    _delete(view, k.partition("a", 1), 6)
    assert view.partitions_of("a") == {} and "a" not in view._by_topic
    assert set(view.partitions_of("b")) == {0}


def test_the_offline_gauge_recounts_only_what_changed_and_matches_a_full_count() -> None:
    rng = random.Random(1127)
    view = _view()
    k = view.keys
    gauge = metrics.OfflinePartitions(view)
    view.add_listener(gauge.on_events)
    for rev in range(1, 301):
        name = f"t{rng.randrange(5)}"
        roll = rng.random()
        if roll < 0.15:
            _delete(view, k.topic(name), rev)
        elif roll < 0.35:
            count = rng.randrange(1, 4)
            meta = md.TopicMetadata(name=name, partition_count=count, deleting=rng.random() < 0.1)
            _put(view, k.topic(name), meta, rev)
        elif roll < 0.45:
            _delete(view, k.partition(name, rng.randrange(4)), rev)
        elif roll < 0.5:
            _put(view, k.cluster, md.ClusterInfo(cluster_id="unit"), rev)  # a full recount
        else:
            state = md.PartitionState(leader=rng.choice([-1, 1, 2]))
            _put(view, k.partition(name, rng.randrange(4)), state, rev)
        assert metrics.OFFLINE_PARTITIONS._value.get() == _full_offline(view)
