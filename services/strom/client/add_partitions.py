"""AddPartitionsToTxn on the producer's side: a transactional producer's partitions are
registered with the transaction coordinator before their first batch of a transaction goes.

:class:`AddPartitions` is mixed into :class:`strom.client.producer.Producer` (through
:class:`strom.client.sender.SenderLoop`): the sender hands it the partitions due to be added
(``_add_to_transaction``), whose call runs on a thread of its own, one at a time, so that
a coordinator that does not answer holds nothing else; once it ends the sender sends their
batches, or fails them and the transaction (``_added_to_transaction``). Batches of
partitions never added fail as not written (``_fail_unadded``, also at an abort:
strom.client.producer_txn). A module of its own: this one call's thread, budget and
failures are one concern, which only a transactional producer reaches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future

from strom.client.accumulator import PartitionQueue
from strom.client.cluster import MIN_ATTEMPT_S
from strom.client.produce_answers import _earlier
from strom.client.stats import ProducerStats
from strom.client.transactions import TransactionManager, TxnPhase
from strom.errors import ProducerFencedError, StromError

#: Transaction phases in which a partition's first batch is still added to the transaction
#: and sent (an abort sends what is queued, within its timeout).
_ADDING_PHASES = (
    TxnPhase.IN_TRANSACTION,
    TxnPhase.COMMITTING,
    TxnPhase.ABORTING,
    TxnPhase.ABORTABLE_ERROR,
)


class AddPartitions:
    """The AddPartitionsToTxn in flight, its thread and its outcome, and the failing of
    batches whose partition was never added.

    A mixin, as :class:`strom.client.sender.SenderLoop` is: it runs on the sender thread
    (the call itself on its own), under the Producer's lock where it touches the partition
    queues. Every attribute is set up by ``Producer.__init__``; the annotations say which
    ones it uses. It calls ``_fail``, ``_fail_all`` and ``_done``
    (strom.client.produce_answers) and the Producer's ``_close_open``.
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    client_id: str
    delivery_timeout_s: float
    _txn: TransactionManager | None
    _add_future: Future[None] | None
    _adding: frozenset[tuple[str, int]]
    _adding_generation: int
    _fatal: StromError | None
    _lock: threading.Lock
    _queues: dict[tuple[str, int], PartitionQueue]
    _stats: ProducerStats
    _wake: threading.Event

    def _add_to_transaction(
        self, parts: set[tuple[str, int]], next_wake: float | None
    ) -> float | None:
        """Send AddPartitionsToTxn for partitions about to get their first batch of the
        transaction, as one more request in flight: it runs on a thread of its own and wakes
        the sender when it ends (:meth:`_added_to_transaction`), one at a time; partitions
        due meanwhile go in the next one. With the coordinator down the sender goes on
        sending the partitions already added, and delivery timeouts, callbacks, flush(),
        close() and abort_transaction() do not wait for it (Kafka's sender, too, keeps
        polling while its AddPartitionsToTxn is in flight).

        The call may retry until the oldest of those batches is due to expire
        (delivery_timeout_ms after its creation), each attempt for up to request_timeout_ms
        (DESIGN §8). Nothing is added once the transaction has ended (an abort fails the
        batches of partitions still not added once its flush is over: see
        :meth:`abort_transaction`)."""
        txn = self._txn
        assert txn is not None
        if self._add_future is not None:
            # (these wait for the next one; the sender wakes to expire them in time)
            return _earlier(next_wake, self._add_budget(parts))
        if txn.phase not in _ADDING_PHASES:
            self._fail_unadded(parts, self._unadded_error(txn))
            return next_wake
        budget = self._add_budget(parts)
        future: Future[None] = Future()
        self._add_future, self._adding = future, frozenset(parts)
        self._adding_generation = txn.generation
        threading.Thread(
            target=self._add_partitions,
            args=(txn, parts, budget, future),
            name=f"strom-producer-add-partitions-{self.client_id}",
            daemon=True,
        ).start()
        return next_wake

    def _add_partitions(
        self,
        txn: TransactionManager,
        parts: set[tuple[str, int]],
        budget: float,
        future: Future[None],
    ) -> None:
        """The AddPartitionsToTxn thread (see :meth:`_add_to_transaction`)."""
        try:
            txn.add_partitions(parts, budget)
        except BaseException as exc:  # (handed to the sender, which fails the batches)
            future.set_exception(exc)
        else:
            future.set_result(None)
        self._wake.set()

    def _added_to_transaction(self) -> None:
        """On the sender thread, once the AddPartitionsToTxn in flight has ended: its
        partitions were added (their batches go now), or it failed, and so do their
        batches and the transaction. An answer to a transaction that has ended since (it
        was aborted meanwhile; its batches failed then) changes nothing, unless it fenced
        the producer."""
        txn, future, parts = self._txn, self._add_future, self._adding
        assert txn is not None and future is not None
        self._add_future, self._adding = None, frozenset()
        exc = future.exception()
        if exc is None:
            return
        if not isinstance(exc, StromError):
            exc = StromError(f"AddPartitionsToTxn failed: {type(exc).__name__}: {exc}")
        if txn.generation != self._adding_generation and txn.phase is not TxnPhase.FATAL_ERROR:
            return
        txn.fail(exc)
        err = txn.error or exc
        self._fail_unadded(parts, err, fail_txn=True)
        if isinstance(err, ProducerFencedError):
            self._fatal = err
            self._fail_all(err)

    @staticmethod
    def _unadded_error(txn: TransactionManager) -> StromError:
        """What a batch of a partition not added to its transaction fails with when the
        transaction fails or is aborted first."""
        why = (
            f"the transaction failed ({txn.error})" if txn.error else "the transaction was aborted"
        )
        return StromError(
            f"not written: {why} before the record's partition was added to it "
            f"(AddPartitionsToTxn); the record belongs to the aborted transaction"
        )

    def _fail_unadded(
        self, parts: Iterable[tuple[str, int]], err: StromError, *, fail_txn: bool = False
    ) -> None:
        """Fail the unsent batches of ``parts`` (partitions not added to the transaction:
        nothing of them was sent). ``fail_txn``: the transaction fails with ``err`` too (see
        :meth:`_fail`); else (an abort) it is left as it is, and only batches never given a
        sequence fail (no sequence bookkeeping is needed for them)."""
        wanted = set(parts)
        with self._lock:
            victims = [
                (pq, [b for b in pq.batches if not b.sent and (fail_txn or b.base_sequence < 0)])
                for (t, p), pq in self._queues.items()
                if (t, p) in wanted
            ]
            victims = [(pq, batches) for pq, batches in victims if batches]
            for pq, batches in victims:
                if pq.open in batches:
                    self._close_open(pq.topic, pq.partition)
                for b in batches:
                    b.sent = True
                pq.in_flight += 1
        for pq, batches in victims:
            if fail_txn:
                self._fail(pq, batches, err)
            else:
                for b in batches:
                    b.result.fail(err)
                self._stats.failed(pq.topic, sum(b.count for b in batches))
                self._done(pq, batches)

    def _add_budget(self, parts: set[tuple[str, int]]) -> float:
        """How long AddPartitionsToTxn for ``parts`` may take: until the oldest unsent batch
        of those partitions passes delivery_timeout_ms (it fails then anyway)."""
        now = time.monotonic()
        with self._lock:
            created = [
                b.created
                for (t, p), pq in self._queues.items()
                if (t, p) in parts
                for b in pq.batches
                if not b.sent
            ]
        return max(min(created, default=now) + self.delivery_timeout_s - now, MIN_ATTEMPT_S)
