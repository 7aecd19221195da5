"""Batches' bodies written without pyarrow's writer (strom.record.small_body) are the very
bytes pyarrow writes: encode_batch with lists (the fast path) against the same data as tuples (which
always go through pyarrow), byte for byte, and back through decode_batches."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.record import small_body
from strom.record.batch import decode_batches, encode_batch

blobs = st.one_of(st.none(), st.binary(max_size=300))


@st.composite
def batches(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, small_body.MAX_RECORDS + 2))
    values = draw(st.lists(blobs, min_size=n, max_size=n))
    keys = draw(st.one_of(st.none(), st.lists(blobs, min_size=n, max_size=n)))
    stamps = draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(0, 2**50), min_size=n, max_size=n),
            st.lists(st.integers(0, 2**50), min_size=n, max_size=n).map(np.array),
        )
    )
    return dict(
        values=values,
        keys=keys,
        timestamps=stamps,
        compression=draw(st.sampled_from(["none", "lz4", "zstd"])),
        producer_id=draw(st.integers(-1, 2**40)),
        producer_epoch=draw(st.integers(-1, 2**15 - 1)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)),
        transactional=draw(st.booleans()),
        now_ms=1_700_000_000_000,
    )


@settings(max_examples=300, deadline=None)
@given(batches())
def test_small_batches_are_the_bytes_pyarrow_writes(b: dict[str, Any]) -> None:
    fast = encode_batch(**b)
    slow = dict(b, values=tuple(b["values"]))
    if b["keys"] is not None:
        slow["keys"] = tuple(b["keys"])
    assert fast == encode_batch(**slow)
    (batch,) = decode_batches(fast)
    got = batch.records()
    assert [r.value for r in got] == b["values"]
    assert [r.key for r in got] == (b["keys"] or [None] * len(b["values"]))
    assert [r.offset for r in got] == list(range(len(b["values"])))


def test_the_layout_checked_itself_against_pyarrow_at_import() -> None:
    assert small_body._layout() is not None  # this pyarrow's bytes were reproduced
    deltas = np.array([0, 5, -2], dtype=np.int64)
    values = [b"a", None, b"ccc"]
    assert small_body.serialize(values, None, deltas) == small_body._pyarrow_body(
        values, None, deltas
    )


@pytest.mark.parametrize(
    ("values", "keys"),
    [
        ([b"a", bytearray(b"b")], None),  # not bytes: pyarrow takes it
        ([b"a"], [memoryview(b"k")]),
        ([b"a", b"b"], [b"k"]),  # a length mismatch: pyarrow's path names it
    ],
)
def test_what_the_fast_path_does_not_take_goes_through_pyarrow(
    values: list[Any], keys: list[Any] | None
) -> None:
    assert small_body.serialize(values, keys, np.zeros(len(values), dtype=np.int64)) is None
    if keys is not None and len(keys) != len(values):
        with pytest.raises(ValueError, match="keys has 1 entries but there are 2 values"):
            encode_batch(values, keys=keys)
    else:
        (batch,) = decode_batches(encode_batch(values, keys=keys))
        assert [r.value for r in batch.records()] == [bytes(v) for v in values]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(small_body.MAX_RECORDS + 1, 1200),
    st.sampled_from(["bytes", "some none", "all none", "no keys"]),
    st.integers(0, 2**32 - 1),
)
def test_big_batches_are_the_bytes_pyarrow_writes(n: int, keys_kind: str, seed: int) -> None:
    """Batches over MAX_RECORDS (pyarrow's columns, this module's IPC message around them),
    with numpy's 500-item slices crossed (strom.record.held). The data comes from a seeded
    generator: drawn item by item from hypothesis it outgrows its entropy budget."""
    rnd = random.Random(seed)
    values = [rnd.randbytes(rnd.randint(0, 40)) if rnd.random() < 0.9 else None for _ in range(n)]
    keys: list[Any] | None = {
        "bytes": lambda: [str(i % 97).encode() for i in range(n)],
        "some none": lambda: [None if i % 3 else b"k%d" % i for i in range(n)],
        "all none": lambda: [None] * n,
        "no keys": lambda: None,
    }[keys_kind]()
    stamps = np.array([1_700_000_000_000 + rnd.randint(-5000, 5000) for _ in range(n)])
    b = dict(values=values, keys=keys, timestamps=stamps, producer_id=7, base_sequence=3)
    fast = encode_batch(**b)
    slow = dict(b, values=tuple(values), keys=None if keys is None else tuple(keys))
    assert fast == encode_batch(**slow)
    (batch,) = decode_batches(fast)
    got = batch.records()
    assert [r.value for r in got] == values
    assert [r.key for r in got] == (keys or [None] * n)
    assert [r.timestamp for r in got] == stamps.tolist()


def test_bad_input_is_refused_as_before() -> None:
    with pytest.raises(TypeError, match="values must be bytes or None"):
        encode_batch([b"a", 5])
    with pytest.raises(ValueError, match="timestamps must be ms since the epoch"):
        encode_batch([b"a"], timestamps=[-1])
    with pytest.raises(ValueError, match="timestamps has 2 entries but there are 1 values"):
        encode_batch([b"a"], timestamps=[1, 2])


def test_without_the_layout_pyarrow_writes_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [b"v1", None]
    expected = encode_batch(values, now_ms=5)
    monkeypatch.setattr(small_body, "_LAYOUT", None)
    assert small_body.serialize(values, None, np.zeros(2, dtype=np.int64)) is None
    assert encode_batch(values, now_ms=5) == expected


def columns_of(batch: Any) -> list[list[Any]]:
    return [list(col) for col in batch.py_columns()]


@settings(max_examples=300, deadline=None)
@given(batches(), st.integers(0, 2**32 - 1))
def test_small_bodies_read_back_as_pyarrow_reads_them(b: dict[str, Any], base: int) -> None:
    raw = encode_batch(**dict(b, base_offset=base))
    (fast,) = decode_batches(raw)
    (slow,) = decode_batches(raw)
    slow.body()  # decoded by pyarrow first: py_columns then reads pyarrow's columns
    assert columns_of(fast) == columns_of(slow)
    assert columns_of(fast)[0] == [base + i for i in range(len(b["values"]))]


def test_a_body_with_headers_is_read_by_pyarrow() -> None:
    raw = encode_batch([b"a", b"b"], headers=[[("h", b"1")], None])
    (batch,) = decode_batches(raw)
    assert columns_of(batch)[4] == [(("h", b"1"),), ()]


@settings(max_examples=400, deadline=None)
@given(batches(), st.data())
def test_a_damaged_body_reads_as_some_records_or_is_refused(b: dict[str, Any], data: Any) -> None:
    """Damage the CRC does not see here (the consumer checks CRCs before reading): whatever a
    byte of the body becomes, the batch reads as n records or raises InvalidBatchError."""
    from strom.record import HEADER_SIZE, InvalidBatchError

    b = dict(b, compression="none")
    raw = bytearray(encode_batch(**b))
    at = data.draw(st.integers(HEADER_SIZE, len(raw) - 1))
    raw[at] = data.draw(st.integers(0, 255))
    (batch,) = decode_batches(bytes(raw), verify_crc=False)
    try:
        cols = columns_of(batch)
    except InvalidBatchError:
        return
    assert all(len(c) == len(b["values"]) for c in cols)
