"""Consumer groups under churn and failure (issue: consumer groups, "Must show"): members
joining one by one past the partition count, a member SIGKILLed while a stream is produced,
queue semantics (each record to exactly one member), and committed offsets across a full
cluster restart.

Real processes throughout; the coordinator runs with a 200 ms heartbeat and a 1.5 s session
timeout so that the SIGKILL bound (session timeout + 1 s) is short. Every wait is on a
condition. The full restart test runs last because it stops the module's cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from strom.client import Producer
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import UnsupportedAssignorError
from tests.conftest import create_topic as conftest_create_topic
from tests.integration.test_groups import create_topic, produce

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_S = 1.5
MEMBER_SCRIPT = Path(__file__).with_name("group_member_proc.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("groups-failures")
    c = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=1,
        coordinator_args=[
            "--group-heartbeat-interval-ms",
            "200",
            "--group-session-timeout-ms",
            str(int(SESSION_TIMEOUT_S * 1000)),
            "--offsets-partitions",
            "2",
        ],
    )
    try:
        c.start()
        yield c
    finally:
        c.kill()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[ClusterClient]:
    with ClusterClient(cluster.bootstrap, retry_s=20) as c:
        yield c


class Member:
    """A group member polling on its own thread; records ``(partition, offset)`` of every
    record it processed and, with ``commit=True``, commits after each processed batch
    (at-least-once)."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str, *, commit: bool = False):
        self.consumer = Consumer(
            cluster.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        self.consumer.subscribe([topic])
        self.commit = commit
        self.owned: set[TopicPartition] = set()
        self.seen: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            records = self.consumer.poll(50)
            with self._lock:
                self.seen.extend((r.partition, r.offset) for r in records)
            self.owned = self.consumer.assignment()
            if records and self.commit:
                # Fenced mid-rebalance: the records are simply re-read by the next owner.
                with contextlib.suppress(Exception):
                    self.consumer.commit()

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.owned}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close(autocommit=False)


