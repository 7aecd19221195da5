"""The long-poll helper: parked fetches wake on enough bytes, on state changes and on
shutdown, and time out otherwise, without any polling loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from strom.storage.longpoll import WaiterRegistry


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def test_wakes_once_enough_bytes_arrived() -> None:
    async def main() -> None:
        reg = WaiterRegistry()
        w = reg.park([("t", 0), ("t", 1)], needed=100)
        reg.notify(("t", 0), 60)
        assert not w.woken
        reg.notify(("other", 0), 1000)  # not one of its partitions
        assert not w.woken
        reg.notify(("t", 1), 40)
        assert w.woken
        assert await reg.wait(w, 5.0)
        reg.unpark(w)
        assert reg.waiting() == 0

    run(main())


def test_times_out_without_data_and_returns_promptly() -> None:
    async def main() -> None:
        reg = WaiterRegistry()
        w = reg.park([("t", 0)], needed=1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert not await reg.wait(w, 0.05)
        assert 0.04 <= loop.time() - t0 < 1.0
        assert not await reg.wait(w, 0)  # no time left: no wait at all
        reg.unpark(w)

    run(main())


def test_a_notification_from_another_task_wakes_the_waiter_immediately() -> None:
    async def main() -> None:
        reg = WaiterRegistry()
        w = reg.park([("t", 0)], needed=10)
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, reg.notify, ("t", 0), 10)
        t0 = loop.time()
        assert await reg.wait(w, 10.0)
        assert loop.time() - t0 < 1.0
        reg.unpark(w)

    run(main())


def test_state_changes_and_shutdown_wake_everyone() -> None:
    async def main() -> None:
        reg = WaiterRegistry()
        a = reg.park([("t", 0)], needed=10**9)
        b = reg.park([("t", 1)], needed=10**9)
        reg.wake(("t", 0))
        assert a.woken and not b.woken
        assert reg.waiting(("t", 1)) == 1
        reg.close()
        assert b.woken
        late = reg.park([("t", 2)], needed=1)  # after close: never waits
        assert late.woken and await reg.wait(late, 10.0)
        for w in (a, b, late):
            reg.unpark(w)
        assert reg.waiting() == 0

    run(main())


def test_needed_is_at_least_one_byte() -> None:
    async def main() -> None:
        reg = WaiterRegistry()
        w = reg.park([("t", 0)], needed=0)
        assert not w.woken
        reg.notify(("t", 0), 1)
        assert w.woken

    run(main())


def test_a_wake_up_reaches_the_parked_fetch_in_one_pass_of_the_loop() -> None:
    """An append's notification resumes the waiting fetch at the loop's next pass, not after
    further callbacks queued behind whatever else the loop has to do."""

    async def main() -> None:
        reg = WaiterRegistry()
        w = reg.park([("t", 0)], needed=1)
        waiting = asyncio.ensure_future(reg.wait(w, 10.0))
        await asyncio.sleep(0)  # the fetch is now parked on its future
        assert not waiting.done()
        reg.notify(("t", 0), 1)
        await asyncio.sleep(0)  # one pass: the fetch ran before this task resumed
        assert waiting.done() and waiting.result() is True
        reg.unpark(w)

    run(main())


def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    """A fetch cancelled while parked (its stream ended) is not woken later, its timer is
    gone, and a notification afterwards harms nothing."""

    async def main() -> None:
        reg = WaiterRegistry()
        w = reg.park([("t", 0)], needed=1)
        loop = asyncio.get_running_loop()

        def live_timers() -> int:
            return sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]

        timers = live_timers()
        waiting = asyncio.ensure_future(reg.wait(w, 10.0))
        await asyncio.sleep(0)
        assert live_timers() == timers + 1  # the wait's timeout
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert waiting.cancelled() and not w.woken
        assert live_timers() == timers
        reg.notify(("t", 0), 5)
        assert not w.woken
        reg.unpark(w)
        assert reg.waiting() == 0

    run(main())
