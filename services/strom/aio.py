"""asyncio versions of :class:`Producer`, :class:`Consumer` and :class:`Admin`.

``from strom.aio import Producer, Consumer, Admin`` gives the same clients with awaitable
methods, for services built on asyncio (aiohttp, FastAPI, grpc.aio …). They wrap the
threaded clients rather than re-implementing them: the real work already happens off the
caller's thread (the producer's sender thread, the consumer's prefetching fetcher), so the
asyncio layer only has to never block the event loop:

- ``Producer.send`` returns an ``asyncio.Future`` of :class:`RecordMetadata` (await it, or
  ``await producer.send_and_wait(...)``); it hands the record over without blocking when the
  topic is known and the buffer has room, and moves to a worker thread only when ``send`` may
  have to wait (metadata, ``max_block_ms``).
- ``Consumer.poll`` / ``poll_arrow`` answer at once from prefetched data when there is some
  and otherwise wait in a worker thread; ``async for record in consumer`` works.
- every ``Admin`` method is a coroutine; so are the producer's transaction calls but
  ``begin_transaction``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from strom.client import admin as _admin
from strom.client import consumer as _consumer
from strom.client import producer as _producer
from strom.client.types import RecordMetadata, TopicPartition
from strom.record import Record

__all__ = ["Admin", "Consumer", "Producer", "RecordMetadata", "TopicPartition"]


class Producer:
    """asyncio face of :class:`strom.client.producer.Producer` (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = _producer.Producer(*args, **kwargs)

    async def send(self, topic: str, value: Any = None, **kwargs: Any) -> asyncio.Future[Any]:
        """Queue one record; returns an asyncio Future of its RecordMetadata."""
        p = self._sync
        if topic in p._counts and p._buffered < p.buffer_memory // 2:
            fut = p.send(topic, value, **kwargs)  # cannot block: metadata known, room left
        else:
            fut = await asyncio.to_thread(p.send, topic, value, **kwargs)
        return asyncio.wrap_future(fut)

    async def send_and_wait(self, topic: str, value: Any = None, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(topic, value, **kwargs))

    async def send_batch(self, topic: str, values: Any, *args: Any, **kwargs: Any) -> Any:
        """Queue many records; returns the list of BatchMetadata once all are acknowledged."""
        fut = await asyncio.to_thread(self._sync.send_batch, topic, values, *args, **kwargs)
        return await asyncio.wrap_future(fut)

    async def flush(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self._sync.flush, timeout)

    async def close(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self._sync.close, timeout)

    async def partitions_for(self, topic: str) -> list[int]:
        return await asyncio.to_thread(self._sync.partitions_for, topic)

    # -- transactions (each call may wait on the coordinator: a worker thread) --------------

    async def init_transactions(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self._sync.init_transactions, timeout)

    def begin_transaction(self) -> None:
        self._sync.begin_transaction()  # local: never waits

    async def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any) -> None:
        await asyncio.to_thread(self._sync.send_offsets_to_transaction, offsets, group_metadata)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self._sync.commit_transaction, timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self._sync.abort_transaction, timeout)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Consumer:
    """asyncio face of :class:`strom.client.consumer.Consumer` (same arguments)."""

    #: Methods that may wait on the network: coroutines here.
    _BLOCKING = frozenset(
        {
            "commit",
            "committed",
            "beginning_offsets",
            "end_offsets",
            "offsets_for_times",
            "position",
            "seek_to_beginning",
            "seek_to_end",
            "topics",
            "partitions_for_topic",
            "subscribe",
            "unsubscribe",
            "assign",
        }
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = _consumer.Consumer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if name in self._BLOCKING and callable(attr):
            return _in_thread(attr)
        return attr  # seek, pause, resume, assignment, paused … never wait

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        records = self._sync.poll(0, max_records)
        if records or timeout_ms <= 0:
            return records
        return await asyncio.to_thread(self._sync.poll, timeout_ms, max_records)

    async def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        table = self._sync.poll_arrow(0, max_records)
        if table.num_rows or timeout_ms <= 0:
            return table
        return await asyncio.to_thread(self._sync.poll_arrow, timeout_ms, max_records)

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        while not self._sync._closed:
            for record in await self.poll(500):
                yield record

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Admin:
    """asyncio face of :class:`strom.client.admin.Admin`: every public method is awaitable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = _admin.Admin(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if callable(attr) and not name.startswith("_"):
            return _in_thread(attr)
        return attr

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return run
