"""One log segment: a ``.log`` file of whole batches plus its offset and time indexes.

A segment's batches tile its offset range: the first batch may start at or after the
segment's base offset, and each later batch starts exactly where the previous one ended.
That rule, and the leader epoch each batch must carry (from the epoch cache), are checked on
every read and during recovery. They cover the two header fields the CRC leaves out (base
offset and leader epoch), so with the CRC a corrupted byte anywhere in a batch is caught. The
CRC itself is taken once per batch and process (on the way in, by a recovery scan, or by the
first read that meets it: :mod:`strom.log.checked`), as Kafka's brokers take it on the way
in only; a byte that goes bad on disk after that is left to the reader's own CRC check.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import dataclasses
import logging
import mmap
import os
import struct
import weakref
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from strom.grpc_options import MAX_MESSAGE_BYTES
from strom.log.checked import CheckedRanges
from strom.log.errors import CorruptLogError, disk_full
from strom.log.index import OffsetIndex, TimeIndex
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    HEADER_SIZE,
    BatchHeader,
    check_header,
    header_at,
    read_header,
)

EpochLookup = Callable[[int], int]
_log = logging.getLogger("strom.log")
_IOV_MAX = 1024
#: Suffix of segment files waiting for their ``file.delete.delay.ms`` before the unlink.
DELETED_SUFFIX = ".deleted"
_FALLOC_FL_KEEP_SIZE = 1
#: At most this many of the newest batches keep their exact position in memory (see
#: :meth:`LogSegment.locate`); when full, the older half is dropped.
TAIL_BATCHES = 128
#: How much of the file :meth:`LogSegment.find_producer_batch` reads at a time.
HEADER_CHUNK_BYTES = 64 * 1024
#: A batch header's base offset and length, and its producer id, epoch and base sequence
#: (at byte 43 of the header; DESIGN §4).
_PREFIX = struct.Struct(">qi")
_PRODUCER_FIELDS = struct.Struct(">qhi")
_PRODUCER_AT = 43
#: The largest batch stored data may hold, checked on every re-read (reads, recovery, the
#: cleaner, follower appends). Fixed, not the topic's ``max.message.bytes``: that limit is
#: the leader's produce check only (as in Kafka), and lowering it must not make batches
#: accepted under an older, larger limit look corrupt (recovery cut them and everything
#: after, reads failed for good, followers could not copy them). Every batch in a log
#: arrived whole in one gRPC message (a Produce request or a follower's fetch answer), so
#: none is larger than the wire limit; a length above it is garbage (a torn or damaged
#: header), refused without reading hundreds of MiB behind it.
MAX_STORED_BATCH_BYTES = MAX_MESSAGE_BYTES


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate`` (Linux), or None where it is missing: preallocation is then a
    no-op. Python's ``os.posix_fallocate`` cannot keep the file size, which strom needs (the
    file size is the end of the valid data)."""
    try:
        # The running process's own symbols: libc on Linux, without searching the disk.
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_fallocate = _load_fallocate()


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def valid_batches(
    view: memoryview, base_offset: int, epoch_for: EpochLookup | None
) -> Iterator[BatchHeader]:
    """The headers of the batches of segment data ``view`` (a segment starting at
    ``base_offset``) up to the first one recovery would cut: a torn or damaged batch (header,
    length, CRC), one breaking the offset sequence, or one whose leader epoch the history
    (``epoch_for``; None skips that check) does not give its offset. Recovery and the
    cleaner's check of a rewritten segment use the same rule, so what the cleaner swaps in
    is exactly what a later recovery keeps. Lazy: a caller rebuilding the epoch history
    from the batches sees each before the next is checked."""
    pos = 0
    expected = base_offset
    while pos < len(view):
        try:
            h = read_header(view, pos)
            check_header(h, view, max_batch_bytes=MAX_STORED_BATCH_BYTES)
        except InvalidBatchError:
            return
        if h.base_offset != expected:
            return
        if epoch_for is not None and h.partition_leader_epoch != epoch_for(h.base_offset):
            return
        yield h
        expected = h.next_offset
        pos += h.size


