"""FindCoordinator answered from a :class:`~strom.metadata.ClusterView` (DESIGN §2, §3).

Storage nodes and coordinators both answer FindCoordinator, and both know the shard owners
only through etcd (``coordinators/<shard>``, lease-bound). Keeping the one function here means
a client gets the same answer whichever process it asks. No gRPC in here: the callers wrap it.
"""

from __future__ import annotations

from strom.api import common_pb2, storage_pb2
from strom.api import metadata_pb2 as md
from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC, shard_for_group
from strom.errors import ErrorCode
from strom.metadata import ClusterView


def shard_count(view: ClusterView, default: int | None = None) -> int | None:
    """Partition count of ``__consumer_offsets`` (the number of shards), or ``default`` while
    the topic does not exist yet."""
    meta = view.topic(CONSUMER_OFFSETS_TOPIC)
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

    COORDINATOR_NOT_AVAILABLE when the shard has no owner (no coordinator running, ownership
    moving, or ``__consumer_offsets`` not created yet); INVALID_REQUEST for transaction keys,
    which strom does not have.
    """
    resp = storage_pb2.FindCoordinatorResponse()
    shards = shard_count(view, default_shards)
    with view.lock:
        owners = {s: v.value for s, v in view.coordinators.items()}
    for key in request.keys:
        c = resp.coordinators.add(key=key, shard=-1)
        c.node.node_id = -1
        if request.key_type != storage_pb2.COORDINATOR_TYPE_GROUP:
            c.error_code = ErrorCode.INVALID_REQUEST  # type: ignore[assignment]
            c.error_message = "transactions are not supported: only group keys can be looked up"
            continue
        if not key:
            c.error_code = ErrorCode.INVALID_GROUP_ID  # type: ignore[assignment]
            c.error_message = "group id must not be empty"
            continue
        if shards is None:
            c.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE  # type: ignore[assignment]
            c.error_message = f"{CONSUMER_OFFSETS_TOPIC} does not exist yet (no coordinator ran)"
            continue
        shard = shard_for_group(key, shards)
        c.shard = shard
        owner = owners.get(shard)
        if owner is None:
            c.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE  # type: ignore[assignment]
            c.error_message = f"no coordinator owns shard {shard} right now"
            continue
        c.node.CopyFrom(owner_node(owner))
    return resp
