"""The node's ProduceStream handler (strom.storage.stream_rpcs) with a fake append path:
answers come in request order whatever order the appends finish in, and a request the
admission refuses ends the stream after the answers before it, with nothing after it
started. (The real node and clients on streams: tests/integration/test_streams.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from strom.api import storage_pb2
from strom.service.limits import Admission
from strom.storage.stream_rpcs import StreamRpcs


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def send_initial_metadata(self, metadata: tuple[()]) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted(details)

    def invocation_metadata(self) -> tuple[()]:
        return ()


def request(name: str, nbytes: int) -> Any:
    """A Produce request as the handler reads it: one partition of ``nbytes`` record bytes."""
    part = SimpleNamespace(partition=0, records=b"x" * nbytes)
    return SimpleNamespace(name=name, topics=[SimpleNamespace(topic="t", partitions=[part])])


class Node(StreamRpcs):
    """Appends that finish when the test says so."""

    def __init__(self, admission: Admission | None = None) -> None:
        self.admission = admission
        self.shutting_down = False
        self.stream_readers = set()
        self.started: list[str] = []
        self.finish: dict[str, asyncio.Event] = {}

    async def _produce(self, request: Any, context: Any) -> storage_pb2.ProduceResponse:
        self.started.append(request.name)
        event = self.finish.setdefault(request.name, asyncio.Event())
        await event.wait()
        resp = storage_pb2.ProduceResponse()
        resp.topics.add(topic=request.name)
        return resp


async def feed(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def collect(gen: AsyncIterator[storage_pb2.ProduceResponse], out: list[str]) -> None:
    async for resp in gen:
        out.append(resp.topics[0].topic)


def test_answers_come_in_request_order_while_appends_finish_in_any_order() -> None:
    async def main() -> None:
        node = Node()
        ctx = FakeContext()
        names = [f"r{i}" for i in range(6)]
        answers: list[str] = []
        task = asyncio.ensure_future(
            collect(node.produce_stream(feed([request(n, 10) for n in names]), ctx), answers)
        )
        while len(node.started) < len(names):  # every request started before any answer
            await asyncio.sleep(0)
        assert node.started == names  # started in arrival order
        for n in reversed(names):  # the appends finish last-first
            node.finish[n].set()
            await asyncio.sleep(0)
        await asyncio.wait_for(task, 5)
        assert answers == names
        assert ctx.status is None

    asyncio.run(main())


def shed_latencies() -> float:
    """How many Produce requests strom_storage_request_latency_seconds has as shed."""
    labels = {"rpc": "Produce", "result": "RESOURCE_EXHAUSTED"}
    return REGISTRY.get_sample_value("strom_storage_request_latency_seconds_count", labels) or 0


def test_a_shed_request_ends_the_stream_after_the_answers_before_it() -> None:
    """The shed request is timed as a shed unary Produce is (found from outside: it was in
    no latency series, so the dashboards' shed Produce rate missed stream clients)."""
    shed_before = shed_latencies()

    async def main() -> None:
        admission = Admission(max_inflight_bytes=100)
        node = Node(admission)
        ctx = FakeContext()
        answers: list[str] = []
        reqs = [request("a", 60), request("b", 60), request("c", 10)]
        task = asyncio.ensure_future(collect(node.produce_stream(feed(reqs), ctx), answers))
        # Until "b" was read and refused (the shed counter moved: the reader stops there) or,
        # wrongly, started: the window for "b" and "c" to be started is then over.
        async with asyncio.timeout(30):  # (only so that a regression fails, not hangs)
            while not node.started or (shed_latencies() == shed_before and len(node.started) < 2):
                await asyncio.sleep(0)
        node.finish["a"].set()
        with pytest.raises(Aborted):
            await asyncio.wait_for(task, 5)
        assert answers == ["a"]  # answered before the stream ended
        assert node.started == ["a"]  # "b" refused, "c" never read
        assert ctx.status is not None
        assert ctx.status[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "budget of 100" in ctx.status[1]
        assert admission.inflight_bytes == 0  # "a"'s bytes given back

    asyncio.run(main())
    assert shed_latencies() == shed_before + 1


def test_the_fetches_an_append_woke_answer_before_its_produce_answer() -> None:
    """A long poll the append woke (here: a task waiting on an event the append sets, as
    the node's waiter registry does) runs before the stream hands the Produce answer out."""

    async def main() -> None:
        order: list[str] = []
        woken = asyncio.Event()
        arrived = asyncio.Event()

        class Waking(Node):
            async def _produce(self, request: Any, context: Any) -> storage_pb2.ProduceResponse:
                woken.set()  # an append that lands: parked fetches wake, nothing suspends
                resp = storage_pb2.ProduceResponse()
                resp.topics.add(topic=request.name)
                return resp

        async def parked_fetch() -> None:
            await woken.wait()
            order.append("fetch answer")

        async def requests() -> AsyncIterator[Any]:
            await arrived.wait()  # the stream is idle, waiting for its next request
            yield request("r0", 10)

        async def answers() -> None:
            async for _ in Waking().produce_stream(requests(), FakeContext()):
                order.append("produce answer")

        fetch = asyncio.ensure_future(parked_fetch())
        stream = asyncio.ensure_future(answers())
        for _ in range(5):
            await asyncio.sleep(0)
        arrived.set()
        await asyncio.wait_for(asyncio.gather(fetch, stream), 5)
        assert order == ["fetch answer", "produce answer"]

    asyncio.run(main())
