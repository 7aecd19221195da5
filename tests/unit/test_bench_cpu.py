"""strom.bench.cpu: where server CPU comes from, and how a result reports CPU per record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from strom.bench import cpu
from strom.bench.stats import Result


def test_metrics_endpoints_are_completed_and_bad_ones_named() -> None:
    assert cpu.metrics_urls("h:9100, http://h2:9101/m ,") == (
        "http://h:9100/metrics",
        "http://h2:9101/m",
    )
    with pytest.raises(ValueError, match="ftp://x"):
        cpu.metrics_urls("ftp://x")


def test_own_process_cpu_is_read_from_proc() -> None:
    before = cpu.pid_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert cpu.pid_cpu_seconds(os.getpid()) > before
    with pytest.raises(cpu.ServerCpuUnavailable):
        cpu.pid_cpu_seconds(2**22 + 1)


def test_dev_state_is_used_only_for_its_own_cluster(tmp_path: Path) -> None:
    state = {
        "bootstrap": "127.0.0.1:9001,127.0.0.1:9002",
        "members": [{"metrics_port": 9101}, {"metrics_port": 9102}],
    }
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    found = cpu.discover(None, "127.0.0.1:9002", str(tmp_path))
    assert found == cpu.ServerCpu(
        urls=("http://127.0.0.1:9101/metrics", "http://127.0.0.1:9102/metrics")
    )
    assert cpu.discover(None, "10.0.0.1:9001", str(tmp_path)) is None
    assert cpu.discover("h:1", "10.0.0.1:9001", str(tmp_path)) == cpu.ServerCpu(
        urls=("http://h:1/metrics",)
    )


def test_result_reports_cpu_per_million_records_and_unknown_server() -> None:
    r = Result("x", 1, 500_000, 1, 1.0, cpu=cpu.CpuUsage(client_s=0.5, server_s=None))
    d = r.summary()
    assert d["client_cpu_s_per_M_records"] == 1.0
    assert d["server_cpu_s_per_M_records"] is None
    assert "client 1.0 server n/a" in r.line()
    gone = cpu.start(cpu.ServerCpu(pids=(2**22 + 1,))).stop()  # a process that is not there
    assert gone.server_s is None and gone.client_s >= 0


def test_a_result_without_a_batch_count_shows_none_rather_than_zero() -> None:
    """`bench produce` cannot know the producer's batches: it printed "0 batches/s" (found
    from outside); an unknown count is "-" on the line and null in the JSON."""
    r = Result("produce (send)", None, 1_000, 100_000, 0.5)
    assert r.summary()["batches"] is None and r.summary()["batches_per_s"] is None
    assert " - batches/s" in r.line() and " 0 batches/s" not in r.line()
    assert "4 batches/s" in Result("consume (poll)", 2, 1_000, 1, 0.5).line()
