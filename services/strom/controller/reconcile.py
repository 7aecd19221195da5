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


class Reconciler(PartitionStates):
    """The reconcile loop and one reconciliation pass."""

    #: Set (from the watch thread) when nodes or partitions changed; the reconcile loop
    #: runs a pass for each wake-up. _node_gone_at = monotonic time a node key vanished.
    _reconcile_wanted: asyncio.Event | None
    _node_gone_at: float | None

    def _reconcile_wanted_now(self, gone_at: float | None = None) -> None:
        if gone_at is not None and self._node_gone_at is None:
            self._node_gone_at = gone_at
        if self._reconcile_wanted is not None:
            self._reconcile_wanted.set()

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
            try:
                async with self._locked():
                    if self._leadership is not lead:
                        self._reconcile_wanted_now(gone_at)
                        return
                    changed = await asyncio.to_thread(self._reconcile_sync, lead)
                if gone_at is not None:
                    elapsed = time.monotonic() - gone_at
                    metrics.FAILOVER_SECONDS.observe(elapsed)
                    if changed:
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
                self._reconcile_wanted_now(gone_at)
                await asyncio.sleep(0.2)  # etcd unreachable: do not spin
            except Exception:
                log.exception("reconciliation failed")

    def _reconcile_sync(self, lead: Leadership, exclude: Iterable[int] = ()) -> int:
        """Bring every partition in line with node liveness (blocking); states written."""

        def decide() -> list[PartitionDecision]:
            _, alive, eligible = self._liveness(exclude)
            decisions = []
            for tp, (key, v, topic) in self._partitions_sync().items():
                d = leadership.reconcile(
                    v.value,
                    alive,
                    eligible,
                    unclean=self._unclean(topic),
                    auto_preferred=self.auto_leader_rebalance,
                )
                if d is not None:
                    decisions.append(PartitionDecision(tp, key, v.mod_revision, d))
            return decisions

        gave_up = "partition states kept changing during reconciliation"
        return self._decide_and_commit(lead, decide, gave_up=gave_up).written
