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

import enum
import functools
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from strom.api import coordinator_pb2
from strom.coordinator.assignors import Assignment, MemberSpec, get_assignor
from strom.coordinator.offsets_log import (
    GroupMetadata,
    GroupRecord,
    GroupSnapshot,
    MemberAssignment,
    MemberMetadata,
    OffsetAndMetadata,
    PendingTxnOffsets,
    current_assignment_record,
    current_assignment_tombstone,
    group_metadata_record,
    group_metadata_tombstone,
    member_metadata_record,
    member_metadata_tombstone,
    offset_commit_record,
    offset_commit_tombstone,
    pending_txn_offsets_record,
    pending_txn_offsets_tombstone,
    target_assignment_member_record,
    target_assignment_member_tombstone,
    target_assignment_metadata_record,
    target_assignment_metadata_tombstone,
)
from strom.errors import (
    ErrorCode,
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    InvalidGroupIdError,
    InvalidRegularExpressionError,
    InvalidRequestError,
    NonEmptyGroupError,
    ProducerFencedError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
)

#: Heartbeat ``member_epoch`` of a member joining (or rejoining after being fenced).
JOIN_GROUP_MEMBER_EPOCH = 0
#: Heartbeat ``member_epoch`` of a member leaving for good.
LEAVE_GROUP_MEMBER_EPOCH = -1
#: Heartbeat ``member_epoch`` of a static member leaving temporarily (keeps its assignment).
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
#: Topics whose names start with this are internal (``__consumer_offsets``); a regex
#: subscription never matches them (same rule as strom.controller.validation).
INTERNAL_TOPIC_PREFIX = "__"

TopicPartition = tuple[str, int]


class GroupState(enum.IntEnum):
    """A group's state as DescribeGroups/ListGroups report it (values are coordinator.proto's)."""

    EMPTY = coordinator_pb2.GROUP_STATE_EMPTY
    ASSIGNING = coordinator_pb2.GROUP_STATE_ASSIGNING
    RECONCILING = coordinator_pb2.GROUP_STATE_RECONCILING
    STABLE = coordinator_pb2.GROUP_STATE_STABLE
    DEAD = coordinator_pb2.GROUP_STATE_DEAD


class MemberState(enum.IntEnum):
    """A member's reconciliation state (values are coordinator.proto's)."""

    STABLE = coordinator_pb2.MEMBER_STATE_STABLE
    UNREVOKED_PARTITIONS = coordinator_pb2.MEMBER_STATE_UNREVOKED_PARTITIONS
    UNRELEASED_PARTITIONS = coordinator_pb2.MEMBER_STATE_UNRELEASED_PARTITIONS


@dataclass(frozen=True)
class GroupConfig:
    """Coordinator-wide group settings (Kafka's ``group.consumer.*`` and offsets settings).

    Attributes:
        session_timeout_ms: a member that does not heartbeat for this long is removed
            (``group.consumer.session.timeout.ms``).
        heartbeat_interval_ms: the interval told to members
            (``group.consumer.heartbeat.interval.ms``).
        max_size: most members a group may have (``group.consumer.max.size``); None = no limit.
        default_assignor: the assignor used when no member asks for one.
        offset_metadata_max_bytes: longest commit metadata string, UTF-8 bytes
            (``offset.metadata.max.bytes``).
        default_rebalance_timeout_ms: the revocation deadline of a member whose heartbeat
            carries no rebalance timeout (<= 0; the consumer's ``max.poll.interval.ms``
            default), so an unset field never fences a member the moment it must revoke.
    """

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int | None = None
    default_assignor: str = "uniform"
    offset_metadata_max_bytes: int = 4096
    default_rebalance_timeout_ms: int = 300_000


