"""Replica placement for new topics and partitions: a pure engine (no gRPC, no etcd).

The algorithm is Kafka's rack-aware round robin (``AdminUtils.assignReplicasToBrokers``), so
operators get the layout they expect:

1. Nodes are interleaved by rack (rack ``a``'s first node, rack ``b``'s first node, ...,
   rack ``a``'s second node, ...), so that walking the list visits racks in turn.
2. Partition ``i``'s leader (first replica) is the next node in that list after the previous
   partition's leader, starting at ``start_index``: leaders rotate over every node, so each
   node leads ``ceil`` or ``floor`` of ``partitions / nodes``.
3. Followers are taken at a shifted distance from the leader (the shift grows by one every
   full round of nodes, so partitions with the same leader do not get the same followers),
   skipping nodes on a rack that already holds a replica until every rack holds one. With
   at least as many racks as replicas, every partition therefore spans ``RF`` racks.

One difference from Kafka: when the caller passes the current leader counts (``leader_load``,
e.g. when adding partitions to a busy cluster, or creating a topic next to others), each
leader is the least-loaded node, with ties broken by the same rotation. On an evenly loaded
cluster this is exactly the round robin above; on an uneven one new leaderships go to the
nodes that lead least, which is what an operator would do by hand. Everything is
deterministic: the same inputs give the same placement (the controller derives the rotation
from cluster state rather than from a random number so tests and reruns can predict it).
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


def _follower_index(first: int, shift: int, k: int, n: int) -> int:
    # Kafka's replicaIndex(): never the leader's own index, walks all other n-1 positions.
    return (first + 1 + (shift + k) % (n - 1)) % n


def assign_replicas(
    nodes: Sequence[PlacementNode],
    num_partitions: int,
    replication_factor: int,
    *,
    start_index: int = 0,
    shift: int = 0,
    leader_load: Mapping[int, int] | None = None,
) -> list[list[int]]:
    """Replica lists (first = preferred leader) for ``num_partitions`` new partitions.

    Args:
        nodes: the nodes eligible for new replicas (live, not shutting down); distinct ids.
        num_partitions: how many partitions to place (>= 1).
        replication_factor: replicas per partition (1 .. len(nodes)).
        start_index: where the leader rotation starts in the rack-alternated node list.
        shift: initial follower shift (Kafka picks it at random; the caller passes a rotating
            value so successive topics do not all get the same leader-follower pairs).
        leader_load: current number of partitions each node leads; new leaderships go to the
            least-loaded nodes first. None or empty = all equal (pure round robin).

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
    num_racks = len(set(rack_of.values()))
    load = {nid: (leader_load or {}).get(nid, 0) for nid in arranged}

    out: list[list[int]] = []
    pos = start_index % n
    for i in range(num_partitions):
        if i > 0 and i % n == 0:
            shift += 1
        # The least-loaded node, scanning from the rotation position (ties: rotation order).
        best = min(range(n), key=lambda k: (load[arranged[(pos + k) % n]], k))
        first = (pos + best) % n
        pos = first + 1
        leader = arranged[first]
        load[leader] += 1
        replicas = [leader]
        racks_used = {rack_of[leader]}
        k = 0
        while len(replicas) < replication_factor:
            # RF <= n guarantees an eligible node within n-1 steps; the bound is a safety net.
            if k >= 2 * n:  # pragma: no cover - unreachable by the argument above
                raise AssertionError("placement found no eligible follower")
            candidate = arranged[_follower_index(first, shift * num_racks, k, n)]
            k += 1
            if candidate in replicas:
                continue
            if rack_of[candidate] in racks_used and len(racks_used) < num_racks:
                continue  # another rack still has no replica of this partition
            replicas.append(candidate)
            racks_used.add(rack_of[candidate])
        out.append(replicas)
    return out


def leader_counts(replica_lists: Iterable[Sequence[int]]) -> dict[int, int]:
    """How many of the given partitions each node is preferred leader of."""
    counts: dict[int, int] = {}
    for replicas in replica_lists:
        if replicas:
            counts[replicas[0]] = counts.get(replicas[0], 0) + 1
    return counts
