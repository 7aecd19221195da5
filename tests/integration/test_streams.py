"""Produce and Fetch on streams (storage.proto's ProduceStream and FetchStream) against a
real node, and the clients' use of them (strom.client.streams):

- pipelined Produce requests on one stream are answered in order and appended in that order;
- Fetch requests on one stream are answered in order, a long poll included;
- a followed Fetch (FetchRequest.follow) is answered again from where each answer ended,
  until an error; the consumer's own long poll follows, and seeks and pauses end it;
- the Producer and the Consumer hold streams (the node's open-streams gauge) and let them go
  when closed;
- a node without the streams (an older version: a proxy that does not know the methods)
  is reached with unary calls, and nothing is lost;
- a stream whose node does not answer fails its request with DEADLINE_EXCEEDED (the unary
  call's timeout) and the requests behind it with UNAVAILABLE; a fetch stream left with a
  request unanswered is never lent again.

The authorization of each request on a stream is in tests/integration/test_security.py.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strom.api import storage_pb2, storage_pb2_grpc
from strom.client import streams as streams_mod
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.streams import FetchStreams, RequestStream
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode, StromError
from strom.record import encode_batch
from tests.conftest import create_topic, errors_since, member_metric, module_cluster, until_settled

from .grpc_proxy import cluster_behind_proxy

pytestmark = pytest.mark.integration

cluster = module_cluster(nodes=1, controllers=1, coordinators=0)
HEALED_CLUSTERS = ("cluster",)


def produce_request(topic: str, value: bytes) -> storage_pb2.ProduceRequest:
    req = storage_pb2.ProduceRequest(acks=1, timeout_ms=10_000)
    req.topics.add(topic=topic).partitions.add(
        partition=0, records=encode_batch([value]), current_leader_epoch=-1
    )
    return req


def fetch_request(topic: str, offset: int, max_wait_ms: int = 0) -> storage_pb2.FetchRequest:
    req = storage_pb2.FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20
    )
    req.topics.add(topic=topic).partitions.add(
        partition=0,
        fetch_offset=offset,
        current_leader_epoch=-1,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    return req


def read_all(bootstrap: str, topic: str, n: int) -> list[bytes | None]:
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        got: list[bytes | None] = []
        wait_for(
            lambda: bool(got.extend(r.value for r in c.poll(timeout_ms=200))) or len(got) >= n,
            timeout=20,
            what=f"{n} records of {topic}",
        )
        return got


def node_metric(node: Any, family_name: str, label: str) -> dict[str, float]:
    """One metric family of a node's /metrics (counters' ``_total`` samples), by ``label``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics").read()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name == family_name:
            for s in family.samples:
                if family.type != "counter" or s.name.endswith("_total"):
                    out[s.labels[label]] = s.value
    return out


def open_streams(cluster: LocalCluster) -> dict[str, float]:
    """The node's strom_storage_open_streams gauge, by method."""
    return node_metric(cluster.nodes[0], "strom_storage_open_streams", "method")


def test_pipelined_produce_requests_are_answered_and_appended_in_order(
    cluster: LocalCluster,
) -> None:
    topic = create_topic(cluster, "s-order")
    values = [f"v{i}".encode() for i in range(40)]
    with ClusterClient(cluster.bootstrap) as client:
        stub = client.storage(cluster.nodes[0].address)
        # Every request is written before any answer is read: the node has many in flight.
        answers = list(stub.ProduceStream(iter([produce_request(topic, v) for v in values])))
    assert len(answers) == len(values)
    parts = [a.topics[0].partitions[0] for a in answers]
    assert [p.error_code for p in parts] == [0] * len(values)
    assert [p.base_offset for p in parts] == list(range(len(values)))
    assert read_all(cluster.bootstrap, topic, len(values)) == values


