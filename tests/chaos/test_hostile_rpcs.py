"""Malformed requests to every RPC of every service (issue 13), on a real cluster.

The RPCs come from the processes themselves (server reflection), so a new one is covered
automatically. Each gets an empty request and hostile variants (tests/chaos/hostile.py). Every
answer must be a response (with per-partition errors where it has partitions) or a clear gRPC
status, never UNKNOWN/INTERNAL (an unhandled exception); every process must still serve
afterwards; and the data must be unchanged: the topics, every partition's log start offset
and the bytes of a topic holding data.

Then the Produce path with hostile batches (hypothesis): each is refused with a per-partition
error and nothing is appended; and oversized requests and batches.
"""

from __future__ import annotations

import concurrent.futures
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strom import Admin, Producer
from strom.api import storage_pb2, storage_pb2_grpc
from strom.devcluster.cluster import LocalCluster, grpc_serving
from strom.errors import ErrorCode as E
from strom.record import InvalidBatchError, encode_batch, scan_batches
from tests.chaos.hostile import CLEAR, call, requests_for, services_of
from tests.chaos.test_fuzz_batches import with_header

pytestmark = pytest.mark.integration
KEEP = "keep"
#: Methods the gRPC library's own servicers describe but do not implement (grpcio-health-
#: checking's HealthServicer has no List): UNIMPLEMENTED is their honest answer.
LIBRARY_GAPS = {"grpc.health.v1.Health.List"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("hostile")
    c = LocalCluster(
        root / "c",
        nodes=3,
        controllers=1,
        coordinators=1,
        coordinator_args=["--offsets-partitions", "2", "--transaction-state-partitions", "2"],
    )
    try:
        c.start()
        with Admin(c.bootstrap) as admin:
            admin.create_topic(KEEP, partitions=3, replication_factor=3)
            admin.create_topic("fuzz", partitions=1, replication_factor=3)
        with Producer(c.bootstrap) as p:
            for i in range(300):
                p.send(KEEP, b"value-%d" % i, key=b"k%d" % (i % 17))
            p.flush()
        yield c
    finally:
        c.kill()


def _stub(cluster: LocalCluster) -> storage_pb2_grpc.StorageServiceStub:
    return storage_pb2_grpc.StorageServiceStub(grpc.insecure_channel(cluster.nodes[0].address))


def fingerprint(cluster: LocalCluster) -> dict[str, object]:
    """Topics, partition counts, every log start offset, and the bytes of ``keep``."""
    stub = _stub(cluster)
    md = stub.Metadata(storage_pb2.MetadataRequest(), timeout=10)
    topics = {t.name: len(t.partitions) for t in md.topics}
    starts: dict[str, int] = {}
    crcs: dict[str, int] = {}
    nodes = {n.node_id: f"{n.host}:{n.port}" for n in md.nodes}
    for t in md.topics:
        for p in t.partitions:
            leader = storage_pb2_grpc.StorageServiceStub(grpc.insecure_channel(nodes[p.leader]))
            req = storage_pb2.ListOffsetsRequest()
            lt = req.topics.add(topic=t.name)
            lt.partitions.add(partition=p.partition, timestamp=-2)
            lt.partitions.add(partition=p.partition, timestamp=-1)
            resp = leader.ListOffsets(req, timeout=10)
            got = [r.offset for r in resp.topics[0].partitions]
            starts[f"{t.name}-{p.partition}"] = got[0]
            if t.name == KEEP:
                fr = storage_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1 << 24)
                ft = fr.topics.add(topic=KEEP)
                ft.partitions.add(
                    partition=p.partition, fetch_offset=0, partition_max_bytes=1 << 24
                )
                data = leader.Fetch(fr, timeout=10).topics[0].partitions[0].records
                crcs[f"{KEEP}-{p.partition}"] = zlib.crc32(data)
                starts[f"{KEEP}-{p.partition}-end"] = got[1]
    return {"topics": topics, "starts": starts, "crcs": crcs}


def stays_open(method: MethodDescriptor) -> bool:
    """Whether a call of ``method`` may rightly stay open until its deadline: a server stream
    (Health.Watch answers once, then only on a change). Such calls wait rather than load the
    servers, so each gets a thread of its own: a dozen at a time, the 65 Watch calls alone
    held the pool for ~43 s (8 s each) of this test's ~50 s."""
    return method.server_streaming and not method.client_streaming


