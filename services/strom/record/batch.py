"""Encode record batches from Python or Arrow data, and decode them back without per-record loops.

A batch is the 61-byte header (:mod:`strom.record.header`) followed by one Arrow IPC
record-batch message in the fixed v1 schema, compressed as a whole. Building the body is a
handful of C++ calls (``pa.array`` over the value list, one IPC serialize, one compress, one
CRC), which is why encoding runs at millions of records per second from Python.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import pairwise, repeat
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from strom.record import codecs, held, small_body
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    CRC_START,
    DEFAULT_MAX_BATCH_BYTES,
    HEADER_SIZE,
    TIMESTAMP_LOG_APPEND,
    BatchHeader,
    TimestampType,
    check_header,
    pack_header,
    read_header,
)
from strom.record.schema import BODY_SCHEMA_V1, HEADERS_TYPE, RECORDS_SCHEMA, TIMESTAMP_TYPE

Header = tuple[str, bytes | None]


class Record(NamedTuple):
    """One record as users see it.

    A named tuple rather than a dataclass on purpose: decoding builds millions of these per
    second, and tuples of plain values are cheaper to create and are untracked by the garbage
    collector. ``offset`` is -1 until the log assigns it; ``topic``/``partition`` are filled
    in by consumers. ``headers`` is a tuple of ``(str, bytes | None)`` pairs.
    ``timestamp_type`` says what ``timestamp`` is (:class:`TimestampType`: 0 the producer's
    create time, 1 the leader's log-append time), as Kafka's ``ConsumerRecord.timestampType()``;
    it is the batch's, so decoding fills it from one repeated value per batch.
    """

    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp: int = -1
    offset: int = -1
    topic: str | None = None
    partition: int = -1
    timestamp_type: TimestampType = TimestampType.CREATE_TIME


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# Constant columns of small batches, made once: a producer at ``linger_ms=0`` and the
# coordinator encode batches of one or a few records all the time, and building these arrays
# was a third of the cost of such a batch. Arrow arrays are immutable, so sharing is safe.
_SMALL = 64


@functools.lru_cache(maxsize=2 * _SMALL)
def _small_nulls(n: int, type_: pa.DataType) -> pa.Array:
    return pa.nulls(n, type_)


@functools.lru_cache(maxsize=_SMALL)
def _small_zeros(n: int) -> pa.Array:
    return pa.array(np.zeros(n, dtype=np.int64))


@functools.lru_cache(maxsize=_SMALL)
def _small_deltas(n: int) -> pa.Array:
    return pa.array(np.arange(n, dtype=np.int32))


def _nulls(n: int, type_: pa.DataType) -> pa.Array:
    return _small_nulls(n, type_) if n <= _SMALL else pa.nulls(n, type_)


def _zeros(n: int) -> pa.Array:
    """Timestamp deltas of a batch stamped all at once."""
    return _small_zeros(n) if n <= _SMALL else pa.array(np.zeros(n, dtype=np.int64))


def _deltas(n: int) -> pa.Array:
    """Offset deltas 0..n-1."""
    return _small_deltas(n) if n <= _SMALL else pa.array(np.arange(n, dtype=np.int32))


def _binary_array(data: Any, name: str, n: int | None) -> pa.Array:
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    if isinstance(data, pa.Array):
        arr = data if data.type == pa.binary() else data.cast(pa.binary())
    else:
        try:
            arr = pa.array(data, type=pa.binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise TypeError(f"{name} must be bytes or None per record: {exc}") from None
    if n is not None and len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} entries but there are {n} values")
    return arr


def _headers_array(headers: Any, n: int) -> pa.Array:
    if headers is None:
        return pa.nulls(n, HEADERS_TYPE)
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if isinstance(headers, pa.Array):
        arr = headers if headers.type == HEADERS_TYPE else headers.cast(HEADERS_TYPE)
    else:
        rows: list[Any] = []
        for h in headers:
            if not h:
                rows.append(None)
                continue
            row = []
            for item in h:
                if isinstance(item, dict):
                    k, v = item["key"], item["value"]
                else:
                    k, v = item
                if not isinstance(k, str):
                    raise TypeError(f"header keys must be str, got {type(k).__name__}")
                if isinstance(v, str):
                    v = v.encode()
                row.append((k, v))
            rows.append(row)
        try:
            arr = pa.array(rows, type=HEADERS_TYPE)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise TypeError(f"headers must be (str, bytes) pairs: {exc}") from None
    if len(arr) != n:
        raise ValueError(f"headers has {len(arr)} entries but there are {n} values")
    return arr


def encode_batch(
    values: Sequence[bytes | None] | pa.Array,
    *,
    keys: Sequence[bytes | None] | pa.Array | None = None,
    headers: Sequence[Sequence[Header] | None] | pa.Array | None = None,
    timestamps: Sequence[int] | np.ndarray | pa.Array | None = None,
    offset_deltas: Sequence[int] | np.ndarray | None = None,
    compression: str | int | None = "none",
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    log_append_time: bool = False,
    transactional: bool = False,
    control: bool = False,
    now_ms: int | None = None,
) -> bytes:
    """Encode one batch from columns of record data and return its bytes.

    ``values`` (and ``keys``) are lists of bytes/None or Arrow binary arrays; ``headers`` a
    list of per-record lists of ``(str, bytes)`` or an Arrow ``list<struct>`` array;
    ``timestamps`` ms since the epoch per record (default: now for all). ``offset_deltas``
    exists for the log cleaner, which rewrites batches with gaps; producers leave it out.
    """
    codec = codecs.codec_id(compression)
    attributes = codec
    if log_append_time:
        attributes |= ATTR_LOG_APPEND_TIME
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    if control:
        attributes |= ATTR_CONTROL
    ids = dict(
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    if (
        headers is None
        and offset_deltas is None
        and type(values) is list
        and (keys is None or type(keys) is list)
    ):
        direct = _encode_direct(values, keys, timestamps, now_ms, codec, attributes, ids)
        if direct is not None:
            return direct
    value_arr = _binary_array(values, "values", None)
    n = len(value_arr)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    key_arr = _nulls(n, pa.binary()) if keys is None else _binary_array(keys, "keys", n)
    headers_arr = _nulls(n, HEADERS_TYPE) if headers is None else _headers_array(headers, n)

    if timestamps is None:
        ts_now = _now_ms() if now_ms is None else now_ms
        base_ts = max_ts = ts_now
        ts_delta = _zeros(n)
    else:
        if isinstance(timestamps, pa.ChunkedArray):
            timestamps = timestamps.combine_chunks()
        if isinstance(timestamps, pa.Array):
            if pa.types.is_timestamp(timestamps.type):
                timestamps = timestamps.cast(TIMESTAMP_TYPE).cast(pa.int64())
            ts = timestamps.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        else:
            ts = np.asarray(timestamps, dtype=np.int64)
        if ts.shape != (n,):
            raise ValueError(f"timestamps has {ts.size} entries but there are {n} values")
        base_ts = int(ts[0])
        max_ts = int(ts.max())
        if int(ts.min()) < 0:
            raise ValueError("timestamps must be ms since the epoch (>= 0)")
        ts_delta = pa.array(ts - base_ts)

    if offset_deltas is None:
        od = _deltas(n)
        last_delta = n - 1
    else:
        od_np = np.asarray(offset_deltas, dtype=np.int32)
        if od_np.shape != (n,) or (n > 1 and not bool(np.all(np.diff(od_np) > 0))):
            raise ValueError("offset_deltas must be strictly increasing, one per record")
        od = pa.array(od_np)
        last_delta = int(od_np[-1])

    rb = pa.RecordBatch.from_arrays(
        [od, ts_delta, key_arr, value_arr, headers_arr], schema=BODY_SCHEMA_V1
    )
    return encode_body(
        rb,
        attributes=attributes,
        last_offset_delta=last_delta,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        **ids,
    )


def _encode_direct(
    values: list[Any],
    keys: list[Any] | None,
    timestamps: Any,
    now_ms: int | None,
    codec: int,
    attributes: int,
    ids: dict[str, int],
) -> bytes | None:
    """A batch whose body :mod:`strom.record.small_body` writes without pyarrow's writer,
    with the interpreter lock held throughout (:mod:`strom.record.held`); None for anything
    it does not take (the pyarrow path then encodes it, or names the error)."""
    n = len(values)
    if n <= 0:
        return None
    if timestamps is None:
        base_ts = max_ts = _now_ms() if now_ms is None else now_ms
        deltas = _small_np_zeros(n) if n <= _SMALL else np.zeros(n, dtype=np.int64)
    elif isinstance(timestamps, (np.ndarray, list)):
        ts = np.asarray(timestamps)
        if ts.shape != (n,) or ts.dtype.kind not in "iu":
            return None
        ts = held.as_int64(ts)
        if n <= _SMALL:
            stamps = ts.tolist()  # min/max of a few Python ints: cheaper than two ufunc calls
            if min(stamps) < 0:
                return None
            base_ts, max_ts = stamps[0], max(stamps)
            deltas = ts - base_ts
        else:
            min_ts, max_ts = held.min_max(ts)
            if min_ts < 0:
                return None
            base_ts = int(ts[0])
            deltas = held.minus(ts, base_ts)
    else:
        return None
    parts = small_body.serialize_parts(values, keys, deltas)
    if parts is None:
        return None
    return _frame(
        parts if codec == codecs.NONE else codecs.compress(codec, held.join(parts)),
        attributes=attributes,
        last_offset_delta=n - 1,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        record_count=n,
        **ids,
    )


@functools.lru_cache(maxsize=_SMALL)
def _small_np_zeros(n: int) -> np.ndarray:
    zeros = np.zeros(n, dtype=np.int64)
    zeros.flags.writeable = False
    return zeros


def encode_body(
    body: pa.RecordBatch,
    *,
    attributes: int,
    base_offset: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Frame an Arrow body (v1 body schema, deltas already relative) as a batch.

    The low-level entry for code that rewrites batches, such as the log cleaner: it may
    encode zero records or a ``last_offset_delta`` beyond the last record, both of which
    keep a compacted segment's offset ranges contiguous.
    """
    if not body.schema.equals(BODY_SCHEMA_V1):
        raise ValueError("body does not have the v1 body schema")
    codec = attributes & 0x07
    return _frame(
        codecs.compress(codec, body.serialize()),
        attributes=attributes,
        base_offset=base_offset,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=body.num_rows,
    )


#: A body in parts smaller than this is joined before its CRC is taken.
_JOIN_FIRST = 64 * 1024


def _frame(payload: Any, **header: int) -> bytes:
    """The header (CRC included) and the (compressed) body ``payload``: one batch's bytes.
    ``payload`` is a buffer, or a list of the byte strings the body is made of (a big one is
    joined once, behind the header). The interpreter lock is held throughout
    (strom.record.held)."""
    if isinstance(payload, list):
        if sum(map(len, payload)) >= _JOIN_FIRST:
            return _frame_parts(payload, header)
        payload = b"".join(payload)
    fields = dict(body_length=len(memoryview(payload)), **header)
    provisional = pack_header(crc=0, **fields)
    crc = held.crc32c(payload, held.crc32c(provisional[CRC_START:]))  # crc_of, lock held
    head = pack_header(crc=crc, **fields)
    if fields["body_length"] < held.JOIN_THRESHOLD:
        return b"".join((head, payload))
    return held.join((head, payload))


def _frame_parts(parts: list[Any], header: dict[str, int]) -> bytes:
    """:func:`_frame` of a big body in parts: its CRC taken part by part, one join."""
    fields = dict(body_length=sum(len(memoryview(p)) for p in parts), **header)
    provisional = pack_header(crc=0, **fields)
    crc = held.crc32c(provisional[CRC_START:])
    for p in parts:
        crc = held.crc32c(p, crc)
    return held.join([pack_header(crc=crc, **fields), *parts])


def encode_records(records: Iterable[Record | tuple[Any, ...]], **options: Any) -> bytes:
    """Encode Python records: :class:`Record` objects or ``(key, value)`` /
    ``(key, value, headers)`` / ``(key, value, headers, timestamp)`` tuples."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    hdrs: list[Any] = []
    stamps: list[int] = []
    for r in records:
        # Record is a named tuple (key, value, headers, timestamp, ...), like the plain tuples.
        k, v, h, t = (*tuple(r), None, None, -1)[:4]
        keys.append(k)
        values.append(v)
        hdrs.append(h or None)
        stamps.append(t if t is not None else -1)
    if not values:
        raise ValueError("a batch needs at least one record")
    timestamps: Any = None
    if any(t >= 0 for t in stamps):
        now = _now_ms()
        timestamps = [t if t >= 0 else now for t in stamps]
    has_headers = any(h is not None for h in hdrs)
    return encode_batch(
        values,
        keys=keys if any(k is not None for k in keys) else None,
        headers=hdrs if has_headers else None,
        timestamps=timestamps,
        **options,
    )


def encode_arrow(data: pa.RecordBatch | pa.Table, **options: Any) -> bytes:
    """Encode an Arrow batch/table with a ``value`` column and optional ``key``, ``headers``
    and ``timestamp`` columns (int64 ms or an Arrow timestamp)."""
    names = set(data.schema.names)
    if "value" not in names:
        raise ValueError(f"Arrow input needs a 'value' column; it has {sorted(names)}")
    unknown = names - {"key", "value", "headers", "timestamp"}
    if unknown:
        raise ValueError(f"unexpected Arrow columns {sorted(unknown)}")

    def col(name: str) -> Any:
        return data.column(name) if name in names else None

    return encode_batch(
        col("value"),
        keys=col("key"),
        headers=col("headers"),
        timestamps=col("timestamp"),
        **options,
    )


class RecordBatch:
    """A decoded view of one batch: header fields as attributes, body decoded lazily.

    ``raw`` is a memoryview of the batch bytes exactly as stored, so brokers and tools can
    pass it on without re-encoding.
    """

    __slots__ = ("_body", "_columns", "_deltas", "header", "raw")

    def __init__(self, header: BatchHeader, raw: memoryview) -> None:
        self.header = header
        self.raw = raw
        self._body: pa.RecordBatch | None = None
        #: The body's columns and its offset deltas as numpy, taken once when it is decoded
        #: (``pa.RecordBatch.column`` builds a new wrapper per call, ~1 µs: a consumer's
        #: drain asked for them ~9 times per batch).
        self._columns: list[pa.Array] = []
        self._deltas: np.ndarray | None = None

    def __getattr__(self, name: str) -> Any:
        # Expose header fields (base_offset, record_count, crc, ...) directly.
        try:
            return getattr(self.header, name)
        except AttributeError:
            raise AttributeError(f"RecordBatch has no attribute {name!r}") from None

    def __len__(self) -> int:
        return self.header.record_count

    def __repr__(self) -> str:
        h = self.header
        return (
            f"RecordBatch(base_offset={h.base_offset}, records={h.record_count}, "
            f"last_offset={h.last_offset}, bytes={h.size}, compression={h.compression})"
        )

    def body(self) -> pa.RecordBatch:
        """The Arrow body in the v1 body schema (offset/timestamp deltas)."""
        if self._body is None:
            body, self._columns, self._deltas = _decode_body(self.header, self.raw)
            self._body = body  # last: it is what says the others are set
        return self._body

    def offset_deltas(self) -> np.ndarray:
        """The body's offset deltas (int32, increasing: checked when decoded), uncopied."""
        if self._deltas is None:
            self.body()
        return self._deltas  # type: ignore[return-value]

    def to_arrow(self) -> pa.Table:
        """Records as a table with absolute ``offset`` and ``timestamp`` columns."""
        return pa.Table.from_batches([self.to_arrow_batch()], schema=RECORDS_SCHEMA)

    def to_arrow_batch(self) -> pa.RecordBatch:
        """The records as one Arrow batch in ``RECORDS_SCHEMA`` (absolute offsets and
        timestamps; key, value and headers are the body's own buffers, not copied).

        The two absolute columns are computed in numpy and the timestamps reinterpreted
        (``view``) rather than cast: Arrow's compute kernels cost ~5 µs per call whatever the
        length, a third of ``poll_arrow()``'s time per batch (measured, 2,300-record batches:
        25 µs -> 10 µs for this method)."""
        return pa.RecordBatch.from_arrays(self.arrow_columns(), schema=RECORDS_SCHEMA)

    def arrow_columns(self, start: int = 0, length: int | None = None) -> list[pa.Array]:
        """The columns of :meth:`to_arrow_batch` for records ``start`` .. ``start+length``
        (all by default): what a caller adding its own columns (the consumer's topic and
        partition) builds one batch from, without an intermediate batch and its slice."""
        h = self.header
        deltas = self.offset_deltas()
        cols = self._columns
        n = len(deltas)
        if length is None or length > n - start:
            length = n - start
        whole = start == 0 and length == n
        offsets = (deltas if whole else deltas[start : start + length]).astype(np.int64)
        offsets += h.base_offset
        if h.timestamp_type == TIMESTAMP_LOG_APPEND:
            ts = np.full(length, h.max_timestamp, dtype=np.int64)
        else:
            tsd = cols[1].to_numpy()
            ts = (tsd if whole else tsd[start : start + length]) + h.base_timestamp
        if whole:
            return [pa.array(offsets), pa.array(ts).view(TIMESTAMP_TYPE), *cols[2:]]
        return [
            pa.array(offsets),
            pa.array(ts).view(TIMESTAMP_TYPE),
            cols[2].slice(start, length),
            cols[3].slice(start, length),
            cols[4].slice(start, length),
        ]

    def py_columns(self) -> tuple[list[int], Any, Any, Any, Any]:
        """The records' offsets, timestamps, keys, values and headers as Python columns
        (iterables of ``len(self)`` items). A small body in the layout
        :mod:`strom.record.small_body` writes is read without pyarrow (a fixed cost of tens of
        µs per batch, most of a trickle consumer's work); any other through pyarrow, in C."""
        h = self.header
        n = h.record_count
        small = None
        if self._body is None and 0 < n <= small_body.MAX_RECORDS:
            payload = _payload(h, self.raw)
            small = small_body.columns(payload, n)
            if small is None:  # another layout: pyarrow reads the payload already here
                body, self._columns, self._deltas = _decode_payload(h, payload)
                self._body = body  # last, as in body()
        if small is not None:
            deltas, stamp_deltas, keys, values = small
            _check_deltas(h, deltas[0], deltas[-1], any(b <= a for a, b in pairwise(deltas)))
            base = h.base_offset
            offsets = [base + d for d in deltas]
            if h.timestamp_type == TIMESTAMP_LOG_APPEND:
                stamps: Any = repeat(h.max_timestamp, n)
            else:
                base_ts = h.base_timestamp
                stamps = [base_ts + t for t in stamp_deltas]
            return (
                offsets,
                stamps,
                repeat(None, n) if keys is None else keys,
                repeat(None, n) if values is None else values,
                repeat((), n),
            )
        deltas = self.offset_deltas()
        cols = self._columns
        n = len(deltas)
        offsets = (deltas.astype(np.int64) + h.base_offset).tolist()
        if h.timestamp_type == TIMESTAMP_LOG_APPEND:
            stamps = repeat(h.max_timestamp, n)
        else:
            stamps = (cols[1].to_numpy() + h.base_timestamp).tolist()
        kc, vc, hc = cols[2], cols[3], cols[4]
        keys = repeat(None, n) if kc.null_count == n else kc.to_pylist()
        values = repeat(None, n) if vc.null_count == n else vc.to_pylist()
        headers: Any
        if hc.null_count == n:
            headers = repeat((), n)
        else:
            headers = [
                tuple((d["key"], d["value"]) for d in row) if row else () for row in hc.to_pylist()
            ]
        return offsets, stamps, keys, values, headers

    def records(self, topic: str | None = None, partition: int = -1) -> list[Record]:
        """Records as Python objects: columns convert in C, then one tuple per record."""
        offsets, stamps, keys, values, headers = self.py_columns()
        n = len(offsets)
        new = tuple.__new__
        return [
            new(Record, row)
            for row in zip(
                keys,
                values,
                headers,
                stamps,
                offsets,
                repeat(topic, n),
                repeat(partition, n),
                repeat(self.header.timestamp_type, n),
                strict=True,
            )
        ]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())


