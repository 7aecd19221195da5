"""Lookups by time in a partition log: ListOffsets by timestamp and by the largest one.

:class:`TimeLookup` is mixed into :class:`strom.log.partition_log.Log`. Both lookups find
their segment and batch by the time indexes and segment maxima, then read that batch
through ``Log.read`` and look at its timestamp column: admin lookups, off the produce and
fetch paths.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from strom.log.errors import CorruptLogError, OffsetOutOfRangeError, UndecodableBatchError
from strom.log.results import ReadResult
from strom.log.segment import MAX_STORED_BATCH_BYTES, LogSegment
from strom.record.batch import RecordBatch, decode_batches
from strom.record.errors import InvalidBatchError


class TimeLookup:
    """``offset_for_timestamp`` and ``max_timestamp_offset`` of a log.

    A mixin rather than an object of its own: the lookups take a snapshot of the log's
    segments under its lock and read through its ``read``. Every attribute is set by
    ``Log.__init__``; the annotations say which ones they use.
    """

    # -- set by Log.__init__ ---------------------------------------------------------------
    lock: threading.RLock
    segments: list[LogSegment]
    log_start_offset: int

    if TYPE_CHECKING:  # the Log's (the parameters the lookups pass)

        def read(self, offset: int, max_bytes: int = ..., *, min_one: bool = ...) -> ReadResult: ...

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
                # index does not list it (a damaged .timeindex made the
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
                    offs, ts = (col.to_numpy() for col in _columns(batch))
                    ts = ts.astype(np.int64)
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
        the deleted records must not be answered (after deleting every
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
        offs, ts = (col.to_numpy() for col in _columns(batches[0]))
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
                offs, ts = (col.to_numpy() for col in _columns(batch))
                ts = ts.astype(np.int64)[offs >= start]
                if ts.size and (best is None or int(ts.max()) > best[0]):
                    top = int(ts.max())
                    best, by_header = (top, int(offs[offs >= start][np.argmax(ts)])), False
            offset = max(result.next_offset, offset + 1)
        if best is not None and by_header:
            return self._first_at(best[1], best[0], start)
        return best


def _decode(data: bytes | memoryview) -> list[RecordBatch]:
    try:
        return decode_batches(data, max_batch_bytes=MAX_STORED_BATCH_BYTES)
    except InvalidBatchError as exc:  # a CRC or body fault in what the log holds: corruption
        raise CorruptLogError(str(exc)) from exc


def _columns(batch: RecordBatch) -> list[Any]:
    """The batch's absolute offset and timestamp columns; :class:`UndecodableBatchError`
    naming its offset when its body cannot be decoded (a batch stored before leaders checked
    bodies, or rotted). Why: the decode is lazy, past :func:`_decode`'s check, and its
    InvalidBatchError escaped as an unexpected error (UNKNOWN_SERVER_ERROR and a traceback
    on every ListOffsets by time over the batch)."""
    try:
        return batch.arrow_columns()[:2]
    except InvalidBatchError as exc:
        base = batch.header.base_offset
        raise UndecodableBatchError(
            f"batch at offset {base} ({batch.header.record_count} records): {exc}", offset=base
        ) from None
