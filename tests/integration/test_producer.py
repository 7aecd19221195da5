"""The Producer against a real local cluster (etcd, controller and a storage node as
processes). The node advertises a TCP proxy, so tests can lose a response on the wire."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from strom.api import common_pb2, controller_pb2, storage_pb2
from strom.client import trace
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.partitioner import partition_for_key
from strom.client.producer import Producer, ProducerClosedError
from strom.client.types import RecordMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import free_port, wait_for
from strom.errors import (
    InconsistentTopicIdError,
    InvalidRequestError,
    MessageTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from strom.record import Record, RecordBatch, decode_batches, decode_records

from .tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration
NONE = common_pb2.ErrorCode.NONE


class Env:
    def __init__(self, cluster: LocalCluster, proxy: TcpProxy) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.bootstrap = cluster.bootstrap
        self.client = ClusterClient(cluster.bootstrap)
        self._n = 0

    def topic(self, partitions: int = 1, name: str | None = None, **configs: str) -> str:
        self._n += 1
        name = name or f"p{self._n}"
        resp = self.client.controller_call(
            "CreateTopics",
            controller_pb2.CreateTopicsRequest(
                topics=[
                    controller_pb2.CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=1,
                        configs=configs,
                    )
                ]
            ),
        )
        assert resp.topics[0].error_code == NONE, resp.topics[0].error_message
        wait_for(lambda: self.client.partition_count(name) == partitions, timeout=10, what=name)
        return name

    def delete(self, topic: str, partitions: int) -> None:
        """Delete ``topic`` and wait until the node has dropped every one of its
        ``partitions`` (a produce to one it still hosts would land in the deleted log)."""
        resp = self.client.controller_call(
            "DeleteTopics", controller_pb2.DeleteTopicsRequest(topics=[topic])
        )
        assert resp.topics[0].error_code == NONE, resp.topics[0].error_message
        wait_for(
            lambda: all(
                self.offset_error(topic, i) == common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                for i in range(partitions)
            ),
            timeout=20,
            what=f"{topic} dropped by the node",
        )

    def offset_error(self, topic: str, partition: int) -> int:
        """The node's error code for a ListOffsets of the partition (NONE: it serves it)."""
        req = storage_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                storage_pb2.ListOffsetsTopic(
                    topic=topic,
                    partitions=[
                        storage_pb2.ListOffsetsPartition(partition=partition, timestamp=-1)
                    ],
                )
            ],
        )
        addr = self.cluster.bootstrap.split(",")[0]
        return (
            self.client.storage(addr)
            .ListOffsets(req, timeout=10)
            .topics[0]
            .partitions[0]
            .error_code
        )

    def read(self, topic: str, partition: int = 0, start: int = 0) -> list[Record]:
        """Every record of the partition from ``start``, straight from the node (not through
        the proxy)."""
        out: list[Record] = []
        for batch in self.batches(topic, partition, start):
            out.extend(x for x in decode_records(batch.raw) if x.offset >= start)
        return out

    def batches(self, topic: str, partition: int = 0, start: int = 0) -> list[RecordBatch]:
        """Every batch of the partition holding offsets from ``start``, as the node stored
        them, straight from the node."""
        out: list[RecordBatch] = []
        offset = start
        addr = self.cluster.bootstrap.split(",")[0]
        while True:
            req = storage_pb2.FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                max_bytes=16 << 20,
                topics=[
                    storage_pb2.FetchTopic(
                        topic=topic,
                        partitions=[
                            storage_pb2.FetchPartition(
                                partition=partition,
                                fetch_offset=offset,
                                current_leader_epoch=-1,
                                partition_max_bytes=8 << 20,
                            )
                        ],
                    )
                ],
            )
            r = self.client.storage(addr).Fetch(req, timeout=10).topics[0].partitions[0]
            assert r.error_code == NONE, r.error_message
            got = [b for b in decode_batches(r.records) if b.last_offset >= offset]
            if not got:
                return out
            out.extend(got)
            offset = got[-1].last_offset + 1


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("producer")
    proxy_port = free_port()
    cluster = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        node_args=["--advertise", f"127.0.0.1:{proxy_port}"],
    )
    proxy = TcpProxy(cluster.nodes[0].port, proxy_port)
    try:
        cluster.start()
        e = Env(cluster, proxy)
        yield e
        e.client.close()
    finally:
        proxy.close()
        cluster.kill()


def test_send_returns_futures_and_runs_callbacks(env: Env) -> None:
    t = env.topic()
    seen: list[tuple[RecordMetadata | None, BaseException | None]] = []
    with Producer(env.bootstrap, acks=1) as p:
        f1 = p.send(t, b"a", callback=lambda md, err: seen.append((md, err)))
        f2 = p.send(t, "b", key="k", headers=[("h", b"1"), ("s", "x")], timestamp_ms=12345)
        assert isinstance(f1, concurrent.futures.Future)
        done, _ = concurrent.futures.wait([f1, f2], timeout=10)
        assert len(done) == 2
        md1, md2 = f1.result(), f2.result()
        assert (md1.topic, md1.partition, md1.offset) == (t, 0, 0)
        assert (md2.offset, md2.timestamp) == (1, 12345)
        cb: list[RecordMetadata] = []
        f2.add_done_callback(lambda f: cb.append(f.result()))
        assert cb == [md2]
        assert [f.result() for f in concurrent.futures.as_completed([f1])] == [md1]
    assert seen == [(md1, None)]
    recs = env.read(t)
    assert [(r.offset, r.key, r.value) for r in recs] == [(0, None, b"a"), (1, b"k", b"b")]
    assert list(recs[1].headers) == [("h", b"1"), ("s", b"x")] and recs[1].timestamp == 12345


