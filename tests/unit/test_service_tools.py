"""The small programs the image and the chart run besides the services: the zone-to-rack init
container (strom.service.kube_zone). The selftest is run by the chart test
(tests/integration/test_helm_processes.py) and the health check by test_dockerfile.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from strom.service import kube_zone
from strom.service.config import parse_with_sources
from strom.storage.cli import build_parser


def test_zone_label_becomes_the_storage_nodes_rack(tmp_path: Path) -> None:
    node = {"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "eu-west-1b"}}}
    assert kube_zone.zone_of(node) == "eu-west-1b"
    legacy = {"metadata": {"labels": {"failure-domain.beta.kubernetes.io/zone": "z1"}}}
    assert kube_zone.zone_of(legacy) == "z1"
    assert kube_zone.zone_of({"metadata": {"labels": {}}}) is None
    out = tmp_path / "node" / "rack.yaml"
    kube_zone.write_config(out, "eu-west-1b")
    assert yaml.safe_load(out.read_text()) == {"rack": "eu-west-1b"}
    # The storage node reads it as its --config file, exactly as the chart passes it.
    args = parse_with_sources(
        build_parser(),
        ["--node-id", "0", "--data-dir", str(tmp_path), "--etcd", "e:2379", f"--config={out}"],
    )
    assert args.rack == "eu-west-1b"
    kube_zone.write_config(out, None)
    args = parse_with_sources(
        build_parser(),
        ["--node-id", "0", "--data-dir", str(tmp_path), "--etcd", "e:2379", f"--config={out}"],
    )
    assert args.rack is None


def test_kube_zone_outside_a_pod_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert kube_zone.main([str(tmp_path / "r.yaml")]) == 1
    assert "NODE_NAME is not set" in capsys.readouterr().err
    monkeypatch.setenv("NODE_NAME", "n1")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kube_zone.main([str(tmp_path / "r.yaml")]) == 1
    assert "not running in a pod" in capsys.readouterr().err
    assert kube_zone.main([]) == 2
