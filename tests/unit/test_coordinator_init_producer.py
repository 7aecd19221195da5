"""The coordinator's InitProducerId on the storage nodes (``StorageIO._init_producer``),
against a real grpc.aio server and a port nothing listens on.

Found by CI: the lowest-id live node had just died (its registration not expired yet); the
refused connection reached a transactional producer's ``init_transactions()`` as
UNKNOWN_SERVER_ERROR, which it takes for fatal. Another node is asked now, and when none
gives an id the answer is COORDINATOR_LOAD_IN_PROGRESS, which clients retry.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from strom.api import storage_pb2, storage_pb2_grpc
from strom.coordinator.storage_io import StorageIO, StorageUnreachable, storage_unreachable
from strom.errors import ErrorCode, LeaderNotAvailableError, RequestTimedOutError, StromError


class _Node(storage_pb2_grpc.StorageServiceServicer):
    """A storage node's InitProducerId: a fresh id, or a refusal with ``code``."""

    def __init__(self, code: int = ErrorCode.NONE) -> None:
        self.code = code
        self.calls = 0

    async def InitProducerId(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.code != ErrorCode.NONE:
            return storage_pb2.InitProducerIdResponse(error_code=self.code, error_message="no")
        return storage_pb2.InitProducerIdResponse(producer_id=7000, producer_epoch=0)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connections are refused


async def _ask(nodes: dict[int, int], servicer: _Node) -> Any:
    server = grpc.aio.server()
    storage_pb2_grpc.add_StorageServiceServicer_to_server(servicer, server)
    live_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels: dict[str, grpc.aio.Channel] = {}

    def channel(address: str) -> grpc.aio.Channel:
        if address not in channels:
            channels[address] = grpc.aio.insecure_channel(address)
        return channels[address]

    ports = {node_id: (live_port if port == 0 else port) for node_id, port in nodes.items()}
    view = SimpleNamespace(
        live_nodes=lambda: {n: SimpleNamespace(host="127.0.0.1", port=p) for n, p in ports.items()}
    )
    io = SimpleNamespace(view=view, _channel=channel)
    try:
        return await StorageIO._init_producer(io, -1, -1)  # type: ignore[arg-type]
    finally:
        for ch in channels.values():
            await ch.close()
        await server.stop(None)


def test_a_node_that_refuses_connections_is_passed_over() -> None:
    node = _Node()
    # Node 1 (asked first) refuses connections; node 2 (port 0: the live server) answers.
    assert asyncio.run(_ask({1: _closed_port(), 2: 0}, node)) == (7000, 0)
    assert node.calls == 1


def test_no_node_giving_an_id_is_a_retriable_answer_naming_the_last_failure() -> None:
    node = _Node(code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    with pytest.raises(StromError) as info:
        asyncio.run(_ask({1: _closed_port(), 2: 0}, node))
    assert info.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and info.value.retriable
    assert "node 2" in info.value.message and "NOT_LEADER_OR_FOLLOWER" in info.value.message
    with pytest.raises(StromError) as none:
        asyncio.run(_ask({}, node))
    assert none.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


def test_a_refusal_retrying_cannot_fix_is_passed_on() -> None:
    node = _Node(code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    with pytest.raises(StromError) as info:
        asyncio.run(_ask({2: 0}, node))
    assert info.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and not info.value.retriable


def test_no_node_answering_at_all_is_told_apart_from_nodes_answering_with_errors() -> None:
    """Whether the nodes answered decides whether another coordinator might do better: a
    shard whose load fails so is released (``shard_ownership``), one whose nodes refuse is
    not (every coordinator would meet the same refusal)."""
    with pytest.raises(StromError) as cut:
        asyncio.run(_ask({1: _closed_port(), 2: _closed_port()}, _Node()))
    assert isinstance(cut.value, StorageUnreachable) and storage_unreachable(cut.value)
    assert cut.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and cut.value.retriable
    with pytest.raises(StromError) as refused:
        asyncio.run(_ask({1: _closed_port(), 2: 0}, _Node(code=ErrorCode.NOT_LEADER_OR_FOLLOWER)))
    assert not storage_unreachable(refused.value)
    with pytest.raises(StromError) as none:
        asyncio.run(_ask({}, _Node()))
    assert not storage_unreachable(none.value)  # no live node: the view's, the same for all


def test_which_load_failures_count_as_the_nodes_not_answering() -> None:
    assert storage_unreachable(StorageUnreachable("could not append: DEADLINE_EXCEEDED"))
    # 10 s of answered retriable errors: every coordinator would meet them alike.
    assert not storage_unreachable(RequestTimedOutError("could not append: NOT_ENOUGH_REPLICAS"))
    assert not storage_unreachable(LeaderNotAvailableError("__consumer_offsets-1 has no leader"))
    assert not storage_unreachable(StromError("fetch: NOT_LEADER_OR_FOLLOWER", retriable=True))
    assert not storage_unreachable(ValueError("anything else"))
