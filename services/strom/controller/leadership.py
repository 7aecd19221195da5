"""Leader and ISR decisions for one partition, as pure functions (DESIGN §6).

No gRPC, no etcd: every function takes a committed :class:`PartitionState` and what the
controller knows about the nodes, and returns the state to commit (a new message, epochs
bumped) or None when nothing changes. The controller writes the result with CAS.

Terms: ``alive`` = registered nodes (any state); ``eligible`` = registered and RUNNING (a
SHUTTING_DOWN or STARTING node may stay in an ISR but may not be elected). Invariants kept by
every function: leader ∈ ISR ⊆ replicas, or leader = -1; partition_epoch grows on every
change, leader_epoch on every leader change; an unclean election only when asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode

E = ErrorCode
RECOVERING = md.LEADER_RECOVERY_STATE_RECOVERING
RECOVERED = md.LEADER_RECOVERY_STATE_RECOVERED

#: Reasons, as in the strom_controller_leader_elections_total metric.
FAILURE = "failure"
PREFERRED = "preferred"
CONTROLLED_SHUTDOWN = "controlled_shutdown"
UNCLEAN = "unclean"
REASSIGNMENT = "reassignment"
DAMAGED_REPLICA = "damaged_replica"
STORAGE_ERROR = "storage_error"
#: Every reason (the metric's label values, each named in its help text).
REASONS = (
    FAILURE,
    PREFERRED,
    CONTROLLED_SHUTDOWN,
    UNCLEAN,
    REASSIGNMENT,
    DAMAGED_REPLICA,
    STORAGE_ERROR,
)


@dataclass(frozen=True)
class Decision:
    """A state to commit, and why the leader changed (None = it did not)."""

    state: md.PartitionState
    election: str | None = None


def _copy(st: md.PartitionState) -> md.PartitionState:
    new = md.PartitionState()
    new.CopyFrom(st)
    return new


def _set(field: object, values: Sequence[int]) -> None:
    del field[:]  # type: ignore[index]
    field.extend(values)  # type: ignore[attr-defined]


def _ordered(st: md.PartitionState, members: Collection[int]) -> list[int]:
    return [r for r in st.replicas if r in members]


def _finish(old: md.PartitionState, new: md.PartitionState, reason: str) -> Decision | None:
    """Bump the epochs of ``new`` against ``old``; None when nothing changed."""
    if new == old:
        return None
    changed_leader = new.leader != old.leader
    if changed_leader:
        new.leader_epoch = old.leader_epoch + 1
    new.partition_epoch = old.partition_epoch + 1
    return Decision(new, reason if changed_leader else None)


def targets(st: md.PartitionState) -> list[int]:
    """The replica set the partition ends with (replicas minus removing_replicas)."""
    removing = set(st.removing_replicas)
    return [r for r in st.replicas if r not in removing]


def eligible_nodes(
    nodes: Mapping[int, md.NodeRegistration], stopping: Mapping[int, str] | None = None
) -> set[int]:
    """The nodes that may lead or join an ISR: registered and RUNNING, and not in a
    controlled shutdown (``stopping``: node id -> the incarnation that asked for it; a later
    incarnation of the node is not stopping)."""
    stopping = stopping or {}
    return {
        n
        for n, reg in nodes.items()
        if reg.state == md.NODE_STATE_RUNNING and stopping.get(n) != reg.incarnation_id
    }


def starting_nodes(nodes: Mapping[int, md.NodeRegistration]) -> set[int]:
    """Registered nodes still STARTING (not eligible yet, and not shutting down)."""
    return {n for n, reg in nodes.items() if reg.state == md.NODE_STATE_STARTING}


def initial_state(
    replicas: Sequence[int], eligible: Collection[int], topic_id: str
) -> md.PartitionState:
    """A new partition's state: the first eligible replica leads, the eligible ones are the
    ISR; ``replicas`` keeps its order, so the first one stays the preferred leader that a
    preferred election moves leadership back to.

    Why not simply the first replica: a node still STARTING (or shutting down) may be placed
    on but not elected, and a leader the next reconciliation has to move away cost a leader
    change and an under-replicated start. The others
    join the ISR once caught up, as after any restart. With no replica eligible (every one
    still starting) the first replica leads with all of them in the ISR, as before: a
    partition without a leader would wait for its last ISR member (:func:`reconcile`'s
    offline rule), and the first of them to be RUNNING takes over anyway.
    """
    isr = [r for r in replicas if r in eligible] or list(replicas)
    return md.PartitionState(
        replicas=replicas,
        leader=isr[0],
        leader_epoch=0,
        isr=isr,
        partition_epoch=0,
        leader_recovery_state=RECOVERED,
        topic_id=topic_id,
    )


def reconcile(
    st: md.PartitionState,
    alive: Collection[int],
    eligible: Collection[int],
    *,
    unclean: bool = False,
    auto_preferred: bool = False,
    starting: Collection[int] = (),
) -> Decision | None:
    """React to node liveness: dead nodes leave the ISR, a dead or stopping leader is replaced.

    A leader that is SHUTTING_DOWN (alive, not eligible) hands over to the next eligible ISR
    member; if there is none it keeps leading (it still serves). A leader in ``starting``
    (registered again but still STARTING: its previous process is gone) hands over the same
    way, counted as a failure, not a controlled shutdown. A dead leader with no eligible
    ISR member leaves the partition offline (leader -1, the ISR keeps its last member) unless
    ``unclean``: then the first eligible replica leads alone, RECOVERING. Followers that are
    dead or stopping leave the ISR. Then a finished reassignment completes and, with
    ``auto_preferred``, the preferred replica takes over when it is eligible and in sync.
    """
    new = _copy(st)
    old_leader = st.leader
    reason = FAILURE
    isr = [r for r in st.isr if r in alive]
    leader = old_leader if old_leader in isr else -1
    if leader >= 0 and leader not in eligible:
        # Stopping leader: hand over to an eligible in-sync member if one exists.
        other = next((r for r in _ordered(st, isr) if r in eligible and r != leader), -1)
        if other >= 0:
            leader = other
            reason = FAILURE if old_leader in starting else CONTROLLED_SHUTDOWN
    if leader < 0:
        leader = next((r for r in _ordered(st, isr) if r in eligible), -1)
    if leader >= 0:
        # Stopping followers leave the ISR (the leader stays in it whatever its state).
        isr = [r for r in isr if r == leader or r in eligible]
        _set(new.isr, _ordered(st, isr))
    elif unclean and (cand := next((r for r in st.replicas if r in eligible), -1)) >= 0:
        leader, reason = cand, UNCLEAN
        _set(new.isr, [cand])
        new.leader_recovery_state = RECOVERING
    else:
        # Offline: keep the last in-sync member, so that a clean election can happen when it
        # comes back (it has every committed record).
        last = (
            [r for r in isr if r in eligible]
            or isr
            or ([old_leader] if old_leader >= 0 and old_leader in st.isr else list(st.isr[-1:]))
        )
        _set(new.isr, _ordered(st, last[-1:]))
    new.leader = leader
    decision = _finish(st, new, reason)
    current = decision.state if decision else st
    follow = complete_reassignment(current, eligible)
    if follow is None and auto_preferred:
        follow = preferred(current, eligible)[0]
    if follow is None:
        return decision
    return _merge(st, decision, follow)


def _merge(st: md.PartitionState, first: Decision | None, second: Decision) -> Decision:
    """Two decisions applied one after the other, committed as one change of ``st``."""
    new = _copy(second.state)
    new.partition_epoch = st.partition_epoch + 1
    new.leader_epoch = st.leader_epoch + (1 if new.leader != st.leader else 0)
    reason = second.election or (first.election if first else None)
    if new.leader == st.leader:
        reason = None
    return Decision(new, reason)


def preferred(st: md.PartitionState, eligible: Collection[int]) -> tuple[Decision | None, int]:
    """Preferred-leader election: (decision, error code) — the first target replica leads."""
    wanted = targets(st)
    if not wanted:
        return None, E.PREFERRED_LEADER_NOT_AVAILABLE
    first = wanted[0]
    if st.leader == first:
        return None, E.ELECTION_NOT_NEEDED
    if first not in eligible or first not in st.isr:
        return None, E.PREFERRED_LEADER_NOT_AVAILABLE
    new = _copy(st)
    new.leader = first
    return _finish(st, new, PREFERRED), E.NONE


def preferred_unavailable_reason(st: md.PartitionState, eligible: Collection[int]) -> str:
    """Why :func:`preferred` answered PREFERRED_LEADER_NOT_AVAILABLE for ``st``, for the
    ElectLeaders result's message: the code alone names neither the replica nor what keeps it
    from leading, which is what an operator has to act on."""
    wanted = targets(st)
    if not wanted:
        return "the partition has no replicas"
    first = wanted[0]
    if first not in eligible:
        return f"preferred replica {first} is not running (down, starting or shutting down)"
    return f"preferred replica {first} is not in the ISR (it is still catching up)"


def unclean_election(
    st: md.PartitionState, alive: Collection[int], eligible: Collection[int]
) -> tuple[Decision | None, int]:
    """Elect a leader for a partition without one, accepting data loss if no ISR member lives."""
    if st.leader >= 0 and st.leader in eligible:
        return None, E.ELECTION_NOT_NEEDED
    decision = reconcile(st, alive, eligible, unclean=True)
    if decision is None or decision.state.leader < 0:
        return None, E.ELIGIBLE_LEADERS_NOT_AVAILABLE
    return decision, E.NONE


def controlled_shutdown(
    st: md.PartitionState, node: int, alive: Collection[int], eligible: Collection[int]
) -> Decision | None:
    """Node ``node`` is stopping: move its leadership away and take it out of the ISR."""
    return reconcile(st, alive, set(eligible) - {node})


def resign(
    st: md.PartitionState, eligible: Collection[int], reason: str = DAMAGED_REPLICA
) -> Decision | None:
    """The leader gives up leading (AlterPartition with an ISR without itself): data of its
    replica failed a check on read (``reason`` DAMAGED_REPLICA), so it serves errors where
    the other replicas hold the records, or its disk refused an append (STORAGE_ERROR: full
    or failing), so it refuses writes the others could take (Kafka takes such a log dir
    offline and moves its leaderships). The next eligible in-sync replica, in replica order,
    leads; the old leader leaves the ISR (it truncates at the damage, or waits for its
    appends to succeed, as a follower, then rejoins once caught up). None when no other
    eligible replica is in sync: nobody else has every committed record, so it keeps
    leading."""
    other = next((r for r in _ordered(st, st.isr) if r in eligible and r != st.leader), -1)
    if st.leader < 0 or other < 0:
        return None
    new = _copy(st)
    new.leader = other
    _set(new.isr, [r for r in _ordered(st, st.isr) if r != st.leader])
    return _finish(st, new, reason)


def original_replicas(st: md.PartitionState) -> list[int]:
    """The replicas a cancel returns to (those not being added), in their order before the
    reassignment started.

    ``replicas`` holds the target's order during a move, so the order comes from
    ``original_replicas``; a replica missing there (a leader kept while a move replaced the
    one adding it; any replica of a state written before the field existed) keeps its place
    relative to the others, after them.
    """
    adding = set(st.adding_replicas)
    kept = [r for r in st.replicas if r not in adding]
    order = {r: i for i, r in enumerate(st.original_replicas)}
    return sorted(kept, key=lambda r: order.get(r, len(order)))


def start_reassignment(
    st: md.PartitionState, target: Sequence[int], eligible: Collection[int]
) -> Decision | None:
    """Begin moving to ``target`` (KIP-455): replicas = target + the removed originals.

    The originals' order is kept in ``original_replicas`` for a cancel (a move replacing
    another keeps the first one's originals).
    """
    original = original_replicas(st)
    new = _copy(st)
    adding = [r for r in target if r not in original]
    removing = [r for r in original if r not in target]
    _set(new.replicas, [*target, *removing])
    _set(new.adding_replicas, adding)
    _set(new.removing_replicas, removing)
    _set(new.isr, _ordered(new, set(st.isr)))
    if st.leader >= 0 and st.leader not in new.replicas:
        # The leader was being added by the move this one replaces: it stays (as a replica
        # being removed) and keeps leading until the new targets are in sync.
        removing.append(st.leader)
        _set(new.replicas, [*target, *removing])
        _set(new.removing_replicas, removing)
        _set(new.isr, _ordered(new, set(st.isr)))
    if new.adding_replicas or new.removing_replicas:
        _set(new.original_replicas, original)
    else:
        new.ClearField("original_replicas")
    first = _finish(st, new, REASSIGNMENT)
    current = first.state if first else st
    done = complete_reassignment(current, eligible)
    if done is None:
        return first
    return _merge(st, first, done)


def cancel_reassignment(
    st: md.PartitionState, eligible: Collection[int], *, unclean_allowed: bool = False
) -> tuple[Decision | None, int]:
    """Revert to the original replicas (those not being added), in their original order: the
    preferred leader is the one before the move, and an in-sync leader keeps leading.

    Refused (INVALID_REPLICA_ASSIGNMENT) when every in-sync replica is one the move is adding
    and the topic does not allow unclean elections (``unclean_allowed``): the revert would
    drop the only copies with every acknowledged record and leave the originals, which are
    behind, without a clean leader for good (Kafka's revert refuses it the same way, "it
    would require an unclean leader election")."""
    if not st.adding_replicas and not st.removing_replicas:
        return None, E.NO_REASSIGNMENT_IN_PROGRESS
    original = original_replicas(st)
    if st.isr and not set(st.isr) & set(original) and not unclean_allowed:
        return None, E.INVALID_REPLICA_ASSIGNMENT
    new = _copy(st)
    _set(new.replicas, original)
    new.ClearField("adding_replicas")
    new.ClearField("removing_replicas")
    new.ClearField("original_replicas")
    isr = [r for r in st.isr if r in set(original)]
    leader = st.leader if st.leader in isr else -1
    if leader < 0:
        leader = next((r for r in _ordered(new, isr) if r in eligible), -1)
    if not isr:
        isr = list(st.isr[-1:]) if st.isr and st.isr[-1] in set(original) else []
    _set(new.isr, _ordered(new, set(isr)))
    new.leader = leader
    if leader >= 0 and leader not in new.isr:
        new.isr.append(leader)
        _set(new.isr, _ordered(new, set(new.isr)))
    return _finish(st, new, REASSIGNMENT), E.NONE


def complete_reassignment(st: md.PartitionState, eligible: Collection[int]) -> Decision | None:
    """Finish a reassignment whose targets are all in the ISR: drop the removed replicas."""
    if not st.adding_replicas and not st.removing_replicas:
        return None
    wanted = targets(st)
    if not wanted or not set(wanted) <= set(st.isr):
        return None
    leader = st.leader
    if leader not in wanted:
        leader = next((r for r in wanted if r in eligible and r in st.isr), -1)
        if leader < 0:
            return None  # nobody to lead the new set yet: wait
    new = _copy(st)
    _set(new.replicas, wanted)
    new.ClearField("adding_replicas")
    new.ClearField("removing_replicas")
    new.ClearField("original_replicas")
    _set(new.isr, [r for r in wanted if r in set(st.isr)])
    new.leader = leader
    return _finish(st, new, REASSIGNMENT)


def check_invariants(st: md.PartitionState) -> None:
    """Raise AssertionError if ``st`` breaks leader ∈ ISR ⊆ replicas (for tests and debug)."""
    replicas = list(st.replicas)
    assert len(set(replicas)) == len(replicas), replicas
    assert set(st.isr) <= set(replicas), (list(st.isr), replicas)
    assert st.leader == -1 or st.leader in st.isr, (st.leader, list(st.isr))
    assert set(st.adding_replicas) <= set(replicas)
    assert set(st.removing_replicas) <= set(replicas)
    assert set(st.original_replicas) <= set(replicas)
    if not st.adding_replicas and not st.removing_replicas:
        assert not st.original_replicas, list(st.original_replicas)
