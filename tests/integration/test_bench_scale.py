"""`strom bench scale` with tiny sizes: every phase runs on a real local cluster, the JSON has
each curve's points and the PNG plots are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cluster_cli import strom

pytestmark = pytest.mark.integration


def test_bench_scale_reports_curves_and_draws_plots(tmp_path: Path) -> None:
    out_dir = tmp_path / "plots"
    out = strom(
        "bench",
        "scale",
        *("--max-partitions", "10", "--max-spread", "6", "--records", "200000"),
        *("--connections", "4", "--workers", "2", "--seconds", "1", "--interval-ms", "100"),
        *("--changes", "1", "--out", str(out_dir), "--dir", str(tmp_path), "--json"),
        timeout=600,
    )
    result = json.loads(out.stdout)
    assert [r["partitions"] for r in result["spread"]] == [1, 6]
    for r in result["spread"]:
        assert r["records"] == 200_000 and r["records_per_s"] > 0
        # /proc counts CPU in 10 ms ticks: a short phase may cost the node less than one.
        assert r["client_cpu_s_per_M_records"] > 0 and r["server_cpu_s_per_M_records"] >= 0
    # 400,000 records cost the node tens of ms: several ticks even on a fast machine (20,000
    # each, as before, could add up to less than one tick).
    assert sum(r["server_cpu_s"] for r in result["spread"]) > 0
    (row,) = result["partitions"]
    assert row["partitions"] == 10
    assert row["etcd_bytes"] > 0 and row["etcd_db_bytes"] > 0
    assert 0 < row["create_s"] <= row["led_s"]
    assert row["node_partitions"] == 1 + 6 + 10 + 1 + 1  # spread, connections, step, probe
    assert row["node_rss_bytes"] > 0 and row["node_startup_s"] > 0 and row["change_led_s"] > 0
    c = result["connections"]
    assert (c["producers"], c["consumers"], c["errors"]) == (2, 2, 0)
    assert (c["unanswered"], c["failed_workers"]) == (0, 0)
    assert c["acknowledged"] > 0 and c["p99_ms"] > 0 and c["node_rss_peak_bytes"] > 0
    plots = [Path(p) for p in result["context"]["plots"]]
    assert {p.name for p in plots} == {
        "scale-topic-creation.png",
        "scale-etcd-bytes.png",
        "scale-node-memory-startup.png",
        "scale-controller-change.png",
        "scale-produce-spread.png",
    }
    for p in plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out_dir / "scale.json").read_text())["partitions"] == result["partitions"]
