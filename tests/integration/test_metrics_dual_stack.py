"""/metrics of a service listening on a wildcard answers over IPv4 and IPv6.

Found from outside: the chart runs every role with ``--listen=0.0.0.0:<port>``, gRPC on
0.0.0.0 takes both IP families, but the metrics listener was handed 0.0.0.0 and listened on
IPv4 only, so on an IPv6-only Kubernetes cluster Prometheus could not scrape any pod.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.devcluster.procs import EtcdServer, ManagedProcess, free_port, wait_for

pytestmark = pytest.mark.integration


def ipv6_loopback() -> bool:
    """Whether this machine has ::1 (the test needs it to reach a listener over IPv6)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def scrape(host: str, port: int) -> bool:
    """Whether http://host:port/metrics answers with strom's series."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        return resp.status == 200 and b"strom_service_" in resp.read()


def refused(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((host.strip("[]"), port)) != 0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def controller(etcd: EtcdServer, listen_host: str, log: Path) -> Iterator[int]:
    """A real controller process listening on ``listen_host``; yields its metrics port."""
    metrics_port = free_port()
    argv = [sys.executable, "-m", "strom.cli.main", "controller", "--etcd", etcd.endpoint]
    argv += ["--listen", f"{listen_host}:{free_port()}", "--metrics-port", str(metrics_port)]
    proc = ManagedProcess("controller", argv, log).start()
    try:
        yield metrics_port
    finally:
        proc.stop()


# skip is justified: ::1 is the machine's (a container may run with IPv6 disabled), not
# something the project's setup provides; the IPv4 side is covered by every other test.
@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
@pytest.mark.parametrize("listen_host", ["0.0.0.0", "[::]"])
def test_metrics_of_a_wildcard_listener_answer_on_both_families(
    etcd: EtcdServer, listen_host: str, tmp_path: Path
) -> None:
    with controller(etcd, listen_host, tmp_path / "controller.log") as port:
        wait_for(lambda: scrape("[::1]", port), timeout=60, what="/metrics over IPv6")
        assert scrape("127.0.0.1", port)


# skip is justified: as above, ::1 is the machine's.
@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_metrics_of_a_loopback_listener_stay_on_its_address(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """A service listening on 127.0.0.1 (strom dev up) serves its metrics there only."""
    with controller(etcd, "127.0.0.1", tmp_path / "controller.log") as port:
        wait_for(lambda: scrape("127.0.0.1", port), timeout=60, what="/metrics over IPv4")
        assert refused("[::1]", port)