def _decode_body(
    h: BatchHeader, raw: memoryview
) -> tuple[pa.RecordBatch, list[pa.Array], np.ndarray]:
    return _decode_payload(h, _payload(h, raw))


def _payload(h: BatchHeader, raw: memoryview) -> Any:
    """The batch's body, decompressed (bounded: see :func:`codecs.decompress`); a body over
    the bound says which offset follows the batch, so that a reader can tell where to skip."""
    try:
        return codecs.decompress(h.codec, raw[HEADER_SIZE:], position=h.position)
    except InvalidBatchError as exc:
        if exc.too_large:
            exc.next_offset = h.next_offset
        raise


def _read_body(h: BatchHeader, payload: Any, *, full: bool) -> pa.RecordBatch:
    """The body's Arrow record batch, validated (``full``: every value too), with as many
    rows as the header says and no null offset or timestamp delta; InvalidBatchError
    naming the batch otherwise."""
    pos = h.position
    try:
        rb = pa.ipc.read_record_batch(pa.py_buffer(payload), BODY_SCHEMA_V1)
        rb.validate(full=full)
        od_col, ts_col = rb.column(0), rb.column(1)
    except (pa.ArrowException, ValueError, OSError, EOFError) as exc:
        raise InvalidBatchError(
            f"batch at byte {pos}: Arrow body does not parse ({exc})", position=pos
        ) from exc
    if rb.num_rows != h.record_count:
        raise InvalidBatchError(
            f"batch at byte {pos}: body holds {rb.num_rows} records, header says {h.record_count}",
            position=pos,
        )
    if od_col.null_count or ts_col.null_count:
        raise InvalidBatchError(
            f"batch at byte {pos}: null offset or timestamp delta in the body", position=pos
        )
    return rb


