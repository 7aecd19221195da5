"""The application's own Fetch (``Fetcher.fetch_inline``) and the followed stream it reads.

:class:`InlineFetch` is mixed into :class:`strom.client.fetcher.Fetcher`. A ``poll()`` that
would wait for caught-up partitions of one leader makes the (long-poll) Fetch itself, on the
application's thread, so that the answer lands on the thread that wants it (the why and the
numbers are in strom.client.fetcher's docstring and ``fetch_inline``'s); that Fetch
*follows* (storage.proto, ``FetchRequest.follow``): the node goes on answering it as appends
land, within a window of answers the consumer grants. A module of its own because this path
(holds, the follow's window and its end) is apart from the workers' fetches: it shares with
them only the request building and the filing of answers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import grpc

from strom.api import storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.downgrades import Downgrades
from strom.client.fetch_claims import _Claim
from strom.client.fetch_state import PartitionState
from strom.client.metadata import MetadataCache
from strom.client.streams import FollowStream
from strom.client.types import TopicPartition
from strom.errors import ErrorCode
from strom.record import InvalidBatchError

# The fetcher's logger, not this module's: users and tests filter the consumer's fetch lines
# on "strom.client.fetcher".
log = logging.getLogger("strom.client.fetcher")

#: How long past its long-poll wait a poll's own Fetch may take: a leader that stops answering
#: must not hold ``poll(timeout_ms)`` for the whole request timeout (the partition then backs
#: off and goes to the fetch threads).
INLINE_GRACE_S = 0.5
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


class InlineFetch:
    """The application's own Fetch and its follow: the holds that keep caught-up partitions
    for it, the follow's start, fit, answers and end.

    A mixin, as the other parts of :class:`strom.client.fetcher.Fetcher` are: everything
    runs under the Fetcher's lock (except the round trip itself) over its partition states.
    Every attribute is set up by ``Fetcher.__init__``; the annotations say which ones it
    uses. It calls the Fetcher's ``_open``/``_kick`` and the workers' ``_request``, ``_ask``
    and ``_fetch`` (strom.client.fetch_workers).
    """

    # -- set by Fetcher.__init__ -----------------------------------------------------------
    parts: dict[TopicPartition, PartitionState]
    _client: ClusterClient
    _client_md: tuple[tuple[str, str], ...]
    _leaders: MetadataCache
    _lock: Any  # threading.RLock() (a factory, not a type)
    _closed: bool
    _fatal: BaseException | None
    _app_fetches: bool
    _follow: _Follow | None
    _max_wait_ms: int
    _no_follow: Downgrades
    _unary_only: Downgrades

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
