"""Sparse per-segment indexes: offset → file position, and max timestamp → offset.

Entries live in memory (``array``) and are appended to their file in batches on flush, so an
append costs no extra syscall. Both indexes are derived data: recovery rebuilds them from the
log, and a file that fails its sanity check on open is rebuilt rather than trusted.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from array import array
from pathlib import Path

from strom.log.errors import naming

_OFF_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # max timestamp so far, relative offset


def _append_entries(
    path: Path, entry: struct.Struct, a: array[int], b: array[int], written: int, fsync: bool
) -> int:
    """Append entries ``written..`` of the two columns to ``path``; return the new count."""
    if written == len(a) and not fsync:
        return written
    data = b"".join(entry.pack(a[i], b[i]) for i in range(written, len(a)))
    try:
        with open(path, "ab") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        # Cut what part of the entries got written (it holds space on a full disk, and the
        # next flush writes them all again).
        with contextlib.suppress(OSError):
            os.truncate(path, written * entry.size)
        raise naming(exc, "writing", path) from exc
    return len(a)


def _rewrite_entries(path: Path, entry: struct.Struct, a: array[int], b: array[int]) -> int:
    """Replace ``path`` with all entries (after a truncation); return the count written."""
    try:
        path.write_bytes(b"".join(entry.pack(x, y) for x, y in zip(a, b, strict=True)))
    except OSError as exc:
        raise naming(exc, "writing", path) from exc
    return len(a)


class _EntryFile:
    """The file side both indexes share: entries held as two ``array`` columns, appended to
    their file on flush and the file rewritten after a cut. Subclasses name their columns
    (``rel``/``pos``, ``ts``/``rel``) and give their entry format."""

    _entry: struct.Struct
    entry_size: int

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._set_columns(array("q"), array("q"))
        self._written = 0  # entries already on disk
        #: Set by a failed ``load``: the offset of a batch a well-formed entry listed past
        #: the end of the log. Index files are written after the data they describe, so
        #: below the recovery point (or after a clean shutdown) this is evidence that the
        #: log file lost batches, not merely a stale index (``Log._load`` reports it).
        self.past_end: int | None = None

    def _read_entries(self) -> bytes | None:
        """Empty the index and read its file: the bytes, or None when the file is missing
        or not a whole number of entries (then the index is rebuilt from the log)."""
        self._set_columns(array("q"), array("q"))
        self._written = 0
        self.past_end = None
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return None if len(data) % self.entry_size else data

    def _columns(self) -> tuple[array[int], array[int]]:
        raise NotImplementedError

    def _set_columns(self, a: array[int], b: array[int]) -> None:
        raise NotImplementedError

    def _cut(self, i: int) -> None:
        """Drop the entries from index ``i`` on (none when ``i`` is past the end)."""
        a, b = self._columns()
        if i < len(a):
            del a[i:]
            del b[i:]
            self.rewrite()

    def reset(self) -> None:
        self._set_columns(array("q"), array("q"))
        self.rewrite()

    def flush(self, *, fsync: bool = False) -> None:
        """Append entries not yet on disk."""
        a, b = self._columns()
        self._written = _append_entries(self.path, self._entry, a, b, self._written, fsync)

    def rewrite(self) -> None:
        self._written = _rewrite_entries(self.path, self._entry, *self._columns())

    def forget_written(self) -> None:
        """The file is gone: the next flush writes every entry."""
        self._written = 0


class OffsetIndex(_EntryFile):
    """Relative offset of a batch's base offset → byte position of that batch."""

    entry_size = _OFF_ENTRY.size
    _entry = _OFF_ENTRY

    rel: array[int]
    pos: array[int]

    def load(self, log_size: int) -> bool:
        """Load entries from disk; False (and empty) when the file is missing or insane."""
        data = self._read_entries()
        if data is None:
            return False
        rel, pos = array("q"), array("q")
        for r, p in _OFF_ENTRY.iter_unpack(data):
            if (rel and (r <= rel[-1] or p <= pos[-1])) or r < 0 or p < 0:
                return False
            if p >= log_size:
                # A well-formed entry (in order after sane ones) for a batch the file no
                # longer holds: the log file lost data after its index was written.
                self.past_end = self.base_offset + r
                return False
            rel.append(r)
            pos.append(p)
        self.rel, self.pos, self._written = rel, pos, len(rel)
        return True

    def append(self, offset: int, position: int) -> None:
        self.rel.append(offset - self.base_offset)
        self.pos.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(base offset, position) of the last indexed batch starting at or before ``offset``;
        (segment base, 0) when none is."""
        i = bisect.bisect_right(self.rel, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self.rel[i], self.pos[i]

    def last(self) -> tuple[int, int]:
        if not self.rel:
            return self.base_offset, 0
        return self.base_offset + self.rel[-1], self.pos[-1]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or beyond ``position`` (the log was cut there)."""
        self._cut(bisect.bisect_left(self.pos, position))

    def _columns(self) -> tuple[array[int], array[int]]:
        return self.rel, self.pos

    def _set_columns(self, a: array[int], b: array[int]) -> None:
        self.rel, self.pos = a, b


class TimeIndex(_EntryFile):
    """Running max timestamp → relative offset of the batch that raised it."""

    entry_size = _TIME_ENTRY.size
    _entry = _TIME_ENTRY

    ts: array[int]
    rel: array[int]

    def load(self, next_offset: int) -> bool:
        """Load entries from disk; False (and empty) when the file is missing or insane."""
        data = self._read_entries()
        if data is None:
            return False
        ts, rel = array("q"), array("q")
        for t, r in _TIME_ENTRY.iter_unpack(data):
            if (ts and (t <= ts[-1] or r < rel[-1])) or r < 0:
                return False
            if self.base_offset + r >= next_offset:
                self.past_end = self.base_offset + r
                return False
            ts.append(t)
            rel.append(r)
        self.ts, self.rel, self._written = ts, rel, len(ts)
        return True

    @property
    def max_timestamp(self) -> int:
        return self.ts[-1] if self.ts else -1

    def maybe_append(self, max_timestamp: int, offset: int) -> None:
        if not self.ts or max_timestamp > self.ts[-1]:
            self.ts.append(max_timestamp)
            self.rel.append(offset - self.base_offset)

    def lookup(self, timestamp: int) -> int | None:
        """Base offset of the first batch whose max timestamp is >= ``timestamp``, or None.

        Every increase of the running maximum is indexed, so the batch of the first entry at
        or above the target is exactly the first batch that can hold a matching record.
        """
        i = bisect.bisect_left(self.ts, timestamp)
        if i == len(self.ts):
            return None
        return self.base_offset + self.rel[i]

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries of batches at or beyond ``offset`` (the log was cut there)."""
        self._cut(bisect.bisect_left(self.rel, offset - self.base_offset))

    def _columns(self) -> tuple[array[int], array[int]]:
        return self.ts, self.rel

    def _set_columns(self, a: array[int], b: array[int]) -> None:
        self.ts, self.rel = a, b