@dataclass
class Member:
    """One member: what it declared (``metadata``), where it is in reconciliation, its timers.

    ``assigned`` and ``pending_revocation`` together are the partitions the member may hold
    right now; the group never gives any of them to another member.
    """

    member_id: str
    metadata: MemberMetadata
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: dict[str, set[int]] = field(default_factory=dict)
    pending_revocation: dict[str, set[int]] = field(default_factory=dict)
    session_deadline_ms: int = 0
    revocation_deadline_ms: int | None = None
    #: Which topics the member's principal may DESCRIBE (None: any, ACLs off or not known
    #: yet): a regex subscription resolves only to those, as Kafka's does. Set by every
    #: heartbeat (the caller's principal is not persisted; after a reload the member's next
    #: heartbeat sets it again).
    topic_filter: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)
    #: What the member's regex resolved to at its last heartbeat with ACLs on (None: no
    #: regex, ACLs off, or no heartbeat since the group was loaded).
    resolved: frozenset[str] | None = field(default=None, compare=False, repr=False)

    @property
    def instance_id(self) -> str | None:
        """group.instance.id of a static member, None for dynamic members."""
        return self.metadata.instance_id

    def assignment(self) -> Assignment:
        """The partitions the member may consume now (what heartbeats send it)."""
        return _freeze(self.assigned)

    def current(self) -> MemberAssignment:
        """The member's reconciliation state as persisted (CurrentMemberAssignmentValue)."""
        return MemberAssignment(
            member_epoch=self.member_epoch,
            previous_member_epoch=self.previous_member_epoch,
            state=int(self.state),
            assigned=_freeze(self.assigned),
            pending_revocation=_freeze(self.pending_revocation),
        )


@dataclass
class HeartbeatResult:
    """What a heartbeat answers (ConsumerGroupHeartbeatResponse fields) and must persist.

    ``assignment`` is None when unchanged (the response leaves the field unset).
    """

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None
    records: list[GroupRecord]
    #: What changed the group's membership or subscriptions, for the coordinator's log
    #: ("member m1 joined", "member m2 left"); None for a plain heartbeat.
    change: str | None = None
    #: The group epoch after the call and the one before it (equal: no rebalance).
    group_epoch: int = 0
    previous_group_epoch: int = 0
    #: Members after the call.
    members: int = 0


@dataclass(frozen=True)
class ExpiredMember:
    """A member removed by :meth:`ConsumerGroup.expire` and why ("session" or "rebalance")."""

    member_id: str
    instance_id: str | None
    reason: str


@dataclass
class ExpireResult:
    """Members removed by :meth:`ConsumerGroup.expire` and the records to persist."""

    expired: list[ExpiredMember]
    records: list[GroupRecord]
    #: The group epoch and member count after the removals (for the coordinator's log).
    group_epoch: int = 0
    members: int = 0


@dataclass
class OffsetsResult:
    """Per-partition ErrorCodes of an offset commit/delete, and the records to persist."""

    errors: dict[TopicPartition, int]
    records: list[GroupRecord]
    #: Partitions an OffsetCommit left alone because a newer commit of the same committer
    #: had already set them.
    superseded: int = 0


def _stale_offset(om: OffsetAndMetadata, live_topic_id: str | None) -> bool:
    """Whether a committed offset outlived its topic: no topic of that name is live, or the
    live one has another id (deleted and created again)."""
    if live_topic_id is None:
        return True
    return om.topic_id != "" and live_topic_id != "" and om.topic_id != live_topic_id


def _freeze(parts: Mapping[str, Iterable[int]]) -> Assignment:
    return {t: sorted(ps) for t, ps in sorted(parts.items()) if ps}


def _thaw(parts: Mapping[str, Iterable[int]] | None) -> dict[str, set[int]]:
    if not parts:
        return {}
    out: dict[str, set[int]] = {}
    for t, ps in parts.items():
        s = set(ps)
        if s:
            out[t] = s
    return out


def _intersects(a: Mapping[str, set[int]], b: Mapping[str, set[int]]) -> bool:
    return any(a.get(t, set()) & ps for t, ps in b.items())


