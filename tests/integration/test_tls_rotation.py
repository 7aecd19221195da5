"""Certificates rotate without a restart: a service serves, and dials the others with, the
TLS files in force when a connection is made (real etcd, controller and storage nodes).

The files live as Kubernetes mounts a Secret: ``tls.crt`` is a symlink through ``..data``
to a timestamped directory, and an update swaps ``..data`` in one rename.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from strom.client import Admin, Producer
from strom.client.cluster import ClusterClient
from strom.devcluster.certs import CertificateAuthority, Pem
from strom.devcluster.cluster import LocalCluster, grpc_serving
from strom.devcluster.procs import wait_for
from strom.errors import StromError
from strom.security import ChannelSecurity
from tests.conftest import member_metric

pytestmark = pytest.mark.integration

EXPIRY = "strom_service_tls_certificate_expiry_timestamp_seconds"


class Secret:
    """A directory laid out as a mounted Kubernetes Secret (tls.crt, tls.key, ca.crt)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.version = 0
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (root / name).symlink_to(Path("..data") / name)

    def update(self, cert: Pem, cas: list[CertificateAuthority]) -> None:
        """Write a new version and swap it in at once, as the kubelet does."""
        self.version += 1
        data = self.root / f"..v{self.version}"
        data.mkdir()
        shutil.copyfile(cert.cert, data / "tls.crt")
        shutil.copyfile(cert.key, data / "tls.key")
        (data / "ca.crt").write_bytes(b"".join(ca.ca_file.read_bytes() for ca in cas))
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(data.name)
        os.replace(tmp, self.root / "..data")

    def path(self, name: str) -> str:
        return str(self.root / name)


def not_after(pem: Pem) -> float:
    return x509.load_pem_x509_certificate(pem.cert.read_bytes()).not_valid_after_utc.timestamp()


@pytest.fixture
def rotation(tmp_path: Path) -> Iterator[tuple[LocalCluster, Secret, dict[str, object]]]:
    certs = tmp_path / "certs"
    old_ca = CertificateAuthority(certs, "old-ca")
    new_ca = CertificateAuthority(certs, "new-ca")
    old = old_ca.issue("strom", days=30, stem="strom-old")
    new = new_ca.issue("strom", days=20, stem="strom-new")
    admin = new_ca.issue("admin")  # trusted before and after the rotation
    secret = Secret(tmp_path / "secret")
    secret.update(old, [old_ca, new_ca])
    flags = [
        "--tls-cert",
        secret.path("tls.crt"),
        "--tls-key",
        secret.path("tls.key"),
        "--tls-ca",
        secret.path("ca.crt"),
        "--tls-client-auth",
        "required",
    ]
    both = tmp_path / "both-cas.crt"
    both.write_bytes(old_ca.ca_file.read_bytes() + new_ca.ca_file.read_bytes())
    admin_security = ChannelSecurity.from_files(both, admin.cert, admin.key)
    cluster = LocalCluster(
        tmp_path / "c",
        nodes=2,
        controllers=1,
        coordinators=0,
        node_args=[*flags, "--replica-lag-time-max-ms", "1000"],
        controller_args=flags,
        security=admin_security,
    )
    try:
        cluster.start()
        yield (
            cluster,
            secret,
            {
                "old": old,
                "new": new,
                "new_ca": new_ca,
                "admin": admin,
                "admin_security": admin_security,
                "admin_files": {
                    "ssl_cafile": str(both),
                    "ssl_certfile": str(admin.cert),
                    "ssl_keyfile": str(admin.key),
                },
                "new_only": ChannelSecurity.from_files(new_ca.ca_file, admin.cert, admin.key),
            },
        )
    finally:
        cluster.kill()


def _isr(cluster: LocalCluster, security: ChannelSecurity, topic: str) -> tuple[int, int, list]:
    with ClusterClient(cluster.bootstrap, security=security, retry_s=5) as c:
        p = c.topic_metadata(topic).partitions[0]
        return p.leader, p.leader_epoch, sorted(p.isr)


