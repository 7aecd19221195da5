"""Log compaction (``cleanup.policy=compact``): keep the latest record per key.

*When* a log is cleaned follows Kafka's log cleaner. Each log remembers its first dirty
offset (``Log.first_dirty_offset``, checkpointed by the LogManager as Kafka's
cleaner-offset-checkpoint): below it the last pass left the log clean, from it on records may
have duplicates. The cleanable part ends at the first uncleanable offset: the active segment,
``max_offset``, which the storage node passes as the partition's last stable offset (Kafka's
first unstable offset: records that may still be truncated or aborted must not decide what
others lose)
and the first dirty segment holding a record younger than ``min.compaction.lag.ms``.
:func:`cleanable_range` measures the log; a log is due when its dirty ratio (cleanable bytes
over clean + cleanable bytes) is above ``min.cleanable.dirty.ratio``, or at once when its
oldest dirty segment began longer ago than ``max.compaction.lag.ms`` (and something is
cleanable). :func:`select_logs` orders the due logs dirtiest first; the storage node cleans
them in that order. :func:`compact` cleans one log from its start to the first uncleanable
offset and moves the first dirty offset there.

The cleaner works a segment at a time on sealed segments only, and holds at most two
segments in memory at a time plus the key map, never the whole log (a multi-GB compacted
topic would otherwise take that much memory at every pass). A first read of every segment below the
``max_offset`` builds the key → latest offset map with Arrow's group-by (C++, no per-record
Python; each segment's map is merged into the log's as the pass goes) and keeps from the
headers what the producer state and the transactions need (:class:`_LogScan`); then each
sealed segment is read again and each batch rewritten with the records that survive, and
runs of adjacent rewritten segments are merged into one file while they fit in
``segment.bytes`` (:class:`_Group`; otherwise every segment ever rolled would stay a file
and an open descriptor). Unlike
Kafka's (``log.cleaner.dedupe.buffer.size``), the map is not bounded: it holds every
distinct key of the log with its latest offset, because it is built from the whole log, the
clean part and the active segment included, not from the dirty part alone. The rewrite finds
each record's key among the map's offsets, sorted once, by binary search, so a pass costs
about its records times log(keys). The log's lock is held only while a segment's bytes are
read (and to swap one in): decoding, grouping and rewriting run beside the partition's
appends and reads, and a truncation or deletion meanwhile makes the pass void.

Offsets are kept (each record's offset delta is explicit), batches keep their base offset,
epoch and producer fields, and a batch left with no records stays as an empty batch covering
its range (runs of non-idempotent ones in one epoch are merged; an idempotent producer's
batch keeps its own header, which the producer state is rebuilt from), so every segment
still tiles its offsets and the log's read-time checks (tiling, epochs, CRCs) still hold. A
batch with records keeps exactly its original offset range. A merged run does not: it covers
batch boundaries a lagging follower may have copied, so a follower's log end can fall inside
it (a follower appends only whole batches from its log end); ``Log.read`` therefore serves
such a filler cut to start at the offset asked for (see ``partition_log._trim_filler``),
never from below a follower's end. Tombstones (null value) and transaction markers are
removed once the segment holding them has taken no append for longer than
``delete.retention.ms`` (:func:`_tombstones_expired`). The new segment is written beside the
old ones as ``.cleaned`` and fsynced; under the log's lock, once no truncation or deletion
voided the pass, it is renamed to ``.swap``, the segments it replaces to ``.deleted`` and the
``.swap`` to ``.log`` (:func:`_swap`), so a crash at any point leaves either the old segments
or the new one (``Log`` finishes a ``.swap`` and discards a ``.cleaned``). After the swaps
the aborted-transactions index drops the aborts whose markers the log no longer holds
(:func:`compact`).
"""

from __future__ import annotations

import logging
import mmap
import os
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strom.log.checkpoint import fsync_dir
from strom.log.errors import CorruptLogError
from strom.log.partition_log import Log
from strom.log.producer_state import BATCHES_KEPT
from strom.log.segment import (
    DELETED_SUFFIX,
    MAX_STORED_BATCH_BYTES,
    EpochLookup,
    LogSegment,
    valid_batches,
)
from strom.log.transactions import AbortedTxn
from strom.record.batch import RecordBatch, decode_batches, encode_body
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    read_header,
    set_log_append_time,
)
from strom.record.schema import BODY_SCHEMA_V1

_log = logging.getLogger("strom.log.cleaner")


@dataclass
class CleanerStats:
    """What one compaction pass did."""

    #: Segments replaced by a rewrite (each member of a merged group counts).
    segments_cleaned: int = 0
    #: Segments merged into the file of the segment before them (see ``_Group``).
    segments_merged: int = 0
    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    #: The log's first dirty offset after the pass (unchanged when the pass was void).
    first_dirty_offset: int = 0
    #: Aborted-transactions index entries dropped with their markers (see compact).
    aborted_pruned: int = 0


@dataclass(frozen=True)
class CleanableRange:
    """How dirty a compacted log is (Kafka's ``LogToClean``), measured in whole segments.

    ``clean_bytes`` are the bytes of segments below ``first_dirty_offset``,
    ``cleanable_bytes`` those from there up to ``first_uncleanable_offset``;
    ``compaction_delay_ms`` is how far the oldest dirty segment is past
    ``max.compaction.lag.ms`` (0 when it is not)."""

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    compaction_delay_ms: int
    min_cleanable_ratio: float

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def dirty_ratio(self) -> float:
        """Share of the cleanable log not cleaned yet (0 for an empty log)."""
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def needs_compaction_now(self) -> bool:
        """max.compaction.lag.ms has passed for the oldest dirty segment."""
        return self.compaction_delay_ms > 0

    @property
    def due(self) -> bool:
        """Whether the cleaner should clean this log now (Kafka's rule: a forced clean needs
        something cleanable; otherwise the dirty ratio must be above the minimum)."""
        if self.total_bytes == 0 or self.cleanable_bytes == 0:
            return False
        return self.needs_compaction_now or self.dirty_ratio > self.min_cleanable_ratio


