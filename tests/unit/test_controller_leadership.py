"""The pure leader/ISR engine (strom.controller.leadership)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strom.api import metadata_pb2 as md
from strom.controller import leadership as L
from strom.errors import ErrorCode as E


def ps(replicas, leader, isr, *, le=5, pe=9, adding=(), removing=()) -> md.PartitionState:
    return md.PartitionState(
        replicas=replicas,
        leader=leader,
        leader_epoch=le,
        isr=isr,
        partition_epoch=pe,
        adding_replicas=adding,
        removing_replicas=removing,
        leader_recovery_state=md.LEADER_RECOVERY_STATE_RECOVERED,
    )


def test_nothing_changes_when_all_alive():
    assert L.reconcile(ps([1, 2, 3], 1, [1, 2, 3]), {1, 2, 3}, {1, 2, 3}) is None


def test_dead_leader_next_isr_member_in_replica_order():
    d = L.reconcile(ps([1, 2, 3], 1, [1, 3, 2]), {2, 3}, {2, 3})
    assert d is not None and d.election == L.FAILURE
    assert d.state.leader == 2 and list(d.state.isr) == [2, 3]
    assert d.state.leader_epoch == 6 and d.state.partition_epoch == 10


def test_dead_follower_leaves_isr_without_leader_change():
    d = L.reconcile(ps([1, 2, 3], 1, [1, 2, 3]), {1, 3}, {1, 3})
    assert d is not None and d.election is None
    assert d.state.leader == 1 and list(d.state.isr) == [1, 3]
    assert d.state.leader_epoch == 5 and d.state.partition_epoch == 10


def test_follower_not_in_isr_dying_changes_nothing():
    assert L.reconcile(ps([1, 2, 3], 1, [1, 2]), {1, 2}, {1, 2}) is None


def test_no_live_isr_member_goes_offline_keeping_last_member():
    d = L.reconcile(ps([1, 2, 3], 1, [1]), {2, 3}, {2, 3})
    assert d is not None
    assert d.state.leader == -1 and list(d.state.isr) == [1]
    assert d.state.leader_epoch == 6
    # Nothing more happens while it stays offline.
    assert L.reconcile(d.state, {2, 3}, {2, 3}) is None
    # The last ISR member returns: clean election.
    back = L.reconcile(d.state, {1, 2, 3}, {1, 2, 3})
    assert back is not None and back.state.leader == 1 and back.state.leader_epoch == 7


def test_unclean_election_only_when_enabled():
    st_ = ps([1, 2, 3], 1, [1])
    d = L.reconcile(st_, {3}, {3}, unclean=True)
    assert d is not None and d.election == L.UNCLEAN
    assert d.state.leader == 3 and list(d.state.isr) == [3]
    assert d.state.leader_recovery_state == md.LEADER_RECOVERY_STATE_RECOVERING
    assert L.reconcile(st_, {3}, {3}).state.leader == -1


def test_a_leader_resigning_hands_over_to_the_next_eligible_in_sync_replica():
    """A leader whose stored data failed a check resigns (AlterPartition with an ISR without
    itself): another in-sync, running replica leads and the old leader leaves the ISR."""
    d = L.resign(ps([1, 2, 3], 1, [1, 2, 3]), {1, 3})
    assert d is not None and d.election == L.DAMAGED_REPLICA
    assert d.state.leader == 3 and list(d.state.isr) == [2, 3]
    assert (d.state.leader_epoch, d.state.partition_epoch) == (6, 10)
    # Nobody else in sync and running: it keeps leading (no decision).
    assert L.resign(ps([1, 2, 3], 1, [1, 2]), {1, 3}) is None
    assert L.resign(ps([1, 2], 1, [1]), {1, 2}) is None


def test_a_leader_whose_disk_refused_an_append_resigns_as_a_storage_error():
    """Found from outside: a leader on a full disk kept leading. It now resigns the same way,
    and the election is counted under its own reason."""
    d = L.resign(ps([3, 1, 2], 3, [3, 1, 2]), {1, 2, 3}, L.STORAGE_ERROR)
    assert d is not None and d.election == L.STORAGE_ERROR
    assert d.state.leader == 1 and list(d.state.isr) == [1, 2]


def test_shutting_down_leader_hands_over_or_keeps_leading():
    d = L.reconcile(ps([1, 2, 3], 1, [1, 2, 3]), {1, 2, 3}, {2, 3})
    assert d is not None and d.election == L.CONTROLLED_SHUTDOWN
    assert d.state.leader == 2 and list(d.state.isr) == [2, 3]
    # Sole ISR member: keeps leading, stays in the ISR.
    assert L.reconcile(ps([1, 2], 1, [1]), {1, 2}, {2}) is None


def test_controlled_shutdown_removes_follower():
    d = L.controlled_shutdown(ps([1, 2, 3], 1, [1, 2, 3]), 3, {1, 2, 3}, {1, 2, 3})
    assert d is not None and d.state.leader == 1 and list(d.state.isr) == [1, 2]


def test_preferred_election():
    st_ = ps([1, 2, 3], 2, [1, 2, 3])
    d, code = L.preferred(st_, {1, 2, 3})
    assert code == E.NONE and d.state.leader == 1 and d.election == L.PREFERRED
    assert d.state.leader_epoch == 6
    assert L.preferred(ps([1, 2], 1, [1, 2]), {1, 2}) == (None, E.ELECTION_NOT_NEEDED)
    assert L.preferred(ps([1, 2], 2, [2]), {1, 2}) == (None, E.PREFERRED_LEADER_NOT_AVAILABLE)
    assert L.preferred(st_, {2, 3}) == (None, E.PREFERRED_LEADER_NOT_AVAILABLE)


def test_preferred_unavailable_reason_names_the_replica_and_why():
    """Found from outside: ElectLeaders answered PREFERRED_LEADER_NOT_AVAILABLE with the
    code's name as its message; it now says which replica and what keeps it from leading."""
    assert L.preferred_unavailable_reason(ps([3, 1], 1, [1]), {1, 2}) == (
        "preferred replica 3 is not running (down, starting or shutting down)"
    )
    assert L.preferred_unavailable_reason(ps([3, 1], 1, [1]), {1, 3}) == (
        "preferred replica 3 is not in the ISR (it is still catching up)"
    )
    # A reassignment removing the first replica: the target's first one is preferred.
    reason = L.preferred_unavailable_reason(ps([2, 3, 1], 1, [1, 2], removing=(2,)), {1, 2})
    assert reason.startswith("preferred replica 3 ")
    assert L.preferred_unavailable_reason(ps([], -1, []), {1}) == "the partition has no replicas"


