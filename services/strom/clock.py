"""The wall clock every strom service reads, with a test-only offset for clock-jump tests.

Services read the wall clock for record timestamps (LogAppendTime), retention, segment age,
producer-id expiry, transaction start times and timeouts, and the times they publish in etcd.
The reliability suite (tests/chaos) jumps that clock forwards and backwards in one process
without touching the machine's clock: when ``STROM_TEST_CLOCK_OFFSET_FILE`` names a file at
process start, :func:`wall_ms` adds the whole number of milliseconds written in it (re-read
at most every 100 ms, so a jump shows within that; a missing or unreadable file counts as 0).
Without the variable, :func:`wall_ms` is ``time.time_ns() // 1_000_000`` and costs nothing
more. Timeouts inside one process mostly use ``time.monotonic()``; those that follow this clock
(group members' session deadlines and transaction timeouts in the coordinator, whose start
times are persisted and read by the next owner, as in Kafka) move with a jump: a jump forward
expires sessions early, one backward delays expiry by the jump.
"""

from __future__ import annotations

import os
import time

#: The environment variable naming the offset file (tests only; never set it in production).
OFFSET_ENV = "STROM_TEST_CLOCK_OFFSET_FILE"

_offset_file = os.environ.get(OFFSET_ENV) or None
_offset_ms = 0
_checked_at = -1.0


def _read_offset() -> int:
    """The offset in the file, re-read at most every 100 ms."""
    global _offset_ms, _checked_at
    now = time.monotonic()
    if now - _checked_at >= 0.1:
        _checked_at = now
        try:
            with open(_offset_file, encoding="ascii") as f:  # type: ignore[arg-type]
                _offset_ms = int(f.read().strip() or 0)
        except (OSError, ValueError):
            _offset_ms = 0
    return _offset_ms


if _offset_file is None:

    def wall_ms() -> int:
        """Milliseconds since the Unix epoch."""
        return time.time_ns() // 1_000_000

else:

    def wall_ms() -> int:
        """Milliseconds since the Unix epoch, plus the test offset (see the module docstring)."""
        return time.time_ns() // 1_000_000 + _read_offset()
