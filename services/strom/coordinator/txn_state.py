"""The transaction coordinator's engine: one transactional id's state machine (Kafka's
KIP-98 TransactionMetadata), with no gRPC or etcd in it.

States and moves::

    EMPTY / COMPLETE_* --AddPartitions/AddOffsets--> ONGOING --EndTxn--> PREPARE_COMMIT|ABORT
    PREPARE_* --markers written everywhere--> COMPLETE_COMMIT|ABORT
    ONGOING --timeout, or InitProducerId of a new instance--> PREPARE_ABORT (epoch + 1)

Every move returns the new :class:`TxnMetadata` (never mutates the old one) so the service
writes it to ``__transaction_state`` first and adopts it only once that write is durable: a
coordinator that dies in between leaves the log, not its memory, as the truth, and a new
owner that replays a PREPARE_* state finishes writing the markers.

Fencing: InitProducerId bumps the epoch, so the previous instance's requests (older epoch)
get PRODUCER_FENCED here and its batches INVALID_PRODUCER_EPOCH at the partitions once the
markers (written with the new epoch) have reached them. An abort the coordinator starts by
itself (timeout, new instance) also bumps the epoch, for the same reason.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from google.protobuf.message import DecodeError

from strom.api import coordinator_pb2
from strom.coordinator.replay import ReplayState
from strom.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)

#: The compacted internal topic whose partitions are the transaction coordinator's shards.
TRANSACTION_STATE_TOPIC = "__transaction_state"
#: Producer epochs are 16-bit in the batch header; past this the id is replaced.
MAX_EPOCH = 32767
#: Kafka's transaction.max.timeout.ms default (15 minutes).
MAX_TIMEOUT_MS = 15 * 60 * 1000

TopicPartition = tuple[str, int]


class TxnState(enum.IntEnum):
    """Mirrors ``strom.v1.TransactionState``."""

    EMPTY = coordinator_pb2.TRANSACTION_STATE_EMPTY
    ONGOING = coordinator_pb2.TRANSACTION_STATE_ONGOING
    PREPARE_COMMIT = coordinator_pb2.TRANSACTION_STATE_PREPARE_COMMIT
    PREPARE_ABORT = coordinator_pb2.TRANSACTION_STATE_PREPARE_ABORT
    COMPLETE_COMMIT = coordinator_pb2.TRANSACTION_STATE_COMPLETE_COMMIT
    COMPLETE_ABORT = coordinator_pb2.TRANSACTION_STATE_COMPLETE_ABORT
    DEAD = coordinator_pb2.TRANSACTION_STATE_DEAD

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction open or completing."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True)
class TxnMetadata:
    """One transactional id's state (TransactionLogValue)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)
    start_ms: int = -1
    last_update_ms: int = -1
    #: Set (not persisted) when the coordinator aborted on its own: why, for the producer.
    abort_reason: str = ""
    #: The epoch whose open transaction this coordinator aborted because its timeout
    #: passed (bumping past it), while no other instance has initialised the id since; -1
    #: otherwise. Persisted: that producer, and only it, may take the id back under a new
    #: epoch (Kafka's KIP-588; see :func:`init_producer_id`), on any coordinator. None, not
    #: -1, when unset: a request's epoch is compared with it, and -1 must not match.
    timed_out_epoch: int | None = None
    #: The epoch an InitProducerId taking the id back (its producer id and epoch given) bumped
    #: to ``producer_epoch``, while nothing has bumped it since; -1 otherwise. Persisted: the
    #: same request again (its answer was lost: a client timeout, a broken connection) gets
    #: the same answer instead of PRODUCER_FENCED (Kafka's lastProducerEpoch), on any
    #: coordinator. Only that producer holds that epoch, so nobody else can ask so. None when
    #: unset (as ``timed_out_epoch``).
    granted_from_epoch: int | None = None

    # -- the log record ------------------------------------------------------------------------

    def to_value(self) -> bytes:
        by_topic: dict[str, list[int]] = {}
        for t, p in self.partitions:
            by_topic.setdefault(t, []).append(p)
        v = coordinator_pb2.TransactionLogValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.timeout_ms,
            state=int(self.state),  # type: ignore[arg-type]
            groups=sorted(self.groups),
            transaction_start_ms=self.start_ms,
            last_update_ms=self.last_update_ms,
        )
        if self.timed_out_epoch is not None:
            v.timed_out_epoch = self.timed_out_epoch
        if self.granted_from_epoch is not None:
            v.granted_from_epoch = self.granted_from_epoch
        for t in sorted(by_topic):
            v.topics.add(topic=t, partitions=sorted(by_topic[t]))
        return v.SerializeToString()

    @classmethod
    def from_value(cls, transactional_id: str, value: bytes) -> TxnMetadata:
        v = coordinator_pb2.TransactionLogValue.FromString(value)
        return cls(
            transactional_id,
            v.producer_id,
            v.producer_epoch,
            v.transaction_timeout_ms,
            TxnState(v.state),
            frozenset((tp.topic, p) for tp in v.topics for p in tp.partitions),
            frozenset(v.groups),
            v.transaction_start_ms,
            v.last_update_ms,
            timed_out_epoch=v.timed_out_epoch if v.HasField("timed_out_epoch") else None,
            granted_from_epoch=(v.granted_from_epoch if v.HasField("granted_from_epoch") else None),
        )

    # -- checks --------------------------------------------------------------------------------

    def check_producer(self, producer_id: int, producer_epoch: int) -> None:
        """The request's producer must be this id's current one (its epoch already checked
        by :func:`check_epoch` where the request came in)."""
        if producer_id != self.producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {self.transactional_id!r} maps to producer id "
                f"{self.producer_id}, not {producer_id}"
            )
        if producer_epoch < self.producer_epoch and producer_epoch == self.timed_out_epoch:
            # Not a newer instance: abortable, and InitProducerId takes the id back.
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {producer_epoch} of {self.transactional_id!r}: "
                "the transaction coordinator aborted its transaction because "
                f"transaction.timeout.ms={self.timeout_ms} passed, and bumped the epoch to "
                f"{self.producer_epoch}; no other instance has initialised the id since"
            )
        if producer_epoch < self.producer_epoch and producer_epoch == self.granted_from_epoch:
            # The same producer, which asked for its id back and may have lost the answer.
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {producer_epoch} of {self.transactional_id!r}: "
                f"InitProducerId with this epoch gave it epoch {self.producer_epoch} already "
                "(the same InitProducerId again is answered so again)"
            )
        if producer_epoch < self.producer_epoch:
            why = f" ({self.abort_reason})" if self.abort_reason else ""
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} of {self.transactional_id!r} is "
                f"fenced: epoch {self.producer_epoch} took over{why}"
            )
        if producer_epoch > self.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} is newer than the coordinator's "
                f"{self.producer_epoch}: the id was re-initialised elsewhere"
            )

    # -- moves ---------------------------------------------------------------------------------

    def add(
        self,
        producer_id: int,
        producer_epoch: int,
        now_ms: int,
        *,
        partitions: Iterable[TopicPartition] = (),
        groups: Iterable[str] = (),
    ) -> TxnMetadata | None:
        """AddPartitionsToTxn / AddOffsetsToTxn: the new state, or None when nothing changes
        (everything was added already)."""
        self.check_producer(producer_id, producer_epoch)
        if self.state.preparing:
            raise ConcurrentTransactionsError(
                f"the previous transaction of {self.transactional_id!r} is still being completed"
            )
        if self.state is not TxnState.ONGOING and not self.state.idle:
            raise InvalidTxnStateError(f"{self.transactional_id!r} is {self.state.name}")
        new_parts = self.partitions | frozenset(partitions)
        new_groups = self.groups | frozenset(groups)
        if self.state is TxnState.ONGOING and (new_parts, new_groups) == (
            self.partitions,
            self.groups,
        ):
            return None
        if self.state.idle:  # a new transaction starts
            new_parts, new_groups = frozenset(partitions), frozenset(groups)
        return replace(
            self,
            state=TxnState.ONGOING,
            partitions=new_parts,
            groups=new_groups,
            start_ms=self.start_ms if self.state is TxnState.ONGOING else now_ms,
            last_update_ms=now_ms,
            abort_reason="",
        )

    def end(
        self, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> TxnMetadata | None:
        """EndTxn: the PREPARE_* state to write, or None when the request repeats a decision
        already made (a retry after a lost answer)."""
        self.check_producer(producer_id, producer_epoch)
        wanted = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if self.state in (wanted, done):
            return None
        if self.state is TxnState.EMPTY and not commit:
            return None  # nothing was added: an abort of nothing
        if self.state is not TxnState.ONGOING:
            raise InvalidTxnStateError(
                f"cannot {'commit' if commit else 'abort'} the transaction of "
                f"{self.transactional_id!r}: it is {self.state.name}"
            )
        return replace(self, state=wanted, last_update_ms=now_ms)

    def abort_fencing(self, now_ms: int, reason: str, *, timed_out: bool = False) -> TxnMetadata:
        """The coordinator aborts the open transaction itself (timeout, a new instance) and
        bumps the epoch, so the old instance can write nothing more to it. After a timeout
        (``timed_out``) that instance may take the id back (``timed_out_epoch``)."""
        if self.state is not TxnState.ONGOING:
            raise InvalidTxnStateError(f"{self.transactional_id!r} has no open transaction")
        return replace(
            self,
            state=TxnState.PREPARE_ABORT,
            producer_epoch=self.producer_epoch + 1,
            last_update_ms=now_ms,
            abort_reason=reason,
            timed_out_epoch=self.producer_epoch if timed_out else None,
            granted_from_epoch=None,
        )

    def complete(self, now_ms: int) -> TxnMetadata:
        """Every marker is written: COMPLETE_COMMIT / COMPLETE_ABORT."""
        if not self.state.preparing:
            raise InvalidTxnStateError(f"{self.transactional_id!r} is {self.state.name}")
        return replace(
            self,
            state=(
                TxnState.COMPLETE_COMMIT
                if self.state is TxnState.PREPARE_COMMIT
                else TxnState.COMPLETE_ABORT
            ),
            partitions=frozenset(),
            groups=frozenset(),
            start_ms=-1,
            last_update_ms=now_ms,
        )

    def seen_at(self, now_ms: int, shift_ms: int = 0) -> TxnMetadata:
        """The state as a coordinator that loads it at ``now_ms`` keeps it.

        ``shift_ms`` takes the writer's times onto the loader's clock: both write
        ``strom.clock.steady_ms``, which trails or leads its wall clock for hours after a
        step (it slews), so the writer's steady time of the start is translated through
        the wall clock (:meth:`TxnShardState.shift_for`). Without it, a transaction begun on
        an owner whose wall clock had just been stepped forward 7 minutes looked 7 minutes
        older to the next owner, which aborted it at once after a failover.

        Times still ahead of ``now_ms`` (the previous owner's clock ran ahead, or was
        stepped back since) count from ``now_ms``, so an open transaction times out at most
        its timeout after the load instead of waiting for the loader's clock to catch up."""
        start = min(self.start_ms + shift_ms, now_ms) if self.start_ms >= 0 else self.start_ms
        update = (
            min(self.last_update_ms + shift_ms, now_ms)
            if self.last_update_ms >= 0
            else self.last_update_ms
        )
        if (start, update) == (self.start_ms, self.last_update_ms):
            return self
        return replace(self, start_ms=start, last_update_ms=update)

    def expired(self, now_ms: int) -> bool:
        """An open transaction older than its timeout."""
        return self.state is TxnState.ONGOING and now_ms - self.start_ms > self.timeout_ms


def check_epoch(epoch: int, field: str = "producer_epoch") -> None:
    """Refuse a producer epoch no producer can hold: epochs are 16-bit in the batch header
    and never negative once assigned. Such a value is a malformed request, not an older or
    newer instance (PRODUCER_FENCED or "timed out" would mislead). Checked where each
    request comes in, once."""
    if not 0 <= epoch <= MAX_EPOCH:
        raise InvalidRequestError(f"{field}={epoch} is outside 0..{MAX_EPOCH}")


def check_txn_offsets(
    meta: TxnMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    group_id: str,
    *,
    full: bool = True,
) -> None:
    """A TxnOffsetCommit must belong to the open transaction of its transactional id, and
    that transaction must have added the group (AddOffsetsToTxn), as Kafka's KIP-890
    verification requires: otherwise any client could leave offsets pending under an epoch
    the real producer never had, fencing that producer's own offsets in the group.

    ``meta`` is the id's state (None: unknown id). ``full``: it is this process's own
    state; a copy from another coordinator's DescribeTransactions lacks the timed-out
    epoch, so an older epoch is answered INVALID_PRODUCER_EPOCH (abortable: the producer's
    EndTxn then learns from the transaction coordinator whether it was fenced or timed out).

    Raises:
        InvalidRequestError, InvalidProducerIdMappingError, ProducerFencedError,
        InvalidProducerEpochError, InvalidTxnStateError.
    """
    if meta is None or meta.state is TxnState.DEAD:
        raise InvalidProducerIdMappingError(
            f"transactional id {transactional_id!r} is unknown to the transaction coordinator"
        )
    if not full and producer_id == meta.producer_id and producer_epoch < meta.producer_epoch:
        raise InvalidProducerEpochError(
            f"producer {producer_id} epoch {producer_epoch} of {transactional_id!r} is older "
            f"than the transaction coordinator's {meta.producer_epoch}"
        )
    meta.check_producer(producer_id, producer_epoch)
    if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
        now = (
            f"it is {meta.state.name}"
            if meta.state is not TxnState.ONGOING
            else "its open transaction has not added it"
        )
        raise InvalidTxnStateError(
            f"TxnOffsetCommit for group {group_id!r} outside a transaction of "
            f"{transactional_id!r} that added it with AddOffsetsToTxn ({now})"
        )


def check_timeout(timeout_ms: int, max_timeout_ms: int = MAX_TIMEOUT_MS) -> None:
    if not 1 <= timeout_ms <= max_timeout_ms:
        raise InvalidTransactionTimeoutError(
            f"transaction_timeout_ms={timeout_ms} is outside 1..{max_timeout_ms} "
            "(transaction.max.timeout.ms)"
        )


@dataclass(frozen=True)
class InitResult:
    """What InitProducerId decided: the metadata to write, and whether the caller must wait
    (an open transaction of the previous instance is being aborted first)."""

    metadata: TxnMetadata
    retry_later: bool = False


def init_producer_id(
    current: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    now_ms: int,
    new_producer_id: Callable[[], int],
    max_timeout_ms: int = MAX_TIMEOUT_MS,
    *,
    expected: tuple[int, int] | None = None,
    asked_epoch: int | None = None,
) -> InitResult:
    """InitProducerId for a transactional id.

    ``expected``: the (producer id, epoch) of a producer taking its id back (Kafka's
    KIP-588), after the coordinator aborted its transaction for the timeout: allowed only
    for that epoch (``timed_out_epoch``) or the current one, else PRODUCER_FENCED (another
    instance initialised the id since) or INVALID_PRODUCER_ID_MAPPING; then as below. Such
    a request is idempotent: the one before it with the same epoch bumped the epoch
    (``granted_from_epoch``) and its answer may have been lost, so while nothing has bumped
    it since, the same request gets the same epoch again (Kafka's lastProducerEpoch retry;
    before, the retry was PRODUCER_FENCED and the producer was lost for good).
    ``asked_epoch`` is the epoch the producer sent, when ``expected`` was moved on since
    (the coordinator aborted that epoch's open transaction first): what a retry carries.

    - unknown id: a new producer id (from ``new_producer_id``), epoch 0;
    - no transaction open: the epoch + 1 (a new id past the 16-bit epoch space);
    - a transaction open: it is aborted with a bumped epoch first; the caller answers
      CONCURRENT_TRANSACTIONS and the producer retries once the abort completed;
    - a transaction completing: CONCURRENT_TRANSACTIONS.
    """
    check_timeout(timeout_ms, max_timeout_ms)
    if expected is not None:
        _check_expected(current, transactional_id, *expected)
        assert current is not None  # (_check_expected refuses an unknown id)
        if expected[1] != current.producer_epoch and expected[1] == current.granted_from_epoch:
            return InitResult(current)  # a retry: the answer it lost, unchanged
        if asked_epoch is None:
            asked_epoch = expected[1]
    if current is None or current.state is TxnState.DEAD:
        return InitResult(
            TxnMetadata(transactional_id, new_producer_id(), 0, timeout_ms, last_update_ms=now_ms)
        )
    if current.state.preparing:
        raise ConcurrentTransactionsError(
            f"the previous transaction of {transactional_id!r} is still being completed"
        )
    if current.state is TxnState.ONGOING:
        return InitResult(
            current.abort_fencing(now_ms, "a new producer instance initialised the id"),
            retry_later=True,
        )
    pid, epoch = current.producer_id, current.producer_epoch + 1
    if epoch > MAX_EPOCH:
        pid, epoch = new_producer_id(), 0
        asked_epoch = None  # (a retry carries the old producer id: refused, as before)
    return InitResult(
        replace(
            current,
            producer_id=pid,
            producer_epoch=epoch,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=frozenset(),
            groups=frozenset(),
            start_ms=-1,
            last_update_ms=now_ms,
            abort_reason="",
            timed_out_epoch=None,
            granted_from_epoch=asked_epoch,
        )
    )


def _check_expected(
    current: TxnMetadata | None, transactional_id: str, producer_id: int, epoch: int
) -> None:
    """An InitProducerId taking the id back must come from its current producer, or from
    the one whose transaction timed out, with no other instance initialised since (which
    resets ``timed_out_epoch``): any other caller is a zombie."""
    if current is None or current.state is TxnState.DEAD or current.producer_id != producer_id:
        raise InvalidProducerIdMappingError(
            f"transactional id {transactional_id!r} does not map to producer id {producer_id}"
            + ("" if current is None else f" (it maps to {current.producer_id})")
        )
    if epoch in (current.producer_epoch, current.timed_out_epoch, current.granted_from_epoch):
        return
    raise ProducerFencedError(
        f"producer {producer_id} epoch {epoch} of {transactional_id!r} is fenced: epoch "
        f"{current.producer_epoch} took over"
        + (f" ({current.abort_reason})" if current.abort_reason else "")
    )


def txn_log_key(transactional_id: str) -> bytes:
    """The record key of a transactional id in ``__transaction_state``."""
    return coordinator_pb2.TransactionLogKey(transactional_id=transactional_id).SerializeToString(
        deterministic=True
    )


def decode_txn_log_key(key: bytes) -> str | None:
    """The transactional id of a record key; None for records that are not an id's (the
    shard owner's fence record)."""
    try:
        k = coordinator_pb2.TransactionLogKey.FromString(key)
    except DecodeError:
        return None
    return k.transactional_id or None


class TxnShardState(ReplayState):
    """A shard's transactional ids rebuilt from ``__transaction_state`` (latest per key)."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions: dict[str, TxnMetadata] = {}
        #: Per id, how far its writer's wall clock was ahead of the steady clock it wrote
        #: the times with (the batch timestamp minus ``last_update_ms``): see shift_for.
        self.writer_skew: dict[str, int] = {}

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        tid = decode_txn_log_key(key) if key else None
        if tid is None:
            self.skipped += 1
        elif value is None:
            self.transactions.pop(tid, None)
            self.writer_skew.pop(tid, None)
        else:
            meta = TxnMetadata.from_value(tid, value)
            self.transactions[tid] = meta
            if self.batch_timestamp >= 0 and meta.last_update_ms >= 0:
                self.writer_skew[tid] = self.batch_timestamp - meta.last_update_ms
            else:
                self.writer_skew.pop(tid, None)

    def shift_for(self, transactional_id: str, own_skew_ms: int) -> int:
        """What to add to the id's written times to read them on the loader's steady clock
        (:meth:`TxnMetadata.seen_at`), given the loader's own wall-minus-steady skew.

        The writer stamped the batch with its wall clock a moment after its engine step read
        its steady clock for ``last_update_ms``: the difference is its skew then (plus the
        append's queueing, which only makes the transaction look that much younger). Writer
        steady + writer skew is wall time; wall time - loader skew is the loader's steady.
        Ids replayed from records without a batch time are not shifted."""
        skew = self.writer_skew.get(transactional_id)
        return 0 if skew is None else skew - own_skew_ms