def test_batches_stay_under_the_topics_max_message_bytes(env: Env) -> None:
    """A topic whose max.message.bytes is below batch_size: the producer keeps its batches
    under it, so only a record too large on its own is refused (found from outside: 500
    records of 100 bytes all failed in batches of 60 KB, and a large line cost the small
    ones around it)."""
    t = env.topic(**{"max.message.bytes": "10000"})
    with Producer(env.bootstrap, linger_ms=50) as p:
        small = [p.send(t, b"%05d" % i + b"x" * 95) for i in range(500)]
        big = p.send(t, b"y" * 12_000)
        after = p.send(t, b"after")
        p.send_batch(t, [b"z" * 100] * 1000).result(10)  # the bulk path too
        p.flush()
    assert all(f.exception(0) is None for f in small)
    assert isinstance(big.exception(0), MessageTooLargeError)
    assert after.result(0).offset == 500
    got = env.read(t)
    assert len(got) == 1501 and [r.value for r in got[:500]] == [
        b"%05d" % i + b"x" * 95 for i in range(500)
    ]


def test_keys_keep_their_order_on_the_kafka_partition(env: Env) -> None:
    t = env.topic(partitions=4)
    keys = [b"user-%d" % i for i in range(6)]
    with Producer(env.bootstrap, linger_ms=1, batch_size=512) as p:
        futures = [p.send(t, b"%d" % i, key=keys[i % 6]) for i in range(300)]
        p.flush()
    assert all(f.done() for f in futures)
    for k in keys:
        want = partition_for_key(k, 4)
        got = [int(r.value) for r in env.read(t, want) if r.key == k]
        assert got == sorted(got) and len(got) == 50
        assert all(f.result().partition == want for i, f in enumerate(futures) if keys[i % 6] == k)


def test_keyless_records_stick_to_a_partition_per_batch(env: Env) -> None:
    t = env.topic(partitions=3)
    with Producer(env.bootstrap, linger_ms=1000, batch_size=1 << 20) as p:
        parts = {p.send(t, b"x").result(10).partition for _ in range(1)}
        more = [p.send(t, b"y") for _ in range(20)]
        p.flush()
        assert {f.result().partition for f in more} <= parts | {f.result().partition for f in more}
        assert len({f.result().partition for f in more}) == 1
    with Producer(env.bootstrap, linger_ms=0, batch_size=200) as p:
        spread = [p.send(t, b"z" * 100) for _ in range(60)]
        p.flush()
    assert len({f.result().partition for f in spread}) == 3  # full batches move on


def test_send_batch_from_lists_and_arrow(env: Env) -> None:
    t = env.topic(partitions=2)
    with Producer(env.bootstrap, batch_size=4096) as p:
        values = [b"v%05d" % i for i in range(5000)]
        res = p.send_batch(t, values, partition=1).result(30)
        assert sum(r.count for r in res) == 5000 and len(res) > 1
        assert [r.base_offset for r in res] == sorted(r.base_offset for r in res)
        table = pa.table(
            {
                "key": pa.array([b"a", b"b"] * 50, pa.binary()),
                "value": pa.array([b"w%d" % i for i in range(100)], pa.binary()),
                "timestamp": pa.array([1000 + i for i in range(100)], pa.int64()),
            }
        )
        res2 = p.send_batch(t, table).result(30)
        assert sum(r.count for r in res2) == 100
    assert [r.value for r in env.read(t, 1)][:5000] == values
    for key in (b"a", b"b"):
        part = partition_for_key(key, 2)
        mine = [r for r in env.read(t, part) if r.key == key]
        assert [int(r.value[1:]) for r in mine] == list(range(0 if key == b"a" else 1, 100, 2))
        assert all(r.timestamp == 1000 + int(r.value[1:]) for r in mine)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_compression_round_trips(env: Env, codec: str) -> None:
    t = env.topic()
    values = [b"compress me %d " % i * 5 for i in range(500)]
    with Producer(env.bootstrap, compression=codec) as p:
        for v in values:
            p.send(t, v)
    assert [r.value for r in env.read(t)] == values


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks_levels(env: Env, acks: int | str) -> None:
    t = env.topic()
    with Producer(env.bootstrap, acks=acks) as p:
        md = p.send(t, b"a").result(10)
    assert md.offset == (-1 if acks == 0 else 0)
    wait_for(lambda: [r.value for r in env.read(t)] == [b"a"], timeout=10, what="the record")


def test_idempotent_retry_after_a_lost_response_writes_once(env: Env) -> None:
    t = env.topic()
    with Producer(env.bootstrap, acks="all", retry_backoff_ms=50) as p:
        assert p.send(t, b"first").result(10).offset == 0  # connection through the proxy is up
        env.proxy.hold()  # the node's answers vanish from here on
        f = p.send(t, b"second")
        # The append happened (seen directly on the node) but the producer got no answer.
        wait_for(lambda: len(env.read(t)) == 2, timeout=10, what="the append on the node")
        assert not f.done()
        env.proxy.cut()  # the connection dies: the producer retries the same batch
        assert f.result(20).offset == 1
        assert p.send(t, b"third").result(10).offset == 2
    assert [r.value for r in env.read(t)] == [b"first", b"second", b"third"]