def _decode_payload(
    h: BatchHeader, payload: Any
) -> tuple[pa.RecordBatch, list[pa.Array], np.ndarray]:
    """The body, its columns, and its offset deltas as numpy (all checked)."""
    rb = _read_body(h, payload, full=True)
    cols = rb.columns
    return rb, cols, _checked_deltas(h, cols[0])


def _checked_deltas(h: BatchHeader, od_col: pa.Array) -> np.ndarray:
    """The body's offset deltas as numpy, checked increasing within the header's range.

    Increasing deltas are what lets a consumer bisect a batch for its position. Compared
    as two views and counted in C (np.diff and ndarray.any add Python wrappers)."""
    od = od_col.to_numpy()
    n = len(od)
    # The usual body (every producer's): deltas exactly 0..n-1, told by one memcmp that
    # keeps the GIL. numpy's comparison releases it for a long array, and taking it back
    # behind a busy thread (the node's event loop) cost ~200 µs a batch, 5x the check.
    if n and n <= _CONSECUTIVE_MAX and od.tobytes() == _CONSECUTIVE[: 4 * n]:
        _check_deltas(h, 0, n - 1, False)
        return od
    if n:
        _check_deltas(h, od[0], od[-1], bool(np.count_nonzero(od[1:] <= od[:-1])))
    return od


