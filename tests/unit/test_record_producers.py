"""The node's idempotent per-partition sender (RecordService's ProduceRecords path) against a
fake leader that keeps a log and producer state the way strom's leaders do: sequences,
duplicates answered with their original offsets, unknown producers, fenced epochs.

The fake is the network and the leader; the sender is the real engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import pyarrow as pa
import pytest

from strom.api import storage_pb2, storage_pb2_grpc
from strom.errors import DuplicateSequenceError, ErrorCode, RequestTimedOutError, StromError
from strom.metadata import RESYNC, WatchEvent
from strom.record import decode_batches
from strom.storage import record_producers
from strom.storage.metrics import CALLER_CLIENT_ID
from strom.storage.record_producers import (
    NodeProducer,
    PartitionSender,
    SequencedSender,
    TransportError,
)
from strom.storage.records_api import RecordService

E = ErrorCode


@dataclass
class FakeLeader:
    """A partition leader: the log (values), and per producer id its epoch, next sequence
    and the offsets of recent batches by sequence."""

    values: list[bytes] = field(default_factory=list)
    producers: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[list[tuple[int, int, int, int]]] = field(default_factory=list)
    #: The client id each request was sent for.
    client_ids: list[str] = field(default_factory=list)
    #: Faults for the next requests, in order: "transport" (nothing appended), "lost-answer"
    #: (appended, answer lost), "timeout" (appended, REQUEST_TIMED_OUT), "not-leader",
    #: "forget" (the producer state is gone), or None.
    faults: list[str | None] = field(default_factory=list)
    #: Values the leader refuses as INVALID_RECORD (a non-retriable refusal).
    poison: bytes = b"poison"
    gate: asyncio.Event | None = None

    async def produce(
        self,
        topic: str,
        partition: int,
        data: bytes,
        acks: int,
        timeout_s: float,
        client_id: str = "",
    ) -> storage_pb2.ProducePartitionResponse:
        if self.gate is not None:
            await self.gate.wait()
        batches = decode_batches(data)
        self.client_ids.append(client_id)
        self.requests.append(
            [(b.producer_id, b.producer_epoch, b.base_sequence, b.record_count) for b in batches]
        )
        fault = self.faults.pop(0) if self.faults else None
        if fault == "transport":
            raise TransportError("leader unreachable")
        if fault == "not-leader":
            return _answer(E.NOT_LEADER_OR_FOLLOWER)
        if fault == "forget":
            self.producers.clear()
        if any(self.poison in (r.value or b"") for b in batches for r in b.records()):
            return _answer(E.INVALID_RECORD)
        code, offset = self._append(batches)
        if fault == "lost-answer" and code == E.NONE:
            raise TransportError("answer lost")
        if fault == "timeout" and code == E.NONE:
            return _answer(E.REQUEST_TIMED_OUT)
        return _answer(code, offset)

    def _append(self, batches: list[Any]) -> tuple[int, int]:
        first = batches[0]
        pid, epoch, seq = first.producer_id, first.producer_epoch, first.base_sequence
        if pid < 0:
            base = len(self.values)
            for b in batches:
                self.values += [r.value for r in b.records()]
            return E.NONE, base
        state = self.producers.get(pid)
        if state is not None and epoch < state["epoch"]:
            return E.INVALID_PRODUCER_EPOCH, -1
        if state is not None and epoch == state["epoch"] and seq in state["offsets"]:
            return E.NONE, state["offsets"][seq]  # a retry: the original offset
        expected = 0 if state is None or epoch > state["epoch"] else state["next"]
        if seq != expected:
            return (E.UNKNOWN_PRODUCER_ID if state is None else E.OUT_OF_ORDER_SEQUENCE), -1
        state = self.producers.setdefault(pid, {"epoch": epoch, "next": 0, "offsets": {}})
        if epoch > state["epoch"]:
            state.update(epoch=epoch, next=0, offsets={})
        base = len(self.values)
        for b in batches:
            state["offsets"][b.base_sequence] = len(self.values)
            self.values += [r.value for r in b.records()]
            state["next"] = b.base_sequence + b.record_count
        return E.NONE, base


def _answer(code: int, offset: int = -1) -> storage_pb2.ProducePartitionResponse:
    return storage_pb2.ProducePartitionResponse(error_code=code, base_offset=offset)  # type: ignore[arg-type]


class Ids:
    """InitProducerId: id 7, epochs 0, 1, 2, ... (bumps keep the id)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    async def __call__(self, producer_id: int, epoch: int) -> tuple[int, int]:
        self.calls.append((producer_id, epoch))
        return 7, epoch + 1


