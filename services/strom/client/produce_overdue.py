"""Produce requests to a leader that stopped answering: the sender's watch over its requests
in flight, and the attempts it gives up once a partition's leader moved.

:class:`OverdueRequests` is mixed into :class:`strom.client.producer.Producer` (through
:class:`strom.client.sender.SenderLoop`): each time the sender wakes with requests in
flight it looks at the oldest (``_overdue``); one unanswered ``OVERDUE_GRACE_S`` has its
partitions' leaders looked up again, and once one moved the attempt is given up as one that
reached its deadline (the rules, and why, are in strom.client.sender's docstring). The
coordinator's and the storage nodes' own producers use the same timers
(``OVERDUE_GRACE_S``, ``OVERDUE_RECHECK_S``, still imported from strom.client.sender). A
module of its own: following a hung leader is one concern, apart from sending and answers.
"""

from __future__ import annotations

import logging

import grpc

from strom.client.cluster import ClusterClient
from strom.client.metadata import MetadataCache, PartitionLeader
from strom.client.produce_answers import _earlier, _Shipment
from strom.client.streams import StreamError
from strom.client.types import TopicPartition

# The producer's logger, not this module's: users filter the producer's lines on
# "strom.client.producer", and the sender's were always among them.
log = logging.getLogger("strom.client.producer")

#: How long a Produce request may go unanswered before the leaders of its partitions are
#: looked up again (design §8; ``SenderLoop._overdue``). A healthy node answers acks=0/1 in
#: milliseconds; with acks=all it may rightly hold a request longer, waiting for slow
#: replicas (up to the request's ``timeout_ms``). The same grace serves both: a lookup
#: costs one Metadata call (on the metadata thread, hedged), and only a *moved* leader
#: makes the producer act. A leader that moved cannot commit the request any more (its
#: ``_await_commit`` answers NOT_LEADER_OR_FOLLOWER at best), so giving the attempt up loses
#: nothing the wait could have brought. Without it, batches in flight to a hung leader
#: (SIGSTOP, a GC pause, a network partition) waited out ``request_timeout_ms`` (30 s)
#: although the controller had moved the partition within 2-3 s.
OVERDUE_GRACE_S = 1.0
#: How often an overdue request's leaders are looked up again while it stays unanswered
#: (the controller moves a hung node's partitions once its etcd session ends).
OVERDUE_RECHECK_S = 1.0


class _Outstanding:
    """A Produce request in flight, watched by the sender (``SenderLoop._overdue``): past
    ``due`` its partitions' leaders are looked up again and, if one moved away, the attempt
    is given up as if it had timed out (its late answer, if any, is ignored)."""

    __slots__ = ("addr", "checked", "due", "entries")

    def __init__(self, addr: str, entries: list[_Shipment], due: float) -> None:
        self.addr = addr
        self.entries = entries
        #: When it is overdue (then: when its leaders are looked up again).
        self.due = due
        #: Its leaders were asked for since it became overdue.
        self.checked = False


class OverdueRequests:
    """The sender's watch over its requests in flight (``_overdue``) and the test of a moved
    leader (``_moved``, ``_moved_entry``).

    A mixin, as :class:`strom.client.sender.SenderLoop` is; it runs on the sender thread.
    Every attribute is set up by ``Producer.__init__``; the annotations say which ones it
    uses. It hands the requests it gives up to ``_complete``
    (strom.client.produce_answers).
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    _client: ClusterClient
    _metadata: MetadataCache
    _leaders: dict[TopicPartition, PartitionLeader]
    #: Requests in flight, oldest first; touched by the sender thread only.
    _outstanding: dict[_Outstanding, None]

    def _overdue(self, now: float) -> float | None:
        """On the sender thread, each time it wakes while requests are in flight: give up the
        attempts of requests unanswered :data:`OVERDUE_GRACE_S` whose partitions' leader
        moved; seconds until the next look is due (None: nothing to watch).

        The normal path costs one look at the oldest request in flight (no timer per
        request): answers come in milliseconds, so it is rarely due. Once it is, every
        request is looked at: an overdue one has its topics marked stale (the metadata
        thread looks them up, hedged, and wakes the sender) and its node demoted (asked
        last for metadata: it may be hung), again every :data:`OVERDUE_RECHECK_S` while it
        stays unanswered. A node answers a stream's requests in order, so the requests sent
        to it after an overdue one count as overdue too.

        A request with a partition whose leader is now another node, or the same node under
        a higher leader epoch, is given up as a whole, exactly as an attempt that reached
        its deadline (DEADLINE_EXCEEDED): "no answer, may have been written", retried after
        the backoff, in sequence order, its partitions' other requests drained first (they
        are given up too, by the same rule). Its partitions whose leader did not move go
        back to the same node; with idempotence the new leader (and the old one) answer a
        batch it already has with its original offsets (DESIGN §6), and with acks=all only
        once it is committed. Without idempotence such a retry may write a batch twice,
        exactly as after a timeout today: the rule is the same for both (the old leader can
        no longer commit what it holds, and the cluster has already moved on from it). Its
        late answer, if one comes, is ignored (``_complete`` finds it no longer in
        ``_outstanding``). A unary call cannot be cancelled from here and simply ends at its
        deadline; a stream's is dropped with the stream when the watchdog cancels it."""
        out = self._outstanding
        first = next(iter(out))
        if not first.checked and first.due > now:
            return first.due - now
        given_up: list[_Outstanding] = []
        hung: set[str] = set()
        next_due: float | None = None
        for tracked in out:
            if tracked.checked or tracked.due <= now or tracked.addr in hung:
                hung.add(tracked.addr)
                if self._moved(tracked):
                    given_up.append(tracked)
                    continue
                if tracked.due <= now:
                    if not tracked.checked:  # (debug: acks=all may wait for slow replicas)
                        log.debug(
                            "no Produce answer from %s within %.1f s; looking its "
                            "partitions' leaders up again",
                            tracked.addr,
                            OVERDUE_GRACE_S,
                        )
                    self._client.demote(tracked.addr)
                    for topic in {e.pq.topic for e in tracked.entries}:
                        self._metadata.mark_stale(topic)
                    tracked.checked = True
                    tracked.due = now + OVERDUE_RECHECK_S
            next_due = _earlier(next_due, tracked.due - now)
        for tracked in given_up:
            del out[tracked]
            moved = sorted(
                {
                    f"{e.pq.topic}-{e.pq.partition}"
                    for e in tracked.entries
                    if self._moved_entry(e, tracked.addr)
                }
            )
            log.info(
                "no Produce answer from %s for %s, whose leader moved: retrying at the new leader",
                tracked.addr,
                ", ".join(moved),
            )
            self._complete(
                tracked.addr,
                tracked.entries,
                None,
                StreamError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no answer from {tracked.addr} and the leader of {', '.join(moved)} moved",
                ),
            )
        return next_due

    def _moved(self, tracked: _Outstanding) -> bool:
        """Whether a partition of the request has another leader now (see :meth:`_overdue`)."""
        return any(self._moved_entry(e, tracked.addr) for e in tracked.entries)

    def _moved_entry(self, entry: _Shipment, addr: str) -> bool:
        """Whether ``entry``'s partition is now led by another node than ``addr``, or by it
        under a higher epoch than the request was sent with (an epoch unknown then, -1,
        proves nothing). A partition without a live leader (the controller has not elected
        one yet) has not moved: the request goes on waiting."""
        leader = self._leaders.get((entry.pq.topic, entry.pq.partition))
        return (
            leader is not None
            and leader.address is not None
            and (leader.address != addr or 0 <= entry.leader_epoch < leader.epoch)
        )
