"""A storage node reports *ready* (health name ``strom.ready``) only while it is registered in
etcd and in the ISR of every partition it replicates; its started status (``""``) is
unaffected.

The chart's readiness probes ask ``strom.ready``: a StatefulSet's rolling restart stops the
next node only once this one is Ready, so a node that restarted but has not caught up yet must
not look ready (found while checking the chart: readiness was "started", and a rolling restart
under load could leave partitions with a single in-sync replica or none).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.api import metadata_pb2 as md
from strom.client.cluster import ClusterClient
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.metadata import MetadataStore
from tests.conftest import create_topic

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _status(member: Member, service: str) -> int | None:
    with grpc.insecure_channel(member.address) as channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                .status
            )
        except grpc.RpcError:
            return None


def _state(cluster: LocalCluster, topic: str) -> tuple[int, list[int]]:
    with ClusterClient(cluster.bootstrap, retry_s=5) as client:
        p = client.metadata([topic]).topics[0].partitions[0]
    return p.leader, sorted(p.isr)


def test_a_node_is_ready_only_while_it_is_in_its_partitions_isrs(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    # Leases outlive the pauses below: the ISR changes come from replication alone.
    cluster = make_cluster(
        nodes=3,
        controllers=1,
        coordinators=0,
        node_args=["--replica-lag-time-max-ms", "1000", "--session-timeout-s", "60"],
    )
    for node in cluster.nodes:
        wait_for(lambda n=node: _status(n, "strom.ready") == SERVING, timeout=20, what="ready")
    topic = "ready-t"
    create_topic(cluster, topic, 1, 3)
    wait_for(lambda: len(_state(cluster, topic)[1]) == 3, timeout=20, what="a full ISR")
    leader_id, _ = _state(cluster, topic)
    leader = next(n for n in cluster.nodes if n.ident == leader_id)
    follower = next(n for n in cluster.nodes if n.ident != leader_id)

    follower.process.signal(signal.SIGSTOP)
    stopped = [follower]
    try:
        with Producer(cluster.bootstrap, acks=1) as producer:
            producer.send(topic, b"while the follower sleeps", partition=0).get(10)
        wait_for(
            lambda: follower.ident not in _state(cluster, topic)[1],
            timeout=20,
            what="the paused follower to leave the ISR",
        )
        # The leader paused too: the follower wakes up outside the ISR with nothing to catch
        # up from, for as long as this test wants.
        leader.process.signal(signal.SIGSTOP)
        stopped.append(leader)
        follower.process.signal(signal.SIGCONT)
        stopped.remove(follower)
        wait_for(
            lambda: _status(follower, "strom.ready") == NOT_SERVING,
            timeout=20,
            what="the follower outside the ISR to say it is not ready",
        )
        assert _status(follower, "") == SERVING  # started (alive): only readiness waits
        others = [n for n in cluster.nodes if n not in (leader, follower)]
        assert [_status(n, "strom.ready") for n in others] == [SERVING]
    finally:
        for member in stopped:
            member.process.signal(signal.SIGCONT)
    wait_for(
        lambda: follower.ident in _state(cluster, topic)[1],
        timeout=30,
        what="the follower to catch up and rejoin the ISR",
    )
    wait_for(
        lambda: _status(follower, "strom.ready") == SERVING,
        timeout=20,
        what="the follower back in the ISR to say it is ready",
    )
    assert _state(cluster, topic)[0] == leader_id  # nothing moved: the leader only slept


def test_a_node_whose_key_is_gone_is_not_ready_and_registers_again(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: a node left unregistered (its re-registration dropped) ran on for
    good, answering ready. Its key deleted by hand while its lease lives (no loss for its
    keepalive to report): it says it is not ready, and its watchdog registers it again."""
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    node = cluster.nodes[0]
    wait_for(lambda: _status(node, "strom.ready") == SERVING, timeout=20, what="ready")
    store = MetadataStore(cluster.etcd.endpoint, cluster.cluster_name)
    try:
        key = store.keys.node(node.ident)
        first = store.get(key, md.NodeRegistration)
        assert first is not None
        store.client.delete(key)
        wait_for(
            lambda: _status(node, "strom.ready") == NOT_SERVING,
            timeout=20,
            what="the unregistered node to say it is not ready",
        )
        assert _status(node, "") == SERVING  # alive
        wait_for(
            lambda: store.get(key, md.NodeRegistration) is not None,
            timeout=30,
            what="the node to register again",
        )
        again = store.get(key, md.NodeRegistration)
        assert again is not None and again.value.incarnation_id == first.value.incarnation_id
        assert again.value.state == md.NODE_STATE_RUNNING
        wait_for(
            lambda: _status(node, "strom.ready") == SERVING,
            timeout=20,
            what="the registered node to say it is ready again",
        )
    finally:
        store.close()
