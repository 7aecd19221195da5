"""Client ids reach the storage node's per-client byte counters (``strom-client-id``
gRPC metadata): from the Producer as from the Consumer, named or defaulted, and from
RecordService callers; and what a Fetch answers is counted once."""

from __future__ import annotations

import re
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strom.api import records_pb2 as rp
from strom.api import records_pb2_grpc
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from tests.conftest import member_metric

pytestmark = pytest.mark.integration


def _by_client(cluster: LocalCluster, name: str) -> dict[str, float]:
    """``name`` per client_id label, summed over the cluster's storage nodes."""
    out: dict[str, float] = {}
    for node in cluster.nodes:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics") as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name:
                    cid = s.labels["client_id"]
                    out[cid] = out.get(cid, 0.0) + s.value
    return out


def test_produce_and_fetch_bytes_are_counted_per_client_id(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    cluster = one_node_cluster
    topic = new_topic(cluster)
    value = b"v" * 1000
    before_in = _by_client(cluster, "strom_storage_client_bytes_in_total")
    with Producer(cluster.bootstrap, client_id="billing-writer", acks="all") as p:
        for _ in range(20):
            p.send(topic, value)
        p.flush()
    with Producer(cluster.bootstrap, acks="all") as p:
        assert re.fullmatch(r"strom-producer-\d+", p.client_id)
        default_id = p.client_id
        p.send(topic, value).result(timeout=30)
    after_in = _by_client(cluster, "strom_storage_client_bytes_in_total")
    # Record bytes of a batch: at least the values (headers and Arrow framing add more).
    assert after_in["billing-writer"] - before_in.get("billing-writer", 0) >= 20 * len(value)
    assert after_in[default_id] - before_in.get(default_id, 0) >= len(value)

    before_out = _by_client(cluster, "strom_storage_client_bytes_out_total")
    with Consumer(cluster.bootstrap, client_id="billing-reader") as c:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning([tp])
        got, deadline = 0, time.monotonic() + 30
        while got < 21 and time.monotonic() < deadline:
            got += len(c.poll(timeout_ms=1000, max_records=100))
        assert got == 21
    after_out = _by_client(cluster, "strom_storage_client_bytes_out_total")
    assert after_out["billing-reader"] - before_out.get("billing-reader", 0) >= 21 * len(value)


def test_a_long_poll_counts_what_it_answers_once(one_node_cluster: LocalCluster, new_topic) -> None:
    """A consumer whose fetch_min_bytes is never met: each Fetch reads the partition, waits
    out fetch_max_wait_ms and reads it again. Only the last read is sent, and only it is
    counted (found from outside: both were, so bytes_out was twice client_bytes_out)."""
    cluster = one_node_cluster
    node = cluster.nodes[0]
    topic = new_topic(cluster)
    with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(10):
            p.send(topic, b"v" * 80 + bytes([i]))
        p.flush()
    with Consumer(
        cluster.bootstrap,
        client_id=f"long-poll-{topic}",
        fetch_min_bytes=1 << 20,
        fetch_max_wait_ms=50,
    ) as c:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning([tp])
        got, deadline = 0, time.monotonic() + 30
        while got < 10 and time.monotonic() < deadline:
            got += len(c.poll(timeout_ms=1000, max_records=100))
        assert got == 10
    answered = _by_client(cluster, "strom_storage_client_bytes_out_total")[f"long-poll-{topic}"]
    assert answered > 10 * 80
    assert member_metric(node, "strom_storage_bytes_out_total", topic=topic) == answered
    assert member_metric(node, "strom_storage_records_out_total", topic=topic) == 10


def test_record_service_calls_count_under_the_callers_client_id(
    three_node_cluster: LocalCluster, new_topic
) -> None:
    """ProduceRecords' bytes count under the client id its caller sent, on the leaders it
    forwards to as for a partition it leads itself; Subscribe's fetches too, or under one id
    per node when it sent none. Found from outside: ProduceRecords counted under "", and
    every Subscribe call fetched with an id of its own, a series per call on each leader."""
    cluster = three_node_cluster
    topic = new_topic(cluster, partitions=3)
    writer, reader = f"rec-writer-{topic}", f"rec-reader-{topic}"
    node = cluster.nodes[0]
    with grpc.insecure_channel(node.address) as ch:
        stub = records_pb2_grpc.RecordServiceStub(ch)
        for p in range(3):  # (one partition led here, one elsewhere at least)
            resp = stub.ProduceRecords(
                rp.ProduceRecordsRequest(
                    topic=topic, partition=p, records=rp.RecordColumns(values=[b"r" * 100] * 5)
                ),
                timeout=30,
                metadata=(("strom-client-id", writer),),
            )
            assert [r.error_code for r in resp.results] == [0]
        appended = sum(
            member_metric(n, "strom_storage_bytes_in_total", topic=topic) for n in cluster.nodes
        )
        assert appended > 15 * 100
        assert _by_client(cluster, "strom_storage_client_bytes_in_total")[writer] == appended

        for md in [(("strom-client-id", reader),)] * 2 + [None]:
            stream = stub.Subscribe(
                rp.SubscribeRequest(topics=[topic], start=rp.START_POSITION_EARLIEST),
                timeout=60,
                metadata=md,
            )
            got = 0
            while got < 15:
                msg = next(stream)
                if msg.WhichOneof("event") == "records":
                    got += len(msg.records.offsets)
            stream.cancel()
    out = _by_client(cluster, "strom_storage_client_bytes_out_total")
    assert out[reader] >= 2 * appended
    assert out[f"strom-node-{node.ident}-subscribe"] >= appended
    assert not [c for c in out if re.fullmatch(r"strom-node-\d+-subscribe-\d+", c)]
