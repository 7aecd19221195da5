"""Timestamps at the clients' hand-offs, for ``strom bench e2e --trace`` (the latency budget).

A record's way from ``Producer.send`` to ``Consumer.poll`` crosses threads and processes; the
budget says how long each leg takes. The clients call :func:`emit` at the points the record
changes hands: the sender thread issuing a Produce (``produce.sent``), its answer being
handled (``produce.acked``), a Fetch answer parsed on the fetch thread (``fetch.received``).
The bench installs a sink and does the per-record matching afterwards.

Off unless a sink is installed: each point costs one module attribute read per request or
answer, never per record (the clients' hot paths stay batch-level).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: ``sink(point, perf_counter_ns, payload)``; None = tracing off.
sink: Callable[[str, int, Any], None] | None = None


def emit(point: str, payload: Any) -> None:
    """Hand ``payload`` to the sink, stamped now (callers check ``sink`` first)."""
    s = sink
    if s is not None:
        s(point, time.perf_counter_ns(), payload)
