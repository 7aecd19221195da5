"""``strom bench scale``: how costs grow with partitions and with connections (issue 15 item 5).

One local cluster of real processes (etcd, one controller, one storage node, no coordinator:
replication factor 1, so every partition is on the measured node) goes through:

- **spread**: the same keyed produce load (``--records`` records of 100 bytes, keys cycling
  over 10 per partition, so every partition gets records) on topics of 1, 6, 60 and 600
  partitions: records/s and CPU seconds per million records, client and server.
- **partitions**: topics of 10, 100, 1,000 and 10,000 partitions (up to
  ``--max-partitions``) created one after the other. For each: the CreateTopics call's time,
  the time until the node leads every partition (its ``strom_storage_partitions`` gauge:
  the log created, not only the decision in etcd), the etcd bytes the topic added (key and
  value sizes under the cluster's prefix) and etcd's database size; then, with all the
  partitions made so far on the node: its resident memory, its start-up time (SIGKILL, start,
  every partition led again: log recovery and re-registration), and the controller's cost of
  one more change (a 1-partition topic created: time until led, controller CPU).
- **connections**: ``--connections`` concurrent clients on the node, half producers (one
  record every ``--interval-ms``, acks=all, each with its own connection) and half consumers
  (each its own connection, long-polling), in ``--workers`` processes: node memory before and
  at the peak, produce acknowledgement latency percentiles over all producers.

Results are printed as tables (or one JSON object) and drawn as PNG plots into ``--out``
(matplotlib, from the ``bench`` extra). Numbers depend on the machine and what runs beside it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from strom.bench import cpu
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import StromError

PARTITION_STEPS = (10, 100, 1_000, 10_000)
SPREAD_STEPS = (1, 6, 60, 600)
RECORD_SIZE = 100


def rss_bytes(pid: int) -> int:
    """Resident memory of a process on this host (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def etcd_bytes(store: Any) -> int:
    """Sum of key and value sizes of every key of the cluster (what it keeps in etcd)."""
    _, items = store.get_prefix_raw(store.keys.root)
    return sum(len(ev.key) + len(ev.value or b"") for ev in items)


def etcd_db_size(store: Any) -> int:
    """etcd's database file size (all revisions until compaction, so it only grows)."""
    return int(store._call(store.client.status).db_size)


def _led(client: Any, topic: str, partitions: int) -> bool:
    try:
        md = client.metadata([topic])
    except Exception:  # a node restarting: not yet
        return False
    if not md.topics or md.topics[0].error_code:
        return False
    parts = md.topics[0].partitions
    return len(parts) == partitions and all(p.leader >= 0 for p in parts)


def node_leads(metrics_port: int) -> int:
    """Partitions a node leads (and hosts: its log is open), from its
    ``strom_storage_partitions{role="leader"}`` gauge. Metadata alone is not enough: it
    shows the controller's decision before the node has created or recovered the log."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    led = cpu.scrape_sample(url, 'strom_storage_partitions{role="leader"}')
    return -1 if led is None else int(led)  # None: restarting


def wait_hosted(cluster: LocalCluster, total: int, timeout: float, what: str) -> None:
    """Until the (only) node leads ``total`` partitions."""
    port = cluster.nodes[0].metrics_port
    wait_for(lambda: node_leads(port) >= total, timeout=timeout, what=what, interval=0.01)


# -- spread -----------------------------------------------------------------------------------


def bench_spread(
    cluster: LocalCluster, client: Any, admin: Any, steps: list[int], records: int
) -> list[dict[str, Any]]:
    from strom.client.producer import Producer

    server = cpu.ServerCpu.of_cluster(cluster)
    rows = []
    value = b"x" * RECORD_SIZE
    for parts in steps:
        topic = f"spread-{parts}"
        admin.create_topic(topic, partitions=parts, replication_factor=1)
        wait_for(lambda t=topic, p=parts: _led(client, t, p), timeout=300, what=f"{topic} led")
        keys = [b"key-%d" % i for i in range(10 * parts)]
        with Producer(cluster.bootstrap, acks="all", linger_ms=5) as p:
            for k in keys[:: max(len(keys) // 50, 1)]:
                p.send(topic, value, key=k)
            p.flush()  # metadata and connections warm
            meter = cpu.start(server)
            t0 = time.perf_counter()
            n = len(keys)
            for i in range(records):
                p.send(topic, value, key=keys[i % n])
            p.flush()
            seconds = time.perf_counter() - t0
            usage = meter.stop()
        row: dict[str, Any] = {
            "partitions": parts,
            "records": records,
            "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds),
        }
        row.update(usage.per_million(records))
        rows.append(row)
    return rows


# -- partitions -------------------------------------------------------------------------------


def _one_change(cluster: LocalCluster, admin: Any, name: str, total: int) -> tuple[float, float]:
    """Create a 1-partition topic on a node leading ``total - 1``: (seconds until the node
    leads it, controller CPU seconds spent)."""
    ctrl = cpu.ServerCpu(pids=tuple(m.process.pid for m in cluster.controllers if m.process))
    meter = cpu.start(ctrl)
    t0 = time.perf_counter()
    admin.create_topic(name, partitions=1, replication_factor=1)
    wait_hosted(cluster, total, 120, f"{name} led")
    took = time.perf_counter() - t0
    return took, meter.stop().server_s or 0.0


def bench_partitions(
    cluster: LocalCluster, client: Any, admin: Any, store: Any, steps: list[int], changes: int
) -> list[dict[str, Any]]:
    rows = []
    # Every partition on the node counts (the spread and connections topics too).
    topics = {t.name: len(t.partitions) for t in client.metadata().topics}
    node = cluster.nodes[0]
    for parts in steps:
        topic = f"scale-{parts}"
        before = etcd_bytes(store)
        t0 = time.perf_counter()
        admin.create_topic(topic, partitions=parts, replication_factor=1)
        created = time.perf_counter() - t0
        topics[topic] = parts
        wait_hosted(cluster, sum(topics.values()), 900, f"the node leading {topic}")
        led = time.perf_counter() - t0
        added = etcd_bytes(store) - before
        assert node.process is not None
        rss = rss_bytes(node.process.pid)
        # One more change at this size, a few times (the median is reported).
        probes = []
        for i in range(changes):
            topics[f"probe-{parts}-{i}"] = 1
            probes.append(_one_change(cluster, admin, f"probe-{parts}-{i}", sum(topics.values())))
        # Start-up: SIGKILL the node, start it, wait until every partition is led again.
        node.process.kill()
        t1 = time.perf_counter()
        node.start()
        cluster.wait_serving(node, timeout=600)
        wait_hosted(cluster, sum(topics.values()), 1800, "all partitions led again")
        startup = time.perf_counter() - t1
        rows.append(
            {
                "partitions": parts,
                "create_s": round(created, 3),
                "led_s": round(led, 3),
                "etcd_bytes": added,
                "etcd_bytes_per_partition": round(added / parts, 1),
                "etcd_db_bytes": etcd_db_size(store),
                "node_partitions": sum(topics.values()),
                "node_rss_bytes": rss,
                "node_startup_s": round(startup, 3),
                "change_led_s": round(statistics.median(p[0] for p in probes), 4),
                "change_controller_cpu_s": round(statistics.median(p[1] for p in probes), 4),
            }
        )
    return rows


# -- connections ------------------------------------------------------------------------------


def _connections_worker(
    bootstrap: str,
    topic: str,
    producers: int,
    consumers: int,
    seconds: float,
    interval: float,
    ready: Any,
    go: Any,
    q: Any,
) -> None:
    import strom.client.cluster as cluster_mod
    from strom.client.consumer import Consumer
    from strom.client.producer import Producer
    from strom.client.types import TopicPartition

    # Own connection per client, as separate client processes would have (gRPC otherwise
    # shares one connection between channels of a process with the same target).
    cluster_mod.GRPC_OPTIONS = (*cluster_mod.GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
    ps = [Producer(bootstrap, acks="all", linger_ms=0) for _ in range(producers)]
    cs = []
    for _ in range(consumers):
        c = Consumer(bootstrap, auto_offset_reset="latest")
        c.assign([TopicPartition(topic, 0)])
        cs.append(c)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for c in cs:
                c.poll(timeout_ms=0)
            stop.wait(interval)

    value = b"x" * RECORD_SIZE
    for p in ps:
        p.send(topic, value).result(60)
    ready.put(1)
    go.wait()
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    end = time.monotonic() + seconds
    sends = 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        for p in ps:
            sent = time.perf_counter()
            sends += 1

            def done(_md: object, exc: BaseException | None, sent: float = sent) -> None:
                with lock:
                    if exc is None:
                        latencies.append(time.perf_counter() - sent)
                    else:
                        errors[0] += 1

            p.send(topic, value, callback=done)
        time.sleep(max(0.0, interval - (time.monotonic() - t0)))
    deadline = time.monotonic() + 60
    for p in ps:
        # A node that cannot keep up leaves sends unanswered: counted below, not a crash
        # (the parent would otherwise wait for this worker's result for ten minutes).
        with contextlib.suppress(StromError):
            p.flush(timeout=max(deadline - time.monotonic(), 0.1))
    stop.set()
    reader.join(10)
    with lock:
        unanswered = sends - len(latencies) - errors[0]
    for p in ps:
        with contextlib.suppress(StromError):
            p.close(timeout=10)
    for c in cs:
        c.close()
    q.put({"latencies": latencies, "errors": errors[0], "unanswered": unanswered})


def bench_connections(
    cluster: LocalCluster,
    admin: Any,
    client: Any,
    connections: int,
    workers: int,
    seconds: float,
    interval_ms: float,
) -> dict[str, Any]:
    topic = "scale-connections"
    admin.create_topic(topic, partitions=1, replication_factor=1)
    wait_for(lambda: _led(client, topic, 1), timeout=60, what=f"{topic} led")
    node = cluster.nodes[0]
    assert node.process is not None
    pid = node.process.pid
    before = rss_bytes(pid)
    workers = max(1, min(workers, connections))
    ctx = multiprocessing.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    per = [connections // workers + (1 if i < connections % workers else 0) for i in range(workers)]
    procs = [
        ctx.Process(
            target=_connections_worker,
            args=(
                cluster.bootstrap,
                topic,
                n - n // 2,
                n // 2,
                seconds,
                interval_ms / 1000.0,
                ready,
                go,
                q,
            ),
            daemon=True,
        )
        for n in per
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=600)
        connected = rss_bytes(pid)
        peak = [connected]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.25):
                peak[0] = max(peak[0], rss_bytes(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        go.set()
        results: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds + 600
        while len(results) < len(procs) and time.monotonic() < deadline:
            try:
                results.append(q.get(timeout=1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and q.empty():
                    break  # a worker died without a result: report what came
        stop.set()
        sampler.join()
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    lat = np.asarray([x for r in results for x in r["latencies"]]) * 1e3
    out: dict[str, Any] = {
        "connections": connections,
        "producers": sum(n - n // 2 for n in per),
        "consumers": sum(n // 2 for n in per),
        "seconds": seconds,
        "acknowledged": int(lat.size),
        "errors": sum(r["errors"] for r in results),
        "unanswered": sum(r.get("unanswered", 0) for r in results),
        "failed_workers": len(procs) - len(results),
        "node_rss_before_bytes": before,
        "node_rss_connected_bytes": connected,
        "node_rss_peak_bytes": peak[0],
        "node_rss_per_connection_bytes": round((peak[0] - before) / connections),
    }
    if lat.size:
        for p in (50, 99, 99.9):
            out[f"p{p}_ms"] = round(float(np.percentile(lat, p)), 2)
    return out


# -- the whole run ----------------------------------------------------------------------------


def steps_up_to(limit: int, steps: tuple[int, ...]) -> list[int]:
    out = [s for s in steps if s <= limit]
    return out or [limit]


def bench_scale(
    *,
    max_partitions: int = 10_000,
    max_spread: int = 600,
    records: int = 200_000,
    connections: int = 1_000,
    workers: int = 10,
    seconds: float = 20.0,
    interval_ms: float = 500.0,
    changes: int = 3,
    directory: str | None = None,
) -> dict[str, Any]:
    """Run every phase on one fresh local cluster; returns the results as a dict."""
    from strom.client.admin import Admin
    from strom.client.cluster import ClusterClient
    from strom.metadata.store import MetadataStore

    root = Path(tempfile.mkdtemp(prefix="strom-scale-", dir=directory))
    # The controller keeps its etcd transactions small; the node keeps every partition.
    cluster = LocalCluster(root / "c", nodes=1, controllers=1, coordinators=0)
    out: dict[str, Any] = {}
    try:
        cluster.start(timeout=120)
        store = MetadataStore(cluster.etcd.endpoint, cluster.cluster_name)
        try:
            # A 10,000-partition CreateTopics takes seconds: a call timeout shorter than that
            # makes the client retry it and report TOPIC_ALREADY_EXISTS for its own topic.
            with ClusterClient(cluster.bootstrap, retry_s=120, timeout_s=600) as client:
                admin = Admin(cluster_client=client)
                out["spread"] = bench_spread(
                    cluster, client, admin, steps_up_to(max_spread, SPREAD_STEPS), records
                )
                if connections:
                    out["connections"] = bench_connections(
                        cluster, admin, client, connections, workers, seconds, interval_ms
                    )
                out["partitions"] = bench_partitions(
                    cluster,
                    client,
                    admin,
                    store,
                    steps_up_to(max_partitions, PARTITION_STEPS),
                    changes,
                )
        finally:
            store.close()
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _mib(n: float) -> float:
    return round(n / (1 << 20), 1)


def tables(result: dict[str, Any]) -> str:
    """The results as aligned text tables."""
    lines = ["produce spread (keyed, 100 B records, acks=all (idempotent), linger 5 ms)"]
    lines.append(
        f"  {'partitions':>10} {'records/s':>12} {'client CPU s/M':>15} {'server CPU s/M':>15}"
    )
    for r in result.get("spread", []):
        lines.append(
            f"  {r['partitions']:>10,} {r['records_per_s']:>12,} "
            f"{r['client_cpu_s_per_M_records']!s:>15} {r['server_cpu_s_per_M_records']!s:>15}"
        )
    lines.append("")
    lines.append("partitions (one node, replication factor 1)")
    lines.append(
        f"  {'topic':>7} {'create s':>9} {'led s':>8} {'etcd B/part':>11} {'on node':>8} "
        f"{'node RSS MiB':>12} {'start-up s':>10} {'change s':>9} {'ctrl CPU s':>10}"
    )
    for r in result.get("partitions", []):
        lines.append(
            f"  {r['partitions']:>7,} {r['create_s']:>9} {r['led_s']:>8} "
            f"{r['etcd_bytes_per_partition']:>11} {r['node_partitions']:>8,} "
            f"{_mib(r['node_rss_bytes']):>12} {r['node_startup_s']:>10} "
            f"{r['change_led_s']:>9} {r['change_controller_cpu_s']:>10}"
        )
    c = result.get("connections")
    if c:
        lines.append("")
        lines.append(
            f"connections: {c['producers']} producers + {c['consumers']} consumers on one node "
            f"for {c['seconds']} s: node RSS {_mib(c['node_rss_before_bytes'])} -> "
            f"{_mib(c['node_rss_peak_bytes'])} MiB peak "
            f"({c['node_rss_per_connection_bytes'] / 1024:.0f} KiB per connection), "
            f"{c['acknowledged']:,} acks, {c['errors']} errors, "
            f"{c.get('unanswered', 0):,} unanswered after 60 s, "
            f"{c.get('failed_workers', 0)} client processes failed, ack latency ms "
            f"p50 {c.get('p50_ms')} p99 {c.get('p99_ms')} p99.9 {c.get('p99.9_ms')}"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the cost curves as PNG files in ``out_dir``; returns their paths."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "strom bench scale draws its plots with matplotlib: pip install 'strom[bench]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    parts = result.get("partitions", [])
    if parts:
        x = [r["partitions"] for r in parts]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x, [r["create_s"] for r in parts], "o-", label="CreateTopics returned")
        ax.plot(x, [r["led_s"] for r in parts], "s-", label="every partition led")
        ax.set(xscale="log", yscale="log", xlabel="partitions in the topic", ylabel="seconds")
        ax.set_title("topic creation time")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "scale-topic-creation.png")

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x, [r["etcd_bytes"] / 1024 for r in parts], "o-", label="keys + values")
        ax.set(xscale="log", yscale="log", xlabel="partitions in the topic", ylabel="KiB")
        ax.set_title("etcd bytes per topic")
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "scale-etcd-bytes.png")

        n = [r["node_partitions"] for r in parts]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(n, [_mib(r["node_rss_bytes"]) for r in parts], "o-", color="tab:blue")
        ax.set(xlabel="partitions on the node", ylabel="node RSS (MiB)")
        ax2 = ax.twinx()
        ax2.plot(n, [r["node_startup_s"] for r in parts], "s--", color="tab:red")
        ax2.set_ylabel("start-up to all led (s)", color="tab:red")
        ax.set_title("node memory (o) and start-up time (s)")
        ax.grid(True, alpha=0.3)
        save(fig, "scale-node-memory-startup.png")

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(n, [r["change_led_s"] * 1e3 for r in parts], "o-", label="change to led (ms)")
        ax.plot(
            n,
            [r["change_controller_cpu_s"] * 1e3 for r in parts],
            "s-",
            label="controller CPU (ms)",
        )
        ax.set(xlabel="partitions in the cluster", ylabel="ms")
        ax.set_title("controller cost of one change (a 1-partition topic)")
        ax.legend()
        ax.grid(True, alpha=0.3)
        save(fig, "scale-controller-change.png")

    spread = result.get("spread", [])
    if spread:
        x = [r["partitions"] for r in spread]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x, [r["records_per_s"] / 1e3 for r in spread], "o-")
        ax.set(xscale="log", xlabel="partitions", ylabel="thousand records/s")
        ax.set_title("keyed produce spread over partitions")
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "scale-produce-spread.png")
    return paths


__all__ = ["bench_scale", "plot", "tables"]
