"""Empty groups with nothing committed are deleted (DESIGN §7): real etcd, controller,
storage node and coordinator processes, the coordinator started with a short
``--empty-group-retention-ms``.

Found from outside (a 50-minute soak with churn): every consumer that closed without
committing, and every RecordService Subscribe with a group id, left an EMPTY group that
``strom groups list`` showed, and the coordinator kept, for good (922 of 924 groups).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from strom.client.admin import Admin
from strom.client.consumer import Consumer
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration

RETENTION_MS = "1500"
FLAG = "--empty-group-retention-ms"
FAST = ["--group-heartbeat-interval-ms", "200", "--offsets-partitions", "2"]


def listed(cluster: LocalCluster, complete: bool = True) -> dict[str, str]:
    """``strom groups list --json``: group id -> state (``complete=False``: what the shards
    that answered list, while some are still loading)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "strom.cli.main",
            "groups",
            "list",
            "--json",
            "-b",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert proc.returncode == 0 or (not complete and proc.returncode == 2), proc.stderr
    return {row["group"]: row["state"] for row in json.loads(proc.stdout)}


def admin_listed(cluster: LocalCluster) -> set[str]:
    with Admin(cluster.bootstrap) as admin:
        return {g.group_id for g in admin.list_groups()}


def join_and_leave(cluster: LocalCluster, group: str, topic: str, commit: int | None) -> None:
    """A consumer of ``group`` that gets its assignment, commits ``commit`` (None: nothing)
    and closes, leaving the group EMPTY."""
    consumer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.subscribe([topic])
        tp = TopicPartition(topic, 0)

        def assigned() -> bool:
            consumer.poll(100)
            return tp in consumer.assignment()

        wait_for(assigned, timeout=30, what=f"{group}'s assignment")
        # While it is a member the group is listed (so its disappearing below is the cleanup).
        assert group in listed(cluster)
        if commit is not None:
            consumer.commit({tp: OffsetAndMetadata(commit)})
    finally:
        consumer.close()


def test_an_empty_group_without_offsets_is_deleted_durably_and_one_with_offsets_stays(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=[*FAST, FLAG, RETENTION_MS],
    )
    cluster.wait_coordinators_ready()
    create_topic(cluster, "cleanup", 1)
    join_and_leave(cluster, "g-nocommit", "cleanup", None)
    join_and_leave(cluster, "g-committed", "cleanup", 3)

    wait_for(
        lambda: "g-nocommit" not in listed(cluster),
        timeout=30,
        what="the empty group without offsets deleted",
    )
    assert listed(cluster)["g-committed"] == "Empty"
    assert admin_listed(cluster) == {"g-committed"}

    # A reload replays the shard's log: the deletion is in it (tombstones), so the group does
    # not come back. Restarted with a long retention, so that only a missing tombstone could
    # show it again.
    coord = cluster.coordinators[0]
    coord.argv[coord.argv.index(FLAG) + 1] = "3600000"
    cluster.restart(coord)
    cluster.wait_coordinators_ready()
    wait_for(
        lambda: "g-committed" in listed(cluster, False), timeout=30, what="the shards reloaded"
    )
    assert "g-nocommit" not in listed(cluster)
    again = Consumer(cluster.bootstrap, group_id="g-committed", enable_auto_commit=False)
    try:
        tp = TopicPartition("cleanup", 0)
        assert again.committed(tp) == OffsetAndMetadata(3)
    finally:
        again.close()


def test_the_offsets_of_a_group_empty_for_the_offsets_retention_expire_with_it(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Kafka's offsets.retention.minutes (KIP-211): a group that stayed empty that long is
    deleted with its committed offsets (found from outside: every group that ever committed
    was kept for good); one with a member keeps its offsets however old they are."""
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=[*FAST, FLAG, RETENTION_MS, "--offsets-retention-ms", "3000"],
    )
    cluster.wait_coordinators_ready()
    create_topic(cluster, "expire", 1)
    tp = TopicPartition("expire", 0)
    active = Consumer(cluster.bootstrap, group_id="g-active", enable_auto_commit=False)
    try:
        active.subscribe(["expire"])

        def assigned() -> bool:
            active.poll(100)
            return tp in active.assignment()

        wait_for(assigned, timeout=30, what="g-active's assignment")
        active.commit({tp: OffsetAndMetadata(7)})
        join_and_leave(cluster, "g-left", "expire", 5)
        wait_for(
            lambda: "g-left" not in listed(cluster),
            timeout=30,
            what="the group empty past the offsets retention deleted",
        )
        assert "g-active" in listed(cluster)  # a member is in: its offsets stay
        assert active.committed(tp) == OffsetAndMetadata(7)
    finally:
        active.close()
    # Deleted with its offsets, durably: a reload (a long retention now) does not bring them.
    coord = cluster.coordinators[0]
    coord.argv[coord.argv.index("--offsets-retention-ms") + 1] = "3600000"
    cluster.restart(coord)
    cluster.wait_coordinators_ready()
    wait_for(lambda: "g-active" in listed(cluster, False), timeout=30, what="the shards reloaded")
    assert "g-left" not in listed(cluster)
    with Consumer(cluster.bootstrap, group_id="g-left", enable_auto_commit=False) as gone:
        assert gone.committed(tp) is None
