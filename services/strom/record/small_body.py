"""Arrow bodies of small batches, written and read without pyarrow's per-call cost.

Why: a producer at ``linger_ms=0`` sends batches of a handful of records, hundreds a second
per partition, and a consumer that keeps up reads them as they come. pyarrow's fixed cost per
batch (five arrays, a record batch and an IPC message to write one: 80-110 µs on a 2-core VM;
reading one back into Python lists 40-70 µs) was most of the producer's sender thread's work
and of such a consumer's. For a small batch the IPC message is a fixed 528-byte metadata
block, in which only lengths and the buffers' places differ, followed by a few small buffers;
this module writes those bytes directly and reads them back (10-25 µs each way).
Measured (docs/benchmarks.md, "Small batches without pyarrow"): ~10-record batches, one
producer 55-57 k -> 88-104 k records/s, ``poll()`` 80-87 k -> 139-171 k.

Exactness: the metadata block is taken from pyarrow itself at import (a one-record batch
serialized by pyarrow) and only its length fields are overwritten; at import the module
also writes a few batches both ways, compares the bytes and reads them back, and switches
itself off if anything differs (another pyarrow version with another layout then costs
speed, never correctness). The tests compare random batches byte for byte with pyarrow's
serialization, and read random (and damaged) bodies both ways.

Scope: values and keys that are lists of ``bytes`` or None, no headers; read up to
:data:`MAX_RECORDS` records, written at any size. A bigger batch's binary columns are built
by pyarrow (``pa.array``: cheaper per record than Python for more than a few dozen) and only
the IPC message around them is written here: pyarrow's writer lets go of the interpreter
lock, which costs a producer's sender up to a switch interval per batch beside a busy
application thread (:mod:`strom.record.held`). Anything else (and, when reading, any body
not in exactly this layout) returns None and goes through pyarrow, which also names what is
wrong with a bad one.
"""

from __future__ import annotations

import logging
import struct
import sys
import threading
from array import array
from itertools import accumulate, pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from strom.record import held
from strom.record.schema import BODY_SCHEMA_V1, HEADERS_TYPE

log = logging.getLogger(__name__)

#: Batches of up to this many records are read here (and written with Python's own columns).
MAX_RECORDS = 64

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_PAIR = struct.Struct("<qq")
_PAD = bytes(8)
_ZEROS = bytes(8 * (MAX_RECORDS + 1))


def _field(meta: bytes, table: int, index: int) -> int:
    """Position of a flatbuffer table's field ``index`` (0 if absent)."""
    vtable = table - _I32.unpack_from(meta, table)[0]
    vsize = struct.unpack_from("<H", meta, vtable)[0]
    if 4 + 2 * index >= vsize:
        return 0
    off = struct.unpack_from("<H", meta, vtable + 4 + 2 * index)[0]
    return table + off if off else 0


def _deref(meta: bytes, pos: int) -> int:
    return pos + struct.unpack_from("<I", meta, pos)[0]


class _Layout:
    """Where pyarrow's metadata block for the v1 schema keeps what varies per batch."""

    def __init__(self, sample: bytes) -> None:
        meta_len = _I32.unpack_from(sample, 4)[0]
        self.prefix = bytearray(sample[: 8 + meta_len])
        meta = bytes(sample[8 : 8 + meta_len])
        root = _deref(meta, 0)
        header = _deref(meta, _field(meta, root, 2))
        nodes = _deref(meta, _field(meta, header, 1))
        buffers = _deref(meta, _field(meta, header, 2))
        if _field(meta, header, 3):  # a compression field: not the layout this expects
            raise ValueError("unexpected body compression in pyarrow's metadata")
        self.body_length = 8 + _field(meta, root, 3)
        self.length = 8 + _field(meta, header, 0)
        self.nodes = 8 + nodes + 4
        self.buffers = 8 + buffers + 4
        self.node_count = struct.unpack_from("<I", meta, nodes)[0]
        self.buffer_count = struct.unpack_from("<I", meta, buffers)[0]
        if (self.node_count, self.buffer_count) != (8, 19) or 0 in (
            self.body_length - 8,
            self.length - 8,
        ):
            raise ValueError("unexpected field or buffer count in pyarrow's metadata")
        #: The prefix's bytes that are the same in every body of this layout: (start, end).
        varying = sorted(
            [
                (self.body_length, self.body_length + 8),
                (self.length, self.length + 8),
                (self.nodes, self.nodes + 16 * 8),
                (self.buffers, self.buffers + 16 * 19),
            ]
        )
        self.fixed: list[tuple[int, int, bytes]] = []
        at = 0
        for start, end in varying:
            if start > at:
                self.fixed.append((at, start, bytes(self.prefix[at:start])))
            at = max(at, end)
        if at < len(self.prefix):
            self.fixed.append((at, len(self.prefix), bytes(self.prefix[at:])))


