"""Unit tests for the record batch engine (DESIGN §4): encode, decode, header ops, errors."""

from __future__ import annotations

import contextlib
import random
import struct
import time

import crc32c
import numpy as np
import pyarrow as pa
import pytest

from strom.record import (
    CODEC_IDS,
    CODEC_NAMES,
    DEFAULT_MAX_BATCH_BYTES,
    HEADER_SIZE,
    MAGIC,
    RECORDS_SCHEMA,
    TIMESTAMP_CREATE,
    TIMESTAMP_LOG_APPEND,
    InvalidBatchError,
    Record,
    RecordBatch,
    batches_to_arrow,
    codec_id,
    decode_batches,
    decode_records,
    decode_to_arrow,
    encode_arrow,
    encode_batch,
    encode_records,
    patch_base_offset,
    patch_leader_epoch,
    read_header,
    scan_batches,
    set_log_append_time,
)
from strom.record import codecs as codecs_mod
from strom.record.header import CRC_START
from strom.record.schema import BODY_SCHEMA_V1, HEADERS_TYPE, TIMESTAMP_TYPE
from tests.unit.reframe import rebuild

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
T0 = 1_700_000_000_000  # a plausible ms timestamp

SAMPLE = [
    Record(key=b"k0", value=b"v0", headers=(("h1", b"x"), ("h2", None)), timestamp=T0),
    Record(key=None, value=b"v1", headers=(), timestamp=T0 + 5),
    Record(key=b"k2", value=None, headers=(("tomb", b""),), timestamp=T0 + 2),
    Record(key=b"", value=b"", headers=(), timestamp=T0 + 10),
    Record(key=b"\x00\xff" * 50, value=b"payload " * 100, headers=(("u", None),), timestamp=T0),
]


# --------------------------------------------------------------------------------- helpers


def body_batch(*arrays: pa.Array) -> bytes:
    """Serialize an Arrow body in the v1 schema (for hand-crafted bodies)."""
    return pa.RecordBatch.from_arrays(list(arrays), schema=BODY_SCHEMA_V1).serialize().to_pybytes()


def v1_body(n: int, od: list | None = None, td: list | None = None) -> bytes:
    return body_batch(
        pa.array(od if od is not None else list(range(n)), pa.int32()),
        pa.array(td if td is not None else [0] * n, pa.int64()),
        pa.nulls(n, pa.binary()),
        pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        pa.nulls(n, HEADERS_TYPE),
    )


def fully_decode(buf: bytes) -> None:
    """Decode everything a consumer could ask for; corruption must raise InvalidBatchError."""
    for b in decode_batches(buf):
        b.body()
        b.records()
        b.to_arrow()


def fully_decode_unchecked(buf: bytes | bytearray) -> None:
    for b in decode_batches(buf, verify_crc=False):
        b.records()
        b.to_arrow()


def comparable(records: list[Record]) -> list[tuple]:
    return [(r.key, r.value, tuple(r.headers), r.timestamp) for r in records]


def ts_ints(table: pa.Table) -> list[int]:
    return table.column("timestamp").cast(pa.int64()).to_pylist()


# ------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(codec: str) -> None:
    batch = encode_records(SAMPLE, compression=codec, base_offset=100)
    (b,) = decode_batches(batch)
    assert b.compression == codec
    assert b.codec == CODEC_IDS[codec]
    recs = b.records()
    assert comparable(recs) == comparable(SAMPLE)
    assert [r.offset for r in recs] == list(range(100, 100 + len(SAMPLE)))
    # a tombstone keeps its key, a null key stays null, None header values survive
    assert recs[2].value is None and recs[2].key == b"k2"
    assert recs[1].key is None
    assert recs[0].headers == (("h1", b"x"), ("h2", None))

    table = b.to_arrow()
    assert table.schema.equals(RECORDS_SCHEMA)
    assert table.column("offset").to_pylist() == list(range(100, 100 + len(SAMPLE)))
    assert ts_ints(table) == [r.timestamp for r in SAMPLE]
    assert table.column("key").to_pylist() == [r.key for r in SAMPLE]
    assert table.column("value").to_pylist() == [r.value for r in SAMPLE]
    hdrs = table.column("headers").to_pylist()
    assert hdrs[0] == [{"key": "h1", "value": b"x"}, {"key": "h2", "value": None}]
    assert hdrs[1] is None  # empty headers are encoded as null


@pytest.mark.parametrize("codec", CODECS)
def test_encode_batch_columns_every_codec(codec: str) -> None:
    values = [b"a" * 10, None, b"c"]
    keys = [None, b"k1", b"k2"]
    headers = [[("x", b"1")], None, [("y", None), ("z", "str-value")]]
    stamps = [T0 + 3, T0, T0 + 7]  # not sorted: base is the first, max the largest
    batch = encode_batch(values, keys=keys, headers=headers, timestamps=stamps, compression=codec)
    h = read_header(batch)
    assert h.base_timestamp == T0 + 3
    assert h.max_timestamp == T0 + 7
    recs = decode_records(batch)
    assert [r.value for r in recs] == values
    assert [r.key for r in recs] == keys
    assert [r.headers for r in recs] == [(("x", b"1"),), (), (("y", None), ("z", b"str-value"))]
    assert [r.timestamp for r in recs] == stamps


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_shrinks_compressible_data(codec: str) -> None:
    values = [b"the same bytes over and over " * 20] * 200
    plain = encode_batch(values, compression="none", now_ms=T0)
    packed = encode_batch(values, compression=codec, now_ms=T0)
    assert len(packed) < len(plain) // 4
    assert decode_records(packed) == decode_records(plain)