class LogSegment:
    """A segment file and its indexes. Not thread-safe on its own: :class:`Log` serialises."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        stem = segment_name(base_offset)
        self.log_path = directory / f"{stem}.log"
        self.index = OffsetIndex(directory / f"{stem}.index", base_offset)
        self.time_index = TimeIndex(directory / f"{stem}.timeindex", base_offset)
        self.index_interval_bytes = index_interval_bytes
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        # A raw descriptor is not closed by the garbage collector as a file object is: a
        # segment dropped without close() (a log abandoned after an error, a test) would
        # hold its file open for the life of the process.
        self._fd_finalizer = weakref.finalize(self, os.close, self.fd)
        self.size = os.fstat(self.fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        #: The first batch's max timestamp (-1: none): segment.ms counts from it.
        self.first_batch_timestamp = -1
        self.record_count = 0  # records appended since open (flush.messages)
        #: Monotonic ms (``Log.monotonic``) when this process created or opened the segment:
        #: segment.ms counts from it while the segment has no first batch timestamp.
        self.created_ms = 0
        #: Wall-clock ms of the last append (the file's mtime until one in this process):
        #: retention deletes an active segment only once it has been idle that long too.
        self.last_append_ms = int(os.fstat(self.fd).st_mtime * 1000)
        self.roll_jitter_ms = 0  # segment.jitter.ms: this segment rolls this much earlier
        self.preallocated = False
        self._bytes_since_index = 0
        # The newest batches in file order (base offsets, positions): a suffix of the
        # segment's batches, restarted at each offset-index entry, at most TAIL_BATCHES.
        self._tail_bases = array("q")
        self._tail_positions = array("q")
        #: Where this process has taken the batches' CRC-32C (its appends, whose batches
        #: were checked on the way in, a recovery scan, its reads): reads take it elsewhere
        #: only. A segment opened from disk starts with none, so its first reads check all.
        self.crc_checked = CheckedRanges()
        self.closed = False

    # -- preallocation (the preallocate config) ---------------------------------------------

    def preallocate(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of disk for this segment without changing its size (Linux
        ``fallocate(FALLOC_FL_KEEP_SIZE)``): later appends land in blocks already allocated,
        and a full disk shows when the segment is created rather than mid-append. Returns
        False (nothing reserved) where the platform or file system cannot."""
        if _fallocate is None or self.closed:
            return False
        if _fallocate(self.fd, _FALLOC_FL_KEEP_SIZE, 0, nbytes) != 0:
            return False
        self.preallocated = True
        return True

    def release_preallocation(self) -> None:
        """Give back the reserved blocks past the data (when the segment stops being active):
        truncating to the current size frees what ``preallocate`` kept beyond it."""
        if self.preallocated and not self.closed:
            os.ftruncate(self.fd, self.size)
            self.preallocated = False

    # -- writing ---------------------------------------------------------------------------

    def append(
        self,
        pieces: Sequence[bytes | bytearray | memoryview],
        length: int,
        headers: Sequence[BatchHeader],
    ) -> None:
        """Write already-validated batches (offsets assigned), given as consecutive buffers
        totalling ``length`` bytes, at the end of the file with as few syscalls as possible."""
        position = self.size
        try:
            written = 0
            for i in range(0, len(pieces), _IOV_MAX):
                chunk = pieces[i : i + _IOV_MAX]
                n = os.pwritev(self.fd, chunk, position + written)
                want = sum(memoryview(c).nbytes for c in chunk)
                if n < want:
                    # A short write (a full disk answers so before it answers ENOSPC): write
                    # the rest, which either completes or raises the real error.
                    rest = memoryview(b"".join(chunk))[n:]
                    while rest:
                        k = os.pwrite(self.fd, rest, position + written + want - len(rest))
                        rest = rest[k:]
                written += want
            if written != length:
                raise OSError(f"wrote {written} of {length} bytes")
        except OSError as exc:
            # Nothing of this append stays on disk: the bytes past the log's end are cut, so
            # no torn batch is left behind (and the next append writes at the same place).
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, position)
            raise OSError(
                exc.errno, f"{exc.strerror or exc} (appending to {self.log_path})"
            ) from exc
        for h in headers:
            self._index_batch(h, position + h.position)
        self.size += length
        self.crc_checked.add(position, self.size)  # every caller checked these batches' CRCs

    def _index_batch(self, h: BatchHeader, position: int) -> None:
        if not self.index.rel or self._bytes_since_index >= self.index_interval_bytes:
            self.index.append(h.base_offset, position)
            self._bytes_since_index = 0
            self._set_tail(())
        self._add_tail(h.base_offset, position)
        self._bytes_since_index += h.size
        self.time_index.maybe_append(h.max_timestamp, h.base_offset)
        if self.first_batch_timestamp < 0:
            self.first_batch_timestamp = h.max_timestamp
        self.max_timestamp = max(self.max_timestamp, h.max_timestamp)
        self.next_offset = h.next_offset
        self.record_count += h.record_count

    def flush(self) -> None:
        """fsync data and indexes (called from a worker thread, never the event loop)."""
        if self.closed:
            return
        os.fsync(self.fd)
        self.index.flush(fsync=True)
        self.time_index.flush(fsync=True)

    def close(self) -> None:
        """Flush the indexes and close the file; the file is closed even when an index
        write fails (a full disk), and that error is raised after."""
        if not self.closed:
            try:
                self.release_preallocation()
                self.index.flush()
                self.time_index.flush()
            finally:
                self._close_fd()

    def abandon(self) -> None:
        """Close the file without flushing anything: what a killed process leaves behind
        (the crash-recovery tests use it)."""
        self._close_fd()

    def _close_fd(self) -> None:
        self._fd_finalizer()  # closes the descriptor once, whoever calls first
        self.closed = True

    def rename_for_delete(self) -> list[Path]:
        """Close the segment and rename its files to ``<name>.deleted`` (Kafka's asynchronous
        delete); returns the new paths, which the caller unlinks after
        ``file.delete.delay.ms``. A crash before that is harmless: opening a log removes
        ``.deleted`` files."""
        if not self.closed:
            self.release_preallocation()
            self._close_fd()
        out: list[Path] = []
        for p in (self.log_path, self.index.path, self.time_index.path):
            target = p.with_name(p.name + DELETED_SUFFIX)
            try:
                os.replace(p, target)
            except FileNotFoundError:
                continue
            out.append(target)
        return out

    def delete(self) -> None:
        if not self.closed:
            self._close_fd()
        for p in (self.log_path, self.index.path, self.time_index.path):
            p.unlink(missing_ok=True)

    # -- the newest batches' positions ------------------------------------------------------

    def _add_tail(self, base: int, position: int) -> None:
        if len(self._tail_bases) >= TAIL_BATCHES:
            half = TAIL_BATCHES // 2
            del self._tail_bases[:half], self._tail_positions[:half]
        self._tail_bases.append(base)
        self._tail_positions.append(position)

    def _set_tail(self, headers: Sequence[BatchHeader]) -> None:
        """The newest batches are ``headers`` (file positions, in file order, ending at EOF)."""
        self._tail_bases = array("q")
        self._tail_positions = array("q")
        for h in headers[-TAIL_BATCHES:]:
            self._add_tail(h.base_offset, h.position)

    # -- reading ---------------------------------------------------------------------------

    def _header_at(self, position: int) -> BatchHeader:
        return dataclasses.replace(self._read_header_at(position), position=position)

    def _read_header_at(self, position: int) -> BatchHeader:
        """The header of the batch at file ``position`` (its ``position`` field left at 0)."""
        raw = os.pread(self.fd, HEADER_SIZE, position)
        try:
            return read_header(raw, 0)
        except InvalidBatchError as exc:
            raise CorruptLogError(f"{self.log_path}: {exc} at position {position}") from None

    def locate(self, offset: int) -> tuple[int, int] | None:
        """(position, base offset) of the batch holding ``offset``, or of the first batch after
        it; None when the segment holds nothing at or after ``offset``."""
        if offset >= self.next_offset:
            return None
        bases = self._tail_bases
        if bases and offset >= bases[0]:
            # A caught-up reader asks for one of the newest batches: its position is known,
            # where the offset index would leave a walk over up to index.interval.bytes of
            # headers (a pread each). The read that follows checks the base offset found.
            i = bisect.bisect_right(bases, offset) - 1
            return self._tail_positions[i], bases[i]
        expected, pos = self.index.lookup(offset)
        while pos < self.size:
            h = self._read_header_at(pos)
            if h.base_offset != expected:
                raise CorruptLogError(
                    f"{self.log_path}: batch at position {pos} has base offset "
                    f"{h.base_offset}, expected {expected}"
                )
            if h.next_offset > offset:
                return pos, h.base_offset
            expected = h.next_offset
            pos += h.size
        return None

    def read(
        self,
        position: int,
        expected_base: int,
        max_bytes: int,
        max_offset: int,
        epoch_for: EpochLookup,
        min_one: bool,
    ) -> tuple[bytes | memoryview, int]:
        """Read whole batches from ``position`` up to ``max_bytes`` and below ``max_offset``.

        Returns (data, next offset after the returned batches): data is a view of the one
        read buffer when the read ends before it (no copy). Every returned batch is
        checked (contiguity from ``expected_base``, leader epoch, header sanity, and its
        CRC unless this process took it already: ``crc_checked``); a failure
        raises :class:`CorruptLogError` instead of serving bad bytes when it is the first
        batch of the read, and otherwise ends the read before it (the batches before the
        damage are served; the read that starts at it raises). A CRC is taken once
        per process, as Kafka's brokers take it on the way in only: a byte that goes bad on
        disk after that is caught by the consumer's own CRC check (and a follower's).
        """
        want = min(max_bytes, self.size - position)
        chunk = os.pread(self.fd, max(want, HEADER_SIZE if min_one else 0), position)
        view = memoryview(chunk)
        pos = 0
        expected = expected_base
        checked = self.crc_checked.until(position)
        while pos < len(view):
            if len(view) - pos < HEADER_SIZE:
                break
            h = read_header(view, pos)
            try:
                # The offset sequence is checked before the bound (the rest in _verify): a
                # damaged base offset must raise, not end the read early.
                if h.base_offset != expected:
                    raise CorruptLogError(
                        f"{self.log_path} position {position + pos}: batch base offset "
                        f"{h.base_offset} breaks the offset sequence (expected {expected})",
                        offset=expected,
                    )
                if h.base_offset >= max_offset:
                    break
                if h.size > len(view) - pos:
                    if pos == 0 and min_one:
                        if position + h.size > self.size:
                            raise CorruptLogError(
                                f"{self.log_path}: batch at {position} runs past EOF",
                                offset=expected,
                            )
                        chunk = os.pread(self.fd, h.size, position)
                        view = memoryview(chunk)
                        h = read_header(view, 0)
                    else:
                        break
                self._verify(h, view, epoch_for, position, position + pos + h.size > checked)
            except CorruptLogError:
                if pos == 0:
                    raise
                # Good batches came before the bad one: serve them, as Kafka's broker
                # serves the bytes and its consumer returns the records before the damage.
                # The next read starts at the bad batch and raises there (counted, and the
                # leader hands over), so a consumer gets everything up to the damage.
                break
            expected = h.next_offset
            pos += h.size
            if pos >= max_bytes:
                break
        self.crc_checked.add(position, position + pos)
        if pos == len(chunk):
            return chunk, expected
        if pos * 2 < len(chunk):
            # Mostly unused (the read stopped at the high watermark): a view would keep the
            # whole buffer alive while the answer waits, so the small part is copied.
            return bytes(view[:pos]), expected
        # A view, not a copy: the fetch answer is joined once around it anyway (a copy of
        # every byte served here was 8 % of a node's CPU serving a lagging consumer).
        return view[:pos], expected

    def _verify(
        self,
        h: BatchHeader,
        view: memoryview,
        epoch_for: EpochLookup,
        file_position: int,
        crc: bool = True,
    ) -> None:
        where = f"{self.log_path} position {file_position + h.position}"
        try:
            check_header(h, view, verify_crc=crc, max_batch_bytes=MAX_STORED_BATCH_BYTES)
        except InvalidBatchError as exc:
            raise CorruptLogError(f"{where}: {exc}", offset=h.base_offset) from None
        if h.partition_leader_epoch != epoch_for(h.base_offset):
            raise CorruptLogError(
                f"{where}: batch leader epoch {h.partition_leader_epoch} does not match the "
                f"epoch history ({epoch_for(h.base_offset)} at offset {h.base_offset})",
                offset=h.base_offset,
            )

    def batch_headers(self, start_position: int = 0) -> list[BatchHeader]:
        """Headers of the batches from ``start_position`` (positions are file positions)."""
        out: list[BatchHeader] = []
        pos = start_position
        while pos < self.size:
            h = self._header_at(pos)
            # A garbage length shorter than a header moved ``pos`` backwards (pread at a
            # negative position: OSError out of Log.__init__) or not at all (endless loop).
            if h.size < HEADER_SIZE:
                raise CorruptLogError(
                    f"{self.log_path}: batch at position {pos} has length {h.batch_length}"
                )
            out.append(h)
            pos += h.size
        return out

    def find_producer_batch(
        self,
        position: int,
        last_base: int,
        key: tuple[int, int, int],
        max_headers: int,
        max_bytes: int,
    ) -> tuple[BatchHeader | None, int, int]:
        """Walk the batch headers from file ``position`` while their base offset is at most
        ``last_base``, for the first batch whose (producer id, producer epoch, base sequence)
        is ``key``; stop after ``max_headers`` headers or ``max_bytes`` of batches walked.
        Returns (its header or None, headers walked, bytes walked).

        For ``Log._find_older_batch`` (a retry older than its producer's kept batches), so
        bounded and cheap: ``HEADER_CHUNK_BYTES`` of file per ``pread`` (the headers of every
        small batch in it at once; a batch larger than a chunk costs a ``pread`` of its own)
        and only the prefix and producer fields parsed per header, never a record."""
        pid, epoch, seq = key
        pos, buf, buf_at = position, b"", position
        walked = headers = 0
        while pos < self.size and headers < max_headers and walked < max_bytes:
            i = pos - buf_at
            if i + HEADER_SIZE > len(buf):
                buf = os.pread(self.fd, min(HEADER_CHUNK_BYTES, self.size - pos), pos)
                buf_at, i = pos, 0
                if len(buf) < HEADER_SIZE:
                    raise CorruptLogError(
                        f"{self.log_path}: truncated header ({len(buf)} of {HEADER_SIZE} "
                        f"bytes) at position {pos}"
                    )
            base, length = _PREFIX.unpack_from(buf, i)
            if base > last_base:
                break
            if length < HEADER_SIZE - _PREFIX.size:  # (see batch_headers)
                raise CorruptLogError(
                    f"{self.log_path}: batch at position {pos} has length {length}"
                )
            if _PRODUCER_FIELDS.unpack_from(buf, i + _PRODUCER_AT) == (pid, epoch, seq):
                return header_at(buf, i, pos), headers, walked
            headers += 1
            walked += _PREFIX.size + length
            pos += _PREFIX.size + length
        return None, headers, walked

    # -- recovery --------------------------------------------------------------------------

    def recover(
        self, epoch_for: EpochLookup | None, on_batch: Callable[[BatchHeader], None] | None = None
    ) -> int:
        """Re-read every batch, rebuild both indexes, and truncate at the first bad batch.

        ``epoch_for`` checks leader epochs (None skips that check when the epoch history is
        being rebuilt from the batches, reported through ``on_batch``).
        Returns the bytes truncated.
        """
        self.index.rel, self.index.pos = self.index.rel[:0], self.index.pos[:0]
        self.time_index.ts, self.time_index.rel = self.time_index.ts[:0], self.time_index.rel[:0]
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.first_batch_timestamp = -1
        self._bytes_since_index = 0
        self._set_tail(())
        valid = 0
        if self.size:
            with mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                try:
                    for h in valid_batches(view, self.base_offset, epoch_for):
                        if on_batch is not None:
                            on_batch(h)
                        self._index_batch(h, valid)
                        valid += h.size
                finally:
                    view.release()
        truncated = self.size - valid
        if truncated:
            os.ftruncate(self.fd, valid)
            self.size = valid
        self.crc_checked = CheckedRanges()
        self.crc_checked.add(0, valid)
        self._rewrite_indexes()
        self.record_count = 0
        return truncated

    def _rewrite_indexes(self) -> None:
        """Write both rebuilt indexes to their files. On a full disk the segment goes on
        with them in memory: the files only save the next start a scan, and refusing to
        open the log kept a node that a full disk had stopped from starting again, in a
        loop. Both files are removed then (a removal needs no space,
        and a half-written one must not be trusted later); the next flush writes them
        whole."""
        try:
            self.index.rewrite()
            self.time_index.rewrite()
        except OSError as exc:
            if not disk_full(exc):
                raise
            for idx in (self.index, self.time_index):
                with contextlib.suppress(OSError):
                    idx.path.unlink(missing_ok=True)
                idx.forget_written()
            _log.warning("%s; keeping the segment's indexes in memory only", exc)

    def load_trusted(self) -> bool:
        """Open a segment below the recovery point from its indexes, reading only the tail.

        Returns False when an index fails its sanity check; the caller then recovers the
        segment in full instead.
        """
        if not self.index.load(self.size):
            return False
        last_base, pos = self.index.last()
        self._bytes_since_index = 0
        self.next_offset = self.base_offset
        try:
            tail = self.batch_headers(pos)
        except CorruptLogError:
            return False
        if self.size and (not tail or tail[0].base_offset != last_base):
            return False
        # The tail must tile and end exactly at EOF. A last batch running past EOF (torn)
        # or garbage after it was trusted: the torn batch set next_offset, and reads failed.
        expected, end = last_base, pos
        for h in tail:
            if h.base_offset != expected:
                return False
            expected, end = h.next_offset, end + h.size
        if end != self.size:
            return False
        if tail:
            self.next_offset = tail[-1].next_offset
        if not self.time_index.load(max(self.next_offset, self.base_offset + 1)):
            return False
        # An emptied or shortened .timeindex passed its sanity
        # check, and offset-by-time lookups then skipped the segment (6200 instead of 6000).
        # Every rise of the running max timestamp has an entry, the first batch's included,
        # so a complete index is not empty for a non-empty segment and its last entry is at
        # least every batch's max timestamp (the tail's are at hand).
        if self.size and not self.time_index.ts:
            return False
        if any(h.max_timestamp > self.time_index.ts[-1] for h in tail):
            return False
        self.max_timestamp = max([self.time_index.max_timestamp] + [h.max_timestamp for h in tail])
        if self.time_index.ts:
            self.first_batch_timestamp = self.time_index.ts[0]
        for h in tail:
            self._bytes_since_index += h.size
        self._set_tail(tail)
        return True

    @property
    def indexed_past_end(self) -> int | None:
        """After a failed :meth:`load_trusted`: the largest batch offset its index files
        listed beyond the data the ``.log`` file holds (evidence of lost data, see
        ``Log._load``); None when they listed none."""
        found = [o for o in (self.index.past_end, self.time_index.past_end) if o is not None]
        return max(found) if found else None

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset``; return the bytes removed."""
        found = self.locate(offset)
        if found is None:
            return 0
        pos, batch_base = found
        removed = self.size - pos
        os.ftruncate(self.fd, pos)
        self.size = pos
        self.crc_checked.cut(pos)
        self.index.truncate_to_position(pos)
        # Rebuild the in-memory tail state (next offset, max timestamp) from the indexes.
        self.time_index.truncate_to_offset(batch_base)
        if pos == 0:
            self.next_offset = self.base_offset
            self.max_timestamp = -1
            self.first_batch_timestamp = -1
            self._bytes_since_index = 0
            self._set_tail(())
        else:
            last_base, ipos = self.index.last()
            tail = self.batch_headers(ipos)
            self._set_tail(tail)
            # What the next index entry counts from: the surviving batches after the last
            # entry (the removed ones must not bring it forward).
            self._bytes_since_index = sum(h.size for h in tail)
            self.next_offset = tail[-1].next_offset if tail else last_base
            self.max_timestamp = max(
                [self.time_index.max_timestamp] + [h.max_timestamp for h in tail]
            )
        return removed
