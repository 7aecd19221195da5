"""The consumer's fetch engine without a cluster: the zero-copy FetchResponse parser, draining
batches to records and Arrow, and the fetch workers against a scripted in-process "leader"
(prefetch bound, stale answers after a seek, offset-out-of-range policies, leader hints)."""

from __future__ import annotations

import gc
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest

from strom.api import common_pb2, storage_pb2
from strom.client import downgrades, fetch_overdue
from strom.client.fetch_state import Constants as _Constants
from strom.client.fetcher import (
    CONSUMER_SCHEMA,
    SPLIT_REQUEST_BYTES,
    STORAGE_ERRORS_RAISED_AFTER,
    CompletedFetch,
    Fetcher,
    FetchWireError,
    corrupt_batches,
    decode_bodies,
    parse_fetch_answer,
    parse_fetch_response,
    unreadable_batch_error,
)
from strom.client.offsets import LeaderMap, PartitionLeader
from strom.client.types import TopicPartition
from strom.devcluster.procs import wait_for
from strom.errors import (
    CorruptMessageError,
    ErrorCode,
    MessageTooLargeError,
    NotLeaderError,
    OffsetOutOfRangeError,
    StorageError,
)
from strom.record import (
    BODY_SCHEMA_V1,
    HEADER_SIZE,
    InvalidBatchError,
    Record,
    TimestampType,
    decode_batches,
    encode_batch,
    small_body,
)
from strom.record import codecs as codecs_mod
from strom.storage.wire import FetchPartitionOut, FetchTopicOut, encode_fetch_response
from tests.unit.reframe import rebuild

TP = TopicPartition("t", 0)


def batches(*specs: tuple[int, int], **kw: Any) -> bytes:
    """Concatenated batches, each (base_offset, record count), values b"v<offset>"."""
    return b"".join(
        encode_batch([b"v%d" % (base + i) for i in range(n)], base_offset=base, **kw)
        for base, n in specs
    )


def completed(raw: bytes, check_crcs: bool = True) -> CompletedFetch:
    return CompletedFetch(TP, decode_batches(raw, verify_crc=False), check_crcs=check_crcs)


# -- wire format ------------------------------------------------------------------------------


def test_parse_fetch_response_keeps_records_uncopied() -> None:
    data = batches((0, 3), (3, 2))
    p0 = storage_pb2.FetchPartitionResponse(
        partition=0, high_watermark=5, last_stable_offset=5, log_start_offset=0
    )
    p1 = storage_pb2.FetchPartitionResponse(
        partition=1,
        error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
        error_message="moved",
        high_watermark=-1,
        current_leader=common_pb2.LeaderAndEpoch(leader_id=7, leader_epoch=3),
    )
    endpoints = storage_pb2.FetchResponse(
        node_endpoints=[common_pb2.Node(node_id=7, host="h7", port=97)]
    )
    raw = encode_fetch_response(
        [FetchTopicOut("t", [FetchPartitionOut(p0, data), FetchPartitionOut(p1)])], endpoints
    )
    answers, nodes = parse_fetch_response(raw)
    assert [(a.topic, a.info.partition) for a in answers] == [("t", 0), ("t", 1)]
    assert bytes(answers[0].records) == data
    assert answers[0].records.obj is raw  # a view into gRPC's buffer, not a copy
    assert answers[0].info.high_watermark == 5
    assert answers[1].info.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert answers[1].info.current_leader.leader_id == 7
    assert len(answers[1].records) == 0
    assert [(n.node_id, n.host, n.port) for n in nodes] == [(7, "h7", 97)]


def test_parse_fetch_response_of_a_generated_message() -> None:
    data = batches((10, 4))
    msg = storage_pb2.FetchResponse(
        topics=[
            storage_pb2.FetchTopicResponse(
                topic="a",
                partitions=[
                    storage_pb2.FetchPartitionResponse(
                        partition=2, high_watermark=14, records=data, preferred_read_replica=-1
                    )
                ],
            ),
            storage_pb2.FetchTopicResponse(
                topic="b",
                partitions=[
                    storage_pb2.FetchPartitionResponse(
                        partition=0, error_code=ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=9
                    )
                ],
            ),
        ]
    )
    answers, nodes = parse_fetch_response(msg.SerializeToString())
    assert nodes == []
    assert [(a.topic, a.info.partition) for a in answers] == [("a", 2), ("b", 0)]
    assert bytes(answers[0].records) == data
    assert answers[0].info.preferred_read_replica == -1
    assert answers[1].info.log_start_offset == 9


def test_parse_fetch_answer_reads_the_throttle_time() -> None:
    """The consumer's fetch-throttle-time metrics: read once per answer, from the same walk
    over the response's fields; 0 when the node did not throttle (the field left out)."""
    msg = storage_pb2.FetchResponse(
        topics=[storage_pb2.FetchTopicResponse(topic="a")], throttle_time_ms=250
    )
    answers, nodes, throttle_ms = parse_fetch_answer(msg.SerializeToString())
    assert throttle_ms == 250 and nodes == [] and answers == []
    assert parse_fetch_answer(storage_pb2.FetchResponse().SerializeToString())[2] == 0


def test_parse_fetch_response_rejects_garbage() -> None:
    with pytest.raises(FetchWireError):
        parse_fetch_response(b"\x0a\x7f\x01")  # a topic claiming 127 bytes
    with pytest.raises(FetchWireError):
        parse_fetch_response(b"\x0b")  # wire type 3 (groups) is not used


# -- draining ---------------------------------------------------------------------------------


def test_take_records_skips_below_the_position_and_honours_the_limit() -> None:
    cf = completed(batches((0, 10), (10, 10), (20, 10)))
    recs, pos = cf.take_records(5, 7)  # the fetch started inside the first batch
    assert [r.offset for r in recs] == list(range(5, 12)) and pos == 12
    assert recs[0] == Record(None, b"v5", (), recs[0].timestamp, 5, "t", 0)
    recs, pos = cf.take_records(pos, 100)
    assert [r.offset for r in recs] == list(range(12, 30)) and pos == 30
    assert cf.exhausted


