"""Partition leadership and offset lookups for the consumer: who leads each partition (from
Metadata), and ListOffsets routed to those leaders with retries.

Why a separate module: the consumer's fetch thread and its user-facing calls (``position``,
``seek_to_end``, ``beginning_offsets``, ``offsets_for_times``, auto offset reset) both need the
same leader map and the same retry rules for leader changes, and the group code that comes later
(committed offsets, lag) will need them too. ``ClusterClient.leader_of`` answers one partition at
a time and does not return the leader epoch; this map answers many partitions from one Metadata
round trip and keeps the epoch that requests carry as ``current_leader_epoch`` (DESIGN §6).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.types import TopicPartition
from strom.errors import (
    BrokerNotAvailableError,
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


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    """Where to send a partition's requests: the leader's node id and address (None when the
    node is not registered, i.e. down) and the leader epoch to send as current_leader_epoch."""

    node_id: int
    address: str | None
    epoch: int


class OffsetResult(NamedTuple):
    """One ListOffsets answer: the offset (-1 = no record matched), the record's timestamp
    (-1 for earliest/latest lookups) and the leader epoch of the batch holding it."""

    offset: int
    timestamp: int
    leader_epoch: int


class LeaderMap:
    """Thread-safe cache of partition leaders, refreshed from one Metadata call per topic set.

    Entries are replaced wholesale on refresh, so readers never see half an update; the fetch
    thread and the user's thread may refresh at the same time (the later answer wins, and both
    are answers the cluster gave).
    """

    def __init__(self, client: ClusterClient, *, metadata_timeout_s: float = 5.0) -> None:
        self._client = client
        self._metadata_timeout_s = metadata_timeout_s
        self._lock = threading.Lock()
        self._leaders: dict[TopicPartition, PartitionLeader] = {}
        self._partition_counts: dict[str, int] = {}
        self._nodes: dict[int, str] = {}

    def refresh(self, topics: Iterable[str]) -> None:
        """Ask the cluster for ``topics``' leaders. Raises BrokerNotAvailableError when no
        node answers; topics the nodes do not know are left out (callers see no leader)."""
        names = sorted(set(topics))
        if not names:
            return
        md = self._metadata_once(names)
        nodes = {n.node_id: f"{n.host}:{n.port}" for n in md.nodes}
        fresh: dict[TopicPartition, PartitionLeader] = {}
        counts: dict[str, int] = {}
        for t in md.topics:
            if t.error_code != NONE:
                continue
            counts[t.name] = len(t.partitions)
            for p in t.partitions:
                addr = nodes.get(p.leader) if p.leader >= 0 else None
                fresh[TopicPartition(t.name, p.partition)] = PartitionLeader(
                    p.leader, addr, p.leader_epoch
                )
        with self._lock:
            self._nodes.update(nodes)
            for name in names:
                if name not in counts:  # gone (deleted) or not known to the nodes yet
                    self._partition_counts.pop(name, None)
                    for tp in [tp for tp in self._leaders if tp.topic == name]:
                        del self._leaders[tp]
            self._leaders.update(fresh)
            self._partition_counts.update(counts)

    def _metadata_once(self, names: list[str]) -> storage_pb2.MetadataResponse:
        """One pass over the known nodes and the bootstrap list. Unlike
        ``ClusterClient.metadata`` it does not keep retrying for ``retry_s``: the callers
        (the fetch thread, offset lookups) have their own backoff and deadlines, and the fetch
        thread must stay responsive to close()."""
        with self._lock:
            known = list(self._nodes.values())
        candidates = list(dict.fromkeys([*known, *self._client.bootstrap]))
        req = storage_pb2.MetadataRequest(topics=names)
        errors = []
        for addr in candidates:
            try:
                return self._client.storage(addr).Metadata(req, timeout=self._metadata_timeout_s)
            except grpc.RpcError as exc:
                errors.append(f"{addr}: {exc.code().name}")
        raise BrokerNotAvailableError("no strom node answered Metadata (" + "; ".join(errors) + ")")

    def get(self, tp: TopicPartition) -> PartitionLeader | None:
        with self._lock:
            return self._leaders.get(tp)

    def learn(self, tp: TopicPartition, node_id: int, epoch: int, address: str | None) -> bool:
        """Adopt a leader hint from a response (current_leader + node_endpoints) when it is
        newer than what the map holds; returns whether it was adopted. Saves a Metadata round
        trip after a leader change."""
        with self._lock:
            if address is None:
                address = self._nodes.get(node_id)
            old = self._leaders.get(tp)
            if node_id < 0 or address is None or (old is not None and epoch <= old.epoch):
                return False
            self._leaders[tp] = PartitionLeader(node_id, address, epoch)
            self._nodes[node_id] = address
            return True

    def partition_count(self, topic: str) -> int | None:
        with self._lock:
            return self._partition_counts.get(topic)


def list_offsets(
    client: ClusterClient,
    leaders: LeaderMap,
    query: Mapping[TopicPartition, int],
    *,
    timeout_s: float,
    backoff_s: float,
    client_metadata: tuple[tuple[str, str], ...] = (),
    read_committed: bool = False,
) -> dict[TopicPartition, OffsetResult]:
    """ListOffsets for every partition in ``query`` (value: a timestamp in ms, or LATEST /
    EARLIEST / MAX_TIMESTAMP), one request per leader node.

    Leader moves, unreachable nodes and a new leader that cannot answer yet
    (OFFSET_NOT_AVAILABLE) are retried after a metadata refresh until ``timeout_s``; then the
    last such error is raised. Errors that retrying cannot fix are raised at once.
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
            try:
                resp = client.storage(address).ListOffsets(
                    req, timeout=client.timeout_s, metadata=client_metadata
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
    leaders: LeaderMap,
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
