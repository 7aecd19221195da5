"""The consumer's metadata thread: leader lookups, and Fetches to a node that stopped
answering.

:class:`OverdueFetches` is mixed into :class:`strom.client.fetcher.Fetcher`. Topics a worker,
a kick or an overdue Fetch found stale are looked up again on one thread
(``_refresh_loop``), which also watches the workers' Fetches in flight: one unanswered
``OVERDUE_GRACE_S`` past its wait has its partitions' leaders looked up again, and those that
moved leave it for their new leader (``_overdue``, ``_release_moved``; design §8). A leader
that answers, but only ever empty (cut off from etcd, it goes on leading in its own view), is
checked with another node every ``QUIET_RECHECK_S`` (``_quiet_check``). A module of
its own: following a moved or hung leader is one concern, with its own thread and timers,
apart from the fetching itself.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from strom.client.cluster import ClusterClient
from strom.client.fetch_claims import _Claim, _Outstanding
from strom.client.fetch_state import PartitionState
from strom.client.metadata import MetadataCache
from strom.client.types import TopicPartition
from strom.errors import StromError

# The fetcher's logger, not this module's: users and tests filter the consumer's fetch lines
# on "strom.client.fetcher".
log = logging.getLogger("strom.client.fetcher")

#: How long past its long-poll wait a worker's Fetch may go unanswered before the leaders of
#: its partitions are looked up again (design §8): a node answers a long poll within its wait
#: plus a round trip, so a later answer means the node is slow or hung. If a partition's
#: leader moved meanwhile, the request is given up on for it and the new leader is asked at
#: once; if not, the request goes on waiting up to the request timeout (a big answer may just
#: be slow). Without it a consumer would stay on a hung (SIGSTOPped) leader for the whole
#: ``request_timeout_ms`` while its producer moved on in 2 s.
OVERDUE_GRACE_S = 1.0
#: How often an overdue Fetch's leaders are looked up again while it stays unanswered (the
#: controller moves a hung node's partitions a few seconds after it stopped answering).
OVERDUE_RECHECK_S = 1.0
#: How long a partition's Fetch answers may come back without records before the consumer
#: asks *another* node for its leader: a leader cut off from etcd keeps its last view,
#: answers every Fetch at once, empty, and names itself in its own Metadata answer, while a
#: new leader (newer epoch, which decides as in KIP-320) takes the writes. Several times any
#: long-poll wait, so an idle partition costs at most one Metadata call per this interval
#: per consumer.
QUIET_RECHECK_S = 5.0


class OverdueFetches:
    """The metadata thread's loop, and its watch over the workers' Fetches in flight.

    A mixin, as the other parts of :class:`strom.client.fetcher.Fetcher` are. Every
    attribute is set up by ``Fetcher.__init__``; the annotations say which ones it uses. It
    calls the Fetcher's ``_kick`` and ``_kick_all``.
    """

    # -- set by Fetcher.__init__ -----------------------------------------------------------
    _client: ClusterClient
    _leaders: MetadataCache
    _lock: Any  # threading.RLock() (a factory, not a type)
    _md_wake: threading.Condition
    data_ready: threading.Condition
    _fatal: BaseException | None
    _closed: bool
    _max_wait_ms: int
    _outstanding: set[_Outstanding]
    _watch_idle: bool
    parts: dict[TopicPartition, PartitionState]
    #: When the next partition's answers will have been empty for QUIET_RECHECK_S (None:
    #: none is quiet), and how many checks ran (which node to leave out when every known
    #: node leads a quiet partition).
    _quiet_due: float | None = None
    _quiet_turn: int = 0
    #: When the last check ran (None: none yet): the next comes a QUIET_RECHECK_S later.
    _quiet_last: float | None = None

    # -- metadata -------------------------------------------------------------------------

    def _stale(self, topic: str) -> None:
        """(Lock held.) Have ``topic``'s leaders looked up again, by the refresh thread."""
        self._leaders.mark_stale(topic)
        self._md_wake.notify()

    def _refresh_loop(self) -> None:
        """The metadata thread: :meth:`_refresh_rounds`; an unexpected error is raised by the
        next poll() (as a fetch worker's), not left to end the thread silently with every
        later poll() waiting for partitions nobody hands out."""
        try:
            self._refresh_rounds()
        except BaseException as exc:
            with self._lock:
                if not self._closed:
                    log.exception("strom consumer metadata thread failed")
                    self._fatal = StromError(f"the consumer's metadata thread failed: {exc!r}")
                self.data_ready.notify_all()

    def _refresh_rounds(self) -> None:
        """Refresh the topics a worker, a kick or an overdue Fetch found stale, with the
        metadata cache's backoff (exponential while refreshing does not help: no node
        answers, an election takes long, a deleted topic), then give up overdue Fetches for
        the partitions whose leader moved, and hand partitions to their (new) leaders'
        workers."""
        while True:
            check: tuple[set[str], set[str], dict[TopicPartition, str]] | None = None
            with self._lock:
                while not self._closed:
                    now = time.monotonic()
                    watch_in = self._overdue(now)  # (may mark topics stale)
                    due_in = self._leaders.next_refresh_in()
                    if due_in is not None and due_in <= 0:
                        break
                    quiet = self._quiet_due
                    if quiet is not None and quiet <= now:
                        check = self._quiet_check(now)
                        if check is not None:
                            break
                        quiet = self._quiet_due
                    for wait in (watch_in, None if quiet is None else quiet - now):
                        if wait is not None and (due_in is None or wait < due_in):
                            due_in = wait
                    # (Idle: watching no Fetch, so the next one tracked wakes it to.)
                    self._watch_idle = watch_in is None
                    self._md_wake.wait(due_in)
                    self._watch_idle = False
                if self._closed:
                    return
            try:
                if check is not None:
                    self._check_quiet_leaders(*check)
                else:
                    self._leaders.refresh_stale()
            except Exception:  # never let the refresher die: the consumer would hang
                log.exception("consumer metadata refresh failed")
            with self._lock:
                self._release_moved()
                self._kick_all()  # partitions still without a leader mark it stale again

    # -- leaders that answer nothing but empty Fetches ------------------------------------

    def _quiet(self, part: PartitionState, now: float) -> None:
        """(Lock held.) ``part``'s answer came back without records: have its leader checked
        :data:`QUIET_RECHECK_S` after the first such answer in a row unless records come
        meanwhile. Called for the first one, and for any while no check is due (a partition
        left out of the last one, paused then, is due again)."""
        if part.quiet_since is None:
            part.quiet_since = now
        due = part.quiet_since + QUIET_RECHECK_S
        if self._quiet_due is None or due < self._quiet_due:
            # (At most once per QUIET_RECHECK_S: later quiet partitions are due after it.)
            self._quiet_due = due
            self._md_wake.notify()

    def _quiet_check(
        self, now: float
    ) -> tuple[set[str], set[str], dict[TopicPartition, str]] | None:
        """(Lock held; at most once per QUIET_RECHECK_S.) The partitions quiet for
        :data:`QUIET_RECHECK_S`: their topics, the nodes not to ask (their leaders: each
        one's own answer is the one in doubt) and their leaders now; None when none is due.
        When every node known leads one of them, one leader is left out per check, in turn.

        One check per consumer takes along every partition quiet for half the interval, so
        the checks do not multiply with partitions on their own phases; each is checked
        within 1.5 x QUIET_RECHECK_S of going quiet."""
        last = self._quiet_last
        if last is not None and now < last + QUIET_RECHECK_S:
            self._quiet_due = last + QUIET_RECHECK_S
            return None
        quiet = [
            (p.quiet_since, p)
            for p in self.parts.values()
            if p.quiet_since is not None and not p.paused
        ]
        first = min((since for since, _ in quiet), default=None)
        if first is None or first + QUIET_RECHECK_S > now:
            self._quiet_due = None if first is None else first + QUIET_RECHECK_S
            return None
        due: list[PartitionState] = []
        next_due: float | None = None
        for since, part in quiet:
            if since + QUIET_RECHECK_S / 2 <= now:
                due.append(part)
                part.quiet_since = since = now  # checked now: next time a bound later
            if next_due is None or since + QUIET_RECHECK_S < next_due:
                next_due = since + QUIET_RECHECK_S
        self._quiet_last = now
        self._quiet_due = None if next_due is None else max(next_due, now + QUIET_RECHECK_S)
        leaders: dict[TopicPartition, str] = {}
        for part in due:
            leader = self._leaders.get(part.tp)
            if leader is not None and leader.address is not None:
                leaders[part.tp] = leader.address
        if not leaders:
            return None
        avoid = set(leaders.values())
        if not self._leaders.node_addresses() - avoid:
            turn = sorted(avoid)
            avoid = {turn[self._quiet_turn % len(turn)]}
        self._quiet_turn += 1
        return {tp.topic for tp in leaders}, avoid, leaders

    def _check_quiet_leaders(
        self, topics: set[str], avoid: set[str], leaders: dict[TopicPartition, str]
    ) -> None:
        """Ask a node other than those in ``avoid`` for ``topics``' leaders (one Metadata
        call, no retries: the next check comes a QUIET_RECHECK_S later); partitions that
        another node now leads, at a newer epoch (the cache keeps the newest), are fetched
        there from the next request on, at the same position."""
        try:
            self._leaders.refresh(topics, avoid=avoid)
        except StromError as exc:
            log.debug("leader check of %s without %s failed: %s", sorted(topics), avoid, exc)
            return
        with self._lock:
            for tp, address in leaders.items():
                leader = self._leaders.get(tp)
                if leader is None or leader.address in (None, address):
                    continue
                log.info(
                    "%s-%d: %s answered no records for %.0f s and is no longer its leader "
                    "(node %d is, at leader epoch %d): fetching there",
                    tp.topic,
                    tp.partition,
                    address,
                    QUIET_RECHECK_S,
                    leader.node_id,
                    leader.epoch,
                )
                part = self.parts.get(tp)
                if part is not None:
                    # A fresh bound at the new leader. (A poll's own Fetch goes by the cache
                    # too: its next one, and the end of its follow, go to the new leader.)
                    part.quiet_since = None

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
