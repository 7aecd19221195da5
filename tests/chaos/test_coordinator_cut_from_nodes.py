"""A group coordinator cut from every storage node while it still reaches etcd and its clients
(real etcd, controller, storage node and coordinator processes; the cut is the chaos proxy's
``stall`` between the coordinator and each node, both ways).

Found from outside: with two coordinators, the cut one kept its shards for the whole cut
(it reloaded them again and again), FindCoordinator kept naming it, every commit of its
groups failed with COORDINATOR_LOAD_IN_PROGRESS ("still loading"), and the healthy
coordinator never took them. Now (``strom.coordinator.shard_ownership``) a shard unserved for
``RELEASE_AFTER_S`` because the nodes do not answer is released when another coordinator
runs, and its clients are told COORDINATOR_NOT_AVAILABLE naming the cause meanwhile; alone,
a coordinator keeps its shard (with that error); and when the nodes answer no coordinator,
a released shard comes back to its releaser and rests there instead of going round.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from strom import Admin, Consumer, OffsetAndMetadata, TopicPartition
from strom.api import coordinator_pb2, coordinator_pb2_grpc
from strom.api import metadata_pb2 as md
from strom.client.cluster import ClusterClient
from strom.coordinator.offsets_log import shard_for_group
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode as E
from strom.errors import InvalidReplicationFactorError, StromError
from strom.metadata import MetadataStore
from tests.chaos.cluster import CLUSTER, ChaosCluster, Proc

pytestmark = pytest.mark.integration

TOPIC = "cut-orders"
TP = TopicPartition(TOPIC, 0)
#: Offsets shards: one per coordinator, so each owns one.
SHARDS = 2
#: From the cut to a commit answered by the other coordinator: the append in flight gives
#: up after 10 s, the reload's first attempt after 10 s more, the release follows at once
#: and the other coordinator takes the free shard within FREE_GRACE_S (5 s) and loads it;
#: the rest is slack for a loaded machine. Before: never, for as long as the cut lasted.
MOVE_BOUND_S = 60.0


@pytest.fixture
def make_chaos(tmp_path: Path) -> Iterator[Callable[..., ChaosCluster]]:
    made: list[ChaosCluster] = []

    def make(coordinators: int, shards: int = SHARDS) -> ChaosCluster:
        c = ChaosCluster(
            tmp_path / "c",
            nodes=3,
            controllers=1,
            coordinators=coordinators,
            etcd_members=1,
            coordinator_args=[
                "--offsets-partitions",
                str(shards),
                "--transaction-state-partitions",
                "1",
            ],
        )
        made.append(c)
        c.start()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.kill_all()


def _owners(store: MetadataStore, shards: int) -> dict[int, md.CoordinatorShardOwner]:
    """The loaded shards' owners in etcd (a published epoch: the owner serves it)."""
    out = {}
    for s in range(shards):
        v = store.get(store.keys.coordinator(s), md.CoordinatorShardOwner)
        if v is not None and v.value.epoch >= 0:
            out[s] = v.value
    return out


def _proc_of(cluster: ChaosCluster, owner: md.CoordinatorShardOwner) -> Proc:
    """The coordinator process an owner record names (it advertises its proxy port)."""
    return next(p for p in cluster.coordinators if p.proxy_port == owner.port)


def _cut_from_nodes(cluster: ChaosCluster, *names: str) -> None:
    """Stall everything between the named processes and every storage node, both ways."""
    rules = []
    for name in names:
        rules.append({"kind": "stall", "from": [name], "to": ["node-*"]})
        rules.append({"kind": "stall", "from": ["node-*"], "to": [name]})
    cluster.proxy.command(cmd="rules", rules=rules)  # type: ignore[union-attr]


def _group_on(shard: int, prefix: str) -> str:
    return next(
        g for g in (f"{prefix}-{i}" for i in range(1000)) if shard_for_group(g, SHARDS) == shard
    )


def _ready(cluster: ChaosCluster, shards: int = SHARDS) -> MetadataStore:
    """Wait until every offsets shard is loaded by a coordinator, and the test topic exists."""
    store = MetadataStore(cluster.etcd_endpoints, CLUSTER)
    wait_for(
        lambda: len(_owners(store, shards)) == shards,
        timeout=90,
        what="every offsets shard loaded",
    )
    with Admin(cluster.bootstrap) as admin:

        def created() -> bool:
            try:
                admin.create_topic(TOPIC, partitions=1, replication_factor=3)
            except InvalidReplicationFactorError:
                return False  # a node's registration is not in the controller's view yet
            return True

        wait_for(created, timeout=60, what=f"{TOPIC} created on all three nodes")
    return store


def _raw_commit(
    address: str, group: str, offset: int
) -> coordinator_pb2.OffsetCommitResponse | None:
    """One OffsetCommit straight to ``address`` (no client retries): its answer, or None when
    the call itself failed (its deadline: the append in flight waits for the nodes)."""
    req = coordinator_pb2.OffsetCommitRequest(group_id=group, member_epoch=-1)
    req.topics.add(topic=TOPIC).partitions.add(partition=0, committed_offset=offset)
    with grpc.insecure_channel(address) as channel:
        try:
            return coordinator_pb2_grpc.CoordinatorServiceStub(channel).OffsetCommit(
                req, timeout=30
            )
        except grpc.RpcError:
            return None


def _unreachable_answer(address: str, group: str) -> Callable[[], str | None]:
    """A wait_for condition: the coordinator answers COORDINATOR_NOT_AVAILABLE naming the
    unreachable storage nodes (its message), else None. LOAD_IN_PROGRESS is what the old
    code answered for the whole cut."""

    def check() -> str | None:
        resp = _raw_commit(address, group, 5)
        if resp is None or resp.error_code != E.COORDINATOR_NOT_AVAILABLE:
            return None
        return resp.error_message

    return check