def _is_subset(a: Mapping[str, set[int]], b: Mapping[str, set[int]]) -> bool:
    return all(ps <= b.get(t, set()) for t, ps in a.items())


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


def _new_member_id() -> str:
    return str(uuid.uuid4())


class ConsumerGroup:
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
        (:attr:`Member.topic_filter`; found from outside: a member was assigned topics its
        principal may not see).
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
    # Epochs, target assignment, reconciliation

    def _compute_subscription_metadata(self) -> dict[str, int]:
        known = self._known_topics()
        wanted = self.all_subscribed_topics()
        return {t: known[t] for t in sorted(wanted) if t in known}

    def _preferred_assignor(self) -> str:
        """The assignor most members ask for (ties by name), else the configured default."""
        counts: dict[str, int] = {}
        for m in self.members.values():
            name = m.metadata.server_assignor
            if name:
                counts[name] = counts.get(name, 0) + 1
        if not counts:
            return get_assignor(self.config.default_assignor).name
        return min(counts, key=lambda n: (-counts[n], n))

    def _maybe_bump_epoch(self, records: list[GroupRecord], *, force: bool) -> None:
        subscription = self._compute_subscription_metadata()
        assignor = self._preferred_assignor()
        if (
            force
            or not self._persisted
            or subscription != self.subscription_metadata
            or assignor != self.assignor_name
        ):
            self.subscription_metadata = subscription
            self.assignor_name = assignor
            self.group_epoch += 1
            records.append(self._metadata_record())

    def _metadata_record(self) -> GroupRecord:
        self._persisted = True
        return group_metadata_record(
            self.group_id,
            GroupMetadata(
                group_epoch=self.group_epoch,
                subscribed_topic_partitions=dict(self.subscription_metadata),
                assignor_name=self.assignor_name,
                created_ms=self.created_ms,
            ),
        )

    def refresh_metadata(self, topics: Mapping[str, int]) -> list[GroupRecord]:
        """Take new cluster topics; bump the group epoch if subscribed partition counts changed.

        Heartbeats do this on their own (their ``topics`` argument); this is for a service
        that wants a metadata change to start a rebalance before the next heartbeat. The
        target itself is recomputed on the next heartbeat, as for any epoch bump.
        """
        records: list[GroupRecord] = []
        if topics != self._topics:
            self._topics = dict(topics)
            if self.members:
                self._maybe_bump_epoch(records, force=False)
        return records

    def _compute_target(self) -> list[GroupRecord]:
        """Run the assignor for the current group epoch; records for what changed."""
        assignor = get_assignor(self.assignor_name)
        specs = [
            MemberSpec(
                member_id=mid,
                topics=self.subscribed_topics(m),
                assignment=self.target.get(mid, {}),
                instance_id=m.instance_id,
                rack_id=m.metadata.rack_id,
            )
            for mid, m in sorted(self.members.items())
        ]
        new_target = assignor.assign(specs, self.subscription_metadata)
        records = [
            target_assignment_member_record(self.group_id, mid, new_target[mid])
            for mid in sorted(new_target)
            if self.target.get(mid) != new_target[mid]
        ]
        self.target = new_target
        self.assignment_epoch = self.group_epoch
        records.append(target_assignment_metadata_record(self.group_id, self.assignment_epoch))
        return records

    def _release(self, member: Member, parts: Mapping[str, set[int]]) -> None:
        for t, ps in parts.items():
            for p in ps:
                if self._owners.get((t, p)) == member.member_id:
                    del self._owners[(t, p)]

    def _reconcile(
        self, member: Member, owned: Mapping[str, set[int]], now_ms: int, *, force: bool
    ) -> None:
        """Move the member one step towards its target (KIP-848's CurrentAssignmentBuilder)."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if _intersects(owned, member.pending_revocation):
                return  # still revoking; nothing can move until it reports them gone
            self._release(member, member.pending_revocation)
            member.pending_revocation = {}
            member.revocation_deadline_ms = None
        elif (
            not force
            and member.state is MemberState.STABLE
            and member.member_epoch == self.assignment_epoch
        ):
            return
        self._compute_next(member, owned, now_ms, joining=force)

    def _compute_next(
        self, member: Member, owned: Mapping[str, set[int]], now_ms: int, *, joining: bool
    ) -> None:
        target = self.target.get(member.member_id, {})
        keep: dict[str, set[int]] = {}
        revoke: dict[str, set[int]] = {}
        gained: dict[str, set[int]] = {}
        unreleased = False
        for t in set(target) | set(member.assigned):
            want = set(target.get(t, ()))
            have = member.assigned.get(t, set())
            if have & want:
                keep[t] = have & want
            if have - want:
                revoke[t] = have - want
            for p in sorted(want - have):
                holder = self._owners.get((t, p))
                if holder is None or holder == member.member_id:
                    gained.setdefault(t, set()).add(p)
                else:
                    unreleased = True
        if revoke:
            # A report from a member that is not joining may predate the assignment that gave
            # it these partitions: it can be installing them right now (on its application
            # thread, between its heartbeats) and consume them. Only a heartbeat sent after it
            # learnt of the revocation can say they are gone, so revoke first unless it joins
            # (then it holds nothing). Freeing them at once let two members consume the same
            # partition: a transactional pipeline transformed records twice (chaos).
            if not joining or _intersects(owned, revoke):
                # Revoke first, in the current epoch; new partitions come after.
                member.assigned = keep
                member.pending_revocation = revoke
                member.state = MemberState.UNREVOKED_PARTITIONS
                member.revocation_deadline_ms = now_ms + max(
                    0, member.metadata.rebalance_timeout_ms
                )
                return
            # A join: the member holds nothing yet, free them right away.
            self._release(member, revoke)
        for t, ps in gained.items():
            keep.setdefault(t, set()).update(ps)
            for p in ps:
                self._owners[(t, p)] = member.member_id
        member.assigned = keep
        member.pending_revocation = {}
        member.revocation_deadline_ms = None
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE

    def _remove_member(self, member: Member) -> list[GroupRecord]:
        """Remove a member, free its partitions and bump the group epoch."""
        gid, mid = self.group_id, member.member_id
        self._release(member, member.assigned)
        self._release(member, member.pending_revocation)
        del self.members[mid]
        if member.instance_id is not None and self._static.get(member.instance_id) == mid:
            del self._static[member.instance_id]
        self.target.pop(mid, None)
        records = [
            current_assignment_tombstone(gid, mid),
            target_assignment_member_tombstone(gid, mid),
            member_metadata_tombstone(gid, mid),
        ]
        self._maybe_bump_epoch(records, force=True)
        return records

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

    # -----------------------------------------------------------------------------------------
    # Offsets

    def validate_commit(self, member_id: str, member_epoch: int) -> None:
        """Check that an OffsetCommit may proceed (KIP-848's rules).

        ``member_epoch`` -1 (any negative) is an admin or a simple consumer not using group
        management: allowed only while the group has no members. Otherwise the member must
        exist and send exactly its current epoch: an older one is STALE_MEMBER_EPOCH (it may
        retry with the epoch of its next heartbeat, if it still owns the partitions), a newer
        one FENCED_MEMBER_EPOCH. A member removed after its session timeout (a zombie) gets
        UNKNOWN_MEMBER_ID, so it cannot overwrite the offsets of the partitions' new owners.

        Raises:
            NonEmptyGroupError, UnknownMemberIdError, StaleMemberEpochError,
            FencedMemberEpochError.
        """
        if member_epoch < 0:
            if self.members:
                raise NonEmptyGroupError(
                    f"group {self.group_id!r} has members; commits without a member epoch "
                    "are allowed only on an empty group"
                )
            return
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(
                f"member {member_id!r} is not a member of group {self.group_id!r}"
            )
        if member_epoch > member.member_epoch:
            raise FencedMemberEpochError(
                f"member epoch {member_epoch} is newer than the coordinator's {member.member_epoch}"
            )
        if member_epoch < member.member_epoch:
            raise StaleMemberEpochError(
                f"member epoch {member_epoch} is older than the member's current "
                f"{member.member_epoch}"
            )

    def validate_fetch(self, member_id: str, member_epoch: int) -> None:
        """Check an OffsetFetch: -1 (any negative) is unchecked (admins, simple consumers);
        otherwise the member must exist (UNKNOWN_MEMBER_ID) with exactly its current epoch
        (STALE_MEMBER_EPOCH), as in Kafka."""
        if member_epoch < 0:
            return
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(
                f"member {member_id!r} is not a member of group {self.group_id!r}"
            )
        if member_epoch != member.member_epoch:
            raise StaleMemberEpochError(
                f"member epoch {member_epoch} is not the member's current {member.member_epoch}"
            )

    def commit_offsets(
        self,
        member_id: str,
        member_epoch: int,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        now_ms: int,
        topics: Mapping[str, int] | None = None,
        committer_id: str = "",
        commit_sequence: int = 0,
    ) -> OffsetsResult:
        """Validate (:meth:`validate_commit`) and apply an OffsetCommit.

        Per partition: OFFSET_METADATA_TOO_LARGE for a metadata string over the limit,
        UNKNOWN_TOPIC_OR_PARTITION when ``topics`` is given and lacks the partition, else NONE.
        The commit timestamp is ``now_ms``. Raises the group-level errors of
        :meth:`validate_commit` (nothing committed then).

        One committer's commits take effect in the order it numbered them: a partition whose
        offset a newer commit of the same ``committer_id`` already set keeps that offset (a
        delayed request, e.g. a retried attempt that reached the coordinator late); its result
        is NONE, as if the older commit had been applied first and then overwritten.
        """
        self.validate_commit(member_id, member_epoch)
        errors: dict[TopicPartition, int] = {}
        records: list[GroupRecord] = []
        if not self._persisted:
            records.append(self._metadata_record())
        limit = self.config.offset_metadata_max_bytes
        superseded = 0
        for (t, p), om in sorted(offsets.items()):
            if len(om.metadata.encode()) > limit:
                errors[(t, p)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            if topics is not None and not (t in topics and 0 <= p < topics[t]):
                errors[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            errors[(t, p)] = ErrorCode.NONE
            current = self.offsets.get((t, p))
            if (
                current is not None
                and current.topic_id == om.topic_id
                and current.supersedes(committer_id, commit_sequence)
            ):
                superseded += 1
                continue
            om = replace(
                om,
                commit_timestamp_ms=now_ms,
                committer_id=committer_id,
                commit_sequence=commit_sequence,
            )
            self.offsets[(t, p)] = om
            records.append(offset_commit_record(self.group_id, t, p, om))
        return OffsetsResult(errors, records, superseded)

    def txn_commit_offsets(
        self,
        member_id: str,
        member_epoch: int,
        producer_id: int,
        producer_epoch: int,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        now_ms: int,
        topics: Mapping[str, int] | None = None,
    ) -> OffsetsResult:
        """TxnOffsetCommit: validated like :meth:`commit_offsets` (a fenced member cannot
        commit), but stored as the pending offsets of the transaction of ``producer_id``;
        they become the committed offsets only when it commits (:meth:`complete_txn`).

        Raises ProducerFencedError when a newer epoch of the producer already has offsets
        pending here (a zombie instance).
        """
        self.validate_commit(member_id, member_epoch)
        current = self.pending.get(producer_id)
        if current is not None and current.producer_epoch > producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} is fenced in group "
                f"{self.group_id!r}: epoch {current.producer_epoch} "
                + ("has offsets pending" if current.offsets else "ended its transaction here")
            )
        merged: dict[TopicPartition, OffsetAndMetadata] = (
            dict(current.offsets)
            if current is not None and current.producer_epoch == producer_epoch
            else {}
        )
        errors: dict[TopicPartition, int] = {}
        limit = self.config.offset_metadata_max_bytes
        for (t, p), om in sorted(offsets.items()):
            if len(om.metadata.encode()) > limit:
                errors[(t, p)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif topics is not None and not (t in topics and 0 <= p < topics[t]):
                errors[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                merged[(t, p)] = om  # timestamped when the transaction commits
                errors[(t, p)] = ErrorCode.NONE
        records: list[GroupRecord] = []
        if not self._persisted:
            records.append(self._metadata_record())
        pending = PendingTxnOffsets(producer_epoch, merged)
        self.pending[producer_id] = pending
        records.append(pending_txn_offsets_record(self.group_id, producer_id, pending))
        return OffsetsResult(errors, records)

    def complete_txn(
        self, producer_id: int, producer_epoch: int, committed: bool, *, now_ms: int
    ) -> OffsetsResult:
        """The transaction of ``producer_id`` ended: its pending offsets become the group's
        committed offsets (``committed``) or are dropped. Idempotent: a retry changes nothing.

        The epoch it ended with stays, as a pending entry without offsets: an offset commit
        of an older epoch arriving afterwards is refused (found from outside: a producer
        paused between AddOffsetsToTxn and TxnOffsetCommit while its transaction timed out
        and was aborted with a bumped epoch; its late offsets were taken, pending for good,
        and every read_committed member of the group was refused UNSTABLE_OFFSET_COMMIT)."""
        pending = self.pending.get(producer_id)
        if pending is not None and (
            pending.producer_epoch > producer_epoch
            or (pending.producer_epoch == producer_epoch and not pending.offsets)
        ):
            return OffsetsResult({}, [])  # stale, or ended already
        records: list[GroupRecord] = []
        if not self._persisted:  # a group created for this record (see CompleteTxnOffsets)
            records.append(self._metadata_record())
        errors: dict[TopicPartition, int] = {}
        if committed and pending is not None:
            for (t, p), om in sorted(pending.offsets.items()):
                om = replace(om, commit_timestamp_ms=now_ms)
                self.offsets[(t, p)] = om
                records.append(offset_commit_record(self.group_id, t, p, om))
                errors[(t, p)] = ErrorCode.NONE
        ended = PendingTxnOffsets(producer_epoch, {})
        self.pending[producer_id] = ended
        records.append(pending_txn_offsets_record(self.group_id, producer_id, ended))
        return OffsetsResult(errors, records)

    def unstable(self, topic: str, partition: int) -> bool:
        """Whether an open transaction has an offset pending for the partition (OffsetFetch
        with require_stable answers UNSTABLE_OFFSET_COMMIT for it)."""
        return any((topic, partition) in p.offsets for p in self.pending.values())

    def live_offsets(self, topic_ids: Mapping[str, str]) -> dict[TopicPartition, OffsetAndMetadata]:
        """The committed offsets that still belong to a live topic (``topic_ids``: the
        cluster's live topics → ids). An offset of a deleted topic, or of an earlier topic of
        the same name (committed with another id), is not the current topic's position: a
        consumer resuming there would skip the new topic's first records. Offsets committed
        without an id (before ids were stored) count as the live topic's."""
        return {
            tp: om for tp, om in self.offsets.items() if not _stale_offset(om, topic_ids.get(tp[0]))
        }

    def drop_stale_offsets(self, topic_ids: Mapping[str, str]) -> OffsetsResult:
        """Delete (tombstone) the offsets :meth:`live_offsets` leaves out, as Kafka drops a
        deleted topic's offsets; no subscription check (the topic is gone)."""
        records: list[GroupRecord] = []
        for (t, p), om in sorted(self.offsets.items()):
            if _stale_offset(om, topic_ids.get(t)):
                del self.offsets[(t, p)]
                records.append(offset_commit_tombstone(self.group_id, t, p))
        return OffsetsResult({}, records)

    def delete_offsets(self, partitions: Iterable[TopicPartition]) -> OffsetsResult:
        """DeleteOffsets: GROUP_SUBSCRIBED_TO_TOPIC for topics a member is subscribed to,
        else delete (NONE, also when nothing was committed)."""
        subscribed = self.all_subscribed_topics()
        errors: dict[TopicPartition, int] = {}
        records: list[GroupRecord] = []
        for t, p in sorted(set(partitions)):
            if t in subscribed:
                errors[(t, p)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
                continue
            if self.offsets.pop((t, p), None) is not None:
                records.append(offset_commit_tombstone(self.group_id, t, p))
            errors[(t, p)] = ErrorCode.NONE
        return OffsetsResult(errors, records)

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

    # -----------------------------------------------------------------------------------------
    # Persistence

    def snapshot(self) -> GroupSnapshot:
        """The group as its records describe it (what a replay must give back)."""
        return GroupSnapshot(
            group_id=self.group_id,
            metadata=(
                GroupMetadata(
                    group_epoch=self.group_epoch,
                    subscribed_topic_partitions=dict(self.subscription_metadata),
                    assignor_name=self.assignor_name,
                    created_ms=self.created_ms,
                )
                if self._persisted
                else None
            ),
            assignment_epoch=self.assignment_epoch,
            members={mid: m.metadata for mid, m in self.members.items()},
            targets={mid: dict(a) for mid, a in self.target.items()},
            current={mid: m.current() for mid, m in self.members.items()},
            offsets=dict(self.offsets),
            pending=dict(self.pending),
        )

    @classmethod
    def from_snapshot(
        cls,
        snapshot: GroupSnapshot,
        *,
        now_ms: int,
        config: GroupConfig | None = None,
        member_id_factory: Callable[[], str] = _new_member_id,
    ) -> ConsumerGroup:
        """Rebuild a group from replayed records (a shard takeover, or a failed write).

        Session timers are not persisted: every member gets a fresh session timeout from
        ``now_ms`` (and members still revoking a fresh rebalance timeout), as in Kafka.
        """
        group = cls(
            snapshot.group_id,
            config=config,
            now_ms=now_ms,
            member_id_factory=member_id_factory,
        )
        meta = snapshot.metadata
        if meta is not None:
            group.group_epoch = meta.group_epoch
            group.subscription_metadata = dict(meta.subscribed_topic_partitions)
            if meta.assignor_name:
                group.assignor_name = meta.assignor_name
            group.created_ms = meta.created_ms
            group._persisted = True
        group.assignment_epoch = snapshot.assignment_epoch
        session = group.config.session_timeout_ms
        for mid in sorted(snapshot.members):
            md = snapshot.members[mid]
            cur = snapshot.current.get(mid, MemberAssignment())
            member = Member(
                mid,
                metadata=md,
                member_epoch=cur.member_epoch,
                previous_member_epoch=cur.previous_member_epoch,
                state=MemberState(cur.state or MemberState.STABLE),
                assigned=_thaw(cur.assigned),
                pending_revocation=_thaw(cur.pending_revocation),
                session_deadline_ms=now_ms + session,
            )
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                member.revocation_deadline_ms = now_ms + max(0, md.rebalance_timeout_ms)
            group.members[mid] = member
            if md.instance_id is not None:
                group._static[md.instance_id] = mid
            for parts in (member.assigned, member.pending_revocation):
                for t, ps in parts.items():
                    for p in ps:
                        group._owners.setdefault((t, p), mid)
        group.target = {mid: dict(a) for mid, a in snapshot.targets.items() if mid in group.members}
        group.offsets = dict(snapshot.offsets)
        group.pending = dict(snapshot.pending)
        return group


def _subscription(md: MemberMetadata) -> tuple[object, ...]:
    """The parts of a member's metadata that the target assignment depends on."""
    return (md.subscribed_topic_names, md.subscribed_topic_regex, md.server_assignor)
