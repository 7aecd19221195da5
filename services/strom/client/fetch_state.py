"""What the consumer keeps of its fetches: per answer, the batches one Fetch returned for one
partition (:class:`CompletedFetch`, drained by ``poll()`` / ``poll_arrow()``), and per
partition, its position, buffers and errors (:class:`PartitionState`).

Why a module of its own: the fetch threads (:mod:`strom.client.fetcher`) fill these and the
application's thread drains them; the draining is the consumer's hot path and stays free of
per-record Python (``take_records``: columns convert in C, one tuple per record;
``take_arrow``: no per-record work at all). How an answer is parsed and checked on arrival
is in :mod:`strom.client.fetch_answers`.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from itertools import islice, repeat
from typing import Any

import numpy as np
import pyarrow as pa

from strom.client.fetch_answers import crc_matches as _crc_matches
from strom.client.types import TopicPartition
from strom.errors import StromError
from strom.record import RECORDS_SCHEMA, InvalidBatchError, Record, RecordBatch

#: What ``poll_arrow()`` returns: the record columns of ``RECORDS_SCHEMA`` behind the
#: partition they came from, then each record's ``timestamp_type`` (``TimestampType``: 0
#: create time, 1 log-append time; its batch's, filled as one constant array per batch). It
#: comes last so that code reading the earlier columns by position keeps working.
CONSUMER_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        *RECORDS_SCHEMA,
        pa.field("timestamp_type", pa.int8(), nullable=False),
    ]
)

_new = tuple.__new__


# -- draining fetched batches -----------------------------------------------------------------


def _py_columns(b: RecordBatch, topic: str, partition: int) -> tuple[list[int], Iterator[Any]]:
    """A batch's record offsets and an iterator of Record field tuples (columns converted
    at once, see :meth:`RecordBatch.py_columns`, but Record tuples created lazily, per poll,
    so the ones the application drops are freed before the garbage collector sees a large
    young generation)."""
    offsets, stamps, keys, values, headers = b.py_columns()
    n = len(offsets)
    rows = zip(
        keys,
        values,
        headers,
        stamps,
        offsets,
        repeat(topic, n),
        repeat(partition, n),
        repeat(b.header.timestamp_type, n),  # the batch's: one value, no per-record work
        strict=True,
    )
    return offsets, rows


class Constants:
    """Constant topic / partition / timestamp_type columns for poll_arrow, built once per
    value and sliced (zero-copy) to each batch's length."""

    __slots__ = ("_arrays",)

    def __init__(self) -> None:
        self._arrays: dict[tuple[Any, pa.DataType], pa.Array] = {}

    def get(self, value: Any, type_: pa.DataType, n: int) -> pa.Array:
        arr = self._arrays.get((value, type_))
        if arr is None or len(arr) < n:
            size = max(n, 1 << 16)
            arr = pa.repeat(pa.scalar(value, type_), size)
            if len(self._arrays) > 4096:
                self._arrays.clear()
            self._arrays[(value, type_)] = arr
        return arr.slice(0, n)


