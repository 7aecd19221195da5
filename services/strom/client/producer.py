"""The Producer: ``send`` appends to per-partition batches; one sender thread ships them.

Conventions follow kafka-python / confluent-kafka (``acks``, ``linger_ms``, ``batch_size``,
``buffer_memory``, ``max_block_ms``, ``delivery_timeout_ms`` …) so users feel at home. How it
works, and why:

- ``send`` does as little as possible on the caller's thread (pick a partition, append three
  list items, return a lazy future; see :mod:`strom.client.futures`): that is what lets one
  Python thread hand over about a million records per second.
- The sender thread closes batches when they are full, when ``linger_ms`` has passed, or on
  ``flush``; encodes each batch once (Arrow, one call per batch); sends one Produce request
  per node that has a ready partition, holding every partition of that node with records
  waiting (up to ``max_in_flight`` requests per node); and completes the batch's futures
  from the response. Requests go on one ``ProduceStream`` per node
  (:mod:`strom.client.streams`: about half the node's CPU of a unary call per request, and
  answers in request order), or as unary calls to a node without it (an older version).

The sender thread's rules (Nagle's rule for batches, idempotence and retries, batches that
"may have been written", topics deleted and re-created under a producer) are told in
:mod:`strom.client.sender`, whose :class:`~strom.client.sender.SenderLoop` the Producer mixes
in; ``send_batch``'s Arrow side (tables, grouping by key, cutting by size) is in
:mod:`strom.client.bulk`, and the checks both make of a record in
:mod:`strom.client.record_checks`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from strom.client import forks
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.bulk import (
    BatchMetadata,
    BulkFuture,
    as_table,
    gather,
    split_by_key,
    table_chunks,
)
from strom.client.cluster import ClusterClient
from strom.client.downgrades import Downgrades
from strom.client.futures import FutureRecordMetadata
from strom.client.kwnames import bool_option, kafka_keywords
from strom.client.partitioner import murmur2
from strom.client.produce_answers import RETRY_LOG_INTERVAL_S, request_too_large
from strom.client.record_checks import Partitioner

# send() (the measured hot path) is kept as it was, calling these by their former names.
from strom.client.record_checks import checked_pick as _checked_pick
from strom.client.record_checks import record_headers as _headers
from strom.client.record_checks import record_too_large as _record_too_large
from strom.client.sender import SenderLoop
from strom.client.spin import SpinKeeper
from strom.client.stats import ProducerStats
from strom.client.streams import RequestStream
from strom.client.transactions import (
    GroupMetadata,
    PreparedTxnState,
    TransactionManager,
    TxnPhase,
)
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import (
    BrokerNotAvailableError,
    InvalidRequestError,
    InvalidTxnStateError,
    ProducerCallbackError,
    ProducerClosedError,
    RequestTimedOutError,
    StromError,
)
from strom.grpc_options import MAX_BATCH_BYTES
from strom.lograte import LogLimiter
from strom.record import codecs
from strom.security.channel import client_security

__all__ = [
    "NO_WAIT",
    "BatchMetadata",
    "BulkFuture",
    "Partitioner",
    "Producer",
    "ProducerCallbackError",
    "ProducerClosedError",
    "WouldBlockError",
    "request_too_large",
    "space_wait_until",
]

_ACKS = {"all": -1, "-1": -1, -1: -1, 1: 1, "1": 1, 0: 0, "0": 0}


_client_ids = itertools.count(1)

#: key -> its murmur2 made positive (the partition is that modulo the count), for ``send``:
#: a dict lookup costs a keyed record ~40 ns less than the lru_cache above. Shared by all
#: producers (a key hashes the same everywhere); emptied when it grows past ``_KEY_HASHES``.
_key_hashes: dict[bytes, int] = {}
_KEY_HASHES = 1 << 16


def _hash_key(key: bytes) -> int:
    if len(_key_hashes) >= _KEY_HASHES:
        _key_hashes.clear()
    h = _key_hashes[key] = murmur2(key) & 0x7FFFFFFF
    return h


def _to_bytes(x: Any, what: str, serializer: Callable[[Any], bytes] | None) -> bytes | None:
    if x is None:
        return None
    if serializer is not None:
        x = serializer(x)
        if x is None:
            return None
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, bytearray | memoryview):
        return bytes(x)
    raise TypeError(
        f"{what} must be bytes, str or None (or give a {what}_serializer), got {type(x).__name__}"
    )


class Producer(SenderLoop):
    """Sends records to strom topics; thread-safe; use as a context manager or ``close()``."""

    @kafka_keywords
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        acks: int | str = "all",
        linger_ms: float = 5,
        batch_size: int = 256 * 1024,
        buffer_memory: int = 64 * 1024 * 1024,
        compression: str | None = "none",
        enable_idempotence: bool | None = None,
        retries: int = 2**31 - 1,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        max_in_flight: int = 5,
        max_block_ms: int = 60_000,
        max_request_size: int = 4 * 1024 * 1024,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        metadata_max_age_ms: int = 300_000,
        partitioner: Partitioner | None = None,
        key_serializer: Callable[[Any], bytes] | None = None,
        value_serializer: Callable[[Any], bytes] | None = None,
        client_id: str | None = None,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        token: str | None = None,
    ) -> None:
        if enable_idempotence is not None:
            enable_idempotence = bool_option("enable_idempotence", enable_idempotence)
        if acks not in _ACKS:
            raise ValueError(f"acks must be 'all', 1 or 0, got {acks!r}")
        self.acks = _ACKS[acks]
        if transactional_id is not None and (self.acks != -1 or enable_idempotence is False):
            raise ValueError(
                "a transactional producer needs acks='all' and enable_idempotence=True"
            )
        # Kafka's rule: idempotence needs acks='all'. With acks=1 a record the leader
        # acknowledged can be lost in a leader change, and the partition's sequence numbers
        # cannot go on after such a gap: every later batch was refused OUT_OF_ORDER_SEQUENCE
        # for good (found from outside). By default it is on exactly when acks='all'.
        if enable_idempotence and self.acks != -1:
            raise ValueError(
                f"enable_idempotence=True needs acks='all' (got acks={acks!r}): with fewer "
                "acknowledgements a leader change can lose acknowledged records and the "
                "producer's sequence numbers could not continue; leave enable_idempotence "
                "unset (it is then on with acks='all' only) or set it to False"
            )
        if compression is None:
            compression = "none"
        try:
            codecs.codec_id(compression)
        except (ValueError, KeyError) as exc:
            raise ValueError(
                f"unknown compression {compression!r}: use none, gzip, snappy, lz4 or zstd"
            ) from exc
        # Types are checked here, once, so that send() need not (found from outside:
        # linger_ms="5" failed with a bare "'<' not supported", batch_size=True was taken).
        for name, v, minimum in (
            ("batch_size", batch_size, 1),
            ("buffer_memory", buffer_memory, 1),
            ("max_in_flight", max_in_flight, 1),
            ("max_request_size", max_request_size, 1),
            ("delivery_timeout_ms", delivery_timeout_ms, 1),
            ("request_timeout_ms", request_timeout_ms, 1),
            ("metadata_max_age_ms", metadata_max_age_ms, 1),
            ("transaction_timeout_ms", transaction_timeout_ms, 1),
            ("max_block_ms", max_block_ms, 0),
            ("retries", retries, 0),
            ("retry_backoff_ms", retry_backoff_ms, 0),
            ("retry_backoff_max_ms", retry_backoff_max_ms, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {v!r}")
            if v < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {v}")
        if max_request_size > MAX_BATCH_BYTES:
            # FIX (found from outside): any size was taken, so records the cluster could not
            # carry (over the gRPC limit) or its readers could not read were sent; and as
            # sizes count records uncompressed (as Kafka's), this also bounds what a batch
            # decompresses to (a 300 MiB record of zeros was ~10 KiB zstd on the wire).
            raise ValueError(
                f"max_request_size must be <= {MAX_BATCH_BYTES} (the largest batch a strom "
                f"Fetch answer can carry), got {max_request_size}"
            )
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, int | float):
            raise TypeError(f"linger_ms must be a number (ms), got {linger_ms!r}")
        if not 0 <= linger_ms < math.inf:
            raise ValueError(f"linger_ms must be >= 0 and finite, got {linger_ms}")
        self.compression = compression
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.idempotent = self.acks == -1 and enable_idempotence is not False
        self.retries = retries
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.max_in_flight = max_in_flight
        self.max_block_s = max_block_ms / 1000
        self.max_request_size = max_request_size
        #: The largest record send() takes: one comparison on its per-record path.
        self._record_limit = min(max_request_size, buffer_memory)
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.retry_backoff_max_s = retry_backoff_max_ms / 1000
        #: Every topic's metadata is looked up again this often (Kafka's metadata.max.age.ms),
        #: so partitions added to a topic get keyed records without a restart.
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self._metadata_due = time.monotonic() + self.metadata_max_age_s
        self.partitioner = partitioner
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self.client_id = client_id or f"strom-producer-{next(_client_ids)}"
        forks.track(self)
        #: Sent with every Produce: the nodes count bytes per client id (metrics).
        self._client_md = (("strom-client-id", self.client_id),)
        self._client = ClusterClient(
            bootstrap,
            retry_s=max(self.max_block_s, 0.1),
            security=client_security(ssl_cafile, ssl_certfile, ssl_keyfile, token),
            retry_backoff_s=self.retry_backoff_s,
            retry_backoff_max_s=self.retry_backoff_max_s,
        )
        #: Partition counts and leaders (strom.client.metadata); ``_counts`` and ``_leaders``
        #: are its live dicts, so ``send`` pays one dict lookup.
        self._metadata = self._client.cache
        #: The transaction state of a transactional producer (None otherwise).
        self._txn: TransactionManager | None = None
        if transactional_id is not None:
            self._txn = TransactionManager(
                self._client,
                transactional_id,
                transaction_timeout_ms,
                request_timeout_s=self.request_timeout_s,
                retry_backoff_s=self.retry_backoff_s,
            )
        self._txn_failed: StromError | None = None
        #: A transaction() block's abort failed: the next block does it first.
        self._block_abort_failed = False
        #: The AddPartitionsToTxn in flight (at most one, on a thread of its own: see
        #: _add_to_transaction), its partitions and the transaction it was sent for.
        self._add_future: Future[None] | None = None
        self._adding: frozenset[tuple[str, int]] = frozenset()
        self._adding_generation = -1

        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._space_waiters = 0
        self._buffered = 0
        self._queues: dict[tuple[str, int], PartitionQueue] = {}
        self._open: dict[tuple[str, int], ProducerBatch] = {}  # batches still taking records
        self._serializers = key_serializer is not None or value_serializer is not None
        self._sticky: dict[str, int] = {}
        self._counts = self._metadata.counts  # topic -> partition count
        self._leaders = self._metadata.leaders  # (topic, partition) -> PartitionLeader
        self._in_flight: dict[str, int] = {}
        #: The thread looking up stale topics' leaders, if one runs (the sender never does).
        self._refresher: threading.Thread | None = None
        self._drain_start: dict[str, int] = {}  # address -> where its next drain starts
        self._produce_calls: dict[str, Any] = {}  # address -> raw-bytes Produce callable
        #: address -> its ProduceStream (strom.client.streams); nodes without: unary calls.
        self._streams: dict[str, RequestStream] = {}
        #: Produce requests in flight, oldest first, watched for a hung leader (the
        #: sender's ``_overdue``); the sender thread's alone.
        self._outstanding: dict[Any, None] = {}
        self._unary_only = Downgrades()
        self._spin = SpinKeeper()  # gRPC's completion thread stays up between requests
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._fatal: StromError | None = None
        self._producer_id = -1
        self._producer_epoch = -1
        #: A partition must renumber under a new epoch (an idempotent producer's; see _settle).
        self._bump_wanted = False
        #: Asked first for the bump: the leader of a partition that wants it, which has just
        #: answered (the sender waits for the call; a node that is paused would hold it).
        self._bump_via: str | None = None
        self._bump_retry_at = 0.0
        #: (partition, batches) _settle failed while holding the lock (a transactional
        #: producer that needs a new epoch); failed right after.
        self._epoch_victims: list[tuple[PartitionQueue, list[ProducerBatch]]] = []
        self._wake = threading.Event()
        self._completions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: Threads inside _fail_all (delivery callbacks run there too).
        self._failing_threads: set[int] = set()
        #: Which partitions' retries are due a WARNING line (ProduceAnswers._log_retry).
        self._retry_lines = LogLimiter(RETRY_LOG_INTERVAL_S)
        #: metrics(): counted by the sender thread, per request and per batch.
        self._stats = ProducerStats()
        self._sender = threading.Thread(target=self._run, name="strom-producer", daemon=True)
        self._sender.start()

    # -- public API ------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[tuple[str | bytes, Any]] | Mapping[str | bytes, Any] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callable[[Any, BaseException | None], object] | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; returns a Future of its :class:`RecordMetadata`.

        Without ``partition``, a custom ``partitioner`` (given to the constructor) is called
        as ``partitioner(key_bytes, partition_count)`` and must return an int in
        ``[0, partition_count)``; any other answer raises TypeError/ValueError here, with
        nothing queued (kafka-python's partitioners take ``(key_bytes, all_partitions,
        available_partitions)`` instead).

        ``callback(metadata, exception)`` (one of them None) runs on the producer's thread
        when the record is acknowledged or failed, before its future completes (so
        :meth:`flush` returns after it has run). ``headers`` are (str, bytes) pairs or a
        mapping; a bytes key is read as UTF-8. Blocks up to ``max_block_ms`` when the
        topic's metadata is not known yet, when ``partition`` was added so recently that the
        nodes have not learnt it yet (a partition the controller does not have either fails
        at once), or when the buffer is full.
        """
        # The hot path: every line here is paid once per record (see the module docstring).
        if self._closing:
            raise self._closed_error()
        txn = self._txn
        if txn is not None and txn.phase is not TxnPhase.IN_TRANSACTION:
            txn.require(TxnPhase.IN_TRANSACTION, action="send()")  # raises the right error
        if (value is not None and type(value) is not bytes) or self._serializers:
            value = _to_bytes(value, "value", self.value_serializer)
        if key is not None and (type(key) is not bytes or self._serializers):
            key = _to_bytes(key, "key", self.key_serializer)
        n = self._counts.get(topic)
        if n is None:
            n = self._topic_partitions(topic)
        if partition is None:
            if self.partitioner is not None:
                partition = self.partitioner(key, n)
                if type(partition) is not int or not 0 <= partition < n:
                    partition = _checked_pick(self.partitioner, partition, topic, n)
            elif key is not None:
                try:
                    partition = _key_hashes[key] % n
                except KeyError:
                    partition = _hash_key(key) % n
            else:
                partition = self._sticky.get(topic)
                if partition is None or partition >= n:
                    partition = self._sticky[topic] = random.randrange(n)
        elif type(partition) is not int or not 0 <= partition < n:
            if type(partition) is not int:
                raise TypeError(f"partition must be an int, got {partition!r}")
            n = self._covering(topic, partition)  # new partitions, or raises
        size = 16 if value is None else len(value) + 16  # RECORD_OVERHEAD
        if key is not None:
            size += len(key)
        if headers:
            headers = _headers(headers)
            size += sum(len(h.encode()) + len(v or b"") for h, v in headers)  # UTF-8 bytes
        else:
            headers = None
        if size > self._record_limit:
            raise self._refused(
                topic, 1, _record_too_large(size, self.max_request_size, self.buffer_memory)
            )
        if timestamp_ms is None:
            stamp: float | int = _time() * 1000.0  # ms; floored when encoded (a float is cheaper)
        else:
            stamp = _check_timestamp(timestamp_ms)
        wake = False
        lock = self._lock
        lock.acquire()  # not `with`: half the cost, paid per record
        try:
            b = self._open.get((topic, partition))
            if b is None or b.size + size > b.limit:  # full, or its buffer_memory used up
                b = self._make_room(topic, partition, size)
                wake = not b.count
            index = b.count
            b.count = index + 1
            b.values.append(value)
            b.keys.append(key)
            b.timestamps.append(stamp)
            if key is not None:
                b.has_keys = True
            if headers is not None or b.headers is not None:
                b.add_headers(index, headers)
            b.size += size
            if b.size + size > b.max_size:  # full: the next record like this won't fit
                self._close_open(topic, partition)
                wake = True
                if key is None and partition == self._sticky.get(topic) and n > 1:
                    self._sticky[topic] = (partition + random.randrange(1, n)) % n
        finally:
            lock.release()
        if wake:
            self._wake.set()
        if callback is not None:
            self._on_delivery(b.result, index, callback)
        # FutureRecordMetadata(b.result, index) without a Python __init__ frame (60 ns a record)
        future = _new_object(FutureRecordMetadata)
        future._batch = b.result
        future._index = index
        return future

    @staticmethod
    def _on_delivery(
        result: Any, index: int, callback: Callable[[Any, BaseException | None], object]
    ) -> None:
        def done() -> None:
            err = result.error_of(index)
            callback(None if err else result.metadata(index), err)

        result.on_delivery(done)  # runs before the record's future is done (BatchResult)

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
            # (found from outside: partition="1" failed with a bare "'<=' not supported")
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

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far and wait until it is acknowledged or failed, and
        every delivery callback (``send(callback=...)``) of those records has run.

        Not from inside a delivery callback: callbacks run on the thread that delivers the
        records, which cannot wait for itself, so this raises :class:`ProducerCallbackError`
        at once there instead of hanging."""
        if self._forked_from:
            raise forks.error(self)
        self._refuse_in_callback("flush()")
        with self._lock:
            pending = [b.result for pq in self._queues.values() for b in pq.batches]
            self._flushing += 1
        self._wake.set()
        try:
            end = None if timeout is None else time.monotonic() + timeout
            for r in pending:
                left = None if end is None else max(end - time.monotonic(), 0)
                if not r.wait_callbacks(left):
                    raise RequestTimedOutError(f"flush did not finish within {timeout} s")
        finally:
            with self._lock:
                self._flushing -= 1

    def _delivering(self) -> bool:
        """Whether this thread delivers this producer's records: the sender thread, or one
        failing them all (``close()``), where delivery callbacks run."""
        return (
            threading.current_thread() is self._sender
            or threading.get_ident() in self._failing_threads
        )

    def _refuse_in_callback(self, action: str) -> None:
        if self._delivering():
            raise ProducerCallbackError(
                f"{action} cannot be called from a delivery callback: callbacks run on the "
                "thread that delivers the records, which would wait for itself; flush from "
                "another thread (or close() the producer, which does not wait there)"
            )

    # -- transactions (DESIGN §6; strom.client.transactions) --------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register the ``transactional_id`` with its coordinator: get the producer id and a
        new epoch, which fences any older producer with the same id; a transaction such a
        producer left open is aborted first. Call once, before the first transaction: after a
        failed transaction ``abort_transaction()`` is all it takes to go on (it gets a new
        epoch itself when a batch failed)."""
        txn = self._require_txn()
        self._adopt(*txn.init(self.max_block_s if timeout is None else timeout))

    def _adopt(self, pid: int, epoch: int) -> None:
        """A transactional producer's new producer id and epoch (init_transactions(), or an
        abort that took the id back): every partition numbers from 0 again."""
        with self._lock:
            self._producer_id, self._producer_epoch = pid, epoch
            for pq in self._queues.values():  # a new epoch numbers from 0 again
                pq.next_sequence = 0
                pq.reseq_from = None
                pq.producer_id, pq.producer_epoch = pid, epoch
                pq.unresolved = False
                pq.unresolved_seq = -1

    def begin_transaction(self) -> None:
        """Start a transaction: records sent until commit/abort belong to it. Local, except
        after an abort that did not finish: an abort that got no answer is asked again
        first, and so is the new epoch the abort of a transaction with a failed batch asks
        for (up to ``max_block_ms``)."""
        txn = self._require_txn()
        if txn.pending_end is False:  # (an abort that got no answer: see TransactionManager)
            txn.end(False, self.max_block_s)
        if txn.epoch_bump_required and txn.phase is TxnPhase.READY:
            self._adopt(*txn.bump_epoch(self.max_block_s))
        txn.begin(self.max_block_s)
        self._txn_failed = None

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group_metadata: GroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer group's offsets as part of the transaction (the
        consume-transform-produce pattern): they become the group's committed offsets only
        if the transaction commits. ``group_metadata`` is ``consumer.group_metadata()``, so
        a consumer that was fenced out of its group cannot commit. A group id string is
        taken too (Kafka's older form): the coordinator takes it only while the group has no
        members (NON_EMPTY_GROUP otherwise), since it cannot tell a fenced member apart."""
        if isinstance(group_metadata, str):
            group_metadata = GroupMetadata(group_metadata)
        elif not isinstance(group_metadata, GroupMetadata):
            raise TypeError(
                "group_metadata must be consumer.group_metadata() or a group id, not "
                f"{type(group_metadata).__name__}"
            )
        self._require_txn().send_offsets(
            offsets, group_metadata, self.max_block_s if timeout is None else timeout
        )

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send everything, then commit: the records and offsets of the transaction become
        visible to read_committed consumers, all or nothing.

        Raises the error that made the transaction fail (call :meth:`abort_transaction`), or
        :class:`~strom.errors.ProducerFencedError` when a newer instance took over (close
        this producer). When the commit got no answer in time (:class:`~strom.errors.
        RequestTimedOutError`, a broken connection) it may still be committed: call
        ``commit_transaction()`` again, which asks once more (an abort is refused then).

        Returns within ``timeout`` (``max_block_ms`` when None): when the transaction's
        records were not all sent by then (a partition waiting to be added by
        AddPartitionsToTxn to a coordinator that does not answer, or for its leader), it
        raises :class:`~strom.errors.RequestTimedOutError` saying so, and the transaction
        is neither committed nor failed: ``commit_transaction()`` again goes on from there
        (Kafka's rule for a commitTransaction() that timed out), ``abort_transaction()``
        aborts it."""
        txn = self._require_txn()
        if txn.pending_end is True:
            txn.end(True, self.max_block_s if timeout is None else timeout)
            return
        txn, end = self._flush_transaction("commit_transaction()", timeout, resumable=True)
        txn.end(True, max(end - time.monotonic(), 0.001))

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Send everything of the open transaction and hand it over undecided (the first
        phase of a two-phase commit, Kafka's KIP-939): the returned state lets another
        process commit or abort it with
        :func:`~strom.client.transactions.complete_prepared_transaction`. This producer is
        done with transactions then; :meth:`close` leaves the prepared transaction open. If
        nobody completes it, it is aborted when ``transaction_timeout_ms`` passes or a new
        instance of the transactional id calls :meth:`init_transactions`.

        Raises the error that made the transaction fail (call :meth:`abort_transaction`)."""
        txn, _ = self._flush_transaction("prepare_transaction()", timeout)
        with txn.lock:
            txn.phase = TxnPhase.PREPARED
        return PreparedTxnState(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, empty=not txn.started
        )

    def _flush_transaction(
        self, action: str, timeout: float | None, *, resumable: bool = False
    ) -> tuple[TransactionManager, float]:
        """The first step of ending a transaction: send everything; raises the error that
        made the transaction fail. Returns the manager and the call's deadline.

        ``resumable`` (a commit): a flush that did not end in time leaves the transaction
        COMMITTING, not failed, and the same call again goes on from there. FIX (found from
        outside): commit_transaction(timeout) while a partition waited for a coordinator
        that did not answer failed the transaction (abortable) when the flush timed out,
        though nothing had gone wrong but the wait."""
        txn = self._require_txn()
        resuming = resumable and txn.phase is TxnPhase.COMMITTING and txn.pending_end is None
        if not resuming:
            txn.require(TxnPhase.IN_TRANSACTION, action=action)
        budget = self.max_block_s if timeout is None else timeout
        end = time.monotonic() + budget
        with txn.lock:
            txn.phase = TxnPhase.COMMITTING
        try:
            self.flush(max(end - time.monotonic(), 0))
        except RequestTimedOutError as exc:
            if not resumable or txn.phase is not TxnPhase.COMMITTING:
                txn.fail(exc)
            else:
                raise RequestTimedOutError(
                    f"{action} did not finish within {budget:.1f} s: records of the "
                    "transaction were still being sent (a partition waiting to be added to it "
                    "by AddPartitionsToTxn, or for its leader); it is not committed: call "
                    f"{action} again to go on, or abort_transaction()"
                ) from None
        except StromError as exc:
            txn.fail(exc)
        if txn.phase is not TxnPhase.COMMITTING:
            assert txn.error is not None
            raise txn.error
        return txn, end

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: its records stay invisible to read_committed consumers
        and its offsets are dropped. Records still queued are sent first (they are part of
        the aborted transaction either way), within ``timeout``; those of partitions the
        transaction coordinator has not added by then fail, never sent. Returns within
        ``timeout`` (``max_block_ms`` when None), or raises
        :class:`~strom.errors.RequestTimedOutError` saying what it waited for (the records,
        or the coordinator's answer): calling ``abort_transaction()`` (or
        ``begin_transaction()``) again goes on.

        When a batch of the transaction failed (it may have been written, or its sequence was
        refused), the abort then asks the coordinator for a new epoch of the same producer id
        (Kafka's KIP-360 bump), under which every partition numbers from 0: the next
        transaction goes on, with no ``init_transactions()``. A newer instance of the
        transactional id still fences this one (:class:`~strom.errors.ProducerFencedError`)."""
        self._abort_transaction(timeout, bump=True)

    def _abort_transaction(self, timeout: float | None, *, bump: bool) -> None:
        """:meth:`abort_transaction`; ``bump=False`` (close()) leaves out the new epoch, which
        only a further transaction needs."""
        txn = self._require_txn()
        if txn.phase is TxnPhase.FATAL_ERROR:
            txn.require(TxnPhase.IN_TRANSACTION, action="abort_transaction()")  # raises it
        if txn.pending_end is True:
            raise InvalidTxnStateError(
                "cannot abort_transaction(): the previous commit_transaction() got no answer "
                "and may have committed; call commit_transaction() again"
            )
        budget = self.max_block_s if timeout is None else timeout
        end = time.monotonic() + budget
        if txn.pending_end is False:  # the previous abort got no answer: ask again
            txn.end(False, budget)
        elif not (txn.phase is TxnPhase.READY and txn.epoch_bump_required):
            self._abort_open(txn, timeout, end)
        if bump and txn.epoch_bump_required:  # (aborted: only the new epoch is left to get)
            self._adopt(*txn.bump_epoch(max(end - time.monotonic(), 0.001)))

    def _abort_open(self, txn: TransactionManager, timeout: float | None, end: float) -> None:
        """Abort the open (or failed) transaction by ``end``: flush, then EndTxn (or, when
        the epoch was bumped past ours, take the id back: KIP-588)."""
        txn.require(
            TxnPhase.IN_TRANSACTION,
            TxnPhase.ABORTABLE_ERROR,
            TxnPhase.COMMITTING,
            action="abort_transaction()",
        )
        with txn.lock:
            txn.phase = TxnPhase.ABORTING
        flushed = True
        try:
            self.flush(max(end - time.monotonic(), 0))
        except RequestTimedOutError:
            flushed = False
        except StromError:
            pass  # (refused from a delivery callback, say: the abort goes on without it)
        # Batches of partitions still not added never go (an AddPartitionsToTxn in flight is
        # not waited for past the flush: the coordinator may hang), as Kafka's
        # abortUndrainedBatches; one answered later marks nothing (TransactionManager).
        with self._lock:
            queued = list(self._queues)
        self._fail_unadded([tp for tp in queued if tp not in txn.added], self._unadded_error(txn))
        if not flushed:
            self._abort_unfinished(txn, timeout)
        if txn.bump_needed:  # the epoch was bumped past ours: ask for the id back (KIP-588)
            back = txn.recover(max(end - time.monotonic(), 0.001))
            if back is not None:
                self._adopt(*back)
            return
        txn.end(False, max(end - time.monotonic(), 0.001))

    def _abort_unfinished(self, txn: TransactionManager, timeout: float | None) -> None:
        """An abort whose flush did not end in its time (a partition waits to be added to
        the transaction, or for its leader): the coordinator is not asked yet (no time is
        left for it), and the transaction stays abortable so that the next
        ``abort_transaction()`` goes on from here; raises saying so."""
        budget = self.max_block_s if timeout is None else timeout
        error = RequestTimedOutError(
            f"abort_transaction() did not finish within {budget:.1f} s: records of the "
            "transaction were still being sent (a partition waiting to be added to it by "
            "AddPartitionsToTxn, or for its leader), so the transaction coordinator has not "
            "been asked to abort it yet; call abort_transaction() again"
        )
        with txn.lock:
            if txn.phase is TxnPhase.ABORTING:
                txn.phase = TxnPhase.ABORTABLE_ERROR
                txn.error = txn.error or error
        raise error

    @contextlib.contextmanager
    def transaction(self, timeout: float | None = None) -> Iterator[Producer]:
        """``with producer.transaction(): ...`` begins a transaction, commits it when the
        block ends, and aborts it (re-raising) when the block raises or the commit fails (a
        send that failed surfaces at the commit).

        A commit that got no answer is never aborted (it may have committed): the block asks
        the coordinator again until it answers, for up to ``transaction_timeout_ms``, so
        that leaving the block with an error means the transaction did not commit (rewind
        and go on) — or, when no answer came at all,
        :class:`~strom.errors.TransactionOutcomeUnknownError` (close the producer).

        A block's abort that failed (no answer within ``timeout``) is done again when the
        next block begins (raising, as an abortable error out of that block, while it still
        fails)."""
        self._finish_block_abort(timeout)
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            self._abort_block(timeout)
            raise
        self._commit_block(timeout)

    def _abort_block(self, timeout: float | None) -> None:
        """A ``transaction()`` block raised: abort (its own error is not the caller's; one
        that fails is left to the next block: :meth:`_finish_block_abort`)."""
        try:
            self.abort_transaction(timeout)
        except StromError:
            self._block_abort_failed = True

    def _finish_block_abort(self, timeout: float | None) -> None:
        """Before a block begins: abort what the last block's abort left open. FIX (found
        from outside): a block whose abort timed out while it was still sending (a hung
        transaction coordinator) left the transaction in its abortable error, the block's
        abort error swallowed; every later block was refused "cannot begin_transaction()
        while abortable error" at once, for ever, and the README's loop spun without end
        though the coordinator had come back (Kafka's loop calls abortTransaction() in its
        catch, and goes on)."""
        if not self._block_abort_failed:
            return
        txn = self._txn
        if (
            txn is not None
            and txn.pending_end is not True
            and txn.phase
            in (TxnPhase.ABORTABLE_ERROR, TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING)
        ):
            self.abort_transaction(timeout)  # raises while it still fails: the flag stays
        self._block_abort_failed = False

    def _commit_block(self, timeout: float | None) -> None:
        """A ``transaction()`` block ended: commit, settling a commit that got no answer."""
        try:
            try:
                self.commit_transaction(timeout)
            except StromError:
                txn = self._txn
                if txn is None or txn.pending_end is not True:
                    raise
                # Found from outside: a commit that timed out left the block with an error
                # the README's loop took as abortable: it rewound, and every later
                # begin_transaction() was refused (the commit was pending). Asked again
                # here, the error out of the block means "not committed" again.
                txn.settle_commit(
                    self.max_block_s if timeout is None else timeout, txn.timeout_ms / 1000
                )
        except StromError:
            # (found from outside: the failed transaction stayed open, holding read_committed
            # readers until its timeout; a commit whose records were not all sent in time is
            # left COMMITTING, and is aborted too: the block's error means "not committed")
            txn = self._txn
            if (
                txn is not None
                and txn.pending_end is not True
                and txn.phase in (TxnPhase.ABORTABLE_ERROR, TxnPhase.COMMITTING)
            ):
                self._abort_block(timeout)
            raise

    def _require_txn(self) -> TransactionManager:
        if self._txn is None:
            raise InvalidTxnStateError("this producer has no transactional_id")
        if self._closing:
            raise self._closed_error()
        return self._txn

    def _closed_error(self) -> StromError:
        """Why a closed producer refuses a call: closed, or made in the parent of this
        forked process (strom.client.forks)."""
        if self._forked_from:
            return forks.error(self)
        return ProducerClosedError("the producer is closed")

    def _after_fork(self) -> None:
        """In a forked child (strom.client.forks): the sender thread and the connections are
        the parent's, so every call is refused (``send`` tests ``_closing`` anyway)."""
        self._closing = True

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the sender and release connections, within ``timeout`` seconds in all.
        Records still unsent then fail with :class:`ProducerClosedError`; records sent but
        not yet acknowledged fail with :class:`RequestTimedOutError`: they may have been
        written (retrying them may duplicate). An open transaction is aborted first, as is
        one that failed (abortable error); a commit that got no answer is left to its
        coordinator.

        From a delivery callback it closes at once, as ``close(0)`` (as Kafka's Java client
        does on its I/O thread): the callback runs on the thread that delivers the records,
        which can neither wait for them nor for itself (found from outside: it raised
        "cannot join current thread", swallowed, and left the producer half-closed)."""
        if self._closed:
            return
        if self._forked_from:  # the threads and connections are the parent's: nothing to do
            self._closed = True
            return
        own = self._delivering()
        if own:
            timeout = 0
        # One deadline for every step (found from outside: close(timeout=2) took 4 s).
        end = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if end is None else max(end - time.monotonic(), 0.0)

        txn = self._txn
        if (
            txn is not None
            and txn.pending_end is not True
            and (txn.in_transaction or txn.phase is TxnPhase.ABORTABLE_ERROR)
            and not txn.bump_needed  # (aborted already, by whoever bumped the epoch)
        ):
            with contextlib.suppress(StromError):
                self._abort_transaction(left(), bump=False)
        if not own:
            with contextlib.suppress(StromError):
                self.flush(left())
        self._closing = True
        if txn is not None:
            txn.closed.set()  # (an AddPartitionsToTxn still retrying gives up)
        self._wake.set()
        if threading.current_thread() is not self._sender:
            self._sender.join(left())
        self._closed = True
        # Found from outside: records in flight were reported "never sent", then appended
        # once the leader answered again; a user retrying them wrote them twice.
        self._fail_all(
            ProducerClosedError("the producer was closed before the record was sent"),
            in_flight=RequestTimedOutError(
                "the producer was closed while the record was in flight, before any answer: "
                "it may have been written"
            ),
        )
        for stream in list(self._streams.values()):
            stream.cancel()
        self._spin.close()
        self._client.close()

    def metrics(self) -> dict[str, float]:
        """The producer's metrics, by Kafka's names where the meaning is the same
        (``record-send-total``, ``request-latency-avg``, ``buffer-available-bytes`` ...;
        per topic as ``"record-send-total{topic=t}"``): docs/client-metrics.md lists them.
        Rates, averages and maxima cover the last 30-60 s (NaN: nothing in that window).
        Counted per batch and per request on the sender thread, so it costs ``send()``
        nothing; works before the first send and after ``close()`` (the final counts)."""
        with self._lock:
            buffered = self._buffered
            in_flight = sum(self._in_flight.values())
        return self._stats.snapshot(
            in_flight=in_flight,
            buffer_total=self.buffer_memory,
            buffer_available=max(self.buffer_memory - buffered, 0),
        )

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition numbers (fetching metadata if needed)."""
        if self._forked_from:
            raise forks.error(self)
        n = self._counts.get(topic) or self._partition_count(topic)
        return list(range(n))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- caller-side helpers ---------------------------------------------------------------

    def _topic_partitions(self, topic: str) -> int:
        """send()'s :meth:`_partition_count` (a topic not in the cache yet): a record that
        fails here (an unknown topic, no metadata within max_block_ms) counts as a
        record-error, as Kafka's doSend counts its failures."""
        _check_topic(topic)
        try:
            return self._partition_count(topic)
        except StromError:
            self._stats.failed(topic, 1)
            raise

    def _covering(self, topic: str, partition: int) -> int:
        """send()'s look-up of a partition past the cached count (added since, or not there):
        a record whose partition does not exist counts as a record-error too."""
        try:
            return self._metadata.count_covering(topic, partition)
        except StromError:
            self._stats.failed(topic, 1)
            raise

    def _refused(self, topic: str, records: int, error: BaseException) -> BaseException:
        """``error``, after counting the ``records`` it fails before any request as errors
        (record-error-total, per topic too; Kafka's doSend records its ApiExceptions and
        BufferExhaustedException on that sensor). Called on failure paths only."""
        self._stats.failed(topic, records)
        return error

    def _partition_count(self, topic: str) -> int:
        """Partition count of ``topic``, waiting up to max_block_ms for metadata."""
        _check_topic(topic)
        try:
            entry = self._metadata.topic(topic)  # also learns the leaders
        except BrokerNotAvailableError as exc:
            raise RequestTimedOutError(
                f"no metadata for topic {topic!r} within max_block_ms="
                f"{self.max_block_s * 1000:.0f}: {exc.message}"
            ) from None
        return len(entry.partitions)

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


_time = time.time
_new_object = object.__new__


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

#: Timestamps are kept as float ms until encoded: exact below 2**53.
_MAX_TIMESTAMP_MS = 2**53


def _check_topic(topic: Any) -> None:
    """A caller's topic name, or a clear error (checked before a failure can be counted
    under it)."""
    if not topic or not isinstance(topic, str):
        raise InvalidRequestError(f"topic must be a non-empty string, got {topic!r}")


def _check_timestamp(ts: Any) -> int:
    """A caller's ``timestamp_ms`` as an int, or a clear error (not a failed batch later)."""
    if type(ts) is not int:
        try:
            if isinstance(ts, bool):
                raise TypeError
            ts = operator.index(ts)  # numpy and other integer types
        except TypeError:
            raise InvalidRequestError(
                f"timestamp_ms must be an int (ms since the epoch), got {ts!r}"
            ) from None
    if not 0 <= ts < _MAX_TIMESTAMP_MS:
        raise InvalidRequestError(f"timestamp_ms must be ms since the epoch (>= 0), got {ts}")
    return ts
