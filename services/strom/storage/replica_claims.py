"""When a storage request is a replica's, not a client's (storage.proto, ``replica_id``).

proto3 sends an unset ``int32`` as 0, and 0 is also a real node id (the Helm chart's
``storage-0`` is node 0). A client in another language that leaves ``replica_id`` unset (as
@grpc/grpc-js callers do: docs/grpc-clients.md) must not be taken for node 0's follower,
which reads above the high watermark, moves it, and skips the fetch quota. So the claim is
read from what only a replica sends:

- Fetch / FetchStream: a follower always names its process (``replica_incarnation``, its
  NodeRegistration.incarnation_id), so a request is a follower's only with ``replica_id >= 0``
  *and* an incarnation. ``replica_id`` 0 without one is a consumer (unset); a positive one
  without one is refused, naming the field (a half-made claim is a caller's mistake).
- ListOffsets: no node sends it for itself; the log-end view is for ``replica_id >= 1``
  (debugging tools), 0 (unset) and negatives are a client's view.

With ACLs on, a claim also needs CLUSTER_ACTION on the cluster (strom.security.rules), as
Kafka's follower fetch does, before the follower path or its quota exemption applies.
"""

from __future__ import annotations

from typing import Any


def is_follower_fetch(request: Any) -> bool:
    """Whether a FetchRequest is a follower replica's (see the module docstring)."""
    return request.replica_id >= 0 and bool(request.replica_incarnation)


def fetch_claim_error(request: Any) -> str | None:
    """Why a FetchRequest's replica claim is malformed (for INVALID_ARGUMENT), else None:
    a positive ``replica_id`` without the ``replica_incarnation`` every follower sends."""
    if request.replica_id > 0 and not request.replica_incarnation:
        return (
            f"FetchRequest.replica_id is {request.replica_id} but replica_incarnation is "
            "empty: a consumer sends replica_id -1 (or leaves it unset); a follower sends "
            "its node id and its NodeRegistration.incarnation_id"
        )
    return None


def is_replica_list_offsets(request: Any) -> bool:
    """Whether a ListOffsetsRequest asks for a replica's (log-end) view: ``replica_id >= 1``;
    0 is what an unset field sends, and is a client's view."""
    return request.replica_id >= 1
