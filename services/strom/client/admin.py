"""The Admin client: topics, partitions, configs, the cluster, offsets, record deletion, leader
elections, partition reassignments and consumer groups, synchronously.

It follows kafka-python's ``KafkaAdminClient`` and confluent-kafka's ``AdminClient`` in what it
offers, with plain return values instead of futures and typed results instead of protobufs::

    from strom.client.admin import Admin
    from strom.client.types import TopicPartition

    with Admin(bootstrap="localhost:9092") as admin:
        admin.create_topic("orders", partitions=6, config={"retention.ms": 3_600_000})
        info = admin.describe_topic("orders")
        ends = admin.list_offsets({tp: "latest" for tp in info.topic_partitions})
        admin.delete_records({TopicPartition("orders", 0): 100})

Controller RPCs go to the active controller (``ClusterClient.controller_call`` follows
NOT_CONTROLLER redirects and waits out an election); ListOffsets and DeleteRecords go to each
partition's leader, one request per leader, retried on the leader-moved errors; group calls go
to the group's coordinator (:mod:`strom.client.group_admin`), retried while it moves or loads.
Each attempt has its own deadline (``request_timeout_ms``) inside the call's
(``default_api_timeout_ms``), so a controller or leader that hangs is retried around once
another has taken over.

Errors: every failure raises a :class:`strom.errors.StromError` subclass whose class matches
the server's error code (``TopicAlreadyExistsError``, ``InvalidConfigError``,
``OffsetOutOfRangeError``, ...) and whose message names the topic, partition or config.
Arguments are checked before anything is sent and raise the error the server would have raised
for them (a non-positive partition count is ``InvalidPartitionsError``, a malformed offset spec
``InvalidRequestError``), so callers catch one family of exceptions.

Calls that take several items (``create_topics``, ``delete_topics``, ``list_offsets``,
``delete_records``, ``alter_partition_reassignments``, ...) send them in one request; the server
handles each item on its own, so when some fail the others have still taken effect. Such a call
raises the first failure (in the order the items were given), of that item's own class, and the
message lists the other failed items. Use the singular forms in a loop when each item's outcome
matters. The calls on partition leaders (``list_offsets``, ``delete_records``,
``describe_producers``) also keep what the others returned, as Kafka answers them per
partition: the error raised is a :class:`strom.errors.PartialResultError` as well, whose
``results`` maps each partition done to its result (for ``delete_records`` its new low
watermark: those records are gone) and ``errors`` each partition refused to its error, and
whose message names both. A partition without a live leader is retried until the call's
timeout, then is one of ``errors``. The one exception is ``elect_leaders``: "the preferred
leader already leads" or "is not in sync yet" are normal outcomes of a sweep, so it returns a
result per partition.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypeVar

import grpc

from strom.api import common_pb2, controller_pb2, coordinator_pb2, metadata_pb2, storage_pb2
from strom.argtypes import datetime_ms
from strom.client import forks, group_admin
from strom.client.cluster import ClusterClient, attempt_timeout, older_node
from strom.client.group_admin import (
    GroupDescription,
    GroupListing,
    GroupListingIncompleteError,
    GroupPartitionLag,
    GroupState,
    MemberDescription,
    MemberState,
)
from strom.client.kwnames import bool_option, kafka_keywords
from strom.client.transactions import TransactionManager
from strom.client.types import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition, add_offsets
from strom.errors import (
    BrokerNotAvailableError,
    ErrorCode,
    InvalidConfigError,
    InvalidGroupIdError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    PartialResultError,
    StromError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for,
    is_retriable,
    partial_result_error,
)
from strom.security.channel import client_security

#: The transaction timeout a fenced id keeps until its next producer sets its own.
FENCE_TRANSACTION_TIMEOUT_MS = 60_000
#: Admin's per-attempt and overall call timeouts (see :class:`Admin`).
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_API_TIMEOUT_MS = 60_000

__all__ = [
    "Admin",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigSource",
    "CreateTopicResult",
    "ElectionResult",
    "GroupDescription",
    "GroupListing",
    "GroupListingIncompleteError",
    "GroupPartitionLag",
    "GroupState",
    "MemberDescription",
    "MemberState",
    "NewTopic",
    "Node",
    "NodeInfo",
    "NodeState",
    "OffsetSpec",
    "PartialResultError",
    "PartitionInfo",
    "Reassignment",
    "TopicDescription",
    "TopicListing",
]

NONE = common_pb2.ErrorCode.NONE
T = TypeVar("T")
V = TypeVar("V")

#: What ``list_offsets`` looks up for a partition: the log start ("earliest"), the offset the
#: next committed record will get ("latest"), the record with the largest timestamp
#: ("max_timestamp"), or the first record at or after a time (ms since the epoch, or a
#: ``datetime``; a naive one is local time, as ``datetime.timestamp`` reads it).
OffsetSpec = Literal["earliest", "latest", "max_timestamp"] | int | datetime
_SPECIAL_OFFSETS = {"latest": -1, "earliest": -2, "max_timestamp": -3}
_ISOLATION = {
    "read_uncommitted": storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
    "read_committed": storage_pb2.ISOLATION_LEVEL_READ_COMMITTED,
}

ConfigValue = str | int | float | bool
Assignment = Mapping[int, Sequence[int]] | Sequence[Sequence[int]]


# ---------------------------------------------------------------------------------------------
# Result and argument types


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


_SOURCES = {
    controller_pb2.CONFIG_SOURCE_DEFAULT: ConfigSource.DEFAULT,
    controller_pb2.CONFIG_SOURCE_TOPIC: ConfigSource.TOPIC,
    controller_pb2.CONFIG_SOURCE_STATIC_NODE_CONFIG: ConfigSource.NODE,
    controller_pb2.CONFIG_SOURCE_DYNAMIC_DEFAULT_NODE_CONFIG: ConfigSource.DYNAMIC_NODE,
}


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


_NODE_STATES = {
    metadata_pb2.NODE_STATE_RUNNING: NodeState.RUNNING,
    metadata_pb2.NODE_STATE_SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
}


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


# ---------------------------------------------------------------------------------------------
# Argument checks (they raise what the server would, so one except clause covers both)


def _topic_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"a topic name must be a non-empty string, not {name!r}")
    return name


def _topic_names(names: Iterable[str] | str, what: str) -> list[str]:
    if isinstance(names, str):
        raise InvalidRequestError(f"{what} takes a list of topic names, not the string {names!r}")
    out = [_topic_name(n) for n in names]
    if len(set(out)) != len(out):
        dups = sorted({n for n in out if out.count(n) > 1})
        raise InvalidRequestError(f"{what}: topics named more than once: {', '.join(dups)}")
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(
    value: int | None, what: str, error: type[StromError], *, default_ok: bool = True
) -> int:
    """-1 (the server's "cluster default") for None when ``default_ok``, else a positive int."""
    if value is None and default_ok:
        return -1
    if value is None or not _is_int(value) or value < 1:
        hint = " (leave it out for the cluster default)" if default_ok else ""
        raise error(f"{what} must be a positive integer, not {value!r}{hint}")
    return value


def _tp(item: object) -> TopicPartition:
    if (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and item[0]
        and _is_int(item[1])
        and item[1] >= 0
    ):
        return TopicPartition(item[0], item[1])
    raise InvalidRequestError(f"expected a TopicPartition(topic, partition >= 0), not {item!r}")


def _tp_list(items: Iterable[Any], what: str) -> list[TopicPartition]:
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise InvalidRequestError(f"{what} takes TopicPartitions, not {items!r}")
    return list(dict.fromkeys(_tp(item) for item in items))


def _tp_map(items: Mapping[Any, V], what: str) -> dict[TopicPartition, V]:
    if not isinstance(items, Mapping):
        raise InvalidRequestError(f"{what} takes a mapping of TopicPartition to a value")
    return {_tp(k): v for k, v in items.items()}


def _config_value(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise InvalidConfigError(f"config '{name}': value {value!r} is not a str, int, float or bool")


def _configs(config: Mapping[str, ConfigValue] | None) -> dict[str, str]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise InvalidConfigError(f"configs must be a mapping of name to value, not {config!r}")
    out = {}
    for name, value in config.items():
        if not isinstance(name, str) or not name:
            raise InvalidConfigError(f"config names must be non-empty strings, not {name!r}")
        out[name] = _config_value(name, value)
    return out


def _replicas(replicas: object, what: str) -> list[int]:
    if isinstance(replicas, str | bytes) or not isinstance(replicas, Iterable):
        raise InvalidReplicaAssignmentError(f"{what}: replicas must be a list of node ids")
    out = list(replicas)
    if not out or not all(_is_int(r) and r >= 0 for r in out):
        raise InvalidReplicaAssignmentError(
            f"{what}: replicas must be a non-empty list of node ids, not {out!r}"
        )
    return out


def _assignments(
    assignment: Assignment | None, topic: str
) -> list[controller_pb2.ReplicaAssignment]:
    if assignment is None:
        return []
    if isinstance(assignment, Mapping):
        items = list(assignment.items())
    elif isinstance(assignment, Sequence) and not isinstance(assignment, str | bytes):
        items = list(enumerate(assignment))
    else:
        raise InvalidReplicaAssignmentError(
            f"topic {topic!r}: replica_assignment must map partition -> node ids"
        )
    out = []
    for partition, replicas in items:
        if not _is_int(partition) or partition < 0:
            raise InvalidReplicaAssignmentError(
                f"topic {topic!r}: partition {partition!r} in replica_assignment is not an index"
            )
        out.append(
            controller_pb2.ReplicaAssignment(
                partition=partition, replicas=_replicas(replicas, f"{topic}-{partition}")
            )
        )
    return sorted(out, key=lambda a: a.partition)


def _offset_spec(tp: TopicPartition, spec: object) -> int:
    if isinstance(spec, str):
        try:
            return _SPECIAL_OFFSETS[spec]
        except KeyError:
            pass
    elif isinstance(spec, datetime):
        try:
            return datetime_ms(spec)  # naive: local time
        except ValueError as exc:
            raise InvalidRequestError(f"{tp.topic}-{tp.partition}: {exc}") from None
    elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= -3:
        return spec  # (-1, -2, -3: Kafka's ListOffsets numbers for latest, earliest, max)
    raise InvalidRequestError(
        f"{tp.topic}-{tp.partition}: offset spec {spec!r} is not 'earliest' (-2), 'latest' "
        "(-1), 'max_timestamp' (-3), a timestamp in ms since the epoch (>= 0) or a datetime"
    )


# ---------------------------------------------------------------------------------------------
# Error context


def _names_item(message: str, names: Sequence[str]) -> bool:
    return any(n in message for n in names)


def _with_context(exc: StromError, context: str, *names: str) -> StromError:
    """The same error, its message prefixed with ``context`` unless it already names the item
    (server messages mostly do: "topic 'x' already exists")."""
    if _names_item(exc.message, names or (context,)):
        return exc
    new = type(exc)(f"{context}: {exc.message}", code=exc.code, retriable=exc.retriable)
    new.__cause__ = exc.__cause__
    return new


def _item_error(code: int, message: str, context: str, *names: str) -> StromError:
    return _with_context(error_for(code, message or None), context, *names)


def _topic_error(code: int, message: str, topic: str) -> StromError:
    return _item_error(code, message, f"topic {topic!r}", repr(topic), f'"{topic}"')


def _partition_error(code: int, message: str, tp: TopicPartition) -> StromError:
    return _item_error(code, message, f"{tp.topic}-{tp.partition}", f"{tp.topic}-{tp.partition}")


def _raise_first(failures: Sequence[tuple[str, StromError]]) -> None:
    """Raise the first failure; its message lists the others (which the server also refused,
    while every item not listed took effect)."""
    if not failures:
        return
    _, first = failures[0]
    if len(failures) == 1:
        raise first
    others = [label for label, _ in failures[1:]]
    shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
    raise type(first)(
        f"{first.message} (also failed: {shown})", code=first.code, retriable=first.retriable
    ) from first


def _listing(labels: Sequence[str]) -> str:
    """Up to five labels, then how many there are in all."""
    more = f", ... ({len(labels)} in all)" if len(labels) > 5 else ""
    return ", ".join(labels[:5]) + more


def _raise_partial(
    wanted: Iterable[TopicPartition],
    done: Mapping[TopicPartition, Any],
    failed: Mapping[TopicPartition, StromError],
) -> None:
    """Raise the first partition refused (in the caller's order) as a PartialResultError of
    its own class carrying every result and every error; its message lists the others
    refused and the partitions done (whose result, e.g. a deletion, took effect). Found
    from outside: ``delete_records`` over several partitions reported only the refusal, and
    the deletions done were neither returned nor said."""
    order = list(wanted)
    refused = [tp for tp in order if tp in failed]
    if not refused:
        return
    first = failed[refused[0]]
    notes = []
    if len(refused) > 1:
        notes.append(
            "also failed: " + _listing([f"{tp.topic}-{tp.partition}" for tp in refused[1:]])
        )
    succeeded = [tp for tp in order if tp in done]
    if succeeded:
        notes.append("done: " + _listing([f"{tp.topic}-{tp.partition}" for tp in succeeded]))
    message = f"{first.message} ({'; '.join(notes)})" if notes else first.message
    results = {tp: done[tp] for tp in succeeded}
    errors = {tp: failed[tp] for tp in refused}
    raise partial_result_error(first, message, results, errors) from first


def _partition_info(p: controller_pb2.PartitionDescription) -> PartitionInfo:
    if not p.HasField("state"):
        # The partition key is missing (being written, or lost): say so rather than invent 0s.
        return PartitionInfo(p.partition, None, -1, (), (), tuple(p.offline_replicas))
    s = p.state
    return PartitionInfo(
        partition=p.partition,
        leader=s.leader if s.leader >= 0 else None,
        leader_epoch=s.leader_epoch,
        replicas=tuple(s.replicas),
        isr=tuple(s.isr),
        offline_replicas=tuple(p.offline_replicas),
        adding_replicas=tuple(s.adding_replicas),
        removing_replicas=tuple(s.removing_replicas),
        partition_epoch=s.partition_epoch,
        recovering=s.leader_recovery_state == metadata_pb2.LEADER_RECOVERY_STATE_RECOVERING,
        original_replicas=tuple(s.original_replicas),
    )


def _replication_factor(configured: int, partitions: tuple[PartitionInfo, ...]) -> int:
    """The first partition's replica count, as Kafka's describe shows it: reassignments change
    it while the topic keeps the count chosen at creation. During a move the replicas being
    added do not count yet. ``configured`` when no partition state is known."""
    for p in partitions:
        if p.replicas:
            adding = set(p.adding_replicas)
            return sum(1 for r in p.replicas if r not in adding)
    return configured


def _topic_description(t: controller_pb2.TopicDescription) -> TopicDescription:
    m = t.metadata
    partitions = tuple(_partition_info(p) for p in sorted(t.partitions, key=lambda p: p.partition))
    return TopicDescription(
        name=t.name,
        topic_id=m.topic_id,
        internal=m.internal or t.name.startswith("__"),
        replication_factor=_replication_factor(m.replication_factor, partitions),
        partitions=partitions,
        configs=dict(sorted(m.configs.items())),
        created_ms=m.created_ms,
    )


def _node(n: common_pb2.Node | None) -> Node | None:
    if n is None or n.node_id < 0 or not n.port:
        return None
    return Node(n.node_id, n.host, n.port, n.rack if n.HasField("rack") else None)


def _config_entries(configs: Iterable[Any]) -> dict[str, ConfigEntry]:
    """A DescribeConfigs result's entries by name (topics' and nodes' alike)."""
    return {
        c.name: ConfigEntry(
            name=c.name,
            value=c.value if c.HasField("value") else None,
            source=_SOURCES.get(c.source, ConfigSource.UNKNOWN),
            read_only=c.read_only,
            sensitive=c.sensitive,
            documentation=c.documentation,
        )
        for c in configs
    }


# ---------------------------------------------------------------------------------------------
# The client


class Admin:
    """Administration of a strom cluster (see the module docstring for the error rules).

    Args:
        bootstrap: ``"host:port,host:port"`` or a list of storage node addresses; None reads
            ``$STROM_BOOTSTRAP``.
        request_timeout_ms: how long one attempt of a call may take (Kafka's
            ``request.timeout.ms``): the deadline of each RPC to the controller or to a
            partition leader. Default 30000 (Kafka's), or the ``cluster_client``'s
            ``timeout_s``. Half the default overall timeout, so that an attempt against a
            controller or leader that hangs (a stopped process, a long GC pause, a network
            partition) gives up while the call still has time to retry against the one that
            took over (within seconds: the services' session timeout); far above the longest
            wait the servers do on their own (the controller's 10 s for its cluster view), so
            that a slow but working controller is not asked twice (see below).
        default_api_timeout_ms: how long one call may take overall, retries included
            (Kafka's ``default.api.timeout.ms``): waiting for a controller election or a
            leader move counts. Default 60000, or the ``cluster_client``'s ``retry_s``, and
            never less than ``request_timeout_ms`` unless given.
        client_id: the name the servers see for this client (sent as the gRPC user agent).
        cluster_client: share an existing :class:`ClusterClient` (its channels and metadata)
            instead of opening one; ``close()`` then leaves it open.

    A call that a server ran but whose answer did not arrive in time is retried like one
    that never arrived. For reads and for idempotent writes (configs, elections, deleting
    records) that is harmless; ``create_topics`` and ``create_partitions`` retried after
    their first attempt created the topic or partitions raise TopicAlreadyExistsError or
    InvalidPartitionsError for what the call itself did (Kafka's admin client has the same
    limit); a ``request_timeout_ms`` well above the controller's waits keeps that rare (a
    single attempt of the same length would have failed anyway).
    """

    @kafka_keywords
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        request_timeout_ms: int | None = None,
        default_api_timeout_ms: int | None = None,
        client_id: str = "strom-admin",
        cluster_client: ClusterClient | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        token: str | None = None,
    ) -> None:
        for name, value in (
            ("request_timeout_ms", request_timeout_ms),
            ("default_api_timeout_ms", default_api_timeout_ms),
        ):
            if value is not None and (not _is_int(value) or value <= 0):
                raise InvalidRequestError(f"{name} must be a positive integer, not {value!r}")
        if request_timeout_ms is None:
            request_timeout_ms = (
                DEFAULT_REQUEST_TIMEOUT_MS
                if cluster_client is None
                else max(1, round(cluster_client.timeout_s * 1000))
            )
        if default_api_timeout_ms is None:
            # As Kafka: a per-attempt timeout above the default overall one raises the latter.
            default_api_timeout_ms = max(
                request_timeout_ms,
                DEFAULT_API_TIMEOUT_MS
                if cluster_client is None
                else max(1, round(cluster_client.retry_s * 1000)),
            )
        elif default_api_timeout_ms < request_timeout_ms:
            raise InvalidRequestError(
                f"default_api_timeout_ms ({default_api_timeout_ms}) must be at least "
                f"request_timeout_ms ({request_timeout_ms}): it bounds every attempt of a call"
            )
        self.request_timeout_ms = request_timeout_ms
        self.default_api_timeout_ms = default_api_timeout_ms
        self.client_id = client_id
        self._owned = cluster_client is None
        if cluster_client is None:
            try:
                cluster_client = ClusterClient(
                    bootstrap,
                    timeout_s=request_timeout_ms / 1000,
                    retry_s=default_api_timeout_ms / 1000,
                    client_id=client_id,
                    security=client_security(ssl_cafile, ssl_certfile, ssl_keyfile, token),
                )
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
        self._client = cluster_client
        self._closed = False
        forks.track(self)

    # The servers' own waits (e.g. for a deletion to reach every replica) get part of an
    # attempt's budget, so they answer before this client's deadline cuts the attempt.
    @property
    def _server_wait_ms(self) -> int:
        return max(1, self.request_timeout_ms * 4 // 5)

    def _ensure_open(self) -> None:
        if self._forked_from:
            raise forks.error(self)
        if self._closed:
            raise StromError("the Admin client is closed")

    def close(self) -> None:
        """Close the connections (unless the ClusterClient was passed in). Idempotent."""
        if not self._closed:
            self._closed = True
            if self._owned:
                self._client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _controller(self, method: str, request: Any) -> Any:
        self._ensure_open()
        return self._client.controller_call(
            method,
            request,
            timeout_s=self.request_timeout_ms / 1000,
            retry_s=self.default_api_timeout_ms / 1000,
        )

    # -- topics ------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, ConfigValue] | None = None,
        *,
        replica_assignment: Assignment | None = None,
        validate_only: bool = False,
    ) -> CreateTopicResult:
        """Create a topic; None counts take the cluster defaults.

        Raises TopicAlreadyExistsError, InvalidTopicError, InvalidPartitionsError,
        InvalidReplicationFactorError (more replicas than live nodes), InvalidConfigError, ...
        With ``validate_only`` nothing is created, but the result shows the counts it would get.
        """
        topic = NewTopic(
            _topic_name(name), partitions, replication_factor, config or {}, replica_assignment
        )
        return self.create_topics([topic], validate_only=validate_only)[name]

    def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, CreateTopicResult]:
        """Create several topics in one request; raises the first failure (the others are
        created anyway)."""
        items = []
        for t in new_topics:
            if not isinstance(t, NewTopic):
                raise InvalidRequestError(f"create_topics takes NewTopic items, not {t!r}")
            name = _topic_name(t.name)
            assignments = _assignments(t.replica_assignment, name)
            if assignments and (t.partitions is not None or t.replication_factor is not None):
                raise InvalidReplicaAssignmentError(
                    f"topic {name!r}: give either replica_assignment or partitions and "
                    "replication_factor, not both"
                )
            items.append(
                controller_pb2.CreatableTopic(
                    name=name,
                    num_partitions=_count(
                        t.partitions, f"topic {name!r}: partitions", InvalidPartitionsError
                    ),
                    replication_factor=_count(
                        t.replication_factor,
                        f"topic {name!r}: replication_factor",
                        InvalidReplicationFactorError,
                    ),
                    assignments=assignments,
                    configs=_configs(t.config),
                )
            )
        _topic_names([i.name for i in items], "create_topics")
        if not items:
            return {}
        resp = self._controller(
            "CreateTopics",
            controller_pb2.CreateTopicsRequest(
                topics=items,
                timeout_ms=self._server_wait_ms,
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        out: dict[str, CreateTopicResult] = {}
        failures = []
        for r in resp.topics:
            if r.error_code != NONE:
                failures.append((r.name, _topic_error(r.error_code, r.error_message, r.name)))
            else:
                out[r.name] = CreateTopicResult(
                    r.name, r.topic_id, r.num_partitions, r.replication_factor
                )
        _raise_first(failures)
        return out

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data (UnknownTopicOrPartitionError if there is none)."""
        self.delete_topics([name])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete several topics; raises the first failure (the others are deleted anyway)."""
        topics = _topic_names(names, "delete_topics")
        if not topics:
            return
        resp = self._controller(
            "DeleteTopics",
            controller_pb2.DeleteTopicsRequest(topics=topics, timeout_ms=self._server_wait_ms),
        )
        _raise_first(
            [
                (r.name, _topic_error(r.error_code, r.error_message, r.name))
                for r in resp.topics
                if r.error_code != NONE
            ]
        )

    def list_topics(self, internal: bool = False) -> dict[str, TopicListing]:
        """Topics by name, sorted; internal ones (``__consumer_offsets``) only if asked.

        A dict so that ``"orders" in admin.list_topics()`` and ``list(admin.list_topics())``
        read like a list of names while the id and partition count are at hand.
        """
        resp = self._controller(
            "ListTopics",
            controller_pb2.ListTopicsRequest(include_internal=bool_option("internal", internal)),
        )
        return {
            t.name: TopicListing(t.name, t.topic_id, t.partition_count, t.internal)
            for t in sorted(resp.topics, key=lambda t: t.name)
        }

    def describe_topic(self, name: str) -> TopicDescription:
        """Topic id, overrides and every partition's leader, ISR and reassignment state."""
        return self.describe_topics([name])[name]

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Several topics by name (None = every topic, internal ones included, sorted); raises
        the first unknown one."""
        topics = [] if names is None else _topic_names(names, "describe_topics")
        if names is not None and not topics:
            return {}
        resp = self._controller(
            "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=topics)
        )
        _raise_first(
            [
                (t.name, _topic_error(t.error_code, t.error_message, t.name))
                for t in resp.topics
                if t.error_code != NONE
            ]
        )
        found = {t.name: _topic_description(t) for t in resp.topics}
        order = topics or sorted(found)
        return {n: found[n] for n in order if n in found}

    def create_partitions(
        self,
        name: str,
        new_total: int,
        *,
        replica_assignment: Mapping[int, Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Grow a topic to ``new_total`` partitions (counts only grow: InvalidPartitionsError).

        Keys already written keep their partitions, so per-key order across the change is not
        kept for keyed records (as in Kafka). ``replica_assignment`` places the new partitions
        only, keyed by their partition numbers, not by a 0-based index among the new ones:
        growing from 1 to 3 partitions takes ``{1: [3, 1], 2: [1, 2]}`` (node ids, preferred
        leader first; every new partition listed, each with the topic's replication factor).
        """
        topic = _topic_name(name)
        total = _count(
            new_total,
            f"topic {topic!r}: new partition count",
            InvalidPartitionsError,
            default_ok=False,
        )
        if replica_assignment is not None and not isinstance(replica_assignment, Mapping):
            raise InvalidReplicaAssignmentError(
                f"topic {topic!r}: replica_assignment must map each new partition's number "
                "-> node ids"
            )
        resp = self._controller(
            "CreatePartitions",
            controller_pb2.CreatePartitionsRequest(
                topics=[
                    controller_pb2.CreatePartitionsTopic(
                        name=topic,
                        count=total,
                        assignments=_assignments(replica_assignment, topic),
                    )
                ],
                timeout_ms=self._server_wait_ms,
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        _raise_first(
            [
                (r.name, _topic_error(r.error_code, r.error_message, r.name))
                for r in resp.topics
                if r.error_code != NONE
            ]
        )

    # -- configs -----------------------------------------------------------------------------

    def describe_configs(
        self,
        topic: str | None = None,
        *,
        node: int | None = None,
        names: Iterable[str] | None = None,
        documentation: bool = False,
    ) -> dict[str, ConfigEntry]:
        """Effective configs of a topic (overrides and defaults) or a storage node (static,
        read-only), by name. ``names`` restricts the result; unknown names are left out."""
        if (topic is None) == (node is None):
            raise InvalidRequestError("describe_configs needs exactly one of topic= or node=")
        if topic is not None:
            res = controller_pb2.DescribeConfigsResource(
                resource_type=controller_pb2.RESOURCE_TYPE_TOPIC, resource_name=_topic_name(topic)
            )
            what = f"topic {topic!r}"
        else:
            if not isinstance(node, int) or isinstance(node, bool) or node < 0:
                raise InvalidRequestError(f"node must be a node id (int >= 0), not {node!r}")
            res = controller_pb2.DescribeConfigsResource(
                resource_type=controller_pb2.RESOURCE_TYPE_NODE, resource_name=str(node)
            )
            what = f"node {node}"
        if names is not None:
            if isinstance(names, str):
                names = [names]
            res.config_names.extend(names)
        resp = self._controller(
            "DescribeConfigs",
            controller_pb2.DescribeConfigsRequest(
                resources=[res],
                include_documentation=bool_option("documentation", documentation),
            ),
        )
        out: dict[str, ConfigEntry] = {}
        for r in resp.results:
            if r.error_code != NONE:
                raise _with_context(
                    error_for(r.error_code, r.error_message or None),
                    what,
                    repr(r.resource_name) if topic is not None else f"node {r.resource_name}",
                )
            out.update(_config_entries(r.configs))
        return out

    def alter_configs(
        self,
        topic: str,
        set: Mapping[str, ConfigValue] | None = None,  # shadows the builtin: Kafka's op name
        delete: Iterable[str] | None = None,
        *,
        append: Mapping[str, ConfigValue] | None = None,
        subtract: Mapping[str, ConfigValue] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Change a topic's configs incrementally, all or nothing: ``set`` overrides values,
        ``delete`` removes overrides (the default applies again), ``append`` / ``subtract`` add
        or remove items of list configs (``cleanup.policy``). Other configs stay as they are.

        Unknown names and invalid values raise InvalidConfigError naming the config.
        """
        name = _topic_name(topic)
        ops: list[controller_pb2.AlterableConfig] = []
        seen: dict[str, str] = {}

        def add(key: str, op: int, value: str | None, how: str) -> None:
            if not isinstance(key, str) or not key:
                raise InvalidConfigError(f"config names must be non-empty strings, not {key!r}")
            if key in seen:
                raise InvalidRequestError(
                    f"topic {name!r}: config '{key}' is given to both {seen[key]} and {how}"
                )
            seen[key] = how
            entry = controller_pb2.AlterableConfig(name=key, op=op)
            if value is not None:
                entry.value = value
            ops.append(entry)

        for how, op, values in (
            ("set", controller_pb2.ALTER_CONFIG_OP_SET, set),
            ("append", controller_pb2.ALTER_CONFIG_OP_APPEND, append),
            ("subtract", controller_pb2.ALTER_CONFIG_OP_SUBTRACT, subtract),
        ):
            for key, value in _configs(values).items():
                add(key, op, value, how)
        if isinstance(delete, str):
            delete = [delete]
        for key in delete or []:
            add(key, controller_pb2.ALTER_CONFIG_OP_DELETE, None, "delete")
        resp = self._controller(
            "AlterConfigs",
            controller_pb2.AlterConfigsRequest(
                resources=[
                    controller_pb2.AlterConfigsResource(
                        resource_type=controller_pb2.RESOURCE_TYPE_TOPIC,
                        resource_name=name,
                        configs=ops,
                    )
                ],
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        _raise_first(
            [
                (r.resource_name, _topic_error(r.error_code, r.error_message, r.resource_name))
                for r in resp.results
                if r.error_code != NONE
            ]
        )

    def describe_node_configs(self, *, documentation: bool = False) -> dict[str, ConfigEntry]:
        """The dynamic configs every storage node applies (Kafka's default broker configs):
        the replication throttle rates, ``leader.replication.throttled.rate`` and
        ``follower.replication.throttled.rate`` (bytes/s; ``value`` None when unset: no
        limit)."""
        resp = self._controller(
            "DescribeConfigs",
            controller_pb2.DescribeConfigsRequest(
                resources=[
                    controller_pb2.DescribeConfigsResource(
                        resource_type=controller_pb2.RESOURCE_TYPE_NODE, resource_name=""
                    )
                ],
                include_documentation=bool_option("documentation", documentation),
            ),
        )
        out: dict[str, ConfigEntry] = {}
        for r in resp.results:
            if r.error_code != NONE:
                raise error_for(r.error_code, r.error_message or None)
            out.update(_config_entries(r.configs))
        return out

    def alter_node_configs(
        self,
        set: Mapping[str, ConfigValue] | None = None,  # shadows the builtin: Kafka's op name
        delete: Iterable[str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Change the dynamic configs of every storage node, all or nothing: today the
        replication throttle rates of reassignments (``leader.replication.throttled.rate``,
        ``follower.replication.throttled.rate``, bytes/s >= 1; ``delete`` removes a limit).
        Which replicas they apply to is the topics' ``*.replication.throttled.replicas``
        (``alter_configs``). An unknown name or bad value raises InvalidConfigError."""
        ops: list[controller_pb2.AlterableConfig] = []
        for key, value in _configs(set).items():
            ops.append(
                controller_pb2.AlterableConfig(
                    name=key, op=controller_pb2.ALTER_CONFIG_OP_SET, value=value
                )
            )
        if isinstance(delete, str):
            delete = [delete]
        for key in delete or []:
            if not isinstance(key, str) or not key:
                raise InvalidConfigError(f"config names must be non-empty strings, not {key!r}")
            ops.append(
                controller_pb2.AlterableConfig(name=key, op=controller_pb2.ALTER_CONFIG_OP_DELETE)
            )
        resp = self._controller(
            "AlterConfigs",
            controller_pb2.AlterConfigsRequest(
                resources=[
                    controller_pb2.AlterConfigsResource(
                        resource_type=controller_pb2.RESOURCE_TYPE_NODE,
                        resource_name="",
                        configs=ops,
                    )
                ],
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        for r in resp.results:
            if r.error_code != NONE:
                raise error_for(r.error_code, r.error_message or None)

    # -- cluster -----------------------------------------------------------------------------

    def describe_cluster(self, *, include_coordinators: bool = False) -> ClusterDescription:
        """Cluster id, active controller and live storage nodes (with rack and state); with
        ``include_coordinators``, the coordinator owning each consumer-group shard."""
        resp = self._controller(
            "DescribeCluster",
            controller_pb2.DescribeClusterRequest(
                include_coordinators=bool_option("include_coordinators", include_coordinators)
            ),
        )
        nodes = tuple(
            NodeInfo(
                node_id=n.node_id,
                host=n.host,
                port=n.port,
                rack=n.rack if n.HasField("rack") else None,
                state=_NODE_STATES.get(n.state, NodeState.STARTING),
                metrics_port=n.metrics_port,
                software_version=n.software_version,
                start_time_ms=n.start_time_ms,
                incarnation_id=n.incarnation_id,
            )
            for n in sorted(resp.nodes, key=lambda n: n.node_id)
        )
        coordinators = {
            s.shard: Node(s.coordinator_id, s.host, s.port)
            for s in sorted(resp.coordinator_shards, key=lambda s: s.shard)
        }
        return ClusterDescription(
            cluster_id=resp.cluster_id,
            controller=_node(resp.controller if resp.HasField("controller") else None),
            controller_epoch=resp.controller_epoch,
            nodes=nodes,
            coordinators=coordinators,
        )

    # -- offsets and records (partition leaders) ---------------------------------------------

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Look offsets up on each partition's leader (one request per leader).

        "earliest" is the log start offset, "latest" the offset the next committed record will
        get (the high watermark), both with timestamp -1; Kafka's numbers for them, -2 and -1
        (and -3 for "max_timestamp"), are taken too. A time gives the first record at or
        after it and that record's timestamp, "max_timestamp" the largest timestamp and the
        offset of the first record holding it (as Kafka 3.8+); when no record matches, the
        partition maps to None (as Kafka's ``offsets_for_times``). With "read_committed", a
        record at or after the last stable offset does not match yet.

        A partition that cannot be looked up (no live leader within the call's timeout, an
        unknown partition) does not lose the others' answers: the error raised, of its own
        class, is a PartialResultError too, with ``results`` and ``errors`` by partition.
        """
        if isolation_level not in _ISOLATION:
            raise InvalidRequestError(
                f"isolation_level must be one of {', '.join(_ISOLATION)}, not {isolation_level!r}"
            )
        wanted = {tp: _offset_spec(tp, s) for tp, s in _tp_map(specs, "list_offsets").items()}

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.ListOffsetsRequest:
            req = storage_pb2.ListOffsetsRequest(
                replica_id=-1, isolation_level=_ISOLATION[isolation_level]
            )
            for topic, parts in _by_topic(group).items():
                req.topics.add(
                    topic=topic,
                    partitions=[
                        storage_pb2.ListOffsetsPartition(
                            partition=p, current_leader_epoch=-1, timestamp=ts
                        )
                        for p, ts in parts
                    ],
                )
            return req

        def results(
            resp: storage_pb2.ListOffsetsResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, OffsetAndTimestamp | None]]:
            for t in resp.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.topic, p.partition)
                    value = OffsetAndTimestamp(p.offset, p.timestamp) if p.offset >= 0 else None
                    yield tp, p.error_code, p.error_message, value

        return self._per_leader(wanted, "ListOffsets", request, results)

    def delete_records(
        self, before: Mapping[TopicPartition, int | Literal["latest"]]
    ) -> dict[TopicPartition, int]:
        """Delete every record below the given offset of each partition; returns each
        partition's new low watermark (its first readable offset). "latest" (or -1, as in
        Kafka's DeleteRecords) deletes everything committed. An offset above the high
        watermark raises OffsetOutOfRangeError, a topic whose cleanup.policy lacks "delete"
        PolicyViolationError (as Kafka). Offsets are never reused: the next record still
        gets the next offset.

        Each partition is deleted on its own: when some are refused, the others are still
        deleted, and the error raised (of the first refusal's class) is a
        PartialResultError too, whose ``results`` holds the new low watermark of each
        partition deleted and ``errors`` the error of each refused."""
        wanted: dict[TopicPartition, int] = {}
        for tp, offset in _tp_map(before, "delete_records").items():
            if offset == "latest" or (offset == -1 and not isinstance(offset, bool)):
                wanted[tp] = -1
            elif isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
                wanted[tp] = offset
            else:
                raise InvalidRequestError(
                    f"{tp.topic}-{tp.partition}: delete_records takes an offset >= 0 or "
                    f"'latest' / -1 (everything committed), not {offset!r}"
                )

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.DeleteRecordsRequest:
            req = storage_pb2.DeleteRecordsRequest(timeout_ms=self._server_wait_ms)
            for topic, parts in _by_topic(group).items():
                req.topics.add(
                    topic=topic,
                    partitions=[
                        storage_pb2.DeleteRecordsPartition(partition=p, offset=o) for p, o in parts
                    ],
                )
            return req

        def results(
            resp: storage_pb2.DeleteRecordsResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, int]]:
            for t in resp.topics:
                for p in t.partitions:
                    yield (
                        TopicPartition(t.topic, p.partition),
                        p.error_code,
                        p.error_message,
                        p.low_watermark,
                    )

        return self._per_leader(wanted, "DeleteRecords", request, results)

    def _per_leader(
        self,
        wanted: Mapping[TopicPartition, int],
        method: str,
        request: Callable[[Mapping[TopicPartition, int]], Any],
        results: Callable[[Any], Iterable[tuple[TopicPartition, int, str, T]]],
    ) -> dict[TopicPartition, T]:
        """Send one request per partition leader (concurrently), and retry the partitions
        whose leader moved, is not known yet or did not answer, until the call's overall
        timeout; raise the first partition that still failed, in the caller's order, as a
        PartialResultError that also carries every partition's result or error.

        Each attempt gets ``request_timeout_ms`` (or what is left of the overall timeout): a
        leader that hangs is given up on in time to ask the metadata again and retry at the
        replica that took over (found from outside: one attempt used to take it all)."""
        self._ensure_open()
        client = self._client
        attempt_s = self.request_timeout_ms / 1000
        deadline = time.monotonic() + self.default_api_timeout_ms / 1000
        done: dict[TopicPartition, T] = {}
        failed: dict[TopicPartition, StromError] = {}
        pending = dict(wanted)
        refresh = False
        while pending:
            last_round = time.monotonic() >= deadline
            retry: dict[TopicPartition, StromError] = {}
            groups: dict[str, dict[TopicPartition, int]] = {}
            # One metadata lookup per topic (an unknown topic fails all its partitions at once).
            topic_errors: dict[str, StromError] = {}
            for topic in dict.fromkeys(tp.topic for tp in pending):
                try:
                    # Fills the client's metadata cache (strom.client.metadata).
                    client.topic_metadata(topic, refresh=refresh)
                except StromError as exc:
                    topic_errors[topic] = exc
            for tp, arg in pending.items():
                error = topic_errors.get(tp.topic)
                if error is None:
                    try:
                        addr = client.leader_of(tp.topic, tp.partition)
                    except StromError as exc:
                        error = exc
                    else:
                        groups.setdefault(addr, {})[tp] = arg
                        continue
                err = _with_context(error, f"{tp.topic}-{tp.partition}")
                if error.retriable and not last_round:
                    retry[tp] = err
                else:
                    failed[tp] = err
            timeout = attempt_timeout(attempt_s, deadline)
            calls = {
                addr: getattr(client.storage(addr), method).future(request(group), timeout=timeout)
                for addr, group in groups.items()
            }
            for addr, call in calls.items():
                group = groups[addr]
                try:
                    resp = call.result()
                except grpc.RpcError as exc:
                    code = exc.code()
                    transient = code in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    cls = BrokerNotAvailableError if transient else UnknownServerError
                    old = older_node(exc, addr, method)
                    for tp in group:
                        if old is not None:
                            err = _with_context(old, f"{tp.topic}-{tp.partition}")
                        else:
                            err = cls(
                                f"{tp.topic}-{tp.partition}: {method} at leader {addr} failed: "
                                f"{code.name} {exc.details() or ''}".rstrip()
                            )
                        if transient and not last_round:
                            retry[tp] = err
                        else:
                            failed[tp] = err
                    continue
                answered: set[TopicPartition] = set()
                for tp, code, message, value in results(resp):
                    if tp not in group:
                        continue
                    answered.add(tp)
                    if code == NONE:
                        done[tp] = value
                    elif is_retriable(code) and not last_round:
                        retry[tp] = _partition_error(code, message, tp)
                    else:
                        failed[tp] = _partition_error(code, message, tp)
                for tp in group.keys() - answered:
                    failed[tp] = UnknownServerError(
                        f"{tp.topic}-{tp.partition}: leader {addr} did not answer for it"
                    )
            pending = {tp: wanted[tp] for tp in retry}
            if pending:
                if time.monotonic() >= deadline:
                    failed.update(retry)
                    break
                refresh = True
                time.sleep(0.1)
        _raise_partial(wanted, done, failed)
        return {tp: done[tp] for tp in wanted}

    # -- transactions ------------------------------------------------------------------------

    def fence_producers(
        self, transactional_ids: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """Fence the producers of ``transactional_ids``, as Kafka's ``Admin.fenceProducers``.

        Each id's epoch is bumped (InitProducerId, what a new producer instance with that id
        does): a transaction it left open is aborted, so read_committed readers stop waiting
        at it, and a producer still running with the old epoch is refused from then on. For
        a transaction left by a killed process (a Spark task, a crashed service) that would
        otherwise hold the last stable offset back until ``transaction_timeout_ms`` passes.
        Returns ``{id: (producer id, new epoch)}``; raises the first failure (the other ids
        are fenced anyway).
        """
        self._ensure_open()
        ids = list(dict.fromkeys(transactional_ids))
        for tid in ids:
            if not isinstance(tid, str) or not tid:
                raise InvalidRequestError(f"a transactional id must be a non-empty string: {tid!r}")
        timeout_s = self.default_api_timeout_ms / 1000 if timeout is None else timeout

        def fence(tid: str) -> tuple[int, int]:
            mgr = TransactionManager(
                self._client,
                tid,
                FENCE_TRANSACTION_TIMEOUT_MS,
                request_timeout_s=min(self.request_timeout_ms / 1000, timeout_s),
                retry_backoff_s=0.05,
            )
            return mgr.init(timeout_s)

        out: dict[str, tuple[int, int]] = {}
        failures: list[tuple[str, StromError]] = []
        with ThreadPoolExecutor(max(1, min(8, len(ids))), "strom-admin-fence") as pool:
            for tid, future in [(tid, pool.submit(fence, tid)) for tid in ids]:
                try:
                    out[tid] = future.result()
                except StromError as exc:
                    failures.append((tid, exc))
        _raise_first(failures)
        return out

    def describe_producers(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition's leader keeps state for, by producer id (Kafka's
        ``Admin.describeProducers``): a producer with ``current_transaction_start_offset``
        set has a transaction open there, holding read_committed readers at that offset."""
        wanted = {tp: 0 for tp in _tp_list(partitions, "describe_producers")}

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.DescribeProducersRequest:
            return storage_pb2.DescribeProducersRequest(
                topics=[
                    common_pb2.TopicPartitions(topic=t, partitions=[p for p, _ in parts])
                    for t, parts in _by_topic(group).items()
                ]
            )

        def results(
            resp: storage_pb2.DescribeProducersResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, list[ProducerState]]]:
            for t in resp.topics:
                for p in t.partitions:
                    states = [
                        ProducerState(
                            e.producer_id,
                            e.producer_epoch,
                            e.last_sequence,
                            e.last_timestamp_ms,
                            e.coordinator_epoch,
                            None if e.current_txn_start_offset < 0 else e.current_txn_start_offset,
                        )
                        for e in p.producers
                    ]
                    yield (
                        TopicPartition(t.topic, p.partition),
                        p.error_code,
                        p.error_message,
                        states,
                    )

        return self._per_leader(wanted, "DescribeProducers", request, results)

    def abort_transaction(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> None:
        """Write an abort marker for ``producer_id`` to ``tp`` (Kafka's
        ``Admin.abortTransaction``, KIP-664): ends a hanging transaction — one no transaction
        coordinator will end — that holds every read_committed reader of the partition. Take
        the producer's epoch and coordinator epoch from :meth:`describe_producers`; aborting a
        transaction its coordinator still tracks makes it fail at commit. Needs the
        cluster-action permission when ACLs are on (it is the coordinator's own call)."""
        (tp,) = _tp_list([tp], "abort_transaction")
        for name, value in (("producer_id", producer_id), ("producer_epoch", producer_epoch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequestError(f"abort_transaction: {name} must be an int >= 0")

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.WriteTxnMarkersRequest:
            req = storage_pb2.WriteTxnMarkersRequest(timeout_ms=self._server_wait_ms)
            req.markers.add(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                committed=False,
                coordinator_epoch=max(coordinator_epoch, 0),
                topics=[
                    common_pb2.TopicPartitions(topic=t, partitions=[p for p, _ in parts])
                    for t, parts in _by_topic(group).items()
                ],
            )
            return req

        def results(
            resp: storage_pb2.WriteTxnMarkersResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, None]]:
            for m in resp.markers:
                for t in m.topics:
                    for p in t.partitions:
                        yield (
                            TopicPartition(t.topic, p.partition),
                            p.error_code,
                            p.error_message,
                            None,
                        )

        self._per_leader({tp: 0}, "WriteTxnMarkers", request, results)

    # -- leaders and reassignments -----------------------------------------------------------

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
                    tps.append(_tp(item))
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
                error = _partition_error(r.error_code, r.error_message, tp)
                if isinstance(error, UnknownTopicOrPartitionError):
                    unknown.append((f"{tp.topic}-{tp.partition}", error))
            out[tp] = ElectionResult(r.leader if r.leader >= 0 else None, r.leader_epoch, error)
        _raise_first(unknown)
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
        for tp, replicas in _tp_map(reassignments, "alter_partition_reassignments").items():
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
                        replicas=_replicas(replicas, f"{tp.topic}-{tp.partition}"),
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
            TopicPartition(r.topic, r.partition): _partition_error(
                r.error_code, r.error_message, TopicPartition(r.topic, r.partition)
            )
            for r in resp.partitions
            if r.error_code != NONE
        }
        if len(wanted) == 1 and failed:
            raise next(iter(failed.values()))
        _raise_partial(wanted, {tp: None for tp in wanted if tp not in failed}, failed)

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, Reassignment]:
        """Reassignments in progress (among ``partitions``, or all), sorted by partition."""
        tps = [] if partitions is None else [_tp(p) for p in partitions]
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

    # -- consumer groups (group coordinators) ------------------------------------------------

    def _group_call(
        self, group: str, method: str, req: Any, code_of: Callable[[Any], int] | None = None
    ) -> Any:
        if self._closed:
            raise StromError("the Admin client is closed")
        return group_admin.group_call(
            self._client,
            group,
            method,
            req,
            code_of,
            timeout_s=self.request_timeout_ms / 1000,
            retry_s=self.default_api_timeout_ms / 1000,
        )

    def list_groups(self, states: Iterable[GroupState | str] | None = None) -> list[GroupListing]:
        """Every consumer group (only those in ``states``, e.g. ``["Empty"]``, when given),
        sorted by id, from every group coordinator.

        One pass, not retried: when some coordinator shard has no owner right now or its
        owner does not answer, raises :class:`GroupListingIncompleteError` (retriable), whose
        ``groups`` holds the groups the other shards listed and ``missing_shards`` the shards
        missing. With ACLs on, groups the caller may not describe are left out.
        """
        if self._closed:
            raise StromError("the Admin client is closed")
        if isinstance(states, str):
            raise InvalidRequestError(f"list_groups takes a list of states, not {states!r}")
        try:
            codes = [group_admin.group_state_code(s) for s in states or ()]
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return group_admin.list_groups(
            self._client, codes, timeout_s=self.request_timeout_ms / 1000
        )

    def describe_groups(
        self, group_ids: Iterable[str], *, include_offsets: bool = False
    ) -> dict[str, GroupDescription]:
        """Describe groups: state, epochs, assignor, members with their assignments (and the
        partitions they still have to give up). ``include_offsets`` adds each partition's
        committed offset, log end and lag (a ListOffsets round to the partition leaders).

        A group that does not exist raises GroupIdNotFoundError naming it (the first failed
        group's error, as every Admin call taking several items; the others are listed).
        """
        gids = _group_ids(group_ids, "describe_groups")
        out: dict[str, GroupDescription] = {}
        failures: list[tuple[str, StromError]] = []
        for gid in gids:
            d = group_admin.describe_group(
                self._client,
                gid,
                include_offsets=include_offsets,
                timeout_s=self.request_timeout_ms / 1000,
                retry_s=self.default_api_timeout_ms / 1000,
            )
            if d.error_code != NONE:
                failures.append((gid, _group_error(d.error_code, d.error_message, gid)))
            else:
                out[gid] = group_admin.group_description(d)
        _raise_first(failures)
        return out

    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (the next offset it reads), sorted by partition:
        every committed one, or those of ``partitions``, where a partition with nothing
        committed maps to None (as Kafka's ``listConsumerGroupOffsets``). An unknown group has
        nothing committed. Lag is ``admin.list_offsets({tp: "latest"})`` minus these."""
        gid = _group_id(group_id)
        tps = None if partitions is None else _tp_list(partitions, "list_group_offsets")
        req = coordinator_pb2.OffsetFetchRequest(group_id=gid, member_epoch=-1)
        for topic, parts in _by_topic(dict.fromkeys(tps or ())).items():
            req.topics.add(topic=topic, partitions=sorted(p for p, _ in parts))
        resp = self._group_call(gid, "OffsetFetch", req)
        if resp.error_code != NONE:
            raise _group_error(resp.error_code, resp.error_message, gid)
        out: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(tps or ())
        failures: list[tuple[str, StromError]] = []
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition)
                if p.error_code != NONE:
                    failures.append(
                        (f"{tp.topic}-{tp.partition}", _group_partition_error(p, gid, tp))
                    )
                elif p.committed_offset >= 0:
                    out[tp] = OffsetAndMetadata(
                        p.committed_offset, p.metadata, p.committed_leader_epoch
                    )
        _raise_first(failures)
        return dict(sorted(out.items()))

    def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Set the group's committed offsets (creating the group if it does not exist), as
        Kafka's ``alterConsumerGroupOffsets`` and ``strom groups reset-offsets`` do.

        Only while the group has no members: otherwise NonEmptyGroupError naming the group
        (and nothing changes), since its members would overwrite the new offsets with their
        next commit. The coordinator checks this atomically with the commit. A partition it
        refuses (an unknown topic, metadata too large) raises that partition's error; the
        other partitions were set.
        """
        gid = _group_id(group_id)
        wanted: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, value in _tp_map(offsets, "alter_group_offsets").items():
            om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)  # type: ignore[arg-type]
            if not _is_int(om.offset) or om.offset < 0 or not isinstance(om.metadata, str):
                raise InvalidRequestError(
                    f"{tp.topic}-{tp.partition}: alter_group_offsets takes an offset >= 0 or an "
                    f"OffsetAndMetadata, not {value!r}"
                )
            wanted[tp] = om
        if not wanted:
            return
        req = coordinator_pb2.OffsetCommitRequest(group_id=gid, member_epoch=-1)
        add_offsets(req, wanted)
        resp = self._group_call(gid, "OffsetCommit", req)
        if resp.error_code == ErrorCode.NON_EMPTY_GROUP:
            raise group_admin.non_empty_error(gid)
        if resp.error_code != NONE:
            raise _group_error(resp.error_code, resp.error_message, gid)
        _raise_first(_partition_failures(resp, gid))

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Delete the group's committed offsets of ``partitions`` (Kafka's
        ``deleteConsumerGroupOffsets``). A partition of a topic some member is subscribed to
        keeps its offset and raises GroupSubscribedToTopicError naming it (the others are
        deleted); an unknown group raises GroupIdNotFoundError."""
        gid = _group_id(group_id)
        tps = _tp_list(partitions, "delete_group_offsets")
        if not tps:
            return
        req = coordinator_pb2.DeleteOffsetsRequest(group_id=gid)
        for topic, parts in _by_topic(dict.fromkeys(tps)).items():
            req.topics.add(topic=topic, partitions=sorted(p for p, _ in parts))
        resp = self._group_call(gid, "DeleteOffsets", req)
        if resp.error_code != NONE:
            raise _group_error(resp.error_code, resp.error_message, gid)
        _raise_first(_partition_failures(resp, gid))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups and their committed offsets (Kafka's ``deleteConsumerGroups``).
        Only groups without members: a group with members raises NonEmptyGroupError, an
        unknown one GroupIdNotFoundError, each naming the group (the first failure; the
        message lists the others, and the groups not listed were deleted)."""
        failures: list[tuple[str, StromError]] = []
        for gid in _group_ids(group_ids, "delete_groups"):
            req = coordinator_pb2.DeleteGroupsRequest(group_ids=[gid])
            resp = self._group_call(gid, "DeleteGroups", req, lambda r: r.results[0].error_code)
            r = resp.results[0]
            if r.error_code != NONE:
                failures.append((gid, _group_error(r.error_code, r.error_message, gid)))
        _raise_first(failures)


def _by_topic(group: Mapping[TopicPartition, V]) -> dict[str, list[tuple[int, V]]]:
    out: dict[str, list[tuple[int, V]]] = {}
    for tp, value in group.items():
        out.setdefault(tp.topic, []).append((tp.partition, value))
    return out


def _group_id(group_id: object) -> str:
    if not isinstance(group_id, str) or not group_id:
        raise InvalidGroupIdError(f"a group id must be a non-empty string, not {group_id!r}")
    return group_id


def _group_ids(group_ids: Iterable[str], what: str) -> list[str]:
    if isinstance(group_ids, str) or not isinstance(group_ids, Iterable):
        raise InvalidRequestError(f"{what} takes a list of group ids, not {group_ids!r}")
    return list(dict.fromkeys(_group_id(g) for g in group_ids))


def _group_error(code: int, message: str, group: str) -> StromError:
    return _item_error(code, message, f"group {group!r}", repr(group), f'"{group}"')


def _group_partition_error(p: Any, group: str, tp: TopicPartition) -> StromError:
    where = f"group {group!r}, {tp.topic}-{tp.partition}"
    return _with_context(error_for(p.error_code, p.error_message or None), where, where)


def _partition_failures(resp: Any, group: str) -> list[tuple[str, StromError]]:
    """The refused partitions of an OffsetCommit or DeleteOffsets answer (the same shape)."""
    return [
        (
            f"{t.topic}-{p.partition}",
            _group_partition_error(p, group, TopicPartition(t.topic, p.partition)),
        )
        for t in resp.topics
        for p in t.partitions
        if p.error_code != NONE
    ]
