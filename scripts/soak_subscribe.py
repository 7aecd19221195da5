"""Storage-node memory under RecordService Subscribe churn.

A steady keyed producer, and a new Subscribe stream of ``--stream-s`` seconds every
``--every-s`` seconds (every other one in a group of its own, auto-committing), all against
one node, for ``--minutes``; the node's resident memory (``/proc/PID/status`` VmRSS) is
printed every 30 s. Found from outside (a 50-minute soak): a node serving such streams grew
by ~3 MB a stream and never gave it back (docs/benchmarks.md, "A node's memory under
Subscribe churn").

Usage: python scripts/soak_subscribe.py BOOTSTRAP NODE_PID [--minutes 30]
"""

from __future__ import annotations

import argparse
import threading
import time

import grpc

from strom import Admin, Producer
from strom.api import records_pb2, records_pb2_grpc

TOPIC = "soak-subscribe"


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def produce(bootstrap: str, stop: threading.Event) -> None:
    with Producer(bootstrap, linger_ms=5) as p:
        i = 0
        while not stop.is_set():
            p.send(TOPIC, b"x" * 200, key=b"%d" % (i % 100))
            i += 1
            if i % 200 == 0:
                stop.wait(0.01)  # ~20,000 records/s at most


def subscribe(address: str, n: int, seconds: float) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = records_pb2_grpc.RecordServiceStub(channel)
        grouped = n % 2 == 1
        req = records_pb2.SubscribeRequest(
            topics=[TOPIC], group_id=f"soak-{n}" if grouped else "", auto_commit=grouped
        )
        try:
            for _ in stub.Subscribe(req, timeout=seconds):
                pass
        except grpc.RpcError:
            pass  # DEADLINE_EXCEEDED: the stream's end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bootstrap")
    ap.add_argument("node_pid", type=int)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every-s", type=float, default=0.5)
    ap.add_argument("--stream-s", type=float, default=5.0)
    args = ap.parse_args()
    with Admin(args.bootstrap) as admin:
        if TOPIC not in admin.list_topics():
            admin.create_topic(TOPIC, partitions=3, replication_factor=1)
    stop = threading.Event()
    threading.Thread(target=produce, args=(args.bootstrap, stop), daemon=True).start()
    address = args.bootstrap.split(",")[0]
    started = last = time.monotonic()
    n = 0
    live: list[threading.Thread] = []
    print(f"t=0s rss={rss_mb(args.node_pid)}MB", flush=True)
    while time.monotonic() - started < args.minutes * 60:
        t = threading.Thread(target=subscribe, args=(address, n, args.stream_s), daemon=True)
        t.start()
        live = [x for x in [*live, t] if x.is_alive()]
        n += 1
        time.sleep(args.every_s)  # the churn's pace, not a wait for a condition
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            print(
                f"t={last - started:.0f}s streams={n} live={len(live)} "
                f"rss={rss_mb(args.node_pid)}MB",
                flush=True,
            )
    stop.set()
    for t in live:
        t.join()
    print(f"end streams={n} rss={rss_mb(args.node_pid)}MB", flush=True)


if __name__ == "__main__":
    main()
