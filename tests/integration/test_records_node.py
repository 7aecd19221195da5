"""RecordService from a real non-Python client (issue 14, item 4): Node.js programs built on
@grpc/grpc-js and @grpc/proto-loader (tests/node, installed by the bootstrap with ``npm ci``)
against a local cluster of real processes.

* 100,000 keyed records produced with ProduceRecords and read back with Subscribe: partition
  (murmur2 computed in JavaScript), offsets, order per key and exact contents; then read once
  more by the Python Consumer, so both languages agree on every record.
* Two Node subscribers in one group split six partitions; when one exits, the other takes
  over all six and reads what is produced next.
* Commits made with CommitOffsets survive a coordinator restart: a new member resumes at them.
* A partition leader is SIGKILLed during a long-lived subscription: the stream goes on, no
  acknowledged record is lost, duplicated or reordered (runs last: it kills a node).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from strom.client import Producer
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.partitioner import partition_for_key
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.integration.node_client import NODE_DIR, NodeProgram, node_binary

pytestmark = pytest.mark.integration
PROTOS = Path(__file__).resolve().parents[2] / "protos"


@pytest.fixture(scope="module")
def cluster(three_node_cluster: LocalCluster) -> LocalCluster:
    return three_node_cluster


def _node(script: str, *args: str, tmp_path: Path) -> NodeProgram:
    return NodeProgram(script, *args, log_dir=tmp_path)


def test_100k_keyed_records_round_trip_through_node(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    new_topic(cluster, 6, 3, {"min.insync.replicas": "2"}, name="node-keyed")
    total, keys = 100_000, 1000
    with _node(
        "produce_and_read.js",
        "--address",
        cluster.nodes[1].address,  # any node: it forwards each partition to its leader
        "--topic",
        "node-keyed",
        "--records",
        str(total),
        "--keys",
        str(keys),
        "--partitions",
        "6",
        tmp_path=tmp_path,
    ) as prog:
        res = prog.result(timeout=240)
    assert "error" not in res, res
    assert res["produced"] == total and res["read"] == total, res
    assert res["bad_partitions"] == 0, res  # JavaScript murmur2 == the node's
    assert res["wrong_offset"] == 0 and res["out_of_order"] == 0, res
    assert res["bad_contents"] == 0 and res["duplicates"] == 0 and res["missing"] == 0, res

    # The Python consumer reads the same 100,000 records where Node put them.
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("node-keyed", p) for p in range(6)])
        seen: dict[str, int] = {}
        count = 0
        while count < total:
            for r in consumer.poll(timeout_ms=2000, max_records=50_000):
                key = r.key.decode()
                assert r.partition == partition_for_key(r.key, 6)
                k, seq, _ = r.value.decode().split("|")
                assert k == key and int(seq) == seen.get(key, -1) + 1
                seen[key] = int(seq)
                count += 1
    assert count == total and len(seen) == keys


def _routed(cluster: LocalCluster, route: str) -> float:
    """strom_storage_records_routed_partitions_total{route} summed over the nodes."""
    total = 0.0
    prefix = f'strom_storage_records_routed_partitions_total{{route="{route}"}} '
    for member in cluster.nodes:
        url = f"http://127.0.0.1:{member.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(prefix):
                    total += float(line.split()[-1])
    return total


def test_a_caller_that_routes_by_leader_is_never_forwarded(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """docs/grpc-clients.md, "Sending to the leader": the Node.js LeaderRouter learns the leaders
    from Metadata and splits each call by leader; every record lands where its key says, and
    no node forwards a single partition's records (while a call sent to one node is forwarded
    for the partitions it does not lead)."""
    new_topic(cluster, 6, 3, {"min.insync.replicas": "2"}, name="node-routed")
    new_topic(cluster, 6, 3, {"min.insync.replicas": "2"}, name="node-unrouted")
    total = 20_000

    def run(topic: str, route: str) -> dict[str, Any]:
        address = cluster.nodes[1].address  # the routed run's bootstrap, the other's target
        args = ["--address", address, "--topic", topic, "--records", str(total)]
        args += ["--keys", "100", "--partitions", "6", "--route", route]
        with _node("produce_and_read.js", *args, tmp_path=tmp_path) as prog:
            res = prog.result(timeout=240)
        assert "error" not in res, res
        assert res["produced"] == total and res["read"] == total, res
        assert res["bad_partitions"] == 0 and res["wrong_offset"] == 0, res
        assert res["out_of_order"] == res["bad_contents"] == res["duplicates"] == 0, res
        assert res["missing"] == 0, res
        return res

    local, forwarded = _routed(cluster, "local"), _routed(cluster, "forwarded")
    run("node-routed", "leaders")
    assert _routed(cluster, "forwarded") == forwarded  # nothing went through another node
    assert _routed(cluster, "local") >= local + total / 1000  # one batch per call at least
    run("node-unrouted", "any")  # the same records through one node: forwarded
    assert _routed(cluster, "forwarded") > forwarded


def _run_example(address: str, topic: str) -> list[str]:
    """Run docs/grpc-clients.md's example (tests/node/example.js) as a user does; its lines."""
    proc = subprocess.run(
        [node_binary(), "example.js", address, str(PROTOS), topic],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_the_documented_node_example_runs(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """docs/grpc-clients.md's complete example (tests/node/example.js), as a user runs it:
    with every node's address, as the docs suggest. Found from outside: its one round_robin
    channel sent each CommitOffsets to the next node, which did not serve the subscription
    (UNKNOWN_MEMBER_ID), so the group ended with no offsets."""
    new_topic(cluster, 3, 1, name="clicks")
    every_node = "ipv4:" + ",".join(n.address for n in cluster.nodes)
    lines = _run_example(every_node, "clicks")
    produced = [ln for ln in lines if ln.startswith("produced ")]
    consumed = {ln.split()[1] for ln in lines if ln.startswith("consumed ")}
    assert len(produced) == 10 and lines[-1] == "done: 10 records"
    assert consumed == {ln.split()[-1] for ln in produced}  # partition@offset, each once
    assert not [ln for ln in lines if ln.startswith("commit ")], lines  # none refused
    ends: dict[int, int] = {}
    for ln in produced:
        p, o = map(int, ln.split()[-1].split("@"))
        ends[p] = max(ends.get(p, 0), o + 1)
    with Consumer(cluster.bootstrap, group_id="example-group", enable_auto_commit=False) as c:
        got = c.committed([TopicPartition("clicks", p) for p in ends])
    assert {tp.partition: om.offset for tp, om in got.items() if om is not None} == ends
    for ln in produced:  # "produced user-1 -> 2@0": the key's murmur2 partition
        key, where = ln.split()[1], ln.split()[-1]
        assert int(where.split("@")[0]) == partition_for_key(key.encode(), 3)


def test_the_documented_node_example_on_a_topic_with_keyless_records(
    cluster: LocalCluster, new_topic: Callable[..., str]
) -> None:
    """Found from outside: on a topic holding records without keys the example printed
    ``undefined`` for their keys (a message whose records have no key has no ``keys``), and
    after ``done:`` it went on committing for messages that arrived after it left the group
    (``commit 0: UNKNOWN_MEMBER_ID``). One partition holding 1,000 keyless records, as many
    as the first message holds: the example reads them (from the start of the topic) before
    its own, and stops there."""
    topic = new_topic(cluster, 1, 1)
    with Producer(cluster.bootstrap, linger_ms=0) as p:
        for i in range(1000):
            p.send(topic, f"plain-{i}".encode())
        p.flush()
    lines = _run_example(cluster.nodes[0].address, topic)
    assert not [ln for ln in lines if "undefined" in ln]
    assert "consumed 0@0 plain-0" in lines
    assert lines[-1].startswith("done: "), lines[-5:]
    assert not [ln for ln in lines if ln.startswith("commit ")], lines


def test_the_documented_node_example_gives_up_on_an_unknown_topic(cluster: LocalCluster) -> None:
    """Found from outside: the example retried UNKNOWN_TOPIC_OR_PARTITION (retriable, for a
    topic created a moment ago) without end, so a misspelt topic printed nothing, forever.
    It gives up after a few seconds now and says why (the subprocess timeout is the bound
    the old example failed)."""
    proc = subprocess.run(
        [node_binary(), "example.js", cluster.nodes[0].address, str(PROTOS), "no-such-topic"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "UNKNOWN_TOPIC_OR_PARTITION: unknown topic 'no-such-topic'" in proc.stderr
    assert not proc.stdout


def test_bench_grpc_records_runs_every_phase(cluster: LocalCluster) -> None:
    """`strom bench grpc-records` (small): every phase reports, both callers, all ratios."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "strom.cli.main",
            "bench",
            "grpc-records",
            "-b",
            cluster.bootstrap,
            "--topic",
            "benchsmoke",
            "--records",
            "3000",
            "--latency-records",
            "40",
            "--rate",
            "100",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    by = {r["name"]: r for r in out["results"]}
    for name in (
        "batch API produce (Py)",
        "ProduceRecords (Py)",
        "batch API consume (Py)",
        "Subscribe (Py)",
        "ProduceRecords (Node)",
        "Subscribe (Node)",
        "ProduceRecords (Node, to leaders)",
    ):
        assert by[name]["records"] >= 3000, (name, by[name])
    for name in (
        "end-to-end client (Py)",
        "end-to-end gRPC (Py)",
        "end-to-end gRPC (Node)",
        "end-to-end gRPC (Node, to leaders)",
    ):
        assert by[name]["records"] == 40 and by[name]["p50_ms"] > 0, (name, by[name])
    ctx = out["context"]
    assert {
        "produce_py_vs_batch",
        "subscribe_node_vs_batch",
        "e2e_node_p50_vs_client",
        "produce_node_leaders_vs_batch",
        "e2e_node_leaders_p99_vs_client",
    } <= set(ctx)


def _assigned(prog: NodeProgram) -> list[int]:
    last = prog.last("assignment")
    return last["partitions"] if last else []


def _read_ranges(prog: NodeProgram) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for e in prog.events("records"):
        out.update((e["partition"], o) for o in range(e["first"], e["last"] + 1))
    return out


def test_two_node_subscribers_split_six_partitions_and_one_takes_over(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    topic, group = "node-group", "node-group-g"
    new_topic(cluster, 6, 3, {"min.insync.replicas": "2"}, name=topic)
    with Producer(cluster.bootstrap) as p:
        for part in range(6):
            p.send_batch(topic, [b"a%d" % i for i in range(50)], partition=part)
        p.flush()
    args = ["--group", group, "--topic", topic, "--commit"]
    a = _node("group_member.js", "--address", cluster.nodes[0].address, *args, tmp_path=tmp_path)
    b = None
    try:
        a.wait_for(lambda _: _assigned(a) == list(range(6)), 30, "member A owning all six")
        b = _node(
            "group_member.js", "--address", cluster.nodes[1].address, *args, tmp_path=tmp_path
        )

        def split(_: Any) -> bool:
            pa_, pb_ = set(_assigned(a)), set(_assigned(b))  # type: ignore[union-attr]
            return len(pa_) == 3 and len(pb_) == 3 and pa_ | pb_ == set(range(6))

        a.wait_for(split, 30, "A and B owning three partitions each")
        # Everything produced before is read by someone (each partition by its owner).
        both = lambda: _read_ranges(a) | _read_ranges(b)  # noqa: E731
        want = {(part, o) for part in range(6) for o in range(50)}
        a.wait_for(lambda _: want <= both(), 30, "the first 300 records read")

        a.send("exit")  # A's stream ends: the node leaves the group for it
        assert a.wait_exit(20) == 0
        b.wait_for(lambda _: _assigned(b) == list(range(6)), 30, "B taking over all six")
        with Producer(cluster.bootstrap) as p:
            for part in range(6):
                p.send_batch(topic, [b"b%d" % i for i in range(50)], partition=part)
            p.flush()
        want2 = {(part, o) for part in range(6) for o in range(50, 100)}
        b.wait_for(lambda _: want2 <= _read_ranges(b), 30, "B reading the next 300 on all six")
        assert not b.events("end"), b.events("end")
    finally:
        a.kill()
        if b is not None:
            b.kill()


def _committed(prog: NodeProgram) -> dict[int, int]:
    out: dict[int, int] = {}
    for e in prog.events("committed"):
        out[e["partition"]] = max(out.get(e["partition"], 0), e["offset"])
    return out


def test_commits_survive_a_coordinator_restart(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    topic, group = "node-commits", "node-commits-g"
    new_topic(cluster, 6, 3, {"min.insync.replicas": "2"}, name=topic)

    def produce(n: int) -> None:
        with Producer(cluster.bootstrap) as p:
            for part in range(6):
                p.send_batch(topic, [b"x%d" % i for i in range(n)], partition=part)
            p.flush()

    produce(100)
    args = ["--address", cluster.nodes[2].address, "--group", group, "--topic", topic, "--commit"]
    m1 = _node("group_member.js", *args, tmp_path=tmp_path)
    try:
        m1.wait_for(lambda _: _committed(m1) == dict.fromkeys(range(6), 100), 60, "commits at 100")
        coordinator = cluster.coordinators[0]
        assert coordinator.process is not None
        coordinator.process.kill()  # SIGKILL: only what reached __consumer_offsets survives
        coordinator.start()
        cluster.wait_serving(coordinator)
        cluster.wait_coordinators_ready()
        produce(100)
        # The member keeps going through the restart (heartbeats and commits retried).
        m1.wait_for(lambda _: _committed(m1) == dict.fromkeys(range(6), 200), 90, "commits at 200")
        m1.send("exit")
        assert m1.wait_exit(20) == 0
    finally:
        m1.kill()

    # What a restarted coordinator has for the group: exactly the last commits.
    with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
        tps = [TopicPartition(topic, p) for p in range(6)]
        got = c.committed(tps)
        assert {tp.partition: om.offset for tp, om in got.items()} == dict.fromkeys(range(6), 200)

    # ... and a new member resumes there: it reads only what is produced from now on.
    m2 = _node("group_member.js", *args, tmp_path=tmp_path)
    try:
        m2.wait_for(lambda _: _assigned(m2) == list(range(6)), 30, "the new member owning all six")
        produce(10)
        want = {(part, o) for part in range(6) for o in range(200, 210)}
        m2.wait_for(lambda _: want <= _read_ranges(m2), 30, "the new member reading 200..209")
        assert min(o for _, o in _read_ranges(m2)) == 200
    finally:
        m2.kill()


def test_the_produce_helper_resends_only_the_partitions_that_failed(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """FIX (found from outside): lib/strom.js's produceRecords resent the whole call when one
    partition failed retriably, so with the only replica of partition 0 dead the other
    partitions held every record once per attempt; and its error joined empty messages.
    Now it resends only the failed partition's records (headers and null keys picked with
    them) and names each failed partition."""
    topic = "node-partial"
    new_topic(cluster, 3, 1, name=topic)
    with ClusterClient(cluster.bootstrap, retry_s=10) as c:
        leaders = {p.partition: p.leader for p in c.topic_metadata(topic).partitions}
    victim = cluster.node(leaders[0])
    serving = next(m for m in cluster.nodes if m.ident != victim.ident)
    n, attempts = 60, 5
    assert victim.process is not None
    victim.process.kill()  # SIGKILL: partition 0 has no replica left
    try:
        with _node(
            "produce_partial.js",
            "--address",
            serving.address,
            "--topic",
            topic,
            "--records",
            str(n),
            "--attempts",
            str(attempts),
            tmp_path=tmp_path,
        ) as prog:
            res = prog.result(timeout=120)
    finally:
        if not victim.alive():
            victim.start()
            cluster.wait_serving(victim)
    assert res["error"] is not None and "partition 0: " in res["error"], res
    assert "; ;" not in res["error"] and not res["error"].endswith(": "), res
    dead = {p for p, leader in leaders.items() if leader == victim.ident}
    pairs = zip(res["partitions"], res["offsets"], strict=True)
    written = {i: (p, o) for i, (p, o) in enumerate(pairs) if o >= 0}
    keyed_healthy = {
        i for i in range(n) if i % 5 != 4 and partition_for_key(b"k%d" % i, 3) not in dead
    }
    assert keyed_healthy <= written.keys(), res  # every healthy partition's records written

    tps = [TopicPartition(topic, p) for p in range(3)]
    found: dict[int, list[tuple[int, int]]] = {}
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"not every record read: {ends}"
            for r in consumer.poll(timeout_ms=500):
                i = int(r.value[1:])
                found.setdefault(i, []).append((r.partition, r.offset))
                assert r.headers == ((("h", str(i).encode()),) if i % 3 == 0 else ()), r
                assert r.key == (None if i % 5 == 4 else b"k%d" % i), r
    dupes = {i: at for i, at in found.items() if len(at) > 1}
    assert not dupes, dupes  # the old helper wrote these once per attempt
    assert {i: at[0] for i, at in found.items()} == written


def test_storage_calls_with_replica_id_unset_get_the_consumer_view(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """Found from outside: a grpc-js caller that leaves FetchRequest/ListOffsetsRequest's
    replica_id unset sends 0, which was read as "node 0's follower": ListOffsets answered
    from the log end (records of an open transaction visible to read_committed) and Fetch
    was refused (node 0 is no replica here) or, on a cluster with a node 0, read above the
    high watermark as a follower. Unset now means a consumer."""
    topic = new_topic(cluster, 1, 1, name="node-replica-unset")
    with Producer(cluster.bootstrap) as producer:
        for i in range(5):
            producer.send(topic, f"plain-{i}".encode(), partition=0)
        producer.flush(30)
    txn = Producer(cluster.bootstrap, transactional_id="node-replica-unset-tx")
    try:
        txn.init_transactions()
        txn.begin_transaction()
        assert txn.send(topic, b"open", partition=0).result(30).offset == 5
        with ClusterClient(cluster.bootstrap) as client:
            leader = client.metadata([topic], timeout_s=10).topics[0].partitions[0].leader
        address = cluster.node(leader).address
        with _node(
            "replica_id_unset.js", "--address", address, "--topic", topic, tmp_path=tmp_path
        ) as prog:
            res = prog.result(timeout=60)
    finally:
        with contextlib.suppress(Exception):
            txn.abort_transaction()
        txn.close()
    assert "error" not in res, res
    # read_committed stops at the open transaction (LSO 5), read_uncommitted at the HW (6).
    assert res["latest"] == {"committed": 5, "uncommitted": 6}, res
    committed, uncommitted = res["fetch"]["committed"], res["fetch"]["uncommitted"]
    assert committed["error_code"] == uncommitted["error_code"] == "NONE", res
    assert (committed["high_watermark"], committed["last_stable_offset"]) == (6, 5), res
    assert committed["end"] == 5 and uncommitted["end"] == 6, res


def test_leader_sigkill_during_a_long_lived_subscription(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    topic = "node-failover"
    new_topic(cluster, 3, 3, {"min.insync.replicas": "2"}, name=topic)
    serving = cluster.nodes[0]
    with ClusterClient(cluster.bootstrap, retry_s=10) as c:
        leaders = {p.partition: p.leader for p in c.topic_metadata(topic).partitions}
    victims = sorted({n for n in leaders.values() if n != serving.ident})
    assert victims, f"node {serving.ident} leads every partition: {leaders}"
    victim = cluster.node(victims[0])

    prog = _node(
        "failover_stream.js", "--address", serving.address, "--topic", topic, tmp_path=tmp_path
    )
    try:

        def progress(at_least: int) -> Any:
            def ok(_: Any) -> bool:
                p = prog.last("progress")
                return bool(p and p["acked"] >= at_least and p["received"] >= at_least // 2)

            return ok

        prog.wait_for(progress(2000), 60, "2000 records acknowledged and half of them read")
        assert victim.process is not None
        victim.process.kill()  # SIGKILL
        acked_at_kill = prog.last("progress")["acked"]  # type: ignore[index]
        # The leaderships move; production and the stream carry on through the node.
        with ClusterClient(serving.address, retry_s=10) as c:
            wait_for(
                lambda: victim.ident not in {p.leader for p in c.topic_metadata(topic).partitions},
                timeout=30,
                what=f"the partitions of node {victim.ident} to get new leaders",
            )
        prog.wait_for(progress(acked_at_kill + 3000), 90, "3000 more records after the kill")
        prog.send("stop")
        summary = prog.wait_for(lambda _: prog.last("summary"), 90, "the summary")
    finally:
        prog.kill()
        if not victim.alive():
            victim.start()
            cluster.wait_serving(victim)
    assert summary["stream_ended"] is None, summary
    assert summary["missing"] == 0 and summary["duplicates"] == 0, summary
    assert summary["out_of_order"] == 0, summary
    assert summary["acked"] >= acked_at_kill + 3000, summary