def test_a_renewed_certificate_is_served_and_dialled_with_without_a_restart(rotation) -> None:
    cluster, secret, f = rotation
    admin_security: ChannelSecurity = f["admin_security"]  # type: ignore[assignment]
    new_only: ChannelSecurity = f["new_only"]  # type: ignore[assignment]
    members = [*cluster.controllers, *cluster.nodes]
    for m in members:
        assert member_metric(m, EXPIRY, service=m.kind.split("-")[0]) == pytest.approx(
            not_after(f["old"])  # type: ignore[arg-type]
        )
    with Admin(cluster.bootstrap, **f["admin_files"]) as admin:  # type: ignore[arg-type]
        admin.create_topic("rot", partitions=1, replication_factor=2)
    leader, _, isr = wait_for(
        lambda: (r := _isr(cluster, admin_security, "rot"))[0] >= 0 and len(r[2]) == 2 and r,
        timeout=30,
        what="rot fully in sync",
    )
    follower = cluster.node(next(n for n in isr if n != leader))
    # The leader reports an ISR expansion to the controller once before the rotation, so its
    # channel to the controller exists, made with the old certificate.
    follower.process.kill()  # type: ignore[union-attr]
    wait_for(lambda: _isr(cluster, admin_security, "rot")[2] == [leader], timeout=30, what="shrink")
    follower.start()
    cluster.wait_serving(follower)
    wait_for(lambda: len(_isr(cluster, admin_security, "rot")[2]) == 2, timeout=30, what="expand")
    pids = {m.ident: m.process.pid for m in cluster.nodes}  # type: ignore[union-attr]

    # Nobody trusting only the new CA can connect yet: the old certificate is served.
    with (
        ClusterClient(cluster.bootstrap, security=new_only, retry_s=1, timeout_s=2) as c,
        pytest.raises(StromError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        c.metadata()

    # The renewal: a certificate of the new CA, and only the new CA trusted from now on.
    secret.update(f["new"], [f["new_ca"]])  # type: ignore[arg-type]
    wait_for(
        lambda: all(grpc_serving(m.address, security=new_only) for m in members),
        timeout=30,
        what="every service serving the new certificate",
    )
    for m in members:
        service = m.kind.split("-")[0]
        assert member_metric(m, EXPIRY, service=service) == pytest.approx(not_after(f["new"]))  # type: ignore[arg-type]
        assert member_metric(m, "strom_service_tls_reload_errors_total", service=service) == 0
    assert {m.ident: m.process.pid for m in cluster.nodes} == pids  # type: ignore[union-attr]

    # The follower's fetch channel to the leader was made with the old certificate: when its
    # connection drops (a network blip, here the kernel's socket kill), it must come back with
    # the new one, which the leader now requires (found from outside: the follower kept the
    # old one and never fetched again).
    subprocess.run(
        ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{cluster.node(leader).port}"],
        capture_output=True,
        check=False,
    )
    new_ca: CertificateAuthority = f["new_ca"]  # type: ignore[assignment]
    admin: Pem = f["admin"]  # type: ignore[assignment]
    with Producer(
        cluster.bootstrap,
        ssl_cafile=str(new_ca.ca_file),
        ssl_certfile=str(admin.cert),
        ssl_keyfile=str(admin.key),
        linger_ms=0,
    ) as producer:
        for i in range(5):
            producer.send("rot", b"after %d" % i).result(timeout=30)

    def follower_caught_up() -> bool:
        labels = {"topic": "rot", "partition": "0"}
        end = member_metric(cluster.node(leader), "strom_storage_log_end_offset", **labels)
        return end >= 5 and member_metric(follower, "strom_storage_log_end_offset", **labels) == end

    wait_for(follower_caught_up, timeout=30, what="the follower fetching with the new certificate")

    # A restarted controller trusts only the new CA: the leader's channel to it must be made
    # again with the new certificate for its next ISR change (the follower back in sync,
    # which only the leader reports) to get through.
    cluster.restart(cluster.controllers[0])
    follower.process.kill()  # type: ignore[union-attr]
    wait_for(lambda: _isr(cluster, new_only, "rot")[2] == [leader], timeout=30, what="shrink")
    follower.start()
    cluster.wait_serving(follower, timeout=30)
    wait_for(
        lambda: len(_isr(cluster, new_only, "rot")[2]) == 2,
        timeout=30,
        what="the leader's ISR expansion reaching the restarted controller",
    )
