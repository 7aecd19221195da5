"""Replication on a storage node (DESIGN §6): replica fetchers, ISR changes, controller calls.

Followers: :class:`ReplicaFetchers` runs ONE task per source (leader) node covering every
partition this node follows from it, in one long-poll Fetch per round, on a FetchStream to
that leader (replica_id = this node, fetch_offset = our LEO, last_fetched_epoch = the epoch
of our last batch). Returned batches
are appended with ``Log.append_as_follower``, which also records idempotent producers'
sequences from the batch headers (so that, as a new leader, this node still answers retries
of batches appended under the old one with their original offsets); the HW is the leader's
bounded by our LEO; a diverging epoch truncates the log there (then checkpoints recovery
points; the log rebuilds its producer state for the shorter log) before the next fetch;
OFFSET_OUT_OF_RANGE below the leader's log start restarts the log there; the leader's log
start in every answer moves ours up (DeleteRecords, retention); epoch or leadership errors
wait for new metadata (a short back-off: the reconcile resets it).

Leaders: :class:`IsrManager` periodically (and right after follower fetches) asks each led
partition whether its ISR should change (:func:`strom.storage.partition.decide_isr`) and
proposes that to the active controller with AlterPartition. The new ISR is applied only from
the committed state in the answer (or from the etcd watch), never before.

Everything here runs on the event loop; log appends/truncations run in worker threads under
the partition's ``flush_lock`` so that deleting a replica waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from strom.api import controller_pb2, controller_pb2_grpc, storage_pb2, storage_pb2_grpc
from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode
from strom.grpc_options import GRPC_OPTIONS
from strom.log import CorruptLogError, LogManager
from strom.metadata import ClusterView
from strom.security import default_channel
from strom.security.channel import ChannelCache
from strom.storage import metrics
from strom.storage.disk_errors import is_disk_error, may_take_writes, note_append_failure
from strom.storage.manager import PartitionManager
from strom.storage.partition import Partition
from strom.storage.replication_quota import is_throttled
from strom.storage.writer import INLINE_MAX_BYTES

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
#: Back-off of a partition's refused ISR proposal: doubles with each refusal in the same
#: partition state, up to the cap.
ISR_REFUSED_BACKOFF_S = 0.5
ISR_REFUSED_BACKOFF_MAX_S = 30.0


#: A follower's channel to its leader: strom's options, and a connection of its own (gRPC
#: shares one, with its reconnect backoff, between a process's channels to an address), so
#: the channel made for a restarted leader's new incarnation dials it at once.
FOLLOWER_OPTIONS = (*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1))


def _log_fetch_failure(
    leader: int, addr: str, waiting: int, failures: int, exc: BaseException
) -> None:
    """A follower's fetches from ``leader`` keep failing: at WARNING once
    (:data:`FETCH_FAILURES_LOGGED` in a row), at DEBUG otherwise. Names the leader's address,
    how many partitions wait on it and gRPC's details. FIX (found from outside): the line
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
                if not reused or exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # The leader ended the stream after its last answer (it is stopping): the
                # request never left (gRPC reports the write as INTERNAL), so it goes on a
                # new stream, once (a stopping leader refuses that one).
                self.close()
                return await self.fetch(request, timeout_s)
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


class ControllerClient:
    """Calls the active controller (found from the view's controller key)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self._channels = ChannelCache(GRPC_OPTIONS)
        #: Why the last call got no answer (for the logs of callers that give up).
        self.last_failure = ""

    def _stub(self, host: str, port: int) -> controller_pb2_grpc.ControllerServiceStub:
        return controller_pb2_grpc.ControllerServiceStub(self._channels.get(f"{host}:{port}"))

    async def call(self, method: str, request: Any, timeout: float = 5.0) -> Any | None:
        """Send to the active controller, following NOT_CONTROLLER once; None if none
        answers. gRPC UNIMPLEMENTED propagates (callers decide)."""
        info = self.view.controller_info()
        if info is None:
            self.last_failure = "no active controller in the cluster view"
            return None
        host, port = info.host, info.port
        for _ in range(3):
            stub = self._stub(host, port)
            try:
                resp = await getattr(stub, method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.debug("%s to controller %s:%d failed: %s", method, host, port, exc.code())
                self.last_failure = f"{exc.code().name} from {host}:{port}"
                return None
            if resp.error_code == E.NOT_CONTROLLER and resp.controller.node_id >= 0:
                if (resp.controller.host, resp.controller.port) == (host, port):
                    return resp
                host, port = resp.controller.host, resp.controller.port
                continue
            return resp
        self.last_failure = "redirected by NOT_CONTROLLER three times"
        return None

    async def close(self) -> None:
        await self._channels.close()


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
        #: expired the follower could not fetch again until restarted; found from outside).
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
            # same way, for good (found from outside, after an unclean election).
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
            # FIX: also when this fetcher was cancelled meanwhile (a role change: the
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
    passed for its records (found from outside): the log now restarts empty at the target
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


def running_nodes(view: ClusterView) -> dict[int, str]:
    """The nodes registered and RUNNING in ``view`` (the only ones the controller lets join
    an ISR), each with its registered incarnation: only that process's fetches count for
    its joining (:func:`strom.storage.partition.decide_isr`)."""
    return {
        i: reg.incarnation_id
        for i, reg in view.live_nodes().items()
        if reg.state == md.NODE_STATE_RUNNING
    }


def _some(tps: list[tuple[str, int]], shown: int = 5) -> str:
    """The first few partitions' names, and how many more, for one log line about many."""
    names = ", ".join(f"{t}-{p}" for t, p in tps[:shown])
    return names + (f" and {len(tps) - shown} more" if len(tps) > shown else "")


