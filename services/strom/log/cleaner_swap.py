"""The cleaner's files: rewritten segments merged into cleaned files, checked and swapped in.

:class:`_Group` merges runs of adjacent rewritten segments into one file while they fit in
``segment.bytes``; :func:`_swap` checks a cleaned file recovers whole (:func:`_check_rewritten`)
and, under the log's lock and once no truncation or deletion voided the pass
(:func:`_still_held`), renames it in place of the segments it replaces so that a crash at any
point leaves either the old segments or the new one. Separate from the rewrite
(:mod:`strom.log.cleaner_rewrite`) because this is the only part that touches the log's files
and its segment list.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import BinaryIO

from strom.log.checkpoint import fsync_dir
from strom.log.cleaner_rewrite import _empty_batch, _mergeable
from strom.log.cleaner_selection import CleanerStats
from strom.log.errors import CorruptLogError
from strom.log.partition_log import Log
from strom.log.segment import DELETED_SUFFIX, EpochLookup, LogSegment, valid_batches
from strom.record.header import BatchHeader, read_header

_log = logging.getLogger("strom.log.cleaner")


#: Relative offsets in a segment's indexes are 32-bit (``strom.log.index``): no batch of a
#: merged segment may start further than this above the segment's base offset.
_MAX_RELATIVE_OFFSET = (1 << 31) - 1


class _Group:
    """A run of adjacent sealed segments that a pass rewrites into one file, named by the
    first one's base offset (Kafka's ``groupSegmentsBySize``).

    Why: rewritten one by one, a compacted log would keep one file, and one open
    descriptor, for every segment it ever rolled (a topic of one key: a segment of one empty
    batch per max.compaction.lag.ms), until the node ran out of descriptors. A segment joins the
    group before it while the group's rewritten bytes stay within segment.bytes, its batches
    within what segment.index.bytes indexes (each batch can add an entry to each index),
    and its offsets within the indexes' 32-bit relative offsets; segments that do not tile
    (a gap between them) or are empty start a group of their own. An empty batch ending one
    member and one starting the next merge as runs do inside a segment (:func:`_rewrite`),
    so merged segments keep no filler per former boundary and a second pass finds nothing
    to do.

    The bytes go to ``<first>.log.cleaned`` as they come, so a pass holds at most two
    segments, never the group: the first member's bytes are held until a second one joins
    (a segment left alone and unchanged is not written again), and the last batch written
    is held until the next member shows whether its first batch merges with it."""

    def __init__(
        self, log: Log, truncations: int, headers: set[int], removable: AbstractSet[int]
    ) -> None:
        self.log = log
        self.truncations = truncations
        self.headers = headers
        self.removable = removable
        self._reset()

    def _reset(self) -> None:
        self.segs: list[LogSegment] = []
        self.changed = False
        self.length = 0  # the group's bytes once written (boundary merges counted)
        self.batches = 0
        self._pieces = 0  # the members' rewritten bytes, before boundary merges
        self._first: bytes | None = None  # the first member's bytes, not looked into yet
        self._body: bytes | memoryview = b""  # ...or all of them but the last batch
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._written = 0
        self._tail = b""  # the last batch, held back (see the class docstring)
        self._tail_header: BatchHeader | None = None

    def fits(self, seg: LogSegment, data: bytes, batches: int) -> bool:
        """Whether ``seg``, rewritten to ``data`` (``batches`` batches), may join."""
        if not self.segs:
            return True
        cfg = self.log.config
        head, last = self.segs[0], self.segs[-1]
        if not (
            head.size > 0
            and seg.size > 0
            and last.next_offset == seg.base_offset
            and self.batches + batches <= min(cfg.max_index_entries, cfg.max_time_index_entries)
            and seg.next_offset - 1 - head.base_offset <= _MAX_RELATIVE_OFFSET
        ):
            return False
        self._split_first()
        return self.length + self._joined(data)[0] <= cfg.segment_bytes

    def _split_first(self) -> None:
        """Hold the first member's last batch apart from the rest (a second one may join)."""
        if self._first is None:
            return
        view = memoryview(self._first)
        self._first = None
        last = _last_batch(view)
        self._body, self._tail = view[:last], bytes(view[last:])
        self._tail_header = read_header(self._tail, 0)

    def _joined(self, data: bytes) -> tuple[int, bytes | None, BatchHeader]:
        """What ``data`` adds to the group's length, and the batch its first batch and the
        held last one merge into (None when they do not: see :func:`_rewrite`)."""
        first = read_header(data, 0)
        t = self._tail_header
        if (
            t is None
            or t.record_count
            or first.record_count
            or t.partition_leader_epoch != first.partition_leader_epoch
            or not _mergeable(t, self.headers, self.removable)
            or not _mergeable(first, self.headers, self.removable)
        ):
            return len(data), None, first
        merged = _empty_batch(t, first.last_offset, max(t.max_timestamp, first.max_timestamp), True)
        return len(data) - first.size - len(self._tail) + len(merged), merged, first

    def add(self, seg: LogSegment, data: bytes, changed: bool, batches: int) -> None:
        """Add ``seg``, rewritten to ``data`` (its own bytes when ``changed`` is false)."""
        self._pieces += len(data)
        self.batches += batches
        self.changed = self.changed or changed
        if not self.segs:
            self.segs.append(seg)
            self.length = len(data)
            self._first = data
            return
        self.segs.append(seg)
        self.changed = True  # merging segments is a change, even of unchanged ones
        self._split_first()
        if self._file is None:
            self._open()
            self._emit(self._body)
            self._body = b""
        added, merged, first = self._joined(data)
        self.length += added
        view = memoryview(data)
        start = 0
        if merged is not None:
            self._tail, self._tail_header = merged, read_header(merged, 0)
            start = first.size
            if start == len(view):
                return  # that batch was all of ``data``: the merged one stays held
        last = _last_batch(view)
        self._emit(self._tail)
        self._emit(view[start:last])
        self._tail = bytes(view[last:])
        self._tail_header = read_header(self._tail, 0)

    def _open(self) -> None:
        head = self.segs[0]
        self._path = head.log_path.with_name(head.log_path.name + ".cleaned")
        self._file = open(self._path, "wb")  # noqa: SIM115 (closed in finish or discard)

    def _emit(self, data: bytes | memoryview) -> None:
        assert self._file is not None
        self._file.write(data)
        self._written += len(data)

    def finish(self, stats: CleanerStats) -> bool:
        """Swap the group in (when it changed anything) and start a new one; False when the
        log changed under the pass (see :func:`_swap`)."""
        segs = self.segs
        if not segs or not self.changed:
            self._reset()
            return True
        if self._file is None:
            self._open()  # one segment, rewritten: the common case, written in one go
            if self._first is not None:
                self._emit(self._first)
            else:
                self._emit(self._body)
                self._emit(self._tail)
        else:
            self._emit(self._tail)
        assert self._file is not None and self._path is not None
        f = self._file
        f.flush()
        # The segment's last-append time decides when its tombstones go; a restart reads it
        # from the mtime, so the rewrite must not make the segment look freshly written. A
        # merged segment takes its newest member's: no tombstone goes before its own time.
        ns = max(s.last_append_ms for s in segs) * 1_000_000
        os.utime(f.fileno(), ns=(ns, ns))
        os.fsync(f.fileno())
        f.close()
        self._file = None
        path, written, pieces = self._path, self._written, self._pieces
        self._path = None
        self._reset()
        if not _swap(self.log, segs, path, written, self.truncations):
            return False
        stats.segments_cleaned += len(segs)
        stats.segments_merged += len(segs) - 1
        stats.bytes_after -= pieces - written  # boundary merges
        return True

    def discard(self) -> None:
        """Drop the group's unfinished file (a void pass, or an error such as a full disk:
        a partial ``.cleaned`` file would hold the disk's last free space until the next
        pass or restart)."""
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._reset()


