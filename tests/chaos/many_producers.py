"""Measure a storage node's memory under many concurrent producers (issue 13).

``python -m tests.chaos.many_producers --producers 1000 --seconds 60``

Starts a one-node cluster, then ``--workers`` processes that each run their share of
idempotent producers (acks=all; each with its own connection, producer id and sequence
state on the node) sending ``--size``-byte records every ``--interval-ms``. The
node's resident memory (VmRSS), open file descriptors and threads are sampled twice a second;
the summary gives them before, at the peak and at the end, with records acknowledged and
errors. This is a measurement, not a test: numbers depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
        elif key == "Threads":
            out[key] = int(value)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def _worker(
    bootstrap: str, topic: str, n: int, first: int, seconds: float, size: int, interval: float, q
) -> None:
    import strom.client.cluster as cluster_mod
    from strom import Producer

    # gRPC shares one connection between channels of a process that have the same target;
    # a local subchannel pool per channel gives every producer its own, as separate client
    # processes would have.
    cluster_mod.GRPC_OPTIONS = (*cluster_mod.GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
    producers = [
        Producer(bootstrap, acks="all", linger_ms=5, client_id=f"many-{first + i}")
        for i in range(n)
    ]
    acked = errors = 0
    lock = threading.Lock()

    def done(_md: object, exc: BaseException | None) -> None:
        nonlocal acked, errors
        with lock:
            if exc is None:
                acked += 1
            else:
                errors += 1

    payload = os.urandom(size)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        for p in producers:
            p.send(topic, payload, callback=done)
        # time is the behaviour: pacing the load to its rate, not waiting for a condition.
        time.sleep(max(0.0, interval - (time.monotonic() - t0)))
    for p in producers:
        p.flush(timeout=60)
        p.close(timeout=10)
    q.put({"acked": acked, "errors": errors})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.many_producers", description=__doc__)
    ap.add_argument("--producers", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--size", type=int, default=1000, help="record bytes")
    ap.add_argument("--interval-ms", type=float, default=500, help="per producer")
    ap.add_argument("--partitions", type=int, default=8)
    args = ap.parse_args(argv)

    from strom import Admin
    from strom.devcluster.cluster import LocalCluster

    root = Path(tempfile.mkdtemp(prefix="strom-many-"))
    cluster = LocalCluster(root / "c", nodes=1, controllers=1, coordinators=0)
    cluster.start()
    try:
        node = cluster.nodes[0]
        pid = node.process.pid  # type: ignore[union-attr]
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("many", partitions=args.partitions, replication_factor=1)
        before = _status(pid)
        samples: list[dict[str, int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                samples.append(_status(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        q: multiprocessing.Queue = multiprocessing.Queue()
        per = args.producers // args.workers
        procs = [
            multiprocessing.Process(
                target=_worker,
                args=(
                    cluster.bootstrap,
                    "many",
                    per,
                    w * per,
                    args.seconds,
                    args.size,
                    args.interval_ms / 1000.0,
                    q,
                ),
            )
            for w in range(args.workers)
        ]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        results = [q.get(timeout=args.seconds + 600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        elapsed = time.monotonic() - t0
        stop.set()
        sampler.join()
        after = _status(pid)
        peak = max(samples, key=lambda s: s["VmRSS"]) if samples else after
        summary = {
            "producers": per * args.workers,
            "seconds": round(elapsed, 1),
            "acknowledged": sum(r["acked"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "node_rss_mib": {
                "before": before["VmRSS"] >> 20,
                "peak": peak["VmRSS"] >> 20,
                "end": after["VmRSS"] >> 20,
                "high_water_mark": after["VmHWM"] >> 20,
            },
            "node_fds_peak": max((s["fds"] for s in samples), default=after["fds"]),
            "node_threads_peak": max((s["Threads"] for s in samples), default=after["Threads"]),
            "node_alive": node.alive(),
        }
        print(json.dumps(summary, indent=1))
        return 0 if node.alive() else 1
    finally:
        cluster.kill()


if __name__ == "__main__":
    sys.exit(main())