def test_fetch_requests_on_one_stream_are_answered_in_order_long_polls_included(
    cluster: LocalCluster,
) -> None:
    topic = create_topic(cluster, "s-fetch")
    with ClusterClient(cluster.bootstrap) as client:
        stub = client.storage(cluster.nodes[0].address)
        list(stub.ProduceStream(iter([produce_request(topic, f"r{i}".encode()) for i in range(3)])))
        requests: Any = _Feed()
        answers = stub.FetchStream(iter(requests))
        for offset in (2, 0, 1):
            requests.put(fetch_request(topic, offset))
            batch = next(answers).topics[0].partitions[0]
            assert batch.error_code == 0
            assert _first_offset(batch.records) == offset
        # A long poll at the end of the log is answered when a record arrives.
        requests.put(fetch_request(topic, 3, max_wait_ms=20_000))
        t0 = time.monotonic()
        late = threading.Timer(
            0.3, lambda: list(stub.ProduceStream(iter([produce_request(topic, b"late")])))
        )
        late.start()
        batch = next(answers).topics[0].partitions[0]
        assert _first_offset(batch.records) == 3
        assert time.monotonic() - t0 < 15  # answered by the append, not by max_wait_ms
        late.join(10)  # (its stream ends after the answer: not cancelled by the client's close)
        requests.close()
        assert list(answers) == []  # the node ends the stream when the requests end


def _followed(cluster: LocalCluster) -> float:
    """The node's count of fetches it started without a request (followed requests)."""
    return member_metric(cluster.nodes[0], "strom_storage_fetch_followed_total")


def _records_of(answer: storage_pb2.FetchResponse) -> list[tuple[int, bytes | None]]:
    from strom.record import decode_batches

    p = answer.topics[0].partitions[0]
    assert p.error_code == 0, p.error_message
    return [(r.offset, r.value) for b in decode_batches(p.records) for r in b.records()]


def test_a_followed_fetch_is_answered_again_from_where_each_answer_ended(
    cluster: LocalCluster,
) -> None:
    """FetchRequest.follow: one request, then an answer for each append as it lands (and an
    empty one after each long-poll wait), every answer starting where the last ended; an
    answer with a partition error ends the follow and the stream takes requests again."""
    topic = create_topic(cluster, "s-follow")
    before = _followed(cluster)
    with ClusterClient(cluster.bootstrap) as client:
        stub = client.storage(cluster.nodes[0].address)

        def produce(*values: bytes) -> None:
            list(stub.ProduceStream(iter([produce_request(topic, v) for v in values])))

        def follow(offset: int, max_wait_ms: int, answers: int = 0) -> tuple[Any, Any]:
            """A new FetchStream carrying a followed request: (its request feed, answers)."""
            request = fetch_request(topic, offset, max_wait_ms)
            request.follow = True
            request.follow_answers = answers
            feed = _Feed()
            feed.put(request)
            return feed, stub.FetchStream(iter(feed))

        produce(b"a0", b"a1")  # two batches before the follow starts
        requests, answers = follow(0, max_wait_ms=300)
        assert _records_of(next(answers)) == [(0, b"a0"), (1, b"a1")]
        assert ("strom-fetch-follow", "1") in tuple(answers.initial_metadata())
        got: list[tuple[int, bytes | None]] = []
        for i in range(2, 8):  # each append is answered without a request
            produce(f"a{i}".encode())
            while len(got) < i - 1:
                got.extend(_records_of(next(answers)))
        assert got == [(i, f"a{i}".encode()) for i in range(2, 8)]
        # Caught up and nothing appended: an empty answer after the wait, and the follow
        # goes on from the same place.
        t0 = time.monotonic()
        assert _records_of(next(answers)) == []
        assert time.monotonic() - t0 >= 0.2
        produce(b"a8")
        later: list[tuple[int, bytes | None]] = []
        while not later:
            later.extend(_records_of(next(answers)))
        assert later == [(8, b"a8")]
        requests.close()  # ends nothing: a follow unbounded by follow_answers reads none
        answers.cancel()
        # A bounded follow answers no more than it was granted: what lands meanwhile waits
        # and goes out in one answer with the next grant.
        requests, answers = follow(9, max_wait_ms=20_000, answers=1)
        produce(b"a9")
        assert _records_of(next(answers)) == [(9, b"a9")]
        produce(b"a10")
        produce(b"a11")  # both appended (acks=1) before the grant: one answer for both
        requests.put(storage_pb2.FetchRequest(replica_id=-1, follow_answers=1))
        assert _records_of(next(answers)) == [(10, b"a10"), (11, b"a11")]
        requests.close()  # the grants end: so does the stream, once it needs one
        assert list(answers) == []
        # An error ends a follow: the stream then answers the next request.
        requests, answers = follow(1000, max_wait_ms=300, answers=1)
        # A grant sent before the client saw the error: skipped, not answered.
        requests.put(storage_pb2.FetchRequest(replica_id=-1, follow_answers=1))
        failed = next(answers).topics[0].partitions[0]
        assert failed.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        requests.put(fetch_request(topic, 8, max_wait_ms=300))
        assert _records_of(next(answers))[0] == (8, b"a8")
        requests.close()
        assert list(answers) == []
    assert _followed(cluster) >= before + 7


