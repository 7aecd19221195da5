"""How a coordinator shard's state is stored in ``__consumer_offsets`` (DESIGN §2, §7): pure.

A shard is partition ``s`` of the compacted internal topic ``__consumer_offsets``. Its owner
keeps the shard's groups in memory and writes every change as records to that partition
*before* acknowledging it; a coordinator that takes the shard over replays the partition from
its start and gets the same state back. Because the topic is compacted, only the latest record
per key survives in the long run, so the format is "one key per piece of state, the value is
that piece's latest version, a null value deletes it" -- exactly what replay with
latest-wins over (key, value) pairs rebuilds.

Record format (the contract is in protos/strom/v1/coordinator.proto, "Records in
__consumer_offsets"; this module is its only codec):

* **Key**: ``GroupRecordKey`` serialized deterministically. Its oneof field number is the
  record type tag (1 offset commit, 2 group metadata, 3 member metadata, 4 target assignment
  metadata, 5 target assignment of one member, 6 current assignment of one member), so keys
  of different kinds never collide, and each kind's key holds only scalar fields, so equal keys
  are equal bytes (what compaction compares).
* **Value**: the value message of the key's kind, serialized (protobuf, so fields can be added
  compatibly: the format is versioned by protobuf's own evolution rules); ``None`` is a
  tombstone.
* A key whose kind this version does not know (a newer coordinator wrote it) is skipped on
  replay, never an error, so a rolling downgrade still loads the shard.

The records of one coordinator operation go into one record batch (:func:`encode_group_batch`)
so they are appended all or nothing, written by the owner's idempotent producer; the producer
id and the highest producer epoch seen while replaying (:class:`ShardState`) are what a new
owner needs to fence the previous one.

The dataclasses here (:class:`GroupSnapshot` and its parts) are plain data with no behaviour:
:mod:`strom.coordinator.group` builds its live :class:`~strom.coordinator.group.ConsumerGroup`
from a snapshot and emits these records for every change, so this module does not depend on
the group logic.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from strom.api import common_pb2, coordinator_pb2
from strom.clock import wall_ms
from strom.coordinator.assignors import Assignment
from strom.coordinator.replay import ReplayState
from strom.record import encode_batch

#: Name of the internal compacted topic holding the shards.
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"


def shard_for_group(group_id: str, num_shards: int) -> int:
    """The shard (partition of ``__consumer_offsets``) holding a group (coordinator.proto):
    ``murmur2(utf8(group_id)) & 0x7fffffff mod num_shards``, Kafka's key hash, so every
    client and coordinator agrees without asking anyone."""
    if num_shards <= 0:
        raise ValueError(f"num_shards must be positive, got {num_shards}")
    # Imported here so that this pure module does not load the client package at import time.
    from strom.client.partitioner import murmur2

    return (murmur2(group_id.encode()) & 0x7FFFFFFF) % num_shards


class RecordKind(enum.IntEnum):
    """The record type tag: the ``GroupRecordKey`` oneof field number."""

    OFFSET_COMMIT = 1
    GROUP_METADATA = 2
    MEMBER_METADATA = 3
    TARGET_ASSIGNMENT_METADATA = 4
    TARGET_ASSIGNMENT_MEMBER = 5
    CURRENT_MEMBER_ASSIGNMENT = 6
    PENDING_TXN_OFFSETS = 7


_ONEOF = {
    RecordKind.OFFSET_COMMIT: "offset_commit",
    RecordKind.GROUP_METADATA: "group_metadata",
    RecordKind.MEMBER_METADATA: "member_metadata",
    RecordKind.TARGET_ASSIGNMENT_METADATA: "target_assignment_metadata",
    RecordKind.TARGET_ASSIGNMENT_MEMBER: "target_assignment_member",
    RecordKind.CURRENT_MEMBER_ASSIGNMENT: "current_member_assignment",
    RecordKind.PENDING_TXN_OFFSETS: "pending_txn_offsets",
}
_KIND_OF_ONEOF = {name: kind for kind, name in _ONEOF.items()}


class GroupRecord(NamedTuple):
    """One record to append to (or replayed from) a shard: key bytes, value bytes or None."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True)