#: Bodies of up to this many records are compared with 0..n-1 from one cached string
#: (the offset_delta column is int32: 256 KiB).
_CONSECUTIVE_MAX = 1 << 16
_CONSECUTIVE = np.arange(_CONSECUTIVE_MAX, dtype="<i4").tobytes()


_NO_DELTA = np.iinfo(np.int64).max


class TimestampExtremes(NamedTuple):
    """A batch's oldest and newest record timestamps and their records' offset deltas (the
    first record of each when several share the value). ``min_timestamp`` is the oldest of
    the records that have one (>= 0); -1 (and ``min_offset_delta`` -1) when none has."""

    min_timestamp: int
    min_offset_delta: int
    max_timestamp: int
    max_offset_delta: int


def check_body(h: BatchHeader, raw: Any, *, extremes: bool = False) -> TimestampExtremes | None:
    """Decode a data batch's body exactly as its readers will, or raise
    :class:`InvalidBatchError` naming the batch; with ``extremes``, also its records' oldest
    and newest timestamps from the same decode (the header's are the first record's and
    whatever the producer wrote, and ``message.timestamp.before.max.ms`` needs every record's).

    Why: the header and CRC say nothing of the body, and a leader that acknowledged a body
    its readers cannot decode (random bytes under a recomputed CRC, a codec bit on an
    uncompressed body) stopped every consumer of the partition at that offset for good.
    These are the readers' own checks (:meth:`RecordBatch.body`, :func:`_decode_payload`:
    bounded decompression, the IPC read in the v1 body schema, ``validate(full=True)``, the
    row count against the header, increasing offset deltas), so what it passes they read;
    per batch, all in C (no per-record Python), as Kafka's LogValidator decompresses and
    iterates each batch.
    Control batches and empty batches are the caller's business (None)."""
    if h.record_count == 0 or h.is_control:
        return None
    # The checks of _decode_payload, without its list of every column (~5 µs a batch).
    rb = _read_body(h, _payload(h, memoryview(raw)[: h.size]), full=True)
    od = _checked_deltas(h, rb.column(0))
    if not extremes:
        return None
    return _extremes(h, rb.column(1).to_numpy(), od)