def test_a_caught_up_consumer_follows_and_seeks_and_pauses_end_the_follow(
    cluster: LocalCluster,
) -> None:
    """The consumer's own long poll follows (the node answers appends without a new
    request); a seek backwards or forwards, a pause and a resume each end the follow, and
    every poll returns exactly the records from the position on, in order."""
    topic = create_topic(cluster, "s-consumer-follow")
    tp = TopicPartition(topic, 0)
    before = _followed(cluster)
    with (
        Producer(cluster.bootstrap, linger_ms=0) as producer,
        Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer,
    ):
        consumer.assign([tp])

        def send(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                producer.send(topic, f"f{i}".encode(), partition=0).result(10)

        def take(n: int) -> list[int]:
            got: list[int] = []
            wait_for(
                lambda: (
                    bool(got.extend(r.offset for r in consumer.poll(timeout_ms=200)))
                    or len(got) >= n
                ),
                timeout=20,
                what=f"{n} records",
            )
            return got

        send(0, 5)
        assert take(5) == list(range(5))
        # Caught up: one record at a time, each answered on the follow.
        for i in range(5, 25):
            send(i, i + 1)
            assert take(1) == [i]
        assert _followed(cluster) >= before + 10
        consumer.seek(tp, 3)  # back, mid-follow
        assert take(22) == list(range(3, 25))
        send(25, 30)
        consumer.seek(tp, 28)  # forward
        assert take(2) == [28, 29]
        consumer.pause([tp])
        send(30, 33)
        assert consumer.poll(timeout_ms=300) == []
        consumer.resume([tp])
        assert take(3) == [30, 31, 32]
        send(33, 35)
        assert take(2) == [33, 34]


def test_a_follow_of_several_partitions_keeps_each_one_in_order(cluster: LocalCluster) -> None:
    """One followed request reads every caught-up partition of the node: records produced
    to them in turn all come back, each partition's in order, none twice."""
    topic = create_topic(cluster, "s-follow-many", partitions=3)
    tps = [TopicPartition(topic, p) for p in range(3)]
    before = _followed(cluster)
    with (
        Producer(cluster.bootstrap, linger_ms=0) as producer,
        Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer,
    ):
        consumer.assign(tps)
        got: dict[int, list[bytes | None]] = {0: [], 1: [], 2: []}

        def take(n: int) -> None:
            want = sum(map(len, got.values())) + n

            def more() -> bool:
                for r in consumer.poll(timeout_ms=200):
                    got[r.partition].append(r.value)
                return sum(map(len, got.values())) >= want

            wait_for(more, timeout=20, what=f"{n} more records")

        for i in range(30):
            producer.send(topic, f"m{i}".encode(), partition=i % 3).result(10)
            take(1)
        assert got == {p: [f"m{i}".encode() for i in range(p, 30, 3)] for p in range(3)}
        assert _followed(cluster) >= before + 10


def test_a_follow_cut_short_by_its_byte_bounds_goes_on_where_each_answer_ended(
    cluster: LocalCluster,
) -> None:
    """Bursts into a followed consumer whose answers hold a few hundred bytes per partition
    and a little more in all: every answer ends mid-burst, each continuation starts where
    the last ended, and every record of the three partitions arrives once, in order."""
    topic = create_topic(cluster, "s-follow-cut", partitions=3)
    before = _followed(cluster)
    with (
        Producer(cluster.bootstrap, linger_ms=0) as producer,
        Consumer(
            cluster.bootstrap,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=300,
            fetch_max_bytes=500,
        ) as consumer,
    ):
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        assert consumer.poll(timeout_ms=300) == []  # caught up: the next polls follow
        got: dict[int, list[bytes | None]] = {0: [], 1: [], 2: []}
        want: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
        for burst in range(3):
            for i in range(60):
                value = f"b{burst}-{i}".encode()
                want[i % 3].append(value)
                producer.send(topic, value, partition=i % 3)
            producer.flush(10)

            def more() -> bool:
                for r in consumer.poll(timeout_ms=200):
                    got[r.partition].append(r.value)
                return sum(map(len, got.values())) >= sum(map(len, want.values()))

            wait_for(more, timeout=30, what=f"burst {burst}")
        assert consumer.poll(timeout_ms=300) == []
        assert got == want
    # (The producer batches what waits behind its request in flight: how many answers the
    # bursts took depends on the machine; 15 continuations here in one run.)
    assert _followed(cluster) >= before + 3


def test_clients_hold_streams_while_open_and_let_them_go_when_closed(
    cluster: LocalCluster,
) -> None:
    topic = create_topic(cluster, "s-clients")
    before = open_streams(cluster)
    producer = Producer(cluster.bootstrap, linger_ms=0)
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, 0)])
        for i in range(20):
            producer.send(topic, f"c{i}".encode(), partition=0)
        producer.flush(10)
        got: list[bytes | None] = []
        wait_for(
            lambda: (
                bool(got.extend(r.value for r in consumer.poll(timeout_ms=200))) or len(got) >= 20
            ),
            timeout=20,
            what="the records back",
        )
        assert got == [f"c{i}".encode() for i in range(20)]
        # Caught up, the consumer long-polls on a stream (a lagging one makes unary calls).
        consumer.poll(timeout_ms=100)
        wait_for(
            lambda: (
                (during := open_streams(cluster)).get("ProduceStream", 0)
                >= before.get("ProduceStream", 0) + 1
                and during.get("FetchStream", 0) >= before.get("FetchStream", 0) + 1
            ),
            timeout=10,
            what="the node to count the producer's and the consumer's streams",
        )
    finally:
        producer.close(10)
        consumer.close()
    # (a gauge without samples yet reads as 0: this test may be the module's first to open
    # a stream)
    wait_for(
        lambda: all(
            open_streams(cluster).get(m, 0) == before.get(m, 0)
            for m in ("ProduceStream", "FetchStream")
        ),
        timeout=10,
        what="the node to see the clients' streams closed",
    )


