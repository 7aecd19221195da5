"""Resource limits on real storage nodes (issue 13; strom.service.limits): a connection limit
that closes the excess, thousands of connections and clients stalling mid-request while others
are served, an in-flight produce budget and a memory limit that shed load with
RESOURCE_EXHAUSTED, and a node that stays up through all of it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import storage_pb2, storage_pb2_grpc
from strom.devcluster.cluster import LocalCluster, Member, grpc_serving
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode as E
from strom.errors import RequestTimedOutError
from strom.record import encode_batch
from tests.chaos import h2raw

pytestmark = pytest.mark.integration
BUDGET = 200_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("limits")
    c = LocalCluster(
        root / "c",
        nodes=3,
        controllers=1,
        coordinators=0,
        node_args=["--max-connections", "300", "--max-inflight-produce-bytes", str(BUDGET)],
    )
    try:
        c.start()
        with Admin(c.bootstrap) as admin:
            admin.create_topic(
                "limits", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
            )
        yield c
    finally:
        c.kill()


def _stub(address: str) -> storage_pb2_grpc.StorageServiceStub:
    return storage_pb2_grpc.StorageServiceStub(grpc.insecure_channel(address))


def _leader(cluster: LocalCluster, topic: str = "limits") -> Member:
    md = _stub(cluster.nodes[0].address).Metadata(
        storage_pb2.MetadataRequest(topics=[topic]), timeout=10
    )
    return cluster.node(md.topics[0].partitions[0].leader)


def _end(address: str, topic: str = "limits") -> int:
    """The partition's log end (appended, replicated or not): a replica's view, which
    ListOffsets gives a replica_id >= 1 (an unset one, 0, is a consumer's: the high
    watermark; storage.proto)."""
    req = storage_pb2.ListOffsetsRequest(replica_id=1)
    req.topics.add(topic=topic).partitions.add(partition=0, timestamp=-1)
    return _stub(address).ListOffsets(req, timeout=10).topics[0].partitions[0].offset


def _produce_request(size: int, topic: str = "limits", timeout_ms: int = 30_000):
    req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=timeout_ms)
    req.topics.add(topic=topic).partitions.add(
        partition=0, records=encode_batch([os.urandom(size)])
    )
    return req


def _fds(m: Member) -> int:
    return len(os.listdir(f"/proc/{m.process.pid}/fd"))  # type: ignore[union-attr]


def test_connection_limit_closes_the_excess_and_the_node_keeps_serving(
    cluster: LocalCluster,
) -> None:
    node = cluster.nodes[0]
    host, port = node.address.rsplit(":", 1)
    socks = [h2raw.connect(host, int(port)) for _ in range(400)]
    try:
        closed = sum(h2raw.closed_by_peer(s, 0.05) for s in socks)
        closed += sum(h2raw.closed_by_peer(s, 2.0) for s in socks[-50:])
        assert closed >= 90, f"only {closed} of 400 connections over a limit of 300 were closed"
        assert node.alive()
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: grpc_serving(node.address), timeout=30, what="the node serving again")
    with Producer(cluster.bootstrap) as p:
        assert p.send("limits", b"after the flood").result(timeout=30).offset >= 0


def test_clients_stalling_mid_request_neither_block_others_nor_leave_data(
    cluster: LocalCluster,
) -> None:
    leader = _leader(cluster)
    host, port = leader.address.rsplit(":", 1)
    before = _end(leader.address)
    message = _produce_request(50_000).SerializeToString()
    stalled = []
    for _ in range(20):
        s = h2raw.connect(host, int(port))
        for i in range(50):  # the start of every request, then nothing (within the
            # connection's 64 KiB flow-control window, so nothing forces the server to act)
            h2raw.stall_call(s, 2 * i + 1, "/strom.v1.StorageService/Produce", message, 1_000)
        stalled.append(s)
    try:
        with Producer(cluster.bootstrap, linger_ms=1) as p:
            futures = [p.send("limits", b"r%d" % i) for i in range(100)]
            offsets = [f.result(timeout=60).offset for f in futures]
        assert len(set(offsets)) == 100
        assert leader.alive()
    finally:
        for s in stalled:
            s.close()
    # Nothing of the half-sent requests was appended: exactly the 100 records.
    wait_for(lambda: _end(leader.address) >= before + 100, timeout=30, what="the 100 records")
    assert _end(leader.address) == before + 100


def test_inflight_produce_budget_sheds_with_resource_exhausted(cluster: LocalCluster) -> None:
    leader = _leader(cluster)
    followers = [n for n in cluster.nodes if n is not leader]
    stub = _stub(leader.address)
    for f in followers:
        f.process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
    held: dict[str, object] = {}
    try:
        before = _end(leader.address)

        def first() -> None:
            held["response"] = stub.Produce(_produce_request(150_000), timeout=60)

        t = threading.Thread(target=first)
        t.start()
        # Appended, now waiting for the (paused) followers: 150 KB of the 200 KB budget used.
        wait_for(lambda: _end(leader.address) > before, timeout=30, what="the first append")
        with pytest.raises(grpc.RpcError) as exc:
            stub.Produce(_produce_request(150_000), timeout=30)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "budget" in (exc.value.details() or "")
    finally:
        for f in followers:
            f.process.signal(signal.SIGCONT)  # type: ignore[union-attr]
    t.join(timeout=60)
    resp = held["response"]
    assert resp.topics[0].partitions[0].error_code == E.NONE  # type: ignore[attr-defined]
    ok = stub.Produce(_produce_request(150_000), timeout=60)  # the budget is free again
    assert ok.topics[0].partitions[0].error_code == E.NONE
    assert leader.alive()


# -- a node over its memory limit; thousands of connections under the default limit ---------


@pytest.fixture(scope="module")
def small_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("memory")
    c = LocalCluster(
        root / "c", nodes=1, controllers=1, coordinators=0, node_args=["--max-memory-bytes", "1"]
    )
    try:
        c.start()
        with Admin(c.bootstrap) as admin:
            admin.create_topic("mem", partitions=1, replication_factor=1)
        yield c
    finally:
        c.kill()


def test_memory_limit_sheds_produce_and_keeps_fetch(small_node: LocalCluster) -> None:
    node = small_node.nodes[0]
    stub = _stub(node.address)
    with pytest.raises(grpc.RpcError) as exc:
        stub.Produce(_produce_request(1000, topic="mem"), timeout=30)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "memory" in (exc.value.details() or "")
    # The client retries RESOURCE_EXHAUSTED until its delivery timeout, then says why (it
    # used to blame "no reachable leader").
    with (
        Producer(small_node.bootstrap, delivery_timeout_ms=3000, request_timeout_ms=1000) as p,
        pytest.raises(RequestTimedOutError, match="RESOURCE_EXHAUSTED: the node's memory"),
    ):
        p.send("mem", b"x").result(timeout=30)
    with Consumer(small_node.bootstrap, auto_offset_reset="earliest") as c:
        tp = TopicPartition("mem", 0)
        c.assign([tp])
        assert c.end_offsets([tp])[tp] == 0
        assert c.poll(timeout_ms=200) == []
    assert node.alive() and grpc_serving(node.address)


def test_thousands_of_connections(small_node: LocalCluster) -> None:
    node = small_node.nodes[0]
    host, port = node.address.rsplit(":", 1)
    fds_before = _fds(node)
    socks = []
    try:
        for _ in range(3000):
            socks.append(h2raw.connect(host, int(port)))
        wait_for(lambda: _fds(node) >= fds_before + 2500, timeout=60, what="connections accepted")
        assert grpc_serving(node.address, timeout=10)
        with Consumer(small_node.bootstrap) as c:
            tp = TopicPartition("mem", 0)
            assert c.end_offsets([tp])[tp] == 0
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: _fds(node) < fds_before + 100, timeout=60, what="connections released")
    assert node.alive()
