"""The producer's pure parts: lazy futures, batches, wire encoding, bulk splitting."""

from __future__ import annotations

import concurrent.futures
import threading

import grpc
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from strom.api import storage_pb2
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.bulk import as_table as _as_table
from strom.client.bulk import split_by_key as _split_by_key
from strom.client.bulk import table_chunks as _chunks
from strom.client.futures import BatchResult, FutureRecordMetadata
from strom.client.partitioner import partition_for_key
from strom.client.producer import Producer, request_too_large
from strom.client.streams import StreamError
from strom.client.types import RecordMetadata
from strom.client.wire import encode_produce_request
from strom.errors import MessageSizeTooLargeError, MessageTooLargeError, NotLeaderError
from strom.record import decode_batches, decode_records
from strom.record.schema import HEADERS_TYPE


def test_futures_resolve_from_their_batch() -> None:
    result = BatchResult("t", 3, [100, 200])
    f0, f1 = FutureRecordMetadata(result, 0), FutureRecordMetadata(result, 1)
    seen: list[RecordMetadata] = []
    f1.add_done_callback(lambda f: seen.append(f.result()))
    assert not f0.done() and f0.running() and not f0.cancel()
    with pytest.raises(concurrent.futures.TimeoutError):
        f0.result(timeout=0.01)
    result.complete(40)
    assert f0.result() == RecordMetadata("t", 3, 40, 100)
    assert f0.get(timeout=1) == f0.result()  # kafka-python's name
    assert seen == [RecordMetadata("t", 3, 41, 200)]
    assert f1.exception() is None


def test_log_append_time_and_failures() -> None:
    ok = BatchResult("t", 0, [1, 2])
    ok.complete(7, log_append_time=999)
    assert FutureRecordMetadata(ok, 1).result().timestamp == 999
    bad = BatchResult("t", 0, [1])
    bad.fail(NotLeaderError("moved"))
    f = FutureRecordMetadata(bad, 0)
    with pytest.raises(NotLeaderError):
        f.result()
    with pytest.raises(NotLeaderError):
        f.get(timeout=1)
    assert isinstance(f.exception(), NotLeaderError)
    with pytest.raises(RuntimeError):
        f.set_result(None)


def test_kafka_python_callbacks_and_errbacks_chain() -> None:
    """Found from outside: ``send(...).add_callback(ok).add_errback(err)`` (kafka-python's
    future API) failed with a bare AttributeError. Extra arguments come first, as in
    kafka-python (``functools.partial(f, *args, **kwargs)(value)``)."""
    calls: list[tuple[object, ...]] = []
    ok = BatchResult("t", 2, [100])
    f = FutureRecordMetadata(ok, 0)
    assert (
        f.add_callback(lambda *a, **kw: calls.append(("ok", *a, kw)), "extra", tag=1).add_errback(
            lambda *a: calls.append(("err", *a))
        )
        is f
    )
    assert calls == []
    ok.complete(5)
    md = RecordMetadata("t", 2, 5, 100)
    assert calls == [("ok", "extra", md, {"tag": 1})]
    f.add_callback(lambda m: calls.append(("late", m)))  # after completion: at once
    assert calls[-1] == ("late", md)

    calls.clear()
    bad = BatchResult("t", 0, [1])
    g = FutureRecordMetadata(bad, 0)
    g.add_callback(lambda m: calls.append(("ok", m))).add_errback(
        lambda tag, e: calls.append((tag, e)), "failed"
    )
    err = NotLeaderError("moved")
    bad.fail(err)
    g.add_errback(lambda e: calls.append(("late", e)))
    assert calls == [("failed", err), ("late", err)]


def test_a_partitioners_bad_answer_fails_send_batch_before_anything_is_split() -> None:
    """Found from outside: send_batch with a partitioner answering None failed with a bare
    numpy TypeError, and one answering 7 of 4 queued a batch for a partition that does not
    exist. Now the error names the partitioner, the value and the range."""
    import numpy as np

    keyed = pa.table({"value": [b"a", b"b"], "key": [b"good", b"bad"]})

    def none_for_bad(key: bytes | None, n: int) -> int | None:
        return None if key == b"bad" else 0

    with pytest.raises(TypeError, match=r"partitioner .*none_for_bad returned None .*\[0, 4\)"):
        _split_by_key(keyed, "orders", 4, none_for_bad)  # type: ignore[arg-type]
    for bad in (7, -1, 4):
        with pytest.raises(ValueError, match=rf"returned partition {bad} for topic 'orders'"):
            _split_by_key(keyed, "orders", 4, lambda k, n, b=bad: b if k == b"bad" else 0)
    with pytest.raises(TypeError, match="returned True"):
        _split_by_key(keyed, "orders", 4, lambda k, n: True)
    groups = _split_by_key(keyed, "orders", 4, lambda k, n: np.int64(3))  # numpy ints do
    assert [p for p, _ in groups] == [3]


