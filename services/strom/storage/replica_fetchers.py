"""A storage node's follower side of replication (DESIGN §6): the replica fetchers.

:class:`ReplicaFetchers` runs ONE task per source (leader) node covering every partition
this node follows from it, in one long-poll Fetch per round, on a FetchStream to that leader
(replica_id = this node, fetch_offset = our LEO, last_fetched_epoch = the epoch of our last
batch). Returned batches are appended with ``Log.append_as_follower``, which also records
idempotent producers' sequences from the batch headers (so that, as a new leader, this node
still answers retries of batches appended under the old one with their original offsets);
the HW is the leader's bounded by our LEO; a diverging epoch truncates the log there (then
checkpoints recovery points; the log rebuilds its producer state for the shorter log) before
the next fetch; OFFSET_OUT_OF_RANGE below the leader's log start restarts the log there; the
leader's log start in every answer moves ours up (DeleteRecords, retention); epoch or
leadership errors wait for new metadata (a short back-off: the reconcile resets it).

Everything here runs on the event loop; log appends/truncations run in worker threads under
the partition's ``flush_lock`` so that deleting a replica waits for them.

The leader side (ISR changes) is :mod:`strom.storage.isr`; the calls to the controller
are :mod:`strom.storage.controller_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from strom.api import storage_pb2, storage_pb2_grpc
from strom.errors import ErrorCode
from strom.grpc_options import GRPC_OPTIONS
from strom.log import CorruptLogError, LogManager
from strom.metadata import ClusterView
from strom.security import default_channel
from strom.storage import metrics
from strom.storage.disk_errors import is_disk_error, may_take_writes, note_append_failure
from strom.storage.manager import PartitionManager
from strom.storage.partition import Partition
from strom.storage.replication_quota import is_throttled
from strom.storage.writer import INLINE_MAX_BYTES

# The replication logger, not this module's: operators filter replication's lines on
# "strom.storage.replication", where they were before the module was split.
log = logging.getLogger("strom.storage.replication")

E = ErrorCode
pb = storage_pb2

#: Long-poll parameters of follower fetches.
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 8 * 1024 * 1024
#: Back-off after a leader-side error for one partition (metadata is expected to change).
PARTITION_BACKOFF_S = 0.2
#: Seconds between two looks at a disk that refused a follower's append (full, failing).
DISK_RETRY_S = 1.0
#: A follower's fetches from a leader failing this many times in a row (~15 s with the
#: back-off) are logged at WARNING, once, and again when they work: a leader that cannot be
#: reached (or refuses this node's certificate) showed only as an ISR shrink before.
FETCH_FAILURES_LOGGED = 10


#: A follower's channel to its leader: strom's options, and a connection of its own (gRPC
#: shares one, with its reconnect backoff, between a process's channels to an address), so
#: the channel made for a restarted leader's new incarnation dials it at once.
FOLLOWER_OPTIONS = (*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1))


def _log_fetch_failure(
    leader: int, addr: str, waiting: int, failures: int, exc: BaseException
) -> None:
    """A follower's fetches from ``leader`` keep failing: at WARNING once
    (:data:`FETCH_FAILURES_LOGGED` in a row), at DEBUG otherwise. Names the leader's address,
    how many partitions wait on it and gRPC's details. The line
    said only "fetch from node 3 failed 10 times in a row: UNAVAILABLE"."""
    if isinstance(exc, grpc.aio.AioRpcError):
        why = f"{exc.code().name}: {exc.details()}"
    else:
        why = repr(exc)
    log.log(
        logging.WARNING if failures == FETCH_FAILURES_LOGGED else logging.DEBUG,
        "fetch from node %d (%s) for %d partitions failed %d times in a row: %s",
        leader,
        addr,
        waiting,
        failures,
        why,
        extra={"fields": {"leader": leader, "address": addr, "partitions": waiting}},
    )


class _LeaderFetches:
    """A follower's fetches from one leader node: on a ``FetchStream`` (about half the
    leader's CPU per fetch of a unary call: a follower long-polls all the time), or unary
    calls to a leader without it (an older version). A stream that fails or ends is dropped
    and the next fetch opens another."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = storage_pb2_grpc.StorageServiceStub(channel)
        self._call: Any = None
        self._unary = False

    async def fetch(self, request: pb.FetchRequest, timeout_s: float) -> pb.FetchResponse:
        """The answer; raises ``grpc.aio.AioRpcError`` (or TimeoutError) as a failed call."""
        if self._unary:
            resp: pb.FetchResponse = await self._stub.Fetch(request, timeout=timeout_s)
            return resp
        if self._call is not None and self._call.done():
            self.close()  # ended since its last answer (below)
        reused = self._call is not None
        if self._call is None:
            self._call = self._stub.FetchStream()
        call = self._call
        try:
            try:
                await call.write(request)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self.close()
                if reused:
                    # The leader ended the stream after its last answer (it is stopping):
                    # the request never left (gRPC reports the write as INTERNAL), so it
                    # goes on a new stream, once (a stopping leader refuses that one).
                    return await self.fetch(request, timeout_s)
                # A fresh stream ended before its first write: a leader without FetchStream
                # (an older version) answers UNIMPLEMENTED at once, and the write can lose
                # that race (gRPC reports it as INTERNAL, the status lost; CI). This request
                # goes as a unary call; the next fetch opens a stream again, and its read
                # tells an older leader (UNIMPLEMENTED) from a failing one.
                unary: pb.FetchResponse = await self._stub.Fetch(request, timeout=timeout_s)
                return unary
            answer = await asyncio.wait_for(call.read(), timeout_s)
        except BaseException as exc:
            self.close()
            if (
                isinstance(exc, grpc.aio.AioRpcError)
                and exc.code() == grpc.StatusCode.UNIMPLEMENTED
            ):
                log.info("the leader has no FetchStream; fetching with unary calls")
                self._unary = True
                return await self.fetch(request, timeout_s)
            raise
        if answer is grpc.aio.EOF:  # the leader ended the stream (it is stopping)
            self.close()
            raise ConnectionResetError("the leader ended the fetch stream")
        return answer  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


