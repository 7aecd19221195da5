"""Which per-partition and per-topic series a storage node exports, as its replicas change.

The registry is the process-wide default one, so each test uses topic names of its own.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from strom.api import metadata_pb2 as md
from strom.metadata import encode
from strom.record import encode_batch
from strom.storage import metrics
from strom.storage.disk_errors import note_append_failure
from tests.unit.test_storage_servicer import (
    Harness,
    WatchEvent,
    fetch_req,
    leader_state,
    produce_req,
    with_harness,
)


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def lso_lag(topic: str, partition: int = 0) -> float | None:
    return sample("strom_storage_last_stable_offset_lag", topic=topic, partition=str(partition))


def moved_away(h: Harness, topic: str, partition: int) -> WatchEvent:
    """A partition state that no longer lists this node (1) as a replica."""
    state = md.PartitionState(
        replicas=[2], leader=2, leader_epoch=2, isr=[2], topic_id=f"id-{topic}"
    )
    return WatchEvent(h.keys.partition(topic, partition), encode(state).encode(), 0)


def delete_topic(h: Harness, name: str, partitions: int) -> None:
    h.events(
        [WatchEvent(h.keys.topic(name), None, 0)]
        + [WatchEvent(h.keys.partition(name, p), None, 0) for p in range(partitions)]
    )


def test_the_last_stable_offset_lag_is_exported_exactly_while_leading(tmp_path: Path) -> None:
    """ "Per partition this node leads": a new leader has the series before its high
    watermark ever moves, and a former leader drops it instead of freezing its last value."""

    async def body(h: Harness) -> None:
        h.topic("lso-a", {0: leader_state(), 1: leader_state(leader=2)})
        await h.settle()
        assert lso_lag("lso-a", 0) == 0  # leading, the high watermark never moved
        assert lso_lag("lso-a", 1) is None  # a follower
        # The leader's high watermark moves: the series follows it.
        await h.servicer.Produce(produce_req({("lso-a", 0): encode_batch([b"v"])}), None)
        assert lso_lag("lso-a", 0) == 0

        # Leadership moves: partition 0 to node 2, partition 1 to this node.
        h.topic(
            "lso-a",
            {0: leader_state(epoch=1, leader=2, isr=[2, 1]), 1: leader_state(epoch=1)},
        )
        await h.settle()
        assert lso_lag("lso-a", 0) is None
        assert lso_lag("lso-a", 1) == 0

        delete_topic(h, "lso-a", 2)
        await h.settle()
        assert lso_lag("lso-a", 1) is None

    with_harness(tmp_path, body)


def test_a_deleted_topic_s_counters_are_dropped_and_a_re_created_one_starts_at_zero(
    tmp_path: Path,
) -> None:
    """Per-topic counters disappear once the node hosts none of the topic's replicas, so
    dashboards stop listing deleted topics and a re-created topic does not add to the old
    one's totals; a topic still partly hosted keeps them."""

    def counters(topic: str) -> list[float | None]:
        return [
            sample(f"strom_storage_{name}_total", topic=topic)
            for name in ("bytes_in", "bytes_out", "records_in", "records_out")
        ]

    async def body(h: Harness) -> None:
        h.topic("cnt-a", {0: leader_state(), 1: leader_state()})
        h.topic("cnt-b", {0: leader_state()})
        await h.settle()
        for t, p in (("cnt-a", 0), ("cnt-a", 1), ("cnt-b", 0)):
            await h.servicer.Produce(produce_req({(t, p): encode_batch([b"v"])}), None)
        await h.servicer.Fetch(fetch_req("cnt-a", 0, 0), None)
        assert all(v is not None and v > 0 for v in counters("cnt-a"))

        # Partition 1 moves away: partition 0 is still hosted, the totals stay.
        h.events([moved_away(h, "cnt-a", 1)])
        await h.settle()
        assert set(h.manager.partitions) >= {("cnt-a", 0)}
        assert ("cnt-a", 1) not in h.manager.partitions
        assert counters("cnt-a")[2] == 2

        delete_topic(h, "cnt-a", 2)
        await h.settle()
        assert counters("cnt-a") == [None] * 4
        assert sample("strom_storage_records_in_total", topic="cnt-b") == 1  # untouched

        h.topic("cnt-a", {0: leader_state()})
        await h.settle()
        await h.servicer.Produce(produce_req({("cnt-a", 0): encode_batch([b"v"])}), None)
        assert counters("cnt-a")[2] == 1

    with_harness(tmp_path, body)


def test_per_client_series_are_bounded_and_idle_ones_make_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found from outside: a series per client id, kept as long as the node ran (one per
    RecordService Subscribe call). At most MAX_CLIENT_IDS: past it new ids count under
    "other", until ids unused for CLIENT_IDLE_S are dropped to make room."""
    monkeypatch.setattr(metrics, "MAX_CLIENT_IDS", 2)
    registry = CollectorRegistry()
    counter = Counter("t_client_bytes", "test", ["client_id"], registry=registry)
    children = metrics._ClientChildren(counter)

    def value(client_id: str) -> float | None:
        return registry.get_sample_value("t_client_bytes_total", {"client_id": client_id})

    children.child("a", 0.0).inc(1)
    children.child("b", 10.0).inc(2)
    children.child("c", 20.0).inc(4)  # full, and nothing idle yet
    children.child("d", 30.0).inc(8)  # (checked at most once a minute)
    assert [value(c) for c in ("a", "b", "c", "d", "other")] == [1, 2, None, None, 12]
    children.child("b", 3000.0).inc(16)  # in use: kept
    children.child("e", metrics.CLIENT_IDLE_S + 5.0).inc(32)  # "a" idle for an hour: dropped
    assert [value(c) for c in ("a", "b", "e", "other")] == [None, 18, 32, 12]
    children.child("a", metrics.CLIENT_IDLE_S + 100.0).inc(64)  # full again: folded
    assert value("a") is None and value("other") == 76


def test_a_removed_partition_s_append_failures_go_with_it() -> None:
    """Found from outside: strom_storage_append_failures_total outlived its partition (the
    other per-partition series went), for whichever errno it was counted under."""
    part = metrics.PartitionMetrics("af-a", 0)
    other = metrics.PartitionMetrics("af-a", 1)
    for code in (errno.ENOSPC, errno.EIO, errno.ENOSPC):
        note_append_failure("producing", "af-a", 0, OSError(code, os.strerror(code)))
    note_append_failure("producing", "af-a", 1, OSError(errno.EROFS, "read-only"))

    def failures(partition: int, errno_name: str) -> float | None:
        name = "strom_storage_append_failures_total"
        return sample(name, topic="af-a", partition=str(partition), errno=errno_name)

    assert [failures(0, "ENOSPC"), failures(0, "EIO")] == [2, 1]
    part.remove()
    assert [failures(0, "ENOSPC"), failures(0, "EIO")] == [None, None]
    assert failures(1, "EROFS") == 1  # another partition's: kept
    other.remove()
    assert failures(1, "EROFS") is None
