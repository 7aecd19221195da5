"""``strom.aio``: the asyncio clients against a real local cluster."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from strom import aio
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import RecordMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bootstrap(one_node_cluster: LocalCluster) -> str:
    return one_node_cluster.bootstrap


def test_admin_producer_and_consumer_never_block_the_loop(bootstrap: str) -> None:
    async def main() -> None:
        ticks = 0

        async def ticker() -> None:  # proves the loop keeps running while clients wait
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        async with aio.Admin(bootstrap) as admin:
            await admin.create_topic("events", partitions=2, replication_factor=1)
            assert "events" in await admin.list_topics()
            desc = await admin.describe_topic("events")
            assert len(desc.partitions) == 2
        async with aio.Producer(bootstrap, acks="all") as producer:
            md = await producer.send_and_wait("events", b"one", partition=0)
            assert isinstance(md, RecordMetadata) and (md.partition, md.offset) == (0, 0)
            futures = [await producer.send("events", b"v%d" % i, partition=1) for i in range(50)]
            offsets = [(await f).offset for f in futures]
            assert offsets == list(range(50))
            chunks = await producer.send_batch(
                "events", [b"b%d" % i for i in range(100)], partition=0
            )
            assert sum(c.count for c in chunks) == 100
        async with aio.Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
            await consumer.assign([TopicPartition("events", 0), TopicPartition("events", 1)])
            got = []
            async for record in consumer:
                got.append(record)
                if len(got) == 151:
                    break
            by_part = {p: [r.value for r in got if r.partition == p] for p in (0, 1)}
            assert by_part[0] == [b"one"] + [b"b%d" % i for i in range(100)]
            assert by_part[1] == [b"v%d" % i for i in range(50)]
            assert await consumer.end_offsets([TopicPartition("events", 1)]) == {
                TopicPartition("events", 1): 50
            }
            assert (await consumer.poll_arrow(timeout_ms=50)).num_rows == 0
        tick_task.cancel()
        assert ticks > 0

    asyncio.run(main())


def _hundred_records(cluster: LocalCluster, topic: str) -> TopicPartition:
    create_topic(cluster, topic)
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch(topic, [b"r%d" % i for i in range(100)], partition=0).result(10)
    return TopicPartition(topic, 0)


def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    with Consumer(bootstrap, group_id=group) as consumer:
        om = consumer.committed(tp)
        return None if om is None else om.offset


def test_async_for_left_early_commits_only_what_it_handed_out(
    one_node_cluster: LocalCluster,
) -> None:
    """A ``break`` after 10 of 100 polled records, then ``async with``'s close: the group
    commits 10, as the sync consumer does (found from outside: it committed 100, and the 90
    records were never read by anyone)."""
    tp = _hundred_records(one_node_cluster, "aio-break")

    async def main() -> list[int]:
        seen = []
        async with aio.Consumer(
            one_node_cluster.bootstrap, group_id="aio-break", auto_offset_reset="earliest"
        ) as consumer:
            await consumer.subscribe(["aio-break"])
            async for record in consumer:
                seen.append(record.offset)
                if len(seen) == 10:
                    break
            async with asyncio.timeout(60):  # (only so that a regression fails, not hangs)
                async for record in consumer:  # a new loop starts where the last one stopped
                    seen.append(record.offset)
                    if len(seen) == 15:
                        break
        return seen

    assert asyncio.run(main()) == list(range(15))
    assert _committed(one_node_cluster.bootstrap, "aio-break", tp) == 15


def test_a_commit_in_the_body_of_async_for_covers_the_records_handed_out(
    one_node_cluster: LocalCluster,
) -> None:
    """``await consumer.commit()`` inside ``async for`` commits through the record in hand,
    not through the rest of the poll (as the sync iterator and kafka-python do)."""
    tp = _hundred_records(one_node_cluster, "aio-commit")

    async def main() -> list[tuple[int, int | None]]:
        pairs = []
        async with aio.Consumer(
            one_node_cluster.bootstrap,
            group_id="aio-commit",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        ) as consumer:
            await consumer.subscribe(["aio-commit"])
            async for record in consumer:
                await consumer.commit()
                om = await consumer.committed(tp)
                pairs.append((record.offset, None if om is None else om.offset))
                if len(pairs) == 3:
                    break
        return pairs

    assert asyncio.run(main()) == [(0, 1), (1, 2), (2, 3)]
    assert _committed(one_node_cluster.bootstrap, "aio-commit", tp) == 3


def test_async_for_cancelled_in_its_body_commits_only_what_it_handed_out(
    one_node_cluster: LocalCluster,
) -> None:
    """A task cancelled while handling its 10th record leaves 10 committed, not the poll."""
    tp = _hundred_records(one_node_cluster, "aio-cancel")

    async def main() -> None:
        handled = asyncio.Event()
        seen = []

        async def read(consumer: aio.Consumer) -> None:
            async for record in consumer:
                seen.append(record.offset)
                if len(seen) == 10:
                    handled.set()
                    await asyncio.Event().wait()  # handling the record: cancelled here

        async with aio.Consumer(
            one_node_cluster.bootstrap, group_id="aio-cancel", auto_offset_reset="earliest"
        ) as consumer:
            await consumer.subscribe(["aio-cancel"])
            task = asyncio.create_task(read(consumer))
            await handled.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert seen == list(range(10))

    asyncio.run(main())
    # The 10th record was being handled, not done: at-least-once reads it again.
    assert _committed(one_node_cluster.bootstrap, "aio-cancel", tp) == 10


def test_close_takes_the_sync_close_s_arguments(one_node_cluster: LocalCluster) -> None:
    """``await consumer.close(autocommit=False, timeout_ms=...)`` as the sync consumer's."""
    tp = _hundred_records(one_node_cluster, "aio-close-args")

    async def main() -> None:
        consumer = aio.Consumer(
            one_node_cluster.bootstrap, group_id="aio-close-args", auto_offset_reset="earliest"
        )
        await consumer.subscribe(["aio-close-args"])
        async with asyncio.timeout(60):  # (only so that a regression fails, not hangs)
            async for _ in consumer:
                break
        await consumer.close(autocommit=False, timeout_ms=5000)
        assert consumer.closed

    asyncio.run(main())
    assert _committed(one_node_cluster.bootstrap, "aio-close-args", tp) is None


