"""The 61-byte record batch header (DESIGN §4) and header-only operations on raw bytes.

Everything a broker does to a batch happens here: parse headers, check CRCs, and patch the two
leader-set fields (base offset, partition leader epoch) in place. None of it touches the body,
so the cost is per batch, never per record. The CRC covers bytes 21..end, which excludes the
leader-set fields, so patching never needs a new CRC.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import crc32c

from strom.grpc_options import MAX_MESSAGE_BYTES
from strom.record.codecs import CODEC_NAMES
from strom.record.errors import InvalidBatchError

MAGIC = 1
HEADER_SIZE = 61
# batch_length counts the bytes after itself, so a batch is batch_length + LENGTH_PREFIX bytes.
LENGTH_PREFIX = 12
CRC_START = 21
#: Default ceiling on one batch when decoding: the largest batch a log may hold
#: (strom.log.segment.MAX_STORED_BATCH_BYTES, the gRPC message limit), so that readers decode
#: every batch the cluster acknowledged. It was 64 MiB while nodes
#: stored and acknowledged batches up to 256 MiB, and every reader failed on such a batch
#: as "corrupt". Produce paths pass the topic's max.message.bytes instead.
DEFAULT_MAX_BATCH_BYTES = MAX_MESSAGE_BYTES

_HEADER = struct.Struct(">qiiBIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_PREFIX = struct.Struct(">qi")  # base_offset, batch_length
_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_MAX_TS = struct.Struct(">q")
_ATTR = struct.Struct(">h")
_CRC = struct.Struct(">I")

ATTR_CODEC_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


class TimestampType(IntEnum):
    """What a record's timestamp means, with Kafka's ``TimestampType`` ids (batch attribute
    bit 3): the producer's create time, or the leader's log-append time (topics with
    ``message.timestamp.type=LogAppendTime``, whose records all carry the batch's append
    time)."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