def test_a_batch_still_filling_waits_for_the_answer_in_flight(env: Env) -> None:
    """Nagle's rule for batches: while a partition has a request in flight, records sent with
    ``linger_ms=0`` gather in one batch that goes out when the answer comes (only full batches
    are pipelined), so a steady trickle costs one call per round trip, not one per record."""
    t = env.topic()
    with Producer(env.bootstrap, acks="all", linger_ms=0, retry_backoff_ms=50) as p:
        assert p.send(t, b"warm").result(10).offset == 0  # connection through the proxy is up
        env.proxy.hold()  # the node's answers vanish from here on
        first = p.send(t, b"a")
        wait_for(lambda: len(env.read(t)) == 2, timeout=10, what="the append on the node")
        pace = threading.Event()
        rest = []
        for i in range(50):
            rest.append(p.send(t, b"b%d" % i))
            pace.wait(0.0005)  # let the sender thread run between sends, as a trickle would
        # Nothing more reached the node while "a" was unanswered (pipelining sent them).
        assert [r.value for r in env.read(t)] == [b"warm", b"a"]
        env.proxy.cut()  # "a" is retried (the node knows it: no duplicate), then the rest
        assert first.result(20).offset == 1
        assert [f.result(20).offset for f in rest] == list(range(2, 52))
    assert [len(b) for b in env.batches(t)] == [1, 1, 50]
    assert [r.value for r in env.read(t)][2:] == [b"b%d" % i for i in range(50)]


def test_requests_holding_many_partitions_leave_the_node_free_for_more(env: Env) -> None:
    """A request carries the due batches of every partition the node leads; it takes one of
    the node's ``max_in_flight`` slots and gives it back when answered. (The slots used to be
    taken per partition and given back per request: a producer that once sent several
    partitions in one request was left with one slot and one partition per request for good.)"""
    t = env.topic(partitions=6)
    keys = {}
    for i in range(1000):  # one key per partition
        keys.setdefault(partition_for_key(b"k%d" % i, 6), b"k%d" % i)
    requests: list[list[int]] = []  # the partitions of each Produce the producer issued

    def sink(point: str, _ns: int, entries: Any) -> None:
        if point == "produce.sent":
            requests.append(sorted(e.pq.partition for e in entries if e.pq.topic == t))

    trace.sink = sink
    try:
        with Producer(env.bootstrap, linger_ms=60_000, max_in_flight=2) as p:
            for round_ in range(5):  # the first may retry while the partitions get leaders
                del requests[:]
                futures = [p.send(t, b"%d" % round_, key=keys[q]) for q in range(6)]
                p.flush(timeout=20)  # all six partitions are due at once
                assert [f.result(0).partition for f in futures] == list(range(6))
                assert [f.result(0).offset for f in futures] == [round_] * 6
                if round_:
                    assert requests == [list(range(6))]  # one request, every round
    finally:
        trace.sink = None


def key_per_partition(partitions: int) -> dict[int, bytes]:
    """partition -> a key Kafka's partitioner sends there."""
    keys: dict[int, bytes] = {}
    for i in range(1000):
        keys.setdefault(partition_for_key(b"k%d" % i, partitions), b"k%d" % i)
    return keys


@contextlib.contextmanager
def produce_requests() -> Iterator[list[list[tuple[int, int]]]]:
    """The Produce requests producers issue meanwhile, as sorted (partition, records) lists
    (from ``strom.client.trace``'s ``produce.sent`` point)."""
    requests: list[list[tuple[int, int]]] = []

    def sink(point: str, _ns: int, entries: Any) -> None:
        if point == "produce.sent":
            requests.append(
                sorted((e.pq.partition, sum(b.count for b in e.batches)) for e in entries)
            )

    trace.sink = sink
    try:
        yield requests
    finally:
        trace.sink = None


def test_a_partition_filling_slowly_rides_along_with_a_due_one(env: Env) -> None:
    """As Kafka's accumulator drains a ready node: when one partition's batch is due, the
    records waiting in the node's other partitions go in the same request, instead of each
    partition costing a call of its own when its linger expires."""
    t = env.topic(partitions=2)
    keys = key_per_partition(2)
    with (
        produce_requests() as requests,
        Producer(env.bootstrap, linger_ms=60_000, batch_size=1000) as p,
    ):
        p.send(t, b"warm", key=keys[0])
        p.send(t, b"warm", key=keys[1])
        p.flush(timeout=20)
        del requests[:]
        slow = p.send(t, b"slow", key=keys[1])  # partition 1: 60 s of linger left
        full = [p.send(t, b"x" * 100, key=keys[0]) for _ in range(8)]  # closes a batch
        assert full[-1].result(20).partition == 0
        assert slow.result(20).partition == 1  # long before its linger
        assert requests == [[(0, 8), (1, 1)]]


def test_a_poll_keeps_its_timeout_when_the_leader_stops_answering(env: Env) -> None:
    """(The consumer, here for the proxy.) A caught-up poll long-polls the leader itself; when
    the answers vanish on the wire, poll(timeout_ms) still returns about on time (not after
    the minute-long request timeout), and once the network is back the records come."""
    t = env.topic()
    tp = TopicPartition(t, 0)
    with Producer(env.bootstrap, acks=1) as p:
        assert p.send(t, b"a").result(10).offset == 0
    with Consumer(
        env.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        request_timeout_ms=60_000,
    ) as c:
        c.assign([tp])
        got: list[Record] = []
        wait_for(
            lambda: bool(got.extend(c.poll(timeout_ms=200))) or bool(got),
            timeout=10,
            what="the first record",
        )
        assert [r.value for r in got] == [b"a"]
        assert c.poll(timeout_ms=150) == []  # caught up: the next poll fetches itself
        env.proxy.hold()  # the node's answers vanish from here on
        try:
            started = time.monotonic()
            assert c.poll(timeout_ms=300) == []
            took = time.monotonic() - started
        finally:
            env.proxy.cut()
        assert took < 10, f"poll(timeout_ms=300) took {took:.1f} s"
        with Producer(env.bootstrap, acks=1) as p:
            assert p.send(t, b"b").result(20).offset == 1
        got = []
        wait_for(
            lambda: bool(got.extend(c.poll(timeout_ms=200))) or bool(got),
            timeout=20,
            what="the record produced after the network came back",
        )
        assert [(r.offset, r.value) for r in got] == [(1, b"b")]


