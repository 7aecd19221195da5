"""``strom bench commits``: how many offset commits a coordinator takes per second from many
committers at once, what each waits and what it costs (issue: performance, item 3).

One local cluster of real processes (``--nodes`` storage nodes, 1 controller, 1 coordinator;
``__consumer_offsets`` has 8 shards replicated to min(3, nodes), written acks=all) in a temp
dir per mode. ``--committers`` tasks on one asyncio loop each own a group and commit in a loop
(OffsetCommit over gRPC, one request in flight per committer, the way a consumer's commit
queue sends them) for ``--seconds``, after one warm-up commit each. Reported per mode:
commits/s (records/s), appends to ``__consumer_offsets``/s (batches/s, from the
coordinator's ``strom_coordinator_writes_total{cause="operations"}``), commit latency, and
client and server CPU per million commits; failed commits are counted by error.

Modes: ``batched`` (the coordinator's default: commits that queue while a shard's append is in
flight share the next append) and, with ``--compare``, ``one-per-append``
(``--max-write-batch-records 1`` on the coordinator: every commit its own append, as before
group commit).
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from strom.api import coordinator_pb2, coordinator_pb2_grpc
from strom.bench import cpu
from strom.bench.stats import Result
from strom.client.admin import Admin
from strom.devcluster.cluster import LocalCluster
from strom.errors import ErrorCode, error_name

TOPIC = "commits-bench"
MODES = {"batched": [], "one-per-append": ["--max-write-batch-records", "1"]}


#: The coordinator's appends of queued operations to group shards.
APPENDS = 'strom_coordinator_writes_total{cause="operations",kind="group"}'


def _appends(url: str) -> float:
    value = cpu.scrape_sample(url, APPENDS)
    if value is None:
        raise RuntimeError(f"{url} has no {APPENDS}")
    return value


async def _drive(
    address: str,
    committers: int,
    seconds: float,
    partitions: int,
    at_start: Callable[[], None],
) -> tuple[list[float], dict[str, int], float]:
    """(latencies of the commits made, failed ones by error, elapsed) of ``committers``
    commit loops for ``seconds``; ``at_start`` runs after the warm-up, before the clock."""
    latencies: list[float] = []
    failed: collections.Counter[str] = collections.Counter()

    def request(i: int, offset: int) -> coordinator_pb2.OffsetCommitRequest:
        req = coordinator_pb2.OffsetCommitRequest(
            group_id=f"bench-commits-{i}", member_epoch=-1, committer_id=f"c{i}"
        )
        t = req.topics.add(topic=TOPIC)
        for p in range(partitions):
            t.partitions.add(partition=p, committed_offset=offset)
        return req

    async def commit(stub: coordinator_pb2_grpc.CoordinatorServiceStub, i: int, n: int) -> str:
        """ "" when committed, else what went wrong (the warm-up retries)."""
        try:
            resp = await stub.OffsetCommit(request(i, n), timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        codes = [resp.error_code] + [p.error_code for t in resp.topics for p in t.partitions]
        return next((error_name(c) for c in codes if c != ErrorCode.NONE), "")

    # One connection per committer, as separate consumers have (gRPC would otherwise share
    # one connection between channels of the same target).
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(committers)
    ]
    stubs = [coordinator_pb2_grpc.CoordinatorServiceStub(ch) for ch in channels]
    try:
        deadline = time.monotonic() + 30  # the coordinator may not have seen the topic yet
        while any(await asyncio.gather(*(commit(stubs[i], i, 0) for i in range(committers)))):
            if time.monotonic() > deadline:
                raise RuntimeError("the warm-up commits were refused for 30 s")
            await asyncio.sleep(0.1)
        at_start()
        t0 = time.perf_counter()
        end = t0 + seconds

        async def loop(i: int) -> None:
            n = 1
            while (now := time.perf_counter()) < end:
                err = await commit(stubs[i], i, n)
                if err:
                    failed[err] += 1
                else:
                    latencies.append(time.perf_counter() - now)
                n += 1

        await asyncio.gather(*(loop(i) for i in range(committers)))
        elapsed = time.perf_counter() - t0
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    return latencies, dict(failed), elapsed


def _one_mode(
    args: list[str],
    committers: int,
    seconds: float,
    partitions: int,
    nodes: int,
    directory: str | None,
) -> tuple[list[float], dict[str, int], float, int, cpu.CpuUsage]:
    """Latencies, failures, elapsed, appends and CPU of one run on a fresh cluster whose
    coordinator runs with ``args``."""
    root = Path(tempfile.mkdtemp(prefix="strom-commits-", dir=directory))
    cluster = LocalCluster(
        root / "c", nodes=nodes, controllers=1, coordinators=1, coordinator_args=args
    )
    try:
        cluster.start()
        cluster.wait_coordinators_ready(timeout=60)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=partitions, replication_factor=1)
        coordinator = cluster.coordinators[0]
        url = f"http://127.0.0.1:{coordinator.metrics_port}/metrics"
        start: dict[str, Any] = {}

        def at_start() -> None:
            start["appends"] = _appends(url)
            start["meter"] = cpu.start(cpu.ServerCpu.of_cluster(cluster))

        latencies, failed, elapsed = asyncio.run(
            _drive(coordinator.address, committers, seconds, partitions, at_start)
        )
        usage = start["meter"].stop()
        appends = int(_appends(url) - start["appends"])
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)
    return latencies, failed, elapsed, appends, usage


def bench_commits(
    *,
    committers: int = 64,
    seconds: float = 10.0,
    partitions: int = 1,
    nodes: int = 1,
    compare: bool = True,
    directory: str | None = None,
) -> tuple[list[Result], dict[str, object]]:
    """Run each mode on a fresh local cluster; the results and per-mode extras."""
    results: list[Result] = []
    extra: dict[str, object] = {}
    for mode, args in MODES.items():
        if mode != "batched" and not compare:
            continue
        latencies, failed, elapsed, appends, usage = _one_mode(
            args, committers, seconds, partitions, nodes, directory
        )
        commits = len(latencies)
        results.append(
            Result(
                name=f"{mode}, {committers} committers",
                batches=appends,
                records=commits,
                bytes=0,
                seconds=elapsed,
                latencies=latencies,
                cpu=usage,
            )
        )
        extra[f"{mode}_commits_per_append"] = round(commits / appends, 1) if appends else None
        extra[f"{mode}_failed_commits"] = sum(failed.values())
        if failed:
            extra[f"{mode}_failed_by_error"] = failed
    return results, extra