def test_take_records_fields() -> None:
    raw = encode_batch(
        [b"a", None, b"c"],
        keys=[b"k0", None, b"k2"],
        headers=[[("x", b"1"), ("y", None)], None, []],
        timestamps=[1000, 1001, 1003],
        base_offset=40,
    )
    recs, _ = completed(raw).take_records(40, 10)
    assert recs == [
        Record(b"k0", b"a", (("x", b"1"), ("y", None)), 1000, 40, "t", 0),
        Record(None, None, (), 1001, 41, "t", 0),
        Record(b"k2", b"c", (), 1003, 42, "t", 0),
    ]


def test_log_append_time_uses_the_batch_max_timestamp() -> None:
    raw = encode_batch([b"a", b"b"], log_append_time=True, now_ms=5000, base_offset=0)
    recs, _ = completed(raw).take_records(0, 10)
    assert [r.timestamp for r in recs] == [5000, 5000]


def test_compacted_gaps_and_control_batches_advance_the_position() -> None:
    # Compaction left offsets 0, 2, 5 of a batch covering 0..5; then a control batch 6..6.
    raw = encode_batch([b"a", b"b", b"c"], offset_deltas=[0, 2, 5], base_offset=0)
    raw += encode_batch([b"marker"], control=True, base_offset=6)
    raw += encode_batch([b"d"], base_offset=7)
    cf = completed(raw)
    recs, pos = cf.take_records(1, 100)
    assert [r.offset for r in recs] == [2, 5, 7] and pos == 8
    cf = completed(raw)
    recs, pos = cf.take_records(1, 2)
    assert [r.offset for r in recs] == [2, 5] and pos == 6  # the batch's end, not 5 + 1
    arrow, pos, n = completed(raw).take_arrow(1, 100, _Constants())
    assert pa.Table.from_batches(arrow).column("offset").to_pylist() == [2, 5, 7]
    assert (pos, n) == (8, 3)


def test_records_and_arrow_say_each_record_s_timestamp_type() -> None:
    """Record.timestamp_type and poll_arrow's timestamp_type column come from each batch's
    attribute bit 3 (Kafka's ConsumerRecord.timestampType(); found from outside: missing)."""
    raw = batches((0, 2), timestamps=[5, 6]) + batches((2, 3), log_append_time=True, now_ms=7)
    recs, _ = completed(raw).take_records(0, 100)
    assert [(r.timestamp, r.timestamp_type) for r in recs] == [
        (5, TimestampType.CREATE_TIME),
        (6, TimestampType.CREATE_TIME),
        *[(7, TimestampType.LOG_APPEND_TIME)] * 3,
    ]
    assert recs[0].timestamp_type == 0 and recs[2].timestamp_type == 1  # Kafka's ids
    assert [r.timestamp_type for r in decode_batches(raw)[1].records()] == [1, 1, 1]
    arrow, _, _ = completed(raw).take_arrow(1, 100, _Constants())
    table = pa.Table.from_batches(arrow, schema=CONSUMER_SCHEMA)
    assert table.column("timestamp_type").to_pylist() == [0, 1, 1, 1]
    assert table.schema.field("timestamp_type").type == pa.int8()


def test_take_arrow_matches_take_records_and_both_mix() -> None:
    raw = batches((0, 10), (10, 10), (20, 10))
    arrow_batches, pos, n = completed(raw).take_arrow(3, 1000, _Constants())
    table = pa.Table.from_batches(arrow_batches, schema=CONSUMER_SCHEMA)
    assert table.schema.equals(CONSUMER_SCHEMA)
    assert (n, pos, table.num_rows) == (27, 30, 27)
    assert table.column("offset").to_pylist() == list(range(3, 30))
    assert set(table.column("topic").to_pylist()) == {"t"}
    assert set(table.column("partition").to_pylist()) == {0}
    recs, _ = completed(raw).take_records(3, 1000)
    assert table.column("value").to_pylist() == [r.value for r in recs]

    cf = completed(raw)
    a, pos = cf.take_records(0, 4)
    b, pos, _ = cf.take_arrow(pos, 9, _Constants())
    c, pos = cf.take_records(pos, 3)
    d, pos, _ = cf.take_arrow(pos, 1000, _Constants())
    offsets = (
        [r.offset for r in a]
        + pa.Table.from_batches(b).column("offset").to_pylist()
        + [r.offset for r in c]
        + pa.Table.from_batches(d).column("offset").to_pylist()
    )
    assert offsets == list(range(30)) and pos == 30


def test_a_corrupt_batch_is_caught_when_drained() -> None:
    raw = bytearray(batches((0, 5), (5, 5)))
    raw[-3] ^= 0xFF  # inside the second batch's body
    cf = completed(bytes(raw))
    recs, pos = cf.take_records(0, 5)
    assert pos == 5 and len(recs) == 5  # the intact first batch is fine
    with pytest.raises(InvalidBatchError, match="CRC"):
        cf.take_records(pos, 5)
    with pytest.raises(InvalidBatchError, match="CRC"):
        cf.take_arrow(pos, 5, _Constants())


def test_a_batch_over_the_readers_limit_is_too_large_not_corrupt() -> None:
    """A well-formed batch longer than the reader decodes says so (MessageTooLargeError with
    the limit, the offset, and the offset to seek to), not "corrupt" (found from outside:
    CORRUPT_MESSAGE "... exceeds the maximum of 67108864" sent users looking for damage)."""
    raw = encode_batch([b"x" * 1000, b"y"], base_offset=7)
    with pytest.raises(InvalidBatchError) as caught:
        decode_batches(raw, max_batch_bytes=500)
    assert caught.value.too_large and caught.value.next_offset == 9
    err = unreadable_batch_error(TP, 7, caught.value)
    assert isinstance(err, MessageTooLargeError) and not isinstance(err, CorruptMessageError)
    msg = str(err)
    assert "t-0 at offset 7" in msg and "too large for this reader" in msg
    assert "the limit is 500 bytes" in msg and "seek to offset 9" in msg
    assert "corrupt" not in msg.lower()


