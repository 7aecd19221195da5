"""Build the strom Grafana dashboard with grafana-foundation-sdk.

    .venv/bin/python deploy/grafana/build_dashboard.py          # write the JSON
    .venv/bin/python deploy/grafana/build_dashboard.py --check  # fail if it is stale

Writes ``deploy/grafana/strom-dashboard.json`` and the copy the Helm chart ships in its
dashboard ConfigMap (``helm/strom/dashboards/strom.json``: Helm reads only files inside the
chart). ``PANELS`` below is the single list of rows, panels and queries; the Prometheus
integration test (tests/integration/test_prometheus.py) runs every query of the generated
JSON against a real cluster.

Every query selects ``cluster=~"$cluster"`` (the label the scrape configuration attaches);
``$topic`` narrows the per-topic panels. ``process_*`` series have no strom labels, so they
are joined with ``strom_build_info`` to keep strom's targets and name each one's role.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = (
    ROOT / "deploy" / "grafana" / "strom-dashboard.json",
    ROOT / "helm" / "strom" / "dashboards" / "strom.json",
)
UID = "strom-overview"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
C = 'cluster=~"$cluster"'
CT = 'cluster=~"$cluster", topic=~"$topic"'
RI = "$__rate_interval"
#: Join for process_* series: keep strom's targets, add their role as `service`.
ROLE = f"* on (instance, job) group_left (service) strom_build_info{{{C}}}"
#: Join for a storage node's series: add its node id (the one `strom topics describe` and the
#: alerts print) as `node_id`; a node too old to export strom_storage_node_info keeps its
#: series, without one.
NODE_ID = (
    f"* on (cluster, instance) group_left (node_id) (strom_storage_node_info{{{C}}} "
    f'or on (cluster, instance) group by (cluster, instance) (up{{{C}, job="strom-storage"}}))'
)
#: The legend of a per-storage-node series: its id and its metrics address.
NODE = "node {{node_id}} {{instance}}"


def by_node(expr: str) -> str:
    """``expr`` (labelled by cluster and instance) with the storage node's id added."""
    return f"({expr}) {NODE_ID}"


@dataclass
class P:
    """One panel: kind is stat | timeseries | heatmap; queries are (expr, legend)."""

    kind: str
    title: str
    description: str
    queries: list[tuple[str, str]]
    unit: str = "short"
    width: int = 8
    height: int = 8
    extra: dict[str, object] = field(default_factory=dict)


#: Latency panels leave out cancelled calls: their time is the client's wait, not ours.
ANSWERED = f'{C}, result!="CANCELLED"'


def quantile(q: float, metric: str, by: str, where: str = C) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{where}}}[{RI}])))"


def rate_by(metric: str, by: str, where: str = C) -> str:
    return f"sum by ({by}) (rate({metric}{{{where}}}[{RI}]))"


def heat(metric: str, where: str) -> str:
    return f"sum by (le) (rate({metric}_bucket{{{where}}}[{RI}]))"


