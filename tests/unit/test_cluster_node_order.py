"""The order in which ClusterClient asks nodes: one that failed or was slow is asked after
the others until it answers again (a hung node is not asked first by every lookup), and its
lookups (Metadata, FindCoordinator) hedged: the next node asked too when one has not
answered within LOOKUP_HEDGE_S. The nodes are fakes (tests.unit.fake_lookups); the
client's logic is real."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from strom.api import common_pb2, storage_pb2
from strom.client.cluster import LOOKUP_HEDGE_S, ClusterClient
from strom.client.types import TopicPartition
from strom.errors import AuthorizationError, BrokerNotAvailableError, CoordinatorNotAvailableError
from tests.unit.fake_lookups import FakeNode, RpcFailure


def test_a_demoted_node_is_asked_last_until_it_answers_again() -> None:
    client = ClusterClient("n1:9092,n2:9092,n3:9092")
    try:
        assert client._candidates() == ["n1:9092", "n2:9092", "n3:9092"]
        client.demote("n1:9092")
        assert client._candidates() == ["n2:9092", "n3:9092", "n1:9092"]
        assert client.demoted("n1:9092") and not client.demoted("n2:9092")
        client.demote("n2:9092")  # the one that failed longest ago comes first of those
        assert client._candidates() == ["n3:9092", "n1:9092", "n2:9092"]
        client._promote("n1:9092")
        assert client._candidates() == ["n1:9092", "n3:9092", "n2:9092"]
    finally:
        client.close()


# -- FindCoordinator hedged as Metadata is ------------------------------------------------
#
# Found from outside: FindCoordinator asked one node after the other, each for up to 5 s, so
# a group consumer (or a transactional producer, `strom groups describe`, a Spark task) whose
# first bootstrap node hung waited 5 s for its first records, in every new process.

GROUP = storage_pb2.COORDINATOR_TYPE_GROUP


def _owner(host: str, port: int, shard: int = 0) -> storage_pb2.FindCoordinatorResponse:
    resp = storage_pb2.FindCoordinatorResponse()
    c = resp.coordinators.add(shard=shard)
    c.node.host, c.node.port = host, port
    return resp


def _fake_client(
    monkeypatch: pytest.MonkeyPatch, nodes: dict[str, FakeNode], timeout_s: float = 5.0
) -> ClusterClient:
    """A client over ``nodes`` (bootstrap order) whose calls take up to ``timeout_s`` each."""
    client = ClusterClient(list(nodes), timeout_s=timeout_s, retry_s=timeout_s)
    monkeypatch.setattr(client, "storage", lambda addr: nodes[addr])
    # (The fakes' names resolve nowhere: a real client would stop at that, see
    # test_bootstrap_resolution.py.)
    monkeypatch.setattr(client, "_check_resolvable", lambda: None)
    return client


def _answering(resp: Any) -> FakeNode:
    return FakeNode(find_coordinator=lambda _req: resp)


def _first_fails(failure: RpcFailure) -> dict[str, FakeNode]:
    """Two nodes: the first fails FindCoordinator with ``failure``, the second answers."""
    return {
        "n1:1": FakeNode(find_coordinator=lambda _req: failure),
        "n2:1": _answering(_owner("c", 9094)),
    }


def test_find_coordinator_asks_the_next_node_when_the_first_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = {"hung:1": FakeNode(), "n2:1": _answering(_owner("c", 9094)), "n3:1": FakeNode()}
    client = _fake_client(monkeypatch, nodes)
    at = time.monotonic()
    assert client.find_coordinator("g") == "c:9094"
    took = time.monotonic() - at
    assert LOOKUP_HEDGE_S <= took < 3.0, took  # (the old code: the hung node's 5 s first)
    assert nodes["n3:1"].FindCoordinator.asked == 0  # n2 answered before a third was due
    # The hung node is asked last from now on: the next lookup costs no hedge at all.
    assert client._candidates() == ["n2:1", "n3:1", "hung:1"]
    at = time.monotonic()
    assert client.find_coordinator("g", timeout_s=2.0) == "c:9094"
    assert time.monotonic() - at < LOOKUP_HEDGE_S
    assert nodes["hung:1"].FindCoordinator.asked == 1


def test_a_node_that_fails_sends_find_coordinator_to_the_next_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = RpcFailure(grpc.StatusCode.UNAVAILABLE, "failed to connect; last error: refused")
    client = _fake_client(monkeypatch, _first_fails(down))
    at = time.monotonic()
    assert client.find_coordinator("g") == "c:9094"
    assert time.monotonic() - at < LOOKUP_HEDGE_S  # no hedge waited: it failed at once
    assert client.demoted("n1:1") and not client.demoted("n2:1")


def test_coordinator_shards_asks_the_next_node_when_the_first_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = {"hung:1": FakeNode(), "n2:1": _answering(_owner("c", 9094, shard=3))}
    client = _fake_client(monkeypatch, nodes)
    at = time.monotonic()
    assert client.coordinator_shards() == {3: "c:9094"}
    took = time.monotonic() - at
    assert took < 3.0, took  # (the old code: 5 s)
    assert client._candidates()[-1] == "hung:1"


def test_when_every_node_fails_the_error_names_each_and_what_it_met(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One pass ends once every node failed, hedged (each node's attempt beside the
    others', not one after the other), and says what each met."""
    nodes = {
        "hung:1": FakeNode(),
        "down:1": FakeNode(
            find_coordinator=lambda _req: RpcFailure(
                grpc.StatusCode.UNAVAILABLE, "failed to connect; last error: Connection refused"
            )
        ),
    }
    client = _fake_client(monkeypatch, nodes, timeout_s=1.0)
    at = time.monotonic()
    with pytest.raises(CoordinatorNotAvailableError) as err:
        client.find_coordinator("g")
    took = time.monotonic() - at
    assert err.value.retriable
    assert err.value.message == (
        "no coordinator for group 'g': down:1: Connection refused; hung:1: Deadline Exceeded"
    )
    assert took < 1.0 + 2.0, took
    with pytest.raises(BrokerNotAvailableError, match="no strom node answered FindCoordinator"):
        client.coordinator_shards()


