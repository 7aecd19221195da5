"""Replica placement for new topics and partitions: a pure engine (no gRPC, no etcd).

The layout follows the goals of Kafka's placements (``AdminUtils.assignReplicasToBrokers``
and KRaft's ``StripedReplicaPlacer``) but balances by counts rather than by a fixed stride, so
it also stays even when the partitions do not divide evenly over the nodes:

1. Nodes are interleaved by rack (rack ``a``'s first node, rack ``b``'s first node, ...,
   rack ``a``'s second node, ...), Kafka's order; it is the rotation that breaks ties.
2. Leaders (first replicas) first: every node leads ``floor`` or ``ceil`` of
   ``partitions / nodes`` of the new partitions, whatever the load elsewhere, because a
   topic's traffic goes to its leaders and one topic piled onto the emptiest node (say a node
   just added) would make that node the topic's bottleneck. The existing load
   (``leader_load``: partitions each node is preferred leader of) decides which nodes take
   the leaderships that do not divide evenly, then the rotation from ``start_index``.
3. Followers: every node ends up with ``floor`` or ``ceil`` of ``partitions * RF / nodes``
   of the new replicas (the ``ceil`` going to those holding the fewest, ``replica_load``).
   Each partition takes the most urgent nodes first, the ones with the least room left to
   get their share (a node cannot follow the partitions it leads, or, rack-aware, those led
   from its own rack), then nodes paired least often with this leader. A node on a rack that
   already holds a replica is skipped until every rack holds one: with at least as many
   racks as replicas, every partition spans ``RF`` racks.
4. Follower order: the first follower is the failover target (the controller elects the
   first in-sync replica in replica order), so each leader's partitions spread their first
   followers evenly, within one, over the nodes that may follow it, and a failed node's
   leaderships spread over the others, as Kafka's ``nextReplicaShift`` rotation does. With
   as many replicas as nodes every partition has the same followers and only their order
   can do that. Followers are reordered, then exchanged between partitions where counting
   left a leader uneven, keeping every count and rack spread (so where racks of unequal
   size, or with RF 2 existing loads, fix the counts, the spread is only as even as they
   allow). The existing pairs (``first_load``) break ties, so that small topics alternate
   a leader's first follower from topic to topic.

Without racks the counts are always within one of each other; with racks of unequal size
(or more replicas than racks) rack spread comes first and the counts are as even as it
allows. Everything is deterministic: the same inputs give the same placement (the controller
derives the rotations from cluster state rather than from a random number so tests and reruns
can predict it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from strom.errors import InvalidPartitionsError, InvalidReplicationFactorError


@dataclass(frozen=True)
class PlacementNode:
    """A node that may receive replicas: its id and rack (None when not configured)."""

    node_id: int
    rack: str | None = None


def rack_alternated(nodes: Iterable[PlacementNode]) -> list[int]:
    """Node ids interleaved by rack: one node of each rack in turn (Kafka's order).

    Racks are sorted by name and nodes within a rack by id, so the result does not depend on
    the input order. Nodes without a rack form one rack of their own when others have racks;
    when no node has a rack the result is simply the ids in ascending order.
    """
    by_rack: dict[str, list[int]] = {}
    for node in nodes:
        by_rack.setdefault(node.rack or "", []).append(node.node_id)
    for ids in by_rack.values():
        ids.sort()
    racks = sorted(by_rack)
    out: list[int] = []
    depth = max((len(v) for v in by_rack.values()), default=0)
    for i in range(depth):
        for rack in racks:
            ids = by_rack[rack]
            if i < len(ids):
                out.append(ids[i])
    return out


def assign_replicas(
    nodes: Sequence[PlacementNode],
    num_partitions: int,
    replication_factor: int,
    *,
    start_index: int = 0,
    shift: int = 0,
    leader_load: Mapping[int, int] | None = None,
    replica_load: Mapping[int, int] | None = None,
    first_load: Mapping[tuple[int, int], int] | None = None,
) -> list[list[int]]:
    """Replica lists (first = preferred leader) for ``num_partitions`` new partitions.

    Args:
        nodes: the nodes eligible for new replicas (live, not shutting down); distinct ids.
        num_partitions: how many partitions to place (>= 1).
        replication_factor: replicas per partition (1 .. len(nodes)).
        start_index: where the leader rotation starts in the rack-alternated node list (the
            last tie-break, so that successive topics do not all start on the same node).
        shift: where each leader's follower rotation starts, past the leader (the last
            tie-break for followers, so that successive topics vary their leader-follower
            pairs).
        leader_load: how many existing partitions each node is preferred leader of; decides
            which nodes take the leaderships that do not divide evenly. None = all equal.
        replica_load: how many existing replicas each node holds; likewise for followers.
        first_load: how many existing partitions each (preferred leader, first follower)
            pair has; where the new partitions' own spread leaves a choice, their first
            followers go to the nodes least often first behind the same leader, so that
            topics of a few partitions each (one partition: nothing to spread inside the
            topic) still spread a node's failover targets over the others. None = none.

    Raises:
        InvalidPartitionsError: num_partitions < 1.
        InvalidReplicationFactorError: replication_factor < 1 or more than the nodes given.
        ValueError: a node id appears twice (a caller bug).
    """
    if num_partitions < 1:
        raise InvalidPartitionsError(
            f"number of partitions must be at least 1, not {num_partitions}"
        )
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"replication factor must be at least 1, not {replication_factor}"
        )
    ids = [node.node_id for node in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate node ids in {sorted(ids)}")
    n = len(ids)
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the number of live nodes "
            f"({n}{': ' + ', '.join(map(str, sorted(ids))) if ids else ''})"
        )
    rack_of = {node.node_id: node.rack or "" for node in nodes}
    arranged = rack_alternated(nodes)
    index = {nid: k for k, nid in enumerate(arranged)}
    num_racks = len(set(rack_of.values()))

    # Leaders first: each node leads floor or ceil of P / n, the ceil going to the nodes
    # with the fewest existing leaderships.
    led = dict.fromkeys(arranged, 0)
    led_total = {nid: (leader_load or {}).get(nid, 0) for nid in arranged}
    leaders: list[int] = []
    pos = start_index % n
    for _ in range(num_partitions):
        leader = min(arranged, key=lambda x: (led[x], led_total[x], (index[x] - pos) % n))
        pos = index[leader] + 1
        led[leader] += 1
        led_total[leader] += 1
        leaders.append(leader)

    # Followers. Each node's share is floor or ceil of P * RF / n replicas (a ceil first to
    # nodes that lead more than the floor, then to those holding the fewest). A partition
    # takes the most urgent nodes first, those with the least room left to get their share:
    # the last partitions' leaders are fixed, and a node that cannot follow them (it leads
    # them, or they are led from its rack) must have got its share before.
    total = num_partitions * replication_factor
    base, extra = divmod(total, n)
    replica_load = replica_load or {}
    by_claim = sorted(
        arranged,
        key=lambda x: (led[x] <= base, replica_load.get(x, 0), (index[x] - start_index) % n),
    )
    need = {x: base - led[x] for x in arranged}
    for x in by_claim[:extra]:
        need[x] += 1

    # Room left: of the partitions still to place (the current one included), how many a
    # node can follow beyond the replicas it still needs. With no more replicas than racks a
    # partition has at most one replica per rack: a node cannot follow partitions led from
    # its own rack, and a rack's nodes share one slot in each of the others, so a rack has a
    # room left too. With more replicas than racks only the node's own partitions are out.
    one_per_rack = replication_factor <= num_racks
    left = num_partitions
    led_left = dict(led)
    rack_led_left = dict.fromkeys(rack_of.values(), 0)
    rack_need = dict.fromkeys(rack_of.values(), 0)
    for x in arranged:
        rack_led_left[rack_of[x]] += led[x]
        rack_need[rack_of[x]] += max(need[x], 0)

    def room(x: int) -> tuple[int, int]:
        if not one_per_rack:
            return 0, left - led_left[x] - need[x]
        out_of_reach = left - rack_led_left[rack_of[x]]
        return out_of_reach - rack_need[rack_of[x]], out_of_reach - need[x]

    held_total = {x: replica_load.get(x, 0) + led[x] for x in arranged}
    pairs: dict[tuple[int, int], int] = {}
    firsts = dict(first_load or {})
    out: list[list[int]] = []
    for leader in leaders:
        replicas = [leader]
        racks_used = {rack_of[leader]}
        first = index[leader] + 1 + shift
        while len(replicas) < replication_factor:
            new_rack = len(racks_used) < num_racks  # another rack still has no replica
            follower = min(
                (
                    x
                    for x in arranged
                    if x not in replicas and not (new_rack and rack_of[x] in racks_used)
                ),
                key=lambda x: (
                    need[x] <= 0,
                    room(x),
                    pairs.get((leader, x), 0),
                    held_total[x],
                    (index[x] - first) % n,
                ),
            )
            replicas.append(follower)
            racks_used.add(rack_of[follower])
            pairs[leader, follower] = pairs.get((leader, follower), 0) + 1
            if need[follower] > 0:
                rack_need[rack_of[follower]] -= 1
            need[follower] -= 1
            held_total[follower] += 1
        # The follower first behind this leader least often goes first: the failover target.
        if len(replicas) > 1:
            head = min(
                replicas[1:], key=lambda x: (firsts.get((leader, x), 0), (index[x] - first) % n)
            )
            replicas.remove(head)
            replicas.insert(1, head)
            firsts[leader, head] = firsts.get((leader, head), 0) + 1
        left -= 1
        led_left[leader] -= 1
        rack_led_left[rack_of[leader]] -= 1
        out.append(replicas)
    # Counting first can still leave a leader's first followers uneven (with few replicas the
    # urgent nodes decide them): moves that keep the counts as even as they are fix that.
    claim = {x: (led[x] <= base, replica_load.get(x, 0)) for x in arranged}
    _balance_first_followers(out, rack_of, one_per_rack, claim)
    _vary_followers(out, rack_of)
    return out


# How many partitions a move of _balance_first_followers looks at for each kind of step before
# it gives up: a bound on the work for a leader that cannot be balanced (racks of unequal size
# or existing loads can make that impossible), not a limit that balanced inputs reach.
_EXCHANGE_SCAN = 64


def _balance_first_followers(
    out: list[list[int]],
    rack_of: Mapping[int, str],
    one_per_rack: bool,
    claim: Mapping[int, object],
) -> None:
    """Spread each leader's first followers evenly over the nodes that may follow it, in place.

    The first follower is where a partition's leadership goes when its leader fails (the
    controller elects the first in-sync replica in replica order), so a node whose partitions
    all had the same first follower would hand all its leaderships to one node. Choosing
    followers by counts cannot see that, and with as many replicas as nodes every partition
    has the same followers anyway: only their order differs. So, for a leader with a node
    ``a`` first in at least two more of its partitions than a node ``b``, one of those
    partitions gets ``b`` first, by the first of these that applies:

    1. the partition holds ``b`` already: ``b`` and ``a`` change places;
    2. one of its followers ``c`` changes places with ``b`` in another partition that does not
       hold ``c``, if that does not unbalance the other partition's leader as much;
    3. one of its followers ``c`` is replaced by ``b`` when ``c`` holds one replica more than
       ``b`` and both had the same claim to it (``claim``: the keys that chose which nodes
       hold one more), so the counts stay within one and go where they would have;
    4. as 2 or 3 through a chain of partitions: b gives its place in one to a node that gives
       its place in another ..., until c or a node like c in 3 takes the last place.

    Every move keeps the rack spread of the partitions it changes and lowers the sum over
    leaders and nodes of (partitions the node is first follower of)^2, so this ends. It
    cannot always get within one: with racks of unequal size, or when existing loads decide
    which nodes hold one replica more and RF is 2 (the first follower is the only one), the
    counts come first.
    """
    if not out or len(out[0]) < 2:
        return
    firsts: dict[tuple[int, int], int] = {}
    by_first: dict[tuple[int, int], dict[int, None]] = {}  # insertion-ordered sets
    rest: dict[int, dict[int, None]] = {x: {} for x in rack_of}  # as a later follower
    held = dict.fromkeys(rack_of, 0)
    for k, r in enumerate(out):
        firsts[r[0], r[1]] = firsts.get((r[0], r[1]), 0) + 1
        by_first.setdefault((r[0], r[1]), {})[k] = None
        for x in r[2:]:
            rest[x][k] = None
        for x in r:
            held[x] += 1
    nodes = sorted(rack_of)
    leaders = sorted({r[0] for r in out})
    may_follow = {
        leader: [
            x for x in nodes if x != leader and not (one_per_rack and rack_of[x] == rack_of[leader])
        ]
        for leader in leaders
    }

    # Leaders to look at: all, then those whose first followers another's move changed.
    todo = dict.fromkeys(leaders)

    def f(leader: int, x: int) -> int:
        return firsts.get((leader, x), 0)

    def reindex(k: int, d: int) -> None:
        """Remove (d = -1) or add (d = 1) partition k in the indexes."""
        r = out[k]
        firsts[r[0], r[1]] = f(r[0], r[1]) + d
        if d > 0:
            by_first.setdefault((r[0], r[1]), {})[k] = None
            for x in r[2:]:
                rest[x][k] = None
        else:
            del by_first[r[0], r[1]][k]
            for x in r[2:]:
                del rest[x][k]

    def keeps_racks(r: list[int], old: int, new: int) -> bool:
        """Whether r spans as many racks with new in the place of old."""
        if rack_of[old] == rack_of[new]:
            return True
        others = [rack_of[x] for x in r if x != old]
        return rack_of[new] not in others or rack_of[old] in others

    def change(k: int, i: int, b: int, m: int | None = None, j: int = 0) -> None:
        """Put b first in partition k, in the place of its follower at i, which goes to
        partition m in the place of b (at j) or, without m, leaves."""
        p = out[k]
        reindex(k, -1)
        if m is not None:
            reindex(m, -1)
            out[m][j] = p[i]
            reindex(m, 1)
            if j == 1:
                todo[out[m][0]] = None
        else:
            held[p[i]] -= 1
            held[b] += 1
        if b in p:
            i = p.index(b)
        else:
            p[i] = b
        p[1], p[i] = p[i], p[1]
        reindex(k, 1)

    def exchange_partners(leader: int, b: int, c: int, gain: int) -> Iterable[int]:
        """Partitions that may give b for c: b a later follower (no first changes), then b
        the first follower of a leader that loses less than ``gain`` by it."""
        yield from rest[b]
        for other in leaders:
            if other not in (leader, c) and 2 * (f(other, c) - f(other, b)) + 2 < gain:
                yield from by_first.get((other, b), {})

    def move(leader: int, a: int, b: int) -> bool:
        mine = list(by_first.get((leader, a), {}))
        for k in mine:  # 1. b is in the partition already
            if b in out[k]:
                change(k, 1, b)
                return True
        gain = 2 * (f(leader, a) - f(leader, b)) - 2  # how much the sum of squares drops
        # Moves 2 to 4 depend on the partition only through c and the racks of its other
        # replicas: one partition of each kind is enough (of the first few: a leader's
        # partitions with the same first follower have few kinds).
        kinds: dict[tuple[int, tuple[str, ...]], tuple[int, int]] = {}
        for k in mine[:_EXCHANGE_SCAN]:
            p = out[k]
            for i in range(1, len(p)):
                if keeps_racks(p, p[i], b):
                    kind = (p[i], tuple(sorted(rack_of[x] for x in p if x != p[i])))
                    kinds.setdefault(kind, (k, i))
        for k, i in kinds.values():  # 2. exchange a follower c for b with another partition
            c = out[k][i]
            for scanned, m in enumerate(exchange_partners(leader, b, c, gain)):
                if scanned == _EXCHANGE_SCAN:
                    break
                q = out[m]
                if c not in q and keeps_racks(q, b, c):
                    change(k, i, b, m, q.index(b))
                    return True
        for k, i in kinds.values():  # 3. b takes the place of a follower c holding one more
            c = out[k][i]
            if held[c] == held[b] + 1 and claim[c] == claim[b]:
                change(k, i, b)
                return True
        for k, i in kinds.values():  # 4. as 2 or 3, through a chain of other partitions
            if (steps := chain(leader, k, b, out[k][i])) is not None:
                change(k, i, b)
                for m, j, y in steps:
                    x = out[m][j]
                    reindex(m, -1)
                    out[m][j] = y
                    reindex(m, 1)
                    held[x] -= 1
                    held[y] += 1
                    if j == 1:
                        todo[out[m][0]] = None
                return True
        return False

    def chain(leader: int, k: int, b: int, c: int) -> list[tuple[int, int, int]] | None:
        """Replacements (partition, position, new node) that take one replica from b and
        give one to c (or to a node with c's claim holding one fewer than c), each in another
        partition, none unbalancing a leader's first followers; found breadth first."""
        came: dict[int, tuple[int, int, int] | None] = {b: None}  # node -> (from, m, j)
        frontier = [b]
        while frontier:
            nxt: list[int] = []
            for x in frontier:
                steps: list[tuple[int, int, int]] = []
                y = x
                while (back := came[y]) is not None:
                    steps.append((back[1], back[2], y))
                    y = back[0]
                used = {m for m, _, _ in steps} | {k}
                moved = {out[m][0] for m, j, _ in steps if j == 1} | {leader}
                partners = list(rest[x])[:_EXCHANGE_SCAN] + [
                    m for other in leaders for m in list(by_first.get((other, x), {}))[:2]
                ]
                for m in partners:
                    q = out[m]
                    if m in used:
                        continue
                    j = q.index(x)
                    if j == 1 and q[0] in moved:
                        continue
                    for y in nodes:
                        if y in came or y in q or not keeps_racks(q, x, y):
                            continue
                        if j == 1 and f(q[0], x) < f(q[0], y) + 1:
                            continue
                        came[y] = (x, m, j)
                        if y == c or (held[c] == held[y] + 1 and claim[c] == claim[y]):
                            path = []
                            while (back := came[y]) is not None:
                                path.append((back[1], back[2], y))
                                y = back[0]
                            return path[::-1]
                        nxt.append(y)
            frontier = nxt
        return None

    def balance(leader: int) -> bool:
        """One move for the leader, most used and least used first; False: none left."""
        order = sorted(may_follow[leader], key=lambda x: f(leader, x))
        for a in reversed(order):
            for b in order:
                if f(leader, a) - f(leader, b) < 2:
                    break  # the rest are closer still
                if move(leader, a, b):
                    return True
        return False

    while todo:
        leader = next(iter(todo))
        del todo[leader]
        while may_follow[leader] and balance(leader):
            pass


def _vary_followers(out: list[list[int]], rack_of: Mapping[int, str]) -> None:
    """Give a leader whose partitions all got the same followers another set, in place.

    Placing by counts first can leave that (a node's failure then moves all its leaderships
    to the same few nodes). Swapping a later follower (not the first) of its last partition
    with a later follower of another leader's partition, same rack, keeps every count, every
    rack spread and every first follower (:func:`_balance_first_followers`).
    """
    by_leader: dict[int, list[list[int]]] = {}
    for replicas in out:
        by_leader.setdefault(replicas[0], []).append(replicas)
    for leader, mine in by_leader.items():
        if len(mine) < 2 or len({frozenset(r[1:]) for r in mine}) > 1:
            continue
        a = mine[-1]
        swap = next(
            (
                (b, i, j)
                for b in out
                if b[0] != leader
                for i in range(2, len(a))
                for j in range(2, len(b))
                if b[j] not in a and a[i] not in b and rack_of[a[i]] == rack_of[b[j]]
            ),
            None,
        )
        if swap is not None:
            b, i, j = swap
            a[i], b[j] = b[j], a[i]


def leader_counts(replica_lists: Iterable[Sequence[int]]) -> dict[int, int]:
    """How many of the given partitions each node is preferred leader of."""
    counts: dict[int, int] = {}
    for replicas in replica_lists:
        if replicas:
            counts[replicas[0]] = counts.get(replicas[0], 0) + 1
    return counts
