"""Consumer-group membership for :class:`strom.client.consumer.Consumer` (DESIGN §7, KIP-848).

The consumer calls :func:`make_group` once (its ``_make_group`` hook) and then drives the
returned :class:`GroupMember` through the ``GroupMembership`` protocol; the member sees the
consumer only through the ``GroupHost`` protocol (both in :mod:`strom.client.membership`), so
this module does not depend on the Consumer class. Why it is split the way it is:

* **A heartbeat thread** talks to the group coordinator (found with FindCoordinator on any
  storage node, looked up again after NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE or a
  transport error): every ``heartbeat_interval_ms`` the coordinator asks for, it reports the
  subscription and the partitions the application owns *now*, and records the assignment the
  coordinator answers with. It never touches the consumer's partitions itself.
* **The application thread** (``on_poll``, called at the start of every poll) reconciles: when
  the assignment shrank it runs the listener's ``on_partitions_revoked``, commits the revoked
  partitions' positions (auto-commit), stops fetching them and wakes the heartbeat so the
  coordinator learns at once that they are free; when it grew it starts fetching (positions
  from the committed offsets, through the consumer's ``committed`` lookup, else
  ``auto_offset_reset``) and runs ``on_partitions_assigned``. So a rebalance never races a poll
  in progress, and a partition is never consumed by two members at once (the coordinator only
  hands it over after the old owner reported it gone).
* **Fencing**: after FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID (e.g. the process was paused past
  the session timeout) the member has lost its partitions: the next poll drops them
  (``on_partitions_lost`` if the listener has it, else ``on_partitions_revoked``) and only then
  does the heartbeat rejoin with epoch 0.

Commits carry the member id and epoch, so a zombie cannot overwrite the offsets of partitions
that moved on. A consumer with a ``group_id`` but manual ``assign()`` commits as a "simple"
consumer (member epoch -1), which the coordinator accepts while the group has no members.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from strom.api import common_pb2, coordinator_pb2, coordinator_pb2_grpc, storage_pb2
from strom.client.cluster import attempt_timeout, refused
from strom.client.commit_queue import CommitQueue, CommitQueueClosedError
from strom.client.coordinator_calls import CallAbandoned, CoordinatorMoved, call_leaving_moved
from strom.client.membership import GroupHost
from strom.client.stats import GroupStats
from strom.client.transactions import GroupMetadata
from strom.client.types import OffsetAndMetadata, TopicPartition, add_offsets
from strom.errors import (
    COORDINATOR_REFRESH_CODES,
    AuthenticationError,
    AuthorizationError,
    CoordinatorNotAvailableError,
    ErrorCode,
    InvalidConfigError,
    RequestTimedOutError,
    StaleMemberEpochError,
    StromError,
    commit_failed_error,
    error_for,
)

log = logging.getLogger("strom.client.group")
E = ErrorCode
#: Heartbeat interval until the coordinator's first answer gives its own (the first
#: heartbeat goes at once; the client has no say in the interval, KIP-848).
INITIAL_HEARTBEAT_S = 3.0
#: gRPC statuses after which the coordinator is looked up again.
_TRANSPORT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
#: Heartbeat errors after which the member has lost its partitions and must rejoin.
_FENCED = frozenset({E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID})


def make_group(consumer: GroupHost) -> GroupMember | None:
    """The consumer's group membership (None without a ``group_id``). Does no I/O: the
    coordinator is first contacted by ``subscribe``, ``commit`` or ``committed``."""
    if consumer.group_id is None:
        return None
    return GroupMember(consumer)


def _topic_partitions(parts: Iterable[TopicPartition]) -> list[common_pb2.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in parts:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [
        common_pb2.TopicPartitions(topic=t, partitions=sorted(ps))
        for t, ps in sorted(by_topic.items())
    ]


def _from_assignment(a: coordinator_pb2.Assignment) -> set[TopicPartition]:
    return {TopicPartition(tp.topic, p) for tp in a.topic_partitions for p in tp.partitions}


def _sorted(parts: Iterable[TopicPartition]) -> list[TopicPartition]:
    return sorted(parts)


class GroupMember:
    """One consumer's membership in its group (see the module docstring)."""

    def __init__(self, consumer: GroupHost) -> None:
        assert consumer.group_id is not None
        self.group_id: str = consumer.group_id
        self._consumer = consumer
        self._client = consumer._client
        self._metadata = (("strom-client-id", consumer.client_id),)
        cfg = consumer.config
        self._auto_commit = bool(cfg["enable_auto_commit"])
        self._auto_commit_interval_s = cfg["auto_commit_interval_ms"] / 1000.0
        self._commit_linger_s = cfg.get("commit_linger_ms", 0) / 1000.0
        self._instance_id: str | None = cfg.get("group_instance_id")
        self._assignor: str | None = cfg.get("group_remote_assignor")
        self._timeout_s = max(consumer._timeout_s, 0.001)
        #: One attempt of a coordinator call. The consumer's calls (commit(), committed())
        #: have request_timeout_ms in all, so an attempt gets half of it: one at a
        #: coordinator that hangs ends while the call can still ask the coordinator that
        #: took over (DESIGN §8). Heartbeats use it too. An attempt at a
        #: coordinator that hangs ends sooner once the group moved (:meth:`_attempt`); this
        #: bounds one at a coordinator that still owns the group but does not answer.
        self._attempt_s = self._timeout_s / 2
        self._backoff_s = max(consumer._backoff_s, 0.05)

        #: (node id, incarnation id) of the storage node running this member for a
        #: RecordService Subscribe stream, sent with every heartbeat (None: an ordinary
        #: consumer). The member dies with that node process, and this lets the coordinator
        #: remove it as soon as the node leaves the cluster rather than after the session
        #: timeout (DESIGN §7). Set by the node before subscribe().
        self.host_node: tuple[int, str] | None = None
        self._lock = threading.Lock()
        #: Notified (under _lock) when a heartbeat's answer sets the member epoch.
        self._epoch_set = threading.Condition(self._lock)
        self.member_id = str(uuid.uuid4())
        self.member_epoch = 0
        #: The last epoch this consumer held as a member (0: never joined): what its commits
        #: carry while it is out of the group (see _commit_identity).
        self._last_epoch = 0
        self._topics: tuple[str, ...] = ()
        self._pattern: str | None = None
        self._listener: Any = None
        self._subscribed = False
        #: The last assignment the coordinator sent (None before the first).
        self._target: set[TopicPartition] | None = None
        #: What the application thread has installed in the consumer.
        self._owned: set[TopicPartition] = set()
        #: The assignment the application thread is installing right now (None when it is
        #: not): reported as owned too, so the coordinator never frees a partition that a
        #: reconciliation in progress is about to consume.
        self._installing: set[TopicPartition] | None = None
        #: Set by the heartbeat thread after fencing; cleared by on_poll once dropped.
        self._fenced = False
        self._error: BaseException | None = None
        self._coordinator: str | None = None
        #: The coordinator's heartbeat interval; its first answer says what it is.
        self._interval_s = INITIAL_HEARTBEAT_S
        #: max_poll_interval_ms: how long the application may stay out of poll() before
        #: the heartbeat thread leaves the group for it (Kafka's max.poll.interval.ms).
        self._max_poll_s = cfg["max_poll_interval_ms"] / 1000.0
        #: Sent as the heartbeat's rebalance_timeout_ms, as Kafka's consumer sends
        #: max.poll.interval.ms: how long the coordinator waits for this member to revoke
        #: partitions. Without it the coordinator's 5-minute default applied, and a consumer
        #: that allowed itself longer between polls was removed mid-rebalance (found from
        #: outside). Clamped to the field's int32.
        self._rebalance_timeout_ms = min(int(cfg["max_poll_interval_ms"]), 2**31 - 1)
        #: Whether the application thread is inside poll(), and when it last entered or left.
        self._polling = False
        self._last_poll = time.monotonic()
        #: Set by the heartbeat thread when it left the group for a stalled application;
        #: the next poll drops the partitions (lost) and rejoins.
        self._poll_expired = False
        #: .active while a poll on this thread must leave rebalance work to a later one
        #: (rebalance_elsewhere).
        self._deferring = threading.local()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._commit_queue: CommitQueue | None = None
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        #: Consumer.metrics(): commits, rebalances and heartbeats, one entry per call.
        self.stats = GroupStats()

    # -- GroupMembership protocol -------------------------------------------------------------

    def subscribe(self, topics: frozenset[str] | None, pattern: Any, listener: Any) -> None:
        """Join (or change the subscription); the heartbeat thread starts on first use."""
        if pattern is not None and not isinstance(pattern, str):
            pattern = getattr(pattern, "pattern", str(pattern))
        with self._lock:
            self._topics = tuple(sorted(topics)) if topics is not None else ()
            self._pattern = pattern if topics is None else None
            self._listener = listener
            self._subscribed = True
            self._last_poll = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"strom-heartbeat-{self.group_id}", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def unsubscribe(self) -> None:
        """Give the partitions up (listener, commit) and leave the group."""
        self._revoke_all(commit=self._auto_commit, lost=False)
        with self._lock:
            self._subscribed = False
        self._leave()

    def polling(self, active: bool) -> None:
        """The application thread enters (True) or leaves (False) poll(): the time between
        two polls is what ``max_poll_interval_ms`` bounds (time blocked inside a poll does
        not count, as in Kafka)."""
        with self._lock:
            self._polling = active
            self._last_poll = time.monotonic()

    def rebalance_pending(self) -> bool:
        """Whether the next poll has rebalance work: partitions to install or drop, and so
        listener calls. strom.aio polls in a worker thread then (see
        :meth:`rebalance_elsewhere`)."""
        with self._lock:
            return (
                self._poll_expired
                or self._fenced
                or (self._target is not None and self._target != self._owned)
            )

    @contextlib.contextmanager
    def rebalance_elsewhere(self) -> Iterator[None]:
        """Within it, a poll on this thread leaves the rebalance work to a later poll.

        For strom.aio, whose poll answers from buffered records on the event loop itself:
        a rebalance listener called there could neither wait for a coroutine on that loop
        (it would deadlock) nor commit without blocking it. The aio consumer polls in a
        worker thread whenever :meth:`rebalance_pending`; this covers an assignment that
        arrives between that check and the poll."""
        self._deferring.active = True
        try:
            yield
        finally:
            self._deferring.active = False

    def on_poll(self, consumer: GroupHost) -> None:
        """Reconcile a new assignment, surface heartbeat errors, auto-commit when due."""
        err, self._error = self._error, None
        if err is not None:
            raise err
        if not getattr(self._deferring, "active", False) and self._rebalance(consumer):
            return
        if self._auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
            with self._lock:
                owned = set(self._owned)  # what the reconcile above kept, not what it revoked
            # Manual assign() with a group_id auto-commits too, as a "simple" consumer.
            offsets = self._positions(owned if self._subscribed else consumer.assignment())
            if offsets:
                self.commit_async(offsets, self._log_commit_error)

    def _rebalance(self, consumer: GroupHost) -> bool:
        """on_poll's rebalance work; True when the partitions were dropped (the poll does
        nothing more)."""
        with self._lock:
            expired = self._poll_expired
        if expired:
            # The heartbeat thread left the group while the application did not poll: the
            # partitions may be another member's by now. Drop them (lost, no commit) and
            # rejoin, as Kafka's consumer does on the poll after max.poll.interval.ms.
            self._revoke_all(commit=False, lost=True)
            with self._lock:
                self._poll_expired = False
                self._last_poll = time.monotonic()
            self._wake.set()
            return True
        with self._lock:
            fenced = self._fenced
            target = None if self._target is None else set(self._target)
            owned = set(self._owned)
            if not fenced and target is not None and target != owned:
                self._installing = target
        if fenced:
            self._revoke_all(commit=False, lost=True)
            with self._lock:
                self._fenced = False
            self._wake.set()
            return True
        if target is not None and target != owned:
            try:
                self._reconcile(consumer, owned, target)
            finally:
                with self._lock:
                    self._installing = None
        return False

    def committed(
        self, partitions: Sequence[TopicPartition], timeout_s: float
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (OffsetFetch without epoch check); None = none.

        A read_committed consumer asks for stable offsets (Kafka's KIP-447): while a
        transaction that committed offsets for a partition is still completing, the lookup
        waits for it, so a consumer taking over never starts from the offset before a
        transaction that is about to commit (which would process its records twice).
        """
        req = coordinator_pb2.OffsetFetchRequest(
            group_id=self.group_id,
            member_epoch=-1,
            topics=_topic_partitions(partitions),
            require_stable=self._consumer._read_committed,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            resp = self._request("OffsetFetch", req, max(deadline - time.monotonic(), 0.001))
            if resp.error_code != E.NONE:
                # The whole lookup failed: raise, or every partition would read as "nothing
                # committed" and start from auto_offset_reset instead of the group's offsets.
                raise error_for(resp.error_code, resp.error_message)
            unstable = any(
                pr.error_code == E.UNSTABLE_OFFSET_COMMIT
                for tr in resp.topics
                for pr in tr.partitions
            )
            if not unstable:
                break
            # Give up while time is left rather than ask once more with none (that answer
            # would be DEADLINE_EXCEEDED, hiding that the offsets were simply still unstable).
            if time.monotonic() + self._backoff_s >= deadline:
                raise error_for(
                    E.UNSTABLE_OFFSET_COMMIT,
                    f"group {self.group_id}: a transaction's offsets are still being completed",
                )
            time.sleep(self._backoff_s)
        found: dict[TopicPartition, OffsetAndMetadata] = {}
        for tr in resp.topics:
            for pr in tr.partitions:
                if pr.error_code == E.TOPIC_AUTHORIZATION_FAILED:
                    # Not "nothing committed": the ACLs hide the topic's offsets.
                    raise error_for(pr.error_code, pr.error_message)
                if pr.error_code == E.NONE and pr.committed_offset >= 0:
                    found[TopicPartition(tr.topic, pr.partition)] = OffsetAndMetadata(
                        pr.committed_offset, pr.metadata, pr.committed_leader_epoch
                    )
        return {tp: found.get(tp) for tp in partitions}

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_s: float) -> None:
        """Commit after every earlier commit of this consumer is done (their callbacks have
        run); raises the group-level error (e.g. UNKNOWN_MEMBER_ID after being fenced) or the
        first partition's error. See :mod:`strom.client.commit_queue` for the ordering."""
        if offsets:
            self._commits().commit(offsets, timeout_s)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        callback: Callable[[Mapping[TopicPartition, OffsetAndMetadata], BaseException | None], Any]
        | None,
    ) -> None:
        """Queue a commit behind this consumer's earlier ones; ``callback`` runs when done."""
        with contextlib.suppress(CommitQueueClosedError):  # closed: nothing more is sent
            self._commits().commit_async(offsets, callback)

    def group_metadata(self) -> GroupMetadata:
        """Group id, member id and epoch for transactional offset commits (see
        :meth:`_commit_identity`)."""
        member_id, epoch = self._commit_identity()
        return GroupMetadata(self.group_id, member_id, epoch)

    def _commit_identity(self) -> tuple[str, int]:
        """The (member id, epoch) a commit or a transaction's offsets carry.

        A subscribed consumer out of the group right now (it left after max_poll_interval_ms,
        was fenced, or is rejoining) sends its last identity, which the coordinator refuses
        (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH: Kafka's CommitFailedException), not -1,
        which a group without members accepts from anyone (an expelled member's commit could
        rewind the group's offsets, a zombie's transactional offsets be taken). Not
        subscribed (assign()), or never
        joined yet: -1 and no member id, a "simple" consumer."""
        with self._lock:
            if not self._subscribed:
                return "", -1
            if self.member_epoch > 0:
                return self.member_id, self.member_epoch
            if self._last_epoch > 0:
                return self.member_id, self._last_epoch
            return "", -1

    def _commits(self) -> CommitQueue:
        with self._lock:
            if self._commit_queue is None:
                self._commit_queue = CommitQueue(self._send_commit, linger_s=self._commit_linger_s)
            return self._commit_queue

    def _send_commit(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        sequence: int,
        timeout_s: float | None = None,
    ) -> dict[TopicPartition, StromError]:
        """One OffsetCommit (request number ``sequence``) with this member's id and epoch
        (:meth:`_commit_identity`); the per-partition errors.

        Raises the group-level error. A STALE_MEMBER_EPOCH after a heartbeat bumped the epoch
        is retried with the new one while every partition committed is still this member's;
        nothing is retried that could commit under an epoch the coordinator fenced, or over
        the commits of a partition's new owner.
        """
        # The caller's budget when it has one (a sync commit's timeout_ms, a close's time
        # left), which may be longer than request_timeout_ms (default_api_timeout_ms).
        budget = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(budget, 0.001)
        #: What is still to be committed (the partitions a coordinator refused for a topic
        #: its view does not have yet are sent again alone) and the errors of the others.
        pending = dict(offsets)
        errors: dict[TopicPartition, StromError] = {}
        while True:
            member_id, epoch = self._commit_identity()
            req = coordinator_pb2.OffsetCommitRequest(
                group_id=self.group_id,
                member_id=member_id,
                member_epoch=epoch,
                committer_id=self.member_id,
                commit_sequence=sequence,
            )
            add_offsets(req, pending)
            asked = time.monotonic()
            resp = self._request("OffsetCommit", req, max(deadline - asked, 0.001))
            self.stats.committed(time.monotonic() - asked)
            if resp.error_code == E.STALE_MEMBER_EPOCH and time.monotonic() < deadline:
                # The coordinator bumped the epoch (a rebalance): ask for a heartbeat at once
                # and retry with the epoch it brings, as Kafka's consumer does.
                self._wake.set()
                with self._lock:
                    wait_s = min(deadline - time.monotonic(), max(2 * self._interval_s, 0.5))
                    self._epoch_set.wait_for(lambda e=epoch: self.member_epoch != e, wait_s)
                    moved = self.member_epoch > 0 and self.member_epoch != epoch
                    gone = sorted(set(pending) - self._may_hold())
                if moved and gone:
                    # The coordinator checks only the member and its epoch, not that the
                    # partitions are still this member's. A retry under the new epoch would
                    # write offsets of partitions that rebalance gave to another member
                    # over that member's own commits (an async commit queued before the
                    # revocation, say): they go back and are read twice. Refused instead,
                    # as Kafka's consumer fails a commit whose generation moved.
                    names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in gone)
                    raise commit_failed_error(
                        StaleMemberEpochError(
                            f"the commit of {names} was refused for a stale member epoch "
                            f"({epoch}, now {self.member_epoch}) and is not retried: a "
                            "rebalance gave them to another member, whose commits it would "
                            "overwrite"
                        )
                    )
                if moved:
                    continue
            if resp.error_code != E.NONE:
                # Kafka's CommitFailedException too when the member is out of the group.
                raise commit_failed_error(error_for(resp.error_code, resp.error_message))
            refused = {
                TopicPartition(tr.topic, pr.partition): pr
                for tr in resp.topics
                for pr in tr.partitions
                if pr.error_code != E.NONE
            }
            again = self._not_known_yet(refused, deadline)
            for tp, pr in refused.items():
                if tp not in again:
                    where = f"{tp.topic}-{tp.partition}"
                    errors[tp] = error_for(pr.error_code, _naming(where, pr.error_message))
            if not again:
                return errors
            log.debug(
                "group %s: the coordinator does not know %d partitions yet; committing them again",
                self.group_id,
                len(again),
            )
            time.sleep(self._backoff_s)
            pending = {tp: om for tp, om in pending.items() if tp in again}

    def _not_known_yet(
        self, refused: Mapping[TopicPartition, Any], deadline: float
    ) -> set[TopicPartition]:
        """Of the partitions an OffsetCommit refused, those to send again: refused
        UNKNOWN_TOPIC_OR_PARTITION although the cluster's metadata has them, while the
        commit has time left. The coordinator checks commits against its own view of the
        topics, which learns a topic just created a moment after the nodes do; Kafka's
        consumer retries that error too (as TxnOffsetCommit does). A topic (or partition) the
        metadata does not have either fails at once: nothing will make it appear. Sent with
        the same ``commit_sequence``: the CommitQueue sends nothing newer meanwhile, and
        the coordinator wrote none of these partitions."""
        unknown = {
            tp for tp, pr in refused.items() if pr.error_code == E.UNKNOWN_TOPIC_OR_PARTITION
        }
        if not unknown or time.monotonic() + self._backoff_s >= deadline:
            return set()
        counts: dict[str, int] = {}
        for topic in sorted({tp.topic for tp in unknown}):
            try:
                counts[topic] = len(self._client.topic_metadata(topic).partitions)
            except StromError as exc:  # (unknown to the controller too: not retried)
                log.debug("group %s: %s not retried: %s", self.group_id, topic, exc)
        return {tp for tp in unknown if 0 <= tp.partition < counts.get(tp.topic, 0)}

    def close(self, *, autocommit: bool, timeout_s: float) -> None:
        """Commit (if asked) and give up the partitions, leave the group, stop the threads,
        all within ``timeout_s``: each step gets the time the earlier ones left, as Kafka's
        close(timeout) is a bound on the whole close."""
        end = time.monotonic() + timeout_s

        def left() -> float:
            return max(end - time.monotonic(), 0.0)

        try:
            if self._subscribed:
                self._revoke_all(commit=autocommit, lost=False, timeout_s=left())
            elif autocommit:
                self._commit_quietly(self._positions(self._consumer.assignment()), left())
        finally:
            self._stop.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=left())
            if self._commit_queue is not None:  # before leaving: a member's commits need it
                self._commit_queue.close(left())
            if self._subscribed:
                self._leave(left())

    # -- reconciliation (application thread) -------------------------------------------------

    def _reconcile(
        self, consumer: GroupHost, owned: set[TopicPartition], target: set[TopicPartition]
    ) -> None:
        began = time.monotonic()
        revoked = owned - target
        added = target - owned
        if revoked:
            self._call_listener("on_partitions_revoked", revoked)
            if self._auto_commit:
                self._commit_quietly(self._positions(revoked), self._timeout_s)
            owned = owned - revoked
        owned = owned | added
        consumer._apply_assignment(owned)
        with self._lock:
            self._owned = set(owned)
        if added:
            self._call_listener("on_partitions_assigned", added)
        self.stats.rebalanced(time.monotonic() - began)
        log.info(
            "group %s member %s: %d partitions (-%d +%d)",
            self.group_id,
            self.member_id,
            len(owned),
            len(revoked),
            len(added),
        )
        self._wake.set()  # tell the coordinator now, so revoked partitions move at once

    def _revoke_all(self, *, commit: bool, lost: bool, timeout_s: float | None = None) -> None:
        with self._lock:
            owned = set(self._owned)
        if owned:
            if lost:
                name = (
                    "on_partitions_lost"
                    if hasattr(self._listener, "on_partitions_lost")
                    else "on_partitions_revoked"
                )
                self._call_listener(name, owned)
            else:
                self._call_listener("on_partitions_revoked", owned)
                if commit:
                    self._commit_quietly(
                        self._positions(owned), self._timeout_s if timeout_s is None else timeout_s
                    )
        consumer = self._consumer
        if not consumer.closed:
            consumer._apply_assignment(set())
        with self._lock:
            self._owned = set()
            if lost:
                self._target = None

    def _positions(
        self, parts: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        positions = self._consumer._consumed_positions(parts)
        return {tp: OffsetAndMetadata(pos) for tp, pos in positions.items()}

    def _commit_quietly(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_s: float
    ) -> None:
        try:
            self.commit(offsets, timeout_s)
        except StromError as exc:
            log.warning("group %s: commit before revoking failed: %s", self.group_id, exc)

    @staticmethod
    def _log_commit_error(_offsets: Any, exc: BaseException | None) -> None:
        if exc is not None:
            log.warning("auto-commit failed: %s", exc)

    def _call_listener(self, method: str, parts: set[TopicPartition]) -> None:
        fn = getattr(self._listener, method, None)
        if fn is None:
            return
        try:
            fn(_sorted(parts))
        except Exception:
            log.exception("rebalance listener %s failed", method)

    # -- heartbeat thread ---------------------------------------------------------------------

    def _run(self) -> None:
        """The heartbeat thread. An unexpected error does not end it silently: the next poll
        raises it, and the loop goes on after a pause (else poll() would return nothing for
        ever)."""
        while not self._stop.is_set():
            try:
                wait = self._run_once()
            except Exception as exc:
                log.exception("group %s: heartbeat thread failed", self.group_id)
                self._fail(StromError(f"the consumer group's heartbeat thread failed: {exc!r}"))
                wait = max(self._interval_s, 1.0)
            if wait is None:
                return
            self._wake.wait(wait)
            self._wake.clear()

    def _run_once(self) -> float | None:
        """One round of :meth:`_run`: how long to wait for the next (None: stop)."""
        with self._lock:
            active = self._subscribed and not self._fenced and not self._poll_expired
            stalled = (
                active
                and not self._polling
                and self.member_epoch > 0
                and time.monotonic() - self._last_poll > self._max_poll_s
            )
            if stalled:
                self._poll_expired = True
        if stalled:
            # Heartbeats alone would keep the partitions of an application that stopped
            # polling for good: leave, so they move to members that read; the next poll
            # rejoins.
            log.warning(
                "group %s member %s: poll() not called for more than max_poll_interval_ms "
                "(%.0f ms): leaving the group; the next poll rejoins",
                self.group_id,
                self.member_id,
                self._max_poll_s * 1000,
            )
            self._leave()
            return 0.0
        if not active:
            return 0.2
        wait = self._heartbeat_once()
        if self._stop.is_set():
            return None
        return wait

    def _heartbeat_request(self, epoch: int | None = None) -> Any:
        with self._lock:
            req = coordinator_pb2.ConsumerGroupHeartbeatRequest(
                group_id=self.group_id,
                member_id=self.member_id,
                member_epoch=self.member_epoch if epoch is None else epoch,
                subscribed_topic_names=list(self._topics),
                owned_topic_partitions=_topic_partitions(self._may_hold()),
                rebalance_timeout_ms=self._rebalance_timeout_ms,
            )
            if self._pattern is not None:
                req.subscribed_topic_regex = self._pattern
        if self._instance_id is not None:
            req.instance_id = self._instance_id
        if self._assignor is not None:
            req.server_assignor = self._assignor
        if self.host_node is not None:
            req.host_node_id, req.host_node_incarnation_id = self.host_node
        return req

    def _may_hold(self) -> set[TopicPartition]:
        """With the lock held: what the application holds or may take before it learns
        anything newer — what it installed, what it is installing, and the last assignment
        received (the next poll installs it). Reported as owned, so the coordinator frees a
        revoked partition only once this member cannot consume it any more, even when the
        answer that revoked it was lost."""
        held = set(self._owned)
        if self._installing:
            held |= self._installing
        if self._target:
            held |= self._target
        return held

    def _heartbeat_once(self) -> float:
        """One heartbeat; returns how long to wait before the next one."""
        req = self._heartbeat_request()
        addr = "(not found)"
        try:
            stub, addr = self._stub(self._timeout_s)
            asked = time.monotonic()
            # Given up when close() stops the thread: it does not wait on a coordinator
            # that hangs (the leave is sent by close itself).
            resp = self._attempt(
                stub, addr, "ConsumerGroupHeartbeat", req, asked + self._attempt_s, self._stop
            )
            self.stats.heartbeat(time.monotonic() - asked)
        except CoordinatorMoved as moved:
            # Heartbeat the new owner now: it loaded the group with fresh session
            # deadlines, which this member must meet (it keeps its partitions).
            self._moved("ConsumerGroupHeartbeat", addr, moved)
            return 0.0
        except CallAbandoned:
            return 0.0
        except (AuthenticationError, AuthorizationError, InvalidConfigError) as exc:
            # Not allowed on the group (or not authenticated), or a bootstrap list none of
            # whose names resolves: the next poll raises it, rather than waiting silently
            # for a coordinator that will never answer.
            self._fail(exc)
            return self._interval_s
        except StromError as exc:
            log.debug("group %s: no coordinator yet: %s", self.group_id, exc)
            return self._backoff_s
        except grpc.RpcError as exc:
            if exc.code() in _TRANSPORT:
                self._coordinator = None
                return self._backoff_s
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                # E.g. a subscribed topic the principal may not describe: raised as what it
                # is (AuthorizationError), which the caller does not retry.
                self._fail(refused(exc))
                return self._interval_s
            self._fail(StromError(f"heartbeat failed: {exc.code().name} {exc.details()}"))
            return self._interval_s
        code = resp.error_code
        if code == E.NONE:
            with self._lock:
                self.member_id = resp.member_id or self.member_id
                self.member_epoch = resp.member_epoch
                self._epoch_set.notify_all()
                if resp.member_epoch > 0:
                    self._last_epoch = resp.member_epoch
                if resp.heartbeat_interval_ms > 0:
                    self._interval_s = resp.heartbeat_interval_ms / 1000.0
                changed = resp.HasField("assignment") and (
                    _from_assignment(resp.assignment) != self._target
                )
                if resp.HasField("assignment"):
                    self._target = _from_assignment(resp.assignment)
            if changed:
                self._wake_poll()
            return self._interval_s
        if code in COORDINATOR_REFRESH_CODES:
            self._coordinator = None
            return self._backoff_s
        if code in (E.COORDINATOR_LOAD_IN_PROGRESS, E.REQUEST_TIMED_OUT):
            return self._backoff_s
        if code in _FENCED:
            log.warning(
                "group %s: member %s fenced (%s); rejoining",
                self.group_id,
                self.member_id,
                resp.error_message,
            )
            with self._lock:
                self.member_epoch = 0
                self._target = None
                self._fenced = bool(self._owned)
            self._wake_poll()
            return 0.0
        self._fail(error_for(code, resp.error_message))
        return self._interval_s

    def has_error(self) -> bool:
        """Whether the next poll raises (a poll's wait for data ends at once then)."""
        return self._error is not None

    def _fail(self, exc: BaseException) -> None:
        """Keep ``exc`` for the next poll to raise, and wake a poll waiting for data so it
        raises now rather than at the end of its timeout."""
        self._error = exc
        self._wake_poll()

    def _wake_poll(self) -> None:
        """Wake a poll() blocked waiting for data, so it reconciles the new assignment now
        rather than when its timeout ends."""
        ready = getattr(self._consumer._fetcher, "data_ready", None)
        if ready is not None:
            with ready:
                ready.notify_all()

    def _leave(self, timeout_s: float | None = None) -> None:
        """Tell the coordinator we are gone (-1; -2 for a static member) so the partitions
        move at once instead of after the session timeout. Best effort."""
        with self._lock:
            joined = self.member_epoch > 0
        if not joined:
            return
        epoch = -2 if self._instance_id is not None else -1
        req = self._heartbeat_request(epoch)
        req.ClearField("owned_topic_partitions")
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        if timeout_s > 0:  # a close out of time does not wait on the coordinator once more
            with contextlib.suppress(StromError, grpc.RpcError):
                stub, _ = self._stub(timeout_s)
                stub.ConsumerGroupHeartbeat(req, timeout=timeout_s, metadata=self._metadata)
        with self._lock:
            self.member_epoch = 0
            self._target = None

    # -- coordinator lookup and calls -------------------------------------------------------

    def _find_coordinator(self, timeout_s: float) -> str:
        """FindCoordinator on any storage node; retried while no coordinator owns the shard."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._client.find_coordinator(self.group_id, timeout_s=self._timeout_s)
            except CoordinatorNotAvailableError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(self._backoff_s)

    def _stub(self, timeout_s: float) -> tuple[coordinator_pb2_grpc.CoordinatorServiceStub, str]:
        addr = self._coordinator
        if addr is None:
            addr = self._coordinator = self._find_coordinator(timeout_s)
        return coordinator_pb2_grpc.CoordinatorServiceStub(self._client.channel(addr)), addr

    def _attempt(
        self,
        stub: coordinator_pb2_grpc.CoordinatorServiceStub,
        addr: str,
        method: str,
        req: Any,
        deadline: float,
        stop: threading.Event | None = None,
    ) -> Any:
        """One attempt of a coordinator call at ``addr`` for up to ``_attempt_s`` (not past
        ``deadline``), left for the group's new coordinator once it has one
        (:class:`CoordinatorMoved`; the overdue rule of
        :func:`strom.client.coordinator_calls.call_leaving_moved`, DESIGN §8). Found from
        outside: a commit, a committed() or a heartbeat at a coordinator that hung waited
        the whole attempt (15 s by default) although a standby owned the group ~2.5 s
        after the hang."""
        return call_leaving_moved(
            self._client,
            getattr(stub, method),
            req,
            addr=addr,
            key=self.group_id,
            key_type=storage_pb2.COORDINATOR_TYPE_GROUP,
            timeout_s=attempt_timeout(self._attempt_s, deadline),
            deadline=deadline,
            metadata=self._metadata,
            stop=stop,
        )

    def _moved(self, method: str, addr: str, moved: CoordinatorMoved) -> None:
        """Forget ``addr`` for the group's new coordinator, which the next attempt asks."""
        log.info(
            "no %s answer from coordinator %s in %.1f s, and group %r is now owned by %s: "
            "asking there",
            method,
            addr,
            moved.waited_s,
            self.group_id,
            moved.address,
        )
        self._coordinator = moved.address

    def _request(self, method: str, req: Any, timeout_s: float) -> Any:
        """A coordinator RPC with coordinator lookup and retries of retriable group errors,
        for up to ``timeout_s`` in all, each attempt for up to ``_attempt_s``; returns the
        response (whose non-retriable error the caller handles). An attempt unanswered
        while the group moved to another coordinator is given up and sent there at once
        (:meth:`_attempt`); a coordinator that did not answer an attempt at all is
        forgotten and looked up again (FindCoordinator); when no attempt succeeded in time,
        RequestTimedOutError (retriable) names the last one.

        Sending again after an attempt was given up on is what a timed-out attempt led to
        before, and safe for the same reason: the old coordinator may have applied it before
        it lost the shard (the new owner replayed what it wrote). A heartbeat is the
        member's state again; an OffsetFetch reads; an OffsetCommit carries the same
        ``commit_sequence`` (the CommitQueue sends the next one only after this call
        ended), and the coordinator rewrites an offset from an equal sequence with the same
        value and keeps one a newer sequence set (``OffsetAndMetadata.supersedes``)."""
        deadline = time.monotonic() + timeout_s
        addr = "(not found)"
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                stub, addr = self._stub(remaining)
                resp = self._attempt(stub, addr, method, req, deadline)
            except CoordinatorMoved as moved:
                self._moved(method, addr, moved)
                continue  # (at once: the new owner was just found to own the group)
            except grpc.RpcError as exc:
                if exc.code() in (
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNAUTHENTICATED,
                ):
                    # Refused by the ACLs (or not authenticated): what it is, not retriable,
                    # so a poll does not take it for a coordinator failing over.
                    raise refused(exc) from None
                if exc.code() not in _TRANSPORT:
                    raise StromError(
                        f"{method} to the group coordinator {addr} failed: {exc.code().name} "
                        f"{exc.details() or ''}".rstrip(),
                        retriable=True,
                    ) from None
                # Forgotten before giving up: the next call looks the owner up again
                # rather than asking a coordinator that hangs once more.
                self._coordinator = None
                if time.monotonic() >= deadline:
                    raise RequestTimedOutError(
                        f"{method} for group {self.group_id!r} got no answer within "
                        f"{timeout_s * 1000:.0f} ms: the group coordinator {addr} did not "
                        f"answer ({exc.code().name})"
                    ) from None
            else:
                code = resp.error_code
                if code in COORDINATOR_REFRESH_CODES:
                    self._coordinator = None
                elif code not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.REQUEST_TIMED_OUT):
                    return resp
                if time.monotonic() >= deadline:
                    raise error_for(code, resp.error_message)
            time.sleep(self._backoff_s)


def _naming(where: str, message: str) -> str:
    """A partition's commit error naming the partition once: the coordinator's messages
    already name it."""
    if not message:
        return f"{where}: commit failed"
    return message if where in message else f"{where}: {message}"