def test_futures_work_with_wait_and_as_completed() -> None:
    result = BatchResult("t", 0, [1, 2, 3])
    futures = [FutureRecordMetadata(result, i) for i in range(3)]
    threading.Timer(0.05, result.complete, args=(10,)).start()
    done, pending = concurrent.futures.wait(futures, timeout=5)
    assert len(done) == 3 and not pending
    assert sorted(f.result().offset for f in concurrent.futures.as_completed(futures)) == [
        10,
        11,
        12,
    ]


def test_batches_encode_once_per_sequence() -> None:
    b = ProducerBatch("t", 0)
    for i in range(3):
        b.values.append(b"v%d" % i)
        b.keys.append(None if i else b"k")
        b.timestamps.append(1000 + i)
        b.count += 1
    b.has_keys = True
    b.add_headers(2, [("h", b"x")])
    raw = b.encode("zstd", 5, 0, 10)
    assert b.encode("zstd", 5, 0, 10) is raw  # cached for retries
    recs = decode_records(raw)
    assert [(r.key, r.value, r.timestamp) for r in recs] == [
        (b"k", b"v0", 1000),
        (None, b"v1", 1001),
        (None, b"v2", 1002),
    ]
    assert [list(r.headers or ()) for r in recs] == [[], [], [("h", b"x")]]
    b.base_sequence = 20  # renumbered after an earlier batch failed
    again = b.encode("zstd", 5, 0, 20)
    assert again is not raw  # encoded again, with the new sequence
    assert decode_batches(again)[0].header.base_sequence == 20


def test_partition_queue_closes_the_open_batch_for_bulk() -> None:
    q = PartitionQueue("t", 0)
    first = q.new_batch()
    bulk = ProducerBatch("t", 0, pa.table({"value": pa.array([b"a", b"b"], pa.binary())}))
    q.add_closed(bulk)
    assert first.closed and q.open is None and list(q.batches) == [first, bulk]
    assert bulk.count == 2 and bulk.closed


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=10),
            st.lists(
                st.tuples(
                    st.integers(0, 1000),
                    st.integers(-1, 50),
                    st.lists(st.binary(max_size=50), min_size=1, max_size=3),
                ),
                min_size=1,
                max_size=3,
            ),
        ),
        min_size=1,
        max_size=3,
        unique_by=lambda t: t[0],
    ),
    st.sampled_from([-1, 0, 1]),
    st.sampled_from(["", "Zk3x-id"]),
)
def test_hand_built_produce_requests_parse_as_protobuf(
    topics: list[tuple[str, list[tuple[int, int, list[bytes]]]]], acks: int, topic_id: str
) -> None:
    """Keyed by name, or by (name, topic id) for the leader to check the id."""
    keyed = {(name, topic_id) if topic_id else name: parts for name, parts in topics}
    raw = encode_produce_request(acks, 1234, keyed)
    req = storage_pb2.ProduceRequest.FromString(raw)
    assert (req.acks, req.timeout_ms) == (acks, 1234)
    assert [(t.topic, t.topic_id) for t in req.topics] == [(name, topic_id) for name, _ in topics]
    for t, (_, parts) in zip(req.topics, topics, strict=True):
        assert [(p.partition, p.current_leader_epoch, p.records) for p in t.partitions] == [
            (p, e, b"".join(bs)) for p, e, bs in parts
        ]


def test_bulk_input_is_split_into_batches_and_by_key() -> None:
    table = _as_table([b"x" * 90] * 1000, None, None, None)
    chunks = list(_chunks(table, batch_size=10_000, max_size=1 << 20))
    assert sum(c.num_rows for c in chunks) == 1000 and len(chunks) > 5
    keyed = _as_table(
        [b"v%d" % i for i in range(200)], [b"k%d" % (i % 7) for i in range(200)], None, None
    )
    groups = _split_by_key(keyed, "t", 4, None)
    assert sum(t.num_rows for _, t in groups) == 200
    for part, t in groups:
        keys = t.column("key").to_pylist()
        assert all(partition_for_key(k, 4) == part for k in keys)
        values = [int(v[1:]) for v in t.column("value").to_pylist()]
        assert values == sorted(values)  # input order kept within a partition
    with pytest.raises(ValueError, match="3 keys for 2 values"):
        _as_table([b"a", b"b"], [b"1", b"2", b"3"], None, None)
    with pytest.raises(TypeError, match="values must be bytes"):
        _as_table([1, 2], None, None, None)


def test_a_request_over_grpcs_size_limit_is_too_large_not_load_shedding() -> None:
    """gRPC refusing a message over its limit (ours to send, or the node's to receive) is
    MessageTooLargeError for the request that was too large, not retried; a node shedding
    load, or a smaller request that shared the stream, is not (and so is retried)."""
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    sent = StreamError(exhausted, "Sent message larger than max (314592720 vs. 268435456)")
    err = request_too_large(sent, 314_000_000)
    assert isinstance(err, MessageTooLargeError)
    assert "314592720" in str(err) and "268435456" in str(err) and "not retried" in str(err)
    received = StreamError(exhausted, "Received message larger than max (5000000 vs. 4194304)")
    assert isinstance(request_too_large(received, 4_999_000), MessageTooLargeError)
    assert request_too_large(sent, 1_000) is None  # an innocent request on the same stream
    assert request_too_large(StreamError(exhausted, "quota exceeded"), 314_000_000) is None
    unavailable = StreamError(grpc.StatusCode.UNAVAILABLE, sent.details())
    assert request_too_large(unavailable, 314_000_000) is None


