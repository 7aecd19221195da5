"""Writes against a real cluster and a real local Spark: a DataFrame written with keys,
headers, explicit partitions and a topic column reads back exactly; streaming writes too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strom.client.partitioner import partition_for_key
from tests.spark.conftest import create_topic, produce

pytestmark = pytest.mark.integration

HEADERS = "array<struct<key: string, value: binary>>"


def read(spark: Any, bootstrap: str, topics: str) -> list[Any]:
    df = (
        spark.read.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", topics)
        .option("includeHeaders", "true")
        .load()
    )
    return df.collect()


def test_write_then_read_round_trip(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "wr-a", 3)
    create_topic(bootstrap, "wr-b", 2)
    data = []
    for i in range(300):
        topic = "wr-a" if i % 3 else "wr-b"
        key = None if i % 5 == 0 else f"user-{i % 17}"
        part = (i % 2) if i % 7 == 0 else None
        headers = [("seq", str(i).encode()), ("empty", None)] if i % 4 == 0 else None
        data.append((key, f"v{i}".encode(), headers, topic, part))
    df = spark.createDataFrame(
        data, f"key string, value binary, headers {HEADERS}, topic string, partition int"
    ).coalesce(1)
    df.write.format("strom").option("bootstrap", bootstrap).mode("append").save()

    got = read(spark, bootstrap, "wr-a,wr-b")
    assert len(got) == 300
    by_value = {r["value"]: r for r in got}
    counts = {"wr-a": 3, "wr-b": 2}
    for key, value, headers, topic, part in data:
        r = by_value[value]
        assert r["topic"] == topic
        assert r["key"] == (None if key is None else key.encode())
        assert (None if r["headers"] is None else [(h.key, h.value) for h in r["headers"]]) == (
            headers
        )
        if part is not None:
            assert r["partition"] == part
        elif key is not None:
            assert r["partition"] == partition_for_key(key.encode(), counts[topic])
    # within a partition, the rows keep the order they had in the (single) task
    for topic in counts:
        for p in range(counts[topic]):
            seq = [
                int(r["value"][1:])
                for r in sorted(got, key=lambda r: r["offset"])
                if (r["topic"], r["partition"]) == (topic, p)
            ]
            assert seq == sorted(seq)


def test_topic_option_overrides_the_column_and_strings_are_bytes(
    spark: Any, bootstrap: str
) -> None:
    create_topic(bootstrap, "wr-opt", 2)
    df = spark.createDataFrame(
        [("k1", "hello", "elsewhere"), ("k2", "world", "elsewhere")],
        "key string, value string, topic string",
    )
    df.write.format("strom").option("bootstrap", bootstrap).option("topic", "wr-opt").option(
        "kafka.compression.type", "zstd"
    ).mode("append").save()
    got = sorted((r["key"], r["value"], r["topic"]) for r in read(spark, bootstrap, "wr-opt"))
    assert got == [(b"k1", b"hello", "wr-opt"), (b"k2", b"world", "wr-opt")]


def test_many_rows_in_several_tasks(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "wr-many", 4)
    n = 100_000
    df = spark.range(n, numPartitions=3).selectExpr(
        "CAST(id % 1000 AS STRING) AS key", "CAST(id AS STRING) AS value"
    )
    df.write.format("strom").option("bootstrap", bootstrap).option("topic", "wr-many").mode(
        "append"
    ).save()
    back = (
        spark.read.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", "wr-many")
        .load()
        .selectExpr("CAST(value AS STRING) AS v", "CAST(key AS STRING) AS k", "partition")
    )
    assert back.count() == n
    assert back.selectExpr("sum(CAST(v AS BIGINT))").first()[0] == n * (n - 1) // 2
    # every key sits on its murmur2 partition
    placed = {(r["k"], r["partition"]) for r in back.select("k", "partition").distinct().collect()}
    assert len(placed) == 1000
    assert all(p == partition_for_key(k.encode(), 4) for k, p in placed)


def test_bad_partition_in_a_row_fails_the_write_clearly(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "wr-bad", 2)
    df = spark.createDataFrame([("v", 7)], "value string, partition int")
    with pytest.raises(Exception, match="asks for partition 7 of topic 'wr-bad'"):
        df.write.format("strom").option("bootstrap", bootstrap).option("topic", "wr-bad").mode(
            "append"
        ).save()


def test_streaming_write(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    create_topic(bootstrap, "wr-src", 2)
    create_topic(bootstrap, "wr-sink", 2)
    for p in range(2):
        produce(
            bootstrap,
            "wr-src",
            p,
            [f"{p}-{i}".encode() for i in range(500)],
            keys=[f"k{i}".encode() for i in range(500)],
        )
    q = (
        spark.readStream.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", "wr-src")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value", "partition")
        .writeStream.format("strom")
        .option("bootstrap", bootstrap)
        .option("topic", "wr-sink")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(300)
    assert q.exception() is None
    assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= 3
    got = sorted((r["partition"], r["value"]) for r in read(spark, bootstrap, "wr-sink"))
    assert got == sorted((p, f"{p}-{i}".encode()) for p in range(2) for i in range(500))
