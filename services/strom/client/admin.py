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

The argument and result types live in :mod:`strom.client.admin_types` (imported from here as
before), the argument checks, error context and answer readers in
:mod:`strom.client.admin_requests`; this module holds the :class:`Admin` class.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import grpc

from strom.api import common_pb2, controller_pb2, coordinator_pb2, metadata_pb2, storage_pb2
from strom.client import forks, group_admin
from strom.client.admin_requests import (
    by_topic,
    checked_group_id,
    checked_group_ids,
    config_entries,
    config_strings,
    group_error,
    group_partition_error,
    is_int,
    node_of,
    offset_spec,
    partition_error,
    partition_failures,
    positive_count,
    raise_first,
    raise_partial,
    replica_assignments,
    replica_list,
    topic_description,
    topic_error,
    topic_name,
    topic_names,
    topic_partition,
    tp_list,
    tp_map,
    with_context,
)
from strom.client.admin_types import (
    Assignment,
    ClusterDescription,
    ConfigEntry,
    ConfigSource,
    ConfigValue,
    CreateTopicResult,
    ElectionResult,
    NewTopic,
    Node,
    NodeInfo,
    NodeState,
    OffsetSpec,
    PartitionInfo,
    ProducerState,
    Reassignment,
    TopicDescription,
    TopicListing,
)
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
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    PartialResultError,
    StromError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for,
    is_retriable,
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

_ISOLATION = {
    "read_uncommitted": storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
    "read_committed": storage_pb2.ISOLATION_LEVEL_READ_COMMITTED,
}

