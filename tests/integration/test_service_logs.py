"""What the services write in their (JSON) logs when something happens that an on-call
operator must be able to follow: a storage node leaving and registering (the controller),
group membership changes (the group coordinator), internal partitions that cannot load, the
start-up summary and recovery. Each test reads the real log files of real processes."""

from __future__ import annotations

import json
import re
import signal
import time
from typing import Any

import pytest

from strom import Admin, Consumer
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def log_size(member: Member) -> int:
    """Where the member's log ends now: what a test reads after."""
    return member.log_path.stat().st_size if member.log_path.exists() else 0


def log_lines(member: Member, since: int = 0) -> list[dict[str, Any]]:
    """The member's JSON log lines written after byte ``since``."""
    with open(member.log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    out = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            try:
                out.append(json.loads(raw))
            except ValueError:  # a line being written
                continue
    return out


def matching(member: Member, pattern: str, since: int = 0) -> list[dict[str, Any]]:
    return [x for x in log_lines(member, since) if re.search(pattern, x["msg"])]


def wait_logged(member: Member, pattern: str, since: int = 0, timeout: float = 60) -> dict:
    """The first line after ``since`` whose message matches ``pattern`` (waits for it)."""
    found: list[dict[str, Any]] = []

    def logged() -> bool:
        found[:] = matching(member, pattern, since)
        return bool(found)

    wait_for(logged, timeout=timeout, what=f"{pattern!r} in {member.log_path.name}")
    return found[0]


def leaders(cluster: LocalCluster, topic: str) -> dict[int, int]:
    with Admin(cluster.bootstrap) as admin:
        parts = admin.describe_topics([topic])[topic].partitions
    out: dict[int, int] = {}
    for p in parts:
        out[p.leader] = out.get(p.leader, 0) + 1
    return out


def test_the_controller_names_the_nodes_that_leave_and_register(make_cluster: Any) -> None:
    """Why each left (lease expired: hung; fenced: its port refused connections; controlled
    shutdown), how many partitions it led, and each registration. Before, the controller
    logged only "6 partition states committed ... after a node left"."""
    cluster = make_cluster(nodes=2, controllers=1, coordinators=0)
    controller, node2 = cluster.controllers[0], cluster.node(2)
    start = wait_logged(controller, r"^starting controller ")
    assert start["config"]["etcd"] == cluster.etcd.endpoint and "version" in start
    create_topic(cluster, "moved", partitions=6)
    led = leaders(cluster, "moved").get(2, 0)
    assert led > 0

    since = log_size(controller)
    node2.process.signal(signal.SIGSTOP)  # hung: its lease expires
    try:
        line = wait_logged(controller, r"^node 2 \(.*\) left", since)
    finally:
        node2.process.signal(signal.SIGCONT)
    assert line["level"] == "info"
    assert line["msg"] == (
        f"node 2 ({node2.address}) left: its lease expired or was revoked without a "
        f"controlled shutdown (the process died, hung, or lost etcd); {led} partitions led "
        "by it"
    ), line["msg"]
    assert line["partitions_led"] == led and line["controlled"] is False
    line = wait_logged(controller, r"^node 2 registered", since)
    assert re.fullmatch(
        rf"node 2 registered \({re.escape(node2.address)}, rack -, incarnation [0-9a-f-]+, "
        r"version \S+\)",
        line["msg"],
    ), line["msg"]
    cluster.wait_cluster_ready()

    since = log_size(controller)
    node2.process.signal(signal.SIGKILL)  # its port refuses connections: fenced at once
    line = wait_logged(controller, r"^node 2 \(.*\) left", since)
    assert "this controller revoked its lease (its port refused connections" in line["msg"]

    since, node_since = log_size(controller), log_size(node2)
    node2.start()
    cluster.wait_serving(node2)
    wait_logged(controller, r"^node 2 registered", since)
    cluster.wait_cluster_ready()
    # Its start: the version and effective settings, then how long opening (here:
    # recovering) its logs took and which were slowest.
    start = wait_logged(node2, r"^starting storage-node ", node_since)
    config = start["config"]
    assert config["data_dir"] == str(cluster.root / "node-2")
    assert (config["etcd"], config["log_level"], config["node_id"]) == (
        cluster.etcd.endpoint,
        "info",
        2,
    )
    loaded = wait_logged(node2, r"^loaded \d+ logs", node_since)
    slowest = ", ".join([r"moved-\d+ \d+ ms"] * min(led, 3))
    assert re.fullmatch(
        rf"loaded {led} logs in \d+ ms \(recovered after an unclean shutdown\); slowest: "
        + slowest,
        loaded["msg"],
    ), loaded["msg"]
    assert loaded["clean_shutdown"] is False and loaded["logs"] == led

    since = log_size(controller)
    node2.process.stop()  # SIGTERM: a controlled shutdown
    line = wait_logged(controller, r"^node 2 \(.*\) left", since)
    assert "it deregistered (controlled shutdown)" in line["msg"], line["msg"]
    assert line["controlled"] is True
    # One line per change: neither departure nor registration repeated.
    assert len(matching(controller, r"^node 2 (registered|\(.*\) left)", since)) == 1


def test_the_group_coordinator_logs_each_membership_change(
    three_node_cluster: LocalCluster,
) -> None:
    cluster = three_node_cluster
    coordinator = cluster.coordinators[0]
    topic = create_topic(cluster, f"members-{time.monotonic_ns()}", partitions=2)
    group = f"g-logs-{time.monotonic_ns()}"
    since = log_size(coordinator)
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest") as c:
        c.subscribe([topic])
        wait_for(
            lambda: c.poll(timeout_ms=200) is not None and len(c.assignment()) == 2,
            timeout=60,
            what="the member's assignment",
        )
        member = c.group_metadata().member_id
    joined = wait_logged(coordinator, rf"^group {group}: .*joined", since)
    assert joined["level"] == "info" and joined["group"] == group
    assert re.fullmatch(
        rf"group {group}: epoch \d+ -> \d+: member {member} joined; 1 members", joined["msg"]
    ), joined["msg"]
    left = wait_logged(coordinator, rf"^group {group}: .*left", since)
    assert re.fullmatch(
        rf"group {group}: epoch (\d+) -> (\d+): member {member} left; 0 members", left["msg"]
    ), left["msg"]
    # One line per change, none per heartbeat (a member heartbeats every 200 ms here).
    assert len(matching(coordinator, rf"^group {group}:", since)) == 2


def test_an_offline_internal_partition_is_one_warning_then_one_line_when_it_loads(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nodes=1, controllers=1, coordinators=1, coordinator_args=["--offsets-partitions", "1"]
    )
    node, coordinator = cluster.node(1), cluster.coordinators[0]
    node.process.signal(signal.SIGKILL)
    wait_for(
        lambda: matching(cluster.controllers[0], r"^node 1 \(.*\) left"),
        timeout=60,
        what="the node's departure",
    )
    coordinator.process.stop()
    since = log_size(coordinator)
    coordinator.start()
    first = wait_logged(coordinator, r"^group shard 0 .*cannot load", since)
    assert first["level"] == "warning"
    assert re.fullmatch(
        r"group shard 0 \(__consumer_offsets-0\) cannot load for \d+s: LEADER_NOT_AVAILABLE: "
        r"__consumer_offsets-0 has no leader \(replicas \[1\], ISR \[1\], offline: \[1\]\); "
        "retrying",
        first["msg"],
    ), first["msg"]
    # Retried every 2 s at most, and still one line per shard (the next is due 30 s after
    # the first; the transaction shards have their own).
    started = time.monotonic()
    node.start()
    loaded = wait_logged(coordinator, r"^loaded group shard 0", since)
    assert re.search(r"\(after failing to load for \d+\.\ds\)$", loaded["msg"]), loaded["msg"]
    if time.monotonic() - started < 25:
        assert len(matching(coordinator, r"^group shard 0 .*cannot load", since)) == 1
    assert not matching(coordinator, r"loading shard", since)  # the old line, ten a second
    assert not matching(coordinator, r"CLIENT_ERROR", since)


def test_a_topic_config_change_says_what_was_set_and_what_was_removed(
    three_node_cluster: LocalCluster,
) -> None:
    """Before, removing a topic's only override logged '"altered configs of topic t2",
    "configs": {}': what was left, not what changed."""
    cluster = three_node_cluster
    controller = cluster.active_controller()
    assert controller is not None
    topic = create_topic(cluster, f"conf-{time.monotonic_ns()}", config={"retention.ms": "60000"})
    since = log_size(controller)
    with Admin(cluster.bootstrap) as admin:
        admin.alter_configs(topic, set={"segment.ms": "3600000"}, delete=["retention.ms"])
        admin.alter_configs(topic, delete=["segment.ms"])
    changed = wait_logged(controller, rf"^altered configs of topic {topic}: set", since)
    assert changed["msg"] == (
        f"altered configs of topic {topic}: set segment.ms=3600000; removed retention.ms"
    )
    assert changed["set"] == {"segment.ms": "3600000"} and changed["removed"] == ["retention.ms"]
    removed = wait_logged(controller, rf"^altered configs of topic {topic}: removed", since)
    assert removed["msg"] == f"altered configs of topic {topic}: removed segment.ms"
    assert removed["configs"] == {}


def test_a_cluster_starting_logs_no_error(make_cluster: Any) -> None:
    """Every service's start (the first snapshot of the cluster reaches each listener of its
    view) writes no error and no traceback: found from outside, every controller start logged
    "metadata listener failed" with an AssertionError (its listener read the view before the
    service kept it) and skipped that first event's work."""
    cluster = make_cluster(nodes=1, controllers=2, coordinators=1)
    create_topic(cluster, "started")  # the active controller has reconciled by then
    for member in cluster.members:
        text = member.log_path.read_text(errors="replace")
        bad = [
            x
            for x in log_lines(member)
            if x.get("level", "").lower() in ("error", "critical") or "exc_info" in x
        ]
        assert not bad and "Traceback" not in text, (member.log_path.name, bad)
