"""The storage servicer and partition manager in-process, with a ClusterView fed by hand.

No etcd and no network: watch events are injected into a real ClusterView (as its watch
thread would deliver them), so reconciles, long polls and per-partition error isolation are
tested quickly and without timing guesses.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from strom.api import metadata_pb2 as md
from strom.api import storage_pb2 as pb
from strom.errors import ErrorCode as E
from strom.log import CorruptLogError, LogManager
from strom.metadata import ClusterView, Keys, WatchEvent, encode
from strom.record import decode_batches, encode_batch
from strom.storage.identity import DataDirIdentity, Identity, read_identity, write_identity
from strom.storage.manager import PARTITION_METADATA, PartitionManager, write_topic_id
from strom.storage.servicer import StorageServicer


class _FakeStore:
    def __init__(self) -> None:
        self.keys = Keys("unit")


class Harness:
    """One node (id 1) with a hand-fed view, its manager and servicer."""

    def __init__(self, data_dir: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.view = ClusterView(_FakeStore())  # type: ignore[arg-type]
        self.keys = self.view.keys
        self.rev = 0
        self.manager = PartitionManager(1, self.view, loop, fsync=False)
        self.view.add_listener(self.manager.on_view_events)
        self.manager.open(data_dir)
        self.servicer = StorageServicer(1, self.manager, self.view)
        # The nodes the tests' followers fetch as, registered with the incarnation their
        # fetches name (fetch_req): a leader counts only a registered process's fetches.
        self.events(
            [
                WatchEvent(
                    self.keys.node(i),
                    encode(
                        md.NodeRegistration(node_id=i, incarnation_id=f"incarnation-{i}")
                    ).encode(),
                    0,
                )
                for i in range(10)
            ]
        )

    def put(self, key: str, msg: Any) -> None:
        self.events([WatchEvent(key, encode(msg).encode(), 0)])

    def delete(self, key: str) -> None:
        self.events([WatchEvent(key, None, 0)])

    def events(self, evs: list[WatchEvent]) -> None:
        self.rev += 1
        evs = [WatchEvent(e.key, e.value, self.rev) for e in evs]
        # Delivered from another thread, like the etcd watch does.
        t = threading.Thread(target=self.view._on_events, args=(evs, self.rev))
        t.start()
        t.join()

    async def settle(self) -> None:
        await asyncio.sleep(0)  # let call_soon_threadsafe callbacks run
        await self.manager.wait_idle()

    def topic(self, name: str, parts: dict[int, md.PartitionState], **configs: str) -> None:
        evs = [
            WatchEvent(
                self.keys.topic(name),
                encode(
                    md.TopicMetadata(
                        name=name,
                        topic_id=f"id-{name}",
                        partition_count=len(parts),
                        configs=configs,
                    )
                ).encode(),
                0,
            )
        ]
        for p, s in parts.items():
            s.topic_id = f"id-{name}"
            evs.append(WatchEvent(self.keys.partition(name, p), encode(s).encode(), 0))
        self.events(evs)


def leader_state(epoch: int = 0, leader: int = 1, isr: list[int] | None = None):
    return md.PartitionState(replicas=[1], leader=leader, leader_epoch=epoch, isr=isr or [1])


def with_harness(tmp_path: Path, body: Callable[[Harness], Awaitable[None]]) -> None:
    async def main() -> None:
        h = Harness(tmp_path / "data", asyncio.get_running_loop())
        try:
            await body(h)
        finally:
            await h.manager.stop()
            assert h.manager.logs is not None
            h.manager.logs.close()

    asyncio.run(main())


def produce_req(
    parts: dict[tuple[str, int], bytes], acks: int = 1, transactional_id: str = ""
) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        acks=acks,
        timeout_ms=1000,
        transactional_id=transactional_id,
        topics=[
            pb.ProduceTopicData(
                topic=t,
                partitions=[
                    pb.ProducePartitionData(partition=p, records=r, current_leader_epoch=-1)
                ],
            )
            for (t, p), r in parts.items()
        ],
    )


def fetch_req(topic: str, p: int, offset: int, **kw: int) -> pb.FetchRequest:
    """A consumer's fetch, or with ``replica_id >= 0`` a follower's (which names its
    incarnation: strom.storage.replica_claims)."""
    replica_id = kw.pop("replica_id", -1)
    return pb.FetchRequest(
        replica_id=replica_id,
        replica_incarnation=f"incarnation-{replica_id}" if replica_id >= 0 else "",
        max_wait_ms=kw.pop("max_wait_ms", 0),
        min_bytes=kw.pop("min_bytes", 1),
        max_bytes=1 << 20,
        topics=[
            pb.FetchTopic(
                topic=topic,
                partitions=[
                    pb.FetchPartition(
                        partition=p,
                        fetch_offset=offset,
                        current_leader_epoch=-1,
                        last_fetched_epoch=kw.pop("last_fetched_epoch", -1),
                        partition_max_bytes=1 << 20,
                    )
                ],
            )
        ],
    )


def results(resp: Any) -> dict[tuple[str, int], Any]:
    return {(t.topic, p.partition): p for t in resp.topics for p in t.partitions}


async def until_parked(h: Harness, n: int = 1, *, follower: bool = False) -> None:
    registry = h.manager.appended if follower else h.manager.committed
    for _ in range(100):
        if registry.waiting() >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError("the fetch never parked")


def test_reconcile_hosts_updates_and_deletes_replicas(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("a", {0: leader_state(), 1: leader_state(leader=2)}, **{"retention.ms": "5000"})
        h.topic("other", {0: md.PartitionState(replicas=[2], leader=2, isr=[2])})
        await h.settle()
        parts = h.manager.partitions
        assert set(parts) == {("a", 0), ("a", 1)}
        assert parts[("a", 0)].is_leader and not parts[("a", 1)].is_leader
        assert parts[("a", 0)].log.config.retention_ms == 5000
        d = parts[("a", 0)].log.directory
        assert (d / PARTITION_METADATA).read_text().endswith("topic_id: id-a\n")

        h.topic("a", {0: leader_state(epoch=3), 1: leader_state(leader=2)}, **{"retention.ms": "7"})
        await h.settle()
        assert parts[("a", 0)].leader_epoch == 3 and parts[("a", 0)].log.config.retention_ms == 7

        h.events(
            [WatchEvent(h.keys.topic("a"), None, 0)]
            + [WatchEvent(h.keys.partition("a", p), None, 0) for p in (0, 1)]
        )
        await h.settle()
        assert not parts and not d.exists()

    with_harness(tmp_path, body)


def test_parked_fetch_wakes_on_produce_and_on_leadership_loss(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        fetch = asyncio.create_task(s.Fetch(fetch_req("t", 0, 0, max_wait_ms=30_000), None))
        await until_parked(h)
        resp = await s.Produce(produce_req({("t", 0): encode_batch([b"v1"])}), None)
        assert results(resp)[("t", 0)].error_code == E.NONE
        got = results(await asyncio.wait_for(fetch, 5))[("t", 0)]
        assert [r.value for b in decode_batches(got.records) for r in b.records()] == [b"v1"]

        fetch = asyncio.create_task(s.Fetch(fetch_req("t", 0, 1, max_wait_ms=30_000), None))
        await until_parked(h)
        h.topic("t", {0: leader_state(epoch=1, leader=2, isr=[2, 1])})
        await h.settle()
        got = results(await asyncio.wait_for(fetch, 5))[("t", 0)]
        assert got.error_code == E.NOT_LEADER_OR_FOLLOWER and got.current_leader.leader_id == 2

    with_harness(tmp_path, body)


def test_min_bytes_and_shutdown_release_parked_fetches(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        s = h.servicer
        one = encode_batch([b"x" * 100])
        fetch = asyncio.create_task(
            s.Fetch(fetch_req("t", 0, 0, max_wait_ms=30_000, min_bytes=len(one) + 1), None)
        )
        await until_parked(h)
        await s.Produce(produce_req({("t", 0): one}), None)
        await until_parked(h)  # woke, re-read, still short of min_bytes: parked again
        assert not fetch.done()
        # Shutdown wakes it: it answers with what it has.
        s.shutting_down = True
        h.manager.committed.close()
        got = results(await asyncio.wait_for(fetch, 5))[("t", 0)]
        assert len(got.records) == len(one)

    with_harness(tmp_path, body)


def test_one_failing_partition_does_not_fail_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state(), 1: leader_state(), 2: leader_state()})
        await h.settle()
        s = h.servicer
        await s.Produce(produce_req({("t", 2): encode_batch([b"z"])}), None)
        log1 = h.manager.partitions[("t", 1)].log
        log2 = h.manager.partitions[("t", 2)].log

        def boom(*a: Any, **k: Any) -> Any:
            raise RuntimeError("disk on fire")

        def corrupt(*a: Any, **k: Any) -> Any:
            raise CorruptLogError("bad crc at position 0")

        monkeypatch.setattr(log1, "append", boom)
        monkeypatch.setattr(log2, "read", corrupt)
        data = encode_batch([b"ok"])
        resp = results(await s.Produce(produce_req({("t", 0): data, ("t", 1): data}), None))
        assert resp[("t", 0)].error_code == E.NONE
        assert resp[("t", 1)].error_code == E.UNKNOWN_SERVER_ERROR
        assert "disk on fire" in resp[("t", 1)].error_message
        got = results(await s.Fetch(fetch_req("t", 2, 0), None))[("t", 2)]
        assert got.error_code == E.STORAGE_ERROR and got.high_watermark == -1

    with_harness(tmp_path, body)


def test_produce_refuses_batches_made_for_another_topic_id(tmp_path: Path) -> None:
    """ProduceTopicData.topic_id (Kafka's Produce v13): batches made for a topic since deleted
    and re-created under the same name are refused INCONSISTENT_TOPIC_ID, nothing appended
    (found from outside: they landed in the new topic); an empty id is not checked; a replica
    still the deleted topic's while the view has the new one refuses the new id's batches
    REPLICA_NOT_AVAILABLE (retriable) instead of taking them into the old log."""

    def req(topic_id: str) -> pb.ProduceRequest:
        r = produce_req({("t", 0): encode_batch([b"x"])})
        r.topics[0].topic_id = topic_id
        return r

    async def code(h: Harness, topic_id: str) -> int:
        return results(await h.servicer.Produce(req(topic_id), None))[("t", 0)].error_code

    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()})
        await h.settle()
        lg = h.manager.partitions[("t", 0)].log
        assert await code(h, "id-t") == E.NONE
        assert await code(h, "") == E.NONE
        assert await code(h, "id-deleted") == E.INCONSISTENT_TOPIC_ID
        assert lg.log_end_offset == 2
        # Re-created: the view has the new id, the reconcile has not replaced the replica
        # yet (nothing here yields to the loop, where it would run).
        h.put(h.keys.topic("t"), md.TopicMetadata(name="t", topic_id="id-t2", partition_count=1))
        assert await code(h, "id-t2") == E.REPLICA_NOT_AVAILABLE
        assert await code(h, "id-t") == E.INCONSISTENT_TOPIC_ID
        assert lg.log_end_offset == 2

    with_harness(tmp_path, body)


def test_flush_messages_fsyncs_before_answering(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        h.topic("t", {0: leader_state()}, **{"flush.messages": "1"})
        await h.settle()
        lg = h.manager.partitions[("t", 0)].log
        await h.servicer.Produce(produce_req({("t", 0): encode_batch([b"a", b"b"])}), None)
        assert lg.recovery_point == 2 and not lg.needs_flush()

    with_harness(tmp_path, body)


def test_follower_fetch_moves_the_high_watermark_and_detects_divergence(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        st = md.PartitionState(replicas=[1, 2], leader=1, leader_epoch=0, isr=[1, 2])
        h.topic("t", {0: st})
        await h.settle()
        s = h.servicer
        await s.Produce(produce_req({("t", 0): encode_batch([b"a", b"b", b"c"])}), None)
        consumer = results(await s.Fetch(fetch_req("t", 0, 0), None))[("t", 0)]
        assert consumer.high_watermark == 0 and consumer.records == b""
        follower = results(await s.Fetch(fetch_req("t", 0, 0, replica_id=2), None))[("t", 0)]
        assert follower.records  # followers read above the HW
        await s.Fetch(fetch_req("t", 0, 3, replica_id=2, last_fetched_epoch=0), None)
        consumer = results(await s.Fetch(fetch_req("t", 0, 0), None))[("t", 0)]
        assert consumer.high_watermark == 3 and consumer.records
        # A follower claiming an epoch the leader never had is told where to truncate.
        div = results(await s.Fetch(fetch_req("t", 0, 3, replica_id=2, last_fetched_epoch=7), None))
        d = div[("t", 0)]
        assert (d.diverging_epoch.epoch, d.diverging_epoch.end_offset) == (0, 3) and not d.records
        stranger = results(await s.Fetch(fetch_req("t", 0, 0, replica_id=9), None))[("t", 0)]
        assert stranger.error_code == E.NOT_LEADER_OR_FOLLOWER

    with_harness(tmp_path, body)


def test_a_follower_fetch_moves_nothing_unless_registered_and_within_the_log(
    tmp_path: Path,
) -> None:
    """Found from outside: Fetch(replica_id=<a follower>, replica_incarnation="spoof",
    fetch_offset=2**62) was answered OFFSET_OUT_OF_RANGE after the leader had recorded the
    follower there, and the high watermark moved with nothing replicated. An offset beyond
    the log end, or an incarnation not the node's registered one, now records nothing."""

    async def body(h: Harness) -> None:
        st = md.PartitionState(replicas=[1, 2], leader=1, leader_epoch=0, isr=[1, 2])
        h.topic("t", {0: st})
        await h.settle()
        s = h.servicer
        await s.Produce(produce_req({("t", 0): encode_batch([b"a", b"b", b"c"])}), None)
        part = h.manager.partitions[("t", 0)]
        beyond = results(await s.Fetch(fetch_req("t", 0, 2**62, replica_id=2), None))[("t", 0)]
        assert beyond.error_code == E.OFFSET_OUT_OF_RANGE
        assert part.high_watermark == 0 and 2 not in part.replica_end_offsets
        assert (beyond.high_watermark, beyond.log_start_offset) == (0, 0)  # (to truncate to)
        assert "beyond the log end offset 3" in beyond.error_message
        spoof = fetch_req("t", 0, 3, replica_id=2, last_fetched_epoch=0)
        spoof.replica_incarnation = "spoof"
        got = results(await s.Fetch(spoof, None))[("t", 0)]
        assert got.error_code == E.STALE_NODE_INCARNATION and not got.records
        assert "'spoof' is not node 2's registered incarnation" in got.error_message
        assert "incarnation-2" not in got.error_message  # (not told to the caller)
        h.delete(h.keys.node(2))
        st = md.PartitionState(replicas=[1, 2, 11], leader=1, leader_epoch=0, isr=[1, 2, 11])
        h.topic("u", {0: st})
        await h.settle()
        unregistered = results(await s.Fetch(fetch_req("u", 0, 0, replica_id=11), None))
        assert unregistered[("u", 0)].error_code == E.STALE_NODE_INCARNATION
        assert "node 11 is not registered" in unregistered[("u", 0)].error_message
        assert part.high_watermark == 0 and 2 not in part.replica_end_offsets
        # The registered process's fetch at the log end moves it.
        await s.Fetch(fetch_req("t", 0, 3, replica_id=2, last_fetched_epoch=0), None)
        assert part.high_watermark == 0  # node 2's registration was deleted above
        h.put(h.keys.node(2), md.NodeRegistration(node_id=2, incarnation_id="incarnation-2"))
        await s.Fetch(fetch_req("t", 0, 3, replica_id=2, last_fetched_epoch=0), None)
        assert part.high_watermark == 3

    with_harness(tmp_path, body)


def test_an_unset_replica_id_is_a_consumer_not_node_0(tmp_path: Path) -> None:
    """proto3 sends an unset replica_id as 0, and node 0 is real (the Helm chart's
    storage-0). Found from outside: a grpc-js caller that left it unset was taken for node
    0's follower: it read above the high watermark, its fetch offset moved the high
    watermark, it skipped the fetch quota, and ListOffsets answered it from the log end.
    Only a fetch naming its incarnation (as every follower's does) is a follower's now."""

    def unset(offset: int) -> pb.FetchRequest:
        req = fetch_req("t", 0, offset)
        req.ClearField("replica_id")  # (what a caller that never set it sends)
        return req

    async def latest(h: Harness, replica_id: int | None) -> int:
        req = pb.ListOffsetsRequest()
        if replica_id is not None:
            req.replica_id = replica_id
        req.topics.add(topic="t").partitions.add(partition=0, current_leader_epoch=-1, timestamp=-1)
        return results(await h.servicer.ListOffsets(req, None))[("t", 0)].offset

    async def body(h: Harness) -> None:
        st = md.PartitionState(replicas=[1, 0], leader=1, leader_epoch=0, isr=[1, 0])
        h.topic("t", {0: st})
        await h.settle()
        s = h.servicer
        await s.Produce(produce_req({("t", 0): encode_batch([b"a", b"b", b"c"])}), None)
        # Node 0 has nothing yet: the high watermark is 0, the log end 3.
        assert await latest(h, None) == 0
        assert await latest(h, 1) == 3  # a replica's view (a debugging tool's)
        got = results(await s.Fetch(unset(0), None))[("t", 0)]
        assert (got.error_code, got.high_watermark, got.records) == (E.NONE, 0, b"")
        # At the log end, as a follower holding everything would fetch: no move of the HW.
        await s.Fetch(unset(3), None)
        assert results(await s.Fetch(fetch_req("t", 0, 0), None))[("t", 0)].high_watermark == 0
        assert h.manager.partitions[("t", 0)].high_watermark == 0
        # Node 0's real follower names its incarnation: it reads above the HW and moves it.
        follower = unset(3)
        follower.replica_incarnation = "incarnation-0"
        follower.topics[0].partitions[0].last_fetched_epoch = 0
        await s.Fetch(follower, None)
        assert h.manager.partitions[("t", 0)].high_watermark == 3
        # A positive replica_id without an incarnation is a malformed claim, refused.
        half = fetch_req("t", 0, 0)
        half.replica_id = 2
        with pytest.raises(ValueError, match="replica_incarnation is empty"):
            await s.Fetch(half, None)

    with_harness(tmp_path, body)


class _CallTime:
    """The one thing DeleteRecords asks of its gRPC context: the time the call has left."""

    def __init__(self, left: float | None = None) -> None:
        self.left = left

    def time_remaining(self) -> float | None:
        return self.left


def delete_req(offset: int, timeout_ms: int) -> pb.DeleteRecordsRequest:
    return pb.DeleteRecordsRequest(
        timeout_ms=timeout_ms,
        topics=[
            pb.DeleteRecordsTopic(
                topic="t", partitions=[pb.DeleteRecordsPartition(partition=0, offset=offset)]
            )
        ],
    )


def follower_fetch(offset: int, log_start: int, *, follows: bool, wait_ms: int = 0) -> Any:
    req = fetch_req("t", 0, offset, replica_id=2, last_fetched_epoch=0, max_wait_ms=wait_ms)
    req.topics[0].partitions[0].log_start_offset = log_start
    req.follows_log_start = follows
    return req


async def _two_replicas_with_ten_records(h: Harness) -> StorageServicer:
    h.topic("t", {0: md.PartitionState(replicas=[1, 2], leader=1, leader_epoch=0, isr=[1, 2])})
    await h.settle()
    await h.servicer.Produce(produce_req({("t", 0): encode_batch([b"x"] * 10)}), None)
    return h.servicer


def test_delete_records_does_not_wait_for_an_in_sync_follower_of_an_older_version(
    tmp_path: Path,
) -> None:
    """Found from outside (rolling upgrade): a follower of an older version reports its log
    start in every fetch but never moves it to the leader's, and an upgraded leader waited
    for it: every DeleteRecords timed out. Its fetches do not set follows_log_start, and it
    now counts with the leader's start (as every follower did before the wait existed). Nor
    is its long poll answered at once for a start it will never adopt."""

    async def body(h: Harness) -> None:
        s = await _two_replicas_with_ten_records(h)
        await s.Fetch(follower_fetch(10, 0, follows=False), None)  # in sync, HW 10
        resp = await s.DeleteRecords(delete_req(5, timeout_ms=1000), _CallTime())
        r = resp.topics[0].partitions[0]
        assert (r.error_code, r.error_message, r.low_watermark) == (E.NONE, "", 5)
        poll = asyncio.create_task(
            s.Fetch(follower_fetch(10, 0, follows=False, wait_ms=30_000), None)
        )
        await until_parked(h, follower=True)
        await s.Produce(produce_req({("t", 0): encode_batch([b"y"])}), None)
        got = results(await asyncio.wait_for(poll, 5))[("t", 0)]
        assert got.records and got.log_start_offset == 5

    with_harness(tmp_path, body)


def test_delete_records_waits_for_a_follower_that_follows_the_log_start(tmp_path: Path) -> None:
    """A follower of this version is waited for; the timeout names it and says what bounded
    the wait (it said "within 0.0 s" when a client's last retry had almost no time left)."""

    async def body(h: Harness) -> None:
        s = await _two_replicas_with_ten_records(h)
        await s.Fetch(follower_fetch(10, 0, follows=True), None)
        r = (await s.DeleteRecords(delete_req(5, timeout_ms=100), _CallTime())).topics[0]
        p = r.partitions[0]
        assert (p.error_code, p.low_watermark) == (E.REQUEST_TIMED_OUT, -1)
        assert "within timeout_ms (0.1 s) (still behind: node 2; low watermark 0)" in (
            p.error_message
        )
        p = (await s.DeleteRecords(delete_req(5, 30_000), _CallTime(0.01))).topics[0].partitions[0]
        assert p.error_code == E.REQUEST_TIMED_OUT
        assert "within the 0.0 s the call's deadline left (timeout_ms 30.0 s)" in p.error_message
        # Its next fetch reports the start it adopted from the answer: the deletion is done.
        behind = results(await s.Fetch(follower_fetch(10, 0, follows=True), None))[("t", 0)]
        assert behind.log_start_offset == 5
        await s.Fetch(follower_fetch(10, 5, follows=True), None)
        p = (await s.DeleteRecords(delete_req(5, 100), _CallTime())).topics[0].partitions[0]
        assert (p.error_code, p.low_watermark) == (E.NONE, 5)

    with_harness(tmp_path, body)


def test_a_new_empty_log_records_its_topic_id_and_the_checkpoint_makes_it_durable(
    tmp_path: Path,
) -> None:
    """Creating a partition writes partition.metadata without fsync (the log is empty, so a
    lost file hides nothing); the node's checkpoint (and a clean stop) syncs it later."""

    async def body(h: Harness) -> None:
        h.manager.fsync = True
        h.topic("a", {0: leader_state(), 1: leader_state()})
        await h.settle()
        d = h.manager.partitions[("a", 0)].log.directory
        assert (d / PARTITION_METADATA).read_text().endswith("topic_id: id-a\n")
        assert h.manager._unsynced_ids == {("a", 0), ("a", 1)}
        assert h.manager.sync_topic_ids() == 2
        assert h.manager.sync_topic_ids() == 0 and not h.manager._unsynced_ids

    with_harness(tmp_path, body)


def test_topic_changes_are_reconciled_by_passes_over_those_topics_only(tmp_path: Path) -> None:
    """Events that only change topics and partition states make a pass over those topics
    (it plans what a full pass would for them); any other event (here the cluster key) makes
    a full pass, the only kind that deletes stray logs."""

    async def body(h: Harness) -> None:
        h.topic("a", {0: leader_state(), 1: leader_state(leader=2)})
        h.topic("b", {0: leader_state()})
        await h.settle()
        assert set(h.manager.partitions) == {("a", 0), ("a", 1), ("b", 0)}
        before = dict(h.manager.passes)

        h.put(h.keys.partition("a", 1), leader_state(epoch=4))  # this node leads a-1 now
        await h.settle()
        assert h.manager.partitions[("a", 1)].is_leader
        assert h.manager.partitions[("a", 1)].leader_epoch == 4
        assert h.manager.passes["all"] == before["all"]
        assert h.manager.passes["topics"] > before["topics"]

        # A stray on disk (a log this process never hosted): a narrow pass leaves it alone
        # even in an initialised cluster; the full pass the cluster key brings deletes it.
        assert h.manager.logs is not None
        h.manager.logs.get_or_create("stray", 0, {})
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="unit"))
        await h.settle()
        assert h.manager.passes["all"] == before["all"] + 1
        assert ("stray", 0) not in {tp for tp, _ in h.manager.logs}

        h.manager.logs.get_or_create("stray", 1, {})
        h.events(
            [WatchEvent(h.keys.topic("b"), None, 0), WatchEvent(h.keys.partition("b", 0), None, 0)]
        )
        await h.settle()
        assert set(h.manager.partitions) == {("a", 0), ("a", 1)}  # b deleted by a narrow pass
        assert ("stray", 1) in {tp for tp, _ in h.manager.logs}  # not b's: left for a full pass
        assert h.manager.passes["all"] == before["all"] + 1

    with_harness(tmp_path, body)


