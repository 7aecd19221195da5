"""``strom dev up`` / ``strom dev down``: a local cluster of real processes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from strom.devcluster.cluster import LocalCluster, stop_from_state

DEFAULT_DIR = os.environ.get("STROM_DEV_DIR", "/tmp/strom-dev")


def add_dev_parser(sub: Any) -> None:
    dev = sub.add_parser(
        "dev", help="run a local cluster (etcd, controllers, storage nodes, coordinators)"
    )
    dsub = dev.add_subparsers(dest="dev_cmd", metavar="ACTION")
    dsub.required = True
    up = dsub.add_parser("up", help="start a local cluster and print its bootstrap address")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--controllers", type=int, default=2)
    up.add_argument("--coordinators", type=int, default=1, help="group coordinators (default 1)")
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"state and data (default {DEFAULT_DIR})")
    up.add_argument("--cluster", default="strom")
    down = dsub.add_parser("down", help="stop the local cluster started with `dev up`")
    down.add_argument("--dir", default=DEFAULT_DIR)


def run_dev(args: argparse.Namespace, out: Any) -> int:
    root = Path(args.dir)
    if args.dev_cmd == "up":
        if args.nodes < 1 or args.controllers < 1:
            raise ValueError("--nodes and --controllers must be at least 1")
        if args.coordinators < 0:
            raise ValueError("--coordinators must be at least 0")
        if (root / "cluster.json").exists():
            raise ValueError(
                f"a local cluster is already recorded in {root}; "
                f"run `strom dev down --dir {root}` first"
            )
        cluster = LocalCluster(
            root,
            nodes=args.nodes,
            controllers=args.controllers,
            coordinators=args.coordinators,
            cluster=args.cluster,
        )
        try:
            cluster.start()
        except BaseException:
            cluster.kill()
            raise
        print(f"etcd       {cluster.etcd.endpoint}", file=out)
        for m in cluster.members:
            print(
                f"{m.kind:<12} {m.ident:<3} {m.address}  metrics :{m.metrics_port}  "
                f"log {m.log_path}",
                file=out,
            )
        print(f"bootstrap: {cluster.bootstrap}", file=out)
        print(
            f"(export STROM_BOOTSTRAP={cluster.bootstrap}; stop with "
            f"`strom dev down --dir {root}`)",
            file=out,
        )
        return 0
    stopped = stop_from_state(root)
    for s in stopped:
        print(f"stopped {s}", file=out)
    return 0
