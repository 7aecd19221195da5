"""A decided transaction whose completion step fails transiently is completed by retrying
(the 20-minute chaos run saw a completion write time out while the ISR of
__transaction_state was short; the transaction stayed PREPARE_COMMIT until the shard moved).
The retry stops when the shard moves to another coordinator, which completes it instead."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from strom.coordinator.shards import Shard
from strom.coordinator.txn_service import TransactionRpcs, _Superseded
from strom.errors import InvalidRequestError, RequestTimedOutError


def _meta() -> SimpleNamespace:
    return SimpleNamespace(transactional_id="t1")


def test_a_timed_out_step_is_retried_until_it_succeeds() -> None:
    shard = Shard(0, loaded=True, generation=3)
    calls: list[int] = []

    async def step() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RequestTimedOutError("the in-sync replicas did not confirm the records in time")
        return "done"

    owner = SimpleNamespace(_stopping=False)
    result = asyncio.run(TransactionRpcs._retrying(owner, shard, 3, _meta(), step))  # type: ignore[arg-type]
    assert result == "done" and len(calls) == 3


def test_the_retry_stops_when_the_shard_moved() -> None:
    shard = Shard(0, loaded=True, generation=3)

    async def step() -> None:
        shard.generation += 1  # reloaded elsewhere meanwhile
        raise RequestTimedOutError("timed out")

    owner = SimpleNamespace(_stopping=False)
    with pytest.raises(_Superseded):
        asyncio.run(TransactionRpcs._retrying(owner, shard, 3, _meta(), step))  # type: ignore[arg-type]


def test_an_error_that_is_not_retriable_is_raised_at_once() -> None:
    shard = Shard(0, loaded=True, generation=3)
    calls: list[int] = []

    async def step() -> None:
        calls.append(1)
        raise InvalidRequestError("bad")

    owner = SimpleNamespace(_stopping=False)
    with pytest.raises(InvalidRequestError):
        asyncio.run(TransactionRpcs._retrying(owner, shard, 3, _meta(), step))  # type: ignore[arg-type]
    assert len(calls) == 1