def test_a_refusal_is_raised_at_once_without_asking_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    denied = RpcFailure(grpc.StatusCode.PERMISSION_DENIED, "DESCRIBE on group g denied")
    nodes = _first_fails(denied)
    client = _fake_client(monkeypatch, nodes)
    with pytest.raises(AuthorizationError, match="DESCRIBE on group g denied"):
        client.find_coordinator("g")
    assert nodes["n2:1"].FindCoordinator.asked == 0


def test_no_coordinator_yet_is_the_answer_not_a_reason_to_ask_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that answers COORDINATOR_NOT_AVAILABLE knows what the others know (the etcd
    view): the answer is retriable, and the other nodes are not asked."""
    none = storage_pb2.FindCoordinatorResponse()
    none.coordinators.add(
        error_code=common_pb2.COORDINATOR_NOT_AVAILABLE, error_message="shard 0 has no owner"
    )
    nodes = {"n1:1": _answering(none), "n2:1": _answering(_owner("c", 9094))}
    client = _fake_client(monkeypatch, nodes)
    with pytest.raises(CoordinatorNotAvailableError, match="shard 0 has no owner"):
        client.find_coordinator("g")
    assert nodes["n2:1"].FindCoordinator.asked == 0 and not client.demoted("n1:1")


def test_metadata_is_hedged_by_the_same_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = storage_pb2.MetadataResponse()
    answer.nodes.add(node_id=2, host="n2", port=1)
    nodes = {"hung:1": FakeNode(), "n2:1": FakeNode(metadata=lambda _req: answer)}
    client = _fake_client(monkeypatch, nodes)
    at = time.monotonic()
    assert client.metadata(skip_topics=True, retry_s=0.0) == answer
    assert LOOKUP_HEDGE_S <= time.monotonic() - at < 3.0
    assert client._candidates() == ["n2:1", "hung:1"]


# -- a lookup that leaves out the node in doubt ---------------------------------------------


def _leading(node_id: int, epoch: int) -> storage_pb2.MetadataResponse:
    resp = storage_pb2.MetadataResponse()
    t = resp.topics.add(name="t", topic_id="id-t")
    t.partitions.add(partition=0, leader=node_id, leader_epoch=epoch)
    return resp


def test_a_lookup_can_leave_out_the_node_whose_own_view_is_in_doubt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader cut off from etcd answers Metadata at once, naming itself at its old epoch
    (found from outside): the consumer's check of such a leader asks the others only, and
    a later answer from the stale node does not take the partition back to the old epoch."""
    stale = FakeNode(metadata=lambda _req: _leading(1, 0))
    fresh = FakeNode(metadata=lambda _req: _leading(2, 1))
    client = _fake_client(monkeypatch, {"n1:1": stale, "n2:1": fresh})
    try:
        assert client.metadata(["t"], avoid={"n1:1"}).topics[0].partitions[0].leader == 2
        client.cache.refresh(["t"], avoid={"n1:1"})
        leader = client.cache.get(TopicPartition("t", 0))
        assert leader is not None and (leader.node_id, leader.epoch) == (2, 1)
        client.cache.refresh(["t"])  # asks n1 first: its older epoch is not taken
        leader = client.cache.get(TopicPartition("t", 0))
        assert leader is not None and (leader.node_id, leader.epoch) == (2, 1)
        with pytest.raises(BrokerNotAvailableError, match="other than n1:1, n2:1"):
            client.metadata(["t"], avoid={"n1:1", "n2:1"})
    finally:
        client.close()


def test_a_lookup_that_leaves_out_the_only_known_node_asks_nobody(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a one-node cluster there is no other view to ask: the quiet-leader check (the
    consumer's and Spark's, every QUIET_RECHECK_S) asks nothing, where it failed each time
    or asked a bootstrap alias of that same node for the view in doubt."""

    def only_n1(_req: Any) -> storage_pb2.MetadataResponse:
        resp = _leading(1, 0)
        resp.nodes.add(node_id=1, host="n1", port=1)
        return resp

    alias = FakeNode(metadata=only_n1)  # "svc:1" is node 1 under another name
    client = _fake_client(monkeypatch, {"svc:1": alias})
    monkeypatch.setattr(client, "storage", lambda addr: alias)
    try:
        client.cache.refresh(["t"])
        assert client.cache.node_addresses() == {"n1:1"}
        asked = alias.Metadata.asked
        client.cache.refresh(["t"], avoid={"n1:1"})
        assert alias.Metadata.asked == asked
    finally:
        client.close()