@pytest.mark.parametrize("compression", [None, 0, 1, 2, 3, 4, "ZSTD", "Gzip"])
def test_compression_by_id_or_name(compression: object) -> None:
    batch = encode_batch([b"x"], compression=compression, now_ms=T0)
    expected = 0 if compression is None else codec_id(compression)  # type: ignore[arg-type]
    assert read_header(batch).codec == expected
    assert decode_records(batch)[0].value == b"x"


def test_codec_id_and_names() -> None:
    assert CODEC_IDS == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    assert {v: k for k, v in CODEC_IDS.items()} == CODEC_NAMES
    assert codec_id(None) == 0
    assert codec_id("LZ4") == 3
    assert codec_id(4) == 4


def test_default_timestamp_is_now() -> None:
    before = time.time_ns() // 1_000_000
    batch = encode_batch([b"a", b"b"])
    after = time.time_ns() // 1_000_000
    recs = decode_records(batch)
    assert recs[0].timestamp == recs[1].timestamp
    assert before <= recs[0].timestamp <= after
    assert [r.timestamp for r in decode_records(encode_batch([b"a"], now_ms=T0))] == [T0]


def test_explicit_timestamps_numpy_and_arrow() -> None:
    stamps = np.array([T0, T0 + 1, T0 + 2], dtype=np.int64)
    for ts in (stamps, pa.array(stamps), pa.chunked_array([stamps[:1], stamps[1:]])):
        recs = decode_records(encode_batch([b"a", b"b", b"c"], timestamps=ts))
        assert [r.timestamp for r in recs] == stamps.tolist()


def test_timestamp_zero_is_valid() -> None:
    assert decode_records(encode_batch([b"a"], timestamps=[0]))[0].timestamp == 0


# ---------------------------------------------------------------------------- encode_records


def test_encode_records_from_record_objects() -> None:
    recs = decode_records(encode_records(SAMPLE, compression="zstd"))
    assert comparable(recs) == comparable(SAMPLE)


def test_encode_records_from_tuples() -> None:
    batch = encode_records(
        [
            (b"k", b"v"),
            (None, b"v2", [("h", b"1")]),
            (b"k3", None, None, T0),
            (b"k4", b"v4", (("a", None),), T0 + 9),
        ]
    )
    recs = decode_records(batch)
    assert [(r.key, r.value, r.headers) for r in recs] == [
        (b"k", b"v", ()),
        (None, b"v2", (("h", b"1"),)),
        (b"k3", None, ()),
        (b"k4", b"v4", (("a", None),)),
    ]
    assert recs[2].timestamp == T0
    assert recs[3].timestamp == T0 + 9
    # records without a timestamp get "now" when others have one
    assert recs[0].timestamp == recs[1].timestamp >= T0


def test_encode_records_missing_timestamps_are_now() -> None:
    before = time.time_ns() // 1_000_000
    recs = decode_records(encode_records([Record(value=b"a"), (None, b"b", None, None)]))
    assert all(r.timestamp >= before for r in recs)


def test_encode_records_all_null_keys_and_headers() -> None:
    recs = decode_records(encode_records([(None, b"a"), (None, b"b")]))
    assert [(r.key, r.headers) for r in recs] == [(None, ()), (None, ())]


def test_encode_records_accepts_iterators_and_dict_headers() -> None:
    gen = (Record(value=b"%d" % i, headers=[{"key": "i", "value": b"%d" % i}]) for i in range(3))
    recs = decode_records(encode_records(gen))
    assert [r.headers for r in recs] == [(("i", b"0"),), (("i", b"1"),), (("i", b"2"),)]


# ----------------------------------------------------------------------------- encode_arrow


def test_encode_arrow_table_binary_columns_int64_timestamp() -> None:
    table = pa.table(
        {
            "key": pa.array([b"k1", None, b"k3"], pa.binary()),
            "value": pa.array([b"v1", b"v2", None], pa.binary()),
            "timestamp": pa.array([T0, T0 + 1, T0 + 2], pa.int64()),
        }
    )
    recs = decode_records(encode_arrow(table, compression="lz4", base_offset=7))
    assert [(r.key, r.value, r.timestamp, r.offset) for r in recs] == [
        (b"k1", b"v1", T0, 7),
        (None, b"v2", T0 + 1, 8),
        (b"k3", None, T0 + 2, 9),
    ]


def test_encode_arrow_record_batch_string_columns() -> None:
    rb = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(["a", None], pa.string()),
            "value": pa.array(["héllo", "world"], pa.string()),
        }
    )
    recs = decode_records(encode_arrow(rb, now_ms=T0))
    assert [(r.key, r.value, r.timestamp) for r in recs] == [
        (b"a", "héllo".encode(), T0),
        (None, b"world", T0),
    ]


