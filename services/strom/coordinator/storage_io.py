"""The coordinator talking to storage nodes: replaying a shard's partition, appending to it
with the shard's idempotent producer, bumping that producer's epoch, and reading end offsets
(DESIGN §7).

Leaders come from the cluster view; a leader move or timeout is retried with the same bytes
(the idempotent producer makes a resend safe) for up to ``WRITE_RETRY_S``. An append (or a
replay's Fetch) left unanswered by a leader that has since moved in the view is given up and
sent to the new leader after a second or two (design §8's overdue rule,
:meth:`StorageIO._moved_from`), not at its timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from strom.api import metadata_pb2 as md
from strom.api import storage_pb2, storage_pb2_grpc
from strom.client.sender import OVERDUE_GRACE_S, OVERDUE_RECHECK_S
from strom.coordinator.core import CoordinatorCore
from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC
from strom.coordinator.replay import ReplayState
from strom.errors import (
    ErrorCode,
    LeaderNotAvailableError,
    RequestTimedOutError,
    StromError,
    error_name,
    is_retriable,
)
from strom.service.headers import INTERNAL_TOPICS_METADATA_KEY

E = ErrorCode
log = logging.getLogger("strom.coordinator")

#: The header that lets the storage nodes take this coordinator's appends to the internal
#: topics, which they refuse to clients (service.headers.INTERNAL_TOPICS_METADATA_KEY).
INTERNAL_WRITER = ((INTERNAL_TOPICS_METADATA_KEY, "true"),)

#: How long a write keeps retrying leader moves before the shard is reloaded.
WRITE_RETRY_S = 10.0


#: How long the coordinator waits for a storage node's InitProducerId answer before asking
#: the next node as well (the clients' lookups hedge after the same time).
INIT_PRODUCER_HEDGE_S = 0.5


async def _watched(call: Any, moved: Callable[[], str | None], what: str = "append") -> Any:
    """A unary call's answer (a Produce, or a shard's replay Fetch: ``what``), the call given
    up (a retriable StromError) once ``moved()`` says why its partition's leader is another:
    asked :data:`OVERDUE_GRACE_S` after it was sent, then every :data:`OVERDUE_RECHECK_S`
    (one timer handle per call, cancelled with its answer). The stream's rule
    (``produce_streams``) for nodes that have no ProduceStream."""
    loop = asyncio.get_running_loop()
    why: str | None = None
    handle: asyncio.TimerHandle | None = None

    def overdue() -> None:
        nonlocal handle, why
        handle = None
        if call.done():
            return
        why = moved()
        if why is None:
            handle = loop.call_later(OVERDUE_RECHECK_S, overdue)
            return
        log.info("no %s answer, and %s: asking the new leader", what, why)
        call.cancel()

    handle = loop.call_later(OVERDUE_GRACE_S, overdue)
    try:
        return await call
    except asyncio.CancelledError:
        if why is None:
            raise  # not ours: the caller's task was cancelled
        raise StromError(f"{what} not answered, and {why}", retriable=True) from None
    finally:
        if handle is not None:
            handle.cancel()


class ShardLost(Exception):
    """The shard is no longer this process's (fenced, key gone): stop using it."""


class AppendRefused(StromError):
    """The leader refused the shard's append for a reason that sending the same bytes again
    cannot change (``code``: INVALID_TIMESTAMP, MESSAGE_TOO_LARGE, CORRUPT_MESSAGE, ...).
    Neither a lost leadership nor a fenced owner: the shard is still this coordinator's, and
    its clients must be told what was refused, not that the shard is loading or moved
    (``strom.coordinator.shard_writes``)."""


class StorageUnreachable(StromError):
    """No storage node answered a call of the coordinator at all (refused connections,
    timeouts), as opposed to nodes answering with an error: this coordinator may be cut
    from the nodes while another reaches them (``strom.coordinator.shard_ownership``
    releases such a shard)."""


#: gRPC codes of a call that no storage node answered: the network or the node is away.
_UNANSWERED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def storage_unreachable(exc: BaseException) -> bool:
    """Whether a shard load failed because the storage nodes did not answer this coordinator
    (a replay Fetch or the fence's append not answered, no node giving a producer id), not
    because they answered with an error or the view names no leader (which every
    coordinator sees alike: handing the shard to another would not help)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in _UNANSWERED
    return isinstance(exc, StorageUnreachable)


def failure_line(exc: BaseException) -> str:
    """One line for why a storage call failed: a gRPC error's status and details (its ``str``
    is a multi-line dump of the call), else the error itself."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)