def _with_identity(h: Harness, *, recorded: str | None) -> DataDirIdentity:
    """The node's data dir identity on the harness's manager, as a start leaves it: recorded
    for cluster id ``recorded`` before this start, or (None) adopted from the flags now."""
    assert h.manager.logs is not None
    data = h.manager.logs.data_dir
    if recorded is not None:
        write_identity(data, Identity(1, "unit", recorded), fsync=False)
    ident = DataDirIdentity(data, 1, "unit", fsync=False)
    ident.check_flags()
    ident.settle("")
    h.manager.identity = ident
    return ident


@pytest.mark.parametrize(("recorded", "deleted"), [("cid", True), (None, False)])
def test_strays_are_set_aside_only_from_a_data_dir_confirmed_to_be_this_node_s(
    tmp_path: Path, recorded: str | None, deleted: bool
) -> None:
    """Stray logs (never hosted by this process) are set aside (renamed, not deleted) only
    when meta.properties recorded this node in this cluster before the start; a data dir
    without one (an older strom's) takes the flags' identity, which the cluster confirms once
    it is initialised (it assigns the node a log of the dir), but keeps its strays on that
    start (a wrong --node-id would otherwise delete every replica, found from outside)."""

    async def body(h: Harness) -> None:
        assert h.manager.logs is not None
        h.manager.logs.get_or_create("stray", 0, {})
        h.manager.logs.get_or_create("a", 0, {})
        ident = _with_identity(h, recorded=recorded)
        assert ident.adopted is (recorded is None)
        h.topic("a", {0: leader_state()})
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="cid"))
        await h.settle()
        assert (("stray", 0) in {tp for tp, _ in h.manager.logs}) is not deleted
        # Taken out of service, its files kept under a name no start opens as a log.
        data = h.manager.logs.data_dir
        aside = [p.name for p in data.iterdir() if p.name.startswith("stray-0-stray-")]
        assert (data / "stray-0").is_dir() is not deleted and len(aside) == int(deleted)
        assert h.manager.get("a", 0) is not None
        assert read_identity(h.manager.logs.data_dir) == Identity(1, "unit", "cid")

    with_harness(tmp_path, body)


