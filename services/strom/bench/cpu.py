"""CPU seconds a benchmark phase cost the client (this process) and the servers.

A rate alone hides what a record costs: a run can be fast because it burns both cores.
Every ``strom bench`` phase therefore reports CPU seconds per million records, for the
bench process (``time.process_time``: all its threads, the producer's sender and gRPC's
included) and for the service processes, taken from one of two sources:

- PIDs of processes on this host (``/proc/<pid>/stat``), when the bench started the
  cluster itself (:class:`LocalCluster` knows them);
- the ``process_cpu_seconds_total`` counter of each service's Prometheus endpoint, for a
  cluster the bench only connects to. The cluster's Metadata does not carry metrics ports,
  so the endpoints come from ``--metrics URL,...`` / ``$STROM_METRICS``, or from the state
  file of ``strom dev up`` when its bootstrap is the bench's.

The server source is module state (:func:`use_server`) because every phase of one
``strom bench`` command measures the same processes; threading it through each bench
function's signature would add nothing.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

METRICS_ENV = "STROM_METRICS"
_CPU_LINE = re.compile(rb"^process_cpu_seconds_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ServerCpuUnavailable(RuntimeError):
    """A service's CPU counter could not be read (process gone, endpoint down)."""


def pid_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process on this host, from ``/proc/<pid>/stat``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError as exc:
        raise ServerCpuUnavailable(f"process {pid}: {exc}") from None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


def scrape_cpu_seconds(url: str, timeout: float = 5.0) -> float:
    """``process_cpu_seconds_total`` of the Prometheus endpoint ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
    except OSError as exc:
        raise ServerCpuUnavailable(f"{url}: {exc}") from None
    m = _CPU_LINE.search(body)
    if m is None:
        raise ServerCpuUnavailable(f"{url}: no process_cpu_seconds_total in the metrics")
    return float(m.group(1))


def scrape_sample(url: str, series: str, timeout: float = 5.0) -> float | None:
    """The value of one series of the Prometheus endpoint ``url``, named as it is exposed
    (``name{label="value",...}``); None when the endpoint is unreachable or lacks it."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(series)}\s+(\S+)$", body, re.M)
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class ServerCpu:
    """The service processes whose CPU a phase adds up: local PIDs and/or metrics URLs."""

    pids: tuple[int, ...] = ()
    urls: tuple[str, ...] = ()

    def sample(self) -> float:
        return sum(pid_cpu_seconds(p) for p in self.pids) + sum(
            scrape_cpu_seconds(u) for u in self.urls
        )

    def describe(self) -> str:
        """Where the numbers come from, for a report's context."""
        parts = []
        if self.pids:
            parts.append(f"{len(self.pids)} local processes")
        if self.urls:
            parts.append("metrics " + ",".join(self.urls))
        return " + ".join(parts) or "none"

    @classmethod
    def of_cluster(cls, cluster: object) -> ServerCpu:
        """Every running service process of a :class:`LocalCluster` (not etcd)."""
        pids = [
            m.process.pid
            for m in cluster.members  # type: ignore[attr-defined]
            if m.process is not None and m.process.pid is not None
        ]
        return cls(pids=tuple(pids))


def metrics_urls(spec: str) -> tuple[str, ...]:
    """``"h:9100,http://h2:9101/metrics"`` → full URLs (``http://`` and ``/metrics`` added)."""
    out = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        if "://" not in item:
            item = f"http://{item}"
        scheme, _, rest = item.partition("://")
        if scheme not in ("http", "https") or not rest or rest.startswith("/"):
            raise ValueError(f"metrics endpoint {raw!r} is not HOST:PORT or an http(s) URL")
        if "/" not in rest:
            item += "/metrics"
        out.append(item)
    return tuple(out)


def from_dev_state(root: Path, bootstrap: Sequence[str]) -> ServerCpu | None:
    """The metrics endpoints of the ``strom dev up`` cluster in ``root`` when the bench's
    bootstrap names one of its nodes (else None: that state file is another cluster's)."""
    from strom.devcluster.cluster import STATE_FILE

    path = Path(root) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    mine = set(str(state.get("bootstrap", "")).split(","))
    if not mine & set(bootstrap):
        return None
    urls = [
        f"http://127.0.0.1:{m['metrics_port']}/metrics"
        for m in state.get("members", [])
        if m.get("metrics_port")
    ]
    return ServerCpu(urls=tuple(urls)) if urls else None


def discover(
    metrics: str | None, bootstrap: str | Sequence[str] | None, dev_dir: str | None = None
) -> ServerCpu | None:
    """The server CPU source a user would expect: ``--metrics`` / ``$STROM_METRICS`` if
    given, else the ``strom dev up`` cluster (``$STROM_DEV_DIR``, default /tmp/strom-dev)
    when the bench talks to it, else None (server CPU is then reported as unknown)."""
    spec = metrics or os.environ.get(METRICS_ENV)
    if spec:
        return ServerCpu(urls=metrics_urls(spec))
    from strom.client.cluster import parse_bootstrap

    try:
        boot = parse_bootstrap(bootstrap)  # type: ignore[arg-type]
    except ValueError:
        return None
    root = dev_dir or os.environ.get("STROM_DEV_DIR", "/tmp/strom-dev")
    return from_dev_state(Path(root), boot)


_server: ServerCpu | None = None


def use_server(server: ServerCpu | None) -> None:
    """Measure these service processes in the phases that follow (None: none known)."""
    global _server
    _server = server


def server_source() -> str:
    """What the phases' server CPU is the sum of, for a report's context."""
    if _server is None:
        return "unknown (pass --metrics URL,... or $STROM_METRICS)"
    return _server.describe()


@dataclass
class CpuUsage:
    """CPU seconds one phase cost: the bench process and, when known, the servers."""

    client_s: float
    server_s: float | None = None

    def scaled(self, share: float) -> CpuUsage:
        """The part of this usage that ``share`` (0..1) of the phase's records take (a phase
        that also sent records it does not count, such as the e2e bench's lead-in)."""
        return CpuUsage(
            self.client_s * share, None if self.server_s is None else self.server_s * share
        )

    def per_million(self, records: int) -> dict[str, float | None]:
        scale = 1e6 / records if records else None
        return {
            "client_cpu_s": round(self.client_s, 3),
            "server_cpu_s": None if self.server_s is None else round(self.server_s, 3),
            "client_cpu_s_per_M_records": round(self.client_s * scale, 3) if scale else None,
            "server_cpu_s_per_M_records": (
                round(self.server_s * scale, 3)
                if scale is not None and self.server_s is not None
                else None
            ),
        }


class Meter:
    """Started at the beginning of a phase; :meth:`stop` gives its :class:`CpuUsage`."""

    def __init__(self, server: ServerCpu | None) -> None:
        self.server = server
        self.client0 = time.process_time()
        self.server0 = self._server_now()

    def _server_now(self) -> float | None:
        if self.server is None:
            return None
        try:
            return self.server.sample()
        except ServerCpuUnavailable:
            return None

    def stop(self) -> CpuUsage:
        client = time.process_time() - self.client0
        server_now = self._server_now() if self.server0 is not None else None
        server = None if server_now is None or self.server0 is None else server_now - self.server0
        return CpuUsage(client, server)


def start(server: ServerCpu | None = None) -> Meter:
    """Begin measuring a phase (``server``: these processes, else :func:`use_server`'s)."""
    return Meter(server if server is not None else _server)
