"""Where appends run: inline on the event loop, or on one writer thread.

A 1 MiB ``pwritev`` into the page cache takes about a millisecond, and much longer while the
kernel throttles dirty pages; on the loop it stalls every other request (and the gRPC
receive path) for that long. On a worker thread the write overlaps with the loop decoding the
next request (the GIL is released during the syscall and the CRC), which on two cores is
what keeps Produce near the transport's throughput. Small appends stay inline when nothing is
queued: a thread hop costs more than writing a few KiB.

Order: appends must reach a partition's log in the order their requests arrived. There is a
single writer thread (FIFO), and an append only runs inline when no job is queued or running
on it, so a small request can never overtake a large one submitted before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from strom.storage import metrics

T = TypeVar("T")

#: Appends up to this many bytes run inline on the loop when the writer is idle.
INLINE_MAX_BYTES = 64 * 1024


class AppendWriter:
    """Runs append jobs in arrival order (see the module docstring)."""

    def __init__(self, inline_max_bytes: int = INLINE_MAX_BYTES) -> None:
        self.inline_max_bytes = inline_max_bytes
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="strom-append")
        self.pending = 0

    async def run(self, job: Callable[[], T], size: int) -> T:
        """Run ``job`` (which appends ``size`` bytes) and return its result."""
        if self.pending == 0 and size <= self.inline_max_bytes:
            metrics.APPEND_QUEUE.observe(0.0)
            return job()
        self.pending += 1
        queued = time.perf_counter()

        def timed() -> T:
            metrics.APPEND_QUEUE.observe(time.perf_counter() - queued)
            return job()

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, timed)
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Wait for queued appends and stop the thread (node shutdown, after the server)."""
        self._executor.shutdown(wait=True)