def test_pause_inside_async_for_loses_nothing(one_node_cluster: LocalCluster) -> None:
    """pause() + resume() of the record's own partition in the body of ``async for``: the
    records of the poll behind it come again (found from outside: offsets 3-9 of 10 never
    came back, as with the sync loop)."""
    tp = _hundred_records(one_node_cluster, "aio-pause")

    async def main() -> tuple[list[int], int | None]:
        seen, at_pause = [], None
        async with aio.Consumer(
            one_node_cluster.bootstrap, group_id="aio-pause", auto_offset_reset="earliest"
        ) as consumer:
            await consumer.assign([tp])
            await consumer.position(tp)
            # All 100 fetched before the loop: its first poll holds records behind the pause.
            fetched = lambda: consumer.highwater(tp) == 100  # noqa: E731
            await asyncio.to_thread(lambda: wait_for(fetched, timeout=10, what="the fetch"))
            async with asyncio.timeout(30):  # (only so that a regression fails, not hangs)
                async for record in consumer:
                    seen.append(record.offset)
                    if record.offset == 2:
                        consumer.pause([tp])
                        at_pause = await consumer.position(tp)
                        consumer.resume([tp])
                    if len(seen) == 100:
                        break
        return seen, at_pause

    assert asyncio.run(main()) == (list(range(100)), 3)


