"""A storage node is *ready* when it is registered and back in the ISR of every partition it
replicates.

The gRPC health status ``""`` says the process has started (and ``strom.ready``, see
:data:`strom.service.runtime.READY_SERVICE`, reports this); Kubernetes' readiness needs more
for a storage node. A StatefulSet's rolling restart moves to the next pod once this one is
Ready, and a PodDisruptionBudget counts Ready pods: a node that restarted but has not caught up
yet is still missing from its partitions' ISRs, so restarting the next node would leave some
partitions with one in-sync replica (acks=all refused under ``min.insync.replicas``) or none
(offline until that node returns). Kafka operators wait for the same thing before rolling on.

What does not hold readiness back: a partition with no leader or a leader that is not
registered (nothing to catch up from: it must not block a restart that would bring it back),
this node leading (a leader is in its ISR), and a replica being added or removed by a
reassignment (a long copy is not a restart's business).

The set of lagging partitions is kept from the cluster view's events: a partition's own event
re-checks that partition, a node's registration (a leader coming or going) or a resync checks
them all, so a burst of ISR changes costs what it changes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable

from strom.api import metadata_pb2 as md
from strom.metadata.store import WatchEvent
from strom.metadata.view import RESYNC, ClusterView


def lags(node_id: int, state: md.PartitionState, live: Iterable[int]) -> bool:
    """Whether this replica of ``state`` still has to catch up into the ISR."""
    if node_id not in state.replicas or node_id in state.isr:
        return False
    if node_id in state.adding_replicas or node_id in state.removing_replicas:
        return False
    return state.leader >= 0 and state.leader != node_id and state.leader in live


class InSyncReadiness:
    """Tracks the partitions this node replicates outside their ISR; ready when none."""

    def __init__(self, node_id: int, view: ClusterView) -> None:
        self.node_id = node_id
        self.view = view
        self.lagging: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._changed: Callable[[], None] | None = None
        self.recheck_all()

    def ready(self) -> bool:
        return self.registered() and not self.lagging_any()

    def registered(self) -> bool:
        """Whether this node's own registration is in the view. A node whose key is gone
        (its lease lost, not registered again yet) is not ready whatever its ISRs say: the
        controller takes it for dead, and leaders drop it from their ISRs (found from
        outside: a node left unregistered for good answered ready while every partition it
        led was offline)."""
        with self.view.lock:
            return self.node_id in self.view.nodes

    def lagging_any(self) -> bool:
        with self._lock:
            return bool(self.lagging)

    def why_not(self) -> str:
        """Why the node is not ready, for the log line of the change."""
        return "not registered in etcd" if not self.registered() else "catching up"

    def recheck_all(self) -> None:
        view = self.view
        with view.lock:
            live = set(view.nodes)
            found = {tp for tp, v in view.partitions.items() if lags(self.node_id, v.value, live)}
        with self._lock:
            self.lagging = found

    def on_view_events(self, events: list[WatchEvent]) -> None:
        """A cluster-view listener (called on the view's watch thread)."""
        keys = self.view.keys
        tps: set[tuple[str, int]] = set()
        for ev in events:
            if ev is RESYNC or ev.key.startswith(keys.nodes_prefix):
                self.recheck_all()
                break
            if ev.key.startswith(keys.partitions_prefix):
                tp = keys.parse_partition(ev.key)
                if tp is not None:
                    tps.add(tp)
        else:
            if tps:
                view = self.view
                with view.lock:
                    live = set(view.nodes)
                    now = {
                        tp: (v is not None and lags(self.node_id, v.value, live))
                        for tp in tps
                        for v in (view.partitions.get(tp),)
                    }
                with self._lock:
                    for tp, lagging in now.items():
                        if lagging:
                            self.lagging.add(tp)
                        else:
                            self.lagging.discard(tp)
        changed = self._changed
        if changed is not None:
            changed()

    async def run(self, report: Callable[[bool], Awaitable[None]], stop: asyncio.Event) -> None:
        """Report readiness now and on every change until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        self._changed = lambda: loop.call_soon_threadsafe(wake.set)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            reported: bool | None = None
            while not stop.is_set():
                wake.clear()
                ready = self.ready()
                if ready != reported:
                    await report(ready)
                    reported = ready
                waiting = asyncio.ensure_future(wake.wait())
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
        finally:
            self._changed = None
            stopping.cancel()
