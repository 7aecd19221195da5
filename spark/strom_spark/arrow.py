"""Fetched record batches → the Arrow batches Spark reads, without a per-record Python loop.

A strom batch body already is an Arrow record batch (DESIGN §4): ``offset_delta``,
``timestamp_delta``, ``key``, ``value``, ``headers``. One Fetch answer holds many such batches;
they are concatenated into one Arrow batch (a copy of the column buffers in C++), and the
Kafka columns are computed with numpy over the whole answer at once:

- ``offset`` = the batch's base offset repeated per record + ``offset_delta``;
- ``timestamp`` = base timestamp + ``timestamp_delta`` (create time), or the batch's max
  timestamp (log-append time), in microseconds as Spark wants;
- ``topic``, ``partition``, ``timestampType`` are constants sliced from cached arrays;
- rows outside the task's offset range ``[lo, hi)`` are cut by two binary searches (offsets
  are sorted within a partition).

The Python work per answer is a few dozen calls whatever the number of records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from strom.record import TIMESTAMP_LOG_APPEND, RecordBatch
from strom_spark.schema import (
    ARROW_HEADERS_TYPE,
    ARROW_TIMESTAMP,
    TIMESTAMP_TYPE_CREATE,
    TIMESTAMP_TYPE_LOG_APPEND,
    arrow_schema,
)

ARROW_SCHEMA = arrow_schema(False)
ARROW_SCHEMA_WITH_HEADERS = arrow_schema(True)


class Constants:
    """Constant columns (topic, partition, timestampType) built once and sliced zero-copy."""

    __slots__ = ("_arrays",)

    def __init__(self) -> None:
        self._arrays: dict[tuple[Any, str], pa.Array] = {}

    def get(self, value: Any, type_: pa.DataType, n: int) -> pa.Array:
        key = (value, str(type_))
        arr = self._arrays.get(key)
        if arr is None or len(arr) < n:
            arr = pa.repeat(pa.scalar(value, type_), max(n, 1 << 16))
            if len(self._arrays) > 256:
                self._arrays.clear()
            self._arrays[key] = arr
        return arr.slice(0, n)


def to_spark_batch(
    batches: Sequence[RecordBatch],
    topic: str,
    partition: int,
    lo: int,
    hi: int,
    *,
    include_headers: bool = False,
    constants: Constants | None = None,
) -> pa.RecordBatch | None:
    """The records of ``batches`` (one partition, in offset order) whose offsets are in
    ``[lo, hi)``, as one Arrow batch in :func:`strom_spark.schema.arrow_schema`; None when
    no record is in range. Control batches carry no records and are skipped. Bodies are
    decoded (decompressed, validated) here; corrupt ones raise ``InvalidBatchError``."""
    data = [b for b in batches if not b.header.is_control and b.header.record_count > 0]
    data = [b for b in data if b.header.next_offset > lo and b.header.base_offset < hi]
    if not data:
        return None
    bodies = [b.body() for b in data]
    counts = np.fromiter((len(x) for x in bodies), dtype=np.int64, count=len(bodies))
    body = bodies[0] if len(bodies) == 1 else pa.concat_batches(bodies)

    headers = [b.header for b in data]
    bases = np.fromiter((h.base_offset for h in headers), dtype=np.int64, count=len(headers))
    offsets = body.column(0).to_numpy().astype(np.int64) + np.repeat(bases, counts)
    i0 = int(np.searchsorted(offsets, lo, side="left"))
    i1 = int(np.searchsorted(offsets, hi, side="left"))
    if i0 >= i1:
        return None

    log_append = np.fromiter(
        (h.timestamp_type == TIMESTAMP_LOG_APPEND for h in headers), dtype=bool, count=len(headers)
    )
    base_ts = np.fromiter((h.base_timestamp for h in headers), dtype=np.int64, count=len(headers))
    if log_append.any():
        max_ts = np.fromiter((h.max_timestamp for h in headers), dtype=np.int64, count=len(headers))
        per_record_append = np.repeat(log_append, counts)
        stamps_ms = np.where(
            per_record_append,
            np.repeat(max_ts, counts),
            body.column(1).to_numpy() + np.repeat(base_ts, counts),
        )
        ts_type = pa.array(
            np.where(per_record_append, TIMESTAMP_TYPE_LOG_APPEND, TIMESTAMP_TYPE_CREATE).astype(
                np.int32
            )[i0:i1]
        )
    else:
        stamps_ms = body.column(1).to_numpy() + np.repeat(base_ts, counts)
        ts_type = None

    k = i1 - i0
    cache = constants if constants is not None else Constants()
    if ts_type is None:
        ts_type = cache.get(TIMESTAMP_TYPE_CREATE, pa.int32(), k)
    stamps = stamps_ms[i0:i1]
    stamps_us = np.ascontiguousarray(stamps * 1000)
    offs = np.ascontiguousarray(offsets[i0:i1])
    columns = [
        body.column(2).slice(i0, k),
        body.column(3).slice(i0, k),
        cache.get(topic, pa.string(), k),
        cache.get(partition, pa.int32(), k),
        pa.Array.from_buffers(pa.int64(), k, [None, pa.py_buffer(offs)]),
        _timestamps(stamps, stamps_us),
        ts_type,
    ]
    if include_headers:
        columns.append(_null_when_empty(body.column(4).slice(i0, k).cast(ARROW_HEADERS_TYPE)))
    schema = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _null_when_empty(headers: pa.Array) -> pa.Array:
    """A record without headers reads as null, as Spark's Kafka source gives it, whether it
    was written with none or with an empty list (the wire keeps the difference; Kafka's has
    none)."""
    if headers.null_count == len(headers):
        return headers
    empty = pc.equal(pc.list_value_length(headers), 0)
    if not pc.any(empty).as_py():
        return headers
    return pc.if_else(empty, pa.scalar(None, type=headers.type), headers)


#: The largest magnitude of a millisecond timestamp whose microseconds fit Spark's int64.
_MAX_MS = (2**63 - 1) // 1000


def _timestamps(stamps_ms: np.ndarray, stamps_us: np.ndarray) -> pa.Array:
    """The ``timestamp`` column: microseconds, null where a record's milliseconds do not fit
    in Spark's int64 microseconds. .
    Two reductions per batch; the null path only for such records."""
    k = len(stamps_ms)
    if k and (stamps_ms.max() > _MAX_MS or stamps_ms.min() < -_MAX_MS):
        wrapped = (stamps_ms > _MAX_MS) | (stamps_ms < -_MAX_MS)
        return pa.array(stamps_us, type=ARROW_TIMESTAMP, mask=wrapped)
    return pa.Array.from_buffers(ARROW_TIMESTAMP, k, [None, pa.py_buffer(stamps_us)])
