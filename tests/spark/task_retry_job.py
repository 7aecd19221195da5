"""Batch writes with ``exactlyOnce=true`` on Spark ``local[2,4]`` (up to 4 attempts per task)
whose task for slot 1 dies on its first attempt after the writer sent part of its rows in its
transaction: ``kill`` SIGKILLs the Python worker that feeds the writer, ``raise`` fails it with
an exception. Spark retries the task; the test (test_exactly_once.py) then reads the topics.

Usage: task_retry_job.py BOOTSTRAP ROWS MARK_ROOT TOPIC_PREFIX MODE [MODE ...]: one write per
mode, one after the other in one Spark application (a second JVM and session cost the test
~20 s), to topic ``TOPIC_PREFIX-MODE``. ``MARK_ROOT/MODE/attempt-0`` is written when that
mode's first attempt reached its failure point, so the test knows the retry happened; stdout
gets ``DONE MODE`` for each write that succeeded (a failed one prints its error and the others
still run), and the exit code is 0 only when every write did.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

#: Past strom_spark.write.GATHER_ROWS (65,536) with room for the rows still in the pipe
#: between the UDF's worker and the writer's: the writer can send a gathered block.
FAIL_AFTER = 90_000


def wait_for_the_writers_rows(bootstrap: str, topic: str, partition: int) -> None:
    """Until the writer of slot ``partition`` has rows in the log (in its open transaction):
    the first attempt must die after sending some, which a busy machine did not ensure when
    the UDF ran ahead of the writer (the failure was then a plain one, not a zombie's)."""
    import time

    from strom import Consumer, TopicPartition

    tp = TopicPartition(topic, partition)
    deadline = time.monotonic() + 120
    with Consumer(bootstrap) as c:  # read_uncommitted: its end is the high watermark
        while c.end_offsets([tp])[tp] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)


def make_spark() -> Any:
    """The job's own session: ``local[2,4]``, so that Spark retries a failed task."""
    from pyspark.sql import SparkSession

    from strom_spark import register

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("strom-task-retry")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def write(spark: Any, bootstrap: str, topic: str, rows: int, mode: str, mark_dir: str) -> None:
    """One exactly-once batch write of ``rows`` rows whose slot 1 fails its first attempt."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    seen: dict[tuple[int, int], int] = {}

    def first_attempt_dies(value: str) -> str:
        """Passes each value through; on slot 1's first attempt, dies at row FAIL_AFTER."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        key = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (-1, -1)
        seen[key] = seen.get(key, 0) + 1
        if key == (1, 0) and seen[key] == FAIL_AFTER:
            wait_for_the_writers_rows(bootstrap, topic, 1)
            Path(mark_dir, "attempt-0").write_text(str(seen[key]))
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("the first attempt of task 1 fails on purpose")
        return value

    # A plain Python UDF (pickled rows, no pandas): it runs in a Python worker beside the
    # writer's and feeds it row by row.
    passthrough = F.udf(first_attempt_dies, StringType())
    df = spark.range(0, rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    # Slot i writes partition i, so partition 1's end tells slot 1's writer has sent.
    df = df.select(passthrough("value").alias("value"), F.spark_partition_id().alias("partition"))
    (
        df.write.format("strom")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("exactlyOnce", "true")
        .mode("append")
        .save()
    )


def main(bootstrap: str, rows: int, mark_root: str, prefix: str, modes: list[str]) -> int:
    spark = make_spark()
    failed = 0
    for mode in modes:
        mark_dir = Path(mark_root, mode)
        mark_dir.mkdir(parents=True, exist_ok=True)
        try:
            write(spark, bootstrap, f"{prefix}-{mode}", rows, mode, str(mark_dir))
        except Exception as exc:  # the next mode still runs; the test names this one
            failed += 1
            print(f"FAILED {mode}: {exc}", flush=True)
        else:
            print(f"DONE {mode}", flush=True)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    b, n, root, prefix, *ms = sys.argv[1:]
    sys.exit(main(b, int(n), root, prefix, ms))
