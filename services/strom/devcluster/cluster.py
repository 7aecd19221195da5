"""A local strom cluster of real processes: etcd, controllers, storage nodes and group
coordinators.

``strom dev up`` starts one and leaves it running (its state, PIDs and ports, goes to
``<dir>/cluster.json`` for ``strom dev down``); the integration tests start one per test on
free ports and can kill, pause and restart any member.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.devcluster.procs import (
    ClusterError,
    EtcdServer,
    ManagedProcess,
    ProcessExited,
    free_port,
    reserve_ports,
    wait_for,
)
from strom.security import ChannelSecurity

STATE_FILE = "cluster.json"
#: Name of the certificate authority ``strom dev up --tls`` makes (``<dir>/tls/<name>.crt``).
DEV_CA = "strom-dev-ca"
#: The separate CA of etcd's server and client certificates (``<dir>/etcd-tls/<name>.crt``):
#: etcd trusts only it, so a certificate from ``strom dev cert`` cannot reach etcd.
DEV_ETCD_CA = "strom-dev-etcd-ca"


def grpc_serving(
    address: str, timeout: float = 1.0, security: ChannelSecurity | None = None
) -> bool:
    """True when the gRPC health service at ``address`` says SERVING."""
    with (security or ChannelSecurity()).channel(address) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class Member:
    """One strom service process of the cluster."""

    kind: str  # "controller" | "storage-node" | "coordinator"
    ident: int
    port: int
    metrics_port: int
    argv: list[str]
    log_path: Path
    process: ManagedProcess | None = None
    extra: dict[str, str] = field(default_factory=dict)
    #: Environment variables of this process only (on top of this one's).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = ManagedProcess(
            f"{self.kind}-{self.ident}", self.argv, self.log_path, env=self.env or None
        ).start()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


class LocalCluster:
    """etcd + ``controllers`` controllers + ``nodes`` storage nodes + ``coordinators`` group
    coordinators under ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 3,
        controllers: int = 2,
        cluster: str = "strom",
        racks: list[str] | None = None,
        node_args: list[str] | None = None,
        controller_args: list[str] | None = None,
        python: str = sys.executable,
        coordinators: int = 1,
        coordinator_args: list[str] | None = None,
        coordinator_env: dict[str, str] | None = None,
        security: ChannelSecurity | None = None,
        etcd_tls: tuple[Path, Path, Path] | None = None,
        tls: bool = False,
        etcd_args: list[str] | None = None,
        node_ports: dict[int, int] | None = None,
    ) -> None:
        """``node_ports``: the listen port of these storage nodes (by node id; the caller
        checked they are free); every other port is a free one (what tests want)."""
        self.root = Path(root)
        self.node_ports = dict(node_ports or {})
        reserve_ports(list(self.node_ports.values()))
        #: How this process reaches the services (TLS / tokens when they require them).
        self.security = security
        self.cluster_name = cluster
        self.python = python
        #: With ``tls``: the dev CA's files and the admin client's (see :meth:`_secure`).
        self.tls_files: dict[str, str] = {}
        common: list[str] = []
        if tls:
            common, etcd_tls = self._secure()
        self.etcd = EtcdServer(self.root, tls=etcd_tls, args=etcd_args or ())
        self.controllers: list[Member] = []
        self.nodes: list[Member] = []
        self.node_args = [*common, *(node_args or [])]
        self.controller_args = [*common, *(controller_args or [])]
        self.coordinator_args = [*common, *(coordinator_args or [])]
        #: Environment variables of the coordinator processes only (tests: a clock offset).
        self.coordinator_env = dict(coordinator_env or {})
        self.coordinators: list[Member] = []
        for i in range(controllers):
            self.controllers.append(self._controller(i))
        for i in range(nodes):
            rack = racks[i % len(racks)] if racks else None
            self.nodes.append(self._node(i + 1, rack))
        for i in range(coordinators):
            self.coordinators.append(self._coordinator(i))

    def _secure(self) -> tuple[list[str], tuple[Path, Path, Path]]:
        """TLS everywhere, as a production cluster would run: a dev CA under ``root/tls``
        signs the services' certificate (CN=strom) and an admin client's (CN=admin);
        listeners require client certificates (mTLS) and ACLs are on with both as super
        users. etcd gets a CA of its own under ``root/etcd-tls`` (its server certificate
        and the services' etcd client certificate) and trusts only that one: with the dev
        CA, any application certificate from ``strom dev cert`` could write the ACLs in
        etcd directly and bypass them (found from outside). Returns the services' flags
        and etcd's (cert, key, CA)."""
        from strom.devcluster.certs import CertificateAuthority

        ca = CertificateAuthority(self.root / "tls", DEV_CA)
        service, admin = ca.issue("strom"), ca.issue("admin")
        etcd_ca = CertificateAuthority(self.root / "etcd-tls", DEV_ETCD_CA)
        etcd_server, etcd_client = etcd_ca.issue("etcd"), etcd_ca.issue("strom")
        self.tls_files = {
            "ca": str(ca.ca_file),
            "cert": str(admin.cert),
            "key": str(admin.key),
        }
        if self.security is None:
            self.security = ChannelSecurity.from_files(ca.ca_file, admin.cert, admin.key)
        flags = [
            f"--tls-cert={service.cert}",
            f"--tls-key={service.key}",
            f"--tls-ca={ca.ca_file}",
            "--tls-client-auth=required",
            "--acls",
            "--super-users=User:CN=strom;User:CN=admin",
            f"--etcd-ca={etcd_ca.ca_file}",
            f"--etcd-cert={etcd_client.cert}",
            f"--etcd-key={etcd_client.key}",
        ]
        return flags, (etcd_server.cert, etcd_server.key, etcd_ca.ca_file)

    def client_env(self) -> dict[str, str]:
        """``STROM_*`` settings a client (the CLI, Producer, Consumer, Admin) needs to reach
        this cluster: the bootstrap, and with ``tls`` the CA and the admin's certificate."""
        env = {"STROM_BOOTSTRAP": self.bootstrap}
        if self.tls_files:
            env.update(
                STROM_SSL_CAFILE=self.tls_files["ca"],
                STROM_SSL_CERTFILE=self.tls_files["cert"],
                STROM_SSL_KEYFILE=self.tls_files["key"],
            )
        return env

    def _service_argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "strom.cli.main", *args]

    def _role(self, kind: str, i: int, *args: str, env: dict[str, str] | None = None) -> Member:
        """Controller or coordinator ``i`` (``kind``), on fresh ports, with ``args`` after
        what every such member is given (its etcd, address, metrics port, cluster, id)."""
        port, mport = free_port(), free_port()
        argv = self._service_argv(
            kind,
            "--etcd",
            self.etcd.endpoint,
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-port",
            str(mport),
            "--cluster",
            self.cluster_name,
            f"--{kind}-id",
            str(i),
            *args,
        )
        log = self.root / f"{kind}-{i}.log"
        return Member(kind, i, port, mport, argv, log, env=env if env is not None else {})

    def _controller(self, i: int) -> Member:
        return self._role("controller", i, *self.controller_args)

    def _coordinator(self, i: int) -> Member:
        return self._role(
            "coordinator",
            i,
            # Internal topics get every node up to 3 (as Kafka's dev configs do), and the
            # coordinator waits for that many before creating them.
            "--offsets-replication-factor",
            str(max(1, min(3, len(self.nodes)))),
            *self.coordinator_args,
            env=self.coordinator_env,
        )

    def _node(self, node_id: int, rack: str | None) -> Member:
        port, mport = self.node_ports.get(node_id) or free_port(), free_port()
        argv = self._service_argv(
            "storage-node",
            "--node-id",
            str(node_id),
            "--data-dir",
            str(self.root / f"node-{node_id}"),
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-port",
            str(mport),
            "--etcd",
            self.etcd.endpoint,
            "--cluster",
            self.cluster_name,
            *(["--rack", rack] if rack else []),
            *self.node_args,
        )
        return Member(
            "storage-node",
            node_id,
            port,
            mport,
            argv,
            self.root / f"node-{node_id}.log",
            extra={"rack": rack or ""},
        )

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def start(self, timeout: float = 60.0) -> LocalCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        for m in self.members:
            m.start()
        for m in self.members:
            self.wait_serving(m, timeout)
        self.wait_cluster_ready(timeout)
        if self.coordinators:
            self.wait_coordinators_ready(timeout)
        self.save_state()
        return self

    @property
    def members(self) -> list[Member]:
        """Every strom process: controllers, storage nodes, coordinators."""
        return [*self.controllers, *self.nodes, *self.coordinators]

    def wait_serving(self, m: Member, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if m.process is None:
                raise ProcessExited(f"{m.kind} {m.ident} was not started")
            if not m.alive():
                raise m.process.exited(f"{m.kind} {m.ident}")
            return grpc_serving(m.address, security=self.security)

        wait_for(ready, timeout=timeout, what=f"{m.kind} {m.ident} on {m.address} to serve")

    def wait_cluster_ready(self, timeout: float = 30.0) -> None:
        """An active controller exists and every live node is registered."""
        from strom.client.cluster import ClusterClient

        live = {n.ident for n in self.nodes if n.alive()}

        def ready() -> bool:
            with ClusterClient(self.bootstrap, retry_s=0.5, security=self.security) as c:
                md = c.metadata()
                return (
                    md.HasField("controller")
                    and md.controller.port > 0
                    and ({n.node_id for n in md.nodes} >= live)
                )

        wait_for(ready, timeout=timeout, what="an active controller and all nodes registered")

    def coordinator_shards(self) -> dict[int, tuple[str, int]] | None:
        """Shard -> (owner address, epoch) from the controller, or None while
        ``__consumer_offsets`` does not exist yet."""
        from strom.api import controller_pb2
        from strom.client.cluster import ClusterClient
        from strom.errors import StromError

        with ClusterClient(self.bootstrap, retry_s=1, security=self.security) as c:
            md = c.metadata(["__consumer_offsets"])
            topic = next((t for t in md.topics if t.name == "__consumer_offsets"), None)
            if topic is None or topic.error_code != 0 or not topic.partitions:
                return None
            try:
                resp = c.controller_call(
                    "DescribeCluster",
                    controller_pb2.DescribeClusterRequest(include_coordinators=True),
                )
            except StromError:
                return None
        owners = {o.shard: (f"{o.host}:{o.port}", o.epoch) for o in resp.coordinator_shards}
        return {p.partition: owners.get(p.partition, ("", -1)) for p in topic.partitions}

    def wait_coordinators_ready(self, timeout: float = 30.0) -> dict[int, tuple[str, int]]:
        """Every shard of ``__consumer_offsets`` is owned by a live coordinator and loaded
        (its published epoch is >= 0), and spread over the live coordinators as they spread
        them (none holds more than the rounded-down share while another holds less), so no
        shard moves right after this returns."""
        live = {m.address for m in self.coordinators if m.alive()}

        def ready() -> dict[int, tuple[str, int]] | None:
            shards = self.coordinator_shards()
            if not shards:
                return None
            if not all(addr in live and epoch >= 0 for addr, epoch in shards.values()):
                return None
            counts = Counter(addr for addr, _ in shards.values())
            share = len(shards) // max(1, len(live))
            held = [counts.get(addr, 0) for addr in live]
            if max(held) > share and min(held) < share:
                return None
            return shards

        return wait_for(ready, timeout=timeout, what="every coordinator shard owned and loaded")

    def stop(self) -> None:
        """SIGTERM everything (coordinators first, then nodes, so they shut down cleanly),
        then etcd."""
        for m in [*self.coordinators, *self.nodes, *self.controllers]:
            if m.process:
                m.process.stop()
        self.etcd.stop()

    def kill(self) -> None:
        for m in [*self.coordinators, *self.nodes, *self.controllers]:
            if m.process:
                m.process.kill()
        self.etcd.kill()

    # -- chaos helpers for tests -----------------------------------------------------------

    def node(self, node_id: int) -> Member:
        for n in self.nodes:
            if n.ident == node_id:
                return n
        raise KeyError(node_id)

    def restart(self, m: Member, timeout: float = 30.0) -> None:
        if m.process:
            m.process.stop()
        m.start()
        self.wait_serving(m, timeout)

    def add_coordinator(self, timeout: float = 30.0) -> Member:
        """Start one more group coordinator (it takes free shards, e.g. after a handover)."""
        m = self._coordinator(max((c.ident for c in self.coordinators), default=-1) + 1)
        self.coordinators.append(m)
        m.start()
        self.wait_serving(m, timeout)
        return m

    def active_controller(self) -> Member | None:
        from strom.client.cluster import ClusterClient

        with ClusterClient(self.bootstrap, retry_s=2, security=self.security) as c:
            md = c.metadata()
        for m in self.controllers:
            if md.HasField("controller") and md.controller.port == m.port:
                return m
        return None

    # -- state file for `strom dev down` ---------------------------------------------------

    def save_state(self) -> None:
        state = {
            "cluster": self.cluster_name,
            "bootstrap": self.bootstrap,
            "etcd": {
                "endpoint": self.etcd.endpoint,
                "pid": self.etcd.process.pid if self.etcd.process else None,
            },
            "members": [
                {
                    "kind": m.kind,
                    "id": m.ident,
                    "address": m.address,
                    "metrics_port": m.metrics_port,
                    "pid": m.process.pid if m.process else None,
                    "log": str(m.log_path),
                    # To restart a member by hand as `dev up` started it (its flags included).
                    "argv": list(m.argv),
                }
                for m in self.members
            ],
            "started": time.time(),
            "client_env": self.client_env(),
        }
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped by us) counts as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _recorded(root: Path) -> list[dict[str, Any]]:
    """The processes ``root/cluster.json`` lists (stop order: coordinators, storage nodes,
    controllers, etcd), each with the port its command line must name."""
    path = Path(root) / STATE_FILE
    if not path.exists():
        raise ClusterError(f"no local cluster recorded in {root} (no {STATE_FILE})")
    state = json.loads(path.read_text())
    members = [m for m in state["members"] if m.get("pid")]
    order = [m for m in members if m["kind"] == "coordinator"]
    order += [m for m in members if m["kind"] == "storage-node"]
    order += [m for m in members if m["kind"] not in ("storage-node", "coordinator")]
    if state["etcd"].get("pid"):
        etcd = state["etcd"]
        order.append({"kind": "etcd", "id": 0, "pid": etcd["pid"], "address": etcd["endpoint"]})
    return order


