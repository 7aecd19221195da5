"""Retries of idempotent batches: finding the batch a retry repeats, and its size rule.

:class:`DuplicateLookup` is mixed into :class:`strom.log.partition_log.Log`. ``Log.append``
asks the producer state whether its batches repeat ones already appended (DESIGN §6); for a
retry older than every batch the state keeps of its producer, the state calls
``_find_older_batch``, a bounded walk of batch headers before where the batch would lie.
A batch over max.message.bytes that repeats an appended one is answered as the duplicate it
is instead of refused for its size (``_repeats_over_limit``, :func:`refuse_over_limit`), and
the repeated batches of one request must lie together in the log (:func:`check_consecutive`).
None of it runs on the produce hot path: only for a retry, or a batch found too large.
"""

from __future__ import annotations

import bisect
import itertools
import threading

from strom.log.producer_state import (
    DUPLICATE_SEQUENCE,
    MAX_SEQUENCE,
    BatchMetadata,
    ProducerEntry,
    ProducerStateError,
    ProducerStateManager,
)
from strom.log.segment import MAX_STORED_BATCH_BYTES, LogSegment
from strom.record.errors import InvalidBatchError
from strom.record.header import BatchHeader, read_header, scan_batches

#: How far the search for a retried batch older than every batch its producer's state keeps
#: (``Log._find_older_batch``) may walk: from at most this many offsets before where the
#: batch would lie were its producer's records contiguous, at most this many headers and this
#: many bytes of log (the bytes nearest that place: the pages a cold walk may read). Why
#: these: a walk runs under the log's lock, and on the node's event loop for a small request
#: (``strom.storage.writer``); 100,000 headers of one-record batches took 42-68 ms on a
#: loaded 2-core machine (headers only, 64 KiB per ``pread``), and 64 MiB of 2 KB records
#: (some 30,000 headers) 17-25 ms. A walk happens only for a retry the kept batches do not
#: answer (after a failover or lost answers) whose batch is not exactly where contiguous
#: records put it (checked first: one offset-index lookup); it covers a producer's batches
#: with up to 100,000 records of others between them. A retry can never make the node read
#: more.
OLDER_BATCH_SEARCH_OFFSETS = 100_000
OLDER_BATCH_SEARCH_HEADERS = 100_000
OLDER_BATCH_SEARCH_BYTES = 64 << 20


