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
   from its own rack), then nodes paired least often with this leader, so that partitions
   with the same leader get different followers and a failed node's leaderships spread over
   several nodes. A node on a rack that already holds a replica is skipped until every rack
   holds one: with at least as many racks as replicas, every partition spans ``RF`` racks.

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
        left -= 1
        led_left[leader] -= 1
        rack_led_left[rack_of[leader]] -= 1
        out.append(replicas)
    _vary_followers(out, rack_of)
    return out


def _vary_followers(out: list[list[int]], rack_of: Mapping[int, str]) -> None:
    """Give a leader whose partitions all got the same followers another set, in place.

    Placing by counts first can leave that (a node's failure then moves all its leaderships
    to the same few nodes). Swapping a follower of its last partition with a follower of
    another leader's partition, same rack, keeps every count and every rack spread.
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
                for i in range(1, len(a))
                for j in range(1, len(b))
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
