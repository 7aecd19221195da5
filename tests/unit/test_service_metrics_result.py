"""The ``result`` label of the request-latency histograms when a handler raises.

A real gRPC aio server on 127.0.0.1 runs handlers wrapped as the services wrap theirs, so
cancellation and ``context.abort`` arrive exactly as they do in production.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Histogram

from strom.service.metrics import timed


def test_failed_calls_get_a_fixed_result_not_an_exception_class_name() -> None:
    """A cancelled call (the client went away during a long poll) is CANCELLED, an aborted
    one its gRPC status, any other exception UNKNOWN_SERVER_ERROR: never a Python class name
    such as CancelledError, which the label's documentation does not promise and which
    would grow the label's values with every new kind of bug."""
    registry = CollectorRegistry()
    hist = Histogram("t_latency_seconds", "test", ["rpc", "result"], registry=registry)

    async def main() -> None:
        parked = asyncio.Event()

        async def wait_forever(_self: Any, _req: bytes, _ctx: Any) -> bytes:
            parked.set()
            await asyncio.Event().wait()
            return b""

        async def shed(_self: Any, _req: bytes, ctx: Any) -> bytes:
            await ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "over budget")
            return b""

        async def bug(_self: Any, _req: bytes, _ctx: Any) -> bytes:
            raise KeyError("a bug")

        async def ok(_self: Any, _req: bytes, _ctx: Any) -> bytes:
            return b""

        handlers = {}
        for name, fn in (("Wait", wait_forever), ("Shed", shed), ("Bug", bug), ("Ok", ok)):
            wrapped = timed(name, hist, lambda _resp: 0)(fn)

            async def call(req: bytes, ctx: Any, wrapped: Any = wrapped) -> bytes:
                return await wrapped(None, req, ctx)

            handlers[name] = grpc.unary_unary_rpc_method_handler(call)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:

                def stub(name: str) -> Any:
                    return ch.unary_unary(f"/t.S/{name}")

                await stub("Ok")(b"")
                for name in ("Shed", "Bug"):
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await stub(name)(b"")
                pending = stub("Wait")(b"")
                await parked.wait()
                pending.cancel()
                for _ in range(1000):  # the server sees the cancellation asynchronously
                    if count("Wait", "CANCELLED"):
                        break
                    await asyncio.sleep(0.01)
        finally:
            await server.stop(None)

    def count(rpc: str, result: str) -> float:
        return (
            registry.get_sample_value("t_latency_seconds_count", {"rpc": rpc, "result": result})
            or 0
        )

    asyncio.run(main())
    seen = {
        (s.labels["rpc"], s.labels["result"])
        for m in registry.collect()
        for s in m.samples
        if s.name.endswith("_count")
    }
    assert seen == {
        ("Ok", "NONE"),
        ("Shed", "RESOURCE_EXHAUSTED"),
        ("Bug", "UNKNOWN_SERVER_ERROR"),
        ("Wait", "CANCELLED"),
    }