def test_members_join_one_by_one_past_the_partition_count(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(client, "joins", 4)
    members: list[Member] = []
    try:
        for n in range(1, 6):
            members.append(Member(cluster, "g-joins", "joins"))

            def settled(n: int = n) -> bool:
                owned = [m.partitions() for m in members]
                counts = sorted(len(o) for o in owned)
                union = set().union(*owned)
                if union != set(range(4)) or sum(counts) != 4:
                    return False
                return counts[-1] - counts[0] <= 1 if n <= 4 else counts == [0, 1, 1, 1, 1]

            wait_for(settled, timeout=20, what=f"{n} members to share 4 partitions")
            owned = [m.partitions() for m in members]
            if n == 4:
                assert sorted(len(o) for o in owned) == [1, 1, 1, 1]
            if n == 5:
                assert sum(1 for o in owned if not o) == 1  # exactly one idle member
                assert sorted(p for o in owned for p in o) == [0, 1, 2, 3]  # none owned twice
    finally:
        for m in members:
            m.close()


def test_a_group_is_a_queue_each_record_goes_to_exactly_one_member(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    create_topic(client, "queue", 6)
    members = [Member(cluster, "g-queue", "queue", commit=True) for _ in range(3)]
    try:
        wait_for(
            lambda: (
                sorted(len(m.owned) for m in members) == [2, 2, 2]
                and set().union(*(m.partitions() for m in members)) == set(range(6))
            ),
            timeout=20,
            what="3 members with 2 partitions each",
        )
        n = 100
        for p in range(6):
            produce(client, "queue", p, n)
        want = {(p, o) for p in range(6) for o in range(n)}
        wait_for(
            lambda: {x for m in members for x in m.seen} == want,
            timeout=20,
            what="all 600 records consumed",
        )
        seen = [x for m in members for x in m.seen]
        assert len(seen) == len(want)  # no duplicates across (or within) members
        assert set(seen) == want
    finally:
        for m in members:
            m.close()


def test_a_sigkilled_member_is_replaced_within_the_session_timeout_and_nothing_is_skipped(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    topic, group, parts = "killme", "g-killme", 4
    create_topic(client, topic, parts)
    lines: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, str(MEMBER_SCRIPT), cluster.bootstrap, group, topic],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stop_producing = threading.Event()
    produced = {p: 0 for p in range(parts)}

    def produce_stream() -> None:
        with Producer(cluster.bootstrap, linger_ms=5) as producer:
            i = 0
            while not stop_producing.is_set():
                p = i % parts
                producer.send(topic, f"{i}".encode(), partition=p)
                produced[p] += 1
                i += 1
                if i % 20 == 0:
                    time.sleep(0.02)  # ~1,000 records/s: a steady stream, not a flood

    producer_thread = threading.Thread(target=produce_stream, daemon=True)
    survivors: list[Member] = []
    try:
        # The process member joins first and owns everything; then two in-process members.
        wait_for(lambda: "A 0,1,2,3" in lines, timeout=30, what="the process member to join")
        producer_thread.start()
        survivors = [Member(cluster, group, topic, commit=True) for _ in range(2)]

        def shared() -> bool:
            assigned = [x for x in lines if x.startswith("A ")]
            theirs = {int(p) for p in assigned[-1][2:].split(",") if p}
            ours = [m.partitions() for m in survivors]
            return bool(theirs) and all(ours) and theirs.isdisjoint(set().union(*ours))

        wait_for(shared, timeout=20, what="the three members to share the partitions")
        wait_for(
            lambda: any(x.startswith("C ") for x in lines[-200:]),
            timeout=20,
            what="the process member to commit",
        )
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(10)
        wait_for(
            lambda: (
                set().union(*(m.partitions() for m in survivors)) == set(range(parts))
                and sum(len(m.owned) for m in survivors) == parts
            ),
            timeout=SESSION_TIMEOUT_S + 10,
            interval=0.02,
            what="the survivors to own every partition",
        )
        took = time.monotonic() - killed_at
        assert took <= SESSION_TIMEOUT_S + 1.0, f"reassigned after {took:.2f} s"

        stop_producing.set()
        producer_thread.join(30)
        reader.join(5)

        def commits() -> dict[int, int]:
            """The killed member's last commit per partition; recomputed on every call, as
            the pipe reader may still be behind the process's last lines."""
            done: dict[int, int] = {}
            for x in list(lines):
                if x.startswith("C "):
                    p, o = map(int, x.split()[1:])
                    done[p] = max(done.get(p, 0), o)
            return done

        want = {(p, o) for p in range(parts) for o in range(produced[p])}

        def killed_processed() -> set[tuple[int, int]]:
            return {(int(x.split()[1]), int(x.split()[2])) for x in list(lines) if x[0] == "R"}

        def covered() -> bool:
            # The killed member may have committed and died before printing its C line, so
            # the records it processed (R lines, printed before each commit) are what counts.
            got = {x for m in survivors for x in m.seen} | killed_processed()
            return got >= want

        wait_for(covered, timeout=30, what="every produced record processed at least once")
        reader.join(10)
        committed = commits()
        # At-least-once: whatever the killed member committed, it had processed first.
        assert {(p, o) for p, end in committed.items() for o in range(end)} <= killed_processed()
        assert sum(produced.values()) > 0 and committed, "nothing was produced or committed"
    finally:
        stop_producing.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for m in survivors:
            m.close()


def test_close_timeout_bounds_the_whole_close_when_the_coordinator_is_stopped(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """close(timeout_ms) is the bound on the whole close, as Kafka's: with the coordinator
    SIGSTOPped (so the commit and the leave get no answer) the close returns while it is
    still stopped; the coordinator is resumed only after several times the timeout (found
    from outside: each of five steps waited the full timeout, close(timeout_ms=2000) took
    10 s). Its own cluster: a coordinator stopped this long disturbs the module's groups."""
    timeout_s = 1.5
    cluster = make_cluster(nodes=1, controllers=1, coordinators=1)
    conftest_create_topic(cluster, "close-bound")
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch("close-bound", [b"x"] * 10, partition=0).result(10)
    consumer = Consumer(cluster.bootstrap, group_id="close-bound", auto_offset_reset="earliest")
    consumer.subscribe(["close-bound"])
    wait_for(lambda: bool(consumer.poll(200)), timeout=30, what="the member's first records")
    coordinator = cluster.coordinators[0].process
    assert coordinator is not None
    resumed = threading.Event()

    def resume() -> None:
        resumed.set()
        coordinator.signal(signal.SIGCONT)

    coordinator.signal(signal.SIGSTOP)
    timer = threading.Timer(4 * timeout_s, resume)
    timer.start()
    try:
        consumer.close(timeout_ms=int(timeout_s * 1000))  # commits (auto-commit) and leaves
        returned_while_stopped = not resumed.is_set()
    finally:
        timer.cancel()
        coordinator.signal(signal.SIGCONT)
    assert consumer.closed
    assert returned_while_stopped
    # The group goes on once the coordinator answers: the close's commit, which got no
    # answer, either landed when it woke or not at all.
    with Consumer(cluster.bootstrap, group_id="close-bound") as again:
        committed = again.committed(TopicPartition("close-bound", 0))
        assert committed is None or committed.offset == 10


def test_poll_waits_out_a_group_coordinator_failover_and_resumes_at_the_committed_offset(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A consumer with a group_id and an assigned partition needs the group's committed
    offset to start; its coordinator is SIGKILLed just before. Every poll returns (empty)
    until another coordinator has taken the shard over, then the records from the committed
    offset come (found from outside: each poll raised "OffsetFetch to the coordinator
    failed: UNAVAILABLE", DEADLINE_EXCEEDED or CoordinatorNotAvailableError until the shard
    had moved, as Kafka's poll does not). Its own cluster with two coordinators; the shard
    keys' lease is 5 s so that the polls meet the failover."""
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=2,
        coordinator_args=["--offsets-partitions", "1", "--session-timeout-s", "5"],
    )
    conftest_create_topic(cluster, "failover-poll")
    tp = TopicPartition("failover-poll", 0)
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch("failover-poll", [b"r%d" % i for i in range(20)], partition=0).result(
            10
        )
    with Consumer(cluster.bootstrap, group_id="failover-poll", enable_auto_commit=False) as c:
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(7)})
    owner_address = cluster.wait_coordinators_ready()[0][0]
    owner = next(m for m in cluster.coordinators if m.address == owner_address).process
    assert owner is not None
    owner.kill()  # SIGKILL
    with Consumer(
        cluster.bootstrap,
        group_id="failover-poll",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    ) as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 60
        records = consumer.poll(timeout_ms=200)  # raised here before the fix
        while not records:
            assert time.monotonic() < deadline, "no records after the coordinator failover"
            records = consumer.poll(timeout_ms=200)
        assert [r.offset for r in records] == list(range(7, 20))


def test_committed_offsets_survive_a_full_cluster_restart(
    cluster: LocalCluster, client: ClusterClient
) -> None:
    """Stops every process, etcd included, keeping the data directories; then a new member
    of the group resumes at the committed offsets (runs last: it restarts the cluster)."""
    create_topic(client, "restart", 2)
    for p in range(2):
        produce(client, "restart", p, 10)
    tp0, tp1 = TopicPartition("restart", 0), TopicPartition("restart", 1)
    with Consumer(cluster.bootstrap, group_id="g-restart", enable_auto_commit=False) as c:
        c.commit({tp0: OffsetAndMetadata(4, "four"), tp1: OffsetAndMetadata(9)})
        assert c.committed(tp0) == OffsetAndMetadata(4, "four")

    cluster.stop()
    assert not any(m.alive() for m in cluster.members)
    cluster.start()

    member = Member(cluster, "g-restart", "restart")
    try:
        assert member.consumer.committed([tp0, tp1]) == {
            tp0: OffsetAndMetadata(4, "four"),
            tp1: OffsetAndMetadata(9),
        }
        want = {(0, o) for o in range(4, 10)} | {(1, 9)}
        wait_for(lambda: set(member.seen) == want, timeout=30, what="the records after the commits")
        assert sorted(member.seen) == sorted(want)  # nothing before the committed offsets
    finally:
        member.close()


def test_a_long_poll_raises_a_group_refusal_as_soon_as_the_heartbeat_gets_it(
    cluster: LocalCluster,
) -> None:
    """Found from outside: the coordinator refusing the member's assignor (a fatal group
    error the heartbeat thread receives) was raised by ``poll(30000)`` only when the whole
    30 s had passed: the heartbeat kept the error without waking the poll waiting for data
    (``poll(500)`` in a loop raised within 0.5 s). Now the wait ends when the error comes."""
    conftest_create_topic(cluster, "refused-assignor")
    with Consumer(
        cluster.bootstrap, group_id="refused-assignor", group_remote_assignor="no-such-assignor"
    ) as consumer:
        consumer.subscribe(["refused-assignor"])
        started = time.monotonic()
        with pytest.raises(UnsupportedAssignorError, match="no-such-assignor"):
            consumer.poll(30_000)
        assert time.monotonic() - started < 15  # the heartbeat's round trip, not the 30 s