def _values(*vals: str) -> pa.Table:
    return pa.table({"value": pa.array([v.encode() for v in vals], pa.binary())})


def _run(body: Callable[[FakeLeader, PartitionSender, Ids], Any], leader: FakeLeader) -> Any:
    async def main() -> Any:
        ids = Ids()
        sender = PartitionSender("t", 0, leader, ids)  # type: ignore[arg-type]
        return await body(leader, sender, ids)

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_producers, "BACKOFF_S", 0.001)


def test_calls_waiting_behind_a_request_go_out_together_in_order() -> None:
    leader = FakeLeader(gate=asyncio.Event())

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> list[int]:
        loop = asyncio.get_running_loop()
        far = loop.time() + 10
        first = s.submit(_values("a", "b"), "none", -1, far)
        await asyncio.sleep(0)  # the first request is on its way (held at the gate)
        rest = [s.submit(_values(f"c{i}"), "lz4", -1, far) for i in range(3)]
        leader.gate.set()  # type: ignore[union-attr]
        return [await f for f in (first, *rest)]

    offsets = _run(body, leader)
    assert offsets == [0, 2, 3, 4]
    assert leader.values == [b"a", b"b", b"c0", b"c1", b"c2"]
    # Two requests: the first call, then the three that waited, as consecutive batches.
    assert leader.requests == [[(7, 0, 0, 2)], [(7, 0, 2, 1), (7, 0, 3, 1), (7, 0, 4, 1)]]


def test_calls_of_different_client_ids_do_not_share_a_request() -> None:
    """The leader counts a request's bytes under one client id (the caller's, found from
    outside: ProduceRecords' were all counted under ""), so only calls of one id share one."""
    leader = FakeLeader(gate=asyncio.Event())

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> list[int]:
        far = asyncio.get_running_loop().time() + 10
        first = s.submit(_values("a"), "none", -1, far, "x")
        await asyncio.sleep(0)  # the first request is on its way (held at the gate)
        rest = [s.submit(_values(v), "none", -1, far, cid) for v, cid in ("bx", "cy", "dy")]
        leader.gate.set()  # type: ignore[union-attr]
        return [await f for f in (first, *rest)]

    assert _run(body, leader) == [0, 1, 2, 3]
    assert leader.values == [b"a", b"b", b"c", b"d"]
    assert leader.client_ids == ["x", "x", "y"]
    assert [len(r) for r in leader.requests] == [1, 1, 2]


def test_a_callers_sequenced_batch_is_sent_for_its_client_id() -> None:
    leader = FakeLeader()

    async def main() -> int:
        return await SequencedSender(leader).send(  # type: ignore[arg-type]
            "t",
            0,
            _values("x"),
            acks=-1,
            compression="none",
            producer_id=42,
            producer_epoch=3,
            base_sequence=0,
            deadline=asyncio.get_running_loop().time() + 10,
            client_id="caller",
        )

    assert asyncio.run(main()) == 0
    assert leader.client_ids == ["caller"]


@pytest.mark.parametrize("fault", ["lost-answer", "timeout", "transport"])
def test_a_request_retried_after_an_ambiguous_failure_is_written_once(fault: str) -> None:
    leader = FakeLeader(faults=[fault])

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> list[int]:
        far = asyncio.get_running_loop().time() + 10
        a = await s.submit(_values("a"), "none", -1, far)
        b = await s.submit(_values("b"), "none", -1, far)
        return [a, b]

    assert _run(body, leader) == [0, 1]
    assert leader.values == [b"a", b"b"]
    assert leader.requests[0] == leader.requests[1] == [(7, 0, 0, 1)]  # the same bytes


