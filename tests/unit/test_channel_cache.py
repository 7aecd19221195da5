"""A call of a :class:`ChannelCache` channel unanswered within its deadline makes the next
call to that address go on a new connection, for every user of the cache (the controller
client, the RecordService's forwarding, the coordinator): HTTP/2 puts every call of a
channel on one connection, and one gone silent held every resend with it.

A real gRPC server on 127.0.0.1 whose handler does not answer the first call: the peer
address it sees (the client's port) tells which connection each call came on."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from strom.security.channel import ChannelCache

pytestmark = pytest.mark.timeout(60)


async def _serve(hang: asyncio.Event) -> tuple[grpc.aio.Server, int, list[str]]:
    """A server answering ``/t.S/UU`` and ``/t.S/US`` with nothing, except while ``hang``
    is set; the peers of the calls, in order."""
    peers: list[str] = []

    async def uu(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        peers.append(context.peer())
        if hang.is_set():
            await asyncio.Event().wait()  # no answer: the caller's deadline passes
        return b""

    async def us(request: bytes, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        peers.append(context.peer())
        if hang.is_set():
            await asyncio.Event().wait()
        yield b""

    server = grpc.aio.server()
    methods = {
        "UU": grpc.unary_unary_rpc_method_handler(uu),
        "US": grpc.unary_stream_rpc_method_handler(us),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, peers


async def _until(cond: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", ["unary", "stream"])
def test_a_missed_deadline_renews_the_connection_of_that_address(kind: str) -> None:
    async def call(cache: ChannelCache, address: str, timeout: float | None) -> None:
        ch = cache.get(address)
        if kind == "unary":
            await ch.unary_unary("/t.S/UU")(b"x", timeout=timeout)
        else:
            [_ async for _ in ch.unary_stream("/t.S/US")(b"x", timeout=timeout)]

    async def run() -> None:
        hang = asyncio.Event()
        server, port, peers = await _serve(hang)
        cache = ChannelCache()
        address = f"127.0.0.1:{port}"
        try:
            await call(cache, address, 5)
            await call(cache, address, None)  # answered: the same channel and connection
            first = cache.get(address)
            assert peers[0] == peers[1]
            hang.set()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(cache, address, 0.3)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            hang.clear()
            await _until(lambda: cache.get(address) is not first)
            await call(cache, address, 5)
            assert peers[3] != peers[0], peers  # a new connection (another client port)
            again = cache.get(address)
            await call(cache, address, 5)  # answered: no renewal
            assert cache.get(address) is again
        finally:
            await cache.close()
            await server.stop(0)

    asyncio.run(run())
