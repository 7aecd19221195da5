"""A real Prometheus (Debian's ``prometheus`` binary) scraping a local cluster.

The scrape configuration is the contract the dashboard and the alert rules rely on, the same
one the Helm chart's ServiceMonitor produces: jobs ``strom-storage``, ``strom-controller``
and ``strom-coordinator``, and a ``cluster`` label with the strom cluster name on every
series.
"""

from __future__ import annotations

import json
import math
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from strom.devcluster.procs import (
    ClusterError,
    ManagedProcess,
    ProcessExited,
    free_port,
    wait_for,
)

#: Job name of each member kind (LocalCluster's ``Member.kind``).
JOBS = {
    "storage-node": "strom-storage",
    "controller": "strom-controller",
    "coordinator": "strom-coordinator",
}


def scrape_config(
    cluster_name: str,
    targets: dict[str, list[str]],
    *,
    rule_files: list[str] | None = None,
    interval: str = "15s",
) -> dict[str, Any]:
    """A prometheus.yml as a dict: one job per role (``targets``: job -> host:port list)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": list(rule_files or []),
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": addrs, "labels": {"cluster": cluster_name}}],
            }
            for job, addrs in targets.items()
        ],
    }


def cluster_targets(cluster: Any) -> dict[str, list[str]]:
    """job -> metrics addresses of a :class:`strom.devcluster.cluster.LocalCluster`."""
    out: dict[str, list[str]] = {job: [] for job in JOBS.values()}
    for m in cluster.members:
        out[JOBS[m.kind]].append(f"127.0.0.1:{m.metrics_port}")
    return {job: addrs for job, addrs in out.items() if addrs}


class PrometheusServer:
    """``prometheus`` on a free loopback port, in its own session, stopped by PID."""

    def __init__(self, root: Path, config: dict[str, Any], port: int | None = None) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise ClusterError(
                "prometheus was not found on PATH: apt-get install -y prometheus "
                "(scripts/bootstrap.sh does that)"
            )
        self.binary = binary
        self.root = Path(root)
        self.config = config
        self.port = port or free_port()
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = self.root / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config, sort_keys=False))
        argv = [
            self.binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.process = ManagedProcess("prometheus", argv, self.root / "prometheus.log").start()
        wait_for(self._ready, timeout=timeout, what=f"prometheus on {self.url} to be ready")
        return self

    def _ready(self) -> bool:
        if self.process is None:
            raise ProcessExited("prometheus was not started")
        if not self.process.alive():
            raise self.process.exited("prometheus")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else ClusterError."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400 on a bad query: say what Prometheus said
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise ClusterError(f"prometheus {path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result vector (a scalar answer becomes one unlabeled sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets_up(self) -> dict[str, bool]:
        """scrape URL -> whether its last scrape succeeded."""
        data = self.api("targets")
        return {t["scrapeUrl"]: t["health"] == "up" for t in data["activeTargets"]}

    def firing(self) -> set[tuple[str, str]]:
        """(alert name, instance or "") of every firing alert."""
        alerts = self.api("alerts")["alerts"]
        return {
            (a["labels"]["alertname"], a["labels"].get("instance", ""))
            for a in alerts
            if a["state"] == "firing"
        }


def values(result: list[dict[str, Any]]) -> list[float]:
    """The sample values of an instant-query result that are numbers (NaN dropped)."""
    out = []
    for series in result:
        v = float(series["value"][1])
        if not math.isnan(v):
            out.append(v)
    return out
