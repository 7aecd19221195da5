"""strom.service.health: Watch streams end at shutdown without a write ever being cut."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from strom.service.health import HealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class SlowContext:
    """A stream whose writes take until the test lets them finish; two at once is the error
    gRPC reports as GRPC_CALL_ERROR_TOO_MANY_OPERATIONS."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.release = asyncio.Event()
        self.writing = asyncio.Event()
        self._busy = False

    async def write(self, msg: health_pb2.HealthCheckResponse) -> None:
        assert not self._busy, "a write while another is under way"
        self._busy = True
        self.writing.set()
        try:
            await self.release.wait()
            self.sent.append(msg.status)
        finally:
            self._busy = False


def test_closing_while_a_status_is_being_written_finishes_it_then_ends() -> None:
    async def body() -> None:
        hs = HealthServicer()
        await hs.set("", SERVING)
        ctx = SlowContext()
        watch = asyncio.ensure_future(hs.Watch(health_pb2.HealthCheckRequest(), ctx))
        await ctx.writing.wait()  # the first status is being sent
        await hs.set("", NOT_SERVING)
        hs.close_watches()
        ctx.release.set()
        await asyncio.wait_for(watch, timeout=5)
        assert ctx.sent == [SERVING, NOT_SERVING]  # the last status, then the end

    asyncio.run(body())


def test_a_watch_after_closing_gets_the_status_and_ends() -> None:
    async def body() -> None:
        hs = HealthServicer()
        await hs.set("", NOT_SERVING)
        hs.close_watches()
        ctx = SlowContext()
        ctx.release.set()
        await asyncio.wait_for(hs.Watch(health_pb2.HealthCheckRequest(), ctx), timeout=5)
        assert ctx.sent == [NOT_SERVING]

    asyncio.run(body())


def test_status_changes_reach_an_open_watch() -> None:
    async def body() -> None:
        hs = HealthServicer()
        await hs.set("svc", NOT_SERVING)
        ctx = SlowContext()
        ctx.release.set()
        watch = asyncio.ensure_future(hs.Watch(health_pb2.HealthCheckRequest(service="svc"), ctx))
        while not ctx.sent:
            await asyncio.sleep(0)
        await hs.set("svc", SERVING)
        while len(ctx.sent) < 2:
            await asyncio.sleep(0)
        assert ctx.sent == [NOT_SERVING, SERVING] and not watch.done()
        hs.close_watches()
        await asyncio.wait_for(watch, timeout=5)

    asyncio.run(body())
