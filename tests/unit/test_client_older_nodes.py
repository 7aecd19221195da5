"""The client against nodes of an older strom version (a rolling upgrade): what they answer
is emulated by fake stubs, the client's own logic is real."""

from __future__ import annotations

from typing import Any

import pytest

from strom.api import controller_pb2, metadata_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.errors import AuthorizationError, CoordinatorNotAvailableError
from tests.unit.fake_lookups import FakeNode

GROUP = storage_pb2.COORDINATOR_TYPE_GROUP
TXN = storage_pb2.COORDINATOR_TYPE_TRANSACTION


class _Node(FakeNode):
    """A node's StorageService as far as FindCoordinator goes: an old node ignores
    all_shards and answers no entry (it looks up request.keys, which are none)."""

    def __init__(self, owners: dict[int, str] | None) -> None:
        super().__init__(find_coordinator=self._answer)
        self.owners = owners  # None: an older node

    @property
    def asked(self) -> int:
        return self.FindCoordinator.asked

    def _answer(self, req: Any) -> storage_pb2.FindCoordinatorResponse:
        resp = storage_pb2.FindCoordinatorResponse()
        for shard, addr in sorted((self.owners or {}).items()):
            host, port = addr.split(":")
            c = resp.coordinators.add(shard=shard)
            c.node.host, c.node.port = host, int(port)
        return resp


def _client(
    monkeypatch: pytest.MonkeyPatch, nodes: dict[str, _Node], describe: Any
) -> ClusterClient:
    client = ClusterClient(list(nodes), timeout_s=1.0, retry_s=1.0)
    monkeypatch.setattr(client, "storage", lambda addr: nodes[addr])

    def controller_call(method: str, request: Any, **kw: Any) -> Any:
        assert (method, request.include_coordinators) == ("DescribeCluster", True)
        if isinstance(describe, Exception):
            raise describe
        return describe

    monkeypatch.setattr(client, "controller_call", controller_call)
    return client


def test_an_empty_all_shards_answer_asks_the_next_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside (rolling upgrade): `strom groups list` asked an old node, which
    answered all_shards with nothing, and printed no group ("incomplete"). The next node,
    upgraded, knows every shard."""
    old, new = _Node(None), _Node({0: "c1:9094", 1: "c2:9094"})
    client = _client(monkeypatch, {"old:1": old, "new:1": new}, AssertionError("not asked"))
    assert client.coordinator_shards() == {0: "c1:9094", 1: "c2:9094"}
    assert (old.asked, new.asked) == (1, 1)


@pytest.mark.parametrize("key_type", [GROUP, TXN])
def test_only_older_nodes_fall_back_to_describe_cluster(
    monkeypatch: pytest.MonkeyPatch, key_type: int
) -> None:
    desc = controller_pb2.DescribeClusterResponse(
        coordinator_shards=[metadata_pb2.CoordinatorShardOwner(shard=0, host="g", port=1)],
        transaction_shards=[metadata_pb2.CoordinatorShardOwner(shard=2, host="t", port=2)],
    )
    client = _client(monkeypatch, {"a:1": _Node(None), "b:1": _Node(None)}, desc)
    want = {0: "g:1"} if key_type == GROUP else {2: "t:2"}
    assert client.coordinator_shards(key_type) == want


def test_no_way_to_find_the_shards_says_the_nodes_may_be_older(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without DESCRIBE on the cluster the fallback is refused too: the error says why the
    nodes answered nothing instead of a bare "incomplete" listing."""
    refused = AuthorizationError("DESCRIBE on the cluster denied")
    client = _client(monkeypatch, {"a:1": _Node(None)}, refused)
    with pytest.raises(CoordinatorNotAvailableError) as err:
        client.coordinator_shards()
    msg = str(err.value)
    assert "a:1 answered FindCoordinator(all_shards) with none" in msg
    assert "older than this client" in msg and "DESCRIBE on the cluster denied" in msg
