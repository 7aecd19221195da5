"""What a client process loads: the Producer, Consumer and Admin need gRPC, protobuf and
Arrow, not the serving side (etcd, Prometheus, cryptography, the service runtime). Every
object those add is walked by each of Python's full garbage collections, which pause every
thread of the process (docs/benchmarks.md, "A client's heap")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SERVING_SIDE = (
    "etcd3",
    "cryptography",
    "prometheus_client",
    "grpc_reflection.v1alpha.reflection",
    "strom.service.runtime",
    "strom.metadata.store",
    "strom.security.config",
    "strom.security.acl",
    "strom.security.quotas",
)


def _loaded(code: str) -> list[str]:
    script = f"{code}\nimport sys\nprint(' '.join(m for m in {SERVING_SIDE!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_clients_do_not_load_the_serving_side() -> None:
    assert _loaded("from strom import Admin, Consumer, Producer") == []
    assert _loaded("import strom.client.producer, strom.client.consumer, strom.client.admin") == []
    # The CLI's module too: the benchmarks' consumer process is spawned through it.
    assert _loaded("import strom.cli.main") == []


def test_the_clients_do_not_load_arrows_compute_kernels() -> None:
    """pyarrow.compute is loaded where it is used (send_batch's rows with headers): at the
    top of the producer module it cost every client process ~30-50 ms at start and ~4,700
    objects more for each full collection to walk."""
    code = "from strom import Admin, Consumer, Producer\nimport sys\n"
    code += "print('pyarrow.compute' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_checking_a_client_certificate_loads_no_serving_side(tmp_path: Path) -> None:
    # The client checks its TLS files with the standard library's ssl, not cryptography.
    from strom.devcluster.certs import CertificateAuthority

    ca = CertificateAuthority(tmp_path / "ca")
    alice = ca.issue("alice")
    files = f"{str(ca.ca_file)!r}, {str(alice.cert)!r}, {str(alice.key)!r}"
    check = "from strom import Producer\nfrom strom.security.channel import ChannelSecurity\n"
    check += f"assert ChannelSecurity.from_files({files}).cert"
    assert _loaded(check) == []


def test_the_serving_side_is_still_there_when_asked_for() -> None:
    # strom.security's names load their module on first use.
    assert "strom.security.config" in _loaded("from strom.security import configure")
    assert "strom.security.quotas" in _loaded("from strom.security import QUOTAS")
    import strom.security

    assert strom.security.server_security().tls is False
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        strom.security.nothing  # noqa: B018
