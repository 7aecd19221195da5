"""Assignment diffing: which replicas a node hosts, creates, updates and deletes."""

from __future__ import annotations

from strom.api import metadata_pb2 as md
from strom.log import LogConfig
from strom.storage.assignment import (
    desired_assignments,
    log_config,
    plan_changes,
    usable_configs,
)


def topic(name: str, tid: str, configs: dict[str, str] | None = None, deleting: bool = False):
    return md.TopicMetadata(name=name, topic_id=tid, configs=configs or {}, deleting=deleting)


def state(replicas: list[int], leader: int, epoch: int = 0, tid: str = "") -> md.PartitionState:
    return md.PartitionState(
        replicas=replicas, leader=leader, leader_epoch=epoch, isr=replicas, topic_id=tid
    )


def test_desired_is_every_partition_naming_this_node_of_a_live_topic() -> None:
    topics = {
        "a": topic("a", "ida"),
        "dying": topic("dying", "idd", deleting=True),
        "b": topic("b", "idb"),
    }
    parts = {
        ("a", 0): state([1, 2], 1, tid="ida"),
        ("a", 1): state([2, 3], 2, tid="ida"),
        ("dying", 0): state([1], 1, tid="idd"),
        ("b", 0): state([3, 1], 3, tid="old-b"),  # leftover of an earlier topic "b"
        ("orphan", 0): state([1], 1),  # no topic key
    }
    got = desired_assignments(1, topics, parts)
    assert list(got) == [("a", 0)]
    a = got[("a", 0)]
    assert (a.topic_id, a.state.leader) == ("ida", 1)


def test_plan_creates_updates_and_deletes() -> None:
    topics = {"a": topic("a", "ida", {"retention.ms": "1000"})}
    parts = {("a", 0): state([1], 1, tid="ida"), ("a", 1): state([1], 1, tid="ida")}
    desired = desired_assignments(1, topics, parts)
    plan = plan_changes(desired, {}, {}, set_aside_strays=True)
    assert [a.tp for a in plan.create] == [("a", 0), ("a", 1)] and not plan.delete

    installed = dict(desired)
    local = {tp: "ida" for tp in installed}
    assert not plan_changes(desired, installed, local, set_aside_strays=True)  # idempotent

    # Leader epoch bump on one partition, config change on the topic: updates only.
    parts2 = {**parts, ("a", 0): state([1], 1, epoch=1, tid="ida")}
    plan = plan_changes(
        desired_assignments(1, topics, parts2), installed, local, set_aside_strays=True
    )
    assert [a.tp for a in plan.update] == [("a", 0)] and not plan.create and not plan.delete
    topics2 = {"a": topic("a", "ida", {"retention.ms": "5"})}
    plan = plan_changes(
        desired_assignments(1, topics2, parts), installed, local, set_aside_strays=True
    )
    assert [a.tp for a in plan.update] == [("a", 0), ("a", 1)]

    # Partition key gone (topic deleted): its replica goes, even with set_aside_strays unset.
    plan = plan_changes(
        desired_assignments(1, topics, {("a", 1): parts[("a", 1)]}),
        installed,
        local,
        set_aside_strays=False,
    )
    assert plan.delete == [("a", 0)] and not plan.create


def test_strays_on_disk_wait_for_an_initialised_view_and_are_set_aside() -> None:
    """Strays are not deleted but set aside (renamed; an operator removes them): judging a
    log a stray depends on the view and the node's identity, and a wrong --node-id deleted
    every replica of a dir (found from outside)."""
    local = {("old", 0): "idx", ("old", 1): None}
    assert not plan_changes({}, {}, local, set_aside_strays=False)
    plan = plan_changes({}, {}, local, set_aside_strays=True)
    assert plan.strays == [("old", 0), ("old", 1)] and not plan.delete


def test_a_log_found_with_another_topic_id_is_set_aside_never_deleted() -> None:
    """Found from outside: one changed character in an RF=1 replica's partition.metadata
    made the next start delete the partition's only copy. A log found on disk whose topic
    id is not the assigned one is set aside (renamed, kept) and its partition created
    afresh, whether or not strays may be set aside yet (a rename costs nothing)."""
    topics = {"a": topic("a", "new-id")}
    parts = {("a", 0): state([1], 1, tid="new-id")}
    desired = desired_assignments(1, topics, parts)
    for set_aside_strays in (False, True):
        plan = plan_changes(desired, {}, {("a", 0): "old-id"}, set_aside_strays=set_aside_strays)
        assert plan.mismatched == [("a", 0)] and not plan.delete and not plan.strays
        assert [a.tp for a in plan.create] == [("a", 0)]
    # Unknown local id (no partition.metadata yet): adopted, neither deleted nor set aside.
    plan = plan_changes(desired, {}, {("a", 0): None}, set_aside_strays=True)
    assert not plan.delete and not plan.mismatched and [a.tp for a in plan.create] == [("a", 0)]


def test_a_topic_served_here_then_deleted_and_created_again_replaces_the_old_log() -> None:
    """The view's deletion and re-creation of a topic this process served arrived as one
    change: the old log is deleted (as a deleted topic's replica is), not set aside."""
    old = desired_assignments(1, {"a": topic("a", "old-id")}, {("a", 0): state([1], 1)})
    desired = desired_assignments(
        1, {"a": topic("a", "new-id")}, {("a", 0): state([1], 1, tid="new-id")}
    )
    plan = plan_changes(desired, old, {("a", 0): "old-id"}, set_aside_strays=True)
    assert plan.delete == [("a", 0)] and not plan.mismatched
    assert [a.tp for a in plan.create] == [("a", 0)]


def test_invalid_topic_configs_are_skipped_not_fatal() -> None:
    raw = {"retention.ms": "12", "segment.bytes": "tiny", "no.such.key": "1"}
    assert usable_configs(raw) == {"retention.ms": "12"}
    assert log_config(raw) == LogConfig(retention_ms=12)
