"""An ISR change the controller did not answer is sent again on a new connection (found from
outside, network-partition review: a leader's ISR expansion proposed during a partition was
committed only ~20 s after it healed, the partition under-replicated meanwhile).

A storage node sends AlterPartition over one cached channel to the controller, and HTTP/2
puts every call of a channel on one connection: when that connection went silent, each
resend (every 0.5 s after a 5 s deadline) waited on it too. Here the fault proxy makes the
leader's open connections to the controller silent while new ones flow (``stick``,
tests/chaos/proxy.py), as a middlebox that lost the flow would, or retransmissions backed off
long after a partition healed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.client.admin import Admin
from strom.client.producer import Producer
from strom.devcluster.procs import wait_for
from tests.chaos.cluster import ChaosCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    c = ChaosCluster(
        tmp_path / "c",
        nodes=3,
        controllers=1,
        coordinators=0,
        etcd_members=1,
        node_args=["--replica-lag-time-max-ms", "2000"],
    )
    try:
        c.start()
        yield c
    finally:
        c.kill_all()


@pytest.mark.timeout(300)
def test_an_unanswered_isr_expansion_is_resent_on_a_new_connection(
    cluster: ChaosCluster,
) -> None:
    assert cluster.proxy is not None
    proxy = cluster.proxy
    with Admin(cluster.bootstrap, default_api_timeout_ms=60_000) as admin:
        admin.create_topic("t", partitions=1, replication_factor=3)

        def isr() -> tuple[int, ...]:
            return tuple(admin.describe_topic("t").partitions[0].isr)

        def leader() -> int | None:
            return admin.describe_topic("t").partitions[0].leader

        wait_for(lambda: leader() is not None and len(isr()) == 3, timeout=60, what="ISR of 3")
        lead = leader()
        follower = next(r for r in isr() if r != lead)
        pair = [f"node-{lead}", f"node-{follower}"]
        proxy.command(cmd="rules", rules=[{"kind": "stall", "from": pair, "to": pair}])
        # A record the cut follower cannot fetch: a follower at the leader's log end stays
        # in the ISR however long it is silent (Kafka's rule), so without it whether the ISR
        # shrinks hung on whether the follower's first fetch came before the cut.
        with Producer(cluster.bootstrap, acks=1) as producer:
            producer.send("t", b"while cut", partition=0).get(30)
        # The leader shrinks the ISR (an AlterPartition over its channel to the controller).
        wait_for(lambda: follower not in isr(), timeout=30, what="the ISR to shrink")
        answer = proxy.command(cmd="stick", **{"from": [f"node-{lead}"], "to": ["controller-*"]})
        assert answer["stuck"] >= 1, answer
        try:
            proxy.command(cmd="rules", rules=[])
            healed = time.monotonic()
            # The follower catches up at once; the expansion must get through although the
            # connection the shrink went over is silent.
            wait_for(lambda: follower in isr(), timeout=30, what="the ISR to grow back")
            took = time.monotonic() - healed
        finally:
            proxy.command(cmd="unstick")
        assert took < 15, f"the expansion took {took:.1f} s"
        print(f"ISR grew back {took:.1f} s after the heal, the old connection silent")
