"""The coordinator's transaction RPCs (DESIGN §6 "Transactions"), mixed into
:class:`~strom.coordinator.service.CoordinatorService`.

The transaction coordinator side: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
EndTxn, DescribeTransactions, ListTransactions. Every state change of a transactional id
(:mod:`strom.coordinator.txn_state`) is written to its shard of ``__transaction_state``
(acks=all, the shard owner's fenced producer) before it is acted on or answered.

Ending a transaction is two-phase, as in Kafka:

1. EndTxn writes PREPARE_COMMIT / PREPARE_ABORT: the decision is durable, EndTxn answers.
2. In the background the markers go to every partition of the transaction
   (WriteTxnMarkers to each leader, retried until every one is in, following leader
   changes), and every group that took offsets in it completes them (CompleteTxnOffsets on
   the group's coordinator: applied on commit, dropped on abort).
3. COMPLETE_COMMIT / COMPLETE_ABORT is written. Until then the id answers
   CONCURRENT_TRANSACTIONS to anything that would start its next transaction.

A coordinator that dies between 1 and 3 leaves PREPARE_* in the log: the next owner replays
it and finishes steps 2 and 3 (markers and offset completion are idempotent). A transaction
open longer than its ``transaction.timeout.ms`` is aborted by the coordinator with a bumped
epoch, which fences the producer that let it expire.

The group coordinator side: TxnOffsetCommit (offsets pending in a transaction) and
CompleteTxnOffsets (called by the transaction coordinator in step 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc

from strom.api import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from strom.client.coordinator_calls import OVERDUE_GRACE_S, OVERDUE_RECHECK_S
from strom.clock import steady_ms, wall_ms
from strom.coordinator import metrics
from strom.coordinator.group import ConsumerGroup
from strom.coordinator.group_types import OffsetsResult
from strom.coordinator.lookup import find_coordinator
from strom.coordinator.offset_rpcs import commit_error
from strom.coordinator.offsets_log import GroupRecord, OffsetAndMetadata
from strom.coordinator.request_bounds import check_group_id
from strom.coordinator.shard_writes import settled
from strom.coordinator.shards import Shard
from strom.coordinator.txn_state import (
    MAX_EPOCH,
    TxnMetadata,
    TxnState,
    check_epoch,
    check_timeout,
    check_txn_offsets,
    init_producer_id,
    txn_log_key,
)
from strom.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    ErrorCode,
    GroupIdNotFoundError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    NotCoordinatorError,
    StromError,
    error_name,
)
from strom.metadata import ClusterView

if TYPE_CHECKING:
    from strom.coordinator.shard_ownership import ShardOwnership

    _Base = ShardOwnership
else:
    _Base = object

log = logging.getLogger("strom.coordinator.txn")
E = ErrorCode
#: How long one WriteTxnMarkers request may wait for the in-sync replicas.
MARKER_TIMEOUT_MS = 10_000
#: How long a request that would start the next transaction waits for the previous one to
#: complete before answering CONCURRENT_TRANSACTIONS (the client then retries).
COMPLETION_WAIT_S = 5.0
#: Kafka's transactional.id.expiration.ms default (7 days): an id with no transaction open
#: or completing and no change for this long is removed from ``__transaction_state``.
ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 1.0
#: The longest a TxnOffsetCommit waits for the transaction coordinator (another process) to
#: describe the transaction it belongs to.
TXN_LOOKUP_TIMEOUT_S = 10.0


def _now_ms() -> int:
    """Transaction start and update times: :func:`strom.clock.steady_ms`, so a step of the wall
    clock neither aborts every open transaction nor leaves an abandoned one open for as long
    as the step (its timeout is measured on this clock)."""
    return steady_ms()


class TransactionRpcs(_Base):
    """Transaction coordinator and transactional-offset RPCs (see the module docstring)."""

    #: transactional.id.expiration.ms (``--transactional-id-expiration-ms``).
    txn_id_expiration_ms: int = ID_EXPIRATION_MS

    # -- shards --------------------------------------------------------------------------------

    def _txn_shard(self, transactional_id: str) -> Shard:
        """The loaded transaction shard of ``transactional_id``; raises the usual errors."""
        if not transactional_id:
            raise InvalidRequestError("transactional_id must not be empty")
        return self._loaded_shard(self.txn_kind, transactional_id)

    async def _txn_write(self, shard: Shard, meta: TxnMetadata) -> None:
        """Make ``meta`` durable, then the in-memory state (shard lock held, so every read of
        the id's state under the lock sees only what the log has)."""
        self._check_serving(shard)
        written = self._queue_write(
            shard, [GroupRecord(txn_log_key(meta.transactional_id), meta.to_value())]
        )
        try:
            await asyncio.shield(written)
        except asyncio.CancelledError:
            # The caller gave up (deadline, stop); the append did not. Still holding the
            # shard lock (nobody may read the old state once the log has the new one: a
            # logged commit decision must not be overwritten by a timeout's abort), wait for
            # it to end, then reload the shard: the log decides, and the reload resumes the
            # completion of a transaction whose decision it holds.
            generation = shard.generation
            await settled(written)
            ours = shard.kind is not None and shard.kind.shards.get(shard.index) is shard
            if ours and shard.generation == generation and not self._stopping:
                log.warning(
                    "a write to %s shard %d was abandoned by its caller; reloading the shard",
                    shard.topic,
                    shard.index,
                )
                self._start_load(shard)
            raise
        self._adopt(shard, meta)

    @staticmethod
    def _adopt(shard: Shard, meta: TxnMetadata) -> None:
        """``meta`` is durable: make it the in-memory state."""
        shard.transactions[meta.transactional_id] = meta
        tid = meta.transactional_id
        if meta.state.preparing:
            shard.completing.setdefault(tid, asyncio.Event())
        else:
            done = shard.completing.pop(tid, None)
            if done is not None:
                done.set()

    async def _txn_change(
        self,
        transactional_id: str,
        change: Callable[[TxnMetadata], TxnMetadata | None],
        *,
        wait_s: float = 0.0,
    ) -> tuple[Shard, TxnMetadata, bool]:
        """Apply ``change`` to the id's state under the shard lock and write the result;
        returns (shard, state now, whether it changed). Unknown ids are refused. With
        ``wait_s``, a change refused because the previous transaction is still completing
        waits (up to ``wait_s``) for it to complete and is tried again: the next transaction
        then starts as soon as it can, without a client-side backoff."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return await self._txn_change_once(transactional_id, change)
            except ConcurrentTransactionsError:
                shard = self._txn_shard(transactional_id)
                done = shard.completing.get(transactional_id)
                left = deadline - time.monotonic()
                if done is None or left <= 0:
                    raise
                try:
                    await asyncio.wait_for(done.wait(), left)
                except TimeoutError:
                    raise ConcurrentTransactionsError(
                        f"the previous transaction of {transactional_id!r} is still being completed"
                    ) from None

    async def _txn_change_once(
        self,
        transactional_id: str,
        change: Callable[[TxnMetadata], TxnMetadata | None],
    ) -> tuple[Shard, TxnMetadata, bool]:
        shard = self._txn_shard(transactional_id)
        async with shard.lock:
            # The shard may have been given up while this waited for the lock: its emptied
            # table must not answer "unknown id" (fatal to the producer) for it.
            self._check_serving(shard)
            current = shard.transactions.get(transactional_id)
            if current is None:
                raise InvalidProducerIdMappingError(
                    f"transactional id {transactional_id!r} is unknown here: call "
                    "InitProducerId first"
                )
            new = change(current)
            if new is None or new == current:
                return shard, current, False
            await self._txn_write(shard, new)
            return shard, new, True

    # -- transaction coordinator RPCs ----------------------------------------------------------

    async def InitProducerId(
        self, request: storage_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.InitProducerIdResponse:
        resp = storage_pb2.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        try:
            if not request.HasField("transactional_id") or not request.transactional_id:
                raise InvalidRequestError(
                    "InitProducerId on a coordinator needs a transactional_id (idempotent "
                    "producers ask a storage node)"
                )
            tid = request.transactional_id
            check_timeout(request.transaction_timeout_ms, self.txn_max_timeout_ms)
            expected = _expected_producer(request)
            # (what a retry of this request carries, whatever ``expected`` becomes below)
            asked_epoch = None if expected is None else expected[1]
            deadline = time.monotonic() + COMPLETION_WAIT_S
            while True:
                shard = self._txn_shard(tid)
                done = shard.completing.get(tid)
                if done is not None:  # the previous transaction is completing: wait for it
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ConcurrentTransactionsError(
                            f"the previous transaction of {tid!r} is still being completed"
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), left)
                    continue
                current = shard.transactions.get(tid)
                fresh_pid = -1
                if current is None or current.producer_epoch >= MAX_EPOCH:
                    fresh_pid, _ = await self._init_producer(-1, -1)
                async with shard.lock:
                    self._check_serving(shard)  # given up while this waited: look it up again
                    current = shard.transactions.get(tid)
                    result = init_producer_id(
                        current,
                        tid,
                        request.transaction_timeout_ms,
                        _now_ms(),
                        lambda pid=fresh_pid: pid,
                        self.txn_max_timeout_ms,
                        expected=expected,
                        asked_epoch=asked_epoch,
                    )
                    if result.metadata.producer_id < 0:
                        continue  # the id appeared meanwhile: look again
                    if result.metadata != current:  # (a retry's answer changes nothing)
                        await self._txn_write(shard, result.metadata)
                if not result.retry_later:
                    break
                # The previous instance left a transaction open: abort it (its bumped epoch
                # fences that instance), then bump again for this one.
                self._spawn(self._finish(shard, result.metadata, by="fenced"))
                if expected is not None:  # (the producer's own epoch, just bumped)
                    expected = (result.metadata.producer_id, result.metadata.producer_epoch)
            resp.producer_id = result.metadata.producer_id
            resp.producer_epoch = result.metadata.producer_epoch
            log.info(
                "transactional id %s -> producer %d epoch %d",
                tid,
                resp.producer_id,
                resp.producer_epoch,
            )
        except Exception as exc:
            self._fail("InitProducerId", resp, exc)
        return resp

    async def AddPartitionsToTxn(
        self,
        request: coordinator_pb2.AddPartitionsToTxnRequest,
        context: grpc.aio.ServicerContext,
    ) -> coordinator_pb2.AddPartitionsToTxnResponse:
        resp = coordinator_pb2.AddPartitionsToTxnResponse()
        wanted = [(tp.topic, p) for tp in request.topics for p in tp.partitions]
        try:
            check_epoch(request.producer_epoch)
            topics = self._topics()
            unknown = {
                (tp.topic, p)
                for tp in request.topics
                for p in tp.partitions
                if not (tp.topic in topics and 0 <= p < topics[tp.topic])
            }
            if not unknown:
                now = _now_ms()
                await self._txn_change(
                    request.transactional_id,
                    lambda m: m.add(
                        request.producer_id, request.producer_epoch, now, partitions=wanted
                    ),
                    wait_s=COMPLETION_WAIT_S,
                )
        except Exception as exc:
            self._fail("AddPartitionsToTxn", resp, exc)
            return resp
        for tp in request.topics:
            tr = resp.topics.add(topic=tp.topic)
            for p in tp.partitions:
                pr = tr.partitions.add(partition=p)
                if (tp.topic, p) in unknown:
                    pr.error_code = E.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[assignment]
                    pr.error_message = f"unknown topic or partition {tp.topic}-{p}"
        return resp

    async def AddOffsetsToTxn(
        self, request: coordinator_pb2.AddOffsetsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.AddOffsetsToTxnResponse:
        resp = coordinator_pb2.AddOffsetsToTxnResponse()
        try:
            check_epoch(request.producer_epoch)
            if not request.group_id:
                raise InvalidRequestError("group_id must not be empty")
            check_group_id(request.group_id)
            now = _now_ms()
            await self._txn_change(
                request.transactional_id,
                lambda m: m.add(
                    request.producer_id, request.producer_epoch, now, groups=[request.group_id]
                ),
                wait_s=COMPLETION_WAIT_S,
            )
        except Exception as exc:
            self._fail("AddOffsetsToTxn", resp, exc)
        return resp

    async def EndTxn(
        self, request: coordinator_pb2.EndTxnRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.EndTxnResponse:
        resp = coordinator_pb2.EndTxnResponse()
        try:
            check_epoch(request.producer_epoch)
            now = _now_ms()
            shard, meta, changed = await self._txn_change(
                request.transactional_id,
                lambda m: m.end(
                    request.producer_id, request.producer_epoch, request.committed, now
                ),
            )
            if changed:
                self._spawn(self._finish(shard, meta, by="client"))
        except Exception as exc:
            self._fail("EndTxn", resp, exc)
        return resp

    async def DescribeTransactions(
        self,
        request: coordinator_pb2.DescribeTransactionsRequest,
        context: grpc.aio.ServicerContext,
    ) -> coordinator_pb2.DescribeTransactionsResponse:
        resp = coordinator_pb2.DescribeTransactionsResponse()
        for tid in request.transactional_ids:
            d = resp.transactions.add(transactional_id=tid, producer_id=-1, producer_epoch=-1)
            d.shard = -1
            try:
                shard = self._txn_shard(tid)
            except Exception as exc:
                self._fail("DescribeTransactions", d, exc)
                continue
            d.shard = shard.index
            meta = shard.transactions.get(tid)
            if meta is None:
                d.error_code = E.TRANSACTIONAL_ID_NOT_FOUND  # type: ignore[assignment]
                d.error_message = f"transactional id {tid!r} is unknown"
                continue
            _describe(d, meta)
        return resp

    async def ListTransactions(
        self,
        request: coordinator_pb2.ListTransactionsRequest,
        context: grpc.aio.ServicerContext,
    ) -> coordinator_pb2.ListTransactionsResponse:
        resp = coordinator_pb2.ListTransactionsResponse()
        states = {int(s) for s in request.state_filters}
        pids = set(request.producer_id_filters)
        for s, shard in sorted(self.txn_kind.shards.items()):
            if not shard.loaded:
                resp.unloaded_shards.append(s)
                continue
            for tid, meta in sorted(shard.transactions.items()):
                if states and int(meta.state) not in states:
                    continue
                if pids and meta.producer_id not in pids:
                    continue
                resp.transactions.add(
                    transactional_id=tid,
                    producer_id=meta.producer_id,
                    state=int(meta.state),  # type: ignore[arg-type]
                )
        return resp

    # -- completing transactions ---------------------------------------------------------------

    def _resume_transactions(self, shard: Shard) -> None:
        """After a load: finish what a previous owner decided but did not complete."""
        for meta in shard.transactions.values():
            if meta.state.preparing:
                self._spawn(self._finish(shard, meta, by="recovered"))

    async def _finish(self, shard: Shard, meta: TxnMetadata, *, by: str) -> None:
        """Steps 2 and 3 of ending a transaction (see the module docstring); stops quietly
        when the shard moves to another coordinator, which then finishes it."""
        generation = shard.generation
        commit = meta.state is TxnState.PREPARE_COMMIT
        t0 = time.monotonic()
        try:
            await self._write_markers(shard, generation, meta, commit)
            for group_id in sorted(meta.groups):
                await self._retrying(
                    shard,
                    generation,
                    meta,
                    lambda g=group_id: self._complete_offsets(shard, generation, g, meta, commit),
                )
            now = _now_ms()

            def complete(current: TxnMetadata) -> TxnMetadata | None:
                same = (current.state, current.producer_epoch) == (meta.state, meta.producer_epoch)
                return current.complete(now) if same else None

            await self._retrying(
                shard, generation, meta, lambda: self._txn_change(meta.transactional_id, complete)
            )
        except (
            NotCoordinatorError,
            CoordinatorLoadInProgressError,
            CoordinatorNotAvailableError,
            _Superseded,
        ):
            log.info(
                "transaction %s: shard moved; its new owner completes it", meta.transactional_id
            )
            return
        except asyncio.CancelledError:
            raise
        except StromError as exc:
            log.warning("completing transaction %s failed: %s", meta.transactional_id, exc)
            return
        except Exception:
            log.exception("completing transaction %s failed", meta.transactional_id)
            return
        outcome = "commit" if commit else "abort"
        metrics.TRANSACTIONS_ENDED.labels(outcome, by).inc()
        metrics.TXN_COMPLETION_SECONDS.observe(time.monotonic() - t0)
        if meta.start_ms >= 0:
            metrics.TRANSACTION_SECONDS.observe(max(_now_ms() - meta.start_ms, 0) / 1000.0)
        # A commit is the normal course (hundreds a minute from one exactly-once loop), so
        # DEBUG; an abort is worth an operator's eye, INFO.
        log.log(
            logging.DEBUG if commit else logging.INFO,
            "transaction %s (producer %d epoch %d) %s: %d partitions, %d groups",
            meta.transactional_id,
            meta.producer_id,
            meta.producer_epoch,
            "committed" if commit else "aborted",
            len(meta.partitions),
            len(meta.groups),
        )

    async def _write_markers(
        self, shard: Shard, generation: int, meta: TxnMetadata, commit: bool
    ) -> None:
        """Write the marker to every partition of the transaction, retrying until each one
        is in (or its topic is gone)."""
        assert self.view is not None
        left = set(meta.partitions)
        delay = _RETRY_FIRST_S
        while left:
            _check(shard, generation)
            by_leader: dict[str, list[tuple[str, int]]] = {}
            epochs: dict[tuple[str, int], int] = {}
            for t, p in sorted(left):
                if self.view.topic(t) is None:
                    left.discard((t, p))  # deleted: nothing to mark
                    continue
                try:
                    addr, epochs[(t, p)] = self._leader(p, t)
                except StromError:
                    continue  # no leader right now: next round
                by_leader.setdefault(addr, []).append((t, p))
            results = await asyncio.gather(
                *(
                    self._markers_to(addr, tps, meta, commit, shard.producer_epoch, epochs)
                    for addr, tps in by_leader.items()
                )
            )
            for done in results:
                left -= done
            if left:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    async def _retrying(
        self, shard: Shard, generation: int, meta: TxnMetadata, step: Callable[[], Any]
    ) -> Any:
        """Run a completion step until it succeeds: a decided transaction left half-complete
        (its state write timed out while the ISR was short, say) would otherwise stay
        PREPARE_* until the shard moves, refusing its producer with CONCURRENT_TRANSACTIONS.
        Each step is idempotent. Stops when the shard moved (its new owner completes it)."""
        delay = _RETRY_FIRST_S
        while True:
            try:
                return await step()
            except StromError as exc:
                if not exc.retriable or self._stopping:
                    raise
                _check(shard, generation)
                log.info(
                    "completing transaction %s: %s; retrying", meta.transactional_id, exc.message
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    async def _markers_to(
        self,
        addr: str,
        tps: list[tuple[str, int]],
        meta: TxnMetadata,
        commit: bool,
        coordinator_epoch: int,
        epochs: dict[tuple[str, int], int],
    ) -> set[tuple[str, int]]:
        """One WriteTxnMarkers to a leader; the partitions that have the marker now.

        Unanswered :data:`OVERDUE_GRACE_S` it is given up (as if it timed out: none has the
        marker) once a partition of it has another leader in the view, or a higher leader
        epoch (``epochs``: each partition's when sent), so the next round sends it to the
        new leader: a hung leader must not hold the transaction's completion (and its
        producer's next transaction) for the call's whole 15 s. Safe as the retry after a
        timeout is: a marker is idempotent for its producer epoch (a second one closes
        nothing), and the old leader can no longer commit one it wrote."""
        req = storage_pb2.WriteTxnMarkersRequest(timeout_ms=MARKER_TIMEOUT_MS)
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        req.markers.add(
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            committed=commit,
            coordinator_epoch=max(coordinator_epoch, 0),
            topics=[
                common_pb2.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()
            ],
        )
        stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))

        def moved() -> str | None:
            for t, p in tps:
                try:
                    now, epoch = self._leader(p, t)
                except StromError:
                    continue  # no live leader yet: not moved, the wait goes on
                if now != addr or 0 <= epochs.get((t, p), -1) < epoch:
                    return f"{t}-{p} is now led by {now} (epoch {epoch})"
            return None

        try:
            resp = await _overdue(
                stub.WriteTxnMarkers(req, timeout=MARKER_TIMEOUT_MS / 1000 + 5), moved
            )
        except grpc.aio.AioRpcError as exc:
            log.info("WriteTxnMarkers to %s: %s", addr, exc.code().name)
            return set()
        except _Moved as exc:
            log.info("WriteTxnMarkers to %s: no answer and %s: retrying there", addr, exc)
            return set()
        done: set[tuple[str, int]] = set()
        for tr in resp.markers[0].topics if resp.markers else ():
            for pr in tr.partitions:
                if pr.error_code == E.NONE:
                    done.add((tr.topic, pr.partition))
                elif pr.error_code == E.TRANSACTION_COORDINATOR_FENCED:
                    # A coordinator of a newer epoch wrote a marker for this producer: the
                    # shard has moved and its new owner finishes the transaction.
                    log.warning("marker for %s-%d: %s", tr.topic, pr.partition, pr.error_message)
                    raise _Superseded(pr.error_message)
                elif pr.error_code == E.INVALID_PRODUCER_EPOCH:
                    # A newer epoch of the producer wrote here already: this transaction's
                    # outcome no longer matters to the partition.
                    log.warning("marker for %s-%d: %s", tr.topic, pr.partition, pr.error_message)
                    done.add((tr.topic, pr.partition))
                else:
                    log.info(
                        "marker for %s-%d: %s %s",
                        tr.topic,
                        pr.partition,
                        error_name(pr.error_code),
                        pr.error_message,
                    )
        return done

    async def _complete_offsets(
        self, shard: Shard, generation: int, group_id: str, meta: TxnMetadata, commit: bool
    ) -> None:
        """Have the group's coordinator apply (or drop) the transaction's pending offsets.

        A call unanswered :data:`OVERDUE_GRACE_S` has the group's coordinator looked up in
        the view every :data:`OVERDUE_RECHECK_S`; once another coordinator owns the group it
        is cancelled and sent there (the client's overdue rule, DESIGN §8; the view is
        local), so a hung group coordinator does not hold the completion for the call's whole
        15 s. CompleteTxnOffsets is idempotent, so sending it again is safe."""
        assert self.view is not None
        req = coordinator_pb2.CompleteTxnOffsetsRequest(
            group_id=group_id,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            committed=commit,
        )
        delay = _RETRY_FIRST_S
        while True:
            _check(shard, generation)
            addr = _group_coordinator(self.view, group_id)
            code, message = E.COORDINATOR_NOT_AVAILABLE, "no coordinator owns the group's shard"
            if addr is not None:

                def moved(view: ClusterView = self.view, asked: str = addr) -> str | None:
                    now = _group_coordinator(view, group_id)
                    return None if now is None or now == asked else f"now owned by {now}"

                try:
                    stub = coordinator_pb2_grpc.CoordinatorServiceStub(self._channel(addr))
                    resp = await _overdue(stub.CompleteTxnOffsets(req, timeout=15.0), moved)
                    code, message = resp.error_code, resp.error_message
                except grpc.aio.AioRpcError as exc:
                    code, message = E.COORDINATOR_NOT_AVAILABLE, exc.code().name
                except _Moved as exc:
                    code, message = E.NOT_COORDINATOR, f"{addr} did not answer; the group is {exc}"
            if code == E.NONE:
                return
            log.info("CompleteTxnOffsets %s: %s %s", group_id, error_name(code), message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    async def _abort_expired(self) -> None:
        """Abort (with a fencing epoch bump) transactions open past their timeout, then
        remove transactional ids idle past transactional.id.expiration.ms."""
        now = _now_ms()
        await self._abort_timed_out(now)
        await self._expire_ids(now)

    async def _expire_ids(self, now: int) -> None:
        """Remove (a tombstone in ``__transaction_state``, then memory) every transactional
        id with nothing open or completing and no change for transactional.id.expiration.ms,
        as Kafka does: short-lived writers (a Spark job's task slots, say) would otherwise
        leave one id each forever. A producer that comes back later with the id gets a new
        producer id from InitProducerId; one still holding the old id is refused
        (INVALID_PRODUCER_ID_MAPPING) and must initialise again."""
        ttl = self.txn_id_expiration_ms
        for shard in list(self.txn_kind.shards.values()):
            if not shard.loaded:
                continue
            for tid, meta in list(shard.transactions.items()):
                if not meta.state.idle or not 0 <= meta.last_update_ms <= now - ttl:
                    continue
                try:
                    async with shard.lock:
                        if not shard.loaded or self.txn_kind.shards.get(shard.index) is not shard:
                            break
                        if shard.transactions.get(tid) is not meta:
                            continue  # changed meanwhile: no longer idle that long
                        await self._write(shard, [GroupRecord(txn_log_key(tid), None)])
                        del shard.transactions[tid]
                except StromError as exc:
                    log.info("expiring transactional id %s failed: %s", tid, exc)
                    continue
                metrics.TRANSACTIONAL_IDS_EXPIRED.inc()
                log.info(
                    "transactional id %s expired: idle for %d ms (producer id %d)",
                    tid,
                    now - meta.last_update_ms,
                    meta.producer_id,
                )

    async def _abort_timed_out(self, now: int) -> None:
        for shard in list(self.txn_kind.shards.values()):
            if not shard.loaded:
                continue
            for tid, meta in list(shard.transactions.items()):
                if not meta.expired(now):
                    continue
                reason = f"aborted after transaction.timeout.ms={meta.timeout_ms} passed"

                def abort(current: TxnMetadata, reason: str = reason) -> TxnMetadata | None:
                    if not current.expired(now):
                        return None
                    return current.abort_fencing(now, reason, timed_out=True)

                try:
                    shard2, new, changed = await self._txn_change(tid, abort)
                except StromError as exc:
                    log.info("aborting expired transaction %s failed: %s", tid, exc)
                    continue
                if changed:
                    log.info("transaction %s timed out: aborting it", tid)
                    self._spawn(self._finish(shard2, new, by="timeout"))

    # -- group coordinator RPCs ----------------------------------------------------------------

    async def TxnOffsetCommit(
        self, request: coordinator_pb2.TxnOffsetCommitRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.OffsetCommitResponse:
        resp = coordinator_pb2.OffsetCommitResponse()
        tid, pid, epoch = request.transactional_id, request.producer_id, request.producer_epoch
        try:
            check_epoch(epoch)
            check_group_id(request.group_id)
            ids = self._topic_ids()  # stored with the offsets (OffsetRpcs.OffsetCommit)
            # The transaction's state: this process's own when it owns the id's shard (read
            # again under the group's lock below), else another coordinator's copy, taken
            # before the lock: what the group held for the producer then tells whether a
            # completion landed since.
            remote = before = None
            if not self._owns_txn(tid):
                group = self._shard_of(request.group_id).groups.get(request.group_id)
                before = group.pending.get(pid) if group is not None else None
                remote = await self._remote_txn(tid, context)
        except Exception as exc:
            self._fail("TxnOffsetCommit", resp, exc)
            return resp

        def commit(g: ConsumerGroup) -> OffsetsResult:
            if remote is None:
                check_txn_offsets(self._local_txn(tid), tid, pid, epoch, request.group_id)
            else:
                now_pending = g.pending.get(pid)
                if (
                    now_pending is not before
                    and now_pending is not None
                    and not now_pending.offsets
                    and now_pending.producer_epoch >= epoch
                ):
                    # The copy may predate that completion: ask again (the client retries).
                    raise ConcurrentTransactionsError(
                        f"the transaction of producer {pid} ended at group "
                        f"{request.group_id!r} while its state was asked for; retry"
                    )
                check_txn_offsets(remote, tid, pid, epoch, request.group_id, full=False)
            return g.txn_commit_offsets(
                request.member_id,
                request.member_epoch,
                pid,
                epoch,
                offsets,
                now_ms=now,
                topics=self._topics(),
            )

        offsets = {
            (t.topic, p.partition): OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=p.committed_leader_epoch,
                metadata=p.metadata,
                topic_id=ids.get(t.topic, ""),
            )
            for t in request.topics
            for p in t.partitions
        }
        now = wall_ms()  # the commit timestamp (offset retention)
        try:
            result = await self._mutate(
                request.group_id, commit, lambda r: r.records, create=request.member_epoch < 0
            )
        except GroupIdNotFoundError:
            resp.error_code = E.UNKNOWN_MEMBER_ID  # type: ignore[assignment]
            resp.error_message = f"group {request.group_id!r} has no member {request.member_id!r}"
            return resp
        except Exception as exc:
            self._fail("TxnOffsetCommit", resp, exc)
            return resp
        _partition_results(
            resp, request.topics, result.errors, self.group_config.offset_metadata_max_bytes
        )
        return resp

    def _owns_txn(self, transactional_id: str) -> bool:
        """Whether this process serves the transactional id's shard (a shard still loading
        raises COORDINATOR_LOAD_IN_PROGRESS, retriable)."""
        try:
            self._txn_shard(transactional_id)
        except NotCoordinatorError:
            return False
        return True

    def _local_txn(self, transactional_id: str) -> TxnMetadata | None:
        """The id's state in this process's own shard. Lost since :meth:`_owns_txn` (a
        hand-over while the request waited for the group's lock): COORDINATOR_NOT_AVAILABLE,
        retriable; NOT_COORDINATOR would tell the client the *group* moved."""
        try:
            shard = self._txn_shard(transactional_id)
        except NotCoordinatorError as exc:
            raise CoordinatorNotAvailableError(
                f"the transaction coordinator of {transactional_id!r} is moving: {exc.message}"
            ) from None
        return shard.transactions.get(transactional_id)

    async def _remote_txn(
        self, transactional_id: str, context: grpc.aio.ServicerContext | None
    ) -> TxnMetadata | None:
        """The id's state as its transaction coordinator (another process) describes it;
        None for an id it does not know. That coordinator unknown or unreachable:
        COORDINATOR_NOT_AVAILABLE (the client retries)."""
        assert self.view is not None
        found = find_coordinator(
            self.view,
            storage_pb2.FindCoordinatorRequest(
                keys=[transactional_id], key_type=storage_pb2.COORDINATOR_TYPE_TRANSACTION
            ),
        ).coordinators[0]
        if found.error_code != E.NONE:
            raise CoordinatorNotAvailableError(
                f"no transaction coordinator for {transactional_id!r}: {found.error_message}"
            )
        addr = f"{found.node.host}:{found.node.port}"
        left = context.time_remaining() if context is not None else None
        timeout = min(left, TXN_LOOKUP_TIMEOUT_S) if left is not None else TXN_LOOKUP_TIMEOUT_S
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(self._channel(addr))
        req = coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id])
        try:
            resp = await stub.DescribeTransactions(req, timeout=max(timeout, 0.001))
        except grpc.aio.AioRpcError as exc:
            raise CoordinatorNotAvailableError(
                f"the transaction coordinator of {transactional_id!r} at {addr} did not "
                f"answer: {exc.code().name}"
            ) from None
        d = resp.transactions[0] if resp.transactions else None
        if d is None or d.error_code == E.TRANSACTIONAL_ID_NOT_FOUND:
            return None
        if d.error_code != E.NONE:
            raise CoordinatorNotAvailableError(
                f"the transaction coordinator of {transactional_id!r} at {addr} answered "
                f"{error_name(d.error_code)}: {d.error_message}"
            )
        return TxnMetadata(
            transactional_id,
            d.producer_id,
            d.producer_epoch,
            d.transaction_timeout_ms,
            TxnState(d.state),
            groups=frozenset(d.groups),
        )

    async def CompleteTxnOffsets(
        self,
        request: coordinator_pb2.CompleteTxnOffsetsRequest,
        context: grpc.aio.ServicerContext,
    ) -> coordinator_pb2.CompleteTxnOffsetsResponse:
        resp = coordinator_pb2.CompleteTxnOffsetsResponse()
        now = wall_ms()  # the commit timestamp (offset retention)
        try:
            await self._mutate(
                request.group_id,
                lambda g: g.complete_txn(
                    request.producer_id, request.producer_epoch, request.committed, now_ms=now
                ),
                lambda r: r.records,
                # A group that does not exist yet gets one holding the ended epoch: a
                # zombie's TxnOffsetCommit arriving after the abort would otherwise create
                # the group and stay pending for good.
                create=True,
            )
        except Exception as exc:
            self._fail("CompleteTxnOffsets", resp, exc)
        return resp


class _Superseded(Exception):
    """The shard was reloaded or moved while a transaction was being completed."""


class _Moved(Exception):
    """An unanswered call was given up: its target no longer leads or owns what it asked
    about (the message says who does now)."""


async def _overdue(call: Any, moved: Callable[[], str | None]) -> Any:
    """The answer of the gRPC ``call``; while it is unanswered :data:`OVERDUE_GRACE_S` after
    it was sent, ``moved()`` is asked every :data:`OVERDUE_RECHECK_S` whether its target
    still owns what it asked about (a look at the local view), and once it names another
    the call is cancelled and :class:`_Moved` raised, so the caller retries there at once
    instead of after the call's timeout. The overdue rule of the clients (DESIGN §8); an
    answer that comes meanwhile wins, and while the owner is the same (or none is known
    yet) the call goes on: a slow answer is not a hang."""
    task: asyncio.Future[Any] = asyncio.ensure_future(call)
    wait = OVERDUE_GRACE_S
    try:
        while True:
            done, _ = await asyncio.wait((task,), timeout=wait)
            if done:
                return task.result()
            why = moved()
            if why is not None:
                raise _Moved(why)
            wait = OVERDUE_RECHECK_S
    finally:
        if not task.done():  # (given up, or the caller was cancelled)
            call.cancel()
            task.cancel()


def _check(shard: Shard, generation: int) -> None:
    if shard.generation != generation or not shard.loaded:
        raise _Superseded()


def _group_coordinator(view: ClusterView, group_id: str) -> str | None:
    resp = find_coordinator(view, storage_pb2.FindCoordinatorRequest(keys=[group_id]))
    c = resp.coordinators[0]
    if c.error_code != E.NONE:
        return None
    return f"{c.node.host}:{c.node.port}"


def _describe(d: coordinator_pb2.TransactionDescription, meta: TxnMetadata) -> None:
    d.state = int(meta.state)  # type: ignore[assignment]
    d.producer_id = meta.producer_id
    d.producer_epoch = meta.producer_epoch
    d.transaction_timeout_ms = meta.timeout_ms
    d.transaction_start_ms = meta.start_ms
    by_topic: dict[str, list[int]] = {}
    for t, p in meta.partitions:
        by_topic.setdefault(t, []).append(p)
    for t in sorted(by_topic):
        d.topics.add(topic=t, partitions=sorted(by_topic[t]))
    d.groups.extend(sorted(meta.groups))


def _partition_results(
    resp: coordinator_pb2.OffsetCommitResponse,
    topics: Iterable[coordinator_pb2.OffsetCommitTopic],
    errors: dict[tuple[str, int], int],
    metadata_limit: int,
) -> None:
    for t in topics:
        tr = resp.topics.add(topic=t.topic)
        for p in t.partitions:
            code = errors.get((t.topic, p.partition), E.NONE)
            pr = tr.partitions.add(partition=p.partition, error_code=code)
            if code != E.NONE:
                pr.error_message = commit_error(code, t.topic, p, metadata_limit)


def _expected_producer(request: storage_pb2.InitProducerIdRequest) -> tuple[int, int] | None:
    """The (producer id, epoch) a transactional producer taking its id back gives (Kafka's
    KIP-588; see txn_state.init_producer_id), or None for a plain InitProducerId (unset or
    -1: every client before this, and a new instance)."""
    if not request.HasField("producer_id") or request.producer_id < 0:
        return None
    if not request.HasField("producer_epoch"):
        return request.producer_id, 0
    check_epoch(request.producer_epoch)  # (-1 must not match an unset epoch)
    return request.producer_id, request.producer_epoch
