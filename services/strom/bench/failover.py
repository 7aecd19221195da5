"""``strom bench failover``: time from SIGKILL of a partition leader to the first successful
acks=all produce on its successor (issue: replication), over several trials.

Each trial runs against a local cluster of real processes (3 storage nodes, 2 controllers,
default settings): kill the leader of a replication-factor-3 partition
(min.insync.replicas=2), then send one small acks=all batch in a tight loop — metadata
refreshed on every failure — until one is acknowledged. The killed node is restarted and the
next trial waits for the full ISR first.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from strom.api import common_pb2, storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
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


def summary(times: list[float]) -> str:
    s = sorted(times)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]
    return (
        f"failover over {len(s)} trials: median {statistics.median(s):.3f} s, "
        f"p90 {p90:.3f} s, min {s[0]:.3f} s, max {s[-1]:.3f} s"
    )
