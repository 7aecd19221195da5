"""How a storage node writes the records of a ProduceRecords call to their partitions' leaders.

Everything here runs on the node's event loop (but the Arrow encoding of a batch of
OFFLOAD_BYTES or more, which runs in a worker thread): a call's batch is appended in-process when
this node leads the partition (no network, no thread hop) and sent with an asyncio gRPC
Produce to the leader otherwise. Forwarding to the leader is the documented choice (rather
than answering NOT_LEADER_OR_FOLLOWER): the keyed records of one call usually span partitions
led by different nodes, and a client in another language should not have to route by key.

Two senders:

* :class:`PartitionSender` (the default): the node's own idempotent producer for one
  partition, with a producer id of its own. Calls for the partition queue up and go out in
  order, one request at a time; the calls waiting while one is in flight go out together as
  consecutive batches of one request (so a busy partition costs a request per round trip, not
  per call), as long as they have the same client id (the leader counts a request's bytes
  under one: callers interleaving on one partition cost a request each). Each batch
  carries a sequence number, so a request retried after an ambiguous
  failure (a timeout, a leader dying mid-request) is answered with the original offsets by a
  leader that has it, never written twice (DESIGN §6). Why one request at a time: gRPC orders
  nothing between calls (DESIGN §6, "Order on the wire"), and with a single request in flight
  a sequence refusal can only mean the leader lost the producer's state, which an epoch bump
  (or, for an unknown producer, a restart at sequence 0) settles when no attempt of the
  request can have been appended; when one may have been (an earlier attempt timed out or
  lost its answer), its calls fail saying the records may have been written, and the next
  request takes a new epoch. The pipelining and reordering cases strom's Python Producer
  handles cannot arise.
* :class:`SequencedSender`: the caller's own producer id, epoch and base sequence (for
  idempotent retries *by the caller*); one batch, sent to the leader and retried until the
  call's deadline, which the sequence makes safe.

Both talk to leaders through :class:`LeaderRoute`, which gives up a forwarded Produce whose
partition's leader moved while it was unanswered (:class:`_LeaderWatch`; design §8, the
Python producer's overdue rule): the sender then retries it at the new leader, which the
sequence numbers make safe, instead of waiting out a hung leader until the call's timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow as pa
from prometheus_client import Counter

from strom.api import storage_pb2, storage_pb2_grpc
from strom.client.sender import OVERDUE_GRACE_S, OVERDUE_RECHECK_S
from strom.errors import ErrorCode, RequestTimedOutError, StromError, error_for, is_retriable
from strom.grpc_options import GRPC_OPTIONS
from strom.metadata import ClusterView
from strom.record import encode_arrow
from strom.security.channel import ChannelCache
from strom.security.quotas import CHARGED_BY_CALLER
from strom.service.limits import ProduceShed
from strom.storage.metrics import CALLER_CLIENT_ID

log = logging.getLogger("strom.storage.record_producers")
E = ErrorCode

#: Transport failures of a Produce: the request may or may not have been appended.
_TRANSPORT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        # The leader shed the request (produce admission): nothing appended, send it again.
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
#: Answers after which the records may have been appended (retry the same bytes).
AMBIGUOUS = frozenset({E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND})
#: Sequence refusals that say the leader's producer state is not ours (nothing appended).
_SEQUENCE = frozenset({E.OUT_OF_ORDER_SEQUENCE, E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_EPOCH})
#: Most bytes of records sent in one request of a PartitionSender (coalesced calls).
MAX_REQUEST_BYTES = 4 << 20
SEQUENCE_LIMIT = 1 << 31
#: Batches of at least this many bytes of records are encoded in a worker thread, so the
#: event loop goes on meanwhile (Arrow IPC writing and the CRC release the GIL for most of
#: their time: 0.8 s for 200 MB); smaller ones are cheaper on the loop.
OFFLOAD_BYTES = 1 << 20
BACKOFF_S = 0.05
#: A PartitionSender unused this long is dropped (the next call makes a fresh one, with a new
#: producer id): otherwise one, with its producer id, stayed for every partition ever written.
SENDER_IDLE_S = 600.0
#: Longest time between two looks for idle senders (made on a ProduceRecords call).
SENDER_PRUNE_EVERY_S = 60.0

ROUTED_PARTITIONS = Counter(
    "strom_storage_records_routed_partitions",
    "Partition batches of ProduceRecords calls by where the node sent them, retries "
    "included: appended here (local: this node leads the partition) or forwarded to the "
    "leader (a caller that routes by leader, docs/grpc-clients.md, keeps this near zero)",
    ["route"],
)
for _route in ("local", "forwarded"):  # exported from the start (0), so dashboards have a line
    ROUTED_PARTITIONS.labels(_route)


class TransportError(StromError):
    """The Produce did not get an answer (the leader is unreachable or died mid-request)."""


@dataclass(eq=False)
class _Part:
    """One partition's data waiting for its leader's next request."""

    topic: str
    partition: int
    data: bytes
    #: The leader (node id) and its epoch in this node's view when the part was routed: a
    #: forwarded request is given up once the view names another (:class:`_LeaderWatch`).
    leader: int
    leader_epoch: int
    timeout_s: float
    client_id: str
    future: asyncio.Future[storage_pb2.ProducePartitionResponse] = field(repr=False)


class LeaderRoute:
    """Sends partitions' batches to their leaders: in-process when this node leads them (per
    its etcd view), else over an asyncio channel to the leader's advertised address.

    The partitions of one ProduceRecords call usually span leaders, and each partition's
    sender awaits its own produce in the same event-loop pass. What reaches one leader (or
    this node) in one pass goes out as one multi-partition Produce, as the Python client sends
    one request per node: a gRPC call costs the sending and the receiving node more than its
    bytes, so this halves the calls between nodes of a 3-node cluster. Each partition still
    has at most one request in flight (its sender's rule), and its result is its own.

    A Produce carries the client id of the ProduceRecords callers it was made for (gRPC
    metadata to a leader elsewhere, :data:`~strom.storage.metrics.CALLER_CLIENT_ID` here), so
    the leader counts their bytes under their id; what different client ids send in one
    pass goes in requests of their own."""

    def __init__(
        self,
        node_id: int,
        view: ClusterView,
        local_produce: Callable[[storage_pb2.ProduceRequest], Awaitable[Any]],
    ) -> None:
        self.node_id = node_id
        self.view = view
        self._local = local_produce
        self._channels = ChannelCache(GRPC_OPTIONS)
        #: (leader address, or None for this node; acks; client id) -> the parts gathered
        #: this pass.
        self._gathering: dict[tuple[Any, ...], list[_Part]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def _leader(self, topic: str, partition: int) -> tuple[int, int, str | None]:
        state = self.view.partition(topic, partition)
        if state is None:
            return -1, -1, None
        s = state.value
        node = self.view.live_nodes().get(s.leader)
        return s.leader, s.leader_epoch, (f"{node.host}:{node.port}" if node else None)

    async def produce(
        self,
        topic: str,
        partition: int,
        data: bytes,
        acks: int,
        timeout_s: float,
        client_id: str = "",
    ) -> storage_pb2.ProducePartitionResponse:
        """One Produce of ``data`` (concatenated batches) for the callers of ``client_id``; the
        partition's result. Raises TransportError when no answer came."""
        leader, epoch, addr = self._leader(topic, partition)
        if leader != self.node_id and addr is None:
            return storage_pb2.ProducePartitionResponse(
                partition=partition,
                error_code=E.LEADER_NOT_AVAILABLE,  # type: ignore[arg-type]
                error_message=f"{topic}-{partition} has no live leader",
                base_offset=-1,
            )
        loop = asyncio.get_running_loop()
        key: tuple[Any, ...] = (None if leader == self.node_id else addr, acks, client_id)
        parts = self._gathering.get(key)
        if parts is not None and any(
            p.topic == topic and p.partition == partition for p in parts
        ):  # a second request for the partition in this pass: a request of its own
            parts = None
            key = (*key, id(data))
        if parts is None:
            parts = self._gathering[key] = []
            loop.call_soon(self._flush, key)
        part = _Part(
            topic, partition, data, leader, epoch, timeout_s, client_id, loop.create_future()
        )
        parts.append(part)
        return await part.future

    def _flush(self, key: tuple[Any, ...]) -> None:
        parts = self._gathering.pop(key)
        task = asyncio.get_running_loop().create_task(self._send(key[0], key[1], parts))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, addr: str | None, acks: int, parts: list[_Part]) -> None:
        parts = [p for p in parts if not p.future.done()]  # a cancelled caller sends nothing
        if not parts:
            return
        ROUTED_PARTITIONS.labels("local" if addr is None else "forwarded").inc(len(parts))
        timeout_s = max(p.timeout_s for p in parts)
        req = storage_pb2.ProduceRequest(acks=acks, timeout_ms=max(int(timeout_s * 1000), 1))
        topics: dict[str, Any] = {}
        for p in parts:
            t = topics.get(p.topic)
            if t is None:
                t = topics[p.topic] = req.topics.add(topic=p.topic)
            pd = t.partitions.add(partition=p.partition, records=p.data)
            pd.current_leader_epoch = p.leader_epoch
        try:
            resp = await self._request(addr, req, timeout_s, parts)
        except asyncio.CancelledError:  # the node is closing
            for p in parts:
                p.future.cancel()
            raise
        except Exception as exc:
            for p in parts:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        results = {
            (t.topic, r.partition): r for t in (resp.topics if acks else ()) for r in t.partitions
        }
        for p in parts:
            if p.future.done():
                continue
            r = results.get((p.topic, p.partition))
            if r is not None:
                p.future.set_result(r)
            elif acks == 0:  # the leader answers nothing
                p.future.set_result(
                    storage_pb2.ProducePartitionResponse(partition=p.partition, base_offset=-1)
                )
            else:  # not answered: as if the answer was lost (a retry is safe, sequenced)
                where = addr or "this node"
                p.future.set_exception(
                    TransportError(f"{where}: no result for {p.topic}-{p.partition}")
                )

    async def _request(
        self,
        addr: str | None,
        req: storage_pb2.ProduceRequest,
        timeout_s: float,
        parts: list[_Part],
    ) -> Any:
        """The answer to ``req`` from this node (``addr`` None) or the leader at ``addr``.

        A forwarded request is watched (:class:`_LeaderWatch`) and given up with a
        TransportError once a part's leader moved. A local one needs no watch: this node
        is not hung if it runs this, and a lost leadership ends the acks=all wait at once
        (``Partition.update`` fails the high-watermark waiters, and the Produce answers
        NOT_LEADER_OR_FOLLOWER, which the senders retry at the new leader)."""
        client_id = parts[0].client_id
        if addr is None:
            # Gathered from several callers, each charged its quota where it called
            # (RecordService): not charged again here.
            token = CHARGED_BY_CALLER.set(True)
            cid = CALLER_CLIENT_ID.set(client_id)
            try:
                return await self._local(req)
            except ProduceShed as exc:
                raise TransportError(f"this node: RESOURCE_EXHAUSTED {exc}") from None
            finally:
                CALLER_CLIENT_ID.reset(cid)
                CHARGED_BY_CALLER.reset(token)
        ch = self._channels.get(addr)
        md = (("strom-client-id", client_id),) if client_id else None
        call = storage_pb2_grpc.StorageServiceStub(ch).Produce(
            req, timeout=timeout_s + 1.0, metadata=md
        )
        watch = _LeaderWatch(self.view, parts, call)
        try:
            return await call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if watch.moved is None or (task is not None and task.cancelling()):
                raise  # the node is closing (or the caller went away): not ours to settle
            raise TransportError(watch.why(addr)) from None
        except grpc.aio.AioRpcError as exc:
            if watch.moved is not None:
                raise TransportError(watch.why(addr)) from None
            if exc.code() in _TRANSPORT:
                raise TransportError(f"leader {addr}: {exc.code().name}") from None
            raise StromError(f"produce to {addr}: {exc.code().name} {exc.details()}") from None
        finally:
            watch.stop()

    async def close(self) -> None:
        await self._channels.close()