def test_a_leader_that_forgot_the_producer_gets_sequence_zero_again() -> None:
    leader = FakeLeader()

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> list[int]:
        far = asyncio.get_running_loop().time() + 10
        out = [await s.submit(_values("a", "b"), "none", -1, far)]
        leader.faults = ["forget"]  # e.g. expired after producer.id.expiration.ms
        out.append(await s.submit(_values("c"), "none", -1, far))
        return out

    assert _run(body, leader) == [0, 2]
    assert leader.values == [b"a", b"b", b"c"]
    assert leader.requests[1:] == [[(7, 0, 2, 1)], [(7, 0, 0, 1)]]


@pytest.mark.parametrize("fault", ["timeout", "lost-answer"])
def test_an_unknown_producer_after_a_maybe_written_attempt_fails_the_call(fault: str) -> None:
    """FIX (found from outside): an attempt appended but not acknowledged, then the
    producer's state expired on the leader (UNKNOWN_PRODUCER_ID on the retry): the sender
    restarted at sequence 0 under the same epoch and wrote the records a second time. The
    call now fails saying they may have been written; the next call takes a new epoch."""
    leader = FakeLeader()

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> Any:
        far = asyncio.get_running_loop().time() + 10
        a = await s.submit(_values("a"), "none", -1, far)
        leader.faults = [fault, "forget"]  # "b" appended, unanswered; then the state expires
        with pytest.raises(RequestTimedOutError, match="may or may not have been written"):
            await s.submit(_values("b"), "none", -1, far)
        c = await s.submit(_values("c"), "none", -1, far)
        return a, c, ids.calls

    a, c, calls = _run(body, leader)
    assert leader.values == [b"a", b"b", b"c"] and (a, c) == (0, 2)
    assert calls == [(-1, -1), (7, 0)]  # a new id, then a bump for "c"
    assert leader.requests[1:] == [[(7, 0, 1, 1)], [(7, 0, 1, 1)], [(7, 1, 0, 1)]]


def test_a_sequence_refusal_after_a_maybe_written_attempt_keeps_its_code() -> None:
    """As above, for a leader whose state of the producer no longer matches (here: its
    duplicates forgotten, its next sequence elsewhere): OUT_OF_ORDER_SEQUENCE, not sent
    again under a new epoch (which would write "b" twice)."""

    class Diverging(FakeLeader):
        async def produce(self, *args: Any) -> storage_pb2.ProducePartitionResponse:
            answer = await super().produce(*args)
            if answer.error_code == E.REQUEST_TIMED_OUT:
                self.producers[7].update(next=99, offsets={})
            return answer

    leader = Diverging()

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> Any:
        far = asyncio.get_running_loop().time() + 10
        await s.submit(_values("a"), "none", -1, far)
        leader.faults = ["timeout"]
        with pytest.raises(StromError, match="may or may not have been written") as err:
            await s.submit(_values("b"), "none", -1, far)
        return err.value.code

    assert _run(body, leader) == E.OUT_OF_ORDER_SEQUENCE
    assert leader.values == [b"a", b"b"]


def test_a_refused_call_fails_alone_and_leaves_no_sequence_gap() -> None:
    leader = FakeLeader(gate=asyncio.Event())

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> list[Any]:
        far = asyncio.get_running_loop().time() + 10
        futs = [s.submit(_values("a"), "none", -1, far)]
        await asyncio.sleep(0)
        futs += [s.submit(_values(v), "none", -1, far) for v in ("b", "poison", "c")]
        leader.gate.set()  # type: ignore[union-attr]
        return await asyncio.gather(*futs, return_exceptions=True)

    a, b, bad, c = _run(body, leader)
    assert (a, b, c) == (0, 1, 2)
    assert isinstance(bad, StromError) and bad.code == E.INVALID_RECORD
    assert leader.values == [b"a", b"b", b"c"]
    assert leader.requests[-1] == [(7, 0, 2, 1)]  # "c" took the sequence "poison" did not use


