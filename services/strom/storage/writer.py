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

Cancellation: a request whose caller goes away (a cancelled call, a closed stream) while its
job waits for or runs on the thread does not stop the job: the bytes get written. So the job
counts as pending until it has finished (not until its caller stopped waiting: a small append
could otherwise run inline beside it, out of order), and what follows an append on the loop
(publishing offsets, advancing the high watermark, waking fetches) is given as ``then`` and
runs when the job finishes, whether anyone still waits for the answer or not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from strom.storage import metrics

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Appends up to this many bytes run inline on the loop when the writer is idle.
INLINE_MAX_BYTES = 64 * 1024


class AppendWriter:
    """Runs append jobs in arrival order (see the module docstring)."""

    def __init__(self, inline_max_bytes: int = INLINE_MAX_BYTES) -> None:
        self.inline_max_bytes = inline_max_bytes
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="strom-append")
        self.pending = 0

    async def run(
        self, job: Callable[[], T], size: int, then: Callable[[T], R] | None = None
    ) -> Any:
        """Run ``job`` (which appends ``size`` bytes), then ``then(result)`` on the loop; return
        what ``then`` returned (without one, the job's result). See the module docstring for
        what a cancelled caller leaves done."""
        if self.pending == 0 and size <= self.inline_max_bytes:
            metrics.APPEND_QUEUE.observe(0.0)
            result = job()
            return result if then is None else then(result)
        self.pending += 1
        queued = time.perf_counter()

        def timed() -> T:
            metrics.APPEND_QUEUE.observe(time.perf_counter() - queued)
            return job()

        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def finished(ran: asyncio.Future[T]) -> None:
            self.pending -= 1
            try:
                result = ran.result()
                out = result if then is None else then(result)
            except BaseException as exc:
                if answer.cancelled():
                    log.error("an append whose caller went away failed", exc_info=exc)
                else:
                    answer.set_exception(exc)
                return
            if not answer.cancelled():
                answer.set_result(out)

        try:
            ran = loop.run_in_executor(self._executor, timed)
        except BaseException:  # not submitted (the writer is closed): nothing is pending
            self.pending -= 1
            raise
        ran.add_done_callback(finished)
        return await answer

    def close(self) -> None:
        """Wait for queued appends and stop the thread (node shutdown, after the server)."""
        self._executor.shutdown(wait=True)