def _first_dirty(log: Log) -> int:
    """The checkpointed first dirty offset, reset to the log start when it is outside the
    log (retention or DeleteRecords moved the start past it; a truncation cut below it)."""
    first = log.first_dirty_offset
    if first < log.log_start_offset or first > log.log_end_offset:
        first = log.log_start_offset
    return first


def cleanable_range(
    log: Log, now: int | None = None, max_offset: int | None = None
) -> CleanableRange:
    """Measure ``log`` for the cleaner (segment metadata only, no reads).

    ``max_offset`` (exclusive; the storage node passes the partition's last stable offset,
    which is at most its high watermark) bounds what may be cleaned: a segment holding an
    offset at or above it is uncleanable.
    """
    cfg = log.config
    now = log.clock() if now is None else now
    with log.lock:
        first_dirty = _first_dirty(log)
        segments = list(log.segments)
    active = segments[-1]
    limit = active.base_offset if max_offset is None else min(max_offset, active.base_offset)
    uncleanable = active.base_offset
    clean_bytes = cleanable_bytes = 0
    oldest_dirty = -1
    for seg in segments[:-1]:
        if seg.next_offset <= first_dirty:
            clean_bytes += seg.size
            continue
        if seg.first_batch_timestamp > 0 and (
            oldest_dirty < 0 or seg.first_batch_timestamp < oldest_dirty
        ):
            oldest_dirty = seg.first_batch_timestamp
        if uncleanable < active.base_offset:
            continue  # past the first uncleanable segment: only its age counts
        too_young = (
            cfg.min_compaction_lag_ms > 0 and seg.max_timestamp > now - cfg.min_compaction_lag_ms
        )
        if seg.next_offset > limit or too_young:
            uncleanable = seg.base_offset
            continue
        cleanable_bytes += seg.size
    uncleanable = max(uncleanable, first_dirty)
    clean_until = now - cfg.max_compaction_lag_ms
    delay = clean_until - oldest_dirty if 0 <= oldest_dirty < clean_until else 0
    return CleanableRange(
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=uncleanable,
        clean_bytes=clean_bytes,
        cleanable_bytes=cleanable_bytes,
        compaction_delay_ms=delay,
        min_cleanable_ratio=cfg.min_cleanable_dirty_ratio,
    )


K = TypeVar("K")


def measure_logs(
    candidates: Iterable[tuple[K, Log, int | None]], now: int | None = None
) -> list[tuple[K, CleanableRange]]:
    """:func:`cleanable_range` of each compacted log among ``candidates`` (key, log, high
    watermark or None); logs without ``compact`` in their cleanup.policy are skipped."""
    return [
        (key, cleanable_range(log, now, max_offset))
        for key, log, max_offset in candidates
        if log.config.compact
    ]


def dirtiest_first(measured: Iterable[tuple[K, CleanableRange]]) -> list[tuple[K, CleanableRange]]:
    """The logs that are due, highest dirty ratio first (Kafka's "filthiest log" order)."""
    due = [(key, r) for key, r in measured if r.due]
    due.sort(key=lambda kr: kr[1].dirty_ratio, reverse=True)
    return due


def select_logs(
    candidates: Iterable[tuple[K, Log, int | None]], now: int | None = None
) -> list[tuple[K, CleanableRange]]:
    """The compacted logs due for cleaning, dirtiest first, each with its measurements."""
    return dirtiest_first(measure_logs(candidates, now))


def _segment_batches(seg: LogSegment, data: bytes, epoch_for: EpochLookup) -> list[RecordBatch]:
    """``data`` (the first bytes of ``seg``'s file) as checked batches."""
    # FIX: check every batch as a read does (CRC, tiling from the segment base, leader
    # epoch). The cleaner re-frames batches with a fresh CRC, so it must refuse corrupt input
    # rather than turn it into valid-looking data (or have the swap's recover() cut it).
    try:
        batches = decode_batches(data, max_batch_bytes=MAX_STORED_BATCH_BYTES)
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


