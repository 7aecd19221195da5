"""``Producer.metrics()`` and ``Consumer.metrics()`` (and strom.aio's) against real clusters:
known numbers of records sent and consumed show in the totals, a consumer's lag per
partition is the high watermark less its position, failures show as retries and errors,
and the calls work before any traffic and after close(); and the Prometheus collector
(strom.client.metrics) exports them."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from strom import aio
from strom.client.consumer import Consumer
from strom.client.metrics import register, unregister
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import (
    MessageTooLargeError,
    RequestTimedOutError,
    StromError,
    UnknownTopicOrPartitionError,
)

pytestmark = pytest.mark.integration

PRODUCER_NAMES = (
    "record-send-total",
    "record-send-rate",
    "record-retry-total",
    "record-error-total",
    "batch-size-avg",
    "records-per-request-avg",
    "request-total",
    "request-latency-avg",
    "request-latency-max",
    "requests-in-flight",
    "buffer-total-bytes",
    "buffer-available-bytes",
    "bufferpool-wait-time-total",
    "compression-rate-avg",
    "produce-throttle-time-avg",
    "record-size-avg",
    "record-size-max",
)

CONSUMER_NAMES = (
    "records-consumed-total",
    "records-consumed-rate",
    "bytes-consumed-total",
    "bytes-consumed-rate",
    "fetch-total",
    "fetch-latency-avg",
    "fetch-latency-max",
    "records-lag-max",
    "commit-total",
    "commit-latency-avg",
    "commit-latency-max",
    "rebalance-total",
    "last-rebalance-seconds-ago",
    "assigned-partitions",
    "heartbeat-response-time-max",
    "last-poll-seconds-ago",
    "time-between-poll-avg",
    "time-between-poll-max",
    "poll-idle-ratio-avg",
    "records-lead-min",
    "commit-rate",
    "heartbeat-rate",
    "fetch-throttle-time-avg",
    "fetch-throttle-time-max",
)


def _consume(consumer: Consumer, count: int) -> int:
    """Poll until exactly ``count`` records came back (never more: max_records)."""
    got = [0]

    def more() -> bool:
        got[0] += len(consumer.poll(timeout_ms=200, max_records=count - got[0]))
        return got[0] >= count

    wait_for(more, timeout=60, what=f"{count} records polled")
    return got[0]


def test_producer_metrics_count_what_was_sent(one_node_cluster: LocalCluster, new_topic) -> None:
    cluster = one_node_cluster
    topic = new_topic(cluster)
    producer = Producer(cluster.bootstrap, buffer_memory=8 * 1024 * 1024)
    before = producer.metrics()
    assert set(PRODUCER_NAMES) <= set(before)
    assert before["record-send-total"] == 0 and before["request-total"] == 0
    assert math.isnan(before["request-latency-avg"])
    assert before["buffer-total-bytes"] == before["buffer-available-bytes"] == 8 * 1024 * 1024
    try:
        for i in range(100):
            producer.send(topic, b"v%03d" % i)
        producer.flush()
        m = producer.metrics()
    finally:
        producer.close()
    assert m["record-send-total"] == 100
    assert m[f"record-send-total{{topic={topic}}}"] == 100
    assert m["record-error-total"] == 0 and m["record-retry-total"] == 0
    assert m["record-send-rate"] > 0
    assert 1 <= m["request-total"] <= 100
    assert m["records-per-request-avg"] == 100 / m["request-total"]
    assert m["request-latency-avg"] > 0 and m["request-latency-max"] >= m["request-latency-avg"]
    assert m["batch-size-avg"] > 0 and m["byte-total"] > 0
    assert m["compression-rate-avg"] == 1.0  # compression="none"
    # b"v000": 4 value bytes and the 16 a record counts for its overhead.
    assert m["record-size-avg"] == m["record-size-max"] == 20
    assert m["produce-throttle-time-avg"] == 0
    assert m["requests-in-flight"] == 0
    assert m["buffer-available-bytes"] == m["buffer-total-bytes"]  # flushed: all given back
    after = producer.metrics()  # closed: still answers, with the final counts
    assert after["record-send-total"] == 100 and after["requests-in-flight"] == 0


def test_time_waiting_for_a_full_buffer_is_counted(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    """A buffer of 32 KiB holds about 30 records of 1 KB: the sends behind them wait for
    the answers to free it, and that wait is bufferpool-wait-time-total (ns)."""
    topic = new_topic(one_node_cluster)
    with Producer(one_node_cluster.bootstrap, buffer_memory=32 * 1024) as producer:
        for _ in range(300):
            producer.send(topic, b"x" * 1000)
        producer.flush()
        m = producer.metrics()
    assert m["record-send-total"] == 300
    assert m["bufferpool-wait-time-ns-total"] > 0
    assert m["bufferpool-wait-time-total"] == m["bufferpool-wait-time-ns-total"]
    assert m["buffer-total-bytes"] == m["buffer-available-bytes"] == 32 * 1024


def test_compression_rate_of_compressible_records(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    topic = new_topic(one_node_cluster)
    with Producer(one_node_cluster.bootstrap, compression="zstd") as producer:
        producer.send_batch(topic, [b"x" * 1000] * 200).result(timeout=30)
        m = producer.metrics()
    assert m["record-send-total"] == 200
    assert 0 < m["compression-rate-avg"] < 0.5


def test_a_refused_record_counts_as_an_error(one_node_cluster: LocalCluster, new_topic) -> None:
    """A record over the topic's max.message.bytes: the leader refuses it, for good."""
    topic = new_topic(one_node_cluster, config={"max.message.bytes": "2048"})
    with Producer(one_node_cluster.bootstrap) as producer:
        with pytest.raises(StromError):
            producer.send(topic, b"x" * 8000).result(timeout=30)
        producer.send(topic, b"small").result(timeout=30)
        m = producer.metrics()
    assert m["record-error-total"] == 1
    assert m[f"record-error-total{{topic={topic}}}"] == 1
    assert m["record-send-total"] == 2