class _LeaderWatch:
    """Gives up a forwarded Produce once a partition of it has another leader in this node's
    view (a ProduceRecords call forwarded to a hung leader, SIGSTOP
    or a GC pause, waited until the leader resumed or the call's timeout_ms, 30 s, although
    the controller moved the partition within ~2 s).

    The rule is the Python producer's (``strom.client.sender``, ``SenderLoop._overdue``;
    design §8), with its constants: unanswered :data:`OVERDUE_GRACE_S` after it was sent, the
    request's partitions are looked up in the view, then every :data:`OVERDUE_RECHECK_S`
    while it stays unanswered. The view is local (kept current by the etcd watch), so a look
    is a few dict lookups; the normal path costs one timer handle per request (cancelled
    with the answer), no task and nothing per record. A partition has moved when the view
    names another live leader, or the same one under a higher leader epoch (an epoch unknown
    when sent, -1, proves nothing); one without a live leader has not moved yet (the
    controller has not elected one; waiting on is all there is to do).

    Once one moved, the call is cancelled and every part of the request fails with a
    TransportError, those whose leader did not move too: that is "no answer, may have been
    written", which both senders already retry (with the part's sequence numbers, so a
    batch the old or new leader holds is answered with its original offsets, never written
    twice; design §6), and the parts that did not move simply go back to their leader in a
    request of their own. Keeping them would need the one gRPC call split in two, for
    requests that a hung node answers no sooner anyway. The old leader cannot commit what it
    holds any more, so nothing the wait could have brought is lost."""

    __slots__ = ("_call", "_handle", "_parts", "_view", "moved")

    def __init__(self, view: ClusterView, parts: list[_Part], call: Any) -> None:
        self._view = view
        self._parts = parts
        self._call = call
        #: The partitions found moved ("topic-partition"), once they are: the call is given up.
        self.moved: list[str] | None = None
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            OVERDUE_GRACE_S, self._check
        )

    def _check(self) -> None:
        self._handle = None
        live = self._view.live_nodes()
        moved = [f"{p.topic}-{p.partition}" for p in self._parts if self._has_moved(p, live)]
        if moved:
            self.moved = moved
            log.info(
                "no Produce answer for %s, whose leader moved: retrying at the new leader",
                ", ".join(moved),
            )
            self._call.cancel()
            return
        self._handle = asyncio.get_running_loop().call_later(OVERDUE_RECHECK_S, self._check)

    def _has_moved(self, part: _Part, live: dict[int, Any]) -> bool:
        state = self._view.partition(part.topic, part.partition)
        if state is None:
            return False
        s = state.value
        if s.leader == part.leader:
            return 0 <= part.leader_epoch < s.leader_epoch
        return s.leader >= 0 and s.leader in live

    def why(self, addr: str) -> str:
        """The TransportError's message for the given-up call to ``addr``."""
        return (
            f"leader {addr}: no answer, and the leader of {', '.join(self.moved or ())} "
            "moved: retried at the new leader"
        )

    def stop(self) -> None:
        """The call ended: no more looks."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


#: ``ids(producer_id, epoch)``: a new producer id (-1, -1) or the next epoch of one.
InitIds = Callable[[int, int], Awaitable[tuple[int, int]]]


@dataclass(eq=False)
class _Call:
    table: pa.Table
    codec: str
    acks: int
    deadline: float
    client_id: str
    future: asyncio.Future[int] = field(repr=False)


class PartitionSender:
    """The node's idempotent producer for one partition (see the module docstring)."""

    def __init__(self, topic: str, partition: int, route: LeaderRoute, ids: InitIds) -> None:
        self.topic = topic
        self.partition = partition
        self._route = route
        self._ids = ids
        self.producer_id = -1
        self.epoch = -1
        self.next_sequence = 0
        #: Set after giving up on an ambiguous request: its sequence numbers may be taken in
        #: the log, so the next request starts a fresh sequence space (a new epoch).
        self._bump = False
        self._pending: deque[_Call] = deque()
        self._task: asyncio.Task[None] | None = None
        #: Event-loop time of the last call submitted or settled (see :attr:`idle_since`).
        self._last_used = 0.0

    def submit(
        self, table: pa.Table, codec: str, acks: int, deadline: float, client_id: str = ""
    ) -> asyncio.Future[int]:
        """Queue a call's records (one batch) for the caller of ``client_id``; the future is
        their base offset (-1 when it is not known: acks=0, or a duplicate older than the
        leader remembers that it did not find in its log by the batch header)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self._last_used = loop.time()
        self._pending.append(_Call(table, codec, acks, deadline, client_id, fut))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return fut

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight: dropping the sender loses no call."""
        return not self._pending and (self._task is None or self._task.done())

    def idle_since(self) -> float | None:
        """Event-loop time since which the sender is :attr:`idle` (None: it is not)."""
        return self._last_used if self.idle else None

    async def _drain(self) -> None:
        try:
            await self._drain_pending()
        finally:
            self._last_used = asyncio.get_running_loop().time()

    async def _drain_pending(self) -> None:
        while self._pending:
            group = self._next_group()
            if not group:
                continue
            try:
                await self._send(group)
            except Exception as exc:  # never leave a caller hanging
                if not isinstance(exc, StromError):
                    log.exception("sending to %s-%d failed", self.topic, self.partition)
                for c in group:
                    if not c.future.done():
                        c.future.set_exception(exc)

    def _next_group(self) -> list[_Call]:
        """The first waiting call and the ones right behind it that can share its request:
        the same acks and client id (the leader counts a request's bytes under one client
        id), up to MAX_REQUEST_BYTES."""
        first = self._pending.popleft()
        while first.future.done() and self._pending:  # cancelled while queued: never sent
            first = self._pending.popleft()
        if first.future.done():
            return []
        group = [first]
        size = first.table.nbytes
        while (
            self._pending
            and not self._pending[0].future.done()
            and self._pending[0].acks == first.acks
            and self._pending[0].client_id == first.client_id
            and size + self._pending[0].table.nbytes <= MAX_REQUEST_BYTES
        ):
            size += self._pending[0].table.nbytes
            group.append(self._pending.popleft())
        return group

    def _encode(self, group: list[_Call], idempotent: bool) -> bytes:
        seq = self.next_sequence
        parts = []
        for c in group:
            parts.append(
                encode_arrow(
                    c.table,
                    compression=c.codec,
                    producer_id=self.producer_id if idempotent else -1,
                    producer_epoch=self.epoch if idempotent else -1,
                    base_sequence=seq if idempotent else -1,
                )
            )
            seq = (seq + c.table.num_rows) % SEQUENCE_LIMIT
        return b"".join(parts)

    async def _send(self, group: list[_Call]) -> None:
        """Send ``group`` as one request until it is answered or every call's deadline
        passed; settles each call's future."""
        loop = asyncio.get_running_loop()
        idempotent = group[0].acks != 0
        deadline = max(c.deadline for c in group)
        ambiguous = False
        last: StromError | None = None
        restarts = 0
        while True:  # (re)encode: a new epoch or sequence restart makes new bytes
            if restarts > 1:  # the leader refused our sequences again: do not spin
                await _backoff(deadline)
            if idempotent and (self.producer_id < 0 or self._bump):
                self.producer_id, self.epoch = await self._ids(self.producer_id, self.epoch)
                self.next_sequence = 0
                self._bump = False
                ambiguous = False  # the new epoch fences whatever the old one left in flight
            if sum(c.table.nbytes for c in group) >= OFFLOAD_BYTES:
                # Safe off the loop: only this sender's one _drain task touches its state.
                data = await asyncio.to_thread(self._encode, group, idempotent)
            else:
                data = self._encode(group, idempotent)
            reencode = False
            while not reencode:
                now = loop.time()
                for c in group:  # calls out of time answer now; the request goes on
                    if c.deadline <= now and not c.future.done():
                        c.future.set_exception(_timed_out(self, ambiguous, last))
                if not ambiguous and any(c.future.done() for c in group):
                    # Nothing of this request can have been appended yet: the calls answered
                    # meanwhile (out of time, or cancelled: their caller's deadline passed or
                    # it went away) are not sent at all. They were
                    # written when the leader came back, after the caller had been told
                    # DEADLINE_EXCEEDED, so its retry wrote them twice.
                    group = [c for c in group if not c.future.done()]
                    if not group:
                        return
                    deadline = max(c.deadline for c in group)
                    reencode = True
                    continue
                if now >= deadline:
                    if ambiguous and idempotent:
                        self._bump = True
                    return
                try:
                    r = await self._route.produce(
                        self.topic,
                        self.partition,
                        data,
                        group[0].acks,
                        deadline - now,
                        group[0].client_id,
                    )
                except TransportError as exc:
                    ambiguous, last = True, exc
                    await _backoff(deadline)
                    continue
                code = r.error_code
                if code in (E.NONE, E.DUPLICATE_SEQUENCE):
                    self._succeeded(group, -1 if code else r.base_offset)
                    return
                last = error_for(code, r.error_message or f"{self.topic}-{self.partition}")
                if code in AMBIGUOUS:
                    ambiguous = True
                elif idempotent and code in _SEQUENCE:
                    # The leader does not know our producer state (it expired, or a leader
                    # without it took over); nothing of this attempt was appended.
                    if ambiguous:  # but an earlier one may have been: never send it again
                        self._bump = True
                        _fail(group, _maybe_written(self, code, last))
                        return
                    if code == E.UNKNOWN_PRODUCER_ID and self.next_sequence != 0:
                        self.next_sequence = 0  # an unknown producer starts at 0
                    else:
                        self._bump = True
                    restarts += 1
                    reencode = True
                    continue
                elif not is_retriable(code):
                    if len(group) > 1:  # find the call at fault: one by one, in order
                        for c in group:
                            await self._send([c])
                        return
                    group[0].future.set_exception(last)
                    return
                await _backoff(deadline)

    def _succeeded(self, group: list[_Call], base: int) -> None:
        offset = base
        for c in group:
            n = c.table.num_rows
            if not c.future.done():
                c.future.set_result(offset)
            if offset >= 0:
                offset += n
            if c.acks != 0:
                self.next_sequence = (self.next_sequence + n) % SEQUENCE_LIMIT