def _aborted_batches(batches: list[RecordBatch], aborted: list[AbortedTxn]) -> set[int]:
    """Base offsets of the transactional batches that belong to aborted transactions (their
    records are never read by read_committed consumers, so compaction drops them)."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for a in aborted:
        ranges.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))
    out: set[int] = set()
    for b in batches:
        h = b.header
        spans = ranges.get(h.producer_id) if h.is_transactional and not h.is_control else None
        if spans and any(first <= h.base_offset < last for first, last in spans):
            out.add(h.base_offset)
    return out


#: Rows of per-segment key maps the cleaner collects before merging them into its key map
#: (see :class:`_KeyMap`): merging after every segment would group the whole map again for
#: each segment of a log with few keys per segment.
KEY_MAP_MERGE_ROWS = 1 << 16


def _segment_latest(batches: list[RecordBatch], upto: int, skip: set[int]) -> pa.Table | None:
    """The offset of each key's latest record among one segment's ``batches`` below
    ``upto``, leaving out transaction markers and the batches of aborted transactions (base
    offsets in ``skip``), as a table (key, offset); None when the segment has no such record.

    The group-by copies the keys out of the segment's buffers, so the segment can go once
    its map is taken."""
    keys: list[pa.Array] = []
    offsets: list[pa.Array] = []
    for b in batches:
        if b.header.is_control or b.header.base_offset in skip:
            continue
        body = b.body()
        if body.num_rows:
            keys.append(body.column(2))
            offsets.append(pc.add(body.column(0).cast(pa.int64()), b.header.base_offset))
    if not keys:
        return None
    table = pa.table({"key": pa.concat_arrays(keys), "offset": pa.concat_arrays(offsets)})
    table = table.filter(
        pc.and_(pc.is_valid(table.column("key")), pc.less(table.column("offset"), upto))
    )
    return _group_latest(table)


def _group_latest(table: pa.Table) -> pa.Table:
    grouped = table.group_by("key").aggregate([("offset", "max")])
    return pa.table({"key": grouped.column("key"), "offset": grouped.column("offset_max")})


class _KeyMap:
    """Each key's latest offset, built from the segments' own maps (:func:`_segment_latest`)
    as they are read, so the cleaner never holds every record's key of the log at once: the
    maps of the segments read since the last merge are merged (max per key) once they hold
    more rows than the merged map (plus :data:`KEY_MAP_MERGE_ROWS`), which keeps the map
    within about twice its final size and merges a row only a few times over."""

    def __init__(self) -> None:
        self._tables: list[pa.Table] = []
        self._rows = 0
        self._merged_rows = 0

    def add(self, table: pa.Table | None) -> None:
        if table is None or table.num_rows == 0:
            return
        self._tables.append(table)
        self._rows += table.num_rows
        if self._rows > 2 * self._merged_rows + KEY_MAP_MERGE_ROWS:
            self._merge()

    def _merge(self) -> None:
        if len(self._tables) > 1:
            self._tables = [_group_latest(pa.concat_tables(self._tables))]
        self._rows = self._merged_rows = self._tables[0].num_rows if self._tables else 0

    def latest_offsets(self) -> np.ndarray:
        """The offset of each key's latest record (the records compaction keeps), sorted, so
        that a batch finds its own among them by binary search (see :func:`_kept_body`)."""
        self._merge()
        if not self._tables:
            return np.empty(0, np.int64)
        offsets = self._tables[0].column("offset").combine_chunks()
        return np.sort(offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))


class _LogScan:
    """What a cleaning pass keeps of the log between reading it and rewriting it.

    ``compact`` reads the segments one at a time and hands each to :meth:`add`, which keeps
    only the segment's key map, the base offsets of its aborted transactions' batches, and
    from the headers what the producer state and the transactions need. So a pass holds the
    key map and one segment, not the log (a multi-GB compacted topic used to take that much
    memory at every pass); the sealed segments are read again, one at a time, to rewrite
    them."""

    def __init__(
        self, upto: int, end: int, aborted: list[AbortedTxn], expired: AbstractSet[int]
    ) -> None:
        self.upto = upto
        self.end = end
        self.aborted = aborted
        #: Base offsets of the sealed segments whose tombstones and markers may go.
        self.expired = expired
        #: Each segment's size when it was read (base offset -> bytes).
        self.sizes: dict[int, int] = {}
        #: Base offsets of the batches of aborted transactions (see _aborted_batches).
        self.dropped: set[int] = set()
        self.keys = _KeyMap()
        self._recent: dict[int, deque[int]] = {}
        self._open_txns: dict[int, list[int]] = {}
        self._last_marker: dict[int, int] = {}
        #: Finished transactions whose marker lies in an expired cleaned segment:
        #: (producer id, marker base offset, base offsets of its data batches).
        self._done: list[tuple[int, int, list[int]]] = []
        #: Base offsets of the markers (control batches) below ``end``: the aborted
        #: transactions the index must keep, less those the pass removes (see compact).
        self.markers: set[int] = set()

    def add(self, seg: LogSegment, size: int, batches: list[RecordBatch]) -> None:
        """Take what the pass needs from ``seg``'s ``batches`` (segments in offset order),
        read from its first ``size`` bytes."""
        self.sizes[seg.base_offset] = size
        dropped = _aborted_batches(batches, self.aborted)
        self.dropped |= dropped
        self.keys.add(_segment_latest(batches, self.upto, dropped))
        expired = seg.base_offset in self.expired
        for b in batches:
            h = b.header
            if h.producer_id < 0:
                continue
            if h.base_sequence >= 0:
                self._recent.setdefault(h.producer_id, deque(maxlen=BATCHES_KEPT)).append(
                    h.base_offset
                )
            if not h.is_transactional:
                continue
            if h.is_control:
                self._last_marker[h.producer_id] = h.base_offset
                if h.base_offset < self.end:
                    self.markers.add(h.base_offset)
                data = self._open_txns.pop(h.producer_id, [])
                # Only a marker in an expired cleaned segment may go: the others' data
                # batches need not be remembered.
                if expired and h.base_offset < self.end:
                    self._done.append((h.producer_id, h.base_offset, data))
            else:
                self._open_txns.setdefault(h.producer_id, []).append(h.base_offset)

    def recent_producer_batches(self) -> set[int]:
        """Base offsets of each idempotent producer's last BATCHES_KEPT batches: the headers
        a producer-state rebuild needs (DESIGN §6), so an emptied one keeps its own header.
        Older emptied batches of a producer may merge into a run, as Kafka keeps only a
        producer's last batch."""
        return {off for offsets in self._recent.values() for off in offsets}

    def transactions_to_check(self, headers: set[int]) -> list[tuple[int, list[int]]]:
        """The finished transactions whose marker may go if none of their data batches keeps
        a record (see :func:`_removable_transactions`), as (marker base offset, base offsets
        of the data batches): the marker lies in an expired cleaned segment and is not its
        producer's last one, and none of the batches is among ``headers``."""
        return [
            (marker, data)
            for producer_id, marker, data in self._done
            if marker != self._last_marker[producer_id] and not any(d in headers for d in data)
        ]