def test_a_refusal_before_writing_is_retried_until_it_goes_through() -> None:
    leader = FakeLeader(faults=["not-leader", "not-leader"])

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> int:
        far = asyncio.get_running_loop().time() + 10
        return await s.submit(_values("a"), "none", -1, far)

    assert _run(body, leader) == 0
    assert len(leader.requests) == 3 and leader.values == [b"a"]


def test_giving_up_after_an_ambiguous_failure_starts_a_new_epoch() -> None:
    leader = FakeLeader(faults=["timeout"] * 1000)

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> Any:
        loop = asyncio.get_running_loop()
        with pytest.raises(RequestTimedOutError, match="may or may not have been written"):
            await s.submit(_values("a"), "none", -1, loop.time() + 0.05)
        leader.faults = []
        # "a" may be in the log under sequence 0 (here it is): the next call must not reuse
        # the sequence, or the leader would answer it as a duplicate of "a" and drop it.
        b = await s.submit(_values("b"), "none", -1, loop.time() + 10)
        return b, ids.calls

    b, calls = _run(body, leader)
    assert leader.values == [b"a", b"b"] and b == 1
    assert calls == [(-1, -1), (7, 0)]  # a new id, then a bump
    assert leader.requests[-1] == [(7, 1, 0, 1)]


def test_acks_0_sends_without_sequences() -> None:
    leader = FakeLeader()

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> Any:
        far = asyncio.get_running_loop().time() + 10
        return await s.submit(_values("a"), "none", 0, far), ids.calls

    offset, calls = _run(body, leader)
    assert offset == 0 and calls == [] and leader.requests == [[(-1, -1, -1, 1)]]


def test_the_callers_sequence_is_sent_as_given_and_retried() -> None:
    leader = FakeLeader(faults=["lost-answer"])

    async def main() -> int:
        s = SequencedSender(leader)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        return await s.send(
            "t",
            0,
            _values("x", "y"),
            acks=-1,
            compression="none",
            producer_id=42,
            producer_epoch=3,
            base_sequence=0,
            deadline=loop.time() + 10,
        )

    assert asyncio.run(main()) == 0
    assert leader.values == [b"x", b"y"]
    assert leader.requests == [[(42, 3, 0, 2)], [(42, 3, 0, 2)]]


def test_a_callers_sequence_taken_for_an_old_retry_is_not_answered_as_written() -> None:
    """FIX (found from outside): a leader's DUPLICATE_SEQUENCE (the batch comes before its
    last five of the producer: taken for a retry, not written) was returned as success with
    offset -1, so ProduceRecords said NONE for records that a caller reusing sequences by
    mistake never had written. It is now the call's error, saying what happened."""

    class Leader:
        async def produce(self, *args: Any) -> storage_pb2.ProducePartitionResponse:
            return _answer(E.DUPLICATE_SEQUENCE)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        return await SequencedSender(Leader()).send(  # type: ignore[arg-type]
            "t",
            0,
            _values("x"),
            acks=-1,
            compression="none",
            producer_id=42,
            producer_epoch=3,
            base_sequence=1,
            deadline=loop.time() + 10,
        )

    with pytest.raises(DuplicateSequenceError) as err:
        asyncio.run(main())
    assert err.value.code == E.DUPLICATE_SEQUENCE
    assert "NOT written" in err.value.message


# -- LeaderRoute: what goes to one leader in one event-loop pass is one request -------------


class _View:
    """The etcd view's two questions LeaderRoute asks: every partition is led by node 1 (this
    node) at leader epoch 3."""

    def partition(self, topic: str, partition: int) -> Any:
        return type("S", (), {"value": type("V", (), {"leader": 1, "leader_epoch": 3})})()

    def live_nodes(self) -> dict[int, Any]:
        return {}


def _route(answer: Callable[[storage_pb2.ProduceRequest], Any]) -> tuple[Any, list[Any]]:
    requests: list[storage_pb2.ProduceRequest] = []
    client_ids.clear()

    async def local(req: storage_pb2.ProduceRequest) -> Any:
        requests.append(req)
        client_ids.append(CALLER_CLIENT_ID.get())
        await asyncio.sleep(0)
        return answer(req)

    return record_producers.LeaderRoute(1, _View(), local), requests  # type: ignore[arg-type]


