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
:mod:`strom.client.fetch_state`; what a request in flight holds (its claims) in
:mod:`strom.client.fetch_claims`; the node workers, their requests and round trips in
:mod:`strom.client.fetch_workers`; what an answer's codes mean for each partition in
:mod:`strom.client.fetch_filing`; the application's own Fetch and its follow in
:mod:`strom.client.fetch_follow`; the metadata thread and the Fetches overdue at a hung
node in :mod:`strom.client.fetch_overdue`; the positions and buffers the application reads
and moves (``Fetcher``, which mixes those parts in) here.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from strom.api import storage_pb2
from strom.client.cluster import ClusterClient
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
from strom.client.fetch_claims import _Outstanding
from strom.client.fetch_filing import STORAGE_ERRORS_RAISED_AFTER, AnswerFiling
from strom.client.fetch_follow import (
    FOLLOW_GRANT,
    FOLLOW_HEADER,
    FOLLOW_MIN_WAIT_MS,
    FOLLOW_SLACK_S,
    FOLLOW_WINDOW,
    INLINE_GRACE_S,
    InlineFetch,
    _Follow,
)
from strom.client.fetch_overdue import (
    OVERDUE_GRACE_S,
    OVERDUE_RECHECK_S,
    QUIET_RECHECK_S,
    OverdueFetches,
)
from strom.client.fetch_state import CONSUMER_SCHEMA, CompletedFetch, PartitionState
from strom.client.fetch_state import Constants as _Constants
from strom.client.fetch_workers import (
    FETCH_METHOD,
    MAX_WORKERS_PER_NODE,
    SPLIT_REQUEST_BYTES,
    WORKER_IDLE_S,
    FetchWorkers,
)
from strom.client.metadata import MetadataCache
from strom.client.stats import FetchStats
from strom.client.streams import FetchStreams
from strom.client.types import TopicPartition
from strom.record import InvalidBatchError

#: The module's names, and those that moved to the modules named in the docstring: the Fetch
#: answer's and the per-partition state's (strom.client.fetch_answers / fetch_state), the
#: workers', the follow's and the overdue watch's constants (still imported from here by the
#: consumer, the Spark connector and tests).
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
    "QUIET_RECHECK_S",
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


class Fetcher(InlineFetch, FetchWorkers, AnswerFiling, OverdueFetches):
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

    def wait(self, timeout_s: float, news: Callable[[], bool] | None = None) -> None:
        """Sleep until data, an error or a reset is waiting, or ``news()`` (checked under
        the lock its setter's wake-up takes, so none is missed), or ``timeout_s`` passes."""
        with self._lock:
            if self._closed or self._fatal is not None or (news is not None and news()):
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
        lag = -1  # the largest lag a drained partition is left with (records-lag-max)
        lead = -1  # the smallest lead over the log start of one (records-lead-min)
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
                    if part.end_offset >= 0:
                        lag = max(lag, part.end_offset - new_pos, 0)
                    if part.log_start_offset >= 0:
                        ahead = max(new_pos - part.log_start_offset, 0)
                        lead = ahead if lead < 0 else min(lead, ahead)
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
        if lag >= 0 or lead >= 0:
            self.stats.lag_observed(lag, lead)
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