def compact(log: Log, now: int | None = None, max_offset: int | None = None) -> CleanerStats:
    """Clean ``log`` now, whatever its dirty ratio: every segment from the log start to the
    first uncleanable offset (see :func:`cleanable_range`), then move the log's first dirty
    offset there. ``max_offset`` bounds what is cleaned and decides nothing above it: the
    storage node passes the last stable offset (None: the log end).

    A pass holds the key map and at most two segments at a time, never the whole log: it
    reads the segments once, one by one, for the key map and the headers the transactions
    need (:class:`_LogScan`), then reads each sealed segment again to rewrite it, merging
    adjacent rewritten segments into one file while they fit (:class:`_Group`).

    Once every group is swapped in, the aborted-transactions index forgets the aborts below
    the cleaned end whose markers the log no longer holds (this pass removed them, or an
    earlier pass a crash interrupted before it pruned), as Kafka's cleaner rewrites a
    cleaned segment's transaction index: a compacted log's start never moves, so the index
    grew with every abort ever written, was loaded at every start and listed to every
    read_committed fetch from an early offset. Pruning comes after the swaps, so a crash
    between the two leaves only entries whose batches are empty (see
    :meth:`~strom.log.transactions.AbortedIndex.prune`); a void pass prunes nothing."""
    cfg = log.config
    now = log.clock() if now is None else now
    with log.lock:
        rng = cleanable_range(log, now, max_offset)
        stats = CleanerStats(first_dirty_offset=rng.first_dirty_offset)
        # Keys are judged against everything below max_offset (the last stable offset),
        # active segment included, so a key rewritten recently makes its old records in
        # sealed segments obsolete; records above it may still be truncated or aborted, so
        # they decide nothing.
        upto = log.log_end_offset if max_offset is None else min(max_offset, log.log_end_offset)
        # FIX: never past the high watermark, even when the checkpointed first dirty offset
        # is above it (a high watermark read back lower after a restart, or lowered by a new
        # leader): a segment holding records at or above it would lose them, as their keys
        # are not in the key map (found from outside).
        end = min(rng.first_uncleanable_offset, upto)
        # FIX: clean only a prefix of the log (up to Kafka's first uncleanable offset).
        # Picking eligible segments one by one could drop an expired tombstone while an older
        # segment, held back by one young record, still has the value it deleted.
        sealed = [s for s in log.segments[:-1] if s.next_offset <= end]
        if not sealed:
            return stats
        expired = {
            s.base_offset for s in sealed if _tombstones_expired(s, now, cfg.delete_retention_ms)
        }
        scan = _LogScan(upto, end, list(log.aborted.entries), expired)
        # FIX: the segments are read, checked and grouped outside the log's lock (only each
        # file's read holds it): a pass over a large log held it for seconds, and every
        # append and read of the partition waited (a truncation or deletion meanwhile makes
        # the pass void, as in the rewrite below).
        reading = [(seg, seg.size) for seg in log.segments if seg.base_offset < upto]
        truncations = log.truncations
    for seg, size in reading:
        # One segment's batches at a time: only what the scan takes of them stays.
        batches = _read_checked(log, seg, size, truncations, sealed=False)
        if batches is None:
            return stats  # the log changed under the cleaner: this pass is void
        scan.add(seg, size, batches)
        del batches
    latest = scan.keys.latest_offsets()
    recent = scan.recent_producer_batches()
    removable = _removable_transactions(
        log, sealed, scan, scan.transactions_to_check(recent), latest, truncations
    )
    if removable is None:
        return stats  # the log changed under the cleaner: this pass is void
    void = False
    group = _Group(log, truncations, recent, removable)
    try:
        for seg in sealed:
            read = _read_segment(log, seg, scan.sizes[seg.base_offset], truncations)
            if read is None:
                void = True
                break  # the log changed under the cleaner: this pass is void
            data, batches = read
            new_data, before, after = _rewrite(
                batches, latest, seg.base_offset in expired, recent, scan.dropped, removable
            )
            count = len(batches)
            del batches  # the old segment's bytes need not outlive its rewrite...
            changed = new_data is not None
            piece = data if new_data is None else new_data
            del data, new_data  # ...unless they are what the group takes of it
            stats.records_before += before
            stats.records_after += after
            stats.bytes_before += seg.size
            stats.bytes_after += len(piece)
            if not group.fits(seg, piece, count) and not group.finish(stats):
                void = True
                break  # the log changed under the cleaner: this pass is void
            group.add(seg, piece, changed, count)
            del piece
        if not void and not group.finish(stats):
            void = True
    except Exception:
        group.discard()
        raise
    group.discard()  # what a void pass had written
    if not void:
        with log.lock:
            if log.truncations == truncations:
                log.first_dirty_offset = max(end, rng.first_dirty_offset)
                stats.aborted_pruned = log.aborted.prune(
                    end, scan.markers - removable, fsync=log._fsync
                )
            stats.first_dirty_offset = log.first_dirty_offset
    return stats


def _tombstones_expired(seg: LogSegment, now: int, delete_retention_ms: int) -> bool:
    """Whether the tombstones and transaction markers of sealed segment ``seg`` may go: the
    segment has taken no append for longer than ``delete.retention.ms``.

    The time is the broker's, never a record's: a producer's CreateTime may be days old (a
    replay, a backfill, a skewed clock), and tombstones judged by it went on the first
    cleaning, before a consumer that had read the deleted value could see the delete. A
    segment's last append is at or after every record it holds was written, so a tombstone
    stays readable at least ``delete.retention.ms`` after this replica wrote it (Kafka before
    3.1 also counts from the cleaned segment's last-modified time). ``_swap`` keeps that time
    (and the file's mtime, which a restart reads it from) across cleanings; segments merged
    into one take the newest one's, so no tombstone goes earlier than in its own segment."""
    return now - seg.last_append_ms > delete_retention_ms


