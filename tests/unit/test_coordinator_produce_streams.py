"""The coordinator's appends on ProduceStream (strom.coordinator.produce_streams) against a
real gRPC server on 127.0.0.1 whose StorageService answers from a script: answers reach the
request they belong to however many are in flight, every request carries the internal-writer
header, a stream the node ends or leaves silent fails only what it still owed (retriably) and
is replaced, and a node without the method (an older version: the generated base answers
UNIMPLEMENTED) is marked for unary calls. (On a real cluster: the group and transaction tests
commit through it; tests/integration/test_streams.py checks the coordinator holds a stream.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from strom.api import storage_pb2, storage_pb2_grpc
from strom.client.sender import OVERDUE_GRACE_S, OVERDUE_RECHECK_S
from strom.coordinator.produce_streams import ProduceStreams
from strom.coordinator.storage_io import _watched
from strom.errors import StromError

HEADER = (("strom-internal-topics", "true"),)
#: A request with this timeout_ms gets no answer (the node holds it).
SILENT = 999


def request(tag: int) -> storage_pb2.ProduceRequest:
    """A request that says which one it is (its timeout_ms)."""
    return storage_pb2.ProduceRequest(acks=-1, timeout_ms=tag)


class OlderNode(storage_pb2_grpc.StorageServiceServicer):
    """Produce only: ProduceStream is the generated base's UNIMPLEMENTED."""


class Node(OlderNode):
    """ProduceStream answering each request with its tag (in ``throttle_time_ms``); ends a
    stream after ``per_stream`` answers; holds a SILENT request unanswered."""

    def __init__(self, per_stream: int = 0, delay_s: float = 0.0) -> None:
        self.per_stream = per_stream
        self.delay_s = delay_s
        self.streams = 0
        self.headers: list[tuple[tuple[str, str], ...]] = []
        #: Set when the test ends: held requests go on (gRPC does not cancel a stream
        #: handler that is not writing, and the server's stop would wait for it).
        self.release = asyncio.Event()

    async def ProduceStream(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[storage_pb2.ProduceResponse]:
        self.streams += 1
        self.headers.append(tuple((k, v) for k, v in context.invocation_metadata()))
        served = 0
        async for r in requests:
            if r.timeout_ms == SILENT:
                await self.release.wait()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)  # time is the behaviour: a slow node
            yield storage_pb2.ProduceResponse(throttle_time_ms=r.timeout_ms)
            served += 1
            if served == self.per_stream:
                return


async def with_node(
    servicer: OlderNode, body: Callable[[ProduceStreams, str], Awaitable[Any]]
) -> Any:
    """Run ``body(streams, address)`` against a server of ``servicer``."""
    server = grpc.aio.server()
    storage_pb2_grpc.add_StorageServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            streams = ProduceStreams(lambda _addr: channel, HEADER)
            try:
                return await body(streams, address)
            finally:
                await streams.close()
    finally:
        if isinstance(servicer, Node):
            servicer.release.set()
        await server.stop(None)


def test_concurrent_appends_each_get_their_own_answer_on_one_stream() -> None:
    node = Node(delay_s=0.001)

    async def body(streams: ProduceStreams, address: str) -> list[int]:
        answers = await asyncio.gather(
            *(streams.produce(address, request(i), 10.0) for i in range(1, 41))
        )
        return [a.throttle_time_ms for a in answers]

    assert asyncio.run(with_node(node, body)) == list(range(1, 41))
    assert node.streams == 1
    assert all(dict(h).get("strom-internal-topics") == "true" for h in node.headers)


def test_a_stream_the_node_ends_fails_only_what_it_owed_and_is_replaced() -> None:
    node = Node(per_stream=3)

    async def body(streams: ProduceStreams, address: str) -> list[int]:
        got: list[int] = []
        for i in range(1, 11):
            for _attempt in range(3):  # as StorageIO._produce: a retriable failure is resent
                try:
                    got.append((await streams.produce(address, request(i), 10.0)).throttle_time_ms)
                    break
                except StromError as exc:
                    assert exc.retriable
        return got

    assert asyncio.run(with_node(node, body)) == list(range(1, 11))
    assert node.streams >= 4  # 3 answers a stream
    assert all(dict(h).get("strom-internal-topics") == "true" for h in node.headers)


