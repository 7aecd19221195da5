"""The cleaner's first read of a log: each key's latest offset, and what the headers tell.

:class:`_KeyMap` builds the key → latest offset map of the whole log below the pass's end
with Arrow's group-by (no per-record Python), merged segment by segment;
:class:`_LogScan` keeps beside it what the producer state and the transactions need from the
batch headers. Separate from the rewrite (:mod:`strom.log.cleaner_rewrite`), which only reads
the map this builds, and from the pass (:func:`strom.log.cleaner.compact`), which drives both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet

import numpy as np
import pyarrow as pa

from strom.log.cleaner_rewrite import body_or_none
from strom.log.errors import CorruptLogError
from strom.log.producer_state import BATCHES_KEPT
from strom.log.segment import MAX_STORED_BATCH_BYTES, EpochLookup, LogSegment
from strom.log.transactions import AbortedTxn
from strom.record.batch import RecordBatch, decode_batches
from strom.record.errors import InvalidBatchError


def _segment_batches(seg: LogSegment, data: bytes, epoch_for: EpochLookup) -> list[RecordBatch]:
    """``data`` (the first bytes of ``seg``'s file) as checked batches."""
    # Check every batch as a read does (CRC, tiling from the segment base, leader
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


def _segment_latest(
    batches: list[RecordBatch],
    upto: int,
    skip: set[int],
    undecodable: set[int],
) -> pa.Table | None:
    """The offset of each key's latest record among one segment's ``batches`` below
    ``upto``, leaving out transaction markers and the batches of aborted transactions (base
    offsets in ``skip``), as a table (key, offset); None when the segment has no such record.

    The group-by copies the keys out of the segment's buffers, so the segment can go once
    its map is taken. A batch whose body cannot be decoded adds no key (the rewrite keeps it
    whole, see :func:`body_or_none`); its base offset is added to ``undecodable``."""
    import pyarrow.compute as pc  # (here: ~60 ms at import, and most nodes never compact)

    keys: list[pa.Array] = []
    offsets: list[pa.Array] = []
    for b in batches:
        if b.header.is_control or b.header.base_offset in skip:
            continue
        body = body_or_none(b, undecodable)
        if body is None:
            continue
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
        #: Base offsets of the data batches whose body cannot be decoded (kept as they are).
        self.undecodable: set[int] = set()

    def add(self, seg: LogSegment, size: int, batches: list[RecordBatch]) -> None:
        """Take what the pass needs from ``seg``'s ``batches`` (segments in offset order),
        read from its first ``size`` bytes."""
        self.sizes[seg.base_offset] = size
        dropped = _aborted_batches(batches, self.aborted)
        self.dropped |= dropped
        self.keys.add(_segment_latest(batches, self.upto, dropped, self.undecodable))
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
