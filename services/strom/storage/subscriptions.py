"""Subscribe streams served by a storage node: one strom Consumer per open stream.

Why a Consumer (:mod:`strom.client.consumer`) inside the node rather than reading the local
logs: a stream's partitions are led by any node and their leaders move; the Consumer already
fetches from whichever node leads each partition, follows leader changes (NOT_LEADER, a dead
leader, fenced epochs) with a short pause, prefetches with a bounded buffer and, with a
``group_id``, *is* a group member: it heartbeats to the coordinator, reconciles assignments
(KIP-848), and commits in order through :mod:`strom.client.commit_queue`. So one stream is one
group member, and closing the Consumer when the stream ends leaves the group, which moves the
stream's partitions to the group's other members at once.

Threads, and why: each subscription has one *pump* thread that polls its Consumer as Arrow
(no per-record Python), cuts the records into messages (one partition per message, bounded
records and bytes) and serializes them, then hands the bytes to the gRPC handler on the event
loop through a small bounded :class:`Outbox`. The pump blocks while the outbox is full and
the handler's ``context.write`` blocks while HTTP/2 flow control says the reader is behind, so
a slow reader holds back the pump, which stops polling, which stops the Consumer fetching
(its buffer is bounded per partition): memory per stream stays a few MiB however slow the
reader. Blocking polls run on the pump thread, never in the event loop's default executor,
which the node needs for disk work.

A rebalance is reconciled when the Consumer polls. While the pump waits for outbox room it
still lets the group reconcile every ``RECONCILE_S``: revoked partitions' unsent messages are
dropped from the outbox (the new owner reads them from the committed offset), and so is a
message of theirs the pump was about to queue. The revocation listener then queues the new
``assignment`` message and returns (which lets the member report the partitions free to the
coordinator) only once the handler's ``context.write`` of it returned: gRPC completes a
write once the transport took it within HTTP/2 flow control, so every record of the revoked
partitions the stream carries is ahead of it, and the new owner cannot start before this
stream has told its reader. What the reader's own HTTP/2 window holds ahead of that message
is the overlap left (docs/grpc-clients.md, "Subscribe"). A reader that reads nothing holds
the handover up to ``max_stall_s``, as a Kafka member that does not poll holds a rebalance up
to max.poll.interval.ms; then its stream ends (below). A group stream whose reader
reads nothing for ``max_stall_s`` while records wait (the node's ``--subscribe-max-stall-ms``,
Kafka's max.poll.interval.ms) ends with ABORTED and leaves the group, so a reader that stopped
for good does not keep its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from prometheus_client import Counter, Gauge

from strom.api import common_pb2, records_pb2
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import ErrorCode, StromError
from strom.metadata.view import RESYNC
from strom.storage.record_columns import fill_columns

if TYPE_CHECKING:
    from strom.client.consumer import Consumer
    from strom.metadata import ClusterView, WatchEvent

log = logging.getLogger("strom.storage.subscriptions")
E = ErrorCode

SUBSCRIPTIONS = Gauge(
    "strom_storage_records_subscriptions", "Open Subscribe streams by kind", ["kind"]
)
REVOCATIONS_WAITING = Gauge(
    "strom_storage_records_subscribe_revocations_waiting",
    "Group Subscribe streams holding revoked partitions until their reader's stream has taken "
    "the assignment message that tells it",
)
SUBSCRIBE_RECORDS = Counter(
    "strom_storage_records_subscribe_records",
    "Records of Subscribe streams by topic: polled from the cluster, and written to streams "
    "(a topic's series go when the topic is deleted)",
    ["stage", "topic"],
)
_STAGES = ("polled", "sent")
#: Topics SUBSCRIBE_RECORDS may have series of (a resync checks each against the view).
_counted_topics: set[str] = set()
#: Held while a series is counted (after checking its topic is live) and while a deleted
#: topic's series are dropped, so that neither a count nor a drop comes between the other's
#: check and its change.
_series_lock = threading.Lock()


def _always_live(topic: str) -> bool:
    return True


def _unknown_count(topic: str) -> int | None:
    return None


def _count_subscribe_records(
    stage: str, topic: str, n: int, topic_live: Callable[[str], bool]
) -> None:
    """Count ``n`` records of ``topic`` unless the topic is gone from the node's view.

    A pump thread keeps polling for a moment after its stream's
    handler returned (stop() does not wait), and counted "polled" for a topic whose series
    :func:`drop_deleted_topics` had just dropped: the series came back and stayed for good.
    The view is updated before its listeners run, so a count checked here after the delete
    sees the topic gone, and one before it is dropped by the listener."""
    with _series_lock:
        if not topic_live(topic):
            return
        _counted_topics.add(topic)
        SUBSCRIBE_RECORDS.labels(stage, topic).inc(n)


def drop_deleted_topics(view: ClusterView) -> Callable[[list[WatchEvent]], None]:
    """A view listener that drops SUBSCRIBE_RECORDS' series of each topic deleted from the
    node's view, as the node's per-topic counters go with the topic's replicas: otherwise a
    deleted topic stays listed for good and a topic re-created under its name adds to its
    totals. Deletes are taken from the events (not the view after them)
    so that a topic deleted and re-created in one batch of events starts again from zero."""
    prefix = view.keys.topics_prefix

    def on_events(events: list[WatchEvent]) -> None:
        gone: set[str] = set()
        for ev in events:
            if ev is RESYNC:  # (what the watch missed: whatever the view has not now)
                gone.update(t for t in list(_counted_topics) if view.topic(t) is None)
            elif ev.value is None and ev.key.startswith(prefix):
                gone.add(ev.key[len(prefix) :])
        with _series_lock:
            for topic in gone:
                _counted_topics.discard(topic)
                for stage in _STAGES:
                    with contextlib.suppress(KeyError):
                        SUBSCRIBE_RECORDS.remove(stage, topic)

    return on_events


#: How long one poll of the Consumer may wait for records.
POLL_MS = 200
#: How often a pump blocked on a full outbox lets the group reconcile a rebalance.
RECONCILE_S = 0.2
#: Messages an outbox holds before the pump waits (each <= max_bytes_per_message).
OUTBOX_MESSAGES = 4
#: Defaults of SubscribeRequest's limits.
DEFAULT_MAX_RECORDS = 1000
DEFAULT_MAX_BYTES = 1 << 20
#: Auto-commit interval of auto_commit subscriptions.
AUTO_COMMIT_S = 2.0
#: How often a stream of whole topics without a group looks for partitions added to them
#: (in the node's view of the cluster: no request).
PARTITION_GROWTH_CHECK_S = 1.0
#: How long a group stream's outbox may stay full before the stream ends (the node's
#: --subscribe-max-stall-ms; Kafka's max.poll.interval.ms default).
MAX_STALL_S = 300.0


class SubscriptionError(Exception):
    """Ends a stream with a gRPC status (``status`` names a ``grpc.StatusCode`` attribute)."""

    def __init__(self, status: str, message: str, code: int = E.UNKNOWN_SERVER_ERROR) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class StalledReaderError(SubscriptionError):
    """The reader read nothing for too long while records waited: the stream ends and its
    member leaves the group (what it had queued is dropped: the partitions move on)."""


def _stalled(max_wait_s: float) -> StalledReaderError:
    return StalledReaderError(
        "ABORTED",
        f"the reader read nothing for {max_wait_s * 1000:.0f} ms while records "
        "waited (the node's --subscribe-max-stall-ms): the stream left the group "
        "and its partitions moved to other members; subscribe again",
        E.UNKNOWN_MEMBER_ID,
    )


@dataclass(slots=True)
class Item:
    """One outbox entry: a serialized SubscribeResponse, or the error ending the stream."""

    data: bytes = b""
    tp: TopicPartition | None = None
    next_offset: int = -1
    records: int = 0
    error: SubscriptionError | None = None
    #: Set once the handler's context.write of ``data`` returned (revocation assignments).
    written: threading.Event | None = None


class Outbox:
    """Bounded hand-over from a pump thread to the stream's handler on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int = OUTBOX_MESSAGES) -> None:
        self._loop = loop
        self._capacity = capacity
        self._items: deque[Item] = deque()
        self._cond = threading.Condition()
        self._ready = asyncio.Event()
        self._closed = False
        #: Seconds the handler has held messages back for the caller's quota (the current
        #: hold, if any, began at ``_held_since``): not the reader stalling.
        self._held_s = 0.0
        self._held_since: float | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The handler holds the stream's next message back for the caller's quota (event
        loop): the time inside does not count towards a stalled reader (:meth:`held_s`).
        A group stream held by its caller's fetch quota was ended
        ABORTED as a stalled reader and left its group, though the node held it."""
        with self._cond:
            self._held_since = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                if self._held_since is not None:
                    self._held_s += time.monotonic() - self._held_since
                self._held_since = None

    def held_s(self) -> float:
        """Seconds the handler has held messages back for the caller's quota so far, the
        current hold included (any thread)."""
        with self._cond:
            since = self._held_since
            return self._held_s + (time.monotonic() - since if since is not None else 0.0)

    def stalled_for(self, started: float, held_at_start: float) -> float:
        """Seconds since ``started`` (time.monotonic) that the reader took nothing, less what
        the handler held back for the quota since then (``held_at_start``: held_s() then)."""
        return time.monotonic() - started - (self.held_s() - held_at_start)

    def put(
        self,
        item: Item,
        idle: Callable[[], None] | None = None,
        max_wait_s: float | None = None,
        admit: Callable[[], bool] | None = None,
    ) -> bool:
        """Append (pump thread), waiting while full; ``idle`` runs every RECONCILE_S of
        waiting. False once the outbox is closed (the item is dropped). Raises
        StalledReaderError when still full after ``max_wait_s``. ``admit`` is asked again
        before appending: an ``idle`` reconcile may have revoked the item's partition, and its
        records must not follow the assignment message that took it away (the item is then
        dropped, True)."""
        started, held = time.monotonic(), self.held_s()
        with self._cond:
            while len(self._items) >= self._capacity and not self._closed:
                if admit is not None and not admit():
                    return True
                if max_wait_s is not None and self.stalled_for(started, held) > max_wait_s:
                    raise _stalled(max_wait_s)
                if not self._cond.wait(RECONCILE_S) and idle is not None:
                    self._cond.release()
                    try:
                        idle()
                    finally:
                        self._cond.acquire()
            if self._closed:
                return False
            if admit is not None and not admit():
                return True
            self._items.append(item)
        self._wake()
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def put_now(self, item: Item) -> None:
        """Append without waiting for room (small control messages and errors)."""
        with self._cond:
            if self._closed:
                return
            self._items.append(item)
        self._wake()

    def purge(self, tps: Iterable[TopicPartition]) -> int:
        """Drop queued records of ``tps`` (revoked partitions); returns how many messages."""
        drop = set(tps)
        with self._cond:
            keep = deque(i for i in self._items if i.tp is None or i.tp not in drop)
            n = len(self._items) - len(keep)
            self._items = keep
            self._cond.notify_all()
        return n

    def close(self, final: Item | None = None, *, drop_queued: bool = False) -> None:
        """No more puts; ``final`` (an error) is delivered after what is queued (or instead
        of it, with ``drop_queued``)."""
        with self._cond:
            if drop_queued and not self._closed:
                self._items.clear()
            if not self._closed and final is not None:
                self._items.append(final)
            self._closed = True
            self._cond.notify_all()
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is reading
            self._loop.call_soon_threadsafe(self._ready.set)

    async def get(self, timeout: float | None = None) -> Item | None:
        """The next item (event loop); None when closed and drained.

        Raises:
            TimeoutError: ``timeout`` seconds passed with nothing to hand over (nothing is
                lost: a later call gets what comes).
        """
        while True:
            with self._cond:
                if self._items:
                    item = self._items.popleft()
                    self._cond.notify_all()
                    return item
                if self._closed:
                    return None
                self._ready.clear()
            if timeout is None:
                await self._ready.wait()
            else:
                await asyncio.wait_for(self._ready.wait(), timeout)


@dataclass
class SubscriptionSpec:
    """What a SubscribeRequest asks for, validated."""

    group_id: str | None
    topics: list[str]
    #: Explicit partitions: TopicPartition -> ("offset"|"timestamp"|"position", value).
    starts: dict[TopicPartition, tuple[str, int]] = field(default_factory=dict)
    earliest: bool = False
    auto_commit: bool = False
    max_records: int = DEFAULT_MAX_RECORDS
    max_bytes: int = DEFAULT_MAX_BYTES
    read_committed: bool = False
    #: Without a group: the topics asked for whole (``topics``), whose partitions added
    #: while the stream runs are read too.
    whole_topics: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "group" if self.group_id else "partitions"


class Subscription:
    """One open stream: its Consumer, pump thread and outbox (see the module docstring)."""

    def __init__(
        self,
        spec: SubscriptionSpec,
        bootstrap: list[str],
        loop: asyncio.AbstractEventLoop,
        *,
        client_id: str,
        consumer_factory: Callable[..., Consumer] | None = None,
        max_stall_s: float = MAX_STALL_S,
        topic_live: Callable[[str], bool] = _always_live,
        partition_count: Callable[[str], int | None] = _unknown_count,
        host_node: tuple[int, str] | None = None,
    ) -> None:
        self.spec = spec
        #: (node id, incarnation id) of the node serving the stream, sent with the member's
        #: heartbeats so the coordinator removes the member once this node process leaves
        #: the cluster, rather than after the session timeout (DESIGN §7).
        self._host_node = host_node
        #: The node's partition count of a topic (None: not known), for whole topics.
        self._partition_count = partition_count
        self._next_growth_check = time.monotonic() + PARTITION_GROWTH_CHECK_S
        #: Whether a topic is in the node's view: records of one that is not are not
        #: counted (see :func:`_count_subscribe_records`).
        self._topic_live = topic_live
        #: How long a group stream's outbox may stay full (see the module docstring).
        self._max_stall_s = max_stall_s
        self.id = uuid.uuid4().hex
        self.outbox = Outbox(loop)
        #: The outbox's held_s() when the pump last told the group it was held, not stalled.
        self._held_seen = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: Partitions the stream reads now (the group's assignment, or the explicit ones).
        self._owned: set[TopicPartition] = set()
        #: Highest offset this subscription has committed (or queued) per partition.
        self._committed: dict[TopicPartition, int] = {}
        #: Highest offset the coordinator confirmed per partition: what ``_committed`` goes
        #: back to when a later commit fails, so an older offset still cannot overwrite it.
        self._acked: dict[TopicPartition, int] = {}
        #: Offset after the last record written to the stream, per partition.
        self._delivered: dict[TopicPartition, int] = {}
        #: Revocations per partition so far: a message polled before one is not queued after.
        self._revocations: dict[TopicPartition, int] = {}
        self._delivered_since_commit = False
        self._next_auto_commit = time.monotonic() + AUTO_COMMIT_S
        self._bootstrap = bootstrap
        self._client_id = client_id
        if consumer_factory is None:
            # Here, not at the top: the client consumer (~30 ms of imports) is for nodes
            # that serve a Subscribe stream, not for every node start.
            from strom.client.consumer import Consumer as consumer_factory
        self._consumer_factory = consumer_factory
        #: Made on the pump thread (its constructor starts threads and connections).
        self.consumer: Consumer | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"strom-subscribe-{self.id[:8]}", daemon=True
        )
        self.closed = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        SUBSCRIPTIONS.labels(self.spec.kind).inc()
        self._thread.start()

    def stop(self) -> None:
        """End the subscription (any thread, never blocks): the pump closes the Consumer,
        which leaves the group."""
        self._stop.set()
        self.outbox.close()

    def end_with(self, status: str, message: str, code: int) -> None:
        """End the stream with an error status (node shutdown), then stop."""
        self.outbox.close(Item(error=SubscriptionError(status, message, code)))
        self.stop()

    def join(self, timeout_s: float) -> bool:
        return self.closed.wait(timeout_s)

    @property
    def member_id(self) -> str:
        group = self.consumer._group if self.consumer is not None else None
        return getattr(group, "member_id", "") if group is not None else ""

    def owned(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._owned)

    def ever_revoked(self, tp: TopicPartition) -> bool:
        """Whether the group took ``tp`` from this stream at some point (a commit of it is
        then refused as moved; one of a partition never assigned here says so instead)."""
        with self._lock:
            return tp in self._revocations

    # -- the pump thread --------------------------------------------------------------------

    def _run(self) -> None:
        spec = self.spec
        try:
            self.consumer = self._consumer_factory(
                self._bootstrap,
                group_id=spec.group_id,
                client_id=self._client_id,
                auto_offset_reset="earliest" if spec.earliest else "latest",
                isolation_level="read_committed" if spec.read_committed else "read_uncommitted",
                enable_auto_commit=False,
                # A CommitOffsets call waits for its commit: no lingering (they still merge
                # while one is in flight).
                commit_linger_ms=0,
                # The pump waiting on a full outbox is out of poll(): the stall bound below
                # ends the stream first; this is the Consumer's own backstop.
                max_poll_interval_ms=max(1, int(self._max_stall_s * 2000)),
            )
            # Polled by this pump thread only; CommitOffsets calls queue their commits from
            # the event loop meanwhile (commit_async), as they did before the consumer's
            # one-thread guard, which would refuse them.
            self.consumer._shared = True
            if spec.group_id:
                group = self.consumer._group
                if group is not None and self._host_node is not None:
                    group.host_node = self._host_node
                self.consumer.subscribe(spec.topics, listener=self)
                self._emit_assignment()
            else:
                self._assign()
            while not self._stop.is_set():
                table = self.consumer.poll_arrow(
                    timeout_ms=POLL_MS, max_records=spec.max_records * 8
                )
                if table.num_rows:
                    self._emit_records(table)
                self._maybe_auto_commit()
                self._follow_partition_growth()
        except SubscriptionError as exc:
            self.outbox.close(Item(error=exc), drop_queued=isinstance(exc, StalledReaderError))
            if isinstance(exc, StalledReaderError):
                log.warning("subscription %s: %s", self.id, exc.message)
        except StromError as exc:
            if not self._stop.is_set():
                log.warning("subscription %s failed: %s", self.id, exc)
                status = "UNAVAILABLE" if exc.retriable else "FAILED_PRECONDITION"
                err = SubscriptionError(status, str(exc), exc.code or E.UNKNOWN_SERVER_ERROR)
                self.outbox.close(Item(error=err))
        except Exception as exc:
            if not self._stop.is_set():
                log.exception("subscription %s failed", self.id)
                err = SubscriptionError("INTERNAL", f"{type(exc).__name__}: {exc}")
                self.outbox.close(Item(error=err))
        finally:
            self.outbox.close()
            try:
                if self.consumer is not None:
                    self._commit_delivered(final=True)
                    self.consumer.close(autocommit=False, timeout_ms=5000)
            except Exception:
                log.exception("closing the consumer of subscription %s failed", self.id)
            SUBSCRIPTIONS.labels(spec.kind).dec()
            self.closed.set()

    def _assign(self) -> None:
        """Explicit partitions: assign, then seek each to its start."""
        c = self.consumer
        assert c is not None
        tps = list(self.spec.starts)
        c.assign(tps)
        times = {tp: v for tp, (how, v) in self.spec.starts.items() if how == "timestamp"}
        found = c.offsets_for_times(times) if times else {}
        ends: list[TopicPartition] = []
        begins: list[TopicPartition] = []
        for tp, (how, v) in self.spec.starts.items():
            if how == "offset":
                c.seek(tp, v)
            elif how == "timestamp":
                hit = found.get(tp)
                if hit is None:
                    ends.append(tp)
                else:
                    c.seek(tp, hit.offset)
            elif v == records_pb2.START_POSITION_EARLIEST:
                begins.append(tp)
            else:
                ends.append(tp)
        if begins:
            c.seek_to_beginning(begins)
        if ends:
            c.seek_to_end(ends)
        for tp in tps:  # resolve lazily-looked-up starts now, so "latest" means now
            c.position(tp)
        with self._lock:
            self._owned = set(tps)
        self._emit_assignment()

    def _follow_partition_growth(self) -> None:
        """Whole topics without a group: read the partitions added since the stream began.
        The stream kept the partitions of its start for ever, while
        a group stream picks new ones up at its next rebalance. They start at their earliest
        offset: every record in them was written after the stream began."""
        if not self.spec.whole_topics or time.monotonic() < self._next_growth_check:
            return
        self._next_growth_check = time.monotonic() + PARTITION_GROWTH_CHECK_S
        owned = self.owned()
        added = [
            TopicPartition(topic, p)
            for topic in self.spec.whole_topics
            for p in range(self._partition_count(topic) or 0)
            if TopicPartition(topic, p) not in owned
        ]
        if not added:
            return
        c = self.consumer
        assert c is not None
        try:
            c.assign([*owned, *added])  # partitions kept keep their positions
        except StromError as exc:  # the consumer does not know them yet: the next check
            log.info("subscription %s: new partitions not readable yet: %s", self.id, exc)
            return
        c.seek_to_beginning(added)
        with self._lock:
            self._owned |= set(added)
        self._emit_assignment()

    # Rebalance listener (called by the group member on the pump thread, inside poll).
    def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
        with self._lock:
            self._owned |= set(parts)
        self._emit_assignment()

    def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
        self._release(parts)

    def on_partitions_lost(self, parts: list[TopicPartition]) -> None:
        self._release(parts, lost=True)

    def _release(self, parts: list[TopicPartition], *, lost: bool = False) -> None:
        """Give ``parts`` up (the member's listener, on the pump thread, before the member
        reports them free). The assignment message used to be only
        queued, behind everything already in flight, and the partitions freed at once: the
        new owner read them while this stream, its reader behind, kept delivering them for
        seconds. Now the message is written before returning (see the module docstring);
        commits of ``parts`` are still accepted meanwhile: the group has not moved them yet."""
        with self._lock:
            for tp in parts:
                self._revocations[tp] = self._revocations.get(tp, 0) + 1
            keep = self._owned - set(parts)
        dropped = self.outbox.purge(parts)
        item = self._emit_assignment(keep)
        waited = 0.0
        if not lost:  # lost: the group already took them; nothing to hold
            waited = self._await_written(item)
            self._commit_delivered(only=set(parts))
        with self._lock:
            self._owned -= set(parts)
            for tp in parts:
                self._delivered.pop(tp, None)
                self._committed.pop(tp, None)
                self._acked.pop(tp, None)
        log.info(
            "subscription %s: %s %d partitions (%d unsent messages dropped; the stream took "
            "the assignment after %.0f ms)",
            self.id,
            "lost" if lost else "gave up",
            len(parts),
            dropped,
            waited * 1000,
        )

    def _await_written(self, item: Item) -> float:
        """Wait until the handler wrote ``item`` (or the stream ended); returns how long.
        A reader that takes nothing for ``max_stall_s`` ends the stream as a stalled one, so
        the member leaves and the partitions move anyway."""
        assert item.written is not None
        started, held = time.monotonic(), self.outbox.held_s()
        REVOCATIONS_WAITING.inc()
        try:
            while not item.written.is_set():
                if self._stop.is_set() or self.outbox.closed:  # nobody will write it
                    break
                if self.outbox.stalled_for(started, held) > self._max_stall_s:
                    err = _stalled(self._max_stall_s)
                    log.warning("subscription %s: %s", self.id, err.message)
                    self.outbox.close(Item(error=err), drop_queued=True)
                    self._stop.set()
                    break
                item.written.wait(RECONCILE_S)
        finally:
            REVOCATIONS_WAITING.dec()
        return time.monotonic() - started

    def _emit_assignment(self, owned: set[TopicPartition] | None = None) -> Item:
        msg = records_pb2.SubscribeResponse()
        a = msg.assignment
        a.subscription_id = self.id
        a.member_id = self.member_id
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(self.owned() if owned is None else owned):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        for topic, parts in by_topic.items():
            a.partitions.append(common_pb2.TopicPartitions(topic=topic, partitions=parts))
        item = Item(data=msg.SerializeToString(), written=threading.Event())
        self.outbox.put_now(item)
        return item

    def _reconcile_while_waiting(self) -> None:
        """Outbox full: let the group hand over revoked partitions without taking records."""
        group = self.consumer._group if self.consumer is not None else None
        if group is not None and not self._stop.is_set():
            held = self.outbox.held_s()
            if held > self._held_seen:
                # Held by the node for the caller's quota, not stalled: the Consumer's own
                # max_poll_interval backstop must not count it either.
                self._held_seen = held
                group.polling(False)
            try:
                group.on_poll(self.consumer)
            except StromError as exc:
                log.warning("subscription %s: group error while waiting: %s", self.id, exc)

    def _emit_records(self, table: pa.Table) -> None:
        if self._stop.is_set():  # the stream ended: nothing is delivered, nor counted
            return
        with self._lock:
            owned = set(self._owned)
            revocations = dict(self._revocations)

        def current(tp: TopicPartition) -> bool:
            # A reconcile while waiting for room could revoke the
            # partition of the message being queued, which then followed the assignment
            # message that took the partition away, or of a later one of this poll, whose
            # highwater() then failed the stream (the partition no longer assigned).
            return self._revocations.get(tp, 0) == revocations.get(tp, 0)

        for tp, part in _by_partition(table):
            _count_subscribe_records("polled", tp.topic, part.num_rows, self._topic_live)
            if tp not in owned or not current(tp):  # revoked during the poll, or since
                continue
            hw = self.consumer.highwater(tp)
            admit = functools.partial(current, tp)
            for chunk in split_records(part, self.spec.max_records, self.spec.max_bytes):
                if not admit():
                    break
                msg = records_pb2.SubscribeResponse()
                encode_partition_records(msg.records, tp, chunk, -1 if hw is None else hw)
                last = int(chunk.column("offset")[-1].as_py())
                item = Item(msg.SerializeToString(), tp, last + 1, chunk.num_rows)
                stall = self._max_stall_s if self.spec.group_id else None
                if not self.outbox.put(item, self._reconcile_while_waiting, stall, admit):
                    return

    # -- delivery and commits ---------------------------------------------------------------

    def delivered(self, item: Item) -> None:
        """The handler wrote ``item`` to the stream (event loop)."""
        if item.written is not None:
            item.written.set()
        if item.tp is None:
            return
        _count_subscribe_records("sent", item.tp.topic, item.records, self._topic_live)
        with self._lock:
            self._delivered[item.tp] = item.next_offset
            self._delivered_since_commit = True

    def _maybe_auto_commit(self) -> None:
        if self.spec.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + AUTO_COMMIT_S
            self._commit_delivered()

    def _commit_delivered(
        self, only: set[TopicPartition] | None = None, final: bool = False
    ) -> None:
        """auto_commit: commit the offsets after the records written to the stream."""
        if not (self.spec.auto_commit and self.spec.group_id):
            return
        with self._lock:
            if not self._delivered_since_commit and only is None:
                return
            self._delivered_since_commit = False
            offsets = {tp: off for tp, off in self._delivered.items() if only is None or tp in only}
        if offsets:
            self.commit(offsets, None, wait_s=5.0 if (final or only) else 0.0)

    def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        done: Callable[[BaseException | None, dict[TopicPartition, int]], None] | None,
        *,
        metadata: Mapping[TopicPartition, str] | None = None,
        wait_s: float = 0.0,
    ) -> dict[TopicPartition, int]:
        """Queue a commit of ``offsets`` (forward-only per partition, see CommitOffsetsRequest)
        in this member's ordered commit queue. Returns the per-partition codes decided here
        (NONE for an offset already committed, STALE_MEMBER_EPOCH for a partition the stream
        does not own); ``done(error, sent)`` runs on the commit thread once the rest is
        stored. With ``wait_s`` the call waits for that (pump-thread callers)."""
        decided: dict[TopicPartition, int] = {}
        send: dict[TopicPartition, OffsetAndMetadata] = {}
        with self._lock:
            for tp, off in offsets.items():
                if tp not in self._owned:
                    decided[tp] = E.STALE_MEMBER_EPOCH
                elif off <= self._committed.get(tp, -1):
                    decided[tp] = E.NONE
                else:
                    send[tp] = OffsetAndMetadata(off, (metadata or {}).get(tp, ""))
                    self._committed[tp] = off
        if not send:
            if done is not None:
                done(None, {})
            return decided
        sent = {tp: om.offset for tp, om in send.items()}
        finished = threading.Event()

        def callback(_offsets: Any, err: BaseException | None) -> None:
            with self._lock:
                for tp, off in sent.items():
                    if err is None:
                        if tp in self._owned and off > self._acked.get(tp, -1):
                            self._acked[tp] = off
                    elif self._committed.get(tp) == off:
                        # Let a later commit send this offset again, but keep the last one
                        # the coordinator confirmed as the floor: forgetting it (found from
                        # outside) let an older offset overwrite it after a refused commit.
                        acked = self._acked.get(tp)
                        if acked is None:
                            self._committed.pop(tp, None)
                        else:
                            self._committed[tp] = acked
            try:
                if done is not None:
                    done(err, sent)
            finally:
                finished.set()

        try:
            if self.consumer is None:
                raise StromError("the subscription is not running yet", retriable=True)
            self.consumer.commit_async(send, callback)
        except StromError as exc:  # closed
            callback(None, exc)
        if wait_s > 0:
            finished.wait(wait_s)
        return decided


def _by_partition(table: pa.Table) -> list[tuple[TopicPartition, pa.Table]]:
    """Split a poll's table into one table per partition, keeping offset order. The poll's
    pieces each hold one partition's records (the fetcher drains partition by partition),
    so only the first row of each piece is looked at."""
    pieces: dict[TopicPartition, list[pa.RecordBatch]] = {}
    for batch in table.to_batches():
        if batch.num_rows:
            tp = TopicPartition(batch.column(0)[0].as_py(), batch.column(1)[0].as_py())
            pieces.setdefault(tp, []).append(batch)
    return [(tp, pa.Table.from_batches(bs)) for tp, bs in pieces.items()]


def _record_sizes(table: pa.Table) -> np.ndarray:
    """Bytes of key + value of each record (nulls count 0)."""
    import pyarrow.compute as pc  # (here: ~60 ms at import, for a node's every start)

    total = np.zeros(table.num_rows, dtype=np.int64)
    for name in ("key", "value"):
        lengths = pc.fill_null(pc.binary_length(table.column(name)), 0)
        total += lengths.to_numpy().astype(np.int64)
    return total


def split_records(table: pa.Table, max_records: int, max_bytes: int) -> list[pa.Table]:
    """Zero-copy slices of at most ``max_records`` records and ``max_bytes`` of keys and
    values each (a single larger record still gets a slice of its own). The loop runs per
    slice, not per record."""
    n = table.num_rows
    if n == 0:
        return []
    # table.nbytes bounds the keys' and values' bytes from above (it adds offsets and the
    # other columns), so a table under the limit needs no per-record sizes at all.
    if n <= max_records and table.nbytes <= max_bytes:
        return [table]
    cum = np.cumsum(_record_sizes(table))
    out = []
    start = 0
    while start < n:
        base = int(cum[start - 1]) if start else 0
        end = int(np.searchsorted(cum, base + max_bytes, side="right"))
        end = min(max(end, start + 1), start + max_records, n)
        out.append(table.slice(start, end - start))
        start = end
    return out


def encode_partition_records(
    out: records_pb2.PartitionRecords, tp: TopicPartition, table: pa.Table, high_watermark: int
) -> None:
    """Fill one PartitionRecords message from decoded records (offset, timestamp, key,
    value, headers columns)."""
    out.topic = tp.topic
    out.partition = tp.partition
    out.high_watermark = high_watermark
    offsets = table.column("offset")
    out.offsets.extend(offsets.to_numpy().tolist())
    fill_columns(table, out.records)
