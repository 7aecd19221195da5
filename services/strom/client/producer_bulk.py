"""``Producer.send_batch``: many records queued at once, as whole batches.

:class:`BulkSend` is mixed into :class:`strom.client.producer.Producer`. It checks the call,
cuts the table into batches (with :mod:`strom.client.bulk`, the Arrow side: tables, grouping
by key, cutting by size), reserves their room in ``buffer_memory`` and queues them closed,
with no per-record Python where it can. A module of its own: the bulk path shares only the
buffer (strom.client.producer_buffer) and the partition queues with ``send``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.bulk import BulkFuture, as_table, gather, split_by_key, table_chunks
from strom.client.metadata import MetadataCache
from strom.client.producer_buffer import _space_deadline
from strom.client.record_checks import Partitioner, _check_topic
from strom.client.stats import ProducerStats
from strom.client.transactions import TransactionManager, TxnPhase
from strom.errors import StromError


class BulkSend:
    """``send_batch`` and the queueing of its batches.

    A mixin, as :class:`strom.client.sender.SenderLoop` is. Every attribute is set up by
    ``Producer.__init__``; the annotations say which ones it uses. It calls the Producer's
    ``_partition_count`` and ``_closed_error`` and the buffer's ``_batch_bytes``, ``_trim``
    and ``_wait_for_space`` (strom.client.producer_buffer).
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    buffer_memory: int
    max_block_s: float
    max_request_size: int
    partitioner: Partitioner | None
    _txn: TransactionManager | None
    _metadata: MetadataCache
    _stats: ProducerStats
    _lock: threading.Lock
    _counts: dict[str, int]
    _sticky: dict[str, int]
    _buffered: int
    _queues: dict[tuple[str, int], PartitionQueue]
    _open: dict[tuple[str, int], ProducerBatch]
    _closing: bool
    _wake: threading.Event

    def send_batch(
        self,
        topic: str,
        values: Sequence[Any] | pa.Array | pa.Table | pa.RecordBatch,
        keys: Sequence[Any] | pa.Array | None = None,
        *,
        headers: Sequence[Any] | pa.Array | None = None,
        timestamps: Sequence[int] | pa.Array | None = None,
        partition: int | None = None,
    ) -> BulkFuture:
        """Queue many records at once, without per-record Python work where possible.

        ``values`` is a list of bytes/None, an Arrow binary array, or an Arrow table/batch
        with a ``value`` column and optional ``key``, ``headers`` and ``timestamp`` columns.
        Records are split into batches of about ``batch_size`` bytes: with keys each goes to
        its key's partition, without keys batches go round the partitions (sticky per batch).
        Returns one Future of the list of :class:`BatchMetadata` (one per batch, in order);
        its ``written()`` counts the records acknowledged, also when a batch failed.
        Each record counts against ``max_request_size`` as in :meth:`send` (the same error,
        before anything is queued), and no batch of several records passes ``batch_size``.
        """
        if self._closing:
            raise self._closed_error()
        if self._txn is not None:
            self._txn.require(TxnPhase.IN_TRANSACTION, action="send_batch()")
        table = as_table(values, keys, headers, timestamps)
        _check_topic(topic)
        try:
            chunks = self._queue_table(topic, table, partition)
        except StromError:
            self._stats.failed(topic, table.num_rows)  # record-error-total, as Kafka's
            raise
        if not chunks:
            done = BulkFuture([])
            done.set_result([])
            return done
        self._wake.set()
        return gather(chunks)

    def _queue_table(
        self, topic: str, table: pa.Table, partition: int | None
    ) -> list[ProducerBatch]:
        """send_batch()'s work: split ``table`` into batches and queue them (none for an empty
        table). Any StromError it raises has queued nothing, and send_batch() counts all the
        table's records as failed (record-error-total)."""
        if table.num_rows == 0:
            return []
        if partition is not None and (
            isinstance(partition, bool) or not isinstance(partition, int)
        ):
            raise TypeError(f"partition must be an int, got {partition!r}")
        n = self._counts.get(topic) or self._partition_count(topic)
        if partition is not None and not 0 <= partition < n:
            n = self._metadata.count_covering(topic, partition)  # new partitions, or raises
        groups: list[tuple[int, pa.Table]]
        if partition is not None:
            groups = [(partition, table)]
        elif "key" in table.schema.names and table.column("key").null_count < table.num_rows:
            groups = split_by_key(table, topic, n, self.partitioner)
        else:
            groups = [(-1, table)]
        chunks: list[ProducerBatch] = []
        topic_id = self._metadata.topic_id(topic)
        for p, t in groups:
            for chunk in table_chunks(
                t, self._batch_bytes(topic), self.max_request_size, self.buffer_memory
            ):
                if p < 0:
                    part = self._sticky.get(topic)
                    if part is None or part >= n:
                        part = random.randrange(n)
                    self._sticky[topic] = (part + 1) % n
                else:
                    part = p
                b = ProducerBatch(topic, part, chunk)
                b.topic_id = topic_id
                chunks.append(b)
        with self._lock:
            for b in chunks:
                if self._buffered + b.size > self.buffer_memory and self._buffered:
                    self._wait_for_space(b.size, _space_deadline(self.max_block_s))
                tp = (topic, b.partition)
                pq = self._queues.get(tp)
                if pq is None:
                    pq = self._queues[tp] = PartitionQueue(topic, b.partition)
                if pq.open is not None:
                    self._trim(pq.open)
                pq.add_closed(b)
                self._open.pop(tp, None)
                self._buffered += b.size  # == b.limit: a bulk batch reserves exactly its size
        return chunks
