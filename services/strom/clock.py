"""The wall clock every strom service reads, with a test-only offset for clock-jump tests.

Services read the wall clock for record timestamps (LogAppendTime), retention, segment age,
producer-id expiry, offset commit times, and the times they publish in etcd.
The reliability suite (tests/chaos) jumps that clock forwards and backwards in one process
without touching the machine's clock: when ``STROM_TEST_CLOCK_OFFSET_FILE`` names a file at
process start, :func:`wall_ms` adds the whole number of milliseconds written in it (re-read
at most every 100 ms, so a jump shows within that; a missing or unreadable file counts as 0).
Without the variable, :func:`wall_ms` is ``time.time_ns() // 1_000_000`` and costs nothing
more.

Timeouts must not move when the wall clock is stepped (NTP, an operator, a VM resumed): a jump
forward would expire every session and transaction at once, one backward would keep a dead
member's partitions or an abandoned transaction's open offsets for as long as the jump (a
transaction begun 7 minutes "in the future" blocks read_committed readers for 7 minutes).
Timeouts inside one process use ``time.monotonic()``; those whose times the coordinator writes
down (members' session deadlines, transaction start times, read by the next owner after a
failover) use :func:`steady_ms`: the wall clock *slewed*, never stepped. It advances with the
monotonic clock, at most :data:`SLEW` (5 %) faster or slower, towards the wall clock: a
7-minute step is absorbed over about 2.3 hours instead of in an instant, a deadline of 45 s
moves by at most 2.25 s meanwhile, and what it writes down stays the wall clock's time once
they agree (as NTP's slewing does for the whole machine). Kafka reads the wall clock there
and has exactly the stalls above.
"""

from __future__ import annotations

import os
import threading
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


def monotonic_ms() -> int:
    """Milliseconds of the monotonic clock (any origin; only differences mean anything). For
    delays a wall-clock step must not move: a step back of N hours would otherwise hold a
    delayed file delete for N hours, a step forward run it at once."""
    return time.monotonic_ns() // 1_000_000


#: How much faster or slower than the monotonic clock :func:`steady_ms` may run while it
#: catches up with a step of the wall clock.
SLEW = 0.05

_steady_lock = threading.Lock()
#: (monotonic ns, steady ms) of the last reading; None before the first.
_steady_last: tuple[int, float] | None = None


def steady_ms() -> int:
    """Wall-clock-like milliseconds that never jump: the last reading advanced by the
    monotonic clock, moved towards :func:`wall_ms` by at most :data:`SLEW` of the time that
    passed (see the module docstring). Never decreases. Deadlines and durations compare
    these; timestamps meant for people and for retention (commit and record times) stay on
    :func:`wall_ms`."""
    global _steady_last
    mono = time.monotonic_ns()
    wall = wall_ms()
    with _steady_lock:
        last = _steady_last
        if last is None:
            value = float(wall)
        else:
            elapsed = (mono - last[0]) / 1e6
            drift = wall - (last[1] + elapsed)
            bound = SLEW * elapsed
            value = last[1] + elapsed + max(-bound, min(bound, drift))
        _steady_last = (mono, value)
    return int(value)
