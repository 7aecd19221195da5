"""docs/security.md's worked example, run as it stands: a ``strom dev up --tls`` cluster,
certificates per application, ACLs from a file, produce and consume as different
principals, refusals that name what is missing, a quota."""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

import pytest

from strom.devcluster.cluster import STATE_FILE, stop_from_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def example() -> str:
    text = DOC.read_text()
    block = re.search(
        r"<!-- example: start -->\s*```sh\n(.*?)```\s*<!-- example: end -->", text, re.S
    )
    assert block, "docs/security.md lost its worked example markers"
    return block.group(1)


def test_the_worked_example_of_docs_security_runs(tmp_path: Path) -> None:
    root = tmp_path / "strom-secure"
    script = example().replace("/tmp/strom-secure", str(root))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    try:
        proc = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        if (root / STATE_FILE).exists():  # the script failed before `strom dev down`
            with contextlib.suppress(Exception):
                stop_from_state(root)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for expected in (
        "created topic orders (3 partitions, replication factor 3)",
        "principal  User:CN=orders-service",
        "applied: ALLOW User:CN=orders-service WRITE on TOPIC 'orders'",
        "applied: ALLOW User:CN=billing READ on GROUP prefix 'billing-'",
        "produced 3 records to orders",
        "o-1\no-2\no-3\n",
        "AUTHORIZATION_FAILED: User:CN=orders-service is not allowed READ on topic 'orders'",
        "AUTHORIZATION_FAILED: User:CN=billing is not allowed DELETE on topic 'orders'",
        "User:CN=orders-service  1048576      -          -",
        "stopped etcd",
    ):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert out.count("refused, as it should be") == 2
    assert "Traceback" not in out
    assert not (root / STATE_FILE).exists()  # `strom dev down` stopped it all
    # Every service of the cluster served TLS with client certificates and ACLs.
    logs = sorted(root.glob("*-[0-9].log"))
    assert len(logs) == 6  # 2 controllers, 3 nodes, a coordinator
    for log in logs:
        assert "(TLS, client certificates required, ACLs on (2 super users))" in log.read_text()
