"""Property tests for the record batch engine: round trips, concatenation, patching and
corruption detection over random records (DESIGN §4)."""

from __future__ import annotations

import contextlib

import crc32c
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strom.record import (
    HEADER_SIZE,
    RECORDS_SCHEMA,
    InvalidBatchError,
    Record,
    decode_batches,
    decode_records,
    decode_to_arrow,
    encode_batch,
    encode_records,
    patch_base_offset,
    patch_leader_epoch,
    read_header,
    scan_batches,
)
from strom.record.header import CRC_START
from tests.unit.reframe import rebuild

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
MAX_TS = 2**42  # ~ year 2109 in ms; a sane upper bound

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

maybe_bytes = st.none() | st.binary(max_size=64)
headers = st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=4).map(tuple)
records = st.builds(
    Record,
    key=maybe_bytes,
    value=maybe_bytes,
    headers=headers,
    timestamp=st.integers(min_value=0, max_value=MAX_TS),
)
record_lists = st.lists(records, min_size=1, max_size=30)
codecs = st.sampled_from(CODECS)


def expected(recs: list[Record], base_offset: int = 0) -> list[tuple]:
    return [
        (r.key, r.value, tuple(r.headers), r.timestamp, base_offset + i) for i, r in enumerate(recs)
    ]


def got(recs: list[Record]) -> list[tuple]:
    return [(r.key, r.value, r.headers, r.timestamp, r.offset) for r in recs]


def table_rows(table: pa.Table) -> list[tuple]:
    assert table.schema.equals(RECORDS_SCHEMA)
    offsets = table.column("offset").to_pylist()
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    hdrs = [
        tuple((h["key"], h["value"]) for h in row) if row else ()
        for row in table.column("headers").to_pylist()
    ]
    return list(zip(keys, values, hdrs, stamps, offsets, strict=True))


@SETTINGS
@given(recs=record_lists, codec=codecs, base_offset=st.integers(0, 2**62))
def test_round_trip_records_and_arrow(recs: list[Record], codec: str, base_offset: int) -> None:
    batch = encode_records(recs, compression=codec, base_offset=base_offset)
    h = read_header(batch)
    assert h.size == len(batch)
    assert h.record_count == len(recs) == h.last_offset_delta + 1
    assert h.base_timestamp == recs[0].timestamp
    assert h.max_timestamp == max(r.timestamp for r in recs)
    assert h.crc == crc32c.crc32c(batch[CRC_START:])
    assert len(scan_batches(batch, producer_batch=True)) == 1

    (b,) = decode_batches(batch)
    want = expected(recs, base_offset)
    assert got(b.records("t", 1)) == want
    assert table_rows(b.to_arrow()) == want


@SETTINGS
@given(
    values=st.lists(maybe_bytes, min_size=1, max_size=30),
    codec=codecs,
    data=st.data(),
)
def test_round_trip_encode_batch_columns(values: list, codec: str, data: st.DataObject) -> None:
    n = len(values)
    keys = data.draw(st.lists(maybe_bytes, min_size=n, max_size=n))
    hdrs = data.draw(st.lists(st.none() | headers, min_size=n, max_size=n))
    stamps = data.draw(st.lists(st.integers(0, MAX_TS), min_size=n, max_size=n))
    batch = encode_batch(values, keys=keys, headers=hdrs, timestamps=stamps, compression=codec)
    want = [
        (k, v, tuple(h) if h else (), t, i)
        for i, (k, v, h, t) in enumerate(zip(keys, values, hdrs, stamps, strict=True))
    ]
    assert got(decode_records(batch)) == want
    assert table_rows(decode_to_arrow(batch)) == want


