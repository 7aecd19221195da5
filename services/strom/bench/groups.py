"""``strom bench rebalance``: how long a graceful leave takes to rebalance, and whether the
rest of the group keeps consuming meanwhile (issue: consumer groups).

One local cluster of real processes (1 storage node, 1 controller, 1 coordinator) in a temp
dir, a 6-partition topic and a producer thread writing a steady stream (``--rate`` records/s).
Each trial starts a group of 3 members (threads, each polling its own consumer), waits until
each owns 2 partitions and is consuming, then closes one member (a graceful leave) and
measures (a) the time from the leave to the 2 remaining members owning all 6 partitions and
(b) for those unaffected members, the largest gap between consecutive received records in
the window around the rebalance versus the median gap before it: incremental rebalancing
means they should keep consuming their own partitions throughout.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from strom.api import controller_pb2
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for

TOPIC = "rebalance-bench"
PARTITIONS = 6


class _Member:
    """A group member on its own thread (a consumer is single-threaded); keeps the arrival
    time of every poll that returned records, so gaps can be computed afterwards."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="latest")
        self.consumer.subscribe([TOPIC])
        self.owned: set[int] = set()
        self.arrivals: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            records = self.consumer.poll(20)
            if records:
                self.arrivals.append(time.monotonic())
            self.owned = {tp.partition for tp in self.consumer.assignment()}

    def leave(self) -> None:
        """Stop polling and close: the consumer leaves the group gracefully (epoch -1)."""
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def _producer_loop(bootstrap: str, rate: float, stop: threading.Event) -> None:
    """Send ``rate`` records/s round-robin over the partitions, paced in 10 ms slices."""
    with Producer(bootstrap, acks="all", linger_ms=5) as producer:
        start, sent = time.monotonic(), 0
        while not stop.is_set():
            due = int((time.monotonic() - start) * rate)
            for _ in range(due - sent):
                producer.send(TOPIC, b"x" * 100, partition=sent % PARTITIONS)
                sent += 1
            time.sleep(0.01)


def _max_gap(times: list[float], lo: float, hi: float) -> float:
    """Largest gap between consecutive arrivals within [lo, hi] (bounds count as arrivals)."""
    inside = [lo, *(t for t in times if lo <= t <= hi), hi]
    return max(b - a for a, b in itertools.pairwise(inside))


def _median_gap(times: list[float], lo: float, hi: float) -> float:
    inside = [t for t in times if lo <= t <= hi]
    gaps = [b - a for a, b in itertools.pairwise(inside)]
    return statistics.median(gaps) if gaps else float("nan")


def bench_rebalance(
    trials: int = 5,
    rate: float = 5000.0,
    directory: str | None = None,
    verbose: bool = True,
    heartbeat_interval_ms: int | None = None,
) -> dict[str, Any]:
    """Run ``trials`` leave-and-rebalance trials; returns per-trial numbers and medians.

    The remaining members learn their new partitions on their next heartbeat, so the
    rebalance time is bounded by the group heartbeat interval: ``heartbeat_interval_ms``
    overrides the coordinator's default to show that.
    """
    root = Path(tempfile.mkdtemp(prefix="strom-rebalance-", dir=directory))
    hb = ["--group-heartbeat-interval-ms", str(heartbeat_interval_ms)]
    cluster = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=hb if heartbeat_interval_ms else [],
    )
    results: list[dict[str, float]] = []
    stop = threading.Event()
    try:
        cluster.start()
        with ClusterClient(cluster.bootstrap, retry_s=30) as client:
            client.controller_call(
                "CreateTopics",
                controller_pb2.CreateTopicsRequest(
                    topics=[
                        controller_pb2.CreatableTopic(
                            name=TOPIC, num_partitions=PARTITIONS, replication_factor=1
                        )
                    ]
                ),
            )
            wait_for(
                lambda: len(client.topic_metadata(TOPIC).partitions) == PARTITIONS,
                timeout=30,
                what="the topic",
            )
        producer = threading.Thread(
            target=_producer_loop, args=(cluster.bootstrap, rate, stop), daemon=True
        )
        producer.start()
        for trial in range(trials):
            members = [_Member(cluster.bootstrap, f"rebalance-{trial}") for _ in range(3)]
            try:
                wait_for(
                    lambda members=members: (
                        sorted(len(m.owned) for m in members) == [2, 2, 2]
                        and all(len(m.arrivals) > 20 for m in members)
                    ),
                    timeout=60,
                    what="3 members with 2 partitions each, consuming",
                )
                steady_from = time.monotonic()
                wait_for(
                    lambda members=members, t=steady_from: all(
                        sum(1 for a in m.arrivals if a > t) > 20 for m in members
                    ),
                    timeout=30,
                    what="a steady-state window",
                )
                leaver, rest = members[0], members[1:]
                t0 = time.monotonic()
                leaver.leave()
                wait_for(
                    lambda rest=rest: (
                        set().union(*(m.owned for m in rest)) == set(range(6))
                        and sum(len(m.owned) for m in rest) == PARTITIONS
                    ),
                    timeout=60,
                    interval=0.005,
                    what="the remaining members to own all partitions",
                )
                took = time.monotonic() - t0
                # Watch the unaffected members for as long again (at least 0.5 s) after.
                t_end = time.monotonic() + max(0.5, took)
                wait_for(lambda t=t_end: time.monotonic() >= t, timeout=60, what="the window")
                normal = statistics.median(_median_gap(m.arrivals, steady_from, t0) for m in rest)
                worst = max(_max_gap(m.arrivals, t0, t_end) for m in rest)
                results.append({"rebalance_s": took, "normal_gap_s": normal, "max_gap_s": worst})
                if verbose:
                    print(
                        f"trial {trial + 1}: leave → all {PARTITIONS} partitions owned by the "
                        f"remaining 2 after {took:.3f} s; their largest gap {worst * 1000:.1f} ms "
                        f"(normal {normal * 1000:.1f} ms)",
                        flush=True,
                    )
            finally:
                for m in members:
                    with contextlib.suppress(Exception):
                        m.leave()
        stop.set()
        producer.join(30)
    finally:
        stop.set()
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)
    rebal = [r["rebalance_s"] for r in results]
    return {
        "trials": results,
        "rate": rate,
        "heartbeat_interval_ms": heartbeat_interval_ms,
        "median_rebalance_s": statistics.median(rebal),
        "max_rebalance_s": max(rebal),
        "median_normal_gap_s": statistics.median(r["normal_gap_s"] for r in results),
        "median_max_gap_s": statistics.median(r["max_gap_s"] for r in results),
        "max_max_gap_s": max(r["max_gap_s"] for r in results),
    }


def summary(result: dict[str, Any]) -> str:
    return (
        f"rebalance after a graceful leave over {len(result['trials'])} trials "
        f"({result['rate']:.0f} records/s, {PARTITIONS} partitions, 3 → 2 members, "
        f"heartbeat interval {result['heartbeat_interval_ms'] or 'default'} ms): "
        f"median {result['median_rebalance_s']:.3f} s, max {result['max_rebalance_s']:.3f} s "
        f"(goal ≤ 1 s)\nunaffected members: largest gap between records around the rebalance "
        f"median {result['median_max_gap_s'] * 1000:.1f} ms, max "
        f"{result['max_max_gap_s'] * 1000:.1f} ms vs normal gap "
        f"{result['median_normal_gap_s'] * 1000:.1f} ms"
    )


def to_json(result: dict[str, Any]) -> str:
    return json.dumps({"mode": "rebalance", **result})