#: CALLER_CLIENT_ID as each request of the last _route saw it (this node's Produce reads it).
client_ids: list[str] = []


def _echo(req: storage_pb2.ProduceRequest) -> storage_pb2.ProduceResponse:
    """A leader that appends each partition's data at offset 100 * partition."""
    resp = storage_pb2.ProduceResponse()
    for t in req.topics:
        rt = resp.topics.add(topic=t.topic)
        for p in t.partitions:
            rt.partitions.add(partition=p.partition, base_offset=100 * p.partition)
    return resp


def test_partitions_for_one_leader_in_one_pass_share_a_request() -> None:
    async def main() -> None:
        route, requests = _route(_echo)
        results = await asyncio.gather(
            route.produce("t", 0, b"a", 1, 5.0),
            route.produce("t", 2, b"b", 1, 5.0),
            route.produce("u", 1, b"c", 1, 2.0),
        )
        assert [(r.partition, r.base_offset) for r in results] == [(0, 0), (2, 200), (1, 100)]
        assert len(requests) == 1
        req = requests[0]
        sent = {
            (t.topic, p.partition, p.records, p.current_leader_epoch)
            for t in req.topics
            for p in t.partitions
        }
        assert sent == {("t", 0, b"a", 3), ("t", 2, b"b", 3), ("u", 1, b"c", 3)}
        assert req.timeout_ms == 5000  # the longest of the parts
        # A later pass is a request of its own.
        await route.produce("t", 0, b"d", 1, 5.0)
        assert len(requests) == 2

    asyncio.run(main())


def test_the_same_partition_twice_in_a_pass_and_other_acks_go_apart() -> None:
    async def main() -> None:
        route, requests = _route(_echo)
        await asyncio.gather(
            route.produce("t", 0, b"a", 1, 5.0),
            route.produce("t", 0, b"b", 1, 5.0),
            route.produce("t", 1, b"c", -1, 5.0),
        )
        shapes = sorted(
            (r.acks, [(t.topic, p.partition, p.records) for t in r.topics for p in t.partitions])
            for r in requests
        )
        assert shapes == [(-1, [("t", 1, b"c")]), (1, [("t", 0, b"a")]), (1, [("t", 0, b"b")])]

    asyncio.run(main())


def test_a_part_without_a_result_fails_as_a_lost_answer_and_acks_0_gets_none() -> None:
    async def main() -> None:
        def only_partition_0(req: storage_pb2.ProduceRequest) -> storage_pb2.ProduceResponse:
            resp = storage_pb2.ProduceResponse()
            resp.topics.add(topic="t").partitions.add(partition=0, base_offset=5)
            return resp

        route, _ = _route(only_partition_0)
        ok, lost = await asyncio.gather(
            route.produce("t", 0, b"a", 1, 5.0),
            route.produce("t", 1, b"b", 1, 5.0),
            return_exceptions=True,
        )
        assert ok.base_offset == 5
        assert isinstance(lost, TransportError) and "t-1" in str(lost)
        none = await route.produce("t", 0, b"c", 0, 5.0)
        assert (none.error_code, none.base_offset) == (E.NONE, -1)

    asyncio.run(main())


def test_a_failed_request_fails_each_of_its_parts() -> None:
    async def main() -> None:
        def refuse(req: storage_pb2.ProduceRequest) -> Any:
            raise record_producers.ProduceShed("queue full")

        route, _ = _route(refuse)
        results = await asyncio.gather(
            route.produce("t", 0, b"a", 1, 5.0),
            route.produce("t", 1, b"b", 1, 5.0),
            return_exceptions=True,
        )
        assert all(isinstance(r, TransportError) for r in results)

    asyncio.run(main())


