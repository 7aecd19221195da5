"""Kafka-compatible key partitioning (DESIGN §1): murmur2 of the key bytes, made positive,
modulo the partition count — the function of Kafka's Java client, so a key lands on the same
partition number in strom as in Kafka."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit murmur2 as Kafka's ``Utils.murmur2`` computes it (returned unsigned)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length & ~3
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """:func:`murmur2` of every entry of an Arrow binary array at once (uint32; nulls hash
    as empty keys, callers mask them).

    The loop runs over the 4-byte blocks of the *longest* key, each step one numpy pass over
    the keys that are that long, so a million short keys cost a few passes rather than a
    million Python calls: this is what lets a storage node partition a ProduceRecords call by
    key without a per-record Python loop.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if keys.type != pa.binary():
        keys = keys.cast(pa.binary())
    n = len(keys)
    out = np.empty(n, dtype=np.uint32)
    if n == 0:
        return out
    bufs = keys.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=keys.offset * 4)
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if keys.null_count:
        lengths[~np.asarray(keys.is_valid())] = 0
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    # Pad so a 4-byte read at the last block never runs past the buffer.
    data = np.concatenate([data, np.zeros(4, dtype=np.uint8)]).astype(np.uint32)
    m = np.uint32(_M)
    h = np.uint32(_SEED) ^ lengths.astype(np.uint32)
    blocks = lengths // 4
    for j in range(int(blocks.max())):
        sel = np.flatnonzero(blocks > j)
        at = starts[sel] + 4 * j
        k = data[at] | (data[at + 1] << 8) | (data[at + 2] << 16) | (data[at + 3] << 24)
        k = k * m
        k ^= k >> np.uint32(24)
        k = k * m
        h[sel] = (h[sel] * m) ^ k
    tail = starts + blocks * 4
    rest = lengths & 3
    for nbytes, shift in ((3, 16), (2, 8)):
        sel = np.flatnonzero(rest >= nbytes)
        h[sel] ^= data[tail[sel] + nbytes - 1] << np.uint32(shift)
    sel = np.flatnonzero(rest >= 1)
    h[sel] = (h[sel] ^ data[tail[sel]]) * m
    h ^= h >> np.uint32(13)
    h = h * m
    h ^= h >> np.uint32(15)
    out[:] = h
    return out


def partitions_for_keys(keys: pa.Array, num_partitions: int) -> np.ndarray:
    """The partition :func:`partition_for_key` picks for each key of an Arrow binary array
    (int32), computed without a per-record Python loop; -1 for null keys."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    parts = ((murmur2_array(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)).astype(
        np.int32
    )
    if keys.null_count:
        parts[~np.asarray(keys.is_valid())] = -1
    return parts
