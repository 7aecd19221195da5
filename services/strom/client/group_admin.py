"""Consumer groups from the admin side: the coordinator calls and typed results that
:class:`strom.client.admin.Admin` (``list_groups``, ``describe_groups``, ...) and the
``strom groups`` CLI share.

A group lives on the coordinator owning its shard (FindCoordinator on a storage node); a
listing asks every shard's owner (FindCoordinator with ``all_shards``, which needs no DESCRIBE
on the cluster). A call is retried while the coordinator moves or loads, up to the caller's
overall timeout, as every Admin call is.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from strom.api import coordinator_pb2, coordinator_pb2_grpc, storage_pb2
from strom.client.cluster import ClusterClient, attempt_timeout, older_node
from strom.client.coordinator_calls import CoordinatorMoved, call_leaving_moved
from strom.client.types import TopicPartition
from strom.errors import (
    COORDINATOR_REFRESH_CODES,
    CoordinatorNotAvailableError,
    ErrorCode,
    GroupListingIncompleteError,
    NonEmptyGroupError,
    StromError,
)

E = ErrorCode
#: Group-level codes after which the call is sent again (to the coordinator found anew).
_RETRY = (*COORDINATOR_REFRESH_CODES, E.COORDINATOR_LOAD_IN_PROGRESS, E.REQUEST_TIMED_OUT)

__all__ = [
    "GroupDescription",
    "GroupListing",
    "GroupListingIncompleteError",
    "GroupPartitionLag",
    "GroupState",
    "MemberDescription",
    "MemberState",
]


class GroupState(enum.StrEnum):
    """A group's state (KIP-848), spelled as ``strom groups list`` prints it."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"
    UNKNOWN = "Unknown"


_GROUP_STATES = {
    coordinator_pb2.GROUP_STATE_EMPTY: GroupState.EMPTY,
    coordinator_pb2.GROUP_STATE_ASSIGNING: GroupState.ASSIGNING,
    coordinator_pb2.GROUP_STATE_RECONCILING: GroupState.RECONCILING,
    coordinator_pb2.GROUP_STATE_STABLE: GroupState.STABLE,
    coordinator_pb2.GROUP_STATE_DEAD: GroupState.DEAD,
}
_STATE_CODES = {state: code for code, state in _GROUP_STATES.items()}


class MemberState(enum.StrEnum):
    """Where a member is in reconciling its assignment (KIP-848)."""

    STABLE = "Stable"
    UNREVOKED_PARTITIONS = "UnrevokedPartitions"
    UNRELEASED_PARTITIONS = "UnreleasedPartitions"
    UNKNOWN = "Unknown"


_MEMBER_STATES = {
    coordinator_pb2.MEMBER_STATE_STABLE: MemberState.STABLE,
    coordinator_pb2.MEMBER_STATE_UNREVOKED_PARTITIONS: MemberState.UNREVOKED_PARTITIONS,
    coordinator_pb2.MEMBER_STATE_UNRELEASED_PARTITIONS: MemberState.UNRELEASED_PARTITIONS,
}


def group_state(code: int) -> GroupState:
    return _GROUP_STATES.get(code, GroupState.UNKNOWN)


def group_state_code(state: GroupState | str) -> int:
    """The protobuf value of a state filter; ValueError naming the states for a bad one."""
    try:
        return _STATE_CODES[GroupState(state)]
    except (ValueError, KeyError):
        names = ", ".join(repr(s.value) for s in _STATE_CODES)
        raise ValueError(f"unknown group state {state!r} (one of {names})") from None


@dataclass(frozen=True)
class GroupListing:
    """One group as ``Admin.list_groups`` lists it."""

    group_id: str
    state: GroupState
    member_count: int
    #: The coordinator shard (``__consumer_offsets`` partition) the group lives in.
    shard: int


