"""What an idle local cluster costs: each process's CPU while nothing is produced.

Starts ``strom dev up`` (3 nodes, 1 controller, 1 coordinator) in a fresh directory, creates
``--topics`` topics of ``--partitions`` partitions at replication factor 3, lets it settle,
then reads every member's CPU time from ``/proc/<pid>/stat`` over ``--seconds`` and prints
it as a share of one core. Why a script and not a ``strom bench`` phase: it measures the
cluster's own processes from outside, on this machine only (docs/benchmarks.md, "An idle
cluster, follower fetch sessions, and what a service start imports").

    python scripts/idle_cpu.py --topics 50 --partitions 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _strom(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode:
        raise SystemExit(f"strom {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds before measuring")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="strom-idle-"))
    _strom("dev", "up", "--dir", str(root), "--controllers", "1")  # (9092, or a free port)
    try:
        state = json.loads((root / "cluster.json").read_text())
        env = {**os.environ, **state["client_env"]}
        for i in range(args.topics):
            _strom(
                "topics",
                "create",
                f"idle-{i}",
                "--partitions",
                str(args.partitions),
                "--replication-factor",
                "3",
                env=env,
            )
        time.sleep(args.settle)
        members = {f"{m['kind']} {m['id']}": m["pid"] for m in state["members"]}
        members["etcd"] = state["etcd"]["pid"]
        before = {name: _cpu_s(pid) for name, pid in members.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - t0
        total = 0.0
        print(f"{args.topics} topics x {args.partitions} partitions, RF 3, idle {elapsed:.0f} s")
        for name, pid in sorted(members.items()):
            share = (_cpu_s(pid) - before[name]) / elapsed * 100
            total += share
            print(f"{share:6.1f} %  {name}")
        print(f"{total:6.1f} %  all (of one core)")
    finally:
        _strom("dev", "down", "--dir", str(root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
