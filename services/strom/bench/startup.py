"""``strom bench startup``: how a storage node's start-up grows with the bytes of log it holds.

One local cluster (one node, replication factor 1). The bench writes ``gib`` GiB of 1 KiB
records over ``partitions`` partitions, then restarts the node twice per trial: after SIGKILL
(recovery: the logs were not closed cleanly) and after SIGTERM (a clean stop). Each restart is
timed from the new process's start to serving gRPC and to leading all its partitions again (its
``strom_storage_partitions{role="leader"}`` gauge), i.e. the logs are open and serve.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from strom.bench.scale import wait_hosted
from strom.client.admin import Admin
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster

RECORD = b"v" * 1024
CHUNK = 8192  # records per send_batch


def bench_startup(
    gib: float, partitions: int, trials: int = 1, directory: str | None = None
) -> list[dict[str, float | str]]:
    """Rows of (how the node was stopped, GiB on disk, seconds to serving, to leading all)."""
    root = Path(tempfile.mkdtemp(prefix="strom-startup-", dir=directory))
    cluster = LocalCluster(root / "c", nodes=1, controllers=1, coordinators=0)
    rows: list[dict[str, float | str]] = []
    try:
        cluster.start()
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("startup", partitions=partitions, replication_factor=1)
        total, sent = int(gib * (1 << 30)), 0
        chunk = [RECORD] * CHUNK
        with Producer(cluster.bootstrap, acks="all", batch_size=1 << 20) as p:
            while sent < total:
                for q in range(partitions):
                    p.send_batch("startup", chunk, partition=q)
                    sent += CHUNK * len(RECORD)
            p.flush()
        node = cluster.nodes[0]
        wait_hosted(cluster, partitions, 60, "the node leading all")
        data = root / "c" / f"node-{node.ident}"  # the node's data dir: its segments
        on_disk = sum(f.stat().st_size for f in data.rglob("*.log")) / (1 << 30)
        for _ in range(trials):
            for how in ("SIGKILL", "SIGTERM"):
                assert node.process is not None
                if how == "SIGKILL":
                    node.process.kill()
                else:
                    node.process.stop()
                t0 = time.monotonic()
                node.start()
                cluster.wait_serving(node, timeout=1800)
                serving = time.monotonic() - t0
                wait_hosted(cluster, partitions, 1800, "all led")
                rows.append(
                    {
                        "stop": how,
                        "gib": round(on_disk, 2),
                        "partitions": partitions,
                        "serving_s": round(serving, 3),
                        "leading_s": round(time.monotonic() - t0, 3),
                    }
                )
                print(
                    f"{how:<8} {on_disk:.2f} GiB in {partitions} partitions: serving after "
                    f"{serving:.2f} s, leading all after {rows[-1]['leading_s']:.2f} s",
                    flush=True,
                )
        return rows
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)
