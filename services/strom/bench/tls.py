"""``strom bench tls``: what TLS costs, against plaintext, in one run.

Starts two local clusters of the same shape side by side: one plaintext, one with TLS and
mTLS on every listener, service-to-service channel and etcd, and ACLs on (``strom dev up
--tls``). Then alternates the same phases on each, round by round, so a machine that gets
busier or quieter during the run touches both alike:

- produce: ``Producer.send`` as fast as it goes (acks as given), ack latency sampled;
- fetch: ``Consumer.poll`` of those records from the earliest offset;
- e2e: produce at ``--rate`` and consume in the same process, every record accounted for.

Printed per phase and cluster, then TLS as a share of plaintext (throughput) and the
latency percentiles side by side.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

from strom.bench import cpu
from strom.bench.clients import bench_consume, bench_produce, ensure_topic
from strom.bench.e2e import bench_e2e
from strom.bench.stats import Result
from strom.devcluster.cluster import LocalCluster

MODES = ("plaintext", "tls")


@contextlib.contextmanager
def _client_env(env: dict[str, str]) -> Iterator[None]:
    """The clients of a phase find their cluster (and its TLS files) through ``STROM_*``,
    as a user's would; the previous environment comes back afterwards."""
    keys = [k for k in os.environ if k.startswith("STROM_SSL_") or k.startswith("STROM_TOKEN")]
    saved = {k: os.environ.pop(k) for k in keys}
    os.environ.update(env)
    try:
        yield
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


def bench_tls(
    *,
    records: int,
    record_size: int,
    nodes: int = 3,
    replication_factor: int = 3,
    partitions: int = 3,
    acks: str | int = "all",
    rate: float = 5_000.0,
    e2e_records: int = 20_000,
    rounds: int = 1,
    root: Path | None = None,
    progress: bool | None = None,
    **producer_options: Any,
) -> list[Result]:
    """Results named ``<mode> <phase>`` (mode plaintext / tls; phase produce, fetch, e2e),
    ``rounds`` of each in the order they ran."""
    if replication_factor > nodes:
        raise ValueError(f"--replication-factor {replication_factor} > --nodes {nodes}")
    tmp = None
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="strom-bench-tls-")
        root = Path(tmp.name)
    clusters = {
        mode: LocalCluster(
            root / mode,
            nodes=nodes,
            controllers=1,
            coordinators=1,
            tls=mode == "tls",
            coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
        )
        for mode in MODES
    }
    results: list[Result] = []
    try:
        for c in clusters.values():
            c.start(timeout=120)
        options = {"acks": acks, **producer_options}
        for _ in range(rounds):
            topic = f"strom-bench-tls-{uuid.uuid4().hex[:8]}"
            for phase in ("produce", "fetch", "e2e"):
                for mode, cluster in clusters.items():
                    cpu.use_server(cpu.ServerCpu.of_cluster(cluster))
                    with _client_env(cluster.client_env()):
                        if phase == "produce":
                            ensure_topic(None, topic, partitions, replication_factor)
                            r = bench_produce(
                                None,
                                topic,
                                records=records,
                                record_size=record_size,
                                progress=progress,
                                **options,
                            )
                        elif phase == "fetch":
                            r = bench_consume(None, topic, records=records, progress=progress)[0]
                        else:
                            e2e_topic = f"{topic}-e2e"
                            ensure_topic(None, e2e_topic, partitions, replication_factor)
                            r = bench_e2e(
                                None,
                                e2e_topic,
                                records=e2e_records,
                                record_size=record_size,
                                rate=rate,
                                progress=progress,
                                **{**options, "linger_ms": 0.0},
                            )
                            if not r.clean:
                                raise RuntimeError(f"{mode} e2e lost or duplicated records: {r}")
                    r.name = f"{mode} {phase}"
                    results.append(r)
    finally:
        cpu.use_server(None)
        for c in clusters.values():
            c.kill()
        if tmp is not None:
            tmp.cleanup()
    return results


def comparison(results: list[Result]) -> dict[str, float]:
    """TLS against plaintext per phase (medians over rounds): throughput as a share
    (``<phase>_tls_share``: 0.9 = TLS does 90 % of plaintext's records/s) and latency
    percentiles of both (``<phase>_<mode>_p50_ms`` ...)."""
    out: dict[str, float] = {}
    for phase in ("produce", "fetch", "e2e"):
        rate = {
            m: median([r.summary()["records_per_s"] for r in results if r.name == f"{m} {phase}"])  # type: ignore[misc]
            for m in MODES
        }
        if rate["plaintext"]:
            out[f"{phase}_tls_share"] = round(rate["tls"] / rate["plaintext"], 3)
        for m in MODES:
            lat = [r.summary() for r in results if r.name == f"{m} {phase}" and r.latencies]
            for p in ("p50_ms", "p99_ms"):
                if lat:
                    out[f"{phase}_{m}_{p}"] = round(median([float(d[p]) for d in lat]), 2)
    return out


def summary(results: list[Result]) -> str:
    lines = [r.line() for r in results]
    cmp = comparison(results)
    lines.append("")
    lines.append("TLS (mTLS, ACLs on) against plaintext, medians over rounds:")
    for phase in ("produce", "fetch", "e2e"):
        share = cmp.get(f"{phase}_tls_share")
        text = f"  {phase:<8} throughput {share:.1%} of plaintext" if share else f"  {phase:<8}"
        if f"{phase}_tls_p50_ms" in cmp:
            plain = {p: cmp[f"{phase}_plaintext_{p}_ms"] for p in ("p50", "p99")}
            tls = {p: cmp[f"{phase}_tls_{p}_ms"] for p in ("p50", "p99")}
            text += (
                f"   latency p50 {plain['p50']} -> {tls['p50']} ms"
                f", p99 {plain['p99']} -> {tls['p99']} ms"
            )
        lines.append(text)
    return "\n".join(lines)
