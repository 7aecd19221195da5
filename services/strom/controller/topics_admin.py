"""Topic admin: CreateTopics, DeleteTopics and CreatePartitions (DESIGN §3).

Writes read the keys they change straight from etcd (admin traffic is rare, and CAS needs
the current mod_revision anyway), commit with the fenced transaction, then wait until the
view shows the change. Writes are serialised by the controller's one write lock, as Kafka's
controller serialises events: placement sees the previous topic's partitions.

etcd limits a transaction to ``--max-txn-ops`` operations (128 by default). A topic whose
partitions fit (up to 127 with the default) is written in one transaction with its
partitions. A larger one is written partition keys first, in chunks, and the topic key last;
the topic key is the commit point. Until it exists the partition keys belong to no topic, and
readers ignore partition keys whose topic is missing, has another topic_id, or has fewer
partitions (that is also how a deleted-and-re-created topic's stale state is told apart). A
controller that dies half-way leaves such orphans; the next active controller deletes them
(:meth:`strom.controller.activation.ActiveRole._cleanup_sync`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field

import grpc

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.clock import wall_ms
from strom.controller.cas import commit_with_retry
from strom.controller.core import ControllerCore, Leadership, item_error, rack_of, rpc
from strom.controller.leadership import eligible_nodes, initial_state
from strom.controller.placement import PlacementNode, assign_replicas
from strom.controller.validation import (
    COORDINATOR_TOPICS,
    colliding_topic,
    is_internal_topic,
    validate_assignments,
    validate_new_topic,
    validate_partition_increase,
)
from strom.errors import (
    ErrorCode,
    InvalidRequestError,
    InvalidTopicError,
    PolicyViolationError,
    ReassignmentInProgressError,
    RequestTimedOutError,
    StromError,
    TopicAlreadyExistsError,
    TopicDeletionInProgressError,
    UnknownTopicOrPartitionError,
)
from strom.metadata import Versioned
from strom.service.headers import INTERNAL_TOPICS_METADATA_KEY

log = logging.getLogger("strom.controller")
E = ErrorCode


def placement_nodes(nodes: dict[int, md.NodeRegistration]) -> list[PlacementNode]:
    """The nodes new replicas may be placed on: registered and not shutting down."""
    return [
        PlacementNode(n.node_id, rack_of(n))
        for n in nodes.values()
        if n.state != md.NODE_STATE_SHUTTING_DOWN
    ]


@dataclass
class Load:
    """What each node already has, for placement: partitions it is preferred leader of (the
    first replica, where leadership returns after a failover), replicas it holds, and
    partitions per (preferred leader, first follower: where leadership goes when it fails)."""

    leaders: dict[int, int] = field(default_factory=dict)
    replicas: dict[int, int] = field(default_factory=dict)
    firsts: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, replica_lists: list[list[int]]) -> None:
        """Count new partitions in (placement of the next topic in the same request)."""
        for r in replica_lists:
            if r:
                self.leaders[r[0]] = self.leaders.get(r[0], 0) + 1
            if len(r) > 1:
                self.firsts[r[0], r[1]] = self.firsts.get((r[0], r[1]), 0) + 1
            for node in r:
                self.replicas[node] = self.replicas.get(node, 0) + 1


async def _place(
    eligible: list[PlacementNode],
    partitions: int,
    replication_factor: int,
    load: Load,
    *,
    shift: int,
) -> list[list[int]]:
    """:func:`assign_replicas` off the event loop: it takes about a second for the largest
    topic (10,000 partitions) over 100 nodes, and the loop serves AlterPartition meanwhile."""
    return await asyncio.to_thread(
        assign_replicas,
        eligible,
        partitions,
        replication_factor,
        start_index=sum(load.leaders.values()),
        shift=shift,
        leader_load=dict(load.leaders),
        replica_load=dict(load.replicas),
        first_load=dict(load.firsts),
    )


class TopicRpcs(ControllerCore):
    """CreateTopics, DeleteTopics and CreatePartitions."""

    @rpc(write=True, with_context=True)
    async def CreateTopics(
        self,
        lead: Leadership,
        request: pb.CreateTopicsRequest,
        response: pb.CreateTopicsResponse,
        context: grpc.aio.ServicerContext,
    ) -> None:
        metadata = dict(context.invocation_metadata() or ())
        allow_internal = str(metadata.get(INTERNAL_TOPICS_METADATA_KEY, "")).lower() == "true"
        assert self.store is not None and self.view is not None
        store, view = self.store, self.view
        counts = Counter(t.name for t in request.topics)
        nodes, placeable, load = await self._placement_inputs()
        eligible = eligible_nodes(nodes, self._shutting_down)
        with view.lock:
            names = {n for n, v in view.topics.items() if not v.value.deleting}
        created: dict[str, str] = {}
        for item in request.topics:
            result = response.topics.add(name=item.name, num_partitions=-1, replication_factor=-1)
            try:
                if counts[item.name] > 1:
                    raise InvalidRequestError(
                        f"topic {item.name!r} is named {counts[item.name]} times in the request"
                    )
                plan = validate_new_topic(
                    item.name,
                    item.num_partitions,
                    item.replication_factor,
                    [(a.partition, list(a.replicas)) for a in item.assignments],
                    dict(item.configs),
                    live_nodes=nodes.keys(),
                    default_partitions=self.default_partitions,
                    default_replication_factor=self.default_replication_factor,
                    allow_internal=allow_internal,
                )
                existing = await asyncio.to_thread(
                    store.get, store.keys.topic(plan.name), md.TopicMetadata
                )
                self._check_absent(plan.name, existing)
                other = colliding_topic(plan.name, names)
                if other is not None:
                    raise InvalidTopicError(
                        f"topic {plan.name!r} collides with existing topic {other!r} "
                        "(names may not differ only by '.' versus '_')"
                    )
                replicas = plan.assignments or await _place(
                    placeable,
                    plan.num_partitions,
                    plan.replication_factor,
                    load,
                    shift=len(names),
                )
                result.num_partitions = plan.num_partitions
                result.replication_factor = plan.replication_factor
                if request.validate_only:
                    continue
                meta = md.TopicMetadata(
                    topic_id=str(uuid.uuid4()),
                    name=plan.name,
                    partition_count=plan.num_partitions,
                    replication_factor=plan.replication_factor,
                    configs=plan.configs,
                    created_ms=wall_ms(),
                    internal=plan.internal,
                )
                states = [initial_state(r, eligible, meta.topic_id) for r in replicas]
                ok = await asyncio.to_thread(self._write_new_topic, lead, meta, states)
                if not ok:
                    existing = await asyncio.to_thread(
                        store.get, store.keys.topic(plan.name), md.TopicMetadata
                    )
                    self._check_absent(plan.name, existing)
                    raise RequestTimedOutError(f"topic {plan.name!r} could not be written")
                result.topic_id = meta.topic_id
                created[meta.name] = meta.topic_id
                names.add(meta.name)
                load.add(replicas)
                log.info(
                    "created topic %s (%d partitions, replication factor %d)",
                    meta.name,
                    meta.partition_count,
                    meta.replication_factor,
                    extra={"fields": {"topic": meta.name, "topic_id": meta.topic_id}},
                )
            except StromError as exc:
                item_error(result, exc)
                result.num_partitions = -1
                result.replication_factor = -1
        if created:
            await self._await_view(
                lambda: all(
                    (v := view.topics.get(n)) is not None and v.value.topic_id == tid
                    for n, tid in created.items()
                ),
                f"topics {sorted(created)}",
            )

    @staticmethod
    def _check_absent(name: str, existing: Versioned | None) -> None:
        if existing is None:
            return
        if existing.value.deleting:
            raise TopicDeletionInProgressError(f"topic {name!r} is still being deleted")
        raise TopicAlreadyExistsError(f"topic {name!r} already exists")

    def _write_new_topic(
        self, lead: Leadership, meta: md.TopicMetadata, states: list[md.PartitionState]
    ) -> bool:
        """Write a new topic and its partitions (blocking); False if the name is taken."""
        assert self.store is not None
        keys = self.store.keys
        topic_key = keys.topic(meta.name)
        absent = [(topic_key, 0)]
        # Partition keys left by an interrupted creation of the same name must not survive.
        # (etcd refuses a put and a delete of the same key in one transaction, hence apart.)
        if not self._txn(lead, absent, delete_prefixes=[keys.partitions_of(meta.name)]):
            return False
        puts = [(keys.partition(meta.name, p), s) for p, s in enumerate(states)]
        return self._write_topic_last(lead, absent, (topic_key, meta), puts)

    @rpc(write=True)
    async def DeleteTopics(
        self, lead: Leadership, request: pb.DeleteTopicsRequest, response: pb.DeleteTopicsResponse
    ) -> None:
        view = self._live_view
        deleted: list[str] = []
        for name in request.topics:
            result = response.topics.add(name=name)
            try:
                topic_id = await asyncio.to_thread(self._delete_topic, lead, name)
                result.topic_id = topic_id
                deleted.append(name)
                log.info(
                    "deleted topic %s",
                    name,
                    extra={"fields": {"topic": name, "topic_id": topic_id}},
                )
            except StromError as exc:
                item_error(result, exc)
        if deleted:
            await self._await_view(
                lambda: not any(n in view.topics for n in deleted),
                f"deletion of {deleted}",
            )

    def _delete_topic(self, lead: Leadership, name: str) -> str:
        """Remove a topic's key and all its partition keys in one transaction (blocking)."""
        assert self.store is not None
        store, key = self.store, self.store.keys.topic(name)

        def decide() -> Versioned:
            current = store.get(key, md.TopicMetadata)
            if current is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            # Only the coordinators' own topics: another ``__`` topic (one a client with
            # CREATE could make before CreateTopics of such names needed CLUSTER_ACTION, found
            # from outside) could otherwise never be removed.
            if name in COORDINATOR_TOPICS:
                raise PolicyViolationError(
                    f"topic {name!r} holds strom's coordinators' state and cannot be deleted"
                )
            return current

        def commit(current: Versioned) -> bool:
            return self._txn(
                lead,
                [(key, current.mod_revision)],
                deletes=[key],
                delete_prefixes=[store.keys.partitions_of(name)],
            )

        current = commit_with_retry(
            decide, commit, attempts=5, gave_up=f"topic {name!r} kept changing while being deleted"
        )
        return str(current.value.topic_id)

    @rpc(write=True)
    async def CreatePartitions(
        self,
        lead: Leadership,
        request: pb.CreatePartitionsRequest,
        response: pb.CreatePartitionsResponse,
    ) -> None:
        assert self.store is not None and self.view is not None
        store, view = self.store, self.view
        counts = Counter(t.name for t in request.topics)
        nodes, placeable, load = await self._placement_inputs()
        eligible = eligible_nodes(nodes, self._shutting_down)
        grown: dict[str, int] = {}
        for item in request.topics:
            result = response.topics.add(name=item.name)
            try:
                if counts[item.name] > 1:
                    raise InvalidRequestError(f"topic {item.name!r} is named twice in the request")
                current = await asyncio.to_thread(
                    store.get, store.keys.topic(item.name), md.TopicMetadata
                )
                if current is None or current.value.deleting:
                    raise UnknownTopicOrPartitionError(f"topic {item.name!r} does not exist")
                meta: md.TopicMetadata = current.value
                if meta.internal or is_internal_topic(item.name):
                    raise PolicyViolationError(
                        f"topic {item.name!r} is internal: its partition count decides which "
                        "coordinator shard keeps each group and transactional id, so it "
                        "cannot change (groups and transactions would be lost)"
                    )
                validate_partition_increase(item.name, meta.partition_count, item.count)
                self._check_no_reassignment(item.name)
                new = item.count - meta.partition_count
                rf = self._replication_factor(meta)
                if item.assignments:
                    replicas = validate_assignments(
                        [(a.partition, list(a.replicas)) for a in item.assignments],
                        first_partition=meta.partition_count,
                        count=new,
                        live_nodes=nodes.keys(),
                        replication_factor=rf,
                    )
                else:
                    replicas = await _place(placeable, new, rf, load, shift=meta.partition_count)
                if request.validate_only:
                    continue
                updated = md.TopicMetadata()
                updated.CopyFrom(meta)
                updated.partition_count = item.count
                states = [initial_state(r, eligible, meta.topic_id) for r in replicas]
                ok = await asyncio.to_thread(self._write_partitions, lead, current, updated, states)
                if not ok:
                    raise RequestTimedOutError(
                        f"topic {item.name!r} changed while adding partitions; retry"
                    )
                grown[item.name] = item.count
                load.add(replicas)
                log.info(
                    "topic %s grew from %d to %d partitions",
                    item.name,
                    meta.partition_count,
                    item.count,
                    extra={"fields": {"topic": item.name}},
                )
            except StromError as exc:
                item_error(result, exc)
        if grown:
            await self._await_view(
                lambda: all(
                    (v := view.topics.get(n)) is not None and v.value.partition_count >= c
                    for n, c in grown.items()
                ),
                f"new partitions of {sorted(grown)}",
            )

    def _replication_factor(self, meta: md.TopicMetadata) -> int:
        """Replicas for a topic's new partitions: as many as its first partition has (Kafka's
        rule, and what describe shows), since a reassignment may have changed it since the
        topic was created; the count stored at creation if that partition is not known."""
        assert self.view is not None
        with self.view.lock:
            v = self.view.partitions.get((meta.name, 0))
        if v is None or v.value.topic_id != meta.topic_id or not v.value.replicas:
            return meta.replication_factor
        removing = set(v.value.removing_replicas)
        return sum(1 for r in v.value.replicas if r not in removing)

    def _check_no_reassignment(self, name: str) -> None:
        assert self.view is not None
        for p, v in sorted(self.view.partitions_of(name).items()):
            if v.value.adding_replicas or v.value.removing_replicas:
                raise ReassignmentInProgressError(
                    f"partition {p} of topic {name!r} is being reassigned"
                )

    def _write_partitions(
        self,
        lead: Leadership,
        current: Versioned,
        updated: md.TopicMetadata,
        states: list[md.PartitionState],
    ) -> bool:
        """Write new partition keys and the grown topic, CAS on the topic (blocking)."""
        assert self.store is not None
        keys = self.store.keys
        topic_key = keys.topic(updated.name)
        first = current.value.partition_count
        same = [(topic_key, current.mod_revision)]
        puts = [(keys.partition(updated.name, first + i), s) for i, s in enumerate(states)]
        return self._write_topic_last(lead, same, (topic_key, updated), puts)

    def _write_topic_last(
        self,
        lead: Leadership,
        compares: list[tuple[str, int]],
        topic: tuple[str, md.TopicMetadata],
        puts: list[tuple[str, md.PartitionState]],
    ) -> bool:
        """Write partition keys and then their topic key, every transaction comparing
        ``compares`` (blocking). One transaction when they fit in ``max_txn_ops``; else the
        partitions in chunks and the topic key last, the commit point (module docstring)."""
        if len(puts) + 1 <= self.max_txn_ops:
            return self._txn(lead, compares, puts=[topic, *puts])
        for i in range(0, len(puts), self.max_txn_ops):
            if not self._txn(lead, compares, puts=puts[i : i + self.max_txn_ops]):
                return False
        return self._txn(lead, compares, puts=[topic])

    async def _placement_inputs(
        self,
    ) -> tuple[dict[int, md.NodeRegistration], list[PlacementNode], Load]:
        """Registered nodes (from etcd), those new replicas may go to, and their load."""
        nodes = await self._nodes()
        return nodes, placement_nodes(nodes), self._load()

    def _load(self) -> Load:
        """Each node's preferred leaderships and replicas (for placement).

        Preferred, not current, leaders: a failover moves leadership for a while, and counting
        it would make placement skew the preferred leaders for good. A partition being
        reassigned counts as its target replicas (the ones it keeps).
        """
        assert self.view is not None
        load = Load()
        with self.view.lock:
            for (topic, p), v in self.view.partitions.items():
                meta = self.view.topics.get(topic)
                if meta is None or meta.value.deleting or p >= meta.value.partition_count:
                    continue
                removing = set(v.value.removing_replicas)
                load.add([[r for r in v.value.replicas if r not in removing]])
        return load
