"""Idempotent producers end to end (DESIGN §6): real etcd, a controller and three storage
nodes as processes. Producer ids come from controller-reserved blocks through any node;
retries are answered with their original offsets (also by a new leader after the old one
was killed), gaps and fenced epochs are refused. Waits are on conditions, never sleeps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strom.api import common_pb2, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import is_retriable
from strom.record import decode_records, encode_batch
from tests.conftest import member_metric

pytestmark = pytest.mark.integration
E = common_pb2.ErrorCode
TOPIC = "idem"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("idem") / "c",
        nodes=3,
        controllers=1,
        node_args=["--replica-lag-time-max-ms", "1500"],
    )
    try:
        c.start()
        with ClusterClient(c.bootstrap, retry_s=20) as client:
            Admin(cluster_client=client).create_topic(
                TOPIC, partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
            )
        wait_for(lambda: len(_state(c)[1]) == 3, timeout=20, what="a full ISR")
        yield c
    finally:
        c.kill()


def _state(c: LocalCluster) -> tuple[int, list[int]]:
    with ClusterClient(c.bootstrap, retry_s=5) as client:
        p = client.metadata([TOPIC]).topics[0].partitions[0]
    return p.leader, sorted(p.isr)


def _init(client: ClusterClient, address: str, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
    r = client.storage(address).InitProducerId(
        storage_pb2.InitProducerIdRequest(producer_id=pid, producer_epoch=epoch), timeout=10
    )
    assert r.error_code == E.NONE, r.error_message
    return r.producer_id, r.producer_epoch


def _batch(pid: int, epoch: int, seq: int, n: int = 2) -> bytes:
    return encode_batch(
        [b"p%d-e%d-s%d" % (pid, epoch, seq + i) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def _produce(client: ClusterClient, records: bytes) -> storage_pb2.ProducePartitionResponse:
    """acks=all to whoever leads, retrying while the answer says leadership is moving."""
    req = storage_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=TOPIC,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=0, records=records, current_leader_epoch=-1
                    )
                ],
            )
        ],
    )
    resp = client.with_leader(
        TOPIC,
        0,
        lambda s: s.Produce(req, timeout=10),
        lambda r: is_retriable(r.topics[0].partitions[0].error_code),
    )
    return resp.topics[0].partitions[0]


def _values(client: ClusterClient) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        req = storage_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            max_bytes=8 << 20,
            topics=[
                storage_pb2.FetchTopic(
                    topic=TOPIC,
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
        r = client.with_leader(
            TOPIC,
            0,
            lambda s, req=req: s.Fetch(req, timeout=10),
            lambda resp: resp.topics[0].partitions[0].error_code != E.NONE,
        )
        p = r.topics[0].partitions[0]
        assert p.error_code == E.NONE, p.error_message
        recs = [x for x in decode_records(p.records) if x.offset >= offset]
        if not recs:
            return out
        out.extend(x.value for x in recs)  # type: ignore[misc]
        offset = recs[-1].offset + 1


def test_ids_retries_gaps_and_fencing(cluster: LocalCluster) -> None:
    n1, n2 = cluster.node(1), cluster.node(2)
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        # Any node hands out ids; blocks reserved by the controller keep them unique.
        ids = [_init(client, n.address) for n in (n1, n2, n1, n2)]
        assert all(epoch == 0 for _, epoch in ids)
        assert len({pid for pid, _ in ids}) == 4
        pid = ids[0][0]

        # The same batch twice: one copy, the same offset both times.
        first = _produce(client, _batch(pid, 0, 0))
        assert first.error_code == E.NONE, first.error_message
        again = _produce(client, _batch(pid, 0, 0))
        assert (again.error_code, again.base_offset) == (E.NONE, first.base_offset)
        assert _values(client) == [b"p%d-e0-s0" % pid, b"p%d-e0-s1" % pid]

        # A gap (sequence 2..3 never arrived).
        gap = _produce(client, _batch(pid, 0, 4))
        assert gap.error_code == E.OUT_OF_ORDER_SEQUENCE and gap.base_offset == -1
        leader = cluster.node(_state(cluster)[0])
        assert member_metric(leader, "strom_storage_producer_duplicate_batches_total") >= 1
        assert (
            member_metric(
                leader,
                "strom_storage_producer_rejected_batches_total",
                error="OUT_OF_ORDER_SEQUENCE",
            )
            >= 1
        )

        # The producer bumps its epoch (on another node): the old epoch is fenced.
        assert _init(client, n2.address, pid, 0) == (pid, 1)
        r = _produce(client, _batch(pid, 1, 0))
        assert r.error_code == E.NONE, r.error_message
        fenced = _produce(client, _batch(pid, 0, 2))
        assert fenced.error_code == E.INVALID_PRODUCER_EPOCH
        assert len(_values(client)) == 4


def test_new_leader_answers_a_retry_with_the_original_offset(cluster: LocalCluster) -> None:
    """Last in the module: kills the leader."""
    with ClusterClient(cluster.bootstrap, retry_s=30) as client:
        pid, epoch = _init(client, cluster.node(3).address)
        for seq in (0, 2):
            assert _produce(client, _batch(pid, epoch, seq)).error_code == E.NONE
        acked = _produce(client, _batch(pid, epoch, 4))  # acks=all: every ISR member has it
        assert acked.error_code == E.NONE, acked.error_message
        before = _values(client)

        leader, _ = _state(cluster)
        proc = cluster.node(leader).process
        assert proc is not None
        proc.kill()  # SIGKILL: as if the answer to the last produce had been lost with it
        wait_for(
            lambda: _state(cluster)[0] not in (leader, -1),
            timeout=20,
            what="a new leader after the old one was killed",
        )
        retry = _produce(client, _batch(pid, epoch, 4))
        assert (retry.error_code, retry.base_offset) == (E.NONE, acked.base_offset)
        assert _values(client) == before  # no duplicate
        nxt = _produce(client, _batch(pid, epoch, 6))
        assert (nxt.error_code, nxt.base_offset) == (E.NONE, acked.base_offset + 2)
