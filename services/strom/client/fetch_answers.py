"""A Fetch answer as it arrives: its wire parsing and the checks on its record batches.

Why a module of its own: these read bytes a node sent, and nothing else (no partition state,
no threads), so the consumer's fetch threads (:mod:`strom.client.fetcher`) and the Spark
connector's readers (``strom_spark.fetch``) share them. What the consumer keeps of an answer
is in :mod:`strom.client.fetch_state`.

Nothing here loops over records in Python: a response is split by its structure, batches are
checked by header and CRC (crc32c lets go of the interpreter lock), and bodies are decoded by
pyarrow, all on the fetch thread; a failed check is raised only when the consumer drains that
batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import crc32c

from strom.api import common_pb2, storage_pb2
from strom.client.types import TopicPartition
from strom.errors import CorruptMessageError, MessageTooLargeError, StromError
from strom.record import HEADER_SIZE, InvalidBatchError, RecordBatch, small_body
from strom.record.header import CRC_START

# -- the FetchResponse wire format -----------------------------------------------------------
#
# The generated classes copy a response's record bytes twice (into the arena on parse, out on
# attribute access): ~30 ns per 100-byte record, as much as decoding the batch to Arrow. The
# structure around them is tiny, so it is walked here and ``records`` stays a memoryview into
# the bytes gRPC handed over; the small fields of each partition are parsed by protobuf.

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class FetchWireError(ValueError):
    """A FetchResponse that does not parse (a server bug; gRPC does not corrupt bytes)."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise FetchWireError("varint too long")


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield (field number, wire type, tag start, value start, value end) over a message."""
    while pos < end:
        tag_start = pos
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == _VARINT:
            start = pos
            _, pos = _varint(buf, pos)
        elif wt == _LEN:
            n, start = _varint(buf, pos)
            pos = start + n
        elif wt == _I64:
            start, pos = pos, pos + 8
        elif wt == _I32:
            start, pos = pos, pos + 4
        else:
            raise FetchWireError(f"unsupported wire type {wt} (field {num})")
        if pos > end:
            raise FetchWireError(f"field {num} runs past the end of its message")
        yield num, wt, tag_start, start, pos


@dataclass(slots=True)
class PartitionAnswer:
    """One partition of a FetchResponse: its small fields, and the record bytes uncopied."""

    topic: str
    info: storage_pb2.FetchPartitionResponse
    records: memoryview


def parse_fetch_response(
    data: bytes,
) -> tuple[list[PartitionAnswer], list[common_pb2.Node]]:
    """Split a serialized FetchResponse into partition answers and node endpoints."""
    answers, nodes, _ = parse_fetch_answer(data)
    return answers, nodes


def parse_fetch_answer(
    data: bytes,
) -> tuple[list[PartitionAnswer], list[common_pb2.Node], int]:
    """:func:`parse_fetch_response`, plus the answer's ``throttle_time_ms`` (0 when not
    throttled): read in the same walk over the response's top-level fields, once per
    answer, for the consumer's fetch-throttle-time metrics."""
    buf = memoryview(data)
    out: list[PartitionAnswer] = []
    nodes: list[common_pb2.Node] = []
    throttle_ms = 0
    try:
        for num, wt, _, s, e in _fields(buf, 0, len(buf)):
            if num == 1 and wt == _LEN:
                _parse_topic(buf, s, e, out)
            elif num == 2 and wt == _LEN:
                nodes.append(common_pb2.Node.FromString(bytes(buf[s:e])))
            elif num == 3 and wt == _VARINT:
                throttle_ms = _varint(buf, s)[0]
    except (IndexError, ValueError) as exc:  # protobuf's DecodeError is a ValueError too
        raise FetchWireError(f"malformed FetchResponse: {exc}") from None
    return out, nodes, throttle_ms


