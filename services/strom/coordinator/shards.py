"""The kinds of shards a coordinator process owns, and one owned shard (plain data).

A coordinator process serves two roles on the same machinery (DESIGN §2, §6): consumer groups
in the partitions of ``__consumer_offsets`` (owners under etcd ``coordinators/<s>``) and
transactional ids in the partitions of ``__transaction_state`` (``txn_coordinators/<s>``).
Claiming, loading (replay, fence, publish), writing and losing a shard are the same for both;
a :class:`ShardKind` says where each kind lives and how its records replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strom.coordinator.group import ConsumerGroup
from strom.coordinator.replay import ReplayState
from strom.coordinator.txn_state import TxnMetadata
from strom.metadata import ClusterView, Keys, Versioned

#: A shard this coordinator has not served for this long, whose last load attempt could not
#: reach the storage nodes, is released (its key deleted) for another registered
#: coordinator to take (``strom.coordinator.shard_ownership``): a coordinator cut from the
#: nodes must not keep its shards for the whole cut.
RELEASE_AFTER_S = 10.0


@dataclass
class ShardKind:
    """Where one kind of shard lives and how its partition replays."""

    #: "group" or "transaction" (for logs and metrics).
    name: str
    #: The compacted internal topic whose partitions are the shards.
    topic: str
    #: Partition count and replication factor when this process creates the topic.
    partitions: int
    replication_factor: int
    #: The etcd key naming a shard's owner.
    key: Callable[[Keys, int], str]
    #: The view's table of owners.
    owners: Callable[[ClusterView], dict[int, Versioned]]
    #: A fresh replay state for the partition's records.
    new_state: Callable[[], ReplayState]
    #: The shards of this kind this process owns.
    shards: dict[int, Shard] = field(default_factory=dict)


@dataclass
class Shard:
    """One owned shard: its in-memory state, its durable mirror and its producer identity.

    ``generation`` goes up on every (re)load so a loader that was superseded stops. A group
    shard fills ``groups``, a transaction shard ``transactions``.
    """

    index: int
    kind: ShardKind | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loaded: bool = False
    generation: int = 0
    groups: dict[str, ConsumerGroup] = field(default_factory=dict)
    transactions: dict[str, TxnMetadata] = field(default_factory=dict)
    durable: Any = None
    producer_id: int = -1
    producer_epoch: int = -1
    next_sequence: int = 0
    create_revision: int = 0
    acquired_ms: int = 0
    loader: asyncio.Task[None] | None = None
    #: Transactional ids whose transaction is completing -> set when it has completed
    #: (requests that would start the next transaction wait on it instead of failing).
    completing: dict[str, asyncio.Event] = field(default_factory=dict)
    #: Writes waiting for the shard's writer, in order (:mod:`strom.coordinator.shard_writes`).
    writes: list[Any] = field(default_factory=list)
    #: The writer task appending them (None or done: nobody is writing).
    writer: asyncio.Task[None] | None = None
    #: Done when the last write queued so far is durable (or failed).
    write_tail: asyncio.Future[None] | None = None
    #: The error code of the last append the leader refused for good (logged once; None
    #: again once an append succeeds): ``strom.coordinator.shard_writes``.
    refused: int | None = None
    #: Why the last attempt to load the shard failed (None: none failed since the last
    #: load): requests answered COORDINATOR_LOAD_IN_PROGRESS meanwhile say it.
    load_error: str | None = None
    #: When (``time.monotonic()``) the shard stopped being served: its current load
    #: started (None while it is served). How long its clients have gone without it.
    unserved_since: float | None = None
    #: Why the last load attempt could not reach the storage nodes (a call not answered,
    #: no node giving a producer id); None when it failed otherwise or none failed.
    #: Such a shard is answered COORDINATOR_NOT_AVAILABLE naming this, and released after
    #: :data:`RELEASE_AFTER_S` when another coordinator runs.
    unreachable: str | None = None

    def load_failure(self) -> str:
        """Why the shard still loads, for COORDINATOR_LOAD_IN_PROGRESS messages: its last
        failed load attempt, if any (a refused fence batch is nothing to wait out blindly)."""
        return f" (its last load attempt failed: {self.load_error})" if self.load_error else ""

    @property
    def topic(self) -> str:
        assert self.kind is not None
        return self.kind.topic
