"""The coordinator's state gauges are counted when Prometheus scrapes
(strom.coordinator.metrics.count_at_scrape), from the live shard tables: what a scrape shows
follows the shards without any write updating it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from strom.coordinator import metrics
from strom.coordinator.group import ConsumerGroup, GroupConfig, GroupState
from strom.coordinator.offsets_log import OffsetAndMetadata
from strom.coordinator.timers import Timers
from strom.coordinator.txn_state import TxnState


@dataclass
class _Group:
    state: GroupState
    members: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Txn:
    state: TxnState


@dataclass
class _Shard:
    loaded: bool = True
    groups: dict[str, Any] = field(default_factory=dict)
    transactions: dict[str, Any] = field(default_factory=dict)


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_gauges_follow_the_shard_tables_at_each_scrape() -> None:
    groups: dict[int, Any] = {}
    txns: dict[int, Any] = {}
    metrics.count_at_scrape(groups, txns)
    assert _value("strom_coordinator_shards_owned") == 0
    assert _value("strom_coordinator_groups", state="stable") == 0

    groups[0] = _Shard(
        groups={
            "a": _Group(GroupState.STABLE, {"m1": 1, "m2": 2}),
            "b": _Group(GroupState.EMPTY),
        }
    )
    groups[1] = _Shard(groups={"c": _Group(GroupState.STABLE, {"m3": 3})})
    groups[2] = _Shard(loaded=False, groups={"d": _Group(GroupState.STABLE, {"m4": 4})})
    txns[0] = _Shard(transactions={"t1": _Txn(TxnState.ONGOING), "t2": _Txn(TxnState.EMPTY)})

    assert _value("strom_coordinator_shards_owned") == 2  # shard 2 is still loading
    assert _value("strom_coordinator_members") == 3
    assert _value("strom_coordinator_groups", state="stable") == 2
    assert _value("strom_coordinator_groups", state="empty") == 1
    assert _value("strom_coordinator_transactions", state="ongoing") == 1
    assert _value("strom_coordinator_transactions", state="empty") == 1

    del groups[1]
    groups[0].groups["a"].state = GroupState.RECONCILING
    assert _value("strom_coordinator_shards_owned") == 1
    assert _value("strom_coordinator_members") == 2
    assert _value("strom_coordinator_groups", state="stable") == 0
    assert _value("strom_coordinator_groups", state="reconciling") == 1


class _LagTimers(Timers):
    """The lag refresh of the timer loop over a real group, with the cluster's answers
    (live topics, ListOffsets) given by the test."""

    def __init__(self, group: ConsumerGroup) -> None:
        self.shards = {0: _Shard(groups={group.group_id: group})}  # type: ignore[dict-item]
        self._lag_labels = set()
        self._past_end_labels = set()
        self.ids = {"lag-t": "id-1"}
        self.ends: dict[tuple[str, int], int] = {}

    def _topic_ids(self) -> dict[str, str]:
        return self.ids

    async def _end_offsets(self, parts: Any) -> dict[tuple[str, int], int]:
        return {tp: end for tp, end in self.ends.items() if tp in set(parts)}


def test_lag_keeps_its_last_value_while_the_end_offset_is_unknown() -> None:
    """Found from outside: a failed ListOffsets removed the lag series, so lag alerts went
    quiet exactly during leader trouble. A deleted topic's series does go."""
    group = ConsumerGroup("lag-g", config=GroupConfig(), now_ms=0)
    group.commit_offsets("", -1, {("lag-t", 0): OffsetAndMetadata(5, topic_id="id-1")}, now_ms=0)
    timers = _LagTimers(group)
    labels = {"group": "lag-g", "topic": "lag-t", "partition": "0"}
    timers.ends = {("lag-t", 0): 12}
    asyncio.run(timers._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **labels) == 7
    timers.ends = {}  # the leader did not answer
    asyncio.run(timers._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **labels) == 7
    timers.ids = {}  # the topic was deleted
    asyncio.run(timers._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **labels) is None


def test_a_committed_offset_past_the_log_end_is_flagged_not_hidden_as_zero_lag() -> None:
    """Found from outside: a committed offset past the log end (records deleted, a reset past
    the end, the topic created again) showed as lag 0, like a caught-up group, though its
    next fetch gets OFFSET_OUT_OF_RANGE and resets. The lag gauge stays at 0 (it is summed
    over partitions) and strom_coordinator_consumer_offset_past_end says how far past."""
    group = ConsumerGroup("past-g", config=GroupConfig(), now_ms=0)
    group.commit_offsets("", -1, {("lag-t", 0): OffsetAndMetadata(9, topic_id="id-1")}, now_ms=0)
    timers = _LagTimers(group)
    labels = {"group": "past-g", "topic": "lag-t", "partition": "0"}
    timers.ends = {("lag-t", 0): 4}
    asyncio.run(timers._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **labels) == 0
    assert _value("strom_coordinator_consumer_offset_past_end", **labels) == 5
    timers.ends = {}  # no answer: the last value stays, as the lag's does
    asyncio.run(timers._refresh_lag())
    assert _value("strom_coordinator_consumer_offset_past_end", **labels) == 5
    timers.ends = {("lag-t", 0): 15}  # the log grew past it: an ordinary lag again
    asyncio.run(timers._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **labels) == 6
    assert _value("strom_coordinator_consumer_offset_past_end", **labels) is None
    timers.ends = {("lag-t", 0): 1}
    asyncio.run(timers._refresh_lag())
    timers._forget_lag(["past-g"])  # the shard was unloaded: both series go
    assert _value("strom_coordinator_consumer_lag", **labels) is None
    assert _value("strom_coordinator_consumer_offset_past_end", **labels) is None


