"""An in-memory, watch-maintained copy of one cluster's metadata in etcd.

Storage nodes, controllers and coordinators all need the same picture (live nodes, topics,
partition states, the active controller, coordinator shard owners) and must react to changes.
The view takes one snapshot of ``/strom/<cluster>/`` and then follows a watch from the
snapshot's revision, so no change between the two is missed (DESIGN §3). Listeners are called
on the watch thread with the events just applied; asyncio services hop to their loop with
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.message import DecodeError

from strom.api import metadata_pb2 as md
from strom.metadata.keys import Keys
from strom.metadata.store import MetadataStore, Versioned, Watch, WatchEvent, decode

log = logging.getLogger("strom.metadata.view")
Listener = Callable[[list[WatchEvent]], None]


class ClusterView:
    """Nodes, topics, partitions, controller and coordinator owners, kept current."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.keys = store.keys
        self.lock = threading.RLock()
        self.revision = 0
        self.cluster: md.ClusterInfo | None = None
        #: The id of the last cluster key this view saw, kept when the key goes: a cluster
        #: key that is missing after this view saw one means etcd lost its data, not a new
        #: cluster (the controller then refuses to create one).
        self.seen_cluster_id: str | None = None
        self.nodes: dict[int, Versioned] = {}
        self.topics: dict[str, Versioned] = {}
        self.partitions: dict[tuple[str, int], Versioned] = {}
        #: The same partition states by topic: one topic's partitions without a scan of
        #: every partition (Metadata for a topic, a reconcile of the topics that changed).
        self._by_topic: dict[str, dict[int, Versioned]] = {}
        self.controller: Versioned | None = None
        self.coordinators: dict[int, Versioned] = {}
        #: Owners of the shards of __transaction_state (transaction coordinators).
        self.txn_coordinators: dict[int, Versioned] = {}
        #: Live coordinator processes by incarnation (``coordinator_members/``).
        self.coordinator_members: dict[str, Versioned] = {}
        #: ACL bindings (by id) and client quotas (by principal), for strom.security.
        self.acls: dict[str, Versioned] = {}
        self.quotas: dict[str, Versioned] = {}
        self.producer_ids: Versioned | None = None
        #: Dynamic node configs (``node_configs``: the replication throttle rates).
        self.node_configs: Versioned | None = None
        self._listeners: list[Listener] = []
        self._watch: Watch | None = None
        self._changed = threading.Condition(self.lock)

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def start(self) -> None:
        """Snapshot and start following (blocking; retried while etcd is unreachable)."""
        self._resync()
        self._watch = self.store.watch_prefix(
            self.keys.root, self.revision + 1, self._on_events, on_reset=self._resync
        )

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def _resync(self) -> int:
        """Take a snapshot of every key and tell the listeners; returns its revision (the
        watch's reset goes on after it)."""
        rev, items = self.store.retry(
            lambda: self.store.get_prefix_raw(self.keys.root), deadline_s=60
        )
        with self.lock:
            self.nodes.clear()
            self.topics.clear()
            self.partitions.clear()
            self._by_topic.clear()
            self.coordinators.clear()
            self.txn_coordinators.clear()
            self.coordinator_members.clear()
            self.acls.clear()
            self.quotas.clear()
            self.controller = None
            # A snapshot without the cluster key (etcd's data wiped) must not leave the old
            # one in place: storage nodes would take the now empty view for that cluster.
            self.cluster = None
            self.producer_ids = None
            self.node_configs = None
            for ev in items:
                self._apply(ev)
            self.revision = rev
            self._changed.notify_all()
        for fn in list(self._listeners):
            try:
                # A listener's failure must not fail the snapshot: a watch's reset would
                # take it again and again.
                fn([RESYNC, *items])
            except Exception:
                log.exception("metadata listener failed")
        return rev

    def _on_events(self, events: list[WatchEvent], revision: int) -> None:
        with self.lock:
            for ev in events:
                self._apply(ev)
            self.revision = max(self.revision, revision)
            self._changed.notify_all()
        for fn in list(self._listeners):
            try:
                fn(events)
            except Exception:
                log.exception("metadata listener failed")

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds under the view's lock (re-checked on changes)."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout=timeout)

    def _apply(self, ev: WatchEvent) -> None:
        k = self.keys
        key = ev.key
        try:
            if key.startswith(k.partitions_prefix):
                tp = k.parse_partition(key)
                if tp is not None:
                    self._set(self.partitions, tp, ev, md.PartitionState)
                    v = self.partitions.get(tp)
                    if v is not None:
                        self._by_topic.setdefault(tp[0], {})[tp[1]] = v
                    else:
                        of_topic = self._by_topic.get(tp[0])
                        if of_topic is not None:
                            of_topic.pop(tp[1], None)
                            if not of_topic:
                                del self._by_topic[tp[0]]
            elif key.startswith(k.topics_prefix):
                self._set(self.topics, key[len(k.topics_prefix) :], ev, md.TopicMetadata)
            elif key.startswith(k.nodes_prefix):
                rest = key[len(k.nodes_prefix) :]
                if rest.isdigit():
                    self._set(self.nodes, int(rest), ev, md.NodeRegistration)
            elif key.startswith(k.acls_prefix):
                self._set(self.acls, key[len(k.acls_prefix) :], ev, md.AclBinding)
            elif key.startswith(k.quotas_prefix):
                self._set(self.quotas, key[len(k.quotas_prefix) :], ev, md.ClientQuota)
            elif key.startswith(k.txn_coordinators_prefix):
                rest = key[len(k.txn_coordinators_prefix) :]
                if rest.isdigit():
                    self._set(self.txn_coordinators, int(rest), ev, md.CoordinatorShardOwner)
            elif key.startswith(k.coordinator_members_prefix):
                rest = key[len(k.coordinator_members_prefix) :]
                self._set(self.coordinator_members, rest, ev, md.CoordinatorShardOwner)
            elif key.startswith(k.coordinators_prefix):
                rest = key[len(k.coordinators_prefix) :]
                if rest.isdigit():
                    self._set(self.coordinators, int(rest), ev, md.CoordinatorShardOwner)
            elif key == k.controller:
                self.controller = self._decode(ev, md.ControllerInfo)
            elif key == k.cluster:
                v = self._decode(ev, md.ClusterInfo)
                self.cluster = v.value if v else None
                if v is not None and v.value.cluster_id:
                    self.seen_cluster_id = v.value.cluster_id
            elif key == k.producer_ids:
                self.producer_ids = self._decode(ev, md.ProducerIdBlock)
            elif key == k.node_configs:
                self.node_configs = self._decode(ev, md.NodeConfigs)
        except (ValueError, DecodeError):
            log.warning("ignoring undecodable metadata at %s", key)

    @staticmethod
    def _decode(ev: WatchEvent, cls: Any) -> Versioned | None:
        if ev.value is None:
            return None
        return Versioned(ev.key, decode(ev.value, cls), ev.mod_revision, ev.mod_revision)

    def _set(self, table: dict[Any, Versioned], key: Any, ev: WatchEvent, cls: Any) -> None:
        v = self._decode(ev, cls)
        if v is None:
            table.pop(key, None)
        else:
            table[key] = v

    # -- convenient reads (copies, safe to use outside the lock) ---------------------------

    def live_nodes(self) -> dict[int, md.NodeRegistration]:
        with self.lock:
            return {i: v.value for i, v in self.nodes.items()}

    def topic(self, name: str) -> md.TopicMetadata | None:
        with self.lock:
            v = self.topics.get(name)
            return v.value if v else None

    def partition(self, topic: str, partition: int) -> Versioned | None:
        with self.lock:
            return self.partitions.get((topic, partition))

    def partitions_of(self, topic: str) -> dict[int, Versioned]:
        """The topic's partition states by index (a copy; costs the topic's partitions, not
        the cluster's)."""
        with self.lock:
            return dict(self._by_topic.get(topic, ()))

    def topic_partitions_locked(self, topic: str) -> Mapping[int, Versioned]:
        """The same without a copy: call with :attr:`lock` held and do not keep it."""
        return self._by_topic.get(topic, {})

    def controller_info(self) -> md.ControllerInfo | None:
        with self.lock:
            return self.controller.value if self.controller else None


#: The first event a resync hands its listeners, before the listing of every key: a listing
#: shows what exists, not what was deleted meanwhile, so what was derived from the view must be
#: rebuilt from all of it (``changed_topics`` answers None).
RESYNC = WatchEvent("", None, 0)


def changed_topics(keys: Keys, events: Iterable[WatchEvent]) -> set[str] | None:
    """The topics whose metadata or partition states ``events`` changed (deletes included),
    or None after a resync (anything may have changed): what a listener needs to redo only the
    work of the topics that changed. Other keys (nodes, the cluster, ACLs ...) are left out."""
    out: set[str] = set()
    for ev in events:
        if ev is RESYNC:
            return None
        if ev.key.startswith(keys.topics_prefix):
            out.add(ev.key[len(keys.topics_prefix) :])
            continue
        tp = keys.parse_partition(ev.key) if ev.key.startswith(keys.partitions_prefix) else None
        if tp is not None:
            out.add(tp[0])
    return out
