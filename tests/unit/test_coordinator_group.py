"""The KIP-848 group state machine (strom.coordinator.group), driven by simulated consumers.

Every operation's records go through a real record batch into a ShardState, and after every
step the replayed state must equal the live group's: so these tests also prove that every
change is persisted (what a coordinator taking the shard over would see).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping

import pytest

from strom.coordinator.group import (
    ConsumerGroup,
    GroupConfig,
    GroupState,
    HostNode,
    MemberState,
)
from strom.coordinator.offsets_log import (
    GroupRecord,
    GroupSnapshot,
    OffsetAndMetadata,
    ShardState,
    encode_group_batch,
)
from strom.errors import (
    ErrorCode,
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupMaxSizeReachedError,
    InvalidRegularExpressionError,
    InvalidRequestError,
    NonEmptyGroupError,
    ProducerFencedError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)

SESSION = 10_000
CONFIG = GroupConfig(session_timeout_ms=SESSION, heartbeat_interval_ms=1_000)


class Harness:
    """A group plus the shard that persists it; checks replay == live after every step."""

    def __init__(self, topics: Mapping[str, int], config: GroupConfig = CONFIG) -> None:
        ids = (f"m{i}" for i in itertools.count(1))
        self.group = ConsumerGroup(
            "g", config=config, now_ms=0, member_id_factory=lambda: next(ids)
        )
        self.topics = dict(topics)
        self.shard = ShardState()
        self.log: list[bytes] = []
        self.now = 0

    def persist(self, records: list[GroupRecord]) -> None:
        if records:
            batch = encode_group_batch(records, now_ms=self.now)
            self.log.append(batch)
            self.shard.apply_batches(batch)
        self.check_ownership()
        if self.group.state is GroupState.DEAD:
            assert "g" not in self.shard.groups
        else:
            assert self.shard.groups.get("g", GroupSnapshot("g")) == self.group.snapshot()

    def check_ownership(self) -> None:
        """Coordinator side: each partition is held (assigned or pending revocation) by at
        most one member, and the group's owner index agrees with the members."""
        g = self.group
        for mid, m in g.members.items():
            for parts in (m.assigned, m.pending_revocation):
                for t, ps in parts.items():
                    for p in ps:
                        assert g.owner_of(t, p) == mid
            for t, ps in m.assigned.items():
                assert not ps & m.pending_revocation.get(t, set())
        for t, n in self.topics.items():
            for p in range(n + 2):
                owner = g.owner_of(t, p)
                if owner is not None:
                    m = g.members[owner]
                    assert p in m.assigned.get(t, set()) | m.pending_revocation.get(t, set())

    def tick(self, ms: int = 100) -> None:
        self.now += ms

    def expire(self) -> list[str]:
        result = self.group.expire(self.now)
        self.persist(result.records)
        return [e.member_id for e in result.expired]

    def rebuild(self) -> None:
        """Simulate a coordinator takeover: a new owner replays the shard's log."""
        shard = ShardState()
        for batch in self.log:
            shard.apply_batches(batch)
        self.group = ConsumerGroup.from_snapshot(
            shard.groups["g"], now_ms=self.now, config=self.group.config
        )
        assert self.group.snapshot() == self.shard.groups["g"]


class Consumer:
    """A well-behaved consumer: owns exactly what the last assignment said."""

    def __init__(
        self,
        h: Harness,
        *,
        topics: Iterable[str] = ("t",),
        regex: str | None = None,
        instance_id: str | None = None,
        member_id: str = "",
        assignor: str | None = None,
    ) -> None:
        self.h = h
        self.names = [] if regex is not None else list(topics)
        self.regex = regex
        self.instance_id = instance_id
        self.member_id = member_id
        self.assignor = assignor
        #: What its heartbeats send as rebalance_timeout_ms (the consumer's
        #: max_poll_interval_ms).
        self.rebalance_timeout_ms = 5_000
        self.epoch = 0
        self.owned: dict[str, set[int]] = {}
        #: The topics the member's principal may describe (None: ACLs off).
        self.may_describe: Callable[[str], bool] | None = None
        #: The storage node running the member (a RecordService stream), as its heartbeats
        #: name it with the session the coordinator matched (None: an ordinary consumer).
        self.host: HostNode | None = None

    def heartbeat(self, epoch: int | None = None, owned: Mapping[str, set[int]] | None = None):
        h = self.h
        r = h.group.heartbeat(
            member_id=self.member_id,
            member_epoch=self.epoch if epoch is None else epoch,
            now_ms=h.now,
            topics=h.topics,
            instance_id=self.instance_id,
            subscribed_topic_names=self.names,
            subscribed_topic_regex=self.regex,
            server_assignor=self.assignor,
            owned_partitions=self.owned if owned is None else owned,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            topic_filter=self.may_describe,
            host_node=self.host,
        )
        h.persist(r.records)
        self.member_id = r.member_id
        self.epoch = r.member_epoch
        if r.assignment is not None:
            self.owned = {t: set(ps) for t, ps in r.assignment.items()}
        if r.member_epoch < 0:
            self.owned = {}
        return r

    def join(self):
        self.epoch = 0
        self.owned = {}
        return self.heartbeat()

    def count(self) -> int:
        return sum(len(ps) for ps in self.owned.values())


