"""A storage node restarted on an empty data dir rejoins the ISR only once it caught up.

FIX (found from outside): a node that came back on an emptied data dir (a Kubernetes
emptyDir, a replaced volume) within ``replica.lag.time.max.ms`` of its last fetch was put
back into the ISR within milliseconds, from the fetch position of its previous run that
its leaders kept. The preferred-leader election then made it leader of its partitions with
an empty log, and the other replicas truncated every acknowledged record to match it
(acks=all, RF=3, min.insync.replicas=2). Now a leader counts only the fetches of the
follower's current process (its registered incarnation) for its joining.

Whether the old code lost the race depended on the new process's first fetch reaching its
leaders before their next ISR check; the test pauses the process as it registers RUNNING
(until its lease runs out), so the window is always there, and records the size of its log
each time it is seen back in an ISR.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable

import pytest

from strom.api import metadata_pb2 as md
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.metadata import MetadataStore
from strom.metadata.store import WatchEvent, decode
from tests.conftest import create_topic

pytestmark = pytest.mark.integration

TOPIC = "wiped"
PARTITIONS = 24
PER_PARTITION = 50
WIPED = 1


def _states(store: MetadataStore) -> dict[int, md.PartitionState]:
    _, items = store.get_prefix(store.keys.partitions_prefix, md.PartitionState)
    out = {}
    for key, v in items.items():
        tp = store.keys.parse_partition(key)
        if tp is not None and tp[0] == TOPIC:
            out[tp[1]] = v.value
    return out


def _registration(store: MetadataStore, node_id: int) -> md.NodeRegistration | None:
    _, items = store.get_prefix(store.keys.nodes_prefix, md.NodeRegistration)
    return next((v.value for v in items.values() if v.value.node_id == node_id), None)


def _log_bytes(cluster: LocalCluster, node_id: int, partition: int) -> int:
    """The bytes of a replica's log segments (0 while it has none)."""
    path = cluster.root / f"node-{node_id}" / f"{TOPIC}-{partition}"
    return sum(f.stat().st_size for f in path.glob("*.log")) if path.is_dir() else 0


def _read_all(bootstrap: str) -> dict[int, list[bytes]]:
    """Every committed value of each partition, up to its end offset now."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps)
        ends = c.end_offsets(tps)
        want = sum(ends.values())
        deadline = time.monotonic() + 60
        got = 0
        while got < want and time.monotonic() < deadline:
            for r in c.poll(timeout_ms=200):
                out[r.partition].append(r.value)
                got += 1
    return out


def test_a_node_restarted_on_an_empty_data_dir_loses_no_acknowledged_record(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=3, controllers=1, coordinators=0)
    create_topic(
        cluster,
        TOPIC,
        partitions=PARTITIONS,
        replication_factor=3,
        config={"min.insync.replicas": "2"},
    )
    store = MetadataStore([cluster.etcd.endpoint], cluster.cluster_name)
    try:
        wait_for(
            lambda: all(len(s.isr) == 3 for s in _states(store).values()),
            timeout=30,
            what="full ISRs",
        )
        values = {
            p: [b"%d-%d" % (p, i) + b"x" * 1000 for i in range(PER_PARTITION)]
            for p in range(PARTITIONS)
        }
        with Producer(cluster.bootstrap, acks="all", enable_idempotence=True) as producer:
            futures = [producer.send(TOPIC, v, partition=p) for p, vs in values.items() for v in vs]
            for f in futures:
                f.result(timeout=60)
        preferred = [p for p, s in _states(store).items() if s.replicas[0] == WIPED]
        assert preferred, "the wiped node should be the preferred leader of some partitions"

        node = cluster.node(WIPED)
        old = _registration(store, WIPED)
        assert old is not None
        # A graceful stop (SIGTERM) takes the node out of every ISR ...
        node.process.stop()
        wait_for(
            lambda: all(WIPED not in s.isr for s in _states(store).values()),
            timeout=30,
            what="the stopped node out of every ISR",
        )
        # ... and each time it is seen back in one, the size of its log is taken then.
        joined: dict[int, int] = {}

        def on_events(events: list[WatchEvent], revision: int) -> None:
            for ev in events:
                tp = store.keys.parse_partition(ev.key)
                if tp is None or tp[0] != TOPIC or ev.value is None or tp[1] in joined:
                    continue
                if WIPED in decode(ev.value, md.PartitionState).isr:
                    joined[tp[1]] = _log_bytes(cluster, WIPED, tp[1])

        # The new process is paused the moment it registers RUNNING, before its first
        # fetches reach its leaders (it starts fetching right after): what a slow start
        # looks like, and the window in which its leaders saw it RUNNING with only its
        # previous run's positions.
        paused = threading.Event()

        def on_nodes(events: list[WatchEvent], revision: int) -> None:
            for ev in events:
                reg = None if ev.value is None else decode(ev.value, md.NodeRegistration)
                if (
                    reg is not None
                    and reg.node_id == WIPED
                    and reg.incarnation_id != old.incarnation_id
                    and reg.state == md.NODE_STATE_RUNNING
                    and not paused.is_set()
                ):
                    node.process.signal(signal.SIGSTOP)
                    paused.set()

        revision = store.revision() + 1
        watches = [
            store.watch_prefix(store.keys.partitions_prefix, revision, on_events),
            store.watch_prefix(store.keys.nodes_prefix, revision, on_nodes),
        ]
        # The same node id on an empty data dir, at once: well within the 10 s lag time of
        # its last fetches.
        shutil.rmtree(cluster.root / f"node-{WIPED}")
        (cluster.root / f"node-{WIPED}").mkdir()
        node.start()
        try:
            wait_for(paused.is_set, timeout=60, what="the restarted node running (then paused)")
            # Paused until its lease (2 s) runs out: its leaders check their ISRs meanwhile.
            wait_for(
                lambda: _registration(store, WIPED) is None,
                timeout=30,
                what="the paused node's registration to expire",
            )
        finally:
            node.process.signal(signal.SIGCONT)
        # It rejoins every ISR, and leads its preferred partitions again (the controller's
        # automatic preferred-leader election).
        wait_for(
            lambda: all(
                WIPED in s.isr and (p not in preferred or s.leader == WIPED)
                for p, s in _states(store).items()
            ),
            timeout=90,
            what="the wiped node back in every ISR and leading its preferred partitions",
        )
        wait_for(lambda: len(joined) == PARTITIONS, timeout=30, what="every join seen")
        for watch in watches:
            watch.cancel()
        # It joined each ISR only with every record: its log held them all by then (the
        # batches a follower copies are the leader's bytes).
        full = {p: _log_bytes(cluster, 2, p) for p in range(PARTITIONS)}
        assert joined == full, f"bytes the wiped node held when back in each ISR: {joined}"
        got = _read_all(cluster.bootstrap)
        lost = {p: PER_PARTITION - len(set(got[p]) & set(vs)) for p, vs in values.items()}
        assert not any(lost.values()), f"acknowledged records lost per partition: {lost}"
        for other in cluster.nodes:
            if other.ident != WIPED:
                assert "truncating fully" not in other.log_path.read_text()
    finally:
        store.close()