#: Seconds before the leadership of a partition whose log could not be opened is handed
#: over again in the same partition state (the last call got no answer or was refused).
UNOPENED_RETRY_S = 5.0


@dataclass(slots=True)
class _Refused:
    """A partition's refused ISR proposal: what was refused, and when to ask again."""

    #: (leader epoch, partition epoch) it was refused in: a new partition state starts afresh.
    epochs: tuple[int, int]
    proposal: tuple[int, ...]
    message: str
    delay: float
    retry_at: float
    #: Replicas not to add before ``retry_at`` (INELIGIBLE_REPLICA: a shrink still goes);
    #: None: no proposal for the partition before then.
    held: frozenset[int] | None


class IsrManager:
    """Leader side: proposes ISR shrinks/expansions through AlterPartition.

    A refused proposal is not asked again at once: a partition backs off (doubling, up to
    ``ISR_REFUSED_BACKOFF_MAX_S``) while its state stays the same, and a repeated refusal
    is logged at DEBUG, so that a proposal the controller will not take (a replica it does
    not see as RUNNING) is neither a stream of calls nor a stream of log lines."""

    def __init__(
        self,
        node_id: int,
        manager: PartitionManager,
        controller: ControllerClient,
        incarnation: Callable[[], str],
        lag_time_max_ms: int,
        *,
        running: Callable[[], Collection[int] | Mapping[int, str]],
    ) -> None:
        self.node_id = node_id
        self.manager = manager
        self.controller = controller
        self.incarnation = incarnation
        self.lag_time_max_s = lag_time_max_ms / 1000.0
        #: The nodes registered and RUNNING (:func:`running_nodes` of the node's view), with
        #: their registered incarnations when a mapping.
        self.running = running
        #: Monotonic seconds for back-offs (a test sets its own).
        self.clock: Callable[[], float] = time.monotonic
        self._kick = asyncio.Event()
        #: Resend time of a proposal whose call got no answer (it stays pending).
        self._retry_at: dict[tuple[str, int], float] = {}
        #: Damaged partitions this node leads with nobody to hand them to (logged once).
        self._alone_damaged: set[tuple[str, int]] = set()
        #: Partitions this node leads on a disk refusing appends, with nobody to hand them
        #: to (logged once).
        self._alone_failing: set[tuple[str, int]] = set()
        self._refused: dict[tuple[str, int], _Refused] = {}
        self._last_call_refusal = ""
        #: Unopened partitions (PartitionManager.unopened) whose leadership was handed over:
        #: the (leader epoch, partition epoch) asked in and when, so each is asked once per
        #: state and again only after UNOPENED_RETRY_S.
        self._unopened_asked: dict[tuple[str, int], tuple[tuple[int, int], float]] = {}
        #: Unopened partitions this node leads with nobody to hand them to (logged once).
        self._alone_unopened: set[tuple[str, int]] = set()

    def _prune_retry_at(self, now: float) -> None:
        """Drop the resend times that passed (a passed one holds nothing back) and those of
        partitions this node no longer has. FIX (found from outside): an entry was made for
        every proposal whose call got no answer and never removed."""
        if self._retry_at:
            parts = self.manager.partitions
            for tp in [tp for tp, at in self._retry_at.items() if at <= now or tp not in parts]:
                del self._retry_at[tp]

    def kick(self) -> None:
        """Check soon (a follower fetched; something may have caught up)."""
        self._kick.set()

    async def run(self, stopping: asyncio.Event) -> None:
        interval = min(max(self.lag_time_max_s / 4, 0.05), 1.0)
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=interval)
            self._kick.clear()
            try:
                await self.check()
            except Exception:
                log.exception("ISR check failed")
            refresh_replication_gauges(self.manager)

    async def _resign_unopened(self, now: float) -> None:
        """Hand over the leadership of each partition whose log this node could not open for
        want of file descriptors (PartitionManager.unopened) to another in-sync replica, as
        a leader whose disk refuses appends does (resign_reason ``storage_error``): the node
        has no log to serve it from (found from outside: under a low open-file limit a node
        went on leading 300 partitions it could not open, nobody able to produce to them).
        Kafka takes such a log dir offline and its leaderships move likewise. With no other
        in-sync replica the partition stays offline until the log opens; that is logged."""
        unopened = self.manager.unopened
        if not unopened:
            self._unopened_asked.clear()
            self._alone_unopened.clear()
            return
        view = self.manager.view
        with view.lock:
            found = {}
            for tp in list(unopened):
                v = view.partitions.get(tp)
                t = view.topics.get(tp[0])
                found[tp] = (v.value if v else None, t.value.topic_id if t else "")
        req = controller_pb2.AlterPartitionRequest(
            leader_id=self.node_id, leader_incarnation=self.incarnation()
        )
        asked: list[tuple[str, int]] = []
        alone: list[tuple[str, int]] = []
        for tp, (st, topic_id) in found.items():
            if st is None or self.node_id not in st.replicas or tp in self.manager.partitions:
                unopened.pop(tp, None)  # no longer assigned here, or opened meanwhile
                self._unopened_asked.pop(tp, None)
                continue
            if st.leader != self.node_id:
                self._alone_unopened.discard(tp)
                continue
            others = [r for r in st.isr if r != self.node_id]
            if not others:
                if tp not in self._alone_unopened:
                    self._alone_unopened.add(tp)
                    alone.append(tp)
                continue
            epochs = (st.leader_epoch, st.partition_epoch)
            last = self._unopened_asked.get(tp)
            if last is not None and last[0] == epochs and now - last[1] < UNOPENED_RETRY_S:
                continue
            self._unopened_asked[tp] = (epochs, now)
            req.partitions.add(
                topic=tp[0],
                topic_id=topic_id,
                partition=tp[1],
                leader_epoch=st.leader_epoch,
                partition_epoch=st.partition_epoch,
                new_isr=others,
                resign_reason="storage_error",
            )
            asked.append(tp)
        if alone:
            log.error(
                "%d partitions this node leads are offline until their logs open (%s), no "
                "other replica being in sync to take over: %s",
                len(alone),
                _some(alone),
                unopened[alone[0]],
            )
        if not asked:
            return
        log.info(
            "handing over the leadership of %d partitions whose log could not be opened (%s)",
            len(asked),
            _some(asked),
        )
        try:
            resp = await self.controller.call("AlterPartition", req)
        except grpc.aio.AioRpcError:
            resp = None
        if resp is not None and resp.error_code != E.NONE:
            log.info("AlterPartition refused the hand-over: %s", resp.error_message)

    async def check(self) -> None:
        now = self.clock()
        await self._resign_unopened(now)
        proposals: list[tuple[Partition, tuple[int, ...]]] = []
        running: dict[int, str] | None = None
        if self._refused:
            for tp in [tp for tp in self._refused if tp not in self.manager.partitions]:
                del self._refused[tp]
        self._prune_retry_at(now)
        for part in list(self.manager.partitions.values()):
            if part.deleted or not part.is_leader:
                self._refused.pop(part.tp, None)
                self._retry_at.pop(part.tp, None)
                continue
            if self._retry_at.get(part.tp, 0.0) > now:
                continue
            if part.pending_isr is not None:
                # An earlier call failed without an answer: it may have committed, so the
                # same proposal goes again (the controller answers with the state either way).
                proposals.append((part, part.pending_isr))
                continue
            refused = self._refused.get(part.tp)
            if refused is not None and refused.epochs != (part.leader_epoch, part.partition_epoch):
                del self._refused[part.tp]  # a new partition state: start afresh
                refused = None
            if refused is not None and refused.held is None and now < refused.retry_at:
                continue
            if part.damaged_at >= 0:
                if len(part.isr) > 1:
                    # Stored data failed its check here: hand leadership to another in-sync
                    # replica (an ISR without us: leadership.resign on the controller), then
                    # truncate at the damage and fetch the rest as a follower. Before, this
                    # node kept leading and answered every fetch with STORAGE_ERROR while
                    # good replicas stood by (found from outside).
                    proposals.append((part, tuple(r for r in part.isr if r != self.node_id)))
                    self._alone_damaged.discard(part.tp)
                    continue
                if part.tp not in self._alone_damaged:
                    self._alone_damaged.add(part.tp)
                    log.error(
                        "%s-%d: stored data from offset %d failed a check, and no other "
                        "replica is in sync to take over: still leading",
                        part.topic,
                        part.index,
                        part.damaged_at,
                    )
            elif not part.append_failing:
                self._alone_failing.discard(part.tp)  # appends succeed again: log a new one
            else:
                if len(part.isr) > 1:
                    # Our disk refused an append (full, failing): hand leadership to another
                    # in-sync replica, whose disk may take the writes; as a follower this node
                    # copies what it can and rejoins the ISR once its appends succeed again
                    # (found from outside: a leader on a full disk kept leading and refused
                    # every produce while two in-sync replicas stood by).
                    proposals.append((part, tuple(r for r in part.isr if r != self.node_id)))
                    self._alone_failing.discard(part.tp)
                    continue
                if part.tp not in self._alone_failing:
                    self._alone_failing.add(part.tp)
                    log.error(
                        "%s-%d: the disk refused an append (%s), and no other replica is in "
                        "sync to take over: still leading",
                        part.topic,
                        part.index,
                        part.disk_error,
                    )
            if part.recovering:
                # Elected uncleanly: the partition stays RECOVERING (no follower may join) until
                # its leader says it has recovered (KIP-704). This node has nothing more to
                # recover (its producer state was rebuilt when the log opened), so it reports
                # RECOVERED at once, with the ISR unchanged: a proposal carries RECOVERED
                # unless it says otherwise. Before, nothing reported it, and the partition
                # showed "recovering" until a follower happened to rejoin.
                proposals.append((part, part.isr))
                continue
            if running is None:
                nodes = self.running()
                running = dict(nodes) if isinstance(nodes, Mapping) else dict.fromkeys(nodes, "")
            new = part.isr_change(self.lag_time_max_s, running)
            if refused is not None:
                if new is None:
                    # Nothing to propose any more (the follower stopped fetching, say): a
                    # follower that comes back is proposed at once, without the back-off.
                    del self._refused[part.tp]
                    continue
                if refused.held is not None and now < refused.retry_at:
                    held = refused.held
                    new = part.isr_change(
                        self.lag_time_max_s, {n: i for n, i in running.items() if n not in held}
                    )
            if new is not None:
                proposals.append((part, new))
        if not proposals:
            return
        req = controller_pb2.AlterPartitionRequest(
            leader_id=self.node_id, leader_incarnation=self.incarnation()
        )
        # The state each proposal was made in: a refusal backs off in that state only.
        epochs = {part.tp: (part.leader_epoch, part.partition_epoch) for part, _ in proposals}
        for part, new in proposals:
            refused = self._refused.get(part.tp)
            # A resend (no answer to the last call) or a retry of a refused proposal was
            # logged when first made.
            again = part.pending_isr == new or (refused is not None and refused.proposal == new)
            part.propose_isr(new)
            item = req.partitions.add(
                topic=part.topic,
                topic_id=part.topic_id,
                partition=part.index,
                leader_epoch=part.leader_epoch,
                partition_epoch=part.partition_epoch,
                new_isr=new,
            )
            # The process each added replica's fetches came from: the controller refuses one
            # that is no longer the node's registered incarnation (it restarted meanwhile).
            for r, incarnation in part.pending_isr_incarnations.items():
                if incarnation:
                    item.new_isr_incarnations[r] = incarnation
            if self.node_id not in new and part.damaged_at >= 0:
                why = f", resigning: stored data from offset {part.damaged_at} failed a check"
            elif self.node_id not in new:
                item.resign_reason = "storage_error"
                why = f", resigning: the disk refused an append ({part.disk_error})"
            elif part.recovering:
                why = ", reporting RECOVERED after an unclean election"
            else:
                why = ""
            if not again and self.node_id in new:
                reason = part.isr_change_reason(new, self.lag_time_max_s)
                why += f": {reason}" if reason else ""
            log.log(
                logging.DEBUG if again else logging.INFO,
                "%s-%d: proposing ISR %s -> %s (leader epoch %d, partition epoch %d)%s",
                part.topic,
                part.index,
                list(part.isr),
                list(new),
                part.leader_epoch,
                part.partition_epoch,
                why,
            )
        try:
            resp = await self.controller.call("AlterPartition", req)
        except grpc.aio.AioRpcError:
            resp = None  # no answer: the proposals stay pending and are sent again
        if resp is None:
            for part, _ in proposals:
                self._retry_at[part.tp] = now + 0.5
            return
        for part, _ in proposals:  # answered: nothing to resend
            self._retry_at.pop(part.tp, None)
        if resp.error_code != E.NONE:
            # Refused as a whole: nothing was committed.
            for part, new in proposals:
                part.pending_isr = None
                self._refuse(part, new, epochs[part.tp], resp.error_message, None, now)
            repeat = resp.error_message == self._last_call_refusal
            self._last_call_refusal = resp.error_message
            log.log(
                logging.DEBUG if repeat else logging.INFO,
                "AlterPartition refused: %s",
                resp.error_message,
            )
            return
        self._last_call_refusal = ""
        results = {(r.topic, r.partition): r for r in resp.partitions}
        for part, new in proposals:
            r = results.get(part.tp)
            if r is None:
                part.pending_isr = None
                continue
            if r.error_code != E.NONE:
                held = None
                if r.error_code == E.INELIGIBLE_REPLICA:
                    held = frozenset(new) - frozenset(part.isr)
                repeat = self._refuse(part, new, epochs[part.tp], r.error_message, held, now)
                log.log(
                    logging.DEBUG if repeat else logging.INFO,
                    "%s-%d: ISR proposal refused: %s (backing off %.1f s)",
                    part.topic,
                    part.index,
                    r.error_message,
                    self._refused[part.tp].delay,
                )
            else:
                self._refused.pop(part.tp, None)
            if r.HasField("state") and not part.deleted:
                self.apply_committed(part, r.state)
            # Answered: committed (the state applied above) or refused.
            part.pending_isr = None
            part.maybe_advance_high_watermark()
        refresh_replication_gauges(self.manager)

    def _refuse(
        self,
        part: Partition,
        proposal: tuple[int, ...],
        epochs: tuple[int, int],
        message: str,
        held: frozenset[int] | None,
        now: float,
    ) -> bool:
        """Back off after a refused proposal; True if it is a repeat (the same proposal
        refused the same way in the same partition state: logged at DEBUG)."""
        prev = self._refused.get(part.tp)
        same_state = prev is not None and prev.epochs == epochs
        delay = ISR_REFUSED_BACKOFF_S
        if prev is not None and same_state:
            delay = min(prev.delay * 2, ISR_REFUSED_BACKOFF_MAX_S)
        self._refused[part.tp] = _Refused(epochs, proposal, message, delay, now + delay, held)
        if prev is None or not same_state:
            return False
        return prev.proposal == proposal and prev.message == message

    def apply_committed(self, part: Partition, state: Any) -> None:
        """Adopt a committed state from the controller's answer (apply_state counts ISR
        changes; stale states are ignored there)."""
        epoch = part.partition_epoch
        changed = part.apply_state(state)
        if changed:
            log.info("%s-%d: leadership changed by an AlterPartition answer", *part.tp)
            self.manager.request_reconcile({part.topic})
        if part.partition_epoch != epoch:
            log.info(
                "%s-%d: ISR now %s (partition epoch %d)",
                part.topic,
                part.index,
                list(part.isr),
                part.partition_epoch,
            )
            # A smaller ISR may advance the HW: wake consumers waiting for it.
            self.manager.committed.notify(part.tp, 1 << 30)


def refresh_replication_gauges(manager: PartitionManager) -> None:
    under = under_min = 0
    for part in manager.partitions.values():
        if part.is_leader and not part.deleted:
            # Kafka's rule: fewer in sync than the replicas not being added by a move.
            if len(part.isr) < len(part.replicas) - len(part.adding):
                under += 1
            if len(part.isr) < part.log.config.min_insync_replicas:
                under_min += 1
            m = manager.metrics.get(part.tp)
            if m is not None:
                m.replica_lag.set(leader_replica_lag(part))
    metrics.UNDER_REPLICATED.set(under)
    metrics.UNDER_MIN_ISR.set(under_min)


def leader_replica_lag(part: Partition) -> int:
    """A leader's replica lag: the largest lag behind its LEO of a follower whose position
    it knows. A new leadership knows none until they fetch (apply_state clears them);
    counting those as at offset 0 showed every failover as a lag of the whole log (found
    from outside). A follower that never fetches leaves the ISR: under-replicated
    partitions report it."""
    leo = part.log.log_end_offset
    ends = part.replica_end_offsets
    lag = [leo - ends[r] for r in part.replicas if r != part.node_id and r in ends]
    return max(max(lag, default=0), 0)
