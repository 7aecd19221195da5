"""What the machine charges for the steps every record's way is made of, measured beside a run.

A record's end-to-end latency is mostly hand-offs: gRPC calls between processes and wake-ups
of threads that waited for a lock or a socket. Their price is the machine's, not strom's, and
it varies more than the code's effect. The same commit of strom, on two instances of the
same 2-core VM type hours apart, gave ``strom bench e2e --consumer-process`` at 10,000/s a
p50 of 1.7-2.1 ms on the first and 3.1-5.6 ms on the second. A bare unary gRPC call from
Python to a ``grpc.aio`` server took 0.35-0.38 ms on the first and 0.85-1.0 ms on the
second, where a thread hand-off took 15-65 µs and a call 340 µs of the client's CPU (its
virtual CPUs halt when idle and the host must wake them: with
``/sys/module/haltpoll/parameters/guest_halt_poll_ns`` raised from 0 to 200000 the call took
0.56 ms and the hand-off 6 µs). So ``strom bench e2e`` measures both before it sends, on
the idle cluster, and prints them beside its result, with the time of a fixed pure-Python
loop (``strom bench produce`` and ``consume`` put all three in their report's context line):
latencies and rates from two machines compare only through these.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

_CHECK = health_pb2.HealthCheckRequest(service="")


def grpc_round_trips(channel: grpc.Channel, calls: int = 300, warm_up: int = 30) -> list[float]:
    """Seconds of each of ``calls`` sequential unary Health/Check calls on ``channel`` (every
    strom service serves it; an empty service name asks about the server as a whole)."""
    check = health_pb2_grpc.HealthStub(channel).Check
    for _ in range(warm_up):
        check(_CHECK, timeout=5)
    out: list[float] = []
    for _ in range(calls):
        t = time.perf_counter()
        check(_CHECK, timeout=5)
        out.append(time.perf_counter() - t)
    return out


def thread_handoffs(round_trips: int = 1000) -> list[float]:
    """Seconds of each hand-off between two threads of this process (half a round trip of
    two events): a thread waking from a wait and taking the interpreter lock."""
    ping, pong = threading.Event(), threading.Event()

    def other() -> None:
        for _ in range(round_trips):
            ping.wait()
            ping.clear()
            pong.set()

    t = threading.Thread(target=other, name="strom-bench-handoff", daemon=True)
    t.start()
    out: list[float] = []
    for _ in range(round_trips):
        start = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
        out.append((time.perf_counter() - start) / 2)
    t.join()
    return out


def python_loop_s(repeat: int = 3) -> float:
    """Seconds of a fixed pure-Python loop (the best of ``repeat``): the interpreter's speed
    on this machine, which throughput in records/s follows."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i & 7
        best = min(best, time.perf_counter() - start)
    return best


def calibrate(channel: grpc.Channel) -> dict[str, Any]:
    """The machine's prices (µs, p50 and p99) for a gRPC round trip to the node behind
    ``channel`` and for a hand-off between two threads, and its fixed Python loop (ms)."""
    rtt = np.asarray(grpc_round_trips(channel)) * 1e6
    hand = np.asarray(thread_handoffs()) * 1e6
    return {
        "grpc_round_trip_p50_us": round(float(np.percentile(rtt, 50)), 1),
        "grpc_round_trip_p99_us": round(float(np.percentile(rtt, 99)), 1),
        "thread_handoff_p50_us": round(float(np.percentile(hand, 50)), 1),
        "thread_handoff_p99_us": round(float(np.percentile(hand, 99)), 1),
        "python_loop_ms": round(python_loop_s() * 1e3, 1),
    }


def calibrate_cluster(bootstrap: str | None, topic: str | None = None) -> dict[str, Any]:
    """:func:`calibrate` against the leader of ``topic``'s first partition (or, without one,
    the first live node); {} if the cluster has no live node."""
    from strom.client.admin import Admin
    from strom.client.cluster import ClusterClient

    with ClusterClient(bootstrap) as client:
        admin = Admin(cluster_client=client)
        nodes = {n.node_id: n.address for n in admin.describe_cluster().nodes}
        address = next(iter(nodes.values()), None)
        if topic is not None:
            try:
                parts = admin.describe_topic(topic).partitions
            except Exception:  # no such topic (yet): any node will do
                parts = []
            if parts and parts[0].leader in nodes:
                address = nodes[parts[0].leader]
        return calibrate(client.channel(address)) if address is not None else {}


def describe(machine: dict[str, Any]) -> str:
    """One line for a bench report."""
    return (
        f"{'machine':<24} gRPC round trip to the node µs p50 {machine['grpc_round_trip_p50_us']}"
        f" p99 {machine['grpc_round_trip_p99_us']}  thread hand-off µs p50 "
        f"{machine['thread_handoff_p50_us']} p99 {machine['thread_handoff_p99_us']}"
        f"  Python loop ms {machine['python_loop_ms']}"
    )


def brief(machine: dict[str, Any]) -> str:
    """The same for a report's context line."""
    if not machine:
        return "-"
    return (
        f"gRPC {machine['grpc_round_trip_p50_us']:.0f}/{machine['grpc_round_trip_p99_us']:.0f}"
        f" µs, hand-off {machine['thread_handoff_p50_us']:.0f}/"
        f"{machine['thread_handoff_p99_us']:.0f} µs (p50/p99), loop {machine['python_loop_ms']} ms"
    )