@dataclass(frozen=True)
class MemberDescription:
    """One member of a described group."""

    member_id: str
    #: ``group_instance_id`` of a static member; None for a dynamic one.
    instance_id: str | None
    rack_id: str | None
    client_id: str
    #: The member's address as the coordinator saw it.
    client_host: str
    member_epoch: int
    state: MemberState
    #: Subscribed topic names (empty when subscribing by pattern).
    subscribed_topics: tuple[str, ...]
    subscribed_pattern: str | None
    #: The partitions it owns now.
    assignment: tuple[TopicPartition, ...]
    #: The partitions it is converging to.
    target_assignment: tuple[TopicPartition, ...]
    #: Partitions it was told to give up and has not reported revoked yet: still its own (no
    #: other member gets them before), so in neither ``assignment`` nor the target.
    pending_revocation: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class GroupPartitionLag:
    """One partition's committed offset, log end and lag within a group (``describe_groups``
    with ``include_offsets``)."""

    topic_partition: TopicPartition
    #: The next offset the group reads; None = nothing committed.
    committed_offset: int | None
    metadata: str
    #: The high watermark (the log end consumers see); None = unknown.
    end_offset: int | None
    #: ``end_offset - committed_offset`` (0 when nothing is committed and the log is empty);
    #: None = unknown. Negative when the committed offset is past the log end (records
    #: deleted or expired, a reset past the end, the topic created again): the group's next
    #: fetch there gets OFFSET_OUT_OF_RANGE and resets by its ``auto.offset.reset``.
    lag: int | None
    #: The member owning the partition; None = none.
    member_id: str | None


@dataclass(frozen=True)
class GroupDescription:
    """A consumer group as ``Admin.describe_groups`` describes it."""

    group_id: str
    state: GroupState
    #: Bumped whenever membership or subscriptions change.
    group_epoch: int
    #: Epoch of the current target assignment (equal to ``group_epoch`` once computed).
    assignment_epoch: int
    #: The server-side assignor ("uniform", "range").
    assignor: str
    members: tuple[MemberDescription, ...]
    #: Per-partition offsets and lag; empty unless asked for (``include_offsets``).
    offsets: tuple[GroupPartitionLag, ...] = ()

    @property
    def is_empty(self) -> bool:
        """No active members: offsets may be altered and the group deleted."""
        return not self.members


def _tps(assignment: coordinator_pb2.Assignment) -> tuple[TopicPartition, ...]:
    return tuple(
        TopicPartition(tp.topic, p) for tp in assignment.topic_partitions for p in tp.partitions
    )


def _member(m: coordinator_pb2.DescribedMember) -> MemberDescription:
    return MemberDescription(
        member_id=m.member_id,
        instance_id=m.instance_id if m.HasField("instance_id") else None,
        rack_id=m.rack_id if m.HasField("rack_id") else None,
        client_id=m.client_id,
        client_host=m.client_host,
        member_epoch=m.member_epoch,
        state=_MEMBER_STATES.get(m.state, MemberState.UNKNOWN),
        subscribed_topics=tuple(m.subscribed_topic_names),
        subscribed_pattern=(
            m.subscribed_topic_regex if m.HasField("subscribed_topic_regex") else None
        ),
        assignment=_tps(m.assignment),
        target_assignment=_tps(m.target_assignment),
        pending_revocation=_tps(m.partitions_pending_revocation),
    )


def partition_lag(committed: int | None, end: int | None) -> int | None:
    """A group's lag on one partition, as Kafka's kafka-consumer-groups computes it: the log
    end minus the committed offset, negative when the committed offset is past the end (an
    operator must see that: the consumer will get OFFSET_OUT_OF_RANGE and reset); 0 with
    nothing committed on an empty log; None when unknown.

    Why from the two offsets and not the answer's ``lag`` field: that field uses -1 for
    "unknown" (and older coordinators clamped it to 0), so a lag of -1 could not be told
    from an unknown one."""
    if end is None or end < 0:
        return None
    if committed is None or committed < 0:
        return 0 if end == 0 else None
    return end - committed


def _lag(o: coordinator_pb2.GroupPartitionOffset) -> GroupPartitionLag:
    committed = o.committed_offset if o.committed_offset >= 0 else None
    end = o.end_offset if o.end_offset >= 0 else None
    return GroupPartitionLag(
        topic_partition=TopicPartition(o.topic, o.partition),
        committed_offset=committed,
        metadata=o.metadata,
        end_offset=end,
        lag=partition_lag(committed, end),
        member_id=o.member_id or None,
    )


def group_description(d: coordinator_pb2.DescribedGroup) -> GroupDescription:
    """The typed form of a DescribedGroup answered without an error."""
    return GroupDescription(
        group_id=d.group_id,
        state=group_state(d.state),
        group_epoch=d.group_epoch,
        assignment_epoch=d.assignment_epoch,
        assignor=d.assignor_name,
        members=tuple(_member(m) for m in d.members),
        offsets=tuple(_lag(o) for o in d.offsets),
    )


