"""The Admin client's argument and result types: what :class:`strom.client.admin.Admin`
takes (``NewTopic``, ``OffsetSpec``, config values, replica assignments) and returns (topic,
partition, config, node, cluster, election, producer and reassignment descriptions).

Plain values (frozen dataclasses and named tuples), with no protobuf in them: callers build and
read them without the RPC layer. They are imported from ``strom.client.admin`` (and ``strom``)
as before; how they are read from an answer is in :mod:`strom.client.admin_requests`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple

from strom.client.kwnames import kafka_keywords
from strom.client.types import TopicPartition
from strom.errors import StromError

#: What ``list_offsets`` looks up for a partition: the log start ("earliest"), the offset the
#: next committed record will get ("latest"), the record with the largest timestamp
#: ("max_timestamp"), or the first record at or after a time (ms since the epoch, or a
#: ``datetime``; a naive one is local time, as ``datetime.timestamp`` reads it).
OffsetSpec = Literal["earliest", "latest", "max_timestamp"] | int | datetime

ConfigValue = str | int | float | bool
Assignment = Mapping[int, Sequence[int]] | Sequence[Sequence[int]]


@dataclass(frozen=True)
class NewTopic:
    """A topic for :meth:`Admin.create_topics` (Kafka's ``NewTopic``).

    ``partitions`` / ``replication_factor`` None take the cluster defaults. ``replica_assignment``
    places replicas by hand: partition -> node ids, preferred leader first (a mapping, or a list
    indexed by partition); it fixes both counts, so those must then be left None.
    """

    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    config: Mapping[str, ConfigValue] = field(default_factory=dict)
    replica_assignment: Assignment | None = None


NewTopic.__init__ = kafka_keywords(NewTopic.__init__)  # type: ignore[method-assign]


class CreateTopicResult(NamedTuple):
    """What the controller created (or, with ``validate_only``, would create: no topic id)."""

    name: str
    topic_id: str
    partitions: int
    replication_factor: int


class TopicListing(NamedTuple):
    """One entry of :meth:`Admin.list_topics`."""

    name: str
    topic_id: str
    partitions: int
    internal: bool


@dataclass(frozen=True)
class PartitionInfo:
    """A partition's replication state as the controller stores it.

    ``leader`` is None while the partition has no leader. During a reassignment ``replicas`` is
    the union of the old and new sets; the new set is :attr:`target_replicas`.
    """

    partition: int
    leader: int | None
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    partition_epoch: int = 0
    #: True after an unclean election until the new leader reports it has recovered.
    recovering: bool = False
    #: During a reassignment, the replicas before it in their order then (``replicas`` has
    #: the target's order first): what a cancel or a rollback returns to. Empty otherwise.
    original_replicas: tuple[int, ...] = ()

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replicas once any reassignment in progress completes."""
        removing = set(self.removing_replicas)
        return tuple(r for r in self.replicas if r not in removing)

    @property
    def preferred_leader(self) -> int | None:
        """The first target replica: the leader a preferred election moves leadership to."""
        target = self.target_replicas
        return target[0] if target else None

    @property
    def under_replicated(self) -> bool:
        """Fewer replicas in sync than the partition has, not counting those a reassignment
        is adding (Kafka's rule): a move whose new replicas are still copying while the old
        ones are all in sync is not under-replicated, one that lost an old replica is."""
        return len(self.isr) < len(self.replicas) - len(self.adding_replicas)

    @property
    def offline(self) -> bool:
        """No live leader: the partition can be neither written nor read."""
        return self.leader is None or self.leader in self.offline_replicas

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)


@dataclass(frozen=True)
class TopicDescription:
    """A topic as stored in etcd. ``configs`` holds the topic's overrides only; the effective
    values (defaults included) come from :meth:`Admin.describe_configs`. ``replication_factor``
    is the first partition's replica count (Kafka's rule; a reassignment may change it, and
    each partition's ``replicas`` say what it has)."""

    name: str
    topic_id: str
    internal: bool
    replication_factor: int
    partitions: tuple[PartitionInfo, ...]
    configs: Mapping[str, str] = field(default_factory=dict)
    created_ms: int = 0

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def topic_partitions(self) -> list[TopicPartition]:
        """Every partition as a TopicPartition, e.g. to build ``list_offsets`` arguments."""
        return [TopicPartition(self.name, p.partition) for p in self.partitions]

    @property
    def under_replicated_partitions(self) -> list[int]:
        return [p.partition for p in self.partitions if p.under_replicated]

    @property
    def offline_partitions(self) -> list[int]:
        return [p.partition for p in self.partitions if p.offline]


class ConfigSource(enum.StrEnum):
    """Where a config's effective value comes from."""

    DEFAULT = "default"  # strom's built-in default
    TOPIC = "topic"  # an override stored with the topic
    NODE = "node"  # a storage node's startup configuration
    DYNAMIC_NODE = "dynamic_node"  # a dynamic config of every node (alter_node_configs)
    UNKNOWN = "unknown"


class ConfigEntry(NamedTuple):
    """One config of a topic or node. ``value`` is None when unset or sensitive (secret)."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool = False
    sensitive: bool = False
    documentation: str = ""

    @property
    def is_default(self) -> bool:
        return self.source == ConfigSource.DEFAULT


class Node(NamedTuple):
    """A server process: a controller or coordinator (``node_id`` is its own id family)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class NodeState(enum.StrEnum):
    """A storage node's lifecycle state (only RUNNING nodes lead partitions or join ISRs)."""

    STARTING = "starting"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting_down"


class NodeInfo(NamedTuple):
    """A registered (live) storage node."""

    node_id: int
    host: str
    port: int
    rack: str | None
    state: NodeState
    metrics_port: int = 0
    software_version: str = ""
    start_time_ms: int = 0
    incarnation_id: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClusterDescription:
    """The cluster id, the active controller (None during an election), the live storage nodes
    by id and, when asked for, the coordinator owning each group shard."""

    cluster_id: str
    controller: Node | None
    controller_epoch: int
    nodes: tuple[NodeInfo, ...]
    coordinators: Mapping[int, Node] = field(default_factory=dict)


class ElectionResult(NamedTuple):
    """One partition's election outcome. ``error`` is None when a leader was elected, else the
    reason nothing changed (``ElectionNotNeededError``: the wanted leader already leads;
    ``PreferredLeaderNotAvailableError``: it is down or out of sync; ...)."""

    leader: int | None
    leader_epoch: int
    error: StromError | None = None

    @property
    def elected(self) -> bool:
        return self.error is None


class ProducerState(NamedTuple):
    """What a partition's leader knows of one producer (Kafka's ``ProducerState``)."""

    producer_id: int
    producer_epoch: int
    #: Sequence number of its last record in the partition; -1 if it wrote only markers.
    last_sequence: int
    #: When it last wrote to the partition, ms since the epoch: its last batch's max
    #: timestamp (the producer's clock unless the topic uses LogAppendTime), as Kafka's.
    last_timestamp_ms: int
    #: Coordinator epoch of the newest marker written for it there; -1 = none.
    coordinator_epoch: int
    #: First offset of its open transaction in the partition; None when none is open.
    current_transaction_start_offset: int | None


class Reassignment(NamedTuple):
    """A reassignment in progress: ``replicas`` is the union of old and new."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        removing = set(self.removing_replicas)
        return tuple(r for r in self.replicas if r not in removing)