class RecordKey:
    """A decoded key. Fields that the kind does not have keep their defaults."""

    kind: RecordKind
    group_id: str
    member_id: str = ""
    topic: str = ""
    partition: int = -1
    producer_id: int = -1


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset (OffsetCommitValue).

    Attributes:
        offset: the next offset to consume.
        leader_epoch: leader epoch of the last consumed record; -1 = unknown.
        metadata: the client's free-form string.
        commit_timestamp_ms: coordinator time of the commit; -1 = unknown.
        topic_id: the topic's id when committed; "" = unknown.
        committer_id: the client instance that committed it; "" = unordered (admin).
        commit_sequence: that committer's request number; 0 = unordered. A later commit of
            the same committer with a lower number is older and must not overwrite this one.
    """

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    topic_id: str = ""
    committer_id: str = ""
    commit_sequence: int = 0

    def supersedes(self, committer_id: str, commit_sequence: int) -> bool:
        """True when this offset came from a newer commit of ``committer_id`` than the one
        numbered ``commit_sequence`` (so that one arrived late and must not overwrite it)."""
        return (
            commit_sequence > 0
            and committer_id != ""
            and self.committer_id == committer_id
            and self.commit_sequence > commit_sequence
        )


@dataclass(frozen=True)
class GroupMetadata:
    """A group's epoch and what it was computed from (GroupMetadataValue)."""

    group_epoch: int = 0
    subscribed_topic_partitions: Mapping[str, int] = field(default_factory=dict)
    assignor_name: str = ""
    created_ms: int = -1


@dataclass(frozen=True)
class MemberMetadata:
    """One member's identity and subscription, as its heartbeats declared (MemberMetadataValue)."""

    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    rebalance_timeout_ms: int = 0


@dataclass(frozen=True)
class MemberAssignment:
    """One member's reconciliation progress (CurrentMemberAssignmentValue).

    Attributes:
        member_epoch: the member's epoch (-2 while a static member is away).
        previous_member_epoch: its epoch before the last bump (a heartbeat carrying it is
            still accepted when the member just lost the response with the new one).
        state: a ``MemberState`` value (coordinator.proto).
        assigned: partitions the member may own now.
        pending_revocation: partitions it must still give up; nobody else gets them before.
    """

    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: int = coordinator_pb2.MEMBER_STATE_STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)


@dataclass
class GroupSnapshot:
    """Everything the records of one group say, after replay: enough to rebuild the group.

    ``metadata`` is None when the group's GroupMetadata record has not been seen (a group
    known only through offsets); ``assignment_epoch`` is 0 before any TargetAssignmentMetadata.
    Members may be missing from ``targets``/``current`` (not computed or reconciled yet).
    """

    group_id: str
    metadata: GroupMetadata | None = None
    assignment_epoch: int = 0
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    targets: dict[str, Assignment] = field(default_factory=dict)
    current: dict[str, MemberAssignment] = field(default_factory=dict)
    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    #: Offsets of open transactions: producer id -> :class:`PendingTxnOffsets`.
    pending: dict[int, PendingTxnOffsets] = field(default_factory=dict)

    def is_blank(self) -> bool:
        """True when no record of the group is left (so the group does not exist)."""
        return (
            self.metadata is None
            and not self.members
            and not self.targets
            and not self.current
            and not self.offsets
            # (an ended transaction's epoch, kept to refuse its late offsets, is not enough)
            and not any(p.offsets for p in self.pending.values())
            and self.assignment_epoch == 0
        )


@dataclass(frozen=True)
class PendingTxnOffsets:
    """Offsets a transaction committed (TxnOffsetCommit), waiting for its end."""

    producer_epoch: int
    offsets: Mapping[tuple[str, int], OffsetAndMetadata]


# ---------------------------------------------------------------------------------------------
# Encoding


def _key(kind: RecordKind, **fields: Any) -> bytes:
    msg = coordinator_pb2.GroupRecordKey()
    getattr(msg, _ONEOF[kind]).SetInParent()
    sub = getattr(msg, _ONEOF[kind])
    for name, value in fields.items():
        setattr(sub, name, value)
    return msg.SerializeToString(deterministic=True)


