"""Real network partitions with Linux network namespaces (root only).

``NetnsNetwork`` puts each process of a chaos cluster in a namespace of its own, joined to
the host by a veth pair on one bridge (a private /24 in 10.213.0.0/16, the host at ``.1``).
Partitions are routing decisions inside the namespaces, so packets are really dropped and TCP
really retransmits: ``block(a, b)`` adds a blackhole route to b's address in a's namespace
(what a sends to b is lost; for TCP both directions of a connection then stall), ``link(a,
False)`` takes a's interface down (a is cut from everyone, the host's clients included),
``kill_connections(a)`` resets every TCP socket in a's namespace (``ss -K``).

The machine needs ``ip`` (iproute2) and root; :func:`unavailable` says why not otherwise.
``netem`` (delays) is often missing (it is on the development machine), so delays stay with
the proxy. Everything created is named after the owning process id and removed by
:meth:`cleanup`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """None when namespaces can be used here, else the reason."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"scprobe{os.getpid()}"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"ip netns add failed: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class NetnsNetwork:
    """See the module docstring."""

    def __init__(self, tag: str | None = None) -> None:
        pid = os.getpid()
        self.tag = tag or f"sc{pid % 100000}"
        self.subnet = f"10.213.{pid % 200 + 20}"
        self.bridge = f"{self.tag}br"
        self.host_ip = f"{self.subnet}.1"
        self.hosts: dict[str, tuple[str, str, str]] = {}  # name -> (namespace, ip, ifname)
        self.blocked: set[tuple[str, str]] = set()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> str:
        """A namespace for ``name``; its address."""
        index = len(self.hosts) + 10
        ns, ip = f"{self.tag}-{name}", f"{self.subnet}.{index}"
        outside, inside = f"{self.tag}h{index}", f"{self.tag}n{index}"
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", inside)
        _ip("-n", ns, "link", "set", inside, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = (ns, ip, inside)
        return ip

    def address(self, name: str) -> str:
        return self.hosts[name][1]

    def prefix(self, name: str) -> list[str]:
        """The argv prefix that runs a command in ``name``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[name][0]]

    def _target_ip(self, name: str) -> str:
        return self.host_ip if name == "host" else self.hosts[name][1]

    def block(self, src: str, dst: str) -> None:
        """Drop what ``src`` sends to ``dst`` ("host": the clients outside)."""
        if (src, dst) in self.blocked or src == dst:
            return
        ns = self.hosts[src][0]
        _ip("-n", ns, "route", "add", "blackhole", f"{self._target_ip(dst)}/32")
        self.blocked.add((src, dst))

    def unblock(self, src: str, dst: str) -> None:
        if (src, dst) not in self.blocked:
            return
        ns = self.hosts[src][0]
        _ip("-n", ns, "route", "del", "blackhole", f"{self._target_ip(dst)}/32", check=False)
        self.blocked.discard((src, dst))

    def link(self, name: str, up: bool) -> None:
        ns, _, inside = self.hosts[name]
        _ip("-n", ns, "link", "set", inside, "up" if up else "down")
        if up:  # the address's routes go with the link; bring them back
            _ip("-n", ns, "link", "set", "lo", "up", check=False)

    def kill_connections(self, name: str) -> int:
        """Reset every TCP connection in ``name``'s namespace; how many there were."""
        ns = self.hosts[name][0]
        res = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-K", "-t", "state", "established"],
            capture_output=True,
            text=True,
            check=False,
        )
        return max(0, len(res.stdout.strip().splitlines()) - 1)

    def heal(self) -> None:
        for src, dst in list(self.blocked):
            self.unblock(src, dst)
        for name in self.hosts:
            self.link(name, True)

    def cleanup(self) -> None:
        """Delete every namespace, interface and the bridge this network made."""
        for ns, _, _ in self.hosts.values():
            with contextlib.suppress(Exception):
                _ip("netns", "del", ns, check=False)
        for index in range(10, 10 + len(self.hosts)):
            with contextlib.suppress(Exception):
                _ip("link", "del", f"{self.tag}h{index}", check=False)
        with contextlib.suppress(Exception):
            _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()