def _parse_topic(buf: memoryview, start: int, end: int, out: list[PartitionAnswer]) -> None:
    topic = ""
    spans: list[tuple[int, int]] = []
    for num, wt, _, s, e in _fields(buf, start, end):
        if num == 1 and wt == _LEN:
            topic = str(buf[s:e], "utf-8")
        elif num == 2 and wt == _LEN:
            spans.append((s, e))
    for s, e in spans:
        records = buf[0:0]
        small: bytes | None = None
        for num, wt, tag_start, vs, ve in _fields(buf, s, e):
            if num == 10 and wt == _LEN:
                records = buf[vs:ve]
                small = bytes(buf[s:tag_start]) + bytes(buf[ve:e])
        info = storage_pb2.FetchPartitionResponse.FromString(
            small if small is not None else bytes(buf[s:e])
        )
        out.append(PartitionAnswer(topic, info, records))


def aborted_batches(
    batches: list[RecordBatch], aborted: Iterable[storage_pb2.AbortedTransaction]
) -> frozenset[int]:
    """Indexes of ``batches`` that belong to aborted transactions (Kafka's read_committed
    rule, on batch headers only): a transactional batch of a producer whose aborted
    transaction began at or before it, up to that producer's next marker."""
    pending = sorted(aborted, key=lambda a: a.first_offset)
    i = 0
    active: set[int] = set()
    out: set[int] = set()
    for n, b in enumerate(batches):
        h = b.header
        while i < len(pending) and pending[i].first_offset <= h.last_offset:
            active.add(pending[i].producer_id)
            i += 1
        if h.is_control:
            active.discard(h.producer_id)  # the abort marker ends that transaction
        elif h.is_transactional and h.producer_id in active:
            out.add(n)
    return frozenset(out)


# -- checking an answer's batches ------------------------------------------------------------


def unreadable_batch_error(tp: TopicPartition, offset: int, exc: InvalidBatchError) -> StromError:
    """The error ``poll()`` raises for a batch it cannot return. A well-formed batch over this
    reader's limit (its bytes, or its body decompressed: a batch a non-strom producer wrote,
    or a decompression bomb) is MessageTooLargeError saying so, with the limit and where to
    seek to skip it, not CORRUPT_MESSAGE, which would send users looking for damage;
    everything else is CorruptMessageError."""
    where = f"{tp.topic}-{tp.partition} at offset {offset}"
    if not exc.too_large:
        return CorruptMessageError(f"{where}: {exc}; seek past it to continue")
    skip = (
        f"seek to offset {exc.next_offset} to skip it"
        if exc.next_offset >= 0
        else "seek past it to skip it"
    )
    return MessageTooLargeError(
        f"{where}: a record batch too large for this reader ({exc}; the limit is "
        f"{exc.limit} bytes); {skip}"
    )


def crc_matches(b: RecordBatch) -> bool:
    """Whether a batch's CRC-32C matches its header (shared by the check on arrival and the
    one a drain makes when the answer was not checked)."""
    return len(b.raw) >= HEADER_SIZE and crc32c.crc32c(b.raw[CRC_START:]) == b.header.crc


def corrupt_batches(batches: list[RecordBatch]) -> frozenset[int]:
    """Base offsets of the batches whose CRC-32C does not match their header (empty when
    all do: the common case allocates nothing new)."""
    bad = [b.header.base_offset for b in batches if not crc_matches(b)]
    return frozenset(bad) if bad else _NONE


_NONE: frozenset[int] = frozenset()


def decode_bodies(batches: list[RecordBatch], corrupt: frozenset[int] | None) -> None:
    """Decode the Arrow bodies of an answer's big batches here, on the fetch thread.

    pyarrow lets go of the interpreter lock inside each of its calls (reading the IPC
    message, the full validation), and on the application's thread each such call could
    hand the lock to a fetch thread and then wait to get it back: measured in a poll_arrow
    loop, ~110 µs of wall time per 2,300-record batch against ~17 µs of work. Left for the
    drain: batches of up to ``small_body.MAX_RECORDS`` records (``take_records`` reads those
    without pyarrow), compressed ones (decompressed, a buffered answer would hold several
    times its bytes: the buffering bound is in compressed bytes), control and corrupt ones,
    and a body that does not decode, which the drain raises when it reaches that batch,
    after the good ones.
    """
    for b in batches:
        h = b.header
        if (
            h.record_count > small_body.MAX_RECORDS
            and not h.codec
            and not h.is_control
            and (corrupt is None or h.base_offset not in corrupt)
        ):
            with contextlib.suppress(InvalidBatchError):
                b.body()
