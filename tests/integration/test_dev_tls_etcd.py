"""``strom dev up --tls``: etcd trusts a CA of its own, so an application's certificate from
``strom dev cert`` (signed by the dev CA) cannot reach etcd and write the ACLs stored there
directly; the services, holding an etcd client certificate from etcd's CA, work as before.

Found from outside: etcd trusted the dev CA with ``--client-cert-auth``, so every
application certificate had full etcd access and could bypass the ACLs.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom import Admin, Consumer, Producer
from strom.cli.dev import run_dev
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for

pytestmark = pytest.mark.integration

ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("dev-tls"), nodes=1, controllers=1, tls=True)
    try:
        c.start()
        yield c
    finally:
        c.kill()


def etcdctl(
    cluster: LocalCluster, cert: Path, key: Path, *args: str, verify: bool = True
) -> subprocess.CompletedProcess:
    """etcdctl against the cluster's etcd over TLS with a client certificate, verifying etcd
    by its own CA (``verify=False``: not at all, as an attacker who only wants in would)."""
    ca = cluster.root / "etcd-tls" / "strom-dev-etcd-ca.crt"
    return subprocess.run(
        [
            ETCDCTL,
            f"--endpoints=https://{cluster.etcd.endpoint}",
            f"--cacert={ca}" if verify else "--insecure-skip-tls-verify",
            f"--cert={cert}",
            f"--key={key}",
            "--command-timeout=5s",
            "--dial-timeout=5s",
            *args,
        ],
        env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_application_certificate_is_refused_by_etcd(cluster: LocalCluster) -> None:
    out = io.StringIO()
    args = Namespace(dev_cmd="cert", name="mallory", dir=str(cluster.root))
    assert run_dev(args, out) == 0
    tls = cluster.root / "tls"
    key = "/strom/strom/acls/mallory"
    mallory = tls / "mallory.crt", tls / "mallory.key"
    proc = etcdctl(cluster, *mallory, "put", key, "allow-all", verify=False)
    assert proc.returncode != 0, proc.stdout
    # The services' etcd client certificate is accepted, and the refused write did not land.
    etcd_tls = cluster.root / "etcd-tls"
    proc = etcdctl(cluster, etcd_tls / "strom.crt", etcd_tls / "strom.key", "get", key)
    assert proc.returncode == 0, proc.stderr
    assert "allow-all" not in proc.stdout
    # The admin's certificate for the strom listeners is from the dev CA too: refused as well.
    admin = Path(cluster.tls_files["cert"]), Path(cluster.tls_files["key"])
    assert etcdctl(cluster, *admin, "get", key, verify=False).returncode != 0


def test_the_services_still_work(cluster: LocalCluster) -> None:
    client = {
        "ssl_cafile": cluster.tls_files["ca"],
        "ssl_certfile": cluster.tls_files["cert"],
        "ssl_keyfile": cluster.tls_files["key"],
    }
    with Admin(cluster.bootstrap, **client) as admin:
        admin.create_topic("etcd-ca", partitions=1, replication_factor=1)
    with Producer(cluster.bootstrap, **client, acks="all") as p:
        assert p.send("etcd-ca", b"x").result(30).offset == 0
    # A group's commit goes through the coordinator, which keeps its shards' ownership in etcd.
    with Consumer(cluster.bootstrap, **client, group_id="g", auto_offset_reset="earliest") as c:
        c.subscribe(["etcd-ca"])
        got = wait_for(lambda: c.poll(1000), timeout=60, what="the record")
        assert [r.value for r in got] == [b"x"]
        c.commit()


def test_every_service_reports_when_its_etcd_certificate_expires(cluster: LocalCluster) -> None:
    """The etcd client certificate had no expiry gauge (only --tls-cert did), so nothing
    warned before etcd would refuse the services (StromEtcdCertificateExpiresSoon)."""
    from cryptography import x509

    from tests.conftest import member_metric

    pem = (cluster.root / "etcd-tls" / "strom.crt").read_bytes()
    end = x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    name = "strom_service_etcd_certificate_expiry_timestamp_seconds"
    for m in [*cluster.controllers, *cluster.nodes, *cluster.coordinators]:
        assert member_metric(m, name, service=m.kind.split("-")[0]) == pytest.approx(end)
