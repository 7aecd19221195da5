"""Pure pieces of replication: ISR decisions, follower HW, divergence truncation."""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from strom.api import controller_pb2
from strom.api import metadata_pb2 as md
from strom.api import storage_pb2 as pb
from strom.errors import ErrorCode as E
from strom.log import Log, LogConfig, LogManager, OffsetOutOfRangeError, checkpoint
from strom.log.manager import LOG_START_OFFSETS
from strom.record import decode_records, encode_batch
from strom.storage.longpoll import WaiterRegistry
from strom.storage.node import StorageNode
from strom.storage.partition import Partition, decide_isr, follower_high_watermark
from strom.storage.replication import (
    ControllerClient,
    ReplicaFetchers,
    divergence_truncation_offset,
    refresh_replication_gauges,
)


def _state(leader: int, epoch: int, isr: list[int], pepoch: int = 0) -> md.PartitionState:
    return md.PartitionState(
        replicas=[1, 2, 3], leader=leader, leader_epoch=epoch, isr=isr, partition_epoch=pepoch
    )


def _log(tmp_path: Path) -> Log:
    return Log(tmp_path / "t-0", LogConfig(), fsync=False)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


#: Every node registered and RUNNING.
ALL = frozenset({1, 2, 3})


def _decide(
    isr, ends, caught, *, leo=10, hw=10, start=0, now=100.0, lag=1.0, fetched=None, joinable=ALL
):
    return decide_isr(
        1,
        (1, 2, 3),
        tuple(isr),
        ends,
        caught,
        fetched_at={r: now for r in ends} if fetched is None else fetched,
        joinable=joinable,
        leo=leo,
        hw=hw,
        epoch_start=start,
        now=now,
        lag_time_max_s=lag,
    )


def test_decide_isr_shrinks_only_lagging_followers_past_the_lag_time() -> None:
    caught = {2: 99.5, 3: 98.0}
    assert _decide([1, 2, 3], {2: 10, 3: 5}, caught, hw=5) == (1, 2)
    # Behind but within the lag time: stays (the HW waits for it).
    assert _decide([1, 2, 3], {2: 10, 3: 5}, {2: 99.5, 3: 99.5}, hw=5) is None
    # Not caught up for long, but has everything (idle partition): stays (Kafka's rule).
    assert _decide([1, 2, 3], {2: 10, 3: 10}, caught) is None
    # Never fetched at all since the leadership began and the lag time passed: leaves.
    assert _decide([1, 2, 3], {2: 10}, {2: 100.0, 3: 98.0}) == (1, 2)


def test_decide_isr_expands_caught_up_followers_in_replica_order() -> None:
    assert _decide([1], {2: 10, 3: 10}, {}, hw=10) == (1, 2, 3)
    # Must reach the HW and the leader's LEO at the start of its epoch.
    assert _decide([1, 2], {2: 10, 3: 9}, {2: 100.0}, hw=10) is None
    assert _decide([1, 2], {2: 10, 3: 10}, {2: 100.0}, hw=10, start=11, leo=12) is None
    assert _decide([1, 2], {2: 12, 3: 12}, {2: 100.0}, hw=12, start=11, leo=12) == (1, 2, 3)


def test_follower_high_watermark_is_bounded_by_its_log_end() -> None:
    assert follower_high_watermark(10, 7) == 7
    assert follower_high_watermark(5, 7) == 5


def test_partition_tracks_lag_and_proposes_a_shrink(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    clock = Clock()
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3]))
    part.clock = clock
    part.apply_state(_state(1, 1, [1, 2, 3]))  # new epoch: grace period from "now"
    lg.append(encode_batch([b"x"] * 4), leader_epoch=1)
    part.record_follower_end_offset(2, 4)
    part.record_follower_end_offset(3, 4)
    assert part.high_watermark == 4
    lg.append(encode_batch([b"y"] * 2), leader_epoch=1)
    clock.t += 0.5
    part.record_follower_end_offset(2, 6)  # 2 keeps up; 3 stops fetching
    assert part.isr_change(1.0, ALL) is None
    clock.t += 1.0
    assert part.isr_change(1.0, ALL) == (1, 2)
    # Nothing is applied before the commit: HW still waits for 3.
    assert part.isr == (1, 2, 3) and part.high_watermark == 4
    part.apply_state(_state(1, 1, [1, 2], pepoch=1))
    assert part.high_watermark == 6
    # An older state (lagging view) does not undo the committed one.
    assert not part.apply_state(_state(1, 1, [1, 2, 3], pepoch=0)) and part.isr == (1, 2)
    # 3 catches up: proposed back.
    part.record_follower_end_offset(3, 6)
    assert part.isr_change(1.0, ALL) == (1, 2, 3)


