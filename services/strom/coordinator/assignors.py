"""Server-side partition assignors for consumer groups (DESIGN §7, KIP-848): a pure engine.

With KIP-848 the coordinator, not a client, decides who consumes what: whenever the group
epoch moves (a member joins, leaves or changes its subscription, or a subscribed topic gains
partitions) the group recomputes its *target assignment* with one of these assignors, and then
moves each member towards it incrementally (see :mod:`strom.coordinator.group`). The assignor
itself only maps "members and their subscriptions" to "member -> partitions"; it knows nothing
about epochs, revocation or time, which is what keeps it small and testable on its own.

Two assignors, named as in Kafka:

* ``uniform`` (the default): **balanced** -- members' partition counts differ by at most one
  when they subscribe to the same topics -- and **sticky** -- a member keeps every partition
  of its current target it may keep, so a join or a leave moves only what balance requires
  (every moved partition is one the consumer has to stop, commit and hand over, so moves are
  the cost to minimise). It also handles members with different subscriptions: constrained
  topics (fewer subscribers) are placed first, then partitions move from the most to the
  least loaded eligible member until no move reduces the imbalance.
* ``range``: Kafka's RangeAssignor: for each topic its subscribers, sorted by member id, get
  contiguous ranges of partitions, the first ``count % n`` members one more. Deterministic and
  easy to predict (co-partitioned topics land together), but neither sticky nor balanced
  across topics.

Both are deterministic: the same members, subscriptions, current assignments and partition
counts always give the same result, whatever the input order. That matters because a
coordinator that takes a shard over recomputes from replayed state and must not reshuffle.

Members beyond the partition count get nothing (an empty assignment) and stay idle.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from strom.errors import UnsupportedAssignorError

#: topic -> partitions, ascending. The shape of one member's assignment everywhere in the
#: coordinator (target, current, what a heartbeat response carries).
Assignment = dict[str, list[int]]


@dataclass(frozen=True)
class MemberSpec:
    """What an assignor knows about one member.

    Attributes:
        member_id: the member's id; the tie-breaker of every deterministic choice.
        topics: the topic names the member is subscribed to, already resolved (a regex
            subscription expanded against the topic list). Topics that do not exist (not in
            the ``topics`` argument of :meth:`Assignor.assign`) are ignored.
        assignment: the member's current *target* assignment (topic -> partitions), the
            starting point for stickiness; partitions it may no longer have (topic
            unsubscribed, partition beyond the count, claimed twice) are ignored.
        instance_id: group.instance.id of a static member, None for dynamic members.
        rack_id: the consumer's rack, None when unknown (not used by these assignors yet).
    """

    member_id: str
    topics: frozenset[str]
    assignment: Mapping[str, Collection[int]] = field(default_factory=dict)
    instance_id: str | None = None
    rack_id: str | None = None


class Assignor(Protocol):
    """A server-side assignor: maps members and partition counts to a target assignment."""

    #: The name members ask for in ``server_assignor`` ("uniform", "range").
    name: str

    def assign(
        self, members: Sequence[MemberSpec], topics: Mapping[str, int]
    ) -> dict[str, Assignment]:
        """The target assignment: every member id -> {topic: ascending partitions}.

        Every member appears in the result (with ``{}`` when it gets nothing); topics with no
        partitions assigned to a member are left out of its dict. Every partition of a topic
        that at least one member subscribes to is assigned to exactly one such subscriber.
        """
        ...


def _subscribers(members: Sequence[MemberSpec], topics: Mapping[str, int]) -> dict[str, list[str]]:
    """topic -> sorted ids of the members subscribed to it (existing, non-empty topics only)."""
    subs: dict[str, list[str]] = {}
    for m in sorted(members, key=lambda m: m.member_id):
        for t in m.topics:
            if topics.get(t, 0) > 0:
                subs.setdefault(t, []).append(m.member_id)
    return subs


def _check_unique(members: Sequence[MemberSpec]) -> None:
    ids = [m.member_id for m in members]
    if len(set(ids)) != len(ids):
        raise ValueError("member ids must be unique")


def _result(owned: Mapping[str, Mapping[str, set[int]]]) -> dict[str, Assignment]:
    return {
        mid: {t: sorted(ps) for t, ps in sorted(by_topic.items()) if ps}
        for mid, by_topic in owned.items()
    }


class UniformAssignor:
    """Balanced and sticky (Kafka's ``uniform``); see the module docstring for the why.

    Algorithm (deterministic; ``n`` members, ``P`` partitions):

    1. **Keep**: each member, in member-id order, keeps the partitions of its current target
       that it may still have (subscribed, existing, not already kept by a member earlier in
       the order). Nothing moves yet.
    2. **Place** the partitions nobody kept: topics with the fewest subscribers first (they
       have the fewest choices), each partition to the eligible member with the fewest
       partitions so far (ties by member id), with a heap per topic.
    3. **Balance**: one move at a time, take the most loaded member that has a partition some
       eligible member with at least two fewer could take, and give its highest-numbered such
       partition to the least loaded of those members; stop when no such move exists. Each
       move lowers the sum of squared counts, so this ends; when all members subscribe to the
       same topics it ends with counts within one of each other. Because the giver is always
       the most loaded, members only lose what balance takes from them and never pass
       partitions among themselves: a join moves only the partitions the new member gets, a
       leave only the leaver's (the property tests check both).

    Cost: O(P log n) to place plus, per move, a sort of the n members and a scan of the giver's
    topics' subscribers; a 100-member group on 1,000 partitions is assigned in milliseconds.
    """

    name = "uniform"

    def assign(
        self, members: Sequence[MemberSpec], topics: Mapping[str, int]
    ) -> dict[str, Assignment]:
        """See :meth:`Assignor.assign`."""
        _check_unique(members)
        subs = _subscribers(members, topics)
        ordered = sorted(members, key=lambda m: m.member_id)
        owned: dict[str, dict[str, set[int]]] = {m.member_id: {} for m in ordered}
        count: dict[str, int] = dict.fromkeys(owned, 0)
        taken: set[tuple[str, int]] = set()

        # 1. Keep what may be kept.
        for m in ordered:
            for t in sorted(m.assignment):
                if t not in m.topics or t not in subs:
                    continue
                n = topics[t]
                for p in sorted(m.assignment[t]):
                    if 0 <= p < n and (t, p) not in taken:
                        taken.add((t, p))
                        owned[m.member_id].setdefault(t, set()).add(p)
                        count[m.member_id] += 1

        effective = {frozenset(t for t in m.topics if t in subs) for m in ordered}
        if len(effective) == 1:
            # Everyone subscribes to the same (existing) topics: the common case, and the one
            # the quota shortcut makes O(P log n) however much has to move.
            self._fill_to_quotas(owned, count, taken, subs, topics)
            return _result(owned)

        # 2. Place the rest, most constrained topics first.
        for t in sorted(subs, key=lambda t: (len(subs[t]), t)):
            free = [p for p in range(topics[t]) if (t, p) not in taken]
            if not free:
                continue
            heap = [(count[mid], mid) for mid in subs[t]]
            heapq.heapify(heap)
            for p in free:
                c, mid = heapq.heappop(heap)
                owned[mid].setdefault(t, set()).add(p)
                count[mid] = c + 1
                heapq.heappush(heap, (c + 1, mid))

        # 3. Balance: one move at a time, from the most loaded member that can give to an
        # eligible member with at least two fewer (the least loaded such member).
        while True:
            move: tuple[int, str, str, str] | None = None
            for a in sorted(count, key=lambda mid: (-count[mid], mid)):
                if count[a] < 2:
                    break  # nobody below can be two ahead of anyone
                for t in sorted(owned[a]):
                    if not owned[a][t]:
                        continue
                    for b in subs[t]:
                        if b != a and count[b] <= count[a] - 2:
                            cand = (count[b], b, a, t)
                            if move is None or cand < move:
                                move = cand
                if move is not None:
                    break
            if move is None:
                break
            _, b, a, t = move
            p = max(owned[a][t])
            owned[a][t].discard(p)
            owned[b].setdefault(t, set()).add(p)
            count[a] -= 1
            count[b] += 1
        return _result(owned)

    @staticmethod
    def _fill_to_quotas(
        owned: dict[str, dict[str, set[int]]],
        count: dict[str, int],
        taken: set[tuple[str, int]],
        subs: Mapping[str, list[str]],
        topics: Mapping[str, int],
    ) -> None:
        """Steps 2 and 3 when all members share one subscription, by quotas.

        With ``P`` partitions and ``n`` members each member's quota is ``P // n``, and the
        ``P % n`` members keeping the most get one more (ties by member id), so that as few
        partitions as possible exceed a quota. Members above their quota give up their
        highest partitions; the freed and the unowned partitions then go, in (topic,
        partition) order, to the member furthest below its quota. This is the outcome of the
        general balancing loop, computed directly.
        """
        ids = sorted(count)
        total = sum(topics[t] for t in subs)
        per, extra = divmod(total, len(ids))
        by_kept = sorted(ids, key=lambda mid: (-count[mid], mid))
        quota = {mid: per + (1 if i < extra else 0) for i, mid in enumerate(by_kept)}
        for mid in ids:
            excess = count[mid] - quota[mid]
            if excess <= 0:
                continue
            held = sorted((t, p) for t, ps in owned[mid].items() for p in ps)
            for t, p in held[-excess:]:
                owned[mid][t].discard(p)
                taken.discard((t, p))
            count[mid] = quota[mid]
        pool = [(t, p) for t in sorted(subs) for p in range(topics[t]) if (t, p) not in taken]
        heap = [(count[mid], mid) for mid in ids if count[mid] < quota[mid]]
        heapq.heapify(heap)
        for t, p in pool:
            c, mid = heapq.heappop(heap)
            owned[mid].setdefault(t, set()).add(p)
            count[mid] = c + 1
            if c + 1 < quota[mid]:
                heapq.heappush(heap, (c + 1, mid))


class RangeAssignor:
    """Kafka's RangeAssignor: contiguous ranges per topic over members sorted by member id.

    For a topic with ``P`` partitions and ``n`` subscribers, each subscriber gets ``P // n``
    consecutive partitions and the first ``P % n`` (in member-id order) one more. Members that
    subscribe to the same topics with the same partition counts therefore get the same
    partition numbers of each (co-partitioning), which is why people pick it; the price is
    that the first members carry the remainder of every topic and that a join shifts every
    range (no stickiness).
    """

    name = "range"

    def assign(
        self, members: Sequence[MemberSpec], topics: Mapping[str, int]
    ) -> dict[str, Assignment]:
        """See :meth:`Assignor.assign`."""
        _check_unique(members)
        subs = _subscribers(members, topics)
        owned: dict[str, dict[str, set[int]]] = {m.member_id: {} for m in members}
        for t, mids in subs.items():
            per, extra = divmod(topics[t], len(mids))
            start = 0
            for i, mid in enumerate(mids):
                size = per + (1 if i < extra else 0)
                if size:
                    owned[mid][t] = set(range(start, start + size))
                start += size
        return _result(owned)


#: The default assignor, used when no member asks for one.
DEFAULT_ASSIGNOR = "uniform"

#: Every server-side assignor by name.
ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}


def get_assignor(name: str | None) -> Assignor:
    """The assignor called ``name`` (the default for None or "").

    Raises:
        UnsupportedAssignorError: no assignor has that name.
    """
    if not name:
        return ASSIGNORS[DEFAULT_ASSIGNOR]
    try:
        return ASSIGNORS[name]
    except KeyError:
        known = ", ".join(sorted(ASSIGNORS))
        raise UnsupportedAssignorError(
            f"server assignor {name!r} is not supported (known: {known})"
        ) from None
