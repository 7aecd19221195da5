"""A consumer group as its ``__consumer_offsets`` records describe it, and back.

:class:`GroupPersistence` is mixed into :class:`strom.coordinator.group.ConsumerGroup`:
:meth:`~GroupPersistence.snapshot` gives the group as a replay of its records must rebuild it,
and :meth:`~GroupPersistence.from_snapshot` rebuilds it (a shard takeover, or a failed write).
It is separate because it is the one place that must know every field the records carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from strom.coordinator.group_types import (
    GroupConfig,
    GroupFields,
    Member,
    MemberState,
    _new_member_id,
    _thaw,
)
from strom.coordinator.offsets_log import GroupMetadata, GroupSnapshot, MemberAssignment

if TYPE_CHECKING:
    from strom.coordinator.group import ConsumerGroup


class GroupPersistence(GroupFields):
    """The group's snapshot and its rebuild from one.

    A mixin rather than an object of its own: both read and set the group's own fields
    (:class:`~strom.coordinator.group_types.GroupFields`).
    """

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
