"""A step of the coordinator's wall clock moves none of its timeouts (strom.clock.steady_ms).

The coordinator runs with the test-only clock offset file (``STROM_TEST_CLOCK_OFFSET_FILE``)
that the reliability suite uses, on real processes: etcd, a controller, a storage node and
the coordinator. Its wall clock jumps 10 minutes forward and comes back:

- forward: no member of a group is expired and no open transaction is aborted (with the
  deadlines on the wall clock, every session and transaction older than its timeout by the
  jump's measure ended at the coordinator's next timer pass, within a second);
- back: a transaction begun while the clock was ahead and then abandoned is still aborted
  after its own timeout, not after the jump too (it used to stay open, holding the last
  stable offset of its partition and its group's offsets, for those 10 minutes).

And a transaction begun while the coordinator's steady clock still trails a forward step of
its wall clock is not aborted by the next owner of its shard (whose steady clock has no such
lag) as if it were as much older as the step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from strom import Consumer, Producer, TopicPartition
from strom.clock import OFFSET_ENV
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import InvalidProducerEpochError
from tests.conftest import create_topic, member_metric

pytestmark = pytest.mark.integration
JUMP_MS = 600_000
#: How long the forward jump is watched: the coordinator re-reads the offset file within
#: 0.1 s and its timer loop passes at least once a second.
WATCH_S = 3.0


class Listener:
    """Counts partitions taken away from the member (revoked or lost)."""

    def __init__(self) -> None:
        self.assigned: set[TopicPartition] = set()
        self.taken: list[TopicPartition] = []
        self.lock = threading.Lock()

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.assigned |= set(partitions)

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.taken += partitions

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self.on_partitions_revoked(partitions)


def test_a_wall_clock_step_moves_no_session_or_transaction_timeout(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    clock = tmp_path / "coordinator-clock.ms"
    clock.write_text("0")
    c = make_cluster(
        nodes=1,
        controllers=1,
        coordinator_args=[
            "--group-heartbeat-interval-ms", "200",
            "--group-session-timeout-ms", "3000",
            "--offsets-partitions", "1",
            "--transaction-state-partitions", "1",
        ],
        coordinator_env={OFFSET_ENV: str(clock)},
    )  # fmt: skip
    create_topic(c, "steps", partitions=2)
    (coordinator,) = c.coordinators
    listener = Listener()
    member = Consumer(c.bootstrap, group_id="steady", auto_offset_reset="earliest")
    before = Producer(c.bootstrap, transactional_id="before-jump", transaction_timeout_ms=20_000)
    during = Producer(c.bootstrap, transactional_id="during-jump", transaction_timeout_ms=3000)
    try:
        member.subscribe(["steps"], listener=listener)
        wait_for(
            lambda: member.poll(timeout_ms=100) is not None and len(listener.assigned) == 2,
            timeout=30,
            what="the member to own both partitions",
        )
        before.init_transactions()
        before.begin_transaction()
        before.send("steps", b"begun before the jump", partition=0).result(10)

        clock.write_text(str(JUMP_MS))
        watch_until = time.monotonic() + WATCH_S
        while time.monotonic() < watch_until:
            member.poll(timeout_ms=100)
        assert listener.taken == [], "a forward step of the clock expired the member"
        expired = sum(
            member_metric(coordinator, "strom_coordinator_members_expired_total", reason=r)
            for r in ("session", "rebalance")
        )
        assert expired == 0
        before.commit_transaction()  # not aborted by the step: it commits

        during.init_transactions()
        during.begin_transaction()
        during.send("steps", b"begun while the clock was ahead", partition=1).result(10)
        clock.write_text("0")  # the clock comes back; the transaction is abandoned
        tp = TopicPartition("steps", 1)
        with Consumer(c.bootstrap, isolation_level="read_committed") as rc:
            assert rc.end_offsets([tp])[tp] == 0  # held by the open transaction
            # Its 3 s timeout and a timer pass, not the 600 s of the step on top.
            wait_for(
                lambda: rc.end_offsets([tp])[tp] == 2,  # the record and the abort marker
                timeout=30,
                what="the abandoned transaction's timeout abort",
            )
        with pytest.raises(InvalidProducerEpochError, match=r"transaction\.timeout\.ms"):
            during.commit_transaction()  # (abortable since KIP-588)
        assert listener.taken == []
    finally:
        member.close()
        before.close()
        during.close()


def test_a_transaction_begun_on_a_slewing_clock_survives_a_new_owner(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """The coordinator's wall clock is stepped 7 minutes forward; its steady clock, which
    writes transaction start times, then trails it by 7 minutes (slewing). A transaction
    begun then (timeout 60 s) and loaded by a new owner whose steady clock agrees with its
    wall clock (the restarted process) used to look 7 minutes old there and was aborted at
    the new owner's first timer pass. The loader now reads the start through the writer's
    wall clock (the batch time): the transaction commits."""
    clock = tmp_path / "coordinator-clock.ms"
    clock.write_text("0")
    c = make_cluster(
        nodes=1,
        controllers=1,
        coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
        coordinator_env={OFFSET_ENV: str(clock)},
    )  # fmt: skip
    create_topic(c, "slewed", partitions=2)
    (coordinator,) = c.coordinators
    c.wait_coordinators_ready()  # its steady clock starts (at the wall clock) with the loads
    step_ms = 420_000
    clock.write_text(str(step_ms))
    state = TopicPartition("__transaction_state", 0)
    with Consumer(c.bootstrap, auto_offset_reset="earliest") as watcher:
        watcher.assign([state])

        def stepped() -> bool:
            """The coordinator stamps its writes with the stepped clock (it re-reads the
            offset file within 0.1 s of a wall-clock reading)."""
            with Producer(c.bootstrap, transactional_id="probe") as probe:
                probe.init_transactions()
            ahead = time.time() * 1000 + step_ms / 2
            return any(r.timestamp > ahead for r in watcher.poll(timeout_ms=500))

        wait_for(stepped, timeout=60, what="the coordinator's wall clock stepped")
    slewed = Producer(c.bootstrap, transactional_id="slewed", transaction_timeout_ms=60_000)
    control = Producer(c.bootstrap, transactional_id="control", transaction_timeout_ms=2000)
    try:
        slewed.init_transactions()
        slewed.begin_transaction()
        slewed.send("slewed", b"begun on a slewing clock", partition=0).result(30)
        c.restart(coordinator)  # a new owner, its steady clock at its wall clock
        c.wait_coordinators_ready()
        # A transaction begun on the new owner and left to time out: once it is aborted, a
        # timer pass has looked at the first one too.
        control.init_transactions()
        control.begin_transaction()
        control.send("slewed", b"left to time out", partition=1).result(30)
        tp1 = TopicPartition("slewed", 1)
        with Consumer(c.bootstrap, isolation_level="read_committed") as rc:
            wait_for(
                lambda: rc.end_offsets([tp1])[tp1] == 2,  # the record and the abort marker
                timeout=60,
                what="the control transaction's timeout abort",
            )
        slewed.commit_transaction()  # not aborted by the new owner
    finally:
        slewed.close()
        control.close()
