"""Array, bytes and checksum steps that keep the interpreter lock while they run.

Why: a thread that lets go of the interpreter lock for a short C call waits, when another
thread of the process is busy in Python, up to the switch interval (5 ms) to get it back.
A producer's sender thread encoding a big batch made ~10 such calls: numpy loops over more
than 500 items, pyarrow's IPC writer and ``pa.nulls``, a CRC-32C of more than 32 KiB, a
``bytes.join`` of more than 1 MiB, each of which is done in microseconds. Beside an
application thread calling ``send()`` in a loop, a 4 MiB request then took the sender
30-300 ms to encode instead of ~3 ms, and the producer's buffer filled up behind it
(docs/benchmarks.md, "One producer: the sender's waits for the interpreter lock").

These helpers do the same work without letting go: numpy in slices of at most
:data:`SLICE` items (numpy keeps the lock for loops that short), CRC-32C with the lock held,
and joins of big byte strings through :class:`io.BytesIO`. A numpy or Python version that
changes those thresholds costs speed, never correctness.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import crc32c as _crc32c
import numpy as np

#: numpy lets go of the interpreter lock for loops over more than 500 items
#: (``NPY_BEGIN_THREADS_THRESHOLDED``); slices of this many keep it.
SLICE = 500

#: ``bytes.join`` lets go of the interpreter lock from this many bytes on (CPython's
#: ``GIL_THRESHOLD`` in ``Objects/stringlib/join.h``).
JOIN_THRESHOLD = 1 << 20


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` continuing ``value``, computed with the interpreter lock held
    (hardware CRC-32C does a 4 MiB buffer in ~0.2 ms: less than one wait for the lock)."""
    return int(_crc32c.crc32c(data, value, gil_release_mode=0))


def join(parts: Iterable[Any]) -> bytes:
    """``b"".join(parts)`` without letting go of the interpreter lock for big results."""
    if not isinstance(parts, (list, tuple)):
        parts = list(parts)
    if sum(map(len, parts)) < JOIN_THRESHOLD:  # parts are bytes-like with 1-byte items
        return b"".join(parts)
    out = io.BytesIO()
    for p in parts:
        out.write(p)
    return out.getvalue()


def as_int64(a: np.ndarray) -> np.ndarray:
    """``a.astype(np.int64)`` (floats truncated towards zero), slice by slice."""
    if a.dtype == np.int64:
        return a
    n = len(a)
    if n <= SLICE:
        return a.astype(np.int64)
    out = np.empty(n, dtype=np.int64)
    for i in range(0, n, SLICE):
        out[i : i + SLICE] = a[i : i + SLICE]
    return out


def min_max(a: np.ndarray) -> tuple[int, int]:
    """The smallest and largest item of a non-empty integer array, as Python ints."""
    n = len(a)
    if n <= SLICE:
        return int(a.min()), int(a.max())
    lo = min(int(a[i : i + SLICE].min()) for i in range(0, n, SLICE))
    hi = max(int(a[i : i + SLICE].max()) for i in range(0, n, SLICE))
    return lo, hi


def minus(a: np.ndarray, base: int) -> np.ndarray:
    """``a - base`` for an int64 array, slice by slice."""
    n = len(a)
    if n <= SLICE:
        return a - base
    out = np.empty(n, dtype=np.int64)
    for i in range(0, n, SLICE):
        np.subtract(a[i : i + SLICE], base, out=out[i : i + SLICE])
    return out