def _last_batch(view: memoryview) -> int:
    """The position of the last batch of the whole batches in ``view``."""
    last = pos = 0
    while pos < len(view):
        last = pos
        pos += read_header(view, pos).size
    return last


def _swap(log: Log, segs: list[LogSegment], cleaned: Path, length: int, truncations: int) -> bool:
    """Replace the adjacent segments ``segs`` by the rewritten file ``cleaned`` (``length``
    bytes, written and fsynced), named by the first one's base offset, atomically with
    respect to a crash, and rebuild its indexes.

    Returns False (and changes nothing) when the log was truncated or one of the segments
    deleted since the cleaner read them. Raises :class:`CorruptLogError` (and changes
    nothing) when the new file would not recover whole: see :func:`_check_rewritten`.

    Kafka's order: ``.cleaned`` is renamed to ``.swap``, the replaced segments' files to
    ``.deleted``, then ``.swap`` to ``.log``, with a directory fsync after each step. A
    ``.swap`` on disk is the commitment: opening the log completes it, deleting every
    segment in the swap's offset range (``Log._finish_swaps``); before it exists, opening
    discards the ``.cleaned`` file. The ``.swap`` is made under the lock, after the check,
    so every ``.swap`` a start finds belongs to segments the log still held (not ones that
    retention deleted or a follower truncated meanwhile, which finishing it would bring
    back)."""
    head = segs[0]
    try:
        _check_rewritten(cleaned, head.base_offset, length, log.epochs.epoch_for)
    except CorruptLogError:
        cleaned.unlink(missing_ok=True)
        with log.lock:
            # Checked outside the lock: a truncation or deletion meanwhile may have moved the
            # epoch history under it. Then the pass is void, as below, not an error.
            if log.truncations != truncations or not _still_held(log, segs):
                return False
        raise
    except Exception:
        cleaned.unlink(missing_ok=True)  # no partial work left on disk (see _Group.discard)
        raise
    with log.lock:
        # The rewrite ran outside the lock. A truncation meanwhile (follower, new leader)
        # makes the key map wrong (its "latest" records may be gone) and may have cut these
        # segments; retention may have deleted them. Swapping then would bring back removed
        # data or drop values that are the latest again: discard the work instead.
        if log.truncations != truncations or not _still_held(log, segs):
            cleaned.unlink(missing_ok=True)
            return False
        directory = head.directory
        swap = head.log_path.with_name(head.log_path.name + ".swap")
        try:
            os.replace(cleaned, swap)
        except Exception:
            cleaned.unlink(missing_ok=True)
            raise
        fsync_dir(directory)
        i = log.segments.index(head)
        head.close()
        # The old segment's index must not be found beside the new file by a start after the
        # last rename: one that passed its sanity check would be trusted.
        head.index.path.unlink(missing_ok=True)
        retired: list[Path] = []
        for seg in segs[1:]:
            retired += seg.rename_for_delete()
        if log.config.file_delete_delay_ms > 0:
            # Keep the replaced file for file.delete.delay.ms, as Kafka does. A crash between
            # the two renames leaves the .swap without its .log: opening the log finishes it.
            old = head.log_path.with_name(head.log_path.name + DELETED_SUFFIX)
            os.replace(head.log_path, old)
            retired.append(old)
        if len(segs) > 1:
            # The merged segment must not appear beside the segments it replaces, even after
            # a power loss that kept the last rename but not the others.
            fsync_dir(directory)
        os.replace(swap, head.log_path)
        fsync_dir(directory)
        fresh = log._new_segment(head.base_offset)
        cut = fresh.recover(log.epochs.epoch_for)
        if cut:  # checked above: only the disk can have changed the file since
            _log.error("%s: the compacted segment lost %d bytes on reopening", fresh.log_path, cut)
        fresh.created_ms = head.created_ms
        fresh.last_append_ms = max(s.last_append_ms for s in segs)
        log.segments[i : i + len(segs)] = [fresh]
        log._bases[i : i + len(segs)] = [head.base_offset]
        log._schedule_delete(retired)
        return True