def test_encode_arrow_large_binary_and_chunked_table() -> None:
    t1 = pa.table({"value": pa.array([b"a", b"b"], pa.large_binary())})
    t2 = pa.table({"value": pa.array([b"c"], pa.large_binary())})
    table = pa.concat_tables([t1, t2])
    assert table.column("value").num_chunks == 2
    recs = decode_records(encode_arrow(table))
    assert [r.value for r in recs] == [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    ("arrow_type", "raw", "expected_ms"),
    [
        (pa.timestamp("ms", tz="UTC"), [T0, T0 + 1], [T0, T0 + 1]),
        (pa.timestamp("ms"), [T0, T0 + 1], [T0, T0 + 1]),
        (pa.timestamp("s", tz="UTC"), [1_700_000_000, 1_700_000_001], [T0, T0 + 1000]),
        (pa.timestamp("us", tz="Europe/Berlin"), [T0 * 1000, (T0 + 2) * 1000], [T0, T0 + 2]),
        (pa.timestamp("ns"), [T0 * 1_000_000, (T0 + 3) * 1_000_000], [T0, T0 + 3]),
    ],
)
def test_encode_arrow_timestamp_types(
    arrow_type: pa.DataType, raw: list[int], expected_ms: list[int]
) -> None:
    table = pa.table({"value": [b"a", b"b"], "timestamp": pa.array(raw, arrow_type)})
    batch = encode_arrow(table)
    assert [r.timestamp for r in decode_records(batch)] == expected_ms
    assert ts_ints(decode_to_arrow(batch)) == expected_ms


def test_encode_arrow_headers_column_round_trip() -> None:
    headers = pa.array(
        [[{"key": "a", "value": b"1"}, {"key": "b", "value": None}], None],
        HEADERS_TYPE,
    )
    table = pa.table({"value": [b"x", b"y"], "headers": headers})
    recs = decode_records(encode_arrow(table))
    assert [r.headers for r in recs] == [(("a", b"1"), ("b", None)), ()]


def test_encode_arrow_round_trips_to_arrow_output() -> None:
    """A decoded table (minus offset) can be re-encoded as is."""
    original = decode_to_arrow(encode_records(SAMPLE))
    again = decode_to_arrow(encode_arrow(original.drop_columns(["offset"])))
    assert again.equals(original)


def test_encode_arrow_rejects_bad_columns() -> None:
    with pytest.raises(ValueError, match="'value' column"):
        encode_arrow(pa.table({"key": [b"a"]}))
    with pytest.raises(ValueError, match="unexpected Arrow columns"):
        encode_arrow(pa.table({"value": [b"a"], "extra": [1]}))


# --------------------------------------------------------------------------------- to_arrow


def test_to_arrow_schema_and_absolute_offsets_and_timestamps() -> None:
    batch = bytearray(
        encode_batch(
            [b"a", b"b", b"c"],
            timestamps=[T0 + 50, T0, T0 + 100],
            offset_deltas=[0, 2, 5],
            base_offset=1000,
        )
    )
    table = decode_batches(batch)[0].to_arrow()
    assert table.schema.equals(RECORDS_SCHEMA)
    assert table.schema.field("timestamp").type == TIMESTAMP_TYPE
    assert table.column("offset").to_pylist() == [1000, 1002, 1005]
    assert ts_ints(table) == [T0 + 50, T0, T0 + 100]
    patch_base_offset(batch, 0, 5_000_000_000)
    table = decode_batches(batch)[0].to_arrow()
    assert table.column("offset").to_pylist() == [5_000_000_000, 5_000_000_002, 5_000_000_005]


def test_batches_to_arrow_and_decode_to_arrow_concatenate() -> None:
    b1 = encode_batch([b"a", b"b"], base_offset=0, now_ms=T0)
    b2 = encode_batch([b"c"], base_offset=2, now_ms=T0 + 1, compression="snappy")
    buf = b1 + b2
    table = decode_to_arrow(buf)
    assert table.schema.equals(RECORDS_SCHEMA)
    assert table.column("offset").to_pylist() == [0, 1, 2]
    assert ts_ints(table) == [T0, T0, T0 + 1]
    assert table.column("value").to_pylist() == [b"a", b"b", b"c"]
    assert batches_to_arrow(decode_batches(buf)).equals(table)
    assert batches_to_arrow([]).schema.equals(RECORDS_SCHEMA)
    assert decode_to_arrow(b"").num_rows == 0


# ----------------------------------------------------------------------- RecordBatch object


def test_records_fills_topic_and_partition() -> None:
    (b,) = decode_batches(encode_records(SAMPLE))
    recs = b.records("orders", 3)
    assert all(r.topic == "orders" and r.partition == 3 for r in recs)
    default = b.records()
    assert all(r.topic is None and r.partition == -1 for r in default)
    assert list(b) == default
    flat = decode_records(encode_records(SAMPLE), topic="t", partition=9)
    assert {(r.topic, r.partition) for r in flat} == {("t", 9)}


