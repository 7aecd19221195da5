"""Shared helpers for the chart tests: render helm/strom with the bootstrap-installed helm."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "strom"
#: Value sets the chart is checked with, besides the defaults.
VALUE_SETS = {
    "default": [],
    "external-etcd": [CHART / "ci" / "external-etcd-values.yaml"],
    "zones-5-nodes": [CHART / "ci" / "zones-values.yaml"],
    "tls-and-monitoring": [CHART / "ci" / "tls-values.yaml"],
}


def helm_binary() -> str:
    """helm from scripts/bootstrap.sh (.venv/bin/helm), else from PATH."""
    local = Path(sys.executable).parent / "helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if not found:
        raise AssertionError(
            "helm is missing: run scripts/bootstrap.sh (it installs .venv/bin/helm)"
        )
    return found


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def render(
    values: list[Path],
    *,
    release: str = "strom",
    namespace: str = "streaming",
    sets: list[str] | None = None,
) -> list[dict[str, Any]]:
    """``helm template`` → the manifests (parsed)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for v in values:
        args += ["-f", str(v)]
    for s in sets or []:
        args += ["--set", s]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]
