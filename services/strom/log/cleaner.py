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

This module holds the pass (:func:`compact`) and what it decides on its own (which
tombstones and transactions may go, reads checked against a log that changed); the rest is
in modules named after what they hold: :mod:`strom.log.cleaner_selection` (when a log is
cleaned, :class:`CleanerStats`), :mod:`strom.log.cleaner_scan` (the key map and the headers'
scan), :mod:`strom.log.cleaner_rewrite` (the records kept, batch by batch) and
:mod:`strom.log.cleaner_swap` (merged files, their check and swap). The public names are still
importable from here.
"""

from __future__ import annotations

import logging
import os
import weakref
from bisect import bisect_left

import numpy as np

from strom.log.cleaner_rewrite import _kept_body, _rewrite
from strom.log.cleaner_scan import _LogScan, _segment_batches
from strom.log.cleaner_selection import (
    CleanableRange,
    CleanerStats,
    cleanable_range,
    dirtiest_first,
    measure_logs,
    select_logs,
)
from strom.log.cleaner_swap import _Group
from strom.log.errors import CorruptLogError
from strom.log.partition_log import Log
from strom.log.segment import LogSegment
from strom.record.batch import RecordBatch

log_ = logging.getLogger(__name__)

__all__ = [
    "CleanableRange",
    "CleanerStats",
    "cleanable_range",
    "compact",
    "dirtiest_first",
    "measure_logs",
    "select_logs",
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
        # Never past the high watermark, even when the checkpointed first dirty offset
        # is above it (a high watermark read back lower after a restart, or lowered by a new
        # leader): a segment holding records at or above it would lose them, as their keys
        # are not in the key map.
        end = min(rng.first_uncleanable_offset, upto)
        # Clean only a prefix of the log (up to Kafka's first uncleanable offset).
        # Picking eligible segments one by one could drop an expired tombstone while an older
        # segment, held back by one young record, still has the value it deleted.
        sealed = [s for s in log.segments[:-1] if s.next_offset <= end]
        if not sealed:
            return stats
        expired = {
            s.base_offset for s in sealed if _tombstones_expired(s, now, cfg.delete_retention_ms)
        }
        scan = _LogScan(upto, end, list(log.aborted.entries), expired)
        # The segments are read, checked and grouped outside the log's lock (only each
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
    stats.undecodable_batches = len(scan.undecodable)
    _report_undecodable(log, scan.undecodable)
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
                batches,
                latest,
                seg.base_offset in expired,
                recent,
                scan.dropped,
                scan.undecodable,
                removable,
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


#: Log -> (first offset, count) of the undecodable batches last warned of.
_undecodable_reported: weakref.WeakKeyDictionary[Log, tuple[int, int]] = weakref.WeakKeyDictionary()


def _report_undecodable(log: Log, offsets: set[int]) -> None:
    """One WARNING per partition for the data batches whose body cannot be decoded, again
    only when the set changes: the pass succeeds (they are kept as they are), and a line
    every pass on every replica would bury the logs."""
    if not offsets:
        return
    first, count = min(offsets), len(offsets)
    if _undecodable_reported.get(log) == (first, count):
        return
    _undecodable_reported[log] = (first, count)
    log_.warning(
        "compacting %s: %d batch(es) whose body cannot be decoded, first at offset %d, kept "
        "as they are (their keys are unknown); readers are refused there with "
        "CORRUPT_MESSAGE until they seek past it or the records are deleted",
        log.directory.name,
        count,
        first,
    )


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
    segments in (:func:`compact`; retention, which would drop it otherwise, never comes on a
    compacted topic)."""
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
            if off not in wanted:
                continue
            kept = _kept_body(b, latest, drop_tombstones, scan.dropped, scan.undecodable)
            if kept is None or kept.num_rows:  # an undecodable batch may hold records
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
