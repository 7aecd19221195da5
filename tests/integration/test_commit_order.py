"""One member's offset commits take effect in the order they were made (issue 9, defect 1).

The defect: a consumer calling ``commit_async()`` after every poll and ``commit()`` at the end
read back a committed offset far below its position, because the synchronous commit overtook
the queued asynchronous ones, which then landed after it. Here thousands of asynchronous
commits are in flight while the coordinator is paused (slow) and then SIGKILLed (failover);
the member's final ``commit()`` must be what ``committed()`` reads back, at once and for good,
every callback must have run (in order) before ``commit()`` returned, and the history of the
partition's committed offset in ``__consumer_offsets`` must never go backwards. A second test
sends raw OffsetCommit requests out of their order to check the coordinator's own guard, also
after a takeover replays the log.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.api import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.coordinator.offsets_log import RecordKind, decode_key, decode_offset
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for

pytestmark = pytest.mark.integration
E = common_pb2.ErrorCode
OFFSETS_TOPIC = "__consumer_offsets"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("commit-order")
    c = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=2,
        coordinator_args=[
            "--group-heartbeat-interval-ms",
            "200",
            # Longer than a pause plus a takeover, so the member keeps its partition.
            "--group-session-timeout-ms",
            "20000",
            "--offsets-partitions",
            "1",
        ],
    )
    try:
        c.start()
        yield c
    finally:
        c.kill()


def _owner(cluster: LocalCluster) -> Member:
    """The coordinator process that owns the (only) shard."""
    shards = cluster.wait_coordinators_ready()
    addr = shards[0][0]
    return next(m for m in cluster.coordinators if m.address == addr)


def _history(cluster: LocalCluster, group: str, tp: TopicPartition) -> list[int]:
    """Every offset committed for ``tp`` by ``group``, in log order, from __consumer_offsets."""
    out: list[int] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        shard = TopicPartition(OFFSETS_TOPIC, 0)
        c.assign([shard])
        end = c.end_offsets([shard])[shard]
        while c.position(shard) < end:
            for r in c.poll(timeout_ms=500):
                key = decode_key(r.key) if r.key is not None else None
                if (
                    key is not None
                    and key.kind is RecordKind.OFFSET_COMMIT
                    and (key.group_id, key.topic, key.partition) == (group, tp.topic, tp.partition)
                    and r.value is not None
                ):
                    out.append(decode_offset(r.value).offset)
    return out


def test_a_sync_commit_after_thousands_of_async_ones_is_what_reads_back(
    cluster: LocalCluster,
) -> None:
    n = 40_000
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("orders", partitions=1, replication_factor=1)
    with Producer(cluster.bootstrap) as p:
        p.send_batch("orders", [b"%d" % i for i in range(n)]).result(60)
    tp = TopicPartition("orders", 0)
    calls = 0
    done: list[tuple[int, BaseException | None]] = []
    paused: int | None = None
    slow: Member | None = None
    killed: Member | None = None
    c = Consumer(
        cluster.bootstrap, group_id="g1", auto_offset_reset="earliest", enable_auto_commit=False
    )
    try:
        c.subscribe(["orders"])
        while c.assignment() != {tp} or c.position(tp) < n:
            records = c.poll(timeout_ms=200, max_records=20)
            if not records:
                continue
            c.commit_async(callback=lambda o, e: done.append((o[tp].offset, e)))
            calls += 1
            pos = c.position(tp)
            if paused is None and pos >= n // 4:
                # A slow coordinator: commits pile up behind the paused one.
                slow = _owner(cluster)
                slow.process.signal(signal.SIGSTOP)
                paused = calls
            elif paused is not None and slow is not None and calls >= paused + 300:
                slow.process.signal(signal.SIGCONT)
                slow = None
            elif killed is None and pos >= n // 2 and slow is None:
                # A coordinator failover with async commits in flight.
                victim = _owner(cluster)
                victim.process.kill()
                killed = victim
        assert calls >= 1500
        c.commit()
        # Every earlier commit is done, its callback run, in the order made.
        assert len(done) == calls
        assert [e for _, e in done if e is not None] == []
        offsets = [o for o, _ in done]
        assert offsets == sorted(offsets) and offsets[-1] == n
        assert c.committed(tp) == OffsetAndMetadata(n)
        # And it stays there: nothing older lands later.
        cluster.wait_coordinators_ready()
        assert c.committed(tp) == OffsetAndMetadata(n)
    finally:
        if slow is not None:
            slow.process.signal(signal.SIGCONT)
        c.close(autocommit=False)
    assert killed is not None
    killed.start()
    history = _history(cluster, "g1", tp)
    assert history and history[-1] == n
    assert history == sorted(history), "the committed offset went backwards"
    again = Consumer(cluster.bootstrap, group_id="g1")
    try:
        assert again.committed(tp) == OffsetAndMetadata(n)
    finally:
        again.close()


def test_the_coordinator_keeps_a_committers_newer_offset_against_a_late_older_request(
    cluster: LocalCluster,
) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("late", partitions=1, replication_factor=1)

    client = ClusterClient(cluster.bootstrap)

    def stub() -> coordinator_pb2_grpc.CoordinatorServiceStub:
        return coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(_owner(cluster).address))

    def commit(offset: int, committer: str = "", sequence: int = 0) -> None:
        req = coordinator_pb2.OffsetCommitRequest(
            group_id="g-late", member_epoch=-1, committer_id=committer, commit_sequence=sequence
        )
        req.topics.add(topic="late").partitions.add(partition=0, committed_offset=offset)

        def sent() -> bool:
            resp = stub().OffsetCommit(req, timeout=5)
            if resp.error_code in (E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS):
                return False
            assert resp.error_code == E.NONE, resp.error_message
            assert resp.topics[0].partitions[0].error_code == E.NONE
            return True

        wait_for(sent, timeout=20, what="an answered OffsetCommit")

    def committed() -> int:
        req = coordinator_pb2.OffsetFetchRequest(group_id="g-late", member_epoch=-1)
        resp = stub().OffsetFetch(req, timeout=5)
        assert resp.error_code == E.NONE, resp.error_message
        return resp.topics[0].partitions[0].committed_offset

    commit(50, "c1", 5)
    commit(40, "c1", 4)  # older, arrives late: answered, but changes nothing
    assert committed() == 50
    commit(30, "c2", 1)  # another committer's commit is not ordered against c1's
    assert committed() == 30
    commit(60, "c1", 6)
    commit(60, "c1", 6)  # a retry of the same request is applied again, harmlessly
    assert committed() == 60

    # The guard survives a takeover: it is replayed from __consumer_offsets.
    owner = _owner(cluster)
    before = cluster.wait_coordinators_ready()[0][1]
    owner.process.kill()
    owner.start()
    wait_for(
        lambda: (cluster.coordinator_shards() or {}).get(0, ("", -1))[1] > before,
        timeout=30,
        what="the shard taken over with a bumped epoch",
    )
    commit(55, "c1", 5)
    assert committed() == 60
    commit(10)  # an admin reset is not ordered: it applies
    assert committed() == 10
    commit(20, "c1", 1)  # and the next commit of c1 is no longer behind anything
    assert committed() == 20
    client.close()