def test_follower_adopts_leader_high_watermark(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    part = Partition(2, "t", 0, "id", lg, _state(1, 0, [1, 2, 3]))
    lg.append_as_follower(encode_batch([b"x"] * 3))
    assert part.set_follower_high_watermark(10) and part.high_watermark == 3
    assert not part.set_follower_high_watermark(10)
    assert part.isr_change(1.0, ALL) is None  # followers never propose


def test_divergence_truncation_offset(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    lg.append(encode_batch([b"a"] * 5), leader_epoch=1)  # epoch 1: [0, 5)
    lg.append(encode_batch([b"b"] * 5), leader_epoch=3)  # epoch 3: [5, 10)
    f = lg.epochs.end_offset_for
    # The leader's epoch 3 ended at 7: we keep [0, 7).
    assert divergence_truncation_offset(f, 10, 3, 7, 0) == 7
    # The leader only knows epoch 2 ending at 8; our largest epoch <= 2 (1) ends at 5.
    assert divergence_truncation_offset(f, 10, 2, 8, 0) == 5
    # The leader has no such epoch: keep nothing above our start.
    assert divergence_truncation_offset(f, 10, -1, -1, 0) == 0
    # Never above our LEO.
    assert divergence_truncation_offset(f, 10, 3, 50, 0) == 10
    lg.truncate_to(divergence_truncation_offset(f, 10, 3, 7, 0))
    # Whole batches go: the one holding offset 7 starts at 5.
    assert lg.log_end_offset == 5 and lg.epochs.latest_epoch == 1


def test_divergence_below_the_log_start_restarts_the_log_at_the_leaders_end(
    tmp_path: Path,
) -> None:
    """A leader elected uncleanly ended its epoch 1 at 5 while our log start is 8 (it missed a
    DeleteRecords): we truncate to 5, below our start, not to our start (which kept our own
    records 8.. and let them pass for the leader's, found from outside)."""
    lg = _log(tmp_path)
    lg.append(encode_batch([b"a"] * 10), leader_epoch=1)  # epoch 1: [0, 10)
    lg.delete_records(8)
    target = divergence_truncation_offset(lg.epochs.end_offset_for, 10, 1, 5, 8)
    assert target == 5
    lg.truncate_to(target)
    assert (lg.log_start_offset, lg.log_end_offset, lg.epochs.latest_epoch) == (5, 5, -1)


class _FakeManager:
    """What ReplicaFetchers needs of a PartitionManager."""

    def __init__(self, part: Partition) -> None:
        self.partitions = {part.tp: part}
        self.appended = WaiterRegistry()
        self.committed = WaiterRegistry()
        self.metrics: dict = {}
        self.logs = None

    def refresh_gauges(self, part: Partition) -> None:
        pass


def _follower(tmp_path: Path) -> tuple[Partition, ReplicaFetchers]:
    lg = _log(tmp_path)
    part = Partition(2, "t", 0, "id", lg, _state(1, 3, [1, 2, 3]))
    fetchers = ReplicaFetchers(2, _FakeManager(part), None, lambda: "inc")  # type: ignore[arg-type]
    return part, fetchers


def _leader_batch(values: list[bytes], base: int, epoch: int) -> bytes:
    data = bytearray(encode_batch(values))
    # base offset (8 bytes at 0) and partition leader epoch (4 bytes at 12), as a leader
    # assigns them; the CRC does not cover these fields.
    data[0:8] = base.to_bytes(8, "big")
    data[12:16] = epoch.to_bytes(4, "big")
    return bytes(data)


def test_fetcher_request_appends_and_learns_the_high_watermark(tmp_path: Path) -> None:
    part, fetchers = _follower(tmp_path)
    req, _ = fetchers._request([part])
    fp = req.topics[0].partitions[0]
    assert (req.replica_id, req.replica_incarnation, req.min_bytes) == (2, "inc", 1)
    assert (fp.fetch_offset, fp.current_leader_epoch, fp.last_fetched_epoch) == (0, 3, -1)
    pr = pb.FetchPartitionResponse(
        partition=0, high_watermark=9, records=_leader_batch([b"a", b"b", b"c"], 0, 3)
    )
    asyncio.run(fetchers._handle(part, 0, 3, pr))
    assert part.log.log_end_offset == 3 and part.high_watermark == 3
    assert part.log.epochs.latest_epoch == 3
    pr = pb.FetchPartitionResponse(partition=0, high_watermark=2)
    asyncio.run(fetchers._handle(part, 3, 3, pr))
    assert part.high_watermark == 2


def test_fetcher_truncates_on_divergence_and_restarts_below_the_leader_start(
    tmp_path: Path,
) -> None:
    part, fetchers = _follower(tmp_path)
    part.log.append_as_follower(_leader_batch([b"a"] * 4, 0, 1))
    part.log.append_as_follower(_leader_batch([b"b"] * 4, 4, 2))
    pr = pb.FetchPartitionResponse(partition=0, high_watermark=4)
    pr.diverging_epoch.epoch = 1
    pr.diverging_epoch.end_offset = 4
    asyncio.run(fetchers._handle(part, 8, 3, pr))
    assert part.log.log_end_offset == 4 and part.log.epochs.latest_epoch == 1
    oor = pb.FetchPartitionResponse(
        partition=0, error_code=E.OFFSET_OUT_OF_RANGE, log_start_offset=100, high_watermark=120
    )
    asyncio.run(fetchers._handle(part, 4, 3, oor))
    assert (part.log.log_start_offset, part.log.log_end_offset) == (100, 100)
    # Leader-side epoch errors: back off and wait for metadata.
    fenced = pb.FetchPartitionResponse(partition=0, error_code=E.FENCED_LEADER_EPOCH)
    asyncio.run(fetchers._handle(part, 100, 3, fenced))
    assert part.fetch_retry_at > 0
    # A response for an epoch we no longer follow in is ignored.
    stale = pb.FetchPartitionResponse(partition=0, records=_leader_batch([b"x"], 100, 3))
    asyncio.run(fetchers._handle(part, 100, 2, stale))
    assert part.log.log_end_offset == 100


def test_fetcher_restarts_its_log_when_an_unclean_leader_ends_below_its_log_start(
    tmp_path: Path,
) -> None:
    """Found from outside: replicas that had 0..9 (epoch 1) and a log start of 8 came back to
    a leader elected uncleanly whose epoch 1 ended at 5 (it then appended its own 5.. at
    epoch 4). Truncating stopped at our log start: we kept our own 8..9 as if they were the
    leader's. Now the log restarts empty at 5 and the next fetch asks from there."""
    part, fetchers = _follower(tmp_path)
    part.log.append_as_follower(_leader_batch([b"a"] * 8, 0, 1))
    part.log.append_as_follower(_leader_batch([b"a"] * 2, 8, 1))
    part.log.delete_records(8)
    pr = pb.FetchPartitionResponse(partition=0, high_watermark=10, log_start_offset=0)
    pr.diverging_epoch.epoch = 1
    pr.diverging_epoch.end_offset = 5
    asyncio.run(fetchers._handle(part, 10, 3, pr))
    lg = part.log
    assert (lg.log_start_offset, lg.log_end_offset, lg.epochs.latest_epoch) == (5, 5, -1)
    req, _ = fetchers._request([part])
    fp = req.topics[0].partitions[0]
    assert (fp.fetch_offset, fp.last_fetched_epoch, fp.log_start_offset) == (5, -1, 5)
    data = _leader_batch([b"new"] * 5, 5, 4)
    asyncio.run(fetchers._handle(part, 5, 3, pb.FetchPartitionResponse(partition=0, records=data)))
    assert [r.value for r in decode_records(lg.read(5).data)] == [b"new"] * 5


def test_fetcher_drops_its_whole_log_when_the_leader_knows_none_of_its_epochs(
    tmp_path: Path,
) -> None:
    """A leader whose every batch is of a newer epoch than all of ours answers the divergence
    with epoch -1: nothing of ours is its. Truncating to our log start kept the history of
    the batches below it (epoch 1), and every later fetch diverged the same way (found from
    outside, the follower never rejoined). The log now restarts empty, at the leader's log
    start when that is below ours."""
    part, fetchers = _follower(tmp_path)
    part.log.append_as_follower(_leader_batch([b"a"] * 10, 0, 1))
    part.log.delete_records(8)
    pr = pb.FetchPartitionResponse(partition=0, high_watermark=10, log_start_offset=5)
    pr.diverging_epoch.epoch = -1
    pr.diverging_epoch.end_offset = -1
    asyncio.run(fetchers._handle(part, 10, 3, pr))
    lg = part.log
    assert (lg.log_start_offset, lg.log_end_offset, lg.epochs.latest_epoch) == (5, 5, -1)
    assert fetchers._request([part])[0].topics[0].partitions[0].last_fetched_epoch == -1


# -- the maximal ISR (chaos suite, issue 13) -------------------------------------------------
#
# Found by the chaos run with seed 2: node 2 came back with an empty disk, caught up and was
# proposed for the ISR; while the expansion was being committed the leader kept advancing the
# HW over the old ISR [1, 3] and acknowledged five records node 2 did not have. The controller
# then made node 2 leader (preferred-leader election, ISR [2, 1, 3]) and the others truncated
# the acknowledged records away.


def _leader_with_lagging_candidate(tmp_path: Path) -> Partition:
    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 3], pepoch=4))
    lg.append(encode_batch([b"x"] * 10), leader_epoch=0)
    part.record_follower_end_offset(3, 10)
    assert part.high_watermark == 10
    part.record_follower_end_offset(2, 10)  # node 2 caught up: it qualifies for the ISR
    return part


def test_high_watermark_waits_for_a_replica_whose_isr_expansion_is_pending(
    tmp_path: Path,
) -> None:
    part = _leader_with_lagging_candidate(tmp_path)
    new = part.isr_change(10.0, ALL)
    assert new == (1, 2, 3)
    part.propose_isr(new)
    part.log.append(encode_batch([b"y"] * 5), leader_epoch=0)
    part.record_follower_end_offset(3, 15)
    assert part.high_watermark == 10  # node 2 may already be in the ISR: not past its LEO
    part.record_follower_end_offset(2, 15)
    assert part.high_watermark == 15
    # The committed state arrives: the proposal is settled.
    part.apply_state(_state(1, 0, [1, 2, 3], pepoch=5))
    assert part.pending_isr is None and part.maximal_isr() == {1, 2, 3}


