"""Reconciliation: the active controller brings every partition in line with node liveness
(DESIGN §6).

It runs whenever the view reports a change of nodes, topics or partition states (and once
when a controller becomes active, since a node may have died while no controller was): a
node whose key vanished (lease expired) or that is SHUTTING_DOWN loses its leaderships and
ISR memberships, finished reassignments complete, and (with ``auto_leader_rebalance``) a
preferred replica back in the ISR leads again. Wake-ups are coalesced; a pass reads the
nodes, topics and partitions from etcd and commits the changed states
(:meth:`PartitionStates._decide_and_commit`); a failed compare re-runs the pass. Nothing
sleeps on this path.

What a pass reads: after a change of nodes (or on activation, or after a failed pass) every
partition, since liveness concerns them all; after changes of topics or partition states
only, just those topics (up to :data:`MAX_NARROW_TOPICS` of them). A partition's decision
depends only on its own state, its topic's configs and node liveness, so the narrow pass
decides exactly what a full one would for what changed, and the rest is unchanged since the
last pass. Why: a full pass reads and compares every partition, so at 5,000 partitions each
change cost the controller ~87 ms of CPU and building N partitions one change at a time was
O(N^2) work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from strom.controller import leadership, metrics
from strom.controller.core import Fenced, Leadership
from strom.controller.partition_states import PartitionDecision, PartitionStates
from strom.metadata import MetadataUnavailableError

log = logging.getLogger("strom.controller")
#: A wake-up for more changed topics than this reads everything (one read of the whole
#: prefix beats two reads per topic).
MAX_NARROW_TOPICS = 32


class Reconciler(PartitionStates):
    """The reconcile loop and one reconciliation pass."""

    #: Set (from the watch thread) when nodes or partitions changed; the reconcile loop
    #: runs a pass for each wake-up. _node_gone_at = monotonic time a node key vanished.
    _reconcile_wanted: asyncio.Event | None
    _node_gone_at: float | None
    #: What the next pass reads: these topics only, or everything (None). Changed on the
    #: event loop only.
    _reconcile_topics: set[str] | None = None

    def _reconcile_wanted_now(
        self, gone_at: float | None = None, topics: Iterable[str] | None = None
    ) -> None:
        """Ask for a pass over ``topics`` (their partitions changed), or over everything
        (None: nodes changed, activation, a failed pass). Event loop only."""
        if gone_at is not None and self._node_gone_at is None:
            self._node_gone_at = gone_at
        wanted = self._reconcile_wanted
        if topics is None or self._reconcile_topics is None:
            self._reconcile_topics = None
        else:
            self._reconcile_topics.update(topics)
            if len(self._reconcile_topics) > MAX_NARROW_TOPICS:
                self._reconcile_topics = None
        if wanted is not None:
            wanted.set()

    def _new_term(self) -> None:
        """A leadership starts or ends: a node-left time seen in an earlier term is not this
        term's failover. Kept, the first pass of the next active term would observe the whole
        standby time in strom_controller_failover_seconds."""
        self._node_gone_at = None

    async def _reconcile_loop(self, lead: Leadership) -> None:
        """While ``lead`` is ours: one reconciliation pass per wake-up (coalesced), no sleeps."""
        wanted = self._reconcile_wanted
        assert wanted is not None
        while self._leadership is lead and not self._stopping:
            await wanted.wait()
            if self._leadership is not lead:
                return  # leave the wake-up to the loop of a later leadership
            wanted.clear()
            gone_at, self._node_gone_at = self._node_gone_at, None
            topics, self._reconcile_topics = self._reconcile_topics, set()
            try:
                async with self._locked():
                    if self._leadership is not lead:
                        # The pass is a later leadership's, and so is its failover clock.
                        self._reconcile_wanted_now(None, topics)
                        return
                    changed = await asyncio.to_thread(
                        self._reconcile_sync, lead, (), None if topics is None else sorted(topics)
                    )
                # A pass that committed nothing moved no partition: no failover to time (a
                # node without replicas left, or another pass already moved them).
                if gone_at is not None and changed:
                    elapsed = time.monotonic() - gone_at
                    metrics.FAILOVER_SECONDS.observe(elapsed)
                    log.info(
                        "failover: %d partition states committed %.3fs after a node left",
                        changed,
                        elapsed,
                    )
            except Fenced:
                election = self._election
                if election is not None:
                    async with self._locked():
                        if self._leadership is lead:
                            await self._restart_election(election, "fenced while reconciling")
                return
            except MetadataUnavailableError as exc:
                log.warning("reconciliation failed, retrying on the next change: %s", exc)
                # Everything: what failed is unknown. The failover clock runs on while this
                # leadership lasts.
                self._reconcile_wanted_now(gone_at if self._leadership is lead else None)
                await asyncio.sleep(0.2)  # etcd unreachable: do not spin
            except Exception:
                log.exception("reconciliation failed")
                self._reconcile_topics = None  # the next pass (on the next change) reads all

    def _reconcile_sync(
        self, lead: Leadership, exclude: Iterable[int] = (), topics: Iterable[str] | None = None
    ) -> int:
        """Bring every partition (or those of ``topics``) in line with node liveness
        (blocking); states written."""
        names = None if topics is None else list(topics)
        if names == []:
            return 0
        metrics.RECONCILE_PASSES.labels("all" if names is None else "topics").inc()

        def decide() -> list[PartitionDecision]:
            nodes, alive, eligible = self._liveness(exclude)
            # A node excluded here is being shut down, whatever state it registered.
            starting = leadership.starting_nodes(nodes) - set(exclude)
            parts = self._partitions_sync() if names is None else self._topic_partitions_sync(names)
            decisions = []
            for tp, (key, v, topic) in parts.items():
                d = leadership.reconcile(
                    v.value,
                    alive,
                    eligible,
                    unclean=self._unclean(topic),
                    auto_preferred=self.auto_leader_rebalance,
                    starting=starting,
                )
                if d is not None:
                    decisions.append(PartitionDecision(tp, key, v.mod_revision, d))
            return decisions

        gave_up = "partition states kept changing during reconciliation"
        return self._decide_and_commit(lead, decide, gave_up=gave_up).written
