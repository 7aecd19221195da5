"""Storage nodes as real processes against a real etcd.

Topics are created the way the controller will create them (TopicMetadata + PartitionState
written into etcd through MetadataStore), because the controller is built in parallel. Two
nodes are shared by most tests (module scope, each test uses its own topics); tests that kill,
restart or duplicate a node start their own processes. Waiting is always on a condition
(gRPC health, an RPC answer, a file), never a fixed sleep.
"""

from __future__ import annotations

import re
import signal
import struct
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.api import metadata_pb2 as md
from strom.api import storage_pb2 as pb
from strom.api import storage_pb2_grpc
from strom.devcluster.procs import EtcdServer, ManagedProcess, free_port, wait_for
from strom.errors import ErrorCode as E
from strom.metadata import MetadataStore
from strom.record import decode_batches, encode_batch, read_header
from strom.record.held import crc32c
from strom.service.runtime import GRPC_OPTIONS

pytestmark = pytest.mark.integration

CLUSTER = "storage-it"
NODE_MAIN = "import sys; from strom.storage.cli import main; sys.exit(main())"


# -- processes -------------------------------------------------------------------------------


@dataclass
class Node:
    """One storage-node process and a client channel to it."""

    node_id: int
    etcd: str
    root: Path
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: ManagedProcess | None = None
    channel: grpc.Channel | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / f"node-{self.node_id}"

    @property
    def stub(self) -> storage_pb2_grpc.StorageServiceStub:
        assert self.channel is not None
        return storage_pb2_grpc.StorageServiceStub(self.channel)

    def argv(self, **overrides: str) -> list[str]:
        flags = {
            "--node-id": str(self.node_id),
            "--data-dir": str(self.data_dir),
            "--listen": f"127.0.0.1:{self.port}",
            "--metrics-port": str(self.metrics_port),
            "--etcd": self.etcd,
            "--cluster": CLUSTER,
            "--log-cleanup-interval-ms": "100",
            # No controller runs here (the tests write partition states themselves): a
            # restarted node must not wait for one to fence its previous life.
            "--startup-fence-timeout-s": "0",
            **overrides,
        }
        return [sys.executable, "-c", NODE_MAIN, *[x for kv in flags.items() for x in kv]]

    def start(self, timeout: float = 30.0) -> Node:
        log_path = self.root / f"node-{self.node_id}.log"
        self.proc = ManagedProcess(f"node-{self.node_id}", self.argv(), log_path).start()
        if self.channel is None:
            self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=GRPC_OPTIONS)
        health = health_pb2_grpc.HealthStub(self.channel)

        def serving() -> bool:
            assert self.proc is not None
            if not self.proc.alive():
                raise AssertionError(f"node {self.node_id} exited:\n{self.proc.log_tail()}")
            resp = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
            return resp.status == health_pb2.HealthCheckResponse.SERVING

        wait_for(serving, timeout=timeout, what=f"node {self.node_id} SERVING")
        return self

    def metric(self, name: str, **labels: str) -> float:
        """One sample from /metrics (0 if absent)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics").read()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "")
        m = re.search(r"^" + pattern + r" (\S+)$", text.decode(), re.MULTILINE)
        return float(m.group(1)) if m else 0.0

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
        if self.channel is not None:
            self.channel.close()


class Cluster:
    """etcd plus helpers that write topics exactly as the controller will."""

    def __init__(self, etcd: EtcdServer, root: Path) -> None:
        self.etcd = etcd
        self.root = root
        self.store = MetadataStore(etcd.endpoint, CLUSTER)
        self.cluster_id = str(uuid.uuid4())
        self.store.create(
            self.store.keys.cluster,
            md.ClusterInfo(cluster_id=self.cluster_id, created_ms=1, metadata_version=1),
        )
        self.nodes: dict[int, Node] = {}

    def node(self, node_id: int) -> Node:
        if node_id not in self.nodes:
            self.nodes[node_id] = Node(node_id, self.etcd.endpoint, self.root)
        return self.nodes[node_id]

    def create_topic(
        self,
        name: str,
        replicas: dict[int, list[int]],
        configs: dict[str, str] | None = None,
        *,
        isr: dict[int, list[int]] | None = None,
        leaders: dict[int, int] | None = None,
    ) -> str:
        """Topic ``name`` with partition p on ``replicas[p]`` (leader = first unless given)."""
        topic_id = str(uuid.uuid4())
        keys = self.store.keys
        meta = md.TopicMetadata(
            topic_id=topic_id,
            name=name,
            partition_count=len(replicas),
            replication_factor=len(next(iter(replicas.values()))),
            configs=configs or {},
            created_ms=int(time.time() * 1000),
        )
        puts: list = [(keys.topic(name), meta)]
        compares = [(keys.topic(name), 0)]
        for p, reps in replicas.items():
            state = md.PartitionState(
                replicas=reps,
                leader=(leaders or {}).get(p, reps[0]),
                leader_epoch=0,
                isr=(isr or {}).get(p, reps),
                partition_epoch=0,
                topic_id=topic_id,
            )
            puts.append((keys.partition(name, p), state))
            compares.append((keys.partition(name, p), 0))
        assert self.store.txn(compares, puts=puts)
        return topic_id

    def update_state(self, topic: str, p: int, **changes: object) -> None:
        key = self.store.keys.partition(topic, p)
        cur = self.store.get(key, md.PartitionState)
        assert cur is not None
        state = cur.value
        for k, v in changes.items():
            if isinstance(v, list):
                del getattr(state, k)[:]
                getattr(state, k).extend(v)
            else:
                setattr(state, k, v)
        state.partition_epoch += 1
        assert self.store.cas(key, state, cur.mod_revision)

    def register_stand_in(self, node_id: int) -> None:
        """Register ``node_id`` (no process) with the incarnation :func:`fetch_request`
        names, so a leader counts the follower fetches the test makes as that node's."""
        reg = md.NodeRegistration(
            node_id=node_id,
            host="127.0.0.1",
            port=1,
            incarnation_id=f"incarnation-{node_id}",
            state=md.NODE_STATE_RUNNING,
        )
        self.store.put(self.store.keys.node(node_id), reg)

    def update_configs(self, topic: str, configs: dict[str, str]) -> None:
        key = self.store.keys.topic(topic)
        cur = self.store.get(key, md.TopicMetadata)
        assert cur is not None
        cur.value.configs.clear()
        cur.value.configs.update(configs)
        assert self.store.cas(key, cur.value, cur.mod_revision)

    def delete_topic(self, name: str) -> None:
        keys = self.store.keys
        assert self.store.txn(
            [], deletes=[keys.topic(name)], delete_prefixes=[keys.partitions_of(name)]
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("storage")
    etcd = EtcdServer(root).start()
    c = Cluster(etcd, root)
    try:
        for node_id in (1, 2):
            c.node(node_id).start()
        yield c
    finally:
        for n in c.nodes.values():
            n.close()
        c.store.close()
        etcd.kill()


# -- request helpers -------------------------------------------------------------------------


def batch(values: list[bytes], timestamps: list[int] | None = None) -> bytes:
    return encode_batch(values, timestamps=timestamps)


def produce(
    node: Node,
    data: dict[tuple[str, int], bytes],
    *,
    acks: int = 1,
    epoch: int = -1,
    timeout_ms: int = 5000,
) -> pb.ProduceResponse:
    by_topic: dict[str, list[pb.ProducePartitionData]] = {}
    for (t, p), records in data.items():
        by_topic.setdefault(t, []).append(
            pb.ProducePartitionData(partition=p, records=records, current_leader_epoch=epoch)
        )
    req = pb.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topics=[pb.ProduceTopicData(topic=t, partitions=ps) for t, ps in by_topic.items()],
    )
    return node.stub.Produce(req, timeout=30)