def test_an_adopted_identity_the_cluster_contradicts_once_initialised_stops_the_node(
    tmp_path: Path,
) -> None:
    """An older strom's dir started with a wrong --node-id before the cluster was known:
    adopted unconfirmed; when the cluster key arrives and the cluster assigns none of the
    dir's logs to this node id (only to node 3), the node stops and deletes nothing."""

    async def body(h: Harness) -> None:
        assert h.manager.logs is not None
        h.manager.logs.get_or_create("a", 0, {})
        _with_identity(h, recorded=None)
        stops: list[str] = []
        h.manager.on_foreign_cluster = stops.append
        h.topic("a", {0: md.PartitionState(replicas=[3], leader=3, isr=[3])})
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="cid"))
        await h.settle()
        assert len(stops) == 1, stops
        assert "assigns none of them to node 1 (it assigns a-0 to node 3)" in stops[0]
        assert {tp for tp, _ in h.manager.logs} == {("a", 0)}
        rec = read_identity(h.manager.logs.data_dir)
        assert rec is not None and rec.adopted  # still unconfirmed: the right id may come

    with_harness(tmp_path, body)


def test_a_cluster_id_changed_under_a_running_node_stops_it_changing_anything(
    tmp_path: Path,
) -> None:
    async def body(h: Harness) -> None:
        assert h.manager.logs is not None
        h.manager.logs.get_or_create("stray", 0, {})
        _with_identity(h, recorded="cid")
        stops: list[str] = []
        h.manager.on_foreign_cluster = stops.append
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="another"))
        h.topic("a", {0: leader_state()})
        await h.settle()
        assert len(stops) == 1 and "now has id another" in stops[0]
        assert {tp for tp, _ in h.manager.logs} == {("stray", 0)}  # nothing deleted or made
        assert not h.manager.partitions
        assert read_identity(h.manager.logs.data_dir) == Identity(1, "unit", "cid")

    with_harness(tmp_path, body)


