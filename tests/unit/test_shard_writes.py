"""The coordinator's shard write queue (strom.coordinator.shard_writes): what queues while an
append is in flight goes out as one batch, in order, with consecutive sequences; a failed append
fails everything queued behind it and reloads the shard; nothing is answered from state that is
not durable. The storage node is a fake ``_produce`` (what it does with the batch is the
integration tests' business: tests/integration/test_coordinator_shards.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from strom.coordinator.offsets_log import (
    CONSUMER_OFFSETS_TOPIC,
    GroupRecord,
    OffsetAndMetadata,
    ShardState,
    offset_commit_record,
)
from strom.coordinator.shard_writes import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, ShardWrites
from strom.coordinator.shards import Shard, ShardKind
from strom.coordinator.storage_io import ShardLost
from strom.errors import NotCoordinatorError, RequestTimedOutError, StromError
from strom.record.header import read_header


class FakeNode:
    """Appends held until the test lets each go; what each carried."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.gates: list[asyncio.Future[None]] = []

    def arrived(self) -> int:
        return len(self.gates)

    async def produce(self, partition: int, batch: bytes, topic: str) -> int:
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate  # raises what the test sets
        self.batches.append(batch)
        return 0

    def answer(self, n: int, exc: BaseException | None = None) -> None:
        if exc is None:
            self.gates[n].set_result(None)
        else:
            self.gates[n].set_exception(exc)


class Writes(ShardWrites):
    """ShardWrites with the rest of the coordinator reduced to what it calls."""

    def __init__(self, node: FakeNode) -> None:
        self.coordinator_id = 1
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.node = node
        self.loads: list[int] = []
        self.unloads: list[int] = []

    async def _produce(self, partition: int, batch: bytes, topic: str = "") -> int:
        return await self.node.produce(partition, batch, topic)

    def _start_load(self, shard: Shard) -> None:
        shard.loaded = False
        shard.generation += 1
        self.loads.append(shard.index)

    def _unload(self, shard: Shard) -> None:
        shard.loaded = False
        shard.generation += 1
        self.unloads.append(shard.index)


def _shard() -> Shard:
    kind = ShardKind(
        name="group",
        topic=CONSUMER_OFFSETS_TOPIC,
        partitions=1,
        replication_factor=1,
        key=lambda keys, s: "",
        owners=lambda view: {},
        new_state=ShardState,
    )
    shard = Shard(index=0, kind=kind, loaded=True, durable=ShardState())
    shard.producer_id, shard.producer_epoch, shard.next_sequence = 42, 3, 1
    kind.shards[0] = shard
    return shard


def _commit(group: str, offset: int) -> list[GroupRecord]:
    return [offset_commit_record(group, "t", 0, OffsetAndMetadata(offset=offset))]


async def _until(cond: Any) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def _one_in_flight() -> tuple[FakeNode, Writes, Shard, asyncio.Future[None]]:
    """A shard whose first write (g0 at 10) is at the node, unanswered."""
    node = FakeNode()
    w, shard = Writes(node), _shard()
    first = w._queue_write(shard, _commit("g0", 10))
    await _until(lambda: node.arrived() == 1)
    return node, w, shard, first


async def _answer_in_turn(node: FakeNode, appends: int) -> None:
    """Answer the appends 0 .. ``appends``-1 (the first already at the node), each once it
    has arrived: the writer sends the next one only after the last was answered."""
    for n in range(appends):
        await _until(lambda n=n: node.arrived() == n + 1)
        node.answer(n)


def test_writes_queued_behind_an_append_go_out_together_in_order() -> None:
    async def main() -> None:
        node, w, shard, first = await _one_in_flight()
        later = [w._queue_write(shard, _commit(f"g{i}", 10 + i)) for i in range(1, 30)]
        later.append(w._queue_write(shard, _commit("g1", 99)))  # the same key again, later
        barrier = asyncio.ensure_future(w._durable(shard))
        await asyncio.sleep(0)
        assert not any(f.done() for f in [first, *later]) and not barrier.done()

        node.answer(0)
        await first
        await _until(lambda: node.arrived() == 2)  # everything else: one append
        assert not barrier.done(), "a read waited only for the first write"
        node.answer(1)
        await asyncio.gather(*later, barrier)

        headers = [read_header(b) for b in node.batches]
        assert [(h.producer_id, h.producer_epoch) for h in headers] == [(42, 3), (42, 3)]
        assert [(h.base_sequence, h.record_count) for h in headers] == [(1, 1), (2, 30)]
        assert shard.next_sequence == 32
        # The durable mirror saw them in order: the later commit of g1 wins.
        assert shard.durable.offsets("g1")[("t", 0)].offset == 99
        assert shard.durable.offsets("g29")[("t", 0)].offset == 39
        assert w.loads == [] and w.unloads == []

    asyncio.run(main())


def test_a_failed_append_fails_every_write_behind_it_and_reloads_the_shard() -> None:
    async def main() -> None:
        node, w, shard, first = await _one_in_flight()
        behind = [w._queue_write(shard, _commit(f"g{i}", i)) for i in range(1, 5)]
        barrier = asyncio.ensure_future(w._durable(shard))

        node.answer(0, StromError("leader gone", retriable=True))
        for f in [first, *behind]:
            with pytest.raises(RequestTimedOutError, match="leader gone"):
                await f
        with pytest.raises(RequestTimedOutError):
            await barrier
        assert w.loads == [0] and node.arrived() == 1, "a write behind the failure was sent"
        assert shard.next_sequence == 1 and shard.durable.offsets("g0") == {}

    asyncio.run(main())


