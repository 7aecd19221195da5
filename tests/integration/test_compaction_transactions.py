"""Compaction, retention and transactions together on a real storage node (found from
outside, /tmp/rev-compaction):

- The log cleaner prunes the aborted-transactions index of the aborts whose markers it
  removed: on a compacted topic (its log start never moves) every abort used to stay listed
  for good, in the file and in every read_committed fetch from an early offset.
- A producer's ``last_timestamp_ms`` (DescribeProducers, ``strom transactions producers``
  and ``find-hanging``) is its last batch's timestamp, kept across a SIGKILL and restart:
  it used to become the restart's time, so a hanging transaction looked fresh again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import storage_pb2
from strom.cli.main import main as cli_main
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.record import encode_batch
from tests.conftest import create_topic, start_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One node that cleans often, a controller and a coordinator (both roles)."""
    c = start_cluster(
        tmp_path_factory.mktemp("ctxn") / "c",
        nodes=1,
        controllers=1,
        coordinators=1,
        node_args=["--log-cleanup-interval-ms", "300"],
        coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
    )
    try:
        yield c
    finally:
        c.kill()


COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": "1024",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "0",
}


def _fetch_committed(cluster: LocalCluster, topic: str) -> storage_pb2.FetchPartitionResponse:
    """A raw read_committed Fetch of partition 0 from offset 0."""
    req = storage_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=1,
        topics=[
            storage_pb2.FetchTopic(
                topic=topic,
                partitions=[
                    storage_pb2.FetchPartition(
                        partition=0,
                        fetch_offset=0,
                        current_leader_epoch=-1,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                ],
            )
        ],
    )
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        resp = client.with_leader(
            topic,
            0,
            lambda s: s.Fetch(req, timeout=10),
            lambda r: r.topics[0].partitions[0].error_code != 0,
        )
    return resp.topics[0].partitions[0]


def _committed(cluster: LocalCluster, topic: str, end: int) -> dict[bytes | None, bytes | None]:
    """The latest committed value of each key, read with read_committed up to ``end``."""
    tp = TopicPartition(topic, 0)
    latest: dict[bytes | None, bytes | None] = {}
    with Consumer(cluster.bootstrap, isolation_level="read_committed") as c:
        c.assign([tp])
        c.seek_to_beginning([tp])
        deadline = time.monotonic() + 60
        while c.position(tp) < end and time.monotonic() < deadline:
            for r in c.poll(timeout_ms=300):
                latest[r.key] = r.value
        assert c.position(tp) >= end
    return latest