def assert_exclusive(consumers: Iterable[Consumer]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for c in consumers:
        for t, ps in c.owned.items():
            for p in ps:
                assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {c.member_id}"
                seen[(t, p)] = c.member_id


def converge(h: Harness, consumers: list[Consumer], rounds: int = 10) -> int:
    """Heartbeat round-robin until the group is stable; checks exclusivity at every step."""
    for i in range(rounds):
        if h.group.state is GroupState.STABLE and all(
            c.owned == {t: set(ps) for t, ps in h.group.members[c.member_id].assignment().items()}
            for c in consumers
        ):
            return i
        for c in consumers:
            h.tick()
            c.heartbeat()
            assert_exclusive(consumers)
    raise AssertionError(f"not stable after {rounds} rounds: {h.group.state}")


def test_three_members_converge_to_two_partitions_each_without_double_ownership() -> None:
    h = Harness({"t": 6})
    consumers = [Consumer(h) for _ in range(3)]
    for c in consumers:
        c.join()
        assert_exclusive(consumers)
    assert [c.member_id for c in consumers] == ["m1", "m2", "m3"]
    converge(h, consumers)
    assert sorted(c.count() for c in consumers) == [2, 2, 2]
    union = set().union(*(c.owned["t"] for c in consumers))
    assert union == set(range(6))
    g = h.group
    assert g.state is GroupState.STABLE
    assert g.group_epoch == g.assignment_epoch == 3
    assert all(c.epoch == 3 for c in consumers)
    # A steady heartbeat changes nothing and persists nothing.
    h.tick()
    r = consumers[0].heartbeat()
    assert r.assignment is None and r.records == [] and r.member_epoch == 3


def test_first_member_gets_everything_at_once() -> None:
    h = Harness({"t": 3})
    c = Consumer(h)
    r = c.join()
    assert r.member_id == "m1" and r.member_epoch == 1
    assert r.assignment == {"t": [0, 1, 2]}
    assert r.heartbeat_interval_ms == 1_000
    assert h.group.state is GroupState.STABLE


def test_reconciliation_steps_follow_kip_848() -> None:
    h = Harness({"t": 4})
    a, b = Consumer(h), Consumer(h)
    a.join()
    assert a.owned == {"t": {0, 1, 2, 3}}
    r = b.join()
    # b's target is held by a: b moves to the new epoch but gets nothing yet.
    assert r.member_epoch == 2 and r.assignment == {}
    assert h.group.members[b.member_id].state is MemberState.UNRELEASED_PARTITIONS
    assert h.group.state is GroupState.RECONCILING
    # a must revoke first; it keeps its epoch meanwhile.
    r = a.heartbeat()
    assert r.member_epoch == 1 and r.assignment is not None
    assert h.group.members[a.member_id].state is MemberState.UNREVOKED_PARTITIONS
    kept = a.owned["t"]
    assert len(kept) == 2
    # b asks again before a has revoked: still nothing.
    r = b.heartbeat()
    assert r.assignment is None and b.owned == {}
    # a reports the revocation: it moves to epoch 2, the partitions are released...
    r = a.heartbeat()
    assert r.member_epoch == 2
    assert h.group.members[a.member_id].state is MemberState.STABLE
    # ...and b picks them up on its next heartbeat.
    r = b.heartbeat()
    assert r.assignment == {"t": sorted({0, 1, 2, 3} - kept)}
    assert h.group.state is GroupState.STABLE


def test_partitions_a_member_has_not_installed_yet_are_not_freed_by_its_report() -> None:
    """A member's heartbeat reports what its application holds *now*; it may have been sent
    partitions it is about to install (its application thread reconciles between
    heartbeats). A report without them, made before it learnt they were revoked, must not
    free them: the other member would consume them while this one does (a transactional
    pipeline transformed records twice, chaos seed 202611211)."""
    h = Harness({"t": 4})
    a, b = Consumer(h), Consumer(h)
    a.join()
    assert a.owned == {"t": {0, 1, 2, 3}}  # sent; its application has not installed them
    b.join()
    # a's heartbeat, built before it installed anything: owns nothing yet.
    r = a.heartbeat(owned={})
    assert h.group.members[a.member_id].state is MemberState.UNREVOKED_PARTITIONS
    kept = set(r.assignment["t"]) if r.assignment is not None else set()
    moved = {0, 1, 2, 3} - kept
    # b gets nothing while a may still be installing them.
    r = b.heartbeat()
    assert not (b.owned.get("t", set()) & moved)
    # a's next heartbeat (after it learnt of the revocation) without them frees them...
    a.owned = {"t": kept}
    r = a.heartbeat()
    assert h.group.members[a.member_id].state is MemberState.STABLE
    # ...and b picks them up.
    b.heartbeat()
    assert b.owned == {"t": moved}
    assert_exclusive([a, b])


def test_fourth_and_fifth_member_on_four_partitions_one_stays_idle() -> None:
    h = Harness({"t": 4})
    consumers = [Consumer(h) for _ in range(3)]
    for c in consumers:
        c.join()
    converge(h, consumers)
    assert sorted(c.count() for c in consumers) == [1, 1, 2]
    before = {c.member_id: set(c.owned.get("t", ())) for c in consumers}
    for _ in range(2):
        consumers.append(Consumer(h))
        consumers[-1].join()
        assert_exclusive(consumers)
    converge(h, consumers)
    assert sorted(c.count() for c in consumers) == [0, 1, 1, 1, 1]
    # Sticky: the three old members kept one partition each from before.
    for c in consumers[:3]:
        assert c.owned.get("t", set()) <= before[c.member_id]


def test_graceful_leave_gives_partitions_to_the_others_on_their_next_heartbeat() -> None:
    h = Harness({"t": 6})
    consumers = [Consumer(h) for _ in range(3)]
    for c in consumers:
        c.join()
    converge(h, consumers)
    epoch = h.group.group_epoch
    leaver = consumers.pop(1)
    r = leaver.heartbeat(epoch=-1)
    assert r.member_epoch == -1 and r.assignment is None
    assert leaver.member_id not in h.group.members
    assert h.group.group_epoch == epoch + 1
    assert h.group.state is GroupState.ASSIGNING  # recomputed lazily, on the next heartbeat
    for c in consumers:
        h.tick()
        c.heartbeat()
        assert_exclusive(consumers)
    assert set().union(*(c.owned["t"] for c in consumers)) == set(range(6))
    assert h.group.state is GroupState.STABLE
    # The leaver is gone for good.
    with pytest.raises(UnknownMemberIdError):
        leaver.heartbeat(epoch=epoch)
    # The last members leave: the group is empty.
    for c in consumers:
        c.heartbeat(epoch=-1)
    assert h.group.state is GroupState.EMPTY


def test_session_expiry_removes_silent_member() -> None:
    h = Harness({"t": 4})
    a, b = Consumer(h), Consumer(h)
    a.join()
    b.join()
    converge(h, [a, b])
    last_b = h.now
    # Only a keeps heartbeating.
    while h.now + 1_000 < last_b + SESSION:
        h.tick(1_000)
        a.heartbeat()
        assert h.expire() == []
    assert h.group.next_deadline_ms() == last_b + SESSION
    h.now = last_b + SESSION
    assert h.expire() == [b.member_id]
    h.tick()
    a.heartbeat()
    assert a.owned == {"t": {0, 1, 2, 3}}
    # b comes back after a GC pause: it has been removed.
    with pytest.raises(UnknownMemberIdError):
        b.heartbeat()
    # Rejoining works (the client rejoins with epoch 0 and the same member id).
    b.join()
    converge(h, [a, b])
    assert sorted([a.count(), b.count()]) == [2, 2]


def fence(h: Harness, live: Mapping[int, int]) -> list[str]:
    result = h.group.fence_gone_hosts(live)
    h.persist(result.records)
    assert all(e.reason == "node" for e in result.expired)
    return [e.member_id for e in result.expired]


def test_members_of_a_node_whose_registration_ended_are_removed_at_once() -> None:
    """A RecordService stream's member dies with its node process (found from outside: its
    partitions waited out the 45 s session timeout after a kill -9 of the node)."""
    h = Harness({"t": 6})
    a, b, c = Consumer(h), Consumer(h), Consumer(h)
    a.host, b.host = HostNode(1, "inc-1", 5), HostNode(2, "inc-2", 7)
    for m in (a, b, c):
        m.join()
    converge(h, [a, b, c])
    live = {1: 5, 2: 7, 3: 9}
    assert not h.group.has_gone_hosts(live) and fence(h, live) == []
    # Node 2's lease ended: b goes now (its session deadline is far away), as a session
    # expiry would remove it; an ordinary consumer (c) is never touched.
    del live[2]
    assert h.group.has_gone_hosts(live)
    assert fence(h, live) == [b.member_id]
    converge(h, [a, c])
    assert sorted([a.count(), c.count()]) == [3, 3]
    with pytest.raises(UnknownMemberIdError):  # b's node back from a hang: fenced
        b.heartbeat()
    # Node 1 registered again (a restart, or a new lease after a hang): a new session.
    live[1] = 6
    assert fence(h, live) == [a.member_id]
    converge(h, [c])
    assert c.owned == {"t": set(range(6))}
    assert fence(h, {}) == []


def test_a_host_the_coordinator_has_not_matched_is_left_to_the_session_timeout() -> None:
    h = Harness({"t": 2})
    a, b = Consumer(h), Consumer(h)
    a.host = HostNode(1, "inc-1", None)  # the coordinator's view lags the node's registration
    for m in (a, b):
        m.join()
    converge(h, [a, b])
    assert fence(h, {}) == []
    a.host = HostNode(1, "inc-1", 4)
    a.heartbeat()
    # A heartbeat of the same process the view no longer shows keeps the session it was seen
    # under: the member is still fenced for it.
    a.host = HostNode(1, "inc-1", None)
    a.heartbeat()
    assert h.group.members[a.member_id].host == HostNode(1, "inc-1", 4)
    assert fence(h, {1: 4}) == []
    assert fence(h, {}) == [a.member_id]


def test_a_coordinator_taking_the_shard_over_learns_the_hosts_from_the_next_heartbeats() -> None:
    """The host is not persisted: a new coordinator numbers sessions its own way, and every
    member names its host again within a heartbeat interval."""
    h = Harness({"t": 2})
    a, b = Consumer(h), Consumer(h)
    a.host = HostNode(1, "inc-1", 3)
    for m in (a, b):
        m.join()
    converge(h, [a, b])
    h.rebuild()
    assert all(m.host is None for m in h.group.members.values())
    assert fence(h, {}) == []
    a.host = HostNode(1, "inc-1", 1)
    a.heartbeat()
    assert fence(h, {}) == [a.member_id]


def test_member_that_does_not_revoke_in_time_is_removed() -> None:
    h = Harness({"t": 2})
    a = Consumer(h)
    a.join()
    b = Consumer(h)
    b.join()
    h.tick()
    a.heartbeat()  # told to revoke one partition
    assert h.group.members[a.member_id].state is MemberState.UNREVOKED_PARTITIONS
    stuck = {t: set(ps) for t, ps in a.owned.items()}
    stuck["t"] |= {0, 1}  # it keeps processing both and never reports the revocation
    deadline = h.group.members[a.member_id].revocation_deadline_ms
    assert deadline == h.now + 5_000
    for _ in range(4):
        h.tick(1_000)
        a.heartbeat(owned=stuck)
        b.heartbeat()
        assert b.owned == {}
        assert h.expire() == []
    h.now = deadline
    assert h.expire() == [a.member_id]
    h.tick()
    b.heartbeat()
    assert b.owned == {"t": {0, 1}}


def test_a_member_with_a_longer_rebalance_timeout_outlives_the_default() -> None:
    """A consumer with max_poll_interval_ms=600000 sends it as its rebalance timeout: it may
    take longer than the default 5 minutes to revoke, and is removed only after its own."""
    h = Harness({"t": 2}, config=GroupConfig(session_timeout_ms=SESSION))
    assert h.group.config.default_rebalance_timeout_ms == 300_000
    a = Consumer(h)
    a.rebalance_timeout_ms = 600_000
    a.join()
    b = Consumer(h)
    b.join()
    h.tick()
    a.heartbeat()  # told to revoke one partition
    stuck = {t: set(ps) for t, ps in a.owned.items()}
    stuck["t"] |= {0, 1}  # its application is busy: the revocation is not reported yet
    deadline = h.group.members[a.member_id].revocation_deadline_ms
    assert deadline == h.now + 600_000
    while h.now + 5_000 < deadline:
        h.tick(5_000)
        a.heartbeat(owned=stuck)  # its heartbeat thread keeps the session alive
        b.heartbeat()
        assert h.expire() == []
    h.now = deadline
    assert h.expire() == [a.member_id]


def test_unset_rebalance_timeout_uses_the_default() -> None:
    h = Harness({"t": 2}, config=GroupConfig(default_rebalance_timeout_ms=7_000))
    g = h.group
    first = g.heartbeat(
        member_id="a", member_epoch=0, now_ms=0, topics=h.topics, subscribed_topic_names=["t"]
    )
    g.heartbeat(member_id="b", member_epoch=0, now_ms=0, subscribed_topic_names=["t"])
    g.heartbeat(
        member_id="a",
        member_epoch=first.member_epoch,
        now_ms=0,
        subscribed_topic_names=["t"],
        owned_partitions=first.assignment,
    )
    assert g.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    assert g.members["a"].revocation_deadline_ms == 7_000
    assert g.members["a"].metadata.rebalance_timeout_ms == 7_000


def test_static_member_rejoin_keeps_its_assignment_without_rebalance() -> None:
    h = Harness({"t": 6})
    s1 = Consumer(h, instance_id="host-1")
    s2 = Consumer(h, instance_id="host-2")
    s3 = Consumer(h)
    for c in (s1, s2, s3):
        c.join()
    converge(h, [s1, s2, s3])
    mine = s1.owned
    epoch = h.group.group_epoch
    old_id = s1.member_id
    # Rolling restart: s1 leaves temporarily.
    r = s1.heartbeat(epoch=-2)
    assert r.member_epoch == -2
    assert h.group.group_epoch == epoch  # no rebalance
    for c in (s2, s3):
        h.tick()
        assert c.heartbeat().assignment is None  # nobody gets s1's partitions
    # Someone else cannot grab a live instance id.
    with pytest.raises(UnreleasedInstanceIdError):
        Consumer(h, instance_id="host-2", member_id="intruder").join()
    # The restarted process (new member id, same instance id) gets its partitions back.
    s1_new = Consumer(h, instance_id="host-1", member_id="restarted")
    r = s1_new.join()
    assert r.member_id == "restarted"
    assert s1_new.owned == mine
    assert r.member_epoch == epoch
    assert h.group.group_epoch == epoch
    assert h.group.state is GroupState.STABLE
    assert old_id not in h.group.members
    assert h.group.static_member("host-1").member_id == "restarted"
    # The old process is fenced by instance id.
    with pytest.raises(FencedInstanceIdError):
        s1.heartbeat(epoch=epoch)
    converge(h, [s1_new, s2, s3])


def test_static_member_not_back_within_session_timeout_is_replaced() -> None:
    h = Harness({"t": 4})
    s1 = Consumer(h, instance_id="host-1")
    s2 = Consumer(h, instance_id="host-2")
    s1.join()
    s2.join()
    converge(h, [s1, s2])
    s1.heartbeat(epoch=-2)
    left_at = h.now
    while h.now < left_at + SESSION - 1_000:
        h.tick(1_000)
        s2.heartbeat()
        assert h.expire() == []
    h.now = left_at + SESSION
    assert h.expire() == [s1.member_id]
    h.tick()
    s2.heartbeat()
    assert s2.owned == {"t": {0, 1, 2, 3}}
    # Coming back later is a plain join.
    again = Consumer(h, instance_id="host-1", member_id="later")
    again.join()
    converge(h, [again, s2])
    assert again.count() == 2


def test_zombie_and_stale_commits_are_fenced() -> None:
    h = Harness({"t": 4})
    a, b = Consumer(h), Consumer(h)
    a.join()
    b.join()
    converge(h, [a, b])
    g = h.group
    offsets = {("t", p): OffsetAndMetadata(10 + p, 3, "m") for p in a.owned["t"]}
    h.tick()
    result = g.commit_offsets(a.member_id, a.epoch, offsets, now_ms=h.now)
    h.persist(result.records)
    assert set(result.errors.values()) == {ErrorCode.NONE}
    assert g.offsets[("t", min(a.owned["t"]))].commit_timestamp_ms == h.now
    # A newer epoch than the member has is fenced; an older one is stale.
    with pytest.raises(FencedMemberEpochError):
        g.validate_commit(a.member_id, a.epoch + 1)
    c = Consumer(h)
    c.join()
    converge(h, [a, b, c])
    with pytest.raises(StaleMemberEpochError) as exc:
        g.validate_commit(a.member_id, a.epoch - 1)
    assert exc.value.code == ErrorCode.STALE_MEMBER_EPOCH
    with pytest.raises(StaleMemberEpochError):
        g.validate_fetch(a.member_id, a.epoch - 1)
    g.validate_fetch(a.member_id, a.epoch)
    g.validate_fetch("", -1)
    # b stops heartbeating and is removed; its late commit is refused.
    zombie_epoch = b.epoch
    h.now += SESSION + 1
    for c2 in (a, c):
        c2.heartbeat()
    assert b.member_id in h.expire()
    with pytest.raises(UnknownMemberIdError):
        g.commit_offsets(b.member_id, zombie_epoch, {("t", 0): OffsetAndMetadata(99)}, now_ms=h.now)
    assert ("t", 0) not in g.offsets or g.offsets[("t", 0)].offset != 99
    # Admin/simple commits (-1) need an empty group.
    with pytest.raises(NonEmptyGroupError):
        g.validate_commit("", -1)


def test_simple_consumer_commits_on_empty_group() -> None:
    h = Harness({"t": 2})
    g = h.group
    result = g.commit_offsets(
        "",
        -1,
        {
            ("t", 0): OffsetAndMetadata(5),
            ("t", 1): OffsetAndMetadata(6, metadata="x" * 5000),
            ("u", 0): OffsetAndMetadata(7),
        },
        now_ms=42,
        topics=h.topics,
    )
    h.persist(result.records)
    assert result.errors == {
        ("t", 0): ErrorCode.NONE,
        ("t", 1): ErrorCode.OFFSET_METADATA_TOO_LARGE,
        ("u", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert g.offsets == {("t", 0): OffsetAndMetadata(5, commit_timestamp_ms=42)}
    assert g.state is GroupState.EMPTY
    assert h.shard.groups["g"].metadata is not None  # the group exists durably


def test_heartbeat_epoch_fencing_and_lost_response() -> None:
    h = Harness({"t": 4})
    a = Consumer(h)
    a.join()
    with pytest.raises(FencedMemberEpochError):
        a.heartbeat(epoch=a.epoch + 1)
    b = Consumer(h)
    b.join()
    converge(h, [a, b])
    assert a.epoch == 2
    # A member whose response (with the new epoch) was lost retries with the previous epoch:
    # accepted while it owns no more than its assignment, and the assignment is resent.
    r = a.heartbeat(epoch=1)
    assert r.member_epoch == 2 and r.assignment == {"t": sorted(a.owned["t"])}
    with pytest.raises(FencedMemberEpochError):
        a.heartbeat(epoch=1, owned={"t": {0, 1, 2, 3}})
    with pytest.raises(FencedMemberEpochError):
        a.heartbeat(epoch=0 - 3)
    # A fenced member rejoins with epoch 0 and its id and gets its partitions back at once.
    mine = a.owned
    r = a.join()
    assert r.member_id == "m1" and a.owned == mine and r.member_epoch == 2


def test_a_regex_resolves_only_to_topics_the_member_may_describe() -> None:
    """Found from outside: a member subscribed with ".*" was assigned a topic its principal
    may not describe (and its consumer failed instead of reading what it may). What the
    regex resolves to follows the ACLs at each heartbeat, and after a takeover."""
    h = Harness({"orders": 2, "secret-payroll": 2})
    allowed = {"orders"}
    c = Consumer(h, regex=".*")
    c.may_describe = allowed.__contains__
    c.join()
    converge(h, [c])
    assert c.owned == {"orders": {0, 1}}
    allowed.add("secret-payroll")  # an ACL granted: the member's next heartbeat rebalances
    epoch = h.group.group_epoch
    h.tick()
    c.heartbeat()
    assert h.group.group_epoch == epoch + 1
    converge(h, [c])
    assert c.owned == {"orders": {0, 1}, "secret-payroll": {0, 1}}
    allowed.discard("secret-payroll")  # and revoked
    h.tick()
    c.heartbeat()
    converge(h, [c])
    assert c.owned == {"orders": {0, 1}}
    # A new owner does not know the member's principal until its next heartbeat brings it.
    h.rebuild()
    h.tick()
    c.heartbeat()
    converge(h, [c])
    assert c.owned == {"orders": {0, 1}}
    # Without ACLs (no filter) the regex matches every topic, as before.
    c.may_describe = None
    h.tick()
    c.heartbeat()
    converge(h, [c])
    assert c.owned == {"orders": {0, 1}, "secret-payroll": {0, 1}}


def test_request_validation() -> None:
    h = Harness({"t": 4}, config=GroupConfig(max_size=1))
    g = h.group
    with pytest.raises(InvalidRequestError):
        g.heartbeat(
            member_id="x",
            member_epoch=0,
            now_ms=0,
            subscribed_topic_names=["t"],
            subscribed_topic_regex="t.*",
        )
    with pytest.raises(InvalidRequestError):
        g.heartbeat(member_id="x", member_epoch=-2, now_ms=0)
    with pytest.raises(InvalidRequestError):
        g.heartbeat(member_id="x", member_epoch=0, now_ms=0, owned_partitions={"t": [1]})
    with pytest.raises(UnsupportedAssignorError):
        g.heartbeat(member_id="x", member_epoch=0, now_ms=0, server_assignor="sticky")
    with pytest.raises(InvalidRegularExpressionError):
        g.heartbeat(member_id="x", member_epoch=0, now_ms=0, subscribed_topic_regex="(")
    with pytest.raises(UnknownMemberIdError):
        g.heartbeat(member_id="x", member_epoch=3, now_ms=0)
    with pytest.raises(UnknownMemberIdError):
        g.heartbeat(member_id="", member_epoch=3, now_ms=0)
    with pytest.raises(UnknownMemberIdError):
        g.heartbeat(member_id="x", member_epoch=-1, now_ms=0)
    assert g.members == {} and g.group_epoch == 0  # failed calls change nothing
    Consumer(h).join()
    with pytest.raises(GroupMaxSizeReachedError):
        Consumer(h).join()


def test_regex_subscription_picks_up_new_topics_and_partitions() -> None:
    h = Harness({"orders-eu": 2, "payments": 2, "__orders-internal": 1})
    c = Consumer(h, regex=r"orders-.*")
    c2 = Consumer(h, topics=["payments"])
    c.join()
    c2.join()
    assert c.owned == {"orders-eu": {0, 1}}
    epoch = h.group.group_epoch
    # Unrelated heartbeats with the same metadata: no epoch change.
    h.tick()
    c.heartbeat()
    assert h.group.group_epoch == epoch
    # A new matching topic appears; the next heartbeat picks it up.
    h.topics["orders-us"] = 3
    h.tick()
    c.heartbeat()
    assert h.group.group_epoch == epoch + 1
    assert c.owned == {"orders-eu": {0, 1}, "orders-us": {0, 1, 2}}
    # A topic that does not match changes nothing for the assignment (no epoch bump).
    h.topics["audit"] = 1
    h.tick()
    c.heartbeat()
    assert h.group.group_epoch == epoch + 1
    # More partitions for a subscribed topic bump the epoch too.
    h.topics["payments"] = 3
    h.tick()
    c2.heartbeat()
    assert c2.owned == {"payments": {0, 1, 2}}
    assert h.group.group_epoch == epoch + 2
    assert h.group.subscription_metadata == {"orders-eu": 2, "orders-us": 3, "payments": 3}


def test_named_topic_that_does_not_exist_yet_is_assigned_once_it_appears() -> None:
    h = Harness({})
    c = Consumer(h, topics=["later"])
    r = c.join()
    assert r.assignment == {}
    h.topics["later"] = 2
    g = h.group
    records = g.refresh_metadata(h.topics)
    h.persist(records)
    assert g.state is GroupState.ASSIGNING
    h.tick()
    c.heartbeat()
    assert c.owned == {"later": {0, 1}}


def test_assignor_preference_and_range() -> None:
    h = Harness({"a": 3, "b": 3})
    consumers = [Consumer(h, topics=["a", "b"], assignor="range") for _ in range(2)]
    for c in consumers:
        c.join()
    converge(h, consumers)
    assert h.group.assignor_name == "range"
    assert consumers[0].owned == {"a": {0, 1}, "b": {0, 1}}
    assert consumers[1].owned == {"a": {2}, "b": {2}}


def test_subscription_change_moves_partitions() -> None:
    h = Harness({"a": 2, "b": 2})
    x, y = Consumer(h, topics=["a", "b"]), Consumer(h, topics=["a", "b"])
    x.join()
    y.join()
    converge(h, [x, y])
    x.names = ["a"]
    epoch = h.group.group_epoch
    h.tick()
    x.heartbeat()
    assert h.group.group_epoch == epoch + 1
    converge(h, [x, y])
    assert set(x.owned) <= {"a"}
    assert y.owned["b"] == {0, 1}


def test_takeover_rebuilds_the_group_mid_rebalance() -> None:
    h = Harness({"t": 6})
    consumers = [Consumer(h) for _ in range(3)]
    for c in consumers:
        c.join()
    h.tick()
    consumers[0].heartbeat()  # m1 is now revoking
    state = h.group.state
    h.rebuild()
    assert h.group.state is state
    # Members carry on against the new owner without noticing.
    converge(h, consumers)
    assert sorted(c.count() for c in consumers) == [2, 2, 2]


def test_delete_offsets_and_group() -> None:
    h = Harness({"t": 2, "old": 1})
    c = Consumer(h)
    c.join()
    g = h.group
    res = g.commit_offsets(
        c.member_id,
        c.epoch,
        {("t", 0): OffsetAndMetadata(1), ("old", 0): OffsetAndMetadata(2)},
        now_ms=h.now,
    )
    h.persist(res.records)
    res = g.delete_offsets([("t", 0), ("old", 0), ("old", 5)])
    h.persist(res.records)
    assert res.errors == {
        ("t", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        ("old", 0): ErrorCode.NONE,
        ("old", 5): ErrorCode.NONE,
    }
    assert set(g.offsets) == {("t", 0)}
    with pytest.raises(NonEmptyGroupError):
        g.delete()
    c.heartbeat(epoch=-1)
    records = g.delete()
    assert g.state is GroupState.DEAD
    h.persist(records)
    assert "g" not in h.shard.groups


def test_offsets_of_a_deleted_or_recreated_topic_are_not_answered_and_are_dropped() -> None:
    """Found from outside: a topic deleted and created again under the same name resumed at
    the old topic's committed offsets (skipping the new topic's first records), and describe
    listed a deleted topic for good. An offset belongs to the topic id it was committed with;
    one committed before ids were stored ("") stays valid while a topic of its name lives."""
    h = Harness({"t": 1, "gone": 1, "legacy": 1})
    g = h.group
    res = g.commit_offsets(
        "",
        -1,
        {
            ("t", 0): OffsetAndMetadata(50, topic_id="id-1"),
            ("gone", 0): OffsetAndMetadata(3, topic_id="id-g"),
            ("legacy", 0): OffsetAndMetadata(7),
        },
        now_ms=h.now,
    )
    h.persist(res.records)
    unchanged = {"t": "id-1", "gone": "id-g", "legacy": "id-l"}
    assert set(g.live_offsets(unchanged)) == {("t", 0), ("gone", 0), ("legacy", 0)}
    assert g.drop_stale_offsets(unchanged).records == []
    # "gone" was deleted, "t" deleted and created again (a new id).
    now = {"t": "id-2", "legacy": "id-l"}
    assert set(g.live_offsets(now)) == {("legacy", 0)}
    res = g.drop_stale_offsets(now)
    h.persist(res.records)
    assert set(g.offsets) == {("legacy", 0)}
    h.rebuild()  # the tombstones are durable: a new owner does not bring them back
    assert set(h.group.offsets) == {("legacy", 0)}
    # A commit of the new topic is not "superseded" by the old topic's later-numbered one.
    g = h.group
    g.commit_offsets(
        "",
        -1,
        {("t", 0): OffsetAndMetadata(9, topic_id="id-1")},
        now_ms=0,
        committer_id="c",
        commit_sequence=5,
    )
    g.commit_offsets(
        "",
        -1,
        {("t", 0): OffsetAndMetadata(2, topic_id="id-2")},
        now_ms=0,
        committer_id="c",
        commit_sequence=1,
    )
    assert g.offsets[("t", 0)].offset == 2


def test_random_membership_churn_keeps_invariants() -> None:
    """Joins, leaves, static restarts, silent members and metadata changes in random order:
    no partition is ever owned by two live consumers, replay always equals the live group,
    and once the churn stops the group converges to a balanced, complete assignment."""
    for seed in range(12):
        rng = random.Random(seed)
        h = Harness({"t": rng.randint(1, 8), "u": rng.randint(0, 4)})
        live: list[Consumer] = []
        silent: list[Consumer] = []
        n_static = 0
        for _ in range(60):
            h.tick(rng.choice([100, 500, 2_000]))
            op = rng.random()
            if op < 0.2 and len(live) < 6:
                n_static += 1
                inst = f"i{n_static}" if rng.random() < 0.3 else None
                c = Consumer(h, topics=rng.choice([["t"], ["t", "u"]]), instance_id=inst)
                c.join()
                live.append(c)
            elif op < 0.3 and live:
                c = live.pop(rng.randrange(len(live)))
                if c.instance_id is not None and rng.random() < 0.5:
                    c.heartbeat(epoch=-2)
                    back = Consumer(h, topics=c.names, instance_id=c.instance_id)
                    back.join()
                    live.append(back)
                else:
                    c.heartbeat(epoch=-1)
            elif op < 0.35 and live:
                silent.append(live.pop(rng.randrange(len(live))))
            elif op < 0.4:
                h.topics["t"] += 1
            else:
                for c in live:
                    c.heartbeat()
            for c in list(live):
                if c.member_id not in h.group.members:  # expired meanwhile (long tick)
                    live.remove(c)
            gone = set(h.expire())
            live = [c for c in live if c.member_id not in gone]
            for c in live:
                assert h.group.members[c.member_id].member_epoch >= 0
            assert_exclusive(live)
        # Silent members time out; the rest converge.
        h.tick(SESSION + 1)
        for c in live:
            c.heartbeat()
        h.expire()
        live = [c for c in live if c.member_id in h.group.members]
        if not live:
            continue
        converge(h, live, rounds=12)
        owned = [(t, p) for c in live for t, ps in c.owned.items() for p in ps]
        wanted = {(t, p) for t, n in h.topics.items() for p in range(n)}
        subscribed = {t for c in live for t in c.names}
        assert sorted(owned) == sorted(w for w in wanted if w[0] in subscribed)


def test_a_committers_late_older_commit_never_overwrites_its_newer_one() -> None:
    """Issue 9, defect 1: commits of one committer take effect in the order it numbered them,
    also after a takeover replays the log; other committers and unordered (admin) commits are
    not ordered against them."""
    h = Harness({"t": 2})
    g = h.group

    def commit(offset: int, committer: str = "", sequence: int = 0, p: int = 0) -> int:
        h.tick()
        r = g.commit_offsets(
            "",
            -1,
            {("t", p): OffsetAndMetadata(offset)},
            now_ms=h.now,
            topics=h.topics,
            committer_id=committer,
            commit_sequence=sequence,
        )
        h.persist(r.records)
        assert r.errors == {("t", p): ErrorCode.NONE}  # superseded is not an error
        return r.superseded

    assert commit(50, "c1", 5) == 0
    assert commit(40, "c1", 4) == 1  # late: left alone
    assert g.offsets[("t", 0)].offset == 50
    assert commit(41, "c1", 4, p=1) == 0  # a partition c1's newer commit did not touch
    assert g.offsets[("t", 1)].offset == 41
    assert commit(60, "c1", 6) == 0
    assert commit(60, "c1", 6) == 0  # a retry of the same request applies again
    h.rebuild()  # a new coordinator replays the log: the guard holds
    g = h.group
    assert g.offsets[("t", 0)] == OffsetAndMetadata(
        60, commit_timestamp_ms=h.now, committer_id="c1", commit_sequence=6
    )
    assert commit(55, "c1", 5) == 1
    assert g.offsets[("t", 0)].offset == 60
    assert commit(30, "c2", 1) == 0  # another committer is not ordered against c1
    assert g.offsets[("t", 0)].offset == 30
    assert commit(10) == 0  # nor is an admin reset (no committer)
    assert commit(20, "c1", 1) == 0
    assert g.offsets[("t", 0)].offset == 20


def test_transactional_offsets_wait_for_their_transaction() -> None:
    """Issue 12: TxnOffsetCommit offsets are pending until the transaction commits (then
    applied) or aborts (dropped); a fenced member or zombie producer cannot add to them; all
    of it replays after a takeover."""
    h = Harness({"t": 2})
    a = Consumer(h)
    a.join()
    converge(h, [a])
    g = h.group
    h.persist(
        g.commit_offsets(a.member_id, a.epoch, {("t", 0): OffsetAndMetadata(5)}, now_ms=1).records
    )

    def txn_commit(pid: int, epoch: int, offsets: dict) -> None:
        h.tick()
        r = g.txn_commit_offsets(a.member_id, a.epoch, pid, epoch, offsets, now_ms=h.now)
        h.persist(r.records)

    txn_commit(9, 0, {("t", 0): OffsetAndMetadata(10)})
    txn_commit(9, 0, {("t", 1): OffsetAndMetadata(20)})  # same transaction: merged
    assert g.offsets[("t", 0)].offset == 5  # not visible before the commit
    assert g.unstable("t", 0) and g.unstable("t", 1)
    h.rebuild()  # a takeover keeps the pending offsets
    g = h.group
    assert set(g.pending[9].offsets) == {("t", 0), ("t", 1)}
    with pytest.raises(StaleMemberEpochError):
        g.txn_commit_offsets(a.member_id, a.epoch - 1, 9, 0, {}, now_ms=h.now)
    r = g.complete_txn(9, 0, True, now_ms=h.now)
    h.persist(r.records)
    assert {tp: om.offset for tp, om in g.offsets.items()} == {("t", 0): 10, ("t", 1): 20}
    assert not g.pending[9].offsets and not g.unstable("t", 0)  # only the ended epoch stays
    assert g.complete_txn(9, 0, True, now_ms=h.now).records == []  # a retry changes nothing

    txn_commit(9, 1, {("t", 0): OffsetAndMetadata(99)})
    with pytest.raises(ProducerFencedError):
        g.txn_commit_offsets(
            a.member_id, a.epoch, 9, 0, {("t", 0): OffsetAndMetadata(1)}, now_ms=h.now
        )
    h.persist(g.complete_txn(9, 1, False, now_ms=h.now).records)  # aborted: dropped
    assert g.offsets[("t", 0)].offset == 10 and not g.pending[9].offsets
    h.rebuild()
    assert h.group.offsets[("t", 0)].offset == 10 and not h.group.pending[9].offsets


def test_offsets_of_a_transaction_that_ended_meanwhile_are_refused() -> None:
    """Found from outside: a producer paused between AddOffsetsToTxn and TxnOffsetCommit
    while its transaction timed out and was aborted (with a bumped epoch); its late
    TxnOffsetCommit was taken and stayed pending for good, so every read_committed member
    of the group got UNSTABLE_OFFSET_COMMIT. The ended epoch now refuses it, also after a
    takeover; the producer's next epoch commits as before."""
    h = Harness({"t": 1})
    a = Consumer(h)
    a.join()
    converge(h, [a])
    g = h.group
    h.persist(g.complete_txn(9, 1, False, now_ms=h.now).records)  # aborted at the bump
    h.rebuild()
    g = h.group
    with pytest.raises(ProducerFencedError):
        g.txn_commit_offsets(
            a.member_id, a.epoch, 9, 0, {("t", 0): OffsetAndMetadata(7)}, now_ms=h.now
        )
    assert not g.unstable("t", 0)
    r = g.txn_commit_offsets(
        a.member_id, a.epoch, 9, 1, {("t", 0): OffsetAndMetadata(8)}, now_ms=h.now
    )
    h.persist(r.records)
    assert g.unstable("t", 0)
    h.persist(g.complete_txn(9, 1, True, now_ms=h.now).records)
    assert g.offsets[("t", 0)].offset == 8 and not g.unstable("t", 0)


def test_only_an_empty_group_with_nothing_committed_is_removable_by_the_cleanup() -> None:
    """The coordinator's periodic cleanup deletes EMPTY groups without committed or
    transactional offsets (found from outside: such groups were kept for good)."""
    h = Harness({"t": 1})
    c = Consumer(h)
    c.join()
    g = h.group
    assert not g.removable and g.delete_if_idle(with_offsets=True) == []  # a member: kept
    c.heartbeat(epoch=-1)
    assert g.removable
    records = g.delete_if_idle(with_offsets=False)
    assert g.state is GroupState.DEAD and not g.removable
    h.persist(records)
    assert "g" not in h.shard.groups  # replayed: the tombstones delete it

    committed = Harness({"t": 1})
    c = Consumer(committed)
    c.join()
    res = committed.group.commit_offsets(
        c.member_id, c.epoch, {("t", 0): OffsetAndMetadata(1)}, now_ms=committed.now
    )
    committed.persist(res.records)
    c.heartbeat(epoch=-1)
    assert committed.group.state is GroupState.EMPTY
    assert not committed.group.removable
    assert committed.group.delete_if_idle(with_offsets=False) == []
    # Past the offsets retention the cleanup deletes it with its offsets (KIP-211).
    assert committed.group.idle
    committed.persist(committed.group.delete_if_idle(with_offsets=True))
    assert "g" not in committed.shard.groups

    txn = Harness({"t": 1})
    c = Consumer(txn)
    c.join()
    offsets = {("t", 0): OffsetAndMetadata(1)}
    res = txn.group.txn_commit_offsets(c.member_id, c.epoch, 7, 0, offsets, now_ms=txn.now)
    txn.persist(res.records)
    c.heartbeat(epoch=-1)
    assert txn.group.state is GroupState.EMPTY and not txn.group.offsets
    assert not txn.group.removable  # the transaction's offsets are pending
    assert not txn.group.idle and txn.group.delete_if_idle(with_offsets=True) == []


def test_each_heartbeat_says_what_it_changed_and_plain_heartbeats_nothing() -> None:
    """What the coordinator logs, one line per change: joins, subscription changes, rejoins
    and leaves, with the group epoch before and after and the member count; a plain
    heartbeat changes nothing (no line per heartbeat)."""
    h = Harness({"t": 4, "u": 2})
    a, b = Consumer(h), Consumer(h)
    r = a.join()
    assert (r.change, r.previous_group_epoch, r.group_epoch, r.members) == (
        "member m1 joined",
        0,
        1,
        1,
    )
    r = b.join()
    assert (r.change, r.previous_group_epoch, r.group_epoch, r.members) == (
        "member m2 joined",
        1,
        2,
        2,
    )
    converge(h, [a, b])
    h.tick()
    assert a.heartbeat().change is None  # a plain heartbeat
    a.names = ["t", "u"]
    r = a.heartbeat()
    assert (r.change, r.group_epoch) == ("member m1 changed its subscription", 3)
    r = b.join()  # epoch 0 again, as after FENCED_MEMBER_EPOCH
    assert (
        r.change
        == "member m2 rejoined with epoch 0 (it was fenced, or lost the answer to its join)"
    )
    r = a.heartbeat(epoch=-1)
    assert (r.change, r.previous_group_epoch, r.group_epoch, r.members) == (
        "member m1 left",
        3,
        4,
        1,
    )
