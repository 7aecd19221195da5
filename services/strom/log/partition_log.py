"""The log of one partition replica: ordered segments, appends, reads, recovery, retention.

Hot paths work per batch: an append validates headers and CRCs, patches offsets and the
leader epoch in place and writes the request with one ``pwrite``; a read is one ``pread`` of
whole batches. Structural changes (roll, truncate, delete, swap) hold ``lock``; the slow part
of a flush (fsync) does not, so a background flush never stalls the event loop's appends.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import mmap
import os
import random
import re
import shutil
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from strom.clock import monotonic_ms, wall_ms
from strom.log.checkpoint import fsync_dir
from strom.log.config import LONG_MAX, LogConfig
from strom.log.epoch_cache import LeaderEpochCache
from strom.log.errors import (
    CorruptLogError,
    InvalidAppendError,
    InvalidTimestampError,
    OffsetOutOfRangeError,
)
from strom.log.producer_state import (
    DUPLICATE_SEQUENCE,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    MAX_SEQUENCE,
    OUT_OF_ORDER_SEQUENCE,
    TRANSACTION_COORDINATOR_FENCED,
    BatchMetadata,
    ProducerEntry,
    ProducerStateError,
    ProducerStateManager,
    delete_snapshots,
    list_snapshots,
    load_snapshot,
    snapshot_path,
    write_snapshot,
)
from strom.log.segment import MAX_STORED_BATCH_BYTES, LogSegment, valid_batches
from strom.log.transactions import (
    AbortedIndex,
    AbortedTxn,
    Marker,
    decode_marker,
    encode_marker,
)
from strom.record.batch import RecordBatch, decode_batches, encode_body, timestamp_extremes
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    patch_base_offset,
    patch_leader_epoch,
    read_header,
    scan_batches,
    set_log_append_time,
)
from strom.record.schema import BODY_SCHEMA_V1

_LEADER_PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
#: How far the search for a retried batch older than every batch its producer's state keeps
#: (``Log._find_older_batch``) may walk: from at most this many offsets before where the
#: batch would lie were its producer's records contiguous, at most this many headers and this
#: many bytes of log (the bytes nearest that place: the pages a cold walk may read). Why
#: these: a walk runs under the log's lock, and on the node's event loop for a small request
#: (``strom.storage.writer``); 100,000 headers of one-record batches took 42-68 ms on a
#: loaded 2-core machine (headers only, 64 KiB per ``pread``), and 64 MiB of 2 KB records
#: (some 30,000 headers) 17-25 ms. A walk happens only for a retry the kept batches do not
#: answer (after a failover or lost answers) whose batch is not exactly where contiguous
#: records put it (checked first: one offset-index lookup); it covers a producer's batches
#: with up to 100,000 records of others between them. A retry can never make the node read
#: more.
OLDER_BATCH_SEARCH_OFFSETS = 100_000
OLDER_BATCH_SEARCH_HEADERS = 100_000
OLDER_BATCH_SEARCH_BYTES = 64 << 20
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
#: Producer-state snapshots kept beside the segments (the newest, and one to fall back on).
_SNAPSHOTS_KEPT = 2
#: The body of a batch without records (see _trim_filler).
_EMPTY_BODY = pa.RecordBatch.from_pylist([], schema=BODY_SCHEMA_V1)


_log = logging.getLogger("strom.log")


def now_ms() -> int:
    return wall_ms()


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did: the offsets it assigned and the resulting log end offset.

    ``duplicates`` counts leading idempotent batches that repeat ones already in the log:
    they were not written again, and ``first_offset`` is the original offset of the first
    of them (``record_count`` and ``bytes`` count only what was written; both are 0 when
    every batch was a duplicate)."""

    first_offset: int
    last_offset: int
    log_end_offset: int
    record_count: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    bytes: int
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Batches read from the log and the offset right after them."""

    data: bytes | memoryview
    next_offset: int
    log_start_offset: int
    log_end_offset: int


class Log:
    """A partition replica's log in ``directory`` (``<data-dir>/<topic>-<partition>``)."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig | None = None,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        clean_shutdown: bool = False,
        fsync: bool = True,
        clock: Callable[[], int] = now_ms,
        first_dirty_offset: int | None = None,
        rng: random.Random | None = None,
        monotonic: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config = config or LogConfig()
        #: The wall clock (ms since the epoch): record times, retention, LogAppendTime.
        self.clock = clock
        #: A monotonic clock (ms, any origin) for delays a wall-clock step must not move:
        #: ``file.delete.delay.ms``, the age of a segment without timestamps, idleness.
        self.monotonic = monotonic
        self._rng = rng or random.Random()
        #: Files renamed to ``.deleted``, unlinked once due (``file.delete.delay.ms``):
        #: (due time on ``self.monotonic``, paths).
        self.pending_deletes: list[tuple[int, list[Path]]] = []
        self._fsync = fsync
        self.lock = threading.RLock()
        self.epochs = LeaderEpochCache(self.directory, fsync=fsync)
        # FIX: a damaged checkpoint counts as absent (the history is rebuilt from the batches),
        # as checkpoint.py promises, instead of as a trusted empty history.
        self.epochs_trusted = self.epochs.path.exists() and not self.epochs.damaged
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.last_flush_ms = clock()
        self._unflushed_records = 0
        self.truncated_bytes_on_recovery = 0
        #: Offset ranges [first, end) recovery found missing from segment files (see
        #: _lost_data); the log was truncated at the first.
        self.lost_on_recovery: list[tuple[int, int]] = []
        # FIX: bumped by every truncation so the cleaner (which rewrites outside the lock) can
        # tell that its key map and segment copies went stale (see cleaner._swap).
        self.truncations = 0
        #: Idempotent producers' epochs and recent batches (DESIGN §6), rebuilt on open.
        self.producers = ProducerStateManager()
        #: Batch headers read by the last producer-state rebuild (0 after a clean restart).
        self.producer_batches_scanned = 0
        #: Aborted transactions, for read_committed fetches (strom.log.transactions).
        self.aborted = AbortedIndex(self.directory)
        self._load(clean_shutdown)
        #: The cleaner's checkpoint (Kafka's cleaner-offset-checkpoint): offsets below it were
        #: compacted by the last pass, from it on the log is "dirty". See strom.log.cleaner.
        self.first_dirty_offset = self.log_start_offset
        if first_dirty_offset is not None and (
            self.log_start_offset <= first_dirty_offset <= self.log_end_offset
        ):
            self.first_dirty_offset = first_dirty_offset

    # -- opening and recovery --------------------------------------------------------------

    def _new_segment(self, base: int) -> LogSegment:
        cfg = self.config
        seg = LogSegment(self.directory, base, cfg.index_interval_bytes)
        seg.created_ms = self.monotonic()
        if cfg.segment_jitter_ms > 0:
            # Kafka's randomSegmentJitter: a fresh draw per segment, below segment.ms.
            seg.roll_jitter_ms = self._rng.randrange(min(cfg.segment_jitter_ms, cfg.segment_ms))
        return seg

    def _new_active_segment(self, base: int) -> LogSegment:
        """A segment that will take appends: preallocated when the topic asks for it."""
        seg = self._new_segment(base)
        if self.config.preallocate and seg.size == 0:
            seg.preallocate(self.config.segment_bytes)
        return seg

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
        """Complete the compaction swaps a crash interrupted (``strom.log.cleaner._swap``).

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

        FIX (found from outside): a non-last segment's ``.log`` emptied or cut exactly at a
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

    # -- state -----------------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        active = self.segments[-1]
        return active.next_offset if active.size else active.base_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def latest_epoch(self) -> int:
        return self.epochs.latest_epoch

    def update_config(self, config: LogConfig) -> None:
        """Apply changed topic configs to the open log (storage nodes, on a config change).

        Segments capture the index interval when they are created, so a change must reach
        them too. ``max.message.bytes`` needs nothing here: it is checked on the leader's
        appends only, never when stored batches are read again (see
        :data:`strom.log.segment.MAX_STORED_BATCH_BYTES`).
        """
        with self.lock:
            self.config = config
            for seg in self.segments:
                seg.index_interval_bytes = config.index_interval_bytes

    # -- appends ---------------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        *,
        leader_epoch: int = 0,
        transactional: bool = True,
        check_timestamps: bool = True,
    ) -> AppendInfo:
        """Append producer batches as leader: validate, assign offsets and epoch, write.
        ``transactional=False`` refuses transactional batches (the producer named no
        transactional id, ProduceRequest.transactional_id, and the node needs one: ACLs check
        WRITE on it). ``check_timestamps=False`` skips ``message.timestamp.before/after.max.ms``:
        the storage node passes it for strom's internal topics, whose only writers are the
        coordinators (see ``strom.storage.servicer._append_jobs``).

        Raises :class:`strom.record.InvalidBatchError` (nothing appended) for bad batches and
        :class:`ProducerStateError` (nothing appended) for idempotent batches out of sequence
        or fenced. Leading batches that repeat ones already appended by their producer are
        not written again: the result then starts at their original offsets (see
        :class:`AppendInfo`), even when they are larger than max.message.bytes is now (see
        :meth:`_repeats_over_limit`).
        """
        limit = self.config.max_message_bytes
        oversized = False
        try:
            headers = scan_batches(data, producer_batch=True, max_batch_bytes=limit)
        except InvalidBatchError as exc:
            if not exc.too_large:
                raise
            headers = self._repeats_over_limit(data, exc.position, limit)
            oversized = True
        if check_timestamps and self.config.checks_timestamps:
            self._check_timestamps(headers, data)
        for h in headers:
            if h.is_control:
                raise ProducerStateError(
                    INVALID_RECORD,
                    f"batch at byte {h.position} is a control batch: transaction markers are "
                    "written by the transaction coordinator, not by producers",
                    h.producer_id,
                )
            if h.is_transactional and not transactional:
                raise ProducerStateError(
                    INVALID_RECORD,
                    f"batch at byte {h.position} is transactional but the request names no "
                    "transactional_id, which this cluster's ACLs need (WRITE on it): the "
                    "producer's client is too old to send it; upgrade the client",
                    h.producer_id,
                )
            if h.is_transactional and (h.producer_id < 0 or h.base_sequence < 0):
                raise ProducerStateError(
                    INVALID_RECORD,
                    f"batch at byte {h.position} is transactional but has no producer id and "
                    "sequence: transactional producers are idempotent",
                    h.producer_id,
                )
        view = memoryview(data).cast("B")
        with self.lock:
            if leader_epoch < self.epochs.latest_epoch:
                raise InvalidAppendError(
                    f"leader epoch {leader_epoch} is older than the log's "
                    f"{self.epochs.latest_epoch}"
                )
            first = next_off = self.log_end_offset
            dups = self.producers.check(headers, self._find_older_batch)
            if oversized:  # only repeats may be over the limit (see _repeats_over_limit)
                _refuse_over_limit(headers, len(dups), limit)
            if dups:
                if len(dups) > 1:
                    _check_consecutive(dups)
                if len(dups) == len(headers):
                    ts = dups[0].timestamp if self.config.log_append_time else -1
                    return AppendInfo(
                        dups[0].base_offset, dups[-1].last_offset, first, 0, ts, 0, len(dups)
                    )
                if dups[-1].last_offset + 1 != first:
                    # One base offset answers for the whole request: the repeated batches
                    # and the new ones must be consecutive in the log.
                    raise ProducerStateError(
                        OUT_OF_ORDER_SEQUENCE,
                        f"the first {len(dups)} batches repeat ones appended at offsets "
                        f"{dups[0].base_offset}..{dups[-1].last_offset}, not at the end of "
                        "the log: send the retried batches in their own request",
                    )
                headers = headers[len(dups) :]
            skip = headers[0].position
            append_time = self.clock() if self.config.log_append_time else -1
            placed: list[BatchHeader] = []
            # The two leader-set fields sit in the first 16 bytes with batch_length between
            # them, outside the CRC: write a fresh 16-byte prefix and the producer's bytes
            # after it (pwritev), so a 1 MiB batch is never copied in Python.
            pieces: list[bytes | bytearray | memoryview] = []
            records = 0
            for h in headers:
                end = h.position + h.size
                if append_time >= 0:
                    # LogAppendTime changes bytes inside the CRC: copy, stamp, re-CRC.
                    one = bytearray(view[h.position : end])
                    patch_base_offset(one, 0, next_off)
                    patch_leader_epoch(one, 0, leader_epoch)
                    set_log_append_time(one, dataclasses.replace(h, position=0), append_time)
                    pieces.append(one)
                else:
                    pieces.append(_LEADER_PREFIX.pack(next_off, h.batch_length, leader_epoch))
                    pieces.append(view[h.position + _LEADER_PREFIX.size : end])
                placed.append(
                    dataclasses.replace(
                        h,
                        base_offset=next_off,
                        partition_leader_epoch=leader_epoch,
                        max_timestamp=append_time if append_time >= 0 else h.max_timestamp,
                        position=h.position - skip,
                    )
                )
                next_off += h.last_offset_delta + 1
                records += h.record_count
            length = len(view) - skip
            self.epochs.assign(leader_epoch, first)
            self._write(
                pieces, length, placed, lambda part: self.producers.update(part, self.clock())
            )
            if dups:
                return AppendInfo(
                    dups[0].base_offset,
                    next_off - 1,
                    next_off,
                    records,
                    append_time,
                    length,
                    len(dups),
                )
            return AppendInfo(first, next_off - 1, next_off, records, append_time, length)

    def _find_older_batch(
        self, entry: ProducerEntry, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        """The batch of ``entry``'s producer (same id and epoch) with exactly the sequences
        ``first_seq``..``last_seq``, written before every batch the producer state keeps of
        it; None when a bounded walk of batch headers does not find it. Called under the
        lock, only by :meth:`append` for a retry the state would answer
        ``DUPLICATE_SEQUENCE`` (written, offsets forgotten): never on the produce hot path.

        Why: the state keeps a producer's last ``BATCHES_KEPT`` (5) batches, but the Python
        producer may have many more of a partition unanswered, and after a failover it
        retries them all; an answer without offsets became offset -1 for acknowledged
        records (found from outside: 30 of 192,100). Keeping more batches per producer costs
        memory for every producer and partition; the log already holds the answer.

        Where: records take one offset and one sequence each, so the ``d`` sequences from
        ``first_seq`` to the oldest kept batch's take at least ``d`` offsets, and the batch
        starts at or before ``hi`` = that batch's base offset - ``d`` (exactly there when
        nobody else wrote in between, checked first: one offset-index lookup). Otherwise the
        headers from ``hi`` - :data:`OLDER_BATCH_SEARCH_OFFSETS` up to ``hi`` are walked,
        at most :data:`OLDER_BATCH_SEARCH_HEADERS` headers, over the
        :data:`OLDER_BATCH_SEARCH_BYTES` of log nearest ``hi`` at most (those bounds say
        why). Headers only (their prefix and producer fields): no record is read. A batch
        the cleaner removed, one below the log start, or a range no batch has (half of a
        split batch) is not found."""
        oldest = entry.batches[0]
        distance = (oldest.first_seq - first_seq) & MAX_SEQUENCE
        hi = oldest.base_offset - distance
        if hi < self.log_start_offset:
            return None
        key = (entry.producer_id, entry.epoch, first_seq)
        found = self._walk_headers(hi, hi, key)  # the producer's records contiguous
        if found is None:
            lo = max(hi - OLDER_BATCH_SEARCH_OFFSETS, self.log_start_offset)
            found = self._walk_headers(self._walk_start(lo, hi), hi, key)
        if (
            found is None
            or found.last_sequence != last_seq
            or found.base_offset < self.log_start_offset
        ):
            return None  # (no other batch of the epoch has that base sequence)
        return BatchMetadata(
            first_seq, last_seq, found.base_offset, found.last_offset, found.max_timestamp
        )

    def _walk_start(self, lo: int, hi: int) -> int:
        """Where a walk of the headers up to offset ``hi`` starts: at ``lo`` or after it,
        where the offset indexes say at most :data:`OLDER_BATCH_SEARCH_BYTES` of log lie
        between it and ``hi``, so that a walk the byte bound stops has seen the batches
        nearest ``hi`` (where a producer's older batch most likely is), not the farthest."""
        budget = OLDER_BATCH_SEARCH_BYTES
        i = max(bisect.bisect_right(self._bases, hi) - 1, 0)
        found = self.segments[i].locate(hi)
        end = found[0] if found is not None else self.segments[i].size  # bytes before hi
        after = hi  # the first offset after the part of the segment counted
        while i >= 0:
            seg = self.segments[i]
            if seg.base_offset <= lo and end <= budget:
                return lo
            if end >= budget:  # the start lies in this segment: its first indexed batch there
                j = bisect.bisect_left(seg.index.pos, end - budget)
                start = seg.base_offset + seg.index.rel[j] if j < len(seg.index.pos) else after
                return min(max(lo, start), hi)
            budget -= end
            after = seg.base_offset
            i -= 1
            end = self.segments[i].size if i >= 0 else 0
        return lo

    def _walk_headers(self, lo: int, hi: int, key: tuple[int, int, int]) -> BatchHeader | None:
        """The header of the first batch from the one holding offset ``lo`` up to base
        offset ``hi`` with (producer id, epoch, base sequence) ``key``; None when none has
        within :data:`OLDER_BATCH_SEARCH_HEADERS` headers and
        :data:`OLDER_BATCH_SEARCH_BYTES` of log."""
        headers, walked = OLDER_BATCH_SEARCH_HEADERS, OLDER_BATCH_SEARCH_BYTES
        i = max(bisect.bisect_right(self._bases, lo) - 1, 0)
        for seg in self.segments[i:]:
            if seg.base_offset > hi or headers <= 0 or walked <= 0:
                break
            at = seg.locate(max(lo, seg.base_offset))
            if at is None:
                continue
            found, n, size = seg.find_producer_batch(at[0], hi, key, headers, walked)
            if found is not None:
                return found
            headers, walked = headers - n, walked - size
        return None

    def _repeats_over_limit(
        self, data: bytes | bytearray | memoryview, position: int, limit: int
    ) -> list[BatchHeader]:
        """The produced batches of ``data``, one of which (at byte ``position``) is larger than
        max.message.bytes: raises MESSAGE_TOO_LARGE (:class:`InvalidBatchError`) unless every
        batch over the limit repeats one its idempotent producer appended and the producer
        state remembers (same producer id, epoch and sequence range).

        Why a repeat is not refused for its size: it is answered with its original offsets
        and never written again, so the limit has nothing to protect, while refusing it hid
        that it was written. The topic's limit may have been lowered after it was appended
        (and its answer lost to a failover); the producer would then split it, and the leader
        refuse the halves (OUT_OF_ORDER_SEQUENCE), so that the records, written, failed.
        Kafka checks the size first; strom answers the retry as the duplicate it is.

        Only the size check moves: every other check keeps its place. A batch over the limit
        that is no repeat is refused for its size before anything else is looked at, as
        before. A repeat still passes, before it is answered, the structure and CRC checks
        (here), the timestamp, control and transactional checks, the leader epoch check and
        the producer-state check (``ProducerStateManager.check``, which looks at the
        producer's epoch and fencing first); ``append`` then calls
        :func:`_refuse_over_limit` again under the lock, should the state have forgotten the
        batch in between. Costs nothing on the hot path: this runs only after a batch was
        found too large, and scans the headers again only when that batch is idempotent."""
        h = read_header(data, position)
        if h.producer_id < 0 or h.base_sequence < 0:
            raise _too_large(h, limit)
        try:
            headers = scan_batches(
                data, producer_batch=True, max_batch_bytes=MAX_STORED_BATCH_BYTES
            )
        except InvalidBatchError:
            raise _too_large(h, limit) from None  # the size refusal came first, as always
        with self.lock:
            _refuse_over_limit(headers, self.producers.repeats(headers), limit)
        return headers

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
        *,
        leader_epoch: int = 0,
    ) -> AppendInfo:
        """Append a transaction marker as leader (WriteTxnMarkers): closes the producer's open
        transaction here, raises its epoch to ``producer_epoch`` and, for an abort, records
        the aborted range. Raises :class:`ProducerStateError`: INVALID_PRODUCER_EPOCH when a
        newer epoch of the producer already wrote here, TRANSACTION_COORDINATOR_FENCED when a
        marker of a newer coordinator epoch did (this one comes from a coordinator that lost
        the transaction's shard and must not decide its outcome any more)."""
        data = bytearray(
            encode_marker(
                producer_id, producer_epoch, committed, coordinator_epoch, now_ms=self.clock()
            )
        )
        with self.lock:
            if leader_epoch < self.epochs.latest_epoch:
                raise InvalidAppendError(
                    f"leader epoch {leader_epoch} is older than the log's "
                    f"{self.epochs.latest_epoch}"
                )
            entry = self.producers.get(producer_id)
            if entry is not None and producer_epoch < entry.epoch:
                raise ProducerStateError(
                    INVALID_PRODUCER_EPOCH,
                    f"marker for producer id {producer_id} epoch {producer_epoch}: epoch "
                    f"{entry.epoch} already wrote here",
                    producer_id,
                )
            if entry is not None and coordinator_epoch < entry.coordinator_epoch:
                raise ProducerStateError(
                    TRANSACTION_COORDINATOR_FENCED,
                    f"marker for producer id {producer_id} from coordinator epoch "
                    f"{coordinator_epoch}: coordinator epoch {entry.coordinator_epoch} already "
                    "wrote a marker here",
                    producer_id,
                )
            offset = self.log_end_offset
            patch_base_offset(data, 0, offset)
            patch_leader_epoch(data, 0, leader_epoch)
            h = read_header(data, 0)
            self.epochs.assign(leader_epoch, offset)
            self._write([data], len(data), [h])
            marker = {offset: Marker(committed, coordinator_epoch)}
            for pid, first, last in self.producers.update([h], self.clock(), marker):
                self.aborted.add(AbortedTxn(last, pid, first))
            return AppendInfo(offset, offset, offset + 1, 1, -1, len(data))

    def last_stable_offset(self, high_watermark: int) -> int:
        """The LSO for a high watermark: below the first offset of the oldest open
        transaction, never above the high watermark.

        The open transaction's first offset counts from the log start at least, as Kafka's
        updateFirstUnstableOffset floors it: DeleteRecords (or retention) may move the start
        past a transaction that is still open, and an LSO below the log start would send a
        read_committed consumer positioned at "latest" out of range."""
        first = self.producers.first_unstable_offset
        if first is None:
            return high_watermark
        return min(max(first, self.log_start_offset), high_watermark)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions that may have batches in ``[start, end)`` (read_committed)."""
        with self.lock:
            return self.aborted.overlapping(start, end)

    def _check_timestamps(
        self, headers: list[BatchHeader], data: bytes | bytearray | memoryview
    ) -> None:
        """``message.timestamp.before.max.ms`` / ``after.max.ms`` (Kafka's KIP-937 rules):
        no record may be older than the broker's time minus before.max.ms nor later than the
        broker's time plus after.max.ms. Raises :class:`InvalidTimestampError`, nothing
        appended.

        With a finite before.max.ms every record is looked at, as Kafka's LogValidator: the
        header's ``base_timestamp`` is only the first record's, and producers may send
        records out of time order, so each batch's body timestamps are read
        (:func:`timestamp_extremes`, vectorized). A topic with no before limit (Kafka's
        default) decodes nothing: after.max.ms alone is checked against the header's
        ``max_timestamp``, which is what the producer wrote."""
        before = self.config.message_timestamp_before_max_ms
        after = self.config.message_timestamp_after_max_ms
        now = self.clock()
        view = memoryview(data).cast("B") if before < LONG_MAX else None
        for h in headers:
            if view is None:
                _check_after(h, h.max_timestamp, None, now, after)
                continue
            ext = timestamp_extremes(h, view[h.position : h.position + h.size])
            if ext is None:
                continue
            if ext.min_timestamp >= 0 and now - ext.min_timestamp > before:
                raise InvalidTimestampError(
                    f"batch at byte {h.position}: record at offset delta "
                    f"{ext.min_offset_delta} has timestamp {ext.min_timestamp}, "
                    f"{now - ext.min_timestamp} ms before the broker's time {now}, more than "
                    f"message.timestamp.before.max.ms={before}"
                )
            _check_after(h, ext.max_timestamp, ext.max_offset_delta, now, after)

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendInfo | None:
        """Append batches copied from the leader, offsets and epochs as they are.

        Batches must start at or after the log end offset; a gap starts a new segment so
        that batches keep tiling each segment. A leader's log has a gap only when one of its
        segments lost data (compaction keeps emptied batches, see _lost_data); its own next
        start truncates there, and so does this log's, which then fetches again from there.

        One exception, Kafka's (UnexpectedAppendOffsetException in
        Partition.appendRecordsToFollowerOrFutureReplica): a log holding nothing readable
        (its log end offset is its log start offset, e.g. just restarted at the leader's
        log start) takes a first batch that starts below its end but holds it. The leader's
        log start then lies inside that batch (DeleteRecords in the middle of a batch), and
        the leader only ever answers with whole batches, so refusing it would refuse every
        fetch for good. The log restarts at the batch's base offset and keeps its log start,
        so the records below it are still never served.

        Another: a first batch that straddles the log end and is a filler (no records,
        producer fields or transaction bits: the cleaner's merged run of emptied batches) is
        cut to start at the log end (_trim_filler), as this version's leader serves it. A
        leader of an older version (before reads cut fillers) serves it whole, and a
        follower that had copied some of the merged batches before the merge would refuse it
        on every fetch and never rejoin the ISR. Any other batch below the log end is
        refused.
        """
        # Not max.message.bytes: the leader took these batches under the limit in force
        # then, which may have been larger than today's (Kafka checks it on produce only).
        headers = scan_batches(data, max_batch_bytes=MAX_STORED_BATCH_BYTES)
        if not headers:
            return None
        with self.lock:
            first = self.log_end_offset
            restart = False
            if headers[0].base_offset < first < headers[0].next_offset:
                restart = first == self.log_start_offset
                if not restart:
                    # A leader of an older version serves a filler whole (see the docstring).
                    trimmed = _trim_filler(data, first)
                    if trimmed is not data:
                        data = trimmed
                        headers = scan_batches(data, max_batch_bytes=MAX_STORED_BATCH_BYTES)
            if headers[0].base_offset < first and not restart:
                raise InvalidAppendError(
                    f"replicated batch at offset {headers[0].base_offset} is below the log "
                    f"end offset {first}"
                )
            run_start = 0
            records = 0
            for i, h in enumerate(headers):
                # FIX: compare with the previous batch of the request too; otherwise epochs
                # going back inside one request failed half-way through writing it (earlier
                # runs written, the newer epoch already in the history).
                floor = max(
                    -1 if restart else self.epochs.latest_epoch,
                    headers[i - 1].partition_leader_epoch if i else -1,
                )
                if h.partition_leader_epoch < floor:
                    raise InvalidAppendError(
                        f"replicated batch at offset {h.base_offset} has epoch "
                        f"{h.partition_leader_epoch}, older than {floor}"
                    )
                if i > 0 and h.base_offset < headers[i - 1].next_offset:
                    raise InvalidAppendError(
                        f"replicated batches overlap at offset {h.base_offset}"
                    )
                records += h.record_count
            if restart:
                # Checked first: a refused request leaves the log as it was.
                self.truncate_fully_and_start_at(headers[0].base_offset, log_start_offset=first)
                first = self.log_end_offset
            view = memoryview(data)
            expected = first
            for i, h in enumerate(headers):
                if h.base_offset != expected and i > run_start:
                    self._write_run(view, headers[run_start:i])
                    run_start = i
                expected = h.next_offset
            self._write_run(view, headers[run_start:])
            last = headers[-1]
            return AppendInfo(
                headers[0].base_offset,
                last.last_offset,
                last.next_offset,
                records,
                -1,
                sum(h.size for h in headers),
            )

    def _write_run(self, view: memoryview, run: list[BatchHeader]) -> None:
        start = run[0].position
        end = run[-1].position + run[-1].size
        if run[0].base_offset != self.log_end_offset:
            self._roll(run[0].base_offset)
        for h in run:
            self.epochs.assign(h.partition_leader_epoch, h.base_offset)

        def written(part: list[BatchHeader]) -> None:
            # Followers keep the producer state too, so that as a new leader they still
            # recognise retries of batches appended under the old one (and open
            # transactions). Positions in ``part`` count from ``start``.
            markers = {
                h.base_offset: decode_marker(view[start + h.position : start + h.position + h.size])
                for h in part
                if h.is_control
            }
            for pid, first, last in self.producers.update(part, self.clock(), markers):
                self.aborted.add(AbortedTxn(last, pid, first))

        self._write(
            [view[start:end]],
            end - start,
            [dataclasses.replace(h, position=h.position - start) for h in run],
            written,
        )

    def _write(
        self,
        pieces: list[bytes | bytearray | memoryview],
        length: int,
        headers: list[BatchHeader],
        after: Callable[[list[BatchHeader]], None] | None = None,
    ) -> None:
        """Write consecutive batches (``headers``, positions relative to the start of
        ``pieces``) at the log end, rolling first when the segment is due to.

        A request that does not fit one segment (segment.bytes, or the index entries) is
        split between batches, each part in a new segment (found from outside: a request
        went whole into one segment, 4.4 MB segments at segment.bytes=65536). A single
        batch larger than a segment still gets one of its own. ``after`` is called with the
        headers of each part once it is written, before the next roll: the producer-state
        snapshot a roll writes must include the parts before it. A failure after a part was
        written truncates the log back to the request's start, so the request still fails
        whole."""
        seg = self.active
        if seg.size and self._should_roll(seg, length, headers):
            seg = self._roll(self.log_end_offset)
        if len(headers) == 1 or not self._too_full(seg, length, len(headers)):
            # The common case, in one write.
            self._write_part(seg, pieces, length, headers)
            if after is not None:
                after(headers)
            return
        start = self.log_end_offset
        try:
            for i, (part, group) in enumerate(self._split(pieces, headers)):
                if i:
                    seg = self._roll(self.log_end_offset)
                base = group[0].position
                self._write_part(
                    seg,
                    part,
                    group[-1].position + group[-1].size - base,
                    [dataclasses.replace(h, position=h.position - base) for h in group],
                )
                if after is not None:
                    after(group)
        except BaseException:
            if self.log_end_offset > start:
                self.truncate_to(start)
            raise

    def _write_part(
        self,
        seg: LogSegment,
        pieces: list[bytes | bytearray | memoryview],
        length: int,
        headers: list[BatchHeader],
    ) -> None:
        seg.append(pieces, length, headers)
        seg.last_append_ms = self.clock()
        self._unflushed_records += sum(h.record_count for h in headers)

    def _split(
        self, pieces: list[bytes | bytearray | memoryview], headers: list[BatchHeader]
    ) -> list[tuple[list[bytes | bytearray | memoryview], list[BatchHeader]]]:
        """``headers`` in runs that each fit an empty segment (at least one batch each),
        with the part of ``pieces`` each run covers. Per batch (header fields only) and per
        piece; pieces are cut with memoryviews, never copied."""
        cfg = self.config
        most = min(cfg.max_index_entries, cfg.max_time_index_entries)
        groups: list[list[BatchHeader]] = []
        size = 0
        for h in headers:
            if groups and size + h.size <= cfg.segment_bytes and len(groups[-1]) < most:
                groups[-1].append(h)
                size += h.size
            else:
                groups.append([h])
                size = h.size
        parts: list[list[bytes | bytearray | memoryview]] = []
        bounds = [g[0].position for g in groups[1:]]
        k = 0
        pos = 0
        current: list[bytes | bytearray | memoryview] = []
        for p in pieces:
            n = memoryview(p).nbytes
            cut_from = 0
            while k < len(bounds) and bounds[k] < pos + n:
                cut = bounds[k] - pos
                if cut > cut_from:
                    current.append(memoryview(p)[cut_from:cut])
                parts.append(current)
                current = []
                cut_from = cut
                k += 1
            if cut_from < n:
                current.append(memoryview(p)[cut_from:] if cut_from else p)
            pos += n
        parts.append(current)
        return list(zip(parts, groups, strict=True))

    def _should_roll(self, seg: LogSegment, length: int, headers: list[BatchHeader]) -> bool:
        """Whether ``headers`` (batches of ``length`` bytes) go to a new segment: the segment
        would pass segment.bytes, it has waited segment.ms (less its jitter;
        max.compaction.lag.ms when shorter on a compacted log) for a roll
        (:meth:`_waited_for_roll`), or an index might overflow segment.index.bytes (each
        batch can add one entry to each index)."""
        cfg = self.config
        # The jitter never brings the age limit below 1 ms (it is drawn below segment.ms,
        # which max.compaction.lag.ms may undercut).
        limit = max(cfg.max_segment_ms - seg.roll_jitter_ms, 1)
        return self._too_full(seg, length, len(headers)) or (
            self._waited_for_roll(seg, max(h.max_timestamp for h in headers)) >= limit
        )

    def _waited_for_roll(self, seg: LogSegment, max_timestamp: int) -> int:
        """How long ``seg`` has waited for a time-based roll, as Kafka's
        ``LogSegment.timeWaitedForRoll``: the incoming batches' newest timestamp (record
        time: CreateTime or LogAppendTime) minus the segment's first batch's, or, for a
        segment whose first batch has none, the monotonic time since this process created
        or opened it. Never the wall clock against the creation time: a node stepped back
        N hours rolled nothing by time for N hours (delaying retention and compaction), one
        stepped forward rolled every partition at once (found from outside). Headers only."""
        if seg.first_batch_timestamp >= 0:
            return max_timestamp - seg.first_batch_timestamp
        return self.monotonic() - seg.created_ms

    def _too_full(self, seg: LogSegment, length: int, batches: int) -> bool:
        """Whether ``batches`` more batches of ``length`` bytes would pass segment.bytes or
        might overflow segment.index.bytes in ``seg``."""
        cfg = self.config
        return (
            seg.size + length > cfg.segment_bytes
            or len(seg.index.rel) + batches > cfg.max_index_entries
            or len(seg.time_index.ts) + batches > cfg.max_time_index_entries
        )

    def _roll(self, base: int) -> LogSegment:
        with self.lock:
            active = self.active
            if active.size == 0:
                # Re-base an empty active segment instead of leaving an empty file behind.
                active.delete()
                self.segments.pop()
                self._bases.pop()
            else:
                active.release_preallocation()
                active.index.flush()
                active.time_index.flush()
                # Recovery then only scans batch headers from the new segment on.
                self._snapshot_producers()
            seg = self._new_active_segment(base)
            self.segments.append(seg)
            self._bases.append(base)
            return seg

    def roll(self) -> None:
        """Start a new active segment now (admin/testing; appends roll by themselves)."""
        with self.lock:
            if self.active.size:
                self._roll(self.log_end_offset)

    # -- reads -----------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int = 1 << 20,
        *,
        max_offset: int | None = None,
        min_one: bool = True,
    ) -> ReadResult:
        """Read whole batches starting with the one that holds ``offset``.

        ``max_offset`` (exclusive) is the high watermark for consumers. At least one batch is
        returned when ``min_one`` is set, even if larger than ``max_bytes``.
        """
        with self.lock:
            leo = self.log_end_offset
            start = self.log_start_offset
            if offset < start or offset > leo:
                raise OffsetOutOfRangeError(offset, start, leo)
            hi = leo if max_offset is None else min(max_offset, leo)
            i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
            while offset < hi and i < len(self.segments):
                seg = self.segments[i]
                found = seg.locate(offset)
                if found is None:
                    i += 1
                    continue
                pos, base = found
                if base >= hi:
                    break
                data, nxt = seg.read(pos, base, max_bytes, hi, self.epochs.epoch_for, min_one)
                if base < offset and data:
                    data = _trim_filler(data, offset)
                return ReadResult(data, nxt, start, leo)
            return ReadResult(b"", offset, start, leo)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int, int] | None:
        """ListOffsets by time: (offset, timestamp, leader epoch) of the first record whose
        timestamp is >= ``timestamp``; None when every record is older."""
        with self.lock:
            segs = list(self.segments)
            start = self.log_start_offset
        for seg in segs:
            if seg.max_timestamp < timestamp:
                continue
            base = seg.time_index.lookup(timestamp)
            if base is None:
                # The segment holds such a record (its max timestamp says so) but its time
                # index does not list it (found from outside: a damaged .timeindex made the
                # lookup skip the segment): scan it from its base, as Kafka does.
                base = seg.base_offset
            offset = max(base, start)
            while offset < seg.next_offset:
                try:
                    result = self.read(offset, 1, min_one=True)
                except OffsetOutOfRangeError:
                    return None
                if not result.data:
                    break
                for batch in _decode(result.data):
                    if batch.header.max_timestamp < timestamp:
                        continue
                    table = batch.to_arrow()
                    ts = table.column("timestamp").cast("int64").to_numpy()
                    offs = table.column("offset").to_numpy()
                    hits = np.nonzero((ts >= timestamp) & (offs >= start))[0]
                    if hits.size:
                        j = int(hits[0])
                        return int(offs[j]), int(ts[j]), batch.header.partition_leader_epoch
                offset = result.next_offset
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp among the
        records at or above the log start (ListOffsets -3), as Kafka 3.8+ answers; None when
        the log holds no record (every one deleted: Kafka answers -1 for an empty log).

        The time indexes find, per segment, the first batch whose max timestamp is the
        segment's largest; that one batch's timestamp column then gives the record (an admin
        lookup, off the produce and fetch paths). A batch whose header max has no record
        (compacted away) answers with its own offset. A segment whose largest batch starts
        below the log start (DeleteRecords inside it) has its readable part scanned instead:
        the deleted records must not be answered (found from outside: after deleting every
        record the lookup gave offset 0 of a log starting at 5)."""
        with self.lock:
            segs = list(self.segments)
            start = self.log_start_offset
        best: tuple[int, int] | None = None  # (timestamp, offset); earlier wins a tie
        for seg in segs:
            if not seg.time_index.ts or (best is not None and seg.time_index.ts[-1] <= best[0]):
                continue  # nothing here beats what an earlier segment holds
            top = seg.time_index.ts[-1]
            base = seg.base_offset + seg.time_index.rel[-1]
            found = (
                self._first_at(base, top, start)
                if base >= start
                else self._max_from(start, seg.next_offset)
            )
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        return None if best is None else (best[1], best[0])

    def _first_at(self, base: int, top: int, start: int) -> tuple[int, int] | None:
        """(``top``, offset of the first record stamped ``top``) in the batch at ``base``;
        the batch's own offset when no record holds it (compacted away); None when the batch
        is gone (retention or a truncation meanwhile)."""
        try:
            data = self.read(max(base, start), 1).data
        except OffsetOutOfRangeError:
            return None
        batches = _decode(data)
        if not batches or batches[0].header.base_offset > base:
            return None
        offs, ts = (col.to_numpy() for col in batches[0].arrow_columns()[:2])
        hits = np.nonzero((ts.astype(np.int64) == top) & (offs >= start))[0]
        return (top, int(offs[hits[0]])) if hits.size else (top, base)

    def _max_from(self, start: int, end: int) -> tuple[int, int] | None:
        """(largest timestamp, offset of its first record) among the records in
        [``start``, ``end``), read batch by batch: the batch holding ``start`` record by
        record (part of it is deleted), the others by their headers, then the winner's
        records; None when that range holds no record."""
        best: tuple[int, int] | None = None  # (timestamp, batch base or record offset)
        by_header = False  # whether ``best`` names a batch (by its header), not a record
        offset = start
        while offset < end:
            try:
                result = self.read(offset, 1 << 20)
            except OffsetOutOfRangeError:
                break
            if not result.data:
                break
            for batch in _decode(result.data):
                h = batch.header
                if h.base_offset >= end:
                    break
                if h.base_offset >= start:
                    if best is None or h.max_timestamp > best[0]:
                        best, by_header = (h.max_timestamp, h.base_offset), True
                    continue
                offs, ts = (col.to_numpy() for col in batch.arrow_columns()[:2])
                ts = ts.astype(np.int64)[offs >= start]
                if ts.size and (best is None or int(ts.max()) > best[0]):
                    top = int(ts.max())
                    best, by_header = (top, int(offs[offs >= start][np.argmax(ts)])), False
            offset = max(result.next_offset, offset + 1)
        if best is not None and by_header:
            return self._first_at(best[1], best[0], start)
        return best

    # -- truncation, retention, deletion ---------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= ``offset`` (follower truncation).

        An ``offset`` below the log start (Kafka's UnifiedLog.truncateTo) empties the log and
        restarts it there (truncate_fully_and_start_at): every readable record lies above the
        point where this replica's log stopped being the leader's. This happens after an
        unclean election to a replica that missed a DeleteRecords: its log ends below our
        log start, and its records from there on are not ours. Refusing (or stopping at our
        log start) kept our own records above the divergence point, which then passed for
        the leader's once our log reached its end (found from outside)."""
        with self.lock:
            if offset >= self.log_end_offset:
                # FIX (found reproducing an outside report of a leader on a full disk): no
                # batch to remove, but the epoch history may end with an epoch that holds
                # none: this replica led in it and its append failed after the epoch was
                # recorded. The leader does not know that epoch, answers every fetch naming
                # it with a divergence at our log end, and the follower truncated to its own
                # end in a loop, many times a second, never copying anything. Kafka's
                # truncateTo drops such entries too.
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
            # FIX: the batch holding ``offset`` may start below the log start (DeleteRecords
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
            # FIX: do not cut the epoch history at ``offset``: batches below it stay on disk
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
        # FIX: forget epochs only below the first segment still on disk (see delete_records).
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
                    break  # found from outside: uncommitted records were deleted
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

    # -- flushing and closing --------------------------------------------------------------

    def needs_flush(self, now: int | None = None) -> bool:
        """Whether ``flush.messages`` / ``flush.ms`` ask for an fsync now."""
        if self._unflushed_records == 0:
            return False
        cfg = self.config
        if 0 <= cfg.flush_messages <= self._unflushed_records:
            return True
        now = self.clock() if now is None else now
        return cfg.flush_ms >= 0 and now - self.last_flush_ms >= cfg.flush_ms

    def flush(self) -> int:
        """fsync everything appended so far and advance the recovery point; returns it.

        Safe to call from a worker thread while the event loop appends: the lock is held
        only to take a snapshot, not during fsync.
        """
        with self.lock:
            upto = self.log_end_offset
            segs = [
                s for s in self.segments if s.next_offset > self.recovery_point or s is self.active
            ]
            self._unflushed_records = 0
        for seg in segs:
            try:
                seg.flush()
            except OSError:
                if not seg.closed:
                    raise
        with self.lock:
            self.recovery_point = max(self.recovery_point, upto)
            self.last_flush_ms = self.clock()
            return self.recovery_point

    def close(self) -> None:
        """Snapshot the producer state and close every segment. Every segment is closed
        even when a write fails (a full disk); the first error is raised after."""
        failed: OSError | None = None
        with self.lock:
            if self.segments and not self.active.closed and self.directory.is_dir():
                # A restart then loads the producer state without scanning any batch.
                try:
                    self._snapshot_producers(fsync=self._fsync)
                except OSError as exc:  # it names its file
                    failed = exc
            for seg in self.segments:
                try:
                    seg.close()
                except OSError as exc:
                    failed = failed or exc
        # Nobody reads a closed log: files waiting for their delete delay can go now.
        self.delete_expired_files(now=LONG_MAX)
        if failed is not None:
            raise failed

    def delete(self) -> None:
        """Remove the whole replica from disk (topic deleted or replica moved away)."""
        with self.lock:
            for seg in self.segments:
                seg.delete()
            self.segments = []
            shutil.rmtree(self.directory, ignore_errors=True)

    def batch_headers(self) -> list[BatchHeader]:
        """Headers of every batch in the log (tools and tests; reads headers only)."""
        with self.lock:
            out: list[BatchHeader] = []
            for seg in self.segments:
                out.extend(seg.batch_headers())
            return out


def _check_after(
    h: BatchHeader, newest: int, offset_delta: int | None, now: int, after: int
) -> None:
    """``message.timestamp.after.max.ms`` on a batch's newest timestamp (from its body when
    ``offset_delta`` names the record, else the header's ``max_timestamp``)."""
    if newest - now <= after:
        return
    which = f"record at offset delta {offset_delta} has " if offset_delta is not None else ""
    raise InvalidTimestampError(
        f"batch at byte {h.position}: {which}timestamp {newest} is {newest - now} ms after the "
        f"broker's time {now}, more than message.timestamp.after.max.ms={after}"
    )


def _check_consecutive(dups: list[BatchMetadata]) -> None:
    """Raise ``DUPLICATE_SEQUENCE`` (written, offsets not given) when repeated batches are not
    consecutive in the log: the answer has one base offset for the request, from which the
    producer counts each batch's records, so a gap (another producer's records between two
    of them, more likely now that batches older than the kept ones are found in the log)
    would give later records wrong offsets. Never the case for a request retried as it was
    first sent (its batches were written together)."""
    for a, b in itertools.pairwise(dups):
        if a.last_offset + 1 != b.base_offset:
            raise ProducerStateError(
                DUPLICATE_SEQUENCE,
                f"the batches repeat ones appended at offsets {dups[0].base_offset}.."
                f"{dups[-1].last_offset} with others' records between them (after offset "
                f"{a.last_offset}): written once, but one base offset can not answer for them",
            )


def _too_large(h: BatchHeader, limit: int) -> InvalidBatchError:
    """MESSAGE_TOO_LARGE for a produced batch over the topic's max.message.bytes."""
    return InvalidBatchError(
        f"batch at byte {h.position} is {h.size} bytes, more than the topic's "
        f"max.message.bytes={limit}",
        position=h.position,
        too_large=True,
    )


def _refuse_over_limit(headers: list[BatchHeader], start: int, limit: int) -> None:
    """Raise MESSAGE_TOO_LARGE for the first batch from index ``start`` on that is larger
    than ``limit`` (the batches before ``start`` repeat appended ones: see
    ``Log._repeats_over_limit``). Runs only after the scan found a batch too large."""
    for h in headers[start:]:
        if h.size > limit:
            raise _too_large(h, limit)


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


def _trim_filler(data: bytes | memoryview, offset: int) -> bytes | memoryview:
    """``data`` (whole batches, the first holding ``offset`` but starting below it) with that
    first batch cut to start at ``offset`` when it is a filler: a batch without records,
    producer fields or transaction bits, such as the cleaner's merged runs of emptied batches
    (strom.log.cleaner).

    A follower appends only batches starting at its log end, which is always the end of a
    batch it copied. A filler on the leader may cover several original batches (the cleaner
    merged them after the follower had copied some), so the follower's end can fall inside
    it; served whole, it could never be appended and the follower would stay stuck for good.
    A filler carries nothing but its offset range and epoch, so any tail of it is as valid.
    Only a read starting inside a batch gets here, and only a filler is re-encoded (one
    small batch, a copy of what follows it)."""
    h = read_header(data, 0)
    if h.record_count or h.producer_id >= 0 or h.attributes & (ATTR_TRANSACTIONAL | ATTR_CONTROL):
        return data
    head = encode_body(
        _EMPTY_BODY,
        attributes=h.attributes,
        base_offset=offset,
        last_offset_delta=h.last_offset - offset,
        base_timestamp=h.base_timestamp,
        max_timestamp=h.max_timestamp,
        partition_leader_epoch=h.partition_leader_epoch,
    )
    return head + bytes(memoryview(data)[h.size :])


def _decode(data: bytes | memoryview) -> list[RecordBatch]:
    try:
        return decode_batches(data, max_batch_bytes=MAX_STORED_BATCH_BYTES)
    except InvalidBatchError as exc:  # a CRC or body fault in what the log holds: corruption
        raise CorruptLogError(str(exc)) from exc
