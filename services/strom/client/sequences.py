"""The idempotent producer's id, epoch and sequence numbers, on the sender thread.

:class:`Sequences` is mixed into :class:`strom.client.producer.Producer` (through
:class:`strom.client.sender.SenderLoop`): it gets the producer id (InitProducerId), bumps
the epoch when a partition's sequences cannot go on (Kafka's KIP-360), and decides how a
partition's batches are numbered after one failed for good (``_settle``): never giving
another batch a sequence that may be in the log (see strom.client.sender's docstring).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import grpc

from strom.api import storage_pb2
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.cluster import ClusterClient, refused
from strom.client.metadata import PartitionLeader
from strom.client.produce_answers import NONE, _seq_before
from strom.client.transactions import TransactionManager
from strom.client.types import TopicPartition
from strom.errors import (
    OutOfOrderSequenceError,
    ProducerClosedError,
    StromError,
    error_for,
    is_retriable,
)

# The producer's logger, not this module's: users filter the producer's lines on
# "strom.client.producer", and the sender's were always among them.
log = logging.getLogger("strom.client.producer")


class Sequences:
    """The producer id and epoch, and the renumbering of a partition's batches.

    A mixin, as :class:`strom.client.sender.SenderLoop` is: the numbering runs on the
    sender thread under the Producer's lock, over its partition queues. Every attribute is
    set up by ``Producer.__init__``; the annotations say which ones it uses.
    """

    # -- set by Producer.__init__ ----------------------------------------------------------
    idempotent: bool
    request_timeout_s: float
    retry_backoff_s: float
    client_id: str
    _client: ClusterClient
    _txn: TransactionManager | None
    _leaders: dict[TopicPartition, PartitionLeader]
    _fatal: StromError | None
    _producer_id: int
    _producer_epoch: int
    _bump_wanted: bool
    _bump_via: str | None
    _bump_retry_at: float
    _epoch_victims: list[tuple[PartitionQueue, list[ProducerBatch]]]
    _wake: threading.Event

    if TYPE_CHECKING:  # the Producer's, called with the lock held (see there)

        def _close_open(self, topic: str, partition: int) -> None: ...

    if TYPE_CHECKING:  # ProduceAnswers' (failing batches)

        def _fail(
            self, pq: PartitionQueue, batches: list[ProducerBatch], err: BaseException
        ) -> None: ...

        def _fail_all(self, err: StromError, in_flight: StromError | None = None) -> None: ...

    def _ensure_producer_id(self) -> bool:
        if not self.idempotent or self._producer_id >= 0:
            if self._bump_wanted:
                self._bump_epoch()
            return True
        if self._txn is not None:
            return False  # init_transactions() sets it
        return self._init_producer_id(-1, -1)

    def _bump_epoch(self) -> None:
        """A new epoch for a partition that must renumber (see :meth:`_settle`): InitProducerId
        with the current id and epoch answers the same id with epoch + 1 (a new id when the
        epoch space is used up; DESIGN §6 "Idempotent producers"), as Kafka's KIP-360 bump.
        Only partitions that ask for it move to the new epoch, each once nothing of it is in
        flight; the others keep theirs, so nothing else has to wait for the bump. A node that
        cannot bump (refuses the id) gives a new id instead, which serves as well: a new id
        also starts every partition at sequence 0."""
        now = time.monotonic()
        if now < self._bump_retry_at:
            return
        if not self._init_producer_id(
            self._producer_id, self._producer_epoch, bump=True, first=self._bump_via
        ):
            self._bump_retry_at = now + self.retry_backoff_s  # no node answered: not in a loop
        else:
            self._bump_wanted = False
            log.info(
                "producer %s: new epoch %d (producer id %d) for partitions whose sequences "
                "cannot continue",
                self.client_id,
                self._producer_epoch,
                self._producer_id,
            )

    def _init_producer_id(
        self, pid: int, epoch: int, *, bump: bool = False, first: str | None = None
    ) -> bool:
        req = storage_pb2.InitProducerIdRequest(producer_id=pid, producer_epoch=epoch)
        candidates = self._client._candidates()
        if first is not None and not self._client.demoted(first):
            # (the partition's leader, unless it failed lately: then it stays last)
            candidates = list(dict.fromkeys([first, *candidates]))
        for addr in candidates:
            try:
                resp = self._client.storage(addr).InitProducerId(
                    req, timeout=self.request_timeout_s
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._fatal = ProducerClosedError(
                        f"node {addr} does not support idempotent producers; "
                        "use enable_idempotence=False"
                    )
                    self._fail_all(self._fatal)
                    return False
                if exc.code() in (
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNAUTHENTICATED,
                ):
                    # Fatal, as Kafka's ClusterAuthorizationException here: no node will
                    # answer otherwise (an idempotent producer needs WRITE on some topic).
                    self._fatal = refused(exc)
                    self._fail_all(self._fatal)
                    return False
                self._client.demote(addr)  # (asked last next time: it may be hung)
                continue
            if resp.error_code == NONE:
                self._producer_id, self._producer_epoch = resp.producer_id, resp.producer_epoch
                return True
            if bump and not is_retriable(resp.error_code):
                return self._init_producer_id(-1, -1)
            if not is_retriable(resp.error_code):
                self._fatal = error_for(resp.error_code, resp.error_message)
                self._fail_all(self._fatal)
                return False
        return False

    def _settle(self, pq: PartitionQueue) -> bool:
        """With the lock held and nothing of the partition in flight, after a batch failed for
        good: decide how the batches behind it are numbered. Returns False while the
        partition waits for a new epoch.

        A sequence that may be in the log is never given to another batch (found from
        outside: a batch that was appended, then expired while waiting for its retry, had its
        sequence handed to the next batch; the leader took that for a retry and answered with
        the old offset, so the new record was reported written and was nowhere in the log).
        In order:

        - the oldest batch may itself be in the log (an earlier attempt had no clear answer)
          and nothing before it provably is not: it is resent as it was sent; its
          acknowledgement settles everything before it (the leader appends only in
          sequence), a refusal fails it as "may have been written";
        - every batch that failed was refused before any append and none left may be in the
          log: the batches behind take over the failed sequences (no stale copy of a later
          sequence can land after them);
        - otherwise the partition renumbers from 0 under a new epoch (Kafka's KIP-360), which
          the leader takes (DESIGN §6): everything from the first batch that is provably not
          in the log on can never be appended under the old epoch. A transactional producer
          cannot bump on its own (its coordinator owns the epoch): it sends its next new
          batch with the next sequence, which the leader takes if the failed batch is in the
          log; when that is refused too, its batches fail (:meth:`_fail_for_epoch`) until
          the transaction's abort, which gets a new epoch from the coordinator since a batch
          failed (``TransactionManager.bump_epoch``, KIP-360): the partition then renumbers
          from 0 as below.
        """
        head = pq.batches[0]
        if head.maybe_written and (
            pq.reseq_from is None or _seq_before(head.base_sequence, pq.reseq_from)
        ):
            return True
        if not pq.unresolved and not any(b.maybe_written for b in pq.batches):
            if pq.reseq_from is not None:
                self._resequence(pq)
            return True
        if (pq.producer_id, pq.producer_epoch) == (self._producer_id, self._producer_epoch):
            if self._txn is not None and head.base_sequence < 0 and pq.unresolved_seq >= 0:
                # A transactional producer, which cannot bump, goes on with the next
                # sequence: if the batch that failed is in the log (an aborted transaction
                # keeps it there), the leader takes it and that settles the partition.
                return True
            if self._txn is None:
                if not self._bump_wanted:
                    self._bump_wanted = True
                    leader = self._leaders.get((pq.topic, pq.partition))  # == TopicPartition
                    if leader is not None and leader.address is not None:
                        self._bump_via = leader.address
                    self._wake.set()
                return False
            self._fail_for_epoch(pq)
            return False
        # The producer has a newer id or epoch than this partition's sequences: start over.
        pq.producer_id, pq.producer_epoch = self._producer_id, self._producer_epoch
        for b in pq.batches:
            b.maybe_written = False  # (under the new epoch; the old can append none of them)
        pq.reseq_from = 0
        self._resequence(pq)
        pq.unresolved = False
        pq.unresolved_seq = -1
        return True

    def _fail_for_epoch(self, pq: PartitionQueue) -> None:
        """With the lock held: a transactional producer's partition whose sequences cannot
        continue under its epoch; its queued batches (none of which was appended: see
        :meth:`_settle`) fail once the lock is released (the transaction can only abort)."""
        batches = [b for b in pq.batches if not b.sent]
        if not batches:
            return
        if pq.open in batches:
            self._close_open(pq.topic, pq.partition)
        for b in batches:
            b.sent = True
        pq.in_flight += 1  # _done counts one request per call
        self._epoch_victims.append((pq, batches))

    def _fail_epoch_victims(self) -> None:
        while self._epoch_victims:
            pq, batches = self._epoch_victims.pop()
            self._fail(
                pq,
                batches,
                OutOfOrderSequenceError(
                    f"{pq.topic}-{pq.partition}: not written: a record sent before may or may "
                    "not be in the log, so this producer epoch's sequence numbers cannot go "
                    "on; call abort_transaction(): it gets a new epoch, from which the next "
                    "transaction goes on"
                ),
            )

    @staticmethod
    def _resequence(pq: PartitionQueue) -> None:
        """With the lock held and nothing in flight: after a batch failed for good, the ones
        behind it (none of which was appended) take over its sequence numbers."""
        assert pq.reseq_from is not None
        seq = pq.reseq_from
        for b in pq.batches:
            if b is pq.open:  # still taking records: numbered when it is first sent
                b.base_sequence = -1
                break
            b.base_sequence = seq
            seq = (seq + b.count) & 0x7FFFFFFF
        pq.next_sequence = seq
        pq.reseq_from = None
