"""A partition leader cut off from etcd and the controllers, but not from its clients and
followers (found from outside with nft rules; here the chaos proxy stalls those pairs).

The controller elects another leader about two seconds after the node's lease expires, and
producers move there at once (their sends are refused by, or time out at, the old leader
within the same time). The cut node keeps its last cluster view: it went on answering every
Fetch at once, empty, and its own Metadata named itself leader at the old epoch, so a consumer
fetched nothing until the heal (28.5 s of a 30 s cut). Now a consumer whose fetches come
back empty for ``QUIET_RECHECK_S`` asks another node who leads, and follows the newer leader
epoch there, while the cut lasts; so does a Spark read task waiting on that leader for the
rest of its range. (The cut node still answers ``strom.ready`` SERVING: it cannot tell its cut
from etcd being down for every node, when every node must stay ready; design.md §Failures.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.api import storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom_spark.fetch import RangeReader, RangeTask
from strom_spark.options import parse_read_options
from tests.chaos.cluster import ChaosCluster, Proc
from tests.conftest import create_topic

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
TOPIC = "cut-leader"
#: How long the cut may last at most: on the old code the consumer got nothing for all of it.
CUT_S = 40.0
#: strom.client.fetch_overdue.QUIET_RECHECK_S (not imported: this test runs against the old
#: code too, to show that it fails there).
QUIET_RECHECK_S = 5.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    c = ChaosCluster(tmp_path / "c", nodes=3, controllers=1, coordinators=0)
    try:
        c.start()
        yield c
    finally:
        c.kill_all()


def _ready(node: Proc) -> int | None:
    """The node's ``strom.ready`` status, asked directly (not through the proxy)."""
    with grpc.insecure_channel(node.direct) as channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service="strom.ready"), timeout=2)
                .status
            )
        except grpc.RpcError:
            return None


def _leader(cluster: ChaosCluster, asked: Proc) -> tuple[int, int]:
    """The partition's leader and epoch, as the node ``asked`` sees them."""
    with ClusterClient(asked.address, retry_s=10) as client:
        answer = client.storage(asked.address).Metadata(
            storage_pb2.MetadataRequest(topics=[TOPIC]), timeout=10
        )
    p = answer.topics[0].partitions[0]
    return p.leader, p.leader_epoch


def test_a_consumer_and_a_read_task_leave_a_leader_cut_from_etcd(
    cluster: ChaosCluster,
) -> None:
    create_topic(cluster, TOPIC, partitions=1, replication_factor=3)  # type: ignore[arg-type]
    tp = TopicPartition(TOPIC, 0)
    leader_id, epoch = _leader(cluster, cluster.nodes[0])
    old = cluster.by_name(f"node-{leader_id}")
    other = next(n for n in cluster.nodes if n is not old)
    cluster.until(lambda: _ready(old) == SERVING, timeout=60, what="the leader to be ready")

    got: list[tuple[float, bytes]] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def consume() -> None:
        try:
            with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
                consumer.assign([tp])
                while not stop.is_set():
                    for r in consumer.poll(200):
                        got.append((time.monotonic(), r.value))
        except BaseException as exc:  # surfaced by the test's own thread
            failures.append(exc)

    # A Spark read task whose range ends past what is written waits on the leader too.
    task_values: list[bytes] = []
    task_done = threading.Event()

    def read_range() -> None:
        try:
            opts = parse_read_options(
                {"bootstrap": cluster.bootstrap, "subscribe": TOPIC}, streaming=False
            )
            for rb in RangeReader(opts).read(RangeTask(TOPIC, 0, 0, 2)):
                task_values.extend(rb.column("value").to_pylist())
        except BaseException as exc:  # surfaced by the test's own thread
            failures.append(exc)
        finally:
            task_done.set()

    reader = threading.Thread(target=consume, daemon=True)
    task = threading.Thread(target=read_range, daemon=True)
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(TOPIC, b"before", partition=0).get(30)
        reader.start()
        task.start()
        try:
            cluster.until(lambda: any(v == b"before" for _, v in got), timeout=30, what="before")
            cluster.until(lambda: task_values, timeout=30, what="the read task's first record")
            cut = [
                {"kind": "stall", "from": [old.name], "to": ["etcd-*", "controller-*"]},
                {"kind": "stall", "from": ["etcd-*", "controller-*"], "to": [old.name]},
            ]
            cluster.proxy.command(cmd="rules", rules=cut)  # type: ignore[union-attr]
            cut_at = time.monotonic()
            try:
                # Another leader elected (as the other nodes see it); the producer moves
                # there, and its next record is acknowledged by that leader.
                cluster.until(
                    lambda: _leader(cluster, other)[0] not in (leader_id, -1),
                    timeout=30,
                    what="another leader elected",
                )
                elected_after = time.monotonic() - cut_at
                producer.send(TOPIC, b"after", partition=0).get(30)
                acked_at = time.monotonic()
                new_leader, new_epoch = _leader(cluster, other)
                assert new_leader != leader_id and new_epoch > epoch
                # The consumer follows within the recheck bound, while the cut lasts.
                cluster.until(
                    lambda: failures or any(v == b"after" for _, v in got),
                    timeout=max(CUT_S - (time.monotonic() - cut_at), 1.0),
                    what="the consumer to read the record acknowledged by the new leader",
                )
                assert not failures, failures
                read_at = next(t for t, v in got if v == b"after")
                # The read task too (strom_spark.fetch.RangeReader._check_leader).
                cluster.until(
                    lambda: task_done.is_set(),
                    timeout=max(CUT_S - (time.monotonic() - cut_at), 1.0),
                    what="the read task to finish its range",
                )
                task_at = time.monotonic()
                assert not failures, failures
                assert task_values == [b"before", b"after"]
                # QUIET_RECHECK_S from its last non-empty answer (before the cut), plus a
                # loaded machine's slack; the old code waited for the heal.
                assert read_at - cut_at < QUIET_RECHECK_S + 10.0, read_at - cut_at
                print(
                    f"another leader {elected_after:.1f} s after the cut; 'after' "
                    f"acknowledged {acked_at - cut_at:.1f} s "
                    f"and read {read_at - cut_at:.1f} s after it; the read task done "
                    f"{task_at - cut_at:.1f} s after it"
                )
            finally:
                cluster.proxy.command(cmd="rules", rules=[])  # type: ignore[union-attr]
            # Registered again after the heal (and caught up as a follower): ready again.
            cluster.until(
                lambda: _ready(old) == SERVING, timeout=60, what="the healed node ready again"
            )
        finally:
            stop.set()
            reader.join(30)
            task.join(30)
    assert [v for _, v in got] == [b"before", b"after"]
