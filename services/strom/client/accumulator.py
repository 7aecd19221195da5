"""The producer's record accumulator: open batches per partition, ready for the sender.

``send`` appends a record to its partition's open batch — three list appends and a few integer
updates, no encoding — and the sender thread encodes whole batches (Arrow, one call per batch)
when they are full, when ``linger_ms`` expired, or on ``flush``. Bulk input (``send_batch``)
arrives as Arrow columns and becomes batches without ever touching single records.

The sequence number of an idempotent batch is fixed when it is first encoded and kept across
retries, so a retry of an appended batch is recognised by the leader as a duplicate.
"""

from __future__ import annotations

import array
import time
from collections import deque
from typing import Any

import numpy as np
import pyarrow as pa

from strom.client.futures import BatchResult
from strom.record import encode_arrow, encode_batch, held

#: Bytes counted per record beyond key and value (offset/timestamp deltas, validity, framing).
RECORD_OVERHEAD = 16
#: Bytes of an encoded batch beyond its records (the 61-byte header and the Arrow framing: a
#: one-record batch encodes to ~670 bytes), with a margin for the request's own framing;
#: counted when batches fill a request, so that many tiny batches cannot make a request ten
#: times ``max_request_size`` (which a gRPC server with default limits refuses above 4 MiB).
BATCH_OVERHEAD = 704


class ProducerBatch:
    """Records bound for one partition, appended by ``send`` until the batch closes."""

    __slots__ = (
        "arrow",
        "attempts",
        "base_sequence",
        "closed",
        "count",
        "created",
        "encoded",
        "encoded_sequence",
        "has_keys",
        "headers",
        "keys",
        "limit",
        "max_size",
        "maybe_written",
        "partition",
        "result",
        "sent",
        "size",
        "timestamps",
        "topic",
        "topic_id",
        "values",
    )

    def __init__(self, topic: str, partition: int, arrow: pa.Table | None = None) -> None:
        self.topic = topic
        self.partition = partition
        #: The id the topic had in the producer's metadata when the batch was made ("" when
        #: unknown): a batch made for a topic since deleted and re-created under the same name
        #: is not the new topic's (SenderLoop._send_ready).
        self.topic_id = ""
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[Any] | None = None
        #: Create times in ms, as raw doubles: floats from the clock (floored when encoded)
        #: or ints given to send() (exact below 2**53). An array, not a list: no float
        #: object per record for the sender to read back from cold memory.
        self.timestamps: Any = array.array("d")
        self.has_keys = False
        self.size = 0
        #: Bytes of ``buffer_memory`` reserved for this batch (>= size; see Producer._make_room).
        self.limit = 0
        #: The batch closes before ``size`` passes this (the producer's batch_size, or less
        #: for a topic with a small max.message.bytes: Producer._batch_bytes).
        self.max_size = 1 << 62
        self.created = time.monotonic()
        self.closed = False
        self.arrow = arrow
        self.encoded: bytes | None = None
        #: (producer id, epoch, sequence) ``encoded`` carries: base_sequence may be renumbered
        #: after a failure, and a transactional producer's epoch bumped.
        self.encoded_sequence: tuple[int, int, int] | None = None
        self.base_sequence = -1
        self.attempts = 0
        self.count = 0
        #: Part of a request in flight right now.
        self.sent = False
        #: An attempt ended without proof that nothing was appended (no answer, an answer
        #: after the append, a retriable error not in sender._REFUSED_BEFORE_APPEND): it may
        #: be in the log. Such a batch fails as "may have been written" and its sequence is
        #: never given to another batch (Sequences._settle).
        self.maybe_written = False
        if arrow is not None:
            self.count = arrow.num_rows
            self.size = self.limit = arrow.nbytes + RECORD_OVERHEAD * arrow.num_rows
            self.closed = True
            stamps: Any
            if "timestamp" in arrow.schema.names:
                col = arrow.column("timestamp")
                if pa.types.is_timestamp(col.type):
                    col = col.cast(pa.timestamp("ms")).cast(pa.int64())
                stamps = col.to_numpy()
            else:
                now = time.time_ns() // 1_000_000
                stamps = np.full(arrow.num_rows, now, dtype=np.int64)
                self.arrow = arrow.append_column("timestamp", pa.array(stamps))
            self.timestamps = stamps
        self.result = BatchResult(topic, partition, self.timestamps)

    def add_headers(self, index: int, headers: Any) -> None:
        """Record ``index``'s headers (the list exists only once some record has headers)."""
        if self.headers is None:
            self.headers = [None] * index
        self.headers.append(headers)

    def encode(
        self,
        compression: str,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool = False,
    ) -> bytes:
        """The batch's wire bytes (cached; re-encoded only if the identity changes)."""
        identity = (producer_id, producer_epoch, base_sequence)
        if self.encoded is not None and self.encoded_sequence == identity:
            return self.encoded
        options = dict(
            compression=compression,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional,
        )
        if self.arrow is not None:
            self.encoded = encode_arrow(self.arrow, **options)
        else:
            self.encoded = encode_batch(
                self.values,
                keys=self.keys if self.has_keys else None,
                headers=self.headers,
                timestamps=held.as_int64(np.frombuffer(self.timestamps, dtype=np.float64)),
                **options,
            )
        self.encoded_sequence = identity
        return self.encoded


class PartitionQueue:
    """A partition's batches in sequence order, oldest first (in-flight ones at the front)."""

    __slots__ = (
        "batches",
        "in_flight",
        "last_error",
        "next_sequence",
        "open",
        "partition",
        "producer_epoch",
        "producer_id",
        "reseq_from",
        "retry_at",
        "retrying",
        "topic",
        "unresolved",
        "unresolved_seq",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.batches: deque[ProducerBatch] = deque()
        self.open: ProducerBatch | None = None
        #: Requests for this partition awaiting an answer.
        self.in_flight = 0
        #: Set after an error: drain in-flight requests, then resend from the oldest batch.
        self.retrying = False
        self.retry_at = 0.0
        #: Why the last attempt was retried (named when the batches finally expire).
        self.last_error: str | None = None
        self.next_sequence = 0
        #: After a batch failed for good: the sequence the batches behind it restart from.
        self.reseq_from: int | None = None
        #: The producer id and epoch this partition's sequences belong to (-1: none yet). Each
        #: partition keeps its own until it has to renumber under a new epoch (Kafka's
        #: per-partition producer id and epoch): a bump for one partition leaves the others'
        #: retries, which may be in the log, under the identity they were sent with.
        self.producer_id = -1
        self.producer_epoch = -1
        #: A batch that may be in the log failed (or the leader refused our oldest batch for
        #: a gap): the sequences sent so far must never be given to other batches. Settled
        #: by an acknowledgement of a later sequence (the leader appends only in sequence, so
        #: everything before it is in the log), else by renumbering under a new epoch.
        self.unresolved = False
        #: The last sequence of the newest such batch (-1: no acknowledgement settles it).
        self.unresolved_seq = -1

    def new_batch(self) -> ProducerBatch:
        if self.open is not None:
            self.open.closed = True
        b = ProducerBatch(self.topic, self.partition)
        self.batches.append(b)
        self.open = b
        return b

    def add_closed(self, batch: ProducerBatch) -> None:
        """Queue a pre-built (bulk) batch behind what is already there."""
        if self.open is not None:
            self.open.closed = True
            self.open = None
        self.batches.append(batch)

    def close_open(self) -> None:
        if self.open is not None:
            self.open.closed = True
            self.open = None
