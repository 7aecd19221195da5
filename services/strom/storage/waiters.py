"""Requests parked until a watermark of a partition passes an offset.

Two answers of the storage node wait on a watermark: an ``acks=-1`` Produce until the high
watermark passes its records, a DeleteRecords until every in-sync replica moved its log
start (the low watermark). Both park a future per request and wake the ones the watermark
passed when it moves, so that nothing polls; they differ only in the value they answer
with, which the caller passes in. Only the event loop thread touches a waiter list.
"""

from __future__ import annotations

import asyncio


class OffsetWaiters:
    """Futures waiting for a watermark to pass their offset, oldest first."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[int, asyncio.Future[int | None]]] = []

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    async def wait(self, offset: int, timeout: float) -> int | None:
        """Park until :meth:`release_below` passes ``offset`` or :meth:`release_all`
        answers: the value they answer with, or None after ``timeout`` seconds (a
        timed-out waiter leaves the list, so a late release does not find it)."""
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        entry = (offset, fut)
        self._entries.append(entry)
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                return await fut
        except TimeoutError:
            return None
        finally:
            if entry in self._entries:
                self._entries.remove(entry)

    def release_below(self, limit: int, result: int | None) -> None:
        """Answer ``result`` to every waiter whose offset is below ``limit``; the others
        keep waiting."""
        if not self._entries:
            return
        keep = []
        for offset, fut in self._entries:
            if offset < limit:
                if not fut.done():
                    fut.set_result(result)
            else:
                keep.append((offset, fut))
        self._entries[:] = keep

    def release_all(self, result: int | None) -> None:
        """Answer ``result`` to every waiter (lost leadership, shutdown, deletion)."""
        for _, fut in self._entries:
            if not fut.done():
                fut.set_result(result)
        self._entries.clear()
