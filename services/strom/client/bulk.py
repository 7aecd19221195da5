"""``Producer.send_batch``'s parts: a caller's columns as one Arrow table, its rows grouped by
their key's partition, cut into batches by the rows' own sizes, and the one future of them all.

Bulk input arrives as columns and becomes batches without a Python object per record: each
row's size (as ``send()`` counts it) comes from Arrow kernels, and batches are zero-copy
slices of the table (only keyed rows are hashed one by one, through a cache). The checks
``send()`` makes of a record (headers, a partitioner's answer, the size limit) are the same
functions, in :mod:`strom.client.record_checks`.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from strom.client.accumulator import RECORD_OVERHEAD, ProducerBatch
from strom.client.futures import BatchResult
from strom.client.partitioner import partition_for_key
from strom.client.record_checks import (
    Partitioner,
    checked_pick,
    record_headers,
    record_too_large,
)
from strom.errors import MessageTooLargeError

#: key -> its partition, for keyed rows (keys repeat: each is hashed once).
_key_partition = functools.lru_cache(maxsize=1 << 16)(partition_for_key)


class BatchMetadata(NamedTuple):
    """Where one chunk of a ``send_batch`` landed: ``count`` records from ``base_offset``."""

    topic: str
    partition: int
    base_offset: int
    count: int


def as_table(values: Any, keys: Any, headers: Any, timestamps: Any) -> pa.Table:
    if isinstance(values, pa.RecordBatch):
        values = pa.Table.from_batches([values])
    if isinstance(values, pa.Table):
        if keys is not None or headers is not None or timestamps is not None:
            raise ValueError("with an Arrow table, give keys/headers/timestamps as its columns")
        if "value" not in values.schema.names:
            raise ValueError(
                f"the Arrow table needs a 'value' column; it has {values.schema.names}"
            )
        return values
    cols = {"value": _binary(values, "values")}
    n = len(cols["value"])
    if keys is not None:
        cols["key"] = _binary(keys, "keys")
        if len(cols["key"]) != n:
            raise ValueError(f"{len(cols['key'])} keys for {n} values")
    if headers is not None:
        from strom.record.schema import HEADERS_TYPE

        cols["headers"] = (
            headers
            if isinstance(headers, pa.Array)
            else pa.array(
                [None if h is None else record_headers(h) for h in headers], type=HEADERS_TYPE
            )
        )
    if timestamps is not None:
        cols["timestamp"] = (
            timestamps
            if isinstance(timestamps, pa.Array)
            else pa.array(timestamps, type=pa.int64())
        )
    return pa.table(cols)


def _binary(x: Any, what: str) -> pa.Array:
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    if isinstance(x, pa.Array):
        if pa.types.is_string(x.type) or pa.types.is_large_string(x.type):
            return x.cast(pa.binary())
        return x
    try:
        return pa.array(x, type=pa.binary())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        try:
            return pa.array(x, type=pa.string()).cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise TypeError(f"{what} must be bytes, str or None: {exc}") from None


def split_by_key(
    table: pa.Table, topic: str, n: int, partitioner: Partitioner | None
) -> list[tuple[int, pa.Table]]:
    """Group rows by their key's partition, keeping each partition's rows in input order.
    A custom partitioner's answers are checked before anything is queued (checked_pick)."""
    keys = table.column("key").to_pylist()
    if partitioner is None:
        parts = np.fromiter(
            (random.randrange(n) if k is None else _key_partition(k, n) for k in keys),
            dtype=np.int32,
            count=len(keys),
        )
    else:
        picks = [partitioner(k, n) for k in keys]
        if not all(type(p) is int and 0 <= p < n for p in picks):
            picks = [checked_pick(partitioner, p, topic, n) for p in picks]
        parts = np.fromiter(picks, dtype=np.int32, count=len(picks))
    out = []
    for p in np.unique(parts):
        idx = np.flatnonzero(parts == p)
        out.append((int(p), table.take(pa.array(idx))))
    return out


def _row_sizes(table: pa.Table) -> np.ndarray:
    """Each row's size as ``send()`` counts a record: value + key + header keys (UTF-8) and
    values + RECORD_OVERHEAD, nulls counting 0. Vectorized: one Arrow kernel a column."""
    # Arrow's compute kernels are imported where send_batch needs them: at the module's
    # top they cost every client process ~30-50 ms at start and thousands of objects
    # each full collection walks.
    import pyarrow.compute as pc

    n = table.num_rows
    sizes = np.full(n, RECORD_OVERHEAD, dtype=np.int64)
    names = table.schema.names
    for name in ("key", "value"):
        if name in names:
            sizes += _lengths(table.column(name))
    if "headers" in names and table.column("headers").null_count < n:
        lists = table.column("headers").combine_chunks()
        if isinstance(lists, pa.ChunkedArray):  # (pyarrow < 16 keeps it chunked)
            lists = pa.concat_arrays(lists.chunks)
        flat = pc.list_flatten(lists)
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        per_header = _lengths(flat.field("key")) + _lengths(flat.field("value"))
        sizes += np.bincount(parents, weights=per_header, minlength=n).astype(np.int64)
    return sizes


