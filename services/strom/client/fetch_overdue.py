"""The consumer's metadata thread: leader lookups, and Fetches to a node that stopped
answering.

:class:`OverdueFetches` is mixed into :class:`strom.client.fetcher.Fetcher`. Topics a worker,
a kick or an overdue Fetch found stale are looked up again on one thread
(``_refresh_loop``), which also watches the workers' Fetches in flight: one unanswered
``OVERDUE_GRACE_S`` past its wait has its partitions' leaders looked up again, and those that
moved leave it for their new leader (``_overdue``, ``_release_moved``; design §8). A module of
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
from strom.client.metadata import MetadataCache
from strom.errors import StromError

# The fetcher's logger, not this module's: users and tests filter the consumer's fetch lines
# on "strom.client.fetcher".
log = logging.getLogger("strom.client.fetcher")

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
