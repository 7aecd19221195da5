"""Whole reassignment plans through the `strom` CLI against a real cluster (real etcd, a
controller, four storage nodes on two racks): ``topics reassign --generate``, ``--plan FILE
--execute``, ``--verify``, ``--cancel`` and ``topics elect-leaders --path-to-json-file``.

Found from outside (a Kafka operator): the command moved one partition per call, with no
plan file, generator, verify or whole-plan cancel, so draining a node of thousands of
partitions meant scripting the Admin API."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.cli import reassignplan
from strom.client.admin import Admin
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for

from .test_cluster_cli import strom

pytestmark = pytest.mark.integration

RACK = {1: "ra", 2: "rb", 3: "ra", 4: "rb"}


@pytest.fixture
def cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    # A long session: a node paused by a test keeps its registration (and its place in plans).
    # No automatic rebalance: leaderships move only by the elections the tests ask for.
    return make_cluster(
        nodes=4,
        controllers=1,
        coordinators=0,
        racks=["ra", "rb"],
        node_args=["--session-timeout-s", "30"],
        controller_args=["--auto-leader-rebalance", "false"],
    )


def _blocks(stdout: bytes) -> list[reassignplan.Plan]:
    """The JSON plans a command printed (the lines from '{"version"' to ']}')."""
    plans, block = [], None
    for line in stdout.decode().splitlines():
        if line.startswith('{"version":1'):
            block = [line]
        elif block is not None:
            block.append(line)
            if line == "]}":
                plans.append(reassignplan.parse_plan("\n".join(block)))
                block = None
    return plans


def _replicas(admin: Admin, topic: str) -> dict[TopicPartition, list[int]]:
    d = admin.describe_topic(topic)
    return {TopicPartition(topic, p.partition): list(p.replicas) for p in d.partitions}


def test_generate_execute_verify(cluster: LocalCluster, tmp_path: Path) -> None:
    b = cluster.bootstrap
    with Admin(b) as admin:
        assert {n.node_id: n.rack for n in admin.describe_cluster().nodes} == RACK
        before = {p: [1, 3] if p % 2 else [3, 1] for p in range(8)}  # all on rack ra
        admin.create_topic("rp-a", replica_assignment=before)
        admin.create_topic("rp-b", replica_assignment={0: [1, 3], 1: [3, 1]})
        topics = tmp_path / "topics.json"
        topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "rp-a"}]}))
        gen = strom(
            "topics", "reassign", "--generate", "--topics-to-move-json-file", str(topics),
            "--nodes", "1,2,3,4", "-b", b,
        )  # fmt: skip
        current, proposed = _blocks(gen.stdout)
        assert current == {TopicPartition("rp-a", p): r for p, r in before.items()}
        assert list(proposed) == list(current)
        assert all(len(r) == 2 and {RACK[x] for x in r} == {"ra", "rb"} for r in proposed.values())
        assert Counter(x for r in proposed.values() for x in r) == {1: 4, 2: 4, 3: 4, 4: 4}
        assert Counter(r[0] for r in proposed.values()) == {1: 2, 2: 2, 3: 2, 4: 2}
        # A node on rack ra stays in each partition: one replica moves a partition, no more.
        assert "(8 of 16 replicas would be copied" in gen.stderr.decode()

        plan = tmp_path / "plan.json"
        plan.write_text(reassignplan.plan_json(proposed))
        run = strom("topics", "reassign", "--plan", str(plan), "--execute", "-b", b)
        (rollback,) = _blocks(run.stdout)
        assert rollback == current  # printed to save for a rollback
        assert "Started the reassignment of 8 partition(s)" in run.stdout.decode()

        def verified() -> bool:
            got = strom("topics", "reassign", "--plan", str(plan), "--verify", "-b", b, check=False)
            assert got.returncode in (0, 1), got.stderr.decode()
            return got.returncode == 0 and "8 done, 0 in progress" in got.stdout.decode()

        wait_for(verified, timeout=60, what="every move of the plan done")
        assert _replicas(admin, "rp-a") == proposed
        done = strom("topics", "reassign", "--plan", str(plan), "--verify", "--preferred", "-b", b)
        assert "rp-a-0: done" in done.stdout.decode()
        leaders = {p.partition: p.leader for p in admin.describe_topic("rp-a").partitions}
        assert leaders == {tp.partition: r[0] for tp, r in proposed.items()}

        # A plan naming a partition that does not exist: the others start, it is named, exit 1.
        bad = tmp_path / "bad.json"
        bad.write_text(
            reassignplan.plan_json(
                {TopicPartition("rp-b", 0): [2, 4], TopicPartition("rp-b", 7): [2, 4]}
            )
        )
        refused = strom("topics", "reassign", "--plan", str(bad), "--execute", "-b", b, check=False)
        assert refused.returncode == 1
        assert "rp-b-7: UNKNOWN_TOPIC_OR_PARTITION" in refused.stderr.decode()
        assert "Started the reassignment of 1 partition(s); 1 refused" in refused.stdout.decode()
        wait_for(
            lambda: _replicas(admin, "rp-b")[TopicPartition("rp-b", 0)] == [2, 4],
            timeout=60,
            what="rp-b-0 moved",
        )
        # An unknown node is a usage error, before anything starts.
        bad.write_text(reassignplan.plan_json({TopicPartition("rp-b", 1): [1, 9]}))
        usage = strom("topics", "reassign", "--plan", str(bad), "--execute", "-b", b, check=False)
        assert usage.returncode == 2
        assert "rp-b-1: unknown node(s) 9 (registered: 1,2,3,4)" in usage.stderr.decode()
        assert _replicas(admin, "rp-b")[TopicPartition("rp-b", 1)] == [3, 1]


def test_a_plan_cancelled_midway(cluster: LocalCluster, tmp_path: Path) -> None:
    b = cluster.bootstrap
    with Admin(b) as admin:
        admin.create_topic("rp-c", replica_assignment={0: [1, 2], 1: [2, 1], 2: [1, 2]})
        plan = tmp_path / "plan.json"
        # Partitions 0 and 1 move to node 4, which is paused (it cannot catch up); 2 is as it is.
        targets = {0: [1, 4], 1: [2, 4], 2: [1, 2]}
        plan.write_text(
            reassignplan.plan_json({TopicPartition("rp-c", p): r for p, r in targets.items()})
        )
        node4 = cluster.node(4)
        assert node4.process is not None
        node4.process.signal(signal.SIGSTOP)
        try:
            strom("topics", "reassign", "--plan", str(plan), "--execute", "-b", b)
            mid = strom("topics", "reassign", "--plan", str(plan), "--verify", "-b", b, check=False)
            cancel = strom("topics", "reassign", "--plan", str(plan), "--cancel", "-b", b)
        finally:
            node4.process.signal(signal.SIGCONT)
        assert mid.returncode == 1
        assert "rp-c-0: in progress (adding 4, removing 2)" in mid.stdout.decode()
        assert "rp-c-2: done" in mid.stdout.decode()
        assert "1 done, 2 in progress, 0 not matching" in mid.stdout.decode()
        out = cancel.stdout.decode()
        assert "rp-c-0: cancelled" in out and "rp-c-1: cancelled" in out
        assert "Cancelled 2 reassignment(s); 1 partition(s) of the plan had none" in out
        assert admin.list_partition_reassignments() == {}
        assert _replicas(admin, "rp-c") == {
            TopicPartition("rp-c", p): r for p, r in {0: [1, 2], 1: [2, 1], 2: [1, 2]}.items()
        }
        after = strom("topics", "reassign", "--plan", str(plan), "--verify", "-b", b, check=False)
        assert after.returncode == 1
        assert "rp-c-0: not matching: replicas 1,2, plan 1,4" in after.stdout.decode()


def test_elect_leaders_from_a_json_file_and_a_partition(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    b = cluster.bootstrap
    with Admin(b) as admin:
        admin.create_topic("rp-e", replica_assignment={0: [1, 2], 1: [1, 2], 2: [1, 2]})
        # Reorder all three: each preferred leader is then 2 while 1 leads.
        admin.alter_partition_reassignments({TopicPartition("rp-e", p): [2, 1] for p in range(3)})
        wait_for(
            lambda: all(p.replicas == (2, 1) for p in admin.describe_topic("rp-e").partitions),
            timeout=30,
            what="the new replica order",
        )
        file = tmp_path / "elect.json"
        file.write_text(json.dumps({"partitions": [{"topic": "rp-e", "partition": 0}]}))
        got = strom("topics", "elect-leaders", "--path-to-json-file", str(file), "-b", b)
        assert "rp-e-0: leader 2" in got.stdout.decode()
        assert "elected 1 leader(s)" in got.stdout.decode()
        one = strom("topics", "elect-leaders", "rp-e", "--partition", "2", "-b", b)
        assert "rp-e-2: leader 2" in one.stdout.decode() and "rp-e-1" not in one.stdout.decode()
        leaders = {p.partition: p.leader for p in admin.describe_topic("rp-e").partitions}
        assert leaders == {0: 2, 1: 1, 2: 2}
        file.write_text(json.dumps({"partitions": [{"topic": "rp-e", "partition": 9}]}))
        missing = strom(
            "topics", "elect-leaders", "--path-to-json-file", str(file), "-b", b, check=False
        )
        assert missing.returncode == 1 and "rp-e-9" in missing.stderr.decode()


def test_a_cancel_needing_an_unclean_election_is_refused_by_name(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The plan moves rp-u-0 from [1] to [2, 3] with node 3 paused; node 2 catches up, then
    node 1 stops: 2 leads, and going back to [1] would need an unclean election. The
    controller refuses that cancel; the command names the partition and why, and exits 1,
    while the plan's other cancel goes through."""
    b = cluster.bootstrap
    with Admin(b) as admin:
        admin.create_topic("rp-u", replica_assignment={0: [1]})
        admin.create_topic("rp-v", replica_assignment={0: [2]})
        plan = tmp_path / "plan.json"
        plan.write_text(
            reassignplan.plan_json(
                {TopicPartition("rp-u", 0): [2, 3], TopicPartition("rp-v", 0): [2, 3]}
            )
        )
        node1, node3 = cluster.node(1), cluster.node(3)
        assert node1.process is not None and node3.process is not None
        node3.process.signal(signal.SIGSTOP)
        try:
            strom("topics", "reassign", "--plan", str(plan), "--execute", "-b", b)
            wait_for(
                lambda: 2 in admin.describe_topic("rp-u").partitions[0].isr,
                timeout=30,
                what="node 2 in sync on rp-u-0",
            )
            node1.process.signal(signal.SIGTERM)  # a controlled shutdown: 2 takes over
            wait_for(
                lambda: admin.describe_topic("rp-u").partitions[0].isr == (2,),
                timeout=30,
                what="node 1 out of rp-u-0's ISR",
            )
            cancel = strom(
                "topics", "reassign", "--plan", str(plan), "--cancel", "-b", b, check=False
            )
        finally:
            node3.process.signal(signal.SIGCONT)
        assert cancel.returncode == 1, cancel.stderr.decode()
        err = cancel.stderr.decode()
        assert "rp-u-0: INVALID_REPLICA_ASSIGNMENT cannot cancel the reassignment" in err
        assert "unclean leader election" in err
        assert "rp-v-0: cancelled" in cancel.stdout.decode()
        assert "Cancelled 1 reassignment(s); 1 refused" in cancel.stdout.decode()
        assert list(admin.list_partition_reassignments()) == [TopicPartition("rp-u", 0)]