PANELS: list[tuple[str, list[P]]] = [
    (
        "Cluster health",
        [
            P(
                "stat",
                "Active controllers",
                "Controllers that say they are active: must be 1.",
                [(f"sum(strom_controller_active{{{C}}})", "")],
                width=4,
                height=4,
                extra={"thresholds": [(None, "red"), (1, "green"), (2, "red")]},
            ),
            P(
                "stat",
                "Storage nodes registered",
                "Storage nodes registered in etcd (live).",
                [(f"max(strom_controller_live_nodes{{{C}}})", "")],
                width=4,
                height=4,
            ),
            P(
                "stat",
                "Offline partitions",
                "Partitions without a leader.",
                [(f"max(strom_controller_offline_partitions{{{C}}})", "")],
                width=4,
                height=4,
                extra={"thresholds": [(None, "green"), (1, "red")]},
            ),
            P(
                "stat",
                "Under-replicated partitions",
                "Partitions with fewer replicas in sync than they have (replicas a "
                "reassignment is adding not counted, as Kafka).",
                [(f"max(strom_controller_under_replicated_partitions{{{C}}})", "")],
                width=4,
                height=4,
                extra={"thresholds": [(None, "green"), (1, "orange")]},
            ),
            P(
                "stat",
                "Under min ISR",
                "Partitions whose ISR is below min.insync.replicas: acks=all produces fail.",
                [(f"max(strom_controller_under_min_isr_partitions{{{C}}})", "")],
                width=4,
                height=4,
                extra={"thresholds": [(None, "green"), (1, "red")]},
            ),
            P(
                "stat",
                "Firing strom alerts",
                "Alerts from deploy/prometheus/strom-alerts.yml firing for this cluster.",
                [
                    (
                        f'count(ALERTS{{alertstate="firing", alertname=~"Strom.*", {C}}}) '
                        "or vector(0)",
                        "",
                    )
                ],
                width=4,
                height=4,
                extra={"thresholds": [(None, "green"), (1, "red")]},
            ),
            P(
                "stat",
                "Topics",
                "Topics in the cluster.",
                [(f"max(strom_controller_topics{{{C}}})", "")],
                width=4,
                height=4,
            ),
            P(
                "stat",
                "Partitions",
                "Partitions in the cluster.",
                [(f"max(strom_controller_partitions{{{C}}})", "")],
                width=4,
                height=4,
            ),
            P(
                "stat",
                "Preferred-replica imbalance",
                "Partitions not led by their preferred "
                "replica (auto leader rebalance moves them back).",
                [(f"max(strom_controller_preferred_replica_imbalance{{{C}}})", "")],
                width=4,
                height=4,
            ),
            P(
                "stat",
                "Partitions being reassigned",
                "Partitions whose replicas a reassignment is moving (strom topics reassign): "
                "a move in progress, not a fault.",
                [(f"max(strom_controller_reassigning_partitions{{{C}}})", "")],
                width=4,
                height=4,
            ),
            P(
                "stat",
                "Scrape targets down",
                "strom processes Prometheus cannot scrape.",
                [(f'count(up{{{C}, job=~"strom-.*"}} == 0) or vector(0)', "")],
                width=4,
                height=4,
                extra={"thresholds": [(None, "green"), (1, "red")]},
            ),
            P(
                "timeseries",
                "Offline partitions as each node sees them",
                "From each storage node's own view of the metadata: a node that disagrees with "
                "the others has a stale view.",
                [(by_node(f"strom_storage_offline_partitions{{{C}}}"), NODE)],
                width=4,
                height=4,
            ),
            P(
                "stat",
                "Versions",
                "Processes by role and strom version.",
                [
                    (
                        f"count by (service, version) (strom_build_info{{{C}}})",
                        "{{service}} {{version}}",
                    )
                ],
                width=4,
                height=4,
            ),
        ],
    ),
    (
        "Topics",
        [
            P(
                "timeseries",
                "Bytes in by topic",
                "Record bytes appended by Produce.",
                [(rate_by("strom_storage_bytes_in_total", "topic", CT), "{{topic}}")],
                unit="Bps",
            ),
            P(
                "timeseries",
                "Bytes out by topic",
                "Record bytes fetched by consumers (replication not included).",
                [(rate_by("strom_storage_bytes_out_total", "topic", CT), "{{topic}}")],
                unit="Bps",
            ),
            P(
                "timeseries",
                "Records in / out by topic",
                "Records appended (from batch headers) and offsets fetched by consumers.",
                [
                    (rate_by("strom_storage_records_in_total", "topic", CT), "in {{topic}}"),
                    (rate_by("strom_storage_records_out_total", "topic", CT), "out {{topic}}"),
                ],
                unit="ops",
            ),
            P(
                "timeseries",
                "Bytes in / out by client id",
                "By the strom-client-id the client sent (empty: none).",
                [
                    (
                        rate_by("strom_storage_client_bytes_in_total", "client_id"),
                        "in {{client_id}}",
                    ),
                    (
                        rate_by("strom_storage_client_bytes_out_total", "client_id"),
                        "out {{client_id}}",
                    ),
                ],
                unit="Bps",
            ),
            P(
                "timeseries",
                "Produce results",
                "Produce partition results by error code (NONE = appended).",
                [(rate_by("strom_storage_produce_requests_total", "error"), "{{error}}")],
                unit="ops",
            ),
            P(
                "timeseries",
                "Log size by topic",
                "Bytes on disk, all replicas.",
                [(f"sum by (topic) (strom_storage_log_size_bytes{{{CT}}})", "{{topic}}")],
                unit="bytes",
            ),
        ],
    ),
    (
        "Replication and ISR",
        [
            P(
                "timeseries",
                "Under-replicated partitions by leader",
                "Partitions each node leads whose ISR is smaller than the replica set.",
                [(by_node(f"strom_storage_under_replicated_partitions{{{C}}}"), NODE)],
            ),
            P(
                "timeseries",
                "Under min ISR by leader",
                "Partitions each node leads whose ISR is below min.insync.replicas.",
                [(by_node(f"strom_storage_under_min_isr_partitions{{{C}}}"), NODE)],
            ),
            P(
                "timeseries",
                "ISR shrinks / expands",
                "Committed ISR changes, per leader.",
                [
                    (
                        by_node(rate_by("strom_storage_isr_shrinks_total", "cluster, instance")),
                        f"shrink {NODE}",
                    ),
                    (
                        by_node(rate_by("strom_storage_isr_expands_total", "cluster, instance")),
                        f"expand {NODE}",
                    ),
                ],
                unit="ops",
            ),
            P(
                "timeseries",
                "Max replica lag by topic",
                "Largest follower lag in offsets.",
                [(f"max by (topic) (strom_storage_replica_lag_messages{{{CT}}})", "{{topic}}")],
            ),
            P(
                "timeseries",
                "Partitions by node and role",
                "Hosted replicas: leaders and followers.",
                [(by_node(f"strom_storage_partitions{{{C}}}"), f"{NODE} {{{{role}}}}")],
            ),
            P(
                "timeseries",
                "Open streams by node",
                "ProduceStream and FetchStream calls held open on each node: producers (one per "
                "node they write to), caught-up consumers and followers. A drop to zero on a node "
                "its clients still use means they fell back to unary calls.",
                [
                    (
                        by_node(
                            "sum by (cluster, instance, method) "
                            f"(strom_storage_open_streams{{{C}}})"
                        ),
                        f"{NODE} {{{{method}}}}",
                    )
                ],
            ),
            P(
                "timeseries",
                "Replication bytes out",
                "Bytes leaders sent to followers.",
                [
                    (
                        by_node(
                            rate_by(
                                "strom_storage_replication_bytes_out_total", "cluster, instance"
                            )
                        ),
                        NODE,
                    )
                ],
                unit="Bps",
            ),
            P(
                "timeseries",
                "Reassignment copy and throttle",
                "Bytes each node sent, as leader, to replicas a reassignment is adding (the "
                "copy a move makes), against the replication throttle rate that node applies "
                "(strom topics reassign --throttle; 0: no limit): both per node, so a copy "
                "line at its node's throttle line is a move held back by the throttle.",
                [
                    (
                        by_node(
                            rate_by(
                                "strom_storage_reassignment_bytes_out_total", "cluster, instance"
                            )
                        ),
                        f"copy {NODE}",
                    ),
                    (
                        by_node(
                            "max by (cluster, instance) (strom_storage_replication_throttle_rate_"
                            f'bytes{{{C}, side="leader"}})'
                        ),
                        f"throttle {NODE}",
                    ),
                ],
                unit="Bps",
            ),
            P(
                "timeseries",
                "Leader elections",
                "Leader changes committed, by reason.",
                [(rate_by("strom_controller_leader_elections_total", "reason"), "{{reason}}")],
                unit="ops",
            ),
        ],
    ),
    (
        "Consumer groups",
        [
            P(
                "timeseries",
                "Consumer lag by group and topic",
                "High watermark minus committed offset, summed over partitions. Each "
                "partition counts once while its group moves between coordinators (both "
                "may export it for a moment).",
                [
                    (
                        # max, not the sum over coordinators: a shard hand-over doubled it
                        # (found from outside). Inline rather than the alert rules'
                        # strom:consumer_lag:max, so the dashboard works without them.
                        "sum by (group, topic) (max by (cluster, group, topic, partition) "
                        f"(strom_coordinator_consumer_lag{{{CT}}}))",
                        "{{group}} {{topic}}",
                    )
                ],
            ),
            P(
                "timeseries",
                "Groups by state",
                "Groups in the coordinators' loaded shards.",
                [(f"sum by (state) (strom_coordinator_groups{{{C}}})", "{{state}}")],
            ),
            P(
                "timeseries",
                "Group members",
                "Members of all groups.",
                [(f"sum(strom_coordinator_members{{{C}}})", "members")],
            ),
            P(
                "timeseries",
                "Rebalances",
                "Rebalances started per second.",
                [(f"sum(rate(strom_coordinator_rebalances_total{{{C}}}[{RI}]))", "rebalances")],
                unit="ops",
            ),
            P(
                "timeseries",
                "Rebalance duration (p50, p95)",
                "From a group leaving STABLE to every member converged.",
                [
                    (
                        quantile(0.5, "strom_coordinator_rebalance_duration_seconds", "cluster"),
                        "p50",
                    ),
                    (
                        quantile(0.95, "strom_coordinator_rebalance_duration_seconds", "cluster"),
                        "p95",
                    ),
                ],
                unit="s",
            ),
            P(
                "timeseries",
                "Shards owned by coordinator",
                "__consumer_offsets partitions each coordinator has loaded.",
                [(f"strom_coordinator_shards_owned{{{C}}}", "{{instance}}")],
            ),
        ],
    ),
    (
        "Request latency",
        [
            P(
                "heatmap",
                "Produce latency",
                "StorageService Produce handling time.",
                [
                    (
                        heat("strom_storage_request_latency_seconds", f'{ANSWERED}, rpc="Produce"'),
                        "{{le}}",
                    )
                ],
                unit="s",
            ),
            P(
                "heatmap",
                "Fetch latency",
                "StorageService Fetch (consumers and followers; includes the long-poll wait).",
                [
                    (
                        heat("strom_storage_request_latency_seconds", f'{ANSWERED}, rpc="Fetch"'),
                        "{{le}}",
                    )
                ],
                unit="s",
            ),
            P(
                "heatmap",
                "Controller RPC latency",
                "Every ControllerService RPC.",
                [(heat("strom_controller_request_latency_seconds", ANSWERED), "{{le}}")],
                unit="s",
            ),
            P(
                "heatmap",
                "Coordinator heartbeat latency",
                "ConsumerGroupHeartbeat.",
                [
                    (
                        heat(
                            "strom_coordinator_request_latency_seconds",
                            f'{ANSWERED}, rpc="ConsumerGroupHeartbeat"',
                        ),
                        "{{le}}",
                    )
                ],
                unit="s",
            ),
            P(
                "heatmap",
                "Coordinator offset commit latency",
                "OffsetCommit (written to __consumer_offsets before the answer).",
                [
                    (
                        heat(
                            "strom_coordinator_request_latency_seconds",
                            f'{ANSWERED}, rpc="OffsetCommit"',
                        ),
                        "{{le}}",
                    )
                ],
                unit="s",
            ),
            P(
                "timeseries",
                "p99 latency by RPC",
                "Every service's RPCs.",
                [
                    (
                        quantile(0.99, "strom_storage_request_latency_seconds", "rpc", ANSWERED),
                        "storage {{rpc}}",
                    ),
                    (
                        quantile(0.99, "strom_controller_request_latency_seconds", "rpc", ANSWERED),
                        "controller {{rpc}}",
                    ),
                    (
                        quantile(
                            0.99, "strom_coordinator_request_latency_seconds", "rpc", ANSWERED
                        ),
                        "coordinator {{rpc}}",
                    ),
                ],
                unit="s",
            ),
            P(
                "timeseries",
                "Requests by result",
                "RPC answers by RPC and result (NONE = success, CANCELLED = the client cancelled).",
                [
                    (
                        rate_by("strom_storage_request_latency_seconds_count", "rpc, result"),
                        "storage {{rpc}} {{result}}",
                    ),
                    (
                        rate_by("strom_controller_request_latency_seconds_count", "rpc, result"),
                        "controller {{rpc}} {{result}}",
                    ),
                    (
                        rate_by("strom_coordinator_request_latency_seconds_count", "rpc, result"),
                        "coordinator {{rpc}} {{result}}",
                    ),
                ],
                unit="reqps",
            ),
            P(
                "timeseries",
                "Request queue time (p99)",
                "How long a ready request waits for "
                "the event loop, by role; and Produce appends waiting for the writer thread.",
                [
                    (
                        quantile(0.99, "strom_service_request_queue_seconds", "service"),
                        "{{service}} loop",
                    ),
                    (
                        by_node(
                            quantile(
                                0.99, "strom_storage_append_queue_seconds", "cluster, instance"
                            )
                        ),
                        f"append {NODE}",
                    ),
                ],
                unit="s",
            ),
            P(
                "timeseries",
                "ProduceRecords: appended here or forwarded",
                "Partition batches of RecordService ProduceRecords calls by where the receiving "
                "node sent them: appended in-process (it leads the partition) or forwarded to "
                "the leader. Callers that route by leader (docs/grpc-clients.md) keep "
                "'forwarded' near zero; a forward costs both nodes a gRPC call.",
                [
                    (
                        rate_by("strom_storage_records_routed_partitions_total", "route"),
                        "{{route}}",
                    ),
                ],
                unit="ops",
            ),
            P(
                "timeseries",
                "Garbage-collection pauses",
                "Share of time each role's processes stood still in Python's garbage collector, by "
                "generation (2 = full); the event loop answers nothing meanwhile.",
                [
                    (
                        rate_by("strom_service_gc_pause_seconds_sum", "service, generation"),
                        "{{service}} gen {{generation}}",
                    ),
                ],
                unit="percentunit",
            ),
        ],
    ),
    (
        "etcd",
        [
            P(
                "timeseries",
                "etcd request latency (p99)",
                "By role and operation.",
                [
                    (
                        quantile(0.99, "strom_metadata_etcd_request_seconds", "service, op"),
                        "{{service}} {{op}}",
                    )
                ],
                unit="s",
            ),
            P(
                "timeseries",
                "etcd requests",
                "By role and operation.",
                [
                    (
                        rate_by("strom_metadata_etcd_request_seconds_count", "service, op"),
                        "{{service}} {{op}}",
                    )
                ],
                unit="reqps",
            ),
            P(
                "timeseries",
                "etcd errors and lease trouble",
                "Failed requests, failed lease refreshes and leases lost, by role.",
                [
                    (rate_by("strom_metadata_etcd_errors_total", "service"), "errors {{service}}"),
                    (
                        rate_by("strom_metadata_lease_keepalive_failures_total", "service"),
                        "keep-alive failures {{service}}",
                    ),
                    (
                        rate_by("strom_metadata_leases_lost_total", "service"),
                        "leases lost {{service}}",
                    ),
                ],
                unit="ops",
            ),
            P(
                "timeseries",
                "Metadata watch resets",
                "Watches that re-read etcd from scratch, by role and reason: `compacted` (etcd "
                "dropped the history a watch resumed from; it follows again after a resync), "
                "`history_lost` (etcd's revision went below one already seen: etcd wiped or "
                "restored from an older backup; alert StromEtcdHistoryLost).",
                [
                    (
                        rate_by("strom_metadata_watch_resets_total", "service, reason"),
                        "{{service}} {{reason}}",
                    ),
                ],
                unit="ops",
            ),
        ],
    ),
    (
        "Process resources",
        [
            P(
                "timeseries",
                "CPU by process",
                "CPU seconds per second.",
                [
                    (
                        "sum by (service, instance) "
                        f"(rate(process_cpu_seconds_total[{RI}]) {ROLE})",
                        "{{service}} {{instance}}",
                    )
                ],
                unit="percentunit",
            ),
            P(
                "timeseries",
                "Resident memory by process",
                "",
                [
                    (
                        f"sum by (service, instance) (process_resident_memory_bytes {ROLE})",
                        "{{service}} {{instance}}",
                    )
                ],
                unit="bytes",
            ),
            P(
                "timeseries",
                "Open file descriptors",
                "",
                [
                    (
                        f"sum by (service, instance) (process_open_fds {ROLE})",
                        "{{service}} {{instance}}",
                    )
                ],
            ),
            P(
                "timeseries",
                "Data disk free",
                "Free share of each storage node's data-dir file system (alert below 10%).",
                [
                    (
                        f"strom_storage_data_dir_free_bytes{{{C}}} / "
                        f"strom_storage_data_dir_size_bytes{{{C}}}",
                        "{{instance}}",
                    )
                ],
                unit="percentunit",
            ),
        ],
    ),
]