def produce_one(node: Node, topic: str, p: int, records: bytes, **kw: int):
    resp = produce(node, {(topic, p): records}, **kw)
    return resp.topics[0].partitions[0]


def fetch_request(
    parts: dict[tuple[str, int], int],
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 64 << 20,
    partition_max_bytes: int = 16 << 20,
    replica_id: int = -1,
    epoch: int = -1,
) -> pb.FetchRequest:
    by_topic: dict[str, list[pb.FetchPartition]] = {}
    for (t, p), offset in parts.items():
        by_topic.setdefault(t, []).append(
            pb.FetchPartition(
                partition=p,
                fetch_offset=offset,
                current_leader_epoch=epoch,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=partition_max_bytes,
            )
        )
    return pb.FetchRequest(
        replica_id=replica_id,
        # A follower names its incarnation (strom.storage.replica_claims).
        replica_incarnation=f"incarnation-{replica_id}" if replica_id >= 0 else "",
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=[pb.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
    )


def fetch_one(node: Node, topic: str, p: int, offset: int, **kw: int):
    resp = node.stub.Fetch(fetch_request({(topic, p): offset}, **kw), timeout=30)
    return resp.topics[0].partitions[0]


def values_of(records: bytes) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for b in decode_batches(records) for r in b.records()]


def list_offset(node: Node, topic: str, p: int, ts: int, replica_id: int = -1):
    req = pb.ListOffsetsRequest(
        replica_id=replica_id,
        topics=[
            pb.ListOffsetsTopic(
                topic=topic,
                partitions=[
                    pb.ListOffsetsPartition(partition=p, current_leader_epoch=-1, timestamp=ts)
                ],
            )
        ],
    )
    return node.stub.ListOffsets(req, timeout=30).topics[0].partitions[0]


def wait_hosted(node: Node, topic: str, partitions: list[int], *, leader: bool = True) -> None:
    """Until ``node`` serves the partitions (it picked the etcd change up)."""

    def ready() -> bool:
        for p in partitions:
            r = fetch_one(node, topic, p, 0)
            if leader and r.error_code != E.NONE:
                return False
            if not leader and r.error_code != E.NOT_LEADER_OR_FOLLOWER:
                return False
        return True

    wait_for(ready, timeout=15, what=f"node {node.node_id} to host {topic} {partitions}")


# -- tests -----------------------------------------------------------------------------------