def test_the_cleaner_prunes_aborts_of_a_compacted_topic(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's t16: aborted transactions on a compact-only topic with
    delete.retention.ms=0; once cleaned, the index keeps only the aborts whose markers stay
    (the producer's last batches need a few) and a read_committed fetch from offset 0 lists
    only those, with the same committed records; `strom dump-log` of the node's segments
    agrees."""
    topic = create_topic(cluster, "t16", config=COMPACT)
    aborts = 30
    with Producer(
        cluster.bootstrap, transactional_id="t16", linger_ms=0, transaction_timeout_ms=600_000
    ) as x:
        x.init_transactions()
        for i in range(aborts):
            x.begin_transaction()
            x.send(topic, b"a" * 50, key=b"k%d" % (i % 5), partition=0)
            x.flush()
            x.abort_transaction()
        x.begin_transaction()
        x.send(topic, b"c", key=b"k0", partition=0)
        x.commit_transaction()
    with Producer(cluster.bootstrap, linger_ms=0) as q:
        for i in range(20):
            q.send(topic, b"x" * 100, key=b"f%d" % i, partition=0)
    index = cluster.root / "node-1" / f"{topic}-0" / "aborted-transactions"
    wait_for(
        lambda: index.exists() and index.stat().st_size <= 5 * 24,
        timeout=90,
        what="the cleaner to prune the aborted-transactions index",
    )
    part = _fetch_committed(cluster, topic)
    assert part.error_code == 0 and len(part.aborted_transactions) <= 5
    want = {b"k0": b"c", **{b"f%d" % i: b"x" * 100 for i in range(20)}}
    assert _committed(cluster, topic, part.last_stable_offset) == want
    _dump_agrees(index, part.last_stable_offset, capsys)


def _dump_agrees(index: Path, end: int, capsys: pytest.CaptureFixture[str]) -> None:
    """`strom dump-log --records` of the node's own segments: every batch's CRC holds, the
    batches reach the log end, and the abort markers left are the index's entries. The
    cleaner may swap a segment between the listing and the dump (a later pass merging the
    cleaned ones): the dump is taken again then."""
    dumped: list[tuple[list[Path], str]] = []

    def dump() -> bool:
        segments = sorted(index.parent.glob("*.log"))
        code = cli_main(["dump-log", "--records", *map(str, segments)])
        out = capsys.readouterr().out
        if code == 0 and all(s.exists() for s in segments):
            dumped.append((segments, out))
        return bool(dumped)

    wait_for(dump, timeout=30, what="a dump of segments the cleaner left in place")
    segments, out = dumped[0]
    assert out.count("Dumping ") == len(segments) and "isValid: false" not in out
    assert f"lastOffset: {end - 1} " in out
    assert out.count("endTxnMarker: ABORT") == index.stat().st_size // 24


def test_a_producers_last_timestamp_survives_a_sigkill(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hanging transaction (transactional batches no coordinator knows of) written ten
    minutes "ago" is older than a 5-minute --max-transaction-timeout before and after the
    node is SIGKILLed (no producer snapshot covers it) and restarted: DescribeProducers
    reports the same last_timestamp_ms and find-hanging still lists it."""
    topic = create_topic(cluster, "t18", config={"cleanup.policy": "compact"})
    tp = TopicPartition(topic, 0)
    written = int(time.time() * 1000) - 600_000
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        init = client.with_leader(
            topic,
            0,
            lambda s: s.InitProducerId(storage_pb2.InitProducerIdRequest(), timeout=10),
            lambda r: r.error_code != 0,
        )
        pid = init.producer_id
        batch = encode_batch(
            [b"hanging"],
            keys=[b"k"],
            timestamps=[written],
            producer_id=pid,
            producer_epoch=init.producer_epoch,
            base_sequence=0,
            transactional=True,
        )
        req = storage_pb2.ProduceRequest(
            acks=-1,
            timeout_ms=10_000,
            transactional_id="t18-unknown",
            topics=[
                storage_pb2.ProduceTopicData(
                    topic=topic,
                    partitions=[storage_pb2.ProducePartitionData(partition=0, records=batch)],
                )
            ],
        )
        resp = client.with_leader(
            topic,
            0,
            lambda s: s.Produce(req, timeout=10),
            lambda r: r.topics[0].partitions[0].error_code != 0,
        )
        assert resp.topics[0].partitions[0].error_code == 0

    def last_timestamp() -> int:
        with Admin(cluster.bootstrap) as admin:
            (state,) = [s for s in admin.describe_producers([tp])[tp] if s.producer_id == pid]
        assert state.current_transaction_start_offset == 0
        return state.last_timestamp_ms

    b = ["-b", cluster.bootstrap]
    find = ["transactions", "find-hanging", "--topic", topic, "--json", *b]

    def hanging() -> list[int]:
        assert cli_main([*find, "--max-transaction-timeout", "5"]) == 0
        return [f["producer_id"] for f in json.loads(capsys.readouterr().out)]

    assert last_timestamp() == written and hanging() == [pid]
    node = cluster.nodes[0]
    assert node.process is not None
    node.process.kill()  # SIGKILL: no snapshot of the batch
    node.start()
    cluster.wait_serving(node, 60)
    cluster.wait_cluster_ready(60)
    wait_for(lambda: _serves(cluster, topic), timeout=60, what=f"{topic} served again")
    assert last_timestamp() == written and hanging() == [pid]
    assert (
        cli_main(["transactions", "abort", topic, "--partition", "0", "--start-offset", "0", *b])
        == 0
    )


def _serves(cluster: LocalCluster, topic: str) -> bool:
    """Whether the partition's leader answers DescribeProducers for it again."""
    try:
        with Admin(cluster.bootstrap) as admin:
            return bool(admin.describe_producers([TopicPartition(topic, 0)]))
    except Exception:
        return False
