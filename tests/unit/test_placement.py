"""Replica placement (strom.controller.placement): Kafka's rack-aware round robin, plus the
load-aware choice of leaders. Pure and fast."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.controller import leadership
from strom.controller.placement import (
    PlacementNode,
    assign_replicas,
    leader_counts,
    rack_alternated,
)
from strom.controller.topics_admin import Load, _place
from strom.errors import ErrorCode, InvalidPartitionsError, InvalidReplicationFactorError


def _nodes(n: int, racks: int = 0) -> list[PlacementNode]:
    return [PlacementNode(i, f"r{i % racks}" if racks else None) for i in range(n)]


def _first_follower_spread(got: list[list[int]], nodes: list[PlacementNode]) -> int:
    """The largest difference, over leaders, between how many of a leader's partitions two
    nodes are the first follower of, among the nodes that may follow it (not the leader, and
    not its rack when every partition can span one rack per replica)."""
    rack = {x.node_id: x.rack or "" for x in nodes}
    one_per_rack = len(got[0]) <= len(set(rack.values()))
    worst = 0
    for leader in {r[0] for r in got}:
        firsts = Counter(r[1] for r in got if r[0] == leader)
        counts = [
            firsts[x.node_id]
            for x in nodes
            if x.node_id != leader and not (one_per_rack and rack[x.node_id] == rack[leader])
        ]
        worst = max(worst, max(counts) - min(counts))
    return worst


def test_rack_alternated_interleaves_racks() -> None:
    nodes = [
        PlacementNode(0, "a"),
        PlacementNode(1, "a"),
        PlacementNode(2, "a"),
        PlacementNode(3, "b"),
        PlacementNode(4, "b"),
        PlacementNode(5, "c"),
    ]
    # Kafka's example: one of each rack in turn, a rack dropping out when it runs out.
    assert rack_alternated(nodes) == [0, 3, 5, 1, 4, 2]
    assert rack_alternated(reversed(nodes)) == [0, 3, 5, 1, 4, 2]  # order-independent
    assert rack_alternated(_nodes(4)) == [0, 1, 2, 3]


def test_full_rounds_spread_leaders_replicas_and_followers() -> None:
    got = assign_replicas(_nodes(5), 10, 3)
    assert got[0] == [0, 1, 2]  # the rotation starts at start_index, followers after it
    assert set(Counter(r[0] for r in got).values()) == {2}
    assert set(Counter(n for r in got for n in r).values()) == {6}
    # A node's two partitions have other followers, so its failure spreads its leaderships.
    for leader in range(5):
        followers = [frozenset(r[1:]) for r in got if r[0] == leader]
        assert len(set(followers)) == 2, (leader, got)


@pytest.mark.parametrize(
    ("nodes", "racks", "partitions", "rf"),
    [
        (3, 0, 12, 3),  # the outside reviewer's case: RF = nodes
        (3, 0, 2000, 3),
        (4, 0, 24, 3),
        (4, 0, 13, 3),
        (5, 0, 40, 2),
        (5, 0, 17, 2),
        (6, 3, 24, 3),  # one replica per rack
        (6, 3, 24, 2),
        (6, 2, 30, 3),  # more replicas than racks
        (8, 4, 40, 2),
    ],
)
def test_each_leaders_first_followers_are_spread(
    nodes: int, racks: int, partitions: int, rf: int
) -> None:
    """Found from outside: with RF = nodes every partition of a leader had the same first
    follower (3 nodes, RF 3: only [1, 2, 3], [2, 1, 3] and [3, 1, 2]), so a failed node's
    leaderships all went to one node. The first follower is the failover target (the first
    in-sync replica in replica order is elected), so for each leader it is spread within one
    over the nodes that may follow it."""
    placed = _nodes(nodes, racks)
    got = assign_replicas(placed, partitions, rf)
    assert _first_follower_spread(got, placed) <= 1, got


@pytest.mark.parametrize(("nodes", "partitions", "rf"), [(3, 2000, 3), (4, 24, 3), (5, 40, 2)])
def test_a_failed_nodes_leaderships_split_over_the_survivors(
    nodes: int, partitions: int, rf: int
) -> None:
    """Found from outside: 2,000 partitions, RF 3 on 3 nodes; node 3 killed, all 667 of its
    leaderships went to node 1. With the controller's own election rule, whichever node
    fails, its leaderships now split within one over the others."""
    got = assign_replicas(_nodes(nodes), partitions, rf)
    assert len(got) == partitions  # (an empty placement would pass every check below)
    everyone = set(range(nodes))
    for failed in everyone:
        survivors = everyone - {failed}
        moved: Counter[int] = Counter()
        for replicas in got:
            if replicas[0] != failed:
                continue
            state = leadership.initial_state(replicas, everyone, "topic-id")
            decision = leadership.reconcile(state, survivors, survivors)
            assert decision is not None
            moved[decision.state.leader] += 1
        counts = [moved[x] for x in survivors]
        assert sum(counts) == Counter(r[0] for r in got)[failed]
        assert max(counts) - min(counts) <= 1, (failed, moved)


@pytest.mark.parametrize(("nodes", "partitions"), [(3, 1), (3, 2), (4, 1), (4, 3)])
def test_small_topics_spread_first_followers_over_the_cluster(nodes: int, partitions: int) -> None:
    """Topics of one or two partitions have nothing to spread inside the topic: the
    controller's placement (``_place``, fed the cluster's load as CreateTopics does) counts
    the existing (leader, first follower) pairs so that, with RF = nodes, each node's
    failover targets still alternate over the others from topic to topic."""
    placed = _nodes(nodes)
    load = Load()
    got: list[list[int]] = []
    for topic in range(12 * nodes):
        replicas = asyncio.run(_place(placed, partitions, nodes, load, shift=topic))
        load.add(replicas)
        got += replicas
    assert _first_follower_spread(got, placed) <= 1, got


def test_new_node_does_not_take_a_whole_new_topic() -> None:
    # Found from outside: node 5 joined a cluster of 4 (each preferred leader of 6); a new
    # topic of 5 partitions was placed [5, 1, 2] five times over, nodes 3 and 4 got nothing.
    nodes = [PlacementNode(i) for i in range(1, 6)]
    got = assign_replicas(nodes, 5, 3, leader_load={1: 6, 2: 6, 3: 6, 4: 6, 5: 0})
    assert sorted(r[0] for r in got) == [1, 2, 3, 4, 5]
    assert set(Counter(n for r in got for n in r).values()) == {3}
    assert len({tuple(r) for r in got}) == 5
    # And a 3-partition topic on 3 nodes, one of which already led more, was put on 3, 2, 3.
    nodes = [PlacementNode(i) for i in range(1, 4)]
    got = assign_replicas(nodes, 3, 1, leader_load={1: 2, 2: 1, 3: 0})
    assert sorted(r[0] for r in got) == [1, 2, 3]


def test_existing_load_decides_the_remainder() -> None:
    # 4 partitions over 3 nodes: one node leads two, the one leading least elsewhere.
    got = assign_replicas(_nodes(3), 4, 1, leader_load={0: 2, 1: 0, 2: 1})
    assert Counter(r[0] for r in got) == {0: 1, 1: 2, 2: 1}
    # 2 partitions of RF 2 over 3 nodes: the node holding fewest replicas gets two of four.
    got = assign_replicas(_nodes(3), 2, 2, leader_load={0: 1}, replica_load={0: 9, 1: 9, 2: 3})
    held = Counter(n for r in got for n in r)
    assert held[2] == 2 and sorted(r[0] for r in got) == [1, 2]


@pytest.mark.parametrize(("nodes", "partitions", "rf"), [(3, 6, 2), (5, 10, 3), (4, 12, 1)])
def test_leaders_and_replicas_spread_evenly(nodes: int, partitions: int, rf: int) -> None:
    got = assign_replicas(_nodes(nodes), partitions, rf)
    assert len(got) == partitions
    assert all(len(r) == rf and len(set(r)) == rf for r in got)
    leaders = Counter(r[0] for r in got)
    replicas = Counter(n for r in got for n in r)
    assert set(leaders.values()) == {partitions // nodes}
    assert set(replicas.values()) == {partitions * rf // nodes}


def test_uneven_counts_differ_by_at_most_one() -> None:
    got = assign_replicas(_nodes(4), 7, 2)
    leaders = Counter(r[0] for r in got)
    assert max(leaders.values()) - min(leaders.values()) <= 1
    assert sum(leaders.values()) == 7


def test_every_partition_spans_distinct_racks_when_racks_suffice() -> None:
    nodes = _nodes(6, racks=3)  # r0: 0,3  r1: 1,4  r2: 2,5
    rack = {n.node_id: n.rack for n in nodes}
    got = assign_replicas(nodes, 12, 3)
    for replicas in got:
        assert len({rack[n] for n in replicas}) == 3, replicas
    assert set(Counter(r[0] for r in got).values()) == {2}
    # With RF 2 over 3 racks, both replicas are on different racks.
    for replicas in assign_replicas(nodes, 9, 2):
        assert rack[replicas[0]] != rack[replicas[1]]


def test_racks_fewer_than_rf_use_every_rack() -> None:
    nodes = _nodes(4, racks=2)
    rack = {n.node_id: n.rack for n in nodes}
    got = assign_replicas(nodes, 8, 3)
    assert len(got) == 8  # (an empty placement would pass every check below)
    for replicas in got:
        assert {rack[n] for n in replicas} == {"r0", "r1"}
        assert len(set(replicas)) == 3


def test_uneven_racks_still_place_on_distinct_racks() -> None:
    nodes = [PlacementNode(0, "a"), PlacementNode(1, "a"), PlacementNode(2, "a")]
    nodes += [PlacementNode(3, "b"), PlacementNode(4, "c")]
    rack = {n.node_id: n.rack for n in nodes}
    got = assign_replicas(nodes, 10, 3)
    assert len(got) == 10  # (an empty placement would pass every check below)
    for replicas in got:
        assert len({rack[n] for n in replicas}) == 3


def test_deterministic_and_independent_of_input_order() -> None:
    nodes = _nodes(6, racks=2)
    a = assign_replicas(nodes, 20, 3, start_index=2, shift=1, leader_load={0: 3})
    b = assign_replicas(list(reversed(nodes)), 20, 3, start_index=2, shift=1, leader_load={0: 3})
    assert a == b


def test_start_index_rotates_the_first_leader() -> None:
    assert [r[0] for r in assign_replicas(_nodes(3), 3, 1, start_index=1)] == [1, 2, 0]
    assert [r[0] for r in assign_replicas(_nodes(3), 3, 1, start_index=5)] == [2, 0, 1]


def test_leader_counts() -> None:
    assert leader_counts([[1, 2], [2, 1], [1], []]) == {1: 2, 2: 1}


def test_errors() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="larger than the number of live"):
        assign_replicas(_nodes(2), 1, 3)
    with pytest.raises(InvalidReplicationFactorError) as info:
        assign_replicas([], 1, 1)
    assert info.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(InvalidReplicationFactorError, match="at least 1"):
        assign_replicas(_nodes(2), 1, 0)
    with pytest.raises(InvalidPartitionsError, match="at least 1"):
        assign_replicas(_nodes(2), 0, 1)
    with pytest.raises(ValueError, match="duplicate"):
        assign_replicas([PlacementNode(1), PlacementNode(1)], 1, 1)


def test_single_node() -> None:
    assert assign_replicas(_nodes(1), 3, 1) == [[0], [0], [0]]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 9),
    racks=st.integers(0, 4),
    partitions=st.integers(1, 40),
    data=st.data(),
)
def test_properties(n: int, racks: int, partitions: int, data: st.DataObject) -> None:
    nodes = _nodes(n, racks)
    rf = data.draw(st.integers(1, n))
    start = data.draw(st.integers(0, 20))
    shift = data.draw(st.integers(0, 20))
    loads = st.none() | st.dictionaries(st.integers(0, n - 1), st.integers(0, 30))
    leader_load = data.draw(loads)
    replica_load = data.draw(loads)
    pair = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
    first_load = data.draw(st.none() | st.dictionaries(pair, st.integers(0, 9)))
    got = assign_replicas(
        nodes,
        partitions,
        rf,
        start_index=start,
        shift=shift,
        leader_load=leader_load,
        replica_load=replica_load,
        first_load=first_load,
    )
    rack = {x.node_id: x.rack for x in nodes}
    n_racks = len(set(rack.values()))
    for replicas in got:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert len({rack[x] for x in replicas}) == min(rf, n_racks)
    # Leaders: floor or ceil each, the ceil to nodes leading no more elsewhere than others.
    leaders = Counter(r[0] for r in got)
    counts = [leaders.get(x, 0) for x in range(n)]
    assert max(counts) - min(counts) <= 1
    before = leader_load or {}
    for a in range(n):
        for b in range(n):
            if counts[a] > counts[b]:
                assert before.get(a, 0) <= before.get(b, 0), (a, b, got)
    # Replicas: floor or ceil each without racks, or with racks of equal size and a replica
    # at most per rack (otherwise rack spread comes first).
    even_racks = not racks or (n % racks == 0 and rf <= racks and not replica_load)
    if even_racks:
        held = Counter(x for r in got for x in r)
        assert max(held.values()) - min(held.get(x, 0) for x in range(n)) <= 1, got
    # Partitions sharing a leader do not all share followers while other choices exist (when
    # the replicas divide evenly: otherwise which nodes get one more can decide it).
    if not racks and 2 <= rf < n and partitions * rf % n == 0:
        for leader, count in leaders.items():
            if count >= 2:
                assert len({frozenset(r[1:]) for r in got if r[0] == leader}) >= 2, got
    # Each leader's first followers (its failover targets) are spread within one over the
    # nodes that may follow it, with racks of equal size. With RF 2 the first follower is the
    # only one, so the replica counts come first: existing loads that decide which nodes hold
    # one more replica can leave no spread within one.
    if rf >= 2 and (not racks or n % racks == 0) and (rf > 2 or not (leader_load or replica_load)):
        assert _first_follower_spread(got, nodes) <= 1, got
