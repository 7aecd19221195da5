"""How a controller becomes, stays and stops being the active one (DESIGN §2).

Several controllers run; one is active. Each campaigns through :class:`strom.metadata.Election`
on the ``controller`` key with its :class:`ControllerInfo`; the winner rewrites the key (same
lease) with ``epoch`` = the key's create revision, which increases with every new winner.
Standbys answer every RPC with NOT_CONTROLLER and the active controller's address.

A controller that becomes active first finishes what a previous one left half-done (topics
marked ``deleting``, partition keys of no topic), then reconciles every partition. While
active it holds health streams to every storage node (fast failure detection, prober.py);
while a standby, one to the active controller, so a killed active is replaced without
waiting for its lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from strom.api import metadata_pb2 as md
from strom.clock import wall_ms
from strom.controller import metrics
from strom.controller.core import Fenced, Leadership
from strom.controller.prober import NodeProber
from strom.controller.reconcile import Reconciler
from strom.metadata import (
    RESYNC,
    Election,
    MetadataUnavailableError,
    Versioned,
    WatchEvent,
    changed_topics,
    decode,
    encode,
)

log = logging.getLogger("strom.controller")

#: Version of the etcd layout written into ClusterInfo.
METADATA_VERSION = 1


class ActiveRole(Reconciler):
    """Campaigning, activation, stepping down, and the probers that speed up takeovers."""

    _loop: asyncio.AbstractEventLoop | None
    _tasks: set[asyncio.Task[Any]]

    # -- election ----------------------------------------------------------------------------

    def _candidate_info(self) -> md.ControllerInfo:
        return md.ControllerInfo(
            controller_id=self.controller_id,
            host=self.advertise_host,
            port=self.advertise_port,
            metrics_port=self.metrics_port,
            epoch=-1,  # set to the key's create revision right after winning
            incarnation_id=self.incarnation_id,
        )

    def _start_election(self) -> None:
        assert self.store is not None
        election = Election(
            self.store,
            self.store.keys.controller,
            self._candidate_info(),
            ttl_s=self.session_timeout_s,
            on_elected=lambda rev: self._from_thread(self._activate, election, rev),
            on_lost=lambda: self._from_thread(self._lose, election, "lease lost"),
        )
        self._election = election
        election.start()

    def acting_as_active(self) -> bool:
        """Whether this controller holds the leadership and its election lease surely lives
        (not :meth:`KeepAlive.may_have_expired`): what ``strom_controller_active`` reports
        when scraped (:meth:`export_active_gauge`), and whether it answers admin requests as
        the active controller (:meth:`ControllerCore._handle`; else NOT_CONTROLLER).

        Why not just "leadership held": a controller cut off from etcd (an outage, a pause)
        hears of its lease's loss only when it reaches etcd again, and meanwhile a standby
        may have taken over. Reporting 1 all that time would sum 2 across the controllers
        (StromMultipleActiveControllers) and, with nobody able to act, keep
        StromNoActiveController silent."""
        if self._leadership is None:
            return False
        keepalive = getattr(self._election, "_keepalive", None)
        return keepalive is None or not keepalive.may_have_expired()

    def export_active_gauge(self) -> None:
        """``strom_controller_active`` from :meth:`acting_as_active`, when scraped."""
        metrics.ACTIVE.set_function(lambda: 1.0 if self.acting_as_active() else 0.0)

    def _from_thread(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run coroutine function ``fn(*args)`` on the service loop (called from etcd threads)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closing
            loop.call_soon_threadsafe(self._spawn, fn(*args))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _activate(self, election: Election, create_revision: int) -> None:
        """Won the election: stamp the epoch, catch the view up, then serve as active."""
        assert self._write_lock is not None and self.store is not None and self.view is not None
        async with self._write_lock:
            if not self._still_elected(election, create_revision):
                return  # superseded: resigned, stopping, or lost and won again since
            store, view = self.store, self.view
            info = self._candidate_info()
            info.epoch = create_revision
            info.elected_ms = wall_ms()
            try:
                current = await asyncio.to_thread(
                    store.retry,
                    lambda: self._stamp_epoch(election, create_revision, info),
                    deadline_s=max(self.session_timeout_s, 2),
                )
            except MetadataUnavailableError as exc:
                current = None
                log.warning("could not confirm leadership: %s", exc)
            if current is None:
                if self._still_elected(election, create_revision):
                    # The key is gone or someone else's: campaign again from scratch.
                    await self._restart_election(election, "election key lost before activation")
                return
            # Catch up with everything committed up to our own write before acting on the view.
            await asyncio.to_thread(
                view.wait_for, lambda: view.revision >= current.mod_revision, 10.0
            )
            lead = Leadership(
                create_revision=create_revision,
                mod_revision=current.mod_revision,
                epoch=create_revision,
                elected_ms=info.elected_ms,
            )
            try:
                await asyncio.to_thread(self._cleanup_sync, lead)
            except Fenced:
                await self._restart_election(election, "fenced while activating")
                return
            except MetadataUnavailableError as exc:
                log.warning("startup housekeeping failed, continuing: %s", exc)
            if not self._still_elected(election, create_revision):
                return  # the lease was lost meanwhile; a later on_elected will come
            self._leadership = lead
            self._new_term()
            self._stop_following_active()
            self._start_prober()
            # A node may have died while no controller was active: reconcile everything now.
            self._reconcile_wanted_now()
            self._spawn(self._reconcile_loop(lead))
            log.info(
                "controller %d is now active (epoch %d)",
                self.controller_id,
                lead.epoch,
                extra={"fields": {"controller_id": self.controller_id, "epoch": lead.epoch}},
            )

    # -- fast failure detection -------------------------------------------------------------

    def _start_prober(self) -> None:
        if self.fast_failure_detection and self._prober is None:
            self._prober = NodeProber(self._node_dead)
            self._update_prober()

    def _stop_prober(self) -> None:
        prober, self._prober = self._prober, None
        if prober is not None:
            prober.stop()

    def _update_prober(self) -> None:
        """Follow the registered nodes (event loop only)."""
        if self._prober is None or self.view is None:
            return
        with self.view.lock:
            nodes = {
                nid: (f"{v.value.host}:{v.value.port}", v.value.incarnation_id)
                for nid, v in self.view.nodes.items()
            }
        self._prober.update(nodes)

    async def _node_dead(self, node_id: int, incarnation_id: str) -> None:
        """The prober proved a node dead: end its registration now (as lease expiry would)."""
        if self._leadership is None or self.store is None:
            return
        self._node_changes.fencing(node_id, incarnation_id)
        if await self._revoke_if_incarnation(
            self.store.keys.node(node_id),
            md.NodeRegistration,
            incarnation_id,
            f"node {node_id}",
            # A node that published SHUTTING_DOWN (before it stopped its server) is leaving
            # cleanly and ends its registration itself: not a crash to fence.
            also=lambda value: value.state != md.NODE_STATE_SHUTTING_DOWN,
        ):
            metrics.NODES_FENCED.inc()
            log.warning("revoked the lease of node %d, which refuses connections", node_id)
        else:
            self._node_changes.not_fencing(node_id)

    async def _revoke_if_incarnation(
        self,
        key: str,
        kind: type[Any],
        incarnation_id: str,
        what: str,
        also: Callable[[Any], bool] = lambda value: True,
    ) -> bool:
        """Revoke the lease ``key`` is bound to while it still holds ``incarnation_id`` (and
        the value passes ``also``), deleting it as lease expiry would; False if it did not,
        or etcd did not answer."""
        assert self.store is not None
        try:
            return await asyncio.to_thread(
                self.store.revoke_lease_if,
                key,
                kind,
                lambda value: value.incarnation_id == incarnation_id and also(value),
            )
        except MetadataUnavailableError as exc:
            log.warning("could not revoke the lease of dead %s: %s", what, exc)
            return False

    # -- a standby's fast detection of a dead active controller ------------------------------

    def _follow_active(self) -> None:
        """While a standby, hold a health stream to the active controller (event loop only).

        The election key lives on the active's etcd lease, so without this a standby takes
        over only when that lease expires (TTL 2 s + up to a keepalive interval). A killed
        process closes its sockets at once: when the stream breaks and every fresh connection
        is *refused* (the same proof the node prober uses), the standby revokes the lease of
        the election key — only while the key still holds that same incarnation — which
        deletes the key exactly as expiry would, and the standbys campaign at once.

        Safety does not rest on this judgement: a controller that were alive after all finds
        its election key gone, and every write it tries compares that key's mod_revision, so
        it commits nothing more and steps down (as after an expiry). Two controllers never
        both commit.
        """
        if not self.fast_failure_detection or self.view is None or self._stopping:
            return
        if self._leadership is not None:
            self._stop_following_active()
            return
        with self.view.lock:
            current = self.view.controller
        target: dict[int, tuple[str, str]] = {}
        if current is not None and current.value.incarnation_id != self.incarnation_id:
            info = current.value
            if info.host and info.port:
                target[info.controller_id] = (f"{info.host}:{info.port}", info.incarnation_id)
        if not target:
            metrics.FOLLOWING_ACTIVE.set(0)
        if self._active_prober is None:
            if not target:
                return
            self._active_prober = NodeProber(
                self._active_dead,
                kind="active controller",
                on_reached=lambda _cid, up: metrics.FOLLOWING_ACTIVE.set(1 if up else 0),
            )
        self._active_prober.update(target)

    def _stop_following_active(self) -> None:
        prober, self._active_prober = self._active_prober, None
        if prober is not None:
            prober.stop()
        metrics.FOLLOWING_ACTIVE.set(0)

    async def _active_dead(self, controller_id: int, incarnation_id: str) -> None:
        """The active controller refuses connections: end its election lease now."""
        if self._leadership is not None or self.store is None or self._stopping:
            return
        if await self._revoke_if_incarnation(
            self.store.keys.controller,
            md.ControllerInfo,
            incarnation_id,
            f"controller {controller_id}",
        ):
            metrics.CONTROLLERS_FENCED.inc()
            log.warning(
                "revoked the election lease of controller %d, which refuses connections",
                controller_id,
            )

    def _still_elected(self, election: Election, create_revision: int) -> bool:
        return (
            election is self._election
            and not self._stopping
            and election.leader
            and election.create_revision == create_revision
        )

    def _stamp_epoch(
        self, election: Election, create_revision: int, info: md.ControllerInfo
    ) -> Versioned | None:
        """Rewrite our election key with the epoch, keeping its lease (blocking)."""
        assert self.store is not None
        store, key = self.store, self.store.keys.controller
        keepalive = election._keepalive  # the lease the key is bound to
        if keepalive is None:
            return None
        # First, so that the view has the cluster id once it has caught up with the stamp.
        self._ensure_cluster_key()
        t = store.client.transactions
        ok, _ = store._call(
            store.client.transaction,
            compare=[t.create(key) == create_revision],
            success=[t.put(key, encode(info), lease=keepalive.lease)],
            failure=[],
        )
        if not ok:
            return None
        current = store.get(key, md.ControllerInfo)
        if current is None or current.create_revision != create_revision:
            return None
        return current

    def _ensure_cluster_key(self) -> None:
        """Create the cluster key (a new cluster id) if etcd has none, as the first active
        controller of a new cluster does (blocking).

        A controller whose view has seen a cluster id creates none but logs an error: the
        key is gone because etcd came back without its data (wiped, or restored from before
        the cluster existed), and a new cluster would replace the one it served. The
        storage nodes stop with their data untouched until etcd's data is restored (to
        start a new cluster on purpose, restart the controllers)."""
        assert self.store is not None
        seen = self.view.seen_cluster_id if self.view is not None else None
        if seen is not None:
            if self.store.get(self.store.keys.cluster, md.ClusterInfo) is None:
                log.error(
                    "cluster %r has no cluster key in etcd, but this controller saw its id %s: "
                    "etcd lost its data; not creating a new cluster (restore etcd's data; "
                    "restart the controllers to start a new cluster instead)",
                    self.cluster,
                    seen,
                )
            return
        info = md.ClusterInfo(
            cluster_id=str(uuid.uuid4()), created_ms=wall_ms(), metadata_version=METADATA_VERSION
        )
        if self.store.create(self.store.keys.cluster, info):
            log.info("created cluster %r with id %s", self.cluster, info.cluster_id)

    async def _lose(self, election: Election, reason: str) -> None:
        if election is not self._election:
            return
        if self._leadership is not None:
            log.warning("controller %d is no longer active: %s", self.controller_id, reason)
        self._leadership = None
        self._new_term()
        self._stop_prober()
        self._follow_active()

    async def _restart_election(self, election: Election, reason: str) -> None:
        """Drop ``election`` (its key is no longer ours) and campaign with a fresh one."""
        await self._lose(election, reason)
        if election is not self._election or self._stopping:
            return
        self._election = None
        await asyncio.to_thread(election.resign)  # deletes only a key it created itself
        if not self._stopping:
            self._start_election()

    def _update_gauges(self) -> None:
        if self.view is not None:
            metrics.update_gauges(self.view)

    def _on_view_events(self, events: list[WatchEvent]) -> None:
        """Watch thread: keep gauges current and notice when our election key changes."""
        self._update_gauges()
        assert self.store is not None
        keys = self.store.keys
        if any(ev is RESYNC or ev.key.startswith(keys.nodes_prefix) for ev in events):
            self._note_node_changes()
        node_gone = any(ev.key.startswith(keys.nodes_prefix) and ev.value is None for ev in events)
        nodes_changed = any(ev.key.startswith(keys.nodes_prefix) for ev in events)
        if self._prober is not None and any(ev.key.startswith(keys.nodes_prefix) for ev in events):
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._update_prober)
        if self._leadership is not None and any(
            ev.key.startswith((keys.nodes_prefix, keys.partitions_prefix, keys.topics_prefix))
            for ev in events
        ):
            loop = self._loop
            if loop is not None and not loop.is_closed():
                now = time.monotonic()
                # Nodes changed: every partition may be concerned; else only the topics whose
                # metadata or partition states changed (see strom.controller.reconcile).
                topics = None if nodes_changed else changed_topics(keys, events)
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(
                        self._reconcile_wanted_now, now if node_gone else None, topics
                    )
        if any(ev.key == self.store.keys.controller for ev in events):
            self._from_thread(self._check_election_key)
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._follow_active)

    def _note_node_changes(self) -> None:
        """Watch thread: log which storage nodes registered or left (the active controller
        only; a standby keeps track, so that it has no news to tell when it takes over)."""
        view = self.view
        assert view is not None
        with view.lock:
            now = {i: v.value for i, v in view.nodes.items()}

        def led_by(node_id: int) -> int:
            # The partitions not yet moved: the reconcile this change wakes moves them.
            with view.lock:
                return sum(1 for v in view.partitions.values() if v.value.leader == node_id)

        def controlled(node_id: int, reg: md.NodeRegistration) -> bool:
            return (
                reg.state == md.NODE_STATE_SHUTTING_DOWN
                or self._shutting_down.get(node_id) == reg.incarnation_id
            )

        self._node_changes.observe(
            now, led_by=led_by, controlled=controlled, report=self._leadership is not None
        )

    async def _check_election_key(self) -> None:
        lead, view, election = self._leadership, self.view, self._election
        if lead is None or view is None or election is None:
            return
        with view.lock:
            current = view.controller
            caught_up = view.revision >= lead.mod_revision
        if caught_up and (current is None or current.mod_revision != lead.mod_revision):
            async with self._locked():
                if self._leadership is lead:
                    await self._restart_election(election, "election key deleted or replaced")

    # -- housekeeping when becoming active ---------------------------------------------------

    def _cleanup_sync(self, lead: Leadership) -> None:
        """Finish what a previous controller left half-done (blocking).

        Topics marked ``deleting`` lose their keys; partition keys that belong to no topic
        (an interrupted multi-transaction creation or growth) are deleted.
        """
        assert self.store is not None
        store, keys = self.store, self.store.keys
        _, topics = store.get_prefix(keys.topics_prefix, md.TopicMetadata)
        by_name = {v.value.name or k[len(keys.topics_prefix) :]: v for k, v in topics.items()}
        for name, v in by_name.items():
            if v.value.deleting:
                self._txn(
                    lead,
                    [(keys.topic(name), v.mod_revision)],
                    deletes=[keys.topic(name)],
                    delete_prefixes=[keys.partitions_of(name)],
                )
                log.info("finished deleting topic %s", name)
        _, parts = store.get_prefix_raw(keys.partitions_prefix)
        orphans: list[str] = []
        for ev in parts:
            tp = keys.parse_partition(ev.key)
            if tp is None or ev.value is None:
                continue
            topic = by_name.get(tp[0])
            try:
                state = decode(ev.value, md.PartitionState)
            except Exception:
                continue
            if (
                topic is None
                or topic.value.deleting
                or tp[1] >= topic.value.partition_count
                or (state.topic_id and state.topic_id != topic.value.topic_id)
            ):
                orphans.append(ev.key)
        for i in range(0, len(orphans), self.max_txn_ops):
            self._txn(lead, [], deletes=orphans[i : i + self.max_txn_ops])
        if orphans:
            log.info("deleted %d orphaned partition keys", len(orphans))