def _fail(group: list[_Call], exc: StromError) -> None:
    """Settle every call of ``group`` not settled yet with ``exc``."""
    for c in group:
        if not c.future.done():
            c.future.set_exception(exc)


def _maybe_written(sender: PartitionSender, code: int, last: StromError) -> StromError:
    """The error of a request refused for its sequences (``code``: UNKNOWN_PRODUCER_ID,
    OUT_OF_ORDER_SEQUENCE, INVALID_PRODUCER_EPOCH) after an earlier attempt of it got an
    answer, or none, that leaves it possibly appended. The leader
    expired the producer while the first attempt waited for replicas
    (NOT_ENOUGH_REPLICAS_AFTER_APPEND), the sender restarted at sequence 0 under the same
    epoch and the records were written twice. Sent again under any new sequence, a written
    request is written again; so, as Kafka's producer and strom's (``strom.client.sender``)
    do, the calls fail saying so, and the sender's next request takes a new epoch
    (``_bump``). OUT_OF_ORDER_SEQUENCE keeps its code (a refusal of the batch); the others
    answer REQUEST_TIMED_OUT, as a call whose outcome no answer settled."""
    where = f"{sender.topic}-{sender.partition}"
    msg = (
        f"{where}: an earlier attempt may have been written, and the leader then refused the "
        f"retry ({last}): not sent again under new sequence numbers, so as not to write the "
        "records twice; the records may or may not have been written"
    )
    if code == E.OUT_OF_ORDER_SEQUENCE:
        return error_for(code, msg)
    return RequestTimedOutError(msg)