def test_a_newer_state_settles_a_proposal_whose_answer_was_lost(tmp_path: Path) -> None:
    part = _leader_with_lagging_candidate(tmp_path)
    part.propose_isr((1, 2, 3))
    part.apply_state(_state(1, 0, [1, 3], pepoch=4))  # the same state again: still pending
    assert part.pending_isr == (1, 2, 3)
    part.apply_state(_state(1, 0, [1, 3], pepoch=5))  # decided (here: not committed)
    assert part.pending_isr is None
    part.log.append(encode_batch([b"y"] * 5), leader_epoch=0)
    part.record_follower_end_offset(3, 15)
    assert part.high_watermark == 15


class _FlakyController:
    """Answers AlterPartition after failing the first call (no answer: outcome unknown)."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    async def call(self, method: str, request, timeout: float = 5.0):
        from strom.api import controller_pb2

        self.calls.append(list(request.partitions[0].new_isr))
        if len(self.calls) == 1:
            return None
        p = request.partitions[0]
        resp = controller_pb2.AlterPartitionResponse()
        r = resp.partitions.add(topic=p.topic, partition=p.partition)
        r.state.CopyFrom(_state(1, 0, list(p.new_isr), pepoch=p.partition_epoch + 1))
        return resp


class _Manager:
    def __init__(self, part: Partition) -> None:
        self.partitions = {part.tp: part}
        self.metrics: dict = {}
        self.committed = WaiterRegistry()
        self.unopened: dict = {}

    def request_reconcile(self, topics: set[str] | None = None) -> None:
        pass


def test_isr_manager_resends_a_proposal_whose_call_failed(tmp_path: Path) -> None:
    from strom.storage.replication import IsrManager

    part = _leader_with_lagging_candidate(tmp_path)
    controller = _FlakyController()
    isr = IsrManager(
        1,
        _Manager(part),  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "inc",
        10_000,
        running=lambda: ALL,
    )

    async def main() -> None:
        await isr.check()
        assert part.pending_isr == (1, 2, 3)  # no answer: still pending, HW held for node 2
        part.log.append(encode_batch([b"y"] * 5), leader_epoch=0)
        part.record_follower_end_offset(3, 15)
        assert part.high_watermark == 10
        isr._retry_at.clear()
        await isr.check()
        assert controller.calls == [[1, 2, 3], [1, 2, 3]]
        assert part.pending_isr is None and part.isr == (1, 2, 3)

    asyncio.run(main())


class _WholeRefusal:
    """Refuses AlterPartition as a whole (``whole``), or answers it for no partition."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole

    async def call(self, method: str, request, timeout: float = 5.0):
        resp = controller_pb2.AlterPartitionResponse()
        if self.whole:
            resp.error_code = E.NOT_CONTROLLER
            resp.error_message = "this controller is not active"
        return resp


@pytest.mark.parametrize("whole", [True, False], ids=["refused-as-a-whole", "no-result"])
def test_a_dropped_proposal_lets_the_high_watermark_move_at_once(
    tmp_path: Path, whole: bool
) -> None:
    """Found by review of follower fetch sessions: a proposal dropped without an answer for
    its partition left the HW held back by the replica it would have added, until a
    follower's fetch recomputed it; a session's quiet fetches do not, so an acks=all
    produce waited for the next append. The HW now moves when the proposal is dropped, and
    parked fetches are told."""
    from strom.storage.replication import IsrManager

    part = _leader_with_lagging_candidate(tmp_path)
    manager = _Manager(part)
    isr = IsrManager(
        1,
        manager,  # type: ignore[arg-type]
        _WholeRefusal(whole),  # type: ignore[arg-type]
        lambda: "inc",
        10_000,
        running=lambda: ALL,
    )
    part.propose_isr((1, 2, 3))
    part.log.append(encode_batch([b"y"] * 5), leader_epoch=0)
    part.record_follower_end_offset(3, 15)
    assert part.high_watermark == 10  # node 2 (in the proposal) is at 10

    async def main() -> None:
        waiter = manager.committed.park([part.tp], 1)
        part.isr_change = lambda *a, **k: (1, 2, 3)  # type: ignore[method-assign]
        await isr.check()
        assert part.pending_isr is None and part.isr == (1, 3)
        assert part.high_watermark == 15
        assert waiter.woken

    asyncio.run(main())


def test_the_resend_time_of_an_unanswered_proposal_goes_once_answered_or_partition_gone(
    tmp_path: Path,
) -> None:
    """Found from outside: IsrManager._retry_at kept an entry for every partition whose
    AlterPartition call once got no answer."""
    from strom.storage.replication import IsrManager

    part = _leader_with_lagging_candidate(tmp_path)
    manager = _Manager(part)
    clock = Clock()
    isr = IsrManager(
        1,
        manager,
        _FlakyController(),
        lambda: "inc",
        10_000,
        running=lambda: ALL,  # type: ignore[arg-type]
    )
    isr.clock = clock

    async def main() -> None:
        await isr.check()  # no answer: resent after a back-off
        assert part.tp in isr._retry_at
        clock.t += 1.0
        await isr.check()  # resent and answered
        assert part.isr == (1, 2, 3) and isr._retry_at == {}

        isr._retry_at[part.tp] = clock.t + 5.0  # an unanswered proposal, then the partition goes
        del manager.partitions[part.tp]
        await isr.check()
        assert isr._retry_at == {}

    asyncio.run(main())


# -- followers that are gone do not rejoin (found from outside) -------------------------------
#
# A follower's last fetch position stays with the leader after the follower stops; on an idle
# partition it is at the HW. Once the controller had dropped a stopped node from the ISR, the
# leader of every partition it replicated proposed it back about once a second, forever: each
# proposal refused INELIGIBLE_REPLICA ("it is not registered"), logged twice, and the HW waited
# for the dead replica while the proposal was in flight.


def test_decide_isr_adds_only_followers_that_fetch_and_are_running() -> None:
    ends = {2: 10, 3: 10}
    assert _decide([1, 2], ends, {}, fetched={2: 100.0, 3: 99.5}) == (1, 2, 3)
    # 3's last fetch is older than the lag time: a stale position, not proposed.
    assert _decide([1, 2], ends, {}, fetched={2: 100.0, 3: 98.5}) is None
    assert _decide([1, 2], ends, {}, fetched={2: 100.0}) is None
    # 3 fetches but its node is not registered and RUNNING (gone, STARTING, SHUTTING_DOWN).
    assert _decide([1, 2], ends, {}, joinable={1, 2}) is None
    # Shrinks depend on neither.
    assert _decide([1, 2, 3], {2: 10, 3: 5}, {2: 99.5, 3: 98.0}, fetched={}, joinable={1}) == (
        1,
        2,
    )