def _still_ours(m: dict[str, Any]) -> bool:
    """Whether the recorded process still runs and is the one recorded: after a reboot (or
    long after) its pid may belong to another program, which must not be signalled. A
    member's command line names the port it listens on."""
    pid = int(m["pid"])
    if not _pid_alive(pid):
        return False
    port = str(m.get("address", "")).rsplit(":", 1)[-1]
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return bool(port) and f":{port}" in cmdline


def recorded_processes_alive(root: Path) -> bool:
    """Whether any process of the cluster recorded in ``root`` still runs."""
    return any(_still_ours(m) for m in _recorded(root))


def _restarted_as(m: dict[str, Any]) -> list[int]:
    """Pids of running processes that serve as member ``m`` without being the recorded one:
    a member restarted by hand from its recorded command (docs tell testers to), whose pid
    ``cluster.json`` does not know. A member's command line has ``--listen <its address>``
    (etcd's names its client port); nothing else on the machine can hold that port."""
    address = str(m.get("address", ""))
    port = address.rsplit(":", 1)[-1]
    if not port:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), int(m["pid"])):
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if m["kind"] == "etcd":
            ours = Path(args[0]).name == "etcd" and any(f":{port}" in a for a in args)
        else:
            ours = any(a == "--listen" and b == address for a, b in itertools.pairwise(args))
            # A storage node names its data dir too: a port like 9092, which every `dev up`
            # wants, may now be another cluster's node, which must be left alone.
            ours = ours and _same_flag(args, m.get("argv") or [], "--data-dir")
        if ours and _pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _same_flag(args: list[str], recorded: list[str], flag: str) -> bool:
    """Whether ``args`` give ``flag`` the value the recorded command line gave it (true when
    the recorded one has no such flag)."""

    def value(argv: list[str]) -> str | None:
        return next((b for a, b in itertools.pairwise(argv) if a == flag), None)

    want = value(list(recorded))
    return want is None or value(args) == want


def _stop_pid(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_from_state(root: Path, timeout: float = 15.0) -> list[str]:
    """Stop the processes listed in ``root/cluster.json`` (SIGTERM, then SIGKILL), and the
    members restarted by hand from their recorded commands (found from outside: they kept
    running after ``strom dev down``, and nothing recorded them any more); a pid now held
    by another program is left alone."""
    path = Path(root) / STATE_FILE
    stopped = []
    for m in _recorded(root):
        pid = int(m["pid"])
        if _still_ours(m):
            _stop_pid(pid, timeout)
            stopped.append(f"{m['kind']} {m['id']} (pid {pid})")
        for other in _restarted_as(m):
            _stop_pid(other, timeout)
            stopped.append(f"{m['kind']} {m['id']} (pid {other}, restarted by hand)")
    path.unlink()
    return stopped