def test_auto_preferred_in_reconcile():
    d = L.reconcile(ps([1, 2], 2, [1, 2]), {1, 2}, {1, 2}, auto_preferred=True)
    assert d is not None and d.state.leader == 1 and d.election == L.PREFERRED
    assert d.state.partition_epoch == 10 and d.state.leader_epoch == 6


def test_unclean_election_rpc_rules():
    assert L.unclean_election(ps([1, 2], 1, [1, 2]), {1, 2}, {1, 2}) == (
        None,
        E.ELECTION_NOT_NEEDED,
    )
    offline = ps([1, 2], -1, [1])
    d, code = L.unclean_election(offline, {2}, {2})
    assert code == E.NONE and d.state.leader == 2
    assert L.unclean_election(offline, set(), set()) == (None, E.ELIGIBLE_LEADERS_NOT_AVAILABLE)


def test_reassignment_lifecycle():
    st_ = ps([1, 2, 3], 1, [1, 2, 3])
    d = L.start_reassignment(st_, [4, 5, 3], {1, 2, 3, 4, 5})
    s = d.state
    assert list(s.replicas) == [4, 5, 3, 1, 2]
    assert list(s.adding_replicas) == [4, 5] and list(s.removing_replicas) == [1, 2]
    assert s.leader == 1 and s.partition_epoch == 10
    # Not in sync yet: nothing to complete.
    assert L.complete_reassignment(s, {1, 2, 3, 4, 5}) is None
    s.isr.extend([4, 5])
    done = L.complete_reassignment(s, {1, 2, 3, 4, 5})
    assert done is not None and done.election == L.REASSIGNMENT
    assert list(done.state.replicas) == [4, 5, 3] and done.state.leader == 4
    assert list(done.state.isr) == [4, 5, 3]
    assert not done.state.adding_replicas and not done.state.removing_replicas
    assert done.state.leader_epoch == 6


