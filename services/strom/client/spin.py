"""Keeps gRPC's per-channel completion thread alive under ``.future()`` calls.

grpc's synchronous API completes ``.future()`` calls on a "channel spin" thread that it
starts when the channel's first such call begins and that exits when the last one ends. A
producer with ``linger_ms=0`` at 10,000 records/s has one call in flight most of the time and
often none, so gRPC started and stopped a thread for nearly every request: py-spy of
``strom bench e2e`` showed ~300 threads started per second, ``Thread.start`` a tenth of the
sender thread's time and the short-lived threads as much CPU again.

A call that stays open keeps the thread: :class:`SpinKeeper` holds one ``grpc.health.v1``
``Health/Watch`` stream per channel (every strom service serves it; the node keeps one idle
coroutine per stream). It never reads the stream. If the stream ends (the node restarted,
the channel was closed and dialed afresh) the next :meth:`SpinKeeper.keep` opens another,
at most once per ``retry_s``, so a node that refuses it costs nothing more than before.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_WATCH = health_pb2.HealthCheckRequest(service="")


class SpinKeeper:
    """One open Health/Watch call per channel (see the module docstring)."""

    def __init__(self, retry_s: float = 1.0) -> None:
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[grpc.Channel, Any, float]] = {}
        self._closed = False

    def keep(self, channel: grpc.Channel) -> None:
        """Make sure ``channel`` has its open call (cheap when it has: one dict lookup)."""
        key = id(channel)
        entry = self._calls.get(key)
        if entry is not None and entry[0] is channel and entry[1].running():
            return
        now = time.monotonic()
        with self._lock:
            entry = self._calls.get(key)
            if self._closed:
                return
            recent = entry is not None and now - entry[2] < self._retry_s
            if entry is not None and entry[0] is channel and (entry[1].running() or recent):
                return
            try:
                call = health_pb2_grpc.HealthStub(channel).Watch(_WATCH)
            except Exception:  # a closed channel: the caller's own call reports it
                return
            self._calls[key] = (channel, call, now)
            stale = [k for k, (ch, c, _) in self._calls.items() if k != key and not c.running()]
            for k in stale:
                del self._calls[k]

    def close(self) -> None:
        """Cancel every open call."""
        with self._lock:
            self._closed = True
            calls, self._calls = list(self._calls.values()), {}
        for _, call, _ in calls:
            call.cancel()