def test_record_batch_exposes_header_fields() -> None:
    batch = encode_batch(
        [b"a", b"b", b"c"],
        keys=[b"k", None, b"k"],
        timestamps=[T0 + 1, T0, T0 + 9],
        compression="gzip",
        base_offset=42,
        partition_leader_epoch=7,
        producer_id=1234,
        producer_epoch=5,
        base_sequence=10,
    )
    (b,) = decode_batches(batch)
    assert isinstance(b, RecordBatch)
    assert b.base_offset == 42
    assert b.batch_length == len(batch) - 12
    assert b.size == len(batch)
    assert b.partition_leader_epoch == 7
    assert b.magic == MAGIC == 1
    assert b.crc == crc32c.crc32c(batch[CRC_START:])
    assert b.crc == struct.unpack_from(">I", batch, 17)[0]
    assert b.attributes == CODEC_IDS["gzip"]
    assert b.last_offset_delta == 2
    assert b.base_timestamp == T0 + 1
    assert b.max_timestamp == T0 + 9
    assert b.producer_id == 1234
    assert b.producer_epoch == 5
    assert b.base_sequence == 10
    assert b.last_sequence == 12
    assert b.record_count == 3 == len(b)
    assert b.last_offset == 44
    assert b.next_offset == 45
    assert b.timestamp_type == TIMESTAMP_CREATE
    assert not b.is_transactional
    assert not b.is_control
    assert b.position == 0
    assert bytes(b.raw) == batch
    assert b.header == read_header(batch)
    assert "base_offset=42" in repr(b) and "gzip" in repr(b)
    with pytest.raises(AttributeError, match="no_such_field"):
        _ = b.no_such_field


def test_defaults_for_non_idempotent_batch() -> None:
    h = read_header(encode_batch([b"a"]))
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    assert h.partition_leader_epoch == -1
    assert h.base_offset == 0
    assert h.last_sequence == -1


def test_last_sequence_wraps() -> None:
    h = read_header(encode_batch([b"a", b"b", b"c"], base_sequence=2**31 - 2, producer_id=1))
    assert h.last_sequence == 0


def test_transactional_and_control_flags() -> None:
    (b,) = decode_batches(encode_batch([b"a"], transactional=True, control=True))
    assert b.is_transactional and b.is_control
    assert b.attributes == 0x10 | 0x20
    assert b.records()[0].value == b"a"


def test_body_is_cached_and_in_body_schema() -> None:
    (b,) = decode_batches(encode_records(SAMPLE))
    body = b.body()
    assert body is b.body()
    assert body.schema.equals(BODY_SCHEMA_V1)
    assert body.column("offset_delta").to_pylist() == list(range(len(SAMPLE)))


def test_decode_accepts_bytes_bytearray_memoryview() -> None:
    batch = encode_records(SAMPLE)
    for buf in (batch, bytearray(batch), memoryview(batch), memoryview(bytearray(batch))):
        assert comparable(decode_records(buf)) == comparable(SAMPLE)
        assert len(scan_batches(buf)) == 1


def test_large_base_offset_records_are_not_truncated_to_int32() -> None:
    # Regression: offset deltas are int32 in the body; adding a base offset >= 2**31 must
    # widen to int64 instead of overflowing (numpy 2 raises / wraps).
    for base in (2**31 - 1, 2**31, 3_000_000_000, 2**62):
        batch = encode_batch([b"a", b"b"], base_offset=base)
        assert [r.offset for r in decode_records(batch)] == [base, base + 1]
        assert decode_to_arrow(batch).column("offset").to_pylist() == [base, base + 1]


# -------------------------------------------------------------------- offset gaps (cleaner)


def test_offset_deltas_with_gaps() -> None:
    batch = encode_batch([b"a", b"b", b"c"], offset_deltas=[0, 3, 9], base_offset=10)
    h = read_header(batch)
    assert h.record_count == 3
    assert h.last_offset_delta == 9
    assert [r.offset for r in decode_records(batch)] == [10, 13, 19]
    assert len(scan_batches(batch)) == 1  # log data may have gaps
    with pytest.raises(InvalidBatchError, match="produced batch"):
        scan_batches(batch, producer_batch=True)


@pytest.mark.parametrize("deltas", [[0, 0], [1, 0], [0, 1, 2], [0]])
def test_offset_deltas_must_increase_one_per_record(deltas: list[int]) -> None:
    with pytest.raises(ValueError, match="offset_deltas"):
        encode_batch([b"a", b"b"], offset_deltas=deltas)


# ---------------------------------------------------------------------------- header patches


def test_patch_base_offset_and_epoch_keep_crc() -> None:
    b1 = encode_batch([b"a", b"b"], now_ms=T0)
    b2 = encode_batch([b"c", b"d", b"e"], now_ms=T0, compression="zstd")
    buf = bytearray(b1 + b2)
    crcs = [h.crc for h in scan_batches(buf)]
    patch_base_offset(buf, 0, 100)
    patch_leader_epoch(buf, 0, 3)
    patch_base_offset(buf, len(b1), 102)
    patch_leader_epoch(buf, len(b1), 2**31 - 1)
    headers = scan_batches(buf)
    assert [h.crc for h in headers] == crcs
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [
        (100, 3),
        (102, 2**31 - 1),
    ]
    assert [r.offset for r in decode_records(buf)] == [100, 101, 102, 103, 104]
    assert [r.value for r in decode_records(buf)] == [b"a", b"b", b"c", b"d", b"e"]
    # only bytes 0..16 of each batch changed
    assert buf[16 : len(b1)] == b1[16:]
    assert buf[len(b1) + 16 :] == b2[16:]


