"""Leader elections on request: ElectLeaders (preferred or unclean) and ControlledShutdown
(DESIGN §6).

Both decide with the pure functions of :mod:`strom.controller.leadership` and commit through
:meth:`PartitionStates._decide_and_commit`, like reconciliation; a controlled shutdown marks
the node as stopping and runs a reconciliation pass, which moves its leaderships away.
"""

from __future__ import annotations

import asyncio

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.controller import leadership
from strom.controller.core import Leadership, rpc
from strom.controller.partition_states import PartitionDecision
from strom.controller.reconcile import Reconciler
from strom.errors import ErrorCode, error_name

E = ErrorCode


class ElectionRpcs(Reconciler):
    """ElectLeaders and ControlledShutdown."""

    @rpc(write=True)
    async def ElectLeaders(
        self, lead: Leadership, request: pb.ElectLeadersRequest, response: pb.ElectLeadersResponse
    ) -> None:
        unclean = request.election_type == pb.ELECTION_TYPE_UNCLEAN
        committed = await asyncio.to_thread(self._elect_sync, lead, request, unclean, response)
        await self._await_partition_epochs(committed)

    def _elect_sync(
        self,
        lead: Leadership,
        request: pb.ElectLeadersRequest,
        unclean: bool,
        response: pb.ElectLeadersResponse,
    ) -> dict[tuple[str, int], int]:
        """Elect the requested partitions' leaders (all, if none named) (blocking)."""
        wanted = [(tp.topic, tp.partition) for tp in request.partitions]

        def decide() -> list[PartitionDecision]:
            del response.partitions[:]
            _, alive, eligible = self._liveness()
            parts = self._partitions_sync()
            decisions = []
            for tp in wanted or sorted(parts):
                result = response.partitions.add(
                    topic=tp[0], partition=tp[1], leader=-1, leader_epoch=-1
                )
                found = parts.get(tp)
                if found is None:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    result.error_message = f"partition {tp[0]}-{tp[1]} does not exist"
                    continue
                key, v, _ = found
                if unclean:
                    d, code = leadership.unclean_election(v.value, alive, eligible)
                else:
                    d, code = leadership.preferred(v.value, eligible)
                state = d.state if d is not None else v.value
                result.leader, result.leader_epoch = state.leader, state.leader_epoch
                if code == E.PREFERRED_LEADER_NOT_AVAILABLE:
                    result.error_code = code
                    result.error_message = leadership.preferred_unavailable_reason(
                        v.value, eligible
                    )
                elif code != E.NONE:
                    result.error_code = code
                    result.error_message = error_name(code)
                if d is not None:
                    decisions.append(PartitionDecision(tp, key, v.mod_revision, d))
            return decisions

        return self._decide_and_commit(lead, decide).committed

    @rpc(write=True)
    async def ControlledShutdown(
        self,
        lead: Leadership,
        request: pb.ControlledShutdownRequest,
        response: pb.ControlledShutdownResponse,
    ) -> None:
        nodes = await self._nodes()
        if request.node_id not in nodes:
            response.error_code = E.BROKER_NOT_AVAILABLE
            response.error_message = f"node {request.node_id} is not registered"
            return
        stale = self._stale_incarnation(nodes, request.node_id, request.incarnation_id)
        if stale is not None:
            response.error_code = E.STALE_NODE_INCARNATION
            response.error_message = stale
            return
        # A STARTING node asks to have its previous life fenced (storage/node.py): it is
        # not eligible while STARTING anyway, and must become so once RUNNING.
        if nodes[request.node_id].state != md.NODE_STATE_STARTING:
            self._shutting_down[request.node_id] = request.incarnation_id
        await asyncio.to_thread(self._reconcile_sync, lead)
        parts = await asyncio.to_thread(self._partitions_sync)
        for (topic, p), (_, v, _) in sorted(parts.items()):
            if v.value.leader == request.node_id:
                response.remaining_partitions.add(topic=topic, partition=p)
        await self._await_partition_epochs(
            {tp: v.value.partition_epoch for tp, (_, v, _) in parts.items()},
            "controlled shutdown states",
        )
