"""OffsetWaiters: requests parked until a watermark passes their offset."""

from __future__ import annotations

import asyncio

from strom.storage.waiters import OffsetWaiters


def test_release_below_answers_only_the_offsets_the_watermark_passed() -> None:
    async def run() -> tuple[list[int | None], int]:
        waiters = OffsetWaiters()
        tasks = [asyncio.create_task(waiters.wait(offset, 5.0)) for offset in (3, 7, 5)]
        await asyncio.sleep(0)  # let every task park
        waiters.release_below(6, 42)
        done = [await tasks[0], await tasks[2]]
        left = len(waiters)
        waiters.release_all(None)
        done.append(await tasks[1])
        return done, left

    done, left = asyncio.run(run())
    assert done == [42, 42, None]
    assert left == 1


def test_a_timed_out_waiter_answers_none_and_leaves_the_list() -> None:
    async def run() -> tuple[int | None, bool]:
        waiters = OffsetWaiters()
        result = await waiters.wait(10, 0.0)
        return result, bool(waiters)

    assert asyncio.run(run()) == (None, False)


def test_a_released_waiter_is_not_answered_twice() -> None:
    async def run() -> int | None:
        waiters = OffsetWaiters()
        task = asyncio.create_task(waiters.wait(1, 5.0))
        await asyncio.sleep(0)
        waiters.release_below(2, 9)
        waiters.release_all(None)  # the same future must not be set again
        return await task

    assert asyncio.run(run()) == 9
