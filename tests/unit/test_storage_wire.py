"""Hand-rolled protobuf wire handling for Produce/Fetch agrees with the generated classes,
and the append writer keeps arrival order."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import pytest

from strom.api import common_pb2
from strom.api import storage_pb2 as pb
from strom.storage.wire import (
    SMALL_REQUEST_BYTES,
    FetchPartitionOut,
    FetchTopicOut,
    WireError,
    decode_produce_request,
    encode_fetch_response,
    parse_produce_request,
)
from strom.storage.writer import AppendWriter


def test_produce_request_parses_like_protobuf_without_copying_records() -> None:
    big = bytes(range(256)) * 4096
    req = pb.ProduceRequest(
        acks=-1,
        timeout_ms=1500,
        topics=[
            pb.ProduceTopicData(
                topic="tö",
                topic_id="id-1",
                partitions=[
                    pb.ProducePartitionData(partition=0, records=big, current_leader_epoch=-1),
                    pb.ProducePartitionData(partition=7, records=b"x", current_leader_epoch=3),
                ],
            ),
            pb.ProduceTopicData(topic="empty"),
        ],
    )
    raw = req.SerializeToString()
    view = parse_produce_request(raw)
    assert (view.acks, view.timeout_ms) == (-1, 1500)
    assert [(t.topic, t.topic_id) for t in view.topics] == [("tö", "id-1"), ("empty", "")]
    p0, p7 = view.topics[0].partitions
    assert (p0.partition, p0.current_leader_epoch, bytes(p0.records)) == (0, -1, big)
    assert (p7.partition, p7.current_leader_epoch, bytes(p7.records)) == (7, 3, b"x")
    assert isinstance(p0.records, memoryview) and p0.records.obj is raw  # a view, not a copy
    assert view.topics[1].partitions == []


@pytest.mark.parametrize("size", [1, SMALL_REQUEST_BYTES - 100, SMALL_REQUEST_BYTES + 1, 1 << 20])
def test_the_servers_produce_decoder_reads_small_and_large_requests_alike(size: int) -> None:
    """Small requests go to the generated parser, large ones to the zero-copy view; what the
    servicer reads of them is the same."""
    records = bytes(range(256)) * (size // 256) + b"r" * (size % 256)
    req = pb.ProduceRequest(
        acks=1,
        timeout_ms=700,
        topics=[
            pb.ProduceTopicData(
                topic="t",
                partitions=[
                    pb.ProducePartitionData(partition=2, records=records, current_leader_epoch=4)
                ],
                topic_id="tid",
            )
        ],
    )
    raw = req.SerializeToString()
    got = decode_produce_request(raw)
    small = len(raw) <= SMALL_REQUEST_BYTES
    assert isinstance(got, pb.ProduceRequest) is small
    assert (got.acks, got.timeout_ms) == (1, 700)
    ((topic, topic_id, parts),) = [(t.topic, t.topic_id, list(t.partitions)) for t in got.topics]
    (p,) = parts
    assert (topic, topic_id, p.partition, p.current_leader_epoch) == ("t", "tid", 2, 4)
    assert bytes(p.records) == records
    if not small:
        assert isinstance(p.records, memoryview) and p.records.obj is raw


def test_unknown_fields_are_skipped_and_garbage_refused() -> None:
    # acks=1, then an unknown fixed64 field 9 and an unknown length-delimited field 10.
    raw = b"\x08\x01" + b"\x49" + b"\x00" * 8 + b"\x52\x02hi"
    assert parse_produce_request(raw).acks == 1
    with pytest.raises(WireError):
        parse_produce_request(b"\x1a\x05ab")  # a topic claiming 5 bytes, 2 present
    with pytest.raises(WireError):
        parse_produce_request(b"\x08")  # truncated varint


def test_fetch_response_encodes_like_protobuf() -> None:
    recs = b"\x00" * 300 + b"payload"
    p0 = pb.FetchPartitionResponse(
        partition=0, high_watermark=10, last_stable_offset=10, log_start_offset=2
    )
    p0.preferred_read_replica = -1
    p1 = pb.FetchPartitionResponse(partition=1, error_code=30, error_message="not leader")
    p1.current_leader.CopyFrom(common_pb2.LeaderAndEpoch(leader_id=2, leader_epoch=5))
    endpoints = pb.FetchResponse(node_endpoints=[common_pb2.Node(node_id=2, host="h", port=9)])
    raw = encode_fetch_response(
        [
            FetchTopicOut("a", [FetchPartitionOut(p0, memoryview(recs)), FetchPartitionOut(p1)]),
            FetchTopicOut("b"),
        ],
        endpoints,
    )
    expect = pb.FetchResponse(
        topics=[
            pb.FetchTopicResponse(topic="a", partitions=[p0, p1]),
            pb.FetchTopicResponse(topic="b"),
        ],
        node_endpoints=endpoints.node_endpoints,
    )
    expect.topics[0].partitions[0].records = recs
    assert pb.FetchResponse.FromString(raw) == expect


def _big_and_small_jobs() -> tuple[
    list[str], threading.Event, Callable[[], str], Callable[[], str]
]:
    """Two writer jobs noting the order they ran in: ``big`` blocks until ``release`` is set."""
    order: list[str] = []
    release = threading.Event()

    def big() -> str:
        release.wait(5)
        order.append("big")
        return "big"

    def small() -> str:
        order.append("small")
        return "small"

    return order, release, big, small


def test_writer_keeps_arrival_order_across_inline_and_threaded_jobs() -> None:
    async def main() -> None:
        writer = AppendWriter(inline_max_bytes=100)
        order, release, big, small = _big_and_small_jobs()
        first = asyncio.create_task(writer.run(big, 1000))
        await asyncio.sleep(0)  # submitted to the thread, blocked there
        second = asyncio.create_task(writer.run(small, 10))  # must queue behind, not run inline
        await asyncio.sleep(0)  # one pass: the task ran up to its wait (or, wrongly, inline)
        assert order == [] and writer.pending == 2  # queued behind the big one
        release.set()
        assert await first == "big" and await second == "small"
        assert order == ["big", "small"]
        assert await writer.run(small, 10) == "small" and writer.pending == 0  # idle: inline
        writer.close()

    asyncio.run(main())


def test_a_cancelled_callers_append_is_still_written_in_order_and_published() -> None:
    """A client that goes away (its call cancelled) while its append waits on the writer
    thread: the append still counts as pending until written, so a later small append queues
    behind it instead of running inline beside it, and what follows the append (``then``:
    the high watermark, woken fetches) still runs."""

    async def main() -> None:
        writer = AppendWriter(inline_max_bytes=100)
        order, release, big, small = _big_and_small_jobs()
        published = asyncio.Event()

        def publish(result: str) -> str:
            order.append(f"published {result}")
            published.set()
            return result

        gone = asyncio.create_task(writer.run(big, 1000, publish))
        await asyncio.sleep(0)  # submitted to the thread, blocked there
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        assert writer.pending == 1  # still on the thread
        later = asyncio.create_task(writer.run(small, 10))  # must not run inline now
        await asyncio.sleep(0)
        assert order == []
        release.set()
        await published.wait()
        assert await later == "small"
        assert [x for x in order if not x.startswith("published")] == ["big", "small"]
        assert order.index("published big") > order.index("big")
        assert writer.pending == 0
        writer.close()

    asyncio.run(main())


def test_an_append_the_closed_writer_refuses_leaves_nothing_pending() -> None:
    async def main() -> None:
        writer = AppendWriter(inline_max_bytes=100)
        writer.close()
        with pytest.raises(RuntimeError):
            await writer.run(lambda: "big", 1000)
        assert writer.pending == 0
        assert await writer.run(lambda: "small", 10) == "small"  # still inline

    asyncio.run(main())
