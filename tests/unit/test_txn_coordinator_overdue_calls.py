"""The transaction coordinator's calls in completing a transaction leave a target that does
not answer once the view names another (``strom.coordinator.txn_service._overdue``, DESIGN
§8), and only then; against a real grpc.aio server that holds its answers.

Found from outside: CompleteTxnOffsets to a hung group coordinator (and WriteTxnMarkers to a
hung partition leader) held a transaction's completion, and its producer's next transaction,
for the call's whole 15 s although another coordinator owned the group within ~2.4 s. The
real takeover is in tests/integration/test_txn_coordinator_overdue.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from strom.api import storage_pb2, storage_pb2_grpc
from strom.coordinator import txn_service
from strom.coordinator.txn_service import TransactionRpcs, _Moved, _overdue
from strom.errors import ErrorCode, LeaderNotAvailableError

GRACE_S = 0.05
#: Far below the calls' 15 s timeout, generous for a loaded machine.
BOUND_S = 5.0


class _Leader(storage_pb2_grpc.StorageServiceServicer):
    """A partition leader whose WriteTxnMarkers answers once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.received = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def WriteTxnMarkers(self, request: Any, context: Any) -> Any:
        self.received.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        resp = storage_pb2.WriteTxnMarkersResponse()
        mr = resp.markers.add(producer_id=request.markers[0].producer_id)
        for tp in request.markers[0].topics:
            tr = mr.topics.add(topic=tp.topic)
            for p in tp.partitions:
                tr.partitions.add(partition=p, error_code=ErrorCode.NONE)
        return resp


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txn_service, "OVERDUE_GRACE_S", GRACE_S)
    monkeypatch.setattr(txn_service, "OVERDUE_RECHECK_S", GRACE_S)


@asynccontextmanager
async def _serving(leader: _Leader) -> AsyncIterator[tuple[str, grpc.aio.Channel]]:
    server = grpc.aio.server()
    storage_pb2_grpc.add_StorageServiceServicer_to_server(leader, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    addr = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(addr)
    try:
        yield addr, channel
    finally:
        await channel.close()
        await server.stop(None)


def _request() -> storage_pb2.WriteTxnMarkersRequest:
    req = storage_pb2.WriteTxnMarkersRequest(timeout_ms=10_000)
    req.markers.add(producer_id=1, producer_epoch=0, committed=True)
    return req


def test_an_unanswered_call_is_given_up_once_its_target_moved() -> None:
    async def run() -> tuple[float, bool, int]:
        leader = _Leader()
        async with _serving(leader) as (_, channel):
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            looks = 0

            def moved() -> str | None:
                nonlocal looks
                looks += 1
                return "now owned by elsewhere" if looks >= 3 else None

            at = time.monotonic()
            with pytest.raises(_Moved, match="elsewhere"):
                await _overdue(stub.WriteTxnMarkers(_request(), timeout=15.0), moved)
            took = time.monotonic() - at
            await asyncio.wait_for(leader.cancelled.wait(), BOUND_S)  # (the server saw it)
            return took, leader.cancelled.is_set(), looks

    took, cancelled, looks = asyncio.run(run())
    assert took < BOUND_S and cancelled and looks == 3


def test_an_answer_wins_while_the_target_is_the_same() -> None:
    async def run() -> Any:
        leader = _Leader()
        async with _serving(leader) as (_, channel):
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            looks = 0

            def moved() -> str | None:
                nonlocal looks
                looks += 1
                if looks == 3:
                    leader.release.set()  # (a slow answer, not a hang)
                return None

            return await _overdue(stub.WriteTxnMarkers(_request(), timeout=15.0), moved)

    resp = asyncio.run(run())
    assert resp.markers[0].producer_id == 1


def test_a_cancelled_caller_cancels_the_call() -> None:
    async def run() -> bool:
        leader = _Leader()
        async with _serving(leader) as (_, channel):
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            waiting = asyncio.ensure_future(
                _overdue(stub.WriteTxnMarkers(_request(), timeout=15.0), lambda: None)
            )
            await asyncio.wait_for(leader.received.wait(), BOUND_S)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.wait_for(leader.cancelled.wait(), BOUND_S)
            return leader.cancelled.is_set()

    assert asyncio.run(run())


def _markers_to(leaders: Callable[[], tuple[str, int]], leader: _Leader) -> Any:
    """``TransactionRpcs._markers_to`` for topic t-0 (leader epoch 4 when sent), the view's
    leader of it given by ``leaders()`` (raising: none live), and how long it took."""

    async def run() -> tuple[set[tuple[str, int]], float]:
        async with _serving(leader) as (addr, channel):

            def leader_of(partition: int, topic: str) -> tuple[str, int]:
                now, epoch = leaders()
                return (addr if now == "sent" else now), epoch

            io = SimpleNamespace(_channel=lambda _: channel, _leader=leader_of)
            meta = SimpleNamespace(producer_id=1, producer_epoch=0)
            at = time.monotonic()
            done = await TransactionRpcs._markers_to(
                io,  # type: ignore[arg-type]
                addr,
                [("t", 0)],
                meta,  # type: ignore[arg-type]
                True,
                0,
                {("t", 0): 4},
            )
            return done, time.monotonic() - at

    return asyncio.run(run())


def test_a_marker_write_is_given_up_once_the_partition_has_another_leader() -> None:
    looks = iter([("sent", 4), ("sent", 4)])
    done, took = _markers_to(lambda: next(looks, ("127.0.0.1:1", 5)), _Leader())
    assert done == set() and took < BOUND_S  # (the next round goes to the new leader)


def test_a_higher_leader_epoch_is_a_move_too() -> None:
    done, took = _markers_to(lambda: ("sent", 5), _Leader())
    assert done == set() and took < BOUND_S


def test_a_marker_write_waits_while_no_leader_or_the_same_is_known() -> None:
    leader = _Leader()
    looks = 0

    def leaders() -> tuple[str, int]:
        nonlocal looks
        looks += 1
        if looks == 4:
            leader.release.set()
        if looks % 2:
            raise LeaderNotAvailableError("t-0 has no leader")
        return "sent", 4

    done, _ = _markers_to(leaders, leader)
    assert done == {("t", 0)} and looks >= 4
