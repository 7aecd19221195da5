"""``strom demo``: the main job, as far as strom exists today.

``run_cluster_demo`` starts a local cluster of real processes (etcd, two controllers, three
storage nodes), creates a topic, produces keyed records over gRPC, consumes them back, kills
the active controller and a storage node and shows the cluster carry on. ``run_demo`` (the
``--engine`` form) runs the storage engine alone: append, read, compact, retention, crash
recovery. The producer → consumer-group pipeline grows here as the client issues land.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from strom.log import Log, LogConfig, LogManager, compact
from strom.record import Record, decode_records, encode_batch


def _read_all(log: Log) -> list[Record]:
    out: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        r = log.read(offset, 1 << 20)
        out.extend(decode_records(r.data))
        offset = r.next_offset
    return out


def run_demo(data_dir: str | None = None) -> int:
    root = Path(data_dir or tempfile.mkdtemp(prefix="strom-demo-"))
    try:
        print(f"data dir: {root}")
        mgr = LogManager(root)
        events = mgr.get_or_create("events", 0, {"segment.bytes": "65536"})
        t0 = time.perf_counter()
        for i in range(200):
            values = [f"event {i}:{j}".encode() for j in range(500)]
            events.append(encode_batch(values, compression="zstd"), leader_epoch=0)
        dt = time.perf_counter() - t0
        print(
            f"appended 100,000 records in 200 batches to events-0 in {dt * 1e3:.0f} ms "
            f"({len(events.segments)} segments, LEO {events.log_end_offset})"
        )
        records = _read_all(events)
        print(
            f"read back {len(records)} records; first {records[0].value!r}, "
            f"last {records[-1].value!r}"
        )

        table = mgr.get_or_create(
            "users", 0, {"cleanup.policy": "compact", "segment.bytes": "4096"}
        )
        for i in range(300):
            table.append(
                encode_batch([f"v{i}".encode()], keys=[f"user-{i % 10}".encode()]), leader_epoch=0
            )
        stats = compact(table)
        latest = {r.key: (r.offset, r.value) for r in _read_all(table)}
        print(
            f"compacted users-0: {stats.records_before} -> {stats.records_after} records in "
            f"sealed segments; {len(latest)} keys, e.g. user-3 = {latest[b'user-3']}"
        )

        events.config = LogConfig.from_dict({"retention.bytes": "200000", "segment.bytes": "65536"})
        deleted = events.apply_retention()
        print(
            f"retention.bytes=200000 deleted {deleted} segments; log start offset now "
            f"{events.log_start_offset} (offsets are never reused)"
        )

        mgr.checkpoint()
        seg_file = events.active.log_path
        for _, log in mgr:
            log.close()  # a crash: no clean-shutdown marker
        with open(seg_file, "r+b") as f:
            f.truncate(os.path.getsize(seg_file) - 100)
        mgr = LogManager(root)
        events = mgr.get("events", 0)
        assert events is not None
        print(
            f"after a crash that tore the last batch: recovery cut "
            f"{events.truncated_bytes_on_recovery} bytes, LEO {events.log_end_offset}, "
            f"{len(_read_all(events))} records readable"
        )
        mgr.close()
        print("clean shutdown marker written; next start skips recovery")
        return 0
    finally:
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def run_cluster_demo(data_dir: str | None = None, records: int = 200_000) -> int:
    """Local cluster + a replicated produce/consume pipeline + failures, printed step by step."""
    import pyarrow as pa

    from strom.client import Admin, Consumer, Producer, TopicPartition
    from strom.devcluster.cluster import LocalCluster

    root = Path(data_dir or tempfile.mkdtemp(prefix="strom-demo-"))
    cluster = LocalCluster(root / "cluster", nodes=3, controllers=2)
    t0 = time.perf_counter()
    cluster.start()
    try:
        print(
            f"local cluster up in {time.perf_counter() - t0:.1f}s: etcd {cluster.etcd.endpoint}, "
            f"2 controllers, 3 storage nodes; bootstrap {cluster.bootstrap}"
        )
        parts = 6
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(
                "clicks",
                partitions=parts,
                replication_factor=3,
                config={"min.insync.replicas": "2"},
            )
            print("created clicks: 6 partitions, replication factor 3, min.insync.replicas=2")

            keys = pa.array([f"user-{i % 1000}".encode() for i in range(records)], pa.binary())
            values = pa.array([b"click %d" % i for i in range(records)], pa.binary())
            with Producer(cluster.bootstrap, acks="all", compression="lz4") as producer:
                t0 = time.perf_counter()
                chunks = producer.send_batch(
                    "clicks", pa.table({"key": keys, "value": values})
                ).result(120)
                dt = time.perf_counter() - t0
                print(
                    f"produced {records:,} keyed records (acks=all, lz4, idempotent) in "
                    f"{len(chunks)} batches in {dt:.2f}s: {records / dt:,.0f} records/s"
                )

                tps = [TopicPartition("clicks", p) for p in range(parts)]
                with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
                    consumer.assign(tps)
                    t0 = time.perf_counter()
                    got = 0
                    while got < records:
                        table = consumer.poll_arrow(timeout_ms=2000)
                        if table.num_rows == 0:
                            break
                        got += table.num_rows
                    dt = time.perf_counter() - t0
                print(
                    f"consumed {got:,} records back as Arrow tables in {dt:.2f}s: "
                    f"{got / dt:,.0f} records/s"
                )

                leader = admin.describe_topic("clicks").partitions[0].leader
                assert leader is not None
                node = cluster.node(leader)
                assert node.process is not None
                node.process.kill()
                t0 = time.perf_counter()
                md = producer.send("clicks", b"after the crash", partition=0).result(60)
                print(
                    f"SIGKILLed node {leader}, leader of clicks-0: the next acks=all record "
                    f"was acknowledged {time.perf_counter() - t0:.2f}s later at offset "
                    f"{md.offset} by the new leader"
                )
            p0 = admin.describe_topic("clicks").partitions[0]
            print(
                f"clicks-0 now: leader {p0.leader}, ISR {sorted(p0.isr)}, replicas "
                f"{list(p0.replicas)} (node {leader} out of the ISR)"
            )
            cluster.restart(node)

            active = cluster.active_controller()
            assert active is not None and active.process is not None
            active.process.signal(signal.SIGKILL)
            t0 = time.perf_counter()
            admin.create_topic("after-failover", partitions=3, replication_factor=1)
            print(
                f"killed the active controller (SIGKILL); the standby served CreateTopics "
                f"{time.perf_counter() - t0:.2f}s later"
            )
        return 0
    finally:
        cluster.stop()
