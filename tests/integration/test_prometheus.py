"""A real Prometheus scraping a real local cluster under produce/consume load.

* Every query of every dashboard panel (deploy/grafana/strom-dashboard.json), with the
  template variables filled in as Grafana would, parses and returns at least one number.
* Stopping a storage node (a follower of the other nodes' partitions) fires
  StromUnderReplicatedPartitions, StromNodeDown and StromNodeMissing, the last two naming the
  node by its id and its metrics address; starting it again clears them.
* Every storage node exports its id (strom_storage_node_info), and the alerts' join on it
  names each node; with both controllers up, the standby follows the active one, so
  StromNoStandbyController's expression finds nothing; stopping the standby fires
  StromControllerInstanceDown naming it, and it follows again once restarted.

Alert rules: the test loads deploy/prometheus/strom-alerts.yml and changes only each rule's
``for:`` (to 2 s), writing a test-only copy. The expressions are exactly the shipped ones, so
this proves they match the series a real cluster exports; the real durations (5 minutes
under-replicated, 1 minute node down) are what promtool's unit tests check
(tests/unit/test_alert_rules.py), where time is simulated. Waiting out real 5-minute ``for:``
here would add minutes to the suite and prove nothing more about the expressions.

Set ``STROM_PANEL_REPORT=<file>`` to write each panel's query and returned value as Markdown.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from strom import Admin, Consumer, Producer, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.devcluster.prometheus import (
    PrometheusServer,
    cluster_targets,
    scrape_config,
    values,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "strom-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "strom-alerts.yml"
CLUSTER = "metrics-test"
TOPIC = "load"
#: What $__rate_interval stands for: long enough to hold the whole test's samples, so
#: panels built on rare events (a rebalance at the start) still have them in the window.
RATE_WINDOW = "5m"
#: Each rule's `for:` in the test-only copy (see the module docstring).
TEST_FOR = "2s"


def test_rules(dest: Path) -> Path:
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = TEST_FOR
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


test_rules.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


class Load:
    """A producer and a consumer-group member running until stopped (bounded)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.produced = 0
        self.consumed = 0
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._produce, name="load-produce", daemon=True),
            threading.Thread(target=self._consume, name="load-consume", daemon=True),
        ]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def _produce(self) -> None:
        try:
            with Producer(self.bootstrap, acks="all", linger_ms=5) as p:
                for i in range(200_000):  # bounded; normally stopped long before
                    if self.stop.is_set():
                        break
                    p.send_batch(TOPIC, [b"v%d" % j for j in range(50)])
                    self.produced += 50
                    self.stop.wait(0.05)
                    if i % 20 == 0:
                        p.flush()
        except BaseException as exc:
            self.errors.append(exc)

    def _consume(self) -> None:
        try:
            with Consumer(
                self.bootstrap,
                group_id="dashboard-test",
                client_id="dashboard-consumer",
                auto_offset_reset="earliest",
                auto_commit_interval_ms=500,
            ) as c:
                c.subscribe([TOPIC])
                while not self.stop.is_set():
                    self.consumed += len(c.poll(timeout_ms=200))
        except BaseException as exc:
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root: Path = tmp_path_factory.mktemp("prometheus")
    cluster = LocalCluster(
        root / "c",
        nodes=3,
        controllers=2,
        coordinators=1,
        cluster=CLUSTER,
        node_args=["--replica-lag-time-max-ms", "2000"],
        coordinator_args=["--lag-metrics-interval-s", "1", "--offsets-partitions", "2"],
    )
    prom = None
    load = None
    try:
        cluster.start()
        config = scrape_config(
            CLUSTER,
            cluster_targets(cluster),
            rule_files=[str(test_rules(root / "rules.yml"))],
            interval="1s",
        )
        prom = PrometheusServer(root / "prom", config).start()
        p = prom
        wait_for(
            lambda: len(ups := p.targets_up()) == len(cluster.members) and all(ups.values()),
            timeout=60,
            what="every strom process scraped successfully",
        )
        # Only now, so that the first samples precede the controller's RPCs and the group's
        # first rebalance (a counter's first sample already holding them shows no rate).
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(
                TOPIC, partitions=3, replication_factor=3, config={"min.insync.replicas": "2"}
            )
        load = Load(cluster.bootstrap).start()
        _move_a_partition(cluster)
        yield {"cluster": cluster, "prom": prom, "load": load}
    finally:
        if load is not None:
            load.close()
        if prom is not None:
            prom.stop()
        cluster.kill()


