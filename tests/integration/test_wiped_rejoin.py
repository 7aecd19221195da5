"""A storage node restarted on an empty data dir rejoins the ISR only once it caught up.

FIX (found from outside): a node that came back on an emptied data dir (a Kubernetes
emptyDir, a replaced volume) within ``replica.lag.time.max.ms`` of its last fetch was put
back into the ISR within milliseconds, from the fetch position of its previous run that
its leaders kept. The preferred-leader election then made it leader of its partitions with
an empty log, and the other replicas truncated every acknowledged record to match it
(acks=all, RF=3, min.insync.replicas=2). Now a leader counts only the fetches of the
follower's current process (its registered incarnation) for its joining.
"""

from __future__ import annotations

import shutil
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
from tests.conftest import create_topic, member_metric

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
        # A graceful stop (SIGTERM), then the same node id on an empty data dir, at once:
        # well within the 10 s lag time of its last fetches.
        node.process.stop()
        shutil.rmtree(cluster.root / f"node-{WIPED}")
        (cluster.root / f"node-{WIPED}").mkdir()
        node.start()
        wait_for(
            lambda: (
                (r := _registration(store, WIPED)) is not None
                and r.incarnation_id != old.incarnation_id
                and r.state == md.NODE_STATE_RUNNING
            ),
            timeout=60,
            what="the restarted node running",
        )
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
        # It joined only with every record: its log holds them all.
        for p in range(PARTITIONS):
            end = member_metric(node, "strom_storage_log_end_offset", topic=TOPIC, partition=str(p))
            assert end >= PER_PARTITION, f"partition {p}: the wiped node's log ends at {end}"
        got = _read_all(cluster.bootstrap)
        lost = {p: PER_PARTITION - len(set(got[p]) & set(vs)) for p, vs in values.items()}
        assert not any(lost.values()), f"acknowledged records lost per partition: {lost}"
        for other in cluster.nodes:
            if other.ident != WIPED:
                assert "truncating fully" not in other.log_path.read_text()
    finally:
        store.close()