@pytest.mark.parametrize("method", ["poll", "poll_arrow"])
def test_a_cancelled_poll_loses_no_records(one_node_cluster: LocalCluster, method: str) -> None:
    """``asyncio.wait_for(consumer.poll(...), ...)`` timing out while records are on their
    way: the worker thread's poll still takes them, and they go back for the next poll
    (found from outside: the next polls returned nothing and the position was past them)."""
    topic = f"aio-cancel-{method.replace('_', '-')}"
    create_topic(one_node_cluster, topic)
    tp = TopicPartition(topic, 0)

    async def main() -> list[int]:
        async with aio.Consumer(
            one_node_cluster.bootstrap, group_id=topic, auto_offset_reset="earliest"
        ) as consumer:
            await consumer.assign([tp])
            assert await consumer.position(tp) == 0
            poll = getattr(consumer, method)
            task = asyncio.create_task(poll(60_000))
            group = consumer._sync._group
            async with asyncio.timeout(30):  # (only so that a regression fails, not hangs)
                while not group._polling:  # the poll waits in its worker thread
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                async with aio.Producer(one_node_cluster.bootstrap) as producer:
                    for i in range(5):
                        await producer.send(topic, b"v%d" % i, partition=0)
                while group._polling:  # the abandoned poll took them and returned
                    await asyncio.sleep(0.01)
                got: list[int] = []
                while len(got) < 5:
                    out = await poll(1000)
                    got += (
                        [r.offset for r in out] if method == "poll" else out["offset"].to_pylist()
                    )
            return got

    assert asyncio.run(main()) == list(range(5))


def test_after_a_cancelled_poll_the_next_poll_and_close_do_not_wait_it_out(
    one_node_cluster: LocalCluster,
) -> None:
    """Found from outside on the re-check: after ``wait_for(consumer.poll(20000), 0.5)``
    timed out, ``poll(0)`` and ``close()`` each waited for the abandoned 20 s poll (19.5 s),
    since they must let its thread put its records back first. The thread now polls in short
    slices and stops after the one it is in, so neither waits out the poll's timeout."""
    topic = "aio-abandoned"
    create_topic(one_node_cluster, topic)
    tp = TopicPartition(topic, 0)

    async def main() -> None:
        consumer = aio.Consumer(
            one_node_cluster.bootstrap, auto_offset_reset="earliest", request_timeout_ms=600_000
        )
        await consumer.assign([tp])
        # The bounds below are far under the abandoned polls' 600 s (and the request timeout
        # the old code waited for them), only so that a regression fails instead of hanging.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.poll(600_000), 0.3)
        async with asyncio.timeout(60):
            assert await consumer.poll(0) == []
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.poll(600_000), 0.3)
        async with asyncio.timeout(60):
            await consumer.close()
        assert consumer.closed

    asyncio.run(main())


