"""The storage node's part of transactions (issue 12), in-process with a hand-fed view (see
test_storage_servicer.py): transactional produce holds the last stable offset back,
WriteTxnMarkers closes transactions, read_committed Fetch stops at the LSO and lists the
aborted transactions in what it returns, ListOffsets read_committed answers the LSO."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.api import common_pb2
from strom.api import storage_pb2 as pb
from strom.errors import ErrorCode as E
from strom.log.transactions import encode_marker
from strom.record import decode_batches, encode_batch
from tests.unit.test_storage_servicer import (
    Harness,
    fetch_req,
    leader_state,
    produce_req,
    results,
    with_harness,
)

RC = pb.ISOLATION_LEVEL_READ_COMMITTED


def txn_batch(pid: int, seq: int, values: list[bytes], epoch: int = 0) -> bytes:
    return encode_batch(
        values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True
    )


def markers(
    pid: int, committed: bool, epoch: int = 0, coordinator_epoch: int = 3, **parts: list[int]
) -> pb.WriteTxnMarkersRequest:
    req = pb.WriteTxnMarkersRequest(timeout_ms=1000)
    req.markers.add(
        producer_id=pid,
        producer_epoch=epoch,
        committed=committed,
        coordinator_epoch=coordinator_epoch,
        topics=[common_pb2.TopicPartitions(topic=t, partitions=ps) for t, ps in parts.items()],
    )
    return req


async def fetch(h: Harness, offset: int, isolation: int) -> pb.FetchPartitionResponse:
    req = fetch_req("t", 0, offset)
    req.isolation_level = isolation  # type: ignore[assignment]
    return results(await h.servicer.Fetch(req, None))[("t", 0)]


def values(r: pb.FetchPartitionResponse) -> list[tuple[int, bytes | None, bool]]:
    return [
        (rec.offset, rec.value, b.header.is_control)
        for b in decode_batches(r.records)
        for rec in b.records()
    ]


async def latest(h: Harness, isolation: int) -> int:
    req = pb.ListOffsetsRequest(replica_id=-1, isolation_level=isolation)  # type: ignore[arg-type]
    req.topics.add(topic="t").partitions.add(partition=0, current_leader_epoch=-1, timestamp=-1)
    resp = await h.servicer.ListOffsets(req, None)
    return resp.topics[0].partitions[0].offset


def test_read_committed_stops_at_open_transactions_and_lists_aborted_ones(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        for data in (
            encode_batch([b"plain"]),  # 0
            txn_batch(7, 0, [b"a0", b"a1"]),  # 1..2: producer 7's transaction (will abort)
            txn_batch(8, 0, [b"c0"]),  # 3: producer 8's transaction (will commit)
        ):
            resp = await s.Produce(produce_req({("t", 0): data}, transactional_id="tx"), None)
            assert results(resp)[("t", 0)].error_code == E.NONE
        # Both transactions open: read_committed sees only offset 0.
        r = await fetch(h, 0, RC)
        assert (r.high_watermark, r.last_stable_offset) == (4, 1)
        assert [v for _, v, _ in values(r)] == [b"plain"]
        assert await latest(h, RC) == 1 and await latest(h, 0) == 4

        resp = await s.WriteTxnMarkers(markers(7, committed=False, t=[0]), None)
        assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE  # offset 4
        r = await fetch(h, 0, RC)
        assert r.last_stable_offset == 3  # producer 8's is still open
        resp = await s.WriteTxnMarkers(markers(8, committed=True, t=[0]), None)  # offset 5
        assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE
        r = await fetch(h, 0, RC)
        assert r.last_stable_offset == r.high_watermark == 6
        assert [(a.producer_id, a.first_offset) for a in r.aborted_transactions] == [(7, 1)]
        # The markers are in the log as control batches; read_uncommitted gets no list.
        got = values(r)
        assert [o for o, _, control in got if control] == [4, 5]
        assert not (await fetch(h, 0, 0)).aborted_transactions
        # A fetch from the abort marker on still lists it; one past it does not.
        assert len((await fetch(h, 4, RC)).aborted_transactions) == 1
        assert not (await fetch(h, 5, RC)).aborted_transactions

    with_harness(tmp_path, body)


def test_read_committed_holds_for_a_caller_that_leaves_replica_id_unset(tmp_path: Path) -> None:
    """A caller in another language that never sets replica_id sends 0: it is a client, so
    read_committed still stops "latest" and its reads at an open transaction (found from
    outside: it got the log end, past uncommitted records)."""

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        for data in (encode_batch([b"plain"]), txn_batch(7, 0, [b"a0", b"a1"])):
            resp = await s.Produce(produce_req({("t", 0): data}, transactional_id="tx"), None)
            assert results(resp)[("t", 0)].error_code == E.NONE
        req = pb.ListOffsetsRequest(isolation_level=RC)  # type: ignore[arg-type]
        req.topics.add(topic="t").partitions.add(partition=0, current_leader_epoch=-1, timestamp=-1)
        assert (await s.ListOffsets(req, None)).topics[0].partitions[0].offset == 1
        fetch = fetch_req("t", 0, 0)
        fetch.ClearField("replica_id")
        fetch.isolation_level = RC  # type: ignore[assignment]
        r = results(await s.Fetch(fetch, None))[("t", 0)]
        assert (r.high_watermark, r.last_stable_offset) == (3, 1)
        assert [v for _, v, _ in values(r)] == [b"plain"]

    with_harness(tmp_path, body)


def test_markers_are_refused_for_fenced_epochs_and_non_leaders(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        h.topic("u", {0: leader_state(leader=2, isr=[2, 1])})
        await h.settle()
        s = h.servicer
        await s.Produce(
            produce_req({("t", 0): txn_batch(7, 0, [b"x"], epoch=2)}, transactional_id="tx"), None
        )
        resp = await s.WriteTxnMarkers(markers(7, committed=True, epoch=1, t=[0], u=[0]), None)
        got = {(t.topic, p.partition): p for t in resp.markers[0].topics for p in t.partitions}
        assert got[("t", 0)].error_code == E.INVALID_PRODUCER_EPOCH
        assert got[("u", 0)].error_code == E.NOT_LEADER_OR_FOLLOWER
        # A producer may not write control batches itself.
        resp = await s.Produce(produce_req({("t", 0): encode_marker(9, 0, True, 0)}), None)
        assert results(resp)[("t", 0)].error_code == E.INVALID_RECORD

    with_harness(tmp_path, body)


def test_markers_of_an_older_coordinator_epoch_are_refused(tmp_path: Path) -> None:
    """A coordinator that lost the shard (epoch 3) must not write a marker once its
    successor (epoch 4) wrote one for the producer: TRANSACTION_COORDINATOR_FENCED, nothing
    appended, the producer's next transaction stays open."""

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        await s.Produce(
            produce_req({("t", 0): txn_batch(7, 0, [b"x"])}, transactional_id="tx"), None
        )  # 0
        resp = await s.WriteTxnMarkers(markers(7, False, coordinator_epoch=4, t=[0]), None)  # 1
        assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE
        await s.Produce(
            produce_req({("t", 0): txn_batch(7, 1, [b"y"])}, transactional_id="tx"), None
        )  # 2
        resp = await s.WriteTxnMarkers(markers(7, True, coordinator_epoch=3, t=[0]), None)
        p = resp.markers[0].topics[0].partitions[0]
        assert p.error_code == E.TRANSACTION_COORDINATOR_FENCED and "epoch 4" in p.error_message
        r = await fetch(h, 0, RC)
        assert (r.high_watermark, r.last_stable_offset) == (3, 2)
        resp = await s.WriteTxnMarkers(markers(7, True, coordinator_epoch=4, t=[0]), None)
        assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE
        assert (await fetch(h, 0, RC)).last_stable_offset == 4

    with_harness(tmp_path, body)


