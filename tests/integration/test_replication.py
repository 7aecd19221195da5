"""Replication end to end (issue: replication, "Must show"): real etcd, two controllers and
three storage nodes as processes; replication factor 3, min.insync.replicas=2, acks=all."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.api import common_pb2, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.errors import is_retriable
from strom.log import checkpoint
from strom.log.manager import LOG_START_OFFSETS
from strom.record import decode_records, encode_batch
from tests.conftest import TopicFactory, create_topic, member_metric, module_cluster

pytestmark = pytest.mark.integration
NONE = common_pb2.ErrorCode.NONE
NOT_LEADER_OR_FOLLOWER = common_pb2.ErrorCode.NOT_LEADER_OR_FOLLOWER
OFFSET_OUT_OF_RANGE = common_pb2.ErrorCode.OFFSET_OUT_OF_RANGE
#: The topic of the test with a cluster of its own.
TOPIC = "replicated"


# One cluster for the module, each test on a topic of its own; members a test killed are
# restarted after it.
cluster = module_cluster(nodes=3, controllers=2, node_args=["--replica-lag-time-max-ms", "1500"])
HEALED_CLUSTERS = ("cluster",)


@pytest.fixture
def topic(cluster: LocalCluster, new_topic: TopicFactory) -> str:
    """A fresh replicated partition (RF 3, min.insync.replicas=2) with its full ISR."""
    name = new_topic(cluster, 1, 3, {"min.insync.replicas": "2"})

    def settled() -> bool:
        # A full ISR, led by its preferred replica: a partition created while that node was
        # still starting is led by another first and moved back soon after, and a test that
        # took the first leader then saw "leadership moved" (CI).
        with ClusterClient(cluster.bootstrap, retry_s=5) as client:
            p = client.metadata([name], timeout_s=2).topics[0].partitions[0]
        return len(p.isr) == 3 and p.leader == p.replicas[0]

    wait_for(settled, timeout=30, what="a full ISR led by the preferred replica")
    return name


def _state(c: LocalCluster, topic: str) -> tuple[int, int, list[int]]:
    """(leader, leader_epoch, isr) of partition 0 as the cluster reports it."""
    with ClusterClient(c.bootstrap, retry_s=5) as client:
        # A short timeout per node: a node a test paused (SIGSTOP) accepts the connection
        # but never answers, and the next bootstrap node must be asked soon enough.
        md = client.metadata([topic], timeout_s=2)
    p = md.topics[0].partitions[0]
    return p.leader, p.leader_epoch, sorted(p.isr)


def _produce(
    client: ClusterClient,
    topic: str,
    values: list[bytes],
    acks: int = -1,
    address: str | None = None,
    keys: list[bytes] | None = None,
) -> tuple[int, int]:
    """One batch; returns (error_code, base_offset). Routed to the leader unless ``address``."""
    req = storage_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=5000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=topic,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=0,
                        records=encode_batch(values, keys=keys),
                        current_leader_epoch=-1,
                    )
                ],
            )
        ],
    )
    if address is not None:
        r = client.storage(address).Produce(req, timeout=10).topics[0].partitions[0]
    else:
        r = (
            client.with_leader(
                topic,
                0,
                lambda s: s.Produce(req, timeout=10),
                lambda resp: (
                    is_retriable(resp.topics[0].partitions[0].error_code)
                    and resp.topics[0].partitions[0].error_code != NONE
                ),
            )
            .topics[0]
            .partitions[0]
        )
    return r.error_code, r.base_offset


def _fetch_request(topic: str, offset: int) -> storage_pb2.FetchRequest:
    return storage_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        max_bytes=8 << 20,
        topics=[
            storage_pb2.FetchTopic(
                topic=topic,
                partitions=[
                    storage_pb2.FetchPartition(
                        partition=0,
                        fetch_offset=offset,
                        current_leader_epoch=-1,
                        partition_max_bytes=4 << 20,
                    )
                ],
            )
        ],
    )


def _read_all(client: ClusterClient, topic: str, offset: int = 0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while True:
        req = _fetch_request(topic, offset)
        r = (
            client.with_leader(
                topic,
                0,
                lambda s, req=req: s.Fetch(req, timeout=10),
                lambda resp: resp.topics[0].partitions[0].error_code != NONE,
            )
            .topics[0]
            .partitions[0]
        )
        assert r.error_code == NONE, r.error_message
        recs = decode_records(r.records)
        if not recs:
            return out
        out.extend((x.offset, x.value) for x in recs if x.offset >= offset)
        offset = recs[-1].offset + 1


def _member(c: LocalCluster, node_id: int) -> Member:
    return c.node(node_id)


def _kill_leader(c: LocalCluster, topic: str, what: str, timeout: float = 20) -> tuple[int, int]:
    """SIGKILL partition 0's leader and wait for another one; (old leader, old epoch)."""
    leader, epoch, _ = _state(c, topic)
    _member(c, leader).process.kill()
    wait_for(lambda: _state(c, topic)[0] not in (leader, -1), timeout=timeout, what=what)
    return leader, epoch