@pytest.mark.parametrize("revoked_style", ["plain", "coroutine"])
def test_rebalance_listener_methods_run_and_a_commit_in_them_is_committed(
    one_node_cluster: LocalCluster, revoked_style: str
) -> None:
    """Found from outside: an ``async def`` listener method was called and never awaited,
    and a plain one's ``consumer.commit()`` returned a coroutine, so nothing was committed
    and the partition's next owner read it again. Here a second member joins: the first
    one's ``on_partitions_revoked`` commits (``consumer.commit()`` in a plain method,
    ``await consumer.commit()`` in a coroutine), and the commit is there afterwards."""
    topic = f"aio-listener-{revoked_style}"
    create_topic(one_node_cluster, topic, partitions=2)
    with Producer(one_node_cluster.bootstrap) as producer:
        for p in (0, 1):
            producer.send_batch(topic, [b"r%d" % i for i in range(20)], partition=p).result(10)
    group = topic
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    async def main() -> list[tuple[str, list[TopicPartition]]]:
        loop = asyncio.get_running_loop()
        calls: list[tuple[str, list[TopicPartition]]] = []
        settings: dict[str, object] = {
            "group_id": group,
            "auto_offset_reset": "earliest",
            "enable_auto_commit": False,
        }
        first = aio.Consumer(one_node_cluster.bootstrap, **settings)

        class Listener:
            async def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
                assert asyncio.get_running_loop() is loop
                await asyncio.sleep(0)
                calls.append(("assigned", parts))

            if revoked_style == "plain":

                def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
                    assert first.commit() is None  # synchronous here, not a coroutine
                    calls.append(("revoked", parts))

            else:

                async def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
                    await first.commit()
                    calls.append(("revoked", parts))

        await first.subscribe([topic], listener=Listener())
        read = 0
        async with asyncio.timeout(60):  # (only so that a regression fails, not hangs)
            while read < 40:
                read += len(await first.poll(200))
            assert calls == [("assigned", tps)]
            async with aio.Consumer(one_node_cluster.bootstrap, **settings) as second:
                await second.subscribe([topic])
                while not any(name == "revoked" for name, _ in calls):
                    assert await first.poll(200) == []
                assert calls[1][0] == "revoked" and len(calls[1][1]) == 1
                # committed before the partition moved, not by a later close
                om = await second.committed(calls[1][1][0])
                assert om is not None and om.offset == 20
            await first.close(autocommit=False)
        return calls

    calls = asyncio.run(main())
    assert calls[0] == ("assigned", tps)


def test_a_poll_that_must_look_up_positions_leaves_the_loop_free(
    one_node_cluster: LocalCluster,
) -> None:
    """Found from outside: ``await consumer.poll(0)`` ran the sync poll on the event loop
    whenever no rebalance was pending (always, with ``assign()``), and so also the lookups
    of partitions without a position (the group's committed offsets, ListOffsets): a round
    trip or two each time, and up to a second per poll while the group coordinator failed
    over, with every other task of the loop stopped. Such a poll now runs in a worker
    thread; the lookups are seen there, never on the loop's thread."""
    topic = "aio-lookups-off-loop"
    create_topic(one_node_cluster, topic, partitions=2)
    with Producer(one_node_cluster.bootstrap) as producer:
        for p in (0, 1):
            producer.send_batch(topic, [b"r%d" % i for i in range(5)], partition=p).result(10)

    async def main() -> tuple[set[str], int]:
        loop_thread = threading.current_thread().name
        seen: set[str] = set()
        async with aio.Consumer(
            one_node_cluster.bootstrap, group_id=topic, auto_offset_reset="earliest"
        ) as consumer:
            sync = consumer._sync
            lookups = (sync._update_positions, sync._list_offsets)

            def watched(fn: Any) -> Any:
                def call(*args: Any, **kwargs: Any) -> Any:
                    if sync._fetcher.needing_positions():
                        seen.add(threading.current_thread().name)
                    return fn(*args, **kwargs)

                return call

            sync._update_positions = watched(lookups[0])
            sync._list_offsets = watched(lookups[1])
            tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
            await consumer.assign(tps)  # no rebalance: only the lookups could send it away
            async with asyncio.timeout(60):  # (only so that a regression fails, not hangs)
                for _ in range(2):
                    read = 0
                    while read < 10:
                        read += len(await consumer.poll(0))
                        await asyncio.sleep(0.01)
                    await consumer.seek_to_beginning(tps)  # a lookup again (ListOffsets)
        return seen - {loop_thread}, len(seen & {loop_thread})

    elsewhere, on_loop = asyncio.run(main())
    assert elsewhere, "no position was looked up at all"
    assert on_loop == 0, "a position lookup ran on the event loop's thread"


def test_after_flush_every_callback_ran_and_every_future_is_done(
    one_node_cluster: LocalCluster,
) -> None:
    """``await producer.flush()`` returns after the delivery callbacks of the records it
    waited for (the sync flush's promise) and with their asyncio futures done."""
    create_topic(one_node_cluster, "aio-flush", partitions=2)

    async def main() -> None:
        ran = 0

        def callback(md: Any, err: Any) -> None:
            nonlocal ran
            ran += 1

        async with aio.Producer(one_node_cluster.bootstrap, linger_ms=20) as producer:
            futures = [
                await producer.send("aio-flush", b"v%d" % i, callback=callback) for i in range(2000)
            ]
            await producer.flush()
            assert ran == 2000
            assert all(f.done() for f in futures)

    asyncio.run(main())