def test_without_idempotence_the_same_retry_duplicates(env: Env) -> None:
    """The control experiment for the test above: it shows the retry really happened."""
    t = env.topic()
    with Producer(env.bootstrap, acks=1, retry_backoff_ms=50, enable_idempotence=False) as p:
        assert p.send(t, b"first").result(10).offset == 0
        env.proxy.hold()
        f = p.send(t, b"second")
        wait_for(lambda: len(env.read(t)) == 2, timeout=10, what="the append on the node")
        env.proxy.cut()
        assert f.result(20).offset == 2
    assert [r.value for r in env.read(t)] == [b"first", b"second", b"second"]


def test_max_block_ms_when_the_cluster_does_not_answer(env: Env) -> None:
    t = env.topic()
    with Producer(
        env.bootstrap, acks=1, buffer_memory=64 * 1024, max_block_ms=500, delivery_timeout_ms=3000
    ) as p:
        p.send(t, b"warm").result(10)
        env.proxy.hold()  # the leader stops answering
        start = time.monotonic()
        with pytest.raises(RequestTimedOutError, match="buffer_memory"):
            for _ in range(10_000):
                p.send(t, b"x" * 1000)
        assert 0.4 < time.monotonic() - start < 5
        env.proxy.cut()
    # No cluster at all: metadata cannot be had within max_block_ms.
    dead = f"127.0.0.1:{free_port()}"
    with Producer(dead, max_block_ms=300) as p:
        start = time.monotonic()
        with pytest.raises(RequestTimedOutError, match="max_block_ms"):
            p.send("anything", b"x")
        assert time.monotonic() - start < 5


def test_a_due_partition_goes_first_when_a_request_cannot_hold_all(env: Env) -> None:
    """A request that cannot hold every partition of the node takes the due ones first (and
    each round starts one partition further), so a partition with a full batch is not kept
    waiting behind partitions that are merely riding along."""
    t = env.topic(partitions=2)
    keys = key_per_partition(2)
    with (
        produce_requests() as requests,
        Producer(
            env.bootstrap, linger_ms=60_000, batch_size=1000, max_request_size=1500, max_in_flight=1
        ) as p,
    ):
        p.send(t, b"warm", key=keys[0])
        p.send(t, b"warm", key=keys[1])
        p.flush(timeout=20)
        del requests[:]
        waiting = p.send(t, b"w" * 900, key=keys[0])  # 60 s of linger left
        full = [p.send(t, b"x" * 100, key=keys[1]) for _ in range(8)]  # a full batch
        assert full[-1].result(20).partition == 1
        assert requests[0] == [(1, 8)]  # 916 + 928 bytes do not fit in 1,500
        assert not waiting.done()  # it was not due, and did not fit beside
        p.flush(timeout=20)
        assert waiting.result(0).partition == 0


def test_reservations_do_not_crowd_out_many_partitions(env: Env) -> None:
    """``buffer_memory`` is reserved per batch in chunks; with more partitions open than the
    buffer has chunks, the reservations nobody filled go back before anyone waits, so the
    records still travel in batches (not one or two per request, as when empty
    reservations filled the buffer and every send made all batches due)."""
    t = env.topic(partitions=64)
    requests: list[int] = []

    def sink(point: str, _ns: int, entries: Any) -> None:
        if point == "produce.sent":
            requests.append(sum(b.count for e in entries for b in e.batches))

    trace.sink = sink
    try:
        with Producer(env.bootstrap, linger_ms=50, buffer_memory=1 << 20) as p:
            p.send(t, b"warm", partition=0).result(20)
            del requests[:]
            futures = [p.send(t, b"%05d" % i + b"v" * 295, partition=i % 64) for i in range(16_000)]
            p.flush(timeout=60)
        assert [f.result(0).partition for f in futures[:64]] == list(range(64))
        assert sum(requests) == 16_000
        assert len(requests) < 16_000 / 50  # batched: at least 50 records a request on average
    finally:
        trace.sink = None


def test_a_full_buffer_sends_batches_that_would_still_linger(env: Env) -> None:
    """``buffer_memory`` is reserved per batch, in chunks; a caller waiting for it makes every
    batch due (as Kafka's accumulator does when its pool is exhausted), so a long
    ``linger_ms`` cannot hold the memory the caller waits for until ``max_block_ms``."""
    t = env.topic(partitions=6)
    with Producer(
        env.bootstrap, linger_ms=60_000, buffer_memory=64 * 1024, max_block_ms=5_000
    ) as p:
        # ~600 KiB through a 64 KiB buffer: each send that finds it full waits for batches
        # the sender ships at once (not after 60 s, nor RequestTimedOutError after 5 s)
        futures = [p.send(t, b"%04d" % i + b"x" * 1000, partition=i % 6) for i in range(600)]
        assert futures[500].result(10).partition == 2  # shipped without a flush
        p.flush(timeout=20)  # the last ones would linger
        got = [f.result(0) for f in futures]
    assert sorted(md.offset for md in got if md.partition == 0) == list(range(100))
    for q in range(6):
        assert [r.value[:4] for r in env.read(t, q)] == [b"%04d" % i for i in range(q, 600, 6)]