def test_what_one_client_id_sends_here_is_a_produce_for_that_client_id() -> None:
    async def main() -> None:
        route, requests = _route(_echo)
        await asyncio.gather(
            route.produce("t", 0, b"a", 1, 5.0, "x"),
            route.produce("t", 1, b"b", 1, 5.0, "y"),
            route.produce("t", 2, b"c", 1, 5.0, "x"),
        )
        assert [[p.partition for t in r.topics for p in t.partitions] for r in requests] == [
            [0, 2],
            [1],
        ]
        assert client_ids == ["x", "y"]

    asyncio.run(main())


# -- what the node holds per topic is dropped (found from outside) -----------------------------
#
# NodeProducer kept a PartitionSender, with its producer id, for every partition ever written
# through ProduceRecords, and RecordService a round-robin position for every topic that ever
# had a keyless write: deleted topics' went on, and idle senders were never dropped.


class FreshIds:
    """InitProducerId: a new producer id per call (epoch 0)."""

    def __init__(self) -> None:
        self.next = 100

    async def __call__(self, producer_id: int, epoch: int) -> tuple[int, int]:
        self.next += 1
        return self.next, 0


def test_idle_senders_and_a_deleted_topics_senders_are_dropped() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        leader = FakeLeader()
        producer = NodeProducer(leader, FreshIds(), idle_s=60.0)  # type: ignore[arg-type]
        far = loop.time() + 30
        assert await producer.send("t", 0, _values("a"), -1, "none", far) == 0
        assert await producer.send("u", 0, _values("b"), -1, "none", far) == 1
        assert producer.topics() == {"t", "u"}

        producer.forget_topics({"u"})  # the topic was deleted
        assert producer.topics() == {"t"}

        # A busy sender is not idle, however long ago it was made.
        leader.gate = asyncio.Event()
        busy = producer.send("t", 0, _values("c"), -1, "none", far)
        assert producer.prune_idle(loop.time() + 3600) == 0
        leader.gate.set()
        assert await busy == 2
        assert producer.prune_idle(loop.time() + 59) == 0  # idle, not for long enough
        assert producer.prune_idle(loop.time() + 61) == 1
        assert producer.topics() == set()

        # The next call makes a fresh sender: a new producer id, from sequence 0.
        assert await producer.send("t", 0, _values("d"), -1, "none", far) == 3
        pids = [r[0][0] for r in leader.requests]
        assert pids[-1] not in pids[:-1] and leader.requests[-1][0][2] == 0

        # A deleted topic's busy sender is dropped at once, and close() still waits for it.
        leader.gate = asyncio.Event()
        queued = producer.send("u", 0, _values("e"), -1, "none", far)
        await asyncio.sleep(0)
        producer.forget_topics({"u"})
        assert producer.topics() == {"t"}
        leader.gate.set()
        await producer.close(5)
        assert queued.done() and queued.result() == 4

    asyncio.run(main())


def test_a_deleted_topics_round_robin_position_and_senders_are_dropped() -> None:
    prefix = "/strom/c/topics/"
    topics = {"t", "u"}
    view = SimpleNamespace(
        keys=SimpleNamespace(topics_prefix=prefix),
        add_listener=lambda fn: None,
        topic=lambda name: object() if name in topics else None,
    )

    async def main() -> None:
        svc = RecordService(1, view, None, None, lambda: [])  # type: ignore[arg-type]
        svc._loop = asyncio.get_running_loop()  # (as a ProduceRecords call sets it)
        keyless = _values("a", "b")
        for topic in ("t", "u"):
            svc._partitions(topic, keyless, None, 3)
        svc.producer._senders[("u", 0)] = PartitionSender("u", 0, None, Ids())  # type: ignore[arg-type]
        assert set(svc._round_robin) == {"t", "u"}

        topics.discard("u")
        svc._on_view_events([WatchEvent(prefix + "u", None, 2)])  # the watch thread's call
        await asyncio.sleep(0)
        assert set(svc._round_robin) == {"t"} and svc.producer.topics() == set()

        topics.discard("t")  # deleted while the watch was down: a resync finds it
        svc._on_view_events([])
        await asyncio.sleep(0)
        assert set(svc._round_robin) == {"t"}
        svc._on_view_events([RESYNC])
        await asyncio.sleep(0)
        assert svc._round_robin == {}

    asyncio.run(main())