def _pyarrow_body(values: list[Any], keys: list[Any] | None, deltas: np.ndarray) -> bytes:
    n = len(values)
    rb = pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(n, dtype=np.int32)),
            pa.array(deltas.astype(np.int64)),
            pa.nulls(n, pa.binary()) if keys is None else pa.array(keys, type=pa.binary()),
            pa.array(values, type=pa.binary()),
            pa.nulls(n, HEADERS_TYPE),
        ],
        schema=BODY_SCHEMA_V1,
    )
    return rb.serialize().to_pybytes()  # type: ignore[no-any-return]


_BYTES = {bytes}
_BYTES_OR_NONE = {bytes, type(None)}
_BUFFERS = struct.Struct("<" + "qq" * 19)
_NODES = struct.Struct("<" + "qq" * 8)


def _binary(items: list[Any], n: int) -> tuple[int, list[bytes]] | None:
    """(null count, [validity, offsets, data]) of a binary column; None if an item is not
    bytes or None (or the data outgrows int32 offsets)."""
    types = set(map(type, items))
    try:
        if types == _BYTES:
            offsets = array("i", accumulate(map(len, items), initial=0))
            return 0, [b"", offsets.tobytes(), b"".join(items)]
        if not types <= _BYTES_OR_NONE:
            return None
        present = [x for x in items if x is not None]
        nulls = n - len(present)
        if not present:
            return n, [_ZEROS[: (n + 7) >> 3], _ZEROS[: 4 * (n + 1)], b""]
        offsets = array("i", accumulate((0 if x is None else len(x) for x in items), initial=0))
    except OverflowError:
        return None
    bits = bytearray((n + 7) >> 3)
    for i, x in enumerate(items):
        if x is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return nulls, [bytes(bits), offsets.tobytes(), b"".join(present)]


def _arrow_binary(items: list[Any], n: int) -> tuple[int, list[Any]] | None:
    """:func:`_binary` of a big column, from the buffers of pyarrow's array of it (sliced as
    pyarrow's IPC writer slices them); None if pyarrow does not take the items."""
    try:
        arr = pa.array(items, type=pa.binary())
    except (pa.ArrowException, TypeError, OverflowError):
        return None
    if not isinstance(arr, pa.BinaryArray) or len(arr) != n or arr.offset:
        return None  # e.g. chunked: more than int32 offsets hold
    validity, offsets_buf, data = arr.buffers()
    offsets = memoryview(offsets_buf)[: 4 * (n + 1)]  # type: ignore[arg-type]
    end = _I32.unpack_from(offsets, 4 * n)[0]
    nulls = arr.null_count
    bits: Any = memoryview(validity)[: (n + 7) >> 3] if nulls and validity is not None else b""
    blob: Any = memoryview(data)[:end] if data is not None else b""
    return nulls, [bits, offsets, blob]


def _zeros(size: int) -> bytes:
    return _ZEROS[:size] if size <= len(_ZEROS) else bytes(size)


_offset_deltas = array("i", range(MAX_RECORDS)).tobytes()


