"""Log compaction (``cleanup.policy=compact``): keep the latest record per key.

The cleaner works a segment at a time on sealed segments only. It builds the key → latest
offset map with Arrow's group-by (C++, no per-record Python), then rewrites each batch with
the records that survive. Offsets are kept (each record's offset delta is explicit), batches
keep their base offset, epoch and producer fields, and a batch left with no records stays as
an empty batch covering its range (runs of non-idempotent ones in one epoch are merged; an
idempotent producer's batch keeps its own header, which the producer state is rebuilt from),
so every segment still tiles its offsets and every read-time check still holds. Tombstones
(null value) are removed once older than ``delete.retention.ms``. The new segment is written
beside the old one as ``.cleaned``, fsynced, renamed to ``.swap`` and then over the original,
so a crash at any point leaves either the old or the new segment (``Log`` finishes or
discards the swap).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strom.log.checkpoint import fsync_dir
from strom.log.errors import CorruptLogError
from strom.log.partition_log import Log
from strom.log.segment import EpochLookup, LogSegment
from strom.record.batch import RecordBatch, decode_batches, encode_body
from strom.record.errors import InvalidBatchError
from strom.record.header import ATTR_LOG_APPEND_TIME, set_log_append_time
from strom.record.schema import BODY_SCHEMA_V1


@dataclass
class CleanerStats:
    """What one compaction pass did."""

    segments_cleaned: int = 0
    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def _segment_batches(seg: LogSegment, epoch_for: EpochLookup) -> list[RecordBatch]:
    data = os.pread(seg.fd, seg.size, 0)
    # FIX: check every batch as a read does (CRC, tiling from the segment base, leader
    # epoch). The cleaner re-frames batches with a fresh CRC, so it must refuse corrupt input
    # rather than turn it into valid-looking data (or have the swap's recover() cut it).
    try:
        batches = decode_batches(data)
    except InvalidBatchError as exc:
        raise CorruptLogError(f"{seg.log_path}: {exc}") from None
    expected = seg.base_offset
    for b in batches:
        h = b.header
        if h.base_offset != expected or h.partition_leader_epoch != epoch_for(h.base_offset):
            raise CorruptLogError(
                f"{seg.log_path}: batch at position {h.position} (base offset {h.base_offset}, "
                f"epoch {h.partition_leader_epoch}) breaks the offset sequence or epoch history"
            )
        expected = h.next_offset
    return batches


def _latest_offsets(batches: list[RecordBatch]) -> pa.Array:
    keys: list[pa.Array] = []
    offsets: list[pa.Array] = []
    for b in batches:
        body = b.body()
        if body.num_rows:
            keys.append(body.column(2))
            offsets.append(pc.add(body.column(0).cast(pa.int64()), b.header.base_offset))
    if not keys:
        return pa.array([], pa.int64())
    table = pa.table({"key": pa.concat_arrays(keys), "offset": pa.concat_arrays(offsets)})
    table = table.filter(pc.is_valid(table.column("key")))
    latest = table.group_by("key").aggregate([("offset", "max")])
    return latest.column("offset_max").combine_chunks()


def compact(log: Log, now: int | None = None) -> CleanerStats:
    """Compact every sealed segment of ``log`` that is older than ``min.compaction.lag.ms``."""
    cfg = log.config
    now = log.clock() if now is None else now
    stats = CleanerStats()
    with log.lock:
        # FIX: clean only the prefix of sealed segments old enough (Kafka's first uncleanable
        # offset). Picking eligible segments one by one could drop an expired tombstone while
        # an older segment, held back by one young record, still has the value it deleted.
        sealed = []
        for s in log.segments[:-1]:
            if s.max_timestamp >= 0 and now - s.max_timestamp < cfg.min_compaction_lag_ms:
                break
            sealed.append(s)
        if not sealed:
            return stats
        # Keys are judged against everything up to the log end, active segment included,
        # so a key rewritten recently makes its old records in sealed segments obsolete.
        per_segment = {
            s.base_offset: _segment_batches(s, log.epochs.epoch_for) for s in log.segments
        }
        truncations = log.truncations
    everything = [b for batches in per_segment.values() for b in batches]
    latest = _latest_offsets(everything)
    tombstone_horizon = now - cfg.delete_retention_ms
    for seg in sealed:
        batches = per_segment[seg.base_offset]
        new_data, before, after = _rewrite(batches, latest, tombstone_horizon)
        stats.records_before += before
        stats.records_after += after
        stats.bytes_before += seg.size
        if new_data is None:
            stats.bytes_after += seg.size
            continue
        if not _swap(log, seg, new_data, truncations):
            break  # the log changed under the cleaner: this pass is void
        stats.segments_cleaned += 1
        stats.bytes_after += len(new_data)
    return stats


def _rewrite(
    batches: list[RecordBatch], latest: pa.Array, tombstone_horizon: int
) -> tuple[bytes | None, int, int]:
    """Rewrite one segment's batches; None when nothing would be removed."""
    out: list[bytes] = []
    pending: RecordBatch | None = None  # first of a run of now-empty batches
    pending_last = -1
    before = after = 0
    changed = False

    def flush_pending() -> None:
        nonlocal pending
        if pending is not None:
            out.append(_empty_batch(pending, pending_last))
            pending = None

    for b in batches:
        h = b.header
        body = b.body()
        before += body.num_rows
        if body.num_rows == 0:
            kept = body
        else:
            offsets = pc.add(body.column(0).cast(pa.int64()), h.base_offset)
            keep = pc.or_(pc.is_in(offsets, value_set=latest), pc.is_null(body.column(2)))
            if h.attributes & ATTR_LOG_APPEND_TIME:
                stamps = pa.array(np.full(body.num_rows, h.max_timestamp, dtype=np.int64))
            else:
                stamps = pc.add(body.column(1), h.base_timestamp)
            expired_tombstone = pc.and_(
                pc.is_null(body.column(3)),
                pc.and_(pc.is_valid(body.column(2)), pc.less(stamps, tombstone_horizon)),
            )
            keep = pc.and_(keep, pc.invert(expired_tombstone))
            kept = body.filter(keep)
        after += kept.num_rows
        if kept.num_rows != body.num_rows:
            changed = True
        if kept.num_rows == 0:
            if (
                pending is not None
                and pending.header.partition_leader_epoch == h.partition_leader_epoch
                # An idempotent batch keeps its own header: its producer id, epoch and
                # sequence range are what rebuilds the producer state (DESIGN §6).
                and pending.header.producer_id < 0
                and h.producer_id < 0
            ):
                pending_last = h.last_offset
            else:
                flush_pending()
                pending, pending_last = b, h.last_offset
            continue
        flush_pending()
        out.append(b.raw.tobytes() if kept.num_rows == body.num_rows else _kept_batch(b, kept))
    flush_pending()
    if not changed:
        return None, before, after
    return b"".join(out), before, after


