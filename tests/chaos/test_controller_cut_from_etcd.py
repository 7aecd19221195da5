"""An active controller cut off from etcd alone stops acting as the controller (found from
outside, network-partition review).

The standby takes over within a couple of seconds of the old controller's lease expiring, but
the old one cannot hear that its lease is gone. It went on answering: reads from its frozen
view (an ISR 28 s old), writes only after the client's whole 60 s deadline, every answer
naming itself as the controller, so an Admin that had last talked to it never looked for the
new one. Now it refuses (NOT_CONTROLLER) once its lease has lapsed unrenewed, and the client
asks the nodes which controller is active after a refusal or a retriable error.

The cut is the fault proxy's stall, both ways, between that controller and every etcd member
(tests/chaos/proxy.py): it reaches the nodes and the clients, and they reach it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strom.api import controller_pb2 as pb
from strom.api import controller_pb2_grpc
from strom.client.admin import Admin
from strom.devcluster.procs import wait_for
from strom.errors import BrokerNotAvailableError, ErrorCode
from tests.chaos.cluster import ChaosCluster, Proc

pytestmark = pytest.mark.integration
E = ErrorCode


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    c = ChaosCluster(tmp_path / "c", nodes=3, controllers=2, coordinators=0, etcd_members=1)
    try:
        c.start()
        yield c
    finally:
        c.kill_all()


def _stub(p: Proc, channels: list[grpc.Channel]) -> controller_pb2_grpc.ControllerServiceStub:
    """A stub to ``p`` past the proxy, so the test's own calls are never stalled."""
    channel = grpc.insecure_channel(p.direct)
    channels.append(channel)
    return controller_pb2_grpc.ControllerServiceStub(channel)


def _answer(stub: controller_pb2_grpc.ControllerServiceStub) -> int:
    try:
        return int(stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=2).error_code)
    except grpc.RpcError:
        return -1


@pytest.mark.timeout(300)
def test_a_controller_cut_from_etcd_refuses_and_the_admin_finds_the_new_one(
    cluster: ChaosCluster,
) -> None:
    channels: list[grpc.Channel] = []
    stubs = {p.name: _stub(p, channels) for p in cluster.controllers}
    wait_for(
        lambda: any(_answer(s) == E.NONE for s in stubs.values()),
        timeout=60,
        what="an active controller",
    )
    old = next(p for p in cluster.controllers if _answer(stubs[p.name]) == E.NONE)
    new = next(p for p in cluster.controllers if p is not old)
    old_id, new_id = int(old.name.split("-")[1]), int(new.name.split("-")[1])
    admin = Admin(cluster.bootstrap, request_timeout_ms=10_000, default_api_timeout_ms=40_000)
    try:
        admin.create_topic("before", partitions=1, replication_factor=3)
        # A long-lived Admin whose last answer came from the controller about to be cut.
        assert admin.describe_cluster().controller.node_id == old_id
        assert cluster.proxy is not None
        cluster.proxy.command(
            cmd="rules",
            rules=[
                {"kind": "stall", "from": [old.name], "to": ["etcd-*"]},
                {"kind": "stall", "from": ["etcd-*"], "to": [old.name]},
            ],
        )
        cut = time.monotonic()
        wait_for(
            lambda: _answer(stubs[new.name]) == E.NONE,
            timeout=60,
            what="the standby to take over",
        )
        took_over = time.monotonic() - cut
        # The deposed controller refuses reads and writes alike, naming no one (its view
        # cannot have seen the new controller) rather than itself.
        wait_for(
            lambda: _answer(stubs[old.name]) == E.NOT_CONTROLLER,
            timeout=10,
            what="the deposed controller to refuse",
        )
        resp = stubs[old.name].DescribeTopics(pb.DescribeTopicsRequest(topics=["before"]))
        assert resp.error_code == E.NOT_CONTROLLER, resp
        assert resp.controller.node_id != old_id, resp
        assert "election lease" in resp.error_message, resp.error_message
        started = time.monotonic()
        create = stubs[old.name].CreateTopics(
            pb.CreateTopicsRequest(
                topics=[pb.CreatableTopic(name="zombie", num_partitions=1, replication_factor=1)]
            ),
            timeout=30,
        )
        assert create.error_code == E.NOT_CONTROLLER, create
        assert time.monotonic() - started < 5, "the refusal waited for etcd"
        # The old Admin looks the controller up again and reaches the new one well within
        # its deadline (it waited out all 60 s before).
        started = time.monotonic()
        assert admin.describe_cluster().controller.node_id == new_id
        admin.create_topic("after", partitions=1, replication_factor=3)
        assert "after" in admin.describe_topics(["after"])
        elapsed = time.monotonic() - started
        assert elapsed < 20, f"the old Admin took {elapsed:.1f} s to reach the new controller"
        print(f"standby active {took_over:.1f} s after the cut; old Admin done in {elapsed:.1f} s")
        # Healed, the deposed controller hears its lease is gone and points at the new one.
        cluster.proxy.command(cmd="rules", rules=[])
        wait_for(
            lambda: (
                stubs[old.name].ListTopics(pb.ListTopicsRequest(), timeout=2).controller.node_id
                == new_id
            ),
            timeout=30,
            what="the healed controller to point at the new one",
        )
    finally:
        admin.close()
        for ch in channels:
            ch.close()


@pytest.mark.timeout(300)
def test_with_every_controller_cut_from_etcd_admin_calls_fail_and_then_recover(
    cluster: ChaosCluster,
) -> None:
    """Nobody can write then (design.md §3, docs/reliability.md): the active controller's lease
    lapses unrenewed and it refuses reads too, the standby names it; an admin call fails with
    BROKER_NOT_AVAILABLE at its deadline. Healed, admin calls work again."""
    channels: list[grpc.Channel] = []
    stubs = {p.name: _stub(p, channels) for p in cluster.controllers}
    wait_for(
        lambda: any(_answer(s) == E.NONE for s in stubs.values()),
        timeout=60,
        what="an active controller",
    )
    active = next(p for p in cluster.controllers if _answer(stubs[p.name]) == E.NONE)
    admin = Admin(cluster.bootstrap, request_timeout_ms=3_000, default_api_timeout_ms=6_000)
    try:
        admin.create_topic("before", partitions=1, replication_factor=3)
        assert cluster.proxy is not None
        names = [p.name for p in cluster.controllers]
        cluster.proxy.command(
            cmd="rules",
            rules=[
                {"kind": "stall", "from": names, "to": ["etcd-*"]},
                {"kind": "stall", "from": ["etcd-*"], "to": names},
            ],
        )
        wait_for(
            lambda: _answer(stubs[active.name]) == E.NOT_CONTROLLER,
            timeout=15,
            what="the cut-off active controller to refuse",
        )
        with pytest.raises(BrokerNotAvailableError, match="no active controller answered"):
            admin.describe_topic("before")
        with pytest.raises(BrokerNotAvailableError):
            admin.create_topic("during", partitions=1, replication_factor=3)
        cluster.proxy.command(cmd="rules", rules=[])
        wait_for(
            lambda: any(_answer(s) == E.NONE for s in stubs.values()),
            timeout=60,
            what="an active controller after the heal",
        )
        admin.create_topic("after", partitions=1, replication_factor=3)
        assert "before" in admin.describe_topics(["before"])
    finally:
        admin.close()
        for ch in channels:
            ch.close()