def test_timestamps_from_the_clock_and_given(env: Env) -> None:
    t = env.topic()
    with Producer(env.bootstrap) as p:
        before = time.time_ns() // 1_000_000
        stamped = p.send(t, b"now").result(10).timestamp
        after = time.time_ns() // 1_000_000
        assert before <= stamped <= after  # ms, floored like the clock
        given = [p.send(t, b"g", timestamp_ms=ts) for ts in (0, 1_795_000_000_123)]
        assert [f.result(10).timestamp for f in given] == [0, 1_795_000_000_123]
        assert p.send(t, b"np", timestamp_ms=np.int64(7)).result(10).timestamp == 7
        for bad in (-1, 2**53, 1.5, "12", True):  # (2**53: kept exactly as a float below it)
            with pytest.raises(InvalidRequestError, match="timestamp_ms"):
                p.send(t, b"bad", timestamp_ms=bad)
        # It says the bound (found from outside: it said ">= 0" for 2**53).
        with pytest.raises(InvalidRequestError, match=r"0 to 2\*\*53 - 1"):
            p.send(t, b"bad", timestamp_ms=2**53)
    stamps = [r.timestamp for r in env.read(t)]
    assert stamps == [stamped, 0, 1_795_000_000_123, 7]


def test_clear_errors_for_bad_arguments(env: Env) -> None:
    t = env.topic(partitions=2)
    with pytest.raises(ValueError, match="compression"):
        Producer(env.bootstrap, compression="brotli")
    with pytest.raises(ValueError, match="acks"):
        Producer(env.bootstrap, acks=2)
    with Producer(env.bootstrap, max_request_size=1000) as p:
        start = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
            p.send("no-such-topic", b"x")
        assert time.monotonic() - start < 5
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 2"):
            p.send(t, b"x", partition=2)
        with pytest.raises(MessageTooLargeError, match="max_request_size"):
            p.send(t, b"x" * 2000)
        with pytest.raises(TypeError, match="value must be bytes"):
            p.send(t, 42)
        assert p.send(t, b"ok", partition=1).result(10).offset == 0
    with pytest.raises(ProducerClosedError):
        p.send(t, b"late")


def test_partitions_added_while_the_producer_runs_take_records(env: Env) -> None:
    # The producer learnt "1 partition"; partitions added since are waited for (the nodes
    # learn them through their etcd watches), one beyond the new count fails at once.
    t = env.topic(partitions=1)
    with Producer(env.bootstrap) as p, Consumer(env.bootstrap) as c:
        assert p.send(t, b"first", partition=0).result(10).offset == 0
        assert p.partitions_for(t) == [0]
        resp = env.client.controller_call(
            "CreatePartitions",
            controller_pb2.CreatePartitionsRequest(
                topics=[controller_pb2.CreatePartitionsTopic(name=t, count=3)]
            ),
        )
        assert resp.topics[0].error_code == NONE, resp.topics[0].error_message
        assert p.send(t, b"new", partition=2).result(10).offset == 0
        [meta] = p.send_batch(t, [b"a", b"b"], partition=1).result(10)
        assert (meta.partition, meta.base_offset) == (1, 0)
        start = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 3 \\(it has 3\\)"):
            p.send(t, b"x", partition=3)
        assert time.monotonic() - start < 5
        c.assign([TopicPartition(t, 2)])
        c.seek(TopicPartition(t, 2), 0)
        got = []
        wait_for(lambda: got.extend(c.poll(200)) or got, timeout=10, what="the new partition")
        assert [r.value for r in got] == [b"new"]


def test_records_for_a_partition_the_recreated_topic_lacks_fail_at_once(env: Env) -> None:
    """A topic deleted and re-created with fewer partitions: records a producer with the old
    metadata queued for a partition the new topic lacks fail as soon as the producer learns
    the new topic, as not written (found from outside: every answer was
    UNKNOWN_TOPIC_OR_PARTITION, yet they were retried for delivery_timeout_ms and failed as
    "may have been written")."""
    t = env.topic(partitions=3)
    with Producer(env.bootstrap) as p:  # delivery_timeout_ms: 120 s
        assert p.send(t, b"old", partition=2).result(10).offset == 0
        env.delete(t, 3)
        env.topic(partitions=1, name=t)
        wait_for(lambda: env.offset_error(t, 0) == NONE, timeout=20, what="the new topic served")
        # The producer still has the old topic's 3 partitions: it takes the record.
        stale = p.send(t, b"stale", partition=2)
        with pytest.raises(UnknownTopicOrPartitionError, match="not written") as info:
            stale.result(30)
        assert "may have been written" not in str(info.value)
        assert not info.value.retriable
        assert p.send(t, b"new", partition=0).result(10).offset == 0
    assert [r.value for r in env.read(t)] == [b"new"]


def test_records_made_for_a_deleted_topic_never_land_in_its_successor(env: Env) -> None:
    """Produce carries the topic id the producer made its batches for (Kafka's Produce v13):
    a record sent with the metadata of a topic since deleted and re-created under the same
    name is refused and fails as not written, and sends after the producer has learnt the
    new topic go to it (found from outside: the stale record was appended to the new
    topic)."""
    t = env.topic(partitions=1)
    with Producer(env.bootstrap) as p:
        assert p.send(t, b"old").result(10).offset == 0
        env.delete(t, 1)
        env.topic(partitions=1, name=t)
        wait_for(lambda: env.offset_error(t, 0) == NONE, timeout=20, what="the new topic served")
        stale = p.send(t, b"stale")  # made with the deleted topic's id
        with pytest.raises(InconsistentTopicIdError, match="not written: the topic was deleted"):
            stale.result(30)
        assert p.send(t, b"new").result(10).offset == 0
        assert p.send_batch(t, [b"bulk"]).result(10)[0].base_offset == 1
    assert [r.value for r in env.read(t)] == [b"new", b"bulk"]