def _move_a_partition(cluster: LocalCluster) -> None:
    """One small reassignment (a partition of a few records on node 1 copied to node 2 too),
    so that the reassignment panels have the series a move exports (node 1 keeps its
    replica: a node that hosts none of a topic's replicas drops the topic's counters)."""
    tp = TopicPartition("moved", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(tp.topic, replica_assignment={0: [1]})
        with Producer(cluster.bootstrap, acks="all") as p:
            p.send_batch(tp.topic, [b"r%d" % i for i in range(100)]).result(timeout=60)
        admin.alter_partition_reassignments({tp: [1, 2]})

        def moved() -> bool:
            p = admin.describe_topic(tp.topic).partitions[0]
            return p.replicas == (1, 2) and not p.adding_replicas and 2 in p.isr

        wait_for(moved, timeout=60, what="the small move done")


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(row, panel title, expr) of every panel target, in dashboard order."""
    d = json.loads(DASHBOARD.read_text())
    out = []
    row = ""
    for p in d["panels"]:
        if p["type"] == "row":
            row = p["title"]
            continue
        for t in p["targets"]:
            out.append((row, p["title"], t["expr"]))
    return out


def grafana_substitute(expr: str) -> str:
    """Fill the template variables as Grafana does for cluster=metrics-test, topic=All."""
    return (
        expr.replace("$cluster", CLUSTER)
        .replace("$topic", ".*")
        .replace("$__rate_interval", RATE_WINDOW)
    )


def test_every_dashboard_query_returns_data(env: dict[str, Any]) -> None:
    prom: PrometheusServer = env["prom"]
    load: Load = env["load"]
    # Load has flowed end to end: records consumed, committed, and lag reported.
    wait_for(lambda: load.consumed > 500, timeout=60, what="the consumer to read records")
    wait_for(
        lambda: prom.query(f'strom_coordinator_consumer_lag{{cluster="{CLUSTER}"}}'),
        timeout=60,
        what="consumer lag to be scraped",
    )
    assert not load.errors, load.errors
    queries = dashboard_queries()
    assert len(queries) >= 40
    results: dict[str, list[float]] = {}

    def all_answer() -> bool:
        missing = []
        for _row, title, expr in queries:
            got = values(prom.query(grafana_substitute(expr)))
            results[expr] = got
            if not got:
                missing.append(f"{title}: {expr}")
        all_answer.missing = missing  # type: ignore[attr-defined]
        return not missing

    # Rates need two scrapes of a counter that exists: wait for the state, not a duration.
    try:
        wait_for(all_answer, timeout=60, what="every dashboard query to return data")
    except Exception:
        pytest.fail("queries without data:\n" + "\n".join(all_answer.missing))  # type: ignore[attr-defined]
    report = os.environ.get("STROM_PANEL_REPORT")
    if report:
        lines = ["| row | panel | query | value |", "| --- | --- | --- | --- |"]
        for row, title, expr in queries:
            shown = ", ".join(f"{v:.4g}" for v in results[expr][:4])
            more = f" (+{len(results[expr]) - 4} series)" if len(results[expr]) > 4 else ""
            lines.append(f"| {row} | {title} | `{expr}` | {shown}{more} |")
        Path(report).write_text("\n".join(lines) + "\n")


def test_alerts_fire_when_a_follower_stops_and_clear_when_it_returns(
    env: dict[str, Any],
) -> None:
    cluster: LocalCluster = env["cluster"]
    prom: PrometheusServer = env["prom"]
    node = cluster.node(3)
    instance = f"127.0.0.1:{node.metrics_port}"
    named = f"strom storage node 3 ({instance}) in cluster {CLUSTER}"
    wait_for(
        lambda: (
            not {a for a, _ in prom.firing()}
            & {"StromUnderReplicatedPartitions", "StromNodeDown", "StromNodeMissing"}
        ),
        timeout=60,
        what="no replication alert before the test",
    )
    assert node.process is not None
    node.process.stop()
    try:
        wait_for(
            lambda: (
                {
                    ("StromUnderReplicatedPartitions", ""),
                    ("StromNodeDown", instance),
                    # The controllers' view (no registration), with the address node 3 had.
                    ("StromNodeMissing", instance),
                }
                <= prom.firing()
            ),
            timeout=90,
            what="StromUnderReplicatedPartitions, StromNodeDown and StromNodeMissing to fire",
        )
        # Both name the node as `strom topics describe` does (3) and as Prometheus does.
        assert summaries(prom, "StromNodeDown") == [f"{named} is down"]
        (missing,) = summaries(prom, "StromNodeMissing")
        assert missing.startswith(f"{named} holds ") and missing.endswith(" not registered")
    finally:
        cluster.restart(node)
    wait_for(
        lambda: (
            not {a for a, _ in prom.firing()}
            & {"StromUnderReplicatedPartitions", "StromNodeDown", "StromNodeMissing"}
        ),
        timeout=120,
        what="the alerts to clear after the node is back in the ISR",
    )
    assert (
        max(
            values(
                prom.query(
                    f'max(strom_controller_under_replicated_partitions{{cluster="{CLUSTER}"}})'
                )
            )
        )
        == 0
    )


def summaries(prom: PrometheusServer, alert: str) -> list[str]:
    """The summaries of ``alert``'s firing instances, as Prometheus rendered them."""
    return [
        a["annotations"]["summary"]
        for a in prom.api("alerts")["alerts"]
        if a["labels"]["alertname"] == alert and a["state"] == "firing"
    ]


def rule_expr(alert: str) -> str:
    """The shipped expression of ``alert``."""
    data = yaml.safe_load(RULES.read_text())
    return next(r["expr"] for g in data["groups"] for r in g["rules"] if r.get("alert") == alert)


def test_storage_nodes_export_their_ids_and_the_alerts_join_on_them(env: dict[str, Any]) -> None:
    """strom_storage_node_info maps each storage target to its node id; StromDiskAlmostFull's
    join, its threshold raised so that every node matches, names every node by id."""
    prom: PrometheusServer = env["prom"]
    cluster: LocalCluster = env["cluster"]
    want = {(f"127.0.0.1:{n.metrics_port}", str(n.ident)) for n in cluster.nodes}

    def ids(expr: str) -> set[tuple[str, str]]:
        return {(r["metric"]["instance"], r["metric"].get("node_id", "")) for r in prom.query(expr)}

    wait_for(
        lambda: ids(f'strom_storage_node_info{{cluster="{CLUSTER}"}}') == want,
        timeout=30,
        what="every storage node's id scraped",
    )
    wait_for(
        lambda: ids(f'strom:storage_node_info:last{{cluster="{CLUSTER}"}}') >= want,
        timeout=30,
        what="the recording rule to name every storage target",
    )
    expr = rule_expr("StromDiskAlmostFull")
    assert "< 0.10)" in expr
    assert ids(expr.replace("< 0.10)", "< 1.01)")) == want


def test_the_standby_controller_follows_the_active_one(env: dict[str, Any]) -> None:
    """strom_controller_following_active: 1 on the standby, 0 on the active; so the standby
    alert (unit-tested firing with promtool) finds nothing on a healthy 2-controller cluster."""
    prom: PrometheusServer = env["prom"]
    following = f'sum(strom_controller_following_active{{cluster="{CLUSTER}"}})'
    wait_for(
        lambda: values(prom.query(following)) == [1.0],
        timeout=60,
        what="the standby controller to follow the active one",
    )
    assert values(prom.query(f'sum(strom_controller_active{{cluster="{CLUSTER}"}})')) == [1.0]
    assert prom.query(rule_expr("StromNoStandbyController")) == []
    assert prom.query(rule_expr("StromControllerInstanceDown")) == []


def test_a_group_committed_past_the_end_fires_its_alert_naming_it(env: dict[str, Any]) -> None:
    """An idle group whose committed offset is past the log end (here set there by hand):
    the coordinator's strom_coordinator_consumer_offset_past_end, through the shipped
    StromConsumerOffsetPastEnd expression, fires naming the group and the topic; the
    dashboard's busy group does not."""
    cluster: LocalCluster = env["cluster"]
    prom: PrometheusServer = env["prom"]
    tp = TopicPartition("past-end", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(tp.topic, partitions=1, replication_factor=3)
        admin.alter_group_offsets("idle-past-end", {tp: 40})
    want = "consumer group idle-past-end committed past the end of past-end"
    wait_for(
        lambda: summaries(prom, "StromConsumerOffsetPastEnd") == [want],
        timeout=60,
        what="StromConsumerOffsetPastEnd firing for the idle group",
    )
    firing = prom.query(rule_expr("StromConsumerOffsetPastEnd"))
    assert [(r["metric"]["group"], values([r])) for r in firing] == [("idle-past-end", [40.0])]


def test_a_standby_controller_down_fires_its_instance_alert(env: dict[str, Any]) -> None:
    """Found from outside: a standby controller killed while the active one was up fired
    nothing. StromControllerInstanceDown names it; once it is back it follows again."""
    prom: PrometheusServer = env["prom"]
    cluster: LocalCluster = env["cluster"]
    active = cluster.active_controller()
    (standby,) = [c for c in cluster.controllers if c is not active]
    instance = f"127.0.0.1:{standby.metrics_port}"
    following = f'sum(strom_controller_following_active{{cluster="{CLUSTER}"}})'
    assert standby.process is not None
    standby.process.stop()
    try:
        wait_for(
            lambda: ("StromControllerInstanceDown", instance) in prom.firing(),
            timeout=60,
            what="StromControllerInstanceDown to fire for the stopped standby",
        )
        assert summaries(prom, "StromControllerInstanceDown") == [
            f"strom controller {instance} in cluster {CLUSTER} is down"
        ]
        assert "StromNoActiveController" not in {a for a, _ in prom.firing()}
    finally:
        cluster.restart(standby)
    wait_for(
        lambda: (
            values(prom.query(following)) == [1.0]
            and "StromControllerInstanceDown" not in {a for a, _ in prom.firing()}
        ),
        timeout=60,
        what="the standby back, following the active controller, and the alert cleared",
    )


def test_every_process_exports_its_security_settings_and_equal_ones_do_not_alert(
    env: dict[str, Any],
) -> None:
    """strom_service_security (a process whose settings differ from the others' serves what
    they refuse: alert StromSecuritySettingsDiffer, unit-tested firing with promtool): here
    every process runs plaintext without ACLs, so each exports 0 for each setting, and the
    alert's expression, evaluated by the real Prometheus, finds nothing."""
    prom, cluster = env["prom"], env["cluster"]
    rule = yaml.safe_load(RULES.read_text())
    expr = next(
        r["expr"]
        for g in rule["groups"]
        for r in g["rules"]
        if r.get("alert") == "StromSecuritySettingsDiffer"
    )
    want = {(s, f"127.0.0.1:{m.metrics_port}") for m in cluster.members for s in SETTINGS}

    def exported() -> set[tuple[str, str]]:
        rows = prom.query(f'strom_service_security{{cluster="{CLUSTER}"}} == 0')
        return {(r["metric"]["setting"], r["metric"]["instance"]) for r in rows}

    wait_for(lambda: exported() >= want, timeout=30, what="every process's settings scraped")
    assert prom.query(f'strom_service_security{{cluster="{CLUSTER}"}} == 1') == []
    assert prom.query(expr) == []


SETTINGS = ("tls", "client_auth", "tokens", "acls")
