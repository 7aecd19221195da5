"""`strom demo` (the README's main job) as the process a user runs, and the benchmark's
code on the test session's Spark. Sizes are cut down so they finish quickly."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from strom.devcluster.cluster import recorded_processes_alive
from strom.devcluster.procs import wait_for
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_once_spark_is_up_stops_the_demo_in_one_line(tmp_path: Path) -> None:
    """Found from outside: Ctrl-C during `strom demo` once Spark was up printed ~45 lines of
    Py4J tracebacks (PySpark's own SIGINT handler called the JVM from inside a Py4J call),
    then said "the run did not pass", and the cluster's lines came after "stopped the
    cluster". Now: SIGINT to the process group (as a terminal sends it) while the batch read
    runs stops everything, says so in one line, no traceback, lines in time order, exit 130."""
    log = tmp_path / "demo.out"
    argv = [sys.executable, "-m", "strom.cli.main", "demo", "--events", "20000"]
    with log.open("wb") as f:
        demo = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    root: Path | None = None
    try:
        wait_for(
            lambda: demo.poll() is not None or "registered as a data source" in log.read_text(),
            timeout=600,
            what="Spark to start in the demo",
        )
        assert demo.poll() is None, log.read_text()
        root = Path(re.search(r"data in (\S+)\)", log.read_text()).group(1))
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(timeout=300) == 130, log.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text and "Py4J" not in text, text
    lines = text.splitlines()
    assert lines[-1].endswith(
        f"] interrupted (Ctrl-C): stopped Spark and the cluster; its data and logs are kept "
        f"in {root}"
    ), text
    assert "did not pass" not in text
    stamps = [float(m.group(1)) for m in re.finditer(r"^\[\s*([0-9.]+)s\]", text, re.M)]
    assert stamps == sorted(stamps), text
    assert "kept only if the run fails" in text  # and this run was cut short: kept
    assert root is not None and (root / "spark.log").exists()
    assert not recorded_processes_alive(root / "cluster")
    shutil.rmtree(root)


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