def test_patch_through_memoryview() -> None:
    buf = bytearray(encode_batch([b"a"]))
    view = memoryview(buf)
    patch_base_offset(view, 0, 2**40)
    patch_leader_epoch(view, 0, 9)
    (b,) = decode_batches(buf)
    assert (b.base_offset, b.partition_leader_epoch) == (2**40, 9)
    assert b.records()[0].offset == 2**40


@pytest.mark.parametrize("codec", CODECS)
def test_set_log_append_time(codec: str) -> None:
    b1 = encode_batch([b"x"], now_ms=T0)
    b2 = encode_batch([b"a", b"b", b"c"], timestamps=[T0 + 5, T0 + 1, T0 + 3], compression=codec)
    buf = bytearray(b1 + b2)
    h = scan_batches(buf)[1]
    append_ms = T0 + 10_000
    set_log_append_time(buf, h, append_ms)
    h1, h2 = scan_batches(buf)  # CRC verifies after the rewrite
    assert h1 == scan_batches(b1)[0]  # the other batch is untouched
    assert h2.timestamp_type == TIMESTAMP_LOG_APPEND
    assert h2.max_timestamp == append_ms
    assert h2.codec == CODEC_IDS[codec]
    assert h2.crc == crc32c.crc32c(bytes(buf[len(b1) + CRC_START :]))
    recs = decode_batches(buf)[1].records()
    assert [r.timestamp for r in recs] == [append_ms] * 3
    assert [r.value for r in recs] == [b"a", b"b", b"c"]
    assert ts_ints(decode_batches(buf)[1].to_arrow()) == [append_ms] * 3


def test_set_log_append_time_earlier_than_create_time_is_valid() -> None:
    buf = bytearray(encode_batch([b"a"], timestamps=[T0]))
    set_log_append_time(buf, scan_batches(buf)[0], T0 - 1000)
    assert decode_records(buf)[0].timestamp == T0 - 1000


def test_encode_with_log_append_time_flag() -> None:
    batch = encode_batch([b"a", b"b"], timestamps=[T0, T0 + 7], log_append_time=True)
    (b,) = decode_batches(batch)
    assert b.timestamp_type == TIMESTAMP_LOG_APPEND
    assert b.attributes & 0x08
    assert [r.timestamp for r in b.records()] == [T0 + 7, T0 + 7]
    assert ts_ints(b.to_arrow()) == [T0 + 7, T0 + 7]


# --------------------------------------------------------------------------- scan / decode


def test_scan_batches_positions() -> None:
    parts = [
        encode_batch([b"a"] * 3, compression="none", base_offset=0),
        encode_batch([b"b"] * 10, compression="gzip", base_offset=3),
        encode_batch([b"c"], compression="lz4", base_offset=13),
        encode_records(SAMPLE, compression="zstd", base_offset=14),
    ]
    buf = b"".join(parts)
    headers = scan_batches(buf)
    positions = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    assert [h.position for h in headers] == positions
    assert [h.size for h in headers] == [len(p) for p in parts]
    assert [h.base_offset for h in headers] == [0, 3, 13, 14]
    assert [h.record_count for h in headers] == [3, 10, 1, len(SAMPLE)]
    batches = decode_batches(buf)
    assert [b.position for b in batches] == positions
    assert [bytes(b.raw) for b in batches] == parts
    assert [r.offset for r in decode_records(buf)] == list(range(14 + len(SAMPLE)))
    assert scan_batches(b"") == []
    assert decode_batches(b"") == []


def test_producer_batch_rules() -> None:
    good = encode_batch([b"a", b"b"])
    assert len(scan_batches(good, producer_batch=True)) == 1
    # fewer records than offset deltas
    gap = rebuild(good, last_offset_delta=2)
    assert len(scan_batches(gap)) == 1
    with pytest.raises(InvalidBatchError, match="produced batch") as ei:
        scan_batches(gap, producer_batch=True)
    assert not ei.value.too_large
    # empty batch is fine in the log, never from a producer
    empty = rebuild(
        good,
        body=body_batch(*(pa.array([], t.type) for t in BODY_SCHEMA_V1)),
        record_count=0,
        last_offset_delta=0,
    )
    assert len(scan_batches(empty)) == 1
    assert decode_batches(empty)[0].records() == []
    with pytest.raises(InvalidBatchError, match="produced batch"):
        scan_batches(empty, producer_batch=True)


def test_max_timestamp_before_base_timestamp_rejected() -> None:
    batch = encode_batch([b"a"], timestamps=[T0])
    bad = rebuild(batch, max_timestamp=T0 - 1)
    with pytest.raises(InvalidBatchError, match="max_timestamp"):
        scan_batches(bad)
    # allowed with LogAppendTime
    ok = rebuild(batch, max_timestamp=T0 - 1, attributes=0x08)
    assert decode_records(ok)[0].timestamp == T0 - 1


# ---------------------------------------------------------------------------------- errors