def test_a_node_without_streams_is_reached_with_unary_calls(tmp_path: Path) -> None:
    """The producer learns that the node has no ProduceStream from the stream's headers,
    before it sends anything on it: its requests go as unary calls (pipelined ones may reach
    the node out of order and be resent: DESIGN "Order on the wire"), and every record lands
    once, in order."""
    with cluster_behind_proxy(tmp_path / "c", controllers=1, coordinators=0) as (c, proxy):
        topic = create_topic(c, "s-unary")
        values = [f"u{i}".encode() for i in range(2000)]
        # Small requests (about 10 one-record batches each), up to 5 in flight.
        with Producer(c.bootstrap, linger_ms=0, batch_size=1, max_request_size=8192) as p:
            futures = [p.send(topic, v, partition=0) for v in values]
            assert [f.result(20).offset for f in futures] == list(range(len(values)))
        assert read_all(c.bootstrap, topic, len(values)) == values
        assert proxy.calls.get("/strom.v1.StorageService/Produce", 0) >= 50
        assert proxy.calls.get("/strom.v1.StorageService/Fetch", 0) >= 1
        results = node_metric(c.nodes[0], "strom_storage_produce_requests", "error")
        assert results.get("NONE", 0) >= 50


# -- the client's streams against a server that never answers ------------------------------