class DuplicateLookup:
    """The log's answers to retried idempotent batches that its producer state alone does
    not give: where an older repeated batch lies, and whether a batch over the size limit
    repeats one.

    A mixin rather than an object of its own: the walk reads the log's segments and offset
    indexes under the log's lock, as ``append`` (its only caller) holds them. Every
    attribute is set by ``Log.__init__``; the annotations say which ones it uses.
    """

    # -- set by Log.__init__ ---------------------------------------------------------------
    lock: threading.RLock
    segments: list[LogSegment]
    _bases: list[int]
    log_start_offset: int
    producers: ProducerStateManager

    def _find_older_batch(
        self, entry: ProducerEntry, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        """The batch of ``entry``'s producer (same id and epoch) with exactly the sequences
        ``first_seq``..``last_seq``, written before every batch the producer state keeps of
        it; None when a bounded walk of batch headers does not find it. Called under the
        lock, only by :meth:`append` for a retry the state would answer
        ``DUPLICATE_SEQUENCE`` (written, offsets forgotten): never on the produce hot path.

        Why: the state keeps a producer's last ``BATCHES_KEPT`` (5) batches, but the Python
        producer may have many more of a partition unanswered, and after a failover it
        retries them all; an answer without offsets became offset -1 for acknowledged
        records (30 of 192,100). Keeping more batches per producer costs
        memory for every producer and partition; the log already holds the answer.

        Where: records take one offset and one sequence each, so the ``d`` sequences from
        ``first_seq`` to the oldest kept batch's take at least ``d`` offsets, and the batch
        starts at or before ``hi`` = that batch's base offset - ``d`` (exactly there when
        nobody else wrote in between, checked first: one offset-index lookup). Otherwise the
        headers from ``hi`` - :data:`OLDER_BATCH_SEARCH_OFFSETS` up to ``hi`` are walked,
        at most :data:`OLDER_BATCH_SEARCH_HEADERS` headers, over the
        :data:`OLDER_BATCH_SEARCH_BYTES` of log nearest ``hi`` at most (those bounds say
        why). Headers only (their prefix and producer fields): no record is read. A batch
        the cleaner removed, one below the log start, or a range no batch has (half of a
        split batch) is not found."""
        oldest = entry.batches[0]
        distance = (oldest.first_seq - first_seq) & MAX_SEQUENCE
        hi = oldest.base_offset - distance
        if hi < self.log_start_offset:
            return None
        key = (entry.producer_id, entry.epoch, first_seq)
        found = self._walk_headers(hi, hi, key)  # the producer's records contiguous
        if found is None:
            lo = max(hi - OLDER_BATCH_SEARCH_OFFSETS, self.log_start_offset)
            found = self._walk_headers(self._walk_start(lo, hi), hi, key)
        if (
            found is None
            or found.last_sequence != last_seq
            or found.base_offset < self.log_start_offset
        ):
            return None  # (no other batch of the epoch has that base sequence)
        return BatchMetadata(
            first_seq, last_seq, found.base_offset, found.last_offset, found.max_timestamp
        )

    def _walk_start(self, lo: int, hi: int) -> int:
        """Where a walk of the headers up to offset ``hi`` starts: at ``lo`` or after it,
        where the offset indexes say at most :data:`OLDER_BATCH_SEARCH_BYTES` of log lie
        between it and ``hi``, so that a walk the byte bound stops has seen the batches
        nearest ``hi`` (where a producer's older batch most likely is), not the farthest."""
        budget = OLDER_BATCH_SEARCH_BYTES
        i = max(bisect.bisect_right(self._bases, hi) - 1, 0)
        found = self.segments[i].locate(hi)
        end = found[0] if found is not None else self.segments[i].size  # bytes before hi
        after = hi  # the first offset after the part of the segment counted
        while i >= 0:
            seg = self.segments[i]
            if seg.base_offset <= lo and end <= budget:
                return lo
            if end >= budget:  # the start lies in this segment: its first indexed batch there
                j = bisect.bisect_left(seg.index.pos, end - budget)
                start = seg.base_offset + seg.index.rel[j] if j < len(seg.index.pos) else after
                return min(max(lo, start), hi)
            budget -= end
            after = seg.base_offset
            i -= 1
            end = self.segments[i].size if i >= 0 else 0
        return lo

    def _walk_headers(self, lo: int, hi: int, key: tuple[int, int, int]) -> BatchHeader | None:
        """The header of the first batch from the one holding offset ``lo`` up to base
        offset ``hi`` with (producer id, epoch, base sequence) ``key``; None when none has
        within :data:`OLDER_BATCH_SEARCH_HEADERS` headers and
        :data:`OLDER_BATCH_SEARCH_BYTES` of log."""
        headers, walked = OLDER_BATCH_SEARCH_HEADERS, OLDER_BATCH_SEARCH_BYTES
        i = max(bisect.bisect_right(self._bases, lo) - 1, 0)
        for seg in self.segments[i:]:
            if seg.base_offset > hi or headers <= 0 or walked <= 0:
                break
            at = seg.locate(max(lo, seg.base_offset))
            if at is None:
                continue
            found, n, size = seg.find_producer_batch(at[0], hi, key, headers, walked)
            if found is not None:
                return found
            headers, walked = headers - n, walked - size
        return None

    def _repeats_over_limit(
        self, data: bytes | bytearray | memoryview, position: int, limit: int
    ) -> list[BatchHeader]:
        """The produced batches of ``data``, one of which (at byte ``position``) is larger than
        max.message.bytes: raises MESSAGE_TOO_LARGE (:class:`InvalidBatchError`) unless every
        batch over the limit repeats one its idempotent producer appended and the producer
        state remembers (same producer id, epoch and sequence range).

        Why a repeat is not refused for its size: it is answered with its original offsets
        and never written again, so the limit has nothing to protect, while refusing it hid
        that it was written. The topic's limit may have been lowered after it was appended
        (and its answer lost to a failover); the producer would then split it, and the leader
        refuse the halves (OUT_OF_ORDER_SEQUENCE), so that the records, written, failed.
        Kafka checks the size first; strom answers the retry as the duplicate it is.

        Only the size check moves: every other check keeps its place. A batch over the limit
        that is no repeat is refused for its size before anything else is looked at, as
        before. A repeat still passes, before it is answered, the structure and CRC checks
        (here), the timestamp, control and transactional checks, the leader epoch check and
        the producer-state check (``ProducerStateManager.check``, which looks at the
        producer's epoch and fencing first); ``append`` then calls
        :func:`refuse_over_limit` again under the lock, should the state have forgotten the
        batch in between. Costs nothing on the hot path: this runs only after a batch was
        found too large, and scans the headers again only when that batch is idempotent."""
        h = read_header(data, position)
        if h.producer_id < 0 or h.base_sequence < 0:
            raise _too_large(h, limit)
        try:
            headers = scan_batches(
                data, producer_batch=True, max_batch_bytes=MAX_STORED_BATCH_BYTES
            )
        except InvalidBatchError:
            raise _too_large(h, limit) from None  # the size refusal came first, as always
        with self.lock:
            refuse_over_limit(headers, self.producers.repeats(headers), limit)
        return headers


def check_consecutive(dups: list[BatchMetadata]) -> None:
    """Raise ``DUPLICATE_SEQUENCE`` (written, offsets not given) when repeated batches are not
    consecutive in the log: the answer has one base offset for the request, from which the
    producer counts each batch's records, so a gap (another producer's records between two
    of them, more likely now that batches older than the kept ones are found in the log)
    would give later records wrong offsets. Never the case for a request retried as it was
    first sent (its batches were written together)."""
    for a, b in itertools.pairwise(dups):
        if a.last_offset + 1 != b.base_offset:
            raise ProducerStateError(
                DUPLICATE_SEQUENCE,
                f"the batches repeat ones appended at offsets {dups[0].base_offset}.."
                f"{dups[-1].last_offset} with others' records between them (after offset "
                f"{a.last_offset}): written once, but one base offset can not answer for them",
                written_by=max(d.last_offset for d in dups),
            )


def _too_large(h: BatchHeader, limit: int) -> InvalidBatchError:
    """MESSAGE_TOO_LARGE for a produced batch over the topic's max.message.bytes."""
    return InvalidBatchError(
        f"batch at byte {h.position} is {h.size} bytes, more than the topic's "
        f"max.message.bytes={limit}",
        position=h.position,
        too_large=True,
    )


def refuse_over_limit(headers: list[BatchHeader], start: int, limit: int) -> None:
    """Raise MESSAGE_TOO_LARGE for the first batch from index ``start`` on that is larger
    than ``limit`` (the batches before ``start`` repeat appended ones: see
    ``Log._repeats_over_limit``). Runs only after the scan found a batch too large."""
    for h in headers[start:]:
        if h.size > limit:
            raise _too_large(h, limit)
