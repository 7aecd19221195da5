"""Offset lookups: ListOffsets routed to the partition leaders, with retries.

Why a separate module: the consumer's user-facing calls (``position``, ``seek_to_end``,
``beginning_offsets``, ``offsets_for_times``, auto offset reset), the CLI's group commands and
the Spark connector's planning need the same retry rules for leader changes. Leaders and their
epochs (sent as ``current_leader_epoch``, DESIGN §6) come from the client's one metadata cache,
:class:`strom.client.metadata.MetadataCache`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import NamedTuple

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.metadata import MetadataCache, PartitionLeader
from strom.client.types import TopicPartition
from strom.errors import (
    LeaderNotAvailableError,
    StromError,
    error_for,
    is_retriable,
)

NONE = common_pb2.ErrorCode.NONE
#: ListOffsets sentinels (storage.proto, ListOffsetsPartition.timestamp).
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
#: gRPC statuses after which the node is taken as unreachable (retry elsewhere, later).
TRANSPORT_RETRY = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class OffsetResult(NamedTuple):
    """One ListOffsets answer: the offset (-1 = no record matched), the record's timestamp
    (-1 for earliest/latest lookups) and the leader epoch of the batch holding it."""

    offset: int
    timestamp: int
    leader_epoch: int


#: The consumer's name for the client's metadata cache (kept for its callers and tests).
LeaderMap = MetadataCache


def list_offsets(
    client: ClusterClient,
    leaders: MetadataCache,
    query: Mapping[TopicPartition, int],
    *,
    timeout_s: float,
    backoff_s: float,
    client_metadata: tuple[tuple[str, str], ...] = (),
    read_committed: bool = False,
    call_timeout_s: float | None = None,
    partial: bool = False,
) -> dict[TopicPartition, OffsetResult]:
    """ListOffsets for every partition in ``query`` (value: a timestamp in ms, or LATEST /
    EARLIEST / MAX_TIMESTAMP), one request per leader node.

    Leader moves, unreachable nodes and a new leader that cannot answer yet
    (OFFSET_NOT_AVAILABLE) are retried after a metadata refresh until ``timeout_s``; then the
    last such error is raised — or, with ``partial``, what was found is returned and the
    partitions still without an answer are left out (a consumer's poll: one partition
    without a leader must not stop it reading the others). Errors that retrying cannot fix
    are raised at once.

    Each request waits the client's request timeout, or with ``call_timeout_s`` at most that
    long and never past ``timeout_s``: a caller with a short budget (the Spark connector's
    planning) sets it well below the budget, so that a hung leader costs one try and the
    lookup still has time to refresh metadata and ask the partition's new leader.
    """
    remaining = dict(query)
    out: dict[TopicPartition, OffsetResult] = {}
    if not remaining:
        return out
    deadline = time.monotonic() + timeout_s
    if any(leaders.get(tp) is None for tp in remaining):
        leaders.refresh(tp.topic for tp in remaining)
    last: StromError | None = None
    while True:
        by_node: dict[str, list[TopicPartition]] = {}
        for tp in remaining:
            leader = leaders.get(tp)
            if leader is None or leader.address is None:
                last = LeaderNotAvailableError(
                    f"{tp.topic}-{tp.partition} has no live leader"
                    if leader is not None
                    else f"{tp.topic}-{tp.partition} is not in the cluster's metadata"
                )
                continue
            by_node.setdefault(leader.address, []).append(tp)
        for address, tps in by_node.items():
            req = _list_offsets_request(tps, remaining, leaders, read_committed)
            timeout = client.timeout_s
            if call_timeout_s is not None:
                timeout = max(min(timeout, call_timeout_s, deadline - time.monotonic()), 0.05)
            try:
                resp = client.storage(address).ListOffsets(
                    req, timeout=timeout, metadata=client_metadata
                )
            except grpc.RpcError as exc:
                if exc.code() not in TRANSPORT_RETRY:
                    raise StromError(
                        f"ListOffsets on {address} failed: {exc.code().name} {exc.details() or ''}"
                    ) from None
                last = LeaderNotAvailableError(f"leader {address} unreachable: {exc.code().name}")
                continue
            for t in resp.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.topic, p.partition)
                    if tp not in remaining:
                        continue
                    if p.error_code == NONE:
                        out[tp] = OffsetResult(p.offset, p.timestamp, p.leader_epoch)
                        del remaining[tp]
                    elif is_retriable(p.error_code):
                        last = error_for(
                            p.error_code,
                            f"{tp.topic}-{tp.partition}: {p.error_message or 'retriable'}",
                        )
                    else:
                        raise error_for(
                            p.error_code, f"{tp.topic}-{tp.partition}: {p.error_message}"
                        )
        if not remaining:
            return out
        if time.monotonic() >= deadline:
            if partial:
                return out
            missing = ", ".join(f"{tp.topic}-{tp.partition}" for tp in remaining)
            raise last or LeaderNotAvailableError(f"ListOffsets got no answer for {missing}")
        time.sleep(backoff_s)
        try:
            leaders.refresh(tp.topic for tp in remaining)
        except StromError as exc:
            last = exc


def _list_offsets_request(
    tps: list[TopicPartition],
    query: Mapping[TopicPartition, int],
    leaders: MetadataCache,
    read_committed: bool = False,
) -> storage_pb2.ListOffsetsRequest:
    topics: dict[str, list[storage_pb2.ListOffsetsPartition]] = {}
    for tp in tps:
        leader = leaders.get(tp)
        topics.setdefault(tp.topic, []).append(
            storage_pb2.ListOffsetsPartition(
                partition=tp.partition,
                current_leader_epoch=leader.epoch if leader is not None else -1,
                timestamp=query[tp],
            )
        )
    return storage_pb2.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=(
            storage_pb2.ISOLATION_LEVEL_READ_COMMITTED
            if read_committed
            else storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED
        ),
        topics=[storage_pb2.ListOffsetsTopic(topic=t, partitions=ps) for t, ps in topics.items()],
    )


__all__ = [
    "EARLIEST",
    "LATEST",
    "MAX_TIMESTAMP",
    "LeaderMap",
    "OffsetResult",
    "PartitionLeader",
    "list_offsets",
]
