"""The committed offsets of one consumer group: commits, transactional commits, fetch checks.

:class:`GroupOffsets` is mixed into :class:`strom.coordinator.group.ConsumerGroup`: the
validation of OffsetCommit/OffsetFetch against the member epochs, plain and transactional
commits (offsets pending until their transaction ends), and the deletion of offsets (by
request, or because their topic is gone). It is separate from the membership protocol, which
it only reads (members and their epochs, subscriptions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from strom.coordinator.group_types import GroupFields, OffsetsResult, TopicPartition
from strom.coordinator.offsets_log import (
    GroupRecord,
    OffsetAndMetadata,
    PendingTxnOffsets,
    offset_commit_record,
    offset_commit_tombstone,
    pending_txn_offsets_record,
)
from strom.errors import (
    ErrorCode,
    FencedMemberEpochError,
    NonEmptyGroupError,
    ProducerFencedError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)


def _stale_offset(om: OffsetAndMetadata, live_topic_id: str | None) -> bool:
    """Whether a committed offset outlived its topic: no topic of that name is live, or the
    live one has another id (deleted and created again)."""
    if live_topic_id is None:
        return True
    return om.topic_id != "" and live_topic_id != "" and om.topic_id != live_topic_id


class GroupOffsets(GroupFields):
    """A group's committed offsets and the offsets its open transactions hold pending.

    A mixin rather than an object of its own: commits are checked against the group's own
    members and epochs, and write records the group's metadata record must precede. Its fields
    are the group's (:class:`~strom.coordinator.group_types.GroupFields`).
    """

    if TYPE_CHECKING:  # the ConsumerGroup's

        def all_subscribed_topics(self) -> frozenset[str]: ...

        def _metadata_record(self) -> GroupRecord: ...

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

        The epoch it ended with stays, as a pending entry without offsets, so a late
        commit of an older epoch (a producer paused past its timeout) is refused instead of
        staying pending for good (read_committed members would get UNSTABLE_OFFSET_COMMIT)."""
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
