"""The chart's TLS probe (``python -m strom.service.healthcheck`` with the mounted Secret in
``STROM_TLS_*``) tests the service, not the files on disk: a bad renewal, which every service
refuses while serving on with the files it read before, must not fail the probes of every
pod (real etcd, controller and storage node).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from strom.devcluster.certs import CertificateAuthority, Pem
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.security import ChannelSecurity
from tests.conftest import member_metric
from tests.integration.test_tls_rotation import Secret

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[LocalCluster, Secret, CertificateAuthority]]:
    """A controller serving plain TLS and a storage node requiring client certificates, both
    from one Secret, as the chart mounts it in every pod."""
    ca = CertificateAuthority(tmp_path / "certs", "ca")
    secret = Secret(tmp_path / "secret")
    secret.update(ca.issue("strom"), [ca])
    files = ["--tls-cert", secret.path("tls.crt"), "--tls-key", secret.path("tls.key")]
    files += ["--tls-ca", secret.path("ca.crt")]
    admin = ca.issue("admin")
    cluster = LocalCluster(
        tmp_path / "c",
        nodes=1,
        controllers=1,
        coordinators=0,
        node_args=[*files, "--tls-client-auth", "required"],
        controller_args=files,
        security=ChannelSecurity.from_files(ca.ca_file, admin.cert, admin.key),
    )
    try:
        cluster.start()
        yield cluster, secret, ca
    finally:
        cluster.kill()


def probe(secret: Secret, address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The chart's exec probe, run as the pod runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STROM_SSL", "STROM_TOKEN"))}
    env["PYTHONPATH"] = f"{ROOT / 'services'}:{ROOT}"
    env["STROM_TLS_CA"] = secret.path("ca.crt")
    env["STROM_TLS_CERT"] = secret.path("tls.crt")
    env["STROM_TLS_KEY"] = secret.path("tls.key")
    return subprocess.run(
        [sys.executable, "-m", "strom.service.healthcheck", *args, address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def probes(secret: Secret, members: list[Any]) -> list[tuple[Any, tuple[str, ...], Any]]:
    """The liveness and the readiness probe of every member, run at once (each is a Python
    process of its own: one after the other they took most of the test's time)."""
    asked = [(m, args) for m in members for args in ((), ("--service", "strom.ready"))]
    with ThreadPoolExecutor(len(asked)) as pool:
        done = list(pool.map(lambda ma: probe(secret, ma[0].address, *ma[1]), asked))
    return [(m, args, r) for (m, args), r in zip(asked, done, strict=True)]


def test_the_probe_passes_a_serving_service_whatever_the_files_on_disk(secured) -> None:
    cluster, secret, ca = secured
    members = [*cluster.controllers, *cluster.nodes]
    for m, _, r in probes(secret, members):
        assert r.returncode == 0 and "SERVING" in r.stdout, (m.kind, r.stderr)

    good = ca.issue("strom", stem="strom-good")
    expired = ca.issue("strom", expired=True, stem="strom-expired")
    bad_sets = {
        "expired": (expired, "the certificate expired"),
        "not its key": (Pem(good.cert, expired.key), "is not the key of"),
    }
    for refused, (what, (files, why)) in enumerate(bad_sets.items(), 1):
        secret.update(files, [ca])
        # Every service refuses the set and keeps serving with the files it read before.
        for m in members:
            service = m.kind.split("-")[0]
            wait_for(
                lambda m=m, service=service, refused=refused: (
                    member_metric(m, "strom_service_tls_reload_errors_total", service=service)
                    >= refused
                ),
                timeout=30,
                what=f"{m.kind} refusing the {what} set",
            )
        for m, args, r in probes(secret, members):
            assert r.returncode == 0, (what, m.kind, args, r.stdout, r.stderr)
            assert "SERVING" in r.stdout
            # The service's own names for the files, not a client's setting it never set.
            assert "ssl_certfile" not in r.stdout + r.stderr
            if "its TLS listener answers" in r.stdout:
                assert "STROM_TLS_" in r.stdout and why in r.stdout, r.stdout

    # Nothing listening: the fallback does not make the probe pass.
    cluster.nodes[0].process.kill()  # type: ignore[union-attr]
    r = probe(secret, cluster.nodes[0].address)
    assert r.returncode == 1, r.stdout
    assert "STROM_TLS_KEY" in r.stderr and "is not the key of STROM_TLS_CERT" in r.stderr
