"""A service asked to stop (SIGTERM) ends its health Watch streams instead of waiting them out.

Watch streams last until the client leaves (the active controller holds one to every node,
producers one per node), and gRPC's graceful stop waits for open calls: a node kept every
graceful stop waiting for its whole grace period, then cut the streams. Now each stream gets
the NOT_SERVING status and ends normally, and a Watch opened during the shutdown ends at once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic, member_metric

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _follow(address: str) -> tuple[list[Any], list[Any], threading.Thread, grpc.Channel]:
    """Watch ``address`` on a thread: the statuses seen, and how the stream ended."""
    channel = grpc.insecure_channel(address)
    stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    statuses: list[Any] = []
    ended: list[Any] = []

    def run() -> None:
        try:
            for msg in stream:
                statuses.append(msg.status)
            ended.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            ended.append(exc.code())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return statuses, ended, t, channel


@pytest.mark.parametrize("kind", ["storage-node", "controller"])
def test_watch_streams_end_with_not_serving_when_a_service_stops(
    make_cluster: Callable[..., LocalCluster], kind: str
) -> None:
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    member = cluster.nodes[0] if kind == "storage-node" else cluster.controllers[0]
    statuses, ended, reader, channel = _follow(member.address)
    try:
        cluster.wait_serving(member)
        # The stream must be open (its first status in) before the stop, or the service may
        # already be NOT_SERVING when the Watch arrives.
        wait_for(lambda: bool(statuses), timeout=10, what="the Watch's first status")
        assert member.process is not None
        assert member.process.stop() == 0  # SIGTERM: a clean exit
        reader.join(30)
        assert not reader.is_alive(), "the Watch stream did not end"
        assert ended == [grpc.StatusCode.OK]  # ended by the service, not cut (UNAVAILABLE)
        assert statuses[0] == SERVING and statuses[-1] == NOT_SERVING
    finally:
        channel.close()


def test_a_node_stopping_cleanly_is_not_fenced_as_a_crash(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """SIGTERM: the node publishes SHUTTING_DOWN before its server stops, so the active
    controller's prober, finding its connections refused, leaves the registration to the
    node (found from outside: every clean stop was fenced as a crash, with warnings on both
    sides). SIGKILL of another node is still fenced at once: the prober is at work."""
    cluster = make_cluster(nodes=3, controllers=1, coordinators=0)
    controller = cluster.controllers[0]
    fenced = "strom_controller_nodes_fenced_total"
    stopping, killed = cluster.nodes[1], cluster.nodes[2]
    assert stopping.process is not None and killed.process is not None
    assert member_metric(controller, fenced) == 0
    assert stopping.process.stop() == 0  # SIGTERM: a clean exit
    log_text = stopping.log_path.read_text()
    assert "stopped cleanly" in log_text and "lease" not in log_text.split("controlled")[-1]
    killed.process.kill()
    wait_for(lambda: member_metric(controller, fenced) == 1, timeout=20, what="the kill fenced")
    assert member_metric(controller, fenced) == 1  # the SIGTERM was not counted


def test_a_node_stops_cleanly_when_no_controller_answers(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """SIGTERM while the controller is frozen: the controlled shutdown gives up after its
    timeout, and the node still closes its logs cleanly (found from outside: the runtime cut
    stop() at 10 s, and the next start recovered every log as after a crash)."""
    cluster = make_cluster(nodes=2, controllers=1, coordinators=0)
    create_topic(cluster, "led", partitions=4, replication_factor=2)  # leaders on both
    node, controller = cluster.nodes[0], cluster.controllers[0]
    assert node.process is not None and controller.process is not None
    # The metadata names leaders before the node has applied the role: a node leading nothing
    # has no leadership to move and stops without asking the controller at all.
    wait_for(
        lambda: member_metric(node, "strom_storage_partitions", role="leader") >= 1,
        timeout=20,
        what="node 0 leading a partition",
    )
    controller_pid = controller.process.pid
    os.kill(controller_pid, signal.SIGSTOP)
    try:
        assert node.process.stop(timeout=60) == 0
    finally:
        os.kill(controller_pid, signal.SIGCONT)
    text = node.log_path.read_text()
    assert "no controller answered ControlledShutdown" in text
    assert "stopped cleanly" in text and "did not finish" not in text
