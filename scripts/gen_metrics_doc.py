"""Write docs/metrics.md from the metrics the services define (``--check``: fail if stale).

The table is built from the live prometheus_client registry after importing every service
module, so a metric added, renamed or re-labelled in the code shows up here, and
tests/unit/test_metrics_doc.py fails until the committed page is regenerated:

    .venv/bin/python scripts/gen_metrics_doc.py
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "metrics.md"

#: Modules whose import defines every strom metric (one per service, plus the shared parts).
MODULES = (
    "strom.service.metrics",
    "strom.service.gc_pauses",
    "strom.metadata.metrics",
    "strom.storage.metrics",
    "strom.storage.node",
    "strom.controller.metrics",
    "strom.controller.service",
    "strom.coordinator.metrics",
    "strom.coordinator.service",
)

HEADER = """\
# strom metrics

Every service serves Prometheus metrics over HTTP on its `--metrics-port` (`/metrics`;
storage node 9102, controller 9103, coordinator 9104 by default), on the host of its
`--listen` address (every interface, IPv4 and IPv6, for `0.0.0.0`, the default, or `[::]`;
IPv4 alone on a host without IPv6). This table is generated from the code by
`scripts/gen_metrics_doc.py`; `tests/unit/test_metrics_doc.py` fails when it is stale. The
clients' own metrics (`Producer.metrics()`, `Consumer.metrics()`) are in
[client-metrics.md](client-metrics.md).

Names follow Prometheus conventions: `strom_<part>_...`, base units (`_seconds`, `_bytes`),
`_total` on counters (the exposed name is given). The parts are the three services
(`storage`, `controller`, `coordinator`) and the layers every service shares: `service` (the
runtime) and `metadata` (the etcd client), whose series carry a `service` label with the
role of the process. Histograms also expose `_bucket{le}`, `_sum` and `_count`.

The `result` label of the `*_request_latency_seconds` histograms is an error code name
(`NONE` = success) when the RPC answered, and otherwise one of a fixed few: `CANCELLED` when
the client cancelled the call or went away (a consumer closing during a long-poll Fetch), the
gRPC status a refused call ended with (`RESOURCE_EXHAUSTED`: a shed Produce), or
`UNKNOWN_SERVER_ERROR` when the handler failed unexpectedly. Cancelled calls are counted but
their time is how long the client waited, not how long the service took to answer, so the
dashboard's latency heatmaps and quantiles leave out `result="CANCELLED"` (a cancelled
long poll would otherwise show as a Fetch near its max wait).

A storage node exports its per-partition series (`topic`, `partition`) while it hosts the
replica, and a topic's counters (`topic` alone) while it hosts any replica of the topic: they
disappear when the replicas are deleted or move away, and start again from zero if they come
back (a re-created topic does not add to the deleted one's totals). Leader-only series exist
only on the partition's current leader. The counters of data a node took out of service or cut
(`strom_storage_replicas_set_aside_total`, `strom_storage_recovery_truncations_total`,
`strom_storage_recovery_truncated_bytes_total`) keep their series for the life of the
process instead: they count what happens as the node opens its logs, mostly at start, before
or without hosting the replica (their alerts also look at `process_start_time_seconds`).

Labels added by the scraper, not by strom: `cluster` (the strom cluster name), `job`
(`strom-storage`, `strom-controller`, `strom-coordinator`) and `instance`. The Helm chart's
ServiceMonitor and the example `deploy/prometheus/prometheus.yml` set them that way; the
dashboard (`deploy/grafana/`) and the alert rules (`deploy/prometheus/strom-alerts.yml`)
rely on them. prometheus-operator also gives every target `service` (the Kubernetes
Service's name), `namespace`, `pod`, `container` and `endpoint`: the chart's ServiceMonitor
sets `honorLabels`, so strom's own `service` label (the role) is kept rather than renamed
`exported_service`; series without it carry the Kubernetes Service's name there.

`instance` names a target by its metrics address, while the cluster names a storage node by
its id (`strom topics describe`, `strom_controller_missing_node_replicas{node}`): every storage
node exports `strom_storage_node_info{node_id}` to join the two, e.g.
`up{job="strom-storage"} * on (cluster, instance) group_left (node_id) strom_storage_node_info`.
The alert rules record `strom:storage_node_info:last` (the id a target last exported, kept a
day while the node is down) and name a storage node "node 3 (10.0.0.7:9102)"; the dashboard's
per-node panels show "node 3 10.0.0.7:9102".

Besides these, every process exports prometheus_client's standard `process_*`
(CPU seconds, resident memory, open file descriptors, start time) and `python_gc_*` /
`python_info` series; the dashboard joins them with `strom_build_info` to name the role.

| name | type | labels | meaning |
| --- | --- | --- | --- |
"""


def exposed_name(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" else name


def rows() -> list[tuple[str, str, str, str]]:
    """(exposed name, type, labels, help) of every strom_* metric, sorted by name."""
    for module in MODULES:
        importlib.import_module(module)
    from prometheus_client import REGISTRY

    out: dict[str, tuple[str, str, str, str]] = {}
    for collector in list(REGISTRY._collector_to_names):
        name = getattr(collector, "_name", None)
        kind = getattr(collector, "_type", None)
        if not isinstance(name, str) or not name.startswith("strom_") or kind is None:
            continue
        labels = ", ".join(f"`{label}`" for label in getattr(collector, "_labelnames", ()))
        doc = " ".join(str(getattr(collector, "_documentation", "")).split())
        full = exposed_name(name, kind)
        out[full] = (f"`{full}`", kind, labels, doc.replace("|", "\\|"))
    return [out[k] for k in sorted(out)]


def render() -> str:
    lines = [HEADER.rstrip("\n")]
    lines += [f"| {n} | {t} | {labels} | {doc} |" for n, t, labels, doc in rows()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/metrics.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(
                f"{DOC.relative_to(ROOT)} is stale: run python scripts/gen_metrics_doc.py",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
