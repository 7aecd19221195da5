"""Fetch: consumers and followers reading partitions, with long polling (DESIGN §5, §8).

The fetch path works on whole batches: the log reads the bytes as they are (one ``pread`` on
the loop, or in a thread when a writer holds that log's lock) and the answer is encoded by
:mod:`strom.storage.wire` with the record bytes spliced in uncopied, so no code here looks at
individual records. A follower's fetch also reports its position to the leader, which may
advance the high watermark.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import grpc

from strom.api import storage_pb2
from strom.errors import ErrorCode
from strom.grpc_options import MAX_BATCH_BYTES
from strom.log import CorruptLogError, OffsetOutOfRangeError
from strom.security import CURRENT_PRINCIPAL, QUOTAS
from strom.storage import metrics
from strom.storage.partition import Partition
from strom.storage.replica_claims import fetch_claim_error, is_follower_fetch
from strom.storage.replication_quota import is_throttled
from strom.storage.rpc_base import (
    _FETCH_RESULT,
    StorageCore,
    _fail_partition,
    _Refusal,
    _throttle,
    _timed,
    _wait_out_debt,
    isolation_error,
)
from strom.storage.wire import (
    FetchPartitionOut,
    FetchTopicOut,
    encode_fetch_response,
)

pb = storage_pb2
E = ErrorCode

#: Kafka's defaults for a fetch that does not bound its size (fetch.max.bytes,
#: max.partition.fetch.bytes are always sent by real clients; 0 means "unset" in proto3).
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024


async def _follower_claim(request: pb.FetchRequest, context: Any) -> bool:
    """Whether ``request`` is a follower's fetch (strom.storage.replica_claims: an unset
    ``replica_id`` is a consumer's, not node 0's); a malformed claim is refused with
    INVALID_ARGUMENT naming the field (ValueError for an in-process caller). With ACLs on,
    the interceptor has already required CLUSTER_ACTION of a claim (strom.security.rules)."""
    error = fetch_claim_error(request)
    if error is not None:
        if context is None:
            raise ValueError(error)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
    return is_follower_fetch(request)


class FetchRpcs(StorageCore):
    """Fetch (and fetch_raw, the form the server is wired to)."""

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        """In-process form of :meth:`fetch_raw` (the server is wired to the raw one)."""
        return pb.FetchResponse.FromString(await self.fetch_raw(request, context))

    @_timed("Fetch")
    async def fetch_raw(self, request: pb.FetchRequest, context: Any) -> bytes:
        """Fetch, answered as serialized FetchResponse bytes (records spliced in uncopied)."""
        return await self._fetch_answer(request, context, None)

    @_timed("Fetch")
    async def fetch_followed(self, step: FollowStep, context: Any) -> bytes:
        """One answer of a followed FetchStream request (storage.proto, FetchRequest.follow):
        ``step.request`` read as :meth:`fetch_raw` reads it; ``step.next_offsets`` gets each
        partition's continuation, in request order (-1: the follow ends)."""
        return await self._fetch_answer(step.request, context, step.next_offsets)

    @_timed("Fetch")
    async def fetch_in_session(self, session: FollowerSession, context: Any) -> bytes:
        """A follower's fetch on its FetchStream (``session.request``), read as
        :meth:`fetch_raw` reads it but answering only the partitions with news for it
        (:class:`FollowerSession`)."""
        return await self._fetch_answer(session.request, context, None, session)

    async def _fetch_answer(
        self,
        request: pb.FetchRequest,
        context: Any,
        next_offsets: list[int] | None,
        session: FollowerSession | None = None,
    ) -> bytes:
        """Fetch, answered as serialized FetchResponse bytes (records spliced in uncopied).

        Long poll: the waiter is parked *before* each read pass (wake on any byte), so an
        append that lands while a read is in progress (a read may hop to a thread) is never
        missed; if one did land, the pass is simply repeated. Otherwise the waiter is told
        how many bytes are still missing and the fetch sleeps on its future until they
        arrive, a state change wakes it, or max_wait_ms passes.
        """
        follower = await _follower_claim(request, context)
        _FETCH_RESULT.set(0)  # (a stream's answers share one context: no earlier error)
        metrics.FETCH_REQUESTS.labels("follower" if follower else "consumer").inc()
        registry = self.manager.appended if follower else self.manager.committed
        keys = _fetch_keys(request)
        waited = quota_bytes = 0
        if QUOTAS.active and not follower:
            # A consumer still ahead of its fetch quota waits before it reads; one with a
            # fetch quota reads at most its quota window's worth (QuotaManager.fetch_limit).
            waited = await _wait_out_debt("fetch")
            quota_bytes = QUOTAS.fetch_limit(CURRENT_PRINCIPAL.get())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000.0
        min_bytes = max(request.min_bytes, 1)
        if quota_bytes:
            min_bytes = min(min_bytes, quota_bytes)  # (more could never be read at once)
        last_pass = False
        if session is not None:
            session.begin(request)
        while True:
            waiter = registry.park(keys, 1)
            try:
                tally = _ThrottleTally()
                topics, total, done, hints = await self._fetch_once(
                    request, quota_bytes, tally, session
                )
                if done or total >= min_bytes or last_pass or self.shutting_down:
                    break
                if registry.closed:
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                if tally.held and not total:
                    # Held back by the replication throttle: look again once the leader
                    # bucket has refilled, not only when an append lands.
                    refill = self.manager.replication_quotas.leader.wait_s()
                    remaining = min(remaining, max(refill, 0.01))
                if not waiter.woken:  # nothing landed during the read
                    waiter.remaining = min_bytes - total
                    # After a timeout, one more pass answers with whatever is there now.
                    last_pass = not await registry.wait(waiter, remaining)
            finally:
                registry.unpark(waiter)
        if session is not None:
            session.commit(keys)
            topics = [t for t in topics if t.partitions]
        endpoints = None
        if hints:
            endpoints = pb.FetchResponse(node_endpoints=self._endpoints(hints))
        for tout in topics:
            for pout in tout.partitions:
                if pout.message.error_code:
                    _FETCH_RESULT.set(pout.message.error_code)
                    break
        if next_offsets is not None:
            next_offsets.extend(
                -1 if pout.message.error_code else pout.next_offset
                for tout in topics
                for pout in tout.partitions
            )
        if total:
            self._count_sent(topics, total, follower)
        if follower:
            self._charge_throttle(tally)
        if total and not follower:
            metrics.client_counter(metrics.CLIENT_BYTES_OUT, metrics.client_id_of(context)).inc(
                total
            )
        if (QUOTAS.active or waited) and not follower:
            throttled = await _throttle("fetch", total, waited, context)
            if throttled:
                endpoints = endpoints or pb.FetchResponse()
                endpoints.throttle_time_ms = throttled
        return encode_fetch_response(topics, endpoints)

    async def _fetch_once(
        self,
        request: pb.FetchRequest,
        quota_bytes: int = 0,
        tally: _ThrottleTally | None = None,
        session: FollowerSession | None = None,
    ) -> tuple[list[FetchTopicOut], int, bool, set[int]]:
        """One pass over the requested partitions: (answer, record bytes, answer now?, hints).
        ``quota_bytes`` (0: none) bounds the answer as max_bytes does (and so each
        partition's share), below what the request asked for. A follower's partitions the
        replication throttle covers share what the leader bucket holds now (DESIGN §6,
        "Replication throttles"); ``tally`` gets what they took and how many were held back,
        charged once the answer is final (a long poll may make several passes). With a
        follower's ``session``, a partition with nothing new for it is left out
        (:class:`FollowerSession`)."""
        replica_id = request.replica_id
        follower = is_follower_fetch(request)
        read_committed = (
            not follower and request.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED
        )
        budget = request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        # Never more than one gRPC message can carry: a consumer
        # asking 300 MiB got an answer gRPC refused to send (RESOURCE_EXHAUSTED "Sent
        # message larger than max"), on every poll, the node re-reading it each time. The
        # first partition's one whole batch may exceed the budget, but no batch exceeds
        # MAX_BATCH_BYTES (max.message.bytes' ceiling), so the answer still fits.
        budget = min(budget, MAX_BATCH_BYTES)
        if quota_bytes:
            budget = min(budget, quota_bytes)
        out: list[FetchTopicOut] = []
        hints: set[int] = set()
        total = 0
        answer_now = False
        bucket = self.manager.replication_quotas.leader
        # What throttled replicas may still take in this pass (None: no limit set).
        throttle_left = bucket.available() if follower else None
        # Whose fetch this is, checked once per pass: its positions only count when it is
        # the registered process of that node (None: it is).
        stale = self._stale_follower(request) if follower else None
        bad_isolation = isolation_error(request)
        if session is not None:
            session.answered.clear()
            if stale is not None or bad_isolation is not None:
                session.forget()  # refused below, partition by partition
                session = None
        partitions = self.manager.partitions
        for ft in request.topics:
            topic = ft.topic
            tout = FetchTopicOut(topic)
            out.append(tout)
            for fp in ft.partitions:
                if session is not None and session.quiet(
                    partitions.get((topic, fp.partition)), topic, ft.topic_id, fp
                ):
                    continue
                pr = pb.FetchPartitionResponse(partition=fp.partition, preferred_read_replica=-1)
                pout = FetchPartitionOut(pr)
                tout.partitions.append(pout)
                part = None
                try:
                    if bad_isolation is not None:
                        raise _Refusal(E.INVALID_REQUEST, bad_isolation)
                    part = self._leader(topic, fp.partition, fp.current_leader_epoch, hints)
                    if ft.topic_id and part.topic_id and ft.topic_id != part.topic_id:
                        raise _Refusal(
                            E.INCONSISTENT_TOPIC_ID,
                            f"topic {topic} now has id {part.topic_id}, not {ft.topic_id}",
                        )
                    if follower:
                        if stale is not None and replica_id in part.replicas:
                            raise _Refusal(E.STALE_NODE_INCARNATION, stale)
                        if not self._follower_position(
                            part,
                            replica_id,
                            fp,
                            pr,
                            request.replica_incarnation,
                            request.follows_log_start,
                        ):
                            answer_now = True
                            continue
                        if request.follows_log_start and self._follower_start_behind(part, fp):
                            answer_now = True
                    cap = None
                    if throttle_left is not None and _leader_throttled(part, replica_id):
                        cap = throttle_left
                    left = budget - total
                    n = await self._read(
                        part, fp, follower, left, total == 0, pout, read_committed, cap
                    )
                    if follower and tally is not None:
                        if cap is not None:
                            throttle_left = cap - n
                            tally.charged += n
                            unthrottled = min(fp.partition_max_bytes or left, left)
                            if cap < unthrottled and pout.next_offset < part.log.log_end_offset:
                                tally.held += 1  # fewer batches, or none, than it could take
                        if n and replica_id in part.adding:
                            tally.moved[topic] = tally.moved.get(topic, 0) + n
                    if session is not None:
                        session.answered.append((part, part.leader_epoch, ft.topic_id, fp, pr))
                except Exception as exc:
                    if isinstance(exc, CorruptLogError) and part is not None and part.is_leader:
                        # Our copy is damaged: hand leadership to a replica that can serve it.
                        part.note_damage(exc.offset if exc.offset >= 0 else fp.fetch_offset)
                        if self.on_out_of_sync_fetch is not None:
                            self.on_out_of_sync_fetch()  # the ISR manager acts on it now
                    r = _fail_partition(pr, "fetch from", topic, fp.partition, exc)
                    if r.code != E.OFFSET_OUT_OF_RANGE:
                        pr.high_watermark = pr.last_stable_offset = pr.log_start_offset = -1
                    if r.hint is not None:
                        pr.current_leader.CopyFrom(r.hint)
                    answer_now = True
                    continue
                total += n
        return out, total, answer_now, hints

    async def _read(
        self,
        part: Partition,
        fp: pb.FetchPartition,
        follower: bool,
        budget: int,
        first: bool,
        pout: FetchPartitionOut,
        read_committed: bool = False,
        throttle_cap: int | None = None,
    ) -> int:
        """Read one partition into ``pout``; returns the record bytes added.

        ``throttle_cap`` (a throttled replica's share of the leader bucket) bounds the read
        to whole batches within it, and at least one while it is above 0 (so a move always
        progresses, even behind other partitions); at 0 nothing is read this round.

        read_committed reads stop at the last stable offset, and the answer lists the
        aborted transactions that may have batches in what was read (the consumer drops
        them batch by batch; nothing here looks inside a batch).

        The read is one pread of page-cache data and runs on the loop, unless a worker
        thread holds the log's lock (an append being written, a flush snapshot, a cleaner
        swap): then it runs in a thread instead of stalling every other request behind it.
        """
        pr = pout.message
        hw = part.high_watermark
        lso = part.last_stable_offset
        pr.high_watermark = hw
        pr.last_stable_offset = lso
        pr.log_start_offset = part.log_start_offset
        limit = fp.partition_max_bytes if fp.partition_max_bytes > 0 else budget
        limit = min(limit, budget)
        pout.next_offset = fp.fetch_offset
        if throttle_cap is not None:
            if throttle_cap <= 0 or budget <= 0:
                return 0
            limit = min(limit, throttle_cap)
            first = True
        if limit <= 0 and not first:
            return 0
        lg = part.log
        # Kafka semantics: the first partition with data returns at least one whole batch
        # even when it exceeds max_bytes / partition_max_bytes, so consumers progress.
        read = functools.partial(
            lg.read,
            fp.fetch_offset,
            max(limit, 0),
            max_offset=None if follower else lso if read_committed else hw,
            min_one=first,
        )
        try:
            if lg.lock.acquire(blocking=False):
                try:
                    result = read()
                finally:
                    lg.lock.release()
            else:
                result = await asyncio.to_thread(read)
        except OffsetOutOfRangeError as exc:
            raise _Refusal(
                E.OFFSET_OUT_OF_RANGE,
                f"fetch offset {exc.offset} is outside the log of {part.topic}-{part.index}: "
                f"log start offset {exc.log_start_offset}, high watermark {hw}, "
                f"log end offset {exc.log_end_offset}",
            ) from None
        n = len(result.data)
        if n and read_committed and lg.aborted:
            for a in lg.aborted_transactions(fp.fetch_offset, result.next_offset):
                pr.aborted_transactions.add(producer_id=a.producer_id, first_offset=a.first_offset)
        if n:
            pout.records = result.data
            pout.next_offset = result.next_offset
        return n

    def _charge_throttle(self, tally: _ThrottleTally) -> None:
        """Charge the leader bucket with what the final answer sends to throttled replicas
        and count it (once per answer, never per record)."""
        if tally.charged:
            self.manager.replication_quotas.leader.record(tally.charged)
            metrics.REPLICATION_THROTTLED_BYTES.labels("leader").inc(tally.charged)
        if tally.held:
            metrics.REPLICATION_THROTTLED.labels("leader").inc(tally.held)
        for topic, n in tally.moved.items():
            metrics.REASSIGNMENT_BYTES_OUT.labels(topic).inc(n)

    def _count_sent(self, topics: list[FetchTopicOut], total: int, follower: bool) -> None:
        """Count what the answer carries, once per answer and per partition (never per
        record). Why here and not at each read: a long poll reads its partitions again after
        a wake-up or its wait, and only the last pass is sent. Each
        pass was counted, so a consumer whose fetch_min_bytes was not met saw bytes_out and
        records_out twice what it received."""
        if follower:
            metrics.REPLICATION_BYTES_OUT.inc(total)
            return
        by_tp = self.manager.metrics
        for tout in topics:
            for pout in tout.partitions:
                n = len(pout.records)
                if not n:
                    continue
                m = by_tp.get((tout.topic, pout.message.partition))
                if m is not None:
                    m.bytes_out.inc(n)
                    # Offsets sent: from the first batch's base offset (header bytes 0-8).
                    m.records_out.inc(pout.next_offset - int.from_bytes(pout.records[:8], "big"))

    def _follower_position(
        self,
        part: Partition,
        replica_id: int,
        fp: pb.FetchPartition,
        pr: pb.FetchPartitionResponse,
        incarnation: str = "",
        follows_log_start: bool = True,
    ) -> bool:
        """Leader side of a follower fetch: check the follower's log against our epoch
        history and record its position, as of its process ``incarnation`` (which may
        advance the high watermark). Returns False when the answer is a diverging epoch
        instead of data. A follower that does not set ``follows_log_start`` (an older
        version: it never moves its log start to ours) is recorded as such, so DeleteRecords
        does not wait for its start (during a rolling upgrade every
        DeleteRecords on an upgraded leader timed out), and is not answered at once for a
        start it will never adopt (that would turn its long poll into a busy loop)."""
        if replica_id not in part.replicas:
            raise _Refusal(
                E.NOT_LEADER_OR_FOLLOWER,
                f"node {replica_id} is not a replica of {part.topic}-{part.index}",
            )
        if fp.last_fetched_epoch >= 0:
            epoch, end = part.log.epochs.end_offset_for(
                fp.last_fetched_epoch, part.log.log_end_offset
            )
            if epoch != fp.last_fetched_epoch or end < fp.fetch_offset:
                pr.diverging_epoch.epoch = epoch
                pr.diverging_epoch.end_offset = end
                pr.high_watermark = part.high_watermark
                pr.last_stable_offset = part.last_stable_offset
                pr.log_start_offset = part.log_start_offset
                return False
        leo = part.log.log_end_offset
        if fp.fetch_offset > leo:
            # Refused before anything is recorded: a follower cannot hold what this log
            # never had, and its position would count toward the high watermark. A follower
            # beyond our end without a known epoch truncates to the high watermark sent here.
            pr.high_watermark = part.high_watermark
            pr.last_stable_offset = part.last_stable_offset
            pr.log_start_offset = part.log_start_offset
            raise _Refusal(
                E.OFFSET_OUT_OF_RANGE,
                f"fetch offset {fp.fetch_offset} is beyond the log end offset {leo} of "
                f"{part.topic}-{part.index}",
            )
        if part.record_follower_end_offset(replica_id, fp.fetch_offset, incarnation):
            self.manager.committed.notify(part.tp, 1 << 30)
        if not follows_log_start:
            part.record_follower_log_start(replica_id, None)
        elif fp.log_start_offset >= 0:
            part.record_follower_log_start(replica_id, fp.log_start_offset)
        # Out of the ISR (it may join), or in it but below the HW (it lost committed records,
        # restarted without its data: it must leave now, not after the lag time).
        out_of_sync = replica_id not in part.isr or fp.fetch_offset < part.high_watermark
        if out_of_sync and self.on_out_of_sync_fetch is not None:
            self.on_out_of_sync_fetch()
        return True

    def _stale_follower(self, request: pb.FetchRequest) -> str | None:
        """Why a follower fetch's (replica_id, replica_incarnation) is not the process
        registered as that node (``nodes/<id>`` in the cluster view), else None.

        A follower's fetch offset moves the high watermark and its ISR membership, so it
        must come from the node's live process, not any client naming its id, nor a zombie
        of a previous run (KIP-903's broker epoch). A restarted follower registers before it
        fetches; until this node's view has the new registration it is refused and retries."""
        with self.view.lock:
            held = self.view.nodes.get(request.replica_id)
        if held is None:
            return (
                f"node {request.replica_id} is not registered: a follower fetch must come "
                "from a live node"
            )
        registered = held.value.incarnation_id
        if registered != request.replica_incarnation:
            return (
                f"replica_incarnation {request.replica_incarnation!r} is not node "
                f"{request.replica_id}'s registered incarnation"
            )
        return None

    @staticmethod
    def _follower_start_behind(part: Partition, fp: pb.FetchPartition) -> bool:
        """A follower's log start is below what it would adopt from an answer now (the
        leader's start, bounded by the high watermark and the follower's log end, as the
        follower bounds it): answer at once rather than park, so that a DeleteRecords
        waiting for the low watermark is not held up by a long poll. Once adopted, the
        follower's next request reports it and this is False again."""
        if fp.log_start_offset < 0:
            return False
        target = min(part.log_start_offset, part.high_watermark, fp.fetch_offset)
        return fp.log_start_offset < target