def assert_invalid(buf: bytes | bytearray, match: str | None = None) -> InvalidBatchError:
    with pytest.raises(InvalidBatchError, match=match) as ei:
        fully_decode(buf)
    return ei.value


def test_invalid_batch_error_is_value_error() -> None:
    err = InvalidBatchError("x", position=5)
    assert isinstance(err, ValueError)
    assert err.position == 5 and not err.too_large


@pytest.mark.parametrize("cut", [1, 12, 17, 60])
def test_truncated_header(cut: int) -> None:
    batch = encode_records(SAMPLE)
    with pytest.raises(InvalidBatchError, match="truncated header"):
        scan_batches(batch[:cut])
    assert_invalid(batch[:cut], "truncated header")


def test_truncated_header_after_a_good_batch_reports_position() -> None:
    batch = encode_records(SAMPLE)
    buf = batch + batch[:30]
    err = assert_invalid(buf, "truncated header")
    assert err.position == len(batch)
    assert f"byte {len(batch)}" in str(err)


@pytest.mark.parametrize("missing", [1, 2, 100])
def test_truncated_body(missing: int) -> None:
    batch = encode_records(SAMPLE)
    with pytest.raises(InvalidBatchError, match="truncated") as ei:
        scan_batches(batch[:-missing])
    assert "truncated header" not in str(ei.value)
    assert_invalid(batch[:-missing], "truncated")
    err = assert_invalid(batch + batch[:-missing], "truncated")
    assert err.position == len(batch)


