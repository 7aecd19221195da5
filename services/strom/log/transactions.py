"""Transactions as one partition log sees them (DESIGN §6 "Transactions").

Everything here is derived from the batches the log holds, so leaders, followers and a log
recovering after a crash reach the same state from the same bytes:

- **Open transactions**: a transactional batch (attributes bit 4) of a producer with no open
  transaction opens one at its base offset; that producer's next marker closes it. The
  smallest open first offset is the partition's *first unstable offset*; the last stable
  offset (LSO) is the smaller of it and the high watermark. Open transactions live in the
  producer state (:mod:`strom.log.producer_state`), whose snapshots carry them.
- **Markers** are control batches (bits 4 and 5) the transaction coordinator has the leader
  write (never a producer): one record whose key is Kafka's control key (version int16 0,
  type int16: 0 abort, 1 commit) and whose value is (version int16 0, coordinator epoch int32).
  Only these rare batches are ever decoded on the append path; everything else stays
  header-only.
- **Aborted transactions** (producer id, first offset, last offset = the abort marker's
  offset) are what a read_committed fetch must tell the consumer so it can drop those batches.
  They are kept in ``aborted-transactions`` beside the segments (fixed 24-byte entries in log
  order); entries below the log start are dropped as retention deletes their data.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from strom.log.errors import naming
from strom.record.batch import decode_batches, encode_batch

#: Control record types (Kafka's ControlRecordType).
ABORT, COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch
#: Named like leader-epoch-checkpoint: no ".*index" suffix, which the log treats as a
#: segment index whose segment may be gone.
INDEX_NAME = "aborted-transactions"
_ENTRY = struct.Struct(">qqq")  # producer id, first offset, last offset


class MarkerError(ValueError):
    """A control batch whose record is not a commit or abort marker."""


@dataclass(frozen=True, slots=True)
class Marker:
    """A transaction marker's content."""

    committed: bool
    coordinator_epoch: int


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    """One aborted transaction of the partition."""

    last_offset: int  # first field: entries sort (and are appended) in log order
    producer_id: int
    first_offset: int


def encode_marker(
    producer_id: int,
    producer_epoch: int,
    committed: bool,
    coordinator_epoch: int,
    *,
    now_ms: int | None = None,
) -> bytes:
    """A marker batch (base offset 0; the leader assigns the real one on append)."""
    return encode_batch(
        [_CONTROL_VALUE.pack(0, coordinator_epoch)],
        keys=[_CONTROL_KEY.pack(0, COMMIT if committed else ABORT)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        transactional=True,
        control=True,
        now_ms=now_ms,
    )


def decode_marker(batch: bytes | memoryview) -> Marker:
    """The marker in one control batch's bytes (CRC checked)."""
    (b,) = decode_batches(batch)
    records = b.records()
    if len(records) != 1 or records[0].key is None or len(records[0].key) != _CONTROL_KEY.size:
        raise MarkerError(f"control batch at offset {b.header.base_offset} holds no marker")
    _, kind = _CONTROL_KEY.unpack(records[0].key)
    if kind not in (ABORT, COMMIT):
        raise MarkerError(f"control batch at offset {b.header.base_offset}: unknown type {kind}")
    epoch = -1
    value = records[0].value
    if value is not None and len(value) >= _CONTROL_VALUE.size:
        epoch = _CONTROL_VALUE.unpack_from(value)[1]
    return Marker(kind == COMMIT, epoch)


class AbortedIndex:
    """The partition's aborted transactions, in log order, mirrored to ``aborted-transactions``."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / INDEX_NAME
        self.entries: list[AbortedTxn] = []

    def load(self, below: int) -> None:
        """Read the file, keeping entries whose marker lies below ``below`` (those above are
        rebuilt from the batches by the caller). A torn last entry is dropped."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        usable = len(data) - len(data) % _ENTRY.size
        entries = []
        for pos in range(0, usable, _ENTRY.size):
            pid, first, last = _ENTRY.unpack_from(data, pos)
            if last < below:
                entries.append(AbortedTxn(last, pid, first))
        entries.sort()
        self.entries = entries

    def add(self, txn: AbortedTxn) -> None:
        """Record an abort marker appended at ``txn.last_offset`` (after every earlier one)."""
        self.entries.append(txn)
        with open(self.path, "ab") as f:
            f.write(_ENTRY.pack(txn.producer_id, txn.first_offset, txn.last_offset))

    def save(self) -> None:
        """Rewrite the file from memory (atomically). No aborts and no file is already what
        the file would say (a missing file loads as empty): nothing is written, which saves
        a new partition's log two file operations."""
        if not self.entries and not self.path.exists():
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(
                    b"".join(
                        _ENTRY.pack(e.producer_id, e.first_offset, e.last_offset)
                        for e in self.entries
                    )
                )
        except OSError as exc:  # a full disk: the old file stays, the error names it
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise naming(exc, "writing", self.path) from exc
        os.replace(tmp, self.path)

    def truncate(self, offset: int) -> None:
        """Forget aborts whose marker is at or after ``offset`` (the log was cut there)."""
        i = bisect.bisect_left(self.entries, AbortedTxn(offset, -(1 << 62), 0))
        if i < len(self.entries):
            del self.entries[i:]
            self.save()

    def drop_below(self, log_start_offset: int) -> None:
        """Forget aborts that ended below the log start (their batches are gone)."""
        i = bisect.bisect_left(self.entries, AbortedTxn(log_start_offset, -(1 << 62), 0))
        if i:
            del self.entries[:i]
            self.save()

    def overlapping(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions that may have batches in ``[start, end)``: ended at or after
        ``start`` and began before ``end``; sorted by first offset."""
        i = bisect.bisect_left(self.entries, AbortedTxn(start, -(1 << 62), 0))
        hits = [e for e in self.entries[i:] if e.first_offset < end]
        hits.sort(key=lambda e: e.first_offset)
        return hits

    def __len__(self) -> int:
        return len(self.entries)