def _deltas_bytes(n: int) -> Any:
    """Offset deltas 0..n-1 as int32 bytes (kept for the biggest batch so far)."""
    global _offset_deltas
    have = _offset_deltas
    if 4 * n > len(have):
        have = _offset_deltas = array("i", range(max(n, 2 * len(have) // 4))).tobytes()
    return memoryview(have)[: 4 * n]


def serialize(values: list[Any], keys: list[Any] | None, deltas: np.ndarray) -> bytes | None:
    """The Arrow IPC body of a batch of ``values`` (and ``keys``, or all-null keys), no
    headers, offset deltas 0..n-1 and timestamp ``deltas`` (int64 array); None when this
    module does not write such a batch (see the module docstring)."""
    parts = _serialize(_layout(), values, keys, deltas)
    return None if parts is None else held.join(parts)


def serialize_parts(
    values: list[Any], keys: list[Any] | None, deltas: np.ndarray
) -> list[Any] | None:
    """:func:`serialize`'s body as the byte strings it is made of, in order, unjoined: the
    caller frames them and joins once (a big batch's bytes are then copied once, not twice)."""
    return _serialize(_layout(), values, keys, deltas)


def _serialize(
    layout: _Layout | None, values: list[Any], keys: list[Any] | None, deltas: np.ndarray
) -> list[Any] | None:
    n = len(values)
    if layout is None or n <= 0 or (keys is not None and len(keys) != n):
        return None
    column = _binary if n <= MAX_RECORDS else _arrow_binary
    vcol = column(values, n)
    if keys is None:
        kcol: tuple[int, list[Any]] | None = (
            n,
            [_zeros((n + 7) >> 3), _zeros(4 * (n + 1)), b""],
        )
    else:
        kcol = column(keys, n)
    if vcol is None or kcol is None:
        return None
    bitmap = _zeros((n + 7) >> 3)
    list_offsets = _zeros(4 * (n + 1))
    buffers = (
        b"",
        _deltas_bytes(n),
        b"",
        deltas.astype("<i8", copy=False).tobytes(),
        *kcol[1],
        *vcol[1],
        bitmap,  # headers: all null
        list_offsets,
        b"",  # the struct child (length 0)
        b"",
        list_offsets,  # its key column
        b"",
        b"",
        list_offsets,  # its value column
        b"",
    )
    places: list[int] = []
    prefix = bytearray(layout.prefix)
    parts: list[Any] = [prefix]
    pos = 0
    for buf in buffers:
        size = len(buf)
        places += (pos, size)
        if size:
            parts.append(buf)
            pad = -size & 7
            if pad:
                parts.append(_PAD[:pad])
            pos += size + pad
    _BUFFERS.pack_into(prefix, layout.buffers, *places)
    _NODES.pack_into(
        prefix, layout.nodes, n, 0, n, 0, n, kcol[0], n, vcol[0], n, n, 0, 0, 0, 0, 0, 0
    )
    _I64.pack_into(prefix, layout.length, n)
    _I64.pack_into(prefix, layout.body_length, pos)
    return parts


Columns = tuple[list[int], list[int], "list[bytes | None] | None", "list[bytes | None] | None"]


def columns(payload: Any, n: int) -> Columns | None:
    """A body of ``n`` records in exactly this module's layout, as Python columns: offset
    deltas, timestamp deltas, keys and values (None for a column of nulls only). None for any
    other body (headers, another writer's layout, anything that does not add up): pyarrow
    then reads it and names what is wrong with it."""
    return _columns(_layout(), payload, n)


def _columns(layout: _Layout | None, payload: Any, n: int) -> Columns | None:
    mv = memoryview(payload)
    size = len(mv)
    start = len(layout.prefix) if layout is not None else 0
    if layout is None or not 0 < n <= MAX_RECORDS or size < start:
        return None
    for a, b, fixed in layout.fixed:
        if mv[a:b] != fixed:
            return None
    if _I64.unpack_from(mv, layout.length)[0] != n:
        return None
    if _I64.unpack_from(mv, layout.body_length)[0] != size - start:
        return None
    nodes = _NODES.unpack_from(mv, layout.nodes)
    knulls, vnulls = nodes[5], nodes[7]
    if nodes != (n, 0, n, 0, n, knulls, n, vnulls, n, n, 0, 0, 0, 0, 0, 0):
        return None
    places = _BUFFERS.unpack_from(mv, layout.buffers)
    body = mv[start:]
    bufs: list[memoryview] = []
    for i in range(0, 38, 2):
        off, length = places[i], places[i + 1]
        if off < 0 or length < 0 or off + length > size - start:
            return None
        bufs.append(body[off : off + length])
    if len(bufs[1]) < 4 * n or len(bufs[3]) < 8 * n or not _all_null(bufs[10], n):
        return None
    deltas = bufs[1][: 4 * n].cast("i").tolist()
    stamps = bufs[3][: 8 * n].cast("q").tolist()
    keys = _read_binary(bufs[4], bufs[5], bufs[6], n, knulls)
    values = _read_binary(bufs[7], bufs[8], bufs[9], n, vnulls)
    if keys is False or values is False:
        return None
    return deltas, stamps, keys, values  # type: ignore[return-value]


def _all_null(validity: memoryview, n: int) -> bool:
    """Whether the first ``n`` bits of ``validity`` are all 0 (every item null)."""
    full, rest = n >> 3, n & 7
    if len(validity) < full + (1 if rest else 0) or any(validity[:full]):
        return False
    return not rest or not validity[full] & ((1 << rest) - 1)


def _read_binary(
    validity: memoryview, offsets_buf: memoryview, data: memoryview, n: int, nulls: int
) -> list[bytes | None] | bool | None:
    """A binary column's items (None: all null); False if it does not add up."""
    if nulls == n:
        return None if _all_null(validity, n) else False
    if len(offsets_buf) < 4 * (n + 1):
        return False
    offsets = offsets_buf[: 4 * (n + 1)].cast("i").tolist()
    if offsets[0] < 0 or offsets[-1] > len(data):
        return False
    if any(b < a for a, b in pairwise(offsets)):
        return False
    blob = bytes(data[: offsets[-1]])
    items: list[bytes | None] = [blob[a:b] for a, b in pairwise(offsets)]
    if nulls:
        nbytes = (n + 7) >> 3
        if len(validity) < nbytes:
            return False
        bits = validity[:nbytes]
        found = 0
        for i in range(n):
            if not bits[i >> 3] >> (i & 7) & 1:
                items[i] = None
                found += 1
        if found != nulls:
            return False
    return items


def _self_check() -> _Layout | None:
    """The layout, if this pyarrow's bytes are reproduced and read back exactly; else None
    (logged)."""
    try:
        if sys.byteorder != "little":  # Arrow's IPC buffers are little-endian
            raise ValueError("a big-endian machine")
        layout = _Layout(_pyarrow_body([b"x"], None, np.zeros(1, dtype=np.int64)))
        samples: list[tuple[list[Any], list[Any] | None]] = [
            ([b"a" * 13, None, b"xy"], None),
            ([b"v"] * 9, [b"k", None, b"", b"kk", None, b"k", b"k", b"k", b"k"]),
            ([b""] * MAX_RECORDS, [b"k" * 3] * MAX_RECORDS),
            ([None], [None]),
            # Bigger batches: pyarrow's columns inside this module's message (its writer's
            # trimming of validity, offsets and data buffers reproduced).
            (
                [b"v%d" % i if i % 7 else None for i in range(3 * MAX_RECORDS + 5)],
                [b"" if i % 5 else None for i in range(3 * MAX_RECORDS + 5)],
            ),
            ([b"x" * 9] * (2 * MAX_RECORDS), None),
        ]
        for values, keys in samples:
            deltas = np.arange(len(values), dtype=np.int64) * 7 - 3
            body = _pyarrow_body(values, keys, deltas)
            if b"".join(_serialize(layout, values, keys, deltas) or ()) != body:
                raise ValueError("bytes differ from pyarrow's")
            if len(values) > MAX_RECORDS:
                continue  # read by pyarrow
            expected = (list(range(len(values))), deltas.tolist(), _nulls_as_none(keys))
            if _columns(layout, body, len(values)) != (*expected, _nulls_as_none(values)):
                raise ValueError("read back differently from what pyarrow wrote")
        return layout
    except Exception as exc:  # any surprise: pyarrow writes every batch, as before
        log.warning("small batches are encoded with pyarrow (%s)", exc)
        return None


def _nulls_as_none(column: list[Any] | None) -> list[Any] | None:
    return None if column is None or all(x is None for x in column) else column


_UNSET: Any = object()
_LAYOUT: Any = _UNSET
_CHECK = threading.Lock()


def _layout() -> _Layout | None:
    """The layout, checked on first use rather than at import: the check has pyarrow
    allocate (its memory pool reserves address space), which a process that only reads
    bodies, or none, should not pay for importing strom.record."""
    global _LAYOUT
    layout = _LAYOUT
    if layout is _UNSET:
        with _CHECK:
            if _LAYOUT is _UNSET:
                _LAYOUT = _self_check()
            layout = _LAYOUT
    return layout  # type: ignore[no-any-return]
