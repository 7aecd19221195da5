"""Epochs, target assignment and reconciliation of one consumer group (KIP-848).

:class:`GroupReconciliation` is mixed into :class:`strom.coordinator.group.ConsumerGroup`: it
decides when the group epoch goes up, runs the assignor for the target assignment, and moves
each member towards its target one step at a time (revoke first, then take what is free).
It is separate from the heartbeat handling that calls it so the rules of incremental
reconciliation can be read on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from strom.coordinator.assignors import MemberSpec, get_assignor
from strom.coordinator.group_types import GroupFields, Member, MemberState, _intersects
from strom.coordinator.offsets_log import (
    GroupMetadata,
    GroupRecord,
    current_assignment_tombstone,
    group_metadata_record,
    member_metadata_tombstone,
    target_assignment_member_record,
    target_assignment_member_tombstone,
    target_assignment_metadata_record,
)


class GroupReconciliation(GroupFields):
    """The group epoch, the target assignment and each member's steps towards it.

    A mixin rather than an object of its own: it changes the group's own fields (epochs,
    target, members' assignments, the owner of each partition), which the heartbeat and the
    offsets then read as they are. Its fields are the group's
    (:class:`~strom.coordinator.group_types.GroupFields`).
    """

    if TYPE_CHECKING:  # the ConsumerGroup's

        def _known_topics(self) -> Mapping[str, int]: ...

        def subscribed_topics(self, member: Member) -> frozenset[str]: ...

        def all_subscribed_topics(self) -> frozenset[str]: ...

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