class _Feed:
    """A request iterator fed by the test."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Any] = []
        self._closed = False

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._closed)
                if self._items:
                    item = self._items.pop(0)
                else:
                    return
            yield item


def _first_offset(records: bytes) -> int:
    from strom.record import decode_batches

    return decode_batches(records)[0].base_offset


@pytest.fixture
def silent_server() -> Iterator[tuple[str, threading.Event]]:
    """A gRPC server whose stream methods read requests and answer none, until released;
    ``Echo`` answers each request with itself."""
    release = threading.Event()

    def silent(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in requests:
            pass
        release.wait(30)
        return iter(())

    def echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    handler = grpc.method_handlers_generic_handler(
        "test.Streams",
        {
            "Silent": grpc.stream_stream_rpc_method_handler(silent),
            "Echo": grpc.stream_stream_rpc_method_handler(echo),
        },
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", release
    finally:
        release.set()
        server.stop(0)


def test_a_silent_stream_fails_its_requests_at_the_deadline(
    silent_server: tuple[str, threading.Event],
) -> None:
    address, _ = silent_server
    with grpc.insecure_channel(address) as channel:
        stream = RequestStream(channel, "/test.Streams/Silent", bytes, (), "test-stream")
        outcomes: list[grpc.StatusCode] = []
        done = threading.Event()

        def record(answer: Any) -> None:
            try:
                answer.result()
            except grpc.RpcError as exc:
                outcomes.append(exc.code())
            if len(outcomes) == 2:
                done.set()

        t0 = time.monotonic()
        assert stream.send(b"first", 0.5, record)
        assert stream.send(b"second", 30, record)
        assert done.wait(10), "the watchdog never ended the stream"
        assert time.monotonic() - t0 >= 0.5
        assert outcomes == [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE]
        assert stream.closed
        assert not stream.send(b"third", 1, record)  # a closed stream takes nothing more


def test_a_fetch_stream_left_with_an_unanswered_request_is_not_lent_again(
    silent_server: tuple[str, threading.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, _ = silent_server
    monkeypatch.setattr(streams_mod, "FETCH_STREAM_METHOD", "/test.Streams/Echo")
    pool = FetchStreams(lambda b: b, ())
    real_ask = streams_mod._PingPong.ask

    def interrupted(self: Any, request: Any, timeout_s: float) -> Any:
        self._requests.put(request)  # sent, and then the caller is interrupted
        raise KeyboardInterrupt

    with grpc.insecure_channel(address) as channel:
        monkeypatch.setattr(streams_mod._PingPong, "ask", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool.ask(channel, address, b"stale", 5)
        monkeypatch.setattr(streams_mod._PingPong, "ask", real_ask)
        assert pool.ask(channel, address, b"fresh", 5) == b"fresh"
        assert pool.ask(channel, address, b"again", 5) == b"again"
        pool.close()


def test_a_fetch_stream_cancelled_while_answered_leaves_no_error_in_the_log(
    cluster: LocalCluster,
) -> None:
    """FIX (found from outside): a FetchStream cancelled while the node was writing to it (a
    followed request whose reader stopped, then cancelled: a Subscribe's Consumer closing,
    a consumer seeking) logged an ERROR with a traceback ("ExecuteBatchError raised in core
    by servicer method [/strom.v1.StorageService/FetchStream]"). It now ends quietly."""
    topic = create_topic(cluster, "s-cancel")
    with Producer(cluster.bootstrap, linger_ms=0) as p:
        for _ in range(8):
            p.send_batch(topic, [b"x" * 1000] * 1000, partition=0)
        p.flush()
    node = cluster.nodes[0]
    before = open_streams(cluster).get("FetchStream", 0)
    mark = node.log_path.stat().st_size
    # gRPC's 64 KiB window (no BDP probing): the node blocks on the reader at once.
    with grpc.insecure_channel(node.address, options=[("grpc.http2.bdp_probe", 0)]) as ch:
        stub = storage_pb2_grpc.StorageServiceStub(ch)
        for _ in range(3):
            request = fetch_request(topic, 0, max_wait_ms=500)
            request.follow = True
            requests: Any = _Feed()
            requests.put(request)
            answers = stub.FetchStream(iter(requests))
            next(answers), next(answers)  # 1 MiB each; then the reader stops
            until_settled(
                lambda: node_metric(node, "strom_storage_bytes_out", "topic").get(topic),
                "the node to block on the reader",
            )
            answers.cancel()  # while the node waits to write the next answer
            requests.close()
            wait_for(
                lambda: open_streams(cluster).get("FetchStream", 0) <= before,
                timeout=30,
                what="the cancelled FetchStream to end",
            )
    assert errors_since(node, mark) == []


def test_a_stopping_node_ends_its_streams_cleanly(cluster: LocalCluster) -> None:
    """On SIGTERM the node answers what its streams carry and ends them with status OK
    (instead of holding them through its grace period until they are cancelled)."""
    topic = create_topic(cluster, "s-stop")
    node = cluster.nodes[0]
    with ClusterClient(cluster.bootstrap) as client:
        stub = client.storage(node.address)
        requests: Any = _Feed()
        answers = stub.FetchStream(iter(requests))
        requests.put(fetch_request(topic, 0))
        assert next(answers).topics[0].partitions[0].error_code == 0  # open, and now idle
        produce_requests: Any = _Feed()
        produced = stub.ProduceStream(iter(produce_requests))
        produce_requests.put(produce_request(topic, b"before the stop"))
        assert next(produced).topics[0].partitions[0].error_code == 0
        assert node.process is not None
        node.process.stop()  # SIGTERM, and waits for the exit
        assert list(answers) == []  # ended with OK: a cancelled stream would raise
        assert list(produced) == []
        requests.close()
        produce_requests.close()


def test_followers_replicate_on_streams(three_node_cluster: LocalCluster) -> None:
    """A follower long-polls its leader on a FetchStream: the leader of an RF=3 partition
    counts at least its two followers' streams, and what is produced is replicated."""
    cluster3 = three_node_cluster
    topic = create_topic(cluster3, "s-followers", replication_factor=3)
    with ClusterClient(cluster3.bootstrap) as client:
        leader_id = client.topic_metadata(topic).partitions[0].leader
        leader = next(n for n in cluster3.nodes if n.ident == leader_id)
        with Producer(cluster3.bootstrap, acks="all") as p:
            assert p.send(topic, b"replicated", partition=0).result(20).offset == 0

    def leader_streams() -> float:
        return node_metric(leader, "strom_storage_open_streams", "method").get("FetchStream", 0)

    wait_for(lambda: leader_streams() >= 2, timeout=10, what="the followers' fetch streams")


def test_a_shed_produce_on_a_stream_is_timed_as_a_shed_produce(make_cluster: Any) -> None:
    """A node over its memory limit sheds every Produce; one on a stream ends the stream and
    shows in the request latency as RESOURCE_EXHAUSTED, as the unary call does (found from
    outside: it was in no latency series)."""
    shed = make_cluster(
        nodes=1, controllers=1, coordinators=0, node_args=["--max-memory-bytes", "1"]
    )
    node = shed.nodes[0]
    topic = create_topic(shed, "s-shed")
    labels = {"rpc": "Produce", "result": "RESOURCE_EXHAUSTED"}
    name = "strom_storage_request_latency_seconds_count"
    with ClusterClient(shed.bootstrap) as client:
        stub = client.storage(node.address)
        with pytest.raises(grpc.RpcError) as exc:
            list(stub.ProduceStream(iter([produce_request(topic, b"x")]), timeout=30))
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert member_metric(node, name, **labels) == 1
        with pytest.raises(grpc.RpcError) as exc:
            stub.Produce(produce_request(topic, b"x"), timeout=30)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # (the unary call is timed as its handler ends, which may be after the client hears)
        wait_for(
            lambda: member_metric(node, name, **labels) == 2,
            timeout=10,
            what="the shed unary Produce timed",
        )


def test_the_coordinators_appends_go_on_a_stream_that_a_node_kill_replaces(
    make_cluster: Any,
) -> None:
    """The group coordinator appends commits to ``__consumer_offsets`` on a ProduceStream
    (strom.coordinator.produce_streams): with no client producing, the node holds one
    ProduceStream, the coordinator's. After the node is SIGKILLed and started again, the
    next commit goes through on a new stream and reads back (the broken one failed its
    appends retriably, and they were sent again)."""
    own = make_cluster(nodes=1, controllers=1, coordinators=1)
    topic = create_topic(own, "s-coord")
    node = own.nodes[0]
    tp = TopicPartition(topic, 0)
    with Consumer(own.bootstrap, group_id="g-stream", enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(5)})
        assert open_streams(own).get("ProduceStream", 0) == 1
        assert node.process is not None
        node.process.kill()
        node.start()
        own.wait_serving(node)
        wait_for(
            lambda: _commits(consumer, tp, 7),
            timeout=60,
            what="a commit after the node's restart",
        )
        assert consumer.committed(tp) == OffsetAndMetadata(7)
        assert open_streams(own).get("ProduceStream", 0) == 1


def _commits(consumer: Consumer, tp: TopicPartition, offset: int) -> bool:
    """Whether a synchronous commit of ``offset`` succeeds now (retriable errors: not yet)."""
    try:
        consumer.commit({tp: OffsetAndMetadata(offset)})
    except StromError as exc:
        if not exc.retriable:
            raise
        return False
    return True