class _WipedEtcd(_FakeStore):
    """What a view reads from an etcd restarted on an empty data dir: nothing."""

    def retry(self, fn: Callable[[], Any], *, deadline_s: float) -> Any:
        return fn()

    def get_prefix_raw(self, prefix: str) -> tuple[int, list[WatchEvent]]:
        return 1, []


def test_a_cluster_key_gone_under_a_running_node_stops_it_deleting_nothing(
    tmp_path: Path,
) -> None:
    """Found from outside: when etcd came back without its data, the view (once its watch
    noticed) resynced to no cluster key and no topics, and the pass that followed would
    delete every replica the node served. The node stops instead, changing nothing."""

    async def body(h: Harness) -> None:
        assert h.manager.logs is not None
        _with_identity(h, recorded="cid")
        stops: list[str] = []
        h.manager.on_foreign_cluster = stops.append
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="cid"))
        h.topic("a", {0: leader_state()})
        await h.settle()
        assert h.manager.get("a", 0) is not None and not stops
        h.view.store = _WipedEtcd()  # type: ignore[assignment]
        t = threading.Thread(target=h.view._resync)  # as the watch's reset does
        t.start()
        t.join()
        await h.settle()
        assert len(stops) == 1 and "no cluster id any more (it had cid)" in stops[0]
        assert {tp for tp, _ in h.manager.logs} == {("a", 0)}  # nothing deleted

    with_harness(tmp_path, body)


