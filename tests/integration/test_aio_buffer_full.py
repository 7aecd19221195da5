"""``strom.aio.Producer`` with its buffer full: a send waiting for space must neither hold
the event loop nor the threads other aio calls need (real cluster; the partition's only
replica is SIGSTOPped, so nothing it holds is acknowledged and the buffer stays full)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from strom import aio
from strom.client.admin import Admin
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.errors import RequestTimedOutError
from tests.conftest import module_cluster, paused

pytestmark = pytest.mark.integration

cluster = module_cluster(nodes=2, controllers=1)
HEALED_CLUSTERS = ("cluster",)

#: The buffer, and sends that fill it: one fits, the next one cannot until the first is
#: acknowledged.
BUFFER = 1_000_000


def _topic_on(cluster: LocalCluster, topic: str, node_id: int) -> None:
    """``topic``, one partition whose only replica is node ``node_id``, serving."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, replica_assignment=[[node_id]])
    with Producer(cluster.bootstrap) as producer:  # waits for the leader (retries)
        producer.send(topic, b"warm").result(60)


class Ticker:
    """A task that sleeps 10 ms again and again: its ticks and the longest time the loop
    kept it waiting past its sleep show whether something held the event loop."""

    def __init__(self) -> None:
        self.ticks = 0
        self.max_lag = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(0.01)
            self.max_lag = max(self.max_lag, time.monotonic() - start - 0.01)
            self.ticks += 1

    async def until(self, ticks: int, unless: asyncio.Task[Any]) -> None:
        """Wait until ``ticks`` more ticks ran, or ``unless`` is done."""
        end = self.ticks + ticks
        while self.ticks < end and not unless.done():
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        self._task.cancel()


def test_a_send_waiting_for_buffer_space_leaves_the_event_loop_free(
    cluster: LocalCluster,
) -> None:
    """Found from outside: with the buffer past half full, ``await producer.send()`` of a
    record that did not fit ran the sync send on the event loop, which waited there for
    space: the loop froze for ``max_block_ms`` (8 s). The loop now only tries to append;
    the send waits in the producer's sending thread while the loop runs, and completes once
    the node is back."""
    topic = "aio-full-loop"
    _topic_on(cluster, topic, 2)
    max_block_s = 8.0

    async def main() -> tuple[int, float, bool]:
        producer = aio.Producer(
            cluster.bootstrap,
            buffer_memory=BUFFER,
            linger_ms=0,
            max_block_ms=int(max_block_s * 1000),
            request_timeout_ms=60_000,
        )
        ticker = Ticker()
        with paused(cluster.node(2)):
            first = await producer.send(topic, b"a" * 460_000)  # fits: queued at once
            ticks = ticker.ticks
            waiting = asyncio.create_task(producer.send(topic, b"b" * 600_000))
            await ticker.until(20, unless=waiting)
            still_waiting = not waiting.done()
            ran, lag = ticker.ticks - ticks, ticker.max_lag
        ticker.stop()
        async with asyncio.timeout(120):  # (only so that a regression fails, not hangs)
            # The node is back: room, and the record is written (or max_block_ms passed
            # before the node freed room: the sync send's timeout error).
            with contextlib.suppress(RequestTimedOutError):
                await (await waiting)
            await first
            await producer.close()
        return ran, lag, still_waiting

    ran, lag, still_waiting = asyncio.run(main())
    assert still_waiting, "the send did not wait for space off the loop"
    assert ran >= 20 and lag < max_block_s / 2


def test_sends_waiting_for_buffer_space_do_not_hold_up_other_aio_calls(
    cluster: LocalCluster,
) -> None:
    """Found from outside: each send waiting for space held a default-executor thread for
    up to ``max_block_ms``, so ``admin.list_topics()`` and a consumer's ``end_offsets``
    queued behind them (39 s). Sends now wait in their producer's own thread, and the other
    clients have threads of their own: both answer while the sends still wait."""
    topic = "aio-full-starve"
    _topic_on(cluster, topic, 2)
    _topic_on(cluster, f"{topic}-ok", 1)
    healthy = TopicPartition(f"{topic}-ok", 0)

    async def main() -> tuple[bool, dict[TopicPartition, int], set[type]]:
        producer = aio.Producer(
            cluster.bootstrap, buffer_memory=BUFFER, linger_ms=0, max_block_ms=30_000
        )
        async with (
            aio.Admin(cluster.bootstrap) as admin,
            aio.Consumer(cluster.bootstrap) as consumer,
        ):
            with paused(cluster.node(2)):
                await producer.send(topic, b"a" * 600_000)
                sends = [
                    asyncio.create_task(producer.send(topic, b"x" * 100_000)) for _ in range(30)
                ]
                async with asyncio.timeout(120):  # (only so that a regression fails)
                    topics = await admin.list_topics()
                    ends = await consumer.end_offsets([healthy])
                answered_while_waiting = not all(s.done() for s in sends)
                assert topic in topics
            async with asyncio.timeout(120):
                outcomes = await asyncio.gather(*sends, return_exceptions=True)
                await producer.close()
        return answered_while_waiting, ends, {type(o) for o in outcomes}

    answered_while_waiting, ends, outcomes = asyncio.run(main())
    assert answered_while_waiting, "the other calls waited for the sends"
    assert ends == {healthy: 1}
    assert outcomes <= {asyncio.Future, RequestTimedOutError}