def test_other_tasks_may_use_the_consumer_while_a_poll_waits(
    one_node_cluster: LocalCluster,
) -> None:
    """The sync consumer refuses a second thread inside it (ConcurrentModificationError), and
    the aio consumer runs a waiting poll in a worker thread: other tasks of the loop calling
    position(), commit(), pause() and resume() meanwhile — as aiokafka users do — were
    refused too. The aio consumer runs one poll at a time itself; the others go through."""
    topic = "aio-beside-a-poll"
    create_topic(one_node_cluster, topic)
    tp = TopicPartition(topic, 0)
    with Producer(one_node_cluster.bootstrap) as producer:
        producer.send_batch(topic, [b"r%d" % i for i in range(5)], partition=0).result(10)

    async def main() -> tuple[int, list[BaseException]]:
        errors: list[BaseException] = []
        async with aio.Consumer(
            one_node_cluster.bootstrap, group_id=topic, auto_offset_reset="earliest"
        ) as consumer:
            await consumer.assign([tp])
            got = len(await consumer.poll(5000))
            polling = asyncio.create_task(consumer.poll(3000))  # nothing more: it waits

            async def beside() -> None:
                while not polling.done():
                    try:
                        assert await consumer.position(tp) == 5
                        await consumer.commit()
                        consumer.pause([tp])
                        consumer.resume([tp])
                    except Exception as exc:  # what the loop would see
                        errors.append(exc)
                    await asyncio.sleep(0.05)

            await asyncio.gather(polling, beside())
            assert (await consumer.committed(tp)).offset == 5
        return got, errors

    got, errors = asyncio.run(main())
    assert got == 5
    assert errors == []


def test_async_with_transaction_commits_the_block_and_aborts_a_block_that_raised(
    one_node_cluster: LocalCluster,
) -> None:
    """strom.aio had no transaction() (a user wrote begin/commit/abort by hand) and no
    prepare_transaction(); the block's calls must not hold the loop either."""
    create_topic(one_node_cluster, "aio-txn")
    tp = TopicPartition("aio-txn", 0)

    async def main() -> Any:
        async with aio.Producer(one_node_cluster.bootstrap, transactional_id="aio-txn") as p:
            await p.init_transactions()
            async with p.transaction():
                await p.send("aio-txn", b"committed")
            with pytest.raises(ValueError):
                async with p.transaction():
                    await p.send("aio-txn", b"aborted")
                    raise ValueError("the block failed")
            p.begin_transaction()
            await p.send("aio-txn", b"prepared")
            return await p.prepare_transaction()

    prepared = asyncio.run(main())
    assert prepared.transactional_id == "aio-txn" and not prepared.empty
    with Consumer(
        one_node_cluster.bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    ) as c:
        c.assign([tp])
        values: list[bytes | None] = []
        wait_for(
            lambda: values.extend(r.value for r in c.poll(timeout_ms=200)) or values,
            timeout=30,
            what="the committed record",
        )
        # Below the prepared transaction's first offset (the LSO): the committed one only.
        assert values == [b"committed"]
        assert c.end_offsets([tp])[tp] == 4  # committed, marker, aborted, marker


async def _offsets_of(consumer: aio.Consumer, how: str, timeout_ms: int) -> list[int]:
    """One poll of ``consumer`` made ``how`` (``poll``, ``poll_arrow`` or an ``async for``
    left after its first record): the offsets it handed out."""
    if how == "poll":
        return [r.offset for r in await consumer.poll(timeout_ms)]
    if how == "poll_arrow":
        return list((await consumer.poll_arrow(timeout_ms))["offset"].to_pylist())
    async for record in consumer:
        return [record.offset]
    return []