def test_produce_and_fetch_round_trip_with_per_partition_errors(cluster: Cluster) -> None:
    n1, n2 = cluster.node(1), cluster.node(2)
    cluster.create_topic("rt", {0: [1], 1: [1], 2: [1], 3: [2]})
    cluster.create_topic("small", {0: [1]}, {"max.message.bytes": "1024"})
    wait_hosted(n1, "rt", [0, 1, 2])
    wait_hosted(n1, "small", [0])

    a = batch([b"a0", b"a1", b"a2"])
    b, c = batch([b"b0"]), batch([b"c0", b"c1"])
    good = batch([b"g0"])
    corrupt = bytearray(batch([b"x0", b"x1"]))
    corrupt[-3] ^= 0xFF  # a body byte: the CRC no longer matches
    resp = produce(
        n1,
        {
            ("rt", 0): a,
            ("rt", 1): b + c,
            ("rt", 2): good + bytes(corrupt),
            ("rt", 3): good,
            ("rt", 9): good,
            ("nosuch", 0): good,
            ("small", 0): batch([b"v" * 4096]),
        },
    )
    got = {(t.topic, p.partition): p for t in resp.topics for p in t.partitions}
    assert got[("rt", 0)].error_code == E.NONE and got[("rt", 0)].base_offset == 0
    assert got[("rt", 1)].error_code == E.NONE and got[("rt", 1)].base_offset == 0
    assert got[("rt", 2)].error_code == E.CORRUPT_MESSAGE
    assert "CRC" in got[("rt", 2)].error_message and got[("rt", 2)].base_offset == -1
    assert got[("rt", 3)].error_code == E.NOT_LEADER_OR_FOLLOWER
    assert got[("rt", 3)].current_leader.leader_id == 2
    assert [(e.node_id, e.port) for e in resp.node_endpoints] == [(2, n2.port)]
    assert got[("rt", 9)].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert got[("nosuch", 0)].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert got[("small", 0)].error_code == E.MESSAGE_TOO_LARGE

    # The next append continues the offsets; acks=0 answers nothing but appends.
    assert produce_one(n1, "rt", 0, batch([b"a3"])).base_offset == 3
    assert produce(n1, {("rt", 0): batch([b"a4"])}, acks=0) == pb.ProduceResponse()

    resp = n1.stub.Fetch(fetch_request({("rt", 0): 0, ("rt", 1): 0, ("rt", 2): 0}))
    f = {p.partition: p for p in resp.topics[0].partitions}
    assert values_of(f[0].records) == [(i, f"a{i}".encode()) for i in range(5)]
    assert f[0].high_watermark == f[0].last_stable_offset == 5 and f[0].log_start_offset == 0
    assert values_of(f[1].records) == [(0, b"b0"), (1, b"c0"), (2, b"c1")]
    assert f[2].error_code == E.NONE and f[2].records == b"" and f[2].high_watermark == 0

    # Leader epochs: newer than known, then a bump in etcd, then a stale one.
    assert produce_one(n1, "rt", 0, good, epoch=1).error_code == E.UNKNOWN_LEADER_EPOCH
    cluster.update_state("rt", 0, leader_epoch=1)
    wait_for(
        lambda: produce_one(n1, "rt", 0, good, epoch=1).error_code == E.NONE,
        timeout=10,
        what="epoch 1 applied",
    )
    stale = produce_one(n1, "rt", 0, good, epoch=0)
    assert stale.error_code == E.FENCED_LEADER_EPOCH and stale.current_leader.leader_epoch == 1
    last = fetch_one(n1, "rt", 0, 5)
    assert read_header(last.records).partition_leader_epoch == 1
    oe = n1.stub.OffsetForLeaderEpoch(
        pb.OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=[
                pb.OffsetForLeaderTopic(
                    topic="rt",
                    partitions=[
                        pb.OffsetForLeaderPartition(
                            partition=0, current_leader_epoch=-1, leader_epoch=0
                        )
                    ],
                )
            ],
        )
    )
    assert (oe.topics[0].partitions[0].leader_epoch, oe.topics[0].partitions[0].end_offset) == (
        0,
        5,
    )

    # Metrics follow the appends (bytes from the request, records from batch headers).
    assert n1.metric("strom_storage_records_in_total", topic="rt") >= 9
    assert n1.metric("strom_storage_log_end_offset", topic="rt", partition="0") == 6
    assert n1.metric("strom_storage_produce_requests_total", error="CORRUPT_MESSAGE") >= 1
    assert n1.metric("strom_storage_partitions", role="leader") >= 4

    # Producer ids come from the controller, and this cluster has none: a retriable answer.
    r = n1.stub.InitProducerId(pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1))
    assert (r.error_code, r.producer_id, r.producer_epoch) == (E.REQUEST_TIMED_OUT, -1, -1)
    # An epoch bump needs no controller.
    r = n1.stub.InitProducerId(pb.InitProducerIdRequest(producer_id=7, producer_epoch=3))
    assert (r.error_code, r.producer_id, r.producer_epoch) == (E.NONE, 7, 4)


def _parked(node: Node, before: float) -> bool:
    return node.metric("strom_storage_fetch_requests_total", kind="consumer") > before


def test_fetch_long_poll_wakes_on_produce_and_honours_min_bytes(cluster: Cluster) -> None:
    n1 = cluster.node(1)
    cluster.create_topic("lp", {0: [1]})
    wait_hosted(n1, "lp", [0])

    # Nothing arrives: empty after max_wait.
    t0 = time.monotonic()
    r = fetch_one(n1, "lp", 0, 0, max_wait_ms=300)
    waited = time.monotonic() - t0
    assert r.error_code == E.NONE and r.records == b"" and 0.28 <= waited < 3

    # A produce wakes the parked fetch at once, long before max_wait (10 s).
    before = n1.metric("strom_storage_fetch_requests_total", kind="consumer")
    t0 = time.monotonic()
    fut = n1.stub.Fetch.future(fetch_request({("lp", 0): 0}, max_wait_ms=10_000), timeout=30)
    wait_for(lambda: _parked(n1, before), timeout=5, what="fetch parked")
    assert produce_one(n1, "lp", 0, batch([b"x"])).error_code == E.NONE
    r = fut.result().topics[0].partitions[0]
    assert time.monotonic() - t0 < 3
    assert values_of(r.records) == [(0, b"x")]

    # min_bytes: one batch is not enough, the second one completes the fetch.
    one = batch([b"y" * 200])
    before = n1.metric("strom_storage_fetch_requests_total", kind="consumer")
    t0 = time.monotonic()
    req = fetch_request({("lp", 0): 1}, max_wait_ms=10_000, min_bytes=len(one) + 10)
    fut = n1.stub.Fetch.future(req, timeout=30)
    wait_for(lambda: _parked(n1, before), timeout=5, what="fetch parked")
    assert produce_one(n1, "lp", 0, one).error_code == E.NONE
    assert produce_one(n1, "lp", 0, one).error_code == E.NONE
    r = fut.result().topics[0].partitions[0]
    assert time.monotonic() - t0 < 5
    assert len(r.records) >= len(one) + 10 and [o for o, _ in values_of(r.records)] == [1, 2]


