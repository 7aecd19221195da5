"""``strom bench spark``: the connector's throughput on ``local[2]`` beside the API's ceiling.

One run measures, for a topic of ``--partitions`` partitions holding ``--records`` records of
``--record-size``-byte values (1,000 distinct keys):

- batch read into ``count()``, and into ``groupBy(key).count()``, in rows/s;
- write (``df.write.format("strom")`` of rows computed in Spark: 1,000 keys, ``--record-size``
  byte values) in rows/s, with ``kafka.acks=1``, with ``acks=all``, and exactly once
  (``exactlyOnce=true``: one transaction per task, which needs acks=all);
- the same reads from an in-memory Arrow data source yielding the very same rows and columns
  (``strom_bench_memory``), and the same write into a Python Arrow writer that drops the rows
  (``NullWriter``):
  what the Python Data Source API itself allows on this machine, so ``strom / in-memory`` says
  how much the connector (and the cluster beside it) costs on top.

Each figure is the best of ``--runs`` timed runs after ``--warmup`` untimed ones (the first
queries of a session pay for JIT compilation and Python worker start-up). Benchmarks are never
asserted in tests (DESIGN §11).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from strom_spark.arrow import ARROW_SCHEMA
from strom_spark.schema import ARROW_TIMESTAMP, spark_schema

TOPIC = "strom-bench-spark"
OUT_TOPIC = "strom-bench-spark-out"
KEYS = 1000
KEY_WIDTH = 9  # b"key-00042"
BASE_TS_MS = 1_700_000_000_000


# -- the rows (shared by the producer and the in-memory source) --------------------------------

_BLOCK = np.random.default_rng(42).integers(0, 256, 1 << 16, dtype=np.uint8)
_KEY_BYTES = np.frombuffer(b"".join(b"key-%05d" % k for k in range(KEYS)), dtype=np.uint8).reshape(
    KEYS, KEY_WIDTH
)


def bench_rows(partition: int, start: int, n: int, record_size: int) -> pa.Table:
    """Records ``start .. start+n-1`` of ``partition``: ``key`` (1,000 distinct) and ``value``
    (``record_size`` bytes), built with numpy copies only, so generating them costs next to
    nothing beside what is measured."""
    total = n * record_size
    shift = ((partition * 7919 + start * record_size) % len(_BLOCK)) if total else 0
    reps = (shift + total) // len(_BLOCK) + 1
    data = np.tile(_BLOCK, reps)[shift : shift + total]
    offs = np.arange(n + 1, dtype=np.int32) * record_size
    value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(data)])
    idx = (np.arange(start, start + n, dtype=np.int64) * 7 + partition) % KEYS
    kdata = np.ascontiguousarray(_KEY_BYTES[idx]).ravel()
    koffs = np.arange(n + 1, dtype=np.int32) * KEY_WIDTH
    key = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(koffs), pa.py_buffer(kdata)])
    return pa.table({"key": key, "value": value})


# -- the in-memory source ----------------------------------------------------------------------


class MemoryReader(DataSourceReader):
    """Yields :func:`bench_rows` as Spark Arrow batches, in the strom schema."""

    def __init__(self, options: dict[str, str]) -> None:
        self.partitions_n = int(options.get("partitions", "6"))
        self.records = int(options.get("records", "1000000"))
        self.record_size = int(options.get("recordsize", "100"))
        self.batch_rows = int(options.get("batchrows", "32768"))
        self.topic = options.get("topic", TOPIC)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in range(self.partitions_n)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        p = int(partition.value)
        per = self.records // self.partitions_n + (p < self.records % self.partitions_n)
        for start in range(0, per, self.batch_rows):
            n = min(self.batch_rows, per - start)
            t = bench_rows(p, start, n, self.record_size)
            ts = np.full(n, BASE_TS_MS * 1000, dtype=np.int64)
            yield pa.RecordBatch.from_arrays(
                [
                    t.column("key").chunk(0),
                    t.column("value").chunk(0),
                    pa.repeat(pa.scalar(self.topic), n),
                    pa.repeat(pa.scalar(p, pa.int32()), n),
                    pa.array(np.arange(start, start + n, dtype=np.int64)),
                    pa.Array.from_buffers(ARROW_TIMESTAMP, n, [None, pa.py_buffer(ts)]),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                ],
                schema=ARROW_SCHEMA,
            )


class MemorySource(DataSource):
    """``strom_bench_memory``: the benchmark topic's rows from memory (the API's ceiling)."""

    @classmethod
    def name(cls) -> str:
        return "strom_bench_memory"

    def schema(self) -> Any:
        return spark_schema(False)

    def reader(self, schema: Any) -> DataSourceReader:
        return MemoryReader({str(k).lower(): v for k, v in self.options.items()})

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return NullWriter()


class NullWriter(DataSourceArrowWriter):
    """Drops what it is given: writing to it measures what the API costs a writer."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Figure:
    """Rows/s of one measurement: the best of the runs, and every run."""

    name: str
    rows: int
    seconds: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return self.rows / min(self.seconds) if self.seconds else 0.0

    @property
    def median(self) -> float:
        return self.rows / statistics.median(self.seconds) if self.seconds else 0.0