def test_a_follower_that_stopped_fetching_is_proposed_again_only_when_it_fetches(
    tmp_path: Path,
) -> None:
    lg = _log(tmp_path)
    clock = Clock()
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3]))
    part.clock = clock
    part.apply_state(_state(1, 1, [1, 2, 3]))
    lg.append(encode_batch([b"x"] * 4), leader_epoch=1)
    part.record_follower_end_offset(2, 4)
    part.record_follower_end_offset(3, 4)
    # Node 3 stops; the controller drops it from the ISR (its registration went away).
    part.apply_state(_state(1, 1, [1, 2], pepoch=1))
    clock.t += 5.0
    part.record_follower_end_offset(2, 4)  # an idle partition: 2 keeps polling at the HW
    assert part.isr_change(1.0, ALL) is None  # 3 is at the HW too, but has not fetched for 5 s
    assert part.maximal_isr() == {1, 2}
    # It is back and fetches: proposed at once, once its node is RUNNING.
    part.record_follower_end_offset(3, 4)
    assert part.isr_change(1.0, {1, 2}) is None
    assert part.isr_change(1.0, ALL) == (1, 2, 3)


# -- a follower's new process (found from outside) ---------------------------------------------
#
# A node restarted on an empty data dir (a Kubernetes emptyDir, a replaced volume) within the
# lag time of its last fetch was proposed back into the ISR from its previous run's position,
# before its new process had fetched; elected as preferred leader with an empty log, it had
# the other replicas truncate every acknowledged record. A leader now counts only the fetches
# of the follower's registered incarnation, and an in-sync follower fetching from below the
# HW leaves the ISR at once without pulling the HW down.

#: Node id -> registered incarnation, node 3 having restarted (run "3b" after "3a").
RESTARTED = {1: "run-1", 2: "run-2", 3: "run-3b"}


def _leader_followed_by_two_runs(tmp_path: Path, clock: Clock) -> Partition:
    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3]))
    part.clock = clock
    part.apply_state(_state(1, 1, [1, 2, 3]))
    lg.append(encode_batch([b"x"] * 10), leader_epoch=1)
    part.record_follower_end_offset(2, 10, "run-2")
    part.record_follower_end_offset(3, 10, "run-3a")
    assert part.high_watermark == 10
    return part


def test_a_restarted_follower_joins_only_from_its_new_process_fetches(tmp_path: Path) -> None:
    clock = Clock()
    part = _leader_followed_by_two_runs(tmp_path, clock)
    # Node 3 stops (the controlled shutdown drops it from the ISR) and is back at once, on an
    # empty data dir: registered RUNNING as a new process before that process fetched.
    part.apply_state(_state(1, 1, [1, 2], pepoch=1))
    clock.t += 1.0
    assert part.isr_change(10.0, RESTARTED) is None  # 10 is what run 3a had
    # Its first fetch, from offset 0, replaces the old run's position.
    part.record_follower_end_offset(3, 0, "run-3b")
    assert part.replica_end_offsets[3] == 0 and part.high_watermark == 10
    assert part.isr_change(10.0, RESTARTED) is None
    part.record_follower_end_offset(3, 10, "run-3b")  # caught up
    # A view that still has the old registration does not let the new process in yet.
    assert part.isr_change(10.0, {**RESTARTED, 3: "run-3a"}) is None
    assert part.isr_change(10.0, RESTARTED) == (1, 2, 3)


def test_an_in_sync_follower_back_without_its_data_leaves_at_once(tmp_path: Path) -> None:
    clock = Clock()
    part = _leader_followed_by_two_runs(tmp_path, clock)
    # Restarted with its data intact: it fetches from its log end, and stays.
    part.record_follower_end_offset(3, 10, "run-3b")
    assert part.isr_change(10.0, RESTARTED) is None and part.high_watermark == 10
    # Restarted on an empty data dir before the controller dropped it from the ISR.
    part.record_follower_end_offset(3, 0, "run-3c")
    assert part.high_watermark == 10  # acknowledged records stay committed
    part.log.append(encode_batch([b"y"] * 5), leader_epoch=1)
    part.record_follower_end_offset(2, 15, "run-2")
    assert part.high_watermark == 10  # the ISR in etcd still names 3: the HW waits
    # It leaves now, not after the lag time.
    assert part.isr_change(10.0, {**RESTARTED, 3: "run-3c"}) == (1, 2)
    part.apply_state(_state(1, 1, [1, 2], pepoch=1))
    assert part.high_watermark == 15


class _CommittingController:
    """Commits every proposal, keeping the requests."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def call(self, method: str, request, timeout: float = 5.0):
        self.requests.append(request)
        resp = controller_pb2.AlterPartitionResponse()
        for p in request.partitions:
            r = resp.partitions.add(topic=p.topic, partition=p.partition)
            r.state.CopyFrom(_state(1, p.leader_epoch, list(p.new_isr), p.partition_epoch + 1))
        return resp


def test_isr_manager_does_not_add_a_restarted_node_from_its_old_position(tmp_path: Path) -> None:
    from strom.storage.replication import IsrManager

    clock = Clock()
    part = _leader_followed_by_two_runs(tmp_path, clock)
    part.apply_state(_state(1, 1, [1, 2], pepoch=1))
    controller = _CommittingController()
    registered = dict(RESTARTED)
    isr = IsrManager(
        1,
        _Manager(part),  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "run-1",
        10_000,
        running=lambda: registered,
    )

    async def main() -> None:
        await isr.check()
        assert controller.requests == []  # node 3's new process has not fetched yet
        part.record_follower_end_offset(3, 10, "run-3b")
        await isr.check()
        assert [list(r.partitions[0].new_isr) for r in controller.requests] == [[1, 2, 3]]
        # The controller checks the process it is proposed from against the registration.
        assert dict(controller.requests[0].partitions[0].new_isr_incarnations) == {3: "run-3b"}
        assert part.isr == (1, 2, 3)

    asyncio.run(main())


def test_a_resent_isr_proposal_keeps_the_incarnation_it_was_made_for(tmp_path: Path) -> None:
    """A proposal whose call got no answer is sent again; if the follower restarted in
    between, the resend still names the process that caught up, which the controller then
    refuses, not the new one, which may hold nothing."""
    from strom.storage.replication import IsrManager

    clock = Clock()
    part = _leader_followed_by_two_runs(tmp_path, clock)
    part.apply_state(_state(1, 1, [1, 2], pepoch=1))
    part.record_follower_end_offset(3, 10, "run-3b")
    controller = _FlakyController()
    requests: list[Any] = []
    call = controller.call

    async def keep(method: str, request, timeout: float = 5.0):
        requests.append(request)
        return await call(method, request, timeout)

    controller.call = keep  # type: ignore[method-assign]
    registered = dict(RESTARTED)
    isr = IsrManager(
        1,
        _Manager(part),  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "run-1",
        10_000,
        running=lambda: registered,
    )

    async def main() -> None:
        await isr.check()  # no answer: pending
        assert part.pending_isr == (1, 2, 3)
        part.record_follower_end_offset(3, 0, "run-3c")  # restarted, empty
        registered[3] = "run-3c"
        isr._retry_at.clear()
        await isr.check()
        sent = [dict(r.partitions[0].new_isr_incarnations) for r in requests]
        assert sent == [{3: "run-3b"}, {3: "run-3b"}]

    asyncio.run(main())


class _RefusingController:
    """Refuses each proposal that adds node 2 as the controller refuses a node it does not
    see RUNNING (INELIGIBLE_REPLICA, with the unchanged state); commits the others."""

    def __init__(self, part: Partition, clock: Clock) -> None:
        self.part = part
        self.clock = clock
        self.calls: list[tuple[float, list[int]]] = []

    async def call(self, method: str, request, timeout: float = 5.0):
        resp = controller_pb2.AlterPartitionResponse()
        for p in request.partitions:
            self.calls.append((self.clock.t, list(p.new_isr)))
            r = resp.partitions.add(topic=p.topic, partition=p.partition)
            if 2 in p.new_isr and 2 not in self.part.isr:
                r.error_code = E.INELIGIBLE_REPLICA
                r.error_message = "replica 2 cannot join the ISR: it is not registered"
                r.state.CopyFrom(_state(1, p.leader_epoch, list(self.part.isr), p.partition_epoch))
            else:
                new = _state(1, p.leader_epoch, list(p.new_isr), pepoch=p.partition_epoch + 1)
                r.state.CopyFrom(new)
        return resp


def _refused_candidate(tmp_path: Path) -> tuple[Partition, Clock, _RefusingController, Any]:
    """A leader with ISR [1, 3] and node 2 caught up (lag time 10 s), an IsrManager on a
    clock of the test's and a controller that will not take node 2."""
    from strom.storage.replication import IsrManager

    part = _leader_with_lagging_candidate(tmp_path)
    clock = Clock()
    part.clock = clock
    part.record_follower_end_offset(2, 10)
    part.record_follower_end_offset(3, 10)
    controller = _RefusingController(part, clock)
    isr = IsrManager(
        1,
        _Manager(part),  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "inc",
        10_000,
        running=lambda: ALL,
    )
    isr.clock = clock
    return part, clock, controller, isr