def test_high_watermark_offsets_and_byte_limits(cluster: Cluster) -> None:
    n1, n2 = cluster.node(1), cluster.node(2)
    cluster.create_topic("hw", {0: [1], 1: [1]})
    # Replicated partition: ISR {1, 7}, so the HW waits for follower 7, a node that never
    # runs (no real fetcher), whose fetches the test makes by hand.
    cluster.create_topic("hw2", {0: [1, 7]}, {"min.insync.replicas": "3"})
    wait_hosted(n1, "hw", [0, 1])
    wait_hosted(n1, "hw2", [0])

    b1, b2 = batch([b"0", b"1"]), batch([b"2", b"3", b"4"])
    assert produce_one(n1, "hw", 0, b1 + b2).error_code == E.NONE
    assert produce_one(n1, "hw", 1, b1).error_code == E.NONE

    oor = fetch_one(n1, "hw", 0, 6)
    assert oor.error_code == E.OFFSET_OUT_OF_RANGE
    assert (oor.log_start_offset, oor.high_watermark) == (0, 5) and "log end offset 5" in (
        oor.error_message
    )
    at_end = fetch_one(n1, "hw", 0, 5)
    assert at_end.error_code == E.NONE and at_end.records == b"" and at_end.high_watermark == 5

    # partition_max_bytes / max_bytes are honoured, but the first partition with data always
    # gets one whole batch.
    r = fetch_one(n1, "hw", 0, 0, partition_max_bytes=1)
    assert values_of(r.records) == [(0, b"0"), (1, b"1")]
    resp = n1.stub.Fetch(fetch_request({("hw", 0): 0, ("hw", 1): 0}, max_bytes=len(b1) + 5))
    f = {p.partition: p for p in resp.topics[0].partitions}
    assert len(f[0].records) == len(b1) and f[1].records == b"" and f[1].high_watermark == 2
    resp = n1.stub.Fetch(fetch_request({("hw", 0): 0, ("hw", 1): 0}))
    f = {p.partition: p for p in resp.topics[0].partitions}
    assert len(f[0].records) == len(b1 + b2) and values_of(f[1].records) == values_of(b1)

    # acks=-1 checks min.insync.replicas against the ISR before appending anything.
    r = produce_one(n1, "hw2", 0, b1, acks=-1)
    assert r.error_code == E.NOT_ENOUGH_REPLICAS
    assert list_offset(n1, "hw2", 0, -1, replica_id=1).offset == 0  # LEO: nothing appended
    cluster.update_configs("hw2", {"min.insync.replicas": "2"})
    wait_for(
        lambda: (
            produce_one(n1, "hw2", 0, b1, acks=-1, timeout_ms=200).error_code == E.REQUEST_TIMED_OUT
        ),
        timeout=10,
        what="acks=-1 to time out waiting for the follower",
    )
    assert produce_one(n1, "hw2", 0, b2, acks=1).error_code == E.NONE
    leo = list_offset(n1, "hw2", 0, -1, replica_id=1).offset
    assert leo >= 5
    # Consumers see nothing above the HW (0): an offset between HW and LEO is empty, no error.
    assert list_offset(n1, "hw2", 0, -1).offset == 0
    for offset in (0, 2):
        r = fetch_one(n1, "hw2", 0, offset)
        assert (r.error_code, r.records, r.high_watermark) == (E.NONE, b"", 0)
    # The follower's fetch (it has everything) moves the HW; consumers then read. Only the
    # fetches of node 7's registered process count: the test registers it (a stand-in).
    cluster.register_stand_in(7)
    wait_for(
        lambda: fetch_one(n1, "hw2", 0, leo, replica_id=7).error_code == E.NONE,
        timeout=10,
        what="node 1 to see node 7's registration",
    )
    r = fetch_one(n1, "hw2", 0, 0)
    assert r.high_watermark == leo and values_of(r.records)[0] == (0, b"0")
    # A node not hosting it refuses produce and consumer fetch, naming the leader.
    nl = produce_one(n2, "hw2", 0, b1)
    assert nl.error_code == E.NOT_LEADER_OR_FOLLOWER and nl.current_leader.leader_id == 1