def _removable_transactions(
    log: Log,
    sealed: list[LogSegment],
    scan: _LogScan,
    candidates: list[tuple[int, list[int]]],
    latest: np.ndarray,
    truncations: int,
) -> set[int] | None:
    """Base offsets of the batches (data and marker) of the transactions whose marker may go;
    None when the log changed since it was read (the pass is then void).

    Kafka's rule: a marker is removed once every record of its transaction has been removed
    and the marker is older than ``delete.retention.ms`` (its segment's, see
    :func:`_tombstones_expired`), so a consumer that read the transaction's records before
    they were cleaned still finds its outcome. strom adds what its header-based producer
    state needs: the transaction's batches must not be among the producer's last
    BATCHES_KEPT and the marker must not be the producer's last one (it carries the
    producer's epoch and coordinator epoch for a rebuild from the log). The marker must lie
    below the end of the cleaned segments. ``candidates``
    (:meth:`_LogScan.transactions_to_check`) meet every rule but the first, which needs the
    whole key map: the sealed segments holding their data batches are read again (one at a
    time) to see whether any of those keeps a record. The transaction's emptied batches then
    lose their producer fields too, so a rebuild opens no transaction for them, and an
    aborted one's entry leaves the aborted-transactions index once the pass has swapped the
    segments in (:func:`compact`; FIX (found from outside): entries used to stay until
    retention dropped them, which on a compacted topic is never: 300 aborts kept 300
    entries, loaded at every start and listed to read_committed fetches)."""
    needed = sorted({d for _, data in candidates for d in data})
    keeping: set[int] = set()  # data batches of the candidates that keep a record
    for seg in sealed:
        i = bisect_left(needed, seg.base_offset)
        if i == len(needed) or needed[i] >= seg.next_offset:
            continue
        batches = _read_checked(log, seg, scan.sizes[seg.base_offset], truncations)
        if batches is None:
            return None
        drop_tombstones = seg.base_offset in scan.expired
        wanted = set(needed[i : bisect_left(needed, seg.next_offset)])
        for b in batches:
            off = b.header.base_offset
            if off in wanted and _kept_body(b, latest, drop_tombstones, scan.dropped).num_rows:
                keeping.add(off)
    out: set[int] = set()
    for marker, data in candidates:
        if not any(d in keeping for d in data):
            out.add(marker)
            out.update(data)
    return out


def _read_checked(
    log: Log, seg: LogSegment, size: int, truncations: int, *, sealed: bool = True
) -> list[RecordBatch] | None:
    """The checked batches of ``seg``'s first ``size`` bytes; None when the log was
    truncated, or the segment deleted or closed, since the pass measured it (the key map may
    then be wrong, and a deleted segment's descriptor may be closed or reused), or when a
    ``sealed`` segment's size changed. See :func:`_read_segment`."""
    read = _read_segment(log, seg, size, truncations, sealed=sealed)
    return None if read is None else read[1]


def _read_segment(
    log: Log, seg: LogSegment, size: int, truncations: int, *, sealed: bool = True
) -> tuple[bytes, list[RecordBatch]] | None:
    """``seg``'s first ``size`` bytes and their checked batches (views of those bytes), or
    None as :func:`_read_checked` says. The bytes are what a segment left unchanged by the
    rewrite contributes to a merged file (see :class:`_Group`).

    Only the file's read holds the log's lock; the decode and checks run outside it, so
    appends and reads of the partition wait for one ``pread``, not for a segment's decode.
    A check failing while the log changed under it is a void pass, not damage."""
    with log.lock:
        if (
            log.truncations != truncations
            or seg.closed
            or seg not in log.segments
            or (seg.size != size if sealed else seg.size < size)
        ):
            return None
        data = os.pread(seg.fd, size, 0)
    try:
        return data, _segment_batches(seg, data, log.epochs.epoch_for)
    except CorruptLogError:
        with log.lock:
            if log.truncations != truncations or seg not in log.segments:
                return None
        raise


def _kept_body(
    b: RecordBatch, latest: np.ndarray, drop_tombstones: bool, aborted: set[int]
) -> pa.RecordBatch:
    """The records of data batch ``b`` that compaction keeps (tombstones only while
    ``drop_tombstones`` is false: see :func:`_tombstones_expired`). ``latest`` is the sorted
    array of each key's latest offset (:meth:`_KeyMap.latest_offsets`)."""
    h = b.header
    body = b.body()
    if body.num_rows == 0:
        return body
    if h.base_offset in aborted:
        return body.slice(0, 0)
    offsets = body.column(0).to_numpy(zero_copy_only=False).astype(np.int64) + h.base_offset
    # FIX: a binary search in the sorted map, not ``pc.is_in(offsets, value_set=latest)``,
    # which hashed the whole map again for every batch: a pass cost batches x keys (100,000
    # keys in 4,000 batches: 29 s of CPU; twice both: 126 s), now batches x log(keys).
    if len(latest):
        found = latest[np.minimum(np.searchsorted(latest, offsets), len(latest) - 1)]
        latest_here = found == offsets
    else:
        latest_here = np.zeros(len(offsets), bool)
    keep = pc.or_(pa.array(latest_here), pc.is_null(body.column(2)))
    if drop_tombstones:
        tombstone = pc.and_(pc.is_null(body.column(3)), pc.is_valid(body.column(2)))
        keep = pc.and_(keep, pc.invert(tombstone))
    return body.filter(keep)