def test_narrow_passes_host_exactly_what_full_passes_would(tmp_path: Path) -> None:
    """Random topic creations, state changes and deletions, each reconciled by a narrow pass:
    after every step the hosted replicas and their states are what the whole view asks for."""
    import random

    from strom.storage.assignment import desired_assignments

    rng = random.Random(20261127)

    async def body(h: Harness) -> None:
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="unit"))
        await h.settle()
        live: dict[str, int] = {}
        for step in range(60):
            name = f"t{rng.randrange(8)}"
            if name in live and rng.random() < 0.3:
                h.events(
                    [WatchEvent(h.keys.topic(name), None, 0)]
                    + [WatchEvent(h.keys.partition(name, p), None, 0) for p in range(live[name])]
                )
                del live[name]
            else:
                n = live.get(name) or rng.randrange(1, 4)
                live[name] = n
                h.topic(
                    name,
                    {
                        p: md.PartitionState(
                            replicas=rng.sample([1, 2, 3], 2),
                            leader=rng.choice([1, 2]),
                            leader_epoch=step,
                            isr=[1, 2],
                        )
                        for p in range(n)
                    },
                )
            await h.settle()
            with h.view.lock:
                topics = {k: v.value for k, v in h.view.topics.items()}
                parts = {k: v.value for k, v in h.view.partitions.items()}
            want = desired_assignments(1, topics, parts)
            assert h.manager._assignments == want, step
            assert set(h.manager.partitions) == set(want), step
            assert {tp for tp, _ in h.manager.logs or ()} == set(want), step
        assert h.manager.passes["topics"] >= 60 and h.manager.passes["all"] == 1

    with_harness(tmp_path, body)


