"""Idempotent producer state of one partition (DESIGN §6 "Idempotent producers").

Per producer id the log keeps the producer's current epoch and the last
:data:`BATCHES_KEPT` batches it appended: sequence range, offsets and max timestamp. That is
enough to decide, from batch header fields alone (producer id, producer epoch, base sequence,
last offset delta), what to do with each batch of a produce request:

==============================================  ==============================================
batch                                           verdict
==============================================  ==============================================
producer id -1                                  not idempotent: appended, nothing checked
unknown producer id, base sequence 0            appended (a new producer)
unknown producer id, base sequence > 0          ``UNKNOWN_PRODUCER_ID``
epoch older than the producer's                 ``INVALID_PRODUCER_EPOCH`` (fenced)
newer epoch, base sequence 0                    appended (sequences restart with an epoch)
newer epoch, base sequence > 0                  ``OUT_OF_ORDER_SEQUENCE``
same epoch, same range as a kept batch          duplicate: answered with its original offsets
same epoch, base sequence = last sequence + 1   appended
same epoch, after the last sequence written     ``OUT_OF_ORDER_SEQUENCE`` (never a duplicate)
same epoch, wholly before every kept batch      found in the log by its header: its offsets;
                                                else ``DUPLICATE_SEQUENCE`` (offsets unknown)
anything else (a gap, an overlap)               ``OUT_OF_ORDER_SEQUENCE``
==============================================  ==============================================

Why a batch before every kept one is taken as a retry rather than refused (Kafka refuses all
but an exact match with a kept batch): strom's Python producer may have more than
:data:`BATCHES_KEPT` batches of a partition unanswered (``max_in_flight`` requests, each
with several batches of the partition), so after a lost answer or a leader change its retry
of an older batch must still not be written twice. The leader then looks for that batch in
its log by its header (``Log._find_older_batch``: a bounded walk of batch headers before the
oldest kept batch), so the retry gets its real offsets, as a kept one does; only a batch the
walk does not find (beyond its bound, or no batch with that exact sequence range: a split
half) is answered ``DUPLICATE_SEQUENCE`` without offsets. A batch *after* the newest
sequence the epoch wrote, though, was never written (it used to
count as such a retry whenever it fell in the half of the sequence space before the oldest
kept batch, so a caller's new records were answered as written and dropped). An epoch's
sequences start at 0 and each record takes an offset, so an epoch whose newest record's
offset is less than 2**31 above its sequence has not wrapped: every sequence above the
newest was never written.

A duplicate is answered so even when it is larger than the topic's ``max.message.bytes`` is
now (lowered after it was appended): the leader checks the size of the other batches only
(:meth:`ProducerStateManager.repeats`, ``Log._repeats_over_limit``).

Sequence numbers wrap from 2**31 - 1 to 0, as in Kafka. The refusal reasons are the names of
the ``strom.v1.ErrorCode`` values the storage node answers with; this module itself knows
nothing of gRPC or etcd. :class:`ProducerStateManager` is not thread-safe: the partition log
uses it under its own lock. State is updated only from batches actually written (leader
appends and follower replication alike), so it always describes the log.

Snapshots: :func:`write_snapshot` stores the state as of an offset in
``<offset:020d>.snapshot`` beside the segments (CRC-protected); the log writes one when it
rolls a segment and when it closes, so that opening it only has to scan the batch headers
after the newest snapshot.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import crc32c

from strom.log.errors import LogError, naming
from strom.record.header import ATTR_CONTROL as _ATTR_CONTROL
from strom.record.header import ATTR_TRANSACTIONAL as _ATTR_TRANSACTIONAL

if TYPE_CHECKING:
    from strom.log.transactions import Marker

#: Sequence numbers are 31-bit and wrap to 0 after this.
MAX_SEQUENCE = (1 << 31) - 1
#: Producer epochs are 16-bit in the batch header.
MAX_PRODUCER_EPOCH = 32767
#: How many recent batches per producer can be recognised as retries (Kafka: 5).
BATCHES_KEPT = 5
NO_PRODUCER_ID = -1

# Refusal reasons: the ErrorCode names the storage node answers with.
OUT_OF_ORDER_SEQUENCE = "OUT_OF_ORDER_SEQUENCE"
INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"
UNKNOWN_PRODUCER_ID = "UNKNOWN_PRODUCER_ID"
DUPLICATE_SEQUENCE = "DUPLICATE_SEQUENCE"
INVALID_RECORD = "INVALID_RECORD"
TRANSACTION_COORDINATOR_FENCED = "TRANSACTION_COORDINATOR_FENCED"

SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_RE = re.compile(r"^(\d{20})\.snapshot$")
_SNAP_MAGIC = b"STPS"
#: Version 2 added each producer's open transaction (first offset), version 3 the
#: coordinator epoch of its last marker, version 4 its last batch's timestamp; older
#: versions still load.
_SNAP_VERSION = 4
_SNAP_HEAD = struct.Struct(">4sHHqI")  # magic, version, reserved, offset, producer count
_SNAP_PRODUCER_V1 = struct.Struct(">qhBxq")  # producer id, epoch, batch count, last seen ms
_SNAP_PRODUCER_V2 = struct.Struct(">qhBxqq")  # ... and the open transaction's first offset
_SNAP_PRODUCER_V3 = struct.Struct(">qhBxqqi")  # ... and the last marker's coordinator epoch
_SNAP_PRODUCER = struct.Struct(">qhBxqqiq")  # ... and the last batch's max timestamp
_SNAP_PRODUCERS = {
    1: _SNAP_PRODUCER_V1,
    2: _SNAP_PRODUCER_V2,
    3: _SNAP_PRODUCER_V3,
    4: _SNAP_PRODUCER,
}
_SNAP_BATCH = struct.Struct(">iiqqq")  # first seq, last seq, base offset, last offset, ts
_SNAP_CRC = struct.Struct(">I")


class HeaderLike(Protocol):
    """The batch header fields the state needs (:class:`strom.record.BatchHeader` has them)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def base_sequence(self) -> int: ...
    @property
    def last_sequence(self) -> int: ...
    @property
    def base_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...