def test_acknowledged_records_survive_leader_sigkill(cluster: LocalCluster, topic: str) -> None:
    acked: dict[bytes, int] = {}
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        i = 0

        def send(n: int) -> None:
            nonlocal i
            for _ in range(n):
                values = [b"v%d-%d" % (i, j) for j in range(10)]
                code, base = _produce(client, topic, values)
                if code == NONE:
                    for j, v in enumerate(values):
                        acked[v] = base + j
                i += 1

        send(30)
        leader, epoch, _ = _state(cluster, topic)
        _member(cluster, leader).process.kill()  # SIGKILL the leader mid-stream
        send(30)
        new_leader, new_epoch, _ = _state(cluster, topic)
        assert new_leader != leader and new_epoch > epoch
        log = _read_all(client, topic)
    offsets = [o for o, _ in log]
    assert offsets == list(range(len(offsets)))  # in order, no gap
    where = {v: o for o, v in log}
    assert len(acked) >= 500
    for v, o in acked.items():  # every acknowledged record, at the offset it was acked with
        assert where.get(v) == o


def test_restarted_follower_catches_up_and_rejoins_the_isr(
    cluster: LocalCluster, topic: str
) -> None:
    leader, _, _ = _state(cluster, topic)
    follower = next(n for n in cluster.nodes if n.ident != leader)
    follower.process.kill()
    wait_for(
        lambda: follower.ident not in _state(cluster, topic)[2],
        timeout=20,
        what="the dead follower to leave the ISR",
    )
    with ClusterClient(cluster.bootstrap) as client:
        for k in range(20):
            assert _produce(client, topic, [b"missed-%d" % k])[0] == NONE
    cluster.restart(follower)
    wait_for(
        lambda: follower.ident in _state(cluster, topic)[2],
        timeout=30,
        what="the restarted follower to rejoin the ISR",
    )


