"""What a Fetch answer means for each partition in it: data to buffer, a reset, a leader to
look up again, a backoff, or an error for ``poll()`` to raise.

:class:`AnswerFiling` is mixed into :class:`strom.client.fetcher.Fetcher`: the thread that
got an answer (a worker, or the application's in ``fetch_inline``) files it here, under the
Fetcher's lock. A module of its own because the per-partition error rules (which codes send
the consumer to another leader, when a leader's storage errors are raised, the reset policy
on OFFSET_OUT_OF_RANGE, read_committed's end offset) are one concern, read apart from the
threads that fetch.
"""

from __future__ import annotations

import threading
from typing import Any

from strom.api import storage_pb2
from strom.client.fetch_answers import aborted_batches, unreadable_batch_error
from strom.client.fetch_claims import _Claim
from strom.client.fetch_state import CompletedFetch, PartitionState
from strom.client.metadata import MetadataCache
from strom.client.types import TopicPartition
from strom.errors import (
    FETCH_LEADER_CODES,
    CorruptMessageError,
    ErrorCode,
    OffsetOutOfRangeError,
    StorageError,
    StromError,
    error_for,
    is_retriable,
)
from strom.record import InvalidBatchError, RecordBatch

#: Per-partition errors after which the leader is looked up again before the next fetch.
_LEADER_ERRORS = FETCH_LEADER_CODES

#: STORAGE_ERROR answers in a row from the same leader (in the same leader epoch) after
#: which ``poll()`` raises: the leader's stored data failed its check, and a leader lookup does
#: not help while it keeps leading (Kafka's consumer raises CorruptRecordException from poll).
STORAGE_ERRORS_RAISED_AFTER = 3