def next_sequence(seq: int, count: int = 1) -> int:
    """The sequence ``count`` after ``seq``, wrapping at 2**31 - 1."""
    return (seq + count) & MAX_SEQUENCE


def _precedes(a: int, b: int) -> bool:
    """Whether sequence ``a`` comes strictly before ``b`` (within half the wrapped space)."""
    return 0 < (b - a) & MAX_SEQUENCE < (1 << 30)


def _never_written(entry: ProducerEntry, first_seq: int) -> bool:
    """Whether ``first_seq`` comes after every sequence the entry's epoch has written (see
    the module docstring): within half the wrapped space after the newest, or anywhere above
    it while the epoch has not wrapped. Such a batch is never a retry."""
    last = entry.last_seq
    if _precedes(last, first_seq):
        return True
    return first_seq > last and entry.batches[-1].last_offset - last <= MAX_SEQUENCE


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended batch of a producer, as far as retries need to know it."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int  # the batch's max timestamp as stored (the append time for LogAppendTime)


class ProducerEntry:
    """One producer id's epoch, most recent batches (oldest first), open transaction and the
    coordinator epoch of its last marker.

    Two times, for two uses. ``last_timestamp_ms`` is the max timestamp of its last batch
    (marker included) as stored, Kafka's ``lastTimestamp``: what DescribeProducers reports
    and ``strom transactions find-hanging`` ages an open transaction by. It is in the
    batches, so a rebuild from the log after a crash finds the same value (a hanging
    transaction must not look fresh after every restart). ``last_seen_ms`` is this node's
    clock when the state last changed for the producer, and only
    ``producer.id.expiration.ms`` uses it: a producer's own timestamps may be days old (a
    backfill), and expiring by them would forget an active idempotent producer's sequences.
    A rebuild sets it to the rebuild's time, which only delays an expiry."""

    __slots__ = (
        "batches",
        "coordinator_epoch",
        "epoch",
        "last_seen_ms",
        "last_timestamp_ms",
        "producer_id",
        "txn_first_offset",
    )

    def __init__(
        self,
        producer_id: int,
        epoch: int,
        last_seen_ms: int,
        txn_first_offset: int = -1,
        coordinator_epoch: int = -1,
        last_timestamp_ms: int | None = None,
    ) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.last_seen_ms = last_seen_ms
        #: The max timestamp of its last batch (see the class docstring).
        self.last_timestamp_ms = last_seen_ms if last_timestamp_ms is None else last_timestamp_ms
        self.batches: deque[BatchMetadata] = deque(maxlen=BATCHES_KEPT)
        #: Offset of the first batch of the producer's open transaction; -1 = none open.
        self.txn_first_offset = txn_first_offset
        #: The coordinator epoch of the newest marker written for this producer (-1: none).
        #: A marker from an older coordinator epoch comes from a coordinator that lost its
        #: shard (a zombie) and is refused, as in Kafka.
        self.coordinator_epoch = coordinator_epoch

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def __repr__(self) -> str:
        return (
            f"ProducerEntry(id={self.producer_id}, epoch={self.epoch}, "
            f"batches={list(self.batches)}, last_seen_ms={self.last_seen_ms}, "
            f"last_timestamp_ms={self.last_timestamp_ms}, "
            f"txn_first_offset={self.txn_first_offset}, "
            f"coordinator_epoch={self.coordinator_epoch})"
        )


