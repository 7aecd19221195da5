"""Replication throttles for reassignments, as Kafka operators use them (KIP-73), against a
real cluster (real etcd, a controller, three storage nodes): ``strom topics reassign --plan F
--execute --throttle RATE``, a changed rate while running, ``--verify`` / ``--cancel``
removing the throttle, the leader and follower buckets, the metrics, and the refusals.

Found from outside: there was no replication throttle, so an untuned move copied as fast as
it could (a reviewer saw acks=all p99 go 22 -> 283 ms during a 600 MB move), and no metric
said how many bytes a move had copied."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from strom import Producer
from strom.cli import reassignplan
from strom.client.admin import Admin
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import InvalidConfigError
from tests.conftest import member_metric

from .test_cluster_cli import strom

pytestmark = pytest.mark.integration

MIB = 1 << 20
LEADER = "leader.replication.throttled.replicas"
FOLLOWER = "follower.replication.throttled.replicas"
RATES = (reassignplan.LEADER_RATE, reassignplan.FOLLOWER_RATE)


@pytest.fixture
def cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return make_cluster(
        nodes=3,
        controllers=1,
        coordinators=0,
        controller_args=["--auto-leader-rebalance", "false"],
    )


def _fill(bootstrap: str, topic: str, megabytes: int) -> int:
    """Write ``megabytes`` of incompressible records to partition 0; the bytes written."""
    values = [os.urandom(16 * 1024) for _ in range(64)]  # 1 MiB a batch of sends
    with Producer(bootstrap, acks="all", linger_ms=5) as p:
        for _ in range(megabytes):
            p.send_batch(topic, values, partition=0).result(timeout=60)
    return megabytes * MIB


def _partition(admin: Admin, topic: str) -> object:
    return admin.describe_topic(topic).partitions[0]


def _throttles(admin: Admin, topic: str) -> dict[str, str | None]:
    found = admin.describe_configs(topic, names=[LEADER, FOLLOWER])
    return {n: e.value or None for n, e in found.items()}


def _rates(admin: Admin) -> dict[str, str | None]:
    return {n: e.value for n, e in admin.describe_node_configs().items() if n in RATES}


def _plan(tmp_path: Path, topic: str, replicas: list[int]) -> str:
    path = tmp_path / f"{topic}.json"
    path.write_text(reassignplan.plan_json({TopicPartition(topic, 0): replicas}))
    return str(path)


def test_a_throttled_move_copies_at_the_rate_and_verify_removes_the_throttle(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    b = cluster.bootstrap
    leader = cluster.node(1)
    with Admin(b) as admin:
        admin.create_topic("moving", replica_assignment={0: [1]})
        # Another partition led by the same node whose in-sync follower its topic names as
        # throttled: KIP-73 never throttles an in-sync replica, so it must not be slowed.
        admin.create_topic("hot", replica_assignment={0: [1, 2]}, config={LEADER: "*"})
        size = _fill(b, "moving", 8)
        plan = _plan(tmp_path, "moving", [1, 3])

        started = time.monotonic()
        run = strom(
            "topics", "reassign", "--plan", plan, "--execute", "--throttle", "1MiB", "-b", b
        )
        out = run.stdout.decode()
        assert "The replication throttle is 1048576 bytes/s per node" in out, out
        assert "Started the reassignment of 1 partition(s)" in out
        assert _throttles(admin, "moving") == {LEADER: "0:1", FOLLOWER: "0:3"}
        assert _rates(admin) == dict.fromkeys(RATES, "1048576")

        # A bucket holds the copy back while the new replica is still behind: the receiving
        # node's (it leaves the partition out of its fetches while in debt) or the leader's.
        def held() -> bool:
            name = "strom_storage_replication_throttled_total"
            return (
                member_metric(leader, name, side="leader")
                + member_metric(cluster.node(3), name, side="follower")
                > 0
            )

        wait_for(held, timeout=60, what="a replication bucket to hold the copy back")
        assert _partition(admin, "moving").adding_replicas == (3,), "copied unthrottled"
        assert (
            member_metric(leader, "strom_storage_replication_throttle_rate_bytes", side="leader")
            == MIB
        )

        # Producers on the same node keep working, and the in-sync follower of "hot" is not
        # charged to the bucket (nor dropped from the ISR) while the move is throttled.
        _fill(b, "hot", 2)
        assert set(_partition(admin, "hot").isr) == {1, 2}

        def verified() -> bool:
            got = strom("topics", "reassign", "--plan", plan, "--verify", "-b", b, check=False)
            assert got.returncode in (0, 1), got.stderr.decode()
            return got.returncode == 0

        wait_for(verified, timeout=120, what="the throttled move to finish")
        elapsed = time.monotonic() - started
        # 8 MiB at 1 MiB/s with a second of burst: several seconds, never "at once". (A
        # lower bound only: a loaded machine makes it slower, never faster.)
        assert elapsed > 3, elapsed
        charged = member_metric(
            leader, "strom_storage_replication_throttled_bytes_total", side="leader"
        )
        moved = member_metric(leader, "strom_storage_reassignment_bytes_out_total", topic="moving")
        assert size * 0.9 <= moved <= size * 1.1, (moved, size)
        assert size * 0.9 <= charged <= size * 1.1, (charged, size)  # "hot" not charged
        received = member_metric(
            cluster.node(3), "strom_storage_reassignment_bytes_in_total", topic="moving"
        )
        assert size * 0.9 <= received <= size * 1.1, (received, size)

        # The move is done: --verify took the throttle away and said so.
        done = strom("topics", "reassign", "--plan", plan, "--verify", "-b", b)
        assert "moving-0: done" in done.stdout.decode()
        assert _throttles(admin, "moving") == {LEADER: None, FOLLOWER: None}
        assert _rates(admin) == dict.fromkeys(RATES)
        assert _throttles(admin, "hot")[LEADER] == "*"  # not the plan's: kept
        wait_for(
            lambda: (
                member_metric(
                    leader, "strom_storage_replication_throttle_rate_bytes", side="leader"
                )
                == 0
            ),
            timeout=30,
            what="the node to drop the rate",
        )


def test_the_rate_changes_while_running_and_cancel_removes_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    b = cluster.bootstrap
    with Admin(b) as admin:
        admin.create_topic("slow", replica_assignment={0: [1]})
        _fill(b, "slow", 4)
        plan = _plan(tmp_path, "slow", [2])
        strom("topics", "reassign", "--plan", plan, "--execute", "--throttle", "64KiB", "-b", b)
        assert _throttles(admin, "slow") == {LEADER: "0:1", FOLLOWER: "0:2"}
        assert _rates(admin) == dict.fromkeys(RATES, "65536")

        # Kafka's way to change a running move's rate: --additional --execute --throttle.
        again = strom(
            "topics", "reassign", "--plan", plan, "--additional", "--execute",
            "--throttle", "128KiB", "-b", b,
        )  # fmt: skip
        assert "The replication throttle is 131072 bytes/s" in again.stdout.decode()
        assert _rates(admin) == dict.fromkeys(RATES, "131072")
        # Merged, without repeats; the leader list takes every current replica, the one being
        # added too (Kafka's "existing replicas" of a running move).
        assert _throttles(admin, "slow") == {LEADER: "0:1,0:2", FOLLOWER: "0:2"}
        for node_id in (1, 2):
            wait_for(
                lambda n=node_id: (
                    member_metric(
                        cluster.node(n),
                        "strom_storage_replication_throttle_rate_bytes",
                        side="follower",
                    )
                    == 131072
                ),
                timeout=30,
                what=f"node {node_id} to take the new rate",
            )
        assert _partition(admin, "slow").adding_replicas == (2,)  # still copying, slowly

        cancel = strom("topics", "reassign", "--plan", plan, "--cancel", "-b", b)
        out = cancel.stdout.decode()
        assert "slow-0: cancelled" in out
        assert "Removed the throttled replicas of topic(s) slow" in out
        assert "Removed the replication throttle rate" in out
        assert _throttles(admin, "slow") == {LEADER: None, FOLLOWER: None}
        assert _rates(admin) == dict.fromkeys(RATES)
        assert _partition(admin, "slow").replicas == (1,)


def test_bad_throttles_are_refused_clearly(cluster: LocalCluster, tmp_path: Path) -> None:
    b = cluster.bootstrap
    with Admin(b) as admin:
        admin.create_topic("t3", partitions=3, replication_factor=1)
        plan = _plan(tmp_path, "t3", [2])
        for bad, why in (("-1", "size must be positive"), ("abc", "not a size: 'abc'")):
            got = strom(
                "topics", "reassign", "--plan", plan, "--execute", "--throttle", bad, "-b", b,
                check=False,
            )  # fmt: skip
            assert got.returncode == 2, got.stderr.decode()
            err = got.stderr.decode()
            assert "--throttle" in err and why in err and "Traceback" not in err, err
        got = strom(
            "topics", "reassign", "--plan", plan, "--verify", "--throttle", "1MiB", "-b", b,
            check=False,
        )  # fmt: skip
        assert got.returncode == 2 and "--verify does not take --throttle" in got.stderr.decode()
        assert _partition(admin, "t3").adding_replicas == ()  # nothing started

        with pytest.raises(InvalidConfigError, match=r"names partition 3 of topic 't3'"):
            admin.alter_configs("t3", set={LEADER: "0:1,3:1"})
        with pytest.raises(InvalidConfigError, match=f"'{FOLLOWER}' has invalid value 'x:1'"):
            admin.alter_configs("t3", set={FOLLOWER: "x:1"})
        with pytest.raises(InvalidConfigError, match=r"names partition 5"):
            admin.create_topic("t4", partitions=2, config={LEADER: "5:1"})
        with pytest.raises(InvalidConfigError, match=r"leader\.replication\.throttled\.rate"):
            admin.alter_node_configs(set={reassignplan.LEADER_RATE: -1})
        with pytest.raises(InvalidConfigError, match="unknown dynamic node config"):
            admin.alter_node_configs(set={"replication.rate": 1})
        assert _throttles(admin, "t3") == {LEADER: None, FOLLOWER: None}
        assert _rates(admin) == dict.fromkeys(RATES)
        admin.alter_configs("t3", set={LEADER: "2:1, 0:1"})
        assert _throttles(admin, "t3")[LEADER] == "2:1,0:1"


def test_cluster_configs_lists_sets_and_deletes_the_throttle_rate(cluster: LocalCluster) -> None:
    """Found from outside: only the Admin API showed or removed the rate a reassignment
    left (`--preserve-throttles`, a kept rate); Kafka's kafka-configs --entity-default does."""
    b = cluster.bootstrap
    got = strom("cluster", "configs", "--alter", "--set", f"{RATES[0]}=10MiB", "-b", b)
    assert f"set {RATES[0]}={10 * MIB}" in got.stdout.decode()
    strom("cluster", "configs", "--set", f"{RATES[1]}=2048", "-b", b)
    listed = strom("cluster", "configs", "-b", b).stdout.decode()
    assert f"{RATES[0]}={10 * MIB}\t(dynamic_node)" in listed, listed
    assert f"{RATES[1]}=2048\t(dynamic_node)" in listed, listed
    bad = strom("cluster", "configs", "--set", "replication.rate=1", "-b", b, check=False)
    err = bad.stderr.decode()
    assert bad.returncode == 2 and "unknown dynamic node config" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    strom("cluster", "configs", "--delete", RATES[0], "--delete", RATES[1], "-b", b)
    with Admin(b) as admin:
        assert _rates(admin) == dict.fromkeys(RATES)


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_each_side_alone_throttles_a_move(cluster: LocalCluster, side: str) -> None:
    """Through the Admin API only, one side at a time: the leader (node 1) sends the new
    replica only what its bucket holds, or the receiving node (2) leaves the partition out
    of its fetches while its bucket is in debt; the move still completes, and only that
    side's bucket is charged."""
    b = cluster.bootstrap
    node = cluster.node(1 if side == "leader" else 2)
    other = cluster.node(2 if side == "leader" else 1)
    if side == "leader":
        config, rate, entry = LEADER, reassignplan.LEADER_RATE, "0:1"
    else:
        config, rate, entry = FOLLOWER, reassignplan.FOLLOWER_RATE, "0:2"
    with Admin(b) as admin:
        admin.create_topic("one-side", replica_assignment={0: [1]})
        size = _fill(b, "one-side", 4)
        admin.alter_configs("one-side", set={config: entry})
        admin.alter_node_configs(set={rate: 512000})
        assert _rates(admin) == {r: "512000" if r == rate else None for r in RATES}
        gauge = "strom_storage_replication_throttle_rate_bytes"
        wait_for(
            lambda: member_metric(node, gauge, side=side) == 512000,
            timeout=30,
            what=f"node {node.ident} to take the {side} rate",
        )
        admin.alter_partition_reassignments({TopicPartition("one-side", 0): [1, 2]})

        def held() -> bool:
            return member_metric(node, "strom_storage_replication_throttled_total", side=side) > 0

        wait_for(held, timeout=60, what=f"the {side} bucket to hold the copy back")
        assert _partition(admin, "one-side").adding_replicas == (2,), "copied unthrottled"
        wait_for(
            lambda: _partition(admin, "one-side").adding_replicas == (),
            timeout=120,
            what="the move to finish",
        )
        assert set(_partition(admin, "one-side").isr) == {1, 2}
        name = "strom_storage_replication_throttled_bytes_total"
        charged = member_metric(node, name, side=side)
        assert size * 0.9 <= charged <= size * 1.1, (charged, size)
        unset = "follower" if side == "leader" else "leader"
        assert member_metric(other, name, side=unset) == 0  # the other side has no throttle