def _mergeable(h: BatchHeader, headers: set[int], removable: AbstractSet[int]) -> bool:
    """Whether an emptied batch may lose its header in a merged run of empty batches."""
    if h.base_offset in removable:
        return True
    if h.attributes & (ATTR_TRANSACTIONAL | ATTR_CONTROL):
        return False
    return h.producer_id < 0 or h.base_offset not in headers


def _rewrite(
    batches: list[RecordBatch],
    latest: np.ndarray,
    drop_tombstones: bool,
    headers: set[int],
    aborted: set[int],
    removable: AbstractSet[int] = frozenset(),
) -> tuple[bytes | None, int, int]:
    """Rewrite one segment's batches; None when nothing would be removed. Tombstones go
    when ``drop_tombstones`` (the segment's time is past delete.retention.ms).

    Transactions: markers (control batches) are kept whole; every record of an aborted
    transaction's batch (base offsets in ``aborted``) is dropped, its header kept, so the
    producer state and the open/closed transactions rebuilt from the log stay the same.
    The batches of a transaction in ``removable`` (see :func:`_removable_transactions`),
    its marker included, become plain empty batches without producer fields.

    Consecutive batches left empty are merged into one empty batch covering their offsets
    (an Arrow body costs about 600 bytes even without rows, so unmerged they would keep most
    of a compacted log of small batches on disk, growing with every batch ever written),
    unless a batch's header is needed: the last BATCHES_KEPT batches of each idempotent
    producer (base offsets in ``headers``). A merged run has no records, producer fields or
    transaction bits, so a read from inside it gets it cut at the offset read (a lagging
    follower's log end may lie inside it)."""
    out: list[bytes] = []
    pending: RecordBatch | None = None  # first of a run of now-empty batches
    pending_last = pending_max_ts = -1
    pending_count = 0
    before = after = 0
    changed = False

    def flush_pending() -> None:
        nonlocal pending
        if pending is not None:
            strip = pending_count > 1 or pending.header.base_offset in removable
            out.append(_empty_batch(pending.header, pending_last, pending_max_ts, strip))
            pending = None

    for b in batches:
        h = b.header
        removed = h.base_offset in removable
        if h.is_control and not removed:
            flush_pending()
            out.append(b.raw.tobytes())
            continue
        if h.is_control:
            body = kept = b.body().slice(0, 0)  # the marker record is not a data record
        else:
            body = b.body()
            kept = _kept_body(b, latest, drop_tombstones, aborted)
        before += body.num_rows
        after += kept.num_rows
        if kept.num_rows != body.num_rows or removed:
            changed = True
        if kept.num_rows == 0:
            if (
                pending is not None
                and pending.header.partition_leader_epoch == h.partition_leader_epoch
                # A recent idempotent batch keeps its own header: its producer id, epoch and
                # sequence range are what rebuilds the producer state (DESIGN §6).
                and _mergeable(pending.header, headers, removable)
                and _mergeable(h, headers, removable)
            ):
                pending_last = h.last_offset
                pending_max_ts = max(pending_max_ts, h.max_timestamp)
                pending_count += 1
            else:
                flush_pending()
                pending, pending_last, pending_max_ts = b, h.last_offset, h.max_timestamp
                pending_count = 1
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


def _empty_batch(h: BatchHeader, last_offset: int, max_ts: int, merged: bool) -> bytes:
    """An empty batch covering the base offset of the batch with header ``h`` to
    ``last_offset``. A merged run keeps the newest timestamp of its batches (retention by
    time and the time index see the same segment maximum) and no producer fields (the
    sequences of several batches do not fit one header), nor the transactional and control
    bits, which mean nothing without them."""
    attributes = h.attributes & ~(ATTR_TRANSACTIONAL | ATTR_CONTROL) if merged else h.attributes
    return encode_body(
        pa.RecordBatch.from_pylist([], schema=BODY_SCHEMA_V1),
        attributes=attributes,
        base_offset=h.base_offset,
        last_offset_delta=last_offset - h.base_offset,
        base_timestamp=max_ts,
        max_timestamp=max_ts,
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=-1 if merged else h.producer_id,
        producer_epoch=-1 if merged else h.producer_epoch,
        base_sequence=-1 if merged else h.base_sequence,
    )


#: Relative offsets in a segment's indexes are 32-bit (``strom.log.index``): no batch of a
#: merged segment may start further than this above the segment's base offset.
_MAX_RELATIVE_OFFSET = (1 << 31) - 1


