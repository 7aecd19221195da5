"""A node that restarts while etcd still names it leader is fenced before it takes a role
(found by the 20-minute chaos run, seed 1437555605, issue 13).

The controller moves a dead node's leaderships away when the node's lease expires. When the
controller cannot (here: paused; in the chaos run: cut off from etcd or failing over) and the
node comes back with an empty data dir (a replaced disk), the new process registered while
etcd still named it leader with the old leader epoch. It led an empty log with that epoch,
the followers truncated to it, and every acknowledged record of the partition was gone. Now
a starting node has its previous life fenced by the controller (ControlledShutdown while it
is STARTING) before it takes any role, and rejoins the ISR by catching up.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.api import metadata_pb2 as md
from strom.client.admin import Admin
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.metadata import MetadataStore

pytestmark = pytest.mark.integration
TOPIC = "fenced"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path / "c",
        nodes=3,
        controllers=1,
        node_args=["--session-timeout-s", "2", "--replica-lag-time-max-ms", "1500"],
    )
    try:
        c.start()
        yield c
    finally:
        for m in c.controllers:
            if m.process is not None and m.process.alive():
                m.process.signal(signal.SIGCONT)
        c.kill()


def _registration(store: MetadataStore, node_id: int) -> md.NodeRegistration | None:
    _, items = store.get_prefix(store.keys.nodes_prefix, md.NodeRegistration)
    return next((v.value for v in items.values() if v.value.node_id == node_id), None)


def _partition(store: MetadataStore) -> md.PartitionState:
    _, items = store.get_prefix(store.keys.partitions_prefix, md.PartitionState)
    (state,) = [v.value for k, v in items.items() if store.keys.parse_partition(k) == (TOPIC, 0)]
    return state


def _read_all(bootstrap: str, expected: int) -> list[bytes]:
    """Every value of the partition up to its end, read from its leader: once the end
    offset (the HW) reached ``expected`` (a new leader learns the HW from its followers'
    fetches), or whatever is there after 30 s."""
    tp = TopicPartition(TOPIC, 0)
    out: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        deadline = time.monotonic() + 30
        while c.end_offsets([tp])[tp] < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        end = c.end_offsets([tp])[tp]
        deadline = time.monotonic() + 30
        while len(out) < end and time.monotonic() < deadline:
            out.extend(r.value for r in c.poll(timeout_ms=200))
    return out


def test_a_wiped_leader_restarted_before_the_controller_noticed_loses_nothing(
    cluster: LocalCluster,
) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(
            TOPIC, partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
        )
    store = MetadataStore([cluster.etcd.endpoint], cluster.cluster_name)
    try:
        wait_for(lambda: len(_partition(store).isr) == 3, timeout=30, what="a full ISR")
        values = [b"acked-%d" % i for i in range(300)]
        with Producer(cluster.bootstrap, acks="all", linger_ms=0) as p:
            for f in [p.send(TOPIC, v) for v in values]:
                f.result(timeout=30)
        before = _partition(store)
        leader = cluster.node(before.leader)
        old = _registration(store, leader.ident)
        assert old is not None

        # The controller cannot react; the leader dies and comes back with an empty disk.
        (controller,) = cluster.controllers
        controller.process.signal(signal.SIGSTOP)
        leader.process.kill()
        shutil.rmtree(cluster.root / f"node-{leader.ident}")
        leader.start()
        wait_for(
            lambda: (
                (r := _registration(store, leader.ident)) is not None
                and r.incarnation_id != old.incarnation_id
            ),
            timeout=30,
            what="the restarted node's new registration",
        )
        # Without fencing it would now lead the empty log with the old epoch (and the
        # followers truncate to it); with it, it waits for the controller, STARTING.
        wait_for(
            lambda: (
                _registration(store, leader.ident).state == md.NODE_STATE_RUNNING
                or "waiting for the controller to fence it" in leader.log_path.read_text()
            ),
            timeout=30,
            what="the restarted node to run or wait for fencing",
        )
        controller.process.signal(signal.SIGCONT)

        wait_for(
            lambda: (
                _partition(store).leader != -1
                and _registration(store, leader.ident).state == md.NODE_STATE_RUNNING
            ),
            timeout=60,
            what="a leader, and the restarted node running",
        )
        got = _read_all(cluster.bootstrap, len(values))
        assert got[: len(values)] == values, (
            f"{len(values) - len(set(got) & set(values))} acknowledged records lost"
        )
        # The wiped node catches up from the new leader and rejoins the ISR.
        wait_for(
            lambda: leader.ident in _partition(store).isr,
            timeout=60,
            what="the wiped node to rejoin the ISR",
        )
        assert _partition(store).leader != -1
    finally:
        store.close()