def _timed_out(sender: PartitionSender, ambiguous: bool, last: StromError | None) -> StromError:
    detail = f" (last: {last})" if last is not None else ""
    if ambiguous:
        return RequestTimedOutError(
            f"{sender.topic}-{sender.partition}: not acknowledged within the call's timeout; "
            f"the records may or may not have been written{detail}"
        )
    if last is not None and is_retriable(last.code or 0):
        return error_for(last.code or E.REQUEST_TIMED_OUT, f"{last.message} (nothing written)")
    return RequestTimedOutError(
        f"{sender.topic}-{sender.partition}: no answer within the call's timeout{detail}"
    )


async def _backoff(deadline: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(min(BACKOFF_S, deadline - loop.time()), 0))


class NodeProducer:
    """The node's PartitionSenders, made on first use (one producer id per partition).

    A sender, with its producer id, stayed for every partition
    ever written through ProduceRecords. The senders of a deleted topic are dropped
    (:meth:`forget_topics`), and so is one idle for ``idle_s`` (looked for on a call, at most
    every :data:`SENDER_PRUNE_EVERY_S`). Only an idle sender is dropped for idleness, so no
    call's sequence is lost; the next call for its partition makes a fresh sender, whose new
    producer id starts at sequence 0 (the leader takes it as a new producer)."""

    def __init__(self, route: LeaderRoute, ids: InitIds, *, idle_s: float = SENDER_IDLE_S) -> None:
        self._route = route
        self._ids = ids
        self.idle_s = idle_s
        self._senders: dict[tuple[str, int], PartitionSender] = {}
        #: Drains of senders dropped while busy (a deleted topic's): close() waits for them.
        self._retiring: set[asyncio.Task[None]] = set()
        self._next_prune = 0.0

    def send(
        self,
        topic: str,
        partition: int,
        table: pa.Table,
        acks: int,
        codec: str,
        deadline: float,
        client_id: str = "",
    ) -> asyncio.Future[int]:
        now = asyncio.get_running_loop().time()
        if now >= self._next_prune:
            self._next_prune = now + min(SENDER_PRUNE_EVERY_S, self.idle_s)
            self.prune_idle(now)
        s = self._senders.get((topic, partition))
        if s is None:
            s = self._senders[(topic, partition)] = PartitionSender(
                topic, partition, self._route, self._ids
            )
        return s.submit(table, codec, acks, deadline, client_id)

    def topics(self) -> set[str]:
        """Topics that have a sender."""
        return {t for t, _ in self._senders}

    def prune_idle(self, now: float) -> int:
        """Drop the senders idle since ``idle_s`` before ``now`` (event-loop time); how many."""
        stale = [
            tp
            for tp, s in self._senders.items()
            if (since := s.idle_since()) is not None and now - since >= self.idle_s
        ]
        for tp in stale:
            del self._senders[tp]
        return len(stale)

    def forget_topics(self, topics: set[str]) -> None:
        """Drop the senders of deleted ``topics`` (event loop). A busy one's queued calls go
        on (they fail as the topic is gone, or reach a topic of the same name created
        since, with a producer id new to it) and close() still waits for them."""
        for tp in [tp for tp in self._senders if tp[0] in topics]:
            task = self._senders.pop(tp)._task
            if task is not None and not task.done():
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)

    async def close(self, timeout_s: float) -> None:
        """Let queued calls finish (bounded by ``timeout_s`` and their own deadlines)."""
        tasks = [s._task for s in self._senders.values() if s._task is not None]
        tasks.extend(self._retiring)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)


