"""A follower's fetches from its leader (strom.storage.replica_fetchers._LeaderFetches) against a
real gRPC server on 127.0.0.1 whose StorageService answers Fetch from a script: with
FetchStream, every fetch goes on one stream and a stream the leader ends is replaced; without
it (a leader of an older version: the generated base class answers UNIMPLEMENTED), the
follower falls back to unary calls and stays there. (Followers on a real cluster's streams:
tests/integration/test_streams.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from strom.api import storage_pb2, storage_pb2_grpc
from strom.storage.replica_fetchers import _LeaderFetches

ENDED = "the leader ended the fetch stream"


def answer(request: storage_pb2.FetchRequest) -> storage_pb2.FetchResponse:
    """An answer that says which request it is for (its max_wait_ms, a counter)."""
    return storage_pb2.FetchResponse(throttle_time_ms=request.max_wait_ms)


class OlderLeader(storage_pb2_grpc.StorageServiceServicer):
    """Fetch only: FetchStream is the generated base's UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.unary = 0

    async def Fetch(self, request: Any, context: Any) -> storage_pb2.FetchResponse:
        self.unary += 1
        return answer(request)


class Leader(OlderLeader):
    """FetchStream too; ends a stream after ``per_stream`` answers (a stopping leader)."""

    def __init__(self, per_stream: int) -> None:
        super().__init__()
        self.per_stream = per_stream
        self.streams = 0

    async def FetchStream(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[storage_pb2.FetchResponse]:
        self.streams += 1
        served = 0
        async for request in requests:
            yield answer(request)
            served += 1
            if served == self.per_stream:
                return


async def fetch_all(servicer: OlderLeader, count: int) -> list[int | str]:
    """Fetch ``count`` times through one _LeaderFetches; each answer's tag, or the error."""
    server = grpc.aio.server()
    storage_pb2_grpc.add_StorageServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            fetches = _LeaderFetches(channel)
            out: list[int | str] = []
            for i in range(1, count + 1):
                try:
                    resp = await fetches.fetch(storage_pb2.FetchRequest(max_wait_ms=i), 5.0)
                    out.append(resp.throttle_time_ms)
                except ConnectionResetError as exc:
                    out.append(str(exc))
            fetches.close()
            return out
    finally:
        await server.stop(None)


def test_a_leader_without_fetch_stream_is_fetched_from_with_unary_calls() -> None:
    leader = OlderLeader()
    got = asyncio.run(fetch_all(leader, 4))
    # Every fetch answered, in order; the first one's stream refusal was not an error.
    assert got == [1, 2, 3, 4]
    assert leader.unary == 4


@pytest.mark.parametrize("per_stream", [2, 100])
def test_fetches_go_on_one_stream_and_an_ended_stream_is_replaced(per_stream: int) -> None:
    leader = Leader(per_stream)
    got = asyncio.run(fetch_all(leader, 5))
    if per_stream == 100:
        assert got == [1, 2, 3, 4, 5]
        assert (leader.streams, leader.unary) == (1, 0)
    else:
        # The leader ends each stream after two answers. A fetch after the end either finds
        # the stream ended before it sends (a new stream answers it) or meets the end on
        # the way (the replica fetcher retries that error): never another error, never
        # another fetch's answer, and every later fetch goes on a new stream.
        for i, g in enumerate(got, 1):
            assert g in (i, ENDED)
        assert got[:2] == [1, 2] and got.count(ENDED) <= 2
        assert leader.streams >= 2 and leader.unary == 0