def test_a_refused_isr_expansion_backs_off_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    part, clock, controller, isr = _refused_candidate(tmp_path)
    caplog.set_level(logging.DEBUG, logger="strom.storage.replication")

    async def main() -> None:
        for _ in range(400):  # 100 s, the partition idle, both followers polling
            part.record_follower_end_offset(2, 10)
            part.record_follower_end_offset(3, 10)
            await isr.check()
            clock.t += 0.25

    asyncio.run(main())
    times = [t for t, _ in controller.calls]
    assert [b - a for a, b in itertools.pairwise(times)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(infos) == 2, infos  # one proposal, one refusal; the repeats at DEBUG
    assert "proposing ISR [1, 3] -> [1, 2, 3]" in infos[0]
    assert "replica 2 cannot join the ISR" in infos[1]
    assert part.pending_isr is None and part.maximal_isr() == {1, 3}


async def _refuse_until_backing_off_16s(part: Partition, clock: Clock, isr: Any) -> None:
    """Refused at 100, 100.5, 101.5, 103.5, 107.5 and 115.5, each time as soon as the
    back-off allowed: the next try is due at 131.5."""
    for i in range(6):
        if i:
            clock.t = isr._refused[part.tp].retry_at
        part.record_follower_end_offset(2, 10)
        part.record_follower_end_offset(3, 10)
        await isr.check()
    assert clock.t == 115.5 and isr._refused[part.tp].retry_at == 131.5


def test_isr_shrinks_while_an_expansion_backs_off_and_a_new_state_ends_the_back_off(
    tmp_path: Path,
) -> None:
    part, clock, controller, isr = _refused_candidate(tmp_path)

    async def main() -> None:
        await _refuse_until_backing_off_16s(part, clock, isr)
        n = len(controller.calls)
        # Node 3 falls behind for longer than the lag time (10 s) while 2 waits out its
        # back-off: the shrink is proposed alone (with node 2 it would be refused as well).
        for _ in range(4):
            clock.t += 3.0
            part.log.append(encode_batch([b"y"]), leader_epoch=0)
            part.record_follower_end_offset(2, part.log.log_end_offset)
            await isr.check()
        assert controller.calls[n:] == [(127.5, [1])]
        assert part.isr == (1,)
        # A new partition state: node 2 is proposed again at once.
        await isr.check()
        assert controller.calls[n + 1 :] == [(127.5, [1, 2])]

    asyncio.run(main())


def test_a_refused_follower_that_stops_and_comes_back_is_proposed_at_once(
    tmp_path: Path,
) -> None:
    part, clock, controller, isr = _refused_candidate(tmp_path)

    async def main() -> None:
        await _refuse_until_backing_off_16s(part, clock, isr)
        n = len(controller.calls)
        # Node 2 stops fetching: nothing to propose once its last fetch is older than the
        # lag time, and its back-off is forgotten.
        clock.t += 11.0
        part.record_follower_end_offset(3, 10)
        await isr.check()
        assert len(controller.calls) == n and not isr._refused
        # It is back: proposed at its first fetch, not after the back-off (due at 131.5).
        part.record_follower_end_offset(2, 10)
        await isr.check()
        assert controller.calls[n:] == [(126.5, [1, 2, 3])]

    asyncio.run(main())


class _RecordingController:
    """Commits every AlterPartition proposal as asked (ISR and recovery state)."""

    def __init__(self) -> None:
        self.items: list[tuple[list[int], int]] = []

    async def call(self, method: str, request, timeout: float = 5.0):
        from strom.api import controller_pb2

        resp = controller_pb2.AlterPartitionResponse()
        for p in request.partitions:
            self.items.append((list(p.new_isr), p.leader_recovery_state))
            st = _state(1, p.leader_epoch, list(p.new_isr), pepoch=p.partition_epoch + 1)
            st.leader_recovery_state = p.leader_recovery_state
            resp.partitions.add(topic=p.topic, partition=p.partition).state.CopyFrom(st)
        return resp


class _ResignController:
    """Commits a resignation as the controller does (leadership.resign): node 3 leads."""

    def __init__(self) -> None:
        self.proposals: list[list[int]] = []
        self.reasons: list[str] = []

    async def call(self, method: str, request, timeout: float = 5.0):
        from strom.api import controller_pb2

        resp = controller_pb2.AlterPartitionResponse()
        for p in request.partitions:
            self.proposals.append(list(p.new_isr))
            self.reasons.append(p.resign_reason)
            st = _state(3, p.leader_epoch + 1, list(p.new_isr), pepoch=p.partition_epoch + 1)
            resp.partitions.add(topic=p.topic, partition=p.partition).state.CopyFrom(st)
        return resp


def test_a_leader_with_damaged_data_resigns_and_truncates_there_as_follower(
    tmp_path: Path,
) -> None:
    """Found from outside: a leader whose stored data failed its check kept leading and
    answered every fetch with STORAGE_ERROR. A damaged read now makes it propose an ISR
    without itself (the controller hands leadership over); as a follower it truncates at the
    damage before it fetches again, so the new leader's copy replaces it."""
    from strom.storage.replication import IsrManager

    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3], pepoch=4))
    lg.append(encode_batch([b"x"] * 10), leader_epoch=0)
    lg.append(encode_batch([b"y"] * 10), leader_epoch=0)
    part.note_damage(10)
    part.note_damage(15)  # the lowest damaged offset counts
    controller = _ResignController()
    manager = _Manager(part)
    isr = IsrManager(1, manager, controller, lambda: "inc", 10_000, running=lambda: {1, 2, 3})  # type: ignore[arg-type]
    asyncio.run(isr.check())
    assert controller.proposals == [[2, 3]]
    assert not part.is_leader and part.leader == 3 and part.isr == (2, 3)
    fetchers = ReplicaFetchers(1, _FakeManager(part), None, lambda: "inc")  # type: ignore[arg-type]
    asyncio.run(fetchers._drop_damaged(part))
    assert (lg.log_end_offset, part.damaged_at) == (10, -1)
    assert fetchers._request([part])[0].topics[0].partitions[0].fetch_offset == 10


