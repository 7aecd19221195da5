"""`strom bench goals`: each goal is measured by its documented `strom bench` command, run as a
process against a real cluster, and every line of the report gets its runs' values (no
number is checked against its goal here: performance is measured, not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strom.bench.goals import Goals, table
from strom.devcluster.cluster import LocalCluster

from .test_cluster_cli import strom

pytestmark = pytest.mark.integration


def test_each_one_node_goal_is_measured_by_its_command(
    one_node_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The latency, producer, consumer and commit phases against the session's one-node
    cluster, at the smallest sizes: every goal of theirs gets one value read from its
    command's JSON (a renamed field or a failing command shows here as an error or a
    missing value)."""
    goals = Goals(tmp_path, runs=1, scale=0.001)
    for phase in ("latency", "producer", "consumer", "commits"):
        getattr(goals, phase)(one_node_cluster)
    assert not [(g.text, g.error) for g in goals.goals if g.error]
    by_text = {g.text: g for g in goals.goals}
    assert all(len(g.values) == 1 for g in goals.goals), {t: g.values for t, g in by_text.items()}
    items = {g.item for g in goals.goals}
    assert items == {1, 2, 3}
    lat = [g for g in goals.goals if g.unit == "ms" and g.item == 1]
    assert len(lat) == 11 and all(g.values[0] > 0 for g in lat)
    p50 = by_text["e2e p50 ≤ 1.5 ms at 10,000/s (assigned consumer)"].values[0]
    p99 = by_text["e2e p99 ≤ 5 ms at 10,000/s (assigned consumer)"].values[0]
    assert p50 <= p99
    for text in (
        "≥ 1 M records/s from one producer (keyless)",
        "≥ 1 M records/s from one producer (keyed)",
        "poll() ≥ 1.5 M records/s (500 per poll)",
        "poll_arrow() ≥ 10 M records/s (4 MiB fetches)",
        "send() ≤ 1 µs of caller CPU per record (keyed)",
        "synchronous commit p50 ≤ 2 ms",
        "consume, async commit per 1,000-record poll ≥ 80 % of none",
    ):
        assert by_text[text].values[0] > 0, text
    assert all(g.met() in ("yes", "no", "report") for g in goals.goals)
    keyed = by_text["≥ 1 M records/s from one producer (keyed)"]
    assert keyed.command.startswith("strom bench produce --topic ")
    assert keyed.command.endswith("--keys 1000") and "--bootstrap" not in keyed.command
    report = table(goals.goals, goals.machine)
    assert report.count("\n1 ") == 11 and "poll_arrow() ≥ 10 M records/s" in report
    assert "strom bench consume --topic goal-arrow4" in report


def test_the_command_runs_the_phases_asked_for_and_names_a_bad_one(tmp_path: Path) -> None:
    """`--skip` leaves phases out (here all but the controller and node failovers, which
    start clusters of their own); an unknown phase is one line naming it."""
    out = strom(
        "bench",
        "goals",
        "--runs",
        "1",
        "--scale",
        "0.05",
        "--skip",
        "latency,producer,consumer,commits,rf3,batching",
        "--dir",
        str(tmp_path),
        "--json",
        timeout=600,
    )
    report = json.loads(out.stdout)
    goals = report["goals"]
    assert [g["item"] for g in goals] == [4, 4]
    assert all(len(g["values"]) == 1 and g["values"][0] > 0 and "error" not in g for g in goals)
    assert goals[1]["goal"].startswith("50 partitions re-led")
    assert report["context"]["machine"]["python_loop_ms"] > 0
    assert list(tmp_path.iterdir()) == [], "the clusters' directories were left behind"
    bad = strom("bench", "goals", "--skip", "latency,speed", check=False)
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr
    assert b"strom bench goals: error: --skip speed: not a phase" in bad.stderr
