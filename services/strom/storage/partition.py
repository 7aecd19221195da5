"""The in-memory state of one hosted partition replica: its log, leadership and watermarks.

The replication issue adds follower fetchers, ISR changes and AlterPartition; this class is
shaped for that already. The high watermark is the minimum log end offset over the ISR
(DESIGN §6): the leader's own LEO plus what followers reported in their fetches
(``replica_end_offsets``). With the ISR being just this node it simply follows the LEO.
``acks=-1`` producers wait in :meth:`wait_for_high_watermark`, which resolves as the high
watermark passes their records (immediately with replication factor 1).

Only the event loop thread touches this object (the manager installs and updates it there),
so it has no locks; the log has its own for the worker threads that flush or clean it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode
from strom.log import Log

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
        self.isr: tuple[int, ...] = ()
        # Follower node id -> its log end offset as of its last fetch (replication issue).
        self.replica_end_offsets: dict[int, int] = {}
        self.high_watermark = log.log_start_offset
        # Held while a worker thread fsyncs / cleans the log, so that deleting the replica
        # waits for that work instead of pulling the files from under it.
        self.flush_lock = asyncio.Lock()
        self.maintenance_lock = asyncio.Lock()
        self.deleted = False
        self.stopping = False
        self._hw_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._on_high_watermark = on_high_watermark
        self.apply_state(state)

    # -- leadership ------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leader == self.node_id

    def apply_state(self, state: md.PartitionState) -> bool:
        """Adopt a PartitionState from etcd; True if leadership (leader or epoch) changed."""
        changed = state.leader != self.leader or state.leader_epoch != self.leader_epoch
        self.leader = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = tuple(state.replicas)
        self.isr = tuple(state.isr)
        if changed:
            # A new leadership starts without follower positions: followers report theirs
            # with their next fetch (Kafka resets them on becoming leader as well).
            self.replica_end_offsets.clear()
            if not self.is_leader:
                self._fail_hw_waiters()
        self.maybe_advance_high_watermark()
        return changed

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
        """Equals the high watermark until transactions exist."""
        return self.high_watermark

    def maybe_advance_high_watermark(self) -> bool:
        """Recompute the HW as the leader; True (and waiters woken) if it moved up.

        Followers adopt the leader's HW from fetch responses (replication issue), so here a
        non-leader only keeps its HW within its own log.
        """
        leo = self.log.log_end_offset
        old = self.high_watermark
        if self.is_leader:
            new = leo
            for replica in self.isr:
                if replica != self.node_id:
                    new = min(new, self.replica_end_offsets.get(replica, old))
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

    def record_follower_end_offset(self, replica: int, end_offset: int) -> bool:
        """A follower fetched from ``end_offset``: it has everything below. True if HW moved."""
        self.replica_end_offsets[replica] = end_offset
        return self.maybe_advance_high_watermark()

    async def wait_for_high_watermark(self, offset: int, timeout: float) -> bool:
        """Wait until the HW is above ``offset`` (acks=-1). False on timeout or lost
        leadership; the caller answers REQUEST_TIMED_OUT or NOT_LEADER_OR_FOLLOWER."""
        if self.high_watermark > offset:
            return True
        if self.stopping:
            return False
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (offset, fut)
        self._hw_waiters.append(entry)
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                return await fut
        except TimeoutError:
            return False
        finally:
            if entry in self._hw_waiters:
                self._hw_waiters.remove(entry)

    def _release_hw_waiters(self) -> None:
        if not self._hw_waiters:
            return
        hw = self.high_watermark
        keep = []
        for offset, fut in self._hw_waiters:
            if hw > offset:
                if not fut.done():
                    fut.set_result(True)
            else:
                keep.append((offset, fut))
        self._hw_waiters[:] = keep

    def _fail_hw_waiters(self) -> None:
        for _, fut in self._hw_waiters:
            if not fut.done():
                fut.set_result(False)
        self._hw_waiters.clear()

    def release_waiters(self) -> None:
        """The node is stopping: acks=-1 waits end now (and new ones do not start), so that
        shutdown is not held up by replication that will not come."""
        self.stopping = True
        self._fail_hw_waiters()

    def close(self) -> None:
        """The replica is being deleted: release every waiter."""
        self.deleted = True
        self.release_waiters()
