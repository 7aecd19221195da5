"""The end of a chaos run: read every partition back through the clients, and every replica's
log files straight from the disk.

:func:`final_reads` runs against the healed cluster: the whole input topic (read_uncommitted),
the pipeline's output topic (read_committed and read_uncommitted), the high watermark and
last stable offset of every partition, and both groups' committed offsets.
:func:`scan_replicas` runs after the cluster was stopped: for every replica of every workload
partition it lists the batches in its segment files with a CRC-32C of each batch's bytes, so
the checker can compare replicas byte for byte below the high watermark.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import crc32c

from strom import Consumer, TopicPartition
from strom.errors import StromError, UnstableOffsetCommitError
from strom.record.errors import InvalidBatchError
from strom.record.header import check_header, read_header
from tests.chaos.workload import GROUP, INPUT, OUTPUT, TXN_GROUP


def read_topic(
    bootstrap: str, topic: str, isolation: str, *, timeout_s: float = 120.0
) -> tuple[dict[int, list[tuple[int, str | None, str | None]]], dict[int, int]]:
    """Every record of ``topic`` as partition -> [(offset, key, value)], up to the end offsets
    (the HW, or the LSO for read_committed) taken at the start; and those end offsets."""
    with Consumer(
        bootstrap,
        auto_offset_reset="earliest",
        isolation_level=isolation,
        request_timeout_ms=10_000,
        max_partition_fetch_bytes=4 << 20,
    ) as c:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
        c.assign(tps)
        c.seek_to_beginning(tps)
        ends = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
        out: dict[int, list[tuple[int, str | None, str | None]]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                behind = {tp.partition: (c.position(tp), ends[tp.partition]) for tp in tps}
                raise TimeoutError(f"final read of {topic} did not reach the end: {behind}")
            for r in c.poll(timeout_ms=500, max_records=10_000):
                if r.offset < ends[r.partition]:
                    out[r.partition].append(
                        (
                            r.offset,
                            None if r.key is None else r.key.decode(),
                            None if r.value is None else r.value.decode(),
                        )
                    )
        return out, ends


#: How long the final read waits for a group's offsets to become stable: a pipeline stopped
#: in the middle of a transaction leaves it open until the coordinator aborts it after the
#: transaction timeout (20 s in the workload), and its offsets are unstable until then.
STABLE_WAIT_S = 120.0


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, stable (read_committed): raises UnstableOffsetCommitError
    when a transaction still holds them after :data:`STABLE_WAIT_S` (a hanging transaction)."""
    deadline = time.monotonic() + STABLE_WAIT_S
    with Consumer(
        bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
        request_timeout_ms=10_000,
    ) as c:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
        while True:
            try:
                got = c.committed(tps)
            except UnstableOffsetCommitError:
                if time.monotonic() >= deadline:
                    raise
                continue
            return {tp.partition: om.offset for tp, om in got.items() if om is not None}  # type: ignore[union-attr]


def final_reads(bootstrap: str) -> dict[str, Any]:
    data_in, hw_in = read_topic(bootstrap, INPUT, "read_uncommitted")
    out_rc, lso_out = read_topic(bootstrap, OUTPUT, "read_committed")
    out_ru, hw_out = read_topic(bootstrap, OUTPUT, "read_uncommitted")
    problems: list[str] = []
    committed: dict[str, dict[str, int]] = {}
    for group in (GROUP, TXN_GROUP):
        try:
            offsets = committed_offsets(bootstrap, group, INPUT)
        except UnstableOffsetCommitError as exc:
            problems.append(f"txn_hanging: {exc} after {STABLE_WAIT_S:.0f} s")
            offsets = {}
        except StromError as exc:  # reported with everything else the checker finds
            problems.append(f"final_offsets: group {group}'s committed offsets unreadable: {exc}")
            offsets = {}
        committed[group] = {str(p): o for p, o in offsets.items()}
    return {
        "problems": problems,
        "input": {str(p): recs for p, recs in data_in.items()},
        "input_hw": {str(p): o for p, o in hw_in.items()},
        "output_committed": {str(p): recs for p, recs in out_rc.items()},
        "output_lso": {str(p): o for p, o in lso_out.items()},
        "output_uncommitted_count": sum(len(v) for v in out_ru.values()),
        "output_hw": {str(p): o for p, o in hw_out.items()},
        "committed": committed,
    }


def scan_log_dir(directory: Path) -> dict[str, Any]:
    """Batches of one replica directory in offset order: [base, last, crc32c of the bytes]."""
    batches: list[list[int]] = []
    problems: list[str] = []
    for seg in sorted(directory.glob("*.log")):
        data = seg.read_bytes()
        pos = 0
        while pos < len(data):
            try:
                h = read_header(data, pos)
                check_header(h, data)
            except InvalidBatchError as exc:
                if any(data[pos:]):  # zeros past the end are preallocation, not damage
                    problems.append(f"{seg.name}: {exc}")
                break
            batches.append([h.base_offset, h.last_offset, crc32c.crc32c(data[pos : pos + h.size])])
            pos += h.size
    batches.sort()
    return {"batches": batches, "problems": problems}


def scan_replicas(data_dirs: dict[str, Path], topics: tuple[str, ...] = (INPUT, OUTPUT)) -> dict:
    """node name -> "topic-p" -> scan_log_dir result, for the workload topics."""
    out: dict[str, dict[str, Any]] = {}
    for node, root in data_dirs.items():
        out[node] = {}
        if not root.is_dir():
            continue
        for d in sorted(root.iterdir()):
            if not d.is_dir():
                continue
            topic, _, part = d.name.rpartition("-")
            if topic in topics and part.isdigit():
                out[node][d.name] = scan_log_dir(d)
    return out
