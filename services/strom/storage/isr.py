"""A storage node's leader side of replication (DESIGN §6): ISR management.

:class:`IsrManager` periodically (and right after follower fetches) asks each partition this
node leads whether its ISR should change (:func:`strom.storage.partition.decide_isr`) and
proposes that to the active controller with AlterPartition
(:class:`strom.storage.controller_client.ControllerClient`). The new ISR is applied only
from the committed state in the answer (or from the etcd watch), never before. The same
call hands over the leadership of partitions this node cannot serve (damaged data, a disk
refusing appends, a log it could not open) and reports RECOVERED after an unclean election.
Also here: which nodes may join an ISR (:func:`running_nodes`) and the replication gauges
(:func:`refresh_replication_gauges`).

Everything here runs on the event loop. The follower side (replica fetchers) is
:mod:`strom.storage.replica_fetchers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from strom.api import controller_pb2
from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode
from strom.metadata import ClusterView
from strom.storage import metrics
from strom.storage.controller_client import ControllerClient
from strom.storage.manager import PartitionManager
from strom.storage.partition import Partition

# The replication logger, not this module's: operators filter replication's lines on
# "strom.storage.replication", where they were before the module was split.
log = logging.getLogger("strom.storage.replication")

E = ErrorCode

#: Back-off of a partition's refused ISR proposal: doubles with each refusal in the same
#: partition state, up to the cap.
ISR_REFUSED_BACKOFF_S = 0.5
ISR_REFUSED_BACKOFF_MAX_S = 30.0


def running_nodes(view: ClusterView) -> dict[int, str]:
    """The nodes registered and RUNNING in ``view`` (the only ones the controller lets join
    an ISR), each with its registered incarnation: only that process's fetches count for
    its joining (:func:`strom.storage.partition.decide_isr`)."""
    return {
        i: reg.incarnation_id
        for i, reg in view.live_nodes().items()
        if reg.state == md.NODE_STATE_RUNNING
    }


def _some(tps: list[tuple[str, int]], shown: int = 5) -> str:
    """The first few partitions' names, and how many more, for one log line about many."""
    names = ", ".join(f"{t}-{p}" for t, p in tps[:shown])
    return names + (f" and {len(tps) - shown} more" if len(tps) > shown else "")


#: Seconds before the leadership of a partition whose log could not be opened is handed
#: over again in the same partition state (the last call got no answer or was refused).
UNOPENED_RETRY_S = 5.0


@dataclass(slots=True)
class _Refused:
    """A partition's refused ISR proposal: what was refused, and when to ask again."""

    #: (leader epoch, partition epoch) it was refused in: a new partition state starts afresh.
    epochs: tuple[int, int]
    proposal: tuple[int, ...]
    message: str
    delay: float
    retry_at: float
    #: Replicas not to add before ``retry_at`` (INELIGIBLE_REPLICA: a shrink still goes);
    #: None: no proposal for the partition before then.
    held: frozenset[int] | None


