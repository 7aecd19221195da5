"""Partition reassignment: AlterPartitionReassignments starts or cancels moving a
partition's replicas, ListPartitionReassignments shows the moves in progress (DESIGN §6).

A started reassignment adds the target replicas as ``adding_replicas``; reconciliation
(:mod:`strom.controller.reconcile`) completes it once they are all in the ISR. Decisions are
the pure functions of :mod:`strom.controller.leadership`, committed like every other
partition state change (:meth:`PartitionStates._decide_and_commit`).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.controller import leadership
from strom.controller.core import Leadership, rpc
from strom.controller.partition_states import PartitionDecision, PartitionStates
from strom.errors import ErrorCode

E = ErrorCode


def target_problem(target: list[int], nodes: dict[int, md.NodeRegistration]) -> str | None:
    """What is wrong with a reassignment's target replica set, or None."""
    if not target:
        return "the target replica set is empty (replication factor >= 1)"
    if len(set(target)) != len(target):
        return f"target replicas {target} contain duplicates"
    if missing := sorted(set(target) - set(nodes)):
        return f"target replicas {missing} are not registered nodes"
    return None


def _unclean_cancel(tp: tuple[str, int], st: md.PartitionState) -> str:
    """Why a cancel was refused: only replicas being added are in sync."""
    original = leadership.original_replicas(st)
    return (
        f"cannot cancel the reassignment of {tp[0]}-{tp[1]}: it would require an unclean "
        f"leader election (in sync: {list(st.isr)}, all being added; original replicas "
        f"{original} are behind, and going back to them would lose the records only the "
        "new replicas hold). Let the move finish, or move to another target that keeps "
        "them, or set unclean.leader.election.enable=true on the topic to accept the loss"
    )


class ReassignmentRpcs(PartitionStates):
    """AlterPartitionReassignments and ListPartitionReassignments."""

    @rpc(write=True)
    async def AlterPartitionReassignments(
        self,
        lead: Leadership,
        request: pb.AlterPartitionReassignmentsRequest,
        response: pb.AlterPartitionReassignmentsResponse,
    ) -> None:
        committed = await asyncio.to_thread(self._reassign_sync, lead, request, response)
        await self._await_partition_epochs(committed)

    def _reassign_sync(
        self,
        lead: Leadership,
        request: pb.AlterPartitionReassignmentsRequest,
        response: pb.AlterPartitionReassignmentsResponse,
    ) -> dict[tuple[str, int], int]:
        """Start or cancel each named reassignment (blocking); the epochs committed."""
        counts = Counter((r.topic, r.partition) for r in request.partitions)

        def decide() -> list[PartitionDecision]:
            del response.partitions[:]
            nodes, _, eligible = self._liveness()
            parts = self._partitions_sync()
            decisions = []
            for item in request.partitions:
                tp = (item.topic, item.partition)
                result = response.partitions.add(topic=item.topic, partition=item.partition)
                found = parts.get(tp)
                if found is None:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    result.error_message = f"partition {tp[0]}-{tp[1]} does not exist"
                    continue
                if counts[tp] > 1:
                    result.error_code = E.INVALID_REQUEST
                    result.error_message = f"partition {tp[0]}-{tp[1]} is named more than once"
                    continue
                key, v, topic = found
                if item.cancel:
                    d, code = leadership.cancel_reassignment(
                        v.value, eligible, unclean_allowed=self._unclean(topic)
                    )
                    if code == E.INVALID_REPLICA_ASSIGNMENT:
                        result.error_code = code
                        result.error_message = _unclean_cancel(tp, v.value)
                    elif code != E.NONE:
                        result.error_code = code
                        result.error_message = f"no reassignment of {tp[0]}-{tp[1]} is in progress"
                else:
                    problem = target_problem(list(item.replicas), nodes)
                    if problem is not None:
                        result.error_code = E.INVALID_REPLICA_ASSIGNMENT
                        result.error_message = problem
                        continue
                    d = leadership.start_reassignment(v.value, list(item.replicas), eligible)
                if d is not None:
                    decisions.append(PartitionDecision(tp, key, v.mod_revision, d))
            return decisions

        return self._decide_and_commit(lead, decide).committed

    @rpc(write=False)
    async def ListPartitionReassignments(
        self,
        lead: Leadership,
        request: pb.ListPartitionReassignmentsRequest,
        response: pb.ListPartitionReassignmentsResponse,
    ) -> None:
        view = self._live_view
        wanted = {(tp.topic, tp.partition) for tp in request.partitions}
        with view.lock:
            for (name, p), v in sorted(view.partitions.items()):
                topic = view.topics.get(name)
                if topic is None or topic.value.deleting or p >= topic.value.partition_count:
                    continue
                if wanted and (name, p) not in wanted:
                    continue
                st = v.value
                if st.adding_replicas or st.removing_replicas:
                    response.reassignments.add(
                        topic=name,
                        partition=p,
                        replicas=st.replicas,
                        adding_replicas=st.adding_replicas,
                        removing_replicas=st.removing_replicas,
                    )
