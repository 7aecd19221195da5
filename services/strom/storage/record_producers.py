"""How a storage node writes the records of a ProduceRecords call to their partitions' leaders.

Two paths, chosen by whether the caller brings its own idempotent producer identity:

* **The node's producers** (:class:`ProducerPool`): strom's Python :class:`Producer`, one per
  (acks, compression) the callers use, with the node's own producer id. It sends each
  partition's records to the partition's leader (this node or another), pipelines, and
  retries leader changes and unreachable leaders until the call's deadline *with the same
  sequence numbers*, so a retry the node makes never duplicates a record (DESIGN §6). This is
  why a call may be sent to any node: forwarding to the leader is the documented choice
  (rather than answering NOT_LEADER_OR_FOLLOWER), because keyed records of one call usually
  span partitions led by different nodes, and a client in another language should not have
  to route by key itself.
* **The caller's sequence** (:class:`SequencedSender`): the records become one batch carrying
  the caller's producer id, epoch and base sequence, sent with a plain Produce to the
  partition's leader (in-process when that is this node). Retries are safe for the same
  reason; a retry by the *caller* of a call that was written is answered with the original
  offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
import pyarrow as pa

from strom.api import storage_pb2, storage_pb2_grpc
from strom.client.producer import BatchMetadata, Producer
from strom.errors import ErrorCode, RequestTimedOutError, StromError, error_for, is_retriable
from strom.metadata import ClusterView
from strom.record import encode_arrow

log = logging.getLogger("strom.storage.record_producers")
E = ErrorCode

#: The transport failures after which a sequenced batch is simply sent again.
_TRANSPORT_RETRY = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class ProducerPool:
    """The node's own idempotent producers, one per (acks, compression), made on first use."""

    def __init__(self, bootstrap: Callable[[], list[str]], client_id: str) -> None:
        self._bootstrap = bootstrap
        self._client_id = client_id
        self._producers: dict[tuple[int, str], Producer] = {}
        self._closed = False

    def _producer(self, acks: int, compression: str) -> Producer:
        key = (acks, compression)
        p = self._producers.get(key)
        if p is not None and (p._fatal is not None or p._closing):
            # Fenced or failed for good (e.g. INVALID_PRODUCER_EPOCH): start a fresh identity.
            self._producers.pop(key, None)
            with contextlib.suppress(Exception):
                p.close(0)
            p = None
        if p is None:
            if self._closed:
                raise StromError("the node is shutting down", retriable=True)
            p = self._producers[key] = Producer(
                self._bootstrap(),
                acks=acks,
                compression=compression,
                linger_ms=0,
                client_id=f"{self._client_id}-acks{acks}-{compression}",
                delivery_timeout_ms=120_000,
                max_block_ms=10_000,
                max_request_size=8 * 1024 * 1024,
            )
        return p

    async def send(
        self, topic: str, partition: int, table: pa.Table, acks: int, compression: str
    ) -> list[BatchMetadata]:
        """Append ``table``'s records to one partition; the batches' metadata in order.
        Raises the StromError that failed them."""
        p = self._producer(acks, compression)
        if topic in p._counts and p._buffered < p.buffer_memory // 2:
            fut = p.send_batch(topic, table, partition=partition)  # cannot block here
        else:  # may wait for metadata or buffer room: not on the event loop
            fut = await asyncio.to_thread(p.send_batch, topic, table, partition=partition)
        return await asyncio.wrap_future(fut)

    async def close(self, timeout_s: float) -> None:
        """Flush what is queued (bounded), then stop every producer."""
        self._closed = True
        producers, self._producers = list(self._producers.values()), {}
        await asyncio.gather(
            *(asyncio.to_thread(p.close, timeout_s) for p in producers), return_exceptions=True
        )


class SequencedSender:
    """Sends one caller-sequenced batch to its partition's leader, retrying until a deadline."""

    def __init__(
        self,
        node_id: int,
        view: ClusterView,
        local_produce: Callable[[storage_pb2.ProduceRequest], Any],
        backoff_s: float = 0.05,
    ) -> None:
        self.node_id = node_id
        self.view = view
        self._local = local_produce
        self._backoff_s = backoff_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> storage_pb2_grpc.StorageServiceStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address)
        return storage_pb2_grpc.StorageServiceStub(ch)

    def _leader(self, topic: str, partition: int) -> tuple[int, int, str | None]:
        state = self.view.partition(topic, partition)
        if state is None:
            return -1, -1, None
        s = state.value
        node = self.view.live_nodes().get(s.leader)
        addr = f"{node.host}:{node.port}" if node is not None else None
        return s.leader, s.leader_epoch, addr

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
    ) -> int:
        """Append as one batch; returns its base offset (-1 when unknown: acks=0, or a
        duplicate older than the leader remembers). Raises StromError."""
        data = encode_arrow(
            table,
            compression=compression,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
        )
        loop = asyncio.get_running_loop()
        last: StromError | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise last or RequestTimedOutError(f"{topic}-{partition}: no answer in time")
            leader, epoch, addr = self._leader(topic, partition)
            req = storage_pb2.ProduceRequest(acks=acks, timeout_ms=int(remaining * 1000))
            pd = req.topics.add(topic=topic).partitions.add(partition=partition, records=data)
            pd.current_leader_epoch = epoch
            try:
                if leader == self.node_id:
                    resp = await self._local(req)
                elif addr is not None:
                    resp = await self._stub(addr).Produce(req, timeout=remaining + 1.0)
                else:
                    resp = None
                    last = error_for(
                        E.LEADER_NOT_AVAILABLE, f"{topic}-{partition} has no live leader"
                    )
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _TRANSPORT_RETRY:
                    raise StromError(
                        f"produce to {addr}: {exc.code().name} {exc.details()}"
                    ) from None
                resp = None
                last = error_for(E.BROKER_NOT_AVAILABLE, f"leader {addr} unreachable")
            if resp is not None:
                if acks == 0:
                    return -1
                r = resp.topics[0].partitions[0]
                if r.error_code == E.NONE:
                    return r.base_offset
                if r.error_code == E.DUPLICATE_SEQUENCE:
                    return -1
                last = error_for(r.error_code, r.error_message)
                if not is_retriable(r.error_code):
                    raise last
            await asyncio.sleep(min(self._backoff_s, max(deadline - loop.time(), 0)))

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            with contextlib.suppress(Exception):
                await ch.close()


def monotonic_deadline(timeout_ms: int, default_ms: int = 30_000) -> float:
    """The loop-clock deadline of a call with ``timeout_ms`` (0 = ``default_ms``)."""
    return asyncio.get_running_loop().time() + (timeout_ms or default_ms) / 1000.0
