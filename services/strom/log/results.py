"""What a partition log's appends and reads answer (:class:`strom.log.partition_log.Log`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did: the offsets it assigned and the resulting log end offset.

    ``duplicates`` counts leading idempotent batches that repeat ones already in the log:
    they were not written again, and ``first_offset`` is the original offset of the first
    of them (``record_count`` and ``bytes`` count only what was written; both are 0 when
    every batch was a duplicate)."""

    first_offset: int
    last_offset: int
    log_end_offset: int
    record_count: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    bytes: int
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Batches read from the log and the offset right after them."""

    data: bytes | memoryview
    next_offset: int
    log_start_offset: int
    log_end_offset: int