def test_a_call_out_of_time_before_any_leader_took_it_is_never_written() -> None:
    """Found from outside: a call whose caller had given up (its deadline passed while the
    partition had no leader) was written when the leader came back, sharing the request of a
    later call; the caller's retry then wrote it twice. Nothing of the request had reached a
    leader, so the call is dropped from it and the rest is sent with the same sequences."""
    leader = FakeLeader(faults=["not-leader"] * 200)

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> Any:
        now = asyncio.get_running_loop().time()
        short = s.submit(_values("gave-up"), "none", -1, now + 0.05)
        later = s.submit(_values("kept"), "none", -1, now + 30)
        with pytest.raises(StromError) as info:
            await short
        return info.value, await later

    err, offset = _run(body, leader)
    assert err.code == E.NOT_LEADER_OR_FOLLOWER and "nothing written" in err.message
    assert offset == 0 and leader.values == [b"kept"]
    assert leader.requests[-1] == [(7, 0, 0, 1)]  # its sequence: no gap for the dropped call


def test_a_cancelled_call_is_never_sent_and_leaves_no_sequence_gap() -> None:
    """The caller went away (ProduceRecords cancelled, or its gRPC deadline passed): a call
    that no leader has taken yet is dropped, whether it waits behind another or is being
    retried while the partition has no leader."""
    leader = FakeLeader(faults=["not-leader"] * 50)

    async def body(leader: FakeLeader, s: PartitionSender, ids: Ids) -> int:
        far = asyncio.get_running_loop().time() + 30
        retried = s.submit(_values("retried"), "none", -1, far)
        async with asyncio.timeout(30):  # (only so that a regression fails, not hangs)
            while len(leader.requests) < 2:  # refused, and being retried
                await asyncio.sleep(0)
        retried.cancel()
        queued = s.submit(_values("queued"), "none", -1, far)
        queued.cancel()
        return await s.submit(_values("sent"), "none", -1, far)

    assert _run(body, leader) == 0
    assert leader.values == [b"sent"]
    assert leader.requests[-1] == [(7, 0, 0, 1)]


# -- LeaderRoute: a forwarded Produce is given up once its partition's leader moved ---------
#
# Found from outside: a ProduceRecords call forwarded to a hung leader waited until the
# leader resumed or the call's timeout_ms (30 s) although the controller had moved the
# partition within ~2 s. Against a real grpc.aio server whose Produce hangs until told.


