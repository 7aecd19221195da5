"""Resource limits that keep a service alive under load and hostile clients.

Two layers:

- **Transport** (:class:`ServerLimits`, applied by ``runtime.serve`` to every service's gRPC
  server): at most ``max_connections`` connections (more are closed at once, so file
  descriptors stay for the log), at most ``max_streams_per_connection`` concurrent calls on
  one connection (HTTP/2 makes the client wait: backpressure, not an error), a connection that
  does not finish its handshake in ``handshake_timeout_ms`` or stays without calls for
  ``idle_timeout_ms`` is closed, and every connection is recycled after
  ``max_connection_age_ms`` (clients reconnect transparently; a call still running gets
  ``max_connection_age_grace_ms``), which bounds how long a client stalling mid-request
  holds a stream. The server pings a quiet connection every ``keepalive_time_ms`` and closes
  it when no answer comes within ``keepalive_timeout_ms``: a client that hangs (or whose host
  vanished) holding a Subscribe stream loses it within a minute, not when TCP gives up.
  Requests and answers are limited to ``strom.grpc_options.MAX_MESSAGE_BYTES``.
- **Admission** (:class:`Admission`, used by the storage node's Produce): bytes of produce
  requests being worked on (appended, waiting for acks=all) stay under a budget, and while the
  process's resident memory is above a high-water mark new produce requests are shed. Both
  answer ``RESOURCE_EXHAUSTED``, which clients retry with backoff: load is shed before the
  node runs out of memory instead of after. A request whose principal is over its produce
  quota waits (Kafka's throttling) while holding its bytes; such requests may hold at most
  a quarter of the budget per principal and half of it in all, so principals far over their
  quotas are shed first, not everyone else.

gRPC's ``maximum_concurrent_rpcs`` is deliberately not used: it counts calls whose request is
still arriving, so one client stalling thousands of half-sent requests would lock everyone
else out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strom.errors import StromError
from strom.grpc_options import SERVER_KEEPALIVE_TIME_MS, SERVER_KEEPALIVE_TIMEOUT_MS

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def nofile_limit() -> int | None:
    """The soft limit of open file descriptors (RLIMIT_NOFILE); None when unlimited or
    unknown."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def open_fd_count() -> int | None:
    """File descriptors this process has open (``/proc/self/fd``, Linux); None elsewhere.
    Costs a directory listing: call it per batch of work, not per request."""
    try:
        return max(len(os.listdir("/proc/self/fd")) - 1, 0)  # less the listing's own
    except OSError:
        return None


def default_max_connections() -> int:
    """Half the file descriptors the process may open (the rest are for logs and peers),
    between 64 and 10,000."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY:
        soft = 20_000
    return max(64, min(10_000, soft // 2))


@dataclass(frozen=True)
class ServerLimits:
    """Transport limits for one gRPC server (see the module docstring)."""

    max_connections: int = 0  # 0: default_max_connections()
    max_streams_per_connection: int = 100
    handshake_timeout_ms: int = 10_000
    idle_timeout_ms: int = 10 * 60_000
    max_connection_age_ms: int = 60 * 60_000
    max_connection_age_grace_ms: int = 5 * 60_000
    keepalive_time_ms: int = SERVER_KEEPALIVE_TIME_MS
    keepalive_timeout_ms: int = SERVER_KEEPALIVE_TIMEOUT_MS

    def grpc_options(self) -> list[tuple[str, Any]]:
        return [
            (
                "grpc.max_allowed_incoming_connections",
                self.max_connections or default_max_connections(),
            ),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.server_handshake_timeout_ms", self.handshake_timeout_ms),
            ("grpc.max_connection_idle_ms", self.idle_timeout_ms),
            ("grpc.max_connection_age_ms", self.max_connection_age_ms),
            ("grpc.max_connection_age_grace_ms", self.max_connection_age_grace_ms),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            # gRPC's C core (1.85) waits for a ping's answer for this, 60 s by default, and
            # not for keepalive_timeout_ms: without it a hung client was noticed after ~90 s.
            ("grpc.http2.ping_timeout_ms", self.keepalive_timeout_ms),
        ]


def resident_bytes() -> int:
    """This process's resident set size (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def memory_available_bytes() -> int:
    """The memory this process may use: the cgroup limit if one is set, else the machine's."""
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            text = Path(path).read_text().strip()
            if text != "max" and int(text) < 1 << 60:
                limits.append(int(text))
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                limits.append(int(line.split()[1]) * 1024)
    return min(limits) if limits else 0


