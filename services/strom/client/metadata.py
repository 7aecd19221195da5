"""The client's one metadata cache: topics, partition counts, partition leaders with their
leader epochs, which topics are stale, and how they are refreshed.

Why one module: the Producer, the Consumer (its fetch thread and offset lookups), the Admin
client and the Spark connector all route requests to partition leaders, learn that a leader
moved from the same errors, and ask the same Metadata RPC of any storage node. Each used to
keep its own leader map and refresh rules; here they are written once, so a fix (e.g. "a
lagging node's answer must not undo a newer leader") reaches every client.

Rules it keeps:

- Metadata comes from any storage node (the known nodes, then the bootstrap list) through the
  ``MetadataSource`` (a :class:`strom.client.cluster.ClusterClient`): no etcd, no controller,
  except to tell "the nodes have not learnt a new topic yet" from "no such topic".
- A partition's leader epoch never goes backwards within one topic id: an answer from a node
  that has not seen the latest election, or a refresh that raced a newer ``current_leader``
  hint, leaves the newer leader in place. A topic re-created under the same name has a new
  topic id and starts afresh.
- Reads on hot paths are plain dict lookups: :attr:`leaders` and :attr:`counts` are the live
  dicts (never replaced, only updated in place under the lock), so ``Producer.send`` pays one
  ``dict.get``.
- One refresh per topic set is in flight: a caller asking for topics an in-flight refresh
  already covers waits for that answer instead of sending its own.
- Stale topics (marked after NOT_LEADER / FENCED_LEADER_EPOCH / a transport error, or when a
  partition has no known leader) are refreshed by :meth:`refresh_stale` with exponential
  backoff per topic while refreshing does not help, promptly again once it did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from strom.api import common_pb2, controller_pb2, storage_pb2
from strom.client.types import TopicPartition
from strom.errors import StromError, UnknownTopicOrPartitionError, error_for

log = logging.getLogger(__name__)

NONE = common_pb2.ErrorCode.NONE


class MetadataSource(Protocol):
    """Where the cache gets its answers: a ClusterClient (kept as a protocol so this module
    does not import the RPC layer that owns the cache)."""

    retry_s: float

    def metadata(
        self, topics: Sequence[str] | None = None, *, retry_s: float | None = None, **kw: Any
    ) -> storage_pb2.MetadataResponse:
        """Ask one node after another (the known ones, then bootstrap) for ``topics``, for
        up to ``retry_s`` (0: one pass); ``timeout_s=`` bounds each call, ``avoid=`` names
        nodes not to ask."""
        ...

    def controller_call(self, method: str, request: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    """Where to send a partition's requests: the leader's node id and address (None when the
    node is not registered, i.e. down, or there is no leader) and the leader epoch to send as
    current_leader_epoch."""

    node_id: int
    address: str | None
    epoch: int


def node_address(node: Any) -> str:
    """``host:port`` of a Node message."""
    return f"{node.host}:{node.port}"


class _Flight:
    """One Metadata refresh in progress; callers wanting a subset of its topics wait on it."""

    __slots__ = ("done", "error", "topics")

    def __init__(self, topics: frozenset[str]) -> None:
        self.topics = topics
        self.done = threading.Event()
        self.error: BaseException | None = None


class MetadataCache:
    """Thread-safe cache of the cluster's topics and partition leaders (see the module
    docstring). ``source`` may be None for a cache that is only fed hints (tests)."""

    def __init__(
        self,
        source: MetadataSource | None,
        *,
        metadata_timeout_s: float = 5.0,
        backoff_s: float = 0.1,
        backoff_max_s: float = 1.0,
    ) -> None:
        self._source = source
        self._metadata_timeout_s = metadata_timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = max(backoff_max_s, backoff_s)
        self._lock = threading.Lock()
        self._leaders: dict[TopicPartition, PartitionLeader] = {}
        self._partition_counts: dict[str, int] = {}
        #: The raw topic entry of the last answer that had the topic (topic_metadata()).
        self._entries: dict[str, storage_pb2.MetadataTopic] = {}
        self._topic_ids: dict[str, str] = {}
        self._nodes: dict[int, str] = {}
        self._flights: list[_Flight] = []
        self._stale: set[str] = set()
        self._failures: dict[str, int] = {}
        self._last_refresh: dict[str, float] = {}

    # -- reads (no I/O) --------------------------------------------------------------------

    @property
    def leaders(self) -> dict[TopicPartition, PartitionLeader]:
        """The live leader dict, for lock-free ``get`` on hot paths (keys compare equal to
        plain ``(topic, partition)`` tuples)."""
        return self._leaders

    @property
    def counts(self) -> dict[str, int]:
        """The live partition-count dict (topic -> count), for lock-free ``get``."""
        return self._partition_counts

    def get(self, tp: TopicPartition) -> PartitionLeader | None:
        return self._leaders.get(tp)

    def partition_count(self, topic: str) -> int | None:
        return self._partition_counts.get(topic)

    def node_addresses(self) -> set[str]:
        """Addresses of the nodes the Metadata answers so far named."""
        with self._lock:
            return set(self._nodes.values())

    def topic_id(self, topic: str) -> str:
        """The topic's id in the last answer that had it ("" when not known): a topic deleted
        and re-created under the same name has a new one."""
        return self._topic_ids.get(topic, "")

    def max_message_bytes(self, topic: str) -> int:
        """The topic's max.message.bytes if it overrides the default (else 0)."""
        entry = self._entries.get(topic)
        return entry.max_message_bytes if entry is not None else 0

    def has_leaders(self, topic: str) -> bool:
        """Whether every partition of ``topic`` has a leader on a registered node."""
        with self._lock:
            return self._has_leaders(topic)

    def _has_leaders(self, topic: str) -> bool:
        n = self._partition_counts.get(topic)
        if n is None:
            return False
        for p in range(n):
            leader = self._leaders.get(TopicPartition(topic, p))
            if leader is None or leader.address is None:
                return False
        return True

    # -- learning ---------------------------------------------------------------------------

    def absorb(self, md: storage_pb2.MetadataResponse, asked: Iterable[str] = ()) -> None:
        """Take in a Metadata answer. Topics in ``asked`` that the answer lacks (deleted, or
        not known to that node yet) are forgotten: callers then see no leader."""
        nodes = {n.node_id: node_address(n) for n in md.nodes}
        with self._lock:
            self._nodes.update(nodes)
            seen = set()
            for t in md.topics:
                if t.error_code != NONE:
                    continue
                seen.add(t.name)
                self._absorb_topic(t, nodes)
            for name in asked:
                if name not in seen:
                    self._forget(name)

    def _absorb_topic(self, t: storage_pb2.MetadataTopic, nodes: dict[int, str]) -> None:
        same = self._topic_ids.get(t.name) == t.topic_id
        if not same:
            self._forget(t.name)
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition)
            old = self._leaders.get(tp)
            if old is not None and p.leader_epoch < old.epoch:
                continue  # a node that has not seen the newer election: keep what we know
            addr = nodes.get(p.leader) if p.leader >= 0 else None
            self._leaders[tp] = PartitionLeader(p.leader, addr, p.leader_epoch)
        self._partition_counts[t.name] = len(t.partitions)
        self._entries[t.name] = t
        self._topic_ids[t.name] = t.topic_id

    def _forget(self, topic: str) -> None:
        self._partition_counts.pop(topic, None)
        self._entries.pop(topic, None)
        self._topic_ids.pop(topic, None)
        for tp in [tp for tp in self._leaders if tp.topic == topic]:
            del self._leaders[tp]

    def learn(self, tp: TopicPartition, node_id: int, epoch: int, address: str | None) -> bool:
        """Adopt a leader hint from a response (current_leader + node_endpoints) when it is
        newer than what the cache holds; returns whether it was adopted. Saves a Metadata
        round trip after a leader change."""
        with self._lock:
            if address is None:
                address = self._nodes.get(node_id)
            old = self._leaders.get(tp)
            if node_id < 0 or address is None or (old is not None and epoch <= old.epoch):
                return False
            self._leaders[tp] = PartitionLeader(node_id, address, epoch)
            self._nodes[node_id] = address
            return True

    # -- refreshing -------------------------------------------------------------------------

    def refresh(self, topics: Iterable[str], *, avoid: Collection[str] = ()) -> None:
        """Ask one storage node (one pass over the known nodes and the bootstrap list, no
        retry loop: callers have their own backoff and deadlines) for ``topics``' leaders.
        Raises BrokerNotAvailableError when no node answers. A refresh already in flight for
        a superset of ``topics`` is waited for instead of sending another.

        ``avoid``: nodes not to ask, because their own answer is the one in doubt (a leader
        cut off from etcd still answers that it leads, at its old epoch). Such a refresh is
        its own: it neither joins nor lends its answer to the refreshes in flight, and asks
        nothing when no other node is known (a one-node cluster: no other view exists)."""
        names = frozenset(topics)
        if not names:
            return
        if avoid:
            known = self.node_addresses()
            if known and known <= set(avoid):
                return
            source = self._require_source()
            md = source.metadata(
                sorted(names),
                retry_s=0.0,
                timeout_s=self._metadata_timeout_s,
                avoid=frozenset(avoid),
            )
            self.absorb(md, names)
            return
        with self._lock:
            flight = next((f for f in self._flights if names <= f.topics), None)
            mine = flight is None
            if flight is None:
                flight = _Flight(names)
                self._flights.append(flight)
        if not mine:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return
        try:
            assert self._source is not None, "a MetadataCache without a source cannot refresh"
            md = self._source.metadata(
                sorted(names), retry_s=0.0, timeout_s=self._metadata_timeout_s
            )
            self.absorb(md, names)
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                self._flights.remove(flight)
            flight.done.set()

    def mark_stale(self, topic: str) -> None:
        """Have ``topic`` looked up again by the next :meth:`refresh_stale`."""
        with self._lock:
            self._stale.add(topic)

    def stale(self) -> set[str]:
        with self._lock:
            return set(self._stale)

    def _delay(self, topic: str) -> float:
        """How long after its last refresh a stale topic is looked up again: ``backoff_s``,
        doubled for each further refresh in a row that did not help."""
        failures = self._failures.get(topic, 0)
        return min(self.backoff_s * (2 ** min(max(failures - 1, 0), 10)), self.backoff_max_s)

    def next_refresh_in(self, now: float | None = None) -> float | None:
        """Seconds until :meth:`refresh_stale` has a topic to look up (<= 0: now); None when
        no topic is stale."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._stale:
                return None
            return (
                min(self._last_refresh.get(t, float("-inf")) + self._delay(t) for t in self._stale)
                - now
            )

    def refresh_stale(self, now: float | None = None) -> None:
        """Refresh the stale topics whose backoff has passed, in one Metadata call. A topic
        stops being stale once every partition has a live leader, or when the nodes do not
        know it (deleted: whoever still needs it marks it again); each refresh in a row that
        did not help doubles the topic's wait (up to ``backoff_max_s``). Never raises for a
        refresh that failed: the topics stay stale."""
        now = time.monotonic() if now is None else now
        with self._lock:
            due = [
                t
                for t in self._stale
                if now - self._last_refresh.get(t, float("-inf")) >= self._delay(t)
            ]
            for t in due:
                self._last_refresh[t] = now
        if not due:
            return
        ok = True
        try:
            self.refresh(due)
        except StromError as exc:
            log.debug("metadata refresh of %s failed: %s", due, exc)
            ok = False
        with self._lock:
            for t in due:
                if ok and self._has_leaders(t):
                    self._stale.discard(t)
                    self._failures.pop(t, None)
                    continue
                self._failures[t] = self._failures.get(t, 0) + 1
                if ok and t not in self._partition_counts:
                    self._stale.discard(t)  # unknown: refreshing on its own cannot help

    # -- lookups that wait (user-facing calls) ---------------------------------------------

    def topic(self, topic: str, *, refresh: bool = True) -> storage_pb2.MetadataTopic:
        """The topic's entry in the nodes' metadata (``refresh=False``: the cached one, if
        any), retrying unreachable nodes for the source's ``retry_s``.

        A topic just created (or created while etcd was restarting) reaches the nodes through
        their etcd watches a moment after the controller committed it; when a node does not
        know the topic yet but the controller does, wait for it (up to ``retry_s``) instead
        of failing.
        """
        if not refresh:
            with self._lock:
                entry = self._entries.get(topic)
            if entry is not None:
                return entry
        source = self._require_source()
        entry = self._fetch_topic(source, topic)
        if entry is not None:
            return entry
        if self._controller_count(source, topic) is not None:
            entry = self._await_nodes(source, topic, lambda e: True)
            if entry is not None:
                return entry
            raise error_for(
                common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} exists but the nodes have not learnt it yet",
            )
        # The controller does not have it either: retrying cannot help.
        raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}", retriable=False)

    def _await_nodes(
        self,
        source: MetadataSource,
        topic: str,
        learnt: Callable[[storage_pb2.MetadataTopic], bool],
    ) -> storage_pb2.MetadataTopic | None:
        """Ask the nodes again (up to the source's ``retry_s``) until their entry for
        ``topic`` is ``learnt``; None if it never was."""
        deadline = time.monotonic() + source.retry_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            entry = self._fetch_topic(source, topic)
            if entry is not None and learnt(entry):
                return entry
        return None

    def _fetch_topic(self, source: MetadataSource, topic: str) -> storage_pb2.MetadataTopic | None:
        # Each call bounded as a refresh is: a hung node listed first (the leader that
        # stopped answering, before its lease ran out) must not hold the lookup for a whole
        # request timeout before the next node is asked.
        md = source.metadata([topic], timeout_s=self._metadata_timeout_s)
        self.absorb(md, [topic])
        for t in md.topics:
            if t.name == topic:
                if t.error_code == common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    return None
                if t.error_code != NONE:
                    raise error_for(t.error_code, t.error_message or f"topic {topic!r}")
                return t
        return None

    @staticmethod
    def _controller_count(source: MetadataSource, topic: str) -> int | None:
        """The topic's partition count as the active controller (which reads etcd directly)
        has it, or None when it does not have the topic or cannot be asked."""
        try:
            resp = source.controller_call(
                "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=[topic])
            )
        except StromError:
            return None
        for t in resp.topics:
            if t.name == topic and t.error_code == NONE:
                return len(t.partitions)
        return None

    def count_covering(self, topic: str, partition: int) -> int:
        """The topic's partition count once the nodes know ``partition`` of it.

        Partitions added by ``create_partitions`` reach the nodes through their etcd
        watches a moment after the controller committed them, as a new topic does: a client
        told "the topic has 3 partitions now" may still hear 1 from a node. When the nodes'
        count does not cover ``partition`` but the controller's does, wait for the nodes
        (up to the source's ``retry_s``); when the controller's does not either, the
        partition does not exist and waiting cannot help.
        """
        count = len(self.topic(topic).partitions)
        if 0 <= partition < count:
            return count
        if partition >= 0:
            source = self._require_source()
            known = self._controller_count(source, topic)
            if known is not None and partition < known:
                entry = self._await_nodes(source, topic, lambda e: partition < len(e.partitions))
                if entry is not None:
                    return len(entry.partitions)
                raise error_for(
                    common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"partition {partition} of topic {topic!r} exists (the topic has {known}) "
                    "but the nodes have not learnt it yet",
                )
            count = max(count, known or 0)
        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} has no partition {partition} (it has {count})", retriable=False
        )

    def leader_of(self, topic: str, partition: int, *, refresh: bool = False) -> str:
        """Address of the partition's leader; raises a StromError naming the problem."""
        count = len(self.topic(topic, refresh=refresh).partitions)
        if not 0 <= partition < count:
            self.count_covering(topic, partition)  # waits for new partitions, or raises
        leader = self._leaders.get(TopicPartition(topic, partition))
        if leader is None or leader.address is None:
            if not refresh:
                return self.leader_of(topic, partition, refresh=True)
            raise error_for(
                common_pb2.ErrorCode.LEADER_NOT_AVAILABLE,
                f"{topic}-{partition} has no live leader",
            )
        return leader.address

    def _require_source(self) -> MetadataSource:
        if self._source is None:
            raise StromError("this metadata cache has no cluster to ask")
        return self._source


__all__ = ["MetadataCache", "MetadataSource", "PartitionLeader", "node_address"]