def test_reassignment_cancel():
    st_ = ps([1, 2], 1, [1, 2])
    s = L.start_reassignment(st_, [3, 2], {1, 2, 3}).state
    d, code = L.cancel_reassignment(s, {1, 2, 3})
    assert code == E.NONE
    assert sorted(d.state.replicas) == [1, 2] and d.state.leader == 1
    assert not d.state.adding_replicas
    assert L.cancel_reassignment(st_, {1, 2}) == (None, E.NO_REASSIGNMENT_IN_PROGRESS)


def test_a_cancel_that_would_need_an_unclean_election_is_refused_unless_the_topic_allows_it():
    """Only replicas the move is adding are in sync (the original one fell behind while the
    new leader took writes): going back would drop every copy of those records and leave
    the original replica without a clean leader for good (found from outside: offline, and
    records acknowledged with acks=all lost). Kafka's revert refuses it the same way."""
    state = L.start_reassignment(ps([3], 3, [3]), [1, 2], {1, 2, 3}).state
    assert list(state.adding_replicas) == [1, 2] and list(state.removing_replicas) == [3]
    state.leader = 1  # 1 caught up and took over; then 3 dropped out of the ISR
    del state.isr[:]
    state.isr.append(1)
    assert L.cancel_reassignment(state, {1, 2, 3}) == (None, E.INVALID_REPLICA_ASSIGNMENT)
    # Allowed by the topic: the original replica comes back as it is (the loss accepted).
    d, code = L.cancel_reassignment(state, {1, 2, 3}, unclean_allowed=True)
    assert code == E.NONE and list(d.state.replicas) == [3]
    L.check_invariants(d.state)
    # With an original replica still in sync, the cancel goes on (it leads again).
    state.isr.append(3)
    d, code = L.cancel_reassignment(state, {1, 2, 3})
    assert code == E.NONE and list(d.state.replicas) == [3] and d.state.leader == 3
    assert list(d.state.isr) == [3]


def test_cancel_restores_the_original_order_and_leader():
    # Found from outside: 1,2,3 -> 4,2,3 cancelled gave 2,3,1 and moved leadership to 2.
    st_ = ps([1, 2, 3], 1, [1, 2, 3])
    s = L.start_reassignment(st_, [4, 2, 3], {1, 2, 3, 4}).state
    assert list(s.replicas) == [4, 2, 3, 1] and list(s.original_replicas) == [1, 2, 3]
    d, code = L.cancel_reassignment(s, {1, 2, 3, 4})
    assert code == E.NONE and d.election is None
    assert list(d.state.replicas) == [1, 2, 3] and list(d.state.isr) == [1, 2, 3]
    assert d.state.leader == 1 and d.state.leader_epoch == st_.leader_epoch
    assert not d.state.original_replicas
    # A move replacing another still cancels back to the first one's order.
    s2 = L.start_reassignment(s, [2, 5, 3], {1, 2, 3, 4, 5}).state
    assert list(s2.original_replicas) == [1, 2, 3]
    d, _ = L.cancel_reassignment(s2, {1, 2, 3, 4, 5})
    assert list(d.state.replicas) == [1, 2, 3] and d.state.leader == 1
    # A state written before original_replicas existed: the old order, replicas kept.
    old = ps([4, 2, 3, 1], 1, [2, 3, 1], adding=[4], removing=[1])
    d, _ = L.cancel_reassignment(old, {1, 2, 3, 4})
    assert list(d.state.replicas) == [2, 3, 1]


def test_finished_reassignment_forgets_the_original_order():
    s = L.start_reassignment(ps([1, 2], 1, [1, 2]), [3, 2], {1, 2, 3}).state
    s.isr.append(3)
    done = L.complete_reassignment(s, {1, 2, 3})
    assert done is not None and list(done.state.replicas) == [3, 2]
    assert not done.state.original_replicas
    L.check_invariants(done.state)


def test_reassignment_to_same_set_is_a_noop():
    assert L.start_reassignment(ps([1, 2], 1, [1, 2]), [1, 2], {1, 2}) is None


nodes = st.sampled_from([1, 2, 3, 4, 5])


@st.composite
def states(draw):
    replicas = draw(st.lists(nodes, min_size=1, max_size=4, unique=True))
    isr = draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    leader = draw(st.sampled_from([*isr, -1]))
    return ps(replicas, leader, [r for r in replicas if r in isr])


