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
  order); entries below the log start are dropped as retention deletes their data, and the
  log cleaner drops those whose marker it removed with the transaction's records (Kafka
  rewrites a cleaned segment's transaction index the same way): on a compacted topic the log
  start never moves, so the index would otherwise grow with every abort ever written.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from strom.log.checkpoint import fsync_dir
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
#: Below every producer id: the key that bisects to the first entry of a marker offset.
_LOWEST = -(1 << 62)


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
    """The partition's aborted transactions, in log order, mirrored to ``aborted-transactions``.

    ``entries`` is sorted by marker offset (``last_offset``). :meth:`overlapping` also needs
    the longest transaction's span (marker offset minus first offset): no entry whose marker
    lies that far past a range's end can have begun inside it, so a read_committed fetch
    looks at the entries near its range instead of at every later one."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / INDEX_NAME
        self._entries: list[AbortedTxn] = []
        self._max_span = 0  # an upper bound of last_offset - first_offset over the entries

    @property
    def entries(self) -> list[AbortedTxn]:
        """The entries in log order (read-only: change them through the methods)."""
        return self._entries

    @entries.setter
    def entries(self, entries: Iterable[AbortedTxn]) -> None:
        self._entries = sorted(entries)
        self._max_span = max((e.last_offset - e.first_offset for e in self._entries), default=0)

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
        self.entries = entries

    def add(self, txn: AbortedTxn) -> None:
        """Record an abort marker appended at ``txn.last_offset`` (after every earlier one)."""
        self.remember(txn)
        with open(self.path, "ab") as f:
            f.write(_ENTRY.pack(txn.producer_id, txn.first_offset, txn.last_offset))

    def remember(self, txn: AbortedTxn) -> None:
        """Add ``txn`` (after every earlier one) in memory only: a rebuild from the batches
        saves the whole index once it is done."""
        self._entries.append(txn)
        self._max_span = max(self._max_span, txn.last_offset - txn.first_offset)

    def save(self, *, fsync: bool = False) -> None:
        """Rewrite the file from memory (atomically: a temporary file renamed over it, which
        a start removes if a crash leaves it; with ``fsync`` durably too). No aborts and no
        file is already what the file would say (a missing file loads as empty): nothing is
        written, which saves a new partition's log two file operations."""
        if not self._entries and not self.path.exists():
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(
                    b"".join(
                        _ENTRY.pack(e.producer_id, e.first_offset, e.last_offset)
                        for e in self._entries
                    )
                )
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as exc:  # a full disk: the old file stays, the error names it
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise naming(exc, "writing", self.path) from exc
        os.replace(tmp, self.path)
        if fsync:
            fsync_dir(self.path.parent)

    def truncate(self, offset: int) -> None:
        """Forget aborts whose marker is at or after ``offset`` (the log was cut there)."""
        i = bisect.bisect_left(self._entries, AbortedTxn(offset, _LOWEST, 0))
        if i < len(self._entries):
            del self._entries[i:]
            self.save()

    def drop_below(self, log_start_offset: int) -> None:
        """Forget aborts that ended below the log start (their batches are gone)."""
        i = bisect.bisect_left(self._entries, AbortedTxn(log_start_offset, _LOWEST, 0))
        if i:
            del self._entries[:i]
            self.save()

    def prune(self, below: int, markers: AbstractSet[int], *, fsync: bool = False) -> int:
        """Forget the aborts whose marker lies below ``below`` and is not among ``markers``
        (the base offsets of the control batches the log still holds there): the cleaner
        removed the marker with every record of its transaction, so no fetch needs the entry
        (Kafka's cleaner keeps a cleaned segment's aborted transactions only when it keeps
        their markers). The file is rewritten as :meth:`save` does, durably when ``fsync``.
        Returns how many entries went.

        The caller prunes only after the segments without those markers are swapped in: a
        crash in between leaves entries whose batches are empty, which changes no
        read_committed answer, and the next pass prunes them. Pruning first would let a
        crash bring back aborted records with no entry to hide them."""
        keep = [e for e in self._entries if e.last_offset >= below or e.last_offset in markers]
        gone = len(self._entries) - len(keep)
        if gone:
            self.entries = keep
            self.save(fsync=fsync)
        return gone

    def overlapping(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions that may have batches in ``[start, end)``: ended at or after
        ``start`` and began before ``end``; sorted by first offset. Only entries whose marker
        lies below ``end`` plus the longest span can qualify (see the class docstring)."""
        entries = self._entries
        i = bisect.bisect_left(entries, AbortedTxn(start, _LOWEST, 0))
        j = bisect.bisect_left(entries, AbortedTxn(end + self._max_span, _LOWEST, 0), lo=i)
        hits = [e for e in entries[i:j] if e.first_offset < end]
        hits.sort(key=lambda e: e.first_offset)
        return hits

    def __len__(self) -> int:
        return len(self._entries)
