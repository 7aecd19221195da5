"""The consumer's node workers: the threads that claim partitions, build and send a node's
Fetch requests and take in its answers.

:class:`FetchWorkers` is mixed into :class:`strom.client.fetcher.Fetcher`. Each leader node
has its own workers making *blocking* calls (one wake-up per fetch: the why is in
strom.client.fetcher's docstring), up to ``MAX_WORKERS_PER_NODE``; a worker claims the
node's fetchable partitions (``_claim``), sends one request on a stream or as a unary call
(``_ask``), splits the answer into batches and checks their CRCs off the application's
thread, and files it (``_fetch``, with strom.client.fetch_filing's ``_apply``). A module of
its own: the threads and the wire are one concern, apart from the positions the application
reads and moves (the Fetcher) and from what an answer's codes mean for a partition.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client import trace
from strom.client.cluster import ClusterClient, refused
from strom.client.downgrades import Downgrades
from strom.client.fetch_answers import (
    FetchWireError,
    PartitionAnswer,
    corrupt_batches,
    decode_bodies,
    parse_fetch_answer,
)
from strom.client.fetch_claims import _Claim, _Outstanding
from strom.client.fetch_follow import _Follow
from strom.client.fetch_state import PartitionState
from strom.client.metadata import MetadataCache
from strom.client.offsets import TRANSPORT_RETRY
from strom.client.stats import FetchStats
from strom.client.streams import FetchStreams
from strom.client.types import TopicPartition
from strom.errors import ErrorCode, StromError
from strom.record import InvalidBatchError, RecordBatch, decode_batches

# The fetcher's logger, not this module's: users and tests filter the consumer's fetch lines
# on "strom.client.fetcher".
log = logging.getLogger("strom.client.fetcher")

FETCH_METHOD = "/strom.v1.StorageService/Fetch"

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


class FetchWorkers:
    """The node workers, their claims and requests, and a Fetch's round trip.

    A mixin, as the other parts of :class:`strom.client.fetcher.Fetcher` are. Every
    attribute is set up by ``Fetcher.__init__``; the annotations say which ones it uses. It
    calls the Fetcher's ``_fetchable``, the follow's ``_follow_answer``/``_followed``
    (strom.client.fetch_follow), ``_apply``/``_request_failed`` (strom.client.fetch_filing)
    and ``_track`` (strom.client.fetch_overdue).
    """

    # -- set by Fetcher.__init__ -----------------------------------------------------------
    parts: dict[TopicPartition, PartitionState]
    data_ready: threading.Condition
    stats: FetchStats
    _client: ClusterClient
    _client_id: str
    _client_md: tuple[tuple[str, str], ...]
    _leaders: MetadataCache
    _lock: Any  # threading.RLock() (a factory, not a type)
    _closed: bool
    _fatal: BaseException | None
    _node_wake: dict[str, threading.Condition]
    _workers: dict[str, int]
    _idle: dict[str, int]
    _threads: list[threading.Thread]
    _outstanding: set[_Outstanding]
    _claim_rr: int
    _calls: dict[str, grpc.UnaryUnaryMultiCallable]
    _streams: FetchStreams
    _unary_only: Downgrades
    _check_crcs: bool
    _isolation: int
    _min_bytes: int
    _max_bytes: int
    _max_wait_ms: int
    _partition_max_bytes: int
    _timeout_s: float

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
