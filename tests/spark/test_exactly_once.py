"""Exactly-once writes (``exactlyOnce=true``) against a real cluster and a real local Spark:
a task that fails after sending leaves nothing a read_committed reader sees; a streaming query
that fails mid-batch and is restarted from its checkpoint, and a micro-batch run again after
its transactions committed (a driver crash before Spark's commit log), give every row once."""

from __future__ import annotations

import collections
import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from strom.client.admin import Admin
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.procs import wait_for
from tests.spark.conftest import create_topic
from tests.spark.test_errors import check_clear

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # slow under load

#: Enough rows that a task sends some before it reaches the last ones: it gathers Spark's Arrow
#: batches (10,000 rows) until it has strom_spark.write.GATHER_ROWS (65,536), then sends.
BIG = 100_000
RETRY_JOB = Path(__file__).with_name("task_retry_job.py")


def read_values(spark: Any, bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    df = (
        spark.read.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", topic)
        .option("kafka.isolation.level", isolation)
        .load()
    )
    return [bytes(r["value"]) for r in df.select("value").collect()]


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[TopicPartition, int]:
    with Admin(bootstrap) as admin:
        found = admin.list_offsets({TopicPartition(topic, p): "latest" for p in range(partitions)})
    return {tp: (r.offset if r is not None else -1) for tp, r in found.items()}


def test_batch_write_commits_once_and_a_failed_task_leaves_nothing_committed(
    spark: Any, bootstrap: str
) -> None:
    create_topic(bootstrap, "eo-batch", 2)
    df = spark.range(0, 3000, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("strom").option("bootstrap", bootstrap).option("topic", "eo-batch").option(
        "exactlyOnce", "true"
    ).mode("append").save()
    got = read_values(spark, bootstrap, "eo-batch", "read_committed")
    assert sorted(got) == sorted(str(i).encode() for i in range(3000))
    # Rows that name their topics: the slots' offsets are kept under __consumer_offsets-0.
    create_topic(bootstrap, "eo-col-a", 1)
    create_topic(bootstrap, "eo-col-b", 1)
    spark.range(0, 100, numPartitions=2).selectExpr(
        "CAST(id AS STRING) AS value", "IF(id % 3 = 0, 'eo-col-a', 'eo-col-b') AS topic"
    ).write.format("strom").option("bootstrap", bootstrap).option("exactlyOnce", "true").mode(
        "append"
    ).save()
    got = read_values(spark, bootstrap, "eo-col-a,eo-col-b", "read_committed")
    assert sorted(got) == sorted(str(i).encode() for i in range(100))

    # One task: BIG rows, the last of which asks for a partition the topic lacks, so the task
    # fails after it sent the first GATHER_ROWS rows in its transaction.
    create_topic(bootstrap, "eo-abort", 2)
    bad = spark.range(0, BIG, numPartitions=1).selectExpr(
        "CAST(id AS STRING) AS value", f"IF(id = {BIG - 1}, 99, NULL) AS partition"
    )
    with pytest.raises(Exception) as info:
        bad.write.format("strom").option("bootstrap", bootstrap).option("topic", "eo-abort").option(
            "exactlyOnce", "true"
        ).mode("append").save()
    assert "asks for partition 99" in str(info.value)
    uncommitted = read_values(spark, bootstrap, "eo-abort", "read_uncommitted")
    assert len(uncommitted) >= 65_536  # the records were sent ...
    assert read_values(spark, bootstrap, "eo-abort", "read_committed") == []  # ... and aborted


def test_an_aborted_batch_write_fences_the_tasks_that_sent_no_message(bootstrap: str) -> None:
    """A task Spark killed mid-write (a sibling failed) sends no commit message but may
    leave its transaction open; no later attempt reuses a batch write's ids, so the driver's
    abort fences them: read_committed readers are not held until the transaction timeout."""
    from strom_spark.options import parse_write_options
    from strom_spark.source import StromBatchWriter
    from strom_spark.txn import Slot

    create_topic(bootstrap, "eo-killed", 1)
    tp = TopicPartition("eo-killed", 0)
    opts = parse_write_options(
        {"bootstrap": bootstrap, "topic": "eo-killed", "exactlyOnce": "true"}
    )
    writer = StromBatchWriter(opts, {})
    assert writer.write_id is not None
    # Slot 1 was killed with its transaction open (slot 0 never started one).
    killed = Producer(
        bootstrap,
        transactional_id=Slot.make(opts, writer.write_id, 1).transactional_id,
        transaction_timeout_ms=900_000,  # Spark's kafka.transaction.timeout.ms default
    )
    try:
        killed.init_transactions()
        killed.begin_transaction()
        killed.send("eo-killed", b"from the killed task").result(10)
        with Admin(bootstrap) as admin:
            assert (
                admin.list_offsets({tp: "latest"}, isolation_level="read_committed")[tp].offset == 0
            )
            writer.abort([None, None])
            # Aborted, not left to its 15-minute timeout: the record and its abort marker
            # are below the stable offset.
            wait_for(
                lambda: (
                    admin.list_offsets({tp: "latest"}, isolation_level="read_committed")[tp].offset
                    == 2
                ),
                timeout=30,
                what="the killed task's transaction aborted",
            )
    finally:
        killed.close()


def test_stream_failed_and_rerun_micro_batches_write_every_row_once(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    src, out = "eo-in", "eo-out"
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, out, 2)
    sizes = {0: 200, 1: BIG}  # task 0 is quick (it commits), task 1 fails after sending

    def fill(partition: int, lo: int, hi: int) -> None:
        values = pa.array([f"{partition}:{i}".encode() for i in range(lo, hi)], pa.binary())
        with Producer(bootstrap, linger_ms=0) as producer:
            producer.send_batch(src, pa.table({"value": values}), partition=partition).result(60)

    for p, n in sizes.items():
        fill(p, 0, n)
    cp = tmp_path / "cp"

    def run(poisoned: bool) -> Any:
        df = (
            spark.readStream.format("strom")
            .option("bootstrap", bootstrap)
            .option("subscribe", src)
            .option("startingOffsets", "earliest")
            .load()
        )
        # The first run's bad deploy: one row asks for a partition the topic lacks; the fixed
        # query (same tasks, same rows per task) is what runs after the restart.
        poison = f"IF(partition = 1 AND offset = {BIG - 10}, 99, NULL)" if poisoned else "NULL"
        q = (
            df.selectExpr("value", f"CAST({poison} AS INT) AS partition")
            .writeStream.format("strom")
            .option("bootstrap", bootstrap)
            .option("topic", out)
            .option("exactlyOnce", "true")
            .option("checkpointLocation", str(cp))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(StreamingQueryException):  # the test looks at q.exception()
            q.awaitTermination(600)
        return q

    q = run(poisoned=True)
    assert q.exception() is not None and "asks for partition 99" in str(q.exception())
    aborted = read_values(spark, bootstrap, out, "read_uncommitted")
    committed = read_values(spark, bootstrap, out, "read_committed")
    assert len(aborted) >= 65_536 + len(committed)  # task 1's sent rows are in the log ...
    assert all(v.startswith(b"0:") for v in committed)  # ... but only task 0 could commit

    fill(0, sizes[0], sizes[0] + 100)  # more data while the query is down: a second batch
    q = run(poisoned=False)
    assert q.exception() is None
    batches = [p["batchId"] for p in q.recentProgress if p["numInputRows"] > 0]
    assert batches == [0, 1]  # batch 0 run again, then the new rows

    # A driver crash after the tasks of batch 1 committed, before Spark's commit log: the
    # restarted query runs batch 1 again, and every task finds its rows committed.
    before = high_watermarks(bootstrap, out, 2)
    (cp / "commits" / "1").unlink()
    (cp / "commits" / ".1.crc").unlink(missing_ok=True)
    q = run(poisoned=False)
    assert q.exception() is None
    assert [p["batchId"] for p in q.recentProgress if p["numInputRows"] > 0] == [1]
    assert high_watermarks(bootstrap, out, 2) == before  # nothing sent, not even a marker

    want = [f"0:{i}".encode() for i in range(sizes[0] + 100)]
    want += [f"1:{i}".encode() for i in range(BIG)]
    got = read_values(spark, bootstrap, out, "read_committed")
    counts = collections.Counter(got)
    assert len(got) == len(want) and set(counts) == set(want)
    assert max(counts.values()) == 1
    # read_uncommitted also sees the aborted attempt's records: they were there to leave out.
    assert len(read_values(spark, bootstrap, out, "read_uncommitted")) > len(want)


RETRY_MODES = ("kill", "raise")
#: The task-retry job's run (stdout, stderr, exit code) and the root of its marks.
RetryRun = tuple[subprocess.CompletedProcess[str], Path]


@pytest.fixture(scope="module")
def retried_tasks(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> RetryRun:
    """The task-retry job (``local[2,4]``, in its own process) run once for every mode: one
    Spark application writes ``eo-retry-<mode>`` for each in turn (a JVM and session per mode
    cost ~20 s more). Returns the job and its marks' root (``<root>/<mode>/attempt-0``)."""
    marks = tmp_path_factory.mktemp("task-retry")
    for mode in RETRY_MODES:
        create_topic(bootstrap, f"eo-retry-{mode}", 2)
    argv = [sys.executable, str(RETRY_JOB), bootstrap, str(2 * BIG), str(marks), "eo-retry"]
    job = subprocess.run([*argv, *RETRY_MODES], capture_output=True, text=True, timeout=840)
    return job, marks


@pytest.mark.parametrize("mode", RETRY_MODES)
def test_a_retried_task_writes_its_rows_once(
    spark: Any, bootstrap: str, retried_tasks: RetryRun, mode: str
) -> None:
    """Spark retries a failed write task (``local[2,4]``, in its own process): the first
    attempt of slot 1 dies (its Python worker SIGKILLed, or an exception) after its writer sent
    rows in its transaction; the retry fences that attempt, aborts what it left open and
    writes the slot's rows, so read_committed sees every row once."""
    job, marks = retried_tasks
    topic = f"eo-retry-{mode}"
    n = 2 * BIG  # two slots of BIG rows
    assert f"DONE {mode}\n" in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert (marks / mode / "attempt-0").exists(), "the first attempt did not reach its failure"
    got = read_values(spark, bootstrap, topic, "read_committed")
    assert len(got) == n and set(got) == {str(i).encode() for i in range(n)}
    # The dead attempt's records are in the log, left out of read_committed as aborted.
    assert len(read_values(spark, bootstrap, topic, "read_uncommitted")) > n


@pytest.fixture(scope="module")
def opts_topic(bootstrap: str) -> str:
    create_topic(bootstrap, "eo-opts", 1)
    return "eo-opts"


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"exactlyOnce": "yes"}, "option exactlyOnce must be true or false, got 'yes'"),
        ({"transactionalIdPrefix": "etl"}, "transactionalIdPrefix only applies with exactlyOnce"),
        (
            {"exactlyOnce": "true", "transactionalIdPrefix": "my etl"},
            "transactionalIdPrefix must be 1 to 200 characters",
        ),
        ({"exactlyOnce": "true", "kafka.acks": "1"}, "exactlyOnce=true needs kafka.acks=all"),
        (
            {"exactlyOnce": "true", "kafka.transaction.timeout.ms": "10"},
            "kafka.transaction.timeout.ms must be >= 1000",
        ),
    ],
)
def test_bad_exactly_once_options(
    spark: Any, bootstrap: str, opts_topic: str, options: dict[str, str], needle: str
) -> None:
    w = (
        spark.range(1)
        .selectExpr("'x' AS value")
        .write.format("strom")
        .option("bootstrap", bootstrap)
        .option("topic", opts_topic)
        .mode("append")
    )
    with pytest.raises(Exception) as info:
        w.options(**options).save()
    check_clear(info.value, needle)


def test_bad_isolation_level(spark: Any, bootstrap: str) -> None:
    df = (
        spark.read.format("strom")
        .option("bootstrap", bootstrap)
        .option("subscribe", "eo-any")
        .option("kafka.isolation.level", "committed")
    )
    with pytest.raises(Exception) as info:
        df.load().count()
    check_clear(info.value, "kafka.isolation.level must be read_uncommitted or read_committed")
