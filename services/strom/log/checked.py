"""The parts of a segment file whose batches' CRC-32C this process has taken.

A node takes a batch's CRC on the way in (Produce, replication, a recovery scan) and on the
first read that meets it after a restart; after that a read serves the batch with its
sequence and epoch checked but without a second CRC, as Kafka's brokers do (a byte that goes
bad on disk later is refused by the reader's own CRC check, and by a restarted node). The
checked parts are kept as disjoint, sorted ``[start, end)`` file ranges: appends add at the
end, reads add where they read, so a few ranges cover a segment whatever order its readers
came in (a restarted node's consumers resume in the middle of segments).
"""

from __future__ import annotations

import bisect

#: Past this many separate ranges the set starts over (reads check again until they have
#: covered the segment once more): a bound on memory, never on what is checked.
MAX_RANGES = 1024


class CheckedRanges:
    """Disjoint, sorted file ranges whose batches' CRCs were taken (``Log.lock`` held)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def until(self, position: int) -> int:
        """Where the checked range holding ``position`` ends (``position`` when none does):
        a batch that starts at or after ``position`` and ends by then needs no CRC."""
        i = bisect.bisect_right(self._starts, position) - 1
        if i >= 0 and self._ends[i] > position:
            return self._ends[i]
        return position

    def add(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` checked, merging with the ranges it meets or touches."""
        if end <= start:
            return
        starts, ends = self._starts, self._ends
        lo = bisect.bisect_left(ends, start)  # first range ending at or after start
        hi = bisect.bisect_right(starts, end)  # ranges starting after end are kept
        if lo < hi:
            start = min(start, starts[lo])
            end = max(end, ends[hi - 1])
        if len(starts) - (hi - lo) >= MAX_RANGES:
            starts.clear()
            ends.clear()
            lo = hi = 0
        starts[lo:hi] = [start]
        ends[lo:hi] = [end]

    def cut(self, end: int) -> None:
        """Forget everything at or past ``end`` (the file was truncated there)."""
        i = bisect.bisect_left(self._starts, end)
        del self._starts[i:], self._ends[i:]
        if self._ends and self._ends[-1] > end:
            self._ends[-1] = end

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))