def group_call(
    client: ClusterClient,
    group: str,
    method: str,
    req: Any,
    code_of: Callable[[Any], int] | None = None,
    *,
    timeout_s: float,
    retry_s: float,
) -> Any:
    """A CoordinatorService call for ``group`` on its coordinator, retried while the
    coordinator moves or loads (each attempt up to ``timeout_s``, the whole call up to
    ``retry_s``). ``code_of(resp)`` picks the group-level error code (default
    ``resp.error_code``); the answer is returned whatever that code is, unless retriable.

    An attempt unanswered for a second leaves a coordinator that hangs once the group has
    another owner (:func:`strom.client.coordinator_calls.call_leaving_moved`, DESIGN §8), as a
    consumer's own group calls do, rather than waiting out the attempt (30 s) there. A
    resend is as safe as after a timeout."""
    code_of = code_of or (lambda r: r.error_code)
    deadline = time.monotonic() + retry_s
    last = "no coordinator"
    while True:
        try:
            addr: str | None = client.find_coordinator(group, timeout_s=timeout_s)
        except CoordinatorNotAvailableError as exc:
            addr, last = None, exc.message
        if addr is not None:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(addr))
            attempt = attempt_timeout(timeout_s, deadline)
            try:
                resp = call_leaving_moved(
                    client,
                    getattr(stub, method),
                    req,
                    addr=addr,
                    key=group,
                    key_type=storage_pb2.COORDINATOR_TYPE_GROUP,
                    timeout_s=attempt,
                    deadline=deadline,
                )
            except CoordinatorMoved as moved:
                last = f"{addr}: no answer; the group moved to {moved.address}"
                if time.monotonic() < deadline:
                    continue  # at once: the lookup above finds the new owner
            except grpc.RpcError as exc:
                if (old := older_node(exc, addr, method)) is not None:
                    raise old from None
                last = f"{addr}: {exc.code().name}"
            else:
                code = code_of(resp)
                if code not in _RETRY:
                    return resp
                last = f"{addr}: {ErrorCode.Name(code)}"
        if time.monotonic() >= deadline:
            raise CoordinatorNotAvailableError(
                f"no coordinator answered for group {group!r} ({last})"
            )
        time.sleep(0.2)


def describe_group(
    client: ClusterClient,
    group: str,
    *,
    include_offsets: bool,
    timeout_s: float,
    retry_s: float,
) -> coordinator_pb2.DescribedGroup:
    """The coordinator's DescribedGroup of ``group``, its error code unchecked (the CLI prints
    it as JSON; ``Admin.describe_groups`` turns it into a :class:`GroupDescription`)."""
    req = coordinator_pb2.DescribeGroupsRequest(group_ids=[group], include_offsets=include_offsets)
    resp = group_call(
        client,
        group,
        "DescribeGroups",
        req,
        lambda r: r.groups[0].error_code,
        timeout_s=timeout_s,
        retry_s=retry_s,
    )
    return resp.groups[0]


def list_groups(
    client: ClusterClient, states: list[int], *, timeout_s: float
) -> list[GroupListing]:
    """Every group (in ``states``; empty = any) from every shard's owner, sorted by id. One
    pass, no retries, so that a listing during a coordinator failover says at once what it
    lacks: GroupListingIncompleteError, holding what was found, when some shard is missing
    from the answers (no owner right now, or its owner did not answer)."""
    # Every shard's owner from FindCoordinator, not DescribeCluster: that needs DESCRIBE on
    # the cluster, and listing only DESCRIBE on the groups listed.
    owners = client.coordinator_shards()
    addresses = sorted({a for a in owners.values() if a is not None})
    found: dict[str, GroupListing] = {}
    answered: set[int] = set()
    req = coordinator_pb2.ListGroupsRequest(states_filter=states)  # type: ignore[arg-type]
    for addr in addresses:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(addr))
        try:
            resp = stub.ListGroups(req, timeout=timeout_s)
        except grpc.RpcError:
            continue
        answered.update(resp.shards)
        for g in resp.groups:
            state = group_state(g.state)
            found[g.group_id] = GroupListing(g.group_id, state, g.member_count, g.shard)
    groups = [found[g] for g in sorted(found)]
    missing = sorted(set(owners) - answered)
    if missing or not addresses:
        shards = f" (shards {missing})" if missing else ""
        raise GroupListingIncompleteError(
            f"incomplete: some coordinator shards are not available{shards}", groups, missing
        )
    return groups


def non_empty_error(group: str, members: int | None = None) -> StromError:
    """The refusal of an offset change on a group with members (Kafka refuses it too: the
    members would overwrite the new offsets with their next commit)."""
    count = f"{members} active members" if members is not None else "active members"
    return NonEmptyGroupError(
        f"group {group!r} has {count}: stop them first (offsets can only be changed while "
        "the group is empty)"
    )