def _time(fn: Callable[[], Any], rows: int, name: str, runs: int, warmup: int) -> Figure:
    for _ in range(warmup):
        fn()
    fig = Figure(name, rows)
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        fig.seconds.append(time.perf_counter() - t0)
    return fig


def _produce(bootstrap: str, partitions: int, records: int, record_size: int) -> float:
    from strom.client.admin import Admin
    from strom.client.producer import Producer

    with Admin(bootstrap) as admin:
        for name in (TOPIC, OUT_TOPIC):
            if name in admin.list_topics():
                admin.delete_topic(name)
        cfg = {"segment.bytes": str(1 << 30)}
        admin.create_topic(TOPIC, partitions=partitions, replication_factor=1, config=cfg)
        admin.create_topic(OUT_TOPIC, partitions=partitions, replication_factor=1, config=cfg)
    t0 = time.perf_counter()
    with Producer(
        bootstrap, acks=1, linger_ms=5, batch_size=1 << 20, max_request_size=4 << 20
    ) as producer:
        futures = []
        for p in range(partitions):
            per = records // partitions + (p < records % partitions)
            for start in range(0, per, 200_000):
                n = min(200_000, per - start)
                futures.append(
                    producer.send_batch(TOPIC, bench_rows(p, start, n, record_size), partition=p)
                )
        for f in futures:
            f.result()
    return time.perf_counter() - t0