def test_a_failure_announcing_a_written_append_does_not_answer_it_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The records are in the log once the append returns: a failure in what follows it
    (metrics, watermark, woken fetches) is logged, and Produce and WriteTxnMarkers still
    answer success; a producer told "failed" would retry what was written, a coordinator
    would think a durable marker missing."""

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer

        def broken(*_: object) -> None:
            raise RuntimeError("gauge backend gone")

        class BrokenMetrics(dict):  # type: ignore[type-arg]
            get = broken

        gauges, per_partition = h.manager.refresh_gauges, h.manager.metrics
        h.manager.refresh_gauges = broken  # type: ignore[method-assign]
        h.manager.metrics = BrokenMetrics()  # type: ignore[assignment]
        resp = await s.Produce(
            produce_req({("t", 0): txn_batch(7, 0, [b"a"])}, transactional_id="tx"), None
        )
        assert results(resp)[("t", 0)].error_code == E.NONE
        resp = await s.WriteTxnMarkers(markers(7, committed=True, t=[0]), None)
        assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE
        assert caplog.text.count("announcing them failed") == 2  # the records, the marker
        h.manager.refresh_gauges, h.manager.metrics = gauges, per_partition  # type: ignore
        r = await fetch(h, 0, RC)
        assert r.last_stable_offset == r.high_watermark == 2
        assert [(o, control) for o, _, control in values(r)] == [(0, False), (1, True)]

    with_harness(tmp_path, body)


def test_with_acls_transactional_batches_need_the_requests_transactional_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside: with topic WRITE alone, anyone could open a transaction no
    coordinator knew of (a hanging transaction). With ACLs on, transactional batches need the
    request's transactional_id (WRITE on it is checked); nothing is appended without, and the
    refusal tells the old client's user to upgrade it."""
    from strom.security import config

    monkeypatch.setattr(config, "_SERVER", config.ServerSecurity(acls=True))

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        resp = await s.Produce(produce_req({("t", 0): txn_batch(7, 0, [b"x"])}), None)
        r = results(resp)[("t", 0)]
        assert r.error_code == E.INVALID_RECORD and "transactional_id" in r.error_message
        assert "upgrade the client" in r.error_message
        assert await latest(h, pb.ISOLATION_LEVEL_READ_UNCOMMITTED) == 0
        resp = await s.Produce(
            produce_req({("t", 0): txn_batch(7, 0, [b"x"])}, transactional_id="tx"), None
        )
        assert results(resp)[("t", 0)].error_code == E.NONE

    with_harness(tmp_path, body)


def test_without_acls_an_old_clients_transactional_batches_are_appended(tmp_path: Path) -> None:
    """Found from outside (rolling upgrade): producers from before
    ProduceRequest.transactional_id send none, and every transaction of theirs touching an
    upgraded leader failed INVALID_RECORD. With ACLs off there is nothing to check the id
    with, so such a request is appended as before and its transactions close as usual."""

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        for data in (txn_batch(7, 0, [b"aborted"]), txn_batch(8, 0, [b"committed"])):
            resp = await s.Produce(produce_req({("t", 0): data}), None)  # no transactional_id
            assert results(resp)[("t", 0)].error_code == E.NONE
        assert await latest(h, RC) == 0  # both open: they hold read_committed back
        for pid, committed in ((7, False), (8, True)):
            resp = await s.WriteTxnMarkers(markers(pid, committed=committed, t=[0]), None)
            assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE
        r = await fetch(h, 0, RC)
        assert r.last_stable_offset == r.high_watermark == 4
        assert [(a.producer_id, a.first_offset) for a in r.aborted_transactions] == [(7, 0)]

    with_harness(tmp_path, body)
