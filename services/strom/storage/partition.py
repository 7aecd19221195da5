"""The in-memory state of one hosted partition replica: its log, leadership and watermarks.

The high watermark is the minimum log end offset over the ISR (DESIGN §6): the leader's own
LEO plus what followers reported in their fetches (``replica_end_offsets``); with the ISR
being just this node it simply follows the LEO. ``acks=-1`` producers wait in
:meth:`wait_for_high_watermark`, which resolves as the high watermark passes their records.
Followers adopt the leader's HW bounded by their own LEO (:meth:`set_follower_high_watermark`).
The leader tracks when each follower was last caught up and :func:`decide_isr` says when the
ISR should shrink or grow; :mod:`strom.storage.isr` proposes that to the controller and the
new ISR arrives back through :meth:`apply_state` only once committed.

Only the event loop thread touches this object (the manager installs and updates it there),
so it has no locks; the log has its own for the worker threads that flush or clean it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode
from strom.log import Log
from strom.storage import metrics
from strom.storage.waiters import OffsetWaiters

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class EpochCheck:
    """A refused leader epoch: the code and the message to answer with."""

    code: int
    message: str


class Partition:
    """One replica hosted on this node."""

    def __init__(
        self,
        node_id: int,
        topic: str,
        index: int,
        topic_id: str,
        log: Log,
        state: md.PartitionState,
        on_high_watermark: Callable[[Partition, int, int], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.topic = topic
        self.index = index
        self.tp: TopicPartition = (topic, index)
        self.topic_id = topic_id
        self.log = log
        self.leader = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        #: Replicas a reassignment is adding (among ``replicas``): not counted as copies the
        #: partition should have until the move completes (Kafka's replication factor of a
        #: partition being moved), so a move alone does not make it under-replicated.
        self.adding: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        #: Leader after an unclean election, not yet reported RECOVERED (KIP-704).
        self.recovering = False
        # Follower node id -> its log end offset as of its last fetch (replication issue).
        self.replica_end_offsets: dict[int, int] = {}
        #: Follower node id -> its log start offset as of its last fetch: DeleteRecords is
        #: answered once every in-sync replica moved its start (Kafka's low watermark). None
        #: for a follower that does not follow the leader's start (an older version).
        self.replica_log_starts: dict[int, int | None] = {}
        self.high_watermark = log.log_start_offset
        # Leader side ISR bookkeeping (DESIGN §6): per follower, when it was last caught up
        # with our LEO, and our LEO/time at its previous fetch (Kafka's lastCaughtUpTime).
        self.caught_up_at: dict[int, float] = {}
        self._last_fetch: dict[int, tuple[int, float]] = {}
        #: Follower node id -> the incarnation (process run id) whose fetches the positions
        #: above come from ("" from a follower that sends none): a follower process that
        #: restarted holds only what its own fetches say, not what its previous run had.
        self.fetched_by: dict[int, str] = {}
        #: Our LEO when this leadership started: a follower must reach it to join the ISR.
        self.leader_epoch_start_offset = log.log_end_offset
        #: An ISR proposal whose outcome is not known yet (never applied before the
        #: controller commits it). Kept across a failed AlterPartition call, which may have
        #: committed anyway, until an answer or a newer partition state decides it.
        self.pending_isr: tuple[int, ...] | None = None
        #: The partition epoch that proposal was made against.
        self.pending_isr_epoch = -1
        #: For each replica the proposal adds, the incarnation whose fetches qualified it
        #: (sent with the proposal, and with its resends: a follower restarting meanwhile
        #: must not turn it into a proposal for its new, empty process).
        self.pending_isr_incarnations: dict[int, str] = {}
        #: Follower side: do not fetch before this monotonic time (leader errors back off).
        self.fetch_retry_at = 0.0
        #: The first offset whose stored data failed a check on read here (-1: none found).
        #: As leader this node then resigns (IsrManager); as follower it truncates there and
        #: fetches the rest from the new leader (ReplicaFetchers).
        self.damaged_at = -1
        #: The disk error (full, failing) the last append here failed with, as leader or
        #: follower; None once one succeeds. As follower this node then holds its fetches
        #: back until the disk may take them (ReplicaFetchers): a caught-up follower would
        #: rejoin the ISR and be made leader again only to fail its next append.
        self.disk_error: OSError | None = None
        #: Monotonic time of that failure.
        self.disk_error_at = 0.0
        #: The leader epoch in which an append as leader failed so (-1: none since the last
        #: append that succeeded). While it is the current epoch this node resigns
        #: (IsrManager): its disk refuses every write while in-sync replicas on other disks
        #: could take them.
        self.append_failed_epoch = -1
        self.clock: Callable[[], float] = time.monotonic
        # Held while a worker thread fsyncs / cleans the log, so that deleting the replica
        # waits for that work instead of pulling the files from under it.
        self.flush_lock = asyncio.Lock()
        self.maintenance_lock = asyncio.Lock()
        self.deleted = False
        self.stopping = False
        self._hw_waiters = OffsetWaiters()
        self._lw_waiters = OffsetWaiters()
        self._on_high_watermark = on_high_watermark
        self.apply_state(state)

    # -- leadership ------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leader == self.node_id

    def apply_state(self, state: md.PartitionState) -> bool:
        """Adopt a PartitionState from etcd; True if leadership (leader or epoch) changed.

        States older than the one held (lower leader epoch, or same leader epoch with a lower
        partition epoch, e.g. a lagging view after an AlterPartition answer) are ignored."""
        if self.leader_epoch >= 0 and (
            state.leader_epoch < self.leader_epoch
            or (
                state.leader_epoch == self.leader_epoch
                and state.partition_epoch < self.partition_epoch
            )
        ):
            return False
        changed = state.leader != self.leader or state.leader_epoch != self.leader_epoch
        if not changed and self.is_leader and tuple(state.isr) != self.isr:
            if set(state.isr) - set(self.isr):
                metrics.ISR_EXPANDS.inc()
            if set(self.isr) - set(state.isr):
                metrics.ISR_SHRINKS.inc()
        if self.pending_isr is not None and state.partition_epoch > self.pending_isr_epoch:
            self.pending_isr = None  # a newer state decided the proposal, one way or the other
        self.leader = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = tuple(state.replicas)
        self.adding = tuple(state.adding_replicas)
        self.isr = tuple(state.isr)
        self.recovering = state.leader_recovery_state == md.LEADER_RECOVERY_STATE_RECOVERING
        if changed:
            # A new leadership starts without follower positions: followers report theirs
            # with their next fetch (Kafka resets them on becoming leader as well).
            self.replica_end_offsets.clear()
            self.replica_log_starts.clear()
            self._last_fetch.clear()
            self.fetched_by.clear()
            self.pending_isr = None
            self.fetch_retry_at = 0.0
            if self.is_leader:
                # Followers get a full lag period to show up before they can be dropped.
                now = self.clock()
                self.caught_up_at = {r: now for r in self.replicas if r != self.node_id}
                self.leader_epoch_start_offset = self.log.log_end_offset
            else:
                self.caught_up_at.clear()
                self._fail_hw_waiters()
        self.maybe_advance_high_watermark()
        self._release_lw_waiters()  # a shrunk ISR, or a lost leadership, decides them
        return changed

    def note_damage(self, offset: int) -> None:
        """A read found stored data from ``offset`` on failing its check (CRC, offsets,
        epochs): remember the lowest such offset."""
        if offset >= 0 and (self.damaged_at < 0 or offset < self.damaged_at):
            self.damaged_at = offset

    def note_append_failure(self, exc: OSError) -> None:
        """An append failed with a disk error. As leader: resign while it is not followed by
        one that succeeds (a leader whose disk is full kept leading and refused every
        produce although two in-sync replicas stood by)."""
        self.disk_error = exc
        self.disk_error_at = self.clock()
        if self.is_leader:
            self.append_failed_epoch = self.leader_epoch

    def note_append_ok(self) -> None:
        """An append succeeded: the disk takes writes again."""
        self.disk_error = None
        self.append_failed_epoch = -1

    @property
    def append_failing(self) -> bool:
        """Leading with a disk that refused the last append of this leadership."""
        return self.is_leader and self.append_failed_epoch == self.leader_epoch

    def check_epoch(self, current_leader_epoch: int) -> EpochCheck | None:
        """Compare a request's current_leader_epoch (-1 = not checked) with ours."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch:
            return None
        if current_leader_epoch < self.leader_epoch:
            return EpochCheck(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"leader epoch {current_leader_epoch} is stale; the current epoch of "
                f"{self.topic}-{self.index} is {self.leader_epoch}",
            )
        return EpochCheck(
            ErrorCode.UNKNOWN_LEADER_EPOCH,
            f"leader epoch {current_leader_epoch} is newer than the epoch {self.leader_epoch} "
            f"this node knows for {self.topic}-{self.index}",
        )

    # -- watermarks ------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        """Below the oldest open transaction's first offset, never above the high watermark
        (what read_committed consumers may see)."""
        return self.log.last_stable_offset(self.high_watermark)

    def settle_pending_isr(self) -> bool:
        """The pending ISR proposal is decided (committed, refused, or answered for nothing):
        the maximal ISR is the committed one again, and a replica only the proposal added no
        longer holds the HW back. True if the HW moved. Every follower fetch used to recompute
        the HW; a fetch session's quiet partitions do not (strom.storage.fetch_rpcs), so a
        proposal dropped without this left the HW where it was until the next append."""
        self.pending_isr = None
        return self.maybe_advance_high_watermark()

    def maybe_advance_high_watermark(self) -> bool:
        """Recompute the HW as the leader; True (and waiters woken) if it moved up.

        Followers adopt the leader's HW from fetch responses (replication issue), so here a
        non-leader only keeps its HW within its own log.

        A leader's HW never moves back (Kafka's rule): records below it were acknowledged
        and served as committed. An in-sync follower fetching from below it lost records
        (it restarted on an empty data dir, say): it holds the HW where it is until it
        leaves the ISR (:func:`decide_isr` drops it at once), instead of pulling it down to
        its position.
        """
        leo = self.log.log_end_offset
        old = self.high_watermark
        if self.is_leader:
            new = leo
            for replica in self.maximal_isr():
                if replica != self.node_id:
                    new = min(new, self.replica_end_offsets.get(replica, old))
            new = max(new, min(old, leo))
        else:
            new = min(old, leo)
        new = max(new, self.log.log_start_offset)
        if new == old:
            return False
        self.high_watermark = new
        if new > old:
            self._release_hw_waiters()
        if self._on_high_watermark is not None:
            self._on_high_watermark(self, old, new)
        return new > old

    def maximal_isr(self) -> set[int]:
        """The committed ISR plus the replicas a pending proposal adds (Kafka's "maximal
        ISR"): the HW must not pass a replica that may already be in the ISR in etcd. A
        follower joins the ISR once it reached the HW; if the HW then moved on without it
        while the change was being committed, the ISR would hold a replica missing records
        below the HW, and electing it (a preferred-leader election right after the expansion,
        say) would truncate acknowledged records from the others."""
        if self.pending_isr is None:
            return set(self.isr)
        return set(self.isr) | set(self.pending_isr)

    def propose_isr(self, new: tuple[int, ...]) -> None:
        """Mark ``new`` as proposed (the HW now waits for the replicas it adds). A resend
        of the pending proposal keeps the incarnations it was first made for."""
        if self.pending_isr != new or self.pending_isr_epoch != self.partition_epoch:
            self.pending_isr_incarnations = {
                r: self.fetched_by.get(r, "") for r in new if r not in self.isr
            }
        self.pending_isr = new
        self.pending_isr_epoch = self.partition_epoch

    def record_follower_end_offset(
        self, replica: int, end_offset: int, incarnation: str = ""
    ) -> bool:
        """A follower fetched from ``end_offset``: it has everything below. True if HW moved.

        Also tracks when the follower was last caught up (Kafka's rule): caught up now if it
        reached our LEO, else as of its previous fetch if it reached the LEO we had then.

        ``incarnation`` is the follower process's run id. A fetch from another one than the
        previous fetch's drops what that process reported first (Kafka keys it by broker
        epoch, KIP-903). A node restarted on an empty data dir
        within ``replica.lag.time.max.ms`` of its last fetch was added back to the ISR at
        once from its previous run's position, and, elected as preferred leader with an
        empty log, had the other replicas truncate every acknowledged record."""
        if self.fetched_by.get(replica, incarnation) != incarnation:
            self.replica_end_offsets.pop(replica, None)
            self.replica_log_starts.pop(replica, None)
            self._last_fetch.pop(replica, None)
        self.fetched_by[replica] = incarnation
        now = self.clock()
        leo = self.log.log_end_offset
        if end_offset >= leo:
            self.caught_up_at[replica] = now
        else:
            prev = self._last_fetch.get(replica)
            if prev is not None and end_offset >= prev[0]:
                self.caught_up_at[replica] = max(self.caught_up_at.get(replica, 0.0), prev[1])
        self._last_fetch[replica] = (leo, now)
        self.replica_end_offsets[replica] = end_offset
        return self.maybe_advance_high_watermark()

    def note_follower_at_end(self, replica: int) -> None:
        """A follower fetched again from our log end, where its last fetch already was
        (recorded by :meth:`record_follower_end_offset`, which this is the rest of for that
        case): it is caught up now, and fetching."""
        now = self.clock()
        self.caught_up_at[replica] = now
        self._last_fetch[replica] = (self.log.log_end_offset, now)

    def record_follower_log_start(self, replica: int, log_start: int | None) -> None:
        """A follower fetched with ``log_start`` as its log start offset; None when its
        fetches do not say it moves its start up to the leader's (FetchRequest.
        follows_log_start unset: a follower of an older version, whose reported start never
        moves with DeleteRecords, so waiting for it would time out every time)."""
        if self.replica_log_starts.get(replica, -1) != log_start:
            self.replica_log_starts[replica] = log_start
            self._release_lw_waiters()

    def low_watermark(self) -> int:
        """Leader: the lowest log start offset among this replica and the followers of the
        (maximal) ISR, -1 while one of them has not fetched in this leadership. Records below
        it are gone from every replica a clean election can choose; an out-of-sync replica
        adopts the leader's start from its fetch answers before it can rejoin the ISR.

        A follower that does not follow the leader's start (an older version, mixed in
        during a rolling upgrade) counts with the leader's start, as every follower did
        before the low watermark was waited for: it keeps the records until its own
        retention removes them."""
        low = self.log.log_start_offset
        for replica in self.maximal_isr():
            if replica != self.node_id:
                start = self.replica_log_starts.get(replica, -1)
                if start is not None:
                    low = min(low, start)
        return low

    def followers_below_log_start(self, offset: int) -> list[int]:
        """Leader: the followers of the (maximal) ISR that hold the low watermark below
        ``offset`` (their reported start is below it, or they have not fetched in this
        leadership), for DeleteRecords' timeout message."""
        return [
            r
            for r in self.maximal_isr()
            if r != self.node_id
            and (start := self.replica_log_starts.get(r, -1)) is not None
            and start < offset
        ]

    async def wait_for_low_watermark(self, offset: int, timeout: float) -> int | None:
        """Wait until the low watermark reaches ``offset`` (DeleteRecords): the low
        watermark, or None on timeout, lost leadership or shutdown."""
        low = self.low_watermark()
        if low >= offset:
            return low
        if self.stopping or not self.is_leader:
            return None
        return await self._lw_waiters.wait(offset, timeout)

    def _release_lw_waiters(self) -> None:
        if not self._lw_waiters:
            return
        if self.stopping or not self.is_leader:
            self._lw_waiters.release_all(None)
        else:
            low = self.low_watermark()
            self._lw_waiters.release_below(low + 1, low)

    def set_follower_high_watermark(self, leader_hw: int) -> bool:
        """Follower: adopt the leader's HW, bounded by our own LEO. True if it moved."""
        new = max(
            follower_high_watermark(leader_hw, self.log.log_end_offset), self.log.log_start_offset
        )
        old = self.high_watermark
        if new == old:
            return False
        self.high_watermark = new
        if self._on_high_watermark is not None:
            self._on_high_watermark(self, old, new)
        return True

    def isr_change(
        self, lag_time_max_s: float, joinable: Collection[int] | Mapping[int, str]
    ) -> tuple[int, ...] | None:
        """Leader: the ISR to propose now (shrink laggards, add caught-up followers among
        ``joinable``, the nodes registered and RUNNING, with their registered incarnations
        when a mapping), or None."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        return decide_isr(
            self.node_id,
            self.replicas,
            self.isr,
            self.replica_end_offsets,
            self.caught_up_at,
            fetched_at={r: at for r, (_, at) in self._last_fetch.items()},
            joinable=joinable,
            fetched_by=self.fetched_by,
            leo=self.log.log_end_offset,
            hw=self.high_watermark,
            epoch_start=self.leader_epoch_start_offset,
            now=self.clock(),
            lag_time_max_s=lag_time_max_s,
        )

    def isr_change_reason(self, new: Collection[int], lag_time_max_s: float) -> str:
        """Leader: why the ISR goes from ``isr`` to ``new``, replica by replica, for the
        proposal's log line: a removed follower's fetch position against the log end, how
        long since it was last caught up and last fetched (against
        ``replica.lag.time.max.ms``), or its position below the high watermark; an added one's
        position. "proposing ISR [3, 2, 1] -> [3, 2]" said neither
        who left nor why. Called per proposal, not per fetch."""
        now, leo, hw = self.clock(), self.log.log_end_offset, self.high_watermark
        lag_ms = round(lag_time_max_s * 1000)
        out = []
        for r in self.isr:
            if r in new or r == self.node_id:
                continue
            end = self.replica_end_offsets.get(r)
            last = self._last_fetch.get(r)
            fetched = f"last fetched {now - last[1]:.1f}s ago" if last else "no fetch seen"
            if end is None:
                out.append(f"removing {r}: {fetched} in this leadership")
            elif end < hw:
                out.append(
                    f"removing {r}: its log end {end} is below the high watermark {hw} "
                    "(it came back without records it had)"
                )
            else:
                behind = now - self.caught_up_at.get(r, now)
                out.append(
                    f"removing {r}: fetched up to {end} of log end {leo}, last caught up "
                    f"{behind:.1f}s ago, {fetched} (replica.lag.time.max.ms {lag_ms})"
                )
        for r in new:
            if r not in self.isr:
                end = self.replica_end_offsets.get(r, -1)
                out.append(f"adding {r}: caught up to {end} (high watermark {hw}, log end {leo})")
        return "; ".join(out)

    async def wait_for_high_watermark(self, offset: int, timeout: float) -> int | None:
        """Wait until the HW is above ``offset`` (acks=-1): the number of in-sync replicas
        when it passed, or None on timeout or lost leadership (the caller answers
        REQUEST_TIMED_OUT or NOT_LEADER_OR_FOLLOWER).

        The ISR size is taken when the HW moves past the records, not when the waiter
        resumes: an ISR that shrank to fewer than ``min.insync.replicas`` lets the HW jump
        to the leader's log end, and records only the leader holds must then be answered
        NOT_ENOUGH_REPLICAS_AFTER_APPEND, not acknowledged (Kafka's rule; found from
        outside: both followers paused, the ack came once the controller dropped them)."""
        if self.high_watermark > offset:
            return len(self.isr)
        if self.stopping:
            return None
        return await self._hw_waiters.wait(offset, timeout)

    def _release_hw_waiters(self) -> None:
        self._hw_waiters.release_below(self.high_watermark, len(self.isr))

    def _fail_hw_waiters(self) -> None:
        self._hw_waiters.release_all(None)

    def release_waiters(self) -> None:
        """The node is stopping: acks=-1 waits end now (and new ones do not start), so that
        shutdown is not held up by replication that will not come."""
        self.stopping = True
        self._fail_hw_waiters()
        self._release_lw_waiters()

    def close(self) -> None:
        """The replica is being deleted: release every waiter."""
        self.deleted = True
        self.release_waiters()


def follower_high_watermark(leader_hw: int, log_end_offset: int) -> int:
    """A follower's HW: the leader's, but never above what the follower holds."""
    return min(leader_hw, log_end_offset)


def decide_isr(
    leader: int,
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    end_offsets: dict[int, int],
    caught_up_at: dict[int, float],
    *,
    fetched_at: Mapping[int, float],
    joinable: Collection[int] | Mapping[int, str],
    fetched_by: Mapping[int, str] | None = None,
    leo: int,
    hw: int,
    epoch_start: int,
    now: float,
    lag_time_max_s: float,
) -> tuple[int, ...] | None:
    """The new ISR (replica order) if it should change, else None (DESIGN §6).

    A follower in the ISR that has not been caught up with the leader's LEO for
    ``lag_time_max_s`` leaves; one outside whose LEO reached both the HW and the leader's
    LEO at the start of its epoch joins. The leader always stays.

    Only a follower that is fetching may join: its last fetch (``fetched_at``) within
    ``lag_time_max_s``, and its node among ``joinable`` (registered and RUNNING: the nodes
    the controller lets join, as Kafka's KIP-841). Its fetch position is kept after it stops,
    and on an idle partition the position of a dead follower stays at the HW: without
    these checks the leader asked to add it back about once a second, forever, and the
    HW waited for it while each proposal was in flight.

    When ``joinable`` maps each node to its registered incarnation, the position must come
    from that process's fetches (``fetched_by``; "" on either side is not checked): a node
    that restarted has registered again before it first fetches, and the position its
    previous run reported says nothing of what the new one holds (an emptied data dir).

    An ISR member whose position is below the HW leaves at once: it no longer holds every
    committed record (it came back without its data), and must not be elected."""
    members = set(isr) | {leader}
    for r in isr:
        if r == leader:
            continue
        end = end_offsets.get(r, -1)
        lagging = now - caught_up_at.get(r, now) > lag_time_max_s and end < leo
        if lagging or (r in end_offsets and end < hw):  # below the HW: records lost
            members.discard(r)
    for r in replicas:
        if r in members or r in isr or r not in end_offsets or r not in joinable:
            continue
        if now - fetched_at.get(r, float("-inf")) > lag_time_max_s:
            continue
        if isinstance(joinable, Mapping) and fetched_by is not None:
            registered, fetched = joinable[r], fetched_by.get(r, "")
            if registered and fetched and registered != fetched:
                continue
        end = end_offsets[r]
        if end >= hw and end >= epoch_start:
            members.add(r)
    new = tuple(r for r in replicas if r in members)
    return None if set(new) == set(isr) else new