@settings(max_examples=300, deadline=None)
@given(
    states(),
    st.sets(nodes),
    st.sets(nodes),
    st.booleans(),
    st.booleans(),
    st.lists(nodes, min_size=1, max_size=3, unique=True),
)
def test_invariants(s, alive, eligible_extra, unclean, auto, target):
    eligible = alive & eligible_extra
    for d in (
        L.reconcile(s, alive, eligible, unclean=unclean, auto_preferred=auto),
        L.preferred(s, eligible)[0],
        L.controlled_shutdown(s, 1, alive, eligible),
        L.start_reassignment(s, target, eligible),
    ):
        if d is None:
            continue
        L.check_invariants(d.state)
        assert d.state.partition_epoch == s.partition_epoch + 1
        assert d.state.leader_epoch >= s.leader_epoch
        if d.state.leader != s.leader:
            assert d.state.leader_epoch == s.leader_epoch + 1
        if d.state.leader >= 0 and d.state.leader != s.leader:
            assert d.state.leader in eligible
        if d.state.leader_recovery_state == md.LEADER_RECOVERY_STATE_RECOVERING:
            assert unclean
        # Applying the same liveness again is stable.
        again = L.reconcile(d.state, alive, eligible, unclean=unclean)
        if again is not None:
            L.check_invariants(again.state)


def test_replacing_a_move_keeps_a_leader_that_was_being_added():
    s = L.start_reassignment(ps([1, 2], 1, [1, 2]), [3, 2], {1, 2, 3}).state
    # Node 3 (being added) caught up and leads now, alone in the ISR.
    del s.isr[:]
    s.isr.extend([3])
    s.leader = 3
    d = L.start_reassignment(s, [4, 2], {2, 3, 4})
    assert d is not None and d.state.leader == 3
    assert 3 in d.state.removing_replicas and 4 in d.state.adding_replicas
    L.check_invariants(d.state)


@settings(max_examples=200, deadline=None)
@given(
    states(),
    st.lists(nodes, min_size=1, max_size=3, unique=True),
    st.lists(nodes, min_size=1, max_size=3, unique=True),
    st.sets(nodes),
)
def test_chained_reassignments_keep_invariants(s, first, second, eligible):
    d1 = L.start_reassignment(s, first, eligible)
    cur = d1.state if d1 else s
    for d in (
        L.start_reassignment(cur, second, eligible),
        L.cancel_reassignment(cur, eligible)[0],
        L.reconcile(cur, eligible, eligible, auto_preferred=True),
    ):
        if d is not None:
            L.check_invariants(d.state)
            assert d.state.partition_epoch == cur.partition_epoch + 1


@settings(max_examples=200, deadline=None)
@given(states(), st.lists(nodes, min_size=1, max_size=3, unique=True), st.sets(nodes))
def test_cancel_undoes_a_started_reassignment(s, target, eligible):
    d = L.start_reassignment(s, target, eligible)
    if d is None or not (d.state.adding_replicas or d.state.removing_replicas):
        return  # nothing to move, or finished at once
    undone, code = L.cancel_reassignment(d.state, eligible)
    assert code == E.NONE
    assert list(undone.state.replicas) == list(s.replicas)
    if s.leader >= 0 and d.state.leader == s.leader:
        assert undone.state.leader == s.leader  # an in-sync leader is not moved


def _reg(node_id: int, state: int, incarnation: str = "i") -> md.NodeRegistration:
    return md.NodeRegistration(node_id=node_id, state=state, incarnation_id=incarnation)


def test_a_new_partition_is_led_by_its_first_running_replica():
    """Found from outside: at `strom dev up` topics were created with node 1, still STARTING,
    as leader; the next reconciliation moved leadership away and dropped node 1 from the ISR.
    Now the first RUNNING replica leads and the RUNNING ones are the ISR; the replica order,
    the preferred leader first, is kept."""
    st = L.initial_state([1, 2, 3], {2, 3}, "tid")
    assert list(st.replicas) == [1, 2, 3] and st.leader == 2 and list(st.isr) == [2, 3]
    assert (st.leader_epoch, st.partition_epoch, st.topic_id) == (0, 0, "tid")
    L.check_invariants(st)
    # Nothing for the next reconciliation to move while node 1 is still starting ...
    assert L.reconcile(st, {1, 2, 3}, {2, 3}, starting={1}) is None
    # ... and once it runs (and has joined the ISR), a preferred election makes it lead.
    joined = md.PartitionState()
    joined.CopyFrom(st)
    joined.isr[:] = [1, 2, 3]
    d, code = L.preferred(joined, {1, 2, 3})
    assert code == E.NONE and d is not None and d.state.leader == 1
    # Every replica eligible: as before, the first one leads with all in the ISR.
    st = L.initial_state([3, 1, 2], {1, 2, 3}, "tid")
    assert st.leader == 3 and list(st.isr) == [3, 1, 2]


