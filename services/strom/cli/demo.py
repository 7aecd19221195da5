"""``strom demo``: the main job, as far as strom exists today.

Until the cluster services land this runs the storage engine end to end in a temporary data
directory: append keyed records to a partition log, read them back, compact a changelog,
apply retention, then reopen after a simulated crash and show recovery cutting a torn tail.
Later issues replace it with a local cluster and a producer → consumer pipeline.
"""

from __future__ import annotations

import os
import shutil
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