def _target(i: int, expr: str, legend: str, kind: str) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(chr(ord("A") + i)).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if kind == "heatmap":
        q = q.format(pm.PromQueryFormat.HEATMAP)
    elif kind == "stat":
        q = q.instant()
    return q


def _panel(p: P) -> object:
    if p.kind == "stat":
        b = stat.Panel()
    elif p.kind == "heatmap":
        b = (
            heatmap.Panel()
            .calculate(False)
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges"))
            .y_axis(heatmap.YAxisConfig().unit(p.unit))
        )
    else:
        b = timeseries.Panel()
    b = b.title(p.title).datasource(DS).unit(p.unit).span(p.width).height(p.height)
    if p.description:
        b = b.description(p.description)
    steps = p.extra.get("thresholds")
    if steps:
        b = b.thresholds(
            gd.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in steps])  # type: ignore[union-attr]
        )
    for i, (expr, legend) in enumerate(p.queries):
        b = b.with_target(_target(i, expr, legend, p.kind))
    return b


def build() -> dict:
    """The dashboard as Grafana's JSON model."""
    d = (
        gd.Dashboard("strom")
        .uid(UID)
        .description(
            "strom cluster overview: health, topics, replication, consumer groups, "
            "latency, etcd and process resources"
        )
        .tags(["strom"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .editable()
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            gd.QueryVariable("cluster")
            .label("Cluster")
            .datasource(DS)
            .query("label_values(strom_build_info, cluster)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
        )
        .with_variable(
            gd.QueryVariable("topic")
            .label("Topic")
            .datasource(DS)
            .query(f"label_values(strom_storage_bytes_in_total{{{C}}}, topic)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    for row_title, panels in PANELS:
        d = d.with_row(gd.Row(row_title))
        for p in panels:
            d = d.with_panel(_panel(p))  # type: ignore[arg-type]
    model = d.build()
    return json.loads(json.dumps(model, cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON files are stale")
    args = parser.parse_args(argv)
    text = render()
    stale = [p for p in OUTPUTS if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(
                f"{p.relative_to(ROOT)} is stale: run {Path(__file__).relative_to(ROOT)}",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for p in OUTPUTS:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
