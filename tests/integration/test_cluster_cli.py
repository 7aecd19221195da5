"""The local cluster end to end through the `strom` CLI: real etcd, two controllers and three
storage nodes as separate processes (issue: cluster core, "Must show")."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.client.admin import Admin, PartitionInfo
from strom.client.cluster import ClusterClient
from strom.client.partitioner import partition_for_key
from strom.client.types import OffsetAndTimestamp, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import LeaderNotAvailableError, PartialResultError
from tests.conftest import module_cluster

pytestmark = pytest.mark.integration


def strom(
    *args: str,
    stdin: bytes | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"strom {' '.join(args)} exited {proc.returncode}:\n{proc.stderr.decode()}"
        )
    return proc


# One cluster for the module (each test uses topics of its own names); members a test kills
# are restarted after it. No group coordinator: __consumer_offsets' leaders would skew the
# leader spread of the first test.
cluster = module_cluster(nodes=3, controllers=2, coordinators=0)
HEALED_CLUSTERS = ("cluster",)


def _pids(c: LocalCluster) -> list[int]:
    return [m.process.pid for m in [*c.controllers, *c.nodes] if m.process]


def test_topic_admin_through_the_cli(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    out = strom(
        "topics",
        "create",
        "orders",
        "--partitions",
        "6",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=3600000",
        "-b",
        b,
    ).stdout.decode()
    assert "created topic orders (6 partitions" in out
    listed = strom("topics", "list", env={"STROM_BOOTSTRAP": b}).stdout.decode().split()
    assert "orders" in listed
    desc = strom("topics", "describe", "orders", "-b", b).stdout.decode()
    assert "retention.ms=3600000" in desc
    leaders = [
        line.split("Leader: ")[1].split()[0] for line in desc.splitlines() if "Partition:" in line
    ]
    assert len(leaders) == 6 and sorted(set(leaders)) == ["1", "2", "3"]
    assert all(leaders.count(x) == 2 for x in ("1", "2", "3"))  # spread evenly
    # --json prints every field, zeros included, with integers as numbers (found from
    # outside: partition 0 had no "partition" key and leader epoch 0 none at all).
    [topic] = json.loads(strom("topics", "describe", "orders", "--json", "-b", b).stdout)
    parts = sorted(topic["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in parts] == list(range(6))
    assert [p["state"]["leader_epoch"] for p in parts] == [0] * 6
    assert all(p["offline_replicas"] == [] for p in parts)

    dup = strom("topics", "create", "orders", "--partitions", "1", "-b", b, check=False)
    assert dup.returncode == 1 and b"already exists" in dup.stderr.lower()
    assert b"Traceback" not in dup.stderr
    # Kafka's --if-not-exists: no error, and the topic is left as it was (6 partitions).
    again = strom("topics", "create", "orders", "--partitions", "1", "--if-not-exists", "-b", b)
    assert b"already exists (--if-not-exists" in again.stdout
    assert (
        len(
            json.loads(strom("topics", "describe", "orders", "--json", "-b", b).stdout)[0][
                "partitions"
            ]
        )
        == 6
    )
    bad = strom("topics", "create", "x", "--config", "retention.ms=soon", "-b", b, check=False)
    assert bad.returncode == 1 and b"retention.ms" in bad.stderr

    strom("topics", "alter", "orders", "--set", "retention.ms=60000", "-b", b)
    assert "retention.ms=60000" in strom("topics", "describe", "orders", "-b", b).stdout.decode()

    cluster_out = strom("cluster", "describe", "-b", b).stdout.decode()
    assert cluster_out.count("Node ") == 3 and "Controller:" in cluster_out

    assert "orders" in json.loads(strom("topics", "list", "--json", "-b", b).stdout)
    strom("topics", "delete", "orders", "-b", b)
    assert "orders" not in strom("topics", "list", "-b", b).stdout.decode().split()
    gone = strom("topics", "delete", "orders", "-b", b, check=False)
    assert gone.returncode == 1 and b"UnknownTopicOrPartitionError" in gone.stderr
    gone = strom("topics", "delete", "orders", "--if-exists", "-b", b)  # Kafka's: exit 0
    assert b"does not exist (--if-exists)" in gone.stderr

    # The data leaves the nodes' disks.
    def leftovers() -> list[str]:
        return [p.name for i in (1, 2, 3) for p in (cluster.root / f"node-{i}").glob("orders-*")]

    wait_for(
        lambda: not leftovers(),
        timeout=20,
        what="replica directories of a deleted topic to disappear",
    )


def test_topics_alter_is_all_or_nothing(cluster: LocalCluster) -> None:
    """`topics alter T --set ... --partitions N` with a partition count the controller
    refuses exited 1 and yet applied the configs (found from outside); both are validated
    before either is applied, so a refusal changes nothing and says what was wrong."""
    b = cluster.bootstrap
    strom("topics", "create", "half", "--partitions", "2", "--replication-factor", "1", "-b", b)

    def state() -> tuple[dict[str, str], int]:
        configs = json.loads(strom("topics", "configs", "half", "--json", "-b", b).stdout)
        [topic] = json.loads(strom("topics", "describe", "half", "--json", "-b", b).stdout)
        overrides = {c["name"]: c["value"] for c in configs if c["source"] == "topic"}
        return overrides, len(topic["partitions"])

    assert state() == ({}, 2)

    def alter(
        setting: str, partitions: str, check: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        return strom(
            "topics",
            "alter",
            "half",
            "--set",
            setting,
            "--partitions",
            partitions,
            "-b",
            b,
            check=check,
        )

    same = alter("retention.ms=4242", "2")
    assert same.returncode == 1 and b"InvalidPartitionsError" in same.stderr
    assert b"'half' has 2 partitions" in same.stderr
    assert same.stdout == b""
    huge = alter("segment.ms=77", "20000")
    assert huge.returncode == 1 and b"half" in huge.stderr and huge.stdout == b""
    assert state() == ({}, 2)
    # The other way round: a bad config leaves the partition count alone.
    bad = alter("retention.ms=soon", "3")
    assert bad.returncode == 1 and b"retention.ms" in bad.stderr
    assert state() == ({}, 2)

    both = alter("retention.ms=4242", "3", check=True).stdout.decode()
    assert both == "altered configs of topic half\ntopic half now has 3 partitions\n"
    assert state() == ({"retention.ms": "4242"}, 3)
    strom("topics", "delete", "half", "-b", b)


def test_elect_leaders_exits_1_when_an_election_failed(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """With the preferred replica's node stopped, `topics elect-leaders` printed
    "PREFERRED_LEADER_NOT_AVAILABLE PREFERRED_LEADER_NOT_AVAILABLE" and "elected 0 leader(s)"
    and exited 0 (found from outside); it exits 1 and says which replica and why, as Kafka's
    kafka-leader-election fails. An election done or not needed exits 0. The controller
    does not rebalance leaders on its own here, so leadership moves only when asked."""
    c = make_cluster(
        nodes=2, controllers=1, coordinators=0, controller_args=["--auto-leader-rebalance", "false"]
    )
    b = c.bootstrap
    with Admin(c.bootstrap, request_timeout_ms=15_000) as admin:
        admin.create_topic("ss", replica_assignment={0: [2, 1]})

        def partition() -> PartitionInfo:
            return admin.describe_topic("ss").partitions[0]

        wait_for(lambda: partition().leader == 2, timeout=20, what="node 2 leading ss-0")
        done = strom("topics", "elect-leaders", "ss", "-b", b)
        assert done.stdout == b"elected 0 leader(s)\n" and done.stderr == b""

        node2 = c.node(2)
        assert node2.process is not None
        node2.process.stop()
        wait_for(lambda: partition().leader == 1, timeout=30, what="node 1 leading ss-0")
        failed = strom("topics", "elect-leaders", "ss", "-b", b, check=False)
        assert failed.returncode == 1
        assert failed.stderr.decode() == (
            "ss-0: PREFERRED_LEADER_NOT_AVAILABLE preferred replica 2 is not running "
            "(down, starting or shutting down)\n"
        )
        assert failed.stdout == b"elected 0 leader(s); 1 election(s) failed\n"

        node2.start()
        c.wait_serving(node2)
        wait_for(lambda: 2 in partition().isr, timeout=30, what="node 2 back in the ISR of ss-0")
        assert partition().leader == 1
        moved = strom("topics", "elect-leaders", "ss", "-b", b)
        assert moved.stdout.decode().startswith("ss-0: leader 2 (epoch ")
        assert moved.stdout.decode().endswith("elected 1 leader(s)\n") and moved.stderr == b""
        assert partition().leader == 2


def test_offsets_of_a_topic_with_an_offline_partition_show_the_others(
    cluster: LocalCluster,
) -> None:
    """Found from outside: with one partition's only replica SIGKILLed, `topics offsets`
    printed nothing for the healthy partitions: only LEADER_NOT_AVAILABLE after a minute,
    or with --timeout "no result within --timeout (is the cluster up?)" though it was.
    Admin.list_offsets keeps the partitions it got (PartialResultError.results) and the
    CLI prints them and one error line for the offline one, exit 1, as kafka-get-offsets."""
    b = cluster.bootstrap
    topic = "offline-offsets"
    tps = [TopicPartition(topic, p) for p in range(3)]
    with Admin(b, request_timeout_ms=15_000) as admin:
        admin.create_topic(topic, replica_assignment={0: [3], 1: [1], 2: [2]})
        wait_for(
            lambda: all(p.leader is not None for p in admin.describe_topic(topic).partitions),
            timeout=60,
            what=f"leaders of {topic}",
        )
    strom("produce", topic, "--partition", "1", "-b", b, stdin=b"a\nb\n")
    node3 = cluster.node(3)
    assert node3.process is not None
    node3.process.kill()  # SIGKILL: the partition's only replica
    with Admin(b, request_timeout_ms=2_000, default_api_timeout_ms=5_000) as admin:
        wait_for(
            lambda: admin.describe_topic(topic).partitions[0].leader is None,
            timeout=60,
            what=f"{topic}-0 offline",
        )
        with pytest.raises(LeaderNotAvailableError) as info:
            admin.list_offsets(dict.fromkeys(tps, "latest"))
        exc = info.value
        assert isinstance(exc, PartialResultError)
        assert exc.results == {tps[1]: OffsetAndTimestamp(2, -1), tps[2]: OffsetAndTimestamp(0, -1)}
        assert list(exc.errors) == [tps[0]] and f"{topic}-0" in str(exc)

    started = time.monotonic()
    got = strom("topics", "offsets", topic, "--timeout", "10", "-b", b, check=False)
    assert time.monotonic() - started < 30
    assert got.returncode == 1, got.stderr.decode()
    assert got.stdout.decode() == (
        f"Topic: {topic}\tPartition: 1\tEarliest: 0\tLatest: 2\n"
        f"Topic: {topic}\tPartition: 2\tEarliest: 0\tLatest: 0\n"
    )
    err = got.stderr.decode()
    assert err.count("\n") == 1, err
    assert err.startswith("strom topics: error: LEADER_NOT_AVAILABLE") and f"{topic}-0" in err
    assert "no result within" not in err

    got = strom(
        "topics", "offsets", topic, "--time", "max", "--timeout", "10", "-b", b, check=False
    )
    assert got.returncode == 1, got.stderr.decode()
    assert re.search(r"Partition: 1\tOffset: [01]\tTimestamp: \d+\n", got.stdout.decode())
    assert "Partition: 2\tOffset: none\tTimestamp: -" in got.stdout.decode()
    assert "LEADER_NOT_AVAILABLE" in got.stderr.decode()

    # --json: the refused partition is in the JSON with its error, not only on stderr (found
    # from outside: a script reading stdout took the partial answer for a whole one).
    for extra, fields in (((), ("earliest", "latest")), (("--time", "max"), ("offset",))):
        got = strom(
            "topics", "offsets", topic, "--json", *extra, "--timeout", "10", "-b", b, check=False
        )
        assert got.returncode == 1, got.stderr.decode()
        rows = json.loads(got.stdout)
        assert [(r["partition"], r["error"] and r["error"]["code"]) for r in rows] == [
            (0, "LEADER_NOT_AVAILABLE"),
            (1, None),
            (2, None),
        ]
        assert f"{topic}-0" in rows[0]["error"]["message"]
        assert all(rows[0][f] is None for f in fields)
        if not extra:
            assert [(r["earliest"], r["latest"]) for r in rows[1:]] == [(0, 2), (0, 0)]


def _shown(stdout: bytes) -> set[tuple[str, int]]:
    """(topic, partition) of the fl-* partitions a filtered `topics describe` printed."""
    found = set()
    for line in stdout.decode().splitlines():
        fields = dict(f.split(": ", 1) for f in line.split("\t") if ": " in f)
        assert "Topic" in fields and "Partition" in fields, line  # Kafka's: each line names both
        if fields["Topic"].startswith("fl-"):
            found.add((fields["Topic"], int(fields["Partition"])))
    return found


def test_describe_filters_partitions_as_kafka_topics_does(cluster: LocalCluster) -> None:
    """kafka-topics --describe's --under-replicated-partitions, --unavailable-partitions and
    --under-min-isr-partitions, of every topic or of those named: only the partitions that
    match, each line naming its topic. Node 3 is stopped (restarted after the test)."""
    b = cluster.bootstrap
    with Admin(b, request_timeout_ms=15_000) as admin:
        admin.create_topic(
            "fl-two", replica_assignment={0: [1, 3], 1: [1, 2]}, config={"min.insync.replicas": 2}
        )
        admin.create_topic("fl-fine", replica_assignment={0: [1, 3]})  # min.insync.replicas 1
        admin.create_topic("fl-gone", replica_assignment={0: [3]})
        names = ["fl-two", "fl-fine", "fl-gone"]

        def parts() -> dict[tuple[str, int], PartitionInfo]:
            described = admin.describe_topics(names)
            return {(t, p.partition): p for t, d in described.items() for p in d.partitions}

        wait_for(
            lambda: all(len(p.isr) == len(p.replicas) for p in parts().values()),
            timeout=60,
            what="every fl-* replica in sync",
        )
        for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
            assert _shown(strom("topics", "describe", flag, "-b", b).stdout) == set()
        node3 = cluster.node(3)
        assert node3.process is not None
        node3.process.stop()
        wait_for(
            lambda: (
                (p := parts())[("fl-two", 0)].isr == (1,)
                and p[("fl-fine", 0)].isr == (1,)
                and p[("fl-gone", 0)].offline
            ),
            timeout=60,
            what="node 3 out of the ISRs and fl-gone-0 without a leader",
        )
    some = ["fl-two", "fl-fine", "-b", b]
    under = strom("topics", "describe", "--under-replicated-partitions", *some)
    assert _shown(under.stdout) == {("fl-two", 0), ("fl-fine", 0)}
    assert "Configs" not in under.stdout.decode()
    (line, _) = sorted(under.stdout.decode().splitlines())
    assert line.startswith("Topic: fl-fine\tPartition: 0\tLeader: 1\t"), line
    assert line.endswith("Replicas: 1,3\tIsr: 1\tOffline: 3\t(under-replicated)"), line
    unavailable = strom("topics", "describe", "--unavailable-partitions", "-b", b)  # every topic
    assert _shown(unavailable.stdout) == {("fl-gone", 0)}
    min_isr = strom("topics", "describe", "--under-min-isr-partitions", *some)
    assert _shown(min_isr.stdout) == {("fl-two", 0)}
    # Each row says which condition it met first (found from outside: only "under-replicated").
    (line,) = min_isr.stdout.decode().splitlines()
    assert line.endswith("Isr: 1\tOffline: 3\t(under-min-isr, under-replicated)"), line
    # (every topic: other tests' topics on node 3 may be listed too)
    (line,) = [
        row
        for row in unavailable.stdout.decode().splitlines()
        if row.startswith("Topic: fl-gone\t")
    ]
    assert line.endswith("\t(offline)"), line
    got = json.loads(
        strom("topics", "describe", "--under-min-isr-partitions", "--json", *some).stdout
    )
    assert [(t["name"], [p["partition"] for p in t["partitions"]]) for t in got] == [
        ("fl-two", [0])
    ]
    assert [p["conditions"] for p in got[0]["partitions"]] == [
        ["under-replicated", "under-min-isr"]
    ]
    # The unfiltered listing marks an ISR under min.insync.replicas too, as it marks the other
    # conditions (found from outside: only --under-min-isr-partitions showed it).
    listing = strom("topics", "describe", *some).stdout.decode()
    rows = {
        (topic, line.split("\t")[0]): line
        for topic, block in re.findall(r"Topic: (fl-\w+)\t[^\n]*\n((?:\t[^\n]*\n)*)", listing)
        for line in block.strip("\t\n").split("\n\t")
        if line.startswith("Partition: ")
    }
    assert rows[("fl-two", "Partition: 0")].endswith("\t(under-replicated, under-min-isr)")
    assert rows[("fl-two", "Partition: 1")].endswith("Isr: 1,2"), rows
    assert rows[("fl-fine", "Partition: 0")].endswith("\t(under-replicated)")
    described = json.loads(strom("topics", "describe", "--json", *some).stdout)
    conditions = {
        (t["name"], p["partition"]): p["conditions"] for t in described for p in t["partitions"]
    }
    assert conditions == {
        ("fl-two", 0): ["under-replicated", "under-min-isr"],
        ("fl-two", 1): [],
        ("fl-fine", 0): ["under-replicated"],
    }
    both = strom(
        "topics",
        "describe",
        "--unavailable-partitions",
        "--under-min-isr-partitions",
        *some,
        check=False,
    )
    assert both.returncode == 2 and b"not allowed with argument" in both.stderr


def test_add_partitions_places_the_new_partitions_by_replica_assignment(
    cluster: LocalCluster,
) -> None:
    """kafka-topics --alter --replica-assignment: one colon-separated node list per new
    partition, preferred leader first; lists that do not fit are refused saying why."""
    b = cluster.bootstrap
    with Admin(b, request_timeout_ms=15_000) as admin:
        admin.create_topic("ap-t", replica_assignment={0: [1, 2]})
        common = ["topics", "add-partitions", "ap-t", "-b", b]
        done = strom(*common, "--partitions", "3", "--replica-assignment", "2:3,3:1")
        assert done.stdout == b"topic ap-t now has 3 partitions\n"
        placed = {p.partition: p.replicas for p in admin.describe_topic("ap-t").partitions}
        assert placed == {0: (1, 2), 1: (2, 3), 2: (3, 1)}
        for argv, code, said in [
            (
                ["--partitions", "5", "--replica-assignment", "1:2"],
                2,
                "strom topics add-partitions: error: --replica-assignment has 1 list but "
                "topic ap-t grows from 3 to 5 partitions: give one list per new partition (2)",
            ),
            (
                ["--partitions", "4", "--replica-assignment", "1:1"],
                2,
                "strom topics add-partitions: error: --replica-assignment '1:1': list 1 "
                "('1:1') names a node twice",
            ),
            (["--partitions", "4", "--replica-assignment", "1"], 1, "INVALID_REPLICA_ASSIGNMENT"),
            (
                ["--partitions", "4", "--replica-assignment", "1:9"],
                1,
                "partition 3 names node 9, which is not a live node",
            ),
            (
                ["--partitions", "4", "--replica-assignment", "2:1,2:3,3:1,1:3"],
                2,
                "strom topics add-partitions: error: --replica-assignment: list 1 (2:1) is for "
                "existing partition 0, whose replicas are 1:2: adding partitions does not move",
            ),
        ]:
            bad = strom(*common, *argv, check=False)
            err = bad.stderr.decode()
            assert bad.returncode == code and len(err.splitlines()) == 1, (argv, err)
            assert said in err and "Traceback" not in err, (argv, err)
        assert admin.describe_topic("ap-t").partition_count == 3
        # Kafka's other form: a list for every partition, the existing ones' as they are.
        strom(*common, "--partitions", "4", "--replica-assignment", "1:2,2:3,3:1,1:3")
        placed = {p.partition: p.replicas for p in admin.describe_topic("ap-t").partitions}
        assert placed == {0: (1, 2), 1: (2, 3), 2: (3, 1), 3: (1, 3)}


def test_console_tools_round_trip_across_three_nodes(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    strom("topics", "create", "lines", "--partitions", "3", "--replication-factor", "1", "-b", b)
    lines = [f"user-{i % 7}:event {i}" for i in range(300)]
    strom(
        "produce",
        "lines",
        "--key-separator",
        ":",
        "-b",
        b,
        stdin=("\n".join(lines) + "\n").encode(),
    )
    out = strom(
        "consume",
        "lines",
        "--from-beginning",
        "--max-messages",
        "300",
        "--print-key",
        "--key-separator",
        ":",
        "-b",
        b,
    ).stdout.decode()
    got = out.splitlines()
    assert sorted(got) == sorted(lines)
    # Order per key holds (each key lives on one partition) ...
    for k in range(7):
        mine = [g for g in got if g.startswith(f"user-{k}:")]
        assert mine == [x for x in lines if x.startswith(f"user-{k}:")]
    # ... and that partition is the one Kafka's partitioner picks.
    one = strom(
        "consume",
        "lines",
        "--partition",
        str(partition_for_key(b"user-3", 3)),
        "--offset",
        "0",
        "--max-messages",
        "1",
        "--print-key",
        "--key-separator",
        ":",
        "-b",
        b,
        timeout=30,
    ).stdout.decode()
    assert one.split(":")[0] in {f"user-{k}" for k in range(7)}
    assert any(
        f"user-{k}" == one.split(":")[0]
        and partition_for_key(f"user-{k}".encode(), 3) == partition_for_key(b"user-3", 3)
        for k in range(7)
    )


def test_controller_sigkill_standby_keeps_serving(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    active = cluster.active_controller()
    assert active is not None
    active.process.kill()  # SIGKILL
    start = time.monotonic()
    strom("topics", "create", "after-failover", "--partitions", "2", "-b", b, timeout=60)
    took = time.monotonic() - start
    new_active = cluster.active_controller()
    assert new_active is not None and new_active is not active
    assert "after-failover" in strom("topics", "list", "-b", b).stdout.decode().split()
    print(f"admin request served {took:.2f}s after SIGKILL of the active controller")


def test_etcd_restart_under_a_running_cluster(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    strom("topics", "create", "before", "--partitions", "3", "-b", b)
    pids = _pids(cluster)
    cluster.etcd.kill()
    cluster.etcd.start()
    # Admin works again once etcd is back, and the nodes see the new topic via their watches.
    strom("topics", "create", "after", "--partitions", "3", "-b", b, timeout=90)
    strom("produce", "after", "-b", b, stdin=b"a\nb\nc\n", timeout=60)
    out = (
        strom("consume", "after", "--from-beginning", "--max-messages", "3", "-b", b, timeout=60)
        .stdout.decode()
        .split()
    )
    assert sorted(out) == ["a", "b", "c"]
    assert all(m.alive() for m in [*cluster.controllers, *cluster.nodes])
    assert _pids(cluster) == pids  # nothing was restarted


def test_storage_node_restart_keeps_data_and_offsets(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    strom("topics", "create", "durable", "--partitions", "1", "--replication-factor", "1", "-b", b)
    strom("produce", "durable", "-b", b, stdin=b"".join(b"r%d\n" % i for i in range(100)))
    with ClusterClient(b) as c:
        leader_addr = c.leader_of("durable", 0, refresh=True)
    node = next(n for n in cluster.nodes if n.address == leader_addr)
    node.process.kill()  # SIGKILL: recovery must run on restart
    cluster.restart(node)
    strom("produce", "durable", "-b", b, stdin=b"r100\nr101\n", timeout=60)
    out = (
        strom(
            "consume", "durable", "--from-beginning", "--max-messages", "102", "-b", b, timeout=60
        )
        .stdout.decode()
        .split()
    )
    assert out == [f"r{i}" for i in range(102)]  # nothing lost, offsets continue
    last = (
        strom(
            "consume",
            "durable",
            "--partition",
            "0",
            "--offset",
            "101",
            "--max-messages",
            "1",
            "-b",
            b,
        )
        .stdout.decode()
        .split()
    )
    assert last == ["r101"]


def test_every_service_answers_health_and_reflection(cluster: LocalCluster) -> None:
    import grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    expected = {
        "controller": "strom.v1.ControllerService",
        "storage-node": "strom.v1.StorageService",
    }
    for m in [*cluster.controllers, *cluster.nodes]:
        with grpc.insecure_channel(m.address) as ch:
            services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
        assert expected[m.kind] in services and "grpc.health.v1.Health" in services


def listening(port: int) -> set[str]:
    """The local IPv4/IPv6 addresses with a TCP socket listening on ``port`` (/proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, hexport = local.rpartition(":")
                if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(addr)
                    # /proc prints each 32-bit word in host (little-endian) order
                    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
                    found.add(str(ipaddress.ip_address(b"".join(words))))
    return found


def test_metrics_listen_on_the_grpc_listeners_host(cluster: LocalCluster) -> None:
    """The dev cluster's services listen on 127.0.0.1; their /metrics did on 0.0.0.0, open
    to the network (found from outside). Metrics now bind the --listen host."""
    for m in [*cluster.controllers, *cluster.nodes]:
        assert m.address.startswith("127.0.0.1:")
        assert listening(m.metrics_port) == {"127.0.0.1"}, m.kind


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie waiting for its parent)."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def test_dev_up_and_down_from_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    up = strom("dev", "up", "--nodes", "1", "--controllers", "1", "--dir", str(root), timeout=120)
    try:
        text = up.stdout.decode()
        bootstrap = next(
            line.split("bootstrap: ")[1]
            for line in text.splitlines()
            if line.startswith("bootstrap: ")
        )
        strom("topics", "create", "t", "-b", bootstrap)
        # Each member's command line is recorded, to restart one by hand as it was started.
        recorded = json.loads((root / "cluster.json").read_text())["members"]
        node = next(m for m in recorded if m["kind"] == "storage-node")
        assert "storage-node" in node["argv"] and node["address"].split(":")[1] in " ".join(
            node["argv"]
        )
        again = strom("dev", "up", "--dir", str(root), check=False)
        assert again.returncode == 1 and b"already recorded" in again.stderr
        # The node restarted by hand from that command (the recorded pid is gone)...
        os.kill(node["pid"], signal.SIGKILL)
        wait_for(lambda: not _running(node["pid"]), timeout=10, what="the node to die")
        by_hand = subprocess.Popen(
            node["argv"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        down = strom("dev", "down", "--dir", str(root))
    # ...is stopped by `dev down` too (found from outside: it kept running, unrecorded).
    assert by_hand.wait(timeout=30) is not None
    stopped = down.stdout.decode()
    assert stopped.count("stopped ") == 4  # etcd, a controller, a node and a coordinator
    assert "restarted by hand" in stopped
    state_gone = not (root / "cluster.json").exists()
    assert state_gone
    missing = strom("dev", "down", "--dir", str(root), check=False)
    assert missing.returncode == 1 and b"no local cluster recorded" in missing.stderr


def test_dev_down_leaves_a_reused_pid_alone_and_up_replaces_a_dead_record(tmp_path: Path) -> None:
    """A state file outliving its processes (a reboot): its pids may now be other programs,
    which `dev down` must not signal (found from outside: it killed them, as root), and
    `dev up` starts afresh instead of asking for a `dev down` first."""
    root = tmp_path / "dev"
    root.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        state = {
            "cluster": "strom",
            "bootstrap": "127.0.0.1:1",
            "etcd": {"endpoint": "127.0.0.1:2", "pid": None},
            "members": [
                {
                    "kind": "storage-node",
                    "id": 1,
                    "address": "127.0.0.1:39999",
                    "metrics_port": 1,
                    "pid": other.pid,
                    "log": "x",
                },
            ],
        }
        (root / "cluster.json").write_text(json.dumps(state))
        down = strom("dev", "down", "--dir", str(root))
        assert b"stopped" not in down.stdout
        assert other.poll() is None  # still running
        (root / "cluster.json").write_text(json.dumps(state))
        up = strom("dev", "up", "--nodes", "1", "--dir", str(root), timeout=120)
        assert b"bootstrap: " in up.stdout
        strom("dev", "down", "--dir", str(root))
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_dev_up_on_another_cluster_s_dir_stops_at_once_with_the_node_s_reason(
    tmp_path: Path,
) -> None:
    """Found from outside: `dev up --cluster other` on a dir made with `--cluster strom`
    waited 60 s after the node had exited, then printed one 7 KB line ("timed out ... last
    error: ClusterError('storage-node 1 exited ...\\n...')") with 40 escaped lines of earlier
    runs before the reason. Now it stops when the node exits and shows the end of that run's
    log, line by line."""
    root = tmp_path / "dev"
    strom("dev", "up", "--nodes", "1", "--controllers", "1", "--dir", str(root), timeout=120)
    strom("dev", "down", "--dir", str(root))
    out = strom(
        "dev",
        "up",
        "--nodes",
        "1",
        "--controllers",
        "1",
        "--dir",
        str(root),
        "--cluster",
        "other",
        check=False,
        timeout=120,
    )
    err = out.stderr.decode()
    assert out.returncode == 1, out
    assert err.startswith("strom dev: error: storage-node 1 exited with status 1 during start")
    assert "belongs to node 1 of cluster 'strom'" in err.splitlines()[-1], err
    assert "timed out" not in err and "\\n" not in err and len(err.splitlines()) <= 10, err
    assert not (root / "cluster.json").exists()


def test_dev_up_without_etcd_says_how_to_install_it(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent)}  # python only, no etcd on PATH
    out = strom("dev", "up", "--dir", str(tmp_path / "d"), env=env, check=False)
    assert out.returncode == 1
    assert b"apt-get install -y etcd-server" in out.stderr and b"Traceback" not in out.stderr


def test_the_demo_pipelines_run(tmp_path: Path) -> None:
    # `strom demo` itself (the Spark pipeline) is tested in tests/spark/test_cli.py.
    out = strom("demo", "--cluster", "--records", "6000", timeout=180).stdout.decode()
    assert "produced 6,000 keyed records" in out
    assert "consumed 6,000 records back" in out
    assert "the standby served CreateTopics" in out
    engine = strom("demo", "--engine", timeout=120).stdout.decode()
    assert "read back 100000 records" in engine and "recovery cut" in engine
