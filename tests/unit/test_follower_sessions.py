"""A follower's FetchStream is a session (strom.storage.fetch_rpcs.FollowerSession): the leader
answers only the partitions with news for it, and still counts it as fetching the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strom.api import metadata_pb2 as md
from strom.api import storage_pb2 as pb
from strom.errors import ErrorCode as E
from strom.record import encode_batch
from strom.storage.fetch_rpcs import FollowerSession
from tests.unit.test_storage_servicer import Harness, produce_req, with_harness


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def follower_req(
    offsets: dict[int, int],
    epoch: int = 0,
    incarnation: str = "incarnation-2",
    starts: dict[int, int] | None = None,
) -> pb.FetchRequest:
    """Node 2's fetch of topic ``t`` at ``offsets`` (partition -> its log end), as its replica
    fetcher sends it: its leader epoch, the epoch of its last batch, its log start (0 unless
    ``starts`` says otherwise)."""
    return pb.FetchRequest(
        replica_id=2,
        replica_incarnation=incarnation,
        follows_log_start=True,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[
            pb.FetchTopic(
                topic="t",
                topic_id="id-t",
                partitions=[
                    pb.FetchPartition(
                        partition=p,
                        fetch_offset=o,
                        current_leader_epoch=epoch,
                        last_fetched_epoch=0 if o else -1,
                        log_start_offset=(starts or {}).get(p, 0),
                        partition_max_bytes=1 << 20,
                    )
                    for p, o in offsets.items()
                ],
            )
        ],
    )


async def answer(h: Harness, session: FollowerSession, req: pb.FetchRequest) -> dict[int, Any]:
    session.request = req
    raw = await h.servicer.fetch_in_session(session, None)
    resp = pb.FetchResponse.FromString(raw)
    return {p.partition: p for t in resp.topics for p in t.partitions}


def state(epoch: int = 0) -> md.PartitionState:
    return md.PartitionState(replicas=[1, 2], leader=1, leader_epoch=epoch, isr=[1, 2])


async def two_partitions(h: Harness) -> Clock:
    h.topic("t", {0: state(), 1: state()})
    await h.settle()
    clock = Clock()
    for part in h.manager.partitions.values():
        part.clock = clock
    return clock


def test_only_partitions_with_news_are_answered_and_the_rest_count_as_fetched(
    tmp_path: Path,
) -> None:
    async def body(h: Harness) -> None:
        clock = await two_partitions(h)
        s = h.servicer
        p0, p1 = h.manager.partitions[("t", 0)], h.manager.partitions[("t", 1)]
        await s.Produce(produce_req({("t", 0): encode_batch([b"a", b"b", b"c"])}), None)
        session = FollowerSession()

        first = await answer(h, session, follower_req({0: 0, 1: 0}))
        assert set(first) == {0, 1} and first[0].records and not first[1].records

        # Partition 0 moved on (the follower's position, then the HW); partition 1 did not.
        second = await answer(h, session, follower_req({0: 3, 1: 0}))
        assert set(second) == {0} and second[0].high_watermark == 3 == p0.high_watermark

        # Nothing new anywhere: an empty answer, and the follower is caught up as of now.
        clock.t = 130.0
        assert await answer(h, session, follower_req({0: 3, 1: 0})) == {}
        assert p0.caught_up_at[2] == p1.caught_up_at[2] == 130.0
        assert p0.replica_end_offsets[2] == 3 and p1.replica_end_offsets[2] == 0

        # An append is news for its partition only.
        await s.Produce(produce_req({("t", 1): encode_batch([b"x"])}), None)
        fourth = await answer(h, session, follower_req({0: 3, 1: 0}))
        assert set(fourth) == {1} and fourth[1].records and fourth[1].high_watermark == 0

        # The follower's position moves the HW: that is news (the answer tells it).
        fifth = await answer(h, session, follower_req({0: 3, 1: 1}))
        assert set(fifth) == {1} and fifth[1].high_watermark == 1 and not fifth[1].records
        assert await answer(h, session, follower_req({0: 3, 1: 1})) == {}

        # A new stream (session) is answered in full; so is another process of node 2.
        assert set(await answer(h, FollowerSession(), follower_req({0: 3, 1: 1}))) == {0, 1}
        h.put(h.keys.node(2), md.NodeRegistration(node_id=2, incarnation_id="incarnation-2b"))
        other = follower_req({0: 3, 1: 1}, incarnation="incarnation-2b")
        assert set(await answer(h, session, other)) == {0, 1}

    with_harness(tmp_path, body)


def test_a_new_leader_epoch_a_moved_log_start_and_a_lagging_follower_are_always_answered(
    tmp_path: Path,
) -> None:
    async def body(h: Harness) -> None:
        await two_partitions(h)
        s = h.servicer
        for p in (0, 1):
            await s.Produce(produce_req({("t", p): encode_batch([b"a", b"b"])}), None)
        session = FollowerSession()
        await answer(h, session, follower_req({0: 0, 1: 0}))
        await answer(h, session, follower_req({0: 2, 1: 2}))
        assert await answer(h, session, follower_req({0: 2, 1: 2})) == {}

        # DeleteRecords moves partition 1's log start: the follower must hear of it.
        assert h.manager.partitions[("t", 1)].log.delete_records(1) == 1
        moved = await answer(h, session, follower_req({0: 2, 1: 2}))
        assert set(moved) == {1} and moved[1].log_start_offset == 1
        # Until it moved its own start there too, it is told again each time.
        assert set(await answer(h, session, follower_req({0: 2, 1: 2}))) == {1}
        at = {1: 1}
        assert set(await answer(h, session, follower_req({0: 2, 1: 2}, starts=at))) == {1}
        assert await answer(h, session, follower_req({0: 2, 1: 2}, starts=at)) == {}

        # A new leader epoch (this node leads again): the follower's old epoch is fenced.
        h.topic("t", {0: state(epoch=1), 1: state(epoch=1)})
        await h.settle()
        fenced = await answer(h, session, follower_req({0: 2, 1: 2}, starts=at))
        assert {p: r.error_code for p, r in fenced.items()} == {
            0: E.FENCED_LEADER_EPOCH,
            1: E.FENCED_LEADER_EPOCH,
        }
        # At the new epoch, the first answer is full again (the new leadership knows no
        # follower position yet), then quiet.
        again = follower_req({0: 2, 1: 2}, epoch=1, starts=at)
        assert set(await answer(h, session, again)) == {0, 1}
        assert await answer(h, session, again) == {}

        # Out of the ISR, a follower at the log end is answered (it may be joining).
        part = h.manager.partitions[("t", 0)]
        part.isr = (1,)
        assert set(await answer(h, session, again)) == {0}

    with_harness(tmp_path, body)


def test_a_partition_no_longer_asked_for_is_forgotten(tmp_path: Path) -> None:
    """Found by review: the session kept every partition it ever answered for (and with it the
    closed log of a deleted topic) for as long as the stream lived."""

    async def body(h: Harness) -> None:
        await two_partitions(h)
        session = FollowerSession()
        await answer(h, session, follower_req({0: 0, 1: 0}))
        assert set(session.sent) == {("t", 0), ("t", 1)}
        await answer(h, session, follower_req({0: 0}))  # partition 1 moved away, say
        assert set(session.sent) == {("t", 0)}
        assert await answer(h, session, follower_req({0: 0})) == {}
        # Asked for again: answered in full first.
        assert set(await answer(h, session, follower_req({0: 0, 1: 0}))) == {1}

    with_harness(tmp_path, body)