#: What a follower session remembers of a partition's last answer: the partition and its
#: leader epoch then, the request's topic id and partition fields, and the high watermark,
#: last stable offset and log start offset the answer carried.
_Sent = tuple[Partition, int, str, int, int, int, int, int, int, int]


class FollowerSession:
    """A follower's FetchStream as its leader keeps it: the leader's half of Kafka's
    incremental fetch sessions (KIP-227).

    A follower long-polls every partition it follows from this leader twice a second. Most
    of them, most of the time, have nothing for it: it is at our log end and knows our high
    watermark and log start. Such a partition (same request fields and leadership as when
    it was last answered, the follower's position recorded, in the ISR, nothing appended,
    nothing moved since) is left out of the answer: it costs a lookup and a few
    comparisons, not a read, a position update, an answer entry and the follower's handling
    of it, and the follower is still counted as having fetched it now (caught up, for the
    ISR). Everything else is answered in full, as a unary fetch is; a partition that
    failed or diverged is forgotten, so its next answer is full too. A follower that leaves
    a partition out of the answer it gets keeps it (its next request asks again)."""

    __slots__ = ("answered", "owner", "request", "sent")

    def __init__(self) -> None:
        #: The request being answered (the stream's latest).
        self.request = pb.FetchRequest()
        #: (replica_id, replica_incarnation, follows_log_start) the memory below is of.
        self.owner: tuple[int, str, bool] | None = None
        self.sent: dict[tuple[str, int], _Sent] = {}
        #: The current pass's partitions answered without an error: (partition, leader
        #: epoch, topic id, request fields, answer).
        self.answered: list[tuple[Partition, int, str, pb.FetchPartition, Any]] = []

    def begin(self, request: pb.FetchRequest) -> None:
        """Start answering ``request``; a request from another follower process (or one
        that does not follow the log start) starts the memory over."""
        owner = (request.replica_id, request.replica_incarnation, request.follows_log_start)
        if owner != self.owner:
            self.owner = owner
            self.sent.clear()
        self.answered.clear()

    def forget(self) -> None:
        """A pass refused the whole request (a stale follower, a bad field): its next
        answer is full."""
        self.sent.clear()
        self.answered.clear()

    def quiet(self, part: Partition | None, topic: str, topic_id: str, fp: Any) -> bool:
        """Whether this partition has nothing new for the follower (then it counts as
        fetched at our log end, and is left out of the answer)."""
        key = (topic, fp.partition)
        memo = self.sent.pop(key, None)
        if memo is None or part is None:
            return False
        offset = fp.fetch_offset
        epoch = part.leader_epoch
        replica, incarnation, follows_start = self.owner  # type: ignore[misc]
        now = (part.high_watermark, part.last_stable_offset, part.log_start_offset)
        if (
            memo != _sent(part, epoch, topic_id, fp, *now)
            or not part.is_leader
            or fp.current_leader_epoch != epoch
            or part.log.log_end_offset != offset
            or replica not in part.isr
            or part.replica_end_offsets.get(replica) != offset
            or part.fetched_by.get(replica) != incarnation
            or (follows_start and FetchRpcs._follower_start_behind(part, fp))
        ):
            return False
        self.sent[key] = memo
        part.note_follower_at_end(replica)
        return True

    def commit(self, asked: list[tuple[str, int]]) -> None:
        """The last pass's answer is the one sent: remember what it told. A partition the
        request no longer names (deleted, moved, no longer followed from here) is
        forgotten, or a stream that lives as long as both nodes would keep every deleted
        log it ever answered for."""
        if len(self.sent) > len(asked):
            named = set(asked)
            for key in [k for k in self.sent if k not in named]:
                del self.sent[key]
        for part, epoch, topic_id, fp, pr in self.answered:
            self.sent[part.tp] = _sent(
                part,
                epoch,
                topic_id,
                fp,
                pr.high_watermark,
                pr.last_stable_offset,
                pr.log_start_offset,
            )
        self.answered.clear()