def test_a_record_over_max_request_size_counts_as_an_error(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    """send() refuses it before any request (as Kafka's doSend, which counts it); a
    send_batch() refused for one row counts all its rows, none of which were queued."""
    topic = new_topic(one_node_cluster)
    with Producer(one_node_cluster.bootstrap, max_request_size=100_000) as producer:
        with pytest.raises(MessageTooLargeError):
            producer.send(topic, b"z" * 200_000)
        m = producer.metrics()
        assert m["record-error-total"] == 1 and m[f"record-error-total{{topic={topic}}}"] == 1
        with pytest.raises(MessageTooLargeError):
            producer.send_batch(topic, [b"a", b"z" * 200_000, b"b"])
        m = producer.metrics()
    assert m["record-error-total"] == 4 and m[f"record-error-total{{topic={topic}}}"] == 4
    assert m["record-error-rate"] > 0
    assert m["record-send-total"] == 0 and m["request-total"] == 0


def test_a_record_for_an_unknown_topic_counts_as_an_error(
    one_node_cluster: LocalCluster,
) -> None:
    with Producer(one_node_cluster.bootstrap, max_block_ms=5000) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("no-such-topic-metrics", b"v")
        m = producer.metrics()
    assert m["record-error-total"] == 1
    assert m["record-error-total{topic=no-such-topic-metrics}"] == 1


def test_a_send_that_finds_the_buffer_full_for_max_block_ms_counts_as_an_error(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    """Records the leader keeps refusing (NOT_ENOUGH_REPLICAS, retriable) fill a 32 KiB
    buffer; the next send waits max_block_ms and fails: one error, while the records in the
    buffer are still being retried (not errors yet)."""
    topic = new_topic(one_node_cluster, config={"min.insync.replicas": "2"})
    producer = Producer(
        one_node_cluster.bootstrap,
        buffer_memory=32 * 1024,
        max_block_ms=300,
        delivery_timeout_ms=60_000,
        request_timeout_ms=30_000,
    )
    try:
        with pytest.raises(RequestTimedOutError, match="buffer_memory"):
            for _ in range(200):
                producer.send(topic, b"q" * 1000)
        m = producer.metrics()
    finally:
        producer.close(timeout=0)
    assert m["record-error-total"] == 1
    assert m[f"record-error-total{{topic={topic}}}"] == 1


def test_retries_until_the_delivery_timeout_count_as_retries_then_an_error(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    """acks=all to a partition with fewer in-sync replicas than min.insync.replicas: the
    leader answers NOT_ENOUGH_REPLICAS (retriable) until delivery_timeout_ms."""
    topic = new_topic(one_node_cluster, config={"min.insync.replicas": "2"})
    with Producer(
        one_node_cluster.bootstrap,
        delivery_timeout_ms=1500,
        request_timeout_ms=1000,
        retry_backoff_ms=20,
        retry_backoff_max_ms=50,
    ) as producer:
        with pytest.raises(StromError):
            producer.send(topic, b"v").result(timeout=30)
        m = producer.metrics()
    assert m["record-retry-total"] >= 1
    assert m[f"record-retry-total{{topic={topic}}}"] == m["record-retry-total"]
    assert m["record-error-total"] == 1
    # Each attempt counts as a send, as Kafka's record-send-total does (the last retry may
    # expire before it is sent).
    assert m["record-retry-total"] <= m["record-send-total"] <= m["record-retry-total"] + 1


def test_consumer_metrics_count_records_and_lag(one_node_cluster: LocalCluster, new_topic) -> None:
    """Produce 100, consume 40: the lag is 60, the totals 40."""
    cluster = one_node_cluster
    topic = new_topic(cluster, partitions=2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Producer(cluster.bootstrap) as producer:
        for i in range(100):
            producer.send(topic, b"r%03d" % i, partition=0)
        for i in range(10):
            producer.send(topic, b"s%03d" % i, partition=1)
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    before = consumer.metrics()
    assert set(CONSUMER_NAMES) <= set(before)
    assert before["records-consumed-total"] == 0 and before["assigned-partitions"] == 0
    assert math.isnan(before["last-poll-seconds-ago"]) and math.isnan(before["records-lag-max"])
    try:
        consumer.assign([tp0])
        assert _consume(consumer, 40) == 40
        m = consumer.metrics()
        assert m["records-consumed-total"] == 40
        assert m[f"records-lag{{topic={topic},partition=0}}"] == 60
        # The largest lag a poll left in the window: 60 after the last one, more after an
        # earlier one that returned fewer records.
        assert 60 <= m["records-lag-max"] <= 100
        # Position 40, log start 0 (nothing deleted yet).
        assert m[f"records-lead{{topic={topic},partition=0}}"] == 40
        # The smallest lead a poll left in the window: 40 after the last one, less after an
        # earlier one that returned fewer records.
        assert 1 <= m["records-lead-min"] <= 40
        assert m["fetch-throttle-time-avg"] == 0 == m["fetch-throttle-time-max"]  # no quotas
        assert m["assigned-partitions"] == 1
        assert m["fetch-total"] >= 1 and m["fetch-latency-max"] >= m["fetch-latency-avg"] > 0
        assert m["bytes-consumed-total"] > 0 and m["bytes-consumed-rate"] > 0
        assert m["records-consumed-rate"] > 0
        assert 0 <= m["last-poll-seconds-ago"] < 30
        assert m["commit-total"] == 0 and m["rebalance-total"] == 0  # no group

        consumer.assign([tp0, tp1])
        consumer.seek(tp1, 4)
        _consume(consumer, 66)  # the 60 left of partition 0 and 6 of partition 1
        m = consumer.metrics()
        assert m["records-consumed-total"] == 106
        assert m[f"records-lag{{topic={topic},partition=0}}"] == 0
        assert m[f"records-lag{{topic={topic},partition=1}}"] == 0
        # Caught up now, but records-lag-max is a maximum over the window, as Kafka's: the
        # 60 left by the polls above still counts (it read 0 here before, the lag now).
        assert m["records-lag-max"] >= 60
        assert m[f"records-lead{{topic={topic},partition=1}}"] == 10
        # Partition 1 read from position 4: every poll that drained it left a lead of 5-10.
        assert 5 <= m["records-lead-min"] <= 10
        assert consumer.poll(timeout_ms=0) == []  # all read: a poll of nothing
        m = consumer.metrics()
        assert m["poll-total"] >= 3 and m["time-between-poll-max"] >= m["time-between-poll-avg"]
        assert 0 < m["poll-idle-ratio-avg"] <= 1
    finally:
        consumer.close()
    closed = consumer.metrics()
    assert closed["records-consumed-total"] == 106
    assert closed["assigned-partitions"] == 0 and math.isnan(closed["records-lag-max"])


def test_group_consumer_metrics_count_commits_and_rebalances(
    three_node_cluster: LocalCluster, new_topic
) -> None:
    cluster = three_node_cluster
    topic = new_topic(cluster, partitions=2)
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch(topic, [b"v%d" % i for i in range(20)]).result(timeout=30)
    with Consumer(
        cluster.bootstrap,
        group_id=f"metrics-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    ) as consumer:
        consumer.subscribe([topic])
        _consume(consumer, 20)
        consumer.commit()
        consumer.commit()
        m = consumer.metrics()
    assert m["rebalance-total"] >= 1
    assert 0 <= m["last-rebalance-seconds-ago"] < 60
    assert m["assigned-partitions"] == 2
    assert m["commit-total"] == 2 and m["commit-rate"] > 0
    assert m["commit-latency-max"] >= m["commit-latency-avg"] > 0
    assert m["heartbeat-total"] >= 1 and m["heartbeat-response-time-max"] > 0
    assert m["heartbeat-rate"] > 0
    assert m["records-consumed-total"] == 20 and m["records-lag-max"] == 0


def test_aio_clients_have_the_same_metrics(one_node_cluster: LocalCluster, new_topic) -> None:
    topic = new_topic(one_node_cluster)
    tp = TopicPartition(topic, 0)

    async def main() -> tuple[dict[str, float], dict[str, float]]:
        async with aio.Producer(one_node_cluster.bootstrap) as producer:
            assert producer.metrics()["record-send-total"] == 0
            for i in range(30):
                await producer.send(topic, b"a%d" % i)
            await producer.flush()
            sent = producer.metrics()
        async with aio.Consumer(one_node_cluster.bootstrap, auto_offset_reset="earliest") as c:
            await c.assign([tp])
            got = 0
            while got < 10:
                got += len(await c.poll(timeout_ms=500, max_records=10 - got))
            consumed = c.metrics()
        return sent, consumed

    sent, consumed = asyncio.run(main())
    assert sent["record-send-total"] == 30
    assert consumed["records-consumed-total"] == 10
    assert consumed[f"records-lag{{topic={topic},partition=0}}"] == 20


def test_prometheus_collector_exports_registered_clients(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    """strom.client.metrics.register: a scrape of the application's registry reads the
    clients' metrics() then, as counters and gauges labelled by client id (and topic,
    partition)."""
    topic = new_topic(one_node_cluster)
    registry = CollectorRegistry()
    producer = Producer(one_node_cluster.bootstrap, client_id="scraped-producer")
    consumer = Consumer(
        one_node_cluster.bootstrap, client_id="scraped-consumer", auto_offset_reset="earliest"
    )
    try:
        register(producer, registry)
        register(consumer, registry)
        with pytest.raises(TypeError, match="not a strom Producer or Consumer"):
            register(object(), registry)  # type: ignore[arg-type]
        empty = registry.get_sample_value(
            "strom_client_producer_record_send_total", {"client_id": "scraped-producer"}
        )
        assert empty == 0
        for i in range(25):
            producer.send(topic, b"%d" % i)
        producer.flush()
        consumer.assign([TopicPartition(topic, 0)])
        _consume(consumer, 5)
        assert (
            registry.get_sample_value(
                "strom_client_producer_topic_record_send_total",
                {"client_id": "scraped-producer", "topic": topic},
            )
            == 25
        )
        # The client's total under its own name: a sum over the name is 25, not 50.
        assert (
            registry.get_sample_value(
                "strom_client_producer_record_send_total", {"client_id": "scraped-producer"}
            )
            == 25
        )
        assert (
            registry.get_sample_value(
                "strom_client_consumer_partition_records_lag",
                {"client_id": "scraped-consumer", "topic": topic, "partition": "0"},
            )
            == 20
        )
        text = generate_latest(registry).decode()
        assert "# TYPE strom_client_consumer_records_consumed_total counter" in text
        assert "# TYPE strom_client_producer_buffer_available_bytes gauge" in text
        unregister(producer, registry)
        assert "strom_client_producer_" not in generate_latest(registry).decode()
    finally:
        producer.close()
        consumer.close()