def test_the_shards_of_a_coordinator_cut_from_the_nodes_move_to_the_other_one(
    make_chaos: Callable[..., ChaosCluster],
) -> None:
    cluster = make_chaos(coordinators=2)
    store = _ready(cluster)
    owners = _owners(store, SHARDS)
    cut = _proc_of(cluster, owners[0])
    other = next(p for p in cluster.coordinators if p is not cut)
    group = _group_on(0, "g-cut")
    consumer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign([TP])
        consumer.commit({TP: OffsetAndMetadata(1)}, timeout_ms=60_000)
        _cut_from_nodes(cluster, cut.name)
        at = time.monotonic()
        errors: list[str] = []

        def committed() -> bool:
            try:
                consumer.commit({TP: OffsetAndMetadata(2)}, timeout_ms=15_000)
            except StromError as exc:
                errors.append(f"{time.monotonic() - at:.0f}s {type(exc).__name__}: {exc}")
                return False
            return True

        wait_for(committed, timeout=MOVE_BOUND_S + 30, what="a commit answered after the cut")
        took = time.monotonic() - at
        print(f"commit answered {took:.1f} s after the cut; failures meanwhile: {errors}")
        assert took < MOVE_BOUND_S, (took, errors)
        with ClusterClient(cluster.bootstrap) as client:
            assert client.find_coordinator(group, timeout_s=10) == other.address
        assert consumer.committed([TP], timeout_ms=30_000)[TP].offset == 2
        assert _proc_of(cluster, _owners(store, SHARDS)[0]) is other
        log = cut.log_path.read_text(errors="replace")
        assert "released it for another coordinator to take" in log, log[-3000:]
    finally:
        consumer.close()
        store.close()


def test_a_lone_coordinator_cut_from_the_nodes_keeps_its_shard_and_says_why(
    make_chaos: Callable[..., ChaosCluster],
) -> None:
    cluster = make_chaos(coordinators=1, shards=1)
    store = _ready(cluster, shards=1)
    (coordinator,) = cluster.coordinators
    before = _owners(store, 1)[0]
    group = "g-alone"
    try:
        assert _raw_commit(coordinator.address, group, 1).error_code == E.NONE  # type: ignore[union-attr]
        _cut_from_nodes(cluster, coordinator.name)
        message = wait_for(
            _unreachable_answer(coordinator.address, group),
            timeout=90,
            what="COORDINATOR_NOT_AVAILABLE naming the unreachable storage nodes",
        )
        print(message)
        assert "cannot reach the storage nodes" in message, message
        assert "no other coordinator" in message, message
        # Kept: nobody else could serve it (its key is still this process's).
        key = store.get(store.keys.coordinator(0), md.CoordinatorShardOwner)
        assert key is not None and key.value.incarnation_id == before.incarnation_id
        cluster.proxy.command(cmd="rules", rules=[])  # type: ignore[union-attr]
        with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as consumer:
            consumer.assign([TP])
            consumer.commit({TP: OffsetAndMetadata(3)}, timeout_ms=90_000)
            assert consumer.committed([TP], timeout_ms=30_000)[TP].offset == 3
        assert "released it" not in coordinator.log_path.read_text(errors="replace")
    finally:
        store.close()


def test_shards_nobody_can_load_come_to_rest_with_their_owners(
    make_chaos: Callable[..., ChaosCluster],
) -> None:
    """Every coordinator cut from every node: a released shard is taken by no one (each
    is in storage trouble), comes back to its releaser, and releases pause; the owners end
    as they began, each shard released once, and everything serves once the cut heals."""
    cluster = make_chaos(coordinators=2)
    store = _ready(cluster)
    before = {s: o.incarnation_id for s, o in _owners(store, SHARDS).items()}
    groups = {s: _group_on(s, "g-all") for s in range(SHARDS)}
    procs = {s: _proc_of(cluster, o) for s, o in _owners(store, SHARDS).items()}
    try:
        for s, g in groups.items():
            assert _raw_commit(procs[s].address, g, 1).error_code == E.NONE  # type: ignore[union-attr]
        sizes = {p.name: p.log_path.stat().st_size for p in cluster.coordinators}
        _cut_from_nodes(cluster, *(p.name for p in cluster.coordinators))
        for s, g in groups.items():
            message = wait_for(
                _unreachable_answer(procs[s].address, g),
                timeout=90,
                what=f"COORDINATOR_NOT_AVAILABLE from {procs[s].name}",
            )
            assert "cannot reach the storage nodes" in message, message

        def all_came_back() -> bool:
            return all(
                "released was taken by nobody" in p.log_path.read_text(errors="replace")
                for p in cluster.coordinators
            )

        wait_for(all_came_back, timeout=90, what="each released shard back with its releaser")
        for s, p in procs.items():
            log = p.log_path.read_text(errors="replace")[sizes[p.name] :]
            assert log.count("released it for another coordinator") == 1, log[-3000:]
            assert not re.search(rf"took group shard {1 - s}\b", log), log[-3000:]  # (not its)
        cluster.proxy.command(cmd="rules", rules=[])  # type: ignore[union-attr]
        wait_for(
            lambda: {s: o.incarnation_id for s, o in _owners(store, SHARDS).items()} == before,
            timeout=90,
            what="each shard loaded by the coordinator that owned it before the cut",
        )
        for s, g in groups.items():
            resp = wait_for(
                lambda s=s, g=g: (
                    (r := _raw_commit(procs[s].address, g, 7)) is not None
                    and r.error_code == E.NONE
                    and r
                ),
                timeout=60,
                what=f"a commit of {g} after the cut healed",
            )
            assert resp
    finally:
        store.close()