class _Group:
    """A run of adjacent sealed segments that a pass rewrites into one file, named by the
    first one's base offset (Kafka's ``groupSegmentsBySize``).

    FIX (found from outside): each segment used to be rewritten on its own, so a compacted
    log kept one file, and one open descriptor, for every segment it ever rolled: a topic of
    one key kept a segment of one 621-byte empty batch per max.compaction.lag.ms (1,440 a
    day at a minute), until the node ran out of file descriptors. A segment now joins the
    group before it while the group's rewritten bytes stay within segment.bytes, its batches
    within what segment.index.bytes indexes (each batch can add an entry to each index),
    and its offsets within the indexes' 32-bit relative offsets; segments that do not tile
    (a gap between them) or are empty start a group of their own. An empty batch ending one
    member and one starting the next merge as runs do inside a segment (:func:`_rewrite`),
    so merged segments keep no filler per former boundary and a second pass finds nothing
    to do.

    The bytes go to ``<first>.log.cleaned`` as they come, so a pass holds at most two
    segments, never the group: the first member's bytes are held until a second one joins
    (a segment left alone and unchanged is not written again), and the last batch written
    is held until the next member shows whether its first batch merges with it."""

    def __init__(
        self, log: Log, truncations: int, headers: set[int], removable: AbstractSet[int]
    ) -> None:
        self.log = log
        self.truncations = truncations
        self.headers = headers
        self.removable = removable
        self._reset()

    def _reset(self) -> None:
        self.segs: list[LogSegment] = []
        self.changed = False
        self.length = 0  # the group's bytes once written (boundary merges counted)
        self.batches = 0
        self._pieces = 0  # the members' rewritten bytes, before boundary merges
        self._first: bytes | None = None  # the first member's bytes, not looked into yet
        self._body: bytes | memoryview = b""  # ...or all of them but the last batch
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._written = 0
        self._tail = b""  # the last batch, held back (see the class docstring)
        self._tail_header: BatchHeader | None = None

    def fits(self, seg: LogSegment, data: bytes, batches: int) -> bool:
        """Whether ``seg``, rewritten to ``data`` (``batches`` batches), may join."""
        if not self.segs:
            return True
        cfg = self.log.config
        head, last = self.segs[0], self.segs[-1]
        if not (
            head.size > 0
            and seg.size > 0
            and last.next_offset == seg.base_offset
            and self.batches + batches <= min(cfg.max_index_entries, cfg.max_time_index_entries)
            and seg.next_offset - 1 - head.base_offset <= _MAX_RELATIVE_OFFSET
        ):
            return False
        self._split_first()
        return self.length + self._joined(data)[0] <= cfg.segment_bytes

    def _split_first(self) -> None:
        """Hold the first member's last batch apart from the rest (a second one may join)."""
        if self._first is None:
            return
        view = memoryview(self._first)
        self._first = None
        last = _last_batch(view)
        self._body, self._tail = view[:last], bytes(view[last:])
        self._tail_header = read_header(self._tail, 0)

    def _joined(self, data: bytes) -> tuple[int, bytes | None, BatchHeader]:
        """What ``data`` adds to the group's length, and the batch its first batch and the
        held last one merge into (None when they do not: see :func:`_rewrite`)."""
        first = read_header(data, 0)
        t = self._tail_header
        if (
            t is None
            or t.record_count
            or first.record_count
            or t.partition_leader_epoch != first.partition_leader_epoch
            or not _mergeable(t, self.headers, self.removable)
            or not _mergeable(first, self.headers, self.removable)
        ):
            return len(data), None, first
        merged = _empty_batch(t, first.last_offset, max(t.max_timestamp, first.max_timestamp), True)
        return len(data) - first.size - len(self._tail) + len(merged), merged, first

    def add(self, seg: LogSegment, data: bytes, changed: bool, batches: int) -> None:
        """Add ``seg``, rewritten to ``data`` (its own bytes when ``changed`` is false)."""
        self._pieces += len(data)
        self.batches += batches
        self.changed = self.changed or changed
        if not self.segs:
            self.segs.append(seg)
            self.length = len(data)
            self._first = data
            return
        self.segs.append(seg)
        self.changed = True  # merging segments is a change, even of unchanged ones
        self._split_first()
        if self._file is None:
            self._open()
            self._emit(self._body)
            self._body = b""
        added, merged, first = self._joined(data)
        self.length += added
        view = memoryview(data)
        start = 0
        if merged is not None:
            self._tail, self._tail_header = merged, read_header(merged, 0)
            start = first.size
            if start == len(view):
                return  # that batch was all of ``data``: the merged one stays held
        last = _last_batch(view)
        self._emit(self._tail)
        self._emit(view[start:last])
        self._tail = bytes(view[last:])
        self._tail_header = read_header(self._tail, 0)

    def _open(self) -> None:
        head = self.segs[0]
        self._path = head.log_path.with_name(head.log_path.name + ".cleaned")
        self._file = open(self._path, "wb")  # noqa: SIM115 (closed in finish or discard)

    def _emit(self, data: bytes | memoryview) -> None:
        assert self._file is not None
        self._file.write(data)
        self._written += len(data)

    def finish(self, stats: CleanerStats) -> bool:
        """Swap the group in (when it changed anything) and start a new one; False when the
        log changed under the pass (see :func:`_swap`)."""
        segs = self.segs
        if not segs or not self.changed:
            self._reset()
            return True
        if self._file is None:
            self._open()  # one segment, rewritten: the common case, written in one go
            if self._first is not None:
                self._emit(self._first)
            else:
                self._emit(self._body)
                self._emit(self._tail)
        else:
            self._emit(self._tail)
        assert self._file is not None and self._path is not None
        f = self._file
        f.flush()
        # The segment's last-append time decides when its tombstones go; a restart reads it
        # from the mtime, so the rewrite must not make the segment look freshly written. A
        # merged segment takes its newest member's: no tombstone goes before its own time.
        ns = max(s.last_append_ms for s in segs) * 1_000_000
        os.utime(f.fileno(), ns=(ns, ns))
        os.fsync(f.fileno())
        f.close()
        self._file = None
        path, written, pieces = self._path, self._written, self._pieces
        self._path = None
        self._reset()
        if not _swap(self.log, segs, path, written, self.truncations):
            return False
        stats.segments_cleaned += len(segs)
        stats.segments_merged += len(segs) - 1
        stats.bytes_after -= pieces - written  # boundary merges
        return True

    def discard(self) -> None:
        """Drop the group's unfinished file (a void pass, or an error such as a full disk:
        a partial ``.cleaned`` file would hold the disk's last free space until the next
        pass or restart)."""
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._reset()