def _kept_batch(b: RecordBatch, kept: pa.RecordBatch) -> bytes:
    h = b.header
    ts = kept.column(1).to_numpy() + h.base_timestamp
    base_ts = int(ts[0])
    rel = pa.array(ts - base_ts)
    body = pa.RecordBatch.from_arrays(
        [kept.column(0), rel, kept.column(2), kept.column(3), kept.column(4)],
        schema=BODY_SCHEMA_V1,
    )
    data = encode_body(
        body,
        attributes=h.attributes,
        base_offset=h.base_offset,
        last_offset_delta=h.last_offset_delta,
        base_timestamp=base_ts,
        max_timestamp=h.max_timestamp,
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )
    if h.attributes & ATTR_LOG_APPEND_TIME:
        buf = bytearray(data)
        set_log_append_time(buf, decode_batches(buf)[0].header, h.max_timestamp)
        data = bytes(buf)
    return data


def _empty_batch(first: RecordBatch, last_offset: int) -> bytes:
    h = first.header
    return encode_body(
        pa.RecordBatch.from_pylist([], schema=BODY_SCHEMA_V1),
        attributes=h.attributes,
        base_offset=h.base_offset,
        last_offset_delta=last_offset - h.base_offset,
        base_timestamp=h.max_timestamp,
        max_timestamp=h.max_timestamp,
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )


def _swap(log: Log, seg: LogSegment, data: bytes, truncations: int) -> bool:
    """Replace ``seg``'s file with ``data`` atomically and rebuild its indexes.

    Returns False (and changes nothing) when the log was truncated or the segment deleted
    since the cleaner read it."""
    cleaned = seg.log_path.with_name(seg.log_path.name + ".cleaned")
    with open(cleaned, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    swap = seg.log_path.with_name(seg.log_path.name + ".swap")
    os.replace(cleaned, swap)
    fsync_dir(seg.directory)
    with log.lock:
        # FIX: the rewrite ran outside the lock. A truncation meanwhile (follower, new leader)
        # makes the key map wrong (its "latest" records may be gone) and may have cut this
        # segment; retention may have deleted it. Swapping then would bring back removed data
        # or drop values that are the latest again: discard the work instead.
        if log.truncations != truncations or seg not in log.segments:
            swap.unlink(missing_ok=True)
            return False
        i = log.segments.index(seg)
        seg.close()
        os.replace(swap, seg.log_path)
        fsync_dir(seg.directory)
        fresh = log._new_segment(seg.base_offset)
        fresh.recover(log.epochs.epoch_for)
        fresh.created_ms = seg.created_ms
        log.segments[i] = fresh
        return True
