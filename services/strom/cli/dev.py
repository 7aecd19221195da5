"""``strom dev up`` / ``strom dev down`` / ``strom dev cert``: a local cluster of real
processes, optionally with TLS, mTLS and ACLs (``--tls``) and certificates for its users."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

from strom.argtypes import cluster_name, int_at_least
from strom.devcluster.cluster import (
    DEV_CA,
    STATE_FILE,
    LocalCluster,
    recorded_processes_alive,
    stop_from_state,
)
from strom.devcluster.procs import port_free

DEFAULT_DIR = os.environ.get("STROM_DEV_DIR", "/tmp/strom-dev")
#: The first storage node's port when ``--port`` is not given: Kafka's, so snippets written
#: for a quickstart broker at 127.0.0.1:9092 (the README's) work pasted.
DEFAULT_PORT = 9092
#: The storage nodes' ports of the last ``dev up`` in a directory, kept by ``dev down`` so
#: the next ``dev up`` there listens where an exported STROM_BOOTSTRAP points.
PORTS_FILE = "ports.json"


def add_dev_parser(sub: Any) -> None:
    dev = sub.add_parser(
        "dev", help="run a local cluster (etcd, controllers, storage nodes, coordinators)"
    )
    dsub = dev.add_subparsers(dest="dev_cmd", metavar="ACTION")
    dsub.required = True
    up = dsub.add_parser("up", help="start a local cluster and print its bootstrap address")
    # Bounds in the types: a usage error naming the flag, as for --nodes abc (found from
    # outside: --nodes 0 was a failure, exit 1, under `strom dev`).
    up.add_argument("--nodes", type=int_at_least(1), default=3, help="storage nodes (default 3)")
    up.add_argument(
        "--controllers", type=int_at_least(1), default=2, help="controllers (default 2)"
    )
    up.add_argument(
        "--coordinators", type=int_at_least(0), default=1, help="group coordinators (default 1)"
    )
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"state and data (default {DEFAULT_DIR})")
    up.add_argument(
        "--port",
        type=int_at_least(1, maximum=65535),
        default=None,
        help=f"the first storage node's port (default {DEFAULT_PORT}, or the port it had in "
        f"the last `dev up` of this --dir; when that is taken, a free one, said so). The "
        "other nodes keep their last ports too, where free; other services take free ports",
    )
    up.add_argument(
        "--cluster", default="strom", type=cluster_name, help="cluster name (default strom)"
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every listener and to etcd, client certificates required (mTLS) and "
        "ACLs on; a dev CA in DIR/tls signs the services' and an admin's certificate, "
        "etcd trusts only a CA of its own in DIR/etcd-tls",
    )
    down = dsub.add_parser("down", help="stop the local cluster started with `dev up`")
    down.add_argument("--dir", default=DEFAULT_DIR)
    cert = dsub.add_parser(
        "cert", help="a client certificate from the dev CA of `dev up --tls` (User:CN=NAME)"
    )
    cert.add_argument("name", help="the certificate's CN: the principal is User:CN=NAME")
    cert.add_argument("--dir", default=DEFAULT_DIR)


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def _issue(root: Path, name: str, out: Any) -> int:
    from strom.devcluster.certs import CertificateAuthority

    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"certificate name {name!r}: use letters, digits, '-', '_' or '.'")
    state = root / STATE_FILE
    client_env = json.loads(state.read_text()).get("client_env", {}) if state.exists() else {}
    try:
        ca = CertificateAuthority.load(root / "tls", DEV_CA)
    except FileNotFoundError:
        raise ValueError(
            f"no dev CA in {root / 'tls'}: start the cluster with `strom dev up --tls --dir {root}`"
        ) from None
    pem = ca.issue(name)
    print(f"principal  User:CN={name}", file=out)
    print(f"cert       {pem.cert}", file=out)
    print(f"key        {pem.key}", file=out)
    env = {k: v for k, v in client_env.items() if k in ("STROM_BOOTSTRAP", "STROM_SSL_CAFILE")}
    env.update(STROM_SSL_CERTFILE=str(pem.cert), STROM_SSL_KEYFILE=str(pem.key))
    print("# to act as this principal:", file=out)
    for line in _exports(env):
        print(line, file=out)
    return 0


def _recorded_ports(root: Path) -> dict[int, int]:
    """The storage nodes' ports of the last ``dev up`` in ``root`` (none if unreadable)."""
    try:
        ports = json.loads((root / PORTS_FILE).read_text())["storage-node"]
        return {int(node): int(port) for node, port in ports.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _node_ports(
    root: Path, nodes: int, explicit: int | None
) -> tuple[dict[int, int], dict[int, str]]:
    """The ports to ask for, by node id, and for each node whose wanted port is taken, which
    port that was.

    Node 1: ``--port``, else its last port in ``root``, else 9092; the others: their last
    ports. An explicit ``--port`` that is taken is an error; any other taken port falls back
    to a free one, and the line says which port it was."""
    last = _recorded_ports(root)
    wanted = {node: port for node, port in last.items() if 1 <= node <= nodes}
    if explicit is not None:
        wanted = {node: port for node, port in wanted.items() if port != explicit}
        wanted[1] = explicit
    wanted.setdefault(1, DEFAULT_PORT)
    if explicit is not None and not port_free(explicit):
        raise ValueError(f"--port {explicit}: 127.0.0.1:{explicit} is taken; choose another port")
    taken = {}
    for node in [node for node, port in wanted.items() if not port_free(port)]:
        why = "its port in the last `dev up` here" if node in last else "the default"
        taken[node] = f"port {wanted.pop(node)} ({why})"
    return wanted, taken


def _save_ports(root: Path, cluster: LocalCluster) -> None:
    ports = {str(n.ident): n.port for n in cluster.nodes}
    (root / PORTS_FILE).write_text(json.dumps({"storage-node": ports}, indent=2) + "\n")


def run_dev(args: argparse.Namespace, out: Any) -> int:
    root = Path(args.dir)
    if args.dev_cmd == "up":
        if (root / "cluster.json").exists() and not recorded_processes_alive(root):
            # Left by a cluster whose processes are all gone (a reboot): nothing to stop.
            (root / "cluster.json").unlink()
        if (root / "cluster.json").exists():
            raise ValueError(
                f"a local cluster is already recorded in {root}; "
                f"run `strom dev down --dir {root}` first"
            )
        node_ports, taken = _node_ports(root, args.nodes, args.port)
        cluster = LocalCluster(
            root,
            nodes=args.nodes,
            controllers=args.controllers,
            coordinators=args.coordinators,
            cluster=args.cluster,
            tls=args.tls,
            node_ports=node_ports,
        )
        try:
            cluster.start()
        except BaseException:
            cluster.kill()
            raise
        _save_ports(root, cluster)
        for node, port in taken.items():
            print(
                f"storage node {node}: {port} is taken, so it listens on "
                f"{cluster.node(node).address} instead",
                file=out,
            )
        print(f"etcd       {cluster.etcd.endpoint}", file=out)
        for m in cluster.members:
            print(
                f"{m.kind:<12} {m.ident:<3} {m.address}  metrics :{m.metrics_port}  "
                f"log {m.log_path}",
                file=out,
            )
        print(f"bootstrap: {cluster.bootstrap}", file=out)
        if args.tls:
            print(
                "TLS and mTLS on every listener and to etcd, ACLs on; super users "
                "User:CN=strom (the services) and User:CN=admin (you, below)",
                file=out,
            )
        print(
            f"# the CLI and clients find the cluster with (stop: strom dev down --dir {root}):",
            file=out,
        )
        for line in _exports(cluster.client_env()):
            print(line, file=out)
        return 0
    if args.dev_cmd == "cert":
        return _issue(root, args.name, out)
    stopped = stop_from_state(root)
    for s in stopped:
        print(f"stopped {s}", file=out)
    return 0