def _last_batch(view: memoryview) -> int:
    """The position of the last batch of the whole batches in ``view``."""
    last = pos = 0
    while pos < len(view):
        last = pos
        pos += read_header(view, pos).size
    return last


def _swap(log: Log, segs: list[LogSegment], cleaned: Path, length: int, truncations: int) -> bool:
    """Replace the adjacent segments ``segs`` by the rewritten file ``cleaned`` (``length``
    bytes, written and fsynced), named by the first one's base offset, atomically with
    respect to a crash, and rebuild its indexes.

    Returns False (and changes nothing) when the log was truncated or one of the segments
    deleted since the cleaner read them. Raises :class:`CorruptLogError` (and changes
    nothing) when the new file would not recover whole: see :func:`_check_rewritten`.

    Kafka's order: ``.cleaned`` is renamed to ``.swap``, the replaced segments' files to
    ``.deleted``, then ``.swap`` to ``.log``, with a directory fsync after each step. A
    ``.swap`` on disk is the commitment: opening the log completes it, deleting every
    segment in the swap's offset range (``Log._finish_swaps``); before it exists, opening
    discards the ``.cleaned`` file. FIX (found from outside): the ``.swap`` used to be made
    before the check below, outside the lock; a crash in between, while retention deleted
    the segment or a follower truncated it, left a swap that the next start finished,
    bringing back deleted records or truncated bytes. It is now made under the lock, after
    the check, so every ``.swap`` a start finds belongs to segments the log still held."""
    head = segs[0]
    try:
        _check_rewritten(cleaned, head.base_offset, length, log.epochs.epoch_for)
    except CorruptLogError:
        cleaned.unlink(missing_ok=True)
        with log.lock:
            # Checked outside the lock: a truncation or deletion meanwhile may have moved the
            # epoch history under it. Then the pass is void, as below, not an error.
            if log.truncations != truncations or not _still_held(log, segs):
                return False
        raise
    except Exception:
        cleaned.unlink(missing_ok=True)  # no partial work left on disk (see _Group.discard)
        raise
    with log.lock:
        # FIX: the rewrite ran outside the lock. A truncation meanwhile (follower, new leader)
        # makes the key map wrong (its "latest" records may be gone) and may have cut these
        # segments; retention may have deleted them. Swapping then would bring back removed
        # data or drop values that are the latest again: discard the work instead.
        if log.truncations != truncations or not _still_held(log, segs):
            cleaned.unlink(missing_ok=True)
            return False
        directory = head.directory
        swap = head.log_path.with_name(head.log_path.name + ".swap")
        try:
            os.replace(cleaned, swap)
        except Exception:
            cleaned.unlink(missing_ok=True)
            raise
        fsync_dir(directory)
        i = log.segments.index(head)
        head.close()
        # The old segment's index must not be found beside the new file by a start after the
        # last rename: one that passed its sanity check would be trusted.
        head.index.path.unlink(missing_ok=True)
        retired: list[Path] = []
        for seg in segs[1:]:
            retired += seg.rename_for_delete()
        if log.config.file_delete_delay_ms > 0:
            # Keep the replaced file for file.delete.delay.ms, as Kafka does. A crash between
            # the two renames leaves the .swap without its .log: opening the log finishes it.
            old = head.log_path.with_name(head.log_path.name + DELETED_SUFFIX)
            os.replace(head.log_path, old)
            retired.append(old)
        if len(segs) > 1:
            # The merged segment must not appear beside the segments it replaces, even after
            # a power loss that kept the last rename but not the others.
            fsync_dir(directory)
        os.replace(swap, head.log_path)
        fsync_dir(directory)
        fresh = log._new_segment(head.base_offset)
        cut = fresh.recover(log.epochs.epoch_for)
        if cut:  # checked above: only the disk can have changed the file since
            _log.error("%s: the compacted segment lost %d bytes on reopening", fresh.log_path, cut)
        fresh.created_ms = head.created_ms
        fresh.last_append_ms = max(s.last_append_ms for s in segs)
        log.segments[i : i + len(segs)] = [fresh]
        log._bases[i : i + len(segs)] = [head.base_offset]
        log._schedule_delete(retired)
        return True


def _still_held(log: Log, segs: list[LogSegment]) -> bool:
    """Whether ``segs`` are still adjacent segments of ``log`` (none deleted or closed)."""
    try:
        i = log.segments.index(segs[0])
    except ValueError:
        return False
    held = log.segments[i : i + len(segs)]
    return len(held) == len(segs) and all(
        a is b and not a.closed for a, b in zip(held, segs, strict=True)
    )


def _check_rewritten(path: Path, base_offset: int, length: int, epoch_for: EpochLookup) -> None:
    """Raise :class:`CorruptLogError` unless the rewritten segment file at ``path`` recovers
    to all of its ``length`` bytes, by the rule recovery applies after the swap
    (:func:`strom.log.segment.valid_batches`).

    A safety net (found from outside): a batch the rule refuses would be cut there by the
    swap's own recovery, with everything after it, on every replica at once, and the pass
    would still count the segment as cleaned. The old segment is kept instead, and the
    error reaches the storage node's log ("compacting <partition> failed") on every pass
    until the cause is fixed; the pass stops there, so what it cleaned is a prefix of the
    log, as a void pass leaves it."""
    if length == 0:
        return
    with open(path, "rb") as f, mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            valid = sum(h.size for h in valid_batches(view, base_offset, epoch_for))
        finally:
            view.release()
    if valid != length:
        raise CorruptLogError(
            f"{path}: the compacted segment would recover to {valid} of its {length} bytes "
            "(swap refused, the segment is kept as it was)"
        )