_NODE_STATES = {
    metadata_pb2.NODE_STATE_RUNNING: NodeState.RUNNING,
    metadata_pb2.NODE_STATE_SHUTTING_DOWN: NodeState.SHUTTING_DOWN,
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
            if value is not None and (not is_int(value) or value <= 0):
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
            topic_name(name), partitions, replication_factor, config or {}, replica_assignment
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
            name = topic_name(t.name)
            assignments = replica_assignments(t.replica_assignment, name)
            if assignments and (t.partitions is not None or t.replication_factor is not None):
                raise InvalidReplicaAssignmentError(
                    f"topic {name!r}: give either replica_assignment or partitions and "
                    "replication_factor, not both"
                )
            items.append(
                controller_pb2.CreatableTopic(
                    name=name,
                    num_partitions=positive_count(
                        t.partitions, f"topic {name!r}: partitions", InvalidPartitionsError
                    ),
                    replication_factor=positive_count(
                        t.replication_factor,
                        f"topic {name!r}: replication_factor",
                        InvalidReplicationFactorError,
                    ),
                    assignments=assignments,
                    configs=config_strings(t.config),
                )
            )
        topic_names([i.name for i in items], "create_topics")
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
                failures.append((r.name, topic_error(r.error_code, r.error_message, r.name)))
            else:
                out[r.name] = CreateTopicResult(
                    r.name, r.topic_id, r.num_partitions, r.replication_factor
                )
        raise_first(failures)
        return out

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data (UnknownTopicOrPartitionError if there is none)."""
        self.delete_topics([name])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete several topics; raises the first failure (the others are deleted anyway)."""
        topics = topic_names(names, "delete_topics")
        if not topics:
            return
        resp = self._controller(
            "DeleteTopics",
            controller_pb2.DeleteTopicsRequest(topics=topics, timeout_ms=self._server_wait_ms),
        )
        raise_first(
            [
                (r.name, topic_error(r.error_code, r.error_message, r.name))
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
        topics = [] if names is None else topic_names(names, "describe_topics")
        if names is not None and not topics:
            return {}
        resp = self._controller(
            "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=topics)
        )
        raise_first(
            [
                (t.name, topic_error(t.error_code, t.error_message, t.name))
                for t in resp.topics
                if t.error_code != NONE
            ]
        )
        found = {t.name: topic_description(t) for t in resp.topics}
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
        topic = topic_name(name)
        total = positive_count(
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
                        assignments=replica_assignments(replica_assignment, topic),
                    )
                ],
                timeout_ms=self._server_wait_ms,
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        raise_first(
            [
                (r.name, topic_error(r.error_code, r.error_message, r.name))
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
                resource_type=controller_pb2.RESOURCE_TYPE_TOPIC, resource_name=topic_name(topic)
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
                raise with_context(
                    error_for(r.error_code, r.error_message or None),
                    what,
                    repr(r.resource_name) if topic is not None else f"node {r.resource_name}",
                )
            out.update(config_entries(r.configs))
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
        name = topic_name(topic)
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
            for key, value in config_strings(values).items():
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
        raise_first(
            [
                (r.resource_name, topic_error(r.error_code, r.error_message, r.resource_name))
                for r in resp.results
                if r.error_code != NONE
            ]
        )

    def describe_node_configs(self, *, documentation: bool = False) -> dict[str, ConfigEntry]:
        """The cluster's dynamic configs (Kafka's default broker configs): the replication
        throttle rates every storage node applies, ``leader.replication.throttled.rate`` and
        ``follower.replication.throttled.rate`` (bytes/s; ``value`` None when unset: no
        limit), and the run-time log levels every service follows, ``log.level`` (None:
        each process's start level) and any ``log.level.<logger>`` set."""
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
            out.update(config_entries(r.configs))
        return out

    def alter_node_configs(
        self,
        set: Mapping[str, ConfigValue] | None = None,  # shadows the builtin: Kafka's op name
        delete: Iterable[str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Change the cluster's dynamic configs, all or nothing: the replication throttle
        rates of reassignments (``leader.replication.throttled.rate``,
        ``follower.replication.throttled.rate``, bytes/s >= 1; ``delete`` removes a limit;
        which replicas they apply to is the topics' ``*.replication.throttled.replicas``,
        ``alter_configs``), and the log levels of every running service, as Kafka's dynamic
        broker loggers: ``log.level`` (the root logger) and ``log.level.<logger>`` (one
        logger and those under it), ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``;
        ``delete`` puts back the level each process started at. An unknown name or bad
        value raises InvalidConfigError."""
        ops: list[controller_pb2.AlterableConfig] = []
        for key, value in config_strings(set).items():
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
            controller=node_of(resp.controller if resp.HasField("controller") else None),
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
        wanted = {tp: offset_spec(tp, s) for tp, s in tp_map(specs, "list_offsets").items()}

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.ListOffsetsRequest:
            req = storage_pb2.ListOffsetsRequest(
                replica_id=-1, isolation_level=_ISOLATION[isolation_level]
            )
            for topic, parts in by_topic(group).items():
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
        for tp, offset in tp_map(before, "delete_records").items():
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
            for topic, parts in by_topic(group).items():
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
                err = with_context(error, f"{tp.topic}-{tp.partition}")
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
                            err = with_context(old, f"{tp.topic}-{tp.partition}")
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
                        retry[tp] = partition_error(code, message, tp)
                    else:
                        failed[tp] = partition_error(code, message, tp)
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
        raise_partial(wanted, done, failed)
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
        raise_first(failures)
        return out

    def describe_producers(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition's leader keeps state for, by producer id (Kafka's
        ``Admin.describeProducers``): a producer with ``current_transaction_start_offset``
        set has a transaction open there, holding read_committed readers at that offset."""
        wanted = {tp: 0 for tp in tp_list(partitions, "describe_producers")}

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.DescribeProducersRequest:
            return storage_pb2.DescribeProducersRequest(
                topics=[
                    common_pb2.TopicPartitions(topic=t, partitions=[p for p, _ in parts])
                    for t, parts in by_topic(group).items()
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
        (tp,) = tp_list([tp], "abort_transaction")
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
                    for t, parts in by_topic(group).items()
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
        gids = checked_group_ids(group_ids, "describe_groups")
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
                failures.append((gid, group_error(d.error_code, d.error_message, gid)))
            else:
                out[gid] = group_admin.group_description(d)
        raise_first(failures)
        return out

    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (the next offset it reads), sorted by partition:
        every committed one, or those of ``partitions``, where a partition with nothing
        committed maps to None (as Kafka's ``listConsumerGroupOffsets``). An unknown group has
        nothing committed. Lag is ``admin.list_offsets({tp: "latest"})`` minus these."""
        gid = checked_group_id(group_id)
        tps = None if partitions is None else tp_list(partitions, "list_group_offsets")
        req = coordinator_pb2.OffsetFetchRequest(group_id=gid, member_epoch=-1)
        for topic, parts in by_topic(dict.fromkeys(tps or ())).items():
            req.topics.add(topic=topic, partitions=sorted(p for p, _ in parts))
        resp = self._group_call(gid, "OffsetFetch", req)
        if resp.error_code != NONE:
            raise group_error(resp.error_code, resp.error_message, gid)
        out: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(tps or ())
        failures: list[tuple[str, StromError]] = []
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition)
                if p.error_code != NONE:
                    failures.append(
                        (f"{tp.topic}-{tp.partition}", group_partition_error(p, gid, tp))
                    )
                elif p.committed_offset >= 0:
                    out[tp] = OffsetAndMetadata(
                        p.committed_offset, p.metadata, p.committed_leader_epoch
                    )
        raise_first(failures)
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
        gid = checked_group_id(group_id)
        wanted: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, value in tp_map(offsets, "alter_group_offsets").items():
            om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)  # type: ignore[arg-type]
            if not is_int(om.offset) or om.offset < 0 or not isinstance(om.metadata, str):
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
            raise group_error(resp.error_code, resp.error_message, gid)
        raise_first(partition_failures(resp, gid))

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Delete the group's committed offsets of ``partitions`` (Kafka's
        ``deleteConsumerGroupOffsets``). A partition of a topic some member is subscribed to
        keeps its offset and raises GroupSubscribedToTopicError naming it (the others are
        deleted); an unknown group raises GroupIdNotFoundError."""
        gid = checked_group_id(group_id)
        tps = tp_list(partitions, "delete_group_offsets")
        if not tps:
            return
        req = coordinator_pb2.DeleteOffsetsRequest(group_id=gid)
        for topic, parts in by_topic(dict.fromkeys(tps)).items():
            req.topics.add(topic=topic, partitions=sorted(p for p, _ in parts))
        resp = self._group_call(gid, "DeleteOffsets", req)
        if resp.error_code != NONE:
            raise group_error(resp.error_code, resp.error_message, gid)
        raise_first(partition_failures(resp, gid))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups and their committed offsets (Kafka's ``deleteConsumerGroups``).
        Only groups without members: a group with members raises NonEmptyGroupError, an
        unknown one GroupIdNotFoundError, each naming the group (the first failure; the
        message lists the others, and the groups not listed were deleted)."""
        failures: list[tuple[str, StromError]] = []
        for gid in checked_group_ids(group_ids, "delete_groups"):
            req = coordinator_pb2.DeleteGroupsRequest(group_ids=[gid])
            resp = self._group_call(gid, "DeleteGroups", req, lambda r: r.results[0].error_code)
            r = resp.results[0]
            if r.error_code != NONE:
                failures.append((gid, group_error(r.error_code, r.error_message, gid)))
        raise_first(failures)