def test_a_new_partition_with_no_running_replica_is_led_by_its_first():
    """Every node still starting: the first replica leads (a partition without a leader
    would wait for its last ISR member); the first replica to run takes over."""
    st = L.initial_state([1, 2], set(), "tid")
    assert st.leader == 1 and list(st.isr) == [1, 2]
    L.check_invariants(st)
    d = L.reconcile(st, {1, 2}, {2}, starting={1})
    assert d is not None and d.state.leader == 2 and d.election == L.FAILURE


def test_moving_away_from_a_starting_leader_is_no_controlled_shutdown():
    """A leader registered again but STARTING (its previous process is gone) hands over as
    after a failure; only a node shutting down counts as a controlled shutdown (found from
    outside: 6 "controlled_shutdown" elections on a cluster where nothing shut down)."""
    d = L.reconcile(ps([1, 2, 3], 1, [1, 2, 3]), {1, 2, 3}, {2, 3}, starting={1})
    assert d is not None and d.state.leader == 2 and d.election == L.FAILURE
    d = L.reconcile(ps([1, 2, 3], 1, [1, 2, 3]), {1, 2, 3}, {2, 3})
    assert d is not None and d.state.leader == 2 and d.election == L.CONTROLLED_SHUTDOWN


def test_eligible_and_starting_nodes():
    nodes = {
        1: _reg(1, md.NODE_STATE_STARTING),
        2: _reg(2, md.NODE_STATE_RUNNING),
        3: _reg(3, md.NODE_STATE_SHUTTING_DOWN),
        4: _reg(4, md.NODE_STATE_RUNNING, "new"),
        5: _reg(5, md.NODE_STATE_RUNNING, "asked"),
    }
    # 5's incarnation asked for a controlled shutdown; 4's previous one did, not this one.
    stopping = {4: "old", 5: "asked"}
    assert L.eligible_nodes(nodes, stopping) == {2, 4}
    assert L.eligible_nodes(nodes) == {2, 4, 5}
    assert L.starting_nodes(nodes) == {1}


def test_a_partition_being_moved_is_under_replicated_only_when_its_old_copies_are_not_in_sync():
    """Kafka's rule (replicas - adding - ISR): a move copying to new replicas while the old
    ones are all in sync is not under-replicated (found from outside: every long move paged
    StromUnderReplicatedPartitions); one that lost an old replica is."""
    from strom.client.admin import PartitionInfo
    from strom.controller.metrics import _flags

    topic = md.TopicMetadata(name="t", partition_count=1, replication_factor=2)
    moving = L.start_reassignment(ps([3, 4], 3, [3, 4]), [3, 2], {2, 3, 4}).state
    assert list(moving.replicas) == [3, 2, 4] and list(moving.isr) == [3, 4]
    offline, under, _, _, reassigning = _flags(moving, topic)
    assert (offline, under, reassigning) == (0, 0, 1)
    info = PartitionInfo(
        partition=0,
        leader=3,
        leader_epoch=1,
        replicas=tuple(moving.replicas),
        isr=tuple(moving.isr),
        adding_replicas=tuple(moving.adding_replicas),
        removing_replicas=tuple(moving.removing_replicas),
    )
    assert not info.under_replicated and info.reassigning
    del moving.isr[:]
    moving.isr.append(3)  # an old copy fell behind during the move
    assert _flags(moving, topic)[1] == 1
    assert PartitionInfo(
        partition=0,
        leader=3,
        leader_epoch=1,
        replicas=tuple(moving.replicas),
        isr=(3,),
        adding_replicas=tuple(moving.adding_replicas),
    ).under_replicated
    # Not moving: any replica out of sync.
    plain = ps([1, 2], 1, [1])
    assert _flags(plain, topic)[1:2] == (1,) and _flags(plain, topic)[4] == 0
