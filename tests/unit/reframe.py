"""A batch re-framed with a *valid* CRC around a new body or header fields: what tests use to
hand the readers damage that a CRC check cannot catch."""

from __future__ import annotations

import random
from pathlib import Path

import crc32c
import pyarrow as pa

from strom.record import HEADER_SIZE, encode_batch, read_header
from strom.record.header import CRC_START, pack_header, scan_batches
from strom.record.schema import BODY_SCHEMA_V1, HEADERS_TYPE


def rebuild(batch: bytes, body: bytes | None = None, **overrides: int) -> bytes:
    """Re-pack a batch's header (optionally with a new body / fields) with a valid CRC."""
    h = read_header(batch)
    if body is None:
        body = bytes(batch[HEADER_SIZE : h.size])
    fields = dict(
        base_offset=h.base_offset,
        body_length=len(body),
        partition_leader_epoch=h.partition_leader_epoch,
        attributes=h.attributes,
        last_offset_delta=h.last_offset_delta,
        base_timestamp=h.base_timestamp,
        max_timestamp=h.max_timestamp,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        record_count=h.record_count,
    )
    fields.update(overrides)
    crc = crc32c.crc32c(body, crc32c.crc32c(pack_header(crc=0, **fields)[CRC_START:]))
    return pack_header(crc=crc, **fields) + bytes(body)


def rot_stored_body(log_dir: Path, base_offset: int) -> bytes:
    """Overwrite, in its segment file, the body of the stored batch at ``base_offset`` with
    zeros of the same length under a recomputed CRC: a batch stored before leaders checked
    bodies, or a disk that rotted. The file keeps its layout (sizes, offsets, indexes), so
    only a decode of that body can tell. Returns the batch's new bytes."""
    for seg in sorted(log_dir.glob("*.log")):
        data = seg.read_bytes()
        for h in scan_batches(data, max_batch_bytes=len(data) + 1):
            if h.base_offset != base_offset:
                continue
            one = data[h.position : h.position + h.size]
            rotted = rebuild(one, body=bytes(h.size - HEADER_SIZE))
            with open(seg, "r+b") as f:
                f.seek(h.position)
                f.write(rotted)
            return rotted
    raise AssertionError(f"no stored batch at offset {base_offset} in {log_dir}")


def garbage_body_variants(good: bytes) -> dict[str, bytes]:
    """Batches whose header and CRC are valid but whose body a reader cannot decode, each
    framed around ``good`` (a 3-record producer batch): what a leader must refuse on
    append (found from outside: each was acknowledged, then stopped every reader there)."""
    h = read_header(good)
    n = h.size - HEADER_SIZE
    assert h.record_count == 3
    rows = {
        "offset_delta": pa.array([0, 2, 1], pa.int32()),
        "timestamp_delta": pa.array([0, 0, 0], pa.int64()),
        "key": pa.array([None] * 3, pa.binary()),
        "value": pa.array([b"a", b"b", b"c"], pa.binary()),
        "headers": pa.array([None] * 3, HEADERS_TYPE),
    }
    unordered = pa.RecordBatch.from_arrays(list(rows.values()), schema=BODY_SCHEMA_V1)
    two = read_header(encode_batch([b"a", b"b"]))
    two_body = encode_batch([b"a", b"b"])[HEADER_SIZE : two.size]
    other = pa.record_batch([pa.array([1, 2, 3], pa.int64())], names=["x"])
    return {
        "random": rebuild(good, body=random.Random(7).randbytes(n)),
        "zeros": rebuild(good, body=bytes(n)),
        "zstd-bit-on-plain-body": rebuild(good, attributes=h.attributes | 4),
        "rows-fewer-than-header": rebuild(good, body=two_body),
        "another-schema": rebuild(good, body=other.serialize().to_pybytes()),
        "offset-deltas-not-increasing": rebuild(good, body=unordered.serialize().to_pybytes()),
        "truncated-arrow": rebuild(good, body=good[HEADER_SIZE : h.size - 16]),
    }