def test_bulk_input_is_split_by_the_rows_own_sizes() -> None:
    """Skewed rows: two adjacent big rows among small ones each get a batch of their own,
    and no batch of several rows passes the limit (found from outside: slices cut by the
    average row size put both 9 MiB rows in one 18 MiB batch the topic refused)."""
    big = b"B" * 9000
    values = [b"s%d" % i for i in range(100)] + [big, big] + [b"t%d" % i for i in range(100)]
    table = _as_table(values, None, None, None)
    chunks = list(_chunks(table, batch_size=2000, max_size=12_000))
    assert sum(c.num_rows for c in chunks) == 202
    assert [v for c in chunks for v in c.column("value").to_pylist()] == values  # in order
    for c in chunks:
        size = sum(len(v) + 16 for v in c.column("value").to_pylist())
        assert c.num_rows == 1 or size <= 2000, (c.num_rows, size)
    assert sum(1 for c in chunks if c.column("value")[0].as_py() == big) == 2


def test_a_bulk_row_over_max_request_size_is_refused_as_send_refuses_it() -> None:
    """A single row over max_request_size among small ones is refused with send()'s error
    (found from outside: the small average let a 5 MiB row through a 4 MiB limit); keys and
    headers count as in send()."""
    values = [b"s"] * 100 + [b"x" * 5000] + [b"t"] * 100
    with pytest.raises(
        MessageTooLargeError,
        match=r"the record is 5016 bytes, more than "
        r"max_request_size=4000 \(row 100",
    ):
        list(_chunks(_as_table(values, None, None, None), batch_size=100_000, max_size=4000))
    headers = pa.array([None, [{"key": "h\u00e9", "value": b"v" * 1000}]], type=HEADERS_TYPE)
    table = pa.table({"value": pa.array([b"a", b"b" * 10], pa.binary()), "headers": headers})
    # row 1: 10 + 16 + len("hé".encode()) == 3 + 1000 == 1029 bytes
    with pytest.raises(MessageTooLargeError, match="the record is 1029 bytes"):
        list(_chunks(table, batch_size=100_000, max_size=1028))
    assert [c.num_rows for c in _chunks(table, batch_size=100_000, max_size=1029)] == [1, 1]
    keyed = _as_table([b"v" * 10], [b"k" * 20], None, None)
    with pytest.raises(MessageTooLargeError, match="the record is 46 bytes"):
        list(_chunks(keyed, batch_size=100, max_size=45))


def test_a_split_batch_answers_each_record_with_its_parts_outcome() -> None:
    """After a split (MESSAGE_TOO_LARGE), each record's future, callback and errback follow
    the part holding it: the parts land at their own offsets, and a part that fails fails
    only its own records; the batch is done once every part is."""
    parent = BatchResult("t", 0, [1.0, 2.0, 3.0, 4.0])
    futures = [FutureRecordMetadata(parent, i) for i in range(4)]
    seen: list[object] = []
    futures[0].add_callback(lambda md: seen.append(md.offset))
    futures[3].add_errback(lambda exc: seen.append(type(exc).__name__))
    first, second = BatchResult("t", 0, [1.0, 2.0]), BatchResult("t", 0, [3.0, 4.0])
    parent.split([(0, first), (2, second)])
    first.complete(100)
    assert not futures[0].done()  # (done once every part is)
    second.fail(MessageTooLargeError("t-0: too large"))
    assert [f.result(timeout=0).offset for f in futures[:2]] == [100, 101]
    assert futures[0].result(timeout=0).timestamp == 1
    for f in futures[2:]:
        with pytest.raises(MessageTooLargeError):
            f.result(timeout=0)
    assert futures[1].exception(timeout=0) is None
    assert seen == [100, "MessageTooLargeError"]


def test_a_record_larger_than_buffer_memory_is_refused_at_once() -> None:
    """As Kafka's RecordTooLargeException: the producer's whole buffer could never hold it
    (found from outside: it was taken). send_batch() refuses such a row the same way; and
    kafka-python's MessageSizeTooLargeError name catches it."""
    with Producer("127.0.0.1:1", buffer_memory=1000, max_block_ms=0) as producer:
        producer._counts["t"] = 1  # (no cluster: the topic's partition count, known)
        with pytest.raises(MessageSizeTooLargeError, match=r"more than buffer_memory=1000"):
            producer.send("t", b"x" * 5000)
    values = [b"s"] * 10 + [b"x" * 5000]
    with pytest.raises(MessageTooLargeError, match=r"5016 bytes, more than buffer_memory=1000"):
        list(_chunks(_as_table(values, None, None, None), 100_000, 1 << 20, 1000))
    assert MessageSizeTooLargeError is MessageTooLargeError
