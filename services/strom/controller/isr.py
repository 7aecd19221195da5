"""ISR commits: AlterPartition, the partition leader's proposal of a new ISR or recovery
state, validated and committed with CAS (DESIGN §6).

A proposal carries the leader's epochs; one that is stale (another leader, another
partition epoch) is refused with the current state so the leader resyncs. There is no retry
on a conflict: the leader proposes again from the state it is sent back.
"""

from __future__ import annotations

import asyncio
import logging

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.controller import leadership, metrics
from strom.controller.core import ControllerCore, Leadership, rpc
from strom.errors import ErrorCode

log = logging.getLogger("strom.controller")
E = ErrorCode


class IsrRpcs(ControllerCore):
    """AlterPartition."""

    @rpc(write=True)
    async def AlterPartition(
        self,
        lead: Leadership,
        request: pb.AlterPartitionRequest,
        response: pb.AlterPartitionResponse,
    ) -> None:
        nodes = await self._nodes()
        for node_id, incarnation in self._shutting_down.items():
            reg = nodes.get(node_id)
            if reg is not None and reg.incarnation_id == incarnation:
                reg.state = md.NODE_STATE_SHUTTING_DOWN  # ControlledShutdown came first
        stale = self._stale_incarnation(nodes, request.leader_id, request.leader_incarnation)
        if stale is not None:
            response.error_code = E.STALE_NODE_INCARNATION
            response.error_message = stale
            return
        committed: dict[tuple[str, int], int] = {}
        for item in request.partitions:
            result = response.partitions.add(topic=item.topic, partition=item.partition)
            state = await asyncio.to_thread(
                self._alter_partition, lead, request.leader_id, item, nodes, result
            )
            if state is not None:
                committed[(item.topic, item.partition)] = state.partition_epoch
        await self._await_partition_epochs(committed)

    def _alter_partition(
        self,
        lead: Leadership,
        leader_id: int,
        item: pb.AlterPartitionItem,
        nodes: dict[int, md.NodeRegistration],
        result: pb.AlterPartitionResult,
    ) -> md.PartitionState | None:
        """Validate one ISR proposal and commit it with CAS (blocking, DESIGN §6).

        Returns the committed state when a write happened, else None (``result`` says why).
        """
        assert self.store is not None
        keys = self.store.keys
        topic = self.store.get(keys.topic(item.topic), md.TopicMetadata)
        current = self.store.get(keys.partition(item.topic, item.partition), md.PartitionState)
        if (
            topic is None
            or topic.value.deleting
            or item.partition < 0
            or item.partition >= topic.value.partition_count
            or current is None
        ):
            result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
            result.error_message = f"partition {item.topic}-{item.partition} does not exist"
            return None
        if item.topic_id and item.topic_id != topic.value.topic_id:
            result.error_code = E.INCONSISTENT_TOPIC_ID
            result.error_message = (
                f"topic {item.topic!r} now has id {topic.value.topic_id}, not {item.topic_id}"
            )
            return None
        st: md.PartitionState = current.value
        problem = self._check_proposal(leader_id, item, st, nodes)
        if problem is not None:
            code, message = problem
            result.error_code = code
            result.error_message = message
            if code != E.INVALID_REQUEST:
                result.state.CopyFrom(st)
            return None
        election = None
        if leader_id not in item.new_isr:
            # The leader resigns: its replica's data failed a check, or its disk refused an
            # append (leadership.resign).
            eligible = {n for n, reg in nodes.items() if reg.state == md.NODE_STATE_RUNNING}
            reason = (
                leadership.STORAGE_ERROR
                if item.resign_reason == leadership.STORAGE_ERROR
                else leadership.DAMAGED_REPLICA
            )
            decision = leadership.resign(st, eligible, reason)
            if decision is None:
                result.error_code = E.ELIGIBLE_LEADERS_NOT_AVAILABLE
                result.error_message = (
                    f"node {leader_id} cannot hand {item.topic}-{item.partition} over: no "
                    f"other in-sync replica of ISR {list(st.isr)} is running"
                )
                result.state.CopyFrom(st)
                return None
            new, election = decision.state, decision.election
        else:
            order = {r: i for i, r in enumerate(st.replicas)}
            new = md.PartitionState()
            new.CopyFrom(st)
            new.ClearField("isr")
            new.isr.extend(sorted(set(item.new_isr), key=order.__getitem__))
            new.leader_recovery_state = item.leader_recovery_state
            if (
                list(new.isr) == list(st.isr)
                and new.leader_recovery_state == st.leader_recovery_state
            ):
                result.state.CopyFrom(st)  # nothing changes: already committed
                return None
            new.partition_epoch = st.partition_epoch + 1
        key = keys.partition(item.topic, item.partition)
        if not self._txn(lead, [(key, current.mod_revision)], puts=[(key, new)]):
            latest = self.store.get(key, md.PartitionState)
            result.error_code = E.INVALID_PARTITION_EPOCH
            result.error_message = "the partition state changed while committing; resync"
            if latest is not None:
                result.state.CopyFrom(latest.value)
            return None
        result.state.CopyFrom(new)
        if election is not None:
            metrics.LEADER_ELECTIONS.labels(election).inc()
        log.info(
            "partition %s-%d ISR %s -> %s (partition epoch %d)%s",
            item.topic,
            item.partition,
            list(st.isr),
            list(new.isr),
            new.partition_epoch,
            f"; node {leader_id} resigned ({election}), node {new.leader} leads in epoch "
            f"{new.leader_epoch}"
            if election is not None
            else "",
        )
        return new

    @staticmethod
    def _check_proposal(
        leader_id: int,
        item: pb.AlterPartitionItem,
        st: md.PartitionState,
        nodes: dict[int, md.NodeRegistration],
    ) -> tuple[int, str] | None:
        """The error (code, message) an AlterPartition proposal earns, or None if valid."""
        if st.leader != leader_id or item.leader_epoch != st.leader_epoch:
            return (
                E.FENCED_LEADER_EPOCH,
                f"node {leader_id} in leader epoch {item.leader_epoch} is not the leader; "
                f"node {st.leader} leads in epoch {st.leader_epoch}",
            )
        if item.partition_epoch != st.partition_epoch:
            return (
                E.INVALID_PARTITION_EPOCH,
                f"partition epoch {item.partition_epoch} is not the committed {st.partition_epoch}",
            )
        isr = list(item.new_isr)
        if len(set(isr)) != len(isr) or not set(isr) <= set(st.replicas):
            return (
                E.INVALID_REQUEST,
                f"proposed ISR {isr} must be distinct replicas of {list(st.replicas)}",
            )
        if leader_id not in isr and not set(isr) < set(st.isr):
            # Without the leader, an ISR is its resignation (leadership.resign): it may only
            # drop the leader, never add anyone.
            return (
                E.INVALID_REQUEST,
                f"proposed ISR {isr} without the leader {leader_id} must be the committed ISR "
                f"{list(st.isr)} without it",
            )
        recovering = md.LEADER_RECOVERY_STATE_RECOVERING
        if st.leader_recovery_state != recovering and item.leader_recovery_state == recovering:
            return E.INVALID_REQUEST, "a RECOVERED partition cannot go back to RECOVERING"
        if item.leader_recovery_state == recovering and len(isr) > 1:
            return (
                E.INVALID_REQUEST,
                "a RECOVERING leader cannot add followers to the ISR before it has recovered",
            )
        for node_id in sorted(set(isr) - set(st.isr)):
            node = nodes.get(node_id)
            if node is None or node.state != md.NODE_STATE_RUNNING:
                state = "not registered" if node is None else md.NodeState.Name(node.state)
                return (
                    E.INELIGIBLE_REPLICA,
                    f"replica {node_id} cannot join the ISR: it is {state}",
                )
            # The process whose fetches the leader saw must be the registered one (KIP-903):
            # a node that restarted, on an emptied data dir say, holds only what its new
            # process fetched. A leader whose view lags the registration can propose it from
            # the previous run's position (elected leader with an empty log, it would have
            # the other replicas truncate acknowledged records).
            fetched_by = item.new_isr_incarnations.get(node_id, "")
            if fetched_by and fetched_by != node.incarnation_id:
                return (
                    E.INELIGIBLE_REPLICA,
                    f"replica {node_id} cannot join the ISR: the fetches it was proposed from "
                    f"came from incarnation {fetched_by!r}, not the registered "
                    f"{node.incarnation_id!r} (it restarted)",
                )
        return None
