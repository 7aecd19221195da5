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

Where the Producer's own parts live: ``send`` and the calls every producer has here; the
``buffer_memory`` accounting (room in open batches, the wait for space, ``space_wait_until``)
in :mod:`strom.client.producer_buffer`; ``send_batch`` in :mod:`strom.client.producer_bulk`;
the transactional calls in :mod:`strom.client.producer_txn` (each a mixin of ``Producer``).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from strom.client import forks
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.bulk import BatchMetadata, BulkFuture
from strom.client.cluster import ClusterClient
from strom.client.downgrades import Downgrades
from strom.client.futures import FutureRecordMetadata
from strom.client.kwnames import (
    INT32_MAX,
    INT64_MAX,
    INT_MS_MAX,
    LONG_MS_MAX,
    bool_option,
    int_option,
    kafka_keywords,
    str_option,
    wait_limit,
)
from strom.client.partitioner import murmur2
from strom.client.produce_answers import RETRY_LOG_INTERVAL_S, request_too_large
from strom.client.producer_buffer import NO_WAIT, ProducerBuffer, WouldBlockError, space_wait_until
from strom.client.producer_bulk import BulkSend
from strom.client.producer_txn import ProducerTransactions
from strom.client.record_checks import Partitioner, _check_timestamp, _check_topic

# send() (the measured hot path) is kept as it was, calling these by their former names.
from strom.client.record_checks import checked_pick as _checked_pick
from strom.client.record_checks import record_headers as _headers
from strom.client.record_checks import record_too_large as _record_too_large
from strom.client.sender import SenderLoop
from strom.client.spin import SpinKeeper
from strom.client.stats import ProducerStats
from strom.client.streams import RequestStream
from strom.client.transactions import TransactionManager, TxnPhase
from strom.errors import (
    BrokerNotAvailableError,
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


class Producer(ProducerTransactions, BulkSend, ProducerBuffer, SenderLoop):
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
        # (bool first: True == 1; and a list is unhashable for the ``in``)
        if isinstance(acks, bool) or not isinstance(acks, int | str) or acks not in _ACKS:
            raise ValueError(f"acks must be 'all', 1 or 0, got {acks!r}")
        self.acks = _ACKS[acks]
        if transactional_id is not None and (self.acks != -1 or enable_idempotence is False):
            raise ValueError(
                "a transactional producer needs acks='all' and enable_idempotence=True"
            )
        # Kafka's rule: idempotence needs acks='all'. With acks=1 a record the leader
        # acknowledged can be lost in a leader change, and the partition's sequence numbers
        # cannot go on after such a gap (every later batch refused OUT_OF_ORDER_SEQUENCE).
        # By default it is on exactly when acks='all'.
        if enable_idempotence and self.acks != -1:
            raise ValueError(
                f"enable_idempotence=True needs acks='all' (got acks={acks!r}): with fewer "
                "acknowledgements a leader change can lose acknowledged records and the "
                "producer's sequence numbers could not continue; leave enable_idempotence "
                "unset (it is then on with acks='all' only) or set it to False"
            )
        if compression is None:
            compression = "none"
        if not isinstance(compression, str):
            raise TypeError(
                f"compression must be a str (none, gzip, snappy, lz4 or zstd), got {compression!r}"
            )
        try:
            codecs.codec_id(compression)
        except (ValueError, KeyError) as exc:
            raise ValueError(
                f"unknown compression {compression!r}: use none, gzip, snappy, lz4 or zstd"
            ) from exc
        # Types are checked here, once, so that send() need not.
        # Maxima: Kafka's int settings and what goes on the wire as int32 up to 2**31-1, its
        # long ms settings up to LONG_MS_MAX (threading's timeouts overflow above), bytes up
        # to what a batch can carry or int64.
        for name, v, minimum, maximum in (
            ("batch_size", batch_size, 1, INT32_MAX),
            ("buffer_memory", buffer_memory, 1, INT64_MAX),
            ("max_in_flight", max_in_flight, 1, INT32_MAX),
            ("max_request_size", max_request_size, 1, INT32_MAX),
            ("delivery_timeout_ms", delivery_timeout_ms, 1, INT_MS_MAX),
            ("request_timeout_ms", request_timeout_ms, 1, INT_MS_MAX),
            ("metadata_max_age_ms", metadata_max_age_ms, 1, LONG_MS_MAX),
            ("transaction_timeout_ms", transaction_timeout_ms, 1, INT_MS_MAX),
            ("max_block_ms", max_block_ms, 0, LONG_MS_MAX),
            ("retries", retries, 0, INT32_MAX),
            ("retry_backoff_ms", retry_backoff_ms, 0, LONG_MS_MAX),
            ("retry_backoff_max_ms", retry_backoff_max_ms, 0, LONG_MS_MAX),
        ):
            int_option(name, v, minimum, maximum)
        if max_request_size > MAX_BATCH_BYTES:
            # Larger batches the cluster could not carry (the gRPC limit) or its readers
            # could not read; and as sizes count records uncompressed (as Kafka's), this
            # also bounds what a batch decompresses to.
            raise ValueError(
                f"max_request_size must be <= {MAX_BATCH_BYTES} (the largest batch a strom "
                f"Fetch answer can carry), got {max_request_size}"
            )
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, int | float):
            raise TypeError(f"linger_ms must be a number (ms), got {linger_ms!r}")
        if not 0 <= linger_ms <= LONG_MS_MAX:
            raise ValueError(
                f"linger_ms must be >= 0 and finite, and <= {LONG_MS_MAX}, got {linger_ms}"
            )
        for name, fn in (
            ("key_serializer", key_serializer),
            ("value_serializer", value_serializer),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable returning bytes, got {fn!r}")
        if partitioner is not None and not callable(partitioner):
            raise TypeError(f"partitioner must be a callable, got {partitioner!r}")
        str_option("client_id", client_id, empty_ok=True)
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

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far and wait until it is acknowledged or failed, and
        every delivery callback (``send(callback=...)``) of those records has run.

        Not from inside a delivery callback: callbacks run on the thread that delivers the
        records, which cannot wait for itself, so this raises :class:`ProducerCallbackError`
        at once there instead of hanging."""
        if self._forked_from:
            raise forks.error(self)
        self._refuse_in_callback("flush()")
        limit = wait_limit("timeout", timeout)
        with self._lock:
            pending = [b.result for pq in self._queues.values() for b in pq.batches]
            self._flushing += 1
        self._wake.set()
        try:
            end = None if limit is None else time.monotonic() + limit
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

    # -- transactions (DESIGN §6; strom.client.producer_txn, strom.client.transactions) ---

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
        which can neither wait for them nor for itself."""
        if self._closed:
            return
        if self._forked_from:  # the threads and connections are the parent's: nothing to do
            self._closed = True
            return
        own = self._delivering()
        if own:
            timeout = 0
        limit = wait_limit("timeout", timeout)
        # One deadline for every step, so the whole close keeps to ``timeout``.
        end = None if limit is None else time.monotonic() + limit

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
        # Records in flight may still be appended once the leader answers: "may have been
        # written", so that a user does not retry them into duplicates.
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


_time = time.time
_new_object = object.__new__
