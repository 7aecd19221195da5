"""The Admin client's calls that move leadership and replicas (ElectLeaders and partition
reassignments), mixed into :class:`strom.client.admin.Admin` as :class:`ReassignmentsAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from strom.api import common_pb2, controller_pb2
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import (
    NONE,
    partition_error,
    raise_first,
    raise_partial,
    replica_list,
    topic_partition,
    tp_map,
)
from strom.client.admin_types import ElectionResult, Reassignment
from strom.client.kwnames import bool_option
from strom.client.types import TopicPartition
from strom.errors import UnknownTopicOrPartitionError


class ReassignmentsAdmin(AdminCalls):
    """Leaders and replicas: ElectLeaders and partition reassignments."""

    def elect_leaders(
        self,
        partitions: Iterable[TopicPartition | str] | None = None,
        *,
        unclean: bool = False,
    ) -> dict[TopicPartition, ElectionResult]:
        """Run leader elections and return each partition's outcome.

        Preferred (default): move leadership to each partition's first replica if it is live
        and in sync, e.g. to rebalance leaders after a node came back. ``unclean=True``: for
        partitions without a leader, elect any live replica even out of the ISR, accepting the
        loss of records it lacks. ``partitions`` takes TopicPartitions and topic names (every
        partition of the topic); None = every partition. Naming a partition or topic that does
        not exist raises UnknownTopicOrPartitionError.
        """
        tps: list[TopicPartition] = []
        if partitions is not None:
            if isinstance(partitions, str):
                partitions = [partitions]
            items = list(partitions)
            topics = [i for i in items if isinstance(i, str)]
            described = self.describe_topics(list(dict.fromkeys(topics))) if topics else {}
            for item in items:
                if isinstance(item, str):
                    tps.extend(described[item].topic_partitions)
                else:
                    tps.append(topic_partition(item))
            tps = list(dict.fromkeys(tps))
            if not tps:
                return {}
        resp = self._controller(
            "ElectLeaders",
            controller_pb2.ElectLeadersRequest(
                election_type=(
                    controller_pb2.ELECTION_TYPE_UNCLEAN
                    if bool_option("unclean", unclean)
                    else controller_pb2.ELECTION_TYPE_PREFERRED
                ),
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in tps],
                timeout_ms=self._server_wait_ms,
            ),
        )
        out: dict[TopicPartition, ElectionResult] = {}
        unknown = []
        for r in sorted(resp.partitions, key=lambda r: (r.topic, r.partition)):
            tp = TopicPartition(r.topic, r.partition)
            error = None
            if r.error_code != NONE:
                error = partition_error(r.error_code, r.error_message, tp)
                if isinstance(error, UnknownTopicOrPartitionError):
                    unknown.append((f"{tp.topic}-{tp.partition}", error))
            out[tp] = ElectionResult(r.leader if r.leader >= 0 else None, r.leader_epoch, error)
        raise_first(unknown)
        return out

    def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None]
    ) -> None:
        """Start moving partitions to new replica lists (preferred leader first), or cancel a
        move in progress with None. The new replicas catch up as followers; the controller
        then drops the removed ones. Watch the progress with :meth:`list_partition_reassignments`
        (or ``describe_topic``). Cancelling where nothing is in progress raises
        NoReassignmentInProgressError. With several partitions, those refused raise a
        PartialResultError of the first refusal's class whose ``errors`` hold every refusal by
        partition (the others were started: ``results`` holds them, with None)."""
        items = []
        for tp, replicas in tp_map(reassignments, "alter_partition_reassignments").items():
            if replicas is None:
                items.append(
                    controller_pb2.PartitionReassignment(
                        topic=tp.topic, partition=tp.partition, cancel=True
                    )
                )
            else:
                items.append(
                    controller_pb2.PartitionReassignment(
                        topic=tp.topic,
                        partition=tp.partition,
                        replicas=replica_list(replicas, f"{tp.topic}-{tp.partition}"),
                    )
                )
        if not items:
            return
        resp = self._controller(
            "AlterPartitionReassignments",
            controller_pb2.AlterPartitionReassignmentsRequest(
                partitions=items, timeout_ms=self._server_wait_ms
            ),
        )
        # Every refusal is carried (a PartialResultError when others took effect), so that
        # `strom topics reassign --plan` names each partition refused, not the first only.
        wanted = [TopicPartition(i.topic, i.partition) for i in items]
        failed = {
            TopicPartition(r.topic, r.partition): partition_error(
                r.error_code, r.error_message, TopicPartition(r.topic, r.partition)
            )
            for r in resp.partitions
            if r.error_code != NONE
        }
        if len(wanted) == 1 and failed:
            raise next(iter(failed.values()))
        raise_partial(wanted, {tp: None for tp in wanted if tp not in failed}, failed)

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, Reassignment]:
        """Reassignments in progress (among ``partitions``, or all), sorted by partition."""
        tps = [] if partitions is None else [topic_partition(p) for p in partitions]
        if partitions is not None and not tps:
            return {}
        resp = self._controller(
            "ListPartitionReassignments",
            controller_pb2.ListPartitionReassignmentsRequest(
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in tps]
            ),
        )
        return {
            TopicPartition(r.topic, r.partition): Reassignment(
                tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas)
            )
            for r in sorted(resp.reassignments, key=lambda r: (r.topic, r.partition))
        }
