"""Fixtures for the Spark connector tests: one real local Spark session (``local[2]``) for the
whole test session, and the session's shared three-node strom cluster (``three_node_cluster``
of tests/conftest.py: etcd, a controller, three storage nodes, a coordinator) for every module
that does not break it; modules that kill nodes start their own.

The connector must be importable by Spark's Python workers, which run ``sys.executable`` (the
project's virtualenv, where strom_spark is installed) because of PYSPARK_PYTHON.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # fail loudly: a skipped connector suite would hide breakage
    raise RuntimeError(
        "tests/spark need PySpark: install the spark extra (`make test` does; by hand: "
        "STROM_EXTRAS=spark bash scripts/bootstrap.sh)"
    ) from exc

from strom.client.admin import Admin
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
# Every test names its cluster; a bootstrap from the environment must not leak into Spark.
os.environ.pop("STROM_BOOTSTRAP", None)


def make_spark() -> Any:
    from pyspark.sql import SparkSession

    from strom_spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("strom-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = make_spark()
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def cluster(three_node_cluster: LocalCluster) -> LocalCluster:
    # The session's shared cluster has a group coordinator (exactly-once writes need
    # transactions and group offsets).
    return three_node_cluster


@pytest.fixture(scope="session")
def bootstrap(cluster: LocalCluster) -> str:
    return cluster.bootstrap


def create_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, **config: str) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(
            name,
            partitions=partitions,
            replication_factor=rf,
            config={k.replace("_", "."): v for k, v in config.items()},
        )


def produce(
    bootstrap: str,
    topic: str,
    partition: int,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
    timestamps: Sequence[int] | None = None,
    batch_size: int = 256 * 1024,
) -> int:
    """Send records to one partition in order; returns the offset of the first."""
    from strom.record.schema import HEADERS_TYPE

    cols: dict[str, pa.Array] = {"value": pa.array(values, pa.binary())}
    if keys is not None:
        cols["key"] = pa.array(keys, pa.binary())
    if headers is not None:
        cols["headers"] = pa.array(
            [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
            HEADERS_TYPE,
        )
    if timestamps is not None:
        cols["timestamp"] = pa.array(timestamps, pa.int64())
    with Producer(bootstrap, acks="all", batch_size=batch_size, linger_ms=0) as producer:
        meta = producer.send_batch(topic, pa.table(cols), partition=partition).result(timeout=60)
    return meta[0].base_offset


def rows(df: Any, *columns: str) -> list[tuple]:
    """The DataFrame's rows as tuples of ``columns``, sorted by (partition, offset)."""
    from pyspark.sql import functions as F

    cols = [
        F.expr("unix_millis(timestamp)").alias("ts") if c == "ts" else F.col(c) for c in columns
    ]
    out = [tuple(r) for r in df.select("partition", "offset", *cols).collect()]
    return sorted(out, key=lambda r: (r[0], r[1]))


def per_partition_check(df: Any) -> list[tuple[int, int, int, int, int, int]]:
    """(partition, rows, distinct offsets, lowest, highest offset, rows whose value is not
    ``"<partition>:<offset>"``) of a read of records written so, sorted by partition: each
    partition read whole and once is ``(p, N, N, 0, N - 1, 0)``."""
    from pyspark.sql import functions as F

    check = df.selectExpr(
        "partition",
        "offset",
        "CAST(split(CAST(value AS STRING), ':')[1] AS BIGINT) AS i",
        "CAST(split(CAST(value AS STRING), ':')[0] AS INT) AS vp",
    )
    rows = (
        check.groupBy("partition")
        .agg(
            F.expr("count(*) AS n"),
            F.expr("count(DISTINCT offset) AS distinct_offsets"),
            F.expr("min(offset) AS lo"),
            F.expr("max(offset) AS hi"),
            F.expr("sum(IF(i = offset AND vp = partition, 0, 1)) AS mismatched"),
        )
        .collect()
    )
    return sorted(
        (r["partition"], r["n"], r["distinct_offsets"], r["lo"], r["hi"], r["mismatched"])
        for r in rows
    )


def node_metric(cluster: LocalCluster, name: str, labels: dict[str, str]) -> float:
    """Sum of a counter over the cluster's storage nodes (their /metrics endpoints)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for node in cluster.nodes:
        if not node.alive():
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics") as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
    return total
