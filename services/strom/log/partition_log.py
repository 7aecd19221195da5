"""The log of one partition replica: ordered segments, appends, reads, rolls, flushes.

Hot paths work per batch: an append validates headers and CRCs, patches offsets and the
leader epoch in place and writes the request with one ``pwrite``; a read is one ``pread`` of
whole batches. Structural changes (roll, truncate, delete, swap) hold ``lock``; the slow part
of a flush (fsync) does not, so a background flush never stalls the event loop's appends.

:class:`Log` holds the append, read and roll paths; its other concerns are mixins in modules
of their own, named after what they hold: opening and recovery
(:class:`strom.log.recovery.LogRecovery`), the search for the batch an idempotent retry
repeats (:class:`strom.log.duplicate_lookup.DuplicateLookup`), lookups by time
(:class:`strom.log.time_lookup.TimeLookup`) and truncation, retention and deletion
(:class:`strom.log.removal.LogRemoval`). What appends and reads answer is in
:mod:`strom.log.results`.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from strom.clock import monotonic_ms, wall_ms
from strom.log.config import LONG_MAX, LogConfig
from strom.log.duplicate_lookup import DuplicateLookup, check_consecutive, refuse_over_limit
from strom.log.epoch_cache import LeaderEpochCache
from strom.log.errors import InvalidAppendError, InvalidTimestampError, OffsetOutOfRangeError
from strom.log.producer_state import (
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    OUT_OF_ORDER_SEQUENCE,
    TRANSACTION_COORDINATOR_FENCED,
    ProducerStateError,
    ProducerStateManager,
)
from strom.log.recovery import LogRecovery
from strom.log.removal import LogRemoval
from strom.log.results import AppendInfo, ReadResult
from strom.log.segment import MAX_STORED_BATCH_BYTES, LogSegment
from strom.log.time_lookup import TimeLookup
from strom.log.transactions import AbortedIndex, AbortedTxn, Marker, decode_marker, encode_marker
from strom.record.batch import check_body, encode_body
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

__all__ = ["AppendInfo", "Log", "ReadResult", "now_ms"]

_LEADER_PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
#: The body of a batch without records (see _trim_filler).
_EMPTY_BODY = pa.RecordBatch.from_pylist([], schema=BODY_SCHEMA_V1)


def now_ms() -> int:
    return wall_ms()


class Log(LogRecovery, DuplicateLookup, TimeLookup, LogRemoval):
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
        # A damaged checkpoint counts as absent (the history is rebuilt from the batches),
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
        # Bumped by every truncation so the cleaner (which rewrites outside the lock) can
        # tell that its key map and segment copies went stale (see cleaner_swap._swap).
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

    # -- segments ----------------------------------------------------------------------------

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
        for h in headers:
            low = min(h.base_timestamp, h.max_timestamp)
            if low < NO_TIMESTAMP:  # -1 stays allowed: Kafka clients send it
                which = "base_timestamp" if h.base_timestamp == low else "max_timestamp"
                raise InvalidTimestampError(
                    f"batch at byte {h.position}: {which} {low} is negative (only -1, "
                    "NO_TIMESTAMP, is allowed below 0)"
                )
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
        self._check_bodies(headers, data, check_timestamps and self.config.checks_timestamps)
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
                refuse_over_limit(headers, len(dups), limit)
            if dups:
                if len(dups) > 1:
                    check_consecutive(dups)
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

    def _check_bodies(
        self,
        headers: list[BatchHeader],
        data: bytes | bytearray | memoryview,
        check_timestamps: bool,
    ) -> None:
        """Every data batch's body decoded as its readers will (:func:`check_body`), then,
        with ``check_timestamps``, ``message.timestamp.before.max.ms`` / ``after.max.ms``
        (Kafka's KIP-937 rules): no record may be older than the broker's time minus
        before.max.ms nor later than the broker's time plus after.max.ms. Raises
        :class:`InvalidBatchError` or :class:`InvalidTimestampError`, nothing appended.

        Why the body: the header and CRC do not cover what readers decode, and a body they
        cannot decode, once acknowledged, stopped every reader of the partition there for
        good. Only the leader's append checks: followers copy the
        leader's bytes (``append_as_follower``). With a finite before.max.ms every record's
        timestamp is looked at, as Kafka's LogValidator (the header's ``base_timestamp`` is
        only the first record's, and producers may send records out of time order), from
        the same decode, so a batch is decoded once. Without one (Kafka's default)
        after.max.ms alone is checked against the header's ``max_timestamp``, which is what
        the producer wrote."""
        before = self.config.message_timestamp_before_max_ms
        after = self.config.message_timestamp_after_max_ms
        now = self.clock()
        view = memoryview(data).cast("B")
        extremes = check_timestamps and before < LONG_MAX
        for h in headers:
            ext = check_body(h, view[h.position : h.position + h.size], extremes=extremes)
            if not check_timestamps:
                continue
            if not extremes:
                _check_after(h, h.max_timestamp, None, now, after)
                continue
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
                # Compare with the previous batch of the request too; otherwise epochs
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
        split between batches, each part in a new segment (a request
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
        stepped forward rolled every partition at once. Headers only."""
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


#: Kafka's NO_TIMESTAMP: the lowest timestamp a batch header may carry.
NO_TIMESTAMP = -1


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
