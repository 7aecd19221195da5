"""A coordinator loading a shard (``StorageIO._replay``) leaves a partition leader that does
not answer its Fetch once the view names another leader (design §8's overdue rule, as the
appends: ``StorageIO._moved_from``), and waits for one that is still the leader.

Real gRPC servers on 127.0.0.1 whose StorageService answers Fetch from a script: one holds
every Fetch until released (a hung node: connected, silent), the other answers at once with
an empty partition. The coordinator's view is a dict the test changes. Before the fix the
replay waited its Fetch's whole 10 s at the hung leader and then failed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from strom.api import storage_pb2, storage_pb2_grpc
from strom.client.sender import OVERDUE_GRACE_S
from strom.coordinator.storage_io import StorageIO

TOPIC = "__consumer_offsets"


class Node(storage_pb2_grpc.StorageServiceServicer):
    """Answers a Fetch with an empty partition (high watermark 0), after ``release`` when
    ``hung``."""

    def __init__(self, *, hung: bool) -> None:
        self.hung = hung
        self.release = asyncio.Event()
        self.fetches = 0

    async def Fetch(self, request: Any, context: Any) -> storage_pb2.FetchResponse:
        self.fetches += 1
        if self.hung:
            await self.release.wait()
        resp = storage_pb2.FetchResponse()
        resp.topics.add(topic=TOPIC).partitions.add(partition=0, high_watermark=0)
        return resp


class View:
    """What ``_replay`` uses of a coordinator: the partition's leader from its view (a dict
    here) and a channel per address; ``_moved_from`` and ``_replay`` are StorageIO's own."""

    _replay = StorageIO._replay
    _moved_from = StorageIO._moved_from

    def __init__(self, channels: dict[str, grpc.aio.Channel], leader: tuple[str, int]) -> None:
        self.channels = channels
        self.leader = leader

    def _leader(self, partition: int, topic: str) -> tuple[str, int]:
        return self.leader

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self.channels[address]


async def _with_nodes(
    hung: Node, good: Node, body: Callable[[View, str, str], Awaitable[Any]]
) -> Any:
    servers, addresses = [], []
    for node in (hung, good):
        server = grpc.aio.server()
        storage_pb2_grpc.add_StorageServiceServicer_to_server(node, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    channels = {a: grpc.aio.insecure_channel(a) for a in addresses}
    try:
        return await body(View(channels, (addresses[0], 1)), *addresses)
    finally:
        hung.release.set()
        for channel in channels.values():
            await channel.close()
        for server in servers:
            await server.stop(None)


def test_a_replay_leaves_a_hung_leader_once_the_view_moved() -> None:
    hung, good = Node(hung=True), Node(hung=False)

    async def body(view: View, hung_addr: str, good_addr: str) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        # The partition's leader moves while the Fetch waits at the hung one.
        loop.call_later(0.2, lambda: setattr(view, "leader", (good_addr, 2)))
        position = await view._replay(0, object(), 0, until=None, topic=TOPIC)  # type: ignore[arg-type]
        assert position == 0
        return loop.time() - start

    took = asyncio.run(_with_nodes(hung, good, body))
    assert (hung.fetches, good.fetches) == (1, 1)
    # At the grace's end the view names the new leader (the old code: 10 s, then failed).
    assert OVERDUE_GRACE_S <= took < 5.0, took


def test_a_slow_leader_that_is_still_the_leader_is_waited_for() -> None:
    """Unanswered past the grace, but the view still names it: its late answer is taken."""
    slow, other = Node(hung=True), Node(hung=False)

    async def body(view: View, _slow: str, _other: str) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        loop.call_later(OVERDUE_GRACE_S + 0.5, slow.release.set)
        assert await view._replay(0, object(), 0, until=None, topic=TOPIC) == 0  # type: ignore[arg-type]
        return loop.time() - start

    took = asyncio.run(_with_nodes(slow, other, body))
    assert (slow.fetches, other.fetches) == (1, 0)
    assert took >= OVERDUE_GRACE_S + 0.5, took