@pytest.mark.parametrize(
    ("cancelled", "then"),
    [("poll", "iter"), ("poll_arrow", "iter"), ("poll_arrow", "poll"), ("poll", "poll_arrow")],
)
def test_polls_after_cancelled_polls_never_skip_or_commit_past_a_record(
    one_node_cluster: LocalCluster, cancelled: str, then: str
) -> None:
    """Found from outside: ``async for`` right after a poll cancelled by ``wait_for`` did not
    wait for that poll's worker thread, so two sync polls ran at once over the same
    positions: offsets were skipped and committed past (and ``poll_arrow``'s fetcher raised
    IndexError). Here polls are cancelled again and again while records arrive, each
    followed by another kind of poll; every offset below the final commit was handed out."""
    topic = f"aio-race-{cancelled}-{then}".replace("_", "-")
    create_topic(one_node_cluster, topic)
    tp = TopicPartition(topic, 0)

    async def main() -> tuple[set[int], int]:
        seen: set[int] = set()
        stop = asyncio.Event()
        producer = aio.Producer(one_node_cluster.bootstrap, linger_ms=2)

        async def feed() -> None:
            i = 0
            while not stop.is_set():
                await producer.send(topic, b"%d" % i, partition=0)
                i += 1
                await asyncio.sleep(0.003)

        feeder = asyncio.create_task(feed())
        consumer = aio.Consumer(
            one_node_cluster.bootstrap,
            group_id=topic,
            auto_offset_reset="earliest",
            max_poll_records=20,
        )
        await consumer.subscribe([topic])
        async with asyncio.timeout(240):  # (only so that a regression fails, not hangs)
            for _ in range(150):
                with contextlib.suppress(TimeoutError):
                    seen.update(
                        await asyncio.wait_for(_offsets_of(consumer, cancelled, 2000), 0.02)
                    )
                seen.update(await _offsets_of(consumer, then, 500))
            stop.set()
            await feeder
            await producer.close()
            await consumer.close()  # commits what was handed out
        committed = _committed(one_node_cluster.bootstrap, topic, tp)
        assert committed is not None
        return seen, committed

    seen, committed = asyncio.run(main())
    assert committed > 20
    assert sorted(set(range(committed)) - seen) == []


def test_many_consumers_whose_async_listeners_await_consumer_calls_do_not_deadlock(
    one_node_cluster: LocalCluster,
) -> None:
    """Found from outside: with more aio consumers than the default executor has threads
    (min(32, cpus + 4)), each rebalancing poll held one of its threads waiting for its
    listener coroutine, whose ``await consumer.commit()`` queued behind those very threads:
    every consumer hung. The aio clients now have threads of their own; the default
    executor (two threads here, so that eight consumers are more than it has) stays the
    application's, and the listeners' ``asyncio.to_thread`` runs in it too."""
    topic = "aio-many-listeners"
    create_topic(one_node_cluster, topic)
    with Producer(one_node_cluster.bootstrap) as producer:
        producer.send_batch(topic, [b"r%d" % i for i in range(10)], partition=0).result(10)
    members = 8

    async def member(i: int, assigned: list[int]) -> int:
        consumer = aio.Consumer(
            one_node_cluster.bootstrap, group_id=f"{topic}-{i}", auto_offset_reset="earliest"
        )

        class Listener:
            async def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
                await consumer.commit()

            async def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
                await consumer.committed(set(parts))
                await asyncio.to_thread(time.monotonic)
                assigned.append(i)

        await consumer.subscribe([topic], listener=Listener())
        read = 0
        while read < 10:
            read += len(await consumer.poll(500))
        await consumer.close()
        return read

    async def main() -> tuple[list[int], list[int]]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        assigned: list[int] = []
        async with asyncio.timeout(120):  # (only so that a regression fails, not hangs)
            reads = await asyncio.gather(*(member(i, assigned) for i in range(members)))
        return reads, assigned

    reads, assigned = asyncio.run(main())
    assert reads == [10] * members
    assert sorted(assigned) == list(range(members))


