"""The storage node's quota holds (strom.storage.rpc_base) and a Subscribe outbox's stall
bound (strom.storage.subscriptions.Outbox) with fakes: a fake clock for the quotas, a fake
call context for the deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from strom.api import metadata_pb2 as md
from strom.client.types import TopicPartition
from strom.devcluster.procs import wait_for
from strom.security import CURRENT_PRINCIPAL
from strom.security.quotas import MAX_THROTTLE_S, QuotaManager
from strom.storage import rpc_base, servicer
from strom.storage.subscriptions import Item, Outbox, StalledReaderError
from strom.storage.writer import INLINE_MAX_BYTES

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


def _fill_and_block(box: Outbox, idle: threading.Event, **kw: object) -> threading.Thread:
    """A pump that fills ``box`` and then blocks putting one more (``idle``: it waits)."""
    tp = TopicPartition("t", 0)
    errors: list[BaseException] = []

    def pump() -> None:
        box.put(Item(b"1", tp))
        try:
            box.put(Item(b"2", tp), idle=idle.set, **kw)  # type: ignore[arg-type]
        except StalledReaderError as exc:
            errors.append(exc)

    t = threading.Thread(target=pump)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def test_time_the_handler_holds_for_the_quota_is_not_the_reader_stalling() -> None:
    """Found from outside: a group stream held by its caller's fetch quota was ended as a
    stalled reader (ABORTED, out of its group) though the node held it. The pump's stall
    bound counts only time the handler is not holding a message for the quota."""

    async def main() -> None:
        max_wait_s = 0.3
        box = Outbox(asyncio.get_running_loop(), capacity=1)
        idle = threading.Event()
        with box.held():  # the handler holds a message for the quota
            t = _fill_and_block(box, idle, max_wait_s=max_wait_s)
            await asyncio.to_thread(idle.wait, 5)
            started = time.monotonic()
            # Held for several times the bound while the pump waits.
            await asyncio.to_thread(
                wait_for,
                lambda: time.monotonic() - started > 4 * max_wait_s,
                timeout=10,
                what="the hold outlasting the stall bound",
            )
            assert box.held_s() >= 4 * max_wait_s
        assert (await box.get()).data == b"1"  # type: ignore[union-attr]
        await asyncio.to_thread(t.join, 5)
        assert not t.errors  # type: ignore[attr-defined]
        assert (await box.get()).data == b"2"  # type: ignore[union-attr]

        # Not held: the same wait is a stalled reader.
        box = Outbox(asyncio.get_running_loop(), capacity=1)
        idle = threading.Event()
        t = _fill_and_block(box, idle, max_wait_s=max_wait_s)
        await asyncio.to_thread(t.join, 10)
        assert len(t.errors) == 1  # type: ignore[attr-defined]

    asyncio.run(main())


@pytest.mark.parametrize("stream", [False, True], ids=["Produce", "ProduceStream"])
def test_concurrent_produce_requests_are_charged_before_they_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Found from outside: Produce and ProduceStream charged the produce quota after the
    append, so concurrent requests of a principal owing nothing all passed the wait and were
    appended together; only their answers were held. Each is charged now as it is served,
    before it appends (as ProduceRecords): the first puts the principal ahead, the others
    wait for that debt before anything of theirs is appended (here, until their callers give
    up: the quota's clock is frozen, so nothing is ever paid back)."""
    from strom.record import encode_batch
    from tests.unit.test_storage_servicer import Harness, leader_state, produce_req, with_harness

    q = QuotaManager(clock=lambda: 0.0)  # frozen: a debt is never paid
    q.replace({ALICE: md.ClientQuota(principal=ALICE, produce_bytes_per_second=1000)})
    monkeypatch.setattr(rpc_base, "QUOTAS", q)
    monkeypatch.setattr(servicer, "QUOTAS", q)
    # 80 records, ~80 KB: far above the 1 s burst, and above the writer's inline bound, so
    # its append runs in the writer's thread and the loop serves the others meanwhile.
    batch = encode_batch([b"x" * 1000] * 80)
    assert len(batch) > INLINE_MAX_BYTES

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        produce = h.servicer._produce_streamed if stream else h.servicer.Produce
        CURRENT_PRINCIPAL.set(ALICE)

        async def call() -> Any:
            # A caller whose deadline is 1.5 s away: its answer is held at most 0.5 s.
            return await asyncio.wait_for(produce(produce_req({("t", 0): batch}), _Call(1.5)), 3)

        outcomes = await asyncio.gather(*(call() for _ in range(4)), return_exceptions=True)
        answered = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(answered) == 1, outcomes  # the old code appended and answered all 4
        assert answered[0].throttle_time_ms > 0
        assert all(isinstance(o, asyncio.TimeoutError) for o in outcomes if o not in answered)
        assert h.manager.partitions[("t", 0)].log.log_end_offset == 80  # the answered one only

    with_harness(tmp_path, body)
