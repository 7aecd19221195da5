"""RecordService's column engine: protobuf columns to Arrow and back, vectorized murmur2,
partition grouping, per-record offsets and message splitting (no gRPC, no cluster)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.api import records_pb2 as rp
from strom.client.fetch_state import Constants as _Constants
from strom.client.fetcher import CONSUMER_SCHEMA, CompletedFetch
from strom.client.partitioner import murmur2, murmur2_array, partition_for_key, partitions_for_keys
from strom.client.types import TopicPartition
from strom.record import TimestampType, decode_batches, encode_arrow, encode_batch
from strom.storage.record_columns import ColumnsError, columns_to_table, fill_columns
from strom.storage.records_api import group_by_partition
from strom.storage.subscriptions import (
    Item,
    Outbox,
    SubscriptionError,
    encode_partition_records,
    split_records,
)

TP = TopicPartition("t", 0)

# -- murmur2 over an Arrow array ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60), st.integers(1, 64))
def test_vectorized_murmur2_matches_the_scalar_partitioner(keys: list, n: int) -> None:
    arr = pa.array(keys, type=pa.binary())
    parts = partitions_for_keys(arr, n)
    want = [-1 if k is None else partition_for_key(k, n) for k in keys]
    assert parts.tolist() == want
    hashes = murmur2_array(arr)
    assert [int(h) for h, k in zip(hashes, keys, strict=True) if k is not None] == [
        murmur2(k) for k in keys if k is not None
    ]


def test_vectorized_murmur2_on_a_sliced_array_and_kafka_vectors() -> None:
    arr = pa.array([b"zzz", b"", b"a", b"ab", b"abc", b"123456789", b"\x00 "]).slice(1)
    assert partitions_for_keys(arr, 1000).tolist() == [681, 524, 434, 107, 566, 742]
    with pytest.raises(ValueError, match="num_partitions"):
        partitions_for_keys(arr, 0)


# -- columns -> Arrow ----------------------------------------------------------------------------


def _cols(**kw: object) -> rp.RecordColumns:
    return rp.RecordColumns(**kw)  # type: ignore[arg-type]


def test_columns_become_the_arrow_columns_of_a_batch() -> None:
    cols = _cols(
        keys=[b"k0", b"", b"k2"],
        values=[b"v0", b"v1", b""],
        null_keys=[1],
        null_values=[2],
        timestamps=[5, 6, 7],
        header_counts=[2, 0, 1],
        header_keys=["a", "b", "c"],
        header_values=[b"1", b"2", b"3"],
    )
    table = columns_to_table(cols)
    assert table.column("key").to_pylist() == [b"k0", None, b"k2"]
    assert table.column("value").to_pylist() == [b"v0", b"v1", None]
    assert table.column("timestamp").to_pylist() == [5, 6, 7]
    assert table.column("headers").to_pylist() == [
        [{"key": "a", "value": b"1"}, {"key": "b", "value": b"2"}],
        [],
        [{"key": "c", "value": b"3"}],
    ]
    # ... which a batch encodes, and which come back as the same columns.
    batch = decode_batches(encode_arrow(table))[0]
    out = rp.PartitionRecords()
    encode_partition_records(out, TopicPartition("t", 2), batch.to_arrow(), 9)
    assert list(out.offsets) == [0, 1, 2]
    assert (out.topic, out.partition, out.high_watermark) == ("t", 2, 9)
    back = out.records
    assert list(back.keys) == [b"k0", b"", b"k2"] and list(back.null_keys) == [1]
    assert list(back.values) == [b"v0", b"v1", b""] and list(back.null_values) == [2]
    assert list(back.timestamps) == [5, 6, 7]
    assert list(back.header_counts) == [2, 0, 1]
    assert list(back.header_keys) == ["a", "b", "c"]
    assert list(back.header_values) == [b"1", b"2", b"3"]


def test_optional_columns_stay_absent() -> None:
    table = columns_to_table(_cols(values=[b"a", b"b"]))
    assert table.column_names == ["value"]
    batch = decode_batches(encode_arrow(table, now_ms=42))[0]
    out = rp.RecordColumns()
    fill_columns(batch.to_arrow(), out)
    assert not out.keys and not out.null_keys and not out.header_counts
    assert list(out.values) == [b"a", b"b"] and list(out.timestamps) == [42, 42]


def test_subscribe_columns_carry_each_record_s_timestamp_type() -> None:
    """The consumer's table (what Subscribe sends) has a timestamp_type column: one entry per
    record in records.timestamp_types, from the batch's attribute (found from outside:
    the stream could not tell a LogAppendTime record from a CreateTime one)."""
    create = CompletedFetch(TP, decode_batches(encode_batch([b"a", b"b"], timestamps=[5, 6])))
    stamped = encode_batch([b"c"], base_offset=2, log_append_time=True, now_ms=99)
    appended = CompletedFetch(TP, decode_batches(stamped))
    pieces = [
        *create.take_arrow(0, 10, _Constants())[0],
        *appended.take_arrow(2, 10, _Constants())[0],
    ]
    table = pa.Table.from_batches(pieces, schema=CONSUMER_SCHEMA)
    out = rp.PartitionRecords()
    encode_partition_records(out, TP, table, 3)
    assert list(out.records.timestamps) == [5, 6, 99]
    assert list(out.records.timestamp_types) == [
        rp.TIMESTAMP_TYPE_CREATE_TIME,
        rp.TIMESTAMP_TYPE_CREATE_TIME,
        rp.TIMESTAMP_TYPE_LOG_APPEND_TIME,
    ]
    assert [int(t) for t in TimestampType] == [0, 1]  # Kafka's ids, as the proto enum's


@pytest.mark.parametrize(
    ("cols", "needle"),
    [
        (_cols(), "records.values is empty"),
        (_cols(values=[b"a"], keys=[b"x", b"y"]), "records.keys has 2 entries for 1 values"),
        (_cols(values=[b"a"], null_values=[3]), "records.null_values holds index 3"),
        (_cols(values=[b"a"], null_keys=[-1]), "records.null_keys holds index -1"),
        (_cols(values=[b"a"], timestamps=[1, 2]), "records.timestamps has 2 entries"),
        (_cols(values=[b"a"], timestamps=[-5]), "records.timestamps holds -5"),
        (_cols(values=[b"a"], header_counts=[1]), "add up to 1 headers but there are 0"),
        (_cols(values=[b"a"], header_counts=[-1]), "records.header_counts holds -1"),
        (_cols(values=[b"a", b"b"], header_counts=[0]), "records.header_counts has 1 entries"),
        (_cols(values=[b"a"], header_keys=["k"], header_values=[b"v"]), "header_counts is empty"),
        (_cols(values=[b"a"], timestamp_types=[1]), "timestamp_types is set: .*Subscribe only"),
    ],
)
def test_bad_columns_are_named(cols: rp.RecordColumns, needle: str) -> None:
    with pytest.raises(ColumnsError, match=needle.replace("(", r"\(")):
        columns_to_table(cols)


# -- grouping and offsets --------------------------------------------------------------------------


def test_grouping_by_partition_keeps_call_order_within_each() -> None:
    parts = np.array([2, 0, 2, 1, 0, 2], dtype=np.int32)
    groups = group_by_partition(parts)
    assert [(p, idx.tolist()) for p, idx in groups] == [(0, [1, 4]), (1, [3]), (2, [0, 2, 5])]
    one = group_by_partition(np.array([3, 3, 3], dtype=np.int32))
    assert [(p, idx.tolist()) for p, idx in one] == [(3, [0, 1, 2])]


def test_split_records_bounds_count_and_bytes() -> None:
    n = 10
    table = pa.table(
        {
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array([b"x" * 100] * 9 + [b"y" * 1000], pa.binary()),
        }
    )
    assert [t.num_rows for t in split_records(table, 4, 1 << 20)] == [4, 4, 2]
    chunks = split_records(table, 100, 250)
    assert [t.num_rows for t in chunks] == [2, 2, 2, 2, 1, 1]
    assert sum(t.num_rows for t in chunks) == n
    assert split_records(table.slice(0, 0), 4, 100) == []


# -- the outbox between a pump thread and the event loop -----------------------------------------


def test_outbox_is_bounded_purges_revoked_partitions_and_ends_with_its_error() -> None:
    async def main() -> None:
        box = Outbox(asyncio.get_running_loop(), capacity=2)
        a, b = TopicPartition("t", 0), TopicPartition("t", 1)
        put_third = threading.Event()
        waiting = threading.Event()  # set by put's idle callback: it is blocked on a full box

        def pump() -> None:
            box.put(Item(b"1", a))
            box.put(Item(b"2", b))
            box.put(Item(b"3", a), idle=waiting.set)  # waits: full
            put_third.set()

        t = threading.Thread(target=pump)
        t.start()
        assert await asyncio.to_thread(waiting.wait, 5)
        assert not put_third.is_set()
        assert box.purge([a]) == 1  # "1" dropped, which makes room for "3"
        await asyncio.to_thread(put_third.wait, 5)
        got = [(await box.get()).data, (await box.get()).data]  # type: ignore[union-attr]
        assert got == [b"2", b"3"]
        box.close(Item(error=SubscriptionError("UNAVAILABLE", "bye", 6)))
        last = await box.get()
        assert last is not None and last.error is not None and last.error.message == "bye"
        assert await box.get() is None
        assert box.put(Item(b"late", a)) is False
        t.join()

    asyncio.run(main())