class IsrManager:
    """Leader side: proposes ISR shrinks/expansions through AlterPartition.

    A refused proposal is not asked again at once: a partition backs off (doubling, up to
    ``ISR_REFUSED_BACKOFF_MAX_S``) while its state stays the same, and a repeated refusal
    is logged at DEBUG, so that a proposal the controller will not take (a replica it does
    not see as RUNNING) is neither a stream of calls nor a stream of log lines."""

    def __init__(
        self,
        node_id: int,
        manager: PartitionManager,
        controller: ControllerClient,
        incarnation: Callable[[], str],
        lag_time_max_ms: int,
        *,
        running: Callable[[], Collection[int] | Mapping[int, str]],
    ) -> None:
        self.node_id = node_id
        self.manager = manager
        self.controller = controller
        self.incarnation = incarnation
        self.lag_time_max_s = lag_time_max_ms / 1000.0
        #: The nodes registered and RUNNING (:func:`running_nodes` of the node's view), with
        #: their registered incarnations when a mapping.
        self.running = running
        #: Monotonic seconds for back-offs (a test sets its own).
        self.clock: Callable[[], float] = time.monotonic
        self._kick = asyncio.Event()
        #: Resend time of a proposal whose call got no answer (it stays pending).
        self._retry_at: dict[tuple[str, int], float] = {}
        #: Damaged partitions this node leads with nobody to hand them to (logged once).
        self._alone_damaged: set[tuple[str, int]] = set()
        #: Partitions this node leads on a disk refusing appends, with nobody to hand them
        #: to (logged once).
        self._alone_failing: set[tuple[str, int]] = set()
        self._refused: dict[tuple[str, int], _Refused] = {}
        self._last_call_refusal = ""
        #: Unopened partitions (PartitionManager.unopened) whose leadership was handed over:
        #: the (leader epoch, partition epoch) asked in and when, so each is asked once per
        #: state and again only after UNOPENED_RETRY_S.
        self._unopened_asked: dict[tuple[str, int], tuple[tuple[int, int], float]] = {}
        #: Unopened partitions this node leads with nobody to hand them to (logged once).
        self._alone_unopened: set[tuple[str, int]] = set()

    def _prune_retry_at(self, now: float) -> None:
        """Drop the resend times that passed (a passed one holds nothing back) and those of
        partitions this node no longer has. An entry was made for
        every proposal whose call got no answer and never removed."""
        if self._retry_at:
            parts = self.manager.partitions
            for tp in [tp for tp, at in self._retry_at.items() if at <= now or tp not in parts]:
                del self._retry_at[tp]

    def kick(self) -> None:
        """Check soon (a follower fetched; something may have caught up)."""
        self._kick.set()

    async def run(self, stopping: asyncio.Event) -> None:
        interval = min(max(self.lag_time_max_s / 4, 0.05), 1.0)
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=interval)
            self._kick.clear()
            try:
                await self.check()
            except Exception:
                log.exception("ISR check failed")
            refresh_replication_gauges(self.manager)

    async def _resign_unopened(self, now: float) -> None:
        """Hand over the leadership of each partition whose log this node could not open for
        want of file descriptors (PartitionManager.unopened) to another in-sync replica, as
        a leader whose disk refuses appends does (resign_reason ``storage_error``): the node
        has no log to serve it from (under a low open-file limit a node
        went on leading 300 partitions it could not open, nobody able to produce to them).
        Kafka takes such a log dir offline and its leaderships move likewise. With no other
        in-sync replica the partition stays offline until the log opens; that is logged."""
        unopened = self.manager.unopened
        if not unopened:
            self._unopened_asked.clear()
            self._alone_unopened.clear()
            return
        view = self.manager.view
        with view.lock:
            found = {}
            for tp in list(unopened):
                v = view.partitions.get(tp)
                t = view.topics.get(tp[0])
                found[tp] = (v.value if v else None, t.value.topic_id if t else "")
        req = controller_pb2.AlterPartitionRequest(
            leader_id=self.node_id, leader_incarnation=self.incarnation()
        )
        asked: list[tuple[str, int]] = []
        alone: list[tuple[str, int]] = []
        for tp, (st, topic_id) in found.items():
            if st is None or self.node_id not in st.replicas or tp in self.manager.partitions:
                unopened.pop(tp, None)  # no longer assigned here, or opened meanwhile
                self._unopened_asked.pop(tp, None)
                continue
            if st.leader != self.node_id:
                self._alone_unopened.discard(tp)
                continue
            others = [r for r in st.isr if r != self.node_id]
            if not others:
                if tp not in self._alone_unopened:
                    self._alone_unopened.add(tp)
                    alone.append(tp)
                continue
            epochs = (st.leader_epoch, st.partition_epoch)
            last = self._unopened_asked.get(tp)
            if last is not None and last[0] == epochs and now - last[1] < UNOPENED_RETRY_S:
                continue
            self._unopened_asked[tp] = (epochs, now)
            req.partitions.add(
                topic=tp[0],
                topic_id=topic_id,
                partition=tp[1],
                leader_epoch=st.leader_epoch,
                partition_epoch=st.partition_epoch,
                new_isr=others,
                resign_reason="storage_error",
            )
            asked.append(tp)
        if alone:
            log.error(
                "%d partitions this node leads are offline until their logs open (%s), no "
                "other replica being in sync to take over: %s",
                len(alone),
                _some(alone),
                unopened[alone[0]],
            )
        if not asked:
            return
        log.info(
            "handing over the leadership of %d partitions whose log could not be opened (%s)",
            len(asked),
            _some(asked),
        )
        try:
            resp = await self.controller.call("AlterPartition", req)
        except grpc.aio.AioRpcError:
            resp = None
        if resp is not None and resp.error_code != E.NONE:
            log.info("AlterPartition refused the hand-over: %s", resp.error_message)

    async def check(self) -> None:
        now = self.clock()
        await self._resign_unopened(now)
        proposals: list[tuple[Partition, tuple[int, ...]]] = []
        running: dict[int, str] | None = None
        if self._refused:
            for tp in [tp for tp in self._refused if tp not in self.manager.partitions]:
                del self._refused[tp]
        self._prune_retry_at(now)
        for part in list(self.manager.partitions.values()):
            if part.deleted or not part.is_leader:
                self._refused.pop(part.tp, None)
                self._retry_at.pop(part.tp, None)
                continue
            if self._retry_at.get(part.tp, 0.0) > now:
                continue
            if part.pending_isr is not None:
                # An earlier call failed without an answer: it may have committed, so the
                # same proposal goes again (the controller answers with the state either way).
                proposals.append((part, part.pending_isr))
                continue
            refused = self._refused.get(part.tp)
            if refused is not None and refused.epochs != (part.leader_epoch, part.partition_epoch):
                del self._refused[part.tp]  # a new partition state: start afresh
                refused = None
            if refused is not None and refused.held is None and now < refused.retry_at:
                continue
            if part.damaged_at >= 0:
                if len(part.isr) > 1:
                    # Stored data failed its check here: hand leadership to another in-sync
                    # replica (an ISR without us: leadership.resign on the controller), then
                    # truncate at the damage and fetch the rest as a follower. Before, this
                    # node kept leading and answered every fetch with STORAGE_ERROR while
                    # good replicas stood by.
                    proposals.append((part, tuple(r for r in part.isr if r != self.node_id)))
                    self._alone_damaged.discard(part.tp)
                    continue
                if part.tp not in self._alone_damaged:
                    self._alone_damaged.add(part.tp)
                    log.error(
                        "%s-%d: stored data from offset %d failed a check, and no other "
                        "replica is in sync to take over: still leading",
                        part.topic,
                        part.index,
                        part.damaged_at,
                    )
            elif not part.append_failing:
                self._alone_failing.discard(part.tp)  # appends succeed again: log a new one
            else:
                if len(part.isr) > 1:
                    # Our disk refused an append (full, failing): hand leadership to another
                    # in-sync replica, whose disk may take the writes; as a follower this node
                    # copies what it can and rejoins the ISR once its appends succeed again
                    # (a leader on a full disk kept leading and refused
                    # every produce while two in-sync replicas stood by).
                    proposals.append((part, tuple(r for r in part.isr if r != self.node_id)))
                    self._alone_failing.discard(part.tp)
                    continue
                if part.tp not in self._alone_failing:
                    self._alone_failing.add(part.tp)
                    log.error(
                        "%s-%d: the disk refused an append (%s), and no other replica is in "
                        "sync to take over: still leading",
                        part.topic,
                        part.index,
                        part.disk_error,
                    )
            if part.recovering:
                # Elected uncleanly: the partition stays RECOVERING (no follower may join) until
                # its leader says it has recovered (KIP-704). This node has nothing more to
                # recover (its producer state was rebuilt when the log opened), so it reports
                # RECOVERED at once, with the ISR unchanged: a proposal carries RECOVERED
                # unless it says otherwise. Before, nothing reported it, and the partition
                # showed "recovering" until a follower happened to rejoin.
                proposals.append((part, part.isr))
                continue
            if running is None:
                nodes = self.running()
                running = dict(nodes) if isinstance(nodes, Mapping) else dict.fromkeys(nodes, "")
            new = part.isr_change(self.lag_time_max_s, running)
            if refused is not None:
                if new is None:
                    # Nothing to propose any more (the follower stopped fetching, say): a
                    # follower that comes back is proposed at once, without the back-off.
                    del self._refused[part.tp]
                    continue
                if refused.held is not None and now < refused.retry_at:
                    held = refused.held
                    new = part.isr_change(
                        self.lag_time_max_s, {n: i for n, i in running.items() if n not in held}
                    )
            if new is not None:
                proposals.append((part, new))
        if not proposals:
            return
        req = controller_pb2.AlterPartitionRequest(
            leader_id=self.node_id, leader_incarnation=self.incarnation()
        )
        # The state each proposal was made in: a refusal backs off in that state only.
        epochs = {part.tp: (part.leader_epoch, part.partition_epoch) for part, _ in proposals}
        for part, new in proposals:
            refused = self._refused.get(part.tp)
            # A resend (no answer to the last call) or a retry of a refused proposal was
            # logged when first made.
            again = part.pending_isr == new or (refused is not None and refused.proposal == new)
            part.propose_isr(new)
            item = req.partitions.add(
                topic=part.topic,
                topic_id=part.topic_id,
                partition=part.index,
                leader_epoch=part.leader_epoch,
                partition_epoch=part.partition_epoch,
                new_isr=new,
            )
            # The process each added replica's fetches came from: the controller refuses one
            # that is no longer the node's registered incarnation (it restarted meanwhile).
            for r, incarnation in part.pending_isr_incarnations.items():
                if incarnation:
                    item.new_isr_incarnations[r] = incarnation
            if self.node_id not in new and part.damaged_at >= 0:
                why = f", resigning: stored data from offset {part.damaged_at} failed a check"
            elif self.node_id not in new:
                item.resign_reason = "storage_error"
                why = f", resigning: the disk refused an append ({part.disk_error})"
            elif part.recovering:
                why = ", reporting RECOVERED after an unclean election"
            else:
                why = ""
            if not again and self.node_id in new:
                reason = part.isr_change_reason(new, self.lag_time_max_s)
                why += f": {reason}" if reason else ""
            log.log(
                logging.DEBUG if again else logging.INFO,
                "%s-%d: proposing ISR %s -> %s (leader epoch %d, partition epoch %d)%s",
                part.topic,
                part.index,
                list(part.isr),
                list(new),
                part.leader_epoch,
                part.partition_epoch,
                why,
            )
        try:
            resp = await self.controller.call("AlterPartition", req)
        except grpc.aio.AioRpcError:
            resp = None  # no answer: the proposals stay pending and are sent again
        if resp is None:
            for part, _ in proposals:
                self._retry_at[part.tp] = now + 0.5
            return
        for part, _ in proposals:  # answered: nothing to resend
            self._retry_at.pop(part.tp, None)
        if resp.error_code != E.NONE:
            # Refused as a whole: nothing was committed.
            for part, new in proposals:
                self._settle(part)
                self._refuse(part, new, epochs[part.tp], resp.error_message, None, now)
            repeat = resp.error_message == self._last_call_refusal
            self._last_call_refusal = resp.error_message
            log.log(
                logging.DEBUG if repeat else logging.INFO,
                "AlterPartition refused: %s",
                resp.error_message,
            )
            return
        self._last_call_refusal = ""
        results = {(r.topic, r.partition): r for r in resp.partitions}
        for part, new in proposals:
            r = results.get(part.tp)
            if r is None:
                self._settle(part)
                continue
            if r.error_code != E.NONE:
                held = None
                if r.error_code == E.INELIGIBLE_REPLICA:
                    held = frozenset(new) - frozenset(part.isr)
                repeat = self._refuse(part, new, epochs[part.tp], r.error_message, held, now)
                log.log(
                    logging.DEBUG if repeat else logging.INFO,
                    "%s-%d: ISR proposal refused: %s (backing off %.1f s)",
                    part.topic,
                    part.index,
                    r.error_message,
                    self._refused[part.tp].delay,
                )
            else:
                self._refused.pop(part.tp, None)
            if r.HasField("state") and not part.deleted:
                self.apply_committed(part, r.state)
            # Answered: committed (the state applied above) or refused.
            self._settle(part)
        refresh_replication_gauges(self.manager)

    def _settle(self, part: Partition) -> None:
        """``part``'s proposal is decided: the HW may move, and long polls waiting on it
        are told."""
        if part.settle_pending_isr():
            self.manager.committed.notify(part.tp, 1 << 30)

    def _refuse(
        self,
        part: Partition,
        proposal: tuple[int, ...],
        epochs: tuple[int, int],
        message: str,
        held: frozenset[int] | None,
        now: float,
    ) -> bool:
        """Back off after a refused proposal; True if it is a repeat (the same proposal
        refused the same way in the same partition state: logged at DEBUG)."""
        prev = self._refused.get(part.tp)
        same_state = prev is not None and prev.epochs == epochs
        delay = ISR_REFUSED_BACKOFF_S
        if prev is not None and same_state:
            delay = min(prev.delay * 2, ISR_REFUSED_BACKOFF_MAX_S)
        self._refused[part.tp] = _Refused(epochs, proposal, message, delay, now + delay, held)
        if prev is None or not same_state:
            return False
        return prev.proposal == proposal and prev.message == message

    def apply_committed(self, part: Partition, state: Any) -> None:
        """Adopt a committed state from the controller's answer (apply_state counts ISR
        changes; stale states are ignored there)."""
        epoch = part.partition_epoch
        changed = part.apply_state(state)
        if changed:
            log.info("%s-%d: leadership changed by an AlterPartition answer", *part.tp)
            self.manager.request_reconcile({part.topic})
        if part.partition_epoch != epoch:
            log.info(
                "%s-%d: ISR now %s (partition epoch %d)",
                part.topic,
                part.index,
                list(part.isr),
                part.partition_epoch,
            )
            # A smaller ISR may advance the HW: wake consumers waiting for it.
            self.manager.committed.notify(part.tp, 1 << 30)


def refresh_replication_gauges(manager: PartitionManager) -> None:
    under = under_min = 0
    for part in manager.partitions.values():
        if part.is_leader and not part.deleted:
            # Kafka's rule: fewer in sync than the replicas not being added by a move.
            if len(part.isr) < len(part.replicas) - len(part.adding):
                under += 1
            if len(part.isr) < part.log.config.min_insync_replicas:
                under_min += 1
            m = manager.metrics.get(part.tp)
            if m is not None:
                m.replica_lag.set(leader_replica_lag(part))
    metrics.UNDER_REPLICATED.set(under)
    metrics.UNDER_MIN_ISR.set(under_min)


def leader_replica_lag(part: Partition) -> int:
    """A leader's replica lag: the largest lag behind its LEO of a follower whose position
    it knows. A new leadership knows none until they fetch (apply_state clears them);
    counting those as at offset 0 showed every failover as a lag of the whole log (found
    from outside). A follower that never fetches leaves the ISR: under-replicated
    partitions report it."""
    leo = part.log.log_end_offset
    ends = part.replica_end_offsets
    lag = [leo - ends[r] for r in part.replicas if r != part.node_id and r in ends]
    return max(max(lag, default=0), 0)