def test_the_only_in_sync_replica_keeps_leading_with_damaged_data(tmp_path: Path) -> None:
    from strom.storage.replication import IsrManager

    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1], pepoch=4))
    lg.append(encode_batch([b"x"] * 10), leader_epoch=0)
    part.note_damage(0)
    controller = _ResignController()
    isr = IsrManager(1, _Manager(part), controller, lambda: "inc", 10_000, running=lambda: {1})  # type: ignore[arg-type]
    asyncio.run(isr.check())
    assert controller.proposals == [] and part.is_leader


def test_a_leader_elected_uncleanly_reports_recovered_before_followers_join(
    tmp_path: Path,
) -> None:
    """After an unclean election the partition is RECOVERING, and no follower may join the
    ISR until its leader reports RECOVERED (KIP-704). Nothing reported it (found from
    outside: "recovering" until a follower happened to rejoin); the leader now does at
    once, with its ISR unchanged."""
    from strom.storage.replication import IsrManager

    part = _leader_with_lagging_candidate(tmp_path)
    unclean = _state(1, 1, [1], pepoch=7)
    unclean.leader_recovery_state = md.LEADER_RECOVERY_STATE_RECOVERING
    part.apply_state(unclean)
    assert part.recovering and part.isr == (1,)
    controller = _RecordingController()
    isr = IsrManager(
        1,
        _Manager(part),  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "inc",
        10_000,
        running=lambda: ALL,
    )

    async def main() -> None:
        await isr.check()
        recovered = md.LEADER_RECOVERY_STATE_RECOVERED
        assert controller.items == [([1], recovered)]
        assert not part.recovering and part.isr == (1,)

    asyncio.run(main())


def test_controller_calls_that_get_no_answer_say_why() -> None:
    """A restarting node that gives up waiting for the controller to fence its previous
    life logs why its last call got no answer (a chaos run waited 60 s with no clue)."""

    class View:
        def __init__(self, info: object) -> None:
            self.info = info

        def controller_info(self) -> object:
            return self.info

    async def call(view: View) -> tuple[object, str]:
        client = ControllerClient(view)  # type: ignore[arg-type]
        try:
            req = controller_pb2.ControlledShutdownRequest(node_id=1)
            resp = await client.call("ControlledShutdown", req, timeout=2.0)
            return resp, client.last_failure
        finally:
            await client.close()

    assert asyncio.run(call(View(None))) == (None, "no active controller in the cluster view")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    resp, why = asyncio.run(call(View(SimpleNamespace(host="127.0.0.1", port=port))))
    assert resp is None and why == f"UNAVAILABLE from 127.0.0.1:{port}"


def test_a_restarting_node_sees_its_fencing_in_etcd_when_the_answer_never_comes() -> None:
    """The controller fenced the previous life (etcd no longer names the node leader or
    in-sync) but its answer never reached the node: the node goes on at once instead of
    waiting out ``startup_fence_timeout_s``."""
    me = 2
    states = {("t", 0): _state(leader=me, epoch=3, isr=[me, 1])}
    calls: list[float] = []

    async def call(method: str, request: object, timeout: float) -> None:
        calls.append(timeout)
        # The controller commits the fencing; the answer is lost on the way back.
        states[("t", 0)] = _state(leader=1, epoch=4, isr=[1])
        return None

    node = SimpleNamespace(
        config=SimpleNamespace(node_id=me, startup_fence_timeout_s=30.0),
        controller=SimpleNamespace(call=call, last_failure="DEADLINE_EXCEEDED from x:1"),
        registration=SimpleNamespace(incarnation_id="i-2"),
        view=SimpleNamespace(
            lock=threading.Lock(),
            partitions=_Values(states),
        ),
    )
    node._roles_from_a_previous_life = types.MethodType(  # type: ignore[attr-defined]
        StorageNode._roles_from_a_previous_life, node
    )
    start = time.monotonic()
    asyncio.run(StorageNode._fence_previous_life(node))  # type: ignore[arg-type]
    assert time.monotonic() - start < 5 and len(calls) == 1
    assert calls[0] > 10  # longer than the controller's own wait for its view


class _Values:
    """A view's partitions map: values with ``.value`` as ClusterView keeps them."""

    def __init__(self, states: dict[tuple[str, int], md.PartitionState]) -> None:
        self.states = states

    def values(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(value=v) for v in self.states.values()]


# -- the leader's log start (found from outside) ----------------------------------------------


def _follower_with_logs(tmp_path: Path) -> tuple[Partition, ReplicaFetchers, LogManager]:
    """A follower whose log lives in a real LogManager (the checkpoints are on disk)."""
    logs = LogManager(tmp_path / "data", fsync=False)
    part = Partition(2, "t", 0, "id", logs.get_or_create("t", 0), _state(1, 3, [1, 2, 3]))
    manager = _FakeManager(part)
    manager.logs = logs
    return part, ReplicaFetchers(2, manager, None, lambda: "inc"), logs  # type: ignore[arg-type]


def _checkpointed_start(logs: LogManager) -> int:
    return checkpoint.read_offsets(logs.data_dir / LOG_START_OFFSETS)["t-0"]


def test_follower_moves_its_log_start_to_the_leaders_and_checkpoints_it(tmp_path: Path) -> None:
    """The leader's DeleteRecords reached no follower: a follower elected later served the
    deleted records again. Every answer's log start now moves the follower's up, bounded by
    its high watermark, and is on disk before the next fetch."""
    part, fetchers, logs = _follower_with_logs(tmp_path)
    pr = pb.FetchPartitionResponse(
        partition=0,
        high_watermark=12,
        log_start_offset=0,
        records=_leader_batch([b"a"] * 10, 0, 3) + _leader_batch([b"b"] * 10, 10, 3),
    )
    asyncio.run(fetchers._handle(part, 0, 3, pr))
    assert (part.log.log_start_offset, part.high_watermark) == (0, 12)
    # Never past our high watermark (Kafka's guard): only offsets known to be committed.
    asyncio.run(
        fetchers._handle(
            part, 20, 3, pb.FetchPartitionResponse(high_watermark=12, log_start_offset=15)
        )
    )
    assert part.log.log_start_offset == 12 and _checkpointed_start(logs) == 12
    asyncio.run(
        fetchers._handle(
            part, 20, 3, pb.FetchPartitionResponse(high_watermark=20, log_start_offset=15)
        )
    )
    assert part.log.log_start_offset == 15 and _checkpointed_start(logs) == 15
    with pytest.raises(OffsetOutOfRangeError):
        part.log.read(14)
    # Never back down (a stale answer, or a leader without the change yet).
    asyncio.run(
        fetchers._handle(
            part, 20, 3, pb.FetchPartitionResponse(high_watermark=20, log_start_offset=10)
        )
    )
    assert part.log.log_start_offset == 15


