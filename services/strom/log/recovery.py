"""Opening a partition log: recovery of its segments, producer state and epoch history.

:class:`LogRecovery` is mixed into :class:`strom.log.partition_log.Log`; ``Log.__init__``
calls ``_load``, which finishes compaction swaps a crash interrupted, loads the segments
(trusted ones by their indexes, the rest by a scan of their batches, cut at the first torn or
corrupt one), truncates the log where a segment lost data, and rebuilds the idempotent
producers' state from the newest snapshot plus the batch headers after it. Truncations
rebuild the producer state the same way (``_rebuild_producer_state``), and rolls and
``close`` write the snapshots (``_snapshot_producers``).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from strom.log.checkpoint import fsync_dir
from strom.log.epoch_cache import LeaderEpochCache
from strom.log.errors import CorruptLogError
from strom.log.producer_state import (
    ProducerStateManager,
    delete_snapshots,
    list_snapshots,
    load_snapshot,
    snapshot_path,
    write_snapshot,
)
from strom.log.segment import LogSegment, valid_batches
from strom.log.transactions import AbortedIndex, AbortedTxn, Marker, decode_marker
from strom.record.errors import InvalidBatchError
from strom.record.header import BatchHeader

_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
#: Producer-state snapshots kept beside the segments (the newest, and one to fall back on).
_SNAPSHOTS_KEPT = 2

_log = logging.getLogger("strom.log")


class LogRecovery:
    """A log's opening and recovery, and the producer-state snapshots they start from.

    A mixin rather than an object of its own: recovery sets up the log's own fields
    (segments, start and recovery offsets, producer state, epochs), which the append and
    read paths then use as they are, with no second object to reach through. Every
    attribute is set by ``Log.__init__``; the annotations say which ones recovery uses.
    """

    # -- set by Log.__init__ ---------------------------------------------------------------
    directory: Path
    clock: Callable[[], int]
    _fsync: bool
    epochs: LeaderEpochCache
    epochs_trusted: bool
    segments: list[LogSegment]
    _bases: list[int]
    log_start_offset: int
    recovery_point: int
    truncated_bytes_on_recovery: int
    lost_on_recovery: list[tuple[int, int]]
    producers: ProducerStateManager
    producer_batches_scanned: int
    aborted: AbortedIndex

    if TYPE_CHECKING:  # the Log's

        @property
        def log_end_offset(self) -> int: ...

        def _new_segment(self, base: int) -> LogSegment: ...

        def _new_active_segment(self, base: int) -> LogSegment: ...

    def _load(self, clean_shutdown: bool) -> None:
        for p in self.directory.iterdir():
            if p.name.endswith((".cleaned", ".tmp", ".deleted")):
                p.unlink(missing_ok=True)
        self._finish_swaps()
        bases = sorted(
            int(m.group(1)) for p in self.directory.iterdir() if (m := _SEGMENT_RE.match(p.name))
        )
        # Index files whose segment is gone are leftovers of an interrupted delete.
        for p in self.directory.glob("*.*index"):
            if not (self.directory / (p.stem + ".log")).exists():
                p.unlink(missing_ok=True)
        segs = [self._new_segment(b) for b in bases]
        epoch_check = self.epochs.epoch_for if self.epochs_trusted else None
        if not self.epochs_trusted:
            self.epochs.clear()
        recovering = False
        kept: list[LogSegment] = []
        for i, seg in enumerate(segs):
            trusted = (
                not recovering
                and self.epochs_trusted
                and (
                    clean_shutdown
                    or (i + 1 < len(segs) and segs[i + 1].base_offset <= self.recovery_point)
                )
            )
            cut = 0
            if not (trusted and seg.load_trusted()):
                recovering = True
                cut = seg.recover(
                    epoch_check,
                    on_batch=None if self.epochs_trusted else self._rebuild_epoch,
                )
                self.truncated_bytes_on_recovery += cut
            kept.append(seg)
            lost = self._lost_data(seg, segs[i + 1] if i + 1 < len(segs) else None, cut)
            if cut or lost:
                # Everything after a torn or corrupt batch, or after offsets the segment lost,
                # is unreachable: drop later segments.
                for later in segs[i + 1 :]:
                    self.truncated_bytes_on_recovery += later.size
                    later.delete()
                break
        # Drop empty non-active segments left behind by a crash during roll.
        while len(kept) > 1 and kept[-1].size == 0 and kept[-2].next_offset == kept[-1].base_offset:
            kept.pop().delete()
        if not kept:
            kept = [self._new_active_segment(max(self.log_start_offset, 0))]
        self.segments = kept
        self._bases = [s.base_offset for s in kept]
        leo = self.log_end_offset
        self.epochs.truncate_from_end(leo)
        first_base = self.segments[0].base_offset
        self.log_start_offset = min(max(self.log_start_offset, first_base), leo)
        self.recovery_point = min(self.recovery_point, leo) if not clean_shutdown else leo
        if self.truncated_bytes_on_recovery or self.lost_on_recovery:
            # Operators must see it: the replica now holds less than before the crash (a
            # follower fetches the rest again; a leader had it replicated or never acked it).
            _log.warning(
                "%s: recovery truncated %d bytes of torn, corrupt or unreachable data; the "
                "log now ends at offset %d",
                self.directory,
                self.truncated_bytes_on_recovery,
                leo,
            )
        self._rebuild_producer_state()

    def _finish_swaps(self) -> None:
        """Complete the compaction swaps a crash interrupted (``strom.log.cleaner_swap._swap``).

        A ``<base>.log.swap`` file is complete and was checked before it was made, under the
        log's lock, so it replaces whatever it covers: every segment whose base offset lies
        in its offset range goes (the cleaner merges adjacent segments into one file; some
        may already be renamed ``.deleted``, which opening removes anyway), then the swap
        takes the first one's name. Its old indexes go too, so it is recovered in full."""
        for swap in sorted(self.directory.glob("*.swap")):
            target = swap.with_suffix("")
            m = _SEGMENT_RE.match(target.name)
            if m is None:
                continue
            base = int(m.group(1))
            end = _swap_end(swap, base)
            covered = [
                p
                for p in self.directory.iterdir()
                if (other := _SEGMENT_RE.match(p.name)) and base < int(other.group(1)) < end
            ]
            for p in covered:
                for name in (p.name, f"{p.stem}.index", f"{p.stem}.timeindex"):
                    (self.directory / name).unlink(missing_ok=True)
            if covered and self._fsync:
                fsync_dir(self.directory)  # gone before the swap shows, even on power loss
            os.replace(swap, target)
            target.with_suffix(".index").unlink(missing_ok=True)
            if self._fsync:
                fsync_dir(self.directory)

    def _lost_data(self, seg: LogSegment, nxt: LogSegment | None, cut: int) -> bool:
        """Whether ``seg`` (just loaded or recovered) lost offsets that were in the log:
        it ends below the next segment's base offset (``nxt``), or, for the last segment,
        its index files listed a batch past the data its file still holds. Warns with the
        files and offsets and records the range in ``lost_on_recovery``.

        A non-last segment's ``.log`` emptied or cut exactly at a
        batch boundary recovers without a torn batch, so the log opened with a hole, silently:
        reads jumped to the next segment, consumers skipped acknowledged records, and the
        damaged replica (its log end unchanged) rejoined the ISR and led again. The rule:
        strom never writes a gap between segments. Compaction keeps emptied batches (a
        segment keeps its offset range), retention and DeleteRecords drop segments from the
        front, truncations cut the end, and a follower starts a segment at a gap only when
        its leader's log has one, which only lost data makes (that leader's own next start
        then truncates it too). So a gap is lost data, except wholly below the log start,
        where nothing is served anyway. The caller truncates the log there, as at a torn
        batch, and a follower fetches the rest from the leader again."""
        end = seg.next_offset if seg.size else seg.base_offset
        if nxt is not None:
            if end >= nxt.base_offset or nxt.base_offset <= self.log_start_offset:
                return False
            first, upto = max(end, self.log_start_offset), nxt.base_offset
            self.lost_on_recovery.append((first, upto))
            _log.warning(
                "%s: ends at offset %d but the next segment, %s, starts at %d: offsets "
                "%d..%d are missing (the file lost data); truncating the log at %d, dropping "
                "the segments after it (a follower fetches them again from the leader)",
                seg.log_path,
                end,
                nxt.log_path.name,
                upto,
                first,
                upto - 1,
                end,
            )
            return True
        listed = seg.indexed_past_end
        if cut or listed is None or listed < end:
            return False
        # The last segment: nothing after it to drop, the log simply ends earlier.
        self.lost_on_recovery.append((end, listed + 1))
        _log.warning(
            "%s: its index listed a batch at offset %d but the file ends at offset %d: "
            "offsets %d..%d at least are missing (the file lost data)",
            seg.log_path,
            listed,
            end,
            end,
            listed,
        )
        return True

    def _rebuild_producer_state(self) -> None:
        """Producer state from the newest usable snapshot at or below the log end offset plus
        the batch headers after it (header reads only). Snapshots above the log end describe
        batches that are gone (truncation, crash) and are deleted."""
        leo = self.log_end_offset
        offsets = list_snapshots(self.directory)
        delete_snapshots(self.directory, [o for o in offsets if o > leo])
        state: ProducerStateManager | None = None
        start = -1
        for off in reversed([o for o in offsets if o <= leo]):
            try:
                state = load_snapshot(self.directory, off)
                start = off
                break
            except (OSError, ValueError):
                snapshot_path(self.directory, off).unlink(missing_ok=True)
        if state is None:
            state = ProducerStateManager()
        # Aborts before the snapshot come from the index file; later ones from the scan.
        self.aborted.load(below=max(start, 0))
        now = self.clock()
        scanned = 0
        for seg in self.segments:
            if seg.next_offset <= start or seg.size == 0:
                continue
            pos = 0
            if start > seg.base_offset:
                found = seg.locate(start)
                if found is None:
                    continue
                pos = found[0]
            headers = [h for h in seg.batch_headers(pos) if h.base_offset >= start]
            scanned += len(headers)
            markers = {h.base_offset: self._marker_at(seg, h) for h in headers if h.is_control}
            for pid, first, last in state.update(headers, now, markers):
                self.aborted.remember(AbortedTxn(last, pid, first))
        state.evict_below(self.log_start_offset)
        self.producers = state
        self.producer_batches_scanned = scanned
        self.aborted.entries = [
            e for e in self.aborted.entries if e.last_offset >= self.log_start_offset
        ]
        self.aborted.save()

    @staticmethod
    def _marker_at(seg: LogSegment, h: BatchHeader) -> Marker:
        """The marker in the control batch ``h`` of ``seg``."""
        try:
            return decode_marker(os.pread(seg.fd, h.size, h.position))
        except (InvalidBatchError, ValueError) as exc:
            raise CorruptLogError(
                f"{seg.log_path}: control batch at offset {h.base_offset} is damaged: {exc}"
            ) from exc

    def _snapshot_producers(self, *, fsync: bool = False) -> None:
        """Write the producer state as of the log end offset; keep the newest few."""
        leo = self.log_end_offset
        write_snapshot(self.directory, leo, self.producers, fsync=fsync)
        older = [o for o in list_snapshots(self.directory) if o < leo]
        delete_snapshots(self.directory, older[: max(len(older) - (_SNAPSHOTS_KEPT - 1), 0)])

    def _rebuild_epoch(self, h: BatchHeader) -> None:
        if h.partition_leader_epoch > self.epochs.latest_epoch:
            self.epochs.assign(h.partition_leader_epoch, h.base_offset)


def _swap_end(path: Path, base: int) -> int:
    """The offset after the last batch of the compaction swap file ``path`` (a segment
    starting at ``base``), by the rule recovery applies (a damaged tail ends it early: the
    recovery that follows cuts the segment there and drops the segments after it)."""
    end = base
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return end
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                for h in valid_batches(view, base, None):
                    end = h.next_offset
            finally:
                view.release()
    return end
