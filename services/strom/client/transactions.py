"""The transactional producer's side of Kafka's transaction protocol (DESIGN §6).

:class:`TransactionManager` keeps the producer's transaction state and talks to its
transaction coordinator (found with FindCoordinator for the transactional id):
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, and TxnOffsetCommit to the
consumer group's coordinator. The :class:`~strom.client.producer.Producer` calls it: before a
partition's first batch of a transaction is sent, the partition is added; ``commit`` flushes
and ends the transaction.

Errors follow Kafka's classes:

- **fatal** (:class:`~strom.errors.ProducerFencedError`, a newer instance took the id over):
  the producer can do nothing more; close it.
- **abortable** (a send failed, the coordinator refused a request): the transaction cannot
  commit; ``abort_transaction()`` and start again. After a failed batch the abort also gets
  a new epoch (InitProducerId with the current id and epoch, Kafka's KIP-360 bump:
  :meth:`TransactionManager.bump_epoch`), so partitions whose sequences cannot go on (a batch
  that may have been written, OUT_OF_ORDER_SEQUENCE) start again from 0; no
  init_transactions() is needed. INVALID_PRODUCER_EPOCH is one (Kafka's
  KIP-588): the coordinator's timeout abort bumped the epoch, or a new instance did; the
  abort then asks the coordinator for the id back (:meth:`TransactionManager.recover`),
  which it gives only in the first case.
- retriable errors (coordinator moving, the previous transaction still completing) are
  retried here until the call's timeout.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from strom.api import common_pb2, coordinator_pb2, coordinator_pb2_grpc, storage_pb2
from strom.client.cluster import (
    REFUSED_CODES,
    ClusterClient,
    attempt_timeout,
    older_node,
    refused,
)
from strom.client.coordinator_calls import CallAbandoned, CoordinatorMoved, call_leaving_moved
from strom.client.types import OffsetAndMetadata, TopicPartition, add_offsets
from strom.errors import (
    COORDINATOR_REFRESH_CODES,
    CoordinatorNotAvailableError,
    ErrorCode,
    InvalidTxnStateError,
    ProducerClosedError,
    ProducerFencedError,
    RequestTimedOutError,
    StromError,
    TransactionOutcomeUnknownError,
    commit_failed_error,
    error_for,
    is_retriable,
)

log = logging.getLogger("strom.client.transactions")
E = ErrorCode
_TRANSPORT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
#: Errors after which the producer is fenced for good. (INVALID_PRODUCER_EPOCH in a
#: transaction is abortable: only the coordinator can tell whether a new instance took over,
#: and abort_transaction() asks it; see TransactionManager.fail.)
_FATAL = frozenset({E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING})


class TxnPhase(enum.Enum):
    """Where the producer's transaction is."""

    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    #: prepare_transaction(): flushed and handed over; another process commits or aborts it.
    PREPARED = "prepared"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


#: A transaction is open (a failure of it is abortable).
_OPEN_PHASES = (TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING, TxnPhase.ABORTING)


@dataclass(frozen=True)
class GroupMetadata:
    """What ``send_offsets_to_transaction`` needs of a consumer (Kafka's
    ConsumerGroupMetadata): its group and, for a group member, its member id and epoch, so a
    fenced member's offsets are refused."""

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