def _still_held(log: Log, segs: list[LogSegment]) -> bool:
    """Whether ``segs`` are still adjacent segments of ``log`` (none deleted or closed)."""
    try:
        i = log.segments.index(segs[0])
    except ValueError:
        return False
    held = log.segments[i : i + len(segs)]
    return len(held) == len(segs) and all(
        a is b and not a.closed for a, b in zip(held, segs, strict=True)
    )


def _check_rewritten(path: Path, base_offset: int, length: int, epoch_for: EpochLookup) -> None:
    """Raise :class:`CorruptLogError` unless the rewritten segment file at ``path`` recovers
    to all of its ``length`` bytes, by the rule recovery applies after the swap
    (:func:`strom.log.segment.valid_batches`).

    A safety net: a batch the rule refuses would be cut there by the
    swap's own recovery, with everything after it, on every replica at once, and the pass
    would still count the segment as cleaned. The old segment is kept instead, and the
    error reaches the storage node's log ("compacting <partition> failed") on every pass
    until the cause is fixed; the pass stops there, so what it cleaned is a prefix of the
    log, as a void pass leaves it."""
    if length == 0:
        return
    with open(path, "rb") as f, mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            valid = sum(h.size for h in valid_batches(view, base_offset, epoch_for))
        finally:
            view.release()
    if valid != length:
        raise CorruptLogError(
            f"{path}: the compacted segment would recover to {valid} of its {length} bytes "
            "(swap refused, the segment is kept as it was)"
        )
