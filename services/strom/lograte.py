"""Rate limits for log lines that can repeat (a retry loop, an outage that lasts).

A service that logs each failed attempt of something retried several times a second buries
the one line an operator needs (the first) under thousands of copies, while one that logs
nothing leaves no trace. :class:`LogLimiter` lets a caller log the first occurrence of a
condition and then at most one line per interval, each saying how many were left out since,
as Kafka's brokers do for a lost ZooKeeper session. It only decides; the caller logs, so the
line stays in its own logger and wording.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

#: How often a condition that lasts is logged again by default.
DEFAULT_INTERVAL_S = 30.0


class LogLimiter:
    """Per key: the first occurrence is logged, then at most one line per ``interval_s``.

    Thread-safe (etcd's lease keepers and watches each run in a thread of their own)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        #: key -> (when its last line was written, occurrences left out since, first seen).
        self._state: dict[Hashable, tuple[float, int, float]] = {}

    def occurred(self, key: Hashable, now: float | None = None) -> int | None:
        """Note one occurrence of ``key`` (at ``now`` on the limiter's clock, when the caller
        has read it already): None when no line is due now, else how many occurrences were
        left out since the last line (0 for the first one)."""
        if now is None:
            now = self._clock()
        with self._lock:
            last = self._state.get(key)
            if last is None:
                self._state[key] = (now, 0, now)
                return 0
            logged_at, left_out, first = last
            if now - logged_at < self.interval_s:
                self._state[key] = (logged_at, left_out + 1, first)
                return None
            self._state[key] = (now, 0, first)
            return left_out

    def active(self, key: Hashable) -> bool:
        """Whether ``key`` occurred since it last :meth:`ended`."""
        with self._lock:
            return key in self._state

    def ended(self, key: Hashable) -> tuple[float, int] | None:
        """The condition is over: forget ``key``. None if it was not active, else (seconds
        since its first occurrence, occurrences left out since its last line)."""
        now = self._clock()
        with self._lock:
            last = self._state.pop(key, None)
        if last is None:
            return None
        return now - last[2], last[1]
