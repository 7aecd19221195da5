"""A storage node short of file descriptors (RLIMIT_NOFILE) does not lead partitions whose
log it could not open: it keeps some descriptors free and hands those leaderships to another
in-sync replica (strom.storage.manager.FD_RESERVE, IsrManager._resign_unopened).

Found from outside: under ``ulimit -n 256`` a node given a 1,200-partition topic logged a
traceback per partition per second, went on leading 300 partitions it had no log for, and
ran out of descriptors for connections too (its metrics and health endpoints hung)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

import pytest

from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.log.manager import log_dir_name
from strom.storage.manager import FD_RESERVE
from tests.conftest import member_metric

pytestmark = pytest.mark.integration


def _open_logs(pid: int, topic: str, partitions: int) -> set[int]:
    """The partitions of ``topic`` the process has a file open in (its segments)."""
    dirs = {f"/{log_dir_name(topic, p)}/": p for p in range(partitions)}
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        for d, p in dirs.items():
            if d in target:
                found.add(p)
    return found


def test_a_node_short_of_descriptors_hands_over_the_partitions_it_cannot_open(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=2, controllers=1, coordinators=0)
    short = cluster.nodes[0]
    pid = short.process.pid  # type: ignore[union-attr]
    used = len(os.listdir(f"/proc/{pid}/fd"))
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    # Room for a few logs above the reserve, and for fewer than the topic's replicas
    # without it (the code before opened logs until none was left).
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (used + FD_RESERVE + 6, hard))
    topic, partitions = "fd-short", 96
    began = time.monotonic()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=2)

    def leaders() -> dict[int, int]:
        with ClusterClient(cluster.bootstrap, retry_s=10) as client:
            return {p.partition: p.leader for p in client.topic_metadata(topic).partitions}

    def led_without_a_log() -> set[int]:
        led = {p for p, leader in leaders().items() if leader == short.ident}
        return led - _open_logs(pid, topic, partitions)

    # The short node leads half the partitions at first; those it could not open must go
    # to the other node (before: led for good, nobody able to produce to them).
    wait_for(
        lambda: len(leaders()) == partitions and not led_without_a_log(),
        timeout=30,
        what="the short node to hand over the partitions it could not open",
    )
    opened = _open_logs(pid, topic, partitions)
    assert len(opened) < partitions  # the limit did bite
    assert all(leader >= 0 for leader in leaders().values())
    # It still leads what it opened, and was never cut off: before, it spent every
    # descriptor on logs, lost its lease (no connection to etcd) and with it everything.
    assert {p for p, leader in leaders().items() if leader == short.ident} & opened
    assert member_metric(short, "strom_metadata_leases_lost_total", service="storage-node") == 0
    # Every partition takes records, the short node still accepting connections.
    with Producer(cluster.bootstrap, acks=1) as producer:
        sent = [producer.send(topic, b"x", partition=p) for p in range(partitions)]
        for future in sent:
            future.get(30)
    # One line a minute, not a traceback per partition per retry.
    logged = short.log_path.read_text()
    assert "Traceback" not in logged
    minutes = int((time.monotonic() - began) // 60)
    assert 1 <= logged.count("could not open the logs of") <= 1 + minutes
    # The other node, started with the defaults (half the limit for connections), has
    # nothing to warn about.
    assert WARNING not in cluster.nodes[1].log_path.read_text()


WARNING = "the open-file limit (RLIMIT_NOFILE"


def test_a_node_warns_at_start_when_connections_and_logs_may_outgrow_the_limit(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """--max-connections as high as the open-file limit leaves the logs nothing: said in
    one line at start, before the node runs out at run time."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        # skip is justified: Linux caps RLIMIT_NOFILE at fs.nr_open, so CI never lands here.
        pytest.skip("no open-file limit")
    cluster = make_cluster(
        nodes=1, controllers=1, coordinators=0, node_args=["--max-connections", str(soft)]
    )
    node = cluster.nodes[0]
    wait_for(lambda: WARNING in node.log_path.read_text(), timeout=10, what="the warning")
    assert node.log_path.read_text().count(WARNING) == 1