def _extremes(h: BatchHeader, deltas: np.ndarray, od: np.ndarray) -> TimestampExtremes:
    """:class:`TimestampExtremes` from a body's timestamp and offset delta columns."""
    base = h.base_timestamp
    hi = int(np.argmax(deltas))
    # Records without a timestamp (-1, Kafka's NO_TIMESTAMP) are not too old: left out of
    # the minimum as Kafka's LogValidator leaves them out (compared in delta space).
    lo = int(np.argmin(deltas))
    if base + int(deltas[lo]) < 0:
        stamped = np.where(deltas >= -base, deltas, _NO_DELTA)
        lo = int(np.argmin(stamped))
        if stamped[lo] == _NO_DELTA:
            lo = -1
    low = (base + int(deltas[lo]), int(od[lo])) if lo >= 0 else (-1, -1)
    return TimestampExtremes(*low, base + int(deltas[hi]), int(od[hi]))


def _check_deltas(h: BatchHeader, first: int, last: int, not_increasing: bool) -> None:
    if first < 0 or last > h.last_offset_delta or not_increasing:
        raise InvalidBatchError(
            f"batch at byte {h.position}: offset deltas are not increasing within "
            f"0..last_offset_delta {h.last_offset_delta}",
            position=h.position,
        )


def decode_batches(
    buf: Any,
    *,
    verify_crc: bool = True,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> list[RecordBatch]:
    """Split a buffer of concatenated batches into :class:`RecordBatch` views.

    Headers and CRCs are checked eagerly (so a corrupt byte anywhere is caught here); bodies
    are decoded on first use. Raises :class:`InvalidBatchError` for any fault.
    """
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    out: list[RecordBatch] = []
    pos = 0
    end = len(view)
    while pos < end:
        h = read_header(view, pos)
        check_header(h, view, verify_crc=verify_crc, max_batch_bytes=max_batch_bytes)
        out.append(RecordBatch(h, view[pos : pos + h.size]))
        pos += h.size
    return out


def batches_to_arrow(batches: Sequence[RecordBatch]) -> pa.Table:
    """Concatenate decoded batches into one table (no per-record work)."""
    return pa.Table.from_batches([b.to_arrow_batch() for b in batches], schema=RECORDS_SCHEMA)


def decode_to_arrow(buf: Any, *, verify_crc: bool = True) -> pa.Table:
    """Decode a buffer of batches straight to one Arrow table of records."""
    return batches_to_arrow(decode_batches(buf, verify_crc=verify_crc))


def decode_records(
    buf: Any, *, verify_crc: bool = True, topic: str | None = None, partition: int = -1
) -> list[Record]:
    """Decode a buffer of batches to a flat list of :class:`Record`."""
    out: list[Record] = []
    for b in decode_batches(buf, verify_crc=verify_crc):
        out.extend(b.records(topic, partition))
    return out