def _topic_partitions(assignment: Mapping[str, Iterable[int]]) -> list[common_pb2.TopicPartitions]:
    return [
        common_pb2.TopicPartitions(topic=t, partitions=sorted(ps))
        for t, ps in sorted(assignment.items())
        if ps
    ]


def _assignment(tps: Iterable[common_pb2.TopicPartitions]) -> Assignment:
    out: Assignment = {}
    for tp in tps:
        if tp.partitions:
            out.setdefault(tp.topic, []).extend(tp.partitions)
    return {t: sorted(set(ps)) for t, ps in sorted(out.items())}


def offset_commit_key(group_id: str, topic: str, partition: int) -> bytes:
    """Key of a committed offset."""
    return _key(RecordKind.OFFSET_COMMIT, group_id=group_id, topic=topic, partition=partition)


def offset_commit_record(
    group_id: str, topic: str, partition: int, offset: OffsetAndMetadata
) -> GroupRecord:
    """The record storing one committed offset."""
    value = coordinator_pb2.OffsetCommitValue(
        committed_offset=offset.offset,
        committed_leader_epoch=offset.leader_epoch,
        metadata=offset.metadata,
        commit_timestamp_ms=offset.commit_timestamp_ms,
        topic_id=offset.topic_id,
        committer_id=offset.committer_id,
        commit_sequence=offset.commit_sequence,
    )
    return GroupRecord(offset_commit_key(group_id, topic, partition), value.SerializeToString())


def offset_commit_tombstone(group_id: str, topic: str, partition: int) -> GroupRecord:
    """The tombstone deleting one committed offset."""
    return GroupRecord(offset_commit_key(group_id, topic, partition), None)


def group_metadata_key(group_id: str) -> bytes:
    """Key of a group's metadata."""
    return _key(RecordKind.GROUP_METADATA, group_id=group_id)


def group_metadata_record(group_id: str, metadata: GroupMetadata) -> GroupRecord:
    """The record storing a group's epoch, subscription metadata and assignor."""
    value = coordinator_pb2.GroupMetadataValue(
        group_epoch=metadata.group_epoch,
        subscribed_topic_partitions=dict(metadata.subscribed_topic_partitions),
        assignor_name=metadata.assignor_name,
        created_ms=metadata.created_ms,
    )
    return GroupRecord(group_metadata_key(group_id), value.SerializeToString(deterministic=True))


def group_metadata_tombstone(group_id: str) -> GroupRecord:
    """The tombstone deleting a group (written last when a group is deleted)."""
    return GroupRecord(group_metadata_key(group_id), None)


def member_metadata_key(group_id: str, member_id: str) -> bytes:
    """Key of one member's metadata."""
    return _key(RecordKind.MEMBER_METADATA, group_id=group_id, member_id=member_id)


def member_metadata_record(group_id: str, member_id: str, member: MemberMetadata) -> GroupRecord:
    """The record storing one member's identity and subscription."""
    value = coordinator_pb2.MemberMetadataValue(
        client_id=member.client_id,
        client_host=member.client_host,
        subscribed_topic_names=list(member.subscribed_topic_names),
        rebalance_timeout_ms=member.rebalance_timeout_ms,
    )
    if member.instance_id is not None:
        value.instance_id = member.instance_id
    if member.rack_id is not None:
        value.rack_id = member.rack_id
    if member.subscribed_topic_regex is not None:
        value.subscribed_topic_regex = member.subscribed_topic_regex
    if member.server_assignor is not None:
        value.server_assignor = member.server_assignor
    return GroupRecord(member_metadata_key(group_id, member_id), value.SerializeToString())


def member_metadata_tombstone(group_id: str, member_id: str) -> GroupRecord:
    """The tombstone removing a member."""
    return GroupRecord(member_metadata_key(group_id, member_id), None)


def target_assignment_metadata_key(group_id: str) -> bytes:
    """Key of a group's target assignment epoch."""
    return _key(RecordKind.TARGET_ASSIGNMENT_METADATA, group_id=group_id)


