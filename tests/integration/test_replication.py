"""Replication end to end (issue: replication, "Must show"): real etcd, two controllers and
three storage nodes as processes; replication factor 3, min.insync.replicas=2, acks=all."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.api import common_pb2, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.errors import is_retriable
from strom.record import decode_records, encode_batch
from tests.conftest import TopicFactory, create_topic, member_metric, module_cluster

pytestmark = pytest.mark.integration
NONE = common_pb2.ErrorCode.NONE
#: The topic of the test with a cluster of its own.
TOPIC = "replicated"


# One cluster for the module, each test on a topic of its own; members a test killed are
# restarted after it.
cluster = module_cluster(nodes=3, controllers=2, node_args=["--replica-lag-time-max-ms", "1500"])
HEALED_CLUSTERS = ("cluster",)


@pytest.fixture
def topic(cluster: LocalCluster, new_topic: TopicFactory) -> str:
    """A fresh replicated partition (RF 3, min.insync.replicas=2) with its full ISR."""
    name = new_topic(cluster, 1, 3, {"min.insync.replicas": "2"})
    wait_for(lambda: len(_state(cluster, name)[2]) == 3, timeout=20, what="a full ISR")
    return name


def _state(c: LocalCluster, topic: str) -> tuple[int, int, list[int]]:
    """(leader, leader_epoch, isr) of partition 0 as the cluster reports it."""
    with ClusterClient(c.bootstrap, retry_s=5) as client:
        md = client.metadata([topic])
    p = md.topics[0].partitions[0]
    return p.leader, p.leader_epoch, sorted(p.isr)


def _produce(
    client: ClusterClient,
    topic: str,
    values: list[bytes],
    acks: int = -1,
    address: str | None = None,
    keys: list[bytes] | None = None,
) -> tuple[int, int]:
    """One batch; returns (error_code, base_offset). Routed to the leader unless ``address``."""
    req = storage_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=5000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=topic,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=0,
                        records=encode_batch(values, keys=keys),
                        current_leader_epoch=-1,
                    )
                ],
            )
        ],
    )
    if address is not None:
        r = client.storage(address).Produce(req, timeout=10).topics[0].partitions[0]
    else:
        r = (
            client.with_leader(
                topic,
                0,
                lambda s: s.Produce(req, timeout=10),
                lambda resp: (
                    is_retriable(resp.topics[0].partitions[0].error_code)
                    and resp.topics[0].partitions[0].error_code != NONE
                ),
            )
            .topics[0]
            .partitions[0]
        )
    return r.error_code, r.base_offset


def _read_all(client: ClusterClient, topic: str) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        req = storage_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            max_bytes=8 << 20,
            topics=[
                storage_pb2.FetchTopic(
                    topic=topic,
                    partitions=[
                        storage_pb2.FetchPartition(
                            partition=0,
                            fetch_offset=offset,
                            current_leader_epoch=-1,
                            partition_max_bytes=4 << 20,
                        )
                    ],
                )
            ],
        )
        r = (
            client.with_leader(
                topic,
                0,
                lambda s, req=req: s.Fetch(req, timeout=10),
                lambda resp: resp.topics[0].partitions[0].error_code != NONE,
            )
            .topics[0]
            .partitions[0]
        )
        assert r.error_code == NONE, r.error_message
        recs = decode_records(r.records)
        if not recs:
            return out
        out.extend((x.offset, x.value) for x in recs if x.offset >= offset)
        offset = recs[-1].offset + 1


def _member(c: LocalCluster, node_id: int) -> Member:
    return c.node(node_id)


def test_acknowledged_records_survive_leader_sigkill(cluster: LocalCluster, topic: str) -> None:
    acked: dict[bytes, int] = {}
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        i = 0

        def send(n: int) -> None:
            nonlocal i
            for _ in range(n):
                values = [b"v%d-%d" % (i, j) for j in range(10)]
                code, base = _produce(client, topic, values)
                if code == NONE:
                    for j, v in enumerate(values):
                        acked[v] = base + j
                i += 1

        send(30)
        leader, epoch, _ = _state(cluster, topic)
        _member(cluster, leader).process.kill()  # SIGKILL the leader mid-stream
        send(30)
        new_leader, new_epoch, _ = _state(cluster, topic)
        assert new_leader != leader and new_epoch > epoch
        log = _read_all(client, topic)
    offsets = [o for o, _ in log]
    assert offsets == list(range(len(offsets)))  # in order, no gap
    where = {v: o for o, v in log}
    assert len(acked) >= 500
    for v, o in acked.items():  # every acknowledged record, at the offset it was acked with
        assert where.get(v) == o


def test_restarted_follower_catches_up_and_rejoins_the_isr(
    cluster: LocalCluster, topic: str
) -> None:
    leader, _, _ = _state(cluster, topic)
    follower = next(n for n in cluster.nodes if n.ident != leader)
    follower.process.kill()
    wait_for(
        lambda: follower.ident not in _state(cluster, topic)[2],
        timeout=20,
        what="the dead follower to leave the ISR",
    )
    with ClusterClient(cluster.bootstrap) as client:
        for k in range(20):
            assert _produce(client, topic, [b"missed-%d" % k])[0] == NONE
    cluster.restart(follower)
    wait_for(
        lambda: follower.ident in _state(cluster, topic)[2],
        timeout=30,
        what="the restarted follower to rejoin the ISR",
    )


def test_paused_follower_shrinks_isr_and_produce_continues(
    cluster: LocalCluster, topic: str
) -> None:
    leader, _, _ = _state(cluster, topic)
    follower = next(n for n in cluster.nodes if n.ident != leader)
    follower.process.signal(signal.SIGSTOP)
    try:
        with ClusterClient(cluster.bootstrap) as client:
            wait_for(
                lambda: follower.ident not in _state(cluster, topic)[2],
                timeout=20,
                what="the paused follower to leave the ISR",
            )
            for k in range(20):  # ISR of 2 still satisfies min.insync.replicas=2
                assert _produce(client, topic, [b"during-%d" % k])[0] == NONE
    finally:
        follower.process.signal(signal.SIGCONT)
    wait_for(
        lambda: follower.ident in _state(cluster, topic)[2],
        timeout=30,
        what="the resumed follower to rejoin the ISR",
    )


def test_paused_old_leader_is_fenced_when_it_wakes_up(cluster: LocalCluster, topic: str) -> None:
    leader, _, _ = _state(cluster, topic)
    old = _member(cluster, leader)
    old.process.signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: _state(cluster, topic)[0] not in (leader, -1),
            timeout=20,
            what="a new leader after the old one stopped",
        )
    finally:
        old.process.signal(signal.SIGCONT)
    with ClusterClient(cluster.bootstrap) as client:
        code, _ = _produce(client, topic, [b"zombie-write"], acks=-1, address=old.address)
        assert code != NONE  # refused: not leader any more, fenced, or never committed
        assert _produce(client, topic, [b"after"])[0] == NONE
        values = [v for _, v in _read_all(client, topic)]
    assert b"zombie-write" not in values and b"after" in values


def test_controller_fences_a_killed_node_before_its_lease_expires(tmp_path: Path) -> None:
    """With a 60 s node lease, only the controller's health streams (prober.py) can notice a
    SIGKILLed leader within the test's timeout: it revokes the node's lease, and the partition
    gets a new leader that takes acks=all writes."""
    c = LocalCluster(
        tmp_path / "c", nodes=3, controllers=1, node_args=["--session-timeout-s", "60"]
    )
    try:
        c.start()
        with ClusterClient(c.bootstrap, retry_s=20) as client:
            Admin(cluster_client=client).create_topic(
                TOPIC, partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
            )
            wait_for(lambda: len(_state(c, TOPIC)[2]) == 3, timeout=20, what="a full ISR")
            leader, epoch, _ = _state(c, TOPIC)
            _member(c, leader).process.kill()
            wait_for(
                lambda: _state(c, TOPIC)[0] not in (leader, -1),
                timeout=15,
                what="a new leader long before the 60 s lease expires",
            )
            assert _state(c, TOPIC)[1] > epoch
            assert leader not in {n.node_id for n in client.metadata().nodes}
            assert _produce(client, TOPIC, [b"after"])[0] == NONE
    finally:
        c.kill()


def test_a_follower_behind_a_compaction_catches_up(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: the leader's cleaner merged emptied batches 0..22 into one while a
    killed follower held the batches 0..9; restarted, the follower fetched at 10, was served
    the merged batch starting at 0, refused it as below its log end, and stayed out of the
    ISR for good. Now the leader serves that batch cut at the fetch offset."""
    c = make_cluster(
        nodes=3,
        controllers=1,
        node_args=["--replica-lag-time-max-ms", "1500", "--log-cleanup-interval-ms", "200"],
    )
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "16384",
        "min.cleanable.dirty.ratio": "0.01",
    }
    topic = create_topic(c, "compacted-lag", 1, 3, config)
    wait_for(lambda: len(_state(c, topic)[2]) == 3, timeout=20, what="a full ISR")
    leader, _, _ = _state(c, topic)
    follower = next(n for n in c.nodes if n.ident != leader)
    with ClusterClient(c.bootstrap) as client:

        def put(i: int) -> None:
            assert _produce(client, topic, [b"v%d" % i], keys=[b"k%d" % (i % 3)])[0] == NONE

        for i in range(10):  # acks=all with the full ISR: the follower has all ten
            put(i)
        follower.process.kill()
        wait_for(
            lambda: follower.ident not in _state(c, topic)[2],
            timeout=20,
            what="the dead follower to leave the ISR",
        )

        def cleanings() -> float:
            return member_metric(
                _member(c, leader), "strom_storage_cleaner_cleanings_total", reason="dirty_ratio"
            )

        before = cleanings()
        for i in range(10, 70):
            put(i)
        wait_for(
            lambda: cleanings() > before,
            timeout=30,
            what="the leader's cleaner",
        )
        c.restart(follower)
        wait_for(
            lambda: follower.ident in _state(c, topic)[2],
            timeout=30,
            what="the restarted follower to rejoin the ISR",
        )
    end = member_metric(follower, "strom_storage_log_end_offset", topic=topic, partition="0")
    assert end == 70
