"""Vectorised key partitioning equals Kafka's murmur2 key by key (strom.client.keyhash)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.client.keyhash import murmur2_array, partitions_for_keys
from strom.client.partitioner import murmur2, partition_for_key


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=200), st.integers(1, 50))
def test_equals_the_scalar_murmur2(keys: list[bytes | None], n: int) -> None:
    arr = pa.array(keys, pa.binary())
    hashes = murmur2_array(arr)
    parts = partitions_for_keys(arr, n)
    for i, key in enumerate(keys):
        if key is None:
            assert parts[i] == -1
        else:
            assert int(hashes[i]) == murmur2(key)
            assert parts[i] == partition_for_key(key, n)


def test_kafka_vectors_slices_strings_and_large_types() -> None:
    keys = [b"", b"a", b"ab", b"abc", b"123456789", b"\x00 "]
    expected = [681, 524, 434, 107, 566, 742]  # Kafka's own partitioner tests (1000 parts)
    assert partitions_for_keys(pa.array(keys, pa.binary()), 1000).tolist() == expected
    assert partitions_for_keys(pa.array(keys, pa.large_binary()), 1000).tolist() == expected
    text = pa.array(["user-1", "user-22", None, "ü"])
    got = partitions_for_keys(text, 7).tolist()
    assert got == [
        partition_for_key(b"user-1", 7),
        partition_for_key(b"user-22", 7),
        -1,
        partition_for_key("ü".encode(), 7),
    ]
    sliced = pa.array(keys, pa.binary()).slice(2, 3)
    assert partitions_for_keys(sliced, 1000).tolist() == expected[2:5]
    chunked = pa.chunked_array([pa.array(keys[:3]), pa.array(keys[3:])])
    assert partitions_for_keys(chunked, 1000).tolist() == expected


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partitions_for_keys(pa.array([b"k"]), 0)
    with pytest.raises(TypeError, match="binary or string"):
        murmur2_array(pa.array([1, 2]))


def test_equal_length_keys_take_the_zero_copy_path() -> None:
    keys = [b"key-%05d" % i for i in range(500)]
    arr = pa.array(keys, pa.binary()).slice(17, 400)
    assert partitions_for_keys(arr, 12).tolist() == [partition_for_key(k, 12) for k in keys[17:417]]
