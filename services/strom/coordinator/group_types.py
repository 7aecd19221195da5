"""The value types of the consumer-group engine (:mod:`strom.coordinator.group`).

The group and member states, the coordinator-wide :class:`GroupConfig`, one :class:`Member`
and what the engine's calls answer (:class:`HeartbeatResult`, :class:`ExpireResult`,
:class:`OffsetsResult`), with the heartbeat's special member epochs and the helpers that turn
an assignment into the sets the engine works on; and :class:`GroupFields`, the group's fields
declared once for the mixins :class:`~strom.coordinator.group.ConsumerGroup` is made of. They
are separate from the engine because the service, the RPC layer and the metrics read them
without needing the state machine itself; :mod:`strom.coordinator.group` re-exports every
one of them.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from strom.api import coordinator_pb2
from strom.coordinator.assignors import Assignment
from strom.coordinator.offsets_log import (
    GroupRecord,
    MemberAssignment,
    MemberMetadata,
    OffsetAndMetadata,
    PendingTxnOffsets,
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


@dataclass(frozen=True)
class HostNode:
    """The storage node process a member runs in (a RecordService Subscribe stream's member).

    Such a member lives and dies with that process, so the coordinator removes it as soon as
    the node's registration leaves the cluster, without waiting out the session timeout
    (:meth:`~strom.coordinator.group.ConsumerGroup.fence_gone_hosts`).

    Attributes:
        node_id: the node's id.
        incarnation_id: the node process's incarnation (NodeRegistration.incarnation_id).
        registration: the session (:class:`~strom.coordinator.node_sessions.NodeSessions`)
            of the node's registration the coordinator saw holding that incarnation when the
            member heartbeated: one uninterrupted registration of the process (a node that
            lost its lease registers again, same incarnation, as a new session). None when
            the coordinator's view did not show the node with that incarnation (a view that
            lags, a node re-registering): the member is then left to its session timeout
            until a heartbeat sees the registration.
    """

    node_id: int
    incarnation_id: str
    registration: int | None = None


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
    #: The storage node hosting the member (RecordService streams), as its last heartbeat
    #: said; None for ordinary consumers. Not persisted: after a reload the member's next
    #: heartbeat sets it again (until then only its session timeout removes it).
    host: HostNode | None = field(default=None, compare=False)

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


class GroupFields:
    """The fields ``ConsumerGroup.__init__`` sets, declared once for the mixins the group is
    made of (:mod:`strom.coordinator.group_reconciliation`, :mod:`~strom.coordinator.group_offsets`,
    :mod:`~strom.coordinator.group_persistence`), which read and set them as the group's own.
    """

    group_id: str
    config: GroupConfig
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    subscription_metadata: dict[str, int]
    members: dict[str, Member]
    target: dict[str, Assignment]
    offsets: dict[TopicPartition, OffsetAndMetadata]
    #: Offsets of open transactions, by producer id (TxnOffsetCommit).
    pending: dict[int, PendingTxnOffsets]
    created_ms: int
    _static: dict[str, str]  # instance id -> member id
    _owners: dict[TopicPartition, str]  # partition -> member holding it
    _topics: dict[str, int] | None  # the cluster's topics, last seen
    _persisted: bool  # GroupMetadata record written (or replayed)


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


def _new_member_id() -> str:
    return str(uuid.uuid4())
