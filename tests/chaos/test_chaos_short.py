"""The short chaos run inside ``make test`` (issue 13): about 60 seconds of faults against the
full workload, then the checker. ``make chaos DURATION=20m`` is the long run.

The seed is fixed (``STROM_CHAOS_SEED`` overrides it) so that every ``make test`` plays the
same fault schedule; a failure keeps the history, every process log and the seed under the
test's temporary directory, and ``make chaos SEED=<seed> DURATION=60s`` replays it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.cluster import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SEED = int(os.environ.get("STROM_CHAOS_SEED", "20261123"))
DURATION = os.environ.get("STROM_CHAOS_SHORT", "60s")


@pytest.mark.timeout(900)
def test_short_chaos_run_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos.run",
            "--duration",
            DURATION,
            "--seed",
            str(SEED),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    report_path = out / "report.json"
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0 and report["ok"], (
        f"chaos run failed (seed {SEED}; everything kept in {out}):\n"
        + json.dumps(report["violations"], indent=1)[:6000]
    )
    counts = report["counts"]
    # The run did something worth checking: faults, acknowledged records, consumption,
    # transactions and replicas compared.
    assert sum(report["faults"].values()) >= 8, report["faults"]
    assert counts["acknowledged"] > 1000
    assert counts["records_received"] >= counts["acknowledged"]
    assert counts.get("txn_commit", 0) > 0
    assert counts["replica_batches_compared"] > 0