def target_assignment_metadata_record(group_id: str, assignment_epoch: int) -> GroupRecord:
    """The record storing the group epoch the target assignment was computed at."""
    value = coordinator_pb2.TargetAssignmentMetadataValue(assignment_epoch=assignment_epoch)
    return GroupRecord(target_assignment_metadata_key(group_id), value.SerializeToString())


def target_assignment_metadata_tombstone(group_id: str) -> GroupRecord:
    """The tombstone deleting a group's target assignment epoch."""
    return GroupRecord(target_assignment_metadata_key(group_id), None)


def target_assignment_member_key(group_id: str, member_id: str) -> bytes:
    """Key of one member's target assignment."""
    return _key(RecordKind.TARGET_ASSIGNMENT_MEMBER, group_id=group_id, member_id=member_id)


def target_assignment_member_record(
    group_id: str, member_id: str, assignment: Mapping[str, Iterable[int]]
) -> GroupRecord:
    """The record storing one member's target assignment."""
    value = coordinator_pb2.TargetAssignmentMemberValue(
        topic_partitions=_topic_partitions(assignment)
    )
    return GroupRecord(target_assignment_member_key(group_id, member_id), value.SerializeToString())


def target_assignment_member_tombstone(group_id: str, member_id: str) -> GroupRecord:
    """The tombstone deleting one member's target assignment."""
    return GroupRecord(target_assignment_member_key(group_id, member_id), None)


def current_assignment_key(group_id: str, member_id: str) -> bytes:
    """Key of one member's current assignment."""
    return _key(RecordKind.CURRENT_MEMBER_ASSIGNMENT, group_id=group_id, member_id=member_id)


def current_assignment_record(
    group_id: str, member_id: str, assignment: MemberAssignment
) -> GroupRecord:
    """The record storing one member's epoch, state, and assigned/pending partitions."""
    value = coordinator_pb2.CurrentMemberAssignmentValue(
        member_epoch=assignment.member_epoch,
        previous_member_epoch=assignment.previous_member_epoch,
        state=assignment.state,
        assigned_partitions=_topic_partitions(assignment.assigned),
        partitions_pending_revocation=_topic_partitions(assignment.pending_revocation),
    )
    return GroupRecord(current_assignment_key(group_id, member_id), value.SerializeToString())


def current_assignment_tombstone(group_id: str, member_id: str) -> GroupRecord:
    """The tombstone deleting one member's current assignment."""
    return GroupRecord(current_assignment_key(group_id, member_id), None)


def pending_txn_offsets_key(group_id: str, producer_id: int) -> bytes:
    """Key of a transaction's pending offsets in a group."""
    return _key(RecordKind.PENDING_TXN_OFFSETS, group_id=group_id, producer_id=producer_id)


def pending_txn_offsets_record(
    group_id: str, producer_id: int, pending: PendingTxnOffsets
) -> GroupRecord:
    """The record holding a transaction's pending offsets (all of them, latest per partition)."""
    value = coordinator_pb2.PendingTxnOffsetsValue(producer_epoch=pending.producer_epoch)
    for (t, p), om in sorted(pending.offsets.items()):
        value.offsets.add(
            topic=t,
            partition=p,
            committed_offset=om.offset,
            committed_leader_epoch=om.leader_epoch,
            metadata=om.metadata,
        )
    return GroupRecord(pending_txn_offsets_key(group_id, producer_id), value.SerializeToString())


def pending_txn_offsets_tombstone(group_id: str, producer_id: int) -> GroupRecord:
    """The tombstone ending a transaction's pending offsets (applied or dropped)."""
    return GroupRecord(pending_txn_offsets_key(group_id, producer_id), None)


def decode_pending_txn_offsets(value: bytes) -> PendingTxnOffsets:
    """Decode a PendingTxnOffsetsValue."""
    v = coordinator_pb2.PendingTxnOffsetsValue.FromString(value)
    return PendingTxnOffsets(
        v.producer_epoch,
        {
            (o.topic, o.partition): OffsetAndMetadata(
                o.committed_offset, o.committed_leader_epoch, o.metadata
            )
            for o in v.offsets
        },
    )


# ---------------------------------------------------------------------------------------------
# Decoding