def test_a_body_decompressing_past_the_bound_is_too_large_with_where_to_skip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compressed body over the decompression bound (a bomb a non-strom client wrote) is
    raised when drained as too large, naming the offset after its batch; the batch before
    it is returned first (found from outside: "zstd body decompresses to more than ..."
    came as CORRUPT_MESSAGE without saying where to skip)."""
    monkeypatch.setattr(codecs_mod, "MAX_DECOMPRESSED_BYTES", 1 << 16)
    raw = batches((0, 3)) + encode_batch([bytes(1 << 20)], base_offset=3, compression="zstd")
    assert len(raw) < 1 << 12  # tiny on the wire
    cf = completed(raw)
    recs, pos = cf.take_records(0, 10)
    assert len(recs) == 3 and pos == 3
    with pytest.raises(InvalidBatchError) as caught:
        cf.take_records(pos, 10)
    assert caught.value.too_large and caught.value.next_offset == 4
    err = unreadable_batch_error(TP, pos, caught.value)
    assert isinstance(err, MessageTooLargeError)
    assert "seek to offset 4" in str(err) and str(1 << 16) in str(err)
    # something broken stays CorruptMessageError
    bad = unreadable_batch_error(TP, 0, InvalidBatchError("CRC-32C mismatch"))
    assert isinstance(bad, CorruptMessageError) and "seek past it" in str(bad)


def test_a_corrupt_batch_found_on_arrival_is_raised_only_when_drained() -> None:
    """The fetch thread checks CRCs when the answer arrives; the application still gets the
    intact batches before the bad one, then the error, as when the check ran on draining."""
    raw = bytearray(batches((0, 5), (5, 5), (10, 5)))
    raw[len(raw) // 2] ^= 0xFF  # inside the second batch
    bs = decode_batches(bytes(raw), verify_crc=False)
    assert corrupt_batches(bs) == {5}
    assert corrupt_batches(decode_batches(batches((0, 5), (5, 5)))) == set()
    for take in ("records", "arrow"):
        cf = CompletedFetch(TP, bs, corrupt=corrupt_batches(bs))
        if take == "records":
            recs, pos = cf.take_records(0, 100)
            assert [r.offset for r in recs] == list(range(5)) and pos == 5
            with pytest.raises(InvalidBatchError, match="CRC"):
                cf.take_records(pos, 5)
        else:
            pieces, pos, n = cf.take_arrow(0, 100, _Constants())
            assert n == 5 and pos == 5
            offsets = pa.Table.from_batches(pieces).column("offset").to_pylist()
            assert offsets == list(range(5))
            with pytest.raises(InvalidBatchError, match="CRC"):
                cf.take_arrow(pos, 5, _Constants())


def _backwards(base: int, n: int) -> bytes:
    """A batch of ``n`` records with a right CRC whose Arrow body does not pass the reader's
    checks (its offset deltas go backwards)."""
    good = encode_batch([b"v%d" % (base + i) for i in range(n)], base_offset=base)
    rb = pa.ipc.read_record_batch(pa.py_buffer(good[HEADER_SIZE:]), BODY_SCHEMA_V1)
    deltas = pa.array(list(range(n))[::-1], pa.int32())
    body = (
        pa.RecordBatch.from_arrays([deltas, *rb.columns[1:]], schema=BODY_SCHEMA_V1)
        .serialize()
        .to_pybytes()
    )
    return rebuild(good, body)


def test_big_bodies_are_decoded_on_arrival_and_a_bad_one_is_raised_when_drained() -> None:
    """The fetch thread decodes the Arrow bodies of batches over ``small_body.MAX_RECORDS``
    records (pyarrow's releases of the interpreter lock then cost the application's thread
    nothing); small ones are left to the drain's own reader, and a body that does not decode
    is left too and raised when drained, after the records before it."""
    big = small_body.MAX_RECORDS + 36
    raw = batches((0, big), (big, 10)) + _backwards(big + 10, big) + batches((2 * big + 10, big))
    bs = decode_batches(raw, verify_crc=False)
    bad = corrupt_batches(bs)
    assert bad == set()  # every CRC is right
    decode_bodies(bs, bad)
    assert [b._body is not None for b in bs] == [True, False, False, True]
    # Compressed bodies wait for the drain (decompressed, a buffered answer would grow).
    (lz4,) = decode_batches(batches((0, big), compression="lz4"))
    decode_bodies([lz4], None)
    assert lz4._body is None and len(lz4.to_arrow()) == big
    for take in ("records", "arrow"):
        cf = CompletedFetch(TP, bs, corrupt=bad)
        if take == "records":
            recs, pos = cf.take_records(0, 10_000)
            assert [r.offset for r in recs] == list(range(big + 10))
            with pytest.raises(InvalidBatchError, match="increasing"):
                cf.take_records(pos, 10)
        else:
            pieces, pos, n = cf.take_arrow(0, 10_000, _Constants())
            offsets = pa.Table.from_batches(pieces).column("offset").to_pylist()
            assert offsets == list(range(big + 10)) and n == pos == big + 10
            with pytest.raises(InvalidBatchError, match="increasing"):
                cf.take_arrow(pos, 10, _Constants())


# -- the fetch workers against a scripted leader ----------------------------------------------


class FakeLeader:
    """A partition leader in-process: answers Fetch from a list of batches, one batch per
    request, with hooks to block or fail particular requests."""

    def __init__(self, batch_specs: list[tuple[int, int]], latency_s: float = 0.0) -> None:
        self.latency_s = latency_s  # simulated network time per request
        self.batches = [(base, n, batches((base, n))) for base, n in batch_specs]
        self.log_start = self.batches[0][0]
        self.hw = self.batches[-1][0] + self.batches[-1][1]
        self.requests: list[int] = []
        self.hold: dict[int, threading.Event] = {}  # fetch offset -> released when set
        self.stop = threading.Event()  # ends parked long polls
        self.answer: Callable[[storage_pb2.FetchPartition], Any] | None = None
        self.lock = threading.Lock()

    def __call__(self, req: storage_pb2.FetchRequest, **_: Any) -> bytes:
        fp = req.topics[0].partitions[0]
        with self.lock:
            self.requests.append(fp.fetch_offset)
        gate = self.hold.get(fp.fetch_offset)
        if gate is not None:
            gate.wait(10)
        if self.latency_s:
            time.sleep(self.latency_s)  # time is the behaviour: simulated network time
        pr = storage_pb2.FetchPartitionResponse(
            partition=fp.partition,
            high_watermark=self.hw,
            last_stable_offset=self.hw,
            log_start_offset=self.log_start,
        )
        data = b""
        special = self.answer(fp) if self.answer is not None else None
        if special is not None:
            pr = special
        elif fp.fetch_offset < self.log_start or fp.fetch_offset > self.hw:
            pr.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        else:
            for base, n, raw in self.batches:
                if base <= fp.fetch_offset < base + n:
                    data = raw
                    break
            else:  # at the end of the log: a long poll that no append ends
                self.stop.wait(5)
        out = FetchTopicOut(req.topics[0].topic, [FetchPartitionOut(pr, data)])
        return encode_fetch_response([out])


class FakeClient:
    def __init__(self, leaders: dict[str, FakeLeader]) -> None:
        self.leaders = leaders
        #: The fetch offset of every request, by how it went: "unary" or "stream".
        self.sent: list[tuple[str, int]] = []
        #: Nodes the fetcher asked to be looked up last (a Fetch to them went overdue).
        self.demoted: list[str] = []

    def demote(self, address: str) -> None:
        self.demoted.append(address)

    def channel(self, address: str) -> Any:
        leader = self.leaders[address]
        sent = self.sent

        def via(kind: str) -> Callable[..., bytes]:
            def call(req: storage_pb2.FetchRequest, **kw: Any) -> bytes:
                sent.append((kind, req.topics[0].partitions[0].fetch_offset))
                return leader(req, **kw)

            return call

        class Channel:
            def unary_unary(self, method: str, **_: Any) -> Callable[..., bytes]:
                return via("unary")

            def stream_stream(self, method: str, **_: Any) -> Any:
                return lambda requests, **_kw: FakeStreamCall(via("stream"), requests)

        return Channel()


class FakeStreamCall:
    """A FetchStream to a fake leader: each request pulled is answered on the caller's
    thread, as the leader answers a unary call."""

    def __init__(self, leader: Callable[..., bytes], requests: Any) -> None:
        self._leader = leader
        self._requests = iter(requests)
        self._done = False

    def __iter__(self) -> FakeStreamCall:
        return self

    def __next__(self) -> bytes:
        return self._leader(next(self._requests))

    def done(self) -> bool:
        return self._done

    def cancel(self) -> None:
        self._done = True


class FixedLeaders(LeaderMap):
    def __init__(self, leaders: dict[TopicPartition, PartitionLeader]) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self._leaders.update(leaders)
        self.refreshes = 0

    def refresh(self, topics: Any, **kw: Any) -> None:
        self.refreshes += 1


def make_fetcher(
    leaders: dict[str, FakeLeader], where: str = "n1", reset_policy: str = "earliest"
) -> tuple[Fetcher, FixedLeaders, list[list[int]]]:
    lm = FixedLeaders({TP: PartitionLeader(1, where, 5)})
    f = Fetcher(
        FakeClient(leaders),  # type: ignore[arg-type]
        lm,
        client_id="test",
        reset_policy=reset_policy,
        min_bytes=1,
        max_wait_ms=0,
        max_bytes=1 << 20,
        partition_max_bytes=1,
        check_crcs=True,
        request_timeout_s=5,
        backoff_s=0.01,
        backoff_max_s=0.05,
    )
    fetched: list[list[int]] = []  # fetch offsets of every finished round trip
    fetch = f._fetch

    def traced(address: str, claims: Any, **kw: Any) -> None:
        fetch(address, claims, **kw)
        fetched.append([c.fetch_offset for c in claims])

    f._fetch = traced  # type: ignore[method-assign]
    f.start()
    f.assign({TP})
    return f, lm, fetched


def stop(f: Fetcher, *leaders: FakeLeader) -> None:
    for leader in leaders:
        leader.stop.set()
        for gate in leader.hold.values():
            gate.set()
    f.close()
    f.join(5)


def drain(f: Fetcher, n: int, arrow: bool = False) -> list[int]:
    out: list[int] = []

    def more() -> bool:
        items, _ = f.collect(1000, arrow=arrow)
        if arrow:
            out.extend(pa.Table.from_batches(items, CONSUMER_SCHEMA).column("offset").to_pylist())
        else:
            out.extend(r.offset for r in items)
        return len(out) >= n

    wait_for(more, timeout=10, what=f"{n} records")
    return out


def test_prefetch_is_bounded_and_resumes_as_the_buffer_drains() -> None:
    leader = FakeLeader([(i * 10, 10) for i in range(10)])
    f, _, _fetched = make_fetcher({"n1": leader})
    try:
        gen = f.needing_positions()[0][2]
        assert f.set_position(TP, 0, gen)
        part = f.parts[TP]
        wait_for(lambda: len(part.completed) == 2, timeout=5, what="two prefetched responses")
        with f._lock:  # nothing in flight once the buffer is full: memory stays bounded
            assert not part.inflight and leader.requests == [0, 10]
        assert drain(f, 100) == list(range(100))
        assert leader.requests[:10] == list(range(0, 100, 10))
        assert f.position(TP) == 100
    finally:
        stop(f, leader)


def test_an_answer_for_a_position_sought_away_from_is_dropped() -> None:
    leader = FakeLeader([(0, 10), (10, 10), (20, 10)])
    gate = leader.hold[0] = threading.Event()
    f, _, fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        wait_for(lambda: leader.requests == [0], timeout=5, what="the first fetch")
        f.seek(TP, 20)  # the fetch at 0 is still parked on the leader
        assert drain(f, 10) == list(range(20, 30))
        gate.set()  # its answer (offsets 0..9) arrives late and must be ignored
        wait_for(lambda: [0] in fetched, timeout=5, what="the late answer")
        assert f.collect(1000, arrow=False) == ([], 0)
        assert f.position(TP) == 30
    finally:
        stop(f, leader)


@pytest.mark.parametrize("policy", ["earliest", "none"])
def test_offset_out_of_range(policy: str) -> None:
    leader = FakeLeader([(50, 10)])
    f, _, _fetched = make_fetcher({"n1": leader}, reset_policy=policy)
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])  # below the log start
        if policy == "none":
            wait_for(lambda: f.parts[TP].error is not None, timeout=5, what="the error")
            for _ in range(2):  # sticky until a seek
                exc = f.take_error()
                assert isinstance(exc, OffsetOutOfRangeError)
                assert exc.partitions == {TP: 0}  # type: ignore[attr-defined]
            f.seek(TP, 55)
            assert f.take_error() is None
            assert drain(f, 5) == list(range(55, 60))
        else:
            wait_for(lambda: f.needing_positions(), timeout=5, what="a reset request")
            ((tp, strategy, gen),) = f.needing_positions()
            assert (tp, strategy) == (TP, "earliest")
            f.set_position(TP, 50, gen)
            assert drain(f, 10) == list(range(50, 60))
    finally:
        stop(f, leader)


def test_a_leader_hint_moves_fetching_to_the_new_leader() -> None:
    old = FakeLeader([(0, 10)])
    new = FakeLeader([(0, 10)])
    old.answer = lambda fp: storage_pb2.FetchPartitionResponse(
        partition=fp.partition,
        error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
        current_leader=common_pb2.LeaderAndEpoch(leader_id=2, leader_epoch=6),
    )
    f, lm, _fetched = make_fetcher({"n1": old, "n2": new})
    lm._nodes[2] = "n2"  # known from an earlier Metadata answer
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, 10) == list(range(10))
        assert old.requests[:1] == [0] and new.requests[:1] == [0]
        assert lm.get(TP) == PartitionLeader(2, "n2", 6)
    finally:
        stop(f, old, new)


def test_an_overdue_answer_from_a_leader_that_did_not_move_is_still_taken() -> None:
    """A Fetch unanswered past its wait + OVERDUE_GRACE_S has its leader looked up again and
    its node demoted; the leader being the same, the request goes on waiting (a slow answer
    is no failure) and its answer is filed once: no second request for the same records."""
    leader = FakeLeader([(0, 10)])
    gate = leader.hold[0] = threading.Event()
    f, lm, _fetched = make_fetcher({"n1": leader})
    client = f._client
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        wait_for(
            lambda: lm.refreshes >= 2 and "n1" in client.demoted,  # type: ignore[attr-defined]
            timeout=10,
            what="the overdue fetch's leader looked up (twice)",
        )
        assert leader.requests == [0] and f.parts[TP].inflight
        gate.set()
        assert drain(f, 10) == list(range(10))
        assert leader.requests.count(0) == 1
    finally:
        stop(f, leader)


def test_an_overdue_fetch_whose_leader_moved_is_given_up_for_the_new_leader() -> None:
    """The lookup finds another leader: the partition leaves the request still parked at
    the old one and is fetched from the new one at the same offset; the old request's late
    answer is ignored (nothing skipped, nothing twice)."""
    old = FakeLeader([(0, 10), (10, 10)])
    gate = old.hold[0] = threading.Event()
    new = FakeLeader([(0, 10), (10, 10)])
    f, lm, fetched = make_fetcher({"n1": old, "n2": new})

    def moved(topics: Any) -> None:
        lm.refreshes += 1
        with lm._lock:
            lm._leaders[TP] = PartitionLeader(2, "n2", 6)

    lm.refresh = moved  # type: ignore[method-assign]
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, 20) == list(range(20))
        assert old.requests == [0] and new.requests[:2] == [0, 10]
        gate.set()  # the old leader answers at last (offsets 0..9): ignored
        wait_for(lambda: [0] in fetched[1:], timeout=10, what="the late answer")
        assert f.collect(1000, arrow=False) == ([], 0)
        assert f.position(TP) == 20
    finally:
        stop(f, old, new)


def _empty_at_once(fp: storage_pb2.FetchPartition) -> storage_pb2.FetchPartitionResponse:
    """What a leader cut off from etcd answers: at once, nothing, at its end of the log."""
    return storage_pb2.FetchPartitionResponse(
        partition=fp.partition,
        high_watermark=fp.fetch_offset,
        last_stable_offset=fp.fetch_offset,
        log_start_offset=0,
    )


def test_a_leader_answering_only_empty_fetches_is_checked_with_another_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found from outside: a leader cut off from etcd went on answering every Fetch at once,
    empty, and named itself leader in its own Metadata answer, so the consumer stayed on it
    for the whole cut while another leader had the new records. A partition quiet for
    QUIET_RECHECK_S has its leader looked up with that node left out; a newer leader
    elsewhere takes its fetches, at the same position. Checks come once per bound while
    it stays quiet (not once per empty answer)."""
    monkeypatch.setattr(fetch_overdue, "QUIET_RECHECK_S", 0.3, raising=False)
    old = FakeLeader([(0, 10)])
    new = FakeLeader([(0, 10), (10, 10)])
    f, lm, _fetched = make_fetcher({"n1": old, "n2": new})
    checks: list[tuple[frozenset[str], float]] = []
    move = threading.Event()

    def refresh(topics: Any, *, avoid: Any = ()) -> None:
        lm.refreshes += 1
        if avoid:
            checks.append((frozenset(avoid), time.monotonic()))
            if move.is_set():
                with lm._lock:
                    lm._leaders[TP] = PartitionLeader(2, "n2", 6)

    lm.refresh = refresh  # type: ignore[method-assign]
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, 10) == list(range(10))
        old.answer = _empty_at_once  # cut off: nothing more from it
        wait_for(lambda: len(checks) >= 3, timeout=10, what="three checks while it is quiet")
        assert all(avoid == {"n1"} for avoid, _ in checks)  # the node in doubt is not asked
        gaps = [b - a for (_, a), (_, b) in itertools.pairwise(checks)]
        assert min(gaps) >= 0.25, gaps  # once per bound, not once per empty answer
        move.set()  # another node now names a newer leader
        assert drain(f, 10) == list(range(10, 20))
        assert new.requests[0] == 10  # where the consumer was: nothing skipped or repeated
    finally:
        stop(f, old, new)


