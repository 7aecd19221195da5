"""Mistakes a user makes get a plain message naming what was wrong, raised on the driver while
the query is planned: no Java stack trace first, no task retries, no waiting for timeouts."""

from __future__ import annotations

import time
from typing import Any

import pytest

from strom.devcluster.procs import free_port
from tests.spark.conftest import create_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def err_topic(bootstrap: str) -> str:
    create_topic(bootstrap, "err-t", 1)
    return "err-t"


def check_clear(exc: BaseException, *needles: str) -> str:
    text = str(exc)
    first = text.strip().splitlines()[0]
    assert "at org.apache" not in text and "java." not in first, text
    assert "Py4JJavaError" not in type(exc).__name__
    for needle in needles:
        assert needle in text, text
    return text


def test_unknown_topic(spark: Any, bootstrap: str) -> None:
    df = spark.read.format("strom").option("bootstrap", bootstrap).option("subscribe", "nope")
    with pytest.raises(Exception) as info:
        df.load().count()
    check_clear(info.value, "unknown topic 'nope' (subscribe=nope)", "strom topics create nope")
    with pytest.raises(Exception) as info:
        spark.read.format("strom").option("bootstrap", bootstrap).option(
            "assign", '{"nope": [0]}'
        ).load().collect()
    check_clear(info.value, "unknown topic 'nope'")


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("startingOffsets", "first", "option startingOffsets must be earliest, latest or JSON"),
        ("minPartitions", "many", "option minPartitions must be an integer, got 'many'"),
        ("failOnDataLoss", "maybe", "option failOnDataLoss must be true or false"),
        ("includeHeaders", "1", "option includeHeaders must be true or false"),
        ("startingOffset", "earliest", "unknown strom read option 'startingoffset'"),
        ("endingOffsets", '{"err-t": {"1": 5}}', "has no entry for err-t-0"),
        ("endingOffsets", '{"err-t": {"0": 500}}', "up to offset 500, but it ends at 0"),
    ],
)
def test_bad_option_value(
    spark: Any, bootstrap: str, err_topic: str, option: str, value: str, needle: str
) -> None:
    df = (
        spark.read.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", "err-t")
        .option(option, value)
    )
    with pytest.raises(Exception) as info:
        df.load().count()
    check_clear(info.value, needle)


def test_unreachable_bootstrap_fails_fast(spark: Any) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        spark.read.format("strom").option("bootstrap", nobody).option(
            "subscribe", "t"
        ).load().count()
    check_clear(info.value, f"cannot reach the cluster at bootstrap={nobody}")
    assert time.monotonic() - t0 < 30
    with pytest.raises(Exception) as info:
        spark.range(3).selectExpr("CAST(id AS STRING) AS value").write.format("strom").option(
            "bootstrap", nobody
        ).option("topic", "t").mode("append").save()
    check_clear(info.value, f"cannot reach the cluster at bootstrap={nobody}")


def test_missing_bootstrap(spark: Any) -> None:
    with pytest.raises(Exception) as info:
        spark.read.format("strom").option("subscribe", "t").load().count()
    check_clear(info.value, "option bootstrap is required")


def test_write_mistakes(spark: Any, bootstrap: str, err_topic: str) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")

    def base() -> Any:  # a DataFrameWriter keeps its options: a fresh one each time
        return df.write.format("strom").option("bootstrap", bootstrap).mode("append")

    with pytest.raises(Exception) as info:
        base().option("topic", "nope").save()
    check_clear(info.value, "unknown topic 'nope'")
    with pytest.raises(Exception) as info:
        base().save()
    check_clear(info.value, "no topic to write to")
    with pytest.raises(Exception) as info:
        spark.range(3).write.format("strom").option("bootstrap", bootstrap).option(
            "topic", "err-t"
        ).mode("append").save()
    check_clear(info.value, "needs a 'value' column", "its columns are: id")
    with pytest.raises(Exception) as info:
        spark.range(3).selectExpr("id AS value").write.format("strom").option(
            "bootstrap", bootstrap
        ).option("topic", "err-t").mode("append").save()
    check_clear(info.value, "column 'value' must be binary or string, not bigint")
    with pytest.raises(Exception) as info:
        base().option("topic", "err-t").mode("overwrite").save()
    check_clear(info.value, "append-only log and cannot be overwritten")
    with pytest.raises(Exception) as info:  # a 2 MB row, the sink's requests 1 MiB
        spark.range(1).selectExpr("repeat('x', 2000000) AS value").write.format("strom").option(
            "bootstrap", bootstrap
        ).option("topic", "err-t").mode("append").save()
    check_clear(info.value, "a row is too large", "kafka.max.request.size (now 1048576 bytes)")


def test_a_schema_of_ones_own_is_refused(spark: Any, bootstrap: str, err_topic: str) -> None:
    reader = spark.read.format("strom").option("bootstrap", bootstrap).option("subscribe", "err-t")
    with pytest.raises(Exception) as info:
        reader.schema("value binary").load().count()
    check_clear(info.value, "the source's schema is fixed", "got struct<value:binary>")
    # The source's own schema, given explicitly, is accepted.
    own = spark.read.format("strom").option("bootstrap", bootstrap).option("subscribe", "err-t")
    assert reader.schema(own.load().schema).load().count() == own.load().count()


def test_streaming_unknown_topic(spark: Any, bootstrap: str, tmp_path: Any) -> None:
    stream = (
        spark.readStream.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", "nope-stream")
        .load()
    )
    with pytest.raises(Exception) as info:
        q = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .start()
        )
        try:
            assert q.awaitTermination(600), "the query did not stop"
        finally:
            q.stop()
    check_clear(info.value, "unknown topic 'nope-stream'")