def decode_key(key: bytes) -> RecordKey | None:
    """Decode a record key; None when its kind is unknown to this version (skip the record).

    Raises:
        google.protobuf.message.DecodeError: the bytes are not a GroupRecordKey.
    """
    msg = coordinator_pb2.GroupRecordKey.FromString(key)
    which = msg.WhichOneof("kind")
    if which is None:
        return None
    kind = _KIND_OF_ONEOF[which]
    sub = getattr(msg, which)
    if kind is RecordKind.OFFSET_COMMIT:
        return RecordKey(kind, sub.group_id, topic=sub.topic, partition=sub.partition)
    if kind in (RecordKind.GROUP_METADATA, RecordKind.TARGET_ASSIGNMENT_METADATA):
        return RecordKey(kind, sub.group_id)
    if kind is RecordKind.PENDING_TXN_OFFSETS:
        return RecordKey(kind, sub.group_id, producer_id=sub.producer_id)
    return RecordKey(kind, sub.group_id, member_id=sub.member_id)


def decode_offset(value: bytes) -> OffsetAndMetadata:
    """Decode an OffsetCommitValue."""
    v = coordinator_pb2.OffsetCommitValue.FromString(value)
    return OffsetAndMetadata(
        offset=v.committed_offset,
        leader_epoch=v.committed_leader_epoch,
        metadata=v.metadata,
        commit_timestamp_ms=v.commit_timestamp_ms,
        topic_id=v.topic_id,
        committer_id=v.committer_id,
        commit_sequence=v.commit_sequence,
    )


def decode_group_metadata(value: bytes) -> GroupMetadata:
    """Decode a GroupMetadataValue."""
    v = coordinator_pb2.GroupMetadataValue.FromString(value)
    return GroupMetadata(
        group_epoch=v.group_epoch,
        subscribed_topic_partitions=dict(sorted(v.subscribed_topic_partitions.items())),
        assignor_name=v.assignor_name,
        created_ms=v.created_ms,
    )


def decode_member_metadata(value: bytes) -> MemberMetadata:
    """Decode a MemberMetadataValue."""
    v = coordinator_pb2.MemberMetadataValue.FromString(value)
    return MemberMetadata(
        instance_id=v.instance_id if v.HasField("instance_id") else None,
        rack_id=v.rack_id if v.HasField("rack_id") else None,
        client_id=v.client_id,
        client_host=v.client_host,
        subscribed_topic_names=tuple(v.subscribed_topic_names),
        subscribed_topic_regex=(
            v.subscribed_topic_regex if v.HasField("subscribed_topic_regex") else None
        ),
        server_assignor=v.server_assignor if v.HasField("server_assignor") else None,
        rebalance_timeout_ms=v.rebalance_timeout_ms,
    )


def decode_assignment_epoch(value: bytes) -> int:
    """Decode a TargetAssignmentMetadataValue to its assignment epoch."""
    return coordinator_pb2.TargetAssignmentMetadataValue.FromString(value).assignment_epoch


def decode_target_assignment(value: bytes) -> Assignment:
    """Decode a TargetAssignmentMemberValue."""
    v = coordinator_pb2.TargetAssignmentMemberValue.FromString(value)
    return _assignment(v.topic_partitions)


def decode_current_assignment(value: bytes) -> MemberAssignment:
    """Decode a CurrentMemberAssignmentValue."""
    v = coordinator_pb2.CurrentMemberAssignmentValue.FromString(value)
    return MemberAssignment(
        member_epoch=v.member_epoch,
        previous_member_epoch=v.previous_member_epoch,
        state=v.state,
        assigned=_assignment(v.assigned_partitions),
        pending_revocation=_assignment(v.partitions_pending_revocation),
    )


# ---------------------------------------------------------------------------------------------
# Batches and replay


