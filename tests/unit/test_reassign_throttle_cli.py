"""What ``strom topics reassign --plan --verify/--cancel`` decides about the replication
throttle and preferred elections (strom.cli.reassign), against a fake Admin that keeps
configs and reassignments in memory: found by an outside review, a refused cancel
unthrottled a move still copying, a superseded plan kept its throttle for ever, and
--verify elected leaders without --preferred."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from strom.cli import reassign
from strom.cli import reassignplan as rp
from strom.client.admin import ConfigEntry, ConfigSource, ElectionResult, PartitionInfo
from strom.client.types import TopicPartition
from strom.errors import InvalidReplicaAssignmentError, partial_result_error

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)


class FakeTopic:
    """A topic's partitions (name only: :func:`reassign._described` reads ``partitions``)."""

    def __init__(self, partitions: list[PartitionInfo]) -> None:
        self.partitions = partitions


class FakeAdmin:
    """The Admin calls strom.cli.reassign makes, over in-memory state. ``refuse`` names the
    partitions whose cancel the controller refuses (they stay moving)."""

    def __init__(self, parts: dict[TopicPartition, PartitionInfo]) -> None:
        self.parts = dict(parts)
        self.topic_configs: dict[str, dict[str, str]] = {}
        self.node_configs: dict[str, str] = {}
        self.refuse: set[TopicPartition] = set()
        self.elected: list[TopicPartition] = []
        self.started: dict[TopicPartition, list[int]] = {}

    def describe_cluster(self) -> SimpleNamespace:
        ids = {r for p in self.parts.values() for r in p.replicas} | {4, 5}
        return SimpleNamespace(nodes=[SimpleNamespace(node_id=i) for i in sorted(ids)])

    def list_topics(self, internal: bool = False) -> list[str]:
        return sorted({tp.topic for tp in self.parts})

    def describe_topics(self, names: Iterable[str]) -> dict[str, FakeTopic]:
        return {t: FakeTopic([p for tp, p in self.parts.items() if tp.topic == t]) for t in names}

    def describe_configs(self, topic: str, names: Iterable[str]) -> dict[str, ConfigEntry]:
        have = self.topic_configs.get(topic, {})
        return {
            n: ConfigEntry(n, have[n], ConfigSource.TOPIC)
            if n in have
            else ConfigEntry(n, "", ConfigSource.DEFAULT)
            for n in names
        }

    def alter_configs(
        self, topic: str, set: Mapping[str, str] | None = None, delete: Iterable[str] = ()
    ) -> None:
        have = self.topic_configs.setdefault(topic, {})
        have.update(set or {})
        for n in delete:
            have.pop(n, None)

    def describe_node_configs(self) -> dict[str, ConfigEntry]:
        return {
            n: ConfigEntry(n, self.node_configs.get(n), ConfigSource.DYNAMIC_NODE)
            for n in sorted({rp.LEADER_RATE, rp.FOLLOWER_RATE, "log.level", *self.node_configs})
        }

    def alter_node_configs(
        self, set: Mapping[str, Any] | None = None, delete: Iterable[str] = ()
    ) -> None:
        self.node_configs.update({k: str(v) for k, v in (set or {}).items()})
        for n in delete:
            self.node_configs.pop(n, None)

    def list_partition_reassignments(self) -> dict[TopicPartition, object]:
        return {tp: p for tp, p in self.parts.items() if p.reassigning}

    def alter_partition_reassignments(self, moves: Mapping[TopicPartition, Any]) -> None:
        errors = {}
        for tp, target in moves.items():
            if target is not None:
                self.started[tp] = list(target)
                continue
            if tp in self.refuse:
                errors[tp] = InvalidReplicaAssignmentError(f"{tp.topic}-{tp.partition}: no")
                continue
            p = self.parts[tp]
            kept = tuple(r for r in p.replicas if r not in p.adding_replicas)
            self.parts[tp] = PartitionInfo(tp.partition, p.leader, 1, kept, kept)
        if errors:
            first = next(iter(errors.values()))
            raise partial_result_error(first, "refused", {}, errors)

    def elect_leaders(self, tps: list[TopicPartition]) -> dict[TopicPartition, ElectionResult]:
        self.elected.extend(tps)
        return {tp: ElectionResult(self.parts[tp].replicas[0], 2, None) for tp in tps}