@SETTINGS
@given(batches=st.lists(st.tuples(record_lists, codecs), min_size=1, max_size=5))
def test_concatenated_batches_decode_in_order(batches: list[tuple[list[Record], str]]) -> None:
    parts: list[bytes] = []
    want: list[tuple] = []
    next_offset = 0
    for recs, codec in batches:
        parts.append(encode_records(recs, compression=codec, base_offset=next_offset))
        want.extend(expected(recs, next_offset))
        next_offset += len(recs)
    buf = b"".join(parts)

    headers = scan_batches(buf, producer_batch=True)
    assert [h.position for h in headers] == [sum(map(len, parts[:i])) for i in range(len(parts))]
    assert [h.size for h in headers] == [len(p) for p in parts]
    assert got(decode_records(buf)) == want
    assert table_rows(decode_to_arrow(buf)) == want
    assert [bytes(b.raw) for b in decode_batches(buf)] == parts


@SETTINGS
@given(
    batches=st.lists(st.tuples(record_lists, codecs), min_size=1, max_size=4),
    data=st.data(),
)
def test_patching_offsets_and_epochs_keeps_decoding_correct(
    batches: list[tuple[list[Record], str]], data: st.DataObject
) -> None:
    parts = [encode_records(recs, compression=codec) for recs, codec in batches]
    buf = bytearray(b"".join(parts))
    crcs = [h.crc for h in scan_batches(buf)]
    want: list[tuple] = []
    epochs: list[int] = []
    bases: list[int] = []
    for h, (recs, _) in zip(scan_batches(buf), batches, strict=True):
        base = data.draw(st.integers(0, 2**62), label="base_offset")
        epoch = data.draw(st.integers(-(2**31), 2**31 - 1), label="epoch")
        patch_base_offset(buf, h.position, base)
        patch_leader_epoch(buf, h.position, epoch)
        bases.append(base)
        epochs.append(epoch)
        want.extend(expected(recs, base))

    headers = scan_batches(buf)  # CRCs still verify
    assert [h.crc for h in headers] == crcs
    assert [h.base_offset for h in headers] == bases
    assert [h.partition_leader_epoch for h in headers] == epochs
    assert got(decode_records(buf)) == want
    assert table_rows(decode_to_arrow(buf)) == want


def _decode_fully(buf: bytes | bytearray) -> None:
    for b in decode_batches(buf):
        b.records()
        b.to_arrow()


@SETTINGS
@given(recs=record_lists, codec=codecs, data=st.data())
def test_any_single_byte_corruption_is_detected(
    recs: list[Record], codec: str, data: st.DataObject
) -> None:
    batch = encode_records(recs, compression=codec)
    pos = data.draw(st.integers(17, len(batch) - 1), label="position")
    xor = data.draw(st.integers(1, 255), label="xor")
    bad = bytearray(batch)
    bad[pos] ^= xor
    try:
        _decode_fully(bad)
    except InvalidBatchError:
        pass
    else:
        raise AssertionError(f"corruption at byte {pos} (xor {xor:#x}) went undetected")


@SETTINGS
@given(recs=record_lists, codec=codecs, data=st.data())
def test_corruption_in_a_later_batch_is_detected(
    recs: list[Record], codec: str, data: st.DataObject
) -> None:
    first = encode_records(recs, compression=codec)
    second = encode_records(recs, compression=codec, base_offset=len(recs))
    buf = bytearray(first + second)
    pos = data.draw(st.integers(len(first) + 17, len(buf) - 1), label="position")
    buf[pos] ^= data.draw(st.integers(1, 255), label="xor")
    try:
        scan_batches(buf)
    except InvalidBatchError as exc:
        assert exc.position == len(first)
    else:
        raise AssertionError(f"corruption at byte {pos} went undetected")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=record_lists, data=st.data())
def test_corrupt_body_behind_valid_crc_only_raises_invalid_batch(
    recs: list[Record], data: st.DataObject
) -> None:
    """A body mangled *before* the CRC was computed: decode may succeed (values are opaque)
    but must fail, if at all, with InvalidBatchError, never a pyarrow/numpy exception."""
    batch = encode_records(recs)
    body = bytearray(batch[HEADER_SIZE:])
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        i = data.draw(st.integers(0, len(body) - 1), label="i")
        body[i] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.none() | st.integers(0, len(body)), label="cut")
    if cut is not None:
        del body[cut:]
    bad = rebuild(batch, bytes(body))
    with contextlib.suppress(InvalidBatchError):
        _decode_fully(bad)