def default_memory_limit() -> int:
    """80 % of :func:`memory_available_bytes` (0 = unknown: no limit)."""
    return int(memory_available_bytes() * 0.8)


class ProduceShed(StromError):
    """A Produce refused by :class:`Admission`, raised to in-process callers (the
    RecordService) that have no gRPC context to answer RESOURCE_EXHAUSTED on. Nothing of
    the request was appended, so sending it again later is safe."""


class Admission:
    """The in-flight byte budget and the resident-memory high-water mark (module docstring).

    ``try_admit`` never refuses when nothing is in flight, so one request larger than the
    budget still goes through (alone); the memory mark is sampled by :meth:`run`, not read
    per request.
    """

    def __init__(self, max_inflight_bytes: int, max_memory_bytes: int = 0) -> None:
        self.max_inflight_bytes = max_inflight_bytes
        self.max_memory_bytes = max_memory_bytes
        self.inflight_bytes = 0
        self.resident = 0
        self.shed = 0
        #: Bytes of admitted requests whose principal was over its quota when they came
        #: (they wait it out holding them), per principal and in all.
        self.owing: dict[str, int] = {}
        self.owing_bytes = 0

    def try_admit(self, nbytes: int, owing: str | None = None) -> str | None:
        """Reserve ``nbytes``; None when admitted, else why not (call :meth:`release` after,
        with the same ``owing``: the principal of a request that came while it was over its
        quota, None otherwise).

        Requests waiting out their principal's quota get at most a quarter of the budget per
        principal and half in all, so that one principal far over its quota cannot make every other
        principal's produce requests shed (one alone always passes, as any request with nothing in
        flight)."""
        if self.max_memory_bytes and self.resident > self.max_memory_bytes:
            self.shed += 1
            return (
                f"the node's memory ({self.resident >> 20} MiB resident) is above its limit "
                f"({self.max_memory_bytes >> 20} MiB); retry later"
            )
        if owing is not None:
            mine = self.owing.get(owing, 0)
            if (mine and mine + nbytes > self.max_inflight_bytes // 4) or (
                self.owing_bytes and self.owing_bytes + nbytes > self.max_inflight_bytes // 2
            ):
                self.shed += 1
                return (
                    f"{owing} is over its produce quota and {mine} bytes of its requests are "
                    "already waiting for it on this node (at most a quarter of the node's "
                    f"budget of {self.max_inflight_bytes} per principal, half in all); "
                    "retry later"
                )
        if self.inflight_bytes and self.inflight_bytes + nbytes > self.max_inflight_bytes:
            self.shed += 1
            return (
                f"{self.inflight_bytes} bytes of produce requests are in flight and this one "
                f"({nbytes} bytes) would pass the node's budget of {self.max_inflight_bytes}; "
                "retry later"
            )
        self.inflight_bytes += nbytes
        if owing is not None:
            self.owing[owing] = self.owing.get(owing, 0) + nbytes
            self.owing_bytes += nbytes
        return None

    def release(self, nbytes: int, owing: str | None = None) -> None:
        self.inflight_bytes = max(0, self.inflight_bytes - nbytes)
        if owing is not None:
            left = self.owing.get(owing, 0) - nbytes
            if left > 0:
                self.owing[owing] = left
            else:
                self.owing.pop(owing, None)
            self.owing_bytes = max(0, self.owing_bytes - nbytes)

    def sample(self) -> None:
        self.resident = resident_bytes()

    async def run(self, stopping: asyncio.Event, interval_s: float = 0.25) -> None:
        """Sample the resident memory until ``stopping`` is set."""
        while not stopping.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=interval_s)
