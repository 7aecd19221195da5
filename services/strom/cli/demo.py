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
from strom.record import Record, decode_records, decode_to_arrow, encode_batch


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
    """Local cluster + produce/consume pipeline + failures, printed step by step."""
    from strom.api import common_pb2, controller_pb2, storage_pb2
    from strom.client.cluster import ClusterClient
    from strom.client.partitioner import partition_for_key
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
        with ClusterClient(cluster.bootstrap) as client:
            client.controller_call(
                "CreateTopics",
                controller_pb2.CreateTopicsRequest(
                    topics=[
                        controller_pb2.CreatableTopic(
                            name="clicks", num_partitions=6, replication_factor=1
                        )
                    ]
                ),
            )
            parts = 6
            keys = [f"user-{i}".encode() for i in range(1000)]
            by_part: dict[int, list[int]] = {p: [] for p in range(parts)}
            for i, k in enumerate(keys):
                by_part[partition_for_key(k, parts)].append(i)
            per_batch = 1000
            t0 = time.perf_counter()
            sent = 0
            while sent < records:
                for p, idx in by_part.items():
                    ks = [keys[idx[j % len(idx)]] for j in range(per_batch)]
                    vals = [b"click %d" % (sent + j) for j in range(per_batch)]
                    batch = encode_batch(vals, keys=ks, compression="lz4")
                    req = storage_pb2.ProduceRequest(
                        acks=1,
                        timeout_ms=10000,
                        topics=[
                            storage_pb2.ProduceTopicData(
                                topic="clicks",
                                partitions=[
                                    storage_pb2.ProducePartitionData(
                                        partition=p, records=batch, current_leader_epoch=-1
                                    )
                                ],
                            )
                        ],
                    )
                    resp = client.with_leader(
                        "clicks",
                        p,
                        lambda stub, req=req: stub.Produce(req, timeout=30),
                        lambda r: False,
                    )
                    code = resp.topics[0].partitions[0].error_code
                    if code != common_pb2.ErrorCode.NONE:
                        raise RuntimeError(resp.topics[0].partitions[0].error_message)
                    sent += per_batch
            dt = time.perf_counter() - t0
            print(
                f"produced {sent:,} keyed records to clicks (6 partitions over 3 nodes) in "
                f"{dt:.2f}s: {sent / dt:,.0f} records/s"
            )
            t0 = time.perf_counter()
            got = 0
            for p in range(parts):
                offset = 0
                while True:
                    req = storage_pb2.FetchRequest(
                        replica_id=-1,
                        max_wait_ms=0,
                        max_bytes=8 << 20,
                        topics=[
                            storage_pb2.FetchTopic(
                                topic="clicks",
                                partitions=[
                                    storage_pb2.FetchPartition(
                                        partition=p,
                                        fetch_offset=offset,
                                        current_leader_epoch=-1,
                                        partition_max_bytes=4 << 20,
                                    )
                                ],
                            )
                        ],
                    )
                    r = (
                        client.with_leader(
                            "clicks",
                            p,
                            lambda stub, req=req: stub.Fetch(req, timeout=30),
                            lambda r: False,
                        )
                        .topics[0]
                        .partitions[0]
                    )
                    if not r.records:
                        break
                    table = decode_to_arrow(r.records)
                    got += table.num_rows
                    offset = int(table.column("offset")[-1].as_py()) + 1
            dt = time.perf_counter() - t0
            print(
                f"consumed {got:,} records back as Arrow tables in {dt:.2f}s: "
                f"{got / dt:,.0f} records/s"
            )

            active = cluster.active_controller()
            assert active is not None and active.process is not None
            active.process.signal(signal.SIGKILL)
            t0 = time.perf_counter()
            client.controller_call(
                "CreateTopics",
                controller_pb2.CreateTopicsRequest(
                    topics=[
                        controller_pb2.CreatableTopic(
                            name="after-failover", num_partitions=3, replication_factor=1
                        )
                    ]
                ),
            )
            print(
                f"killed the active controller (SIGKILL); the standby served CreateTopics "
                f"{time.perf_counter() - t0:.2f}s later"
            )

            node = cluster.nodes[0]
            assert node.process is not None
            node.process.kill()
            cluster.restart(node)
            end = client.with_leader(
                "clicks",
                0,
                lambda stub: stub.ListOffsets(
                    storage_pb2.ListOffsetsRequest(
                        replica_id=-1,
                        topics=[
                            storage_pb2.ListOffsetsTopic(
                                topic="clicks",
                                partitions=[
                                    storage_pb2.ListOffsetsPartition(
                                        partition=0, timestamp=-1, current_leader_epoch=-1
                                    )
                                ],
                            )
                        ],
                    ),
                    timeout=30,
                ),
                lambda r: r.topics[0].partitions[0].error_code != common_pb2.ErrorCode.NONE,
            )
            print(
                f"SIGKILLed and restarted storage node {node.ident}: clicks-0 still ends at "
                f"offset {end.topics[0].partitions[0].offset} (recovered from disk)"
            )
        return 0
    finally:
        cluster.stop()
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
