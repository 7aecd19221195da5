"""Big records end to end on real processes (etcd, a controller, storage nodes): one size
limit holds from the producer to every reader, so that whatever the cluster acknowledges its
readers can read.

Found from outside: batches between 64 and 256 MiB were acknowledged and then every reader
failed on them as "corrupt"; ``max.message.bytes`` and ``max_request_size`` took any size,
so records no Fetch answer could carry (or decompression bombs) were accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import records_pb2, records_pb2_grpc, storage_pb2
from strom.client import cluster as cluster_mod
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import InvalidConfigError, MessageTooLargeError
from strom.grpc_options import GRPC_OPTIONS, MAX_BATCH_BYTES, MAX_MESSAGE_BYTES
from strom.record import scan_batches

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
MiB = 1 << 20


def read_values(
    bootstrap: str, topic: str, count: int, *, arrow: bool, **options: object
) -> list[bytes]:
    """The first ``count`` values of partition 0, by poll() or poll_arrow()."""
    out: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest", **options) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 120
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count} records"
            if arrow:
                out.extend(consumer.poll_arrow(timeout_ms=1000).column("value").to_pylist())
            else:
                out.extend(r.value for r in consumer.poll(timeout_ms=1000))
    return out


def test_a_batch_over_64_mib_the_cluster_acknowledged_is_read_by_poll_and_poll_arrow(
    one_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """A 65 MiB record on a topic allowing 128 MiB: acknowledged, and both poll() and
    poll_arrow() return it and the record after it (they failed "exceeds the maximum of
    67108864" for good, the readers' limit being 64 MiB while nodes stored up to 256)."""
    b = one_node_cluster.bootstrap
    topic = new_topic(one_node_cluster, config={"max.message.bytes": str(128 * MiB)})
    big = b"\x01" * (65 * MiB)
    with Producer(b, max_request_size=128 * MiB, buffer_memory=256 * MiB, linger_ms=0) as producer:
        producer.send(topic, big).result(timeout=120)
        producer.send(topic, b"after").result(timeout=120)
    for arrow in (False, True):
        values = read_values(b, topic, 2, arrow=arrow)
        assert len(values[0]) == len(big) and values[0] == big
        assert values[1] == b"after"
    assert subscribed_values(one_node_cluster, topic, 2) == [big, b"after"]


def subscribed_values(cluster: LocalCluster, topic: str, count: int) -> list[bytes]:
    """The first ``count`` values of ``topic`` read through the records API's Subscribe
    (what the Node.js and other gRPC clients use), with strom's channel limits."""
    out: list[bytes] = []
    with grpc.insecure_channel(cluster.nodes[0].address, options=list(GRPC_OPTIONS)) as ch:
        stream = records_pb2_grpc.RecordServiceStub(ch).Subscribe(
            records_pb2.SubscribeRequest(topics=[topic], start=records_pb2.START_POSITION_EARLIEST),
            timeout=120,
        )
        try:
            for msg in stream:
                if msg.WhichOneof("event") == "records":
                    out.extend(msg.records.records.values)
                    if len(out) >= count:
                        break
        finally:
            stream.cancel()
    return out


def test_max_message_bytes_above_what_a_fetch_answer_carries_is_refused(
    one_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """Create and alter refuse a max.message.bytes no Fetch answer could carry, naming the
    maximum; the maximum itself is taken (both were accepted up to 2^31-1 before)."""
    b = one_node_cluster.bootstrap
    with Admin(b) as admin:
        with pytest.raises(InvalidConfigError, match=rf"max\.message\.bytes.*{MAX_BATCH_BYTES}"):
            admin.create_topic(
                "too-big-limit",
                partitions=1,
                replication_factor=1,
                config={"max.message.bytes": str(1 << 30)},
            )
        topic = new_topic(one_node_cluster)
        with pytest.raises(InvalidConfigError, match=rf"max\.message\.bytes.*{MAX_BATCH_BYTES}"):
            admin.alter_configs(topic, set={"max.message.bytes": str(MAX_BATCH_BYTES + 1)})
        admin.alter_configs(topic, set={"max.message.bytes": str(MAX_BATCH_BYTES)})


def test_a_producer_refuses_a_max_request_size_above_the_largest_batch() -> None:
    """Refused at construction with the maximum named (any size was taken before, and
    records above the gRPC limit were then retried for the whole delivery timeout)."""
    with pytest.raises(ValueError, match=rf"max_request_size must be <= {MAX_BATCH_BYTES}"):
        Producer("127.0.0.1:1", max_request_size=MAX_BATCH_BYTES + 1)


def test_records_count_uncompressed_so_no_batch_decompresses_past_max_request_size(
    one_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """A compression bomb cannot be made by a strom producer: a record of zeros larger than
    max_request_size is refused at send() although it is tiny once compressed, and records
    that each fit never share a batch bigger than max_request_size uncompressed (batch_size
    above it let a batch grow to batch_size, decompressing to many times the limit)."""
    b = one_node_cluster.bootstrap
    topic = new_topic(one_node_cluster)
    with Producer(
        b, compression="zstd", max_request_size=MiB, batch_size=16 * MiB, linger_ms=60_000
    ) as producer:
        with pytest.raises(MessageTooLargeError, match="max_request_size"):
            producer.send(topic, bytes(2 * MiB))
        futures = [producer.send(topic, bytes(400_000)) for _ in range(6)]
        producer.flush(timeout=60)
        batches: dict[int, int] = {}
        for f in futures:
            batches[id(f._batch)] = batches.get(id(f._batch), 0) + 400_000
            f.result(timeout=0)
    assert max(batches.values()) <= MiB, batches
    assert read_values(b, topic, 6, arrow=True) == [bytes(400_000)] * 6


def fill_past_one_message(cluster: LocalCluster, topic: str, partitions: int) -> int:
    """Write more than one gRPC message's worth (256 MiB) across the topic's partitions, in
    10 MiB records; the number of records."""
    count = MAX_MESSAGE_BYTES // (10 * MiB) + 3
    with Producer(cluster.bootstrap, max_request_size=12 * MiB, linger_ms=0) as producer:
        futures = [
            producer.send(topic, b"\x02" * (10 * MiB), partition=i % partitions)
            for i in range(count)
        ]
        for f in futures:
            f.result(timeout=120)
    return count


def test_a_fetch_asking_more_than_one_message_carries_is_answered_within_it(
    one_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """A raw Fetch asking 2^31-1 bytes of partitions holding more than 256 MiB is answered
    (fewer batches, whole ones, under the gRPC limit), and a consumer with fetch_max_bytes
    and max_partition_fetch_bytes at 2^31-1 reads everything. Before, gRPC refused to send
    the answer (RESOURCE_EXHAUSTED "Sent message larger than max") on every poll, forever."""
    topic = new_topic(one_node_cluster, partitions=3)
    count = fill_past_one_message(one_node_cluster, topic, 3)
    req = storage_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=(1 << 31) - 1,
        topics=[
            storage_pb2.FetchTopic(
                topic=topic,
                partitions=[
                    storage_pb2.FetchPartition(
                        partition=p,
                        fetch_offset=0,
                        current_leader_epoch=-1,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=(1 << 31) - 1,
                    )
                    for p in range(3)
                ],
            )
        ],
    )
    with ClusterClient(one_node_cluster.bootstrap, retry_s=20) as client:
        resp = client.storage(client.leader_of(topic, 0)).Fetch(req, timeout=120)
    parts = resp.topics[0].partitions
    assert all(p.error_code == 0 for p in parts)
    size = resp.ByteSize()
    assert size <= MAX_MESSAGE_BYTES
    assert sum(len(scan_batches(p.records)) for p in parts) >= count // 2  # not a trickle
    maxed = (1 << 31) - 1
    with Consumer(
        one_node_cluster.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_bytes=maxed,
        max_partition_fetch_bytes=maxed,
    ) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        got = 0
        deadline = time.monotonic() + 180
        while got < count:
            assert time.monotonic() < deadline, f"read {got} of {count} records"
            got += len(consumer.poll(timeout_ms=1000))


def test_a_request_over_the_channels_send_limit_fails_at_once_as_too_large(
    one_node_cluster: LocalCluster, new_topic: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request gRPC itself refuses to send ("Sent message larger than max") fails its
    batch at once with MessageTooLargeError, not retried as the leader shedding load until
    delivery_timeout_ms (found from outside: a record over the gRPC limit was retried as
    BROKER_NOT_AVAILABLE for the whole delivery timeout). The producer cannot build such a
    request any more (max_request_size is capped below the limit), so the channel's send
    limit is lowered here; records of other partitions still go through."""
    options = [(k, v) for k, v in cluster_mod.GRPC_OPTIONS if k != "grpc.max_send_message_length"]
    monkeypatch.setattr(
        cluster_mod, "GRPC_OPTIONS", [*options, ("grpc.max_send_message_length", MiB)]
    )
    topic = new_topic(one_node_cluster, partitions=2)
    for unary in (False, True):
        with Producer(
            one_node_cluster.bootstrap, linger_ms=50, delivery_timeout_ms=120_000
        ) as producer:
            if unary:
                producer._unary_only.add(producer._client.leader_of(topic, 0))
            started = time.monotonic()
            big = producer.send(topic, b"\x03" * (2 * MiB), partition=0)
            beside = producer.send(topic, b"beside", partition=1)  # (same request, likely)
            with pytest.raises(MessageTooLargeError, match="larger than"):
                big.result(timeout=60)
            assert time.monotonic() - started < 30
            assert beside.result(timeout=60).offset >= 0
            assert producer.send(topic, b"small", partition=1).result(timeout=60).offset >= 0


def test_send_batch_with_skewed_rows_writes_every_row_the_topic_takes(
    one_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """send_batch() cuts batches by the rows' own sizes: two adjacent big rows among small
    ones (each within the topic's max.message.bytes, not together) are all written, in order;
    a row over max_request_size is refused before anything is queued, as send() refuses it.
    Before, the two big rows shared one batch the topic refused (the small rows were written,
    the big ones lost), and the oversized row was accepted."""
    b = one_node_cluster.bootstrap
    topic = new_topic(one_node_cluster, config={"max.message.bytes": str(MiB)})
    big = b"\x04" * 600_000
    values = [b"s%d" % i for i in range(100)] + [big, big] + [b"t%d" % i for i in range(100)]
    with Producer(b, max_request_size=800 * 1024) as producer:
        done = producer.send_batch(topic, values, partition=0).result(timeout=60)
        assert sum(m.count for m in done) == len(values)
        with pytest.raises(MessageTooLargeError, match="max_request_size=819200"):
            producer.send_batch(topic, [b"s"] * 100 + [b"x" * 900_000] + [b"t"] * 100)
    assert read_values(b, topic, len(values), arrow=True) == values
    with Admin(b) as admin:
        end = admin.list_offsets({TopicPartition(topic, 0): "latest"})
    assert end[TopicPartition(topic, 0)].offset == len(values)  # nothing of the refused call


def test_batches_refused_after_max_message_bytes_was_lowered_are_split_and_written(
    one_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """Lowering max.message.bytes under a running idempotent producer: its batches made for
    the old limit are refused MESSAGE_TOO_LARGE, split and sent again (as Kafka's Sender
    does), so every record that fits alone is written, once, in order; one too large alone
    still fails. Before, every record already batched failed (found from outside: 40 of 40
    records of 100 KB in 4 MiB batches under a new 1 MiB limit)."""
    b = one_node_cluster.bootstrap
    topic = new_topic(one_node_cluster, partitions=2)
    record = 20_000
    with Producer(b, batch_size=400_000, linger_ms=200) as producer:
        first = [producer.send(topic, b"a%03d" % i + bytes(record), partition=0) for i in range(20)]
        producer.flush(timeout=60)
        assert all(f.exception(timeout=0) is None for f in first)
        with Admin(b) as admin:
            admin.alter_configs(topic, set={"max.message.bytes": "100000"})

        def lowered() -> bool:
            with Producer(b, linger_ms=0) as probe:  # partition 1: the leader applies it
                try:
                    probe.send(topic, bytes(150_000), partition=1).result(timeout=30)
                except MessageTooLargeError:
                    return True
            return False

        wait_for(lowered, timeout=60, what="the leader applying the lowered limit")
        later = [producer.send(topic, b"b%03d" % i + bytes(record), partition=0) for i in range(40)]
        producer.flush(timeout=120)
        failed = [f.exception(timeout=0) for f in later if f.exception(timeout=0) is not None]
        assert not failed, failed[:2]
        offsets = [f.result(timeout=0).offset for f in later]
        assert offsets == sorted(offsets) and len(set(offsets)) == 40
        with pytest.raises(MessageTooLargeError):
            producer.send(topic, bytes(150_000), partition=0).result(timeout=60)
    values = read_values(b, topic, 60, arrow=True)
    assert [v[:4] for v in values] == [b"a%03d" % i for i in range(20)] + [
        b"b%03d" % i for i in range(40)
    ]
    with Admin(b) as admin:
        end = admin.list_offsets({TopicPartition(topic, 0): "latest"})
    assert end[TopicPartition(topic, 0)].offset == 60  # each record once