def _moving(partition: int, target: tuple[int, ...], removing: tuple[int, ...]) -> PartitionInfo:
    """A partition moving from ``removing`` (+ kept ones) to ``target``, adding node 9."""
    replicas = (*target, *removing)
    return PartitionInfo(partition, removing[0], 1, replicas, replicas[1:], (), (9,), removing)


def _done(partition: int, replicas: tuple[int, ...], leader: int) -> PartitionInfo:
    return PartitionInfo(partition, leader, 1, replicas, replicas)


def _throttled(admin: FakeAdmin) -> None:
    admin.topic_configs["a"] = {
        rp.LEADER_THROTTLED: "0:9,0:1,0:2,1:9,1:1,1:3",
        rp.FOLLOWER_THROTTLED: "0:9,1:9",
    }
    admin.node_configs = {rp.LEADER_RATE: "1000", rp.FOLLOWER_RATE: "1000"}


def test_a_refused_cancel_keeps_that_moves_throttle_and_the_rate() -> None:
    admin = FakeAdmin({A0: _moving(0, (9, 1), (2,)), A1: _moving(1, (9, 1), (3,))})
    _throttled(admin)
    admin.refuse = {A1}
    out = io.StringIO()
    plan = {A0: [9, 1], A1: [9, 1]}
    assert reassign._cancel(admin, plan, out) == 1  # type: ignore[arg-type]
    assert admin.topic_configs["a"] == {
        rp.LEADER_THROTTLED: "1:9,1:1,1:3",
        rp.FOLLOWER_THROTTLED: "1:9",
    }
    assert admin.node_configs == {rp.LEADER_RATE: "1000", rp.FOLLOWER_RATE: "1000"}
    assert "Kept the throttled replicas of a-1" in out.getvalue()


def test_a_cancel_of_every_move_removes_the_whole_throttle() -> None:
    admin = FakeAdmin({A0: _moving(0, (9, 1), (2,)), A1: _moving(1, (9, 1), (3,))})
    _throttled(admin)
    assert reassign._cancel(admin, {A0: [9, 1], A1: [9, 1]}, io.StringIO()) == 0  # type: ignore[arg-type]
    assert admin.topic_configs["a"] == {}
    assert admin.node_configs == {}


def test_removing_the_throttle_keeps_the_dynamic_log_levels() -> None:
    """The rates share the nodes' dynamic configs with the log levels: a cancel that removes
    the throttle must not reset an operator's log.level."""
    admin = FakeAdmin({A0: _moving(0, (9, 1), (2,))})
    _throttled(admin)
    admin.node_configs.update({"log.level": "debug", "log.level.strom.storage": "warning"})
    assert reassign._cancel(admin, {A0: [9, 1]}, io.StringIO()) == 0  # type: ignore[arg-type]
    assert admin.node_configs == {"log.level": "debug", "log.level.strom.storage": "warning"}


def test_a_cancel_with_preserve_throttles_keeps_them_and_says_how_to_remove_them() -> None:
    admin = FakeAdmin({A0: _moving(0, (9, 1), (2,))})
    _throttled(admin)
    out = io.StringIO()
    assert reassign._cancel(admin, {A0: [9, 1]}, out, unthrottle=False) == 0  # type: ignore[arg-type]
    assert admin.node_configs and admin.topic_configs["a"]
    assert "strom cluster configs --delete" in out.getvalue()


