"""Fixtures shared by every test directory: real local clusters and topics on them.

Starting a cluster (etcd, a controller, storage nodes, a group coordinator, each a process)
costs seconds on 2 cores, so modules whose tests leave the cluster as they found it share
two session-scoped clusters instead of starting their own:

* ``one_node_cluster``: etcd, 1 controller, 1 storage node, 1 group coordinator (defaults);
* ``three_node_cluster``: etcd, 1 controller, 3 storage nodes, 1 group coordinator with
  fast group timing (heartbeat 200 ms, session timeout 1.5 s) and 2 ``__consumer_offsets``
  shards.

A test may stop or kill a member of a shared cluster only if it starts it again (the
fixtures check after each test that every member is alive and restart the ones that are not,
so one test's failure does not cascade). Tests that leave a cluster broken, or need other
settings, start their own with ``make_cluster``. Topic names are unique per test through the
``new_topic`` factory, so tests sharing a cluster never see each other's data.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from strom.api import storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import PORTS_ENV, wait_for
from strom.errors import InvalidReplicationFactorError, StromError


def worker_ports(worker: str, count: int) -> str | None:
    """The slice of the ports local clusters draw from (``STROM_DEV_PORTS``) for parallel
    test worker ``worker`` (pytest-xdist: gw0, gw1, ...) of ``count``; None outside xdist.
    Two workers starting clusters at the same moment could both find one port free and race
    to bind it (found in CI: a node's "Address already in use")."""
    if not worker.startswith("gw") or count < 2:
        return None
    low, high = 20000, 32000
    span = (high - low) // count
    start = low + int(worker[2:]) * span
    return f"{start}-{start + span - 1}"


_ports = worker_ports(
    os.environ.get("PYTEST_XDIST_WORKER", ""),
    int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1),
)
if _ports is not None and PORTS_ENV not in os.environ:
    os.environ[PORTS_ENV] = _ports  # inherited by the processes the tests start

#: Coordinator settings of the shared three-node cluster: groups rebalance and expire fast.
FAST_GROUPS = [
    "--group-heartbeat-interval-ms",
    "200",
    "--group-session-timeout-ms",
    "1500",
    "--offsets-partitions",
    "2",
]


def start_cluster(root: Path, **kwargs: Any) -> LocalCluster:
    """A started :class:`LocalCluster` under ``root``; killed again when start-up fails."""
    cluster = LocalCluster(root, **kwargs)
    try:
        cluster.start()
    except BaseException:
        cluster.kill()
        raise
    return cluster


def heal(cluster: LocalCluster) -> None:
    """Restart every member a test left dead and wait until the cluster is whole again.

    Whole means every live node registered too, even when nothing died: a node a test paused
    (SIGSTOP) and resumed is alive but may have lost its registration meanwhile, and the next
    test's replication-factor-3 topic would find two live nodes (one metadata call, ~2 ms)."""
    dead = [m for m in cluster.members if not m.alive()]
    for member in dead:
        member.start()
    for member in dead:
        cluster.wait_serving(member)
    cluster.wait_cluster_ready()
    if dead and cluster.coordinators:
        cluster.wait_coordinators_ready()


@pytest.fixture(scope="session")
def one_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd, 1 controller, 1 storage node, 1 group coordinator, shared by the session."""
    cluster = start_cluster(tmp_path_factory.mktemp("shared-1") / "c", nodes=1, controllers=1)
    try:
        yield cluster
    finally:
        cluster.kill()


@pytest.fixture(scope="session")
def three_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd, 1 controller, 3 storage nodes, 1 coordinator (FAST_GROUPS), shared."""
    cluster = start_cluster(
        tmp_path_factory.mktemp("shared-3") / "c",
        nodes=3,
        controllers=1,
        coordinators=1,
        coordinator_args=FAST_GROUPS,
    )
    try:
        yield cluster
    finally:
        cluster.kill()


SHARED_CLUSTERS = ("one_node_cluster", "three_node_cluster")


