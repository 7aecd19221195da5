"""Durable shard writes, batched: one append in flight per shard, and everything that queued
behind it goes out together as the next one (group commit, DESIGN §7).

Why. Every group change and offset commit must be in the shard's log (acks=all) before its RPC
is answered. Holding the shard lock across each append made a busy shard pay one Produce round
trip per commit, one after another: a hundred members committing at once cost a hundred
appends in a row. Now an operation runs its engine step under the shard lock, queues its
records and lets the lock go; the shard's writer appends whatever has queued while the
previous append was in flight as one batch. A thousand commits arriving together cost a few
appends, and each is answered when the batch holding its records is durable.

What stays true:

- Order. Records reach the log in the order the engine produced them (one queue, one writer,
  one append in flight), so the idempotent producer's sequences stay consecutive.
- All or nothing, in order. If an append fails, it and everything queued after it fail with
  the same error (their engine steps saw state that now may never be durable), and the shard
  reloads from the log, which decides what is true. The error says what happened: a lost
  shard NOT_COORDINATOR; an append the leader refused for good (:class:`AppendRefused`:
  INVALID_TIMESTAMP, MESSAGE_TOO_LARGE, ...) UNKNOWN_SERVER_ERROR naming the refusal, logged
  once (until an append succeeds again): it is no reason to call the shard loading or moved
  (a client told so retries for its whole timeout); any other failure (no leader took the
  batch in time) REQUEST_TIMED_OUT, retriable.
- Nothing is answered from state that is not durable. An operation that changes nothing
  (a heartbeat, an OffsetFetch) still waits for the writes queued before it (:meth:`_durable`),
  so it never reports a join or a commit that a failed append then takes back.
- A caller that gives up (deadline, cancelled RPC) does not abandon its append: the writer
  owns it and counts its sequences whatever the caller does.
- A write queued in one generation of the shard is never appended in another (after a reload
  the producer epoch and the state are new): it fails with NOT_COORDINATOR instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field

from strom.coordinator import metrics
from strom.coordinator.offsets_log import GroupRecord, encode_group_batch
from strom.coordinator.shards import Shard
from strom.coordinator.storage_io import (
    AppendRefused,
    ShardLost,
    StorageIO,
    failure_line,
    storage_unreachable,
)
from strom.errors import (
    NotCoordinatorError,
    RequestTimedOutError,
    StromError,
    UnknownServerError,
    error_name,
)

log = logging.getLogger("strom.coordinator")

#: Most records one append carries by default (``--max-write-batch-records``).
MAX_BATCH_RECORDS = 4096
#: Most key and value bytes one append carries (at least one write, however large): far below
#: the node's message limit, whatever the records are.
MAX_BATCH_BYTES = 1 << 20


@dataclass
class QueuedWrite:
    """One operation's records, waiting for (or in) an append."""

    records: list[GroupRecord]
    generation: int
    size: int
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ShardWrites(StorageIO):
    """Queue a shard's writes and append them in batches (see the module docstring)."""

    max_write_batch_records: int = MAX_BATCH_RECORDS

    def _queue_write(self, shard: Shard, records: list[GroupRecord]) -> asyncio.Future[None]:
        """Queue ``records`` (call with the shard lock held, right after the engine step that
        made them); the future is done when they are durable, or failed."""
        size = sum(len(k or b"") + len(v or b"") for k, v in records)
        w = QueuedWrite(list(records), shard.generation, size)
        shard.writes.append(w)
        shard.write_tail = w.done
        if shard.writer is None or shard.writer.done():
            shard.writer = self._spawn(self._drain(shard))
            shard.writer.add_done_callback(functools.partial(_writer_ended, shard))
        return w.done

    async def _write(self, shard: Shard, records: list[GroupRecord]) -> None:
        """Queue ``records`` and wait until they are durable (raises the write's error); a
        cancelled waiter leaves the write to the writer."""
        await asyncio.shield(self._queue_write(shard, records))

    @staticmethod
    async def _durable(shard: Shard) -> None:
        """Wait until every write queued so far on ``shard`` is durable (raises its error)."""
        tail = shard.write_tail
        if tail is not None:
            await asyncio.shield(tail)

    async def _drain(self, shard: Shard) -> None:
        """The shard's writer: append what is queued, a batch at a time, until nothing is."""
        while shard.writes:
            batch = _take(shard, self.max_write_batch_records, MAX_BATCH_BYTES)
            generation = batch[0].generation
            if generation != shard.generation or self._stopping:
                _fail(batch, NotCoordinatorError, f"shard {shard.index} was reloaded or moved")
                continue
            records = [r for w in batch for r in w.records]
            try:
                await self._append(shard, records)
                if shard.generation == generation:
                    shard.next_sequence = (shard.next_sequence + len(records)) & 0x7FFFFFFF
                    shard.durable.apply_records(records)
                shard.refused = None
            except BaseException as exc:
                self._after_failed_append(shard, generation, batch, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            kind = shard.kind.name if shard.kind is not None else "group"
            metrics.WRITES.labels(kind, "operations").inc()
            metrics.WRITE_OPERATIONS.labels(kind).inc(len(batch))
            for w in batch:
                if not w.done.done():
                    w.done.set_result(None)

    async def _append(self, shard: Shard, records: list[GroupRecord]) -> None:
        batch = encode_group_batch(
            records,
            producer_id=shard.producer_id,
            producer_epoch=shard.producer_epoch,
            base_sequence=shard.next_sequence,
        )
        await self._produce(shard.index, batch, shard.topic)

    def _after_failed_append(
        self, shard: Shard, generation: int, batch: list[QueuedWrite], exc: BaseException
    ) -> None:
        """Fail the batch and everything queued behind it; drop or reload the shard."""
        later, shard.writes = shard.writes, []
        # Whoever waits on these failures holds them already; the next generation's
        # operations must not (they would fail until something is written again).
        shard.write_tail = None
        if isinstance(exc, ShardLost):
            _fail(batch + later, NotCoordinatorError, f"shard {shard.index} moved elsewhere")
        elif isinstance(exc, AppendRefused):
            self._note_refusal(shard, exc)
            _fail(
                batch + later,
                UnknownServerError,
                f"coordinator {self.coordinator_id} could not write this change to "
                f"{shard.topic}-{shard.index}: {exc.message}; nothing of it was written",
            )
        elif isinstance(exc, asyncio.CancelledError):
            _fail(batch + later, NotCoordinatorError, f"coordinator {self.coordinator_id} stops")
        else:
            message = exc.message if isinstance(exc, StromError) else f"write failed: {exc}"
            if storage_unreachable(exc):
                # Name the cause: the client's next attempts meet the reload (and, if it
                # lasts, COORDINATOR_NOT_AVAILABLE saying the nodes do not answer).
                message = (
                    f"coordinator {self.coordinator_id} could not write this change to "
                    f"{shard.topic}-{shard.index}: the storage nodes did not take it "
                    f"({message}); it may or may not have been written"
                )
            _fail(batch + later, RequestTimedOutError, message)
        if shard.generation != generation or self._stopping:
            return  # already reloading or dropped: that is the log's business now
        if isinstance(exc, ShardLost):
            log.warning("shard %d fenced (%s); dropping it", shard.index, exc)
            self._unload(shard)
        elif not isinstance(exc, asyncio.CancelledError):
            if not isinstance(exc, AppendRefused):  # (that one is logged once, above)
                log.warning("write to shard %d failed (%s); reloading it", shard.index, exc)
            if shard.kind is not None and shard.kind.shards.get(shard.index) is shard:
                self._start_load(shard)
                if storage_unreachable(exc):
                    # Its clients are told why from now on, not once the reload's first
                    # attempt failed too (which takes as long again).
                    shard.unreachable = failure_line(exc)

    def _note_refusal(self, shard: Shard, exc: AppendRefused) -> None:
        """Log an append the leader refused for good, once per shard and error code until an
        append succeeds again: every client retry meets it again, and a line per write
        would bury it."""
        if shard.refused == exc.code:
            return
        shard.refused = exc.code
        log.error(
            "%s: the storage node refused coordinator %d's append with %s (%s); the "
            "requests whose changes it held fail with UNKNOWN_SERVER_ERROR naming it, and "
            "the shard reloads (its requests get COORDINATOR_LOAD_IN_PROGRESS with this "
            "reason until a load succeeds)",
            f"{shard.topic}-{shard.index}",
            self.coordinator_id,
            error_name(exc.code),
            exc.message,
            extra={"fields": {"shard": shard.index}},
        )


def _take(shard: Shard, most: int, most_bytes: int) -> list[QueuedWrite]:
    """The next batch: queued writes of one generation, up to ``most`` records and
    ``most_bytes`` bytes (at least one write, however large)."""
    first = shard.writes[0]
    n, count, size = 1, len(first.records), first.size
    while n < len(shard.writes):
        w = shard.writes[n]
        if (
            w.generation != first.generation
            or count + len(w.records) > most
            or size + w.size > most_bytes
        ):
            break
        count += len(w.records)
        size += w.size
        n += 1
    batch, shard.writes = shard.writes[:n], shard.writes[n:]
    return batch


def _fail(writes: list[QueuedWrite], error: type[StromError], message: str) -> None:
    """Fail each write with an error of its own (one exception object raised in many waiters
    would gather all their tracebacks)."""
    for w in writes:
        if not w.done.done():
            w.done.set_exception(error(message))
            w.done.exception()  # retrieved: a waiter that gave up is not an unhandled error


def _writer_ended(shard: Shard, task: asyncio.Task[None]) -> None:
    """A writer cancelled (the coordinator stopping; perhaps before it ever ran) or crashed
    leaves no write waiting for ever: what is still queued fails."""
    if not task.cancelled() and task.exception() is None:
        return
    left, shard.writes = shard.writes, []
    _fail(left, NotCoordinatorError, f"shard {shard.index}'s writer stopped")


async def settled(done: asyncio.Future[None]) -> None:
    """Wait until a write has ended, however often the waiter is cancelled meanwhile (its
    outcome is then ``done``'s to tell)."""
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            continue
        except Exception:
            return