def test_a_resync_makes_a_full_pass_and_keys_a_reconcile_does_not_read_make_none(
    tmp_path: Path,
) -> None:
    """A watch resync lists what exists, not what was deleted meanwhile: it makes a full pass
    (here the listing holds the cluster key alone, so every replica goes). A node key makes
    no pass at all."""

    async def body(h: Harness) -> None:
        h.put(h.keys.cluster, md.ClusterInfo(cluster_id="unit"))
        h.topic("a", {0: leader_state()})
        await h.settle()
        assert set(h.manager.partitions) == {("a", 0)}
        passes = dict(h.manager.passes)

        h.put(h.keys.node(7), md.NodeRegistration(node_id=7, host="h", port=1))
        await h.settle()
        assert h.manager.passes == passes

        store = h.view.store
        cluster = WatchEvent(h.keys.cluster, encode(md.ClusterInfo(cluster_id="unit")).encode(), 1)
        store.get_prefix_raw = lambda _root: (h.rev + 1, [cluster])  # type: ignore[attr-defined]
        store.retry = lambda fn, deadline_s: fn()  # type: ignore[attr-defined]
        t = threading.Thread(target=h.view._resync)  # on a thread, as the watch does it
        t.start()
        t.join()
        await h.settle()
        assert h.manager.passes["all"] == passes["all"] + 1
        assert not h.manager.partitions  # "a" was deleted while the watch was away

    with_harness(tmp_path, body)


