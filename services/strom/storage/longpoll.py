"""Parking long-poll fetches until data lands (DESIGN §8: never sleep in a loop).

A fetch that has less than ``min_bytes`` parks a :class:`Waiter` on the partitions it reads
and awaits one future. Whoever makes data visible (an append for follower fetches, a high
watermark advance for consumer fetches) calls :meth:`WaiterRegistry.notify` with the bytes it
added; the waiter's future resolves once the bytes offered reach what it still needs, or at
once on a state change (leadership moved, partition deleted, shutdown) so that the fetch
re-evaluates and answers the error instead of sitting out ``max_wait_ms``.

Everything here runs on the event loop thread; no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable


class Waiter:
    """One parked fetch. Its future's result says how the wait ended: True woken, False
    timed out (see :meth:`WaiterRegistry.wait`)."""

    __slots__ = ("future", "keys", "remaining")

    def __init__(self, future: asyncio.Future[bool], keys: tuple[Hashable, ...], needed: int):
        self.future = future
        self.keys = keys
        self.remaining = max(needed, 1)

    def offer(self, nbytes: int) -> None:
        """Count ``nbytes`` newly visible bytes; wake when enough have come."""
        self.remaining -= nbytes
        if self.remaining <= 0:
            self.wake()

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(True)

    @property
    def woken(self) -> bool:
        f = self.future
        return f.done() and not f.cancelled() and f.result()


def _time_out(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


class WaiterRegistry:
    """Parked fetches by key (a topic-partition)."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, set[Waiter]] = {}
        self.closed = False

    def park(self, keys: Iterable[Hashable], needed: int) -> Waiter:
        """Register a waiter on ``keys`` that wakes after ``needed`` more bytes (>= 1).

        Call it on the loop right after the read that found too little, with no ``await`` in
        between, so no notification can fall into the gap.
        """
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), tuple(dict.fromkeys(keys)), needed)
        if self.closed:
            waiter.wake()
            return waiter
        for k in waiter.keys:
            self._by_key.setdefault(k, set()).add(waiter)
        return waiter

    def unpark(self, waiter: Waiter) -> None:
        for k in waiter.keys:
            s = self._by_key.get(k)
            if s is not None:
                s.discard(waiter)
                if not s:
                    del self._by_key[k]

    def notify(self, key: Hashable, nbytes: int) -> None:
        """``nbytes`` became visible on ``key``: offer them to every waiter there."""
        waiters = self._by_key.get(key)
        if waiters:
            for w in list(waiters):
                w.offer(nbytes)

    def wake(self, key: Hashable) -> None:
        """Something other than data changed on ``key``: every waiter re-evaluates."""
        waiters = self._by_key.get(key)
        if waiters:
            for w in list(waiters):
                w.wake()

    def wake_all(self) -> None:
        for waiters in list(self._by_key.values()):
            for w in list(waiters):
                w.wake()

    def close(self) -> None:
        """Shutdown: wake everyone now and every later waiter at once."""
        self.closed = True
        self.wake_all()

    def waiting(self, key: Hashable | None = None) -> int:
        """How many waiters are parked (on ``key``, or in total); for tests and metrics."""
        if key is not None:
            return len(self._by_key.get(key, ()))
        return len({id(w) for s in self._by_key.values() for w in s})

    @staticmethod
    async def wait(waiter: Waiter, timeout: float) -> bool:
        """Wait until woken or ``timeout`` seconds pass; True if woken.

        The fetch awaits the waiter's own future, which the timeout resolves with False:
        an append's wake-up reaches the parked fetch in one pass of the event loop (with a
        shielded future under ``asyncio.timeout``, two more callbacks stood between the
        append and the fetch, behind whatever else the loop had queued meanwhile).
        """
        if waiter.future.done():
            return waiter.woken
        if timeout <= 0:
            return False
        timer = asyncio.get_running_loop().call_later(timeout, _time_out, waiter.future)
        try:
            return await waiter.future
        finally:
            timer.cancel()