def test_a_follower_fetch_counts_only_from_the_registered_process_within_the_log(
    cluster: Cluster,
) -> None:
    """Found from outside: Fetch(replica_id=<a follower's id>, replica_incarnation="spoof",
    fetch_offset=2**62) was answered OFFSET_OUT_OF_RANGE, yet the leader had recorded that
    follower at 2**62: with the followers stopped, an acks=-1 produce was acknowledged and
    the high watermark moved though no follower held the record. Now a fetch whose
    incarnation is not the node's registered one is refused (STALE_NODE_INCARNATION), one
    beyond the log end records nothing (OFFSET_OUT_OF_RANGE), and acks=-1 still waits."""
    n1 = cluster.node(1)
    # Follower 8 never runs: it is registered by the test, whose fetches stand in for it.
    cluster.create_topic("spoof", {0: [1, 8]}, {"min.insync.replicas": "2"})
    wait_hosted(n1, "spoof", [0])
    cluster.register_stand_in(8)
    wait_for(
        lambda: fetch_one(n1, "spoof", 0, 0, replica_id=8).error_code == E.NONE,
        timeout=10,
        what="node 1 to see node 8's registration",
    )
    assert produce_one(n1, "spoof", 0, batch([b"a", b"b"])).error_code == E.NONE
    beyond = fetch_one(n1, "spoof", 0, 2**62, replica_id=8)
    assert beyond.error_code == E.OFFSET_OUT_OF_RANGE, beyond
    assert (beyond.high_watermark, beyond.log_start_offset) == (0, 0)  # (not moved)
    assert "beyond the log end offset 2" in beyond.error_message
    spoofed = fetch_request({("spoof", 0): 2}, replica_id=8)
    for incarnation in ("spoof", "incarnation-9"):
        spoofed.replica_incarnation = incarnation
        got = n1.stub.Fetch(spoofed, timeout=30).topics[0].partitions[0]
        assert got.error_code == E.STALE_NODE_INCARNATION and not got.records, got
        assert f"{incarnation!r} is not node 8's registered incarnation" in got.error_message
    # A node id nobody registered (a replica of this partition: 9 is not) is refused too.
    cluster.create_topic("spoof2", {0: [1, 9]})
    wait_hosted(n1, "spoof2", [0])
    gone = fetch_one(n1, "spoof2", 0, 0, replica_id=9)
    assert gone.error_code == E.STALE_NODE_INCARNATION and "not registered" in gone.error_message
    # Nothing moved: consumers see nothing, an acks=-1 produce is not acknowledged.
    assert list_offset(n1, "spoof", 0, -1).offset == 0
    r = produce_one(n1, "spoof", 0, batch([b"c"]), acks=-1, timeout_ms=300)
    assert r.error_code == E.REQUEST_TIMED_OUT
    assert list_offset(n1, "spoof", 0, -1).offset == 0
    # The registered process's fetch at the log end moves it.
    assert fetch_one(n1, "spoof", 0, 3, replica_id=8).error_code == E.NONE
    assert list_offset(n1, "spoof", 0, -1).offset == 3


def test_write_txn_markers_refuses_fields_out_of_range_naming_them(cluster: Cluster) -> None:
    """Found from outside: WriteTxnMarkers with producer_epoch=40000 had every leader log a
    struct.error traceback (the batch header's int16) and answer UNKNOWN_SERVER_ERROR. A
    field out of range is now INVALID_REQUEST naming it, and nothing is written."""
    n1 = cluster.node(1)
    cluster.create_topic("mk", {0: [1]})
    wait_hosted(n1, "mk", [0])
    log_path = cluster.root / "node-1.log"
    logged = log_path.stat().st_size
    for field_name, value, rule in (
        ("producer_epoch", 40000, "must be in 0..32767, got 40000"),
        ("producer_epoch", -1, "must be in 0..32767, got -1"),
        ("coordinator_epoch", -5, "must be >= 0, got -5"),
        ("producer_id", -2, "must be >= 0, got -2"),
    ):
        marker = pb.TxnMarker(producer_id=123456, producer_epoch=0, committed=True)
        setattr(marker, field_name, value)
        marker.topics.add(topic="mk", partitions=[0])
        req = pb.WriteTxnMarkersRequest(timeout_ms=3000, markers=[marker])
        got = n1.stub.WriteTxnMarkers(req, timeout=30).markers[0].topics[0].partitions[0]
        assert got.error_code == E.INVALID_REQUEST, (field_name, got)
        assert got.error_message == f"TxnMarker.{field_name} {rule}"
    assert list_offset(n1, "mk", 0, -1, replica_id=1).offset == 0  # nothing appended
    with log_path.open("rb") as f:
        f.seek(logged)
        assert b"Traceback" not in f.read()


def test_an_unknown_isolation_level_is_refused_naming_it(cluster: Cluster) -> None:
    """Found from outside: isolation_level 99 or -1 was read as read_uncommitted by Fetch,
    FetchStream and ListOffsets (Subscribe refused it). Each now answers INVALID_REQUEST
    naming the value, for every partition, and reads nothing."""
    n1 = cluster.node(1)
    cluster.create_topic("iso", {0: [1]})
    wait_hosted(n1, "iso", [0])
    assert produce_one(n1, "iso", 0, batch([b"a"])).error_code == E.NONE
    for level in (99, -1):
        want = f"isolation_level {level} is not an IsolationLevel"
        req = fetch_request({("iso", 0): 0})
        req.isolation_level = level  # type: ignore[assignment]
        got = n1.stub.Fetch(req, timeout=30).topics[0].partitions[0]
        assert got.error_code == E.INVALID_REQUEST and want in got.error_message, got
        assert not got.records
        streamed = list(n1.stub.FetchStream(iter([req]), timeout=30))
        got = streamed[0].topics[0].partitions[0]
        assert got.error_code == E.INVALID_REQUEST and want in got.error_message, got
        lo = pb.ListOffsetsRequest(replica_id=-1, isolation_level=level)  # type: ignore[arg-type]
        lo.topics.add(topic="iso").partitions.add(
            partition=0, current_leader_epoch=-1, timestamp=-1
        )
        got = n1.stub.ListOffsets(lo, timeout=30).topics[0].partitions[0]
        assert got.error_code == E.INVALID_REQUEST and want in got.error_message, got
        assert got.offset == -1
    # The two levels still read.
    for level in (0, 1):
        req = fetch_request({("iso", 0): 0})
        req.isolation_level = level  # type: ignore[assignment]
        got = n1.stub.Fetch(req, timeout=30).topics[0].partitions[0]
        assert got.error_code == E.NONE and values_of(got.records) == [(0, b"a")]


