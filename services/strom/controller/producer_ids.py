"""Producer-id blocks: AllocateProducerIds hands a storage node the next block of the
cluster-wide producer id counter (DESIGN §6).

The counter lives in one etcd key; a block is taken by advancing it with CAS, so two
controllers (or two requests) never hand out the same ids. Only a node in its registered
incarnation gets a block.
"""

from __future__ import annotations

import asyncio
import logging

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.clock import wall_ms
from strom.controller.cas import commit_with_retry
from strom.controller.core import ControllerCore, Leadership, rpc
from strom.errors import ErrorCode

log = logging.getLogger("strom.controller")
E = ErrorCode


class ProducerIdRpcs(ControllerCore):
    """AllocateProducerIds."""

    @rpc(write=True, first_producer_id=-1, count=0)
    async def AllocateProducerIds(
        self,
        lead: Leadership,
        request: pb.AllocateProducerIdsRequest,
        response: pb.AllocateProducerIdsResponse,
    ) -> None:
        nodes = await self._nodes()
        stale = self._stale_incarnation(nodes, request.node_id, request.incarnation_id)
        if stale is not None:
            response.error_code = E.STALE_NODE_INCARNATION
            response.error_message = stale
            return
        first = await asyncio.to_thread(self._allocate_producer_ids, lead, request.node_id)
        response.first_producer_id = first
        response.count = self.producer_id_block_size

    def _allocate_producer_ids(self, lead: Leadership, node_id: int) -> int:
        """Advance the cluster-wide counter by one block with CAS (blocking); its first id."""
        assert self.store is not None
        store, key, size = self.store, self.store.keys.producer_ids, self.producer_id_block_size

        def decide() -> tuple[int, int, md.ProducerIdBlock]:
            current = store.get(key, md.ProducerIdBlock)
            first = int(current.value.next_producer_id) if current else 0
            block = md.ProducerIdBlock(
                next_producer_id=first + size,
                block_size=size,
                last_assigned_to=node_id,
                updated_ms=wall_ms(),
            )
            return (current.mod_revision if current else 0), first, block

        def commit(decision: tuple[int, int, md.ProducerIdBlock]) -> bool:
            revision, _, block = decision
            return self._txn(lead, [(key, revision)], puts=[(key, block)])

        _, first, _ = commit_with_retry(
            decide, commit, attempts=20, gave_up="the producer id counter kept changing; retry"
        )
        log.info("producer ids %d..%d to node %d", first, first + size - 1, node_id)
        return first