class AnswerFiling:
    """Files a Fetch answer (or a failed request) into the partitions' states.

    A mixin, as the other parts of :class:`strom.client.fetcher.Fetcher` are; every method
    runs with the Fetcher's lock held. Every attribute is set up by ``Fetcher.__init__``;
    the annotations say which ones it uses. It calls the Fetcher's ``_kick`` and ``_stale``
    (strom.client.fetch_overdue).
    """

    # -- set by Fetcher.__init__ -----------------------------------------------------------
    parts: dict[TopicPartition, PartitionState]
    data_ready: threading.Condition
    _leaders: MetadataCache
    _app_fetches: bool
    _check_crcs: bool
    _read_committed: bool
    _reset_policy: str
    _backoff_s: float
    _backoff_max_s: float
    _quiet_due: float | None

    def _request_failed(
        self, claims: list[_Claim], failure: StromError, transport: bool, now: float
    ) -> None:
        if transport:
            for topic in {c.part.tp.topic for c in claims}:
                self._stale(topic)
        for c in claims:
            part = c.part
            if self.parts.get(part.tp) is not part or part.generation != c.generation:
                continue
            self._back_off(part, now)
            if not transport:
                part.error = failure
                self.data_ready.notify_all()

    def _storage_error(self, part: PartitionState, info: Any) -> None:
        """(Lock held.) The leader could not serve the partition from its disk. Retried, as
        a leader change may cure it; but from the same leader, in the same leader epoch,
        ``STORAGE_ERRORS_RAISED_AFTER`` times in a row, ``poll()`` raises it (every further
        one too) with the partition and offset: before, the consumer looked the leader up
        again forever and ``poll()`` returned nothing, with no sign of why (found from
        outside: one damaged batch on the leader's disk, two good replicas standing by)."""
        tp = part.tp
        leader = self._leaders.get(tp)
        node, epoch = (leader.node_id, leader.epoch) if leader is not None else (-1, -1)
        last_node, last_epoch, count = part.storage_errors
        count = count + 1 if (node, epoch) == (last_node, last_epoch) else 1
        part.storage_errors = (node, epoch, count)
        if count >= STORAGE_ERRORS_RAISED_AFTER:
            # Damaged data (the node's "stored data ... failed a check") is Kafka's
            # CorruptRecordException; anything else (a disk error) stays a StorageError.
            damaged = "failed a check" in info.error_message
            cls = CorruptMessageError if damaged else StorageError
            part.error = cls(
                f"{tp.topic}-{tp.partition} at offset {part.fetch_offset}: the leader (node "
                f"{node}) failed to read its stored data {count} times in a row: "
                f"{info.error_message}"
            )
            self.data_ready.notify_all()

    def _back_off(self, part: PartitionState, now: float) -> None:
        delay = min(self._backoff_s * (2 ** min(part.failures, 10)), self._backoff_max_s)
        part.failures += 1
        part.backoff_until = now + delay

    def _apply(
        self,
        part: PartitionState,
        info: storage_pb2.FetchPartitionResponse,
        batches: list[RecordBatch] | InvalidBatchError,
        endpoints: dict[int, str],
        now: float,
        corrupt: frozenset[int] | None = None,
    ) -> None:
        tp = part.tp
        code = info.error_code
        if code == ErrorCode.STORAGE_ERROR:
            self._storage_error(part, info)
        elif part.storage_errors[2]:
            if part.storage_errors[2] >= STORAGE_ERRORS_RAISED_AFTER and not part.error_sticky:
                part.error = None  # not raised yet, and served again meanwhile: moot
            part.storage_errors = (-1, -1, 0)
        if code == ErrorCode.NONE:
            part.failures = 0
            part.high_watermark = info.high_watermark
            # read_committed: the last stable offset, else an open transaction shows as lag
            # they can never read.
            part.end_offset = (
                info.last_stable_offset
                if self._read_committed and info.last_stable_offset >= 0
                else info.high_watermark
            )
            part.log_start_offset = info.log_start_offset
            if isinstance(batches, InvalidBatchError):
                part.error = unreadable_batch_error(tp, part.fetch_offset, batches)
                part.error_sticky = True
                self.data_ready.notify_all()
                return
            start = part.fetch_offset
            keep = [b for b in batches if b.header.next_offset > start]
            if keep:
                aborted = (
                    aborted_batches(keep, info.aborted_transactions)
                    if info.aborted_transactions
                    else None
                )
                part.completed.append(
                    CompletedFetch(
                        tp, keep, check_crcs=self._check_crcs, skip=aborted, corrupt=corrupt
                    )
                )
                part.fetch_offset = keep[-1].header.next_offset
                part.quiet_since = None
                self.data_ready.notify_all()
            elif part.quiet_since is None or self._quiet_due is None:
                self._quiet(part, now)  # (strom.client.fetch_overdue: QUIET_RECHECK_S)
            if self._app_fetches and part.fetch_offset >= part.high_watermark:
                part.held = True
                self.data_ready.notify_all()  # a waiting poll() fetches it itself now
            else:
                part.held = False
            return
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if info.log_start_offset >= 0:
                part.log_start_offset = info.log_start_offset
            if info.high_watermark >= 0:
                part.high_watermark = info.high_watermark
            if self._reset_policy == "none":
                exc = OffsetOutOfRangeError(
                    f"fetch offset {part.fetch_offset} of {tp.topic}-{tp.partition} is out of "
                    f"range (log start offset {info.log_start_offset}, high watermark "
                    f"{info.high_watermark}) and auto_offset_reset='none': seek to continue"
                )
                exc.partitions = {tp: part.fetch_offset}  # type: ignore[attr-defined]
                part.error = exc
                part.error_sticky = True
            else:
                part.position = None
                part.reset = self._reset_policy
                part.drop_buffered()
            self.data_ready.notify_all()
            return
        if code in _LEADER_ERRORS or code == ErrorCode.UNKNOWN_LEADER_EPOCH:
            hint = info.current_leader if info.HasField("current_leader") else None
            if hint is not None and self._leaders.learn(
                tp, hint.leader_id, hint.leader_epoch, endpoints.get(hint.leader_id)
            ):
                self._kick(part)  # the answer named the new leader: go there at once
                return
            if code != ErrorCode.UNKNOWN_LEADER_EPOCH:  # that one: the node lags, just wait
                self._stale(tp.topic)
            self._back_off(part, now)
            return
        if is_retriable(code):
            self._back_off(part, now)
            return
        part.error = error_for(code, f"{tp.topic}-{tp.partition}: {info.error_message}")
        self._back_off(part, now)
        self.data_ready.notify_all()
