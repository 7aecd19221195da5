"""Which storage node registrations are live, as the coordinator's cluster view shows them.

A group member that a storage node runs for a RecordService Subscribe stream lives and dies
with that node process (DESIGN §7): when the process crashes, hangs past its etcd lease or is
cut off, nothing heartbeats for the member, and Kafka's rule would leave its partitions unread
for the whole session timeout (45 s). The node's registration (``nodes/<id>``, bound to its
lease) ends within about two seconds of that, and so does the member here: the heartbeat
stamps the member with the *session* of the registration its node named
(:class:`~strom.coordinator.group_types.HostNode`), and the timer loop removes members whose
session is no longer live (:meth:`~strom.coordinator.group.ConsumerGroup.fence_gone_hosts`).

A session is one uninterrupted registration of one node incarnation, numbered by this process.
It is followed here from the view's watch events, not read from the view's revisions: a node
that lost its lease registers again under the same incarnation id (a new key), and only the
delete event in between tells the two registrations apart. After a resync (the watch missed
events) only what the view shows now can be compared: a node missing or with another
incarnation ends its session; one that was deleted and registered again meanwhile under the
same incarnation keeps it (its members were alive enough to heartbeat, or their session
timeout removes them).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping

from strom.metadata import WatchEvent
from strom.metadata.view import RESYNC


class NodeSessions:
    """Node id -> (incarnation id, session number) of the live registrations (thread-safe:
    updated on the view's watch thread, read on the event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[int, tuple[str, int]] = {}
        self._numbers = itertools.count(1)

    def update(
        self, nodes_prefix: str, events: Iterable[WatchEvent], live: Mapping[int, str]
    ) -> None:
        """Follow one batch of view events; ``live`` is node id -> incarnation id as the view
        shows after them (the view is updated before its listeners run)."""
        ended: set[int] = set()
        for ev in events:
            if ev is RESYNC:
                continue
            if ev.value is None and ev.key.startswith(nodes_prefix):
                rest = ev.key[len(nodes_prefix) :]
                if rest.isdigit():
                    ended.add(int(rest))
        with self._lock:
            for node in ended:
                self._sessions.pop(node, None)
            for node in [n for n in self._sessions if n not in live]:
                del self._sessions[node]
            for node, incarnation in live.items():
                held = self._sessions.get(node)
                if held is None or held[0] != incarnation:
                    self._sessions[node] = (incarnation, next(self._numbers))

    def session_of(self, node_id: int, incarnation_id: str) -> int | None:
        """The live session of that node process, or None (not registered, another
        incarnation registered, or not seen yet by this view)."""
        with self._lock:
            held = self._sessions.get(node_id)
        return held[1] if held is not None and held[0] == incarnation_id else None

    def live(self) -> dict[int, int]:
        """Node id -> live session number."""
        with self._lock:
            return {n: s for n, (_, s) in self._sessions.items()}