def test_header_only_batch_is_truncated() -> None:
    batch = encode_records(SAMPLE)
    assert_invalid(batch[:HEADER_SIZE], "truncated")


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("xor", [0x01, 0x80, 0xFF])
def test_every_byte_flip_from_crc_to_end_is_detected(codec: str, xor: int) -> None:
    batch = encode_batch(
        [b"v1", None, b"v3"],
        keys=[b"k", b"k2", None],
        headers=[[("h", b"x")], None, [("n", None)]],
        timestamps=[T0, T0 + 1, T0 + 2],
        compression=codec,
        base_offset=5,
    )
    expected = comparable(decode_records(batch))
    for i in range(17, len(batch)):
        bad = bytearray(batch)
        bad[i] ^= xor
        # the broker's header-only check catches it ...
        with pytest.raises(InvalidBatchError):
            scan_batches(bad)
        # ... and so does every consumer path
        with pytest.raises(InvalidBatchError):
            fully_decode(bad)
        # with the CRC check off, decoding may return altered data but must still fail
        # only with InvalidBatchError (never a pyarrow/numpy error)
        with contextlib.suppress(InvalidBatchError):
            fully_decode_unchecked(bad)
    assert comparable(decode_records(batch)) == expected


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_crc_bytes_report_crc(codec: str) -> None:
    batch = encode_records(SAMPLE, compression=codec)
    for i in (17, 18, 19, 20, 21, len(batch) // 2, len(batch) - 1):
        bad = bytearray(batch)
        bad[i] ^= 0x40
        if 21 <= i < 23:
            # attributes: may trip the codec check first
            assert_invalid(bad)
        else:
            assert_invalid(bad, "CRC")


def test_flip_in_leader_fields_is_not_a_corruption() -> None:
    """Bytes 0..7 and 12..15 are outside the CRC by design (the leader rewrites them)."""
    batch = encode_records(SAMPLE)
    for i in [*range(8), *range(12, 16)]:
        bad = bytearray(batch)
        bad[i] ^= 0x01
        assert comparable(decode_records(bad)) == comparable(SAMPLE)


@pytest.mark.parametrize("magic", [0, 2, 255])
def test_wrong_magic(magic: int) -> None:
    bad = bytearray(encode_records(SAMPLE))
    bad[16] = magic
    with pytest.raises(InvalidBatchError, match="magic"):
        scan_batches(bad)
    assert_invalid(bad, f"unsupported magic {magic}")
    assert_invalid(bytes(bad), "magic")  # checked even without CRC
    with pytest.raises(InvalidBatchError, match="magic"):
        decode_batches(bad, verify_crc=False)


def test_oversized_batch() -> None:
    batch = encode_records(SAMPLE)
    n = len(batch)
    assert len(scan_batches(batch, max_batch_bytes=n)) == 1
    assert len(decode_batches(batch, max_batch_bytes=n)) == 1
    for check in (
        lambda: scan_batches(batch, max_batch_bytes=n - 1),
        lambda: decode_batches(batch, max_batch_bytes=n - 1),
        lambda: scan_batches(batch + batch, max_batch_bytes=n - 1, producer_batch=True),
    ):
        with pytest.raises(InvalidBatchError, match="exceeds the maximum") as ei:
            check()
        assert ei.value.too_large
        assert str(n) in str(ei.value) and str(n - 1) in str(ei.value)


def test_huge_batch_length_is_too_large_not_a_hang() -> None:
    bad = bytearray(encode_records(SAMPLE))
    struct.pack_into(">i", bad, 8, 2**31 - 1)
    with pytest.raises(InvalidBatchError, match="exceeds the maximum") as ei:
        scan_batches(bad)
    assert ei.value.too_large
    assert DEFAULT_MAX_BATCH_BYTES < 2**31


@pytest.mark.parametrize("length", [-(2**31), -1, 0, 10, 48])
def test_negative_or_short_batch_length(length: int) -> None:
    bad = bytearray(encode_records(SAMPLE))
    struct.pack_into(">i", bad, 8, length)
    with pytest.raises(InvalidBatchError, match="shorter than a header") as ei:
        scan_batches(bad)
    assert not ei.value.too_large
    assert_invalid(bad, "shorter than a header")


@pytest.mark.parametrize("delta", [-3, -1, 1, 5])
def test_wrong_batch_length_is_detected(delta: int) -> None:
    batch = encode_records(SAMPLE)
    bad = bytearray(batch)
    struct.pack_into(">i", bad, 8, read_header(batch).batch_length + delta)
    assert_invalid(bad)
    assert_invalid(bad + batch)
    with pytest.raises(InvalidBatchError):
        scan_batches(bad + batch)


@pytest.mark.parametrize("codec_bits", [5, 6, 7])
def test_unknown_codec_bits(codec_bits: int) -> None:
    bad = rebuild(encode_records(SAMPLE), attributes=codec_bits)
    with pytest.raises(InvalidBatchError, match=f"unknown codec id {codec_bits}"):
        scan_batches(bad)
    assert_invalid(bad, "unknown codec")
    with pytest.raises(InvalidBatchError, match="unknown codec"):
        codecs_mod.decompress(codec_bits, b"xx")
    assert "unknown" in read_header(bad).compression


@pytest.mark.parametrize(
    ("record_count", "last_offset_delta"),
    [(len(SAMPLE) + 1, len(SAMPLE) - 1), (10, 0), (-1, 4), (1, -1)],
)
def test_record_count_does_not_fit_last_offset_delta(
    record_count: int, last_offset_delta: int
) -> None:
    bad = rebuild(
        encode_records(SAMPLE), record_count=record_count, last_offset_delta=last_offset_delta
    )
    with pytest.raises(InvalidBatchError, match="record_count"):
        scan_batches(bad)
    assert_invalid(bad, "record_count")


# ------------------------------------------------- garbage bodies behind a valid CRC


def assert_body_rejected(bad: bytes, match: str | None = None) -> None:
    """The header checks pass; every body accessor raises InvalidBatchError only."""
    assert len(scan_batches(bad)) == 1
    for accessor in ("body", "records", "to_arrow"):
        (b,) = decode_batches(bad)
        with pytest.raises(InvalidBatchError, match=match):
            getattr(b, accessor)()
    with pytest.raises(InvalidBatchError, match=match):
        decode_records(bad)
    with pytest.raises(InvalidBatchError, match=match):
        decode_to_arrow(bad)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("seed", range(5))
def test_random_garbage_body_with_valid_crc(codec: str, seed: int) -> None:
    rng = random.Random(seed)
    batch = encode_records(SAMPLE, compression=codec)
    garbage = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
    assert_body_rejected(rebuild(batch, body=garbage))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_garbage_that_decompresses_but_is_not_arrow(codec: str) -> None:
    batch = encode_records(SAMPLE, compression=codec)
    body = bytes(codecs_mod.compress(CODEC_IDS[codec], b"not an arrow message at all" * 3))
    assert_body_rejected(rebuild(batch, body=body), "Arrow body")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_garbage_reports_decompression(codec: str) -> None:
    batch = encode_records(SAMPLE, compression=codec)
    assert_body_rejected(rebuild(batch, body=b"\x00garbage\xff" * 7), "does not decompress")


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("raw", [b"", b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00"])
def test_empty_body_or_end_of_stream_marker(codec: str, raw: bytes) -> None:
    # Regression: pyarrow raises EOFError (not an OSError) for these.
    body = bytes(codecs_mod.compress(CODEC_IDS[codec], raw))
    assert_body_rejected(rebuild(encode_records(SAMPLE, compression=codec), body=body))


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_arrow_body_with_valid_crc(codec: str) -> None:
    batch = encode_records(SAMPLE, compression=codec)
    raw = v1_body(5)
    for cut in (1, 8, len(raw) // 3, len(raw) // 2, len(raw) - 8):
        body = bytes(codecs_mod.compress(CODEC_IDS[codec], raw[:cut]))
        assert_body_rejected(rebuild(batch, body=body))


def test_body_record_count_mismatch() -> None:
    batch = encode_batch([b"a", b"b", b"c"])
    bad = rebuild(batch, body=v1_body(2, od=[0, 1]))
    assert_body_rejected(bad, "body holds 2 records, header says 3")


def test_body_with_another_schema() -> None:
    batch = encode_batch([b"a", b"b"])
    other = pa.record_batch({"x": pa.array([1, 2], pa.int64())}).serialize().to_pybytes()
    assert_body_rejected(rebuild(batch, body=other))
    strings = (
        pa.record_batch({name: pa.array(["a", "b"]) for name in BODY_SCHEMA_V1.names})
        .serialize()
        .to_pybytes()
    )
    assert_body_rejected(rebuild(batch, body=strings))


def test_body_is_an_ipc_stream_not_a_message() -> None:
    batch = encode_batch([b"a", b"b"])
    rb = decode_batches(batch)[0].body()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as writer:
        writer.write_batch(rb)
    assert_body_rejected(rebuild(batch, body=sink.getvalue().to_pybytes()))


@pytest.mark.parametrize("column", [0, 1])
def test_null_offset_or_timestamp_delta_in_body(column: int) -> None:
    arrays: list[pa.Array] = [
        pa.array([0, 1], pa.int32()),
        pa.array([0, 0], pa.int64()),
        pa.nulls(2, pa.binary()),
        pa.array([b"a", b"b"]),
        pa.nulls(2, HEADERS_TYPE),
    ]
    arrays[column] = pa.array([0, None], arrays[column].type)
    bad = rebuild(encode_batch([b"a", b"b"]), body=body_batch(*arrays))
    assert_body_rejected(bad, "null offset or timestamp delta")


@pytest.mark.parametrize(
    ("deltas", "last_offset_delta"),
    [([0, 5], 1), ([1, 1], 1), ([1, 0], 1), ([-1, 0], 1), ([0, 2**31 - 1], 1)],
)
def test_body_offset_deltas_outside_header_range(deltas: list[int], last_offset_delta: int) -> None:
    batch = encode_batch([b"a", b"b"])
    bad = rebuild(batch, body=v1_body(2, od=deltas), last_offset_delta=last_offset_delta)
    assert_body_rejected(bad, "offset deltas")


def test_body_with_gaps_inside_header_range_is_valid() -> None:
    batch = encode_batch([b"a", b"b"])
    ok = rebuild(batch, body=v1_body(2, od=[1, 4]), last_offset_delta=4)
    assert [r.offset for r in decode_records(ok)] == [1, 4]


@pytest.mark.parametrize("codec", CODECS)
def test_mutated_arrow_body_never_leaks_foreign_exceptions(codec: str) -> None:
    """Random byte mutations of a real Arrow body (CRC fixed up): decode either succeeds or
    raises InvalidBatchError, never a pyarrow/numpy error or a crash."""
    rng = random.Random(codec)
    batch = encode_records(SAMPLE, compression="none")
    raw = bytearray(batch[HEADER_SIZE:])
    outcomes = {"ok": 0, "invalid": 0}
    for _ in range(150):
        mutated = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        body = bytes(codecs_mod.compress(CODEC_IDS[codec], bytes(mutated)))
        bad = rebuild(batch, body=body, attributes=CODEC_IDS[codec])
        try:
            fully_decode(bad)
            outcomes["ok"] += 1
        except InvalidBatchError:
            outcomes["invalid"] += 1
    assert outcomes["invalid"] > 0


# ----------------------------------------------------------------------- bad encode args


def test_empty_values_rejected() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([])
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch(pa.array([], pa.binary()))
    with pytest.raises(ValueError, match="at least one record"):
        encode_records([])
    with pytest.raises(ValueError, match="at least one record"):
        encode_arrow(pa.table({"value": pa.array([], pa.binary())}))


@pytest.mark.parametrize("compression", ["brotli", "", "zst", 5, 7, -1, True, 1.0])
def test_unknown_compression(compression: object) -> None:
    with pytest.raises(ValueError, match="gzip, lz4, none, snappy, zstd") as ei:
        encode_batch([b"a"], compression=compression)  # type: ignore[arg-type]
    assert "unknown compression" in str(ei.value)


def test_length_mismatches() -> None:
    with pytest.raises(ValueError, match="keys has 1 entries but there are 2"):
        encode_batch([b"a", b"b"], keys=[b"k"])
    with pytest.raises(ValueError, match="keys"):
        encode_batch([b"a"], keys=pa.array([b"k", b"l"]))
    with pytest.raises(ValueError, match="headers"):
        encode_batch([b"a", b"b"], headers=[None])
    with pytest.raises(ValueError, match="timestamps"):
        encode_batch([b"a", b"b"], timestamps=[T0])


@pytest.mark.parametrize("bad", [[1], [b"ok", 3.5], [object()], [[b"x"]]])
def test_non_bytes_value_is_type_error(bad: list) -> None:
    with pytest.raises(TypeError, match="values"):
        encode_batch(bad)


def test_non_bytes_key_is_type_error() -> None:
    with pytest.raises(TypeError, match="keys"):
        encode_batch([b"a"], keys=[42])
    with pytest.raises(TypeError):
        encode_records([(1, b"a")])


def test_bad_headers_are_type_errors() -> None:
    with pytest.raises(TypeError, match="header keys must be str"):
        encode_batch([b"a"], headers=[[(b"k", b"v")]])
    with pytest.raises(TypeError, match="headers"):
        encode_batch([b"a"], headers=[[("k", 12)]])


@pytest.mark.parametrize("stamps", [[-1], [T0, -5], [-(2**62)]])
def test_negative_timestamp(stamps: list[int]) -> None:
    values = [b"a"] * len(stamps)
    with pytest.raises(ValueError, match=">= 0"):
        encode_batch(values, timestamps=stamps)
    with pytest.raises(ValueError, match=">= 0"):
        encode_arrow(pa.table({"value": values, "timestamp": pa.array(stamps, pa.int64())}))