@pytest.fixture(autouse=True)
def _heal_shared_clusters(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used a shared cluster (the session's, or a module's own listed in
    the module's ``HEALED_CLUSTERS``), restart what it left dead."""
    yield
    for name in (*SHARED_CLUSTERS, *getattr(request.module, "HEALED_CLUSTERS", ())):
        if name in request.fixturenames:
            heal(request.getfixturevalue(name))


def module_cluster(**kwargs: Any) -> Any:
    """A module-scoped cluster fixture (LocalCluster's arguments) for a module whose tests
    need settings no session cluster has: ``cluster = module_cluster(nodes=3, ...)``. Name it
    in the module's ``HEALED_CLUSTERS`` so that members a test left dead are restarted."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
        cluster = start_cluster(tmp_path_factory.mktemp("module") / "c", **kwargs)
        try:
            yield cluster
        finally:
            cluster.kill()

    return fixture


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """A test's own cluster(s): ``make_cluster(nodes=3, ...)`` (LocalCluster's arguments),
    started now and killed after the test."""
    started: list[LocalCluster] = []
    counter = itertools.count()

    def make(**kwargs: Any) -> LocalCluster:
        cluster = start_cluster(tmp_path / f"cluster-{next(counter)}", **kwargs)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.kill()


TopicFactory = Callable[..., str]


@contextmanager
def paused(member: Any) -> Iterator[None]:
    """``member``'s process hung (SIGSTOP) for the block's time, then resumed (SIGCONT), as a
    hung host or a long GC pause looks from outside."""
    assert member.process is not None
    member.process.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        member.process.signal(signal.SIGCONT)


def coordinator_shards_settled(cluster: LocalCluster, *key_types: int, shards: int = 2) -> bool:
    """Every one of the ``shards`` shards of each kind (``storage_pb2.COORDINATOR_TYPE_*``)
    owned, and the owners exactly the live coordinators: none is handed over while a test
    runs (a hand-over is a takeover of its own). For clusters whose coordinators are as many
    as the shards of each kind, so each owns one."""
    live = {m.address for m in cluster.coordinators if m.alive()}
    with ClusterClient(cluster.bootstrap) as client:
        for key_type in key_types:
            owners = list(client.coordinator_shards(key_type).values())
            if len(owners) != shards or set(owners) != live:
                return False
    return True


def coordinator_owning(
    cluster: LocalCluster, key: str, key_type: int, settled: tuple[int, ...] = ()
) -> Any:
    """The coordinator member owning ``key`` (a group or transactional id of ``key_type``),
    once the shards of ``key_type`` and of the kinds in ``settled`` are settled."""
    cluster.wait_coordinators_ready()
    kinds = tuple(dict.fromkeys((key_type, *settled)))
    wait_for(
        lambda: coordinator_shards_settled(cluster, *kinds),
        timeout=60,
        what="coordinator shards settled",
    )
    addr = coordinator_of(cluster, key, key_type)
    return next(m for m in cluster.coordinators if m.address == addr)


def coordinator_of(cluster: LocalCluster, key: str, key_type: int) -> str:
    """The address of the coordinator owning ``key`` now (FindCoordinator)."""
    with ClusterClient(cluster.bootstrap) as client:
        return client.find_coordinator(key, key_type)


def member_metric(member: Any, name: str, **labels: str) -> float:
    """One sample of a cluster member's /metrics (a counter by its exposed ``_total`` name);
    0 when it has none yet."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{member.metrics_port}/metrics", timeout=5)
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "")
    found = re.search(r"^" + pattern + r" (\S+)$", text.read().decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def errors_since(member: Any, size: int) -> list[str]:
    """Lines of the member's (JSON) log after byte ``size`` that are errors or tracebacks."""
    with open(member.log_path, "rb") as f:
        f.seek(size)
        lines = f.read().decode(errors="replace").splitlines()
    return [x for x in lines if '"level": "error"' in x.lower() or "Traceback" in x]


def until_settled(read: Callable[[], Any], what: str) -> None:
    """Wait until ``read()`` stays unchanged for a second (a stream blocked on flow control)."""
    last = [read(), time.monotonic()]

    def settled() -> bool:
        now = read()
        if now != last[0]:
            last[:] = [now, time.monotonic()]
        return time.monotonic() - last[1] >= 1.0

    wait_for(settled, timeout=60, what=what)


def create_topic(
    cluster: LocalCluster,
    name: str,
    partitions: int = 1,
    replication_factor: int = 1,
    config: dict[str, str] | None = None,
) -> str:
    """Create ``name`` on ``cluster`` and wait until every partition's leader serves it.

    A leader named in the metadata may not have opened its replica yet (it answers
    REPLICA_NOT_AVAILABLE until its reconcile has: CI saw a test's first produce refused so),
    so the wait ends only when each leader answers a ListOffsets for its partitions."""
    with Admin(cluster.bootstrap) as admin:
        refused: list[StromError] = []

        def created() -> bool:
            try:
                admin.create_topic(
                    name,
                    partitions=partitions,
                    replication_factor=replication_factor,
                    config=config,
                )
            except InvalidReplicationFactorError as exc:
                # (refused, nothing created: a node a test paused and resumed re-registers
                # after losing its lease, which CI saw between the heal and this call)
                if replication_factor > len(cluster.nodes):
                    refused.append(exc)
                return replication_factor > len(cluster.nodes)
            except StromError as exc:  # any other refusal is the caller's, at once
                refused.append(exc)
            return True

        wait_for(created, timeout=30, what=f"{name} created with all its replicas' nodes live")
        if refused:
            raise refused[0]
    with ClusterClient(cluster.bootstrap, retry_s=10) as client:
        wait_for(
            lambda: _leaders_serve(client, name, partitions),
            # (60 s: a node a test paused and resumed may lose its registration just after
            # the heal saw it, and the topic's leader waits for it to register again; under
            # two test workers that took longer than 20 s once in CI.)
            timeout=60,
            what=f"leaders of {name} serving it",
        )
    return name


def _leaders_serve(client: ClusterClient, topic: str, partitions: int) -> bool:
    """Whether the leader of each of ``topic``'s partitions (by the client's fresh metadata)
    answers a ListOffsets for it without an error; raises naming what is not so yet (the
    wait's timeout message then says which node answered what, not only that it waited)."""
    parts = client.topic_metadata(topic).partitions
    if len(parts) != partitions or any(p.leader < 0 for p in parts):
        raise AssertionError(
            f"metadata of {topic}: "
            + ", ".join(f"{p.partition} leader {p.leader} isr {list(p.isr)}" for p in parts)
        )
    by_leader: dict[str, list[int]] = {}
    for p in range(partitions):
        by_leader.setdefault(client.leader_of(topic, p), []).append(p)
    for address, indexes in by_leader.items():
        req = storage_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                storage_pb2.ListOffsetsTopic(
                    topic=topic,
                    partitions=[
                        # (current_leader_epoch -1: not checked. Its default, 0, is refused
                        # FENCED_LEADER_EPOCH once the leadership moved after the creation,
                        # as when a node a test paused re-registers: CI waited 60 s on it.)
                        storage_pb2.ListOffsetsPartition(
                            partition=i, timestamp=-2, current_leader_epoch=-1
                        )
                        for i in indexes
                    ],
                )
            ],
        )
        try:
            resp = client.storage(address).ListOffsets(req, timeout=5)
        except grpc.RpcError as exc:
            raise AssertionError(f"ListOffsets at {address}: {exc.code().name}") from None
        refused = [
            f"{topic}-{pr.partition}: {pr.error_code} {pr.error_message}"
            for t in resp.topics
            for pr in t.partitions
            if pr.error_code != 0
        ]
        if refused:
            raise AssertionError(f"ListOffsets at {address}: {'; '.join(refused)}")
    return True


@pytest.fixture
def new_topic(request: pytest.FixtureRequest) -> TopicFactory:
    """``new_topic(cluster, partitions=1, replication_factor=1, config=None, name=None)``: create a
    topic whose partitions all have leaders and return its name (unique unless given)."""
    stem = request.node.name.split("[")[0].removeprefix("test_").replace("_", "-")[:40]

    def make(
        cluster: LocalCluster,
        partitions: int = 1,
        replication_factor: int = 1,
        config: dict[str, str] | None = None,
        name: str | None = None,
    ) -> str:
        return create_topic(
            cluster,
            name or f"{stem}-{uuid.uuid4().hex[:8]}",
            partitions,
            replication_factor,
            config,
        )

    return make
