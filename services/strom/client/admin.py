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
:mod:`strom.client.admin_requests`; this module holds the :class:`Admin` class, made of one
mixin per area, each in a module of its own: :mod:`~strom.client.admin_topics`,
:mod:`~strom.client.admin_configs`, :mod:`~strom.client.admin_cluster`,
:mod:`~strom.client.admin_records`, :mod:`~strom.client.admin_transactions`,
:mod:`~strom.client.admin_reassignments` and :mod:`~strom.client.admin_groups`, on the call
helpers they share in :mod:`strom.client.admin_calls`, so that each area reads and changes
on its own while users see one class.
"""

from __future__ import annotations

from collections.abc import Sequence

from strom.client import forks
from strom.client.admin_cluster import ClusterAdmin
from strom.client.admin_configs import ConfigsAdmin
from strom.client.admin_groups import GroupsAdmin
from strom.client.admin_reassignments import ReassignmentsAdmin
from strom.client.admin_records import RecordsAdmin
from strom.client.admin_requests import admin_errors
from strom.client.admin_topics import TopicsAdmin
from strom.client.admin_transactions import (
    FENCE_TRANSACTION_TIMEOUT_MS,  # noqa: F401  (importable from here, as before the split)
    TransactionsAdmin,
)
from strom.client.admin_types import (
    Assignment,  # noqa: F401  (importable from here, as before the split)
    ClusterDescription,
    ConfigEntry,
    ConfigSource,
    ConfigValue,  # noqa: F401  (importable from here, as before the split)
    CreateTopicResult,
    ElectionResult,
    NewTopic,
    Node,
    NodeInfo,
    NodeState,
    OffsetSpec,
    PartitionInfo,
    ProducerState,  # noqa: F401  (`strom transactions` imports it from here)
    Reassignment,
    TopicDescription,
    TopicListing,
)
from strom.client.cluster import ClusterClient
from strom.client.group_admin import (
    GroupDescription,
    GroupListing,
    GroupListingIncompleteError,
    GroupPartitionLag,
    GroupState,
    MemberDescription,
    MemberState,
)
from strom.client.kwnames import INT_MS_MAX, int_option, kafka_keywords
from strom.client.types import (  # noqa: F401  (importable from here, as before the split)
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from strom.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PartialResultError,
)
from strom.security.channel import client_security

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


# ---------------------------------------------------------------------------------------------
# The client


class Admin(
    TopicsAdmin,
    ConfigsAdmin,
    ClusterAdmin,
    RecordsAdmin,
    TransactionsAdmin,
    ReassignmentsAdmin,
    GroupsAdmin,
):
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
            if value is not None:
                with admin_errors():
                    int_option(name, value, 1, INT_MS_MAX)
        if not isinstance(client_id, str):
            raise InvalidArgumentTypeError(f"client_id must be a str, got {client_id!r}")
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
            raise InvalidArgumentError(
                f"default_api_timeout_ms ({default_api_timeout_ms}) must be at least "
                f"request_timeout_ms ({request_timeout_ms}): it bounds every attempt of a call"
            )
        self.request_timeout_ms = request_timeout_ms
        self.default_api_timeout_ms = default_api_timeout_ms
        self.client_id = client_id
        self._owned = cluster_client is None
        if cluster_client is None:
            with admin_errors():
                cluster_client = ClusterClient(
                    bootstrap,
                    timeout_s=request_timeout_ms / 1000,
                    retry_s=default_api_timeout_ms / 1000,
                    client_id=client_id,
                    security=client_security(ssl_cafile, ssl_certfile, ssl_keyfile, token),
                )
        self._client = cluster_client
        self._closed = False
        forks.track(self)

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
