"""deploy/grafana/strom-dashboard.json: generated with grafana-foundation-sdk, readable back
into the SDK's models, its queries valid PromQL over metrics that exist.

That the queries return data from a real cluster is tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "strom-dashboard.json"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ROWS = {
    "Cluster health",
    "Topics",
    "Replication and ISR",
    "Consumer groups",
    "Request latency",
    "etcd",
    "Process resources",
}
#: Series that come from Prometheus or prometheus_client, not from strom's code.
EXTERNAL = {
    "up",
    "ALERTS",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def substitute(expr: str, cluster: str = "strom", topic: str = ".*") -> str:
    """A query as Grafana sends it, with the template variables filled in."""
    return (
        expr.replace("$cluster", cluster).replace("$topic", topic).replace("$__rate_interval", "1m")
    )


def test_dashboard_json_is_generated_by_the_builder() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "grafana" / "build_dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_dashboard_loads_into_the_sdk_model_and_has_the_rows_and_variables() -> None:
    d = dashboard()
    model = Dashboard.from_json(d)
    assert model.uid == "strom-overview" and model.title == "strom"
    rows = {p["title"] for p in d["panels"] if p["type"] == "row"}
    assert rows == ROWS
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert {"cluster", "topic", "datasource"} <= set(variables)
    assert "cluster" in variables["cluster"]["query"]
    assert variables["topic"]["includeAll"] and variables["topic"]["allValue"] == ".*"
    kinds = {p["type"] for p in panels(d)}
    assert {"stat", "timeseries", "heatmap", "row"} <= kinds


def test_every_query_is_valid_promql_over_known_metrics(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    known = set(re.findall(r"\| `(strom_[a-z0-9_]+)` \|", doc))
    exprs = []
    for p in panels(dashboard()):
        if p["type"] == "row":
            continue
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            expr = t["expr"]
            assert "$cluster" in expr, f"panel {p['title']!r} ignores the cluster variable"
            exprs.append(expr)
            for name in re.findall(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:\{|\[)", expr):
                if name in ("by", "on", "group_left"):
                    continue
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                assert name in known or base in known or name in EXTERNAL, (
                    f"panel {p['title']!r} uses {name}, which no strom service exports"
                )
    assert len(exprs) >= 40
    assert any("$topic" in e for e in exprs)
    # promtool parses each query as a recording rule: a syntax error fails the check.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": substitute(e)}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_reassignment_panel_compares_each_nodes_copy_with_its_rate() -> None:
    """Found from outside: the copy was summed by topic over every leader and drawn against
    one node's throttle rate, so a move held at the rate on three nodes showed three times
    over it. Both lines are per node now."""
    (panel,) = [p for p in panels(dashboard()) if p["title"] == "Reassignment copy and throttle"]
    exprs = [t["expr"] for t in panel["targets"]]
    copy = [e for e in exprs if "reassignment_bytes_out_total" in e]
    rate = [e for e in exprs if "replication_throttle_rate_bytes" in e]
    assert len(copy) == 1 and len(rate) == 1, exprs
    assert (
        "sum by (cluster, instance) (rate(strom_storage_reassignment_bytes_out_total" in (copy[0])
    )
    assert "by (topic)" not in copy[0]
    assert "node_id" in copy[0] and "node_id" in rate[0]  # the same legend key: one per node
