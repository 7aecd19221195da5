"""The contract between the Consumer and its consumer-group membership, both ways.

Why its own module: the Consumer drives a group member (``GroupMembership``: subscribe, each
poll, commits, close) and the member needs a few things of the consumer (``GroupHost``: its
settings, positions, and where to install a new assignment). With both sides written as
protocols here, :mod:`strom.client.group_member` depends on this small interface and not on
the Consumer class, so the two modules do not import each other, and the member can be driven
by a fake host in unit tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from strom.client.cluster import ClusterClient
from strom.client.stats import GroupStats
from strom.client.transactions import GroupMetadata
from strom.client.types import OffsetAndMetadata, TopicPartition


class PositionSource(Protocol):
    """The consumer's fetch state, as far as the group member reads it."""

    #: Notified when a poll should wake up (data, errors, or a new assignment to reconcile).
    data_ready: threading.Condition

    def position(self, tp: TopicPartition) -> int | None: ...


class GroupHost(Protocol):
    """What a group member needs of the consumer it belongs to (the Consumer provides it)."""

    group_id: str | None
    client_id: str
    #: The consumer's settings: enable_auto_commit, auto_commit_interval_ms,
    #: commit_linger_ms, max_poll_interval_ms, group_instance_id, group_remote_assignor.
    config: dict[str, Any]
    _client: ClusterClient
    _fetcher: PositionSource
    _timeout_s: float
    _backoff_s: float
    _read_committed: bool

    @property
    def closed(self) -> bool: ...

    def assignment(self) -> set[TopicPartition]: ...

    def _apply_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        """Install a (reconciled) assignment: positions of partitions kept are kept."""

    def _consumed_positions(self, parts: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The positions a commit of ``parts`` covers: what the application was handed."""


class GroupMembership(Protocol):
    """What the consumer-group code plugs in as ``Consumer._group`` (DESIGN §7).

    It is expected to run the ConsumerGroupHeartbeat loop on its own thread, and to hand the
    consumer each new assignment through ``GroupHost._apply_assignment`` from ``on_poll`` (the
    application's thread, so a rebalance never races a poll in progress). The consumer calls
    these methods from the application's thread.
    """

    #: Its commits, rebalances and heartbeats, for ``Consumer.metrics()``.
    stats: GroupStats

    def subscribe(
        self, topics: frozenset[str] | None, pattern: str | None, listener: Any
    ) -> None: ...

    def unsubscribe(self) -> None: ...

    def polling(self, active: bool) -> None:
        """The application thread enters (True) or leaves (False) a poll; a member whose
        application stays out of poll() past ``max_poll_interval_ms`` leaves the group."""

    def on_poll(self, consumer: GroupHost) -> None:
        """Each poll: reconcile a pending assignment, auto-commit when due, surface fencing."""

    def rebalance_pending(self) -> bool:
        """Whether the next ``on_poll`` has partitions to install or drop (listener calls)."""

    def rebalance_elsewhere(self) -> AbstractContextManager[None]:
        """Within it, ``on_poll`` on this thread leaves rebalance work to a later poll
        (strom.aio's poll on the event loop, where a listener could not run)."""

    def committed(
        self, partitions: Sequence[TopicPartition], timeout_s: float
    ) -> dict[TopicPartition, OffsetAndMetadata | None]: ...

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_s: float) -> None:
        """OffsetCommit, fenced by member epoch."""

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        callback: Callable[[Mapping[TopicPartition, OffsetAndMetadata], BaseException | None], Any]
        | None,
    ) -> None: ...

    def group_metadata(self) -> GroupMetadata: ...

    def close(self, *, autocommit: bool, timeout_s: float) -> None:
        """Commit if asked, leave the group (so partitions move at once), stop heartbeats."""


__all__ = ["GroupHost", "GroupMembership", "PositionSource"]
