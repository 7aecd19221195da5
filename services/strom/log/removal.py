"""Removing data from a partition log: truncation at its end, retention and DeleteRecords
at its start, and the delayed unlinking of the files that go.

:class:`LogRemoval` is mixed into :class:`strom.log.partition_log.Log`. A follower truncates
where its log diverges from its leader's (``truncate_to``) or restarts it empty
(``truncate_fully_and_start_at``); DeleteRecords and retention move the log start up and
drop whole segments below it (``delete_records``, ``apply_retention``). Segments removed
from use are renamed ``.deleted`` and unlinked after ``file.delete.delay.ms``
(``_retire``, ``delete_expired_files``). Every change holds the log's lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from strom.log.config import LogConfig
from strom.log.epoch_cache import LeaderEpochCache
from strom.log.errors import InvalidAppendError, OffsetOutOfRangeError
from strom.log.producer_state import ProducerStateManager, delete_snapshots, list_snapshots
from strom.log.segment import LogSegment
from strom.log.transactions import AbortedIndex

_log = logging.getLogger("strom.log")


class LogRemoval:
    """Truncation, retention, DeleteRecords and the unlinking of deleted segment files.

    A mixin rather than an object of its own: each removal changes the log's segment list,
    offsets, epochs and producer state together under its lock, which the append and read
    paths use as they are. Every attribute is set by ``Log.__init__``; the annotations say
    which ones it uses.
    """

    # -- set by Log.__init__ ---------------------------------------------------------------
    directory: Path
    config: LogConfig
    clock: Callable[[], int]
    monotonic: Callable[[], int]
    pending_deletes: list[tuple[int, list[Path]]]
    lock: threading.RLock
    epochs: LeaderEpochCache
    segments: list[LogSegment]
    _bases: list[int]
    log_start_offset: int
    recovery_point: int
    truncations: int
    first_dirty_offset: int
    producers: ProducerStateManager
    aborted: AbortedIndex

    if TYPE_CHECKING:  # the Log's (and LogRecovery's)

        @property
        def active(self) -> LogSegment: ...

        @property
        def log_end_offset(self) -> int: ...

        @property
        def size_bytes(self) -> int: ...

        def _new_active_segment(self, base: int) -> LogSegment: ...

        def _roll(self, base: int) -> LogSegment: ...

        def _rebuild_producer_state(self) -> None: ...

    def _schedule_delete(self, paths: list[Path]) -> None:
        """Unlink ``paths`` (already renamed to ``.deleted``) after ``file.delete.delay.ms``,
        as Kafka does, so that anyone still reading an old file finishes first. The delay is
        counted on the monotonic clock, as Kafka's scheduler counts it: on the wall clock, a
        node stepped back N hours kept the deleted segments' disk for N hours more (found
        from outside), one stepped forward unlinked files readers still had open."""
        if paths:
            due = self.monotonic() + self.config.file_delete_delay_ms
            self.pending_deletes.append((due, paths))
            if self.config.file_delete_delay_ms <= 0:
                self.delete_expired_files()

    def _retire(self, seg: LogSegment) -> None:
        """Remove a segment from use: rename its files to ``.deleted`` and delete them later
        (an empty segment, which nobody can be reading, goes at once)."""
        if seg.size == 0:
            seg.delete()
        else:
            self._schedule_delete(seg.rename_for_delete())

    def delete_expired_files(self, now: int | None = None) -> int:
        """Unlink the ``.deleted`` files whose delay is over (``now``: on ``self.monotonic``);
        returns how many were unlinked. The storage node calls it from its periodic cleanup
        task."""
        now = self.monotonic() if now is None else now
        with self.lock:
            due = [paths for when, paths in self.pending_deletes if when <= now]
            self.pending_deletes = [(w, p) for w, p in self.pending_deletes if w > now]
        count = 0
        for paths in due:
            for p in paths:
                try:
                    p.unlink()
                    count += 1
                except FileNotFoundError:
                    pass
        return count

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= ``offset`` (follower truncation).

        An ``offset`` below the log start (Kafka's UnifiedLog.truncateTo) empties the log and
        restarts it there (truncate_fully_and_start_at): every readable record lies above the
        point where this replica's log stopped being the leader's. This happens after an
        unclean election to a replica that missed a DeleteRecords: its log ends below our
        log start, and its records from there on are not ours. Refusing (or stopping at our
        log start) kept our own records above the divergence point, which then passed for
        the leader's once our log reached its end."""
        with self.lock:
            if offset >= self.log_end_offset:
                # No batch to remove, but the epoch history may end with an epoch that
                # holds none (this replica led in it and its append failed): the leader does
                # not know it, so a follower naming it would truncate to its end in a loop.
                # Kafka's truncateTo drops such entries too.
                self.epochs.truncate_from_end(self.log_end_offset)
                return
            if offset < 0:
                raise InvalidAppendError(f"cannot truncate to a negative offset ({offset})")
            if offset < self.log_start_offset:
                _log.warning(
                    "%s: truncating to %d, below the log start %d: the log restarts empty there",
                    self.directory,
                    offset,
                    self.log_start_offset,
                )
                self.truncate_fully_and_start_at(offset)
                return
            while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
                self._retire(self.segments.pop())
                self._bases.pop()
            self.active.truncate_to(offset)
            self.truncations += 1
            # The cleaner's checkpoint never points past the end (Kafka truncates it too).
            self.first_dirty_offset = min(self.first_dirty_offset, offset)
            leo = self.log_end_offset
            self.epochs.truncate_from_end(leo)
            self.recovery_point = min(self.recovery_point, leo)
            # The batch holding ``offset`` may start below the log start (DeleteRecords
            # mid-batch): keep log_start_offset <= log_end_offset.
            self.log_start_offset = min(self.log_start_offset, leo)
            # Producer state cannot be rolled back batch by batch: rebuild it from the newest
            # snapshot below the new end (snapshots above it are deleted) and the headers.
            self._rebuild_producer_state()

    def truncate_fully_and_start_at(self, offset: int, *, log_start_offset: int = -1) -> None:
        """Drop all data and restart the log at ``offset`` (a follower far behind the
        leader's log start). ``log_start_offset``, when above ``offset``, is the log start
        to keep: the leader's, inside the first batch to come (see append_as_follower)."""
        with self.lock:
            for seg in self.segments:
                self._retire(seg)
            seg = self._new_active_segment(offset)
            self.segments = [seg]
            self._bases = [offset]
            self.epochs.clear()
            self.log_start_offset = max(offset, log_start_offset)
            self.recovery_point = offset
            self.first_dirty_offset = self.log_start_offset
            self.truncations += 1
            delete_snapshots(self.directory, list_snapshots(self.directory))
            self.producers.clear()
            self.aborted.entries = []
            self.aborted.save()

    def delete_records(self, offset: int) -> int:
        """DeleteRecords: advance the log start offset to ``offset`` and drop whole segments
        below it. Returns the new log start offset (the low watermark)."""
        with self.lock:
            leo = self.log_end_offset
            if offset < 0 or offset > leo:
                raise OffsetOutOfRangeError(offset, self.log_start_offset, leo)
            if offset > self.log_start_offset:
                self.log_start_offset = offset
                self.producers.evict_below(offset)
            # Do not cut the epoch history at ``offset``: batches below it stay on disk
            # (the rest of the first kept segment, the batch holding ``offset``) and every
            # read and recovery checks their epochs against this history. Only epochs of
            # deleted segments are forgotten (in _delete_oldest).
            self._delete_segments_below_start()
            return self.log_start_offset

    def _delete_segments_below_start(self) -> int:
        deleted = 0
        while len(self.segments) > 1 and self.segments[0].next_offset <= self.log_start_offset:
            self._delete_oldest()
            deleted += 1
        return deleted

    def _delete_oldest(self) -> None:
        seg = self.segments.pop(0)
        self._bases.pop(0)
        self._retire(seg)
        new_start = self.segments[0].base_offset
        if new_start > self.log_start_offset:
            self.log_start_offset = new_start
        # Forget epochs only below the first segment still on disk (see delete_records).
        self.epochs.truncate_from_start(new_start)
        self.producers.evict_below(self.log_start_offset)
        self.aborted.drop_below(self.log_start_offset)

    def apply_retention(self, now: int | None = None, high_watermark: int | None = None) -> int:
        """Delete whole segments past ``retention.ms`` or ``retention.bytes``.

        Offsets are never reused: the log start offset moves up to the first kept segment.
        Only segments wholly below ``high_watermark`` go, as in Kafka (the next segment's base
        offset at or below it): records not yet committed may still be needed (a follower
        that has not copied them, a leader change) and the log start never passes the high
        watermark. None (the engine on its own, no replication) bounds nothing for sealed
        segments. With ``high_watermark`` at the log end (everything committed), an active segment
        whose newest record is past ``retention.ms``, and that has taken no append for as
        long, goes too, as in Kafka (which does not wait for the idle time): a new empty
        segment takes over first (otherwise a quiet topic would keep its last records
        forever, as segment.ms rolls only on an append). Also forgets idempotent producers
        idle for ``producer.id.expiration.ms``. Returns the number of segments deleted.
        """
        with self.lock:
            self.producers.expire(
                self.clock() if now is None else now, self.config.producer_id_expiration_ms
            )
        if not self.config.delete:
            with self.lock:
                return self._delete_segments_below_start()
        now = self.clock() if now is None else now
        deleted = 0
        with self.lock:
            deleted += self._delete_segments_below_start()
            total = self.size_bytes
            while len(self.segments) > 1:
                seg = self.segments[0]
                if high_watermark is not None and self.segments[1].base_offset > high_watermark:
                    break  # Uncommitted records were deleted
                too_old = (
                    self.config.retention_ms >= 0
                    and seg.max_timestamp >= 0
                    and now - seg.max_timestamp > self.config.retention_ms
                )
                too_big = (
                    self.config.retention_bytes >= 0
                    and total - seg.size >= self.config.retention_bytes
                )
                if not (too_old or too_big):
                    break
                total -= seg.size
                self._delete_oldest()
                deleted += 1
            active = self.active
            if (
                high_watermark is not None
                and len(self.segments) == 1
                and active.size
                and high_watermark >= self.log_end_offset
                and self.config.retention_ms >= 0
                and active.max_timestamp >= 0
                and now - active.max_timestamp > self.config.retention_ms
                # and idle that long: records just written with old timestamps (a backfill)
                # are not deleted the moment they land. On the wall clock, like the
                # retention test beside it (a step moves both alike, as retention.ms is
                # documented to be), and because last_append_ms is the file's mtime after a
                # restart: a monotonic count would start over at each restart, holding an
                # expired quiet segment for retention.ms more every time.
                and now - active.last_append_ms > self.config.retention_ms
            ):
                self._roll(self.log_end_offset)
                self._delete_oldest()
                deleted += 1
        return deleted
