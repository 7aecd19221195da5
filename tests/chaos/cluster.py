"""The chaos cluster: a 3-member etcd, controllers, storage nodes and coordinators as real
processes on loopback, every address behind the fault-injecting proxy (tests/chaos/proxy.py).

Each process listens on its own port and *advertises* a proxy port (storage nodes,
controllers and coordinators through ``--advertise``, etcd through its advertised client and
peer URLs), so every byte between processes, and from clients, passes the proxy, which knows
the sender and the receiver of each connection by process id. Each strom service also gets a
clock-offset file (``STROM_TEST_CLOCK_OFFSET_FILE``, see ``strom.clock``) the nemesis writes
to jump its wall clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strom.clock import OFFSET_ENV
from strom.devcluster.cluster import grpc_serving
from strom.devcluster.procs import (
    ETCD_INSTALL_HINT,
    ClusterError,
    ManagedProcess,
    ProcessExited,
    free_port,
    port_open,
    wait_for,
)
from tests.chaos.netns import NetnsNetwork
from tests.chaos.netns import unavailable as netns_unavailable

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "chaos"


class ProxyControl:
    """The proxy process and its JSON-lines control channel (stdin/stdout)."""

    def __init__(self, log_path: Path) -> None:
        self._lock = threading.Lock()
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the proxy
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.proxy"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )

    def command(self, **msg: Any) -> dict[str, Any]:
        with self._lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise ClusterError("the chaos proxy exited")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise ClusterError(f"proxy refused {msg}: {answer.get('error')}")
        return answer

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._log.close()


@dataclass
class Proc:
    """One process of the cluster (a service or etcd member), by its proxy name."""

    name: str  # "etcd-0", "controller-0", "node-1", "coordinator-0"
    kind: str  # "etcd" | "controller" | "storage-node" | "coordinator"
    port: int  # where it listens
    proxy_port: int  # what it advertises
    argv: list[str]
    log_path: Path
    data_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    clock_file: Path | None = None
    process: ManagedProcess | None = None
    paused: bool = False
    extra_ports: dict[str, int] = field(default_factory=dict)
    host: str = "127.0.0.1"  # its namespace's address in netns mode

    @property
    def address(self) -> str:
        """The advertised address (the proxy's port; in netns mode its own)."""
        return f"{self.host}:{self.proxy_port}"

    @property
    def direct(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.alive() and self.process else None


class ChaosCluster:
    """See the module docstring. ``root`` holds data dirs, logs and clock files.

    ``network="netns"`` puts every process in a network namespace of its own instead
    (tests/chaos/netns.py; root only): partitions are then routing decisions, and the proxy
    is not used.
    """

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        controllers: int = 2,
        coordinators: int = 2,
        etcd_members: int = 3,
        coordinator_args: Iterable[str] = (),
        node_args: Iterable[str] = (),
        controller_args: Iterable[str] = (),
        network: str = "proxy",
    ) -> None:
        if shutil.which("etcd") is None:
            raise ClusterError(ETCD_INSTALL_HINT)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "clock").mkdir(exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        self.network = network
        self.net: NetnsNetwork | None = None
        self.proxy: ProxyControl | None = None
        if network == "netns":
            reason = netns_unavailable()
            if reason is not None:
                raise ClusterError(f"network namespaces are not available here: {reason}")
            self.net = NetnsNetwork()
        elif network == "proxy":
            self.proxy = ProxyControl(self.root / "logs" / "proxy.log")
        else:
            raise ValueError(f"network must be 'proxy' or 'netns', not {network!r}")
        self.procs: dict[str, Proc] = {}
        self.lock = threading.RLock()
        self.etcd = [self._etcd(i, etcd_members) for i in range(etcd_members)]
        endpoints = ",".join(p.address for p in self.etcd)
        self.etcd_endpoints = endpoints
        self.controllers = [
            self._controller(i, endpoints, controller_args) for i in range(controllers)
        ]
        self.nodes = [self._node(i + 1, endpoints, node_args) for i in range(nodes)]
        self.coordinators = [
            self._coordinator(i, endpoints, min(3, nodes), coordinator_args)
            for i in range(coordinators)
        ]
        for p in self.procs.values():
            if self.proxy is None:
                break
            answer = self.proxy.command(
                cmd="listen", name=p.name, upstream=p.port, port=p.proxy_port
            )
            p.proxy_port = answer["port"]
            if "peer" in p.extra_ports:
                self.proxy.command(
                    cmd="listen",
                    name=p.name,
                    upstream=p.extra_ports["peer"],
                    port=p.extra_ports["peer_proxy"],
                )

    # -- process definitions -----------------------------------------------------------------

    def _add(self, p: Proc) -> Proc:
        self.procs[p.name] = p
        return p

    def _host(self, name: str) -> str:
        """Where ``name`` listens: loopback, or its own namespace's address."""
        return self.net.add(name) if self.net is not None else "127.0.0.1"

    def _ports(self) -> tuple[int, int]:
        """(listen port, advertised port): the proxy's in front, or the same one."""
        port = free_port()
        return port, (free_port() if self.proxy is not None else port)

    def _clock(self, name: str) -> tuple[Path, dict[str, str]]:
        path = self.root / "clock" / f"{name}.ms"
        path.write_text("0")
        return path, {OFFSET_ENV: str(path)}

    def _etcd(self, i: int, n: int) -> Proc:
        name = f"etcd-{i}"
        # Addresses are fixed up front: every member's argv names every member's peer URL.
        if not hasattr(self, "_etcd_ports"):
            self._etcd_ports = [(*self._ports(), *self._ports()) for _ in range(n)]
            self._etcd_hosts = [self._host(f"etcd-{j}") for j in range(n)]
        client, client_proxy, peer, peer_proxy = self._etcd_ports[i]
        host = self._etcd_hosts[i]
        cluster = ",".join(
            f"etcd-{j}=http://{self._etcd_hosts[j]}:{ports[3]}"
            for j, ports in enumerate(self._etcd_ports)
        )
        data = self.root / name
        argv = [
            shutil.which("etcd") or "etcd",
            "--name", name,
            "--data-dir", str(data),
            "--listen-client-urls", f"http://{host}:{client}",
            "--advertise-client-urls", f"http://{host}:{client_proxy}",
            "--listen-peer-urls", f"http://{host}:{peer}",
            "--initial-advertise-peer-urls", f"http://{host}:{peer_proxy}",
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", "strom-chaos",
            "--log-level", "warn",
        ]  # fmt: skip
        return self._add(
            Proc(
                name,
                "etcd",
                client,
                client_proxy,
                argv,
                self.root / "logs" / f"{name}.log",
                data_dir=data,
                extra_ports={"peer": peer, "peer_proxy": peer_proxy},
                host=host,
            )
        )

    def _service(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "strom.cli.main", *args]

    def _controller(self, i: int, etcd: str, extra: Iterable[str]) -> Proc:
        name = f"controller-{i}"
        port, proxy_port = self._ports()
        host = self._host(name)
        clock, env = self._clock(name)
        argv = self._service(
            "controller", "--etcd", etcd, "--listen", f"{host}:{port}",
            "--advertise", f"{host}:{proxy_port}", "--metrics-port", "-1",
            "--cluster", CLUSTER, "--controller-id", str(i), *extra,
        )  # fmt: skip
        return self._add(
            Proc(name, "controller", port, proxy_port, argv, self.root / "logs" / f"{name}.log",
                 env=env, clock_file=clock, host=host)
        )  # fmt: skip

    def _node(self, node_id: int, etcd: str, extra: Iterable[str]) -> Proc:
        name = f"node-{node_id}"
        port, proxy_port = self._ports()
        host = self._host(name)
        clock, env = self._clock(name)
        data = self.root / name
        argv = self._service(
            "storage-node", "--node-id", str(node_id), "--data-dir", str(data),
            "--listen", f"{host}:{port}", "--advertise", f"{host}:{proxy_port}",
            "--metrics-port", "-1", "--etcd", etcd, "--cluster", CLUSTER, *extra,
        )  # fmt: skip
        return self._add(
            Proc(name, "storage-node", port, proxy_port, argv, self.root / "logs" / f"{name}.log",
                 data_dir=data, env=env, clock_file=clock, host=host)
        )  # fmt: skip

    def _coordinator(self, i: int, etcd: str, rf: int, extra: Iterable[str]) -> Proc:
        name = f"coordinator-{i}"
        port, proxy_port = self._ports()
        host = self._host(name)
        clock, env = self._clock(name)
        argv = self._service(
            "coordinator", "--etcd", etcd, "--listen", f"{host}:{port}",
            "--advertise", f"{host}:{proxy_port}", "--metrics-port", "-1",
            "--cluster", CLUSTER, "--coordinator-id", str(i),
            "--offsets-replication-factor", str(rf), *extra,
        )  # fmt: skip
        return self._add(
            Proc(name, "coordinator", port, proxy_port, argv, self.root / "logs" / f"{name}.log",
                 env=env, clock_file=clock, host=host)
        )  # fmt: skip

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def services(self) -> list[Proc]:
        return [*self.controllers, *self.nodes, *self.coordinators]

    def start(self, timeout: float = 120.0) -> ChaosCluster:
        self.start_etcd(timeout)
        for p in self.services:
            self.launch(p)
        for p in self.services:
            self.wait_serving(p, timeout)
        return self

    def start_etcd(self, timeout: float = 120.0) -> None:
        for p in self.etcd:
            self.launch(p)
        wait_for(
            lambda: all(port_open(p.host, p.port) for p in self.etcd),
            timeout=timeout,
            what="the etcd members to listen",
        )
        self.wait_etcd_healthy(timeout)

    def launch(self, p: Proc) -> None:
        """Start ``p`` (again) and tell the proxy its pid."""
        with self.lock:
            if p.alive():
                return
            argv = p.argv if self.net is None else [*self.net.prefix(p.name), *p.argv]
            p.process = ManagedProcess(p.name, argv, p.log_path, env=p.env).start()
            p.paused = False
            if self.proxy is not None:
                self.proxy.command(cmd="pid", pid=p.process.pid, name=p.name)

    def register_client(self, name: str, pid: int) -> None:
        if self.proxy is not None:
            self.proxy.command(cmd="pid", pid=pid, name=name)

    def wait_serving(self, p: Proc, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if not p.alive():
                # ProcessExited, not ClusterError: wait_for gives up at once on it, instead
                # of retrying a dead process until its timeout.
                raise ProcessExited(
                    f"{p.name} exited during start:\n{p.process and p.process.log_tail()}"
                )
            return grpc_serving(p.direct)

        wait_for(ready, timeout=timeout, what=f"{p.name} to serve", interval=0.2)

    def wait_etcd_healthy(self, timeout: float = 60.0) -> None:
        import etcd3

        def healthy() -> bool:
            ok = 0
            for p in self.etcd:
                if not p.alive() or p.paused:
                    continue
                c = etcd3.client(p.host, p.port, timeout=2)
                try:
                    c.status()
                    ok += 1
                finally:
                    c.close()
            return ok >= len(self.etcd) // 2 + 1

        wait_for(healthy, timeout=timeout, what="an etcd quorum", interval=0.3)

    def kill(self, p: Proc) -> None:
        with self.lock:
            if p.process is not None:
                p.process.kill()
            p.paused = False

    def pause(self, p: Proc) -> None:
        with self.lock:
            if p.alive():
                p.process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
                p.paused = True

    def resume(self, p: Proc) -> None:
        with self.lock:
            if p.alive():
                p.process.signal(signal.SIGCONT)  # type: ignore[union-attr]
            p.paused = False

    def wipe(self, p: Proc) -> None:
        """Kill ``p`` and delete its data dir (a replaced disk); start it with ``launch``."""
        assert p.data_dir is not None
        self.kill(p)
        shutil.rmtree(p.data_dir, ignore_errors=True)

    def set_clock(self, p: Proc, offset_ms: int) -> None:
        if p.clock_file is not None:
            tmp = p.clock_file.with_suffix(".tmp")
            tmp.write_text(str(int(offset_ms)))
            os.replace(tmp, p.clock_file)

    def stop(self) -> None:
        """SIGTERM the services (coordinators, nodes, controllers), then etcd; SIGCONT first."""
        for p in self.procs.values():
            if p.paused:
                self.resume(p)
        for group in (self.coordinators, self.nodes, self.controllers, self.etcd):
            live = [p.process for p in group if p.process is not None and p.process.alive()]
            for proc in live:  # the whole group at once, then wait for each
                proc.signal(signal.SIGTERM)
            for proc in live:
                proc.stop(timeout=20)

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.paused:
                self.resume(p)
            if p.process is not None:
                p.process.kill()
        if self.proxy is not None:
            self.proxy.close()
        if self.net is not None:
            self.net.cleanup()

    def by_name(self, name: str) -> Proc:
        return self.procs[name]

    def each(self, kinds: Iterable[str]) -> list[Proc]:
        ks = set(kinds)
        return [p for p in self.procs.values() if p.kind in ks]

    def until(self, condition: Callable[[], Any], *, timeout: float, what: str) -> Any:
        return wait_for(condition, timeout=timeout, what=what, interval=0.25)

    def now(self) -> float:
        return time.time()