TIMESTAMP_CREATE = TimestampType.CREATE_TIME
TIMESTAMP_LOG_APPEND = TimestampType.LOG_APPEND_TIME


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded header of one batch plus where it sits in the buffer it came from."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    position: int = 0

    @property
    def size(self) -> int:
        """Total bytes of the batch (header plus body)."""
        return self.batch_length + LENGTH_PREFIX

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> int:
        return self.attributes & ATTR_CODEC_MASK

    @property
    def compression(self) -> str:
        return CODEC_NAMES.get(self.codec, f"unknown({self.codec})")

    @property
    def timestamp_type(self) -> TimestampType:
        return TIMESTAMP_LOG_APPEND if self.attributes & ATTR_LOG_APPEND_TIME else TIMESTAMP_CREATE

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping at 2**31 as Kafka does; -1 if not idempotent."""
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def pack_header(
    *,
    base_offset: int,
    body_length: int,
    partition_leader_epoch: int,
    crc: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    """Pack a header for a body of ``body_length`` bytes."""
    return _HEADER.pack(
        base_offset,
        HEADER_SIZE - LENGTH_PREFIX + body_length,
        partition_leader_epoch,
        MAGIC,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )


def crc_of(header_tail: bytes, body: Any) -> int:
    """CRC-32C over header bytes 21..61 followed by the body."""
    return crc32c.crc32c(body, crc32c.crc32c(header_tail))


def read_header(buf: Any, position: int = 0) -> BatchHeader:
    """Parse the header at ``position`` without checking anything but that it is all there."""
    if len(buf) - position < HEADER_SIZE:
        raise InvalidBatchError(
            f"batch at byte {position}: truncated header "
            f"({len(buf) - position} of {HEADER_SIZE} bytes)",
            position=position,
        )
    return BatchHeader(*_HEADER.unpack_from(buf, position), position)  # type: ignore[arg-type]


def header_at(buf: Any, index: int, position: int) -> BatchHeader:
    """Parse the header at ``index`` of ``buf`` (whole: the caller checked), recording
    ``position`` as where it sits (a file position when ``buf`` is a chunk read from a log
    segment at ``position - index``)."""
    return BatchHeader(*_HEADER.unpack_from(buf, index), position)  # type: ignore[arg-type]


def peek_length(buf: Any, position: int) -> tuple[int, int]:
    """Return (base_offset, batch_length) of the batch at ``position`` (12-byte prefix only)."""
    return _PREFIX.unpack_from(buf, position)  # type: ignore[return-value]


def check_header(
    h: BatchHeader,
    buf: Any,
    *,
    verify_crc: bool = True,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    producer_batch: bool = False,
) -> None:
    """Validate one parsed header against the bytes that follow it.

    ``producer_batch`` adds the rules for batches arriving from a producer: every offset
    delta present (record_count == last_offset_delta + 1) and at least one record. Log data may
    legitimately have gaps after compaction, so the rules are looser there.
    """
    pos = h.position
    if h.magic != MAGIC:
        raise InvalidBatchError(f"batch at byte {pos}: unsupported magic {h.magic}", position=pos)
    if h.batch_length < HEADER_SIZE - LENGTH_PREFIX:
        raise InvalidBatchError(
            f"batch at byte {pos}: batch_length {h.batch_length} is shorter than a header",
            position=pos,
        )
    if h.size > max_batch_bytes:
        raise InvalidBatchError(
            f"batch at byte {pos}: {h.size} bytes exceeds the maximum of {max_batch_bytes}",
            position=pos,
            too_large=True,
            limit=max_batch_bytes,
            next_offset=h.next_offset,
        )
    if len(buf) - pos < h.size:
        raise InvalidBatchError(
            f"batch at byte {pos}: truncated ({len(buf) - pos} of {h.size} bytes present)",
            position=pos,
        )
    if h.codec not in CODEC_NAMES:
        raise InvalidBatchError(f"batch at byte {pos}: unknown codec id {h.codec}", position=pos)
    if h.record_count < 0 or h.last_offset_delta < 0 or h.record_count > h.last_offset_delta + 1:
        raise InvalidBatchError(
            f"batch at byte {pos}: record_count {h.record_count} does not fit "
            f"last_offset_delta {h.last_offset_delta}",
            position=pos,
        )
    if producer_batch and (h.record_count == 0 or h.record_count != h.last_offset_delta + 1):
        raise InvalidBatchError(
            f"batch at byte {pos}: a produced batch must hold last_offset_delta + 1 records "
            f"(record_count {h.record_count}, last_offset_delta {h.last_offset_delta})",
            position=pos,
        )
    if h.max_timestamp < h.base_timestamp and not h.attributes & ATTR_LOG_APPEND_TIME:
        raise InvalidBatchError(
            f"batch at byte {pos}: max_timestamp {h.max_timestamp} is before "
            f"base_timestamp {h.base_timestamp}",
            position=pos,
        )
    if verify_crc:
        view = memoryview(buf)[pos + CRC_START : pos + h.size]
        actual = crc32c.crc32c(view)
        if actual != h.crc:
            raise InvalidBatchError(
                f"batch at byte {pos}: CRC-32C mismatch (stored {h.crc:#010x}, "
                f"computed {actual:#010x})",
                position=pos,
            )


def scan_batches(
    buf: Any,
    *,
    verify_crc: bool = True,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    producer_batch: bool = False,
) -> list[BatchHeader]:
    """Parse and validate every batch header in ``buf``; the body is never decoded.

    This is the broker's produce-path check: per batch it unpacks 61 bytes and runs one
    CRC-32C over the batch in C. Any fault raises :class:`InvalidBatchError` and nothing is
    returned, so a request is accepted or refused as a whole.
    """
    headers: list[BatchHeader] = []
    pos = 0
    end = len(buf)
    while pos < end:
        h = read_header(buf, pos)
        check_header(
            h,
            buf,
            verify_crc=verify_crc,
            max_batch_bytes=max_batch_bytes,
            producer_batch=producer_batch,
        )
        headers.append(h)
        pos += h.size
    return headers


def patch_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None:
    """Overwrite a batch's base offset in place (outside the CRC, so no recompute)."""
    _OFFSET.pack_into(buf, position, base_offset)


def patch_leader_epoch(buf: bytearray | memoryview, position: int, epoch: int) -> None:
    """Overwrite a batch's partition leader epoch in place (outside the CRC)."""
    _EPOCH.pack_into(buf, position + 12, epoch)


def set_log_append_time(buf: bytearray | memoryview, h: BatchHeader, now_ms: int) -> None:
    """Stamp a batch with LogAppendTime: set the attribute bit and max_timestamp, redo the CRC.

    These fields are inside the CRC, so unlike the offset and epoch patch this costs one
    CRC-32C pass over the batch (still no decode).
    """
    pos = h.position
    _ATTR.pack_into(buf, pos + 21, h.attributes | ATTR_LOG_APPEND_TIME)
    _MAX_TS.pack_into(buf, pos + 35, now_ms)
    crc = crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + h.size])
    _CRC.pack_into(buf, pos + 17, crc)