def test_a_batch_timestamp_below_no_timestamp_is_refused(cluster: Cluster) -> None:
    """Found from outside: a raw Produce whose batch header had base_timestamp -2**63 was
    stored, and consumers saw CreateTime -9223372036854775808 (the RecordService and the
    Python producer refuse timestamps below 0). A header base or max timestamp below -1
    (Kafka's NO_TIMESTAMP, still taken) is now INVALID_TIMESTAMP, nothing appended."""
    n1 = cluster.node(1)
    cluster.create_topic("negts", {0: [1]})
    wait_hosted(n1, "negts", [0])

    def stamped(base: int, newest: int, value: bytes = b"x") -> bytes:
        """A one-record batch whose header says ``base`` / ``newest`` (base_timestamp at
        byte 27, max_timestamp at 35, CRC-32C over bytes 21.. at 17), as a raw client
        could send (encode_batch refuses negative timestamps)."""
        b = bytearray(batch([value], [0]))
        struct.pack_into(">qq", b, 27, base, newest)
        struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
        return bytes(b)

    for base, newest, which in (
        (-(2**63), 0, f"base_timestamp {-(2**63)}"),
        (-2, -2, "base_timestamp -2"),
        (-(2**62), -2, f"base_timestamp {-(2**62)}"),  # (max below base: CORRUPT_MESSAGE)
    ):
        r = produce_one(n1, "negts", 0, stamped(base, newest))
        assert r.error_code == E.INVALID_TIMESTAMP, (base, newest, r)
        assert f"{which} is negative" in r.error_message
    assert list_offset(n1, "negts", 0, -1, replica_id=1).offset == 0  # nothing appended
    # -1 (NO_TIMESTAMP) is taken, as Kafka takes it.
    assert produce_one(n1, "negts", 0, stamped(-1, -1, b"y")).error_code == E.NONE
    got = fetch_one(n1, "negts", 0, 0)
    (b,) = decode_batches(got.records)
    assert b.header.base_timestamp == -1 and values_of(got.records) == [(0, b"y")]


def test_list_offsets_and_delete_records(cluster: Cluster) -> None:
    n1 = cluster.node(1)
    cluster.create_topic("lo", {0: [1]}, {"segment.bytes": "1024"})
    wait_hosted(n1, "lo", [0])
    pad = b"p" * 500  # about one batch per 1 KiB segment, so DeleteRecords drops segments
    t = int(time.time() * 1000) - 60_000  # recent enough for the default retention.ms
    for ts in ([t, t + 1, t + 2], [t + 1000, t + 1001], [t + 2000], [t + 500]):
        vals = [pad] * len(ts)
        assert produce_one(n1, "lo", 0, batch(vals, ts)).error_code == E.NONE
    # Offsets: 0-2 @t, 3-4 @t+1000, 5 @t+2000, 6 @t+500; LEO 7.
    assert (list_offset(n1, "lo", 0, -2).offset, list_offset(n1, "lo", 0, -1).offset) == (0, 7)
    assert list_offset(n1, "lo", 0, -1).leader_epoch == 0
    hit = list_offset(n1, "lo", 0, t + 500)
    assert (hit.offset, hit.timestamp, hit.leader_epoch) == (3, t + 1000, 0)
    hit = list_offset(n1, "lo", 0, t + 1001)
    assert (hit.offset, hit.timestamp) == (4, t + 1001)
    assert list_offset(n1, "lo", 0, t + 5000).offset == -1
    mx = list_offset(n1, "lo", 0, -3)
    assert (mx.offset, mx.timestamp) == (5, t + 2000)
    assert list_offset(n1, "lo", 0, -7).error_code == E.INVALID_REQUEST

    def delete(offset: int):
        req = pb.DeleteRecordsRequest(
            timeout_ms=1000,
            topics=[
                pb.DeleteRecordsTopic(
                    topic="lo", partitions=[pb.DeleteRecordsPartition(partition=0, offset=offset)]
                )
            ],
        )
        return n1.stub.DeleteRecords(req).topics[0].partitions[0]

    assert delete(100).error_code == E.OFFSET_OUT_OF_RANGE
    r = delete(4)
    assert (r.error_code, r.low_watermark) == (E.NONE, 4)
    assert list_offset(n1, "lo", 0, -2).offset == 4
    gone = fetch_one(n1, "lo", 0, 0)
    assert gone.error_code == E.OFFSET_OUT_OF_RANGE and gone.log_start_offset == 4
    assert delete(-1).low_watermark == 7
    assert fetch_one(n1, "lo", 0, 7).error_code == E.NONE
    assert n1.metric("strom_storage_log_start_offset", topic="lo", partition="0") == 7


def test_metadata_is_the_same_from_any_node(cluster: Cluster) -> None:
    n1, n2 = cluster.node(1), cluster.node(2)
    tid = cluster.create_topic(
        "md", {0: [1], 1: [2], 2: [1, 99], 3: [2]}, isr={2: [1]}, leaders={3: -1}
    )
    wait_hosted(n1, "md", [0, 2])

    def md_of(node: Node, topics: list[str]) -> pb.MetadataResponse:
        return node.stub.Metadata(pb.MetadataRequest(topics=topics))

    wait_for(
        lambda: all(len(md_of(n, ["md"]).topics[0].partitions) == 4 for n in (n1, n2)),
        timeout=10,
        what="both views to have the topic",
    )
    one, two = md_of(n1, ["md", "unknown"]), md_of(n2, ["md", "unknown"])
    assert one == two
    assert one.cluster_id == cluster.cluster_id and one.controller.node_id == -1
    nodes = {n.node_id: n.port for n in one.nodes}
    assert nodes[1] == n1.port and nodes[2] == n2.port
    mt, unknown = one.topics
    assert (mt.name, mt.topic_id, mt.error_code) == ("md", tid, E.NONE)
    assert unknown.name == "unknown" and unknown.error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    p = {x.partition: x for x in mt.partitions}
    assert (p[0].leader, list(p[0].replicas), list(p[0].isr)) == (1, [1], [1])
    assert (p[1].leader, list(p[1].offline_replicas)) == (2, [])
    assert list(p[2].replicas) == [1, 99] and list(p[2].offline_replicas) == [99]
    assert p[3].leader == -1 and p[3].error_code == E.LEADER_NOT_AVAILABLE
    every = n1.stub.Metadata(pb.MetadataRequest())
    assert "md" in [t.name for t in every.topics]
    bare = n2.stub.Metadata(pb.MetadataRequest(skip_topics=True))
    assert not bare.topics and {1, 2} <= {n.node_id for n in bare.nodes}