def run_bench(
    *,
    records: int = 3_000_000,
    partitions: int = 6,
    record_size: int = 100,
    runs: int = 3,
    warmup: int = 2,
    nodes: int = 1,
    bootstrap: str | None = None,
    data_dir: str | None = None,
    out: Any = None,
    spark: Any = None,
) -> dict[str, Any]:
    """Run the whole benchmark; returns the figures (rows/s) and the conditions. With
    ``spark`` given, that session is used (and left running); else one is started."""
    out = out or sys.stderr
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    cluster = None
    root = Path(data_dir or tempfile.mkdtemp(prefix="strom-bench-spark-"))
    own_spark = spark is None
    try:
        if bootstrap is None:
            from strom.devcluster.cluster import LocalCluster

            print(f"starting a local cluster ({nodes} storage node(s)) in {root}", file=out)
            # A group coordinator too: the exactly-once write needs transactions.
            cluster = LocalCluster(root / "cluster", nodes=nodes, controllers=1, coordinators=1)
            cluster.start()
            bootstrap = cluster.bootstrap
        print(f"producing {records:,} records of {record_size} bytes", file=out)
        produce_s = _produce(bootstrap, partitions, records, record_size)
        print(f"  {records / produce_s:,.0f} records/s", file=out)

        from pyspark.sql import SparkSession

        from strom_spark import register

        if spark is None:
            spark = (
                SparkSession.builder.master("local[2]")
                .appName("strom-bench-spark")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", str(partitions))
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.dataSource.register(MemorySource)

        def strom_df() -> Any:  # a fresh DataFrame per query (Spark caches a plan per one)
            return (
                spark.read.format("strom")
                .option("bootstrap", bootstrap)
                .option("subscribe", TOPIC)
                .load()
            )

        def memory_df() -> Any:
            return (
                spark.read.format("strom_bench_memory")
                .option("partitions", str(partitions))
                .option("records", str(records))
                .option("recordSize", str(record_size))
                .load()
            )

        figures: list[Figure] = []
        for label, make in (("in-memory Arrow", memory_df), ("strom", strom_df)):
            print(f"reading from {label}: count()", file=out)
            n = make().count()
            if n != records:
                raise RuntimeError(f"{label} returned {n:,} rows, expected {records:,}")
            figures.append(
                _time(lambda m=make: m().count(), records, f"{label} count", runs, warmup)
            )
            print(f"reading from {label}: groupBy(key).count()", file=out)
            figures.append(
                _time(
                    lambda m=make: m().groupBy("key").count().collect(),
                    records,
                    f"{label} groupBy",
                    runs,
                    max(warmup - 1, 0),
                )
            )
        print("writing rows computed in Spark to a writer that drops them (the ceiling)", file=out)

        def rows_df() -> Any:
            """The rows to write, computed in Spark (as a job's result would be)."""
            pad = max(record_size - 12, 0)
            return spark.range(records, numPartitions=partitions).selectExpr(
                f"CAST(concat('key-', lpad(CAST(id % {KEYS} AS STRING), 5, '0')) AS BINARY) AS key",
                f"CAST(concat(lpad(CAST(id AS STRING), 12, '0'), repeat('.', {pad})) AS BINARY)"
                " AS value",
            )

        def write_null() -> None:
            rows_df().write.format("strom_bench_memory").mode("append").save()

        figures.append(_time(write_null, records, "in-memory Arrow write", runs, min(warmup, 1)))
        print("writing the same rows to strom", file=out)

        def write() -> None:
            rows_df().write.format("strom").option("bootstrap", bootstrap).option(
                "topic", OUT_TOPIC
            ).option("kafka.acks", "1").mode("append").save()

        figures.append(_time(write, records, "strom write", max(runs - 1, 1), 0))

        def write_with(**options: str) -> Callable[[], None]:
            def run() -> None:
                w = rows_df().write.format("strom").option("bootstrap", bootstrap)
                w.option("topic", OUT_TOPIC).options(**options).mode("append").save()

            return run

        print("writing the same rows with acks=all, then exactly once (transactions)", file=out)
        figures.append(
            _time(
                write_with(**{"kafka.acks": "all"}),
                records,
                "strom write acks=all",
                max(runs - 1, 1),
                0,
            )
        )
        figures.append(
            _time(
                write_with(exactlyOnce="true"),
                records,
                "strom write exactlyOnce",
                max(runs - 1, 1),
                0,
            )
        )
        by = {f.name: f for f in figures}
        result = {
            "records": records,
            "partitions": partitions,
            "record_size": record_size,
            "runs": runs,
            "nodes": nodes,
            "spark": spark.version,
            "cpus": os.cpu_count(),
            "produce_records_per_s": records / produce_s,
            "memory_count_rows_per_s": by["in-memory Arrow count"].best,
            "strom_count_rows_per_s": by["strom count"].best,
            "memory_groupby_rows_per_s": by["in-memory Arrow groupBy"].best,
            "strom_groupby_rows_per_s": by["strom groupBy"].best,
            "strom_write_rows_per_s": by["strom write"].best,
            "memory_write_rows_per_s": by["in-memory Arrow write"].best,
            "strom_write_acks_all_rows_per_s": by["strom write acks=all"].best,
            "strom_write_exactly_once_rows_per_s": by["strom write exactlyOnce"].best,
            "figures": [asdict(f) | {"best": f.best, "median": f.median} for f in figures],
        }
        return result
    finally:
        if own_spark and spark is not None:
            spark.stop()
        if cluster is not None:
            cluster.stop()
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def report(result: dict[str, Any], as_json: bool = False) -> str:
    """The result as a small table (or one JSON object)."""
    if as_json:
        return json.dumps(result)
    r = result
    lines = [
        f"strom bench spark: {r['records']:,} records of {r['record_size']} bytes in "
        f"{r['partitions']} partitions; Spark {r['spark']} local[2] on {r['cpus']} CPUs; "
        f"best of {r['runs']} runs",
        "",
        f"{'':24}{'in-memory Arrow':>18}{'strom':>16}{'strom / in-memory':>20}",
    ]
    for label, mem, strom in (
        ("count()", r["memory_count_rows_per_s"], r["strom_count_rows_per_s"]),
        ("groupBy(key).count()", r["memory_groupby_rows_per_s"], r["strom_groupby_rows_per_s"]),
    ):
        lines.append(f"{label:24}{mem:>12,.0f} rows/s{strom:>10,.0f} rows/s{strom / mem:>19.0%}")
    mem_w, strom_w = r["memory_write_rows_per_s"], r["strom_write_rows_per_s"]
    lines.append(
        f"{'write':24}{mem_w:>12,.0f} rows/s{strom_w:>10,.0f} rows/s{strom_w / mem_w:>19.0%}"
    )
    for label, key in (
        ("write acks=all", "strom_write_acks_all_rows_per_s"),
        ("write exactlyOnce", "strom_write_exactly_once_rows_per_s"),
    ):
        lines.append(f"{label:24}{'':>18}{r[key]:>10,.0f} rows/s{r[key] / mem_w:>19.0%}")
    lines.append(
        f"{'(produce, for reference)':24}{'':>18}{r['produce_records_per_s']:>10,.0f} rows/s"
    )
    return "\n".join(lines)