def test_a_leader_error_without_hint_backs_off_and_refreshes_metadata() -> None:
    leader = FakeLeader([(0, 10)])
    calls = {"n": 0}

    def flaky(fp: storage_pb2.FetchPartition) -> storage_pb2.FetchPartitionResponse | None:
        calls["n"] += 1
        if calls["n"] <= 2:
            return storage_pb2.FetchPartitionResponse(
                partition=fp.partition, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER
            )
        return None

    leader.answer = flaky
    f, lm, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, 10) == list(range(10))
        assert lm.refreshes >= 1
        assert f.take_error() is None  # retriable: never surfaced
    finally:
        stop(f, leader)


def test_non_retriable_errors_surface_from_poll() -> None:
    leader = FakeLeader([(0, 10)])
    leader.answer = lambda fp: storage_pb2.FetchPartitionResponse(
        partition=fp.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message="boom"
    )
    f, _, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        wait_for(lambda: f.parts[TP].error is not None, timeout=5, what="the error")
        exc = f.take_error()
        assert exc is not None and "boom" in str(exc) and not isinstance(exc, NotLeaderError)
    finally:
        stop(f, leader)


def test_a_leader_failing_its_stored_data_check_again_and_again_surfaces_from_poll() -> None:
    """Found from outside: one damaged batch on the leader's disk answered every fetch with
    STORAGE_ERROR, which the consumer retried (looking the leader up again) forever while
    poll() returned nothing. From the same leader in the same epoch, the third in a row now
    reaches the application, naming the partition and offset."""
    leader = FakeLeader([(0, 10)])
    leader.answer = lambda fp: storage_pb2.FetchPartitionResponse(
        partition=fp.partition,
        error_code=ErrorCode.STORAGE_ERROR,
        error_message="stored data at offset 0 failed a check: CRC-32C mismatch",
    )
    f, lm, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        wait_for(lambda: f.parts[TP].error is not None, timeout=5, what="the error")
        assert len(leader.requests) >= STORAGE_ERRORS_RAISED_AFTER
        exc = f.take_error()
        assert isinstance(exc, CorruptMessageError)
        assert f"{TP.topic}-{TP.partition} at offset 0" in str(exc) and "CRC-32C" in str(exc)
        assert lm.refreshes >= 1  # still looked up again: a new leader would cure it
    finally:
        stop(f, leader)
    # A disk error, not damaged data: the same, as a StorageError.
    leader = FakeLeader([(0, 10)])
    leader.answer = lambda fp: storage_pb2.FetchPartitionResponse(
        partition=fp.partition, error_code=ErrorCode.STORAGE_ERROR, error_message="disk error: EIO"
    )
    f, lm, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        wait_for(lambda: f.parts[TP].error is not None, timeout=5, what="the error")
        exc = f.take_error()
        assert isinstance(exc, StorageError) and "EIO" in str(exc)
    finally:
        stop(f, leader)


