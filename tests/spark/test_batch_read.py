"""Batch reads against a real cluster and a real local Spark: every offset option returns
exactly the records produced, one task per partition (or per range), and pushed-down filters
fetch only the range they need (counted on the nodes' /metrics)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from pyspark.sql import functions as F

from strom.client.admin import Admin
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from tests.spark.conftest import create_topic, node_metric, produce, rows

pytestmark = pytest.mark.integration

TOPIC = "br"
SIZES = {0: 200, 1: 300, 2: 250}
T_BASE = 1_700_000_000_000


def _key(i: int) -> bytes | None:
    return None if i % 10 == 0 else f"k{i % 7}".encode()


def _headers(i: int) -> list[tuple[str, bytes | None]] | None:
    return [("i", str(i).encode()), ("n", None)] if i % 3 == 0 else None


def _ts(p: int, i: int) -> int:
    return T_BASE + p + i * 10


@pytest.fixture(scope="module")
def data(bootstrap: str) -> dict[tuple[int, int], tuple]:
    """{(partition, offset): (key, value, headers, timestamp ms)} of what the topic holds."""
    create_topic(bootstrap, TOPIC, 3)
    out: dict[tuple[int, int], tuple] = {}
    for p, n in SIZES.items():
        half = n // 2
        for lo, hi in ((0, half), (half, n)):  # two sends: several batches per partition
            idx = range(lo, hi)
            base = produce(
                bootstrap,
                TOPIC,
                p,
                [f"p{p}-{i}".encode() for i in idx],
                keys=[_key(i) for i in idx],
                headers=[_headers(i) for i in idx],
                timestamps=[_ts(p, i) for i in idx],
                batch_size=2048,
            )
            assert base == lo
            for i in idx:
                out[(p, i)] = (_key(i), f"p{p}-{i}".encode(), _headers(i), _ts(p, i))
    return out


def read(spark: Any, bootstrap: str, **options: Any) -> Any:
    r = spark.read.format("strom").option("bootstrap", bootstrap)
    for k, v in options.items():
        r = r.option(k, json.dumps(v) if isinstance(v, dict) else str(v))
    return r.load()


def expected(data: dict, ranges: dict[int, tuple[int, int]]) -> list[tuple]:
    return [
        (p, o, data[(p, o)][1], data[(p, o)][3])
        for p, (lo, hi) in sorted(ranges.items())
        for o in range(lo, hi)
    ]


def test_reads_every_record_exactly_with_headers(spark: Any, bootstrap: str, data: dict) -> None:
    df = read(spark, bootstrap, subscribe=TOPIC, includeHeaders="true")
    got = rows(df, "key", "value", "headers", "ts", "topic", "timestampType")
    assert len(got) == sum(SIZES.values())
    for p, o, key, value, headers, ts, topic, ts_type in got:
        k, v, h, t = data[(p, o)]
        assert (key, value, ts, topic, ts_type) == (k, v, t, TOPIC, 0)
        assert (None if headers is None else [(x.key, x.value) for x in headers]) == h
    assert {(p, o) for p, o, *_ in got} == set(data)
    # without includeHeaders the schema is Kafka's seven columns
    assert read(spark, bootstrap, subscribe=TOPIC).columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


def test_offset_options(spark: Any, bootstrap: str, data: dict) -> None:
    df = read(
        spark,
        bootstrap,
        subscribe=TOPIC,
        startingOffsets={TOPIC: {"0": 17, "1": -2, "2": 249}},
        endingOffsets={TOPIC: {"0": 45, "1": 120, "2": -1}},
    )
    assert rows(df, "value", "ts") == expected(data, {0: (17, 45), 1: (0, 120), 2: (249, 250)})
    df = read(spark, bootstrap, subscribe=TOPIC, startingOffsets="earliest", endingOffsets="latest")
    assert rows(df, "value", "ts") == expected(data, {p: (0, n) for p, n in SIZES.items()})
    # the same partition start and end: nothing
    df = read(
        spark,
        bootstrap,
        assign={TOPIC: [1]},
        startingOffsets={TOPIC: {"1": 50}},
        endingOffsets={TOPIC: {"1": 50}},
    )
    assert df.count() == 0


def test_timestamp_options(spark: Any, bootstrap: str, data: dict) -> None:
    # startingTimestamp: the first record at or after it, per partition
    df = read(spark, bootstrap, subscribe=TOPIC, startingTimestamp=T_BASE + 1000)
    first = {0: 100, 1: 100, 2: 100}  # T_BASE + p + 10 i >= T_BASE + 1000 <=> i >= 100 - p/10
    assert rows(df, "value", "ts") == expected(data, {p: (first[p], SIZES[p]) for p in SIZES})
    df = read(
        spark,
        bootstrap,
        subscribe=TOPIC,
        startingOffsetsByTimestamp={TOPIC: {"0": T_BASE + 55, "1": T_BASE, "2": T_BASE + 2}},
        endingOffsetsByTimestamp={TOPIC: {"0": T_BASE + 500, "1": T_BASE + 1, "2": T_BASE + 10**9}},
    )
    # p0: i >= 5.5 -> 6 .. i >= 50 -> 50; p1: i >= 0 .. ts >= T_BASE+1 -> 0 (T_BASE+1 is i=0)
    assert rows(df, "value", "ts") == expected(data, {0: (6, 50), 1: (0, 0), 2: (0, 250)})
    df = read(spark, bootstrap, subscribe=TOPIC, endingTimestamp=T_BASE + 30)
    assert rows(df, "value", "ts") == expected(data, {0: (0, 3), 1: (0, 3), 2: (0, 3)})
    # a start after every record: an error by default, the end with strategy=latest
    late = T_BASE + 10**9
    with pytest.raises(Exception, match="no record of br-0 has a timestamp at or after"):
        read(spark, bootstrap, subscribe=TOPIC, startingTimestamp=late).count()
    df = read(
        spark,
        bootstrap,
        subscribe=TOPIC,
        startingTimestamp=late,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert df.count() == 0


def test_assign_and_subscribe_pattern(spark: Any, bootstrap: str, data: dict) -> None:
    df = read(spark, bootstrap, assign={TOPIC: [2, 0]})
    assert rows(df, "value", "ts") == expected(data, {0: (0, 200), 2: (0, 250)})
    create_topic(bootstrap, "br-other", 1)
    produce(bootstrap, "br-other", 0, [b"x", b"y"])
    df = read(spark, bootstrap, subscribePattern="br.*")
    counts = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {TOPIC: 750, "br-other": 2}
    df = read(spark, bootstrap, subscribe=f"{TOPIC},br-other", endingOffsets="latest")
    assert df.count() == 752


def _tasks(df: Any) -> list[tuple]:
    """(spark partition id, topic partitions in it, first offset, last offset, rows) per task."""
    per_task = (
        df.withColumn("sp", F.spark_partition_id())
        .groupBy("sp")
        .agg(
            F.countDistinct("partition").alias("parts"),
            F.min("partition").alias("p"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
            F.count("*").alias("n"),
        )
        .collect()
    )
    return sorted((r["sp"], r["parts"], r["p"], r["lo"], r["hi"], r["n"]) for r in per_task)


def test_one_task_per_partition_or_per_range(spark: Any, bootstrap: str, data: dict) -> None:
    df = read(spark, bootstrap, subscribe=TOPIC)
    assert df.rdd.getNumPartitions() == 3
    tasks = _tasks(df)
    assert [(parts, p, lo, hi, n) for _, parts, p, lo, hi, n in tasks] == [
        (1, 0, 0, 199, 200),
        (1, 1, 0, 299, 300),
        (1, 2, 0, 249, 250),
    ]
    df = read(spark, bootstrap, subscribe=TOPIC, minPartitions=9)
    assert df.rdd.getNumPartitions() == 9
    tasks = _tasks(df)
    assert all(parts == 1 for _, parts, *_ in tasks)  # a task never mixes partitions
    for p, n in SIZES.items():
        mine = sorted((lo, hi) for _, _, q, lo, hi, _ in tasks if q == p)
        assert mine[0][0] == 0 and mine[-1][1] == n - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(mine))
    assert sum(n for *_, n in tasks) == 750
    df = read(spark, bootstrap, subscribe=TOPIC, maxRecordsPerPartition=100)
    assert df.rdd.getNumPartitions() == 2 + 3 + 3
    assert max(n for *_, n in _tasks(df)) == 100


def test_pushed_down_filters_fetch_only_the_needed_range(
    spark: Any, bootstrap: str, cluster: LocalCluster
) -> None:
    topic = "br-big"
    create_topic(bootstrap, topic, 3)
    n = 40_000
    for p in range(3):
        produce(
            bootstrap,
            topic,
            p,
            [f"{p}:{i}:".encode().ljust(100, b".") for i in range(n)],
            timestamps=[T_BASE + i for i in range(n)],
        )
    total_bytes = 3 * n * 100

    def fetched(query: Any) -> tuple[list, float]:
        before = node_metric(cluster, "strom_storage_bytes_out_total", {"topic": topic})
        result = query()
        return result, node_metric(
            cluster, "strom_storage_bytes_out_total", {"topic": topic}
        ) - before

    count, full = fetched(lambda: read(spark, bootstrap, subscribe=topic).count())
    assert count == 3 * n and full >= total_bytes  # the metric sees a full read

    df = read(spark, bootstrap, subscribe=topic)
    narrow = df.filter("partition = 1 AND offset >= 30000 AND offset < 30100")
    plan = narrow._jdf.queryExecution().executedPlan().toString()
    got, used = fetched(lambda: rows(narrow, "value"))
    assert [(p, o) for p, o, _ in got] == [(1, o) for o in range(30000, 30100)]
    assert [v for *_, v in got] == [
        f"1:{o}:".encode().ljust(100, b".") for o in range(30000, 30100)
    ]
    assert used < 600_000, f"fetched {used} bytes for 100 records; plan: {plan}"
    assert narrow.rdd.getNumPartitions() == 1

    # a timestamp lower bound starts each partition's range at the first matching offset
    df = read(spark, bootstrap, subscribe=topic)
    recent = df.filter(F.col("timestamp") >= F.expr(f"timestamp_millis({T_BASE + n - 500})"))
    got, used = fetched(lambda: rows(recent, "ts"))
    assert [(p, o) for p, o, _ in got] == [(p, o) for p in range(3) for o in range(n - 500, n)]
    assert used < 3 * 600_000 < full / 3

    # filters on other columns still work (Spark applies them)
    df = read(spark, bootstrap, subscribe=topic)
    assert df.filter("partition IN (0, 2) AND value LIKE '2:7%'").count() == 1111


def test_fail_on_data_loss(spark: Any, bootstrap: str) -> None:
    topic = "br-lost"
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, 0, [b"%d" % i for i in range(100)])
    with Admin(bootstrap) as admin:
        assert admin.delete_records({TopicPartition(topic, 0): 40}) == {
            TopicPartition(topic, 0): 40
        }
    start = {topic: {"0": 10}}
    with pytest.raises(Exception) as info:
        read(spark, bootstrap, subscribe=topic, startingOffsets=start).count()
    message = str(info.value)
    assert "data loss in br-lost-0" in message and "offsets 10 to 39 were deleted" in message
    assert "failOnDataLoss=false" in message
    df = read(spark, bootstrap, subscribe=topic, startingOffsets=start, failOnDataLoss="false")
    assert [o for _, o in rows(df)] == list(range(40, 100))
    assert [o for _, o in rows(read(spark, bootstrap, subscribe=topic))] == list(range(40, 100))


def test_empty_topic_reads_nothing(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "br-empty", 2)
    df = read(spark, bootstrap, subscribe="br-empty", includeHeaders="true")
    assert df.count() == 0
    assert df.collect() == []