def test_verify_removes_the_throttle_once_nothing_is_in_progress_even_if_not_matching() -> None:
    # a-0 is done; a-1 was moved elsewhere since (another plan, already finished).
    admin = FakeAdmin({A0: _done(0, (9, 1), 9), A1: _done(1, (4, 1), 4)})
    _throttled(admin)
    out = io.StringIO()
    assert reassign._verify(admin, {A0: [9, 1], A1: [9, 1]}, False, out) == 1  # type: ignore[arg-type]
    assert "1 not matching" in out.getvalue()
    assert admin.topic_configs["a"] == {}
    assert admin.node_configs == {}


def test_verify_keeps_the_throttle_of_a_partition_another_move_runs_and_says_so() -> None:
    admin = FakeAdmin({A0: _done(0, (9, 1), 9), A1: _moving(1, (4, 1), (3,))})
    _throttled(admin)
    out = io.StringIO()
    reassign._verify(admin, {A0: [9, 1], A1: [9, 1]}, False, out)  # type: ignore[arg-type]
    assert admin.topic_configs["a"] == {
        rp.LEADER_THROTTLED: "1:9,1:1,1:3",
        rp.FOLLOWER_THROTTLED: "1:9",
    }
    assert admin.node_configs  # a reassignment is still in progress
    assert "Kept the throttled replicas of a-1" in out.getvalue()
    assert "Kept the replication throttle rate" in out.getvalue()


def test_verify_says_why_and_how_when_the_throttle_is_kept() -> None:
    admin = FakeAdmin({A0: _done(0, (9, 1), 9), A1: _moving(1, (9, 1), (3,))})
    _throttled(admin)
    out = io.StringIO()
    reassign._verify(admin, {A0: [9, 1], A1: [9, 1]}, False, out)  # type: ignore[arg-type]
    assert admin.node_configs and admin.topic_configs["a"]
    assert "Kept the replication throttle: 1 partition(s) of the plan still in progress" in (
        out.getvalue()
    )
    out = io.StringIO()
    admin.parts[A1] = _done(1, (9, 1), 9)
    reassign._verify(admin, {A0: [9, 1], A1: [9, 1]}, False, out, unthrottle=False)  # type: ignore[arg-type]
    assert admin.node_configs and admin.topic_configs["a"]
    assert "--preserve-throttles" in out.getvalue()
    assert "strom cluster configs --delete" in out.getvalue()


def test_verify_elects_preferred_leaders_only_with_preferred() -> None:
    admin = FakeAdmin({A0: _done(0, (9, 1), 1)})
    assert reassign._verify(admin, {A0: [9, 1]}, False, io.StringIO()) == 0  # type: ignore[arg-type]
    assert admin.elected == []
    out = io.StringIO()
    assert reassign._verify(admin, {A0: [9, 1]}, True, out) == 0  # type: ignore[arg-type]
    assert admin.elected == [A0]
    assert "a-0: leader 9 (preferred)" in out.getvalue()


def test_the_rollback_plan_of_a_move_in_progress_keeps_the_original_order() -> None:
    # a-0 was [3,2,1] (3 its preferred leader), moving to [9,1]: replicas are the target's
    # order first, [9,1,3,2]; the rollback must give back [3,2,1], not [1,3,2].
    moving = PartitionInfo(
        0, 3, 1, (9, 1, 3, 2), (1, 3, 2), (), (9,), (3, 2), original_replicas=(3, 2, 1)
    )
    admin = FakeAdmin({A0: moving, A1: _done(1, (2, 1), 2)})
    out = io.StringIO()
    plan = {A0: [4, 5], A1: [4, 5]}
    assert reassign._execute(admin, plan, out, None) == 0  # type: ignore[arg-type]
    text = out.getvalue()
    rollback = json.loads(text[text.index('{"version"') : text.index("\n]}") + 3])
    assert [(e["partition"], e["replicas"]) for e in rollback["partitions"]] == [
        (0, [3, 2, 1]),
        (1, [2, 1]),
    ]
    assert admin.started == plan
