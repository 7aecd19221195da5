"""`strom demo` (the README's main job) as the process a user runs, and the benchmark's
code on the test session's Spark. Sizes are cut down so they finish quickly."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from strom_spark.bench import report, run_bench

pytestmark = pytest.mark.integration


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_runs_the_spark_pipeline(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "strom.cli.main", "demo", "--dir", str(tmp_path / "demo")]
    demo = subprocess.Popen(
        [*argv, "--events", "20000", "--seconds", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = demo.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        demo.terminate()  # SIGTERM: the demo stops its cluster and Spark first
        stdout, stderr = demo.communicate(timeout=60)
        pytest.fail(f"strom demo did not finish in 840 s:\n{stdout.decode()}")
    assert demo.returncode == 0, stderr.decode()
    text = stdout.decode()
    assert "cluster up: etcd, a controller and 3 storage nodes" in text
    assert "batch read: 20,000 page views in 6 Spark tasks (one per partition)" in text
    assert "micro-batch  0:" in text and "lag" in text
    assert "check: the streamed counts equal a batch recount" in text
    assert "stopped the cluster" in text
    assert (tmp_path / "demo" / "spark.log").exists()  # Spark's chatter went there
    assert "WARN" not in text


def test_bench_spark_measures_every_figure(spark: Any, bootstrap: str) -> None:
    progress = io.StringIO()
    result = run_bench(
        spark=spark, bootstrap=bootstrap, records=30_000, runs=1, warmup=0, out=progress
    )
    assert result["records"] == 30_000 and result["partitions"] == 6
    for key in (
        "memory_count_rows_per_s",
        "strom_count_rows_per_s",
        "memory_groupby_rows_per_s",
        "strom_groupby_rows_per_s",
        "memory_write_rows_per_s",
        "strom_write_rows_per_s",
        "strom_write_acks_all_rows_per_s",
        "strom_write_exactly_once_rows_per_s",
    ):
        assert result[key] > 0, key
    table = report(result)
    assert "count()" in table and "groupBy(key).count()" in table and "write exactlyOnce" in table
    assert "reading from strom: count()" in progress.getvalue()
    assert spark.range(3).count() == 3  # the session is left running
