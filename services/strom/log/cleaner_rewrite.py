"""The cleaner's rewrite of one segment's batches: the records that survive, in batches that
keep their offsets.

:func:`_rewrite` turns a segment's batches into the bytes of its cleaned copy: each data
batch keeps the records the key map says are their key's latest (:func:`_kept_body`,
:func:`_kept_batch`), and a batch left with none stays as an empty batch covering its range
(:func:`_empty_batch`), runs of them merged where the producer state allows
(:func:`_mergeable`). Pure functions of bytes and the key map: separate from the files they
end up in (:mod:`strom.log.cleaner_swap`) and from the pass (:func:`strom.log.cleaner.compact`).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import numpy as np
import pyarrow as pa

from strom.record.batch import RecordBatch, decode_batches, encode_body
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    set_log_append_time,
)
from strom.record.schema import BODY_SCHEMA_V1


def body_or_none(b: RecordBatch, undecodable: set[int]) -> pa.RecordBatch | None:
    """``b``'s body, or None when it cannot be decoded (garbage under a valid CRC, stored
    before leaders checked bodies on append). Not an error: the cleaner cannot know such a
    batch's keys, so it keeps it whole and compacts the rest of the log; raising would fail
    every pass of the partition for good.

    ``undecodable`` holds the base offsets of the batches of this pass known not to decode
    (each pass reads a segment up to three times: key map, transactions, rewrite): they are
    not decoded again, and a new failure is added."""
    off = b.header.base_offset
    if off in undecodable:
        return None
    try:
        return b.body()
    except InvalidBatchError:
        undecodable.add(off)
        return None


def _kept_body(
    b: RecordBatch,
    latest: np.ndarray,
    drop_tombstones: bool,
    aborted: set[int],
    undecodable: set[int],
) -> pa.RecordBatch | None:
    """The records of data batch ``b`` that compaction keeps (tombstones only while
    ``drop_tombstones`` is false: see :func:`_tombstones_expired`); None when its body cannot
    be decoded (:func:`body_or_none`: kept whole). ``latest`` is the sorted array of each
    key's latest offset (:meth:`_KeyMap.latest_offsets`)."""
    import pyarrow.compute as pc  # (here: ~60 ms at import, and most nodes never compact)

    h = b.header
    body = body_or_none(b, undecodable)
    if body is None or body.num_rows == 0:
        return body
    if h.base_offset in aborted:
        return body.slice(0, 0)
    offsets = body.column(0).to_numpy(zero_copy_only=False).astype(np.int64) + h.base_offset
    # A binary search in the sorted map, not ``pc.is_in(offsets, value_set=latest)``,
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
    undecodable: set[int],
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
            kept_or_none = _kept_body(b, latest, drop_tombstones, aborted, undecodable)
            if kept_or_none is None:  # an undecodable body: kept as it is (body_or_none)
                flush_pending()
                out.append(b.raw.tobytes())
                continue
            body, kept = b.body(), kept_or_none
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