def test_a_storage_error_that_a_retry_cures_is_not_surfaced() -> None:
    leader = FakeLeader([(0, 10)])
    calls = {"n": 0}

    def flaky(fp: storage_pb2.FetchPartition) -> storage_pb2.FetchPartitionResponse | None:
        calls["n"] += 1
        if calls["n"] < STORAGE_ERRORS_RAISED_AFTER:
            return storage_pb2.FetchPartitionResponse(
                partition=fp.partition, error_code=ErrorCode.STORAGE_ERROR
            )
        return None

    leader.answer = flaky
    f, _, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, 10) == list(range(10))
        assert f.take_error() is None
    finally:
        stop(f, leader)


@pytest.mark.parametrize("sizes", [[10] * 30, [10, 10, 3, 25, 10, 1, 40, 10, 7, 7, 30, 2, 10, 10]])
def test_arrow_draining_asks_for_each_range_once(sizes: list[int]) -> None:
    """Arrow draining that waits for the network: the records come out once each, in order,
    and every request starts where the last answer ended, so no batch is fetched twice (a
    speculative fetch-ahead used to guess the next range and, with uneven batches, fetch
    overlapping ones again)."""
    specs, base = [], 0
    for n in sizes:
        specs.append((base, n))
        base += n
    leader = FakeLeader(specs, latency_s=0.002)
    f, _, fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, base, arrow=True) == list(range(base))
        assert f.position(TP) == base
        offsets = [o for claims in fetched for o in claims]
        assert offsets[: len(sizes)] == [b for b, _ in specs]
        assert len(offsets) == len(set(offsets))
    finally:
        stop(f, leader)