def test_new_replica_copies_a_batch_holding_the_leaders_log_start(tmp_path: Path) -> None:
    """Found from outside: DeleteRecords before offset 5 of a batch 0..9, then a new replica:
    it restarted at 5 and refused the leader's batch (base 0) forever. It now restarts its
    log at the batch, keeps the leader's start, and has that start checkpointed."""
    part, fetchers, logs = _follower_with_logs(tmp_path)
    oor = pb.FetchPartitionResponse(
        partition=0, error_code=E.OFFSET_OUT_OF_RANGE, log_start_offset=5, high_watermark=10
    )
    asyncio.run(fetchers._handle(part, 0, 3, oor))
    assert (part.log.log_start_offset, part.log.log_end_offset) == (5, 5)
    assert _checkpointed_start(logs) == 5
    req, _ = fetchers._request([part])
    assert req.topics[0].partitions[0].fetch_offset == 5
    pr = pb.FetchPartitionResponse(
        partition=0,
        high_watermark=10,
        log_start_offset=5,
        records=_leader_batch([b"x"] * 10, 0, 3),
    )
    asyncio.run(fetchers._handle(part, 5, 3, pr))
    assert (part.log.log_start_offset, part.log.log_end_offset) == (5, 10)
    assert part.high_watermark == 10
    assert _checkpointed_start(logs) == 5
    with pytest.raises(OffsetOutOfRangeError):
        part.log.read(4)
    req, _ = fetchers._request([part])
    assert req.topics[0].partitions[0].fetch_offset == 10


def test_a_truncation_whose_fetcher_is_cancelled_meanwhile_still_checkpoints(
    tmp_path: Path,
) -> None:
    """A role change cancels the fetcher while its truncation thread runs; the truncation
    completes (the flush lock covers it) and its checkpoint must be written too. It was
    skipped: a log restarted below its old start (at 50, start 80) kept 80 on disk until
    the periodic checkpoint, so a crash then hid 50..79 (found by the clean-clone CI, which
    met the race 1 time in ~4; this makes it happen every time)."""
    part, fetchers, logs = _follower_with_logs(tmp_path)
    part.log.truncate_fully_and_start_at(80)
    logs.checkpoint()
    assert _checkpointed_start(logs) == 80
    entered, release = threading.Event(), threading.Event()
    restart = part.log.truncate_fully_and_start_at

    def slow_restart(offset: int) -> None:
        entered.set()
        release.wait(10)
        restart(offset)

    part.log.truncate_fully_and_start_at = slow_restart  # type: ignore[method-assign]

    async def run() -> None:
        task = asyncio.create_task(fetchers._truncate(part, 50, fully=True))
        await asyncio.to_thread(entered.wait, 10)
        task.cancel()  # the role change, while the truncation thread runs
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert part.log.log_start_offset == 50
    assert _checkpointed_start(logs) == 50


# -- the leader's replica lag gauge (found from outside) --------------------------------------


class _Gauge:
    def __init__(self) -> None:
        self.value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


def test_new_leader_reports_lag_only_for_followers_that_fetched(tmp_path: Path) -> None:
    """A newly elected leader knows no follower position: the gauge showed its whole log
    end offset as lag at every failover. Followers count once they fetched from it."""
    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(2, 4, [1, 2, 3]))
    lg.append(encode_batch([b"x"] * 1000), leader_epoch=4)
    part.apply_state(_state(1, 5, [1, 2, 3]))  # elected: follower positions unknown
    manager = _Manager(part)
    gauge = _Gauge()
    manager.metrics[part.tp] = SimpleNamespace(replica_lag=gauge)
    refresh_replication_gauges(manager)  # type: ignore[arg-type]
    assert gauge.value == 0
    part.record_follower_end_offset(2, 990)
    refresh_replication_gauges(manager)  # type: ignore[arg-type]
    assert gauge.value == 10  # node 3 is still unknown: not counted
    part.record_follower_end_offset(3, 400)
    refresh_replication_gauges(manager)  # type: ignore[arg-type]
    assert gauge.value == 600


ENOSPC_ERROR = OSError(errno.ENOSPC, "No space left on device (appending to t-0/0.log)")


def test_a_leader_whose_disk_refused_an_append_resigns_as_a_storage_error(
    tmp_path: Path,
) -> None:
    """Found from outside: a leader on a full disk refused every produce with STORAGE_ERROR
    and kept leading while two in-sync replicas stood by. A failed append (a disk error) now
    has it propose an ISR without itself, saying why (the controller counts the election as
    storage_error); an append that succeeds first cancels it."""
    from strom.storage.replication import IsrManager

    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3], pepoch=4))
    controller = _ResignController()
    isr = IsrManager(1, _Manager(part), controller, lambda: "inc", 10_000, running=lambda: ALL)  # type: ignore[arg-type]
    part.note_append_failure(ENOSPC_ERROR)
    part.note_append_ok()  # the disk took the next one: nothing to resign for
    asyncio.run(isr.check())
    assert controller.proposals == [] and part.is_leader
    part.note_append_failure(ENOSPC_ERROR)
    asyncio.run(isr.check())
    assert controller.proposals == [[2, 3]] and controller.reasons == ["storage_error"]
    assert not part.is_leader and part.isr == (2, 3)


def test_the_only_in_sync_replica_keeps_leading_on_a_full_disk(tmp_path: Path) -> None:
    from strom.storage.replication import IsrManager

    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1], pepoch=4))
    part.note_append_failure(ENOSPC_ERROR)
    controller = _ResignController()
    isr = IsrManager(1, _Manager(part), controller, lambda: "inc", 10_000, running=lambda: ALL)  # type: ignore[arg-type]
    asyncio.run(isr.check())
    assert controller.proposals == [] and part.is_leader


def test_a_follower_holds_its_fetches_back_while_its_disk_stays_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that resigned on a full disk was caught up whenever its partition took no
    write since, so it rejoined the ISR at once and, as the preferred replica, was made
    leader again only to fail its next append. A replica whose append failed on a full disk
    now fetches again only once the disk has room; one that failed otherwise (EIO) after a
    while."""
    from strom.storage import disk_errors

    free = [0]
    monkeypatch.setattr(
        disk_errors.shutil, "disk_usage", lambda path: SimpleNamespace(free=free[0])
    )
    clock = Clock()
    part = Partition(1, "t", 0, "id", _log(tmp_path), _state(2, 1, [2, 3], pepoch=4))
    part.clock = clock
    assert ReplicaFetchers._disk_ready([part], 50.0) == [part]  # no failure: fetched
    part.note_append_failure(ENOSPC_ERROR)
    assert ReplicaFetchers._disk_ready([part], 50.0) == []
    assert part.fetch_retry_at > 50.0  # looked at again later
    free[0] = disk_errors.RESUME_FREE_BYTES
    assert ReplicaFetchers._disk_ready([part], 51.0) == [part]
    part.note_append_failure(OSError(errno.EIO, "Input/output error"))
    assert ReplicaFetchers._disk_ready([part], 52.0) == []
    clock.t += disk_errors.RETRY_AFTER_S
    assert ReplicaFetchers._disk_ready([part], 62.0) == [part]
    part.note_append_ok()
    assert part.disk_error is None


def test_disk_errors_of_appends_are_counted_each_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside: a follower on a full disk logged a full traceback about once a
    second per partition. Each failure is counted (strom_storage_append_failures_total, by
    errno) and one line a minute per partition is logged, saying how many were not."""
    from strom.storage import disk_errors, metrics

    clock = [5000.0]
    monkeypatch.setattr(disk_errors.time, "monotonic", lambda: clock[0])
    counter = metrics.APPEND_FAILURES.labels("full", "0", "ENOSPC")
    before = counter._value.get()
    assert disk_errors.is_disk_error(ENOSPC_ERROR)
    assert not disk_errors.is_disk_error(OSError(errno.EMFILE, "Too many open files"))
    assert not disk_errors.is_disk_error(ValueError("a bad batch"))
    with caplog.at_level("ERROR", logger="strom.storage"):
        for _ in range(5):
            disk_errors.note_append_failure("replicating from node 2", "full", 0, ENOSPC_ERROR)
        clock[0] += disk_errors.LOG_INTERVAL_S
        disk_errors.note_append_failure("replicating from node 2", "full", 0, ENOSPC_ERROR)
    assert counter._value.get() - before == 6
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 2 and all(not rec.exc_info for rec in caplog.records), lines
    assert lines[0].startswith("full-0: replicating from node 2: the disk refused an append")
    assert "No space left" in lines[0] and "4 more failures" in lines[1], lines


