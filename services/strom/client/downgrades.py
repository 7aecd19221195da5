"""Nodes found lacking a newer protocol feature, re-checked after a while.

Why: a client that meets an older node (during a rolling upgrade) falls back to what that
node understands: unary calls instead of ``ProduceStream`` / ``FetchStream``, a long poll
per request instead of a followed fetch. Remembered for the client's lifetime, the fallback
outlived the upgrade (the upgraded node keeps its address), so a long-running service used
the slower path until restarted. An entry now lasts :data:`RECHECK_S`; the next request then
tries the feature again, which against a node still old costs one refused or once-answered
call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: How long a node stays marked as lacking a feature before it is tried again.
RECHECK_S = 300.0


class Downgrades:
    """Addresses of nodes lacking one feature, each for :data:`RECHECK_S` seconds."""

    def __init__(
        self, recheck_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.recheck_s = RECHECK_S if recheck_s is None else recheck_s
        self._clock = clock
        self._until: dict[str, float] = {}

    def add(self, address: str) -> None:
        self._until[address] = self._clock() + self.recheck_s

    def __contains__(self, address: object) -> bool:
        until = self._until.get(address)  # type: ignore[call-overload]
        if until is None:
            return False
        if self._clock() < until:
            return True
        self._until.pop(address, None)  # type: ignore[call-overload]
        return False