# -- the cyclic garbage collector and polls of many records ------------------------------------


def _collections_inside(
    f: Fetcher, monkeypatch: pytest.MonkeyPatch, *, records: int
) -> tuple[list[int], int]:
    """Drain ``records`` as Python records with the collector set to run on nearly every
    allocation; the generations of the collections that started while records were built."""
    building = False
    during: list[int] = []
    take = CompletedFetch.take_records

    def traced(self: CompletedFetch, position: int, limit: int) -> Any:
        nonlocal building
        building = True
        try:
            return take(self, position, limit)
        finally:
            building = False

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and building:
            during.append(info["generation"])

    monkeypatch.setattr(CompletedFetch, "take_records", traced)
    got = 0
    threshold = gc.get_threshold()
    gc.callbacks.append(seen)
    gc.set_threshold(1)
    try:
        deadline = time.monotonic() + 10
        while got < records and time.monotonic() < deadline:
            got += f.collect(records, arrow=False)[1]
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(seen)
    return during, got


def test_a_poll_builds_its_records_without_collector_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll's records are all alive until it returns: collector passes meanwhile promoted
    them, and every few polls of 10,000 that set off a full collection of the process (21 per
    2 M records halved poll()). They make no cycles, so none runs while they are built."""
    leader = FakeLeader([(i * 500, 500) for i in range(8)])
    f, _, _ = make_fetcher({"n1": leader})
    try:
        assert f.set_position(TP, 0, f.needing_positions()[0][2])
        during, got = _collections_inside(f, monkeypatch, records=4000)
        assert got == 4000
        assert during == [], f"collections ran while a poll built its records: {during}"
        assert gc.isenabled()
    finally:
        stop(f, leader)


def test_an_application_that_turned_the_collector_off_finds_it_off() -> None:
    leader = FakeLeader([(0, 100)])
    f, _, _ = make_fetcher({"n1": leader})
    gc.disable()
    try:
        assert f.set_position(TP, 0, f.needing_positions()[0][2])
        assert drain(f, 100) == list(range(100))
        assert not gc.isenabled()
    finally:
        gc.enable()
        stop(f, leader)


# -- answers checked on the fetch thread, lagging partitions fetched side by side --------------


def test_the_fetch_thread_checks_crcs_and_the_poll_raises_after_the_good_records() -> None:
    leader = FakeLeader([(0, 10), (10, 10)])
    bad = bytearray(leader.batches[1][2])
    bad[len(bad) // 2] ^= 0xFF
    leader.batches[1] = (10, 10, bytes(bad))
    f, _, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        part = f.parts[TP]
        wait_for(lambda: len(part.completed) == 2, timeout=5, what="both answers")
        with f._lock:  # checked when it arrived, before anything drained it
            assert [cf._corrupt for cf in part.completed] == [set(), {10}]
        assert drain(f, 10) == list(range(10))
        wait_for(lambda: part.error is not None, timeout=5, what="the CRC error")
        exc = f.take_error()
        assert isinstance(exc, CorruptMessageError) and "CRC" in str(exc)
        assert f.position(TP) == 10  # nothing of the bad batch was returned
    finally:
        stop(f, leader)


def test_the_fetch_thread_decodes_a_big_batch_before_the_poll_drains_it() -> None:
    big = small_body.MAX_RECORDS + 36
    leader = FakeLeader([(0, big), (big, 10)])
    f, _, _fetched = make_fetcher({"n1": leader})
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        part = f.parts[TP]
        wait_for(lambda: len(part.completed) == 2, timeout=5, what="both answers")
        with f._lock:  # decoded when it arrived, before anything drained it
            assert [cf.batches[0]._body is not None for cf in part.completed] == [True, False]
        assert drain(f, big + 10) == list(range(big + 10))
    finally:
        stop(f, leader)


class MultiLeader:
    """A leader of several partitions: each answer brings one 10-record batch per requested
    partition from its fetch offset (the log holds ``end`` records per partition) and reports
    how many requests were on it at once."""

    def __init__(self, end: int, latency_s: float) -> None:
        self.end = end
        self.latency_s = latency_s
        self.requests: list[list[tuple[int, int]]] = []  # (partition, fetch offset) each
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()

    def __call__(self, req: storage_pb2.FetchRequest, **_: Any) -> bytes:
        fps = list(req.topics[0].partitions)
        with self.lock:
            self.requests.append(sorted((fp.partition, fp.fetch_offset) for fp in fps))
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            time.sleep(self.latency_s)  # time is the behaviour: simulated network time
            outs = []
            for fp in fps:
                pr = storage_pb2.FetchPartitionResponse(
                    partition=fp.partition,
                    high_watermark=self.end,
                    last_stable_offset=self.end,
                    log_start_offset=0,
                )
                data = batches((fp.fetch_offset, 10)) if fp.fetch_offset < self.end else b""
                outs.append(FetchPartitionOut(pr, data))
            return encode_fetch_response([FetchTopicOut(req.topics[0].topic, outs)])
        finally:
            with self.lock:
                self.inflight -= 1


def _multi_fetcher(
    leader: MultiLeader, tps: list[TopicPartition], partition_max_bytes: int
) -> Fetcher:
    lm = FixedLeaders({tp: PartitionLeader(1, "n1", 5) for tp in tps})
    f = Fetcher(
        FakeClient({"n1": leader}),  # type: ignore[arg-type]
        lm,
        client_id="test",
        reset_policy="earliest",
        min_bytes=1,
        max_wait_ms=0,
        max_bytes=1 << 30,
        partition_max_bytes=partition_max_bytes,
        check_crcs=True,
        request_timeout_s=5,
        backoff_s=0.01,
        backoff_max_s=0.05,
    )
    f.start()
    f.assign(set(tps))
    with f._lock:  # all positioned before a worker can claim any
        for tp, _strategy, gen in f.needing_positions():
            f.set_position(tp, 0, gen)
    return f


@pytest.mark.parametrize("big", [True, False])
def test_partitions_that_are_behind_are_fetched_side_by_side_when_their_answers_are_big(
    big: bool,
) -> None:
    """A partition whose last answer ended below the high watermark has a full answer
    waiting. With ``max_partition_fetch_bytes`` of SPLIT_REQUEST_BYTES, each such partition
    goes in a request of its own, on its own fetch thread, so the node reads one while
    another travels; with small ones they share requests as before. Every record still comes
    once, in order per partition."""
    tps = [TopicPartition("t", p) for p in range(4)]
    leader = MultiLeader(end=200, latency_s=0.005)
    f = _multi_fetcher(leader, tps, SPLIT_REQUEST_BYTES if big else 1024)
    try:
        got: dict[int, list[int]] = {tp.partition: [] for tp in tps}

        def more() -> bool:
            items, _ = f.collect(1000, arrow=False)
            for r in items:
                got[r.partition].append(r.offset)
            return all(len(v) >= 200 for v in got.values())

        wait_for(more, timeout=20, what="every partition read to its end")
        assert all(v == list(range(200)) for v in got.values())
        with leader.lock:
            requests = list(leader.requests)
        # Nothing known to be behind yet: one request for all four.
        assert requests[0] == [(p, 0) for p in range(4)]
        # Per request, the partitions known to be behind (answered before, not at the end).
        behind = [sum(1 for _p, o in r if 0 < o < 200) for r in requests]
        if big:
            assert max(behind) == 1
            assert leader.max_inflight >= 2
        else:
            assert max(behind) >= 2  # small answers still share a request
    finally:
        f.close()
        f.join(5)


def test_lagging_partitions_are_fetched_with_unary_calls_and_caught_up_ones_on_streams() -> None:
    """Few big fetches of a lagging consumer stay unary calls; the long polls of a caught-up
    one go on a stream (strom.client.streams)."""
    leader = FakeLeader([(0, 10), (10, 10), (20, 10)])
    f, _, _ = make_fetcher({"n1": leader})
    client: FakeClient = f._client  # type: ignore[assignment]
    try:
        gen = f.needing_positions()[0][2]
        assert f.set_position(TP, 0, gen)
        assert drain(f, 30) == list(range(30))
        wait_for(
            lambda: ("stream", 30) in client.sent,
            timeout=5,
            what="a long poll at the end of the log",
        )
        offsets = {kind: [o for k, o in client.sent if k == kind] for kind in ("unary", "stream")}
        assert offsets["unary"] == [0, 10, 20]  # the first knew no high watermark yet
        assert set(offsets["stream"]) == {30}
    finally:
        stop(f, leader)


# -- the application's followed fetch against a node that does not follow -------------------


class AppendingLeader:
    """A partition leader with an appendable log, answering Fetch requests as a node of the
    version before FetchRequest.follow: one answer per request, no follow header."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.log: list[tuple[int, bytes]] = []  # (base offset, one-record batch)
        self.follow_requests = 0
        self.requests = 0

    @property
    def end(self) -> int:
        return len(self.log)

    def append(self) -> None:
        with self.cond:
            self.log.append((self.end, batches((self.end, 1))))
            self.cond.notify_all()

    def answer(self, req: storage_pb2.FetchRequest) -> bytes:
        fp = req.topics[0].partitions[0]
        with self.cond:
            self.requests += 1
            self.follow_requests += req.follow
            self.cond.wait_for(lambda: self.end > fp.fetch_offset, req.max_wait_ms / 1000.0)
            data = b"".join(raw for base, raw in self.log if base >= fp.fetch_offset)
            pr = storage_pb2.FetchPartitionResponse(
                partition=0, high_watermark=self.end, last_stable_offset=self.end
            )
        return encode_fetch_response(
            [FetchTopicOut(req.topics[0].topic, [FetchPartitionOut(pr, data)])]
        )