class ReplicaFetchers:
    """One fetcher task per leader node this node follows partitions from."""

    def __init__(
        self,
        node_id: int,
        manager: PartitionManager,
        view: ClusterView,
        incarnation: Callable[[], str],
    ) -> None:
        self.node_id = node_id
        self.manager = manager
        self.view = view
        self.incarnation = incarnation
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._wake: dict[int, asyncio.Event] = {}
        self._stopped = False

    def followed(self) -> dict[int, list[Partition]]:
        """Leader node id -> the partitions this node follows from it."""
        out: dict[int, list[Partition]] = {}
        for part in self.manager.partitions.values():
            if part.deleted or part.is_leader or part.leader < 0:
                continue
            if self.node_id not in part.replicas:
                continue
            out.setdefault(part.leader, []).append(part)
        return out

    def refresh(self) -> None:
        """After a reconcile: start fetchers for new leaders, stop unused ones, wake all."""
        if self._stopped:
            return
        wanted = set(self.followed())
        for leader in list(self.tasks):
            if leader not in wanted:
                self.tasks.pop(leader).cancel()
                self._wake.pop(leader, None)
        for leader in wanted:
            task = self.tasks.get(leader)
            if task is None or task.done():
                self._wake[leader] = asyncio.Event()
                self.tasks[leader] = asyncio.get_running_loop().create_task(
                    self._run(leader), name=f"replica-fetcher-{leader}"
                )
            else:
                self._wake[leader].set()

    async def stop(self) -> None:
        self._stopped = True
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        self.tasks.clear()

    async def _sleep(self, leader: int, seconds: float) -> None:
        ev = self._wake.get(leader)
        if ev is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout=seconds)
        ev.clear()

    async def _run(self, leader: int) -> None:
        channel: grpc.aio.Channel | None = None
        fetches: _LeaderFetches | None = None
        target = None
        #: The settings ``channel`` was made with: a renewed certificate makes it again (a
        #: channel presents its first certificate at every reconnect, so after that one
        #: expired the follower could not fetch again until restarted).
        made_with = None
        backoff = 0.1
        #: Fetches failed in a row (logged once they look like more than a blip).
        failures = 0
        try:
            while not self._stopped:
                parts = self.followed().get(leader, [])
                now = asyncio.get_running_loop().time()
                ready = [p for p in parts if p.fetch_retry_at <= now]
                if any(p.disk_error is not None for p in ready):
                    ready = self._disk_ready(ready, now)
                if not parts:
                    return
                reg = self.view.live_nodes().get(leader)
                if reg is None or not ready:
                    await self._sleep(leader, PARTITION_BACKOFF_S)
                    continue
                # A new incarnation of the leader (restarted, maybe at the same address)
                # gets a new channel: the old one may be waiting out a reconnect backoff.
                where = (reg.host, reg.port, reg.incarnation_id)
                addr = f"{reg.host}:{reg.port}"
                security = default_channel()
                if where != target or security is not made_with:
                    if fetches is not None:
                        fetches.close()
                    if channel is not None:
                        await channel.close()
                    channel = security.aio_channel(addr, FOLLOWER_OPTIONS)
                    fetches = _LeaderFetches(channel)
                    target, made_with = where, security
                assert fetches is not None
                for part in ready:
                    if part.damaged_at >= 0:
                        await self._drop_damaged(part)
                ready = [p for p in ready if p.damaged_at < 0]
                ready, wait_s, cap = self._follower_throttle(ready)
                if not ready:
                    await self._sleep(leader, wait_s or PARTITION_BACKOFF_S)
                    continue
                request, sent = self._request(ready, cap)
                try:
                    resp = await fetches.fetch(request, FETCH_MAX_WAIT_MS / 1000.0 + 5.0)
                except (grpc.aio.AioRpcError, TimeoutError, ConnectionResetError) as exc:
                    failures += 1
                    if failures == FETCH_FAILURES_LOGGED or log.isEnabledFor(logging.DEBUG):
                        _log_fetch_failure(leader, addr, len(parts), failures, exc)
                    await self._sleep(leader, backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                backoff = 0.1
                if failures >= FETCH_FAILURES_LOGGED:
                    log.warning(
                        "fetching from node %d (%s) again after %d failures", leader, addr, failures
                    )
                failures = 0
                inline_budget = [INLINE_MAX_BYTES]  # what this answer may append on the loop
                # Log starts this answer moved: one checkpoint for all of them, after it (a
                # retention pass on the leader moves many partitions' starts at once).
                moved_starts: list[Partition] = []
                self._charge_follower_throttle(resp, sent)
                for tr in resp.topics:
                    for pr in tr.partitions:
                        entry = sent.get((tr.topic, pr.partition))
                        if entry is None:
                            continue
                        part, fetch_offset, epoch = entry
                        try:
                            await self._handle(
                                part, fetch_offset, epoch, pr, inline_budget, moved_starts
                            )
                        except Exception as exc:
                            if is_disk_error(exc):
                                # A full or failing disk fails every retry the same way: one
                                # line a minute and a metric, not a traceback a second (found
                                # from outside).
                                assert isinstance(exc, OSError)
                                note_append_failure(
                                    f"replicating from node {leader}", *part.tp, exc
                                )
                                part.note_append_failure(exc)
                            else:
                                log.exception(
                                    "replicating %s-%d from node %d failed",
                                    part.topic,
                                    part.index,
                                    leader,
                                )
                            part.fetch_retry_at = (
                                asyncio.get_running_loop().time() + PARTITION_BACKOFF_S * 5
                            )
                if moved_starts:
                    try:
                        await self._checkpoint()
                    except Exception:  # the periodic checkpoint tries again
                        log.exception("checkpointing log starts moved by node %d failed", leader)
        except asyncio.CancelledError:
            pass
        finally:
            if fetches is not None:
                fetches.close()
            if channel is not None:
                with contextlib.suppress(Exception):
                    await channel.close()

    def _follower_throttle(
        self, ready: list[Partition]
    ) -> tuple[list[Partition], float, dict[tuple[str, int], int]]:
        """The follower side of the replication throttle (Kafka's KIP-73) for the
        partitions this node throttles (named on it by follower.replication.throttled.replicas,
        and not in the ISR). While its follower bucket is in debt they are left out of the
        fetch, as Kafka's fetcher leaves them out; otherwise each asks for at most what the
        bucket holds, and they go first in the request, so the first with data gets at least
        one whole batch (the leader's rule) and a move always progresses. Returns the
        partitions to fetch, when the bucket refills (seconds; 0 when none was left out) and
        the throttled partitions' byte caps."""
        bucket = self.manager.replication_quotas.follower
        if bucket.rate is None:
            return ready, 0.0, {}
        held = {p.tp for p in ready if _follower_throttled(p, self.node_id)}
        if not held:
            return ready, 0.0, {}
        available = bucket.available() or 0
        if available <= 0:
            metrics.REPLICATION_THROTTLED.labels("follower").inc(len(held))
            keep = [p for p in ready if p.tp not in held]
            return keep, min(max(bucket.wait_s(), 0.01), FETCH_MAX_WAIT_MS / 1000.0), {}
        ordered = [p for p in ready if p.tp in held] + [p for p in ready if p.tp not in held]
        cap = min(available, FETCH_MAX_BYTES)
        return ordered, 0.0, dict.fromkeys(held, cap)

    def _charge_follower_throttle(
        self,
        resp: pb.FetchResponse,
        sent: dict[tuple[str, int], tuple[Partition, int, int]],
    ) -> None:
        """Charge the follower bucket with what an answer brought for throttled replicas,
        and count the bytes fetched for replicas a reassignment is adding here (once per
        partition of the answer, never per record)."""
        bucket = self.manager.replication_quotas.follower
        charged = 0
        for tr in resp.topics:
            for pr in tr.partitions:
                n = len(pr.records)
                entry = sent.get((tr.topic, pr.partition))
                if not n or entry is None:
                    continue
                part = entry[0]
                if self.node_id in part.adding:
                    metrics.REASSIGNMENT_BYTES_IN.labels(tr.topic).inc(n)
                if bucket.rate is not None and _follower_throttled(part, self.node_id):
                    charged += n
        if charged:
            bucket.record(charged)
            metrics.REPLICATION_THROTTLED_BYTES.labels("follower").inc(charged)

    def _request(
        self, parts: list[Partition], caps: Mapping[tuple[str, int], int] | None = None
    ) -> tuple[pb.FetchRequest, dict[tuple[str, int], tuple[Partition, int, int]]]:
        """A fetch of ``parts`` in their order; ``caps`` bounds some partitions' bytes (the
        follower throttle)."""
        req = pb.FetchRequest(
            replica_id=self.node_id,
            replica_incarnation=self.incarnation(),
            follows_log_start=True,  # it moves its start to ours (_follow_log_start)
            max_wait_ms=FETCH_MAX_WAIT_MS,
            min_bytes=1,
            max_bytes=FETCH_MAX_BYTES,
        )
        sent: dict[tuple[str, int], tuple[Partition, int, int]] = {}
        by_topic: dict[str, Any] = {}
        for part in parts:
            ft = by_topic.get(part.topic)
            if ft is None:
                ft = by_topic[part.topic] = req.topics.add(topic=part.topic, topic_id=part.topic_id)
            lg = part.log
            offset = lg.log_end_offset
            ft.partitions.add(
                partition=part.index,
                fetch_offset=offset,
                current_leader_epoch=part.leader_epoch,
                last_fetched_epoch=lg.epochs.latest_epoch,
                log_start_offset=lg.log_start_offset,
                partition_max_bytes=(caps or {}).get(part.tp, FETCH_MAX_BYTES),
            )
            sent[part.tp] = (part, offset, part.leader_epoch)
        return req, sent

    async def _handle(
        self,
        part: Partition,
        fetch_offset: int,
        epoch: int,
        pr: pb.FetchPartitionResponse,
        inline_budget: list[int] | None = None,
        moved_starts: list[Partition] | None = None,
    ) -> None:
        """Apply one partition's part of a fetch answer. A moved log start is checkpointed
        by the caller after the whole answer when it passes ``moved_starts`` (it is added
        there), else here."""
        if part.deleted or part.is_leader or part.leader_epoch != epoch:
            return  # the state changed while the fetch was in flight
        code = pr.error_code
        loop = asyncio.get_running_loop()
        if code == E.OFFSET_OUT_OF_RANGE:
            if pr.log_start_offset >= 0 and fetch_offset < pr.log_start_offset:
                log.info(
                    "%s-%d: fetch offset %d is below the leader's log start %d; restarting there",
                    part.topic,
                    part.index,
                    fetch_offset,
                    pr.log_start_offset,
                )
                await self._locked(part, part.log.truncate_fully_and_start_at, pr.log_start_offset)
                part.set_follower_high_watermark(pr.high_watermark)
                self.manager.refresh_gauges(part)
                await self._log_start_moved(part, moved_starts)
            elif pr.high_watermark >= 0:
                # Our log end is above the leader's: keep what it committed. Below our log
                # start, the log restarts empty there (Log.truncate_to).
                await self._truncate(part, pr.high_watermark)
            return
        if code != E.NONE:
            # FENCED/UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, ...: metadata is about to
            # change (the reconcile resets the back-off); try again shortly in any case.
            part.fetch_retry_at = loop.time() + PARTITION_BACKOFF_S
            return
        if pr.HasField("diverging_epoch"):
            target = divergence_truncation_offset(
                part.log.epochs.end_offset_for,
                part.log.log_end_offset,
                pr.diverging_epoch.epoch,
                pr.diverging_epoch.end_offset,
                part.log.log_start_offset,
                leader_log_start=pr.log_start_offset,
            )
            # The leader knows no epoch as old as our newest: every batch it holds is newer
            # than all of ours, so nothing of ours is its. Truncating only to our log start
            # kept the epoch history of the batches below it, and the next fetch diverged the
            # same way, for good (after an unclean election).
            fully = pr.diverging_epoch.epoch < 0 or pr.diverging_epoch.end_offset < 0
            log.info(
                "%s-%d: log diverges from leader %d at epoch %d (end %d); truncating %sto %d",
                part.topic,
                part.index,
                part.leader,
                pr.diverging_epoch.epoch,
                pr.diverging_epoch.end_offset,
                "fully, restarting the log empty, " if fully else "",
                target,
            )
            await self._truncate(part, target, fully=fully)
            return
        if pr.records:
            if part.log.log_end_offset != fetch_offset:
                return  # our log changed meanwhile; fetch again from the new end
            # Small appends run inline, as the leader's do (strom.storage.writer): two thread
            # hops cost more than writing a few KiB, and every acks=all produce waits for it.
            # At most INLINE_MAX_BYTES per fetch answer (an answer may carry many partitions),
            # and not when the batches may start a new leader epoch: recording it fsyncs.
            size = len(pr.records)
            budget = inline_budget or [0]  # none given: in a thread
            inline = size <= budget[0] and part.log.epochs.latest_epoch >= epoch
            if inline:
                budget[0] -= size
            info = await self._locked(part, part.log.append_as_follower, pr.records, inline=inline)
            if part.is_leader or part.leader_epoch != epoch:
                return
            if info is not None and info.first_offset < fetch_offset:
                # The log restarted at a batch holding its log start (append_as_follower):
                # the checkpoint must keep that start, not the first segment's base below it.
                await self._log_start_moved(part, moved_starts)
            if info is not None:
                part.note_append_ok()
                self.manager.appended.notify(part.tp, info.bytes)
                m = self.manager.metrics.get(part.tp)
                if m is not None:
                    m.log_end_offset.set(part.log.log_end_offset)
                    m.log_size.inc(info.bytes)
        if part.set_follower_high_watermark(pr.high_watermark):
            self.manager.committed.notify(part.tp, 1 << 30)
        if pr.log_start_offset > part.log.log_start_offset:
            await self._follow_log_start(part, pr.log_start_offset, moved_starts)
        m = self.manager.metrics.get(part.tp)
        if m is not None:
            m.replica_lag.set(max(pr.high_watermark - part.log.log_end_offset, 0))

    async def _follow_log_start(
        self, part: Partition, leader_log_start: int, moved_starts: list[Partition] | None
    ) -> None:
        """Move our log start up to the leader's (DeleteRecords, retention), as Kafka's
        followers do on every fetch answer (maybeIncrementLogStartOffset). Otherwise the
        deleted records come back, readable, as soon as this replica leads. Bounded by our
        high watermark: only offsets the leader committed, which our log shares with it.
        Made durable at once, as the leader's DeleteRecords is: a crash must not bring them
        back either."""
        new = min(leader_log_start, part.high_watermark)
        if new <= part.log.log_start_offset:
            return
        await self._locked(part, part.log.delete_records, new)
        self.manager.refresh_gauges(part)
        await self._log_start_moved(part, moved_starts)

    async def _log_start_moved(self, part: Partition, moved_starts: list[Partition] | None) -> None:
        """A log start to make durable: checkpoint it now, or leave that to the caller
        (``moved_starts``)."""
        if moved_starts is None:
            await self._checkpoint()
        else:
            moved_starts.append(part)

    async def _checkpoint(self) -> None:
        """Write the data dir's checkpoints (recovery points, log starts) in a thread."""
        logs: LogManager | None = self.manager.logs
        if logs is not None:
            await asyncio.to_thread(logs.checkpoint)

    @staticmethod
    def _disk_ready(parts: list[Partition], now: float) -> list[Partition]:
        """``parts`` without those whose last append failed on a disk that still cannot take
        it (strom.storage.disk_errors.may_take_writes): they are looked at again in a
        second. A follower that fetched regardless was caught up whenever its partition took
        no writes, rejoined the ISR and, as the preferred replica, was made leader again only
        to fail its next append and resign again."""
        out = []
        for p in parts:
            err = p.disk_error
            if err is not None and not may_take_writes(
                p.log.directory, err, p.disk_error_at, p.clock()
            ):
                p.fetch_retry_at = now + DISK_RETRY_S
                continue
            out.append(p)
        return out

    async def _locked(
        self, part: Partition, fn: Callable[..., Any], *args: Any, inline: bool = False
    ) -> Any:
        """Run a log change in a thread (``inline``: on the loop) under the partition's flush
        lock. A cancelled fetcher (role change, shutdown) still waits for the thread, so the
        lock covers all of it."""
        async with part.flush_lock:
            if part.deleted:
                return None
            # Inline only if no maintenance thread (retention, compaction) holds the log:
            # the loop must not wait for one.
            if inline and part.log.lock.acquire(blocking=False):
                try:
                    return fn(*args)
                finally:
                    part.log.lock.release()
            fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
            try:
                return await asyncio.shield(fut)
            except asyncio.CancelledError:
                with contextlib.suppress(BaseException):
                    await fut
                raise

    async def _drop_damaged(self, part: Partition) -> None:
        """Truncate at the damaged data found while we led (Partition.damaged_at), so that
        the leader's copy replaces it. If the damage is in the batch headers the truncation
        walks, the whole log goes (and is fetched again)."""
        offset, part.damaged_at = part.damaged_at, -1
        log.warning(
            "%s-%d: truncating to %d, where stored data failed a check, to fetch it again "
            "from leader %d",
            part.topic,
            part.index,
            offset,
            part.leader,
        )
        try:
            try:
                await self._truncate(part, offset)
            except CorruptLogError:
                log.exception("%s-%d: truncating the damaged log failed; restarting it", *part.tp)
                await self._truncate(part, part.log.log_start_offset, fully=True)
        except Exception:
            # Not fetched until the damage is gone (a disk error, say): try again later.
            log.exception("%s-%d: truncating the damaged log failed", *part.tp)
            part.note_damage(offset)
            part.fetch_retry_at = asyncio.get_running_loop().time() + PARTITION_BACKOFF_S * 5

    async def _truncate(self, part: Partition, offset: int, *, fully: bool = False) -> None:
        """Truncate our log to ``offset`` (``fully``: drop all of it and restart it empty
        there, epoch history included)."""
        try:
            if fully:
                await self._locked(part, part.log.truncate_fully_and_start_at, offset)
            else:
                await self._locked(part, part.log.truncate_to, offset)
        finally:
            # Also when this fetcher was cancelled meanwhile (a role change: the
            # truncation still completes, see _locked). The checkpoint was skipped then, and
            # a log restarted below its old start (at 50, start 80) kept 80 on disk until the
            # periodic checkpoint: a crash meanwhile hid 50..79 (found by the clean-clone CI).
            part.set_follower_high_watermark(part.high_watermark)
            self.manager.refresh_gauges(part)
            # The recovery point may have moved down: make that durable before going on.
            await asyncio.shield(self._checkpoint())


def _follower_throttled(part: Partition, node_id: int) -> bool:
    """Whether this node throttles its fetching for ``part``: the topic's
    follower.replication.throttled.replicas names the partition on this node and this
    replica is not in the ISR (an in-sync replica is never throttled: KIP-73)."""
    value = part.log.config.follower_replication_throttled_replicas
    return bool(value) and node_id not in part.isr and is_throttled(value, part.index, node_id)


def divergence_truncation_offset(
    own_end_offset_for: Callable[[int, int], tuple[int, int]],
    log_end_offset: int,
    leader_epoch: int,
    leader_end_offset: int,
    log_start_offset: int,
    *,
    leader_log_start: int = -1,
) -> int:
    """Where a follower truncates when the leader answers diverging_epoch (epoch, end).

    Kafka's rule: the leader's end offset for that epoch, or our own end of that epoch if it
    is earlier; if the leader knows no such epoch (-1) we keep nothing of ours above our
    start, nor above the leader's log start (``leader_log_start``, when known): the records
    from there on are the leader's to give us. Never above our LEO.

    It may be below our log start: a leader elected uncleanly that missed a DeleteRecords
    can end below it, and what it appended from there on is not what we hold. Clamping to our
    log start kept our own records there, and once our log reached the leader's end they
    passed for its records: the log now restarts empty at the target
    (Log.truncate_to) and fetches the leader's."""
    if leader_epoch < 0 or leader_end_offset < 0:
        if leader_log_start >= 0:
            return min(log_start_offset, leader_log_start)
        return log_start_offset
    own_epoch, own_end = own_end_offset_for(leader_epoch, log_end_offset)
    target = leader_end_offset
    if own_epoch >= 0 and own_end >= 0:
        target = min(target, own_end)
    return min(target, log_end_offset)