def test_every_rpc_answers_hostile_requests_clearly_and_changes_nothing(
    cluster: LocalCluster,
) -> None:
    before = fingerprint(cluster)
    targets = []  # (address, method)
    covered: set[str] = set()
    for m in cluster.members:
        for svc in services_of(m.address):
            for method in svc.methods:
                targets.append((m.address, method))
                covered.add(method.full_name)
    # The three strom services are all there (a service missing from reflection would
    # silently escape the walk).
    assert {n.rsplit(".", 2)[-2] for n in covered} >= {
        "StorageService",
        "ControllerService",
        "CoordinatorService",
        "Health",
    }
    failures: list[str] = []
    calls = 0
    channels = {a: grpc.insecure_channel(a) for a, _ in targets}

    def one(address: str, method, variant) -> str | None:
        code, details = call(channels[address], method, variant.request, timeout=8)
        if code == grpc.StatusCode.UNIMPLEMENTED and method.full_name in LIBRARY_GAPS:
            return None
        if code not in CLEAR:
            return f"{method.full_name} [{variant.name}] at {address}: {code.name} {details[:300]}"
        return None

    # Calls that may wait for their whole deadline (stays_open) get a thread each; the rest
    # keep the 12.
    jobs = [
        (address, method, variant)
        for address, method in targets
        for variant in requests_for(method, fixed=6, randomized=6)
    ]
    waiting = sum(stays_open(method) for _, method, _ in jobs)
    with (
        concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool,
        concurrent.futures.ThreadPoolExecutor(max_workers=max(waiting, 1)) as streams,
    ):
        futures = [
            (streams if stays_open(method) else pool).submit(one, address, method, variant)
            for address, method, variant in jobs
        ]
        for f in futures:
            calls += 1
            if (msg := f.result()) is not None:
                failures.append(msg)
    for ch in channels.values():
        ch.close()
    assert not failures, f"{len(failures)} of {calls} calls:\n" + "\n".join(failures[:40])
    for m in cluster.members:
        assert m.alive(), f"{m.kind} {m.ident} died:\n{m.process and m.process.log_tail()}"
        assert grpc_serving(m.address, timeout=5), f"{m.kind} {m.ident} stopped serving"
    assert fingerprint(cluster) == before
    with Producer(cluster.bootstrap) as p:  # and it still works
        assert p.send(KEEP, b"after").result(timeout=30).offset >= 0


# -- the Produce path -------------------------------------------------------------------------


def _produce(
    stub: storage_pb2_grpc.StorageServiceStub, data: bytes
) -> storage_pb2.ProducePartitionResponse:
    req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=10_000)
    req.topics.add(topic="fuzz").partitions.add(partition=0, records=data)
    return stub.Produce(req, timeout=30).topics[0].partitions[0]


def _leader_stub(cluster: LocalCluster, topic: str) -> storage_pb2_grpc.StorageServiceStub:
    md = _stub(cluster).Metadata(storage_pb2.MetadataRequest(topics=[topic]), timeout=10)
    nodes = {n.node_id: f"{n.host}:{n.port}" for n in md.nodes}
    leader = md.topics[0].partitions[0].leader
    return storage_pb2_grpc.StorageServiceStub(grpc.insecure_channel(nodes[leader]))


def _end(stub: storage_pb2_grpc.StorageServiceStub) -> int:
    req = storage_pb2.ListOffsetsRequest()
    req.topics.add(topic="fuzz").partitions.add(partition=0, timestamp=-1)
    return stub.ListOffsets(req, timeout=10).topics[0].partitions[0].offset


hostile_batches = st.one_of(
    st.binary(max_size=600),
    st.builds(
        lambda values, cut: encode_batch(values)[:cut],
        st.lists(st.binary(max_size=20), min_size=1, max_size=5),
        st.integers(0, 80),
    ),
    st.builds(
        lambda body, count, delta, attrs: with_header(
            body, record_count=count, last_offset_delta=delta, attributes=attrs
        ),
        st.binary(max_size=300),
        st.integers(-5, 50),
        st.integers(-5, 50),
        st.integers(-(2**15), 2**15 - 1),
    ),
    st.builds(  # a good batch with one byte flipped
        lambda values, pos, xor: (
            lambda b: b[: pos % len(b)] + bytes([b[pos % len(b)] ^ xor]) + b[pos % len(b) + 1 :]
        )(encode_batch(values)),
        st.lists(st.binary(max_size=20), min_size=1, max_size=5),
        st.integers(0, 10_000),
        st.integers(1, 255),
    ),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=hostile_batches)
def test_hostile_batches_are_refused_per_partition_and_append_nothing(
    cluster: LocalCluster, data: bytes
) -> None:
    try:
        scan_batches(data, producer_batch=True)
        valid = bool(data)
    except InvalidBatchError:
        valid = False
    stub = _leader_stub(cluster, "fuzz")
    end = _end(stub)
    pr = _produce(stub, data)
    if valid:
        assert pr.error_code in (E.NONE, E.INVALID_TIMESTAMP, E.INVALID_RECORD), pr
    else:
        assert pr.error_code != E.NONE and pr.error_message, pr
        assert _end(stub) == end


def test_oversized_request_and_batch(cluster: LocalCluster) -> None:
    stub = _leader_stub(cluster, "fuzz")
    end = _end(stub)
    # A batch over max.message.bytes (strom's default: 16 MiB): refused for its partition.
    big = encode_batch([b"z" * (17 << 20)])
    pr = _produce(stub, big)
    assert pr.error_code == E.MESSAGE_TOO_LARGE, pr
    # A request over the server's message limit (256 MiB): a gRPC status, before any work.
    huge = storage_pb2.ProduceRequest(acks=-1, timeout_ms=1000)
    huge.topics.add(topic="fuzz").partitions.add(partition=0, records=b"\0" * (257 << 20))
    with pytest.raises(grpc.RpcError) as exc:
        stub.Produce(huge, timeout=60)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _end(stub) == end
    for m in cluster.nodes:
        assert m.alive()
