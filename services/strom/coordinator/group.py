"""The consumer-group state machine of KIP-848 (DESIGN §7): a pure engine.

One :class:`ConsumerGroup` is one group of one coordinator shard: its members and their
subscriptions, its epochs, its target assignment, each member's reconciliation progress, and
its committed offsets. It has no clock, thread, gRPC or etcd in it: every call that depends on
time takes ``now_ms``, cluster topics come in as a ``{topic: partition count}`` mapping, and
every change comes back as the list of ``__consumer_offsets`` records
(:class:`~strom.coordinator.offsets_log.GroupRecord`) the service must append, in one batch,
before it answers. That split is what lets the whole protocol be tested in milliseconds, and a
coordinator that takes the shard over rebuild the same group from those records
(:meth:`ConsumerGroup.from_snapshot`).

The engine is split by concern into modules named after what they hold:
:class:`ConsumerGroup` here keeps the views, the heartbeat, the timers and the group's
deletion; its epochs and reconciliation are the mixin
:class:`~strom.coordinator.group_reconciliation.GroupReconciliation`, its committed offsets
:class:`~strom.coordinator.group_offsets.GroupOffsets`, its snapshot and rebuild
:class:`~strom.coordinator.group_persistence.GroupPersistence`, and the value types (states,
config, member, results) are in :mod:`strom.coordinator.group_types`. Every public name
is still importable from here.

The protocol, in short (KIP-848's, which Kafka 4 uses):

* **Epochs.** The *group epoch* goes up whenever what the assignment depends on changes: a
  member joins or leaves, a subscription or the preferred assignor changes, or a subscribed
  topic appears or gains partitions. The *assignment epoch* is the group epoch the *target
  assignment* (the assignor's output) was computed at; it catches up lazily, on the next
  heartbeat, as in Kafka. Each member has a *member epoch*: the assignment epoch it has
  converged to, which it echoes on every heartbeat and offset commit, so a zombie (a member
  that was fenced and does not know it yet) is recognised by its stale epoch.
* **Incremental reconciliation.** A member moves towards its target in steps. If it owns
  partitions its target no longer has, it is first told to revoke them (its assignment shrinks,
  its epoch stays): ``UNREVOKED_PARTITIONS``. Once a heartbeat shows it no longer owns them
  they are released; the member then takes the target epoch and the target partitions that are
  free. Partitions still held by another member (which has yet to revoke them) are withheld:
  ``UNRELEASED_PARTITIONS``, until that owner's heartbeat releases them. So no partition is
  ever assigned to two members at once, and members not involved keep consuming throughout.
* **Leaving.** ``member_epoch = -1`` removes the member at once (its partitions are free for the
  next target). ``-2`` is a static member (with ``instance_id``) going away briefly: it keeps
  its assignment, nobody gets its partitions, and the same instance id rejoining within the
  session timeout (usually with a new member id: a restarted process) takes its place and its
  partitions back, without a rebalance. Members that miss the session timeout, or do not revoke
  within their rebalance timeout, are removed by :meth:`ConsumerGroup.expire`.
* **Fencing.** Errors are raised as :mod:`strom.errors` exceptions whose ``code`` is the
  ErrorCode the response carries (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, FENCED_INSTANCE_ID,
  UNRELEASED_INSTANCE_ID, STALE_MEMBER_EPOCH, ...); a failed call changes nothing.

Durability contract with the service: a mutating call changes the in-memory group at once and
returns the records describing the change; the service appends them (one batch, acks=all) and
only then answers. If the append fails, the service must not answer success and should rebuild
the group from its last durable state (:class:`~strom.coordinator.offsets_log.ShardState` fed
with the records it did write), failing operations queued behind the failed write too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping

from strom.coordinator.assignors import Assignment, get_assignor
from strom.coordinator.group_offsets import GroupOffsets
from strom.coordinator.group_persistence import GroupPersistence
from strom.coordinator.group_reconciliation import GroupReconciliation
from strom.coordinator.group_types import (
    INTERNAL_TOPIC_PREFIX,
    JOIN_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ExpiredMember,
    ExpireResult,
    GroupConfig,
    GroupState,
    HeartbeatResult,
    HostNode,
    Member,
    MemberState,
    OffsetsResult,
    TopicPartition,
    _freeze,
    _intersects,
    _is_subset,
    _new_member_id,
    _thaw,
)
from strom.coordinator.offsets_log import (
    GroupRecord,
    MemberMetadata,
    OffsetAndMetadata,
    PendingTxnOffsets,
    current_assignment_record,
    current_assignment_tombstone,
    group_metadata_tombstone,
    member_metadata_record,
    member_metadata_tombstone,
    offset_commit_tombstone,
    pending_txn_offsets_tombstone,
    target_assignment_member_record,
    target_assignment_member_tombstone,
    target_assignment_metadata_tombstone,
)
from strom.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    InvalidGroupIdError,
    InvalidRegularExpressionError,
    InvalidRequestError,
    NonEmptyGroupError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
)

__all__ = [
    "INTERNAL_TOPIC_PREFIX",
    "JOIN_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_STATIC_MEMBER_EPOCH",
    "ConsumerGroup",
    "ExpireResult",
    "ExpiredMember",
    "GroupConfig",
    "GroupState",
    "HeartbeatResult",
    "HostNode",
    "Member",
    "MemberState",
    "OffsetsResult",
    "TopicPartition",
    "compile_subscription_regex",
]


@functools.lru_cache(maxsize=1024)
def compile_subscription_regex(pattern: str) -> re.Pattern[str]:
    """Compile a subscription regex (matched against whole topic names).

    KIP-848 specifies RE2; strom uses Python's ``re`` (no RE2 binding is a dependency), which
    accepts RE2's common syntax. The match is a full match, as RE2J's ``matches()`` in Kafka.

    Raises:
        InvalidRegularExpressionError: the pattern does not compile.
    """
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidRegularExpressionError(
            f"subscription regex {pattern!r} is invalid: {exc}"
        ) from None


class ConsumerGroup(GroupReconciliation, GroupOffsets, GroupPersistence):
    """One consumer group (KIP-848 protocol) and its committed offsets.

    Attributes:
        group_id: the group's id.
        config: the coordinator's group settings.
        group_epoch: bumped when membership, subscriptions, the preferred assignor or the
            subscribed topics' partition counts change.
        assignment_epoch: the group epoch the target assignment was computed at.
        assignor_name: the server-side assignor in use.
        subscription_metadata: partition count of every existing topic some member subscribes
            to, as of the last epoch bump (what the target assignment was computed from).
        members: member id -> :class:`Member`.
        target: member id -> target assignment.
        offsets: (topic, partition) -> committed offset.
        created_ms: when the group was created.
    """

    def __init__(
        self,
        group_id: str,
        *,
        config: GroupConfig | None = None,
        now_ms: int = -1,
        member_id_factory: Callable[[], str] = _new_member_id,
    ) -> None:
        if not group_id:
            raise InvalidGroupIdError("group id must not be empty")
        self.group_id = group_id
        self.config = config or GroupConfig()
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.assignor_name = get_assignor(self.config.default_assignor).name
        self.subscription_metadata: dict[str, int] = {}
        self.members: dict[str, Member] = {}
        self.target: dict[str, Assignment] = {}
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        #: Offsets of open transactions, by producer id (TxnOffsetCommit).
        self.pending: dict[int, PendingTxnOffsets] = {}
        self.created_ms = now_ms
        self._member_id_factory = member_id_factory
        self._static: dict[str, str] = {}  # instance id -> member id
        self._owners: dict[TopicPartition, str] = {}  # partition -> member holding it
        self._topics: dict[str, int] | None = None  # the cluster's topics, last seen
        self._persisted = False  # GroupMetadata record written (or replayed)
        self._dead = False

    # -----------------------------------------------------------------------------------------
    # Views

    @property
    def state(self) -> GroupState:
        """EMPTY, ASSIGNING, RECONCILING, STABLE or DEAD (KIP-848's definitions)."""
        if self._dead:
            return GroupState.DEAD
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return GroupState.RECONCILING
        return GroupState.STABLE

    def owner_of(self, topic: str, partition: int) -> str | None:
        """The member currently holding a partition (assigned or pending revocation), if any."""
        return self._owners.get((topic, partition))

    def static_member(self, instance_id: str) -> Member | None:
        """The member holding a group.instance.id, if any."""
        mid = self._static.get(instance_id)
        return self.members.get(mid) if mid is not None else None

    def subscribed_topics(self, member: Member) -> frozenset[str]:
        """The member's subscription resolved against the known topics (regex expanded).

        Named topics are kept even if they do not exist yet (they are assigned once they
        appear); a regex only matches existing, non-internal topics the member may describe
        (:attr:`Member.topic_filter`: a member must not be assigned topics its principal
        may not see).
        """
        md = member.metadata
        names = set(md.subscribed_topic_names)
        if md.subscribed_topic_regex is not None:
            rx = compile_subscription_regex(md.subscribed_topic_regex)
            may = member.topic_filter
            names.update(
                t
                for t in self._known_topics()
                if not t.startswith(INTERNAL_TOPIC_PREFIX)
                and rx.fullmatch(t)
                and (may is None or may(t))
            )
        return frozenset(names)

    def all_subscribed_topics(self) -> frozenset[str]:
        """Union of every member's resolved subscription."""
        out: set[str] = set()
        for m in self.members.values():
            out |= self.subscribed_topics(m)
        return frozenset(out)

    def next_deadline_ms(self) -> int | None:
        """The earliest session or revocation deadline (when :meth:`expire` may next act)."""
        deadlines = [m.session_deadline_ms for m in self.members.values()]
        deadlines += [
            m.revocation_deadline_ms
            for m in self.members.values()
            if m.revocation_deadline_ms is not None
        ]
        return min(deadlines, default=None)

    def _known_topics(self) -> Mapping[str, int]:
        return self._topics if self._topics is not None else self.subscription_metadata

    # -----------------------------------------------------------------------------------------
    # Heartbeat

    def heartbeat(
        self,
        *,
        member_id: str,
        member_epoch: int,
        now_ms: int,
        topics: Mapping[str, int] | None = None,
        instance_id: str | None = None,
        rack_id: str | None = None,
        subscribed_topic_names: Iterable[str] = (),
        subscribed_topic_regex: str | None = None,
        server_assignor: str | None = None,
        owned_partitions: Mapping[str, Iterable[int]] | None = None,
        rebalance_timeout_ms: int = 0,
        client_id: str = "",
        client_host: str = "",
        topic_filter: Callable[[str], bool] | None = None,
        host_node: HostNode | None = None,
    ) -> HeartbeatResult:
        """Handle one ConsumerGroupHeartbeat (join, heartbeat, leave) and answer it.

        ``topics`` is the cluster's current topics -> partition counts (None = unchanged since
        the last call); new topics matching a regex, or more partitions, bump the group epoch.
        ``owned_partitions`` is what the member reports owning now (empty on a join).
        ``rebalance_timeout_ms`` <= 0 means "not sent": the config's default applies.
        ``client_id`` / ``client_host`` are what DescribeGroups shows (from gRPC metadata).
        ``topic_filter``: the topics the caller's principal may DESCRIBE (None: any); a regex
        resolves only to those (:meth:`subscribed_topics`), and a change of what it resolves
        to (an ACL changed, or the first heartbeat after a reload) rebalances the group.
        ``host_node``: the storage node running the member (RecordService streams; None for
        ordinary consumers), for :meth:`fence_gone_hosts`.

        Raises (nothing is changed then):
            InvalidRequestError: inconsistent request (names and regex both set, -2 without
                instance id, partitions reported on a join).
            UnknownMemberIdError: the member (or the static member) is not in the group.
            FencedMemberEpochError: the epoch is not the member's (nor its previous one with
                owned partitions within its assignment).
            FencedInstanceIdError: the instance id belongs to another member id.
            UnreleasedInstanceIdError: a join with an instance id still held by a live member.
            UnsupportedAssignorError, InvalidRegularExpressionError, GroupMaxSizeReachedError.
        """
        names = tuple(sorted(set(subscribed_topic_names)))
        owned = _thaw(owned_partitions)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = self.config.default_rebalance_timeout_ms
        self._validate_request(member_id, member_epoch, instance_id, names, subscribed_topic_regex)
        if server_assignor:
            get_assignor(server_assignor)  # raises UnsupportedAssignorError
        if subscribed_topic_regex is not None:
            compile_subscription_regex(subscribed_topic_regex)  # raises

        epoch_before = self.group_epoch
        if member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            member = self._leaving_member(member_id, instance_id)
            records = self._remove_member(member)
            return self._noted(
                HeartbeatResult(
                    member.member_id, LEAVE_GROUP_MEMBER_EPOCH, self._interval(), None, records
                ),
                [f"member {member.member_id} left"],
                epoch_before,
            )
        if member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            member = self._leaving_member(member_id, instance_id)
            return self._noted(
                self._static_leave(member, owned, now_ms),
                [
                    f"static member {member.member_id} (instance {instance_id}) left for now, "
                    "keeping its partitions for a session timeout"
                ],
                epoch_before,
            )

        # Join or regular heartbeat: look the member up and validate before changing anything.
        replaced: Member | None = None
        member: Member | None
        if member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if owned:
                raise InvalidRequestError("owned partitions must be empty when joining")
            member, replaced = self._joining_member(member_id, instance_id)
            if member is None and replaced is None:
                limit = self.config.max_size
                if limit is not None and len(self.members) >= limit:
                    raise GroupMaxSizeReachedError(
                        f"group {self.group_id!r} has reached its maximum size of {limit}"
                    )
        else:
            member = self._existing_member(member_id, member_epoch, instance_id, owned)

        # A member whose rights are not known yet (the first heartbeat after a reload): what
        # the group resolves its regex to now, without them (compared below).
        unfiltered: frozenset[str] | None = None
        if (
            member is not None
            and topic_filter is not None
            and member.resolved is None
            and member.metadata.subscribed_topic_regex is not None
        ):
            unfiltered = self.subscribed_topics(member)
        records: list[GroupRecord] = []
        new_metadata = MemberMetadata(
            instance_id=instance_id,
            rack_id=rack_id,
            client_id=client_id,
            client_host=client_host,
            subscribed_topic_names=names,
            subscribed_topic_regex=subscribed_topic_regex,
            server_assignor=server_assignor or None,
            rebalance_timeout_ms=rebalance_timeout_ms,
        )
        is_join = member_epoch == JOIN_GROUP_MEMBER_EPOCH
        created = False
        membership_changed = False
        #: What changed, for the coordinator's log (one line per change, none per heartbeat).
        causes: list[str] = []
        if replaced is not None:
            member = self._replace_static_member(replaced, member_id, records)
            causes.append(
                f"static member {member.member_id} (instance {instance_id}) rejoined in place "
                f"of {replaced.member_id}"
            )
        elif member is None:
            member = Member(member_id or self._member_id_factory(), metadata=new_metadata)
            self.members[member.member_id] = member
            created = membership_changed = True
            records.append(member_metadata_record(self.group_id, member.member_id, new_metadata))
            causes.append(f"member {member.member_id} joined")
        elif is_join:
            causes.append(
                f"member {member.member_id} rejoined with epoch 0 (it was fenced, or lost the "
                "answer to its join)"
            )
        if member.metadata != new_metadata:
            old = member.metadata
            if _subscription(old) != _subscription(new_metadata):
                membership_changed = True
                if not created:
                    causes.append(f"member {member.member_id} changed its subscription")
            if (
                old.instance_id is not None
                and self._static.get(old.instance_id) == member.member_id
            ):
                del self._static[old.instance_id]
            member.metadata = new_metadata
            records.append(member_metadata_record(self.group_id, member.member_id, new_metadata))
        if instance_id is not None:
            self._static[instance_id] = member.member_id
        member.topic_filter = topic_filter
        member.host = _host_after(member.host, host_node)

        topics_changed = topics is not None and topics != self._topics
        if topics_changed:
            self._topics = dict(topics or {})
        if topic_filter is not None or member.resolved is not None:
            # With ACLs on, what the regex resolves to also follows the member's rights: a
            # change since its last heartbeat (an ACL added or removed) rebalances the group.
            resolved = (
                self.subscribed_topics(member)
                if member.metadata.subscribed_topic_regex is not None
                else None
            )
            previous = member.resolved if member.resolved is not None else unfiltered
            if previous is not None and resolved != previous:
                membership_changed = True
                causes.append(f"the topics member {member.member_id}'s regex may read changed")
            member.resolved = resolved
        if membership_changed or topics_changed or not self._persisted:
            self._maybe_bump_epoch(records, force=membership_changed)
            if self.group_epoch > epoch_before and not causes:
                causes.append("the subscribed topics' partitions or the assignor changed")
        if self.group_epoch > self.assignment_epoch:
            records.extend(self._compute_target())

        before = member.current()
        self._reconcile(member, owned, now_ms, force=is_join)
        after = member.current()
        if after != before or created or replaced is not None:
            records.append(current_assignment_record(self.group_id, member.member_id, after))
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms

        assignment = member.assignment()
        # Sent on a join, when it changed, when the member's report differs from it (it lost
        # a response or has yet to revoke), and with every epoch change (cheap, unambiguous).
        send = (
            is_join
            or after.assigned != before.assigned
            or _freeze(owned) != assignment
            or member_epoch != member.member_epoch
        )
        return self._noted(
            HeartbeatResult(
                member.member_id,
                member.member_epoch,
                self._interval(),
                assignment if send else None,
                records,
            ),
            causes,
            epoch_before,
        )

    def _noted(
        self, result: HeartbeatResult, causes: list[str], epoch_before: int
    ) -> HeartbeatResult:
        """``result`` with what changed the group (``causes``), its epochs and size."""
        result.change = "; ".join(causes) or None
        result.group_epoch = self.group_epoch
        result.previous_group_epoch = epoch_before
        result.members = len(self.members)
        return result

    def _interval(self) -> int:
        return self.config.heartbeat_interval_ms

    @staticmethod
    def _validate_request(
        member_id: str,
        member_epoch: int,
        instance_id: str | None,
        names: tuple[str, ...],
        regex: str | None,
    ) -> None:
        if member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise FencedMemberEpochError(f"member epoch {member_epoch} is not valid")
        if member_epoch != JOIN_GROUP_MEMBER_EPOCH and not member_id:
            raise UnknownMemberIdError(f"member epoch {member_epoch} needs a member id")
        if member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and instance_id is None:
            raise InvalidRequestError("member epoch -2 (static leave) needs an instance id")
        if names and regex is not None:
            raise InvalidRequestError(
                "subscribed_topic_names and subscribed_topic_regex are mutually exclusive"
            )

    def _leaving_member(self, member_id: str, instance_id: str | None) -> Member:
        if instance_id is not None:
            member = self.static_member(instance_id)
            if member is None:
                raise UnknownMemberIdError(
                    f"instance id {instance_id!r} is not a member of group {self.group_id!r}"
                )
            if member.member_id != member_id:
                raise FencedInstanceIdError(
                    f"instance id {instance_id!r} belongs to member {member.member_id!r}, "
                    f"not {member_id!r}"
                )
            return member
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(
                f"member {member_id!r} is not a member of group {self.group_id!r}"
            )
        return member

    def _joining_member(
        self, member_id: str, instance_id: str | None
    ) -> tuple[Member | None, Member | None]:
        """(existing member rejoining or None for a new one, static member to replace or None)."""
        if instance_id is not None:
            holder = self.static_member(instance_id)
            if holder is not None and holder.member_id != member_id:
                if holder.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    raise UnreleasedInstanceIdError(
                        f"instance id {instance_id!r} is still held by member "
                        f"{holder.member_id!r}, which has not left"
                    )
                if member_id in self.members:
                    raise InvalidRequestError(
                        f"member {member_id!r} cannot take over instance id {instance_id!r}: "
                        "it is already a member"
                    )
                return None, holder
        return self.members.get(member_id) if member_id else None, None

    def _existing_member(
        self,
        member_id: str,
        member_epoch: int,
        instance_id: str | None,
        owned: Mapping[str, set[int]],
    ) -> Member:
        if instance_id is not None:
            holder = self.static_member(instance_id)
            if holder is None:
                raise UnknownMemberIdError(
                    f"instance id {instance_id!r} is not a member of group {self.group_id!r}"
                )
            if holder.member_id != member_id:
                raise FencedInstanceIdError(
                    f"instance id {instance_id!r} belongs to member {holder.member_id!r}, "
                    f"not {member_id!r}"
                )
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(
                f"member {member_id!r} is not a member of group {self.group_id!r}"
            )
        current = member.member_epoch
        if member_epoch > current:
            raise FencedMemberEpochError(
                f"member epoch {member_epoch} is newer than the coordinator's {current}; "
                "abandon all partitions and rejoin"
            )
        if member_epoch < current and not (
            member_epoch == member.previous_member_epoch and _is_subset(owned, member.assigned)
        ):
            # The previous epoch is tolerated: the member lost the response that bumped it.
            raise FencedMemberEpochError(
                f"member epoch {member_epoch} is older than the coordinator's {current}; "
                "abandon all partitions and rejoin"
            )
        return member

    def _static_leave(
        self, member: Member, owned: Mapping[str, set[int]], now_ms: int
    ) -> HeartbeatResult:
        """-2: keep the member and its partitions for a session timeout; no rebalance."""
        records: list[GroupRecord] = []
        before = member.current()
        if member.pending_revocation and not _intersects(owned, member.pending_revocation):
            self._release(member, member.pending_revocation)
            member.pending_revocation = {}
            member.state = MemberState.STABLE
        if member.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
        member.revocation_deadline_ms = None
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        after = member.current()
        if after != before:
            records.append(current_assignment_record(self.group_id, member.member_id, after))
        return HeartbeatResult(
            member.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH, self._interval(), None, records
        )

    def _replace_static_member(
        self, old: Member, new_member_id: str, records: list[GroupRecord]
    ) -> Member:
        """A static member back under a new member id takes the old one's place and partitions."""
        new_id = new_member_id or self._member_id_factory()
        member = Member(
            new_id,
            metadata=old.metadata,
            # A new member id: no heartbeat can carry an older epoch of it, so start from 0
            # (the join's reconciliation moves it to the assignment epoch at once).
            member_epoch=0,
            previous_member_epoch=-1,
            state=old.state,
            assigned={t: set(ps) for t, ps in old.assigned.items()},
            pending_revocation={t: set(ps) for t, ps in old.pending_revocation.items()},
        )
        gid = self.group_id
        records.append(current_assignment_tombstone(gid, old.member_id))
        records.append(target_assignment_member_tombstone(gid, old.member_id))
        records.append(member_metadata_tombstone(gid, old.member_id))
        del self.members[old.member_id]
        self.members[new_id] = member
        if old.instance_id is not None:
            self._static[old.instance_id] = new_id
        for parts in (member.assigned, member.pending_revocation):
            for t, ps in parts.items():
                for p in ps:
                    self._owners[(t, p)] = new_id
        target = self.target.pop(old.member_id, None)
        records.append(member_metadata_record(gid, new_id, member.metadata))
        if target is not None:
            self.target[new_id] = target
            records.append(target_assignment_member_record(gid, new_id, target))
        return member

    # -----------------------------------------------------------------------------------------
    # Timers

    def expire(self, now_ms: int) -> ExpireResult:
        """Remove members whose session timed out or that did not revoke in time.

        A static member away with -2 is removed here too once its session timeout passes:
        then, and only then, its partitions go to others.
        """
        expired: list[ExpiredMember] = []
        records: list[GroupRecord] = []
        for mid in sorted(self.members):
            m = self.members[mid]
            if m.session_deadline_ms <= now_ms:
                reason = "session"
            elif m.revocation_deadline_ms is not None and m.revocation_deadline_ms <= now_ms:
                reason = "rebalance"
            else:
                continue
            records.extend(self._remove_member(m))
            expired.append(ExpiredMember(mid, m.instance_id, reason))
        return ExpireResult(expired, records, self.group_epoch, len(self.members))

    def has_gone_hosts(self, live: Mapping[int, int]) -> bool:
        """Whether :meth:`fence_gone_hosts` would remove a member (a cheap look, for the
        timer loop, before it takes the shard lock and a write)."""
        return any(_host_gone(m.host, live) for m in self.members.values())

    def fence_gone_hosts(self, live: Mapping[int, int]) -> ExpireResult:
        """Remove the members whose host node's registration has left the cluster.

        ``live`` maps each registered storage node to the session of its registration
        (:class:`~strom.coordinator.node_sessions.NodeSessions`). A member a node runs for a
        RecordService stream (:attr:`Member.host`) dies with that node process: once the
        registration it was seen under is gone (the node crashed, hung or was cut off past its
        lease, and the controller fences it) or replaced (the node restarted, or re-registered after
        losing its lease, so it lost or dropped its streams' state), nothing will heartbeat for it,
        or what does is a zombie. Kafka waits out the session timeout (45 s) for such a member,
        leaving its partitions unread; here the removal happens as soon as the coordinator's view
        shows it, as a session expiry would (reason ``"node"``), so its partitions go to the other
        members at once. A zombie's next heartbeat or commit is then UNKNOWN_MEMBER_ID. Members with
        no host (ordinary consumers) or an unconfirmed one are left alone.
        """
        expired: list[ExpiredMember] = []
        records: list[GroupRecord] = []
        for mid in sorted(self.members):
            m = self.members[mid]
            if _host_gone(m.host, live):
                records.extend(self._remove_member(m))
                expired.append(ExpiredMember(mid, m.instance_id, "node"))
        return ExpireResult(expired, records, self.group_epoch, len(self.members))

    # -----------------------------------------------------------------------------------------
    # Deletion

    @property
    def idle(self) -> bool:
        """EMPTY (no members) with no transactional offsets (an ended transaction's entry
        included: it fences a late commit of an older epoch): the periodic cleanup may delete
        it, once :attr:`removable`, or with its offsets after the offsets retention."""
        return not (self._dead or self.members or self.pending)

    @property
    def removable(self) -> bool:
        """:attr:`idle` with no committed offsets either. Kafka drops such a group on its
        offsets cleanup; kept, every short-lived consumer group without commits stays listed
        for good."""
        return self.idle and not self.offsets

    def delete_if_idle(self, *, with_offsets: bool) -> list[GroupRecord]:
        """The cleanup's deletion: :meth:`delete` if the group is still :attr:`removable`
        (or :attr:`idle`, when its offsets have expired too) once the shard lock is held (a
        member may have joined, or an offset been committed, meanwhile), else nothing."""
        return self.delete() if (self.idle if with_offsets else self.removable) else []

    def delete(self) -> list[GroupRecord]:
        """DeleteGroups: tombstones for every key of the group, GroupMetadata last.

        Raises:
            NonEmptyGroupError: the group still has members.
        """
        if self.members:
            raise NonEmptyGroupError(f"group {self.group_id!r} still has members")
        gid = self.group_id
        records = [offset_commit_tombstone(gid, t, p) for t, p in sorted(self.offsets)]
        records.extend(pending_txn_offsets_tombstone(gid, pid) for pid in sorted(self.pending))
        self.pending.clear()
        records.extend(target_assignment_member_tombstone(gid, mid) for mid in sorted(self.target))
        records.append(target_assignment_metadata_tombstone(gid))
        records.append(group_metadata_tombstone(gid))
        self.offsets.clear()
        self.target.clear()
        self._dead = True
        return records


def _subscription(md: MemberMetadata) -> tuple[object, ...]:
    """The parts of a member's metadata that the target assignment depends on."""
    return (md.subscribed_topic_names, md.subscribed_topic_regex, md.server_assignor)


def _host_after(old: HostNode | None, new: HostNode | None) -> HostNode | None:
    """The host a heartbeat leaves a member with: the one it names, except that a heartbeat
    the coordinator could not match to a registration (``registration`` None: the node's key
    is missing from its view) keeps the registration already seen for that same process, so
    a member whose node just lost its lease is still fenced for it."""
    if (
        new is not None
        and new.registration is None
        and old is not None
        and (old.node_id, old.incarnation_id) == (new.node_id, new.incarnation_id)
    ):
        return old
    return new


def _host_gone(host: HostNode | None, live: Mapping[int, int]) -> bool:
    """Whether a member's confirmed host registration is no longer the node's live one."""
    return (
        host is not None
        and host.registration is not None
        and live.get(host.node_id) != host.registration
    )