def test_a_fenced_append_drops_the_shard_and_answers_not_coordinator() -> None:
    async def main() -> None:
        node, w, shard, first = await _one_in_flight()
        second = w._queue_write(shard, _commit("g1", 10))
        node.answer(0, ShardLost("INVALID_PRODUCER_EPOCH"))
        for f in (first, second):
            with pytest.raises(NotCoordinatorError):
                await f
        assert w.unloads == [0] and w.loads == []

    asyncio.run(main())


def test_a_write_of_an_older_generation_is_never_appended() -> None:
    """Queued before a reload, appended after it, it would carry the new producer epoch and
    sequences for state the reload threw away."""

    async def main() -> None:
        node, w, shard, first = await _one_in_flight()
        stale = w._queue_write(shard, _commit("g1", 10))
        shard.generation += 1  # reloaded meanwhile (by the ownership loop, say)
        node.answer(0)
        await first  # it was appended: durable, whatever the reload does
        with pytest.raises(NotCoordinatorError):
            await stale
        assert node.arrived() == 1
        assert shard.next_sequence == 1, "the old generation's append moved the new sequences"

    asyncio.run(main())


def test_a_waiter_that_gives_up_leaves_its_append_counted() -> None:
    """The caller's RPC is cancelled while its append is in flight: the append still lands,
    and the next write must not reuse its sequences (the node would take it for a retry)."""

    async def main() -> None:
        node = FakeNode()
        w, shard = Writes(node), _shard()
        caller = asyncio.ensure_future(w._write(shard, _commit("g0", 10)))
        await _until(lambda: node.arrived() == 1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        node.answer(0)
        nxt = w._queue_write(shard, _commit("g0", 20))
        await _until(lambda: node.arrived() == 2)
        node.answer(1)
        await nxt
        assert [read_header(b).base_sequence for b in node.batches] == [1, 2]
        assert w.loads == []

    asyncio.run(main())


def test_a_batch_holds_at_most_max_batch_records() -> None:
    async def main() -> None:
        node, w, shard, first = await _one_in_flight()
        many = [w._queue_write(shard, _commit(f"g{i}", i)) for i in range(MAX_BATCH_RECORDS + 5)]
        await _answer_in_turn(node, 3)
        await asyncio.gather(first, *many)
        counts = [read_header(b).record_count for b in node.batches]
        assert counts == [1, MAX_BATCH_RECORDS, 5]

    asyncio.run(main())


def test_stopping_fails_the_queue_with_not_coordinator() -> None:
    async def main() -> None:
        _, w, shard, first = await _one_in_flight()
        second = w._queue_write(shard, _commit("g1", 10))
        w._stopping = True
        assert shard.writer is not None
        shard.writer.cancel()
        for f in (first, second):
            with pytest.raises(NotCoordinatorError):
                await f
        assert w.loads == [] and w.unloads == []

    asyncio.run(main())


def test_one_record_batches_append_each_operation_alone_in_order() -> None:
    """``--max-write-batch-records 1``: the queue still orders and counts, one write per append."""

    async def main() -> None:
        node = FakeNode()
        w, shard = Writes(node), _shard()
        w.max_write_batch_records = 1
        writes = [w._queue_write(shard, _commit(f"g{i}", i)) for i in range(4)]
        await _answer_in_turn(node, 4)
        await asyncio.gather(*writes)
        assert [(h.base_sequence, h.record_count) for h in map(read_header, node.batches)] == [
            (1, 1),
            (2, 1),
            (3, 1),
            (4, 1),
        ]

    asyncio.run(main())


def test_a_writer_cancelled_before_it_ran_fails_what_was_queued() -> None:
    """The coordinator stopping cancels every task, the writer perhaps before its first step:
    nothing queued may wait for ever."""

    async def main() -> None:
        node = FakeNode()
        w, shard = Writes(node), _shard()
        queued = w._queue_write(shard, _commit("g0", 10))
        w._stopping = True
        assert shard.writer is not None
        shard.writer.cancel()
        with pytest.raises(NotCoordinatorError):
            await queued
        assert node.arrived() == 0

    asyncio.run(main())


def test_a_batch_stops_at_max_batch_bytes() -> None:
    async def main() -> None:
        node, w, shard, first = await _one_in_flight()
        meta = "m" * (MAX_BATCH_BYTES // 3)
        big = [
            offset_commit_record(f"g{i}", "t", 0, OffsetAndMetadata(offset=i, metadata=meta))
            for i in range(4)
        ]
        many = [w._queue_write(shard, [r]) for r in big]
        await _answer_in_turn(node, 3)
        await asyncio.gather(first, *many)
        assert [read_header(b).record_count for b in node.batches] == [1, 2, 2]

    asyncio.run(main())


def test_after_a_failed_append_the_reloaded_shard_answers_reads_again() -> None:
    """A heartbeat or an OffsetFetch after the reload writes nothing and waits for the writes
    queued before it: the failed ones are not among them."""

    async def main() -> None:
        node, w, shard, failed = await _one_in_flight()
        node.answer(0, StromError("leader gone", retriable=True))
        with pytest.raises(RequestTimedOutError):
            await failed
        assert w.loads == [0]
        shard.loaded = True  # the reload finished
        await asyncio.wait_for(w._durable(shard), 1.0)  # returns: nothing of this generation
        nxt = w._queue_write(shard, _commit("g0", 11))
        await _until(lambda: node.arrived() == 2)
        node.answer(1)
        await nxt

    asyncio.run(main())