def test_an_unanswered_request_fails_at_its_timeout_and_the_next_goes_on_a_new_stream() -> None:
    node = Node()

    async def body(streams: ProduceStreams, address: str) -> int:
        assert (await streams.produce(address, request(1), 10.0)).throttle_time_ms == 1
        with pytest.raises(StromError, match="not answered within") as caught:
            await streams.produce(address, request(SILENT), 0.3)
        assert caught.value.retriable
        return (await streams.produce(address, request(2), 10.0)).throttle_time_ms

    assert asyncio.run(with_node(node, body)) == 2
    assert node.streams == 2


def test_a_node_without_the_stream_is_marked_for_unary_calls() -> None:
    async def body(streams: ProduceStreams, address: str) -> bool:
        assert streams.supported(address)
        with pytest.raises(StromError, match="UNIMPLEMENTED") as caught:
            await streams.produce(address, request(1), 10.0)
        assert caught.value.retriable
        return streams.supported(address)

    assert asyncio.run(with_node(OlderNode(), body)) is False


def test_closing_fails_what_is_still_unanswered() -> None:
    async def body(streams: ProduceStreams, address: str) -> None:
        waiting = asyncio.ensure_future(streams.produce(address, request(SILENT), 30.0))
        await asyncio.sleep(0)
        while not any(s.waiting for s in streams._streams.values()):
            await asyncio.sleep(0.01)
        await streams.close()
        with pytest.raises(StromError, match="coordinator stops"):
            await waiting

    asyncio.run(with_node(Node(), body))


def test_an_overdue_request_whose_leader_moved_fails_soon_and_one_that_did_not_waits() -> None:
    """The overdue rule (design §8): ``moved()`` is asked after OVERDUE_GRACE_S and every
    OVERDUE_RECHECK_S while unanswered; once it names a move the request fails (retriable)
    and the stream ends, long before the attempt's timeout. Found from outside: an append
    to a hung leader waited its whole 10 s although the partition had moved."""
    asks: list[float] = []

    async def body(streams: ProduceStreams, address: str) -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        start = loop.time()

        def moved() -> str | None:
            asks.append(loop.time() - start)
            return "the leader moved" if len(asks) >= 2 else None

        with pytest.raises(StromError, match="the leader moved") as caught:
            await streams.produce(address, request(SILENT), 30.0, moved)
        assert caught.value.retriable
        took = loop.time() - start
        # An answered request's watch is never asked.
        answer = await streams.produce(address, request(3), 10.0, moved)
        return took, answer.throttle_time_ms

    took, tag = asyncio.run(with_node(Node(), body))
    assert tag == 3
    assert len(asks) == 2  # at the grace, then one recheck later
    assert OVERDUE_GRACE_S + OVERDUE_RECHECK_S <= took < 10.0, took


class HungOlderNode(OlderNode):
    """An older node (unary Produce only) that never answers a Produce until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def Produce(self, request: Any, context: Any) -> storage_pb2.ProduceResponse:
        await self.release.wait()
        return storage_pb2.ProduceResponse()


def test_a_unary_append_whose_leader_moved_is_given_up_soon() -> None:
    """The same rule for nodes without ProduceStream (StorageIO's unary path)."""
    node = HungOlderNode()

    async def body(_streams: ProduceStreams, address: str) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            with pytest.raises(StromError, match="the leader moved") as caught:
                await _watched(stub.Produce(request(1), timeout=30.0), lambda: "the leader moved")
        node.release.set()
        assert caught.value.retriable
        return loop.time() - start

    took = asyncio.run(with_node(node, body))
    assert OVERDUE_GRACE_S <= took < 10.0, took