def test_a_started_node_keeps_its_state_out_of_full_collections(cluster: Cluster) -> None:
    """The runtime freezes what a started service holds (strom.service.gc_pauses): a full
    collection would otherwise walk all of it and stall the event loop for ~20 ms; and every
    collection's pause is a metric."""
    n1 = cluster.node(1)
    frozen = n1.metric("strom_service_gc_frozen_objects", service="storage")
    assert frozen > 20_000  # modules, descriptors, clients: a started node's whole heap
    cluster.create_topic("gcp", {0: [1]})
    wait_hosted(n1, "gcp", [0])
    for _ in range(20):  # requests allocate: young collections happen and are timed
        assert produce_one(n1, "gcp", 0, batch([b"x"] * 200)).error_code == E.NONE
    wait_for(
        lambda: (
            n1.metric("strom_service_gc_pause_seconds_count", generation="0", service="storage") > 0
        ),
        timeout=10,
        what="a timed young collection",
    )


def test_deleting_a_topic_deletes_its_replicas(cluster: Cluster) -> None:
    n1 = cluster.node(1)
    cluster.create_topic("gone", {0: [1], 1: [1]})
    wait_hosted(n1, "gone", [0, 1])
    assert produce_one(n1, "gone", 0, batch([b"x"])).error_code == E.NONE
    dirs = [n1.data_dir / "gone-0", n1.data_dir / "gone-1"]
    assert all(d.is_dir() for d in dirs)
    cluster.delete_topic("gone")
    wait_for(lambda: not any(d.exists() for d in dirs), timeout=10, what="replica dirs removed")
    assert fetch_one(n1, "gone", 0, 0).error_code == E.UNKNOWN_TOPIC_OR_PARTITION


def test_retention_runs_in_the_background_with_new_configs(cluster: Cluster) -> None:
    n1 = cluster.node(1)
    cluster.create_topic("ret", {0: [1]}, {"segment.bytes": "1024"})
    wait_hosted(n1, "ret", [0])
    for _ in range(6):
        assert produce_one(n1, "ret", 0, batch([b"r" * 600])).error_code == E.NONE
    assert list_offset(n1, "ret", 0, -2).offset == 0  # default retention keeps everything
    # A config change reaches the open log; the cleaner (every 100 ms here) applies it.
    cluster.update_configs("ret", {"segment.bytes": "1024", "retention.bytes": "1"})
    wait_for(
        lambda: list_offset(n1, "ret", 0, -2).offset == 5,
        timeout=10,
        what="retention to delete every sealed segment",
    )
    assert fetch_one(n1, "ret", 0, 0).error_code == E.OFFSET_OUT_OF_RANGE
    assert values_of(fetch_one(n1, "ret", 0, 5).records) == [(5, b"r" * 600)]


def test_crash_restart_recovers_and_sigterm_shuts_down_cleanly(cluster: Cluster) -> None:
    node = cluster.node(5).start()
    cluster.create_topic("kr", {0: [5]})
    cluster.create_topic("stray", {0: [5]})
    wait_hosted(node, "kr", [0])
    wait_hosted(node, "stray", [0])
    for i in range(3):
        assert produce_one(node, "kr", 0, batch([b"k%d" % i, b"K%d" % i])).base_offset == 2 * i
    assert produce_one(node, "stray", 0, batch([b"s"])).error_code == E.NONE
    marker = node.data_dir / ".strom-clean-shutdown"
    assert not marker.exists()

    assert node.proc is not None
    node.proc.kill()  # SIGKILL: no marker, lease left to expire
    cluster.delete_topic("stray")  # deleted while the node is down
    node.start()  # waits out the dead incarnation's lease, recovers the logs
    r = fetch_one(node, "kr", 0, 0)
    assert r.high_watermark == 6
    assert [v for _, v in values_of(r.records)] == [b"k0", b"K0", b"k1", b"K1", b"k2", b"K2"]
    assert produce_one(node, "kr", 0, batch([b"after"])).base_offset == 6
    wait_for(
        lambda: not (node.data_dir / "stray-0").exists(), timeout=10, what="stray log set aside"
    )
    assert len(list(node.data_dir.glob("stray-0-stray-*"))) == 1  # kept for an operator

    key = cluster.store.keys.node(5)
    reg = cluster.store.get(key, md.NodeRegistration)
    assert reg is not None and reg.value.state == md.NODE_STATE_RUNNING
    node.proc.signal(signal.SIGTERM)
    node.proc.proc.wait(timeout=15)
    assert node.proc.proc.returncode == 0
    assert marker.exists()
    assert cluster.store.get(key, md.NodeRegistration) is None  # revoked, not expired


