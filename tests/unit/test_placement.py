"""Replica placement (strom.controller.placement): Kafka's rack-aware round robin, plus the
load-aware choice of leaders. Pure and fast."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.controller.placement import (
    PlacementNode,
    assign_replicas,
    leader_counts,
    rack_alternated,
)
from strom.errors import ErrorCode, InvalidPartitionsError, InvalidReplicationFactorError


def _nodes(n: int, racks: int = 0) -> list[PlacementNode]:
    return [PlacementNode(i, f"r{i % racks}" if racks else None) for i in range(n)]


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


def test_rack_unaware_matches_kafka_round_robin() -> None:
    # Kafka's assignReplicasToBrokersRackUnaware with startIndex 0 and shift 0, 5 brokers.
    got = assign_replicas(_nodes(5), 10, 3)
    assert got[:5] == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1]]
    # After a full round the follower shift grows, so leader 0 gets other followers.
    assert got[5:] == [[0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2]]


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
    for replicas in assign_replicas(nodes, 8, 3):
        assert {rack[n] for n in replicas} == {"r0", "r1"}
        assert len(set(replicas)) == 3


def test_uneven_racks_still_place_on_distinct_racks() -> None:
    nodes = [PlacementNode(0, "a"), PlacementNode(1, "a"), PlacementNode(2, "a")]
    nodes += [PlacementNode(3, "b"), PlacementNode(4, "c")]
    rack = {n.node_id: n.rack for n in nodes}
    for replicas in assign_replicas(nodes, 10, 3):
        assert len({rack[n] for n in replicas}) == 3


def test_deterministic_and_independent_of_input_order() -> None:
    nodes = _nodes(6, racks=2)
    a = assign_replicas(nodes, 20, 3, start_index=2, shift=1, leader_load={0: 3})
    b = assign_replicas(list(reversed(nodes)), 20, 3, start_index=2, shift=1, leader_load={0: 3})
    assert a == b


def test_start_index_rotates_the_first_leader() -> None:
    assert [r[0] for r in assign_replicas(_nodes(3), 3, 1, start_index=1)] == [1, 2, 0]
    assert [r[0] for r in assign_replicas(_nodes(3), 3, 1, start_index=5)] == [2, 0, 1]


def test_new_leaders_go_to_least_loaded_nodes() -> None:
    got = assign_replicas(_nodes(3), 3, 2, leader_load={0: 4, 1: 4, 2: 1})
    leaders = [r[0] for r in got]
    # Node 2 leads 1, the others 4: all three new leaderships go to node 2 until it catches up.
    assert leaders == [2, 2, 2]
    got = assign_replicas(_nodes(3), 4, 1, leader_load={0: 2, 1: 0, 2: 1})
    total = Counter({0: 2, 1: 0, 2: 1}) + Counter(r[0] for r in got)
    assert max(total.values()) - min(total.values()) <= 1


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


@settings(max_examples=200, deadline=None)
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
    got = assign_replicas(nodes, partitions, rf, start_index=start, shift=shift)
    rack = {x.node_id: x.rack for x in nodes}
    n_racks = len(set(rack.values()))
    for replicas in got:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert len({rack[x] for x in replicas}) == min(rf, n_racks)
    leaders = Counter(r[0] for r in got)
    counts = [leaders.get(x, 0) for x in range(n)]
    assert max(counts) - min(counts) <= 1