@dataclass(frozen=True)
class PreparedTxnState:
    """A flushed, undecided transaction (Kafka's KIP-939 ``PreparedTxnState``): what
    :func:`complete_prepared_transaction` needs to commit or abort it from another process."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    #: Nothing was registered with the coordinator (no record sent, no offsets): there is
    #: nothing to complete, and an EndTxn would be refused (the coordinator's state is Empty).
    empty: bool = False


def complete_prepared_transaction(
    client: ClusterClient,
    state: PreparedTxnState,
    commit: bool,
    *,
    timeout_s: float = 60.0,
    request_timeout_s: float = 30.0,
) -> None:
    """Commit (or abort) a transaction another producer prepared with
    ``Producer.prepare_transaction()``: EndTxn with its producer id and epoch, retried on
    retriable errors until ``timeout_s``. The second phase of a two-phase commit run by a
    coordinator outside strom (Spark's driver commits what its tasks prepared). Raises
    :class:`~strom.errors.ProducerFencedError` when a newer instance of the transactional id
    took over, or the transaction was aborted (its timeout passed) in the meantime. A
    transaction that sent nothing completes at once (the coordinator would answer
    INVALID_TXN_STATE)."""
    if state.empty:
        return
    mgr = TransactionManager(
        client,
        state.transactional_id,
        1,  # the timeout is the preparing producer's; EndTxn does not carry one
        request_timeout_s=request_timeout_s,
        retry_backoff_s=0.05,
    )
    mgr.producer_id, mgr.producer_epoch = state.producer_id, state.producer_epoch
    mgr.phase = TxnPhase.PREPARED
    try:
        mgr.end(commit, timeout_s)
    except StromError as exc:
        # A prepared transaction the coordinator aborted for its timeout is over: the
        # coordinator's INVALID_PRODUCER_EPOCH for it is fatal here (no abort to retry).
        if exc.code == E.INVALID_PRODUCER_EPOCH and isinstance(mgr.error, ProducerFencedError):
            raise mgr.error from None
        raise


class TransactionManager:
    """One transactional producer's state and coordinator calls (see the module docstring)."""

    def __init__(
        self,
        client: ClusterClient,
        transactional_id: str,
        timeout_ms: int,
        *,
        request_timeout_s: float,
        retry_backoff_s: float,
    ) -> None:
        if not transactional_id or not isinstance(transactional_id, str):
            raise ValueError(
                f"transactional_id must be a non-empty string, got {transactional_id!r}"
            )
        if not isinstance(timeout_ms, int) or timeout_ms <= 0:
            raise ValueError(
                f"transaction_timeout_ms must be a positive integer, got {timeout_ms!r}"
            )
        self.client = client
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.request_timeout_s = request_timeout_s
        self.backoff_s = max(retry_backoff_s, 0.02)
        self.lock = threading.Lock()
        self.phase = TxnPhase.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        #: Partitions registered with the coordinator in the current transaction.
        self.added: set[tuple[str, int]] = set()
        #: Whether the coordinator may know of the current transaction (a partition or a
        #: group was being added): if not, it ends without EndTxn, as Kafka's producer ends
        #: a transaction that added nothing.
        self.started = False
        #: Whether the coordinator accepted a partition or a group of the current
        #: transaction (answered NONE): only then can records of it have been written, since
        #: a partition's batches are sent only after its AddPartitionsToTxn succeeded. See
        #: :meth:`_nothing_to_abort`.
        self.registered = False
        #: When this transaction's first Add*ToTxn was sent (time.monotonic()), None before:
        #: the coordinator's timeout runs from its arrival, so no later than this.
        self.started_at: float | None = None
        #: The epoch was bumped past this producer's (INVALID_PRODUCER_EPOCH): the abort
        #: asks the coordinator for the id back under a new epoch instead of EndTxn (KIP-588).
        self.bump_needed = False
        #: A batch of this producer failed in a transaction (Kafka's ``epochBumpRequired``,
        #: KIP-360): its sequences may not go on under this epoch (a batch that "may have
        #: been written", one refused OUT_OF_ORDER_SEQUENCE or UNKNOWN_PRODUCER_ID), so the
        #: abort ends with :meth:`bump_epoch` and every partition numbers from 0 again.
        #: Stays set until a new epoch is in (an abort whose bump got no answer leaves the
        #: producer READY with it set: the next begin or abort asks again).
        self.epoch_bump_required = False
        self.error: StromError | None = None
        #: The outcome of an EndTxn that got no answer (True: commit): it may have reached
        #: the coordinator, so only the same call may follow (Kafka's rule: a timed-out
        #: commit_transaction() is retried, never turned into an abort).
        self.pending_end: bool | None = None
        #: Counts the transactions begun: an AddPartitionsToTxn answered after its
        #: transaction ended (it runs beside the producer's sender, see
        #: SenderLoop._add_to_transaction) must not mark partitions of the next one added.
        self.generation = 0
        #: Set by the producer's close(): a coordinator call still retrying (an
        #: AddPartitionsToTxn on its own thread) gives up instead of outliving the producer.
        self.closed = threading.Event()
        self._coordinator: str | None = None

    # -- state ---------------------------------------------------------------------------------

    def require(self, *phases: TxnPhase, action: str) -> None:
        with self.lock:
            phase, error = self.phase, self.error
        if phase is TxnPhase.FATAL_ERROR:
            assert error is not None
            raise error
        if phase not in phases:
            hint = ""
            if phase is TxnPhase.UNINITIALIZED:
                hint = ": call init_transactions() first"
            elif phase is TxnPhase.ABORTABLE_ERROR:
                hint = f": the transaction failed ({error}); call abort_transaction()"
            elif phase is TxnPhase.READY:
                hint = ": call begin_transaction() first"
            elif phase is TxnPhase.IN_TRANSACTION:
                hint = ": a transaction is already open"
            elif self.pending_end is not None:
                again = "commit_transaction()" if self.pending_end else "abort_transaction()"
                hint = f": the previous {again} got no answer; call {again} again"
            elif phase is TxnPhase.COMMITTING:
                hint = (
                    ": the previous commit_transaction() did not finish in time; call "
                    "commit_transaction() again to go on, or abort_transaction()"
                )
            elif phase is TxnPhase.PREPARED:
                hint = (
                    ": the transaction was prepared and handed over "
                    "(complete_prepared_transaction() ends it); close this producer"
                )
            raise InvalidTxnStateError(f"cannot {action} while {phase.value}{hint}")

    def fail(self, error: StromError) -> None:
        """A send or request failed: fatal errors end the producer, others the transaction.

        INVALID_PRODUCER_EPOCH ends only the transaction, as in Kafka since KIP-588, when it
        may come from the coordinator's timeout abort (:meth:`_may_have_timed_out`): the
        epoch was bumped past this producer's, by a new instance or by the coordinator
        itself, and abort_transaction() asks the coordinator, which gives the id back under
        a new epoch only when no other instance has initialised it since (else
        PRODUCER_FENCED, fatal). Otherwise a new instance took over: fatal."""
        fatal = isinstance(error, ProducerFencedError) or error.code in _FATAL
        bumped = not fatal and error.code == E.INVALID_PRODUCER_EPOCH
        if bumped and not self._may_have_timed_out(error):
            fatal, bumped = True, False
        with self.lock:
            if self.phase is TxnPhase.FATAL_ERROR:
                return
            if bumped and self.phase in (*_OPEN_PHASES, TxnPhase.ABORTABLE_ERROR):
                self.bump_needed = True
                self.pending_end = None  # (an EndTxn of this epoch cannot be answered now)
                if self.phase is not TxnPhase.ABORTABLE_ERROR:
                    self.phase = TxnPhase.ABORTABLE_ERROR
                    explained = getattr(error, "explained", False)
                    self.error = error if explained else self._epoch_bumped(error)
                return
            if fatal or bumped:
                self.pending_end = None  # nothing to ask again: the producer is done
                self.phase = TxnPhase.FATAL_ERROR
                self.error = self._fenced(error)
            elif self.phase in _OPEN_PHASES:
                # (an abort that failed can be tried again: not left ABORTING for good)
                self.phase = TxnPhase.ABORTABLE_ERROR
                self.error = error
                self.pending_end = None

    def batch_failed(self, error: StromError) -> None:
        """A batch of the transaction failed for good: the transaction can only abort
        (:meth:`fail`), and the abort starts a new epoch (``epoch_bump_required``), as
        Kafka's TransactionManager after a failed batch since KIP-360. Without the bump a
        partition whose failed batch may or may not be in the log could never take another
        sequence under this epoch, and every later transaction failed until
        init_transactions()."""
        self.fail(error)
        with self.lock:
            if self.phase is TxnPhase.ABORTABLE_ERROR:
                self.epoch_bump_required = True

    def epoch_error(self, error: StromError) -> StromError:
        """What a batch refused INVALID_PRODUCER_EPOCH by its partition fails with: when the
        abort may take the id back (see :meth:`fail`) that error saying so, else the
        ProducerFencedError the producer ends with."""
        with self.lock:
            phase = self.phase
        if phase in (*_OPEN_PHASES, TxnPhase.ABORTABLE_ERROR) and self._may_have_timed_out(error):
            return self._epoch_bumped(error)
        return self._fenced(error)

    def _may_have_timed_out(self, error: StromError) -> bool:
        """Whether an INVALID_PRODUCER_EPOCH may come from the coordinator's timeout abort:
        the coordinator answers it only for that (txn_state.check_producer), and a partition
        cannot tell, but a transaction open no longer than its timeout was not aborted for
        it (the coordinator's clock starts after ``started_at``)."""
        return getattr(error, "answered", False) or bool(self._timed_out_note())

    def _epoch_bumped(self, error: StromError) -> StromError:
        """The abortable error of a transaction whose epoch was bumped, saying what to do
        (a partition's own words, "epoch 1 took over", read as a second instance)."""
        explained = error_for(
            E.INVALID_PRODUCER_EPOCH,
            f"{error.message}{self._timed_out_note()}; call abort_transaction(): it asks the "
            f"transaction coordinator for {self.transactional_id!r} back under a new epoch, "
            "which it gives unless another instance has initialised the id since (then "
            "ProducerFencedError: close this producer)",
        )
        explained.explained = True  # type: ignore[attr-defined]  # (see fail)
        if getattr(error, "answered", False):
            explained.answered = True  # type: ignore[attr-defined]
        return explained

    def _timed_out_note(self) -> str:
        """Why the epoch was bumped when this transaction was open past its timeout, else
        "". The coordinator's own refusal says so for sure; a partition's cannot, but this
        producer knows how long its transaction was open."""
        if self.started_at is None:
            return ""
        open_ms = (time.monotonic() - self.started_at) * 1000
        if open_ms <= self.timeout_ms:
            return ""
        return (
            f" (this transaction had been open {open_ms / 1000:.1f} s, longer than "
            f"transaction_timeout_ms={self.timeout_ms}: the transaction coordinator aborts a "
            "transaction open that long by itself and bumps the producer epoch, which fences "
            "this producer's epoch as a new instance of the transactional id would, with no "
            "other instance needed; its records are aborted)"
        )

    def _fenced(self, error: StromError) -> ProducerFencedError:
        """The fatal error a fencing answer ends the producer with (a new instance took the
        id: a timeout abort is abortable, see :meth:`fail`)."""
        if isinstance(error, ProducerFencedError):
            return error
        return ProducerFencedError(f"producer fenced: {error.message}")

    @property
    def in_transaction(self) -> bool:
        return self.phase in (TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING, TxnPhase.ABORTING)

    # -- coordinator calls ---------------------------------------------------------------------

    def init(self, timeout_s: float) -> tuple[int, int]:
        """InitProducerId: the producer id and (bumped) epoch; fences older instances."""
        self.require(TxnPhase.UNINITIALIZED, TxnPhase.READY, action="init_transactions()")
        req = storage_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            producer_id=-1,
            producer_epoch=-1,
        )
        resp = self._call("InitProducerId", req, timeout_s)
        with self.lock:
            self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
            self.epoch_bump_required = False
            self._ready_locked()
        return resp.producer_id, resp.producer_epoch

    def bump_epoch(self, timeout_s: float) -> tuple[int, int]:
        """After the abort of a transaction with a failed batch (``epoch_bump_required``):
        InitProducerId with this producer's id and current epoch, which the coordinator (no
        transaction of it open now) answers with the same id and epoch + 1 (a new id past
        the 16-bit epoch space), Kafka's KIP-360 bump (``InitProducerIdHandler`` with the
        current ``producerIdAndEpoch``). Returns the new id and epoch: the producer numbers
        every partition from 0 under it (the leaders take a newer epoch from sequence 0).

        Fencing holds: the coordinator takes the id and epoch only from the id's current
        producer (or the same request again, its answer lost); a zombie whose epoch a newer
        instance bumped past gets PRODUCER_FENCED, fatal here (:meth:`_call`). A call that
        got no answer raises and leaves ``epoch_bump_required`` set."""
        req = storage_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
        )
        resp = self._call("InitProducerId", req, timeout_s)
        with self.lock:
            old = self.producer_id, self.producer_epoch
            self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
            self.epoch_bump_required = False
        log.info(
            "transactional id %s: producer %d epoch %d -> producer %d epoch %d after a failed "
            "batch (the transaction was aborted; every partition numbers from 0 again)",
            self.transactional_id,
            *old,
            resp.producer_id,
            resp.producer_epoch,
        )
        return resp.producer_id, resp.producer_epoch

    def recover(self, timeout_s: float) -> tuple[int, int] | None:
        """The abort of a transaction whose epoch was bumped (``bump_needed``), Kafka's
        KIP-588: the coordinator aborted the transaction already, and takes the id back
        under a new epoch when its own timeout abort bumped the epoch and nobody initialised
        the id since; PRODUCER_FENCED otherwise (fatal here). Returns the new producer id and
        epoch (None: the epoch was still this producer's, the abort went as usual); READY.

        First an EndTxn(abort) with this epoch, which changes nothing when refused: a
        coordinator that knows of timeout aborts answers INVALID_PRODUCER_EPOCH for such an
        epoch and PRODUCER_FENCED after a new instance; an older coordinator (a rolling
        upgrade) answers PRODUCER_FENCED, and would take InitProducerId below for a new
        instance's, fencing whatever instance holds the id now. Then InitProducerId with this
        producer's id and epoch, which the coordinator checks again."""
        probe = self._end_txn_request(committed=False)
        try:
            self._call("EndTxn", probe, timeout_s)
        except StromError as exc:
            self._refused_back(exc, allow=E.INVALID_PRODUCER_EPOCH)
        else:
            self._ready()
            return None
        req = storage_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
        )
        try:
            resp = self._call("InitProducerId", req, timeout_s)
        except StromError as exc:
            self._refused_back(exc)
            raise  # (not reached: _refused_back raises)
        with self.lock:
            self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
            self.epoch_bump_required = False  # (a new epoch: every partition from 0)
            self._ready_locked()
        log.info(
            "transactional id %s: taken back under producer id %d epoch %d after its epoch "
            "was bumped (the transaction was aborted)",
            self.transactional_id,
            resp.producer_id,
            resp.producer_epoch,
        )
        return resp.producer_id, resp.producer_epoch

    def _refused_back(self, exc: StromError, allow: int | None = None) -> None:
        """A coordinator call of :meth:`recover` failed: returns for its ``allow`` code;
        raises the fatal error after a fencing answer, else ``exc`` (no answer, or a
        retriable one that outlasted the call: still abortable, abort_transaction() may ask
        again)."""
        answered = getattr(exc, "answered", False)
        if answered and exc.code == allow:
            return
        if answered and (exc.code in _FATAL or exc.code == E.INVALID_PRODUCER_EPOCH):
            self.fail(exc if exc.code in _FATAL else ProducerFencedError(exc.message))
            if self.error is not None and self.phase is TxnPhase.FATAL_ERROR:
                raise self.error from None
        with self.lock:
            if self.phase is TxnPhase.ABORTING:  # (so that abort_transaction() is taken)
                self.phase = TxnPhase.ABORTABLE_ERROR
        raise exc

    def _ready(self) -> None:
        """The transaction is over: READY for the next one."""
        with self.lock:
            self._ready_locked()

    def _ready_locked(self) -> None:
        """:meth:`_ready` with ``lock`` held (also after a new producer id or epoch)."""
        self.phase = TxnPhase.READY
        self.added.clear()
        self.started = self.registered = False
        self.started_at = None
        self.bump_needed = False
        self.error = None
        self.pending_end = None

    def begin(self, timeout_s: float | None = None) -> None:
        """Open a transaction. With ``timeout_s``, an abort that got no answer is first asked
        again: that is always safe (the transaction ends aborted whatever reached the
        coordinator), and a loop that caught the abort's error and went on would otherwise
        be refused here for good. Without it (a caller that must not
        wait) such a begin is refused, naming the call to make."""
        if timeout_s is not None and self.pending_end is False:
            self.end(False, timeout_s)
        self.require(TxnPhase.READY, action="begin_transaction()")
        if self.epoch_bump_required:  # (the producer's begin_transaction() bumps it first)
            raise InvalidTxnStateError(
                "cannot begin_transaction(): the abort of the failed transaction did not get "
                "its new producer epoch (InitProducerId had no answer); call "
                "abort_transaction() again"
            )
        with self.lock:
            self.phase = TxnPhase.IN_TRANSACTION
            self.generation += 1
            self.added.clear()
            self.started = self.registered = False
            self.started_at = None

    def add_partitions(self, parts: Iterable[tuple[str, int]], timeout_s: float) -> None:
        """AddPartitionsToTxn for partitions about to get their first batch.

        The producer calls it on a thread of its own, beside its sender, and the transaction
        may end meanwhile (an abort does not wait for it): ``started`` is set before it is
        sent (an EndTxn must then follow, whatever came of it), and an answer that comes
        after its transaction ended marks nothing (``generation``)."""
        with self.lock:
            generation, was_started = self.generation, self.started
            self.started = True  # (see _maybe_started: put back below if refused)
        by_topic: dict[str, list[int]] = {}
        for t, p in parts:
            by_topic.setdefault(t, []).append(p)
        req = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            topics=[
                common_pb2.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()
            ],
        )
        self._mark_start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                resp = self._call("AddPartitionsToTxn", req, deadline - time.monotonic())
            except StromError as exc:
                self._maybe_started(exc, generation, was_started)
                raise
            failed = [pr for tr in resp.topics for pr in tr.partitions if pr.error_code != E.NONE]
            if not failed or len(failed) < sum(len(tr.partitions) for tr in resp.topics):
                break
            # (the coordinator adds all of a request's partitions or none: not registered)
            if self._retry_refused_add(failed, deadline):
                continue
            error = error_for(failed[0].error_code, failed[0].error_message)
            error.answered = True  # type: ignore[attr-defined]
            self._maybe_started(error, generation, was_started)
            raise error
        if failed:  # (some were added: EndTxn must end them; started stays set)
            raise error_for(failed[0].error_code, failed[0].error_message)
        with self.lock:
            if self.generation == generation:
                self.registered = True
                self.added.update((t, p) for t, ps in by_topic.items() for p in ps)

    def _retry_refused_add(self, failed: list[Any], deadline: float) -> bool:
        """Whether an AddPartitionsToTxn whose partitions were all refused is sent again:
        when every refusal is retriable and time is left (after a backoff). As Kafka's
        producer re-enqueues UNKNOWN_TOPIC_OR_PARTITION: the partitions are the leaders' (the
        producer sends only to partitions its metadata has), and a coordinator whose view
        of the topics lags (a topic just created, a coordinator that was stopped) refuses
        them only for a while."""
        if not all(is_retriable(pr.error_code) for pr in failed):
            return False
        if deadline - time.monotonic() <= self.backoff_s or self.closed.is_set():
            return False
        self.closed.wait(self.backoff_s)
        return True

    def send_offsets(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group: GroupMetadata,
        timeout_s: float,
    ) -> None:
        """AddOffsetsToTxn, then TxnOffsetCommit to the group's coordinator."""
        self.require(TxnPhase.IN_TRANSACTION, action="send_offsets_to_transaction()")
        self._mark_start()
        try:
            try:
                self._call(
                    "AddOffsetsToTxn",
                    coordinator_pb2.AddOffsetsToTxnRequest(
                        transactional_id=self.transactional_id,
                        producer_id=self.producer_id,
                        producer_epoch=self.producer_epoch,
                        group_id=group.group_id,
                    ),
                    timeout_s,
                )
            except StromError as exc:
                self._maybe_started(exc)
                raise
            self.started = self.registered = True
            self._txn_offset_commit(offsets, group, time.monotonic() + timeout_s)
        except StromError as exc:
            self.fail(exc)
            raise

    def _txn_offset_commit(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group: GroupMetadata,
        deadline: float,
    ) -> None:
        """TxnOffsetCommit of ``offsets`` to the group's coordinator, until ``deadline``.

        Partitions refused with a retriable error (UNKNOWN_TOPIC_OR_PARTITION from a
        coordinator whose view of the topics lags behind a topic just created,
        COORDINATOR_LOAD_IN_PROGRESS while a shard loads) are sent again after a backoff,
        as Kafka's producer re-enqueues its TxnOffsetCommit: only those partitions, the
        others are in the transaction already, as AddPartitionsToTxn retries the same
        refusal (:meth:`_retry_refused_add`). Any other
        refusal raises (a CommitFailedError for a member out of the group, as Kafka)."""
        pending = dict(offsets)
        while True:
            req = coordinator_pb2.TxnOffsetCommitRequest(
                transactional_id=self.transactional_id,
                group_id=group.group_id,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                member_id=group.member_id,
                member_epoch=group.member_epoch,
            )
            add_offsets(req, pending)
            resp = self._call(
                "TxnOffsetCommit",
                req,
                deadline - time.monotonic(),
                key=group.group_id,
                key_type=storage_pb2.COORDINATOR_TYPE_GROUP,
            )
            failed = [(tr.topic, pr) for tr in resp.topics for pr in tr.partitions if pr.error_code]
            if not failed:
                return
            retry = (
                all(is_retriable(pr.error_code) for _, pr in failed)
                and deadline - time.monotonic() > self.backoff_s
                and not self.closed.is_set()
            )
            if retry:
                self.closed.wait(self.backoff_s)
                # Time again after the backoff: on a loaded machine the wait outlasts it, and
                # a call sent with no time left answers a timeout, not the refusal (CI).
                retry = deadline > time.monotonic() and not self.closed.is_set()
            if retry:
                refused = {(t, pr.partition) for t, pr in failed}
                pending = {
                    tp: om for tp, om in pending.items() if (tp.topic, tp.partition) in refused
                }
                continue
            topic, pr = failed[0]
            raise commit_failed_error(
                error_for(pr.error_code, f"{topic}-{pr.partition}: {pr.error_message}")
            )

    def _mark_start(self) -> None:
        """Before an Add*ToTxn: the transaction's timeout may start at the coordinator."""
        with self.lock:
            if self.started_at is None:
                self.started_at = time.monotonic()

    def _maybe_started(
        self, exc: StromError, generation: int | None = None, was_started: bool = True
    ) -> None:
        """After a failed Add*ToTxn: a refusal the coordinator answered added nothing; a call
        that got no answer (timed out, broke) may have, and then EndTxn must end it. An
        AddPartitionsToTxn (``generation`` given) set ``started`` before it was sent: a
        refusal puts back ``was_started``, unless the transaction changed meanwhile or
        another call of it was accepted (``registered``)."""
        if not getattr(exc, "answered", False):
            self.started = True
        elif generation is not None:
            with self.lock:
                if self.generation == generation and not self.registered:
                    self.started = was_started

    def end(self, commit: bool, timeout_s: float) -> None:
        """EndTxn; back to READY once the coordinator has the decision. A transaction that
        registered nothing with the coordinator ends here (the coordinator may still be
        completing the previous one, which an EndTxn would be refused for)."""
        if not self.started and self.phase is not TxnPhase.PREPARED:
            with self.lock:
                self.phase = TxnPhase.READY
                self.added.clear()
                self.error = None
            return
        req = self._end_txn_request(committed=commit)
        try:
            self._call("EndTxn", req, timeout_s)
        except InvalidTxnStateError as exc:
            if not self._nothing_to_abort(commit, exc):
                self.fail(exc)  # abortable, unless _nothing_to_abort made it fatal
                if self.phase is TxnPhase.FATAL_ERROR and self.error is not None:
                    raise self.error from None
                raise
        except StromError as exc:
            if self.phase is not TxnPhase.FATAL_ERROR and not getattr(exc, "answered", False):
                # No answer (a timeout, a broken connection): the decision may be in. The
                # coordinator answers the same EndTxn again with NONE once it has it (found
                # from outside: the producer went to abortable error, the coordinator
                # committed, and the abort it asked for was refused for good).
                with self.lock:
                    self.pending_end = commit
                raise
            self.fail(exc)
            raise
        with self.lock:
            self.phase = TxnPhase.READY
            self.added.clear()
            self.error = None
            self.pending_end = None

    def _nothing_to_abort(self, commit: bool, exc: InvalidTxnStateError) -> bool:
        """Whether an EndTxn refused INVALID_TXN_STATE was an abort with nothing to abort.

        The coordinator checked the producer id and epoch first (PRODUCER_FENCED otherwise),
        so it has no open transaction of this producer: it refuses an abort only in
        PREPARE_COMMIT / COMPLETE_COMMIT, the previous transaction's commit (it answers an
        abort NONE when its state is EMPTY or an abort). When none of this transaction's
        Add*ToTxn calls was accepted (they went unanswered, to a coordinator that hung and
        was replaced), the transaction never started there and no record of it was written
        (a partition's batches are sent only after it was added), so the abort has nothing
        to do and succeeds, rather than refusing every later begin_transaction().

        When one was accepted, the coordinator should hold the transaction open (a timeout
        abort would have fenced this epoch): records of it may sit in partitions with no
        transaction to end them. No abort can settle that, so the producer fails fatally
        (ProducerFencedError with code INVALID_TXN_STATE, saying so) instead of staying in
        abortable error for ever. A commit refused so, and
        an abort of a transaction prepared by another producer (it was committed), are
        refusals as before."""
        if commit or not getattr(exc, "answered", False) or self.phase is TxnPhase.PREPARED:
            return False
        if self.registered:
            # Raised as ProducerFencedError, as the other fatal coordinator answers are
            # (INVALID_PRODUCER_ID_MAPPING too): what a loop catches as "close the producer".
            self.fail(
                ProducerFencedError(
                    f"the transaction coordinator has no open transaction for "
                    f"{self.transactional_id!r} (producer id {self.producer_id}, epoch "
                    f"{self.producer_epoch}) although it accepted this transaction's "
                    f"partitions ({exc.message}): its records may be left in partitions no "
                    "abort can reach; close this producer (a new one's init_transactions() "
                    "starts a new epoch) and look for hanging transactions with `strom "
                    "transactions find-hanging`",
                    code=E.INVALID_TXN_STATE,
                )
            )
            return False
        log.info(
            "transactional id %s: the abort found no open transaction at the coordinator "
            "(%s); nothing of this transaction was registered, so there is nothing to abort",
            self.transactional_id,
            exc.message,
        )
        return True

    def settle_commit(self, timeout_s: float, within_s: float) -> None:
        """Ask again about a commit that got no answer until the coordinator answers, for up
        to ``within_s`` (each ask up to ``timeout_s``). Returns once it is committed; raises
        the coordinator's answer when it refused (fenced: fatal; otherwise abortable), or
        :class:`~strom.errors.TransactionOutcomeUnknownError` when no answer came in time.
        ``within_s`` is the transaction timeout: a coordinator that is up has decided by
        then (it aborts a transaction it never got the commit of)."""
        deadline = time.monotonic() + within_s
        last: StromError | None = None
        while self.pending_end is True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransactionOutcomeUnknownError(
                    f"the commit of transactional id {self.transactional_id!r} got no answer "
                    f"in {within_s:.0f} s of asking again ({last}): it may have committed; "
                    "close this producer and restart from the committed offsets, or call "
                    "commit_transaction() until it answers"
                ) from last
            try:
                self.end(True, min(timeout_s, remaining))
            except StromError as exc:
                if self.pending_end is not True:
                    raise  # answered: refused (abortable) or fenced (fatal)
                last = exc

    # -- plumbing ------------------------------------------------------------------------------

    def _end_txn_request(self, *, committed: bool) -> coordinator_pb2.EndTxnRequest:
        """An EndTxn for this producer's id and epoch (commit or abort)."""
        return coordinator_pb2.EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            committed=committed,
        )

    def _call(
        self,
        method: str,
        req: Any,
        timeout_s: float,
        *,
        key: str | None = None,
        key_type: int = storage_pb2.COORDINATOR_TYPE_TRANSACTION,
    ) -> Any:
        """A coordinator RPC, retried on retriable errors until ``timeout_s``; raises the
        error of a refused request (fatal ones also end the producer).

        Each attempt leaves a coordinator that stopped answering once another owns the key
        (:meth:`_attempt`), and is sent there at once. Sending the request again to the new
        owner is what a timed-out attempt led to before, and is safe for the same reason: an
        attempt given up on counts as one that got no answer (it may have been applied, so
        :meth:`_maybe_started` and :meth:`end`'s "the decision may be in" hold), and the
        new owner replayed whatever the old one wrote before its fence. AddPartitionsToTxn
        and AddOffsetsToTxn add what may be there already, TxnOffsetCommit writes the same
        offsets again, and EndTxn with the decision the coordinator already has is
        answered NONE again (another decision is refused, as after a timeout)."""
        key = self.transactional_id if key is None else key
        txn = key_type == storage_pb2.COORDINATOR_TYPE_TRANSACTION
        deadline = time.monotonic() + timeout_s
        last = ""
        #: A group's coordinator that took over from one that did not answer (the
        #: transaction coordinator is kept in ``_coordinator`` instead).
        moved_to: str | None = None
        while True:
            if self.closed.is_set():
                raise ProducerClosedError(f"{method} abandoned: the producer was closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"{method} did not succeed within {timeout_s:.1f} s"
                    + (f": {last}" if last else "")
                )
            addr = self._coordinator if txn else moved_to
            moved_to = None
            try:
                if addr is None:
                    # The cluster client's lookup: a refusal (PERMISSION_DENIED on the
                    # transactional id) is an AuthorizationError at once; this class's own
                    # copy took it for a node that did not answer and retried until the
                    # call's timeout.
                    addr = self.client.find_coordinator(
                        key, key_type, timeout_s=min(remaining, self.request_timeout_s)
                    )
                    if txn:
                        self._coordinator = addr
                resp = self._attempt(method, req, addr, key, key_type, deadline)
            except CoordinatorMoved as moved:
                log.info(
                    "no %s answer from coordinator %s in %.1f s, and %s %r is now owned by "
                    "%s: asking there",
                    method,
                    addr,
                    moved.waited_s,
                    "transactional id" if txn else "group",
                    key,
                    moved.address,
                )
                last = (
                    f"coordinator {addr}: no answer in {moved.waited_s:.1f} s (the key moved "
                    f"to {moved.address})"
                )
                if txn:
                    self._coordinator = moved.address
                else:
                    moved_to = moved.address
                continue  # (at once: the new owner was just found to own it)
            except grpc.RpcError as exc:
                if exc.code() in REFUSED_CODES:
                    raise refused(exc) from None
                if exc.code() not in _TRANSPORT:
                    raise older_node(exc, addr, method) or StromError(
                        f"{method} failed: {exc.code().name} {exc.details()}"
                    ) from None
                self._coordinator = None  # (a timed-out one is looked up again)
                last = f"coordinator {addr}: {exc.code().name}"
            except CoordinatorNotAvailableError as exc:
                last = exc.message
            else:
                code = resp.error_code
                if code == E.NONE:
                    return resp
                last = f"{ErrorCode.Name(code)}: {resp.error_message}"
                if code in COORDINATOR_REFRESH_CODES:
                    self._coordinator = None
                elif not is_retriable(code):
                    err = error_for(code, resp.error_message or last)
                    err.answered = True  # type: ignore[attr-defined]  # (see _maybe_started)
                    if code in _FATAL:
                        self.fail(err)
                        with self.lock:
                            assert self.error is not None
                            raise self.error
                    raise err
            self.closed.wait(min(self.backoff_s, max(deadline - time.monotonic(), 0)))

    def _attempt(
        self, method: str, req: Any, addr: str, key: str, key_type: int, deadline: float
    ) -> Any:
        """One attempt of :meth:`_call` at ``addr``: its answer, or the gRPC error it ended
        with (up to ``request_timeout_ms``, and not past the call's ``deadline``); left for
        the key's new owner once it has one (:class:`CoordinatorMoved`, the overdue rule of
        :func:`strom.client.coordinator_calls.call_leaving_moved`: another coordinator takes
        a hung one's shards in ~3 s, well within an attempt). A producer closed
        meanwhile abandons the attempt (ProducerClosedError, as between attempts)."""
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(self.client.channel(addr))
        try:
            return call_leaving_moved(
                self.client,
                getattr(stub, method),
                req,
                addr=addr,
                key=key,
                key_type=key_type,
                timeout_s=attempt_timeout(self.request_timeout_s, deadline),
                deadline=deadline,
                stop=self.closed,
            )
        except CallAbandoned:
            raise ProducerClosedError(f"{method} abandoned: the producer was closed") from None
