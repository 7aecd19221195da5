"""When the log cleaner cleans a log, and what one pass did.

:func:`cleanable_range` measures a log (its first dirty and first uncleanable offsets, the
clean and cleanable bytes, whether it is due), :func:`measure_logs`, :func:`dirtiest_first`
and :func:`select_logs` order the due logs as Kafka's cleaner does, and
:class:`CleanerStats` is what :func:`strom.log.cleaner.compact` reports. They are separate
from the pass itself (:mod:`strom.log.cleaner`) because the storage node reads only these for
its choice of logs and its compaction gauges; :mod:`strom.log.cleaner` re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from strom.log.partition_log import Log


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
    #: Data batches whose body could not be decoded, kept as they are (see compact).
    undecodable_batches: int = 0


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