def _sent(
    part: Partition, epoch: int, topic_id: str, fp: Any, hw: int, lso: int, log_start: int
) -> _Sent:
    """A session's memory of a partition: as answered (:meth:`FollowerSession.commit`), or as
    it stands now, to compare with it (:meth:`FollowerSession.quiet`)."""
    return (
        part,
        epoch,
        topic_id,
        fp.fetch_offset,
        fp.current_leader_epoch,
        fp.last_fetched_epoch,
        fp.log_start_offset,
        hw,
        lso,
        log_start,
    )


class _ThrottleTally:
    """What one pass gave throttled replicas: bytes charged to the leader bucket, partitions
    held back, and bytes sent to replicas a reassignment is adding, by topic."""

    __slots__ = ("charged", "held", "moved")

    def __init__(self) -> None:
        self.charged = 0
        self.held = 0
        self.moved: dict[str, int] = {}


def _leader_throttled(part: Partition, replica_id: int) -> bool:
    """Whether the leader throttles what it sends ``replica_id`` of ``part``: the topic's
    leader.replication.throttled.replicas names this partition on this (the leader's) node,
    as Kafka reads it, and the follower is not in the ISR (KIP-73: in-sync replicas are
    never throttled, so a throttle never slows acks=all or pushes a replica out)."""
    value = part.log.config.leader_replication_throttled_replicas
    return (
        bool(value) and replica_id not in part.isr and is_throttled(value, part.index, part.node_id)
    )


class FollowStep:
    """A followed request: what its next answer reads, and where the last one ended."""

    __slots__ = ("next_offsets", "request")

    def __init__(self, request: pb.FetchRequest) -> None:
        self.request = request
        self.next_offsets: list[int] = []

    def advance(self) -> bool:
        """Move the request on to where the last answer ended; False when a partition failed
        (the follow ends there)."""
        offsets = self.next_offsets
        if not offsets or min(offsets) < 0:
            return False
        it = iter(offsets)
        for ft in self.request.topics:
            for fp in ft.partitions:
                fp.fetch_offset = next(it)
        self.next_offsets = []
        return True


def _fetch_keys(request: pb.FetchRequest) -> list[tuple[str, int]]:
    return [(ft.topic, fp.partition) for ft in request.topics for fp in ft.partitions]