def encode_group_batch(
    records: Sequence[GroupRecord | tuple[bytes, bytes | None]],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    now_ms: int | None = None,
    compression: str = "none",
) -> bytes:
    """One record batch holding ``records`` (one coordinator operation, all or nothing).

    The producer fields are the shard owner's idempotent producer (its epoch fences a deposed
    owner); the batch timestamp is ``now_ms`` (default: the coordinator's wall clock,
    :func:`strom.clock.wall_ms`, which the clock-step tests offset). The storage nodes do not
    check these timestamps against their own clock (``strom.storage.servicer._append_jobs``).
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    return encode_batch(
        [r[1] for r in records],
        keys=[r[0] for r in records],
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        now_ms=wall_ms() if now_ms is None else now_ms,
    )


#: Each record kind's value decoder.
_VALUE_DECODERS: dict[RecordKind, Callable[[bytes], Any]] = {
    RecordKind.OFFSET_COMMIT: decode_offset,
    RecordKind.GROUP_METADATA: decode_group_metadata,
    RecordKind.MEMBER_METADATA: decode_member_metadata,
    RecordKind.TARGET_ASSIGNMENT_METADATA: decode_assignment_epoch,
    RecordKind.TARGET_ASSIGNMENT_MEMBER: decode_target_assignment,
    RecordKind.PENDING_TXN_OFFSETS: decode_pending_txn_offsets,
    RecordKind.CURRENT_MEMBER_ASSIGNMENT: decode_current_assignment,
}


class ShardState(ReplayState):
    """A shard's groups and offsets rebuilt from its records, latest record per key wins.

    Feed it the partition from its start, in offset order, with :meth:`apply_batches` (raw
    batches as fetched) or :meth:`apply` / :meth:`apply_records` (decoded pairs). The service
    also keeps one up to date with the records it has durably written, as the "last known
    durable" state to rebuild a group from when a write fails. Producer and offset tracking:
    see :class:`~strom.coordinator.replay.ReplayState`.

    Attributes:
        groups: group id -> :class:`GroupSnapshot`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, GroupSnapshot] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Apply one record (``value`` None = tombstone)."""
        decoded = decode_key(key) if key else None
        if decoded is None:
            self.skipped += 1
            return
        gid = decoded.group_id
        snap = self.groups.get(gid)
        if value is None:
            if snap is None:
                return
            self._delete(snap, decoded)
            if snap.is_blank() or decoded.kind is RecordKind.GROUP_METADATA:
                del self.groups[gid]
            return
        kind = decoded.kind
        # Decoded before the group is touched: a value that does not decode raises with the
        # state as it was (ReplayState.apply_batches skips the record).
        v: Any = _VALUE_DECODERS[kind](value)
        if snap is None:
            snap = self.groups[gid] = GroupSnapshot(gid)
        if kind is RecordKind.OFFSET_COMMIT:
            snap.offsets[(decoded.topic, decoded.partition)] = v
        elif kind is RecordKind.GROUP_METADATA:
            snap.metadata = v
        elif kind is RecordKind.MEMBER_METADATA:
            snap.members[decoded.member_id] = v
        elif kind is RecordKind.TARGET_ASSIGNMENT_METADATA:
            snap.assignment_epoch = v
        elif kind is RecordKind.TARGET_ASSIGNMENT_MEMBER:
            snap.targets[decoded.member_id] = v
        elif kind is RecordKind.PENDING_TXN_OFFSETS:
            snap.pending[decoded.producer_id] = v
        else:
            snap.current[decoded.member_id] = v

    @staticmethod
    def _delete(snap: GroupSnapshot, key: RecordKey) -> None:
        kind = key.kind
        if kind is RecordKind.OFFSET_COMMIT:
            snap.offsets.pop((key.topic, key.partition), None)
        elif kind is RecordKind.GROUP_METADATA:
            snap.metadata = None
        elif kind is RecordKind.MEMBER_METADATA:
            snap.members.pop(key.member_id, None)
        elif kind is RecordKind.TARGET_ASSIGNMENT_METADATA:
            snap.assignment_epoch = 0
        elif kind is RecordKind.TARGET_ASSIGNMENT_MEMBER:
            snap.targets.pop(key.member_id, None)
        elif kind is RecordKind.PENDING_TXN_OFFSETS:
            snap.pending.pop(key.producer_id, None)
        else:
            snap.current.pop(key.member_id, None)

    def offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        """The committed offsets of a group (empty for an unknown group)."""
        snap = self.groups.get(group_id)
        return dict(snap.offsets) if snap else {}