class _HungLeader(storage_pb2_grpc.StorageServiceServicer):
    """A leader whose Produce answers only once ``release`` is set (base offset 42)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.received = asyncio.Event()
        self.cancelled = 0

    async def Produce(self, request: Any, context: Any) -> storage_pb2.ProduceResponse:
        self.received.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        resp = storage_pb2.ProduceResponse()
        for t in request.topics:
            rt = resp.topics.add(topic=t.topic)
            for p in t.partitions:
                rt.partitions.add(partition=p.partition, base_offset=42)
        return resp


class _MovingView:
    """A view whose partitions are all led by ``leader`` at ``epoch``; nodes 2 and 3 live (2
    at the hung leader's port) unless dropped from ``live``."""

    def __init__(self, port: int, epoch: int = 3) -> None:
        self.leader = 2
        self.epoch = epoch
        self.live = {2: SimpleNamespace(host="127.0.0.1", port=port)}
        self.live[3] = SimpleNamespace(host="127.0.0.1", port=port)

    def partition(self, topic: str, partition: int) -> Any:
        return SimpleNamespace(value=SimpleNamespace(leader=self.leader, leader_epoch=self.epoch))

    def live_nodes(self) -> dict[int, Any]:
        return dict(self.live)


async def _forward(
    change: Callable[[_MovingView], None], *, epoch: int = 3, release_after_s: float | None = None
) -> tuple[Any, float, _HungLeader]:
    """Forward one Produce (through node 1) to the hung leader (node 2), apply ``change`` to
    the view once the leader has the request, and (``release_after_s``) let the leader answer
    that long after; (the result or the exception, seconds taken, the leader)."""
    leader = _HungLeader()
    server = grpc.aio.server()
    storage_pb2_grpc.add_StorageServiceServicer_to_server(leader, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    view = _MovingView(port, epoch)

    async def local(req: storage_pb2.ProduceRequest) -> Any:
        raise AssertionError("node 1 leads nothing here")

    route = record_producers.LeaderRoute(1, view, local)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    try:
        at = loop.time()
        task = asyncio.ensure_future(route.produce("t", 0, b"data", -1, 30.0))
        await asyncio.wait_for(leader.received.wait(), 10)
        change(view)
        if release_after_s is not None:
            loop.call_later(release_after_s, leader.release.set)
        try:
            result: Any = await asyncio.wait_for(task, 20)
        except TransportError as exc:
            result = exc
        return result, loop.time() - at, leader
    finally:
        leader.release.set()
        await route.close()
        await server.stop(None)


@pytest.fixture
def quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_producers, "OVERDUE_GRACE_S", 0.1)
    monkeypatch.setattr(record_producers, "OVERDUE_RECHECK_S", 0.1)


def _to_node_3(view: _MovingView) -> None:
    view.leader, view.epoch = 3, view.epoch + 1


def _new_epoch(view: _MovingView) -> None:
    view.epoch += 1


@pytest.mark.parametrize("change", [_to_node_3, _new_epoch], ids=["other-node", "new-epoch"])
def test_a_forwarded_produce_is_given_up_once_its_leader_moved(
    quick_looks: None, change: Callable[[_MovingView], None]
) -> None:
    result, took, _ = asyncio.run(_forward(change))
    assert isinstance(result, TransportError), result
    assert "t-0" in str(result) and "moved" in str(result)
    assert took < 5.0, took  # old: the leader's answer or the request's 30 s timeout


def test_a_forwarded_produce_is_not_given_up_without_a_move(quick_looks: None) -> None:
    """No live leader yet (the hung node's session ended, nobody elected), or a higher epoch
    than an unknown (-1) one: the request goes on waiting and its answer counts."""

    def leaderless(view: _MovingView) -> None:
        view.leader = -1
        del view.live[2]

    result, _, leader = asyncio.run(_forward(leaderless, release_after_s=0.6))
    assert not isinstance(result, BaseException), result
    assert result.base_offset == 42 and leader.cancelled == 0
    result, _, leader = asyncio.run(_forward(_new_epoch, epoch=-1, release_after_s=0.6))
    assert not isinstance(result, BaseException), result
    assert result.base_offset == 42 and leader.cancelled == 0


def test_a_partition_sender_retries_at_the_new_leader_after_a_move(quick_looks: None) -> None:
    """The node's producer: the TransportError of a given-up request is retried where the
    view now says the leader is, with the same sequence (here: this node, which appends)."""

    async def main() -> tuple[int, list[Any], float]:
        leader = _HungLeader()
        server = grpc.aio.server()
        storage_pb2_grpc.add_StorageServiceServicer_to_server(leader, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        view = _MovingView(port)
        view.live[1] = SimpleNamespace(host="127.0.0.1", port=port)
        appended: list[Any] = []

        async def local(req: storage_pb2.ProduceRequest) -> Any:
            p = req.topics[0].partitions[0]
            appended.append(decode_batches(p.records)[0].base_sequence)
            return _echo(req)

        route = record_producers.LeaderRoute(1, view, local)  # type: ignore[arg-type]
        producer = NodeProducer(route, Ids())
        loop = asyncio.get_running_loop()
        try:
            at = loop.time()
            fut = producer.send(
                "t",
                0,
                _values("a", "b"),
                -1,
                "none",
                at + 30,
            )

            async def move() -> None:
                await leader.received.wait()
                view.leader, view.epoch = 1, 4

            await asyncio.wait_for(asyncio.gather(fut, move()), 10)
            return fut.result(), appended, loop.time() - at
        finally:
            leader.release.set()
            await route.close()
            await server.stop(None)

    base, appended, took = asyncio.run(main())
    assert base == 0 and appended == [0]
    assert took < 5.0, took