class SequencedSender:
    """Sends one caller-sequenced batch to its partition's leader, retrying until a deadline
    (safe: a batch already appended is answered with its original offsets)."""

    def __init__(self, route: LeaderRoute) -> None:
        self._route = route

    async def send(
        self,
        topic: str,
        partition: int,
        table: pa.Table,
        *,
        acks: int,
        compression: str,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        deadline: float,
        client_id: str = "",
    ) -> int:
        """Append as one batch; its base offset. Raises StromError, DuplicateSequenceError
        when the leader takes the batch for a retry of one written before its last five
        batches of the producer (that was answered as a success
        with offsets -1, so a caller that reused sequences by mistake, whose records were
        never written, was told nothing; now the result names it, docs/grpc-clients.md)."""
        encode = functools.partial(
            encode_arrow,
            table,
            compression=compression,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
        )
        data = await asyncio.to_thread(encode) if table.nbytes >= OFFLOAD_BYTES else encode()
        loop = asyncio.get_running_loop()
        last: StromError | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise last or RequestTimedOutError(f"{topic}-{partition}: no answer in time")
            try:
                r = await self._route.produce(topic, partition, data, acks, remaining, client_id)
            except TransportError as exc:
                last = exc
            else:
                if r.error_code == E.NONE:
                    return int(r.base_offset)
                if r.error_code == E.DUPLICATE_SEQUENCE:
                    raise error_for(
                        E.DUPLICATE_SEQUENCE,
                        f"{topic}-{partition}: sequences {base_sequence}.. of producer "
                        f"{producer_id} epoch {producer_epoch} come before the leader's last "
                        "five batches of that producer: taken as a retry of a call written "
                        "then, not written again (offsets unknown). If this call was not a "
                        "retry, its base_sequence is wrong and its records were NOT written",
                    )
                last = error_for(r.error_code, r.error_message)
                if not is_retriable(r.error_code):
                    raise last
            await _backoff(deadline)