class StorageIO(CoordinatorCore):
    """Fetch, Produce, InitProducerId and ListOffsets calls to the storage nodes."""

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def _leader(self, partition: int, topic: str = CONSUMER_OFFSETS_TOPIC) -> tuple[str, int]:
        """(address, leader epoch) of a partition's leader from the view; raises if none."""
        assert self.view is not None
        state = self.view.partition(topic, partition)
        if state is None:
            raise LeaderNotAvailableError(f"{topic}-{partition} does not exist (yet)")
        node = self.view.live_nodes().get(state.value.leader)
        if node is None:
            raise LeaderNotAvailableError(self._no_leader(topic, partition, state.value))
        return f"{node.host}:{node.port}", state.value.leader_epoch

    def _no_leader(self, topic: str, partition: int, state: md.PartitionState) -> str:
        """Why ``topic-partition`` has no leader to talk to, with its replicas and which of
        them are offline: what an operator must bring back."""
        assert self.view is not None
        live = self.view.live_nodes()
        offline = [r for r in state.replicas if r not in live]
        where = f"replicas {list(state.replicas)}, ISR {list(state.isr)}, " + (
            f"offline: {offline}" if offline else "all registered"
        )
        if state.leader < 0:
            return f"{topic}-{partition} has no leader ({where})"
        return f"{topic}-{partition}'s leader, node {state.leader}, is not registered ({where})"

    async def _replay(
        self,
        partition: int,
        state: ReplayState,
        position: int,
        *,
        until: int | None,
        topic: str = CONSUMER_OFFSETS_TOPIC,
    ) -> int:
        """Apply the partition's batches from ``position`` up to ``until`` (None: the high
        watermark seen by the first fetch); returns the offset replay ended at.

        A Fetch left unanswered by a leader that has since moved in the view is given up and
        sent to the new leader (design §8's overdue rule, :meth:`_moved_from`, as the
        appends), so a hung leader does not keep the shard loading for the whole 10 s. A
        fetch only reads, so asking the new leader is always safe."""
        target = until
        deadline = time.monotonic() + 30.0
        while True:
            if time.monotonic() > deadline:
                raise StromError(
                    f"replay of {topic}-{partition} stuck at {position} (want {target})",
                    retriable=True,
                )
            addr, leader_epoch = self._leader(partition, topic)
            stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))
            req = storage_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=8 << 20)
            req.topics.add(topic=topic).partitions.add(
                partition=partition,
                fetch_offset=position,
                current_leader_epoch=-1,
                partition_max_bytes=8 << 20,
            )
            moved = functools.partial(self._moved_from, topic, partition, addr, leader_epoch)
            try:
                resp = await _watched(stub.Fetch(req, timeout=10.0), moved, "replay fetch")
            except StromError:
                continue  # (given up on a leader that moved: the loop asks the new one)
            pr = resp.topics[0].partitions[0]
            if pr.error_code == E.OFFSET_OUT_OF_RANGE and pr.log_start_offset > position:
                position = pr.log_start_offset
                continue
            if pr.error_code != E.NONE:
                # With the answer's code: without one it read "CLIENT_ERROR" in the logs.
                raise StromError(
                    f"fetch {topic}-{partition}@{position}: "
                    f"{error_name(pr.error_code)} {pr.error_message}",
                    code=pr.error_code,
                    retriable=True,
                )
            if target is None:
                target = pr.high_watermark
            if pr.records:
                state.apply_batches(pr.records)
                position = max(position, state.next_offset)
            if position >= target:
                return position
            if not pr.records:
                if until is None:
                    return position  # nothing left below the high watermark
                await asyncio.sleep(0.05)  # the fence is acknowledged; its HW is on its way

    async def _init_producer(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """A bumped epoch of the shard's producer id (or a new id for a fresh shard)."""
        req = storage_pb2.InitProducerIdRequest(
            producer_id=producer_id if producer_id >= 0 else -1,
            producer_epoch=max(epoch, 0) if producer_id >= 0 else -1,
        )
        # The live nodes, lowest id first, the next one asked too when one has not answered
        # within INIT_PRODUCER_HEDGE_S (a dead or hung node must not fail or stall every
        # new transactional id); the first id wins. Safe to ask two: a bump is the same
        # answer from any node, and a new id from a second one only leaves an id unused.
        # None giving an id: COORDINATOR_LOAD_IN_PROGRESS, retriable (as Kafka's answer
        # when its producer-id manager has no block).
        assert self.view is not None
        nodes = self.view.live_nodes()
        addresses = [
            (node_id, f"{nodes[node_id].host}:{nodes[node_id].port}") for node_id in sorted(nodes)
        ]
        failures: list[str] = []
        answered = False  # a node answered (with an error), so it is reachable
        running: dict[asyncio.Task[Any], int] = {}

        def ask(node_id: int, address: str) -> None:
            stub = storage_pb2_grpc.StorageServiceStub(self._channel(address))
            running[asyncio.ensure_future(stub.InitProducerId(req, timeout=10.0))] = node_id

        try:
            pending = list(addresses)
            while pending or running:
                if pending:
                    ask(*pending.pop(0))
                done, _ = await asyncio.wait(
                    running,
                    timeout=INIT_PRODUCER_HEDGE_S if pending else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    node_id = running.pop(task)
                    try:
                        resp = task.result()
                    except grpc.aio.AioRpcError as exc:
                        failures.append(f"node {node_id}: {exc.code().name}")
                        continue
                    answered = True
                    if resp.error_code == E.NONE:
                        return resp.producer_id, resp.producer_epoch
                    failures.append(
                        f"node {node_id}: {error_name(resp.error_code)} {resp.error_message}"
                    )
                    if not is_retriable(resp.error_code):
                        raise StromError(f"InitProducerId: {failures[-1]}", code=resp.error_code)
        finally:
            for task in running:
                task.cancel()
        raise (StorageUnreachable if addresses and not answered else StromError)(
            "InitProducerId: no storage node gave a producer id ("
            + ("; ".join(failures) or "no live storage node")
            + ")",
            code=E.COORDINATOR_LOAD_IN_PROGRESS,
            retriable=True,
        )

    async def _produce(
        self, partition: int, batch: bytes, topic: str = CONSUMER_OFFSETS_TOPIC
    ) -> int:
        """Append one batch with acks=all; its base offset. Leader moves and timeouts are
        retried with the same bytes (the idempotent producer makes a resend safe).

        Raises:
            ShardLost: the leader fenced this producer (a newer owner exists).
            StromError: OUT_OF_ORDER_SEQUENCE, this producer's sequence is off (reload).
            AppendRefused: any other error that is not retriable (the batch itself was
                refused: INVALID_TIMESTAMP, MESSAGE_TOO_LARGE, ...). Retriable ones (a leader
                move, too few replicas, a disk failure) are retried.
            StorageUnreachable: no attempt within WRITE_RETRY_S was answered at all.
            RequestTimedOutError: no leader took the batch within WRITE_RETRY_S, though
                the nodes answered (NOT_ENOUGH_REPLICAS, no leader in the view, ...): every
                coordinator would see the same, so this one is not cut off.
        """
        deadline = time.monotonic() + WRITE_RETRY_S
        last = ""
        answered = False
        while True:
            try:
                addr, leader_epoch = self._leader(partition, topic)
                req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
                req.topics.add(topic=topic).partitions.add(
                    partition=partition, records=batch, current_leader_epoch=leader_epoch
                )
                # An attempt ends by WRITE_RETRY_S's deadline (a resend after a leader move
                # gets what is left of it, not another 10 s; at least a second, as a timeout
                # ends the node's stream for the other shards' appends too), and earlier once
                # its leader moved in the view (the overdue rule: see _moved_from).
                attempt_s = min(10.0, max(deadline - time.monotonic(), 1.0))
                moved = functools.partial(self._moved_from, topic, partition, addr, leader_epoch)
                if self._appends.supported(addr):
                    resp = await self._appends.produce(addr, req, attempt_s, moved)
                else:  # a node of an older version
                    stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))
                    resp = await _watched(
                        stub.Produce(req, timeout=attempt_s, metadata=INTERNAL_WRITER), moved
                    )
                answered = True
                pr = resp.topics[0].partitions[0]
                if pr.error_code == E.NONE:
                    return pr.base_offset
                if pr.error_code == E.INVALID_PRODUCER_EPOCH:
                    raise ShardLost(f"{error_name(pr.error_code)}: {pr.error_message}")
                if pr.error_code == E.OUT_OF_ORDER_SEQUENCE:
                    # Our own sequence is off (the log holds batches of this producer we
                    # did not count, e.g. an append whose answer was lost): nobody fenced us.
                    # Not retriable with these bytes; the caller reloads the shard, which
                    # replays the log and starts a new epoch.
                    raise StromError(
                        f"append to {topic}-{partition}: {error_name(pr.error_code)} "
                        f"{pr.error_message}",
                        retriable=False,
                    )
                last = f"{error_name(pr.error_code)} {pr.error_message}"
                if not is_retriable(pr.error_code):
                    raise AppendRefused(
                        f"the storage node refused the append to {topic}-{partition}: {last}",
                        code=pr.error_code,
                        retriable=False,
                    )
            except grpc.aio.AioRpcError as exc:
                answered = answered or exc.code() not in _UNANSWERED
                last = exc.code().name
            except LeaderNotAvailableError as exc:
                answered = True  # the view names no leader: the same for every coordinator
                last = exc.message
            except StromError as exc:  # (a stream that broke or went unanswered)
                if not exc.retriable:
                    raise
                last = exc.message
            if time.monotonic() >= deadline:
                raise (RequestTimedOutError if answered else StorageUnreachable)(
                    f"could not append to {topic}-{partition}: {last}",
                    code=E.REQUEST_TIMED_OUT,
                    retriable=True,
                )
            await asyncio.sleep(0.1)

    def _moved_from(self, topic: str, partition: int, addr: str, epoch: int) -> str | None:
        """Why ``topic-partition``'s leader is no longer ``addr`` under ``epoch`` in the view
        (another live leader, or the same under a higher epoch), or None while it is, or has
        no live leader yet (nothing to resend to: waiting on is all there is to do). Asked
        while an append is overdue (design §8's overdue rule, the producers' constants): the
        view is the coordinator's own, kept by its etcd watch, so this is a few dict lookups.

        Resending the same bytes to the new leader is safe: the batch carries the shard's
        producer id, epoch and sequence (``strom.coordinator.shard_writes``), so a leader
        that already holds it (replicated from the old leader before the move) answers it
        as a duplicate with its original offsets, with acks=all only once it is committed,
        and never writes it twice (design §6)."""
        try:
            now_addr, now_epoch = self._leader(partition, topic)
        except StromError:
            return None
        if now_addr != addr:
            return f"the leader of {topic}-{partition} moved from {addr} to {now_addr}"
        if 0 <= epoch < now_epoch:
            return f"the leader of {topic}-{partition} has a new epoch {now_epoch} (was {epoch})"
        return None

    async def _end_offsets(self, parts: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """High watermarks by ListOffsets(LATEST) to each leader; missing = unknown."""
        by_leader: dict[str, list[tuple[str, int]]] = {}
        for t, p in parts:
            try:
                addr, _ = self._leader(p, t)
            except StromError:
                continue
            by_leader.setdefault(addr, []).append((t, p))

        async def ask(addr: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
            req = storage_pb2.ListOffsetsRequest(replica_id=-1)
            topics: dict[str, Any] = {}
            for t, p in tps:
                if t not in topics:
                    topics[t] = req.topics.add(topic=t)
                topics[t].partitions.add(partition=p, current_leader_epoch=-1, timestamp=-1)
            stub = storage_pb2_grpc.StorageServiceStub(self._channel(addr))
            try:
                r = await stub.ListOffsets(req, timeout=5.0)
            except grpc.aio.AioRpcError:
                return {}
            return {
                (tr.topic, pr.partition): pr.offset
                for tr in r.topics
                for pr in tr.partitions
                if pr.error_code == E.NONE
            }

        out: dict[tuple[str, int], int] = {}
        for found in await asyncio.gather(*(ask(a, tps) for a, tps in by_leader.items())):
            out.update(found)
        return out
