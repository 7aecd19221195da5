"""The coordinator's state gauges are counted when Prometheus scrapes
(strom.coordinator.metrics.count_at_scrape), from the live shard tables: what a scrape shows
follows the shards without any write updating it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from strom.coordinator import metrics
from strom.coordinator.group import GroupState
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