def test_a_consumer_with_a_coroutine_listener_refuses_another_event_loop(
    one_node_cluster: LocalCluster,
) -> None:
    """Found from outside: subscribed with a coroutine listener inside one ``asyncio.run()``
    and polled in the next, the listener's calls only logged "Event loop is closed" and the
    partitions moved without the revoke's commit. Now polling or closing from another loop
    raises RuntimeError naming the cause (as aiokafka refuses a consumer from another loop);
    subscribing again on the new loop makes it that loop's."""
    topic = "aio-two-loops"
    create_topic(one_node_cluster, topic)
    consumer = aio.Consumer(one_node_cluster.bootstrap, group_id=topic)

    class Listener:
        async def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
            await consumer.commit()

    asyncio.run(consumer.subscribe([topic], listener=Listener()))

    async def elsewhere() -> None:
        for call in (consumer.poll(0), consumer.poll_arrow(0), consumer.close()):
            with pytest.raises(RuntimeError, match="another event loop"):
                await call
        with pytest.raises(RuntimeError, match="another event loop"):
            async for _ in consumer:
                pass
        await consumer.subscribe([topic], listener=Listener())  # now this loop's
        assert await consumer.poll(0) == []
        await consumer.close()

    asyncio.run(elsewhere())
    assert consumer.closed


def _watchdog_alive() -> bool:
    gc.collect()  # (streams are watched through weak references)
    return any(t.name == "strom-stream-watchdog" for t in threading.enumerate())


def test_the_stream_watchdog_ends_when_the_last_client_is_closed(
    one_node_cluster: LocalCluster,
) -> None:
    """Found from outside: the ``strom-stream-watchdog`` thread that times out the clients'
    gRPC streams stayed alive after every client was closed, waking every 250 ms. It now
    stops watching ended streams and ends when none is left (the next stream starts it)."""
    topic = "aio-watchdog"
    create_topic(one_node_cluster, topic)

    async def main() -> None:
        async with aio.Producer(one_node_cluster.bootstrap) as producer:
            await producer.send_and_wait(topic, b"v", partition=0)
            assert _watchdog_alive()
        async with aio.Consumer(one_node_cluster.bootstrap, auto_offset_reset="earliest") as c:
            await c.assign([TopicPartition(topic, 0)])
            async with asyncio.timeout(60):
                while not await c.poll(200):
                    pass

    for _ in range(2):  # and once it ended, the next client's streams start it again
        asyncio.run(main())
        wait_for(lambda: not _watchdog_alive(), timeout=30, what="the watchdog to end")


def test_a_poll_inside_the_consumer_s_own_async_listener_is_refused(
    one_node_cluster: LocalCluster,
) -> None:
    """Every poll waits for the one before it to settle, and the poll that runs a listener
    waits for the listener: a poll (or close) inside that listener would wait for itself.
    It raises RuntimeError instead; the listener's commit still works."""
    topic = "aio-listener-polls"
    create_topic(one_node_cluster, topic)

    async def main() -> list[str]:
        errors: list[str] = []
        consumer = aio.Consumer(one_node_cluster.bootstrap, group_id=topic)

        class Listener:
            async def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
                await consumer.commit()
                for call in (consumer.poll(0), consumer.close()):
                    try:
                        await call
                    except RuntimeError as exc:
                        errors.append(str(exc))

        await consumer.subscribe([topic], listener=Listener())
        async with asyncio.timeout(60):  # (only so that a regression fails, not hangs)
            while not consumer.assignment():
                await consumer.poll(100)
            await consumer.close()
        return errors

    errors = asyncio.run(main())
    assert len(errors) == 2 and all(
        "inside this consumer's rebalance listener" in e for e in errors
    )