def test_keyed_records_reach_partitions_added_later(env: Env) -> None:
    """metadata_max_age_ms (Kafka's metadata.max.age.ms): a long-running producer learns a
    topic's new partition count, so keys map over all partitions (found from outside: the
    producer never looked again, and keyed records never reached added partitions)."""
    t = env.topic(partitions=2)
    keys = [b"k%d" % i for i in range(50)]
    with Producer(env.bootstrap, metadata_max_age_ms=200) as p:
        for k in keys:
            p.send(t, b"before", key=k)
        p.flush()
        resp = env.client.controller_call(
            "CreatePartitions",
            controller_pb2.CreatePartitionsRequest(
                topics=[controller_pb2.CreatePartitionsTopic(name=t, count=6)]
            ),
        )
        assert resp.topics[0].error_code == NONE, resp.topics[0].error_message
        wait_for(lambda: len(p.partitions_for(t)) == 6, timeout=20, what="6 partitions learnt")
        futures = {k: p.send(t, b"after", key=k) for k in keys}
        p.flush()
    assert {k: f.result(0).partition for k, f in futures.items()} == {
        k: partition_for_key(k, 6) for k in keys
    }
    assert max(f.result(0).partition for f in futures.values()) >= 2
    with pytest.raises(ValueError, match="metadata_max_age_ms"):
        Producer(env.bootstrap, metadata_max_age_ms=0)


def test_a_producer_the_leader_forgot_starts_its_sequence_again(env: Env) -> None:
    """DeleteRecords past every batch of a producer drops its state on the leader; the next
    batch (sequence > 0) is refused UNKNOWN_PRODUCER_ID and the producer restarts at 0."""
    from strom.client import Admin, TopicPartition

    t = env.topic()
    with Producer(env.bootstrap, acks=1) as p:
        for i in range(3):
            assert p.send(t, b"%d" % i).result(10).offset == i
        with Admin(env.bootstrap) as admin:
            assert admin.delete_records({TopicPartition(t, 0): 3}) == {TopicPartition(t, 0): 3}
        assert p.send(t, b"again").result(20).offset == 3
        assert p.send(t, b"and again").result(20).offset == 4
    assert [r.value for r in env.read(t, start=3)] == [b"again", b"and again"]


def test_close_tells_records_in_flight_from_records_never_sent(env: Env) -> None:
    """close(timeout) with the leader's answers lost: the record it had sent fails with
    RequestTimedOutError (it may have been written; here it was), those still queued behind
    it with ProducerClosedError (found from outside: all of them were reported never sent,
    and a user retrying them wrote them twice)."""
    t = env.topic()
    p = Producer(env.bootstrap, acks=1, max_in_flight=1)
    try:
        p.send(t, b"warm").result(10)
        env.proxy.hold()
        sent = p.send(t, b"sent")
        wait_for(lambda: len(env.read(t)) == 2, timeout=10, what="the append on the node")
        queued = [p.send(t, b"queued%d" % i) for i in range(5)]  # behind it: max_in_flight=1
        joins: list[float | None] = []
        join = p._sender.join
        p._sender.join = lambda timeout=None: (joins.append(timeout), join(timeout))[1]  # type: ignore[method-assign]
        p.close(timeout=0.5)
    finally:
        env.proxy.cut()
        p.close()
    with pytest.raises(RequestTimedOutError, match="may have been written"):
        sent.result(0)
    for f in queued:
        with pytest.raises(ProducerClosedError, match="before the record was sent"):
            f.result(0)
    assert [r.value for r in env.read(t)] == [b"warm", b"sent"]
    # One deadline for the whole close: the flush used it up, the sender got no more (found
    # from outside: flush and join each had the full timeout, close(timeout=2) took 4 s).
    assert joins == [0.0]


def test_flush_returns_after_every_delivery_callback_ran(env: Env) -> None:
    """flush() waits for the delivery callbacks too, as Kafka's client (a record's callback
    runs before its future completes): found from outside, flush() returned with thousands
    of 20,000 callbacks still to run. Right after flush() every callback has run and every
    future is done."""
    t = env.topic(partitions=3)
    n = 20_000
    ran = [0]

    def slow(md: RecordMetadata | None, err: BaseException | None) -> None:
        assert err is None and md is not None
        time.sleep(0.0001)  # a callback doing a little work (a log line, a DB write)
        ran[0] += 1

    with Producer(env.bootstrap, linger_ms=20) as p:
        futures = [p.send(t, b"x%d" % i, key=b"k%d" % i, callback=slow) for i in range(n)]
        p.flush()
        assert ran[0] == n
        assert all(f.done() for f in futures)


