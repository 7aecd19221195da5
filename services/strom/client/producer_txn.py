"""The transactional producer's calls (DESIGN §6): ``init_transactions``, ``begin``,
``send_offsets_to``, ``commit``, ``prepare`` and ``abort_transaction``, and the steps of a
``transaction()`` block.

:class:`ProducerTransactions` is mixed into :class:`strom.client.producer.Producer`. The
transaction's state and its coordinator calls are :class:`strom.client.transactions.
TransactionManager`'s; what is here is the Producer's side: flushing the transaction's
records first, failing those of partitions never added, adopting a new producer id and epoch
(every partition numbers from 0 again), and the rules for a commit or an abort that got no
answer or did not finish in time. A module of its own: the transactional API is one concern,
which a producer without ``transactional_id`` never reaches. ``transaction()`` itself stays
on the Producer (it yields the Producer) and calls the block steps here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from strom.client.accumulator import PartitionQueue
from strom.client.transactions import (
    GroupMetadata,
    PreparedTxnState,
    TransactionManager,
    TxnPhase,
)
from strom.client.types import OffsetAndMetadata, TopicPartition, checked_offsets
from strom.errors import InvalidTxnStateError, RequestTimedOutError, StromError


class ProducerTransactions:
    """The transactional API and its steps, on the caller's thread.

    A mixin, as :class:`strom.client.sender.SenderLoop` is. Every attribute is set up by
    ``Producer.__init__``; the annotations say which ones it uses. It calls the Producer's
    ``flush`` and ``_closed_error``, and the sender's ``_fail_unadded`` and
    ``_unadded_error`` (strom.client.sender).
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    max_block_s: float
    _txn: TransactionManager | None
    _txn_failed: StromError | None
    _block_abort_failed: bool
    _lock: threading.Lock
    _queues: dict[tuple[str, int], PartitionQueue]
    _producer_id: int
    _producer_epoch: int
    _closing: bool

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register the ``transactional_id`` with its coordinator: get the producer id and a
        new epoch, which fences any older producer with the same id; a transaction such a
        producer left open is aborted first. Call once, before the first transaction: after a
        failed transaction ``abort_transaction()`` is all it takes to go on (it gets a new
        epoch itself when a batch failed)."""
        txn = self._require_txn()
        self._adopt(*txn.init(self.max_block_s if timeout is None else timeout))

    def _adopt(self, pid: int, epoch: int) -> None:
        """A transactional producer's new producer id and epoch (init_transactions(), or an
        abort that took the id back): every partition numbers from 0 again."""
        with self._lock:
            self._producer_id, self._producer_epoch = pid, epoch
            for pq in self._queues.values():  # a new epoch numbers from 0 again
                pq.next_sequence = 0
                pq.reseq_from = None
                pq.producer_id, pq.producer_epoch = pid, epoch
                pq.unresolved = False
                pq.unresolved_seq = -1

    def begin_transaction(self) -> None:
        """Start a transaction: records sent until commit/abort belong to it. Local, except
        after an abort that did not finish: an abort that got no answer is asked again
        first, and so is the new epoch the abort of a transaction with a failed batch asks
        for (up to ``max_block_ms``)."""
        txn = self._require_txn()
        if txn.pending_end is False:  # (an abort that got no answer: see TransactionManager)
            txn.end(False, self.max_block_s)
        if txn.epoch_bump_required and txn.phase is TxnPhase.READY:
            self._adopt(*txn.bump_epoch(self.max_block_s))
        txn.begin(self.max_block_s)
        self._txn_failed = None

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group_metadata: GroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer group's offsets as part of the transaction (the
        consume-transform-produce pattern): they become the group's committed offsets only
        if the transaction commits. ``group_metadata`` is ``consumer.group_metadata()``, so
        a consumer that was fenced out of its group cannot commit. A group id string is
        taken too (Kafka's older form): the coordinator takes it only while the group has no
        members (NON_EMPTY_GROUP otherwise), since it cannot tell a fenced member apart."""
        if isinstance(group_metadata, str):
            group_metadata = GroupMetadata(group_metadata)
        elif not isinstance(group_metadata, GroupMetadata):
            raise TypeError(
                "group_metadata must be consumer.group_metadata() or a group id, not "
                f"{type(group_metadata).__name__}"
            )
        offsets = checked_offsets(offsets, "send_offsets_to_transaction")
        self._require_txn().send_offsets(
            offsets, group_metadata, self.max_block_s if timeout is None else timeout
        )

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send everything, then commit: the records and offsets of the transaction become
        visible to read_committed consumers, all or nothing.

        Raises the error that made the transaction fail (call :meth:`abort_transaction`), or
        :class:`~strom.errors.ProducerFencedError` when a newer instance took over (close
        this producer). When the commit got no answer in time (:class:`~strom.errors.
        RequestTimedOutError`, a broken connection) it may still be committed: call
        ``commit_transaction()`` again, which asks once more (an abort is refused then).

        Returns within ``timeout`` (``max_block_ms`` when None): when the transaction's
        records were not all sent by then (a partition waiting to be added by
        AddPartitionsToTxn to a coordinator that does not answer, or for its leader), it
        raises :class:`~strom.errors.RequestTimedOutError` saying so, and the transaction
        is neither committed nor failed: ``commit_transaction()`` again goes on from there
        (Kafka's rule for a commitTransaction() that timed out), ``abort_transaction()``
        aborts it."""
        txn = self._require_txn()
        if txn.pending_end is True:
            txn.end(True, self.max_block_s if timeout is None else timeout)
            return
        txn, end = self._flush_transaction("commit_transaction()", timeout, resumable=True)
        txn.end(True, max(end - time.monotonic(), 0.001))

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Send everything of the open transaction and hand it over undecided (the first
        phase of a two-phase commit, Kafka's KIP-939): the returned state lets another
        process commit or abort it with
        :func:`~strom.client.transactions.complete_prepared_transaction`. This producer is
        done with transactions then; :meth:`close` leaves the prepared transaction open. If
        nobody completes it, it is aborted when ``transaction_timeout_ms`` passes or a new
        instance of the transactional id calls :meth:`init_transactions`.

        Raises the error that made the transaction fail (call :meth:`abort_transaction`)."""
        txn, _ = self._flush_transaction("prepare_transaction()", timeout)
        with txn.lock:
            txn.phase = TxnPhase.PREPARED
        return PreparedTxnState(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, empty=not txn.started
        )

    def _flush_transaction(
        self, action: str, timeout: float | None, *, resumable: bool = False
    ) -> tuple[TransactionManager, float]:
        """The first step of ending a transaction: send everything; raises the error that
        made the transaction fail. Returns the manager and the call's deadline.

        ``resumable`` (a commit): a flush that did not end in time leaves the transaction
        COMMITTING, not failed, and the same call again goes on from there: nothing went
        wrong but the wait."""
        txn = self._require_txn()
        resuming = resumable and txn.phase is TxnPhase.COMMITTING and txn.pending_end is None
        if not resuming:
            txn.require(TxnPhase.IN_TRANSACTION, action=action)
        budget = self.max_block_s if timeout is None else timeout
        end = time.monotonic() + budget
        with txn.lock:
            txn.phase = TxnPhase.COMMITTING
        try:
            self.flush(max(end - time.monotonic(), 0))
        except RequestTimedOutError as exc:
            if not resumable or txn.phase is not TxnPhase.COMMITTING:
                txn.fail(exc)
            else:
                raise RequestTimedOutError(
                    f"{action} did not finish within {budget:.1f} s: records of the "
                    "transaction were still being sent (a partition waiting to be added to it "
                    "by AddPartitionsToTxn, or for its leader); it is not committed: call "
                    f"{action} again to go on, or abort_transaction()"
                ) from None
        except StromError as exc:
            txn.fail(exc)
        if txn.phase is not TxnPhase.COMMITTING:
            assert txn.error is not None
            raise txn.error
        return txn, end

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: its records stay invisible to read_committed consumers
        and its offsets are dropped. Records still queued are sent first (they are part of
        the aborted transaction either way), within ``timeout``; those of partitions the
        transaction coordinator has not added by then fail, never sent. Returns within
        ``timeout`` (``max_block_ms`` when None), or raises
        :class:`~strom.errors.RequestTimedOutError` saying what it waited for (the records,
        or the coordinator's answer): calling ``abort_transaction()`` (or
        ``begin_transaction()``) again goes on.

        When a batch of the transaction failed (it may have been written, or its sequence was
        refused), the abort then asks the coordinator for a new epoch of the same producer id
        (Kafka's KIP-360 bump), under which every partition numbers from 0: the next
        transaction goes on, with no ``init_transactions()``. A newer instance of the
        transactional id still fences this one (:class:`~strom.errors.ProducerFencedError`)."""
        self._abort_transaction(timeout, bump=True)

    def _abort_transaction(self, timeout: float | None, *, bump: bool) -> None:
        """:meth:`abort_transaction`; ``bump=False`` (close()) leaves out the new epoch, which
        only a further transaction needs."""
        txn = self._require_txn()
        if txn.phase is TxnPhase.FATAL_ERROR:
            txn.require(TxnPhase.IN_TRANSACTION, action="abort_transaction()")  # raises it
        if txn.pending_end is True:
            raise InvalidTxnStateError(
                "cannot abort_transaction(): the previous commit_transaction() got no answer "
                "and may have committed; call commit_transaction() again"
            )
        budget = self.max_block_s if timeout is None else timeout
        end = time.monotonic() + budget
        if txn.pending_end is False:  # the previous abort got no answer: ask again
            txn.end(False, budget)
        elif not (txn.phase is TxnPhase.READY and txn.epoch_bump_required):
            self._abort_open(txn, timeout, end)
        if bump and txn.epoch_bump_required:  # (aborted: only the new epoch is left to get)
            self._adopt(*txn.bump_epoch(max(end - time.monotonic(), 0.001)))

    def _abort_open(self, txn: TransactionManager, timeout: float | None, end: float) -> None:
        """Abort the open (or failed) transaction by ``end``: flush, then EndTxn (or, when
        the epoch was bumped past ours, take the id back: KIP-588)."""
        txn.require(
            TxnPhase.IN_TRANSACTION,
            TxnPhase.ABORTABLE_ERROR,
            TxnPhase.COMMITTING,
            action="abort_transaction()",
        )
        with txn.lock:
            txn.phase = TxnPhase.ABORTING
        flushed = True
        try:
            self.flush(max(end - time.monotonic(), 0))
        except RequestTimedOutError:
            flushed = False
        except StromError:
            pass  # (refused from a delivery callback, say: the abort goes on without it)
        # Batches of partitions still not added never go (an AddPartitionsToTxn in flight is
        # not waited for past the flush: the coordinator may hang), as Kafka's
        # abortUndrainedBatches; one answered later marks nothing (TransactionManager).
        with self._lock:
            queued = list(self._queues)
        self._fail_unadded([tp for tp in queued if tp not in txn.added], self._unadded_error(txn))
        if not flushed:
            self._abort_unfinished(txn, timeout)
        if txn.bump_needed:  # the epoch was bumped past ours: ask for the id back (KIP-588)
            back = txn.recover(max(end - time.monotonic(), 0.001))
            if back is not None:
                self._adopt(*back)
            return
        txn.end(False, max(end - time.monotonic(), 0.001))

    def _abort_unfinished(self, txn: TransactionManager, timeout: float | None) -> None:
        """An abort whose flush did not end in its time (a partition waits to be added to
        the transaction, or for its leader): the coordinator is not asked yet (no time is
        left for it), and the transaction stays abortable so that the next
        ``abort_transaction()`` goes on from here; raises saying so."""
        budget = self.max_block_s if timeout is None else timeout
        error = RequestTimedOutError(
            f"abort_transaction() did not finish within {budget:.1f} s: records of the "
            "transaction were still being sent (a partition waiting to be added to it by "
            "AddPartitionsToTxn, or for its leader), so the transaction coordinator has not "
            "been asked to abort it yet; call abort_transaction() again"
        )
        with txn.lock:
            if txn.phase is TxnPhase.ABORTING:
                txn.phase = TxnPhase.ABORTABLE_ERROR
                txn.error = txn.error or error
        raise error

    def _abort_block(self, timeout: float | None) -> None:
        """A ``transaction()`` block raised: abort (its own error is not the caller's; one
        that fails is left to the next block: :meth:`_finish_block_abort`)."""
        try:
            self.abort_transaction(timeout)
        except StromError:
            self._block_abort_failed = True

    def _finish_block_abort(self, timeout: float | None) -> None:
        """Before a block begins: abort what the last block's abort left open (its abort
        timed out, a hung coordinator say), else every later block would be refused "while
        abortable error" for ever (Kafka's loop calls abortTransaction() in its catch, and
        goes on)."""
        if not self._block_abort_failed:
            return
        txn = self._txn
        if (
            txn is not None
            and txn.pending_end is not True
            and txn.phase
            in (TxnPhase.ABORTABLE_ERROR, TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING)
        ):
            self.abort_transaction(timeout)  # raises while it still fails: the flag stays
        self._block_abort_failed = False

    def _commit_block(self, timeout: float | None) -> None:
        """A ``transaction()`` block ended: commit, settling a commit that got no answer."""
        try:
            try:
                self.commit_transaction(timeout)
            except StromError:
                txn = self._txn
                if txn is None or txn.pending_end is not True:
                    raise
                # A commit that timed out is pending: settled here, the error out of the
                # block means "not committed", which the README's loop rewinds on.
                txn.settle_commit(
                    self.max_block_s if timeout is None else timeout, txn.timeout_ms / 1000
                )
        except StromError:
            # (else the failed transaction stays open, holding read_committed readers until
            # its timeout; a commit whose records were not all sent in time is left
            # COMMITTING, and is aborted too: the block's error means "not committed")
            txn = self._txn
            if (
                txn is not None
                and txn.pending_end is not True
                and txn.phase in (TxnPhase.ABORTABLE_ERROR, TxnPhase.COMMITTING)
            ):
                self._abort_block(timeout)
            raise

    def _require_txn(self) -> TransactionManager:
        if self._txn is None:
            raise InvalidTxnStateError("this producer has no transactional_id")
        if self._closing:
            raise self._closed_error()
        return self._txn
