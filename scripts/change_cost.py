"""How much one metadata change costs a storage node beside many partitions.

Against a running one-node cluster (``strom dev up --dir D --nodes 1 --controllers 1``):
creates a topic of ``--partitions`` partitions, waits until the node leads them all and is
idle, then creates ``--changes`` single-partition topics one after another, each waited for
in the node's Metadata, and prints the node's CPU per created topic (from ``/proc``) and the
created -> led latencies. docs/benchmarks.md ("The storage node's cost per change") has the
numbers::

    .venv/bin/python scripts/change_cost.py --dir D --partitions 10000 --changes 30
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import grpc

from strom.api import storage_pb2, storage_pb2_grpc
from strom.client.admin import Admin


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path, help="the `strom dev up --dir` directory")
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--changes", type=int, default=30)
    ap.add_argument("--prefix", default="change-cost")
    args = ap.parse_args()

    info = json.loads((args.dir / "cluster.json").read_text())
    node = next(m for m in info["members"] if m["kind"] == "storage-node")
    stub = storage_pb2_grpc.StorageServiceStub(grpc.insecure_channel(node["address"]))

    def led(topic: str) -> bool:
        md = stub.Metadata(storage_pb2.MetadataRequest(topics=[topic]), timeout=5)
        t = md.topics[0]
        return t.error_code == 0 and bool(t.partitions) and all(p.leader >= 0 for p in t.partitions)

    def leading() -> int:
        url = f"http://127.0.0.1:{node['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=30) as r:
            m = re.search(r'strom_storage_partitions\{role="leader"\} (\S+)', r.read().decode())
        return int(float(m.group(1))) if m else 0

    big = f"{args.prefix}-big"
    with Admin(info["bootstrap"]) as admin:
        cpu0, t0 = _cpu_s(node["pid"]), time.perf_counter()
        admin.create_topic(big, partitions=args.partitions, replication_factor=1)
        while leading() < args.partitions:
            time.sleep(0.5)
        print(
            f"the {args.partitions}-partition topic: led after {time.perf_counter() - t0:.1f} s, "
            f"node CPU {_cpu_s(node['pid']) - cpu0:.1f} s (the waiting scrapes included)"
        )
        while True:  # idle: under 2 % of a core for a second
            before = _cpu_s(node["pid"])
            time.sleep(1)
            if _cpu_s(node["pid"]) - before < 0.02:
                break
        start_cpu, latencies = _cpu_s(node["pid"]), []
        for i in range(args.changes):
            name = f"{args.prefix}-{i}"
            t0 = time.perf_counter()
            admin.create_topic(name, partitions=1, replication_factor=1)
            while not led(name):
                time.sleep(0.002)
            latencies.append(time.perf_counter() - t0)
        while leading() < args.partitions + args.changes:
            time.sleep(0.05)
        cpu = _cpu_s(node["pid"]) - start_cpu
    latencies.sort()
    print(
        f"{args.partitions} partitions: node CPU per created topic "
        f"{1e3 * cpu / args.changes:.1f} ms; created -> led p50 "
        f"{1e3 * latencies[len(latencies) // 2]:.1f} ms, max {1e3 * latencies[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