def test_a_second_process_with_a_live_node_id_is_refused(cluster: Cluster) -> None:
    live = cluster.node(1)
    dup = Node(1, cluster.etcd.endpoint, cluster.root / "dup")
    proc = ManagedProcess("dup", dup.argv(), cluster.root / "dup.log").start()
    try:
        assert proc.proc is not None
        assert proc.proc.wait(timeout=20) != 0
    finally:
        proc.kill()
    out = proc.log_path.read_text()
    errors = [ln for ln in out.splitlines() if ln.startswith("strom storage-node: error:")]
    assert len(errors) == 1 and "node id 1 is already registered by a live process" in errors[0]
    assert "Traceback" not in out
    assert not (dup.data_dir).exists()  # refused before touching the data dir
    # The live node is unaffected.
    assert live.stub.Metadata(pb.MetadataRequest(skip_topics=True)).nodes
    reg = cluster.store.get(cluster.store.keys.node(1), md.NodeRegistration)
    assert reg is not None and reg.value.port == live.port


def test_a_node_advertising_a_live_node_s_address_is_refused(cluster: Cluster) -> None:
    """Another node id at the address a live node is registered at (two hosts started
    with a wildcard --listen and no --advertise both advertise 127.0.0.1:PORT) is refused
    with one line naming both, once the holder outlived its session timeout: found from
    outside, it registered, and the partitions it led were unreachable for good."""
    live = cluster.node(1)
    # Node 70: an id no other test of this module registers (7 and 8 are stand-ins there).
    other = Node(70, cluster.etcd.endpoint, cluster.root / "other")
    argv = other.argv(**{"--advertise": f"127.0.0.1:{live.port}"})
    proc = ManagedProcess("other", argv, cluster.root / "other.log").start()
    try:
        assert proc.proc is not None
        assert proc.proc.wait(timeout=30) != 0
    finally:
        proc.kill()
    out = proc.log_path.read_text()
    errors = [ln for ln in out.splitlines() if ln.startswith("strom storage-node: error:")]
    assert len(errors) == 1, out
    assert f"node 1 is registered at 127.0.0.1:{live.port}" in errors[0], errors
    assert "node 70" in errors[0] and "--advertise" in errors[0] and "Traceback" not in out
    assert cluster.store.get(cluster.store.keys.node(70), md.NodeRegistration) is None


def test_a_lost_lease_is_replaced_by_a_new_registration(cluster: Cluster) -> None:
    node = cluster.node(2)
    store = cluster.store
    key = store.keys.node(2)
    _, meta = store.client.get(key)
    before = store.get(key, md.NodeRegistration)
    assert before is not None and meta.lease_id
    # As if etcd had expired it while the node was cut off: the key goes with the lease.
    store.client.revoke_lease(meta.lease_id)

    def reregistered() -> bool:
        value, m = store.client.get(key)
        return value is not None and m.lease_id != meta.lease_id

    wait_for(reregistered, timeout=10, what="node 2 to register again under a new lease")
    after = store.get(key, md.NodeRegistration)
    assert after is not None
    assert after.value.incarnation_id == before.value.incarnation_id  # same process life
    assert after.value.state == md.NODE_STATE_RUNNING and after.value.port == node.port


def test_compaction_runs_in_the_background(cluster: Cluster) -> None:
    n1 = cluster.node(1)
    # Any dirt makes the log due (min.cleanable.dirty.ratio): a cleaner pass between two of
    # the appends below must not leave the last sealed segment below the default 0.5 ratio.
    cluster.create_topic(
        "cmp",
        {0: [1]},
        {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0"},
    )
    wait_hosted(n1, "cmp", [0])
    pad = b"v" * 400
    for i in range(5):  # each batch fills a segment: five versions of k1 and k2
        data = encode_batch([pad + b"%d" % i] * 2, keys=[b"k1", b"k2"])
        assert produce_one(n1, "cmp", 0, data).base_offset == 2 * i

    def read_all() -> list[tuple[int, bytes]]:
        out, offset = [], 0
        while offset < 10:  # a fetch returns data from one segment at a time
            records = fetch_one(n1, "cmp", 0, offset).records
            out += values_of(records)
            batches = decode_batches(records)
            offset = batches[-1].header.next_offset
        return out

    wait_for(lambda: len(read_all()) == 2, timeout=10, what="the cleaner to drop old versions")
    # Offsets are kept: the survivors are the last two, and the log still starts at 0.
    assert [o for o, _ in read_all()] == [8, 9]
    assert list_offset(n1, "cmp", 0, -2).offset == 0


def test_the_cleaner_merges_small_segments_on_a_running_node(cluster: Cluster) -> None:
    """Found from outside: every compacted segment stayed a file of its own (and an open
    descriptor), so a compacted topic of few keys gained a file per segment rolled,
    without bound. The node's cleaner merges the cleaned segments into one file."""
    n1 = cluster.node(1)
    cluster.create_topic(
        "cmpm",
        {0: [1]},
        {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0"},
    )
    wait_hosted(n1, "cmpm", [0])
    pad = b"v" * 400
    for i in range(12):  # each batch fills a segment: twelve versions of k1 and k2
        data = encode_batch([pad + b"%d" % i] * 2, keys=[b"k1", b"k2"])
        assert produce_one(n1, "cmpm", 0, data).base_offset == 2 * i
    directory = n1.data_dir / "cmpm-0"

    def segment_files() -> list[str]:
        return sorted(p.name for p in directory.glob("*.log"))

    # The versions before the last sit in sealed segments that merge into the first one's
    # file (the segment with the last versions is the active one, never cleaned).
    wait_for(
        lambda: len(segment_files()) == 2, timeout=20, what="the cleaner to merge the segments"
    )
    assert segment_files()[0] == "00000000000000000000.log"
    offset, got = 0, []
    while offset < 24:
        records = fetch_one(n1, "cmpm", 0, offset).records
        got += values_of(records)
        offset = decode_batches(records)[-1].header.next_offset
    assert [o for o, _ in got] == [22, 23]
