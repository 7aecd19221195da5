"""Producer ids for InitProducerId (DESIGN §6 "Idempotent producers").

Every storage node answers InitProducerId. New ids come from a block the node reserves from
the active controller (AllocateProducerIds: the controller advances the cluster-wide counter
in etcd with a CAS), so ids are unique across the cluster without asking etcd per producer.
When a block runs out the next request fetches a new one; concurrent requests share one
fetch (an asyncio lock) and never get the same id. An unused remainder of a block is simply
lost when the node stops: ids are plentiful (int64) and never reused.

Epoch bumps need no coordination: the producer names its id and current epoch and gets the
same id with epoch + 1, or a fresh id at epoch 0 when the 16-bit epoch would overflow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from strom.api import controller_pb2
from strom.errors import ErrorCode
from strom.log.producer_state import MAX_PRODUCER_EPOCH

log = logging.getLogger("strom.storage.producer_ids")

E = ErrorCode


class ProducerIdUnavailableError(Exception):
    """No block could be reserved; ``code`` is what InitProducerId answers with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: Reserves one block: returns (first id, count) or raises ProducerIdUnavailableError.
BlockFetcher = Callable[[], Awaitable[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    epoch: int
    new_id: bool


class ProducerIdAllocator:
    """Hands out ids from reserved blocks (see the module docstring)."""

    def __init__(self, fetch_block: BlockFetcher) -> None:
        self._fetch_block = fetch_block
        self._next = 0
        self._end = 0  # exclusive; next == end: no ids left
        self._lock = asyncio.Lock()
        self.blocks_fetched = 0

    @property
    def remaining(self) -> int:
        return self._end - self._next

    async def allocate(self) -> int:
        """One id never handed out before (by any node)."""
        if self._next < self._end:  # the common case: no await, so no interleaving
            pid = self._next
            self._next += 1
            return pid
        async with self._lock:
            if self._next >= self._end:  # another request may have refilled meanwhile
                first, count = await self._fetch_block()
                if first < 0 or count <= 0:
                    raise ProducerIdUnavailableError(
                        E.UNKNOWN_SERVER_ERROR,
                        f"the controller reserved an empty producer id block ({first}, {count})",
                    )
                self._next, self._end = first, first + count
                self.blocks_fetched += 1
                log.info("reserved producer ids %d..%d", first, first + count - 1)
            pid = self._next
            self._next += 1
            return pid

    async def init(self, producer_id: int, producer_epoch: int) -> ProducerIdAndEpoch:
        """InitProducerId without a transactional id: a new id (producer_id -1) or the next
        epoch of ``producer_id``. ValueError for ids/epochs that cannot be bumped."""
        if producer_id == -1:
            return ProducerIdAndEpoch(await self.allocate(), 0, True)
        if producer_id < 0:
            raise ValueError(f"producer_id must be -1 (a new id) or >= 0, not {producer_id}")
        if not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
            raise ValueError(
                f"producer_epoch must be the producer's current epoch in "
                f"[0, {MAX_PRODUCER_EPOCH}] when producer_id is given, not {producer_epoch}"
            )
        if producer_epoch < MAX_PRODUCER_EPOCH:
            return ProducerIdAndEpoch(producer_id, producer_epoch + 1, False)
        return ProducerIdAndEpoch(await self.allocate(), 0, True)


def controller_block_fetcher(
    call: Callable[..., Awaitable[controller_pb2.AllocateProducerIdsResponse | None]],
    node_id: int,
    incarnation: Callable[[], str],
    timeout: float = 5.0,
) -> BlockFetcher:
    """A :data:`BlockFetcher` over ``ControllerClient.call`` (which finds the active
    controller the way AlterPartition does and follows NOT_CONTROLLER)."""

    async def fetch() -> tuple[int, int]:
        req = controller_pb2.AllocateProducerIdsRequest(
            node_id=node_id, incarnation_id=incarnation()
        )
        try:
            resp = await call("AllocateProducerIds", req, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise ProducerIdUnavailableError(
                E.UNKNOWN_SERVER_ERROR,
                f"the controller cannot allocate producer ids: {exc.code().name}",
            ) from None
        if resp is None:
            raise ProducerIdUnavailableError(
                E.REQUEST_TIMED_OUT,
                "no active controller answered AllocateProducerIds; retry",
            )
        if resp.error_code == E.NONE:
            return resp.first_producer_id, resp.count
        if resp.error_code == E.STALE_NODE_INCARNATION:
            # This process is not the registered node right now (re-registering): another
            # node can answer.
            raise ProducerIdUnavailableError(
                E.BROKER_NOT_AVAILABLE,
                f"node {node_id} is not registered right now: {resp.error_message}",
            )
        raise ProducerIdUnavailableError(
            E.REQUEST_TIMED_OUT,
            f"the controller did not reserve producer ids: {resp.error_message or 'no reason'}",
        )

    return fetch
