"""The strom Consumer: reads records from assigned partitions, with Kafka's client conventions
(kafka-python / confluent-kafka names and semantics, DESIGN §1) so that habits carry over.

    from strom.client.consumer import Consumer
    from strom.client.types import TopicPartition

    with Consumer("127.0.0.1:9092", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("events", 0)])
        for record in consumer:              # blocks for records; ends on close()
            handle(record.offset, record.value)

        table = consumer.poll_arrow(timeout_ms=500)   # or columns, without per-record Python

The fetch work happens on background threads, per leader node (:mod:`strom.client.fetcher`):
while the application handles what ``poll()`` returned, the next Fetch is already in flight.
Offset lookups (``position`` of a new assignment, ``seek_to_*``, ``*_offsets``,
``offsets_for_times``) go to the partition leaders with ListOffsets
(:mod:`strom.client.offsets`).

Consumer groups (``subscribe``, ``commit``, ``committed``) are served by the group
coordinator through :mod:`strom.client.group_member`, plugged in as ``Consumer._group`` (see
:class:`GroupMembership`): the consumer calls it where a group needs a say (each poll, initial
positions, commit, close), and its heartbeat thread runs beside the application's.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from strom.client import forks
from strom.client.cluster import ClusterClient
from strom.client.fetcher import CONSUMER_SCHEMA, Fetcher
from strom.client.group_member import make_group
from strom.client.kwnames import (
    INT32_MAX,
    INT64_MAX,
    INT_MS_MAX,
    LONG_MS_MAX,
    MAX_WAIT_S,
    bool_option,
    int_option,
    kafka_keywords,
    str_option,
    wait_limit,
)
from strom.client.membership import GroupMembership
from strom.client.memory import keep_freed_buffers
from strom.client.offsets import EARLIEST, LATEST, OffsetResult, list_offsets
from strom.client.stats import GroupStats, PollStats, tagged
from strom.client.transactions import GroupMetadata
from strom.client.types import (
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
    checked_offsets,
)
from strom.client.types import checked_topic_partition as _topic_partition
from strom.errors import (  # IllegalStateError, NoOffsetForPartitionError: re-exported here too
    ConcurrentModificationError,
    IllegalStateError,
    InvalidGroupIdError,
    NoOffsetForPartitionError,
    RecordDeserializationError,
    RequestTimedOutError,
    StromError,
)
from strom.grpc_options import MAX_BATCH_BYTES
from strom.record import Record
from strom.security.channel import client_security

MiB = 1024 * 1024
log = logging.getLogger(__name__)

AUTO_OFFSET_RESET = ("latest", "earliest", "none")
_client_ids = itertools.count(1)
#: Longest a group member's poll() blocks in a Fetch of its own: a new assignment waits for
#: the call to end (a poll waiting on a condition is woken at once).
GROUP_INLINE_WAIT_S = 0.2

__all__ = [
    "CONSUMER_SCHEMA",
    "ConcurrentModificationError",
    "Consumer",
    "GroupMembership",
    "GroupsNotSupportedError",
    "IllegalStateError",
    "NoOffsetForPartitionError",
]


class GroupsNotSupportedError(StromError, NotImplementedError):
    """Consumer groups need the group coordinator, which this strom version does not have yet.
    Also a NotImplementedError, so generic handlers recognise it."""


F = TypeVar("F", bound=Callable[..., Any])


def _one_thread(method: F) -> F:
    """Guard a Consumer method that reads or moves positions (Kafka's acquire()): one
    thread at a time may be inside such a call; a second thread entering meanwhile gets
    :class:`ConcurrentModificationError` at once instead of racing over the positions (found
    from outside: four threads polling one consumer got thousands of records twice, skipped
    offsets, and an IndexError from the fetcher). The owner may re-enter (a rebalance
    listener's commit() inside poll()). ``close()`` stays callable from any thread, as
    documented. The marker is a lock taken without blocking: a poll pays for one acquire."""

    @functools.wraps(method)
    def guarded(self: Consumer, *args: Any, **kwargs: Any) -> Any:
        if self._forked_from:  # (before the marker, which a parent's thread may hold)
            raise forks.error(self)
        me = threading.get_ident()
        if self._owner == me or self._lent or self._shared:
            return method(self, *args, **kwargs)
        if not self._entry.acquire(blocking=False):
            raise ConcurrentModificationError(
                f"{method.__name__.lstrip('_')}(): the consumer is in use by another thread "
                "(a Consumer is not safe for multi-threaded access): poll, commit, seek and "
                "assign from "
                "one thread, or give each thread its own consumer; close() may be called "
                "from any thread"
            )
        self._owner = me
        try:
            return method(self, *args, **kwargs)
        finally:
            self._owner = 0
            self._entry.release()

    return guarded  # type: ignore[return-value]


def _topic_partitions(tps: Any, what: str) -> list[TopicPartition]:
    if isinstance(tps, (str, bytes, TopicPartition)):
        raise TypeError(f"{what} takes a list of TopicPartition, got {tps!r}")
    return list(dict.fromkeys(_topic_partition(tp) for tp in tps))


def _timeout_s(timeout_ms: Any, what: str) -> float:
    """A call's ``timeout_ms`` in seconds: a number of milliseconds >= 0 (not a bool, not NaN:
    a NaN deadline is never reached nor passed), else TypeError / ValueError naming ``what``."""
    if (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, (int, float))
        or timeout_ms != timeout_ms  # NaN
    ):
        raise TypeError(f"{what}: timeout_ms must be a number of milliseconds, got {timeout_ms!r}")
    if timeout_ms < 0:
        raise ValueError(f"{what}: timeout_ms must be >= 0, got {timeout_ms}")
    return timeout_ms / 1000.0


class Consumer:
    """Reads records from the partitions it is assigned, pulling them from their leaders.

    Arguments follow Kafka's consumer configs with underscores (``auto_offset_reset``,
    ``fetch_max_wait_ms``, ...); ``commit_linger_ms`` is strom's own (see
    :meth:`commit_async`). ``default_api_timeout_ms`` bounds a whole blocking call
    (:meth:`commit`, :meth:`committed`, :meth:`position`, :meth:`beginning_offsets`,
    :meth:`end_offsets`, :meth:`offsets_for_times`) retries included, unless the call is
    given its own ``timeout_ms``; when its time is up a call raises a retriable error naming
    what did not answer (RequestTimedOutError; LeaderNotAvailableError for a partition
    without a live leader).
    Its default is ``request_timeout_ms`` (30 s), what these calls have always had in all;
    Kafka's is 60 s. ``session_timeout_ms`` and ``heartbeat_interval_ms`` are refused
    (ValueError), as Kafka's KIP-848 consumer refuses them: the coordinator sets both for
    the whole group (``--group-session-timeout-ms``, ``--group-heartbeat-interval-ms``).
    ``key_deserializer`` / ``value_deserializer`` (kafka-python's) turn the bytes of
    ``poll()`` and iteration records into objects (None stays None; ``poll_arrow()`` keeps
    bytes); one that raises gives :class:`~strom.errors.RecordDeserializationError`.
    The consumer is meant for one application thread (a second thread entering a call that
    reads or moves positions while one is inside gets :class:`ConcurrentModificationError`);
    ``close()`` may be called from another thread to stop a blocking ``poll()`` or
    iteration. A group member whose application does
    not call ``poll()`` for ``max_poll_interval_ms`` (default 5 minutes; time blocked inside
    a poll does not count) leaves the group, so its partitions move to members that read;
    the next ``poll()`` reports them lost and rejoins (Kafka's ``max.poll.interval.ms``).
    It is also the member's rebalance timeout: how long the coordinator waits for it to
    give up revoked partitions before removing it.
    """

    @kafka_keywords
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        group_id: str | None = None,
        client_id: str | None = None,
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        commit_linger_ms: int = 100,
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        fetch_max_bytes: int = 50 * MiB,
        max_partition_fetch_bytes: int = 1 * MiB,
        max_poll_records: int = 500,
        max_poll_interval_ms: int = 300_000,
        isolation_level: str = "read_uncommitted",
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int | None = None,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        check_crcs: bool = True,
        consumer_timeout_ms: int | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        group_instance_id: str | None = None,
        group_remote_assignor: str | None = None,
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        token: str | None = None,
    ) -> None:
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty str or None, got {group_id!r}")
        if not isinstance(auto_offset_reset, str) or auto_offset_reset not in AUTO_OFFSET_RESET:
            raise ValueError(
                f"auto_offset_reset must be one of {', '.join(map(repr, AUTO_OFFSET_RESET))}, "
                f"got {auto_offset_reset!r}"
            )
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                "isolation_level must be 'read_uncommitted' or 'read_committed', got "
                f"{isolation_level!r}"
            )
        enable_auto_commit = bool_option("enable_auto_commit", enable_auto_commit)
        check_crcs = bool_option("check_crcs", check_crcs)
        # Maxima: what goes on the wire as int32 (fetch sizes and waits) and Kafka's int ms
        # settings up to 2**31-1, its long ones (the backoffs) up to LONG_MS_MAX.
        int_option("fetch_min_bytes", fetch_min_bytes, 0, INT32_MAX)
        int_option("fetch_max_wait_ms", fetch_max_wait_ms, 0, INT_MS_MAX)
        int_option("fetch_max_bytes", fetch_max_bytes, 1, INT32_MAX)
        int_option("max_partition_fetch_bytes", max_partition_fetch_bytes, 1, INT32_MAX)
        int_option("max_poll_records", max_poll_records, 1, INT32_MAX)
        int_option("max_poll_interval_ms", max_poll_interval_ms, 1, INT_MS_MAX)
        int_option("request_timeout_ms", request_timeout_ms, 1, INT_MS_MAX)
        if default_api_timeout_ms is None:
            default_api_timeout_ms = request_timeout_ms
        int_option("default_api_timeout_ms", default_api_timeout_ms, 1, INT_MS_MAX)
        int_option("retry_backoff_ms", retry_backoff_ms, 0, LONG_MS_MAX)
        int_option("retry_backoff_max_ms", retry_backoff_max_ms, retry_backoff_ms, LONG_MS_MAX)
        int_option("auto_commit_interval_ms", auto_commit_interval_ms, 1, INT_MS_MAX)
        int_option("commit_linger_ms", commit_linger_ms, 0, INT_MS_MAX)
        str_option("client_id", client_id, empty_ok=True)
        str_option("group_instance_id", group_instance_id)
        str_option("group_remote_assignor", group_remote_assignor)
        for name, value, flag in (
            ("session_timeout_ms", session_timeout_ms, "--group-session-timeout-ms"),
            ("heartbeat_interval_ms", heartbeat_interval_ms, "--group-heartbeat-interval-ms"),
        ):
            if value is not None:
                # Accepted and ignored they would mislead; Kafka's KIP-848 consumer refuses
                # them the same way.
                raise ValueError(
                    f"{name} is not a client setting: the group coordinator decides it for "
                    f"every member (strom coordinator {flag}); leave it out"
                )
        for name, fn in (
            ("key_deserializer", key_deserializer),
            ("value_deserializer", value_deserializer),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable taking bytes, got {fn!r}")
        if consumer_timeout_ms is not None:
            int_option("consumer_timeout_ms", consumer_timeout_ms, 0, LONG_MS_MAX)

        self.client_id = client_id or f"strom-consumer-{next(_client_ids)}"
        forks.track(self)
        self.group_id = group_id
        self.config: dict[str, Any] = {
            "auto_offset_reset": auto_offset_reset,
            "enable_auto_commit": enable_auto_commit and group_id is not None,
            "auto_commit_interval_ms": auto_commit_interval_ms,
            "commit_linger_ms": commit_linger_ms,
            "fetch_min_bytes": fetch_min_bytes,
            "fetch_max_wait_ms": fetch_max_wait_ms,
            "fetch_max_bytes": fetch_max_bytes,
            "max_partition_fetch_bytes": max_partition_fetch_bytes,
            "max_poll_records": max_poll_records,
            "max_poll_interval_ms": max_poll_interval_ms,
            "isolation_level": isolation_level,
            "request_timeout_ms": request_timeout_ms,
            "default_api_timeout_ms": default_api_timeout_ms,
            "retry_backoff_ms": retry_backoff_ms,
            "retry_backoff_max_ms": retry_backoff_max_ms,
            "check_crcs": check_crcs,
            "consumer_timeout_ms": consumer_timeout_ms,
            "group_instance_id": group_instance_id,
            "group_remote_assignor": group_remote_assignor,
        }
        self._auto_offset_reset = auto_offset_reset
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._max_poll_records = max_poll_records
        self._timeout_s = request_timeout_ms / 1000.0
        #: The whole of a blocking call (commit(), committed(), position(), the offset
        #: lookups) when it is not given its own ``timeout_ms``: Kafka's
        #: ``default.api.timeout.ms``.
        self._api_timeout_s = default_api_timeout_ms / 1000.0
        self._backoff_s = retry_backoff_ms / 1000.0
        self._consumer_timeout_s = (
            None if consumer_timeout_ms is None else consumer_timeout_ms / 1000.0
        )
        self._client_md = (("strom-client-id", self.client_id),)
        #: One thread at a time inside the calls that read or move positions (_one_thread):
        #: the marker, the thread holding it, and whether the holder has lent the consumer
        #: to the thread it waits on (strom.aio runs a coroutine rebalance listener on the
        #: event loop while the poll's thread waits for it: that listener's commit()).
        self._entry = threading.Lock()
        self._owner = 0
        self._lent = False
        #: Set by strom.aio, whose consumer runs one poll at a time in a worker thread while
        #: its other tasks may commit, read positions, pause and seek meanwhile (as aiokafka
        #: users do, and as they could before the guard: the fetcher locks its own state).
        #: The guard would refuse those calls; two polls at once cannot happen there.
        self._shared = False
        self._closed = False
        #: Set when close() begins (``_closed`` when it has given up the group): the rebalance
        #: listener that close() runs may still commit, read positions and the assignment.
        self._closing = False
        #: When the last "no position yet" warning was logged (one a minute at most).
        self._unpositioned_logged = -1e9
        self._subscription: frozenset[str] | None = None
        self._iterator: Iterator[Record] | None = None
        #: The records of the poll the iteration (``for r in consumer`` / ``next()``) is
        #: handing out, the fetcher's marks when they were polled, and the index of the first
        #: one not handed out yet: commits count only what was handed out.
        self._handing: tuple[list[Record], dict[TopicPartition, Any]] | None = None
        self._handed = 0
        #: The handed poll's record indexes per partition, built on first need by
        #: ``_unhanded_firsts`` (for the records list it was built from).
        self._handing_index: tuple[list[Record], dict[TopicPartition, list[int]]] | None = None
        #: Set by every call that moves positions, so an iteration in progress stops handing
        #: out records polled before the move.
        self._moved = False

        #: read_committed: fetches stop at the last stable offset and aborted transactions'
        #: batches are dropped (batch by batch); "latest" is the last stable offset.
        self._read_committed = isolation_level == "read_committed"
        self._client = ClusterClient(
            bootstrap,
            timeout_s=self._timeout_s,
            retry_s=self._timeout_s,
            client_id=self.client_id,
            security=client_security(ssl_cafile, ssl_certfile, ssl_keyfile, token),
            retry_backoff_s=self._backoff_s,
            retry_backoff_max_s=retry_backoff_max_ms / 1000.0,
        )
        self._leaders = self._client.cache
        keep_freed_buffers()  # big Fetch answers without page faults: strom.client.memory
        self._fetcher = Fetcher(
            self._client,
            self._leaders,
            client_id=self.client_id,
            reset_policy=auto_offset_reset,
            min_bytes=fetch_min_bytes,
            max_wait_ms=fetch_max_wait_ms,
            # (no answer can be larger than one gRPC message: nodes bound theirs anyway)
            max_bytes=min(fetch_max_bytes, MAX_BATCH_BYTES),
            partition_max_bytes=min(max_partition_fetch_bytes, MAX_BATCH_BYTES),
            check_crcs=check_crcs,
            request_timeout_s=self._timeout_s,
            backoff_s=self._backoff_s,
            backoff_max_s=retry_backoff_max_ms / 1000.0,
            read_committed=self._read_committed,
        )
        #: metrics(): one entry per poll (the fetcher and the group member count theirs).
        self._poll_stats = PollStats()
        #: The consumer-group hook (None until groups exist, and always without a group_id).
        self._group: GroupMembership | None = self._make_group()
        self._fetcher.start()

    # -- groups (hooks for the group coordinator issue) ---------------------------------

    def _make_group(self) -> GroupMembership | None:
        """The group membership for ``group_id`` (None without one); no network I/O here."""
        return make_group(self)

    def _require_group(self, what: str) -> GroupMembership:
        self._ensure_open()
        if self.group_id is None:
            raise InvalidGroupIdError(
                f"{what} needs a group_id: consumer groups share partitions and store committed "
                "offsets per group. Pass Consumer(group_id=...), or use assign() and seek() "
                "to manage partitions and positions yourself"
            )
        if self._group is None:
            raise GroupsNotSupportedError(
                f"{what}: consumer groups need the group coordinator, which this strom "
                f"version does not have yet (group_id={self.group_id!r}); use assign() and "
                "seek() for now"
            )
        return self._group

    def _apply_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        """Where the group code installs a (reconciled) assignment; positions of partitions
        kept are kept, new ones start from the committed offset or auto_offset_reset."""
        self._moved = True
        self._fetcher.assign(set(partitions))

    @_one_thread
    def subscribe(
        self,
        topics: Sequence[str] | None = None,
        pattern: str | None = None,
        listener: Any = None,
    ) -> None:
        """Join ``group_id`` and consume the partitions the group assigns from ``topics``."""
        if topics is not None:
            if isinstance(topics, str):
                topics = [topics]
            if not all(isinstance(t, str) and t for t in topics):
                raise TypeError(f"topics must be non-empty strings, got {topics!r}")
        if topics is None and pattern is None:
            raise ValueError("subscribe() needs topics or a pattern")
        group = self._require_group("subscribe()")
        if self._fetcher.parts and self._subscription is None:
            raise IllegalStateError("subscribe() cannot be mixed with assign(); unsubscribe first")
        self._subscription = frozenset(topics) if topics is not None else frozenset()
        group.subscribe(self._subscription if topics is not None else None, pattern, listener)

    def subscription(self) -> set[str]:
        """Topics subscribed to through the group (empty with manual assignment). For a
        pattern, which the group coordinator matches, the topics it matched for this member:
        those of its assignment."""
        if self._subscription is None:
            return set()
        if self._subscription or self._group is None or self._group._pattern is None:
            return set(self._subscription)
        return {tp.topic for tp in self._fetcher.parts}

    @_one_thread
    def unsubscribe(self) -> None:
        """Leave the subscription (and the group) and drop every assigned partition, as
        Kafka's unsubscribe does for manual assignments too."""
        self._ensure_open()
        if self._group is not None and self._subscription is not None:
            self._group.unsubscribe()
        self._subscription = None
        self._moved = True
        self._fetcher.assign(set())

    @_one_thread
    def commit(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata] | None = None,
        *,
        timeout_ms: float | None = None,
    ) -> None:
        """Commit ``offsets`` (default: the current positions) for the group, synchronously.

        Commits take effect in the order they were made: this returns once every earlier
        ``commit_async`` is done (their callbacks have run) and this one is, so
        ``committed()`` then reads back what was committed here. Waits at most
        ``timeout_ms`` (default ``default_api_timeout_ms``; Kafka's ``commitSync(offsets,
        timeout)``), then raises RequestTimedOutError: the commit may still land (a request
        in flight), or not (one still queued is taken out)."""
        budget = self._budget(timeout_ms, "commit()")
        group = self._require_group("commit()")
        group.commit(self._commit_offsets(offsets), budget)

    @_one_thread
    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata] | None = None,
        callback: Callable[[Mapping[TopicPartition, OffsetAndMetadata], BaseException | None], Any]
        | None = None,
    ) -> None:
        """Commit without waiting; ``callback(offsets, error)`` runs when the answer comes.

        Commits are sent in the order made, on one thread; those made while an earlier one is
        in flight, or less than ``commit_linger_ms`` (default 100) after the last request began,
        go out together as one request (each still gets its own callback, in order): calling
        this after every poll costs the coordinator at most one request per linger. The first
        commit after a pause goes at once; ``commit()`` and ``close()`` send what waits at
        once. ``commit_linger_ms=0`` sends whenever no request is in flight."""
        group = self._require_group("commit_async()")
        group.commit_async(self._commit_offsets(offsets), callback)

    def group_metadata(self) -> GroupMetadata:
        """This consumer's group identity for ``Producer.send_offsets_to_transaction``: the
        group id and, while it is a member, its member id and epoch (so offsets sent by a
        member that has since been fenced are refused)."""
        group = self._require_group("group_metadata()")
        return group.group_metadata()

    def committed(
        self,
        partitions: TopicPartition | Iterable[TopicPartition],
        *,
        timeout_ms: float | None = None,
    ) -> OffsetAndMetadata | dict[TopicPartition, OffsetAndMetadata | None] | None:
        """The group's committed offset for one partition, or a dict for several; waits at
        most ``timeout_ms`` (default ``default_api_timeout_ms``)."""
        budget = self._budget(timeout_ms, "committed()")
        group = self._require_group("committed()")
        if isinstance(partitions, TopicPartition):
            tp = _topic_partition(partitions)
            return group.committed([tp], budget).get(tp)
        return group.committed(_topic_partitions(partitions, "committed()"), budget)

    def _budget(self, timeout_ms: Any, what: str) -> float:
        """A blocking call's whole time in seconds: its ``timeout_ms``, checked, or
        ``default_api_timeout_ms``."""
        if timeout_ms is None:
            return self._api_timeout_s
        return _timeout_s(timeout_ms, what)

    def _commit_offsets(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata] | None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is None:
            return {
                tp: OffsetAndMetadata(pos)
                for tp, pos in self._consumed_positions(self.assignment()).items()
            }
        return checked_offsets(offsets, "commit")

    # -- assignment -----------------------------------------------------------------------

    @_one_thread
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly ``partitions`` (replacing any previous assignment). Partitions that
        stay assigned keep their position; new ones start at auto_offset_reset (no committed
        offsets without a group). Raises for unknown topics and partitions."""
        self._ensure_open()
        if self._subscription is not None:
            raise IllegalStateError("assign() cannot be mixed with subscribe(); unsubscribe first")
        tps = _topic_partitions(partitions, "assign()")
        self._check_exist(tps)
        self._moved = True
        self._fetcher.assign(set(tps))

    def assignment(self) -> set[TopicPartition]:
        """The partitions currently assigned. IllegalStateError once closed, like the other
        calls."""
        self._ensure_open()
        return set(self._fetcher.parts)

    def _check_exist(self, tps: Sequence[TopicPartition]) -> None:
        """Unknown topics and partitions beyond the topic's count are errors now, not silent
        fetch retries later."""
        counts: dict[str, int] = {}
        for topic in dict.fromkeys(tp.topic for tp in tps):
            counts[topic] = len(self._client.topic_metadata(topic).partitions)
        for tp in tps:
            if tp.partition >= counts[tp.topic]:
                # Partitions just added, or none: waits for the nodes to learn them, or raises.
                counts[tp.topic] = self._client.cache.count_covering(tp.topic, tp.partition)
        # topic_metadata() also filled the metadata cache with the topics' leaders.

    def _assigned(self, tps: Any, what: str) -> list[TopicPartition]:
        """Normalise ``tps`` (None = every assigned partition) and insist they are assigned."""
        self._ensure_open()
        if tps is None:
            return list(self._fetcher.parts)
        if isinstance(tps, TopicPartition):
            tps = [tps]
        out = _topic_partitions(tps, what)
        missing = [tp for tp in out if tp not in self._fetcher.parts]
        if missing:
            raise IllegalStateError(
                f"{what}: {', '.join(f'{t.topic}-{t.partition}' for t in missing)} "
                "not assigned to this consumer (assign() it first)"
            )
        return out

    # -- positions ------------------------------------------------------------------------

    @_one_thread
    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next record ``poll()`` returns for ``partition``. An offset
        outside the log is found out on the next fetch and handled by auto_offset_reset."""
        (tp,) = self._assigned([partition], "seek()")
        if isinstance(offset, OffsetAndMetadata):
            offset = offset.offset
        int_option("offset", offset, 0, INT64_MAX)
        self._moved = True
        self._fetcher.seek(tp, offset)

    @_one_thread
    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Start ``partitions`` (default: all assigned) at their log start offset. Looked up
        lazily, on the next ``poll()`` or ``position()``, as Kafka does."""
        tps = self._assigned(partitions, "seek_to_beginning()")
        self._moved = True
        self._fetcher.request_reset(tps, "earliest")

    @_one_thread
    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Start ``partitions`` (default: all assigned) at their high watermark (the offset
        the next committed record will get). Looked up lazily, like seek_to_beginning."""
        tps = self._assigned(partitions, "seek_to_end()")
        self._moved = True
        self._fetcher.request_reset(tps, "latest")

    @_one_thread
    def seek_to_committed(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Start ``partitions`` (default: all assigned) at the group's committed offset again,
        or where auto_offset_reset says for one the group has none for: what an exactly-once
        loop does after a transaction was aborted (Kafka's ExactlyOnceMessageProcessor pairs
        ``abortTransaction`` with ``resetToLastCommittedPositions``). The records polled for
        the aborted transaction are past the consumer's position; without this rewind they
        are never processed again. Looked up lazily, on the next
        ``poll()`` or ``position()``, like seek_to_beginning; with read_committed the lookup
        waits until the aborted transaction's offsets are settled."""
        self._require_group("seek_to_committed()")
        tps = self._assigned(partitions, "seek_to_committed()")
        self._moved = True
        self._fetcher.request_reset(tps, None)

    @_one_thread
    def position(self, partition: TopicPartition, *, timeout_ms: float | None = None) -> int:
        """The offset of the next record ``poll()`` will return for ``partition``; looks it up
        first if it is not known yet (new assignment, after seek_to_*), for at most
        ``timeout_ms`` (default ``default_api_timeout_ms``), then raises
        RequestTimedOutError (Kafka's ``position(partition, timeout)``). While an iteration
        (``for record in consumer``, ``next(consumer)``) is handing out a poll's records, the
        offset of the first one it has not handed out: what ``commit()`` commits, so offsets
        built from it for ``send_offsets_to_transaction`` cover only records processed."""
        budget = self._budget(timeout_ms, "position()")
        (tp,) = self._assigned([partition], "position()")
        pos = self._fetcher.position(tp)
        deadline = time.monotonic() + budget
        while pos is None:
            why = "its group's committed offset or its leader's offsets did not come"
            try:
                self._update_positions({tp}, deadline=deadline)
            except StromError as exc:
                if not exc.retriable:
                    raise
                why = str(exc)  # a lookup gives up (retriable) only at the deadline
            pos = self._fetcher.position(tp)
            if pos is None and time.monotonic() >= deadline:
                raise RequestTimedOutError(
                    f"could not determine the position of {tp.topic}-{tp.partition} within "
                    f"{budget * 1000:.0f} ms: {why}"
                )
        handing = self._handing
        if handing is not None:
            records, polled = handing
            if self._handed < len(records):
                r = records[self._handed]  # the common case: the next record is tp's
                if r.partition == tp.partition and r.topic == tp.topic:
                    if self._fetcher.marks({tp}).get(tp) == polled.get(tp):
                        return r.offset
                    return pos
            first = self._unhanded_firsts({tp}).get(tp)
            if first is not None:
                return first
        return pos

    def _unhanded_firsts(
        self, only: set[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """For each partition (of ``only``, when given) with records the iteration has not
        handed out yet, the offset of the first one, unless the application moved the
        partition since the poll (a seek wins: the fetcher's position holds then).

        The poll's records are indexed per partition once (on the first such call) and each
        call bisects, so a loop calling position() or commit() per record is not O(n^2)."""
        handing = self._handing
        if handing is None:
            return {}
        records, polled = handing
        built = self._handing_index
        if built is None or built[0] is not records:
            index: dict[TopicPartition, list[int]] = {}
            for i, r in enumerate(records):
                tp = TopicPartition(r.topic, r.partition)  # type: ignore[arg-type]
                at = index.get(tp)
                if at is None:
                    index[tp] = [i]
                else:
                    at.append(i)
            built = self._handing_index = (records, index)
        index = built[1]
        handed = self._handed
        firsts: dict[TopicPartition, int] = {}
        for tp, at in index.items():
            if only is not None and tp not in only:
                continue
            j = bisect_left(at, handed)
            if j < len(at):
                firsts[tp] = records[at[j]].offset
        if not firsts:
            return firsts
        now = self._fetcher.marks(set(firsts))
        return {tp: off for tp, off in firsts.items() if tp in now and now[tp] == polled.get(tp)}

    def highwater(self, partition: TopicPartition) -> int | None:
        """The high watermark the last fetch of ``partition`` reported (None before any):
        ``highwater - position`` is the consumer's lag, without a request. With
        read_committed it is the last stable offset (as ``end_offsets()``): records of an
        open transaction are not lag the consumer could read yet."""
        (tp,) = self._assigned([partition], "highwater()")
        return self._fetcher.high_watermark(tp)

    def _update_positions(
        self,
        only: set[TopicPartition] | None = None,
        *,
        poll_timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """Look up positions for partitions that need one: committed offset (groups, later),
        else the reset strategy (seek_to_*, or auto_offset_reset).

        From poll() (``poll_timeout_s``: the time the poll has left), a lookup of the group's
        offsets that fails with a retriable error leaves their partitions without a
        position: the poll returns without their records and the next one asks again, as
        Kafka's does. That covers offsets an open transaction is still completing
        (read_committed) and a group coordinator failing over: ordinary events, which must
        neither block a poll for the request timeout nor raise out of it. A non-retriable
        error (an ACL, say) still raises. Otherwise each lookup has until
        ``deadline`` (a caller's ``timeout_ms``), or ``request_timeout_ms``."""
        need = [n for n in self._fetcher.needing_positions() if only is None or n[0] in only]
        if not need:
            return
        committed: dict[TopicPartition, OffsetAndMetadata | None] = {}
        initial = [tp for tp, reset, _ in need if reset is None]
        if initial and self._group is not None:
            if poll_timeout_s is None:
                committed = self._group.committed(initial, self._left(deadline))
            else:
                try:
                    committed = self._group.committed(
                        initial, min(self._timeout_s, max(poll_timeout_s, 1.0))
                    )
                except StromError as exc:
                    if not exc.retriable:
                        raise
                    waiting = set(initial)
                    need = [n for n in need if n[0] not in waiting]
        query: dict[TopicPartition, int] = {}
        missing: list[TopicPartition] = []
        for tp, reset, gen in need:
            om = committed.get(tp)
            if reset is None and om is not None:
                self._fetcher.set_position(tp, om.offset, gen)
                continue
            strategy = reset or self._auto_offset_reset
            if strategy == "none":
                missing.append(tp)
            else:
                query[tp] = EARLIEST if strategy == "earliest" else LATEST
        if missing:
            raise NoOffsetForPartitionError(
                "no position for "
                + ", ".join(f"{t.topic}-{t.partition}" for t in missing)
                + " and auto_offset_reset='none': seek() to an offset first"
            )
        if poll_timeout_s is None:
            found = self._list_offsets(query, timeout_s=self._left(deadline))
        else:
            # From poll(): a partition whose leader cannot answer (offline, moving) stays
            # without a position and is asked again by the next poll, while the others are
            # read, as Kafka's consumer does: one partition without a leader must not hold up
            # the healthy ones.
            found = self._list_offsets(
                query, timeout_s=min(self._timeout_s, max(poll_timeout_s, 1.0)), partial=True
            )
            if len(found) < len(query):
                self._log_unpositioned(set(query) - set(found))
        gens = {tp: gen for tp, _, gen in need}
        for tp, res in found.items():
            self._fetcher.set_position(tp, res.offset, gens[tp])

    def _left(self, deadline: float | None) -> float:
        """The time a lookup has: up to ``deadline``, or ``request_timeout_ms`` without one."""
        if deadline is None:
            return self._timeout_s
        return max(deadline - time.monotonic(), 0.001)

    # -- offset lookups (any partition, assigned or not) ----------------------------------

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], *, timeout_ms: float | None = None
    ) -> dict[TopicPartition, int]:
        """Each partition's log start offset (the first offset still stored). Waits at most
        ``timeout_ms`` (default ``default_api_timeout_ms``) for the leaders."""
        return self._lookup(partitions, EARLIEST, "beginning_offsets()", timeout_ms)

    def end_offsets(
        self, partitions: Iterable[TopicPartition], *, timeout_ms: float | None = None
    ) -> dict[TopicPartition, int]:
        """Each partition's high watermark: the offset after the last committed record (with
        read_committed, the last stable offset: below any open transaction). Waits at most
        ``timeout_ms`` (default ``default_api_timeout_ms``) for the leaders."""
        return self._lookup(partitions, LATEST, "end_offsets()", timeout_ms)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], *, timeout_ms: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the first offset whose record timestamp is >= the given one
        (ms since the epoch) and that timestamp; None when every record is older. Waits at
        most ``timeout_ms`` (default ``default_api_timeout_ms``) for the leaders."""
        budget = self._budget(timeout_ms, "offsets_for_times()")
        self._ensure_open()
        if not isinstance(timestamps, Mapping):
            raise TypeError("offsets_for_times() takes a {TopicPartition: timestamp_ms} dict")
        query: dict[TopicPartition, int] = {}
        for tp, ts in timestamps.items():
            tp = _topic_partition(tp)
            what = f"timestamp for {tp.topic}-{tp.partition} (ms)"
            query[tp] = int_option(what, ts, 0, INT64_MAX)
        self._check_exist(list(query))
        found = self._list_offsets(query, timeout_s=budget)
        return {
            tp: OffsetAndTimestamp(r.offset, r.timestamp) if r.offset >= 0 else None
            for tp, r in found.items()
        }

    def _lookup(
        self, partitions: Any, which: int, what: str, timeout_ms: float | None
    ) -> dict[TopicPartition, int]:
        budget = self._budget(timeout_ms, what)
        self._ensure_open()
        if isinstance(partitions, TopicPartition):
            partitions = [partitions]
        tps = _topic_partitions(partitions, what)
        self._check_exist(tps)
        found = self._list_offsets(dict.fromkeys(tps, which), timeout_s=budget)
        return {tp: r.offset for tp, r in found.items()}

    def _list_offsets(
        self,
        query: Mapping[TopicPartition, int],
        *,
        timeout_s: float | None = None,
        partial: bool = False,
    ) -> dict[TopicPartition, OffsetResult]:
        """ListOffsets at the leaders, with this consumer's timeouts (or ``timeout_s`` in all)
        and isolation level; ``partial``: see :func:`list_offsets`. No request outlives
        ``timeout_s`` (a leader that hangs must not hold a call given 1 s for 30)."""
        return list_offsets(
            self._client,
            self._leaders,
            query,
            timeout_s=self._timeout_s if timeout_s is None else timeout_s,
            call_timeout_s=self._timeout_s,
            backoff_s=self._backoff_s,
            client_metadata=self._client_md,
            read_committed=self._read_committed,
            partial=partial,
        )

    def _log_unpositioned(self, parts: set[TopicPartition]) -> None:
        """One warning a minute while polls go on without some partitions' positions."""
        now = time.monotonic()
        if now < self._unpositioned_logged + 60.0:
            return
        self._unpositioned_logged = now
        log.warning(
            "no position yet for %s (no leader answered the offset lookup); reading the "
            "other partitions and asking again on the next poll",
            ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(parts)),
        )

    # -- flow control ---------------------------------------------------------------------

    @_one_thread
    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching ``partitions`` (buffered data for them is dropped and fetched again
        after resume(), from the position). Inside ``for record in consumer`` the position
        of a paused partition is its first record the loop has not handed out yet, so those
        records come again after resume(): a pause is not a seek.

        So the paused partitions are first put back to their first record not handed out:
        dropping the rest of the poll would bump their generation, which the loop's rewind
        (and the commit's ``_consumed_positions``) reads as "the application sought", and
        those records would never come back though a commit covered them."""
        tps = self._assigned(list(partitions), "pause()")
        if self._handing is not None:
            for tp, offset in self._unhanded_firsts(set(tps)).items():
                self._fetcher.seek(tp, offset)
        self._moved = True
        self._fetcher.pause(tps)

    @_one_thread
    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch ``partitions`` again."""
        self._fetcher.resume(self._assigned(list(partitions), "resume()"))

    def paused(self) -> set[TopicPartition]:
        """The partitions paused with pause()."""
        self._ensure_open()  # as assignment(): a closed consumer has none
        return self._fetcher.paused()

    # -- metadata -------------------------------------------------------------------------

    def topics(self) -> set[str]:
        """Names of the cluster's topics (internal ones, like __consumer_offsets, left out)."""
        self._ensure_open()
        md = self._client.metadata()
        return {t.name for t in md.topics if not t.is_internal and t.error_code == 0}

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The partition ids of ``topic``; UnknownTopicOrPartitionError if there is none."""
        self._ensure_open()
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        return {p.partition for p in self._client.topic_metadata(topic).partitions}

    # -- reading --------------------------------------------------------------------------

    def poll(self, timeout_ms: float = 0, max_records: int | None = None) -> list[Record]:
        """Records from the assigned partitions, in offset order per partition, with topic and
        partition filled in. Waits up to ``timeout_ms`` for the first record, then returns
        what is buffered, at most ``max_records`` (default ``max_poll_records``).

        Called while an iteration (``next(consumer)``, ``for record in consumer``) is in the
        middle of a poll's records, it first puts back the ones the iteration has not handed
        out (as leaving the loop does): this poll starts with them, and the iteration goes
        on after what this poll returned."""
        limit = self._poll_args(timeout_ms, max_records, self._max_poll_records)
        items, _ = self._poll(timeout_ms, limit, arrow=False)
        return items

    def poll_arrow(self, timeout_ms: float = 0, max_records: int | None = None) -> pa.Table:
        """Like poll(), as one Arrow table in :data:`CONSUMER_SCHEMA` (topic, partition,
        offset, timestamp, key, value, headers, timestamp_type), built from the fetched
        batches without any per-record Python. Without ``max_records`` it returns everything
        buffered."""
        limit = self._poll_args(timeout_ms, max_records, sys.maxsize)
        batches, _ = self._poll(timeout_ms, limit, arrow=True)
        return pa.Table.from_batches(batches, schema=CONSUMER_SCHEMA)

    @staticmethod
    def _poll_args(timeout_ms: Any, max_records: Any, default: int) -> int:
        _timeout_s(timeout_ms, "poll()")
        if max_records is None:
            return default
        return int_option("max_records", max_records, 1, INT32_MAX)

    @_one_thread
    def _poll(self, timeout_ms: float, limit: int, *, arrow: bool) -> tuple[list[Any], int]:
        self._ensure_open()
        if self._handing is not None:
            self._give_back()
        group = self._group
        if group is not None:
            group.polling(True)
        started = time.monotonic()
        try:
            items, n = self._poll_once(timeout_ms, limit, arrow=arrow)
            if items and not arrow and (self._key_deserializer or self._value_deserializer):
                items = self._deserialized(items)
                n = len(items)
            self._poll_stats.polled(n, started)
            return items, n
        except Exception:
            if self._closing:  # closed from another thread mid-call: end quietly
                return [], 0
            raise
        finally:
            if group is not None:
                group.polling(False)

    def _poll_once(self, timeout_ms: float, limit: int, *, arrow: bool) -> tuple[list[Any], int]:
        if not self._fetcher.parts and self._subscription is None:
            raise IllegalStateError(
                "the consumer has no partitions: assign() some (or subscribe() with a group)"
            )
        wait_s = wait_limit("timeout_ms", timeout_ms, ms=True)  # None: as long as asked
        deadline = time.monotonic() + (MAX_WAIT_S if wait_s is None else wait_s)
        waited = False
        while True:
            if self._group is not None:
                self._group.on_poll(self)
            exc = self._fetcher.take_error()
            if exc is not None:
                raise exc
            self._update_positions(poll_timeout_s=deadline - time.monotonic())
            items, n = self._fetcher.collect(limit, arrow=arrow)
            if n or self._closing:
                return items, n
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not waited:
                    self._fetcher.release_holds()  # a poll that never waits fetches nothing
                return items, 0
            waited = True
            # Long-poll on this thread when it can (no thread hop for the answer); a group
            # member's wait is shorter there, since a rebalance cannot wake a blocking call.
            inline_s = remaining if self._group is None else min(remaining, GROUP_INLINE_WAIT_S)
            if not self._fetcher.fetch_inline(inline_s):
                group = self._group
                self._fetcher.wait(remaining, None if group is None else group.has_error)

    def _deserialized(self, records: list[Record]) -> list[Record]:
        """``records`` with keys and values through the deserializers (None stays None).

        A record whose deserializer raises is not lost and does not lose others (Kafka's
        RecordDeserializationException): the records before it are returned and everything
        from it on is put back, so the next poll starts its partition at it; when nothing of
        its partition came before it in this poll, the poll puts back everything and raises
        :class:`~strom.errors.RecordDeserializationError` naming it (seek past it to skip)."""
        kd, vd = self._key_deserializer, self._value_deserializer
        out: list[Record] = []
        seen: set[tuple[str | None, int]] = set()
        for i, r in enumerate(records):
            try:
                out.append(
                    r._replace(
                        key=r.key if kd is None or r.key is None else kd(r.key),
                        value=r.value if vd is None or r.value is None else vd(r.value),
                    )
                )
            except Exception as exc:
                if (r.topic, r.partition) in seen:
                    self._rewind(records[i:], self._fetcher.last_marks)
                    return out
                self._rewind(records, self._fetcher.last_marks)
                raise RecordDeserializationError(
                    f"{r.topic}[{r.partition}] offset {r.offset}: could not deserialize "
                    f"the record ({type(exc).__name__}: {exc}); seek past it to skip it",
                    topic=r.topic,
                    partition=r.partition,
                    offset=r.offset,
                ) from exc
            seen.add((r.topic, r.partition))
        return out

    def __iter__(self) -> Iterator[Record]:
        """Records one by one, blocking until there are some; ends when the consumer is
        closed (from another thread) or after ``consumer_timeout_ms`` without records.
        Leaving the loop early (``break``) puts the positions back to the first record the
        loop did not hand out, so the next poll or loop starts there; inside the loop,
        ``position()`` and ``commit()`` count only the records handed out, and a ``poll()``
        (or ``pause()``) puts the rest back the same way."""
        self._ensure_open()
        return self._records()

    def __next__(self) -> Record:
        if self._iterator is None:
            self._iterator = iter(self)
        return next(self._iterator)

    def _records(self) -> Iterator[Record]:
        idle_since = time.monotonic()
        limit = self._max_poll_records
        wait_ms = 1000.0
        if self._consumer_timeout_s is not None:
            wait_ms = min(wait_ms, self._consumer_timeout_s * 1000.0)
        while not self._closing:
            try:
                records, _ = self._poll(wait_ms, limit, arrow=False)
            except IllegalStateError:
                if self._closing:
                    return
                raise
            if records:
                marks = self._fetcher.last_marks
                self._moved = False
                self._handing = (records, marks)
                try:
                    for i, rec in enumerate(records):
                        # Handed out (kafka-python's rule): a commit from the loop's body
                        # covers this record and the ones before it, not the rest of the poll.
                        self._handed = i + 1
                        yield rec
                        if self._moved:  # seek/pause/assign inside the loop: poll afresh
                            break
                finally:
                    self._handing = self._handing_index = None
                    # Whatever poll() returned but the loop never handed out (break, an
                    # exception, a seek) must be read again: move those partitions back.
                    self._rewind(records[self._handed :], marks)
                idle_since = time.monotonic()
            elif (
                self._consumer_timeout_s is not None
                and time.monotonic() - idle_since >= self._consumer_timeout_s
            ):
                return

    def _give_back(self) -> None:
        """A poll made while an iteration hands out records: put the records it has not
        handed out back (their partitions seek to the first), and have the iteration poll
        afresh when it resumes (its own rewind then finds the partitions moved and skips), so
        poll, the iteration and commit() agree on where they are."""
        handing, self._handing = self._handing, None
        self._handing_index = None
        if handing is None:
            return
        records, marks = handing
        unseen = records[self._handed :]
        if unseen:
            self._moved = True
            self._rewind(unseen, marks)

    def _consumed_positions(self, parts: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The positions to commit for ``parts`` (the assigned ones with a known position):
        the fetcher's, except that a partition with records the iteration has not handed out
        yet is at its first such record: a commit covers what the iterator handed out (as
        kafka-python's), so a crash mid-poll loses nothing (auto-commit and the commits of a
        rebalance or close too)."""
        marks = self._fetcher.marks(set(parts))  # assigned ones only
        out = {tp: pos for tp, (_, pos) in marks.items() if pos is not None}
        if self._handing is not None:
            for tp, offset in self._unhanded_firsts(set(out)).items():
                out[tp] = offset
        return out

    def _rewind(
        self,
        unseen: list[Record],
        marks: dict[TopicPartition, tuple[int, int | None]],
        only: set[TopicPartition] | None = None,
    ) -> None:
        """Seek each partition of ``unseen`` (of ``only``, when given) back to its first
        unseen record, unless the application moved that partition since (a seek wins over
        the rewind)."""
        if not unseen or self._closed:
            return
        first: dict[TopicPartition, int] = {}
        for r in unseen:
            tp = TopicPartition(r.topic, r.partition)  # type: ignore[arg-type]
            if tp not in first and (only is None or tp in only):
                first[tp] = r.offset
        self._rewind_to(first, marks)

    def _rewind_to(
        self, first: dict[TopicPartition, int], marks: dict[TopicPartition, tuple[int, int | None]]
    ) -> None:
        """Seek each partition of ``first`` to its offset there, unless it moved since
        ``marks`` (the fetcher's marks when the records were polled)."""
        if not first or self._closed:
            return
        now = self._fetcher.marks(set(first))
        for tp, offset in first.items():
            if tp in now and now[tp] == marks.get(tp):
                self._fetcher.seek(tp, offset)

    # -- lifecycle ------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._forked_from:
            raise forks.error(self)
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    @property
    def closed(self) -> bool:
        """Whether close() was called (True while it still runs, too)."""
        return self._closing

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        """Stop fetching and release connections. Safe to call twice, and from another thread
        to end a blocking poll() or iteration. With a group it will also commit (when
        auto-commit is on and ``autocommit``) and leave the group; a rebalance listener's
        ``on_partitions_revoked`` runs first and may still commit (as in Kafka).
        ``timeout_ms`` (default ``request_timeout_ms``) bounds the whole close, as Kafka's
        does: a step that finds no time left is skipped (an unsent commit is lost, an unsent
        leave lets the group wait for the session timeout)."""
        if self._closing:
            return
        if self._forked_from:  # the threads and connections are the parent's: nothing to do
            self._closing = self._closed = True
            return
        autocommit = bool_option("autocommit", autocommit)
        timeout_s = self._timeout_s if timeout_ms is None else _timeout_s(timeout_ms, "close()")
        # The consumer is "closing" while the group lets go, so a listener's commit() in
        # on_partitions_revoked (which Kafka runs inside close()) works, and closed after; a
        # poll or iteration blocked on another thread is woken at once and ends on seeing
        # ``_closing``.
        self._closing = True
        with self._fetcher.data_ready:
            self._fetcher.data_ready.notify_all()
        end = time.monotonic() + timeout_s
        try:
            if self._group is not None:
                self._group.close(
                    autocommit=autocommit and self.config["enable_auto_commit"],
                    timeout_s=timeout_s,
                )
        finally:
            self._closed = True
            self._fetcher.close()
            self._client.close()  # also cancels fetches parked in a long poll
            self._fetcher.join(min(max(end - time.monotonic(), 0.0), 5.0))

    def metrics(self) -> dict[str, float]:
        """The consumer's metrics, by Kafka's names where the meaning is the same
        (``records-consumed-total``, ``fetch-latency-avg``, ``records-lag-max``, per
        partition ``"records-lag{topic=t,partition=0}"``, a group member's
        ``commit-total``, ``rebalance-total`` ...): docs/client-metrics.md lists them.
        Rates, averages and maxima cover the last 30-60 s (NaN: nothing in that window).
        Counted per poll and per Fetch answer, never per record; works before the first
        poll and after ``close()`` (the final counts; no partitions then, so no lag)."""
        out = self._poll_stats.snapshot()
        out.update(self._fetcher.stats.snapshot())
        lags = {} if self._closed else self._fetcher.lags()
        leads = {} if self._closed else self._fetcher.leads()
        out["records-lag-max"] = (
            math.nan if self._closed else self._fetcher.stats.records_lag_max(lags.values())
        )
        out["records-lead-min"] = (
            math.nan if self._closed else self._fetcher.stats.records_lead_min(leads.values())
        )
        out["assigned-partitions"] = float(0 if self._closed else len(self._fetcher.parts))
        for tp, lag in sorted(lags.items()):
            out[tagged("records-lag", topic=tp.topic, partition=tp.partition)] = float(lag)
        for tp, lead in sorted(leads.items()):
            out[tagged("records-lead", topic=tp.topic, partition=tp.partition)] = float(lead)
        group = self._group.stats if self._group is not None else GroupStats()
        out.update(group.snapshot())
        return out

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._fetcher.parts)} partitions"
        return f"Consumer(client_id={self.client_id!r}, group_id={self.group_id!r}, {state})"
