"""``strom bench failover``: how long SIGKILLs take to heal, over several trials, each
against a local cluster of real processes (default settings).

- ``--target leader`` (default): SIGKILL the leader of a replication-factor-3 partition
  (min.insync.replicas=2) on 3 nodes, then send one small acks=all batch in a tight loop —
  metadata refreshed on every failure — until one is acknowledged.
- ``--target controller``: 2 controllers; SIGKILL the active one (once the standby follows it,
  as in steady state), then create a topic through the admin client (which finds the
  controller as a user's does) until that succeeds: admin requests served again.
- ``--target node``: 3 nodes, a topic of ``--partitions`` partitions (replication factor 2)
  all led by node 1; SIGKILL node 1 and poll Metadata on node 2 until every partition has a
  new leader.

The killed process is restarted and the next trial waits for the state it started from.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.errors import StromError
from strom.record import encode_batch

TOPIC = "failover-bench"


def _state(client: ClusterClient) -> tuple[int, list[int]]:
    p = client.metadata([TOPIC]).topics[0].partitions[0]
    return p.leader, sorted(p.isr)


def _try_produce(client: ClusterClient) -> bool:
    try:
        addr = client.leader_of(TOPIC, 0, refresh=True)
        req = storage_pb2.ProduceRequest(
            acks=-1,
            timeout_ms=2000,
            topics=[
                storage_pb2.ProduceTopicData(
                    topic=TOPIC,
                    partitions=[
                        storage_pb2.ProducePartitionData(
                            partition=0, records=encode_batch([b"x"]), current_leader_epoch=-1
                        )
                    ],
                )
            ],
        )
        r = client.storage(addr).Produce(req, timeout=3).topics[0].partitions[0]
    except (grpc.RpcError, StromError):  # leader unknown or unreachable: not failed over yet
        return False
    return r.error_code == common_pb2.ErrorCode.NONE


def bench_failover(trials: int = 10, directory: str | None = None) -> list[float]:
    root = Path(tempfile.mkdtemp(prefix="strom-failover-", dir=directory))
    cluster = LocalCluster(root / "c", nodes=3, controllers=2)
    times: list[float] = []
    try:
        cluster.start()
        with ClusterClient(cluster.bootstrap, retry_s=30) as client:
            Admin(cluster_client=client).create_topic(
                TOPIC, partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
            )
            for trial in range(trials):
                wait_for(
                    lambda: len(_state(client)[1]) == 3 and _try_produce(client),
                    timeout=60,
                    what="a full ISR before the trial",
                )
                leader, _ = _state(client)
                node = cluster.node(leader)
                assert node.process is not None
                t0 = time.monotonic()
                node.process.kill()
                while not _try_produce(client):
                    if time.monotonic() - t0 > 60:
                        raise RuntimeError("no successful acks=all produce within 60 s")
                    time.sleep(0.01)
                took = time.monotonic() - t0
                times.append(took)
                print(
                    f"trial {trial + 1}: killed leader {leader}, acks=all produce succeeded "
                    f"after {took:.3f} s",
                    flush=True,
                )
                cluster.restart(node)
        return times
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)


def _following(m: Member) -> bool:
    """The standby ``m`` holds its health stream to the active controller."""
    url = f"http://127.0.0.1:{m.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as resp:
        return b"strom_controller_following_active 1.0" in resp.read()


def bench_controller_failover(trials: int = 10, directory: str | None = None) -> list[float]:
    """SIGKILL of the active controller → first admin request (CreateTopics) served."""
    root = Path(tempfile.mkdtemp(prefix="strom-failover-", dir=directory))
    cluster = LocalCluster(root / "c", nodes=1, controllers=2, coordinators=0)
    times: list[float] = []
    try:
        cluster.start()
        with ClusterClient(cluster.bootstrap, retry_s=60) as client:
            admin = Admin(cluster_client=client)
            for trial in range(trials):
                active = wait_for(cluster.active_controller, timeout=60, what="an active")
                standby = next(m for m in cluster.controllers if m is not active)
                wait_for(lambda s=standby: _following(s), timeout=60, what="a following standby")
                admin.list_topics()  # the client knows the active controller, as in use
                assert active.process is not None
                t0 = time.monotonic()
                active.process.kill()
                admin.create_topic(f"after-kill-{trial}", partitions=1, replication_factor=1)
                took = time.monotonic() - t0
                times.append(took)
                print(
                    f"trial {trial + 1}: killed controller {active.ident}, admin request "
                    f"served after {took:.3f} s",
                    flush=True,
                )
                cluster.restart(active)
        return times
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)


def _moved(client: ClusterClient, topic: str, dead: int) -> int:
    """Partitions of ``topic`` whose leader is neither ``dead`` nor unknown."""
    parts = client.metadata([topic]).topics[0].partitions
    return sum(1 for p in parts if p.leader not in (dead, -1))


def bench_node_failover(
    trials: int = 3, partitions: int = 1000, directory: str | None = None
) -> list[float]:
    """SIGKILL of a node leading ``partitions`` partitions → all have new leaders."""
    root = Path(tempfile.mkdtemp(prefix="strom-failover-", dir=directory))
    cluster = LocalCluster(root / "c", nodes=3, controllers=1, coordinators=0)
    topic = "failover-leaders"
    times: list[float] = []
    try:
        cluster.start(timeout=120)
        survivor = cluster.node(2).address
        with ClusterClient(survivor, retry_s=60) as client:
            Admin(cluster_client=client).create_topic(
                topic, replica_assignment=[[1, 2 + i % 2] for i in range(partitions)]
            )
            for trial in range(trials):
                wait_for(
                    lambda: all(
                        p.leader == 1 and len(p.isr) == 2
                        for p in client.metadata([topic]).topics[0].partitions
                    ),
                    timeout=300,
                    what=f"node 1 leading all {partitions} partitions with full ISRs",
                )
                node = cluster.node(1)
                assert node.process is not None
                t0 = time.monotonic()
                node.process.kill()
                while _moved(client, topic, 1) < partitions:
                    if time.monotonic() - t0 > 120:
                        raise RuntimeError("partitions still without a new leader after 120 s")
                    time.sleep(0.01)
                took = time.monotonic() - t0
                times.append(took)
                print(
                    f"trial {trial + 1}: killed node 1 leading {partitions} partitions, all "
                    f"had new leaders after {took:.3f} s",
                    flush=True,
                )
                cluster.restart(node, timeout=120)  # the preferred leader takes over again
        return times
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)


def summary(times: list[float], what: str = "failover") -> str:
    s = sorted(times)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]
    return (
        f"{what} over {len(s)} trials: median {statistics.median(s):.3f} s, "
        f"p90 {p90:.3f} s, min {s[0]:.3f} s, max {s[-1]:.3f} s"
    )