def _lengths(column: Any) -> np.ndarray:
    """Byte lengths of a binary or string column (nulls 0) as int64."""
    import pyarrow.compute as pc  # see _row_sizes

    lengths = pc.fill_null(pc.binary_length(column), 0)
    return np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)


def table_chunks(
    table: pa.Table, batch_size: int, max_size: int, buffer_memory: int | None = None
) -> Iterable[pa.Table]:
    """Zero-copy slices of at most ``min(batch_size, max_size)`` bytes by the rows' own sizes
    (a larger row alone); a row over ``max_size`` (or ``buffer_memory``) raises what
    ``send()`` raises for it, before any slice is made.

    Cut by the rows' own sizes, not the average: adjacent large rows among small ones must not make
    a batch the topic refuses while each row fits. Per slice, not per row: a cumulative sum and one
    searchsorted each."""
    n = table.num_rows
    if n == 0:
        return []
    sizes = _row_sizes(table)
    memory = max_size if buffer_memory is None else buffer_memory
    too_big = np.flatnonzero(sizes > min(max_size, memory))
    if len(too_big):
        i = int(too_big[0])
        err = record_too_large(int(sizes[i]), max_size, memory)
        raise MessageTooLargeError(f"{err.message} (row {i}; {len(too_big)} such rows)")
    limit = max(min(batch_size, max_size), 1)
    if int(sizes.sum()) <= limit:
        return [table]
    cum = np.cumsum(sizes)
    out = []
    start = 0
    while start < n:
        base = int(cum[start - 1]) if start else 0
        end = max(int(np.searchsorted(cum, base + limit, side="right")), start + 1)
        out.append(table.slice(start, end - start))
        start = end
    return out


def part_of(b: ProducerBatch, start: int, end: int) -> ProducerBatch:
    """Records ``start`` to ``end`` of a (closed, non-bulk) batch as a closed batch of its own,
    with the same creation time (the delivery timeout still counts from the records' send),
    attempts and base sequence (the caller moves the second part's). Per-record Python: only
    on the rare split after a MESSAGE_TOO_LARGE, never on the produce path."""
    part = ProducerBatch(b.topic, b.partition)
    part.topic_id = b.topic_id
    part.values = b.values[start:end]
    part.keys = b.keys[start:end]
    if b.headers is not None:
        part.headers = b.headers[start:end]
    part.has_keys = any(k is not None for k in part.keys)
    part.timestamps = b.timestamps[start:end]
    part.result = BatchResult(b.topic, b.partition, part.timestamps)
    part.count = end - start
    part.size = sum(
        RECORD_OVERHEAD
        + (len(v) if v is not None else 0)
        + (len(k) if k is not None else 0)
        + sum(len(hk.encode()) + len(hv or b"") for hk, hv in (h or ()))
        for v, k, h in zip(
            part.values, part.keys, part.headers or itertools.repeat(None), strict=False
        )
    )
    part.limit = part.size
    part.max_size = b.max_size
    part.created = b.created
    part.closed = True
    part.attempts = b.attempts
    part.base_sequence = b.base_sequence
    return part


class BulkFuture(Future):  # type: ignore[type-arg]
    """What ``send_batch()`` returns: the Future of one :class:`BatchMetadata` per batch,
    which also says how many of its records are acknowledged (:meth:`written`). Its batches
    are acknowledged one by one, so after a failure some of them may be in the log: the
    failure alone says nothing of them."""

    def __init__(self, batches: list[ProducerBatch]) -> None:
        super().__init__()
        self._batches = batches

    def written(self) -> int:
        """Records of the batches acknowledged so far (all of them once it succeeded)."""
        return sum(b.count for b in self._batches if b.result.done and b.result.error is None)


def gather(batches: list[ProducerBatch]) -> BulkFuture:
    out = BulkFuture(batches)
    left = [len(batches)]
    lock = threading.Lock()

    def one_done() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if not last:
            return
        for b in batches:
            if b.result.error is not None:
                out.set_exception(b.result.error)
                return
        out.set_result(
            [BatchMetadata(b.topic, b.partition, b.result.base_offset, b.count) for b in batches]
        )

    for b in batches:
        b.result.on_done(one_done)
    return out