class CompletedFetch:
    """The batches one Fetch returned for one partition, drained in order.

    ``take_records`` and ``take_arrow`` both start at the position they are given (records
    below it, e.g. the head of a batch that starts before the fetch offset, are skipped) and
    return the position after what they took, so the two may be mixed freely. A batch's CRC is
    checked when the answer arrives (``corrupt``, on the fetch thread) or else when it is
    first drained; a mismatch, or a body that does not decode (big bodies are decoded on the
    fetch thread too, see :func:`decode_bodies`), is raised (InvalidBatchError) when the batch
    is reached, after the records of the intact batches before it have been returned (by the
    take that reached it), none of its own.
    """

    __slots__ = (
        "_check_crcs",
        "_corrupt",
        "_cursor",
        "_offsets",
        "_rows",
        "_verified",
        "batches",
        "index",
        "skip",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        batches: list[RecordBatch],
        *,
        check_crcs: bool = True,
        skip: frozenset[int] | None = None,
        corrupt: frozenset[int] | None = None,
    ) -> None:
        self.tp = tp
        self.batches = batches
        #: Indexes of batches of aborted transactions (read_committed): passed over whole.
        self.skip = skip
        self.index = 0
        self._rows: Iterator[Any] | None = None
        self._offsets: list[int] = []
        self._cursor = 0
        self._check_crcs = check_crcs
        #: Base offsets of the batches whose CRC was checked on arrival and did not match;
        #: None: not checked yet, so each is checked when first drained.
        self._corrupt = corrupt
        self._verified = -1

    @property
    def exhausted(self) -> bool:
        return self.index >= len(self.batches)

    def _next_batch(self) -> None:
        self.index += 1
        self._rows = None
        self._offsets = []
        self._cursor = 0

    def _skippable(self, position: int) -> bool:
        h = self.batches[self.index].header
        return (
            h.is_control
            or h.record_count == 0
            or h.next_offset <= position
            or (self.skip is not None and self.index in self.skip)
        )

    def _next_live(self, position: int) -> tuple[RecordBatch | None, int]:
        """Move past the batches with nothing to return at ``position`` (control batches,
        empty or already consumed ones, aborted transactions'); the batch to drain next
        (CRC-checked; None when none is left) and the position after the skipped ones."""
        while self.index < len(self.batches):
            if not self._skippable(position):
                return self._current(), position
            position = max(position, self.batches[self.index].header.next_offset)
            self._next_batch()
        return None, position

    def _next_drainable(self, position: int, taken: bool) -> tuple[RecordBatch | None, int]:
        """:meth:`_next_live`, except that a corrupt batch after records already ``taken``
        ends the take (None) so those are returned first; the next take raises."""
        try:
            return self._next_live(position)
        except InvalidBatchError:
            if taken:
                return None, position
            raise

    def _current(self) -> RecordBatch:
        b = self.batches[self.index]
        if self._check_crcs and self._verified < self.index:
            h = b.header
            if h.base_offset in self._corrupt if self._corrupt is not None else not _crc_matches(b):
                raise InvalidBatchError(
                    f"batch at offset {h.base_offset}: CRC-32C mismatch", position=h.position
                )
            self._verified = self.index
        return b

    def take_records(self, position: int, limit: int) -> tuple[list[Record], int]:
        out: list[Record] = []
        topic, partition = self.tp
        while limit > 0:
            b, position = self._next_drainable(position, bool(out))
            if b is None:
                break
            if self._rows is None:
                try:
                    offsets, rows = _py_columns(b, topic, partition)
                except InvalidBatchError:
                    if out:  # the good records first; the next take raises
                        break
                    raise
                start = bisect.bisect_left(offsets, position)
                self._rows = islice(rows, start, None) if start else rows
                self._offsets = offsets
                self._cursor = start
            offsets = self._offsets
            k = min(limit, len(offsets) - self._cursor)
            if k > 0:
                chunk = list(map(_new, repeat(Record, k), islice(self._rows, k)))
                if out:
                    out.extend(chunk)
                else:
                    out = chunk
                self._cursor += k
                limit -= k
            if self._cursor >= len(offsets):
                position = b.header.next_offset
                self._next_batch()
            else:
                position = offsets[self._cursor - 1] + 1
        return out, position

    def take_arrow(
        self, position: int, limit: int, constants: Constants
    ) -> tuple[list[pa.RecordBatch], int, int]:
        out: list[pa.RecordBatch] = []
        taken = 0
        topic, partition = self.tp
        while limit > 0:
            b, position = self._next_drainable(position, bool(out))
            if b is None:
                break
            h = b.header
            try:
                deltas = b.offset_deltas()
            except InvalidBatchError:
                if out:  # the good records first; the next take raises
                    break
                raise
            start = 0
            if position > h.base_offset:
                start = int(np.searchsorted(deltas, position - h.base_offset, side="left"))
            n = len(deltas) - start
            k = min(n, limit)
            if k > 0:
                out.append(
                    pa.RecordBatch.from_arrays(
                        [
                            constants.get(topic, pa.string(), k),
                            constants.get(partition, pa.int32(), k),
                            *b.arrow_columns(start, k),
                            constants.get(int(h.timestamp_type), pa.int8(), k),
                        ],
                        schema=CONSUMER_SCHEMA,
                    )
                )
                taken += k
                limit -= k
            if k >= n:
                position = h.next_offset
                self._next_batch()
            else:
                position = h.base_offset + int(deltas[start + k - 1]) + 1
                self._rows = None  # a Python-side cursor into this batch is stale now
        return out, position, taken


# -- per-partition state ----------------------------------------------------------------------


class PartitionState:
    """What the consumer and its fetch thread know about one assigned partition.

    ``position`` is the next offset the application will get (None while it has to be looked
    up: a new assignment, seek_to_beginning/end, an auto offset reset); ``fetch_offset`` is the
    next offset to ask the leader for, i.e. the end of what is buffered or in flight.
    """

    __slots__ = (
        "backoff_until",
        "claim",
        "completed",
        "end_offset",
        "error",
        "error_sticky",
        "failures",
        "fetch_offset",
        "following",
        "generation",
        "held",
        "high_watermark",
        "inflight",
        "log_start_offset",
        "paused",
        "position",
        "quiet_since",
        "reset",
        "storage_errors",
        "tp",
    )

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.position: int | None = None
        self.fetch_offset = -1
        self.generation = 0
        #: Pending reset strategy ("earliest" / "latest") while position is None; None means
        #: "no position yet": committed offset (groups) or auto_offset_reset decides.
        self.reset: str | None = None
        self.paused = False
        self.inflight = False
        #: The claim (strom.client.fetcher._Claim) of the request it is in while ``inflight``:
        #: a request given up on (its node hung and the partition's leader moved) no longer
        #: holds it, so that request's late answer or failure is ignored for it.
        self.claim: object | None = None
        #: Caught up (its last answer ended at the high watermark) and left to the
        #: application's own fetch in ``poll()`` (see ``Fetcher.fetch_inline``): the workers
        #: do not long-poll it.
        self.held = False
        #: In the application's followed request (``Fetcher.fetch_inline``): the node sends
        #: its appends on that stream, and the workers leave it alone.
        self.following = False
        self.completed: deque[CompletedFetch] = deque()
        self.high_watermark = -1
        #: What the consumer can read up to, as the last fetch reported it: the high
        #: watermark, or with read_committed the last stable offset (-1 before any fetch).
        self.end_offset = -1
        self.log_start_offset = -1
        self.backoff_until = 0.0
        self.failures = 0
        self.error: StromError | None = None
        #: A sticky error is raised by every poll until the application seeks (Kafka's rule
        #: for OFFSET_OUT_OF_RANGE without a reset policy, and for corrupt data).
        self.error_sticky = False
        #: STORAGE_ERROR answers in a row: (leader node id, leader epoch, how many).
        self.storage_errors = (-1, -1, 0)
        #: Since when its Fetch answers have come back without records (None: the last one
        #: had some), or when its leader was last checked meanwhile: see
        #: strom.client.fetch_overdue.QUIET_RECHECK_S.
        self.quiet_since: float | None = None

    def drop_buffered(self) -> None:
        """Forget buffered data and in-flight answers (they are for an old position)."""
        self.generation += 1
        self.completed.clear()
        self.inflight = False
        self.claim = None
        self.held = False
        self.fetch_offset = self.position if self.position is not None else -1
