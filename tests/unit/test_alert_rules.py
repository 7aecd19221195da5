"""deploy/prometheus/strom-alerts.yml: valid rules, each unit-tested firing and not firing.

The unit tests themselves are promtool's (deploy/prometheus/tests/*.test.yml: one file per
concern, strom-alerts.test.yml the first): synthetic series, evaluated by Prometheus' own rule
engine with the real ``for:`` durations.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "strom-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "strom-alerts.test.yml"
#: Every promtool test file (the redundancy alerts have theirs: strom-alerts-redundancy).
ALL_RULE_TESTS = sorted(RULE_TESTS.parent.glob("*.test.yml"))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: The alerts the operations issue asks for (offline; under-min-ISR; under-replicated > 5 min;
#: no active controller or more than one; a node down; lag growing; etcd errors; disk).
REQUIRED = {
    "StromOfflinePartitions",
    "StromUnderMinIsrPartitions",
    "StromUnderReplicatedPartitions",
    "StromNoActiveController",
    "StromMultipleActiveControllers",
    "StromNodeDown",
    "StromConsumerLagGrowing",
    "StromEtcdErrors",
    "StromDiskAlmostFull",
    # A controller or coordinator down while others of its kind are up, no standby controller
    # following the active one, an unclean leader election (found from outside: none fired).
    "StromControllerInstanceDown",
    "StromCoordinatorInstanceDown",
    "StromNoStandbyController",
    "StromUncleanLeaderElection",
}


def alerts() -> dict[str, dict]:
    data = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in data["groups"] for r in g["rules"] if "alert" in r}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_rules_are_valid_and_cover_the_issue() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = alerts()
    assert set(found) >= REQUIRED, REQUIRED - set(found)
    assert found["StromUnderReplicatedPartitions"]["for"] == "5m"
    assert found["StromConsumerLagGrowing"]["for"] == "10m"
    for name, rule in found.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        # An aggregation must keep `cluster`, or one Prometheus watching two clusters mixes them.
        for clause in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            assert "cluster" in clause, f"{name} aggregates away `cluster`"


def test_promtool_unit_tests_pass() -> None:
    assert len(ALL_RULE_TESTS) >= 2, ALL_RULE_TESTS
    proc = promtool("test", "rules", *(p.name for p in ALL_RULE_TESTS), cwd=RULE_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(ALL_RULE_TESTS), proc.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    tests = [t for p in ALL_RULE_TESTS for t in yaml.safe_load(p.read_text())["tests"]]
    fires: set[str] = set()
    silent: set[str] = set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    assert set(alerts()) <= fires, set(alerts()) - fires
    assert set(alerts()) <= silent, set(alerts()) - silent


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: the same file with one expected value changed does."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "strom-alerts.yml").write_text(RULES.read_text())
    broken = RULE_TESTS.read_text().replace(
        "strom cluster prod: 3 partitions have no leader",
        "strom cluster prod: 4 partitions have no leader",
    )
    (tmp_path / "rules" / "t.yml").write_text(broken)
    proc = promtool("test", "rules", "t.yml", cwd=tmp_path / "rules")
    assert proc.returncode != 0
    assert "StromOfflinePartitions" in proc.stdout + proc.stderr


def test_example_prometheus_config_is_valid_and_uses_the_job_names() -> None:
    from strom.devcluster.prometheus import JOBS

    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    proc = promtool("check", "config", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = {j["job_name"] for j in yaml.safe_load(config.read_text())["scrape_configs"]}
    assert jobs == set(JOBS.values())
