"""Records as protobuf columns (``strom.v1.RecordColumns``) to Arrow and back, without a
per-record loop in Python.

RecordService (``records.proto``) carries records as one repeated field per attribute. The
storage node turns a ProduceRecords request into the Arrow columns a record batch is built
from, and a fetched batch's Arrow columns into a Subscribe message. Every step here is a C
loop: protobuf's repeated containers are read by ``pa.array`` (upb hands each entry over
without Python code in between) and filled with ``extend`` from ``to_pylist()`` / numpy
``tolist()``.

Why not parse the serialized bytes with numpy instead (DESIGN §8 leaves the choice open)? A
protobuf ``repeated bytes`` field is a chain of (tag, varint length, data) entries whose
positions depend on each other, so finding the records without a loop needs pointer jumping
over every byte that could be a tag; measured on 1,000 records of 100-1,000 bytes it was 7-40x
slower than upb's parser plus ``pa.array``, and a vectorized numpy encoder for the other
direction 2.5x slower than upb's ``extend`` + ``SerializeToString`` (docs/benchmarks.md,
"gRPC record API").

Nulls and headers follow ``RecordColumns``' comments: nulls are listed by index, headers are
flattened with a per-record count (Arrow's list offsets, in protobuf).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from strom.api import records_pb2
from strom.record.schema import HEADER_TYPE, HEADERS_TYPE


class ColumnsError(ValueError):
    """The columns do not describe a valid set of records; the message names the field."""


def _null_mask(indexes: Any, n: int, what: str) -> np.ndarray | None:
    if not len(indexes):
        return None
    idx = np.asarray(indexes, dtype=np.int64)
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        raise ColumnsError(
            f"records.{what} holds index {int(idx[bad][0])}, outside 0..{n - 1} "
            f"(there are {n} records)"
        )
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    return mask


def _binary(values: Any, mask: np.ndarray | None, what: str) -> pa.Array:
    try:
        return pa.array(values, type=pa.binary(), mask=mask)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:  # not from protobuf
        raise ColumnsError(f"records.{what}: {exc}") from None


def columns_to_table(cols: records_pb2.RecordColumns) -> pa.Table:
    """The records of ``cols`` as a table with ``value`` and, when given, ``key``,
    ``headers`` and ``timestamp`` (int64 ms) columns: what ``strom.record.encode_arrow`` and
    the Producer's ``send_batch`` take. Raises :class:`ColumnsError` naming the bad field."""
    n = len(cols.values)
    if n == 0:
        raise ColumnsError("records.values is empty: a call needs at least one record")
    if len(cols.timestamp_types):
        raise ColumnsError(
            "records.timestamp_types is set: it is filled by Subscribe only; a record's "
            "timestamp type is the topic's message.timestamp.type"
        )
    columns: dict[str, pa.Array] = {
        "value": _binary(cols.values, _null_mask(cols.null_values, n, "null_values"), "values")
    }
    key_mask = _null_mask(cols.null_keys, n, "null_keys")
    if len(cols.keys):
        if len(cols.keys) != n:
            raise ColumnsError(
                f"records.keys has {len(cols.keys)} entries for {n} values: give one key per "
                "record, or none at all"
            )
        columns["key"] = _binary(cols.keys, key_mask, "keys")
    if len(cols.header_counts):
        columns["headers"] = _headers(cols, n)
    elif len(cols.header_keys) or len(cols.header_values):
        raise ColumnsError(
            "records.header_keys/header_values are set but records.header_counts is empty: "
            "give each record's header count"
        )
    if len(cols.timestamps):
        ts = np.asarray(cols.timestamps, dtype=np.int64)
        if len(ts) != n:
            raise ColumnsError(
                f"records.timestamps has {len(ts)} entries for {n} values: give one timestamp "
                "per record, or none (the node's clock)"
            )
        if int(ts.min()) < 0:
            raise ColumnsError(
                f"records.timestamps holds {int(ts.min())}: timestamps are ms since the Unix "
                "epoch (>= 0)"
            )
        columns["timestamp"] = pa.array(ts)
    return pa.table(columns)


def _headers(cols: records_pb2.RecordColumns, n: int) -> pa.Array:
    counts = np.asarray(cols.header_counts, dtype=np.int64)
    if len(counts) != n:
        raise ColumnsError(
            f"records.header_counts has {len(counts)} entries for {n} values: give one count "
            "per record (0 for none), or none at all"
        )
    if int(counts.min()) < 0:
        raise ColumnsError(f"records.header_counts holds {int(counts.min())}: counts are >= 0")
    total = int(counts.sum())
    if len(cols.header_keys) != total or len(cols.header_values) != total:
        raise ColumnsError(
            f"records.header_counts add up to {total} headers but there are "
            f"{len(cols.header_keys)} header_keys and {len(cols.header_values)} header_values"
        )
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    items = pa.StructArray.from_arrays(
        [pa.array(cols.header_keys, type=pa.utf8()), pa.array(cols.header_values, pa.binary())],
        fields=list(HEADER_TYPE),
    )
    return pa.ListArray.from_arrays(pa.array(offsets), items, type=HEADERS_TYPE)


def _bytes_column(arr: pa.Array, values: Any, nulls: Any) -> None:
    """Fill a repeated bytes field (nulls as empty bytes) and its null-index list."""
    if arr.null_count:
        import pyarrow.compute as pc  # (here: ~60 ms at import, for a node's every start)

        nulls.extend(np.flatnonzero(~np.asarray(arr.is_valid())).tolist())
        arr = pc.fill_null(arr, b"")
    values.extend(arr.to_pylist())


def fill_columns(table: pa.Table | pa.RecordBatch, out: records_pb2.RecordColumns) -> None:
    """Write the ``key``, ``value``, ``headers``, ``timestamp`` and (the consumer's schema
    only) ``timestamp_type`` columns of decoded records (``strom.record.RECORDS_SCHEMA`` or
    the consumer's schema) into ``out``. Columns without
    nulls or headers (the common case) take no compute call beyond the copy out."""
    n = table.num_rows
    if n == 0:
        return
    keys = _combined(table.column("key"))
    if keys.null_count < n:  # else no keys at all: an empty keys field says so
        _bytes_column(keys, out.keys, out.null_keys)
    _bytes_column(_combined(table.column("value")), out.values, out.null_values)
    ts = _combined(table.column("timestamp"))
    out.timestamps.extend(ts.view(pa.int64()).to_numpy(zero_copy_only=False).tolist())
    if "timestamp_type" in table.column_names:  # the consumer's schema (Subscribe)
        types = table.column("timestamp_type").to_numpy()
        out.timestamp_types.extend(types.tolist())
    headers = _combined(table.column("headers"))
    if headers.null_count == n:
        return
    import pyarrow.compute as pc  # (here: ~60 ms at import, for a node's every start)

    counts = pc.fill_null(pc.list_value_length(headers), 0)
    if pc.max(counts).as_py():
        out.header_counts.extend(counts.to_numpy(zero_copy_only=False).tolist())
        items = pc.list_flatten(headers)
        out.header_keys.extend(pc.struct_field(items, "key").to_pylist())
        values = pc.struct_field(items, "value")
        out.header_values.extend(
            (pc.fill_null(values, b"") if values.null_count else values).to_pylist()
        )


def _combined(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
