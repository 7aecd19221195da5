"""The storage node's quota holds (strom.storage.rpc_base) with fakes: a fake clock for the
quotas, a fake call context for the deadline."""

from __future__ import annotations

import asyncio

import pytest

from strom.api import metadata_pb2 as md
from strom.security import CURRENT_PRINCIPAL
from strom.security.quotas import MAX_THROTTLE_S, QuotaManager
from strom.storage import rpc_base

ALICE = "User:CN=alice"


class _Call:
    """A gRPC call context with ``left`` seconds before its deadline (None: no deadline)."""

    def __init__(self, left: float | None) -> None:
        self.left = left

    def time_remaining(self) -> float | None:
        return self.left


@pytest.mark.parametrize(
    ("left", "held_s"),
    [
        (None, MAX_THROTTLE_S),  # no deadline: the capped hold
        (6.0, 6.0 - rpc_base.HOLD_MARGIN_S),  # never into the deadline's last margin
        (0.5, 0.0),  # less than the margin left: answered at once
    ],
)
def test_a_hold_never_outlasts_the_callers_deadline(
    monkeypatch: pytest.MonkeyPatch, left: float | None, held_s: float
) -> None:
    """Found from outside: an answer was held up to MAX_THROTTLE_S whatever the call's
    deadline, so a written call came back DEADLINE_EXCEEDED (and was written again by its
    retry). The hold stops short of the deadline; what it does not cover stays owed."""
    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    q.replace({ALICE: md.ClientQuota(principal=ALICE, produce_bytes_per_second=1000)})
    monkeypatch.setattr(rpc_base, "QUOTAS", q)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:  # the fake clock's time passes at once
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(rpc_base.asyncio, "sleep", sleep)

    async def main() -> int:
        CURRENT_PRINCIPAL.set(ALICE)
        return await rpc_base._throttle("produce", 100_000, 0, _Call(left))

    held_ms = asyncio.run(main())
    assert sum(slept) == pytest.approx(held_s)
    assert held_ms == int(held_s * 1000)
    assert q.owed(ALICE, "produce") == pytest.approx(99 - held_s)  # the rest is still owed
