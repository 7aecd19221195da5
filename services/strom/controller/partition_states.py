"""Partition states as the active controller reads and commits them (DESIGN §6).

Leadership decisions are the pure functions of :mod:`strom.controller.leadership`; this
module feeds them (nodes and partitions read straight from etcd, since CAS needs the current
mod_revision anyway) and commits what they decide: in transactions of up to
``RECONCILE_BATCH`` partitions, each comparing every key's mod_revision and the controller
key, read-decide-commit again on a conflict (:func:`strom.controller.cas.commit_with_retry`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import NamedTuple

from strom.api import metadata_pb2 as md
from strom.controller import leadership, metrics
from strom.controller.cas import commit_with_retry
from strom.controller.configs import _effective
from strom.controller.core import ControllerCore, Leadership
from strom.metadata import Versioned

log = logging.getLogger("strom.controller")

#: Most partition states one reconciliation transaction writes.
RECONCILE_BATCH = 100
#: Read-decide-commit rounds before a leadership write gives up with REQUEST_TIMED_OUT.
ATTEMPTS = 20


class PartitionDecision(NamedTuple):
    """A new state for one partition, decided from the state at ``mod_revision``."""

    tp: tuple[str, int]
    key: str
    mod_revision: int
    decision: leadership.Decision


class Settled(NamedTuple):
    """What a read-decide-commit loop achieved."""

    #: Partition epochs the last (successful) round committed, for read-your-writes.
    committed: dict[tuple[str, int], int]
    #: States all rounds wrote (a round that lost a compare may have committed other batches).
    written: int


class PartitionStates(ControllerCore):
    """Reading nodes and partitions from etcd and committing leadership decisions."""

    #: Decoded partition states by key: (mod_revision, state), see get_prefix_cached.
    _state_cache: dict[str, tuple[int, md.PartitionState]]

    def _liveness(
        self, exclude: Iterable[int] = ()
    ) -> tuple[dict[int, md.NodeRegistration], set[int], set[int]]:
        """(registered nodes, alive ids, eligible ids) from etcd (blocking)."""
        assert self.store is not None
        _, items = self.store.get_prefix(self.store.keys.nodes_prefix, md.NodeRegistration)
        nodes = {v.value.node_id: v.value for v in items.values()}
        alive = set(nodes)
        eligible = leadership.eligible_nodes(nodes, self._shutting_down) - set(exclude)
        return nodes, alive, eligible

    def _partitions_sync(
        self, wanted: set[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], tuple[str, Versioned, md.TopicMetadata]]:
        """Live partitions from etcd: (topic, p) -> (key, versioned state, topic) (blocking)."""
        assert self.store is not None
        store, keys = self.store, self.store.keys
        _, topics = store.get_prefix(keys.topics_prefix, md.TopicMetadata)
        by_name = {v.value.name: v.value for v in topics.values()}
        _, parts = store.get_prefix_cached(
            keys.partitions_prefix, md.PartitionState, self._state_cache
        )
        out: dict[tuple[str, int], tuple[str, Versioned, md.TopicMetadata]] = {}
        for key, v in parts.items():
            tp = keys.parse_partition(key)
            if tp is None or (wanted is not None and tp not in wanted):
                continue
            topic = by_name.get(tp[0])
            if topic is not None and _live(tp, v, topic):
                out[tp] = (key, v, topic)
        return out

    def _topic_partitions_sync(
        self, names: Iterable[str]
    ) -> dict[tuple[str, int], tuple[str, Versioned, md.TopicMetadata]]:
        """:meth:`_partitions_sync` for the named topics only (blocking): two reads per topic
        instead of every topic and partition, so what a change costs does not grow with the
        cluster. Revisions come from etcd, as in the full read: safe for compare-and-swap."""
        assert self.store is not None
        store, keys = self.store, self.store.keys
        out: dict[tuple[str, int], tuple[str, Versioned, md.TopicMetadata]] = {}
        for name in sorted(set(names)):
            found = store.get(keys.topic(name), md.TopicMetadata)
            if found is None or found.value.deleting:
                continue
            topic = found.value
            _, parts = store.get_prefix_cached(
                keys.partitions_of(name), md.PartitionState, self._state_cache, whole=False
            )
            for key, v in parts.items():
                tp = keys.parse_partition(key)
                if tp is not None and tp[0] == name and _live(tp, v, topic):
                    out[tp] = (key, v, topic)
        return out

    @staticmethod
    def _unclean(topic: md.TopicMetadata) -> bool:
        return _effective(dict(topic.configs), "unclean.leader.election.enable").lower() == "true"

    def _commit_decisions(
        self, lead: Leadership, decisions: list[PartitionDecision]
    ) -> tuple[int, bool]:
        """Write decisions in batches with CAS (blocking): (states written, any conflict)."""
        batch = max(1, min(RECONCILE_BATCH, self.max_txn_ops - 1))
        written, conflict = 0, False
        for i in range(0, len(decisions), batch):
            chunk = decisions[i : i + batch]
            if self._txn(
                lead,
                [(pd.key, pd.mod_revision) for pd in chunk],
                puts=[(pd.key, pd.decision.state) for pd in chunk],
            ):
                written += len(chunk)
                changes = []
                for (topic, p), _, _, d in chunk:
                    if d.election is not None:
                        metrics.LEADER_ELECTIONS.labels(d.election).inc()
                    st = d.state
                    changes.append(
                        f"{topic}-{p}: leader {st.leader} "
                        f"(epoch {st.leader_epoch}), isr {list(st.isr)}, replicas "
                        f"{list(st.replicas)} ({d.election or 'isr change'})"
                    )
                # One record per transaction: at 1,000 partitions a record per partition was
                # most of a failover's controller time.
                log.info("%d partition states committed: %s", len(chunk), "; ".join(changes))
            else:
                conflict = True
        return written, conflict

    def _decide_and_commit(
        self,
        lead: Leadership,
        decide: Callable[[], list[PartitionDecision]],
        *,
        gave_up: str = "partition states kept changing; retry",
    ) -> Settled:
        """Read-decide-commit partition states until no compare fails (blocking)."""
        written = 0

        def commit(decisions: list[PartitionDecision]) -> bool:
            nonlocal written
            n, conflict = self._commit_decisions(lead, decisions)
            written += n
            return not conflict

        decisions = commit_with_retry(decide, commit, attempts=ATTEMPTS, gave_up=gave_up)
        return Settled({pd.tp: pd.decision.state.partition_epoch for pd in decisions}, written)


def _live(tp: tuple[str, int], v: Versioned, topic: md.TopicMetadata) -> bool:
    """Whether the state ``v`` of ``tp`` belongs to ``topic`` as it is now (not deleting, a
    partition it has, not a leftover of an earlier topic of that name)."""
    return (
        not topic.deleting
        and tp[1] < topic.partition_count
        and not (v.value.topic_id and v.value.topic_id != topic.topic_id)
    )
