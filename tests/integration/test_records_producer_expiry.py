"""ProduceRecords through the node's own idempotent producer never writes a call twice when
the leader forgets the producer (``producer.id.expiration.ms``) between two attempts of it.

Found from outside: a call's first attempt was appended but not acknowledged
(NOT_ENOUGH_REPLICAS_AFTER_APPEND: both followers paused), the leader expired the producer
meanwhile and answered the retry UNKNOWN_PRODUCER_ID, and the node's producer restarted at
sequence 0 under the same epoch: the records were written again. The call now fails saying
the records may have been written, and the next call goes on under a new epoch.

Fast through the flags: producer state expires after 1 s (topic config) and the node looks
every 200 ms (``--log-cleanup-interval-ms``); followers leave the ISR after 1 s. Real etcd, a
controller and three storage nodes as processes; waits are on conditions."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from strom import Consumer, TopicPartition
from strom.api import common_pb2, records_pb2, records_pb2_grpc, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
E = common_pb2.ErrorCode


def _state(cluster: LocalCluster, topic: str) -> tuple[int, list[int]]:
    with Admin(cluster.bootstrap) as admin:
        p = admin.describe_topic(topic).partitions[0]
    return p.leader, sorted(p.isr)


def _produce(
    stub: records_pb2_grpc.RecordServiceStub, topic: str, value: bytes, timeout_ms: int
) -> records_pb2.ProduceRecordsPartitionResult:
    """One ProduceRecords call (acks=all, the node's own producer) of one record."""
    resp = stub.ProduceRecords(
        records_pb2.ProduceRecordsRequest(
            topic=topic,
            partition=0,
            records=records_pb2.RecordColumns(values=[value]),
            timeout_ms=timeout_ms,
        ),
        timeout=timeout_ms / 1000 + 30,
    )
    assert resp.error_code == E.NONE, resp.error_message
    return resp.results[0]


def _expired_after_append(client: ClusterClient, address: str, topic: str) -> bool:
    """Whether the leader holds a second record (committed once its ISR shrank) and keeps no
    producer state for the partition any more (expired)."""
    tp = common_pb2.TopicPartitions(topic=topic, partitions=[0])
    try:
        described = client.storage(address).DescribeProducers(
            storage_pb2.DescribeProducersRequest(topics=[tp]), timeout=5
        )
        offsets = client.storage(address).ListOffsets(
            storage_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    storage_pb2.ListOffsetsTopic(
                        topic=topic,
                        partitions=[
                            storage_pb2.ListOffsetsPartition(
                                partition=0, timestamp=-1, current_leader_epoch=-1
                            )
                        ],
                    )
                ],
            ),
            timeout=5,
        )
    except grpc.RpcError:
        return False
    p = described.topics[0].partitions[0]
    return (
        p.error_code == E.NONE and not p.producers and offsets.topics[0].partitions[0].offset == 2
    )


def _values(cluster: LocalCluster, topic: str) -> list[bytes | None]:
    tp = TopicPartition(topic, 0)
    out: list[bytes | None] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek_to_beginning([tp])
        end = c.end_offsets([tp])[tp]

        def read() -> bool:
            out.extend(r.value for r in c.poll(timeout_ms=200))
            return c.position(tp) >= end

        wait_for(read, timeout=30, what=f"{topic} read to {end}")
    return out


def test_a_maybe_written_call_is_not_written_again_after_the_producer_expired(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(
        nodes=3,
        controllers=1,
        coordinators=0,
        node_args=["--replica-lag-time-max-ms", "1000", "--log-cleanup-interval-ms", "200"],
    )
    config = {"min.insync.replicas": "3", "producer.id.expiration.ms": "1000"}
    topic = create_topic(cluster, "expiry", 1, 3, config)
    wait_for(lambda: len(_state(cluster, topic)[1]) == 3, timeout=30, what="a full ISR")
    leader, isr = _state(cluster, topic)
    followers = [n for n in isr if n != leader]
    address = cluster.node(leader).address
    with ClusterClient(cluster.bootstrap, retry_s=30) as client:
        stub = records_pb2_grpc.RecordServiceStub(client.channel(address))
        a = _produce(stub, topic, b"A", 30000)
        assert (a.error_code, a.base_offset) == (E.NONE, 0), a.error_message

        answers: list[Any] = []
        for n in followers:
            cluster.node(n).process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            call = threading.Thread(
                target=lambda: answers.append(_produce(stub, topic, b"B", 60000))
            )
            call.start()
            # "B" appended (sequence 1), its ack refused as the ISR shrank; then the leader
            # forgets the producer while the call retries (NOT_ENOUGH_REPLICAS meanwhile).
            wait_for(
                lambda: _expired_after_append(client, address, topic),
                timeout=30,
                what="B appended and the producer expired on the leader",
            )
        finally:
            for n in followers:
                cluster.node(n).process.signal(signal.SIGCONT)  # type: ignore[union-attr]
        call.join(timeout=90)
        assert answers, "the call for B did not end"
        b = answers[0]
        # Its retry, once the ISR was whole again, was refused UNKNOWN_PRODUCER_ID: the call
        # fails as possibly written rather than being written a second time.
        assert b.error_code == E.REQUEST_TIMED_OUT, (b.error_code, b.error_message)
        assert "may or may not have been written" in b.error_message
        c = _produce(stub, topic, b"C", 30000)  # the next call: a new epoch, from sequence 0
        assert (c.error_code, c.base_offset) == (E.NONE, 2), c.error_message
    assert _values(cluster, topic) == [b"A", b"B", b"C"]
