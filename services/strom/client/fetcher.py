"""The consumer's fetch engine: worker threads that keep Fetch requests in flight to the
partition leaders, and the per-partition buffers that ``poll()`` / ``poll_arrow()`` drain.

Why threads: the next fetch must already be on the wire while the application processes what
``poll()`` returned (prefetch), and a consumer whose partitions live on several nodes must wait
on all of them at once.

Why *these* threads (measured): while the application's thread runs Python, any other thread
waits for the GIL up to the interpreter's switch interval (5 ms) each time it wakes up, so what
limits a prefetching consumer is the number of wake-ups per fetch, not the work done. A first
version with one dispatcher thread and gRPC futures paid three per fetch (gRPC starts a polling
thread per call when none is in flight, the completion callback, the dispatcher) and stalled
below a million records/s. Now each leader node has its own workers that make *blocking*
calls: the answer lands on the thread that asked, which files it and sends the next request at
once, one wake-up per fetch. The work on those threads is small and never drops the GIL midway
(CRC checks and body decoding happen when the consumer drains a batch, on the application's
thread).

One hand-off is avoided altogether: a ``poll()`` that would wait for a caught-up partition
makes the (long-poll) Fetch itself, on the application's thread, when all it waits for has
one leader (``Fetcher.fetch_inline``): the answer lands on the thread that wants it.

Requests for caught-up partitions (the long polls of a consumer keeping up, many and small)
go on ``FetchStream`` streams lent to one thread at a time
(:class:`strom.client.streams.FetchStreams`): the asking thread still blocks for its own
answer, and the node spends about half the CPU per request. A lagging consumer's fetches
(few, big) stay unary calls: on a stream the answer reaches the asking thread through gRPC's
own thread, one more wait for the interpreter lock per fetch. A node without the streams
(an older version) gets unary calls.

A partition is in at most one request at a time (no speculative fetch-ahead: see
``Fetcher._fetchable``), and a node may have several requests in flight: each node keeps one
idle worker in reserve (more are started on demand, up to ``MAX_WORKERS_PER_NODE``, and retire
after a while without work). So when workers are parked in long polls at the end of some
partitions' logs (up to ``fetch_max_wait_ms``, perhaps for a position the application has
since sought away from), a partition that becomes fetchable meanwhile (drained, sought,
resumed) is fetched at once instead of waiting for those polls.

A node that stops answering (hung: a long GC pause, SIGSTOP, a network partition) holds a
worker's long poll until the request timeout. So the metadata thread watches the workers'
requests: one unanswered ``OVERDUE_GRACE_S`` past its wait has its partitions' leaders looked
up again, and those that moved leave it for their new leader (``Fetcher._overdue``,
``_release_moved``): the consumer follows a moved leader within seconds, as the producer does.

Buffering is bounded per partition: a partition is fetched again only while fewer than
``max_buffered`` (2) completed responses wait for the application, so memory stays within a
few times ``max_partition_fetch_bytes`` per partition however slow the application is.

Every partition has a *generation* that is bumped whenever its position moves behind the
fetcher's back (seek, reset, pause, re-assignment). Requests remember the generation and fetch
offset they were built with; an answer for an older generation is dropped, so data from before
a seek can never be returned after it.

Nothing here loops over records in Python: a response is split into batches by header when it
arrives (and CRC-checked there, on the fetch thread, with the interpreter lock released); a
failed check is raised only when the consumer drains that batch. Uncompressed bodies of over
64 records are decoded there too (:func:`decode_bodies`); the others when drained, to Python
records (``take_records``: columns convert in C, one tuple per record) or straight to Arrow
(``take_arrow``: no per-record work at all).

Where the parts live: a Fetch answer's wire parsing and the checks on its batches in
:mod:`strom.client.fetch_answers`; what is kept per answer and per partition
(``CompletedFetch``, ``PartitionState``) and the drain into records or Arrow in
:mod:`strom.client.fetch_state`; the threads, requests and positions (``Fetcher``) here.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client import trace
from strom.client.cluster import ClusterClient, refused
from strom.client.downgrades import Downgrades
from strom.client.fetch_answers import (
    FetchWireError,
    PartitionAnswer,
    aborted_batches,
    corrupt_batches,
    decode_bodies,
    parse_fetch_answer,
    parse_fetch_response,
    unreadable_batch_error,
)
from strom.client.fetch_state import CONSUMER_SCHEMA, CompletedFetch, PartitionState
from strom.client.fetch_state import Constants as _Constants
from strom.client.metadata import MetadataCache
from strom.client.offsets import TRANSPORT_RETRY
from strom.client.stats import FetchStats
from strom.client.streams import FetchStreams, FollowStream
from strom.client.types import TopicPartition
from strom.errors import (
    CorruptMessageError,
    ErrorCode,
    OffsetOutOfRangeError,
    StorageError,
    StromError,
    error_for,
    is_retriable,
)
from strom.record import InvalidBatchError, RecordBatch, decode_batches

#: The module's names, and those of the Fetch answer and the per-partition state that moved to
#: strom.client.fetch_answers / fetch_state (still imported from here by the consumer, the
#: Spark connector and tests).
__all__ = [
    "CONSUMER_SCHEMA",
    "FETCH_METHOD",
    "FOLLOW_GRANT",
    "FOLLOW_HEADER",
    "FOLLOW_MIN_WAIT_MS",
    "FOLLOW_SLACK_S",
    "FOLLOW_WINDOW",
    "INLINE_GRACE_S",
    "MAX_WORKERS_PER_NODE",
    "OVERDUE_GRACE_S",
    "OVERDUE_RECHECK_S",
    "SPLIT_REQUEST_BYTES",
    "STORAGE_ERRORS_RAISED_AFTER",
    "WORKER_IDLE_S",
    "CompletedFetch",
    "FetchWireError",
    "Fetcher",
    "PartitionAnswer",
    "PartitionState",
    "aborted_batches",
    "corrupt_batches",
    "decode_bodies",
    "gc_paused",
    "parse_fetch_answer",
    "parse_fetch_response",
    "unreadable_batch_error",
]

log = logging.getLogger(__name__)

FETCH_METHOD = "/strom.v1.StorageService/Fetch"

#: Per-partition errors after which the leader is looked up again before the next fetch.
_LEADER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.STORAGE_ERROR,
        ErrorCode.BROKER_NOT_AVAILABLE,
    }
)

#: STORAGE_ERROR answers in a row from the same leader (in the same leader epoch) after
#: which ``poll()`` raises: the leader's stored data failed its check, and a leader lookup does
#: not help while it keeps leading (Kafka's consumer raises CorruptRecordException from poll).
STORAGE_ERRORS_RAISED_AFTER = 3

#: Most requests in flight to one node (each on its own worker thread).
MAX_WORKERS_PER_NODE = 4
#: Partitions known to be behind (a full answer waits for each) share a request only up to
#: this many bytes of ``max_partition_fetch_bytes``: past it they go side by side on other
#: workers, so the node reads one answer while another travels and the application drains a
#: third (at 4 MiB per partition: 8-9 -> 11 M records/s into poll_arrow, docs/benchmarks.md).
#: Below it, fewer calls win (splitting at 1 MiB made poll() slower).
SPLIT_REQUEST_BYTES = 4 * 1024 * 1024
#: A worker beyond the first that found nothing to do for this long retires.
WORKER_IDLE_S = 30.0
#: How long past its long-poll wait a poll's own Fetch may take: a leader that stops answering
#: must not hold ``poll(timeout_ms)`` for the whole request timeout (the partition then backs
#: off and goes to the fetch threads).
INLINE_GRACE_S = 0.5
#: How long past its long-poll wait a worker's Fetch may go unanswered before the leaders of
#: its partitions are looked up again (design §8): a node answers a long poll within its wait
#: plus a round trip, so a later answer means the node is slow or hung. If a partition's
#: leader moved meanwhile, the request is given up on for it and the new leader is asked at
#: once; if not, the request goes on waiting up to the request timeout (a big answer may just
#: be slow). Without it a consumer stayed on a hung (SIGSTOPped) leader for the whole
#: ``request_timeout_ms`` (31 s) while its producer had moved on in 2 s (found from outside).
OVERDUE_GRACE_S = 1.0
#: How often an overdue Fetch's leaders are looked up again while it stays unanswered (the
#: controller moves a hung node's partitions a few seconds after it stopped answering).
OVERDUE_RECHECK_S = 1.0
#: A poll's own Fetch follows (storage.proto, ``FetchRequest.follow``) when it may wait at
#: least this long: each answer of a follow comes within its wait, so a follow started for a
#: shorter wait would have the node answer an idle consumer that often.
FOLLOW_MIN_WAIT_MS = 20
#: Header a node that follows FetchStream requests sends (older nodes ignore ``follow``).
FOLLOW_HEADER = "strom-fetch-follow"
#: Answers of a follow the node may send ahead of the application (``follow_answers``), and
#: how many each grant adds back once that many were taken. A consumer that falls behind
#: stops granting: the node holds what lands and sends it in one answer at the next grant,
#: instead of queueing many small answers (each with its own cost) in front of it. Without
#: a bound, e2e p95 at 10,000 records/s doubled; 8/4 had p99 11.6-19 ms against 16.5-50 for
#: 4/2 (6 pairs, docs/benchmarks.md 2026-11-28).
FOLLOW_WINDOW = 8
FOLLOW_GRANT = 4
_GRANT = storage_pb2.FetchRequest(replica_id=-1, follow_answers=FOLLOW_GRANT)
#: How much later than a poll's deadline a follow's next answer may be due and the follow
#: still be kept: without it the second long poll of a ``poll(1000)`` at the default 500 ms
#: wait missed by a few ms and the stream was cancelled and opened again.
FOLLOW_SLACK_S = 0.02


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector held off while a poll builds its records (measured).

    A poll of 10,000 records makes 10,000 ``Record`` tuples that are all alive until the poll
    returns. With the collector running, the young-generation passes it triggers on the way
    find them alive and promote them, and every few polls that promotion sets off a *full*
    collection, which walks every object of the process: 21 of them per 2 M records halved
    ``poll()`` (1.75 against 4.04 M records/s with 10,000 per poll; 500 per poll was not
    affected). Records hold bytes, ints and strings: they make no reference cycles, so
    nothing is lost by not looking for cycles while they are built; the collector runs as
    usual once the poll returns (and if the application had turned it off, it stays off).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(slots=True)
class _Follow:
    """The application's followed Fetch (``Fetcher.fetch_inline``): its stream, its node,
    the partitions it reads as they were when it started, and where the node's next answer
    starts for each (the end of the last answer's last batch, as the node computes it)."""

    stream: FollowStream
    address: str
    parts: dict[TopicPartition, tuple[PartitionState, int]]
    offsets: dict[TopicPartition, int]
    #: The node said it follows (its header); checked once, after the first answer.
    confirmed: bool = False
    #: Answers granted to the node and not taken yet.
    granted: int = FOLLOW_WINDOW


@dataclass(frozen=True, slots=True, eq=False)
class _Claim:
    """A partition a worker took into its next request, as it was when taken. The partition
    holds it (``PartitionState.claim``) while the request may still file an answer for it."""

    part: PartitionState
    generation: int
    fetch_offset: int
    leader_epoch: int


@dataclass(slots=True, eq=False)
class _Outstanding:
    """A worker's Fetch in flight, watched by the metadata thread (``Fetcher._overdue``):
    past ``due`` the leaders of its partitions are looked up again, and the partitions whose
    leader moved away from ``address`` are released from it."""

    address: str
    claims: list[_Claim]
    #: When it is overdue (then: when to look its leaders up again).
    due: float
    #: Its leaders were asked for since it became overdue (release what moved).
    checked: bool = False
    #: Cancels its stream (None while not on a stream: a unary call cannot be cancelled
    #: from another thread, and simply ends at its deadline).
    cancel: Any = None


class Fetcher:
    """Owns the partition states, the node workers and the metadata refresher.

    Locking: one re-entrant lock guards every PartitionState field and the worker table. The
    application's thread drains ``completed`` buffers outside the lock (only it pops them; the
    workers only append), then commits the new position under the lock if the partition's
    generation did not change meanwhile.
    """

    def __init__(
        self,
        client: ClusterClient,
        leaders: MetadataCache,
        *,
        client_id: str,
        reset_policy: str,
        min_bytes: int,
        max_wait_ms: int,
        max_bytes: int,
        partition_max_bytes: int,
        check_crcs: bool,
        request_timeout_s: float,
        backoff_s: float,
        backoff_max_s: float,
        max_buffered: int = 2,
        read_committed: bool = False,
    ) -> None:
        self._client = client
        self._read_committed = read_committed
        self._isolation = (
            storage_pb2.ISOLATION_LEVEL_READ_COMMITTED
            if read_committed
            else storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED
        )
        self._leaders = leaders
        self._client_id = client_id
        self._client_md = (("strom-client-id", client_id),)
        self._reset_policy = reset_policy
        self._min_bytes = min_bytes
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._check_crcs = check_crcs
        self._timeout_s = max_wait_ms / 1000.0 + request_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._max_buffered = max_buffered

        self._lock = threading.RLock()
        #: Notified when data, an error or a needed reset is waiting for the application.
        self.data_ready = threading.Condition(self._lock)
        self._md_wake = threading.Condition(self._lock)
        self._node_wake: dict[str, threading.Condition] = {}
        self._workers: dict[str, int] = {}  # address -> running workers
        self._idle: dict[str, int] = {}  # address -> workers waiting for work
        self._threads: list[threading.Thread] = []
        #: Workers' Fetches in flight (``_overdue``), and whether the metadata thread sleeps
        #: without watching any (the next one wakes it: one wake-up, not one per fetch).
        self._outstanding: set[_Outstanding] = set()
        self._watch_idle = False
        self.parts: dict[TopicPartition, PartitionState] = {}
        self._closed = False
        self._fatal: BaseException | None = None
        self._claim_rr = 0
        self._drain_rr = 0
        #: Whether the application waits in poll() on partitions of one leader, so that
        #: caught-up partitions are held for its own fetch (``fetch_inline``).
        self._app_fetches = False
        #: (generation, position) after the last collect() of each partition it drew from.
        self.last_marks: dict[TopicPartition, tuple[int, int | None]] = {}
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        #: Fetches go on streams (strom.client.streams) except to nodes that lack them.
        self._streams = FetchStreams(storage_pb2.FetchRequest.SerializeToString, self._client_md)
        self._unary_only = Downgrades()
        #: Nodes that answered a followed request once only (an older version).
        self._no_follow = Downgrades()
        self._follow: _Follow | None = None
        self._constants = _Constants()
        #: Consumer.metrics(): one entry per Fetch answer, counted on the thread that got it.
        self.stats = FetchStats()
        self._refresher = threading.Thread(
            target=self._refresh_loop, name=f"strom-metadata-{client_id}", daemon=True
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._refresher.start()

    def close(self) -> None:
        """Stop every thread at its next wake-up. The requests on streams are cancelled here;
        workers blocked in a unary call return when the caller closes the channels (which
        cancels those calls)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.data_ready.notify_all()
            self._md_wake.notify_all()
            for cv in self._node_wake.values():
                cv.notify_all()
            self._end_follow()
            cancels = [o.cancel for o in self._outstanding if o.cancel is not None]
            self._outstanding.clear()
        self._streams.close()  # ends the long polls in flight
        for cancel in cancels:  # (closed above already, unless just taken from the pool)
            cancel()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = [*self._threads, self._refresher]
        for t in threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(max(deadline - time.monotonic(), 0.0))

    @property
    def closed(self) -> bool:
        return self._closed

    # -- called from the application's thread -------------------------------------------

    def assign(self, tps: set[TopicPartition]) -> None:
        """Make ``tps`` the assignment; partitions kept keep their position and buffers."""
        with self._lock:
            for tp in list(self.parts):
                if tp not in tps:
                    self.parts.pop(tp).drop_buffered()
            for tp in tps:
                if tp not in self.parts:
                    self.parts[tp] = PartitionState(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            part = self.parts[tp]
            part.position = offset
            part.reset = None
            part.error = None
            part.error_sticky = False
            part.backoff_until = 0.0
            part.failures = 0
            part.drop_buffered()
            self._kick(part)

    def request_reset(self, tps: list[TopicPartition], strategy: str | None) -> None:
        """Forget the positions of ``tps``; the next poll/position() looks them up."""
        with self._lock:
            for tp in tps:
                part = self.parts[tp]
                part.position = None
                part.reset = strategy
                part.error = None
                part.error_sticky = False
                part.drop_buffered()

    def needing_positions(self) -> list[tuple[TopicPartition, str | None, int]]:
        """(tp, reset strategy or None, generation) of partitions without a position."""
        with self._lock:
            return [
                (tp, p.reset, p.generation) for tp, p in self.parts.items() if p.position is None
            ]

    def set_position(self, tp: TopicPartition, offset: int, generation: int) -> bool:
        """Install a looked-up position unless the partition changed since the lookup began."""
        with self._lock:
            part = self.parts.get(tp)
            if part is None or part.generation != generation or part.position is not None:
                return False
            part.position = offset
            part.reset = None
            part.drop_buffered()
            self._kick(part)
            return True

    def position(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self.parts[tp].position

    def marks(self, tps: set[TopicPartition]) -> dict[TopicPartition, tuple[int, int | None]]:
        """(generation, position) of the assigned ones of ``tps``: equal marks at two moments
        mean nothing moved the partition in between."""
        with self._lock:
            return {
                tp: (p.generation, p.position)
                for tp in tps
                if (p := self.parts.get(tp)) is not None
            }

    def high_watermark(self, tp: TopicPartition) -> int | None:
        """The end the last fetch of ``tp`` reported (the last stable offset with
        read_committed: see ``PartitionState.end_offset``); None before any."""
        with self._lock:
            part = self.parts.get(tp)
            return part.end_offset if part is not None and part.end_offset >= 0 else None

    def leads(self) -> dict[TopicPartition, int]:
        """Each assigned partition's lead over the log start its last fetch reported: how
        far its position is from records the retention would delete next (Kafka's
        records-lead). Partitions without a position or a log start yet are left out."""
        with self._lock:
            return {
                tp: max(p.position - p.log_start_offset, 0)
                for tp, p in self.parts.items()
                if p.position is not None and p.log_start_offset >= 0
            }

    def lags(self) -> dict[TopicPartition, int]:
        """Each assigned partition's lag behind the end its last fetch reported (the high
        watermark; the last stable offset with read_committed) from its position: what
        ``poll()`` has not returned yet. Partitions without a position or a fetch yet are
        left out."""
        with self._lock:
            return {
                tp: max(p.end_offset - p.position, 0)
                for tp, p in self.parts.items()
                if p.position is not None and p.end_offset >= 0
            }

    def pause(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                part = self.parts[tp]
                if not part.paused:
                    part.paused = True
                    part.drop_buffered()

    def resume(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                part = self.parts[tp]
                if part.paused:
                    part.paused = False
                    self._kick(part)

    def paused(self) -> set[TopicPartition]:
        with self._lock:
            return {tp for tp, p in self.parts.items() if p.paused}

    def take_error(self) -> BaseException | None:
        """The next error to raise from poll: a worker's own failure, else a partition's
        (sticky ones stay until the application seeks)."""
        with self._lock:
            if self._fatal is not None:
                return self._fatal
            for part in self.parts.values():
                if part.error is not None and not part.paused:
                    exc = part.error
                    if not part.error_sticky:
                        part.error = None
                    return exc
        return None

    def fetch_inline(self, timeout_s: float) -> bool:
        """Fetch on the calling (application's) thread instead of waiting for a worker.

        Why: a worker's answer reaches a waiting ``poll()`` through a thread wake-up and a GIL
        hand-off, ~0.4 ms of a record's end-to-end latency on this VM while the worker goes on
        to create its next call. A blocking call made by the thread that waits anyway lands
        the answer where it is needed. So a partition whose answer ended at the high
        watermark is *held* (the workers do not long-poll it) and the next ``poll()`` that
        would wait long-polls it itself, for at most ``timeout_s``. Partitions with more
        data on the node are still prefetched by the workers while the application works.

        Only when every partition to wait for has the same leader and none is in a worker's
        request (a poll cannot wait on two nodes, or on a worker's answer, from one blocking
        call); otherwise the holds are released to the workers and False is returned: the
        caller waits with :meth:`wait`. True means a fetch was made (or something is ready):
        collect again.

        The request *follows* (storage.proto, ``FetchRequest.follow``): the node goes on
        answering it from where each answer ended, so the next call here reads the answer the
        node sent when the next append landed, with no request in between (an append that
        landed while a new request travelled waited for it). The follow lasts while the
        same partitions, at the generations and offsets it expects, are read with waits it
        can keep; anything else (a seek, a pause, a new assignment, a poll that will not
        wait as long, an error) ends it (its stream is cancelled) and a new one starts."""
        with self._lock:
            if self._closed or self._fatal is not None:
                return True
            now = time.monotonic()
            address: str | None = None
            claims: list[_Claim] = []
            busy = False
            for part in self.parts.values():
                if part.paused:
                    continue
                if part.completed or part.error is not None or part.position is None:
                    return True  # something for the application already
                leader = self._leaders.get(part.tp)
                if (
                    leader is None
                    or leader.address is None
                    or (address is not None and leader.address != address)
                ):
                    self._app_fetches = False  # several leaders (or one unknown): workers
                    self._release_holds()
                    return False
                address = leader.address
                if part.inflight or part.backoff_until > now:
                    busy = True
                elif self._open(part):
                    claims.append(_Claim(part, part.generation, part.fetch_offset, leader.epoch))
            self._app_fetches = True  # caught-up answers are held for this thread from now on
            if busy or not claims or address is None:
                self._release_holds()
                return False
            wait_ms = max(0, min(self._max_wait_ms, int(timeout_s * 1000.0)))
            follow = self._follow
            if follow is not None and not self._follow_fits(
                follow, address, claims, now, timeout_s, wait_ms
            ):
                self._end_follow(kick=False)
                follow = None
            if (
                follow is None
                and wait_ms >= FOLLOW_MIN_WAIT_MS
                and address not in self._no_follow
                and address not in self._unary_only
            ):
                follow = self._start_follow(address, claims, wait_ms)
            for c in claims:
                c.part.inflight = True
                c.part.claim = c
                c.part.held = False
        try:
            self._fetch(address, claims, wait_ms, wait_ms / 1000.0 + INLINE_GRACE_S, follow)
        except BaseException:
            # Raised into the application's thread (a KeyboardInterrupt in the call, a bug):
            # the partitions must not stay "in flight" for ever, or nothing fetches them again.
            with self._lock:
                # The follow too: its answer may have been taken and not filed, and the next
                # one would then start after records nobody has seen.
                if follow is not None and self._follow is follow:
                    self._end_follow(kick=False)
                for c in claims:
                    if c.part.claim is c:
                        c.part.inflight = False
                        c.part.claim = None
                        self._kick(c.part)
            raise
        return True

    def release_holds(self) -> None:
        """The application polls without waiting: let the workers fetch every partition
        again (nobody would fetch a held one)."""
        if not self._app_fetches:
            return  # nothing is held (holds are only made while it is set)
        with self._lock:
            self._app_fetches = False
            self._release_holds()

    def _release_holds(self) -> None:
        self._end_follow()
        for part in self.parts.values():
            if part.held:
                part.held = False
                self._kick(part)

    # -- the application's followed fetch (lock held) -------------------------------------

    def _start_follow(self, address: str, claims: list[_Claim], wait_ms: int) -> _Follow:
        request = self._request(claims, wait_ms)
        request.follow = True
        request.follow_answers = FOLLOW_WINDOW
        stream = FollowStream(
            self._client.channel(address),
            storage_pb2.FetchRequest.SerializeToString,
            self._client_md,
            request,
            wait_ms / 1000.0,
        )
        follow = _Follow(
            stream,
            address,
            {c.part.tp: (c.part, c.generation) for c in claims},
            {c.part.tp: c.fetch_offset for c in claims},
        )
        for c in claims:
            c.part.following = True
        self._follow = follow
        return follow

    def _follow_fits(
        self,
        follow: _Follow,
        address: str,
        claims: list[_Claim],
        now: float,
        timeout_s: float,
        wait_ms: int,
    ) -> bool:
        """Whether the follow's next answer is the one ``claims`` ask for, in time."""
        stream = follow.stream
        if (
            follow.address != address
            or not stream.usable()
            or len(claims) != len(follow.parts)
            # Its next answer is due by then: data, or an empty answer after its wait.
            or stream.last_answer + stream.wait_s > now + timeout_s + FOLLOW_SLACK_S
            # Not much shorter a wait than asked for (an idle consumer answered that often).
            or stream.wait_s * 2000.0 < wait_ms
        ):
            return False
        for c in claims:
            tp = c.part.tp
            if (
                follow.parts.get(tp) != (c.part, c.generation)
                or follow.offsets[tp] != c.fetch_offset
            ):
                return False
        return True

    def _end_follow(self, kick: bool = True) -> None:
        follow = self._follow
        if follow is None:
            return
        self._follow = None
        follow.stream.close()
        for part, _ in follow.parts.values():
            part.following = False
            if kick:
                self._kick(part)

    def _followed(self, follow: _Follow, decoded: list[Any], failure: bool) -> None:
        """After an answer of ``follow``: where the node goes on, or the follow's end (the
        node ends it after an answer with an error; a bad answer ends it here)."""
        if self._follow is not follow:
            return
        if not follow.confirmed:
            follow.confirmed = True
            if not failure and follow.stream.header(FOLLOW_HEADER) is None:
                # An older node answered once and waits for a request: fetch as before.
                self._no_follow.add(follow.address)
                failure = True
        if failure:
            self._end_follow(kick=False)
            return
        offsets = follow.offsets
        for a, batches in decoded:
            tp = TopicPartition(a.topic, a.info.partition)
            if (
                a.info.error_code != ErrorCode.NONE
                or tp not in offsets
                or isinstance(batches, InvalidBatchError)
            ):
                self._end_follow(kick=False)
                return
            if batches:
                offsets[tp] = batches[-1].header.next_offset
        follow.granted -= 1
        if follow.granted <= FOLLOW_WINDOW - FOLLOW_GRANT:
            follow.granted += FOLLOW_GRANT
            follow.stream.grant(_GRANT)

    def wait(self, timeout_s: float) -> None:
        """Sleep until data, an error or a reset is waiting (or ``timeout_s`` passes)."""
        with self._lock:
            if self._closed or self._fatal is not None:
                return
            for part in self.parts.values():
                if not part.paused and (
                    part.completed
                    or part.error is not None
                    or part.position is None
                    or part.held  # for the caller's own fetch_inline
                    or part.following  # (the same)
                ):
                    return
            self.data_ready.wait(timeout_s)

    def collect(self, limit: int, *, arrow: bool) -> tuple[list[Any], int]:
        """Drain up to ``limit`` records across partitions (rotating which goes first, so
        none starves); returns (Records or Arrow batches, record count). Corrupt data stops
        its partition with a sticky error, raised by the next poll."""
        if arrow:
            return self._collect(limit, arrow=True)
        with gc_paused():
            return self._collect(limit, arrow=False)

    def _collect(self, limit: int, *, arrow: bool) -> tuple[list[Any], int]:
        out: list[Any] = []
        count = 0
        marks: dict[TopicPartition, tuple[int, int | None]] = {}
        self.last_marks = marks
        while count < limit:
            with self._lock:
                ready = [
                    p
                    for p in self.parts.values()
                    if p.completed and not p.paused and p.position is not None and p.error is None
                ]
                if not ready:
                    break
                self._drain_rr += 1
                k = self._drain_rr % len(ready)
                ready = ready[k:] + ready[:k]
                work = [(p, p.generation, p.completed[0], p.position) for p in ready]
            progressed = False
            for part, gen, cf, pos in work:
                if count >= limit:
                    break
                assert pos is not None
                try:
                    if arrow:
                        pieces, new_pos, n = cf.take_arrow(pos, limit - count, self._constants)
                    else:
                        pieces, new_pos = cf.take_records(pos, limit - count)
                        n = len(pieces)
                except InvalidBatchError as exc:
                    with self._lock:
                        if part.generation == gen:
                            tp = part.tp
                            part.error = unreadable_batch_error(tp, pos, exc)
                            part.error_sticky = True
                    continue
                with self._lock:
                    if part.generation != gen or self.parts.get(part.tp) is not part:
                        continue  # sought or reset meanwhile: what we took is stale
                    part.position = new_pos
                    marks[part.tp] = (gen, new_pos)
                    if cf.exhausted:
                        part.completed.popleft()
                        self._kick(part)  # below max_buffered again: fetch more (if idle)
                        progressed = True
                if n:
                    out.extend(pieces)
                    count += n
                    progressed = True
            if not progressed:
                break
        return out, count

    # -- helpers (lock held) --------------------------------------------------------------

    def _fetchable(self, part: PartitionState) -> bool:
        """Whether ``part`` can go into a request now: one request per partition at a time.

        A second, speculative request per partition (starting where the one in flight was
        expected to end) was tried and removed: answers hold whole batches, so the guess
        missed by a batch or more and a third of the bytes came twice; one-partition
        ``poll_arrow`` ran 13-22 % faster without it and four partitions the same
        (docs/benchmarks.md, 2026-11-27)."""
        return self._open(part) and not part.held and not part.following

    def _open(self, part: PartitionState) -> bool:
        """Whether ``part`` could go into a request now, held for the application or not."""
        return (
            part.position is not None
            and not part.paused
            and not part.inflight
            and part.error is None
            and len(part.completed) < self._max_buffered
        )

    def _kick(self, part: PartitionState) -> None:
        """``part`` may be fetchable now: wake an idle worker of its leader (starting one if
        none is idle), or have the leader looked up. Wakes nobody when there is nothing to do,
        since every wake-up costs a GIL hand-off."""
        if self._closed or not self._fetchable(part):
            return
        leader = self._leaders.get(part.tp)
        if leader is None or leader.address is None:
            self._stale(part.tp.topic)
            return
        self._ensure_worker(leader.address).notify()

    def _kick_all(self) -> None:
        for part in self.parts.values():
            if self._fetchable(part):
                self._kick(part)

    def _ensure_worker(self, address: str) -> threading.Condition:
        """The node's wake-up condition, with a worker waiting on it (or about to)."""
        cv = self._node_wake.get(address)
        if cv is None:
            cv = self._node_wake[address] = threading.Condition(self._lock)
        running = self._workers.get(address, 0)
        if self._idle.get(address, 0) == 0 and running < MAX_WORKERS_PER_NODE:
            self._workers[address] = running + 1
            self._idle[address] = self._idle.get(address, 0) + 1  # counts as idle until it runs
            t = threading.Thread(
                target=self._worker,
                args=(address, cv),
                name=f"strom-fetch-{self._client_id}-{address}",
                daemon=True,
            )
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
            t.start()
        return cv

    def _claim(self, address: str) -> tuple[list[_Claim], float | None, bool, bool]:
        """Take the fetchable partitions ``address`` leads into a new request: all of them,
        except that partitions known to be behind count ``max_partition_fetch_bytes`` each
        and a request takes them up to SPLIT_REQUEST_BYTES. Returns the claims, when a
        backoff ends (so the worker knows when to look again), whether the node leads any
        assigned partition at all (if not, the worker retires), and whether fetchable
        partitions were left for another worker."""
        now = time.monotonic()
        claims: list[_Claim] = []
        due: float | None = None
        leads = False
        parts = list(self.parts.values())
        if len(parts) > 1:
            self._claim_rr += 1
            k = self._claim_rr % len(parts)
            parts = parts[k:] + parts[:k]
        budget = max(self._partition_max_bytes, SPLIT_REQUEST_BYTES)
        behind_bytes = 0
        left_over = False
        for part in parts:
            leader = self._leaders.get(part.tp)
            if leader is None or leader.address != address:
                continue
            leads = True
            if self._fetchable(part):
                if part.backoff_until > now:
                    due = part.backoff_until if due is None else min(due, part.backoff_until)
                    continue
                behind = 0 <= part.fetch_offset < part.high_watermark
                if behind:
                    if behind_bytes >= budget:
                        left_over = True
                        continue
                    behind_bytes += self._partition_max_bytes
                part.inflight = True
                claim = _Claim(part, part.generation, part.fetch_offset, leader.epoch)
                part.claim = claim
                claims.append(claim)
        return claims, due, leads, left_over

    # -- node workers ---------------------------------------------------------------------

    def _worker(self, address: str, cv: threading.Condition) -> None:
        idle = True  # _ensure_worker counted this thread as idle
        retired = False
        try:
            while True:
                with self._lock:
                    idle_since = time.monotonic()
                    while True:
                        if self._closed:
                            return
                        claims, due, leads, left_over = self._claim(address)
                        if claims:
                            break
                        now = time.monotonic()
                        if not leads or (
                            now - idle_since > WORKER_IDLE_S and self._workers[address] > 1
                        ):
                            # Lower the counters in the critical section that decided it, so
                            # a racing _kick sees that it has to start a new worker.
                            self._workers[address] -= 1
                            if idle:
                                self._idle[address] -= 1
                            retired = True
                            return
                        if not idle:
                            idle = True
                            self._idle[address] += 1
                        timeout = WORKER_IDLE_S if due is None else max(due - now, 0.001)
                        cv.wait(timeout)
                    if idle:
                        idle = False
                        self._idle[address] -= 1
                    if left_over:  # big answers for another worker (this one is busy now)
                        self._ensure_worker(address).notify()
                    tracked = self._track(address, claims)
                self._fetch(address, claims, tracked=tracked)
        except BaseException as exc:  # a bug: surface it from poll() instead of hanging
            with self._lock:
                if not self._closed:
                    log.exception("strom consumer fetch worker for %s failed", address)
                    self._fatal = StromError(f"the consumer's fetch thread failed: {exc!r}")
                self.data_ready.notify_all()
        finally:
            if not retired:
                with self._lock:
                    self._workers[address] -= 1
                    if idle:
                        self._idle[address] -= 1

    def _ask(
        self,
        address: str,
        request: storage_pb2.FetchRequest,
        timeout_s: float,
        stream: bool = True,
        tracked: _Outstanding | None = None,
    ) -> bytes:
        """One Fetch's answer bytes, on a stream (``stream``, unless the node has none: an
        older version) or in a unary call; raises ``grpc.RpcError`` as the unary call does.
        ``tracked`` learns how to cancel the stream while it waits on it."""
        if stream and address not in self._unary_only:
            try:
                return self._streams.ask(
                    self._client.channel(address), address, request, timeout_s, tracked
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.info("node %s has no FetchStream; fetching with unary calls", address)
                self._unary_only.add(address)
        raw: bytes = self._call(address)(request, timeout=timeout_s, metadata=self._client_md)
        return raw

    def _follow_answer(
        self,
        address: str,
        claims: list[_Claim],
        follow: _Follow,
        max_wait_ms: int | None,
        timeout_s: float,
    ) -> bytes:
        """The next answer of ``follow`` (a node without FetchStream: a unary Fetch)."""
        try:
            answer: bytes = follow.stream.answer(timeout_s)
            return answer
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
        log.info("node %s has no FetchStream; fetching with unary calls", address)
        with self._lock:
            self._unary_only.add(address)
            if self._follow is follow:
                self._end_follow(kick=False)
        wait_ms = self._max_wait_ms if max_wait_ms is None else max_wait_ms
        return self._ask(address, self._request(claims, wait_ms), timeout_s, False)

    def _call(self, address: str) -> grpc.UnaryUnaryMultiCallable:
        call = self._calls.get(address)
        if call is None:
            # Raw bytes back (no response_deserializer): parse_fetch_response keeps the record
            # bytes uncopied.
            call = self._client.channel(address).unary_unary(
                FETCH_METHOD, request_serializer=storage_pb2.FetchRequest.SerializeToString
            )
            self._calls[address] = call
        return call

    def _request(self, claims: list[_Claim], max_wait_ms: int) -> storage_pb2.FetchRequest:
        topics: dict[str, list[storage_pb2.FetchPartition]] = {}
        for c in claims:
            topics.setdefault(c.part.tp.topic, []).append(
                storage_pb2.FetchPartition(
                    partition=c.part.tp.partition,
                    fetch_offset=c.fetch_offset,
                    current_leader_epoch=c.leader_epoch,
                    last_fetched_epoch=-1,
                    log_start_offset=-1,
                    partition_max_bytes=self._partition_max_bytes,
                )
            )
        return storage_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=max_wait_ms,
            min_bytes=self._min_bytes,
            max_bytes=self._max_bytes,
            isolation_level=self._isolation,
            topics=[storage_pb2.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        )

    def _fetch(
        self,
        address: str,
        claims: list[_Claim],
        max_wait_ms: int | None = None,
        timeout_s: float | None = None,
        follow: _Follow | None = None,
        tracked: _Outstanding | None = None,
    ) -> None:
        """One Fetch round trip for ``claims`` and filing its answer (on a worker, or on the
        application's thread from ``fetch_inline``); with ``follow``, the next answer of
        that followed request instead. ``tracked``: the worker's request as the metadata
        thread watches it (it may release claims from it, or cancel it: ``_overdue``)."""
        failure: StromError | None = None
        transport = False
        answers: list[PartitionAnswer] = []
        nodes: list[common_pb2.Node] = []
        throttle_ms: int | None = None  # the answer's, once it parsed
        asked = time.monotonic()
        try:
            # Caught-up partitions go on a stream: many small long polls, where a unary
            # call's set-up would be most of the node's work. A lagging consumer's fetches
            # are few and big, and a stream's answer reaches the asking thread through gRPC's
            # own thread: one more wait for the interpreter lock per fetch while the
            # application's thread converts records (poll_arrow() 7-14 % slower, measured).
            caught_up = all(0 <= c.part.high_watermark <= c.fetch_offset for c in claims)
            timeout_s = self._timeout_s if timeout_s is None else timeout_s
            if follow is not None:
                raw = self._follow_answer(address, claims, follow, max_wait_ms, timeout_s)
            else:
                raw = self._ask(
                    address,
                    self._request(
                        claims, self._max_wait_ms if max_wait_ms is None else max_wait_ms
                    ),
                    timeout_s,
                    caught_up,
                    tracked,
                )
        except grpc.RpcError as exc:
            code = exc.code()
            transport = code in TRANSPORT_RETRY
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                failure = refused(exc)
            else:
                failure = StromError(
                    f"Fetch from {address} failed: {code.name} {exc.details() or ''}".strip(),
                    retriable=transport,
                )
        except ValueError as exc:  # the channel was closed under us (consumer closing)
            transport = True
            failure = StromError(f"Fetch from {address}: {exc}", retriable=True)
        else:
            try:
                answers, nodes, throttle_ms = parse_fetch_answer(raw)
            except FetchWireError as exc:
                failure = StromError(f"Fetch from {address}: {exc}")
        # Split into batches by header, and check their CRCs here: crc32c releases the
        # interpreter lock, so on a fetch thread the check runs beside the application's
        # draining instead of inside it (a mismatch is still raised only when that batch is
        # drained, after the good batches before it).
        decoded: list[tuple[PartitionAnswer, list[RecordBatch] | InvalidBatchError]] = []
        corrupt: list[frozenset[int] | None] = []
        nbytes = 0
        for a in answers:
            batches: list[RecordBatch] | InvalidBatchError = []
            bad: frozenset[int] | None = None
            if a.info.error_code == ErrorCode.NONE and len(a.records):
                nbytes += len(a.records)
                try:
                    batches = decode_batches(a.records, verify_crc=False)
                except InvalidBatchError as exc:
                    batches = exc
                else:
                    if self._check_crcs:
                        bad = corrupt_batches(batches)
                    decode_bodies(batches, bad)
            decoded.append((a, batches))
            corrupt.append(bad)
        if trace.sink is not None:
            trace.emit("fetch.received", decoded)
        now = time.monotonic()
        self.stats.fetched(now - asked, nbytes, throttle_ms)
        with self._lock:
            if tracked is not None:
                self._outstanding.discard(tracked)
            # Only the claims the partitions still hold: not those given up on (``_overdue``)
            # nor those a seek or reset dropped (drop_buffered).
            claims = [c for c in claims if c.part.claim is c]
            for c in claims:
                c.part.inflight = False
                c.part.claim = None
            if follow is not None:
                self._followed(follow, decoded, failure is not None)
            if self._closed:
                return
            if failure is not None:
                self._request_failed(claims, failure, transport, now)
                return
            endpoints = {n.node_id: f"{n.host}:{n.port}" for n in nodes}
            by_tp = {c.part.tp: c for c in claims}
            for (a, batches), bad in zip(decoded, corrupt, strict=True):
                c = by_tp.get(TopicPartition(a.topic, a.info.partition))
                if c is None:
                    continue
                part = c.part
                if self.parts.get(part.tp) is not part or part.generation != c.generation:
                    continue  # unassigned, sought or reset since the request left
                if part.fetch_offset != c.fetch_offset:
                    continue
                self._apply(part, a.info, batches, endpoints, now, bad)

    def _request_failed(
        self, claims: list[_Claim], failure: StromError, transport: bool, now: float
    ) -> None:
        if transport:
            for topic in {c.part.tp.topic for c in claims}:
                self._stale(topic)
        for c in claims:
            part = c.part
            if self.parts.get(part.tp) is not part or part.generation != c.generation:
                continue
            self._back_off(part, now)
            if not transport:
                part.error = failure
                self.data_ready.notify_all()

    def _storage_error(self, part: PartitionState, info: Any) -> None:
        """(Lock held.) The leader could not serve the partition from its disk. Retried, as
        a leader change may cure it; but from the same leader, in the same leader epoch,
        ``STORAGE_ERRORS_RAISED_AFTER`` times in a row, ``poll()`` raises it (every further
        one too) with the partition and offset: before, the consumer looked the leader up
        again forever and ``poll()`` returned nothing, with no sign of why (found from
        outside: one damaged batch on the leader's disk, two good replicas standing by)."""
        tp = part.tp
        leader = self._leaders.get(tp)
        node, epoch = (leader.node_id, leader.epoch) if leader is not None else (-1, -1)
        last_node, last_epoch, count = part.storage_errors
        count = count + 1 if (node, epoch) == (last_node, last_epoch) else 1
        part.storage_errors = (node, epoch, count)
        if count >= STORAGE_ERRORS_RAISED_AFTER:
            # Damaged data (the node's "stored data ... failed a check") is Kafka's
            # CorruptRecordException; anything else (a disk error) stays a StorageError.
            damaged = "failed a check" in info.error_message
            cls = CorruptMessageError if damaged else StorageError
            part.error = cls(
                f"{tp.topic}-{tp.partition} at offset {part.fetch_offset}: the leader (node "
                f"{node}) failed to read its stored data {count} times in a row: "
                f"{info.error_message}"
            )
            self.data_ready.notify_all()

    def _back_off(self, part: PartitionState, now: float) -> None:
        delay = min(self._backoff_s * (2 ** min(part.failures, 10)), self._backoff_max_s)
        part.failures += 1
        part.backoff_until = now + delay

    def _apply(
        self,
        part: PartitionState,
        info: storage_pb2.FetchPartitionResponse,
        batches: list[RecordBatch] | InvalidBatchError,
        endpoints: dict[int, str],
        now: float,
        corrupt: frozenset[int] | None = None,
    ) -> None:
        tp = part.tp
        code = info.error_code
        if code == ErrorCode.STORAGE_ERROR:
            self._storage_error(part, info)
        elif part.storage_errors[2]:
            if part.storage_errors[2] >= STORAGE_ERRORS_RAISED_AFTER and not part.error_sticky:
                part.error = None  # not raised yet, and served again meanwhile: moot
            part.storage_errors = (-1, -1, 0)
        if code == ErrorCode.NONE:
            part.failures = 0
            part.high_watermark = info.high_watermark
            # FIX (found from outside): highwater() gave the high watermark to read_committed
            # consumers too, so an open transaction showed as lag they could never read.
            part.end_offset = (
                info.last_stable_offset
                if self._read_committed and info.last_stable_offset >= 0
                else info.high_watermark
            )
            part.log_start_offset = info.log_start_offset
            if isinstance(batches, InvalidBatchError):
                part.error = unreadable_batch_error(tp, part.fetch_offset, batches)
                part.error_sticky = True
                self.data_ready.notify_all()
                return
            start = part.fetch_offset
            keep = [b for b in batches if b.header.next_offset > start]
            if keep:
                aborted = (
                    aborted_batches(keep, info.aborted_transactions)
                    if info.aborted_transactions
                    else None
                )
                part.completed.append(
                    CompletedFetch(
                        tp, keep, check_crcs=self._check_crcs, skip=aborted, corrupt=corrupt
                    )
                )
                part.fetch_offset = keep[-1].header.next_offset
                self.data_ready.notify_all()
            if self._app_fetches and part.fetch_offset >= part.high_watermark:
                part.held = True
                self.data_ready.notify_all()  # a waiting poll() fetches it itself now
            else:
                part.held = False
            return
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if info.log_start_offset >= 0:
                part.log_start_offset = info.log_start_offset
            if info.high_watermark >= 0:
                part.high_watermark = info.high_watermark
            if self._reset_policy == "none":
                exc = OffsetOutOfRangeError(
                    f"fetch offset {part.fetch_offset} of {tp.topic}-{tp.partition} is out of "
                    f"range (log start offset {info.log_start_offset}, high watermark "
                    f"{info.high_watermark}) and auto_offset_reset='none': seek to continue"
                )
                exc.partitions = {tp: part.fetch_offset}  # type: ignore[attr-defined]
                part.error = exc
                part.error_sticky = True
            else:
                part.position = None
                part.reset = self._reset_policy
                part.drop_buffered()
            self.data_ready.notify_all()
            return
        if code in _LEADER_ERRORS or code == ErrorCode.UNKNOWN_LEADER_EPOCH:
            hint = info.current_leader if info.HasField("current_leader") else None
            if hint is not None and self._leaders.learn(
                tp, hint.leader_id, hint.leader_epoch, endpoints.get(hint.leader_id)
            ):
                self._kick(part)  # the answer named the new leader: go there at once
                return
            if code != ErrorCode.UNKNOWN_LEADER_EPOCH:  # that one: the node lags, just wait
                self._stale(tp.topic)
            self._back_off(part, now)
            return
        if is_retriable(code):
            self._back_off(part, now)
            return
        part.error = error_for(code, f"{tp.topic}-{tp.partition}: {info.error_message}")
        self._back_off(part, now)
        self.data_ready.notify_all()

    # -- metadata -------------------------------------------------------------------------

    def _stale(self, topic: str) -> None:
        """(Lock held.) Have ``topic``'s leaders looked up again, by the refresh thread."""
        self._leaders.mark_stale(topic)
        self._md_wake.notify()

    def _refresh_loop(self) -> None:
        """Refresh the topics a worker, a kick or an overdue Fetch found stale, with the
        metadata cache's backoff (exponential while refreshing does not help: no node
        answers, an election takes long, a deleted topic), then give up overdue Fetches for
        the partitions whose leader moved, and hand partitions to their (new) leaders'
        workers."""
        while True:
            with self._lock:
                while not self._closed:
                    watch_in = self._overdue(time.monotonic())  # (may mark topics stale)
                    due_in = self._leaders.next_refresh_in()
                    if due_in is not None and due_in <= 0:
                        break
                    if watch_in is not None and (due_in is None or watch_in < due_in):
                        due_in = watch_in
                    self._watch_idle = due_in is None
                    self._md_wake.wait(due_in)
                    self._watch_idle = False
                if self._closed:
                    return
            try:
                self._leaders.refresh_stale()
            except Exception:  # never let the refresher die: the consumer would hang
                log.exception("consumer metadata refresh failed")
            with self._lock:
                self._release_moved()
                self._kick_all()  # partitions still without a leader mark it stale again

    # -- Fetches to a node that stopped answering (lock held) -----------------------------

    def _track(self, address: str, claims: list[_Claim]) -> _Outstanding:
        """Have the metadata thread watch a worker's Fetch to ``address`` (see
        :data:`OVERDUE_GRACE_S`). It is woken only when it sleeps watching none: not once
        per fetch (each wake-up costs a GIL hand-off)."""
        tracked = _Outstanding(
            address, claims, time.monotonic() + self._max_wait_ms / 1000.0 + OVERDUE_GRACE_S
        )
        self._outstanding.add(tracked)
        if self._watch_idle:
            self._watch_idle = False
            self._md_wake.notify()
        return tracked

    def _overdue(self, now: float) -> float | None:
        """Look up again the leaders of the partitions in Fetches that are overdue, asking
        their node last from now on (``ClusterClient.demote``: it may be hung, as the
        producer's path does); seconds until the next one is due (None: none in flight)."""
        next_due: float | None = None
        for tracked in self._outstanding:
            if tracked.due <= now:
                if not tracked.checked:  # (debug: a big answer may just be slow)
                    log.debug(
                        "no Fetch answer from %s within %.1f s; looking its partitions' "
                        "leaders up again",
                        tracked.address,
                        self._max_wait_ms / 1000.0 + OVERDUE_GRACE_S,
                    )
                self._client.demote(tracked.address)
                for topic in {c.part.tp.topic for c in tracked.claims if c.part.claim is c}:
                    self._stale(topic)
                tracked.checked = True
                tracked.due = now + OVERDUE_RECHECK_S
            if next_due is None or tracked.due < next_due:
                next_due = tracked.due
        return None if next_due is None else max(next_due - now, 0.0)

    def _release_moved(self) -> None:
        """After a lookup: give up overdue Fetches for the partitions whose leader is now
        another node. Their position is untouched (the request's answer was never filed, and
        if it comes it is ignored), so the new leader is asked from the same offset: nothing
        skipped, nothing twice. A request left without partitions is cancelled (a unary
        one cannot be, and ends at its deadline)."""
        for tracked in [t for t in self._outstanding if t.checked]:
            held = False
            for c in tracked.claims:
                part = c.part
                if part.claim is not c:
                    continue
                leader = self._leaders.get(part.tp)
                if leader is None or leader.address in (None, tracked.address):
                    held = True
                    continue
                log.info(
                    "no Fetch answer from %s for %s-%d, whose leader is now %s: fetching there",
                    tracked.address,
                    part.tp.topic,
                    part.tp.partition,
                    leader.address,
                )
                part.claim = None
                part.inflight = False
                self._kick(part)
            if not held:
                self._outstanding.discard(tracked)
                cancel = tracked.cancel
                if cancel is not None:
                    cancel()