def _service_with_lag(end: int) -> tuple[Any, Any]:
    """A real coordinator service (not started) owning one loaded group shard whose group
    committed offset 5 of ``lag-t``/0, with ListOffsets answering ``end``."""
    from strom.coordinator.service import CoordinatorService
    from strom.coordinator.shards import Shard

    svc = CoordinatorService(
        etcd="127.0.0.1:1", cluster="c", coordinator_id=1, advertise_host="h", advertise_port=1
    )
    group = ConsumerGroup("unload-g", config=GroupConfig(), now_ms=0)
    group.commit_offsets("", -1, {("lag-t", 0): OffsetAndMetadata(5, topic_id="id-1")}, now_ms=0)
    shard = Shard(0, svc.group_kind, loaded=True, groups={group.group_id: group})
    svc.group_kind.shards[0] = shard
    svc._topic_ids = lambda: {"lag-t": "id-1"}

    async def ends(parts: Any) -> dict[tuple[str, int], int]:
        return {("lag-t", 0): end}

    svc._end_offsets = ends
    return svc, shard


_UNLOAD_LABELS = {"group": "unload-g", "topic": "lag-t", "partition": "0"}


def test_an_unloaded_shards_lag_and_shard_count_go_at_once() -> None:
    """Found from outside: a coordinator that lost its shards kept exporting their lag until
    its next lag refresh (10 s), while the new owner exported it too, so sums over the
    coordinators (the lag alert, the dashboard) counted those groups twice."""
    svc, shard = _service_with_lag(12)
    asyncio.run(svc._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **_UNLOAD_LABELS) == 7
    assert _value("strom_coordinator_shards_owned") == 1
    svc._unload(shard)  # lost, handed over, or stopping: every path unloads
    assert _value("strom_coordinator_consumer_lag", **_UNLOAD_LABELS) is None
    assert _value("strom_coordinator_shards_owned") == 0


def test_a_shard_unloaded_during_the_lag_refresh_is_not_exported_again() -> None:
    svc, shard = _service_with_lag(12)

    async def unload_meanwhile(parts: Any) -> dict[tuple[str, int], int]:
        svc._unload(shard)  # the shard is lost while ListOffsets is in flight
        return {("lag-t", 0): 12}

    svc._end_offsets = unload_meanwhile
    asyncio.run(svc._refresh_lag())
    assert _value("strom_coordinator_consumer_lag", **_UNLOAD_LABELS) is None


def test_the_clusters_group_shard_count_is_exported_beside_the_shards_owned() -> None:
    """StromCoordinatorShardsUnowned compares the two: shards nobody serves."""
    groups: dict[int, Any] = {0: _Shard(), 1: _Shard(loaded=False)}
    total = [0]
    metrics.count_at_scrape(groups, {}, lambda: total[0])
    assert _value("strom_coordinator_group_shards") == 0  # __consumer_offsets not created yet
    total[0] = 8
    assert _value("strom_coordinator_group_shards") == 8
    assert _value("strom_coordinator_shards_owned") == 1


def test_a_coordinator_before_its_view_started_reports_no_group_shards() -> None:
    svc, _ = _service_with_lag(12)
    assert svc.view is None
    assert _value("strom_coordinator_group_shards") == 0


def test_nothing_counts_as_owned_once_the_lease_has_surely_expired() -> None:
    """Found from outside: a coordinator back from a pause (or cut off from etcd) still
    counted the shards whose keys expired with its lease while others had taken them: the
    sum over coordinators read 10 of 8 shards owned."""
    groups: dict[int, Any] = {0: _Shard(groups={"a": _Group(GroupState.STABLE, {"m": 1})})}
    live = [True]
    metrics.count_at_scrape(groups, {}, lambda: 8, lambda: live[0])
    assert _value("strom_coordinator_shards_owned") == 1
    assert _value("strom_coordinator_members") == 1
    live[0] = False  # no refresh for longer than the TTL: etcd has ended the lease
    assert _value("strom_coordinator_shards_owned") == 0
    assert _value("strom_coordinator_members") == 0
    assert _value("strom_coordinator_groups", state="stable") == 0
    assert _value("strom_coordinator_group_shards") == 8


def test_a_coordinator_follows_its_keepers_view_of_the_lease() -> None:
    svc, _ = _service_with_lag(12)

    class _Keeper:
        expired = False

        def surely_expired(self) -> bool:
            return self.expired

    keeper = _Keeper()
    svc._keepalive = keeper
    assert _value("strom_coordinator_shards_owned") == 1
    keeper.expired = True
    assert _value("strom_coordinator_shards_owned") == 0