def test_a_new_leader_answers_offset_not_available_until_its_high_watermark_catches_up(
    tmp_path: Path,
) -> None:
    """A leader's high watermark starts from what it knew as a follower: answering "latest"
    from it took the end of the log back (found from outside: 5311 -> 5300 after a leader
    move). As Kafka (KIP-207), lookups other than earliest wait until the HW has reached the
    offset where this leadership started."""

    def lookup(ts: int) -> pb.ListOffsetsRequest:
        part = pb.ListOffsetsPartition(partition=0, timestamp=ts, current_leader_epoch=-1)
        return pb.ListOffsetsRequest(
            replica_id=-1, topics=[pb.ListOffsetsTopic(topic="t", partitions=[part])]
        )

    async def answer(h: Harness, ts: int) -> Any:
        return results(await h.servicer.ListOffsets(lookup(ts), None))[("t", 0)]

    async def body(h: Harness) -> None:
        state = lambda leader, epoch: md.PartitionState(  # noqa: E731
            replicas=[1, 2], leader=leader, leader_epoch=epoch, isr=[1, 2]
        )
        h.topic("t", {0: state(1, 0)})
        await h.settle()
        s = h.servicer
        await s.Produce(produce_req({("t", 0): encode_batch([b"a", b"b", b"c"])}), None)
        assert (await answer(h, -1)).offset == 0  # follower 2 has nothing yet: HW 0
        h.put(h.keys.partition("t", 0), state(2, 1))  # leadership moves away and back
        await h.settle()
        h.put(h.keys.partition("t", 0), state(1, 2))
        await h.settle()
        for ts in (-1, -3, 0):
            assert (await answer(h, ts)).error_code == E.OFFSET_NOT_AVAILABLE, ts
        earliest = await answer(h, -2)
        assert earliest.error_code == E.NONE and earliest.offset == 0
        # The follower reports it holds everything: the HW reaches the start, answers resume.
        await s.Fetch(fetch_req("t", 0, 3, replica_id=2, last_fetched_epoch=0), None)
        latest = await answer(h, -1)
        assert latest.error_code == E.NONE and latest.offset == 3

    with_harness(tmp_path, body)


def test_damaged_reads_are_counted_each_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer or follower stuck at a damaged batch fails the same way many times a
    second: each is counted (strom_storage_corrupt_reads_total), one line a minute is logged
    (found from outside: a line per fetch, and no metric)."""
    from strom.storage import metrics, rpc_base

    clock = [1000.0]
    monkeypatch.setattr(rpc_base.time, "monotonic", lambda: clock[0])
    counter = metrics.CORRUPT_READS.labels("dmg", "0")
    before = counter._value.get()
    exc = CorruptLogError(
        "/d/dmg-0/00000000000000000000.log position 0: CRC-32C mismatch", offset=7
    )
    with caplog.at_level("ERROR", logger="strom.storage.servicer"):
        for _ in range(5):
            r = rpc_base._unexpected("fetch from", "dmg", 0, exc)
        clock[0] += rpc_base.CORRUPT_LOG_INTERVAL_S
        rpc_base._unexpected("fetch from", "dmg", 0, exc)
    assert r.code == E.STORAGE_ERROR and r.message.startswith("stored data at offset 7 failed")
    assert counter._value.get() - before == 6
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 2 and "00000000000000000000.log" in lines[0], lines
    assert "at offset 7" in lines[0] and "4 more refusals" in lines[1], lines


#: A legal topic name (249 characters) too long for ``<name>-<p>.deleted``, which older
#: strom tried to rename a deleted replica to.
LONG = "long" + "x" * 245


def _put_topic(h: Harness, name: str, topic_id: str, parts: dict[int, md.PartitionState]) -> None:
    """``name`` with the given topic id (Harness.topic always gives ``id-<name>``)."""
    evs = [
        WatchEvent(
            h.keys.topic(name),
            encode(
                md.TopicMetadata(name=name, topic_id=topic_id, partition_count=len(parts))
            ).encode(),
            0,
        )
    ]
    for p, s in parts.items():
        s.topic_id = topic_id
        evs.append(WatchEvent(h.keys.partition(name, p), encode(s).encode(), 0))
    h.events(evs)


def test_a_log_left_on_disk_by_a_deleted_topic_is_never_adopted_by_its_successor(
    tmp_path: Path,
) -> None:
    """Found from outside: a delete that failed (the rename to ``.deleted`` too long) left the
    replica's folder on disk, out of the node's tables; re-creating the name opened it,
    relabelled its ``partition.metadata`` with the new id and served the deleted records
    as the new topic's. A folder recording another topic id is now set aside first."""

    async def body(h: Harness) -> None:
        h.topic(LONG, {0: leader_state()})
        await h.settle()
        await h.servicer.Produce(produce_req({(LONG, 0): encode_batch([b"o0", b"o1"])}), None)
        lg = h.manager.partitions[(LONG, 0)].log
        assert lg.log_end_offset == 2
        lg.flush()
        shutil.copytree(lg.directory, tmp_path / "left")
        h.events(
            [
                WatchEvent(h.keys.topic(LONG), None, 0),
                WatchEvent(h.keys.partition(LONG, 0), None, 0),
            ]
        )
        await h.settle()
        assert not lg.directory.exists()
        shutil.copytree(tmp_path / "left", lg.directory)  # what the failed delete left
        _put_topic(h, LONG, "id-new", {0: leader_state()})
        await h.settle()
        new = h.manager.partitions[(LONG, 0)].log
        assert new.log_end_offset == 0 and new.directory == lg.directory
        assert (new.directory / PARTITION_METADATA).read_text().endswith("topic_id: id-new\n")
        resp = await h.servicer.Produce(produce_req({(LONG, 0): encode_batch([b"n0"])}), None)
        assert results(resp)[(LONG, 0)].base_offset == 0
        (aside,) = _set_aside(tmp_path / "data")
        assert (aside / PARTITION_METADATA).read_text().endswith(f"topic_id: id-{LONG}\n")

    with_harness(tmp_path, body)


