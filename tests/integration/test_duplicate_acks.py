"""acks=all answers a DUPLICATE_SEQUENCE (a retry of a batch written before the leader's last
five of its producer, offsets forgotten) only once the repeated records are committed, as
it answers a duplicate whose offsets it knows (DESIGN §6).

Found from outside: with both followers paused, a retry of part of an older batch was
answered DUPLICATE_SEQUENCE ("written") at once while the high watermark was still 1; the
leader was then killed and the records it had called written under acks=all were gone. Both
Produce paths (unary and ProduceStream) and the RecordService's (caller-sequenced
ProduceRecords, which appends through the same path) are checked.

Real etcd, a controller and three storage nodes as processes; waits are on conditions."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from strom.api import common_pb2, records_pb2, records_pb2_grpc, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.record import encode_batch
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
E = common_pb2.ErrorCode
#: The answers of an acks=all retry whose repeated records are not committed: retriable
#: refusals after the check (the records may be in the log), never "written".
NOT_COMMITTED = (E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND)


def _state(cluster: LocalCluster, topic: str) -> tuple[int, list[int]]:
    with Admin(cluster.bootstrap) as admin:
        p = admin.describe_topic(topic).partitions[0]
    return p.leader, sorted(p.isr)


def _request(topic: str, records: bytes, acks: int, timeout_ms: int) -> storage_pb2.ProduceRequest:
    return storage_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=topic,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=0, records=records, current_leader_epoch=-1
                    )
                ],
            )
        ],
    )


def _batch(pid: int, seq: int, values: list[bytes]) -> bytes:
    return encode_batch(values, producer_id=pid, producer_epoch=0, base_sequence=seq)


def _high_watermark(client: ClusterClient, address: str, topic: str) -> int:
    req = storage_pb2.ListOffsetsRequest(
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
    )
    p = client.storage(address).ListOffsets(req, timeout=10).topics[0].partitions[0]
    assert p.error_code == E.NONE, p.error_message
    return int(p.offset)


def _committed_on(client: ClusterClient, address: str, topic: str, want: int) -> bool:
    """Whether ``address`` (a new leader settling in) answers a high watermark of ``want``."""
    try:
        return _high_watermark(client, address, topic) == want
    except (grpc.RpcError, AssertionError):
        return False


def test_a_duplicate_sequence_under_acks_all_waits_for_the_commit(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    # Sessions and replica lag long enough that the paused followers stay in the ISR (and
    # registered) for the retries below: then only the high watermark holds the answer.
    cluster = make_cluster(
        nodes=3,
        controllers=1,
        coordinators=0,
        node_args=["--session-timeout-s", "10", "--replica-lag-time-max-ms", "10000"],
    )
    topic = create_topic(cluster, "dup-acks", 1, 3, {"min.insync.replicas": "2"})
    wait_for(lambda: len(_state(cluster, topic)[1]) == 3, timeout=30, what="a full ISR")
    leader, isr = _state(cluster, topic)
    followers = [n for n in isr if n != leader]
    address = cluster.node(leader).address
    with ClusterClient(cluster.bootstrap, retry_s=30) as client:
        stub = client.storage(address)
        r = stub.InitProducerId(storage_pb2.InitProducerIdRequest(), timeout=30)
        assert r.error_code == E.NONE, r.error_message
        pid = r.producer_id
        assert r.producer_epoch == 0

        def produce(records: bytes, acks: int, timeout_ms: int) -> Any:
            resp = stub.Produce(_request(topic, records, acks, timeout_ms), timeout=90)
            return resp.topics[0].partitions[0]

        first = produce(_batch(pid, 0, [b"c0"]), -1, 30000)
        assert (first.error_code, first.base_offset) == (E.NONE, 0), first.error_message

        for n in followers:
            cluster.node(n).process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            written = [b"c0"]
            for i in range(7):  # sequences 1..28 at offsets 1..28, on the leader alone
                values = [b"b%d-%d" % (i, j) for j in range(4)]
                r = produce(_batch(pid, 1 + 4 * i, values), 1, 30000)
                assert (r.error_code, r.base_offset) == (E.NONE, 1 + 4 * i), r.error_message
                written += values
            # A retry of half of the second batch (sequences 5..6): before the last five
            # batches the leader keeps, and no batch has exactly that range.
            half = _batch(pid, 5, [b"b1-0", b"b1-1"])
            unary = produce(half, -1, 1500)
            assert unary.error_code in NOT_COMMITTED, (unary.error_code, unary.error_message)
            streamed = (
                next(iter(stub.ProduceStream(iter([_request(topic, half, -1, 1500)]), timeout=90)))
                .topics[0]
                .partitions[0]
            )
            assert streamed.error_code in NOT_COMMITTED, (
                streamed.error_code,
                streamed.error_message,
            )
            # The RecordService with the caller's sequence: appended through the same path.
            records = records_pb2_grpc.RecordServiceStub(client.channel(address))
            rs = records.ProduceRecords(
                records_pb2.ProduceRecordsRequest(
                    topic=topic,
                    partition=0,
                    records=records_pb2.RecordColumns(values=[b"b1-0", b"b1-1"]),
                    timeout_ms=1500,
                    producer=records_pb2.ProducerSequence(
                        producer_id=pid, producer_epoch=0, base_sequence=5
                    ),
                ),
                timeout=90,
            ).results[0]
            assert rs.error_code in NOT_COMMITTED, (rs.error_code, rs.error_message)
            # The followers were paused and in the ISR all along: nothing was committed.
            assert _state(cluster, topic) == (leader, sorted(isr))
            assert _high_watermark(client, address, topic) == 1

            # The same retry while the followers resume: answered once committed.
            answers: list[Any] = []
            retry = threading.Thread(target=lambda: answers.append(produce(half, -1, 60000)))
            retry.start()
        finally:
            for n in followers:
                cluster.node(n).process.signal(signal.SIGCONT)  # type: ignore[union-attr]
        retry.join(timeout=90)
        assert answers and answers[0].error_code == E.DUPLICATE_SEQUENCE, answers
        assert _high_watermark(client, address, topic) == 29

        # What was answered "written" survives the leader.
        cluster.node(leader).process.kill()  # type: ignore[union-attr]
        wait_for(
            lambda: _state(cluster, topic)[0] not in (leader, -1),
            timeout=60,
            what="a new leader after the old one was killed",
        )
        new = cluster.node(_state(cluster, topic)[0]).address
        wait_for(
            lambda: _committed_on(client, new, topic, 29),
            timeout=30,
            what="the new leader's high watermark at 29",
        )
