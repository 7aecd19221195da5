"""A service's own bearer token (``--client-token-file``) is read again when the file
changes: the next call on any of its channels, made before or after, carries the new one."""

from __future__ import annotations

import asyncio
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from strom.security.channel import ChannelSecurity, ClientTokenFile


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recording(health.HealthServicer):
    """A health service that remembers the bearer token of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[str | None] = []

    def Check(self, request, context):  # type: ignore[no-untyped-def]
        md = dict(context.invocation_metadata())
        self.tokens.append(md.get("authorization"))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    servicer = Recording()
    srv = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}", servicer
    srv.stop(0)


def test_a_rewritten_token_file_is_sent_from_the_next_call_on(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    address, servicer = server
    path = tmp_path / "service.token"
    path.write_text("old-token\n")
    clock = Clock()
    sec = ChannelSecurity(token_file=ClientTokenFile(path, clock=clock))
    req = health_pb2.HealthCheckRequest()
    with sec.channel(address) as blocking:
        stub = health_pb2_grpc.HealthStub(blocking)
        stub.Check(req, timeout=10)
        path.write_text("new-token\n")
        clock.now += 1.0  # the file is looked at no more than once a second
        stub.Check(req, timeout=10)  # the same channel, made before the change

        async def aio_call() -> None:
            async with sec.aio_channel(address) as ch:
                await health_pb2_grpc.HealthStub(ch).Check(req, timeout=10)

        asyncio.run(aio_call())
    assert servicer.tokens == ["Bearer old-token", "Bearer new-token", "Bearer new-token"]


def test_an_empty_or_vanished_token_file_keeps_the_token_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "service.token"
    path.write_text("old-token\n")
    clock = Clock()
    tokens = ClientTokenFile(path, clock=clock)
    path.write_text("")
    clock.now += 1.0
    assert tokens.current() == "old-token"
    path.unlink()
    clock.now += 1.0
    assert tokens.current() == "old-token"
    assert sum("stays in use" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(ValueError, match=r"--client-token-file .*cannot read it"):
        ClientTokenFile(path)


def test_an_asyncio_channel_sends_the_token_on_every_kind_of_call() -> None:
    """Found with the token rotation test: ``grpc.aio`` took the one token interceptor for
    a unary-unary one only, so streaming calls (a follower's FetchStream) went without."""

    def said(context) -> bytes:  # type: ignore[no-untyped-def]
        return (dict(context.invocation_metadata()).get("authorization") or "none").encode()

    async def uu(request, context):  # type: ignore[no-untyped-def]
        return said(context)

    async def us(request, context):  # type: ignore[no-untyped-def]
        yield said(context)

    async def su(requests, context):  # type: ignore[no-untyped-def]
        async for _ in requests:
            pass
        return said(context)

    async def ss(requests, context):  # type: ignore[no-untyped-def]
        async for _ in requests:
            yield said(context)

    async def run() -> list[bytes]:
        server = grpc.aio.server()
        methods = {
            "UU": grpc.unary_unary_rpc_method_handler(uu),
            "US": grpc.unary_stream_rpc_method_handler(us),
            "SU": grpc.stream_unary_rpc_method_handler(su),
            "SS": grpc.stream_stream_rpc_method_handler(ss),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", methods),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with ChannelSecurity(token="tok").aio_channel(f"127.0.0.1:{port}") as ch:
                got = [await ch.unary_unary("/t.S/UU")(b"x", timeout=10)]
                got += [r async for r in ch.unary_stream("/t.S/US")(b"x", timeout=10)]
                got.append(await ch.stream_unary("/t.S/SU")(iter([b"x"]), timeout=10))
                call = ch.stream_stream("/t.S/SS")(timeout=10)
                await call.write(b"x")  # as the follower's fetch stream is used
                got.append(await call.read())
                await call.done_writing()
        finally:
            await server.stop(0)
        return got

    assert asyncio.run(run()) == [b"Bearer tok"] * 4
