"""Errors of the storage engine. Services map them to per-partition error codes."""

from __future__ import annotations

import errno
from pathlib import Path

#: errnos of a volume without space (or a user past its quota).
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def naming(exc: OSError, doing: str, path: Path | str) -> OSError:
    """``exc`` again with what was being done to which file in its message (same class and
    errno): an error from a ``write`` carries no file name."""
    if getattr(exc, "named", False):
        return exc
    out = type(exc)(exc.errno, f"{exc.strerror or exc} ({doing} {path})")
    out.named = True  # type: ignore[attr-defined]
    return out


def disk_full_hint(exc: BaseException) -> str:
    """What an operator can do about ``exc`` when it says the disk is full, else ''."""
    if not disk_full(exc):
        return ""
    return (
        "; the volume is full: free space on it (delete records of a topic with strom topics "
        "delete-records, lower its retention, or enlarge the volume)"
    )


class LogError(Exception):
    """Base class of storage-engine errors."""


class OffsetOutOfRangeError(LogError):
    """A read asked for an offset below the log start or above the log end."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class CorruptLogError(LogError):
    """Data on disk failed a check on read (CRC, offsets, epochs): never returned to a reader.

    ``offset`` is the offset of the batch that failed (where the log's offsets say it
    starts), -1 when unknown: operators and consumers are told where the damage is."""

    def __init__(self, message: str, *, offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset


class UndecodableBatchError(LogError):
    """A stored batch whose header and CRC hold but whose body cannot be decoded (written
    before leaders checked bodies on append). Not a :class:`CorruptLogError`: every replica
    holds the same bytes, so it is no reason to distrust this disk or move leadership;
    answered ``CORRUPT_MESSAGE`` naming ``offset``, as a reader meets it."""

    def __init__(self, message: str, *, offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset


class InvalidAppendError(LogError):
    """An append broke an ordering rule (offsets not increasing, epoch going back)."""


class ConfigError(ValueError):
    """A topic/log config key or value is invalid; the message names the key and the rule."""


class InvalidTimestampError(LogError):
    """A produced batch's timestamp is further from the broker's time than the topic's
    ``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms`` allow (nothing
    of the request was appended). Services answer ``INVALID_TIMESTAMP``."""
