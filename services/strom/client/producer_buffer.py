"""The producer's ``buffer_memory``: room for records in open batches, and waiting for it.

:class:`ProducerBuffer` is mixed into :class:`strom.client.producer.Producer`. ``send``
reserves memory per batch, in chunks of up to ``RESERVE_CHUNK`` bytes, not per record
(``_make_room``: a record that fits its batch's reservation costs ``send`` one comparison);
a batch that closes gives back what it did not use (``_trim``), and a send that finds the
buffer full waits up to ``max_block_ms`` (``_wait_for_space``), or until the deadline a
``space_wait_until`` block set on its thread (strom.aio's producer), or raises
:class:`WouldBlockError` at once with ``NO_WAIT``. A module of its own: the buffer's
accounting is one concern, shared by ``send`` and ``send_batch``, apart from both.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.metadata import MetadataCache
from strom.client.stats import ProducerStats
from strom.errors import RequestTimedOutError


class WouldBlockError(Exception):
    """Raised instead of waiting for buffer space by a send made inside
    :func:`space_wait_until` with ``NO_WAIT``: nothing was queued (strom.aio's event loop
    must never wait for the buffer, so it tries first and waits elsewhere when told to)."""


#: ``space_wait_until``'s "do not wait at all": the send raises :class:`WouldBlockError`.
NO_WAIT = float("-inf")

#: Per thread: when a send made on it stops waiting for buffer space (see space_wait_until).
_space_wait = threading.local()


@contextlib.contextmanager
def space_wait_until(end: float) -> Iterator[None]:
    """Sends and ``send_batch`` calls made on this thread inside the block wait for buffer
    space until the monotonic time ``end`` rather than ``max_block_ms`` from their own
    start; ``NO_WAIT`` makes them raise :class:`WouldBlockError` instead of waiting.

    strom.aio's producer needs both: its event loop may only try (a full buffer must not
    freeze the loop), and the sends it then hands to its one waiting thread must keep the
    deadline of their ``await producer.send()``, not restart it when their turn comes.
    Thread-local and read only on the slow path (a full batch), so ``send`` pays nothing."""
    before = getattr(_space_wait, "end", None)
    _space_wait.end = end
    try:
        yield
    finally:
        _space_wait.end = before


def _space_deadline(max_block_s: float) -> float:
    """When a send on this thread, about to wait for buffer space, gives up (monotonic)."""
    end = getattr(_space_wait, "end", None)
    if end is None:
        return time.monotonic() + max_block_s
    if end == NO_WAIT:
        raise WouldBlockError("the producer's buffer is full")
    return end


#: Largest bytes ``send`` reserves for an open batch at a time (see ``_make_room``).
RESERVE_CHUNK = 32 * 1024


class ProducerBuffer:
    """The open batches' reservations of ``buffer_memory``, opening and closing batches,
    and the wait for space.

    A mixin, as :class:`strom.client.sender.SenderLoop` is: every method runs with the
    Producer's lock held, over its partition queues. Every attribute is set up by
    ``Producer.__init__``; the annotations say which ones it uses.
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    batch_size: int
    buffer_memory: int
    max_block_s: float
    max_request_size: int
    _metadata: MetadataCache
    _stats: ProducerStats
    _space: threading.Condition
    _space_waiters: int
    _buffered: int
    _queues: dict[tuple[str, int], PartitionQueue]
    _open: dict[tuple[str, int], ProducerBatch]
    _closing: bool
    _wake: threading.Event

    def _make_room(self, topic: str, partition: int, size: int) -> ProducerBatch:
        """With the lock held: the partition's open batch with room for ``size`` more bytes,
        opening a new one when it is full, and reserving ``buffer_memory`` for it.

        Memory is reserved per batch in chunks of up to ``RESERVE_CHUNK`` bytes (as Kafka's
        buffer pool hands out memory per batch), not per record: a record that fits in its
        batch's reservation costs ``send`` one comparison. Blocks while the buffer is full.
        """
        end = None
        while True:
            b = self._open.get((topic, partition))
            if b is not None and b.count and b.size + size > b.max_size:
                self._trim(b)  # full: what it did not use goes back to the pool
                b = None
            need = size if b is None else b.size + size - b.limit
            if self._buffered + need > self.buffer_memory and self._buffered:
                # Reservations other batches have not filled yet go back first: with many
                # partitions open they could fill the pool with nothing in it.
                slack = [o for o in self._open.values() if o.limit > o.size]
                for other in slack:
                    self._trim(other)
                if not slack:
                    if end is None:
                        end = _space_deadline(self.max_block_s)
                    try:
                        self._wait_for_space(need, end)
                    except RequestTimedOutError:
                        self._stats.failed(topic, 1)  # record-error-total, as Kafka's
                        raise
                continue  # (the sender may also have taken the open batch meanwhile)
            if b is None:
                b = self._new_batch(topic, partition)
            used = b.size + size
            extra = min(
                RESERVE_CHUNK,
                max(b.max_size, used) - used,
                self.buffer_memory - self._buffered - need,
            )
            grant = need + max(extra, 0)
            b.limit += grant
            self._buffered += grant
            return b

    def _trim(self, b: ProducerBatch) -> None:
        """With the lock held: return a closing batch's unused reservation to the pool."""
        self._buffered -= b.limit - b.size
        b.limit = b.size
        if self._space_waiters:
            self._space.notify_all()

    def _new_batch(self, topic: str, partition: int) -> ProducerBatch:
        """With the lock held: open a new batch for the partition (closing the old one)."""
        tp = (topic, partition)
        pq = self._queues.get(tp)
        if pq is None:
            pq = self._queues[tp] = PartitionQueue(topic, partition)
        b = pq.new_batch()
        b.max_size = self._batch_bytes(topic)
        b.topic_id = self._metadata.topic_id(topic)
        self._open[tp] = b
        return b

    def _batch_bytes(self, topic: str) -> int:
        """``batch_size``, or less for a topic whose ``max.message.bytes`` is smaller, so that
        records are not refused (MESSAGE_TOO_LARGE) for the batch they were put in: half the
        limit, as ``size`` counts 16 bytes a record where an encoded batch spends up to ~24,
        plus a frame of about a kilobyte. Only a record too large on its own then fails.
        Never more than ``max_request_size``: sizes count records uncompressed, so a batch
        of many records then decompresses to no more than one record may be."""
        size = min(self.batch_size, self.max_request_size)
        limit = self._metadata.max_message_bytes(topic)
        if limit <= 0:
            return size
        return max(min(size, limit // 2), 1)

    def _close_open(self, topic: str, partition: int) -> None:
        """With the lock held: the partition's open batch takes no more records."""
        tp = (topic, partition)
        self._open.pop(tp, None)
        pq = self._queues.get(tp)
        if pq is not None:
            if pq.open is not None:
                self._trim(pq.open)
            pq.close_open()

    def _wait_for_space(self, size: int, end: float | None = None) -> None:
        """Called with the lock held: block until ``size`` bytes fit or max_block_ms passes
        (or the monotonic time ``end``, for a caller that waits more than once)."""
        if end is None:
            end = time.monotonic() + self.max_block_s
        self._space_waiters += 1
        began = time.monotonic()
        try:
            while self._buffered + size > self.buffer_memory and self._buffered:
                left = end - time.monotonic()
                if left <= 0 or self._closing:
                    raise RequestTimedOutError(
                        f"buffer_memory={self.buffer_memory} bytes full for max_block_ms="
                        f"{self.max_block_s * 1000:.0f}: the cluster is not keeping up or "
                        "not reachable"
                    )
                self._wake.set()
                self._space.wait(left)
        finally:
            self._space_waiters -= 1
            self._stats.waited_for_buffer(time.monotonic() - began)
