"""Idempotent producers in the storage servicer, in process (DESIGN §6): Produce answers for
retries, gaps and fenced epochs at every acks level, metrics, and InitProducerId with a fake
controller behind the producer id allocator."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from strom.api import storage_pb2 as pb
from strom.errors import ErrorCode as E
from strom.record import encode_batch
from strom.storage import metrics
from strom.storage.producer_ids import ProducerIdAllocator, ProducerIdUnavailableError
from tests.unit.test_storage_servicer import (
    Harness,
    leader_state,
    produce_req,
    results,
    with_harness,
)


def ibatch(pid: int, seq: int, n: int = 1, epoch: int = 0) -> bytes:
    return encode_batch(
        [b"v%d" % (seq + i) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


async def produce(h: Harness, data: bytes, acks: int = 1) -> pb.ProducePartitionResponse:
    resp = await h.servicer.Produce(produce_req({("t", 0): data}, acks=acks), None)
    if acks == 0:
        return pb.ProducePartitionResponse(base_offset=-2)
    return results(resp)[("t", 0)]


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_deduplicates_retries_at_every_acks_level(tmp_path: Path, acks: int) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        lg = h.manager.partitions[("t", 0)].log
        dups = metrics.PRODUCER_DUPLICATE_BATCHES._value.get()
        rejected = metrics.PRODUCER_REJECTED_BATCHES.labels("OUT_OF_ORDER_SEQUENCE")
        before = rejected._value.get()
        await produce(h, encode_batch([b"plain"]), acks)
        first = await produce(h, ibatch(5, 0, 3), acks)
        again = await produce(h, ibatch(5, 0, 3), acks)
        gap = await produce(h, ibatch(5, 4), acks)
        assert lg.log_end_offset == 4  # the retry and the gap appended nothing
        assert metrics.PRODUCER_DUPLICATE_BATCHES._value.get() == dups + 1
        assert rejected._value.get() == before + 1
        if acks != 0:
            assert (first.error_code, first.base_offset) == (E.NONE, 1)
            assert (again.error_code, again.base_offset) == (E.NONE, 1)
            assert gap.error_code == E.OUT_OF_ORDER_SEQUENCE and gap.base_offset == -1
            assert "expected sequence 3" in gap.error_message

    with_harness(tmp_path, body)


def test_fenced_unknown_and_forgotten_batches(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        for seq in range(7):
            assert (await produce(h, ibatch(5, seq))).error_code == E.NONE
        old = await produce(h, ibatch(5, 0))  # before the kept five: found in the log
        assert (old.error_code, old.base_offset) == (E.NONE, 0)
        old = await produce(h, ibatch(5, 0, n=2))  # appended, but no batch holds just those
        assert (old.error_code, old.base_offset) == (E.DUPLICATE_SEQUENCE, -1)
        r = await produce(h, ibatch(6, 3))
        assert r.error_code == E.UNKNOWN_PRODUCER_ID
        assert (await produce(h, ibatch(5, 0, epoch=1))).error_code == E.NONE
        r = await produce(h, ibatch(5, 7, epoch=0))
        assert r.error_code == E.INVALID_PRODUCER_EPOCH and "fenced" in r.error_message

    with_harness(tmp_path, body)


# -- InitProducerId --------------------------------------------------------------------------


class FakeController:
    def __init__(self, block: int = 3) -> None:
        self.next = 1000
        self.block = block
        self.calls = 0
        self.fail: ProducerIdUnavailableError | None = None

    async def __call__(self) -> tuple[int, int]:
        self.calls += 1
        # One pass of the loop: every concurrent request started meanwhile reaches the lock
        # (without it, each would ask the controller for a block of its own).
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        first = self.next
        self.next += self.block
        return first, self.block


def test_init_producer_id_hands_out_unique_ids_and_bumps_epochs(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        ctl = FakeController(block=3)
        h.servicer.producer_ids = ProducerIdAllocator(ctl)
        s = h.servicer
        req = pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
        answers = await asyncio.gather(*(s.InitProducerId(req, None) for _ in range(10)))
        assert all(a.error_code == E.NONE and a.producer_epoch == 0 for a in answers)
        ids = [a.producer_id for a in answers]
        assert sorted(ids) == list(range(1000, 1010)) and ctl.calls == 4  # blocks of 3

        bump = await s.InitProducerId(
            pb.InitProducerIdRequest(producer_id=42, producer_epoch=7), None
        )
        assert (bump.error_code, bump.producer_id, bump.producer_epoch) == (E.NONE, 42, 8)
        top = await s.InitProducerId(
            pb.InitProducerIdRequest(producer_id=42, producer_epoch=32767), None
        )
        assert (top.error_code, top.producer_id, top.producer_epoch) == (E.NONE, 1010, 0)

        for bad in (
            pb.InitProducerIdRequest(producer_id=42, producer_epoch=-1),
            pb.InitProducerIdRequest(producer_id=-5, producer_epoch=0),
            pb.InitProducerIdRequest(producer_id=1, producer_epoch=40000),
        ):
            r = await s.InitProducerId(bad, None)
            assert (r.error_code, r.producer_id, r.producer_epoch) == (E.INVALID_REQUEST, -1, -1)
        r = await s.InitProducerId(
            pb.InitProducerIdRequest(transactional_id="tx", producer_id=-1, producer_epoch=-1),
            None,
        )
        assert r.error_code == E.INVALID_REQUEST and "transaction coordinator" in r.error_message

        # Block exhausted and no controller: a retriable error, and the next call recovers.
        assert (await s.InitProducerId(req, None)).producer_id == 1011  # the block's last id
        ctl.fail = ProducerIdUnavailableError(E.REQUEST_TIMED_OUT, "no controller")
        r = await s.InitProducerId(req, None)
        assert (r.error_code, r.producer_id) == (E.REQUEST_TIMED_OUT, -1)
        ctl.fail = None
        r = await s.InitProducerId(req, None)
        assert r.error_code == E.NONE and r.producer_id == 1012
        # Nothing set (what grpcurl's {} sends): a new id each time, not a bump of producer 0
        # (found from outside: two such callers got (0, 1) and wrote as one producer).
        empty = [await s.InitProducerId(pb.InitProducerIdRequest(), None) for _ in range(2)]
        assert [(e.producer_id, e.producer_epoch) for e in empty] == [(1013, 0), (1014, 0)]
        bump0 = await s.InitProducerId(pb.InitProducerIdRequest(producer_id=0), None)
        assert (bump0.error_code, bump0.producer_id, bump0.producer_epoch) == (E.NONE, 0, 1)
        # A sender from before the fields were optional (proto3 without presence: an old
        # coordinator reloading a shard whose producer is at epoch 0) puts only the id on the
        # wire: field 3, varint 1012. Found from outside during a rolling upgrade: it was
        # refused INVALID_REQUEST (epoch -1), so old coordinators could not load the shard.
        old_sender = pb.InitProducerIdRequest.FromString(b"\x18\xf4\x07")
        assert not old_sender.HasField("producer_epoch")
        r = await s.InitProducerId(old_sender, None)
        assert (r.error_code, r.producer_id, r.producer_epoch) == (E.NONE, 1012, 1)

    with_harness(tmp_path, body)