def test_a_stopped_follower_is_not_proposed_back_until_it_returns(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: once a node stopped (even cleanly, so on every rolling restart),
    each leader of an idle partition it replicated proposed it back to the ISR about once a
    second, forever (its last fetch position sat at the HW), refused INELIGIBLE_REPLICA by
    the controller and logged twice each time. Now only a follower that fetches and whose
    node is RUNNING is proposed: none while it is away, and it rejoins when it is back."""
    # A cluster of its own, so that the stop and restart do not unsettle the module's
    # cluster (leaderships, ISRs) for the tests after this one.
    cluster = make_cluster(nodes=3, controllers=1, node_args=["--replica-lag-time-max-ms", "1500"])
    name = create_topic(cluster, "idle-rf3", 3, 3)
    isrs = lambda: _isrs(cluster, name)  # noqa: E731
    wait_for(lambda: all(len(i) == 3 for i in isrs()), timeout=20, what="full ISRs")
    gone = cluster.nodes[-1]
    others = [n for n in cluster.nodes if n is not gone]
    controller = cluster.active_controller()
    assert controller is not None
    gone.process.stop()  # SIGTERM: a clean stop
    wait_for(
        lambda: all(gone.ident not in i for i in isrs()), timeout=30, what="the ISRs to shrink"
    )

    def refused() -> float:
        return member_metric(
            controller,
            "strom_controller_request_latency_seconds_count",
            rpc="AlterPartition",
            result="INELIGIBLE_REPLICA",
        )

    def follower_fetches() -> float:
        return sum(
            member_metric(n, "strom_storage_fetch_requests_total", kind="follower") for n in others
        )

    # A window measured in the leaders' own work: the remaining followers long-poll them
    # (on idle partitions an answer per FETCH_MAX_WAIT_MS each), and the leaders check their
    # ISRs several times per answer. Before, every check proposed the stopped node.
    before, start = refused(), follower_fetches()
    wait_for(lambda: follower_fetches() >= start + 40, timeout=60, what="follower fetches")
    assert refused() - before <= 1
    cluster.restart(gone)
    wait_for(lambda: all(gone.ident in i for i in isrs()), timeout=30, what="the node to rejoin")


def _isrs(c: LocalCluster, topic: str) -> list[list[int]]:
    """The ISR of each partition of ``topic`` as the cluster reports it."""
    with ClusterClient(c.bootstrap, retry_s=5) as client:
        md = client.metadata([topic], timeout_s=2)
    return [sorted(p.isr) for p in md.topics[0].partitions]


def test_acks_all_is_not_acknowledged_when_the_isr_fell_below_min_insync_meanwhile(
    cluster: LocalCluster, topic: str
) -> None:
    """Both followers stop after the request's check and before they fetch the batch: the
    ISR shrinks to the leader alone, the high watermark jumps to the leader's log end, and
    the records, held by one replica, must not be acknowledged (found from outside: they
    were, with min.insync.replicas=2). Kafka answers NOT_ENOUGH_REPLICAS_AFTER_APPEND."""
    leader, _, _ = _state(cluster, topic)
    followers = [n for n in cluster.nodes if n.ident != leader]
    with ClusterClient(cluster.bootstrap) as client:
        assert _produce(client, topic, [b"warm"])[0] == NONE
        for f in followers:
            f.process.signal(signal.SIGSTOP)
        try:
            req = storage_pb2.ProduceRequest(
                acks=-1,
                timeout_ms=60_000,  # the shrink, not the timeout, must end the wait
                topics=[
                    storage_pb2.ProduceTopicData(
                        topic=topic,
                        partitions=[
                            storage_pb2.ProducePartitionData(
                                partition=0,
                                records=encode_batch([b"only on the leader"]),
                                current_leader_epoch=-1,
                            )
                        ],
                    )
                ],
            )
            address = next(n.address for n in cluster.nodes if n.ident == leader)
            r = client.storage(address).Produce(req, timeout=70).topics[0].partitions[0]
            assert r.error_code == common_pb2.ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, r
            assert "min.insync.replicas=2" in r.error_message
            # And what comes next is refused before it is appended.
            assert _produce(client, topic, [b"next"], address=address)[0] == (
                common_pb2.ErrorCode.NOT_ENOUGH_REPLICAS
            )
        finally:
            for f in followers:
                f.process.signal(signal.SIGCONT)
    wait_for(lambda: len(_state(cluster, topic)[2]) == 3, timeout=30, what="a full ISR again")


def test_transaction_markers_follow_min_insync_replicas(cluster: LocalCluster, topic: str) -> None:
    """A transaction marker is written like an acks=-1 batch (Kafka's rule): held by the
    leader alone it is not confirmed (NOT_ENOUGH_REPLICAS_AFTER_APPEND), below
    min.insync.replicas it is refused before the append (NOT_ENOUGH_REPLICAS), and the
    coordinator retries; found from outside: markers were confirmed with the followers gone,
    and lost with the leader the transaction would stay open on the partition for good."""
    with ClusterClient(cluster.bootstrap) as client:
        init = client.storage(cluster.nodes[0].address).InitProducerId(
            storage_pb2.InitProducerIdRequest(), timeout=10
        )
        pid, epoch = init.producer_id, init.producer_epoch
        batch = encode_batch(
            [b"in a transaction"],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        )
        req = storage_pb2.ProduceRequest(
            acks=-1,
            timeout_ms=10_000,
            transactional_id="markers-direct",  # unknown to any coordinator
            topics=[
                storage_pb2.ProduceTopicData(
                    topic=topic,
                    # -1: no leader epoch check (the module's topic may have changed
                    # leaders before this test; 0 was refused FENCED_LEADER_EPOCH then).
                    partitions=[
                        storage_pb2.ProducePartitionData(
                            partition=0, records=batch, current_leader_epoch=-1
                        )
                    ],
                )
            ],
        )

        def produced() -> int | None:
            # To the leader of the moment: a node the previous test paused may still be
            # fenced by the controller (its lease revoked) and lose the leadership it just
            # took (CI: NOT_LEADER_OR_FOLLOWER). Once the followers are paused below,
            # leadership cannot move (they are out of the ISR).
            leader = _state(cluster, topic)[0]
            address = next(n.address for n in cluster.nodes if n.ident == leader)
            code = client.storage(address).Produce(req, timeout=15).topics[0].partitions[0]
            assert code.error_code in (NONE, NOT_LEADER_OR_FOLLOWER), code
            return leader if code.error_code == NONE else None

        wait_for(produced, timeout=30, what="the transactional batch written")

        def marker(timeout_ms: int, leader: int) -> storage_pb2.TxnMarkerPartitionResult:
            req = storage_pb2.WriteTxnMarkersRequest(timeout_ms=timeout_ms)
            req.markers.add(
                producer_id=pid,
                producer_epoch=epoch,
                committed=True,
                topics=[common_pb2.TopicPartitions(topic=topic, partitions=[0])],
            )
            stub = client.storage(next(n.address for n in cluster.nodes if n.ident == leader))
            resp = stub.WriteTxnMarkers(req, timeout=timeout_ms / 1000 + 10)
            return resp.markers[0].topics[0].partitions[0]

        for attempt in range(3):
            wait_for(lambda: len(_state(cluster, topic)[2]) == 3, timeout=30, what="a full ISR")
            leader = _state(cluster, topic)[0]
            followers = [n for n in cluster.nodes if n.ident != leader]
            for f in followers:
                f.process.signal(signal.SIGSTOP)
            try:
                r = marker(60_000, leader)  # the shrink, not the timeout, ends the wait
                if r.error_code == NOT_LEADER_OR_FOLLOWER and attempt < 2:
                    # The controller fenced nodes the previous test paused only now, and
                    # moved this partition (CI): nothing was written; again from a full ISR.
                    continue
                assert r.error_code == common_pb2.ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, r
                r = marker(10_000, leader)
                assert r.error_code == common_pb2.ErrorCode.NOT_ENOUGH_REPLICAS, r
                assert "min.insync.replicas=2" in r.error_message
                break
            finally:
                for f in followers:
                    f.process.signal(signal.SIGCONT)

        def committed() -> bool:
            state = _state(cluster, topic)
            if len(state[2]) < 3:
                return False
            r = marker(10_000, state[0])
            assert r.error_code in (NONE, NOT_LEADER_OR_FOLLOWER), r
            return r.error_code == NONE

        wait_for(committed, timeout=30, what="the marker confirmed with a full ISR again")


def test_a_leader_elected_uncleanly_reports_recovered(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """The only in-sync replica dies while the other is out of the ISR; with unclean leader
    election on, the other leads, RECOVERING (no follower may join until its leader reports
    it has recovered). It reports RECOVERED at once: before, the partition stayed
    "recovering" for as long as no follower rejoined (found from outside)."""
    topic = new_topic(cluster, 1, 2, {"unclean.leader.election.enable": "true"})
    wait_for(lambda: len(_state(cluster, topic)[2]) == 2, timeout=20, what="a full ISR")
    leader_id, _, _ = _state(cluster, topic)
    leader = _member(cluster, leader_id)
    with Admin(cluster.bootstrap) as admin:
        replicas = admin.describe_topics([topic])[topic].partitions[0].replicas
    follower = _member(cluster, next(r for r in replicas if r != leader_id))
    follower.process.signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: _state(cluster, topic)[2] == [leader_id],
            timeout=20,
            what="the paused follower to leave the ISR",
        )
        leader.process.kill()  # the only in-sync replica: only an unclean election helps
    finally:
        follower.process.signal(signal.SIGCONT)
    wait_for(
        lambda: _state(cluster, topic)[0] == follower.ident,
        timeout=30,
        what="the out-of-sync replica elected uncleanly",
    )

    def recovered() -> bool:
        with Admin(cluster.bootstrap) as admin:
            p = admin.describe_topics([topic])[topic].partitions[0]
        return p.leader == follower.ident and not p.recovering

    wait_for(recovered, timeout=20, what="the unclean leader to report RECOVERED")


def test_paused_follower_shrinks_isr_and_produce_continues(
    cluster: LocalCluster, topic: str
) -> None:
    leader, _, _ = _state(cluster, topic)
    follower = next(n for n in cluster.nodes if n.ident != leader)
    follower.process.signal(signal.SIGSTOP)
    try:
        with ClusterClient(cluster.bootstrap) as client:
            wait_for(
                lambda: follower.ident not in _state(cluster, topic)[2],
                timeout=20,
                what="the paused follower to leave the ISR",
            )
            for k in range(20):  # ISR of 2 still satisfies min.insync.replicas=2
                assert _produce(client, topic, [b"during-%d" % k])[0] == NONE
    finally:
        follower.process.signal(signal.SIGCONT)
    wait_for(
        lambda: follower.ident in _state(cluster, topic)[2],
        timeout=30,
        what="the resumed follower to rejoin the ISR",
    )


def test_paused_old_leader_is_fenced_when_it_wakes_up(cluster: LocalCluster, topic: str) -> None:
    leader, _, _ = _state(cluster, topic)
    old = _member(cluster, leader)
    old.process.signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: _state(cluster, topic)[0] not in (leader, -1),
            timeout=20,
            what="a new leader after the old one stopped",
        )
    finally:
        old.process.signal(signal.SIGCONT)
    with ClusterClient(cluster.bootstrap) as client:
        code, _ = _produce(client, topic, [b"zombie-write"], acks=-1, address=old.address)
        assert code != NONE  # refused: not leader any more, fenced, or never committed
        assert _produce(client, topic, [b"after"])[0] == NONE
        values = [v for _, v in _read_all(client, topic)]
    assert b"zombie-write" not in values and b"after" in values


def test_controller_fences_a_killed_node_before_its_lease_expires(tmp_path: Path) -> None:
    """With a 60 s node lease, only the controller's health streams (prober.py) can notice a
    SIGKILLed leader within the test's timeout: it revokes the node's lease, and the partition
    gets a new leader that takes acks=all writes."""
    c = LocalCluster(
        tmp_path / "c", nodes=3, controllers=1, node_args=["--session-timeout-s", "60"]
    )
    try:
        c.start()
        with ClusterClient(c.bootstrap, retry_s=20) as client:
            Admin(cluster_client=client).create_topic(
                TOPIC, partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
            )
            wait_for(lambda: len(_state(c, TOPIC)[2]) == 3, timeout=20, what="a full ISR")
            leader, epoch = _kill_leader(
                c, TOPIC, "a new leader long before the 60 s lease expires", timeout=15
            )
            assert _state(c, TOPIC)[1] > epoch
            assert leader not in {n.node_id for n in client.metadata().nodes}
            assert _produce(client, TOPIC, [b"after"])[0] == NONE
    finally:
        c.kill()


def _log_start_on_disk(c: LocalCluster, node_id: int, topic: str) -> int:
    """The log start offset of partition 0 in a node's log-start-offset-checkpoint (what the
    node starts from after a crash); -1 when it lists none."""
    path = c.root / f"node-{node_id}" / LOG_START_OFFSETS
    return checkpoint.read_offsets(path).get(f"{topic}-0", -1)


def _fetch_code(client: ClusterClient, topic: str, offset: int) -> int:
    """The leader's error code for a consumer fetch of partition 0 at ``offset``."""
    req = _fetch_request(topic, offset)
    resp = client.with_leader(
        topic,
        0,
        lambda s: s.Fetch(req, timeout=10),
        lambda resp: resp.topics[0].partitions[0].error_code not in (NONE, OFFSET_OUT_OF_RANGE),
    )
    return int(resp.topics[0].partitions[0].error_code)


def test_deleted_records_stay_deleted_after_the_leader_dies(
    cluster: LocalCluster, topic: str
) -> None:
    """Found from outside: DeleteRecords reached no follower (their log start stayed 0) and
    the leader's new log start reached its checkpoint only every --checkpoint-interval-ms
    (60 s). After the leader was SIGKILLed, Earliest was 0 again and consumers read the
    deleted records. Now the leader checkpoints before answering, followers take the
    leader's log start from every fetch answer (and checkpoint it), and the answer waits
    until every in-sync follower reported it (Kafka's low watermark): a leader killed right
    after the answer leaves no in-sync replica with the records."""
    tp = TopicPartition(topic, 0)
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        for k in range(2):
            assert _produce(client, topic, [b"r%d-%d" % (k, j) for j in range(10)])[0] == NONE
        admin = Admin(cluster_client=client)
        assert admin.delete_records({tp: 10}) == {tp: 10}
        epoch = _state(cluster, topic)[1]
        # Durable on every in-sync replica before the answer: no waiting here.
        assert {n.ident: _log_start_on_disk(cluster, n.ident, topic) for n in cluster.nodes} == {
            n.ident: 10 for n in cluster.nodes
        }
        _kill_leader(cluster, topic, "a new leader after the old one was killed")
        assert _state(cluster, topic)[1] > epoch
        earliest = admin.list_offsets({tp: "earliest"})[tp]
        assert earliest is not None and earliest.offset == 10
        assert _fetch_code(client, topic, 0) == OFFSET_OUT_OF_RANGE
        assert [o for o, _ in _read_all(client, topic, 10)] == list(range(10, 20))


def test_reassignment_completes_after_delete_records_inside_a_batch(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """Found from outside: after DeleteRecords before offset 5 of a batch holding 0..9, a
    replica added by a reassignment restarted its log at 5, then refused the leader's batch
    (base offset 0, below its end) forever, and the reassignment never finished. It now
    restarts its log at the batch keeping the leader's log start (Kafka's rule)."""
    topic = new_topic(cluster, 1, 1)
    tp = TopicPartition(topic, 0)
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        code, base = _produce(client, topic, [b"v%d" % j for j in range(10)])  # one batch
        assert (code, base) == (NONE, 0)
        admin = Admin(cluster_client=client)
        assert admin.delete_records({tp: 5}) == {tp: 5}
        leader = _state(cluster, topic)[0]
        other = next(n.ident for n in cluster.nodes if n.ident != leader)
        admin.alter_partition_reassignments({tp: [other, leader]})

        def done() -> bool:
            p = admin.describe_topic(topic).partitions[0]
            return not p.reassigning and set(p.isr) == {leader, other}

        wait_for(done, timeout=30, what="the reassignment to complete")
        assert _log_start_on_disk(cluster, other, topic) == 5
        admin.elect_leaders([tp])  # the new replica (first in the list) leads
        wait_for(lambda: _state(cluster, topic)[0] == other, timeout=20, what="node to lead")
        offsets = admin.list_offsets({tp: "earliest"})[tp], admin.list_offsets({tp: "latest"})[tp]
        assert [o.offset if o else None for o in offsets] == [5, 10]
        assert _fetch_code(client, topic, 4) == OFFSET_OUT_OF_RANGE
        assert _read_all(client, topic, 5) == [(j, b"v%d" % j) for j in range(5, 10)]


def test_a_follower_behind_a_compaction_catches_up(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: the leader's cleaner merged emptied batches 0..22 into one while a
    killed follower held the batches 0..9; restarted, the follower fetched at 10, was served
    the merged batch starting at 0, refused it as below its log end, and stayed out of the
    ISR for good. Now the leader serves that batch cut at the fetch offset."""
    c = make_cluster(
        nodes=3,
        controllers=1,
        node_args=["--replica-lag-time-max-ms", "1500", "--log-cleanup-interval-ms", "200"],
    )
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "16384",
        "min.cleanable.dirty.ratio": "0.01",
    }
    topic = create_topic(c, "compacted-lag", 1, 3, config)
    wait_for(lambda: len(_state(c, topic)[2]) == 3, timeout=20, what="a full ISR")
    leader, _, _ = _state(c, topic)
    follower = next(n for n in c.nodes if n.ident != leader)
    with ClusterClient(c.bootstrap) as client:

        def put(i: int) -> None:
            assert _produce(client, topic, [b"v%d" % i], keys=[b"k%d" % (i % 3)])[0] == NONE

        for i in range(10):  # acks=all with the full ISR: the follower has all ten
            put(i)
        follower.process.kill()
        wait_for(
            lambda: follower.ident not in _state(c, topic)[2],
            timeout=20,
            what="the dead follower to leave the ISR",
        )

        def cleanings() -> float:
            return member_metric(
                _member(c, leader), "strom_storage_cleaner_cleanings_total", reason="dirty_ratio"
            )

        before = cleanings()
        for i in range(10, 70):
            put(i)
        wait_for(
            lambda: cleanings() > before,
            timeout=30,
            what="the leader's cleaner",
        )
        c.restart(follower)
        wait_for(
            lambda: follower.ident in _state(c, topic)[2],
            timeout=30,
            what="the restarted follower to rejoin the ISR",
        )
    end = member_metric(follower, "strom_storage_log_end_offset", topic=topic, partition="0")
    assert end == 70


def _records_on_disk(c: LocalCluster, node_id: int, topic: str, start: int) -> list[bytes]:
    """Values of partition 0's records from ``start`` on, as a node's segment files hold
    them (followers serve no consumer fetches: this is how their copies are compared)."""
    out: list[bytes] = []
    for path in sorted((c.root / f"node-{node_id}" / f"{topic}-0").glob("*.log")):
        out.extend(r.value for r in decode_records(path.read_bytes()) if r.offset >= start)
    return out


def test_records_of_an_unclean_leader_survive_replicas_whose_log_start_is_above_its_end(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """Found from outside: replica B missed offsets 50..99 and DeleteRecords moved the other
    replicas' log start to 80; B, elected uncleanly with its log ending at 50, acknowledged
    50..79. The old replicas came back diverging at 50, below their log start: the
    truncation stopped at their log start, so they kept their own 50..79, reached B's log end
    and joined the ISR; the preferred election then made one of them leader and B's
    acknowledged records were gone everywhere. A replica now truncates fully and restarts its
    log at the divergence point (Kafka's truncateFullyAndStartAt) and fetches 50.. from B."""
    topic = new_topic(
        cluster, 1, 3, {"unclean.leader.election.enable": "true", "min.insync.replicas": "1"}
    )
    tp = TopicPartition(topic, 0)
    wait_for(lambda: len(_state(cluster, topic)[2]) == 3, timeout=20, what="a full ISR")
    with Admin(cluster.bootstrap) as admin:
        replicas = admin.describe_topics([topic])[topic].partitions[0].replicas
    a, b, c = (_member(cluster, r) for r in replicas)  # a: the preferred leader
    assert _state(cluster, topic)[0] == a.ident
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        for k in range(5):  # 0..49 everywhere, batches of ten
            assert _produce(client, topic, [b"old-%d-%d" % (k, j) for j in range(10)])[0] == NONE
        b.process.kill()
        wait_for(
            lambda: b.ident not in _state(cluster, topic)[2],
            timeout=20,
            what="the killed replica to leave the ISR",
        )
        for k in range(5, 10):  # 50..99 on a and c only
            assert _produce(client, topic, [b"old-%d-%d" % (k, j) for j in range(10)])[0] == NONE
        assert Admin(cluster_client=client).delete_records({tp: 80}) == {tp: 80}
    a.process.kill()
    c.process.kill()
    b.start()
    cluster.wait_serving(b)
    wait_for(
        lambda: _state(cluster, topic)[0] == b.ident,
        timeout=30,
        what="the replica without 50..99 elected uncleanly",
    )
    acked = [b"new-%d-%d" % (k, j) for k in range(3) for j in range(10)]
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        for k in range(3):
            assert _produce(client, topic, acked[10 * k : 10 * k + 10]) == (NONE, 50 + 10 * k)
    a.start()
    c.start()
    cluster.wait_serving(a)
    cluster.wait_serving(c)
    wait_for(lambda: len(_state(cluster, topic)[2]) == 3, timeout=30, what="a full ISR again")
    with Admin(cluster.bootstrap) as admin:
        admin.elect_leaders([tp])  # the preferred replica, one that had its own 50..79
    wait_for(lambda: _state(cluster, topic)[0] == a.ident, timeout=20, what="a to lead")
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        assert _read_all(client, topic, 50) == [(50 + i, v) for i, v in enumerate(acked)]
        # The followers' copies agree once they reached the leader's end.
        for m in (b, c):
            wait_for(
                lambda m=m: (
                    member_metric(m, "strom_storage_log_end_offset", topic=topic, partition="0")
                    == 80
                ),
                timeout=20,
                what=f"node {m.ident} at the leader's end",
            )
    for m in (a, b, c):
        assert _records_on_disk(cluster, m.ident, topic, 50) == acked, m.ident
    # The restarted logs' start went down to 50 on disk too: after a crash they still serve
    # the records from 50 (a start of 80 would hide 50..79 again).
    assert [_log_start_on_disk(cluster, m.ident, topic) for m in (a, c)] == [50, 50]


def _flip_byte_in_first_segment(c: LocalCluster, node_id: int, topic: str, at: int) -> Path:
    """Damage partition 0's first segment on a stopped node: XOR one byte at ``at``."""
    seg = sorted((c.root / f"node-{node_id}" / f"{topic}-0").glob("*.log"))[0]
    data = bytearray(seg.read_bytes())
    data[at] ^= 0xFF
    seg.write_bytes(bytes(data))
    return seg


def _restart_with_a_flipped_byte(c: LocalCluster, topic: str) -> tuple[Member, Path]:
    """Stop partition 0's leader cleanly (SIGTERM: no recovery scan at start), flip a byte
    inside its first batch's body and start it again; (that node, the damaged segment)."""
    leader = _member(c, _state(c, topic)[0])
    leader.process.stop()  # type: ignore[union-attr]
    seg = _flip_byte_in_first_segment(c, leader.ident, topic, 300)
    leader.start()
    c.wait_serving(leader)
    return leader, seg


def _damage_lines(m: Member, topic: str) -> list[str]:
    """A node's log lines about damaged data of ``topic`` (other tests' topics share it)."""
    return [
        ln
        for ln in m.log_path.read_text().splitlines()
        if "failed a check, refused" in ln and f"{topic}-0" in ln
    ]


def test_a_leader_whose_stored_data_fails_its_check_hands_leadership_over_and_refetches(
    cluster: LocalCluster, topic: str
) -> None:
    """Found from outside: a byte flipped in the leader's segment while it was stopped
    cleanly (no recovery scan at start) answered every fetch with STORAGE_ERROR, forever:
    consumers read nothing while two good replicas held the records, the leader kept its
    leadership and ISR, and nothing but a log line per fetch showed it. Now the first damaged
    read is counted (strom_storage_corrupt_reads_total) and logged (at most once a minute,
    naming the segment file and offset), the node resigns (AlterPartition with an ISR
    without itself: the controller elects another in-sync replica), truncates at the damage
    as a follower, fetches the records again and rejoins the ISR; consumers read them all."""
    from strom import Consumer

    tp = TopicPartition(topic, 0)
    values = [b"r%d" % i for i in range(40)]
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        assert _produce(client, topic, values) == (NONE, 0)
    damaged, seg = _restart_with_a_flipped_byte(cluster, topic)
    wait_for(lambda: len(_state(cluster, topic)[2]) == 3, timeout=30, what="a full ISR")

    def leads() -> bool:
        if _state(cluster, topic)[0] != damaged.ident:
            with Admin(cluster.bootstrap) as admin:
                admin.elect_leaders([tp])
        return _state(cluster, topic)[0] == damaged.ident

    wait_for(leads, timeout=30, what="the damaged replica to lead again")
    got: list[bytes] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])

        def read_all() -> bool:
            got.extend(r.value for r in consumer.poll(timeout_ms=200))
            return len(got) >= len(values)

        wait_for(read_all, timeout=60, what="every record, from another leader")
    assert got == values
    count = member_metric(damaged, "strom_storage_corrupt_reads_total", topic=topic, partition="0")
    assert count >= 1
    lines = _damage_lines(damaged, topic)
    assert len(lines) == 1 and seg.name in lines[0] and "at offset 0" in lines[0], lines
    # The damaged copy is replaced by the leader's: back in the ISR with the same records.
    wait_for(lambda: len(_state(cluster, topic)[2]) == 3, timeout=30, what="a full ISR again")
    assert _records_on_disk(cluster, damaged.ident, topic, 0) == values


def test_a_damaged_batch_nobody_else_holds_is_raised_to_consumers(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """The only replica's stored data fails its check: it keeps leading (nobody else has
    the records), and the consumer, which used to look the leader up again forever while
    poll() returned nothing (`strom consume` printed nothing and exited 0), raises
    CorruptMessageError from poll() after three such answers in a row from the same leader;
    `strom consume` stops with one line and a non-zero exit (found from outside)."""
    from strom import Consumer
    from strom.errors import CorruptMessageError

    from .test_cluster_cli import strom

    topic = new_topic(cluster, 1, 1)
    tp = TopicPartition(topic, 0)
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        assert _produce(client, topic, [b"r%d" % i for i in range(40)]) == (NONE, 0)
    damaged, seg = _restart_with_a_flipped_byte(cluster, topic)
    wait_for(lambda: _state(cluster, topic)[0] == damaged.ident, timeout=30, what="a leader")
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])

        def raised() -> CorruptMessageError | None:
            try:
                assert consumer.poll(timeout_ms=200) == []
            except CorruptMessageError as exc:
                return exc
            return None

        exc = wait_for(raised, timeout=30, what="poll() to raise")
    assert f"{topic}-0 at offset 0" in str(exc) and "CRC-32C" in str(exc), exc
    count = member_metric(damaged, "strom_storage_corrupt_reads_total", topic=topic, partition="0")
    assert count >= 3
    lines = _damage_lines(damaged, topic)
    assert len(lines) == 1 and seg.name in lines[0] and "at offset 0" in lines[0], lines
    out = strom("consume", topic, "-b", cluster.bootstrap, "--from-beginning", check=False)
    assert out.returncode != 0 and out.stdout == b"", out
    assert len(out.stderr.splitlines()) == 1 and f"{topic}-0 at offset 0".encode() in out.stderr


def test_a_consumer_gets_every_record_before_a_damaged_batch_then_the_error(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """Found from outside: a damaged batch failed the whole read, so with no other in-sync
    replica a consumer starting anywhere before the damage got nothing at all (`strom
    consume --offset 0` printed nothing and exited 1) while the intact records before it sat
    on disk. Now a read serves the good batches before the damaged one, as Kafka's consumer
    returns the records before a corrupt batch and raises only at its offset; the read that
    starts at the damage is refused (and counted) as before."""
    from strom import Consumer
    from strom.errors import CorruptMessageError
    from strom.record.header import read_header

    from .test_cluster_cli import strom

    topic = new_topic(cluster, 1, 1)
    tp = TopicPartition(topic, 0)
    values = [b"r%d" % i for i in range(60)]
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        for base in (0, 20, 40):  # three batches: the third is damaged
            assert _produce(client, topic, values[base : base + 20]) == (NONE, base)
    leader = _member(cluster, _state(cluster, topic)[0])
    leader.process.stop()  # type: ignore[union-attr]  # cleanly: no recovery scan at start
    seg = sorted((cluster.root / f"node-{leader.ident}" / f"{topic}-0").glob("*.log"))[0]
    data = seg.read_bytes()
    pos = read_header(data, 0).size
    pos += read_header(data, pos).size
    third = read_header(data, pos)
    assert third.base_offset == 40
    _flip_byte_in_first_segment(cluster, leader.ident, topic, pos + third.size // 2)
    leader.start()
    cluster.wait_serving(leader)
    wait_for(lambda: _state(cluster, topic)[0] == leader.ident, timeout=30, what="a leader")

    got: list[bytes] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])

        def raised() -> CorruptMessageError | None:
            try:
                got.extend(r.value for r in consumer.poll(timeout_ms=200))
            except CorruptMessageError as exc:
                return exc
            return None

        exc = wait_for(raised, timeout=30, what="poll() to raise")
    assert got == values[:40]
    assert f"{topic}-0 at offset 40" in str(exc), exc
    assert member_metric(leader, "strom_storage_corrupt_reads_total", topic=topic, partition="0")
    out = strom(
        "consume", topic, "-b", cluster.bootstrap, "--partition", "0", "--offset", "30", check=False
    )
    assert out.returncode != 0 and out.stdout.splitlines() == values[30:40], out
    assert f"{topic}-0 at offset 40".encode() in out.stderr