def test_a_node_that_does_not_follow_gets_a_request_per_answer_and_nothing_is_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(downgrades, "RECHECK_S", 1.0)
    """A node of an older version ignores ``follow`` and answers once: the consumer sees no
    follow header after the first answer, stops following that node and fetches as before
    (a request per answer), in order, without waiting out a long poll."""
    import grpc

    leader = AppendingLeader()

    def fetch_stream(requests: Any, context: grpc.ServicerContext) -> Any:
        for req in requests:
            yield leader.answer(req)

    def fetch(req: storage_pb2.FetchRequest, context: grpc.ServicerContext) -> bytes:
        return leader.answer(req)

    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "strom.v1.StorageService",
                {
                    "FetchStream": grpc.stream_stream_rpc_method_handler(
                        fetch_stream, request_deserializer=storage_pb2.FetchRequest.FromString
                    ),
                    "Fetch": grpc.unary_unary_rpc_method_handler(
                        fetch, request_deserializer=storage_pb2.FetchRequest.FromString
                    ),
                },
            ),
        )
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    channel = grpc.insecure_channel(address)

    class Client:
        def channel(self, _address: str) -> grpc.Channel:
            return channel

    f = Fetcher(
        Client(),  # type: ignore[arg-type]
        FixedLeaders({TP: PartitionLeader(1, address, 5)}),
        client_id="test",
        reset_policy="earliest",
        min_bytes=1,
        max_wait_ms=5_000,
        max_bytes=1 << 20,
        partition_max_bytes=1 << 20,
        check_crcs=True,
        request_timeout_s=5,
        backoff_s=0.01,
        backoff_max_s=0.05,
    )
    f.start()
    f.assign({TP})
    got: list[int] = []
    try:
        f.set_position(TP, 0, f.needing_positions()[0][2])
        for i in range(12):
            threading.Timer(0.05, leader.append).start()
            t0 = time.monotonic()
            while len(got) <= i:  # what poll() does
                items, _ = f.collect(1000, arrow=False)
                got.extend(r.offset for r in items)
                if not items and not f.fetch_inline(5.0):
                    f.wait(5.0)
            assert time.monotonic() - t0 < 4  # never a long poll waited out
        assert got == list(range(12))
        assert address in f._no_follow
        assert leader.follow_requests == 1  # tried once, then not again
        assert leader.requests >= 12
        # Once the re-check time has passed, the node is tried again (it may have been
        # upgraded at the same address).
        deadline = time.monotonic() + 30
        while leader.follow_requests < 2:
            assert time.monotonic() < deadline, "the follow was never tried again"
            threading.Timer(0.05, leader.append).start()
            n = len(got)
            while len(got) == n:
                items, _ = f.collect(1000, arrow=False)
                got.extend(r.offset for r in items)
                if not items and not f.fetch_inline(5.0):
                    f.wait(5.0)
        assert got == list(range(len(got)))
    finally:
        f.close()
        f.join(5)
        channel.close()
        server.stop(0)