def test_delivery_callbacks_may_use_the_producer_and_fail(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside a delivery callback: its own future's result() answers at once (the callback
    runs before the future completes, so waiting would never end); send() works; flush(),
    which would wait for the thread running the callback, is refused at once; a callback
    that raises is logged and the others still run."""
    from strom.client.producer import ProducerCallbackError

    t = env.topic()
    seen: dict[str, Any] = {}
    futures: list[concurrent.futures.Future[Any]] = []

    def own_result(md: RecordMetadata | None, err: BaseException | None) -> None:
        seen["own"] = futures[0].result(5)
        seen["done_inside"] = futures[0].done()

    def sends(md: RecordMetadata | None, err: BaseException | None) -> None:
        seen["sent"] = p.send(t, b"from-callback")

    def flushes(md: RecordMetadata | None, err: BaseException | None) -> None:
        try:
            p.flush()
        except ProducerCallbackError as exc:
            seen["flush"] = exc

    def raises(md: RecordMetadata | None, err: BaseException | None) -> None:
        raise RuntimeError("a broken callback")

    def after(md: RecordMetadata | None, err: BaseException | None) -> None:
        seen["after"] = md

    with Producer(env.bootstrap) as p:
        futures.append(p.send(t, b"a", callback=own_result))
        for cb in (sends, flushes, raises, after):
            p.send(t, b"b", callback=cb)
        p.flush()
        assert seen["own"] == futures[0].result(0) and seen["done_inside"] is False
        assert "delivery callback" in str(seen["flush"])
        assert seen["after"] is not None
        assert seen["sent"].result(10).offset == 5
    assert "a produce callback raised" in caplog.text


def test_close_from_a_delivery_callback_closes_at_once(env: Env) -> None:
    """close() from a delivery callback runs on the producer's own thread: it closes as
    close(0) does, without waiting for (or joining) itself (found from outside: it raised
    "cannot join current thread", swallowed, and left the producer half-closed: sends were
    still taken). The sender thread ends, later sends are refused, close() again returns."""
    t = env.topic()
    p = Producer(env.bootstrap)
    p.send(t, b"warm").result(10)
    outcome: list[Any] = []

    def close_inside(md: RecordMetadata | None, err: BaseException | None) -> None:
        try:
            p.close()
            outcome.append("closed")
        except BaseException as exc:  # (the test reports what it was)
            outcome.append(exc)

    first = p.send(t, b"first", callback=close_inside)
    assert first.result(10).offset == 1
    assert outcome == ["closed"]
    wait_for(lambda: not p._sender.is_alive(), timeout=10, what="the sender thread to end")
    with pytest.raises(ProducerClosedError):
        p.send(t, b"after")
    started = time.monotonic()
    p.close(5)
    assert time.monotonic() - started < 1


def test_header_keys_are_text_and_other_types_are_refused(env: Env) -> None:
    """Headers are (str, bytes) pairs (DESIGN §1). A bytes key is taken as UTF-8 text (found
    from outside: b"trace-id" was stored as "b'trace-id'", 7 as "7"); a key or value of any
    other type is refused naming the header and the type (an int value failed with a bare
    "object of type 'int' has no len()"); so is a key that is not UTF-8."""
    t = env.topic()
    with Producer(env.bootstrap) as p:
        md = p.send(t, b"v", headers=[(b"trace-id", b"abc"), ("s", "x"), ("n", None)])
        chunks = p.send_batch(t, [b"b0", b"b1"], headers=[[(b"batch", b"1")], None])
        assert md.result(10).offset == 0 and chunks.result(10)[0].base_offset == 1
        assert p.send(t, b"d", headers={"from": b"dict"}).result(10).offset == 3
        with pytest.raises(TypeError, match=r"header key 7 must be a str .*got int"):
            p.send(t, b"v", headers=[(7, b"x")])
        with pytest.raises(TypeError, match=r"header 'n': value must be .*got int"):
            p.send(t, b"v", headers=[("n", 5)])
        with pytest.raises(ValueError, match="not UTF-8"):
            p.send(t, b"v", headers=[(b"\xff", b"x")])
        with pytest.raises(TypeError, match=r"header key 7 must be a str"):
            p.send_batch(t, [b"v"], headers=[[(7, b"x")]])
        with pytest.raises(TypeError, match="pairs"):
            p.send(t, b"v", headers=[("only-a-key",)])
    records = env.read(t)
    assert [list(r.headers or []) for r in records] == [
        [("trace-id", b"abc"), ("s", b"x"), ("n", None)],
        [("batch", b"1")],
        [],
        [("from", b"dict")],
    ]


def _in_forked_child(check: Any) -> str:
    """Run ``check()`` in a forked child; returns what it reported through a pipe (the
    child exits with os._exit, whatever happens).

    A child that gRPC's core aborts before it can report is forked again (up to five
    times): the core is not fork-safe while other threads are inside it ("Other threads are
    currently calling into gRPC, skipping fork() handlers"), and CPython's after-fork
    clean-up, freeing those threads' frames, can free one of its objects and abort the child
    (SIGABRT, "Mutex::Fer with pending CondVar queueing"; two CI runs, ~1 in 6 forks here).
    That is gRPC's hazard, which the README names; what this checks is what a child that
    runs sees: the clients' refusal."""
    for _ in range(5):
        status, out = _fork_and_run(check)
        if os.waitstatus_to_exitcode(status) != -signal.SIGABRT or out:
            break
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def _fork_and_run(check: Any) -> tuple[int, str]:
    """One fork running ``check()``: (the child's wait status, what it reported)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        try:
            report = check()
        except BaseException as exc:  # (reported to the parent)
            report = f"{type(exc).__name__}: {exc}"
        os.write(write_end, report.encode()[:4000])
        os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            ready, _, _ = select.select([pipe], [], [], 60)
            if not ready:  # a child that hangs (as with a client made before the fork)
                os.kill(pid, signal.SIGKILL)
                pytest.fail("the forked child did not report within 60 s")
            out = pipe.read().decode()
    finally:
        _, status = os.waitpid(pid, 0)
    return status, out


def test_clients_used_in_a_forked_child_fail_clearly(env: Env) -> None:
    """gRPC is not fork-safe: a Producer made before os.fork() took the child's send() and
    its result() timed out for ever (found from outside). Now every client used in the child
    raises ForkedClientError at once, naming the process that made it; close() there does
    nothing (its threads and connections are the parent's), and the parent's clients go on."""
    from strom.client.admin import Admin
    from strom.errors import ForkedClientError

    t = env.topic()
    parent = os.getpid()
    p = Producer(env.bootstrap)
    c = Consumer(env.bootstrap, auto_offset_reset="earliest")
    a = Admin(env.bootstrap)
    try:
        p.send(t, b"before").result(10)
        c.assign([TopicPartition(t, 0)])
        assert len(c.poll(timeout_ms=5000)) == 1

        def calls() -> list[Any]:
            return [
                lambda: p.send(t, b"in-child"),
                lambda: p.send_batch(t, [b"x"]),
                lambda: p.flush(1),
                lambda: c.poll(timeout_ms=100),
                lambda: c.seek(TopicPartition(t, 0), 0),
                lambda: a.list_topics(),
            ]

        def child() -> str:
            reports = []
            for call in calls():
                started = time.monotonic()
                try:
                    call()
                    reports.append("accepted")
                except ForkedClientError as exc:
                    ok = f"created in process {parent}" in str(exc) and "after fork()" in str(exc)
                    reports.append("refused" if ok else str(exc))
                assert time.monotonic() - started < 1
            p.close(1)
            c.close()
            a.close()
            return ",".join(reports)

        assert _in_forked_child(child) == ",".join(["refused"] * len(calls()))
        assert p.send(t, b"after").result(10).offset == 1  # the parent's are unharmed
        assert [r.value for r in c.poll(timeout_ms=5000)] == [b"after"]
        assert t in a.list_topics()
    finally:
        p.close()
        c.close()
        a.close()


def test_send_and_send_batch_name_a_partition_of_the_wrong_type(env: Env) -> None:
    """Found from outside: send_batch(partition="1") failed with a bare "'<=' not
    supported between instances of 'int' and 'str'", and send(partition="1") raised
    InvalidRequestError (a server's error code) for a caller's mistake."""
    t = env.topic(partitions=2)
    with Producer(env.bootstrap) as p:
        for bad in ("1", 1.0, True):
            with pytest.raises(TypeError, match=f"partition must be an int, got {bad!r}"):
                p.send_batch(t, [b"v"], partition=bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=f"partition must be an int, got {bad!r}"):
                p.send(t, b"v", partition=bad)  # type: ignore[arg-type]
        assert p.send_batch(t, [b"v"], partition=1).result(10)[0].partition == 1
        assert p.send(t, b"v", partition=0).result(10).partition == 0


def test_a_partitioners_bad_answer_fails_that_send_alone_and_at_once(env: Env) -> None:
    """Found from outside: a partitioner answering None queued the record for partition
    None, and the sender thread then raised on it every round until delivery_timeout_ms:
    every record of the producer failed "no reachable leader". One answering 7 of 4
    partitions (or -1) waited delivery_timeout_ms too. Now such a send raises at once
    (as Kafka's "Invalid partition given with record"), and nothing is queued."""
    t = env.topic(partitions=4)

    def pick(key: bytes | None, n: int) -> Any:
        return {b"bad": None, b"big": 7, b"neg": -1, b"flag": True}.get(key or b"", 0)

    with Producer(env.bootstrap, partitioner=pick, delivery_timeout_ms=20000) as p:
        with pytest.raises(TypeError, match=r"partitioner .*pick returned None for topic"):
            p.send(t, b"x", key=b"bad")
        with pytest.raises(TypeError, match="returned True"):
            p.send(t, b"x", key=b"flag")
        for key, value in ((b"big", 7), (b"neg", -1)):
            with pytest.raises(
                ValueError,
                match=rf"returned partition {value} for topic '{t}', which has partitions "
                r"\[0, 4\)",
            ):
                p.send(t, b"x", key=key)
        with pytest.raises(TypeError, match="returned None"):
            p.send_batch(t, [b"a", b"b"], keys=[b"ok", b"bad"])
        assert p.send(t, b"good", key=b"ok").get(timeout=60).partition == 0
        assert p.send_batch(t, [b"g2"], keys=[b"ok"]).result(60)[0].partition == 0
    assert [r.value for r in env.read(t, 0)] == [b"good", b"g2"]


def test_a_batch_the_sender_cannot_handle_fails_alone(env: Env) -> None:
    """Found from outside: one batch that raised in the sender loop (a partition None a
    partitioner had answered) stopped the loop for every partition, every round, until each
    record expired. Such a batch now fails alone, and the rest is sent."""
    t = env.topic(partitions=2)
    with Producer(env.bootstrap, delivery_timeout_ms=20000) as p:
        assert p.send(t, b"warm", partition=1).get(timeout=60).offset == 0
        with p._lock:  # what send() queued for a bad partitioner's None before its check
            poisoned = p._new_batch(t, None)  # type: ignore[arg-type]
        p._wake.set()
        assert p.send(t, b"good", partition=0).get(timeout=60).offset == 0
        wait_for(lambda: poisoned.result.done, timeout=30, what="the bad batch failed")
        assert isinstance(poisoned.result.error, InvalidRequestError)
        assert "could not send" in str(poisoned.result.error)
        assert p.send(t, b"after", partition=1).get(timeout=60).offset == 1


def test_a_records_size_counts_its_header_keys_in_utf8_bytes(env: Env) -> None:
    """Header keys are sent as UTF-8: a record whose keys are within max_request_size in
    characters but not in bytes is refused at send(), not by the node."""
    t = env.topic(partitions=1)
    with Producer(env.bootstrap, max_request_size=1000) as p:
        key = "\u00e9" * 600  # 600 characters, 1,200 bytes
        with pytest.raises(MessageTooLargeError, match="max_request_size=1000"):
            p.send(t, b"v", headers=[(key, b"x")])
        assert p.send(t, b"v", headers=[("e" * 600, b"x")]).result(10).offset == 0


def test_a_closed_producer_is_freed(env: Env) -> None:
    """Found from outside (a soak): every closed Producer stayed in memory with its buffers.
    Its ProduceStream, cancelled by close(), raised itself in the reading thread (a gRPC
    call is its own exception); the exception's traceback held that thread's frame, whose
    locals held the requests' callbacks and so the producer, and gRPC's C layer kept the
    call alive where Python's cycle collector cannot look. The stream-deadline watchdog's
    loop also held the last streams it looked at while it slept."""
    t = env.topic(partitions=2)
    refs = []
    for _ in range(6):
        p = Producer(env.bootstrap)
        for k in range(200):
            p.send(t, b"p" * 10_000, key=b"%d" % k)
        p.flush(60)
        p.close()
        refs.append(weakref.ref(p))
        del p

    def freed() -> bool:
        gc.collect()
        return all(r() is None for r in refs)

    wait_for(freed, timeout=10, what="every closed producer freed")
