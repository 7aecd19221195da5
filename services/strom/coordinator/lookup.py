"""FindCoordinator answered from a :class:`~strom.metadata.ClusterView` (DESIGN §2, §3).

Storage nodes and coordinators both answer FindCoordinator, and both know the shard owners
only through etcd (``coordinators/<shard>`` for groups, ``txn_coordinators/<shard>`` for
transactional ids, lease-bound). Keeping the one function here means
a client gets the same answer whichever process it asks. No gRPC in here: the callers wrap it.
"""

from __future__ import annotations

from strom.api import common_pb2, storage_pb2
from strom.api import metadata_pb2 as md
from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC, shard_for_group
from strom.coordinator.txn_state import TRANSACTION_STATE_TOPIC
from strom.errors import ErrorCode
from strom.metadata import ClusterView


def shard_count(
    view: ClusterView, default: int | None = None, topic: str = CONSUMER_OFFSETS_TOPIC
) -> int | None:
    """Partition count of ``topic`` (``__consumer_offsets``: the number of group shards;
    ``__transaction_state``: of transaction shards), or ``default`` while it does not exist."""
    meta = view.topic(topic)
    if meta is None or meta.deleting or meta.partition_count <= 0:
        return default
    return int(meta.partition_count)


def owner_node(owner: md.CoordinatorShardOwner) -> common_pb2.Node:
    """The owner as a ``Node`` (node_id = its coordinator id)."""
    return common_pb2.Node(node_id=owner.coordinator_id, host=owner.host, port=owner.port)


def find_coordinator(
    view: ClusterView,
    request: storage_pb2.FindCoordinatorRequest,
    *,
    default_shards: int | None = None,
) -> storage_pb2.FindCoordinatorResponse:
    """One ``Coordinator`` per requested key, in request order.

    Group keys live in shards of ``__consumer_offsets`` (owners under ``coordinators/``),
    transactional ids in shards of ``__transaction_state`` (``txn_coordinators/``); both use
    the same hash. COORDINATOR_NOT_AVAILABLE when the shard has no owner (no coordinator
    running, ownership moving, or the topic not created yet).
    """
    resp = storage_pb2.FindCoordinatorResponse()
    txn = request.key_type == storage_pb2.COORDINATOR_TYPE_TRANSACTION
    topic = TRANSACTION_STATE_TOPIC if txn else CONSUMER_OFFSETS_TOPIC
    shards = shard_count(view, default_shards, topic)
    with view.lock:
        table = view.txn_coordinators if txn else view.coordinators
        owners = {s: v.value for s, v in table.items()}
    what = "transactional id" if txn else "group id"
    if request.all_shards:
        return _every_shard(request, resp, topic, shards, owners)
    for key in request.keys:
        c = resp.coordinators.add(key=key, shard=-1)
        c.node.node_id = -1
        if request.key_type not in (
            storage_pb2.COORDINATOR_TYPE_GROUP,
            storage_pb2.COORDINATOR_TYPE_TRANSACTION,
        ):
            c.error_code = ErrorCode.INVALID_REQUEST  # type: ignore[assignment]
            c.error_message = f"unknown coordinator key type {request.key_type}"
            continue
        if not key:
            c.error_code = (  # type: ignore[assignment]
                ErrorCode.INVALID_REQUEST if txn else ErrorCode.INVALID_GROUP_ID
            )
            c.error_message = f"{what} must not be empty"
            continue
        if shards is None:
            c.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE  # type: ignore[assignment]
            c.error_message = f"{topic} does not exist yet (no coordinator ran)"
            continue
        shard = shard_for_group(key, shards)
        c.shard = shard
        owner = owners.get(shard)
        if owner is None:
            c.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE  # type: ignore[assignment]
            c.error_message = f"no coordinator owns {topic} shard {shard} right now"
            continue
        c.node.CopyFrom(owner_node(owner))
    return resp


def _every_shard(
    request: storage_pb2.FindCoordinatorRequest,
    resp: storage_pb2.FindCoordinatorResponse,
    topic: str,
    shards: int | None,
    owners: dict[int, md.CoordinatorShardOwner],
) -> storage_pb2.FindCoordinatorResponse:
    """``all_shards``: one entry per shard, so that listing groups or transactions needs no
    DESCRIBE on the cluster (DescribeCluster's), only on what is listed. None while the
    topic does not exist yet; with keys, one INVALID_REQUEST entry per key."""
    if request.keys:
        for key in request.keys:
            c = resp.coordinators.add(key=key, shard=-1)
            c.node.node_id = -1
            c.error_code = ErrorCode.INVALID_REQUEST  # type: ignore[assignment]
            c.error_message = "all_shards asks for every shard: name no keys with it"
        return resp
    for shard in range(shards or 0):
        c = resp.coordinators.add(shard=shard)
        owner = owners.get(shard)
        if owner is None:
            c.node.node_id = -1
            c.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE  # type: ignore[assignment]
            c.error_message = f"no coordinator owns {topic} shard {shard} right now"
        else:
            c.node.CopyFrom(owner_node(owner))
    return resp
