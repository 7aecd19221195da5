"""A batch re-framed with a *valid* CRC around a new body or header fields: what tests use to
hand the readers damage that a CRC check cannot catch."""

from __future__ import annotations

import crc32c

from strom.record import HEADER_SIZE, read_header
from strom.record.header import CRC_START, pack_header


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
