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