class ProducerStateError(LogError):
    """A batch failed the idempotence check; nothing of the request was appended.

    ``reason`` is the ErrorCode name to answer with (see the module docstring).
    ``written_by`` (``DUPLICATE_SEQUENCE`` only, else -1): an offset at or after the last
    record of the repeated batches, which the high watermark must pass before an acks=all
    request may be answered "written": the repeated batch's own last offset when known, else
    the producer's newest appended offset (the batch lies at or before it). Without it a
    duplicate was answered while its first attempt was on the leader alone, and lost with
    it."""

    def __init__(
        self,
        reason: str,
        message: str,
        producer_id: int = NO_PRODUCER_ID,
        *,
        written_by: int = -1,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.producer_id = producer_id
        self.written_by = written_by


#: Finds, in the log, a batch of a producer written before every batch its entry keeps:
#: (entry, first sequence, last sequence) -> the batch's metadata, or None when not found.
OlderBatchLookup = Callable[["ProducerEntry", int, int], "BatchMetadata | None"]


def check_batch(
    entry: ProducerEntry | None,
    producer_id: int,
    epoch: int,
    first_seq: int,
    last_seq: int,
    older: OlderBatchLookup | None = None,
) -> BatchMetadata | None:
    """Decide one idempotent batch against its producer's state.

    Returns None when the batch is new and in sequence (append it), the kept metadata when
    it repeats a recent batch (answer with the original offsets), and raises
    :class:`ProducerStateError` otherwise. A batch wholly before every kept one is looked
    up with ``older`` (the log's header walk, ``Log._find_older_batch``) when given: found,
    it is answered like a kept one; not found, it is ``DUPLICATE_SEQUENCE`` as before.
    """
    if entry is None:
        if first_seq == 0:
            return None
        raise ProducerStateError(
            UNKNOWN_PRODUCER_ID,
            f"no state for producer id {producer_id} (expired, or its batches were deleted) "
            f"and the batch starts at sequence {first_seq}, not 0: bump the epoch",
            producer_id,
        )
    if epoch < entry.epoch:
        raise ProducerStateError(
            INVALID_PRODUCER_EPOCH,
            f"producer id {producer_id} epoch {epoch} is fenced: epoch {entry.epoch} took over",
            producer_id,
        )
    if epoch > entry.epoch:
        if first_seq == 0:
            return None
        raise ProducerStateError(
            OUT_OF_ORDER_SEQUENCE,
            f"producer id {producer_id}: the first batch of the new epoch {epoch} starts at "
            f"sequence {first_seq}, not 0",
            producer_id,
        )
    duplicate = entry.find(first_seq, last_seq)
    if duplicate is not None:
        return duplicate
    if first_seq == next_sequence(entry.last_seq):
        return None
    if (
        entry.batches
        and not _never_written(entry, first_seq)
        and _precedes(last_seq, entry.batches[0].first_seq)
    ):
        found = None if older is None else older(entry, first_seq, last_seq)
        if found is not None:
            return found
        raise ProducerStateError(
            DUPLICATE_SEQUENCE,
            f"producer id {producer_id} epoch {epoch}: sequences {first_seq}..{last_seq} were "
            f"appended before the last {len(entry.batches)} batches, whose offsets are no "
            "longer known",
            producer_id,
            written_by=entry.batches[-1].last_offset,
        )
    raise ProducerStateError(
        OUT_OF_ORDER_SEQUENCE,
        f"producer id {producer_id} epoch {epoch}: expected sequence "
        f"{next_sequence(entry.last_seq)}, got {first_seq}..{last_seq}",
        producer_id,
    )


def _check_follows(
    pid: int, prev_epoch: int, prev_last: int, epoch: int, first: int, last: int
) -> None:
    """A batch must continue the one before it in the same request (no repeats there)."""
    if epoch < prev_epoch:
        raise ProducerStateError(
            INVALID_PRODUCER_EPOCH,
            f"producer id {pid} epoch {epoch} is fenced: epoch {prev_epoch} comes before it "
            "in the same request",
            pid,
        )
    if epoch > prev_epoch and first == 0:
        return
    if epoch == prev_epoch and first == next_sequence(prev_last):
        return
    raise ProducerStateError(
        OUT_OF_ORDER_SEQUENCE,
        f"producer id {pid} epoch {epoch}: sequences {first}..{last} do not continue the "
        f"previous batch of the request (which ended at {prev_last}, epoch {prev_epoch})",
        pid,
    )


class ProducerStateManager:
    """The producer state of one partition log (see the module docstring)."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        #: Producers with an open transaction -> its first offset (mirrors the entries).
        self.ongoing: dict[int, int] = {}
        self._first_unstable: int | None = None

    def __len__(self) -> int:
        return len(self.producers)

    def __iter__(self) -> Iterator[ProducerEntry]:
        return iter(self.producers.values())

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.get(producer_id)

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self._first_unstable = None

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None when none is open): the
        last stable offset can not pass it."""
        return self._first_unstable

    def _open_txn(self, entry: ProducerEntry, offset: int) -> None:
        entry.txn_first_offset = offset
        self.ongoing[entry.producer_id] = offset
        if self._first_unstable is None or offset < self._first_unstable:
            self._first_unstable = offset

    def _close_txn(self, entry: ProducerEntry) -> int:
        first = entry.txn_first_offset
        entry.txn_first_offset = -1
        self.ongoing.pop(entry.producer_id, None)
        if first == self._first_unstable:
            self._first_unstable = min(self.ongoing.values(), default=None)
        return first

    # -- the leader's check ----------------------------------------------------------------

    def check(
        self, headers: Sequence[HeaderLike], older: OlderBatchLookup | None = None
    ) -> list[BatchMetadata]:
        """Check a produce request's batches for one partition, in order.

        Returns the original metadata of the leading batches that repeat recent ones (empty
        when there are none): those are answered, not appended. ``older`` finds a repeat of
        a batch older than every kept one in the log (see :func:`check_batch`). The batches
        after them are new and in sequence. Raises :class:`ProducerStateError` when any
        batch is refused, including a repeat that comes after a new batch (retries never
        follow new data). Changes nothing: :meth:`update` records the batches once they are
        written.
        """
        duplicates: list[BatchMetadata] = []
        pending: dict[int, tuple[int, int]] = {}  # new batches earlier in this request
        new_seen = False
        for h in headers:
            pid = h.producer_id
            if pid < 0:
                new_seen = True
                continue
            epoch, first = h.producer_epoch, h.base_sequence
            if epoch < 0 or first < 0:
                raise ProducerStateError(
                    INVALID_RECORD,
                    f"batch of producer id {pid} has producer epoch {epoch} and base "
                    f"sequence {first}: an idempotent batch needs both >= 0",
                    pid,
                )
            last = h.last_sequence
            earlier = pending.get(pid)
            if earlier is not None:
                # A later batch of a producer that has a new batch earlier in the request.
                _check_follows(pid, earlier[0], earlier[1], epoch, first, last)
            else:
                try:
                    found = check_batch(self.producers.get(pid), pid, epoch, first, last, older)
                except ProducerStateError as exc:
                    if exc.reason == DUPLICATE_SEQUENCE and h is not headers[-1]:
                        # DUPLICATE_SEQUENCE answers for the whole request ("written"): with
                        # batches after this one, a client would count those as written too
                        # though nothing was appended (no strom client sends a retry with
                        # other batches; one in another language might).
                        raise ProducerStateError(
                            OUT_OF_ORDER_SEQUENCE,
                            f"{exc.message}, and the request carries more batches after "
                            "them: send retried batches in their own request",
                            pid,
                        ) from None
                    raise
                if found is not None:
                    if new_seen:
                        raise ProducerStateError(
                            OUT_OF_ORDER_SEQUENCE,
                            f"producer id {pid}: sequences {first}..{last} were appended "
                            "already but follow new batches in the request; send retries "
                            "in their own request",
                            pid,
                        )
                    duplicates.append(found)
                    continue
            pending[pid] = (epoch, last)
            new_seen = True
        return duplicates

    def repeats(self, headers: Sequence[HeaderLike]) -> int:
        """How many of a request's leading batches repeat, exactly, batches this state
        remembers (same producer id and epoch, same sequence range): those :meth:`check`
        answers with their original offsets. Never raises and changes nothing; the leader
        asks it only to decide whether a batch over max.message.bytes is such a repeat
        (``Log._repeats_over_limit``), and :meth:`check` still decides every batch. A
        repeat has its producer's current epoch, so no fencing check can refuse it."""
        n = 0
        for h in headers:
            entry = self.producers.get(h.producer_id)
            if (
                entry is None
                or h.base_sequence < 0
                or h.producer_epoch != entry.epoch
                or entry.find(h.base_sequence, h.last_sequence) is None
            ):
                break
            n += 1
        return n

    # -- updates ---------------------------------------------------------------------------

    def update(
        self,
        headers: Iterable[HeaderLike],
        now_ms: int,
        markers: Mapping[int, Marker] | None = None,
    ) -> list[tuple[int, int, int]]:
        """Record written batches (offsets assigned): leader appends, replicated batches and
        batches scanned when the state is rebuilt. Non-idempotent batches are skipped.
        ``now_ms`` is this node's clock (expiry); the reported time is each producer's last
        batch's max timestamp (see :class:`ProducerEntry`).

        Transactions: a transactional batch opens its producer's transaction if none is open;
        a control batch (a marker; ``markers`` maps its base offset to the decoded marker)
        closes it and raises the producer's epoch and coordinator epoch to the marker's.
        Returns the
        aborted transactions closed here as (producer id, first offset, marker offset).
        """
        producers = self.producers
        aborted: list[tuple[int, int, int]] = []
        for h in headers:
            pid = h.producer_id
            if pid < 0:
                continue
            attributes = getattr(h, "attributes", 0)
            if attributes & _ATTR_CONTROL:
                entry = producers.get(pid)
                if entry is None:
                    entry = producers[pid] = ProducerEntry(pid, h.producer_epoch, now_ms)
                elif h.producer_epoch > entry.epoch:
                    entry.epoch = h.producer_epoch
                    entry.batches.clear()  # the next epoch's sequences start at 0
                entry.last_seen_ms = now_ms
                entry.last_timestamp_ms = h.max_timestamp
                marker = None if markers is None else markers.get(h.base_offset)
                if marker is not None and marker.coordinator_epoch > entry.coordinator_epoch:
                    entry.coordinator_epoch = marker.coordinator_epoch
                if entry.txn_first_offset >= 0:
                    first = self._close_txn(entry)
                    if marker is not None and not marker.committed:
                        aborted.append((pid, first, h.base_offset))
                continue
            if h.base_sequence < 0:
                continue
            entry = producers.get(pid)
            if entry is None:
                entry = producers[pid] = ProducerEntry(pid, h.producer_epoch, now_ms)
            elif h.producer_epoch != entry.epoch:
                entry.epoch = h.producer_epoch
                entry.batches.clear()
            entry.batches.append(
                BatchMetadata(
                    h.base_sequence, h.last_sequence, h.base_offset, h.last_offset, h.max_timestamp
                )
            )
            entry.last_seen_ms = now_ms
            entry.last_timestamp_ms = h.max_timestamp
            if attributes & _ATTR_TRANSACTIONAL and entry.txn_first_offset < 0:
                self._open_txn(entry, h.base_offset)
        return aborted

    def evict_below(self, log_start_offset: int) -> int:
        """Forget producers whose batches all lie below the log start (retention,
        DeleteRecords); returns how many. Their next batch is UNKNOWN_PRODUCER_ID unless it
        starts a sequence at 0."""
        gone = [
            p
            for p, e in self.producers.items()
            if e.last_offset < log_start_offset and e.txn_first_offset < 0
        ]
        for p in gone:
            del self.producers[p]
        return len(gone)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers not seen for ``expiration_ms`` (``producer.id.expiration.ms``);
        returns how many."""
        if expiration_ms < 0:
            return 0
        gone = [
            p
            for p, e in self.producers.items()
            if now_ms - e.last_seen_ms >= expiration_ms and e.txn_first_offset < 0
        ]
        for p in gone:
            del self.producers[p]
        return len(gone)

    # -- snapshots -------------------------------------------------------------------------

    def to_bytes(self, offset: int) -> bytes:
        """Serialise the state as of ``offset`` (it covers every batch below it)."""
        parts = [_SNAP_HEAD.pack(_SNAP_MAGIC, _SNAP_VERSION, 0, offset, len(self.producers))]
        for e in self.producers.values():
            parts.append(
                _SNAP_PRODUCER.pack(
                    e.producer_id,
                    e.epoch,
                    len(e.batches),
                    e.last_seen_ms,
                    e.txn_first_offset,
                    e.coordinator_epoch,
                    e.last_timestamp_ms,
                )
            )
            for b in e.batches:
                parts.append(
                    _SNAP_BATCH.pack(
                        b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.timestamp
                    )
                )
        body = b"".join(parts)
        return body + _SNAP_CRC.pack(crc32c.crc32c(body))

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[int, ProducerStateManager]:
        """Parse :meth:`to_bytes` output: (offset, state). ValueError when damaged."""
        if len(data) < _SNAP_HEAD.size + _SNAP_CRC.size:
            raise ValueError(f"producer snapshot too short ({len(data)} bytes)")
        body = memoryview(data)[: -_SNAP_CRC.size]
        (crc,) = _SNAP_CRC.unpack_from(data, len(data) - _SNAP_CRC.size)
        if crc32c.crc32c(body) != crc:
            raise ValueError("producer snapshot CRC mismatch")
        magic, version, _, offset, count = _SNAP_HEAD.unpack_from(body, 0)
        record = _SNAP_PRODUCERS.get(version)
        if magic != _SNAP_MAGIC or record is None:
            raise ValueError(f"not a producer snapshot (magic {magic!r}, version {version})")
        state = cls()
        pos = _SNAP_HEAD.size
        try:
            for _ in range(count):
                pid, epoch, n, seen, *rest = record.unpack_from(body, pos)
                pos += record.size
                # Before version 4 the reported time was the last time seen.
                rest += [-1, -1, seen][len(rest) :]
                entry = ProducerEntry(pid, epoch, seen, rest[0], rest[1], rest[2])
                for _ in range(n):
                    entry.batches.append(BatchMetadata(*_SNAP_BATCH.unpack_from(body, pos)))
                    pos += _SNAP_BATCH.size
                state.producers[pid] = entry
                if entry.txn_first_offset >= 0:
                    state._open_txn(entry, entry.txn_first_offset)
        except struct.error as exc:
            raise ValueError(f"producer snapshot truncated: {exc}") from None
        if pos != len(body):
            raise ValueError(f"producer snapshot has {len(body) - pos} stray bytes")
        return offset, state


# -- snapshot files ----------------------------------------------------------------------------


def snapshot_path(directory: Path, offset: int) -> Path:
    return Path(directory) / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending."""
    return sorted(
        int(m.group(1)) for p in Path(directory).iterdir() if (m := _SNAPSHOT_RE.match(p.name))
    )


def write_snapshot(
    directory: Path, offset: int, state: ProducerStateManager, *, fsync: bool = False
) -> Path:
    """Write ``state`` as of ``offset`` atomically (temp file, rename). Without fsync a crash
    may leave a damaged file: loading then fails its CRC and the log scans instead."""
    path = snapshot_path(directory, offset)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(state.to_bytes(offset))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:  # a full disk: the error names the file, the temp goes
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise naming(exc, "writing", path) from exc
    os.replace(tmp, path)
    return path


def load_snapshot(directory: Path, offset: int) -> ProducerStateManager:
    """Read the snapshot at ``offset``; ValueError (or OSError) when unusable."""
    got, state = ProducerStateManager.from_bytes(snapshot_path(directory, offset).read_bytes())
    if got != offset:
        raise ValueError(f"snapshot file for offset {offset} holds offset {got}")
    return state


def delete_snapshots(directory: Path, offsets: Iterable[int]) -> None:
    for off in offsets:
        snapshot_path(directory, off).unlink(missing_ok=True)