def _set_aside(data: Path) -> list[Path]:
    """The folders of ``data`` set aside (``...-stray-<time>``)."""
    return sorted(p for p in data.iterdir() if p.is_dir() and "-stray-" in p.name)


def _set_aside_count(topic: str, reason: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"topic": topic, "reason": reason}
    return REGISTRY.get_sample_value("strom_storage_replicas_set_aside_total", labels) or 0.0


def test_a_log_found_at_start_with_another_topic_id_is_set_aside_and_the_partition_starts_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: one changed character in an RF=1 replica's partition.metadata
    made the next start delete the whole log (high watermark 13490 -> 267) with one info
    line. The folder is now set aside like a stray, its records intact for an operator, with
    a warning naming the folder, both ids and where it went, and a count; the partition
    starts empty under the assigned id and never serves the other id's records. (A
    249-character topic: its set-aside name is cut to fit, as a stray's.)"""
    data = tmp_path / "data"
    logs = LogManager(data, fsync=False)
    old = logs.get_or_create(LONG, 0)
    old.append(encode_batch([b"o0", b"o1", b"o2"]), leader_epoch=0)
    write_topic_id(old.directory, "id-old", fsync=False)
    logs.close()
    before = _set_aside_count(LONG, "topic_id_mismatch")

    async def body(h: Harness) -> None:
        with caplog.at_level("WARNING", logger="strom.storage.manager"):
            h.topic(LONG, {0: leader_state()})
            await h.settle()
        lg = h.manager.partitions[(LONG, 0)].log
        assert lg.log_end_offset == 0
        assert (lg.directory / PARTITION_METADATA).read_text().endswith(f"topic_id: id-{LONG}\n")
        (aside,) = _set_aside(data)
        assert len(aside.name.encode()) <= 255
        assert (aside / PARTITION_METADATA).read_text().endswith("topic_id: id-old\n")
        kept = LogManager(tmp_path / "copy", fsync=False)
        shutil.copytree(aside, tmp_path / "copy" / "kept-0")
        kept.close()
        again = LogManager(tmp_path / "copy", fsync=False)
        assert again.get("kept", 0) is not None and again.get("kept", 0).log_end_offset == 3
        again.close()
        (line,) = [r for r in caplog.records if "records topic id" in r.getMessage()]
        msg = line.getMessage()
        assert line.levelname == "WARNING"
        assert str(data / f"{LONG}-0") in msg and str(aside) in msg
        assert "id-old" in msg and f"id-{LONG}" in msg and "log end offset 3" in msg
        assert _set_aside_count(LONG, "topic_id_mismatch") == before + 1

    with_harness(tmp_path, body)


def test_a_log_of_another_topic_id_that_cannot_be_set_aside_is_not_hosted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever keeps the old folder where it is (a rename that fails, faked here), the
    partition is not hosted on it: the records of another topic id are never served as the
    assigned topic's, the folder keeps its own id for the next try, and the error says why."""

    async def body(h: Harness) -> None:
        assert h.manager.logs is not None
        old = h.manager.logs.get_or_create("t", 0, {})
        old.append(encode_batch([b"o0"]), leader_epoch=0)
        write_topic_id(old.directory, "id-old", fsync=False)
        h.manager.logs.logs.pop(("t", 0)).close()  # out of the tables, as a failed delete left it

        def refuse(topic: str, partition: int, suffix: str) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(h.manager.logs, "set_aside", refuse)
        with caplog.at_level("WARNING", logger="strom.storage.manager"):
            h.topic("t", {0: leader_state()})
            await h.settle()
        assert ("t", 0) not in h.manager.partitions
        warned = [r.getMessage() for r in caplog.records if "records topic id" in r.getMessage()]
        assert warned and "id-old" in warned[0] and "id-t" in warned[0]
        assert "Permission denied" in warned[0]
        assert (old.directory / PARTITION_METADATA).read_text().endswith("topic_id: id-old\n")
        assert (old.directory / "00000000000000000000.log").stat().st_size > 0

    with_harness(tmp_path, body)


def test_a_recovery_that_cuts_a_log_is_counted(tmp_path: Path) -> None:
    """Found from outside: a recovery that cut 2.5 MB from a log ("recovery truncated ...
    bytes") showed in no metric, so no alert could tell an operator a replica lost data."""
    from prometheus_client import REGISTRY

    data = tmp_path / "data"
    logs = LogManager(data, fsync=False)
    lg = logs.get_or_create("cut", 0)
    lg.append(encode_batch([b"a", b"b"]), leader_epoch=0)
    segment = lg.directory / "00000000000000000000.log"
    logs.close()
    (data / ".strom-clean-shutdown").unlink()  # a crash
    with open(segment, "ab") as f:
        f.write(b"\x00" * 10 + b"\x7f" * 30)  # a batch torn half way
    sample = REGISTRY.get_sample_value
    bytes_before = sample("strom_storage_recovery_truncated_bytes_total", {"topic": "cut"}) or 0
    events_before = sample("strom_storage_recovery_truncations_total", {"topic": "cut"}) or 0

    async def body(h: Harness) -> None:
        assert h.manager.logs is not None and h.manager.logs.get("cut", 0) is not None
        assert h.manager.logs.get("cut", 0).log_end_offset == 2
        assert sample("strom_storage_recovery_truncated_bytes_total", {"topic": "cut"}) == (
            bytes_before + 40
        )
        assert sample("strom_storage_recovery_truncations_total", {"topic": "cut"}) == (
            events_before + 1
        )

    with_harness(tmp_path, body)