def test_a_follower_drops_an_epoch_its_failed_append_left_at_its_log_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside (a leader on a full disk made leader again): its append in the new
    epoch failed after the epoch was recorded, so its history ended with an epoch holding no
    batch. As a follower it named that epoch in every fetch, the leader answered a
    divergence at its log end, and it truncated to its own end in a loop, many times a
    second, copying nothing. Truncating at (or past) the log end now drops such entries,
    as Kafka's truncateTo does."""
    from strom.log.segment import LogSegment

    lg = _log(tmp_path)
    lg.append(encode_batch([b"x"] * 3), leader_epoch=0)

    def full(self: Any, *args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(LogSegment, "append", full)
        with pytest.raises(OSError):
            lg.append(encode_batch([b"y"]), leader_epoch=2)
    assert lg.log_end_offset == 3 and lg.epochs.latest_epoch == 2  # an epoch with no batch
    lg.truncate_to(3)
    assert lg.epochs.latest_epoch == 0 and lg.log_end_offset == 3
    lg.append(encode_batch([b"z"]), leader_epoch=0)  # still appends where it was
    assert lg.log_end_offset == 4


# -- a log not opened for want of file descriptors is not led (found from outside) -----------


class _RequestsController:
    def __init__(self) -> None:
        self.requests: list = []

    async def call(self, method: str, request, timeout: float = 5.0):
        from strom.api import controller_pb2

        self.requests.append(request)
        return controller_pb2.AlterPartitionResponse()


def test_the_leadership_of_a_partition_whose_log_did_not_open_is_handed_over() -> None:
    """Under a low open-file limit a node went on leading partitions it had no log for;
    it now hands each one it leads to another in-sync replica (storage_error), once per
    partition state, and leaves alone those it only follows or has nobody to hand to."""
    from strom.metadata import ClusterView, Keys
    from strom.metadata.store import Versioned
    from strom.storage.replication import UNOPENED_RETRY_S, IsrManager

    class _Store:
        keys = Keys("unit")

    view = ClusterView(_Store())  # type: ignore[arg-type]

    def put(p: int, leader: int, isr: list[int], epoch: int = 0) -> None:
        state = md.PartitionState(
            replicas=[1, 2], leader=leader, isr=isr, leader_epoch=epoch, partition_epoch=epoch
        )
        view.partitions[("t", p)] = Versioned(f"t/{p}", state, 1, 1)

    view.topics["t"] = Versioned("t", md.TopicMetadata(topic_id="tid", partition_count=4), 1, 1)
    put(0, 1, [1, 2])  # led here, another in-sync replica: handed over
    put(1, 2, [2, 1])  # followed: nothing to hand over
    put(2, 1, [1])  # led, nobody to take it: stays (logged)
    put(3, 1, [1, 2])  # opened meanwhile (hosted): forgotten
    manager = SimpleNamespace(
        partitions={("t", 3): object()},
        metrics={},
        view=view,
        unopened={("t", p): "Too many open files" for p in range(4)},
    )
    controller = _RequestsController()
    isr = IsrManager(
        1,
        manager,  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "inc",
        10_000,
        running=lambda: ALL,
    )
    now = [100.0]
    isr.clock = lambda: now[0]

    async def main() -> None:
        await isr._resign_unopened(now[0])
        assert len(controller.requests) == 1
        (item,) = controller.requests[0].partitions
        assert (item.topic, item.partition, list(item.new_isr)) == ("t", 0, [2])
        assert item.resign_reason == "storage_error" and item.topic_id == "tid"
        assert ("t", 3) not in manager.unopened
        await isr._resign_unopened(now[0] + 1)  # asked already in this state
        assert len(controller.requests) == 1
        now[0] += UNOPENED_RETRY_S  # no new state since: ask again
        await isr._resign_unopened(now[0])
        assert len(controller.requests) == 2
        put(0, 2, [2], epoch=1)  # handed over: nothing more to ask
        await isr._resign_unopened(now[0] + 100)
        assert len(controller.requests) == 2

    asyncio.run(main())


def test_isr_proposals_say_which_replica_leaves_or_joins_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An expansion names the replica that caught up and where; a shrink names the replica
    that leaves, its position against the log end and how long since it was last caught up
    and last fetched, against replica.lag.time.max.ms. Before: "proposing ISR [1, 2, 3] ->
    [1, 2] (leader epoch 0, partition epoch 5)" and nothing more."""
    from strom.storage.replication import IsrManager

    part = _leader_with_lagging_candidate(tmp_path)  # ISR [1, 3]; 2 caught up at 10
    clock = Clock()
    part.clock = clock
    part.record_follower_end_offset(2, 10)
    part.record_follower_end_offset(3, 10)
    controller = _RecordingController()
    isr = IsrManager(
        1,
        _Manager(part),  # type: ignore[arg-type]
        controller,  # type: ignore[arg-type]
        lambda: "inc",
        10_000,
        running=lambda: ALL,
    )
    isr.clock = clock
    caplog.set_level(logging.INFO, logger="strom.storage.replication")

    async def main() -> None:
        await isr.check()  # 2 joins
        for _ in range(4):  # 3 stops fetching while 2 keeps up with new records
            clock.t += 3.0
            part.log.append(encode_batch([b"y"]), leader_epoch=0)
            part.record_follower_end_offset(2, part.log.log_end_offset)
            await isr.check()

    asyncio.run(main())
    infos = [r.getMessage() for r in caplog.records if "proposing ISR" in r.getMessage()]
    assert infos == [
        "t-0: proposing ISR [1, 3] -> [1, 2, 3] (leader epoch 0, partition epoch 4): "
        "adding 2: caught up to 10 (high watermark 10, log end 10)",
        "t-0: proposing ISR [1, 2, 3] -> [1, 2] (leader epoch 0, partition epoch 5): "
        "removing 3: fetched up to 10 of log end 14, last caught up 12.0s ago, last fetched "
        "12.0s ago (replica.lag.time.max.ms 10000)",
    ]


def test_a_follower_whose_fetches_keep_failing_names_the_leader_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The line after 10 failed fetches in a row names the leader's address, how many
    partitions wait on it and gRPC's details, not only the status code."""
    import grpc

    from strom.storage import replica_fetchers

    caplog.set_level(logging.DEBUG, logger="strom.storage.replication")
    exc = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="failed to connect to all addresses; last error: Connection refused",
    )
    for failures in (9, replica_fetchers.FETCH_FAILURES_LOGGED, 11):
        replica_fetchers._log_fetch_failure(3, "10.0.0.3:9092", 22, failures, exc)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "fetch from node 3 (10.0.0.3:9092) for 22 partitions failed 10 times in a row: "
        "UNAVAILABLE: failed to connect to all addresses; last error: Connection refused"
    ]
    assert len(caplog.records) == 3  # the others at DEBUG
