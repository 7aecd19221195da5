"""The Admin client when the controller or a partition leader hangs (SIGSTOP: a GC pause or
a network partition looks the same from outside), against real processes: the call gives up
on the hung server after one attempt (request_timeout_ms) and succeeds against the one that
took over, within its overall deadline (default_api_timeout_ms).

Found from outside: each attempt was given the whole call's budget, so the call failed at
its timeout although a standby controller (or a new leader) was serving two seconds in.
"""

from __future__ import annotations

import signal

import pytest

from strom.client.admin import Admin
from strom.client.types import OffsetAndTimestamp, TopicPartition
from strom.devcluster.cluster import LocalCluster
from tests.conftest import create_topic, module_cluster

pytestmark = pytest.mark.integration

cluster = module_cluster(nodes=3, controllers=2, coordinators=0)
HEALED_CLUSTERS = ("cluster",)

#: Per attempt: more than the services' session timeout (2 s), so that by the time an attempt
#: at the hung server ends, the cluster has moved on; far less than the overall deadline.
ATTEMPT_MS = 3_000
OVERALL_MS = 60_000


def test_create_topic_fails_over_from_a_hung_controller(cluster: LocalCluster) -> None:
    with Admin(
        cluster.bootstrap, request_timeout_ms=ATTEMPT_MS, default_api_timeout_ms=OVERALL_MS
    ) as admin:
        before = admin.describe_cluster().controller  # the client now calls this one first
        hung = cluster.active_controller()
        assert before is not None and hung is not None and hung.port == before.port
        assert hung.process is not None
        hung.process.signal(signal.SIGSTOP)
        try:
            created = admin.create_topic("fo-created", partitions=1, replication_factor=1)
            after = admin.describe_cluster().controller
        finally:
            hung.process.signal(signal.SIGCONT)
        assert created.name == "fo-created" and created.topic_id
        assert after is not None and after.port != hung.port
        assert "fo-created" in admin.list_topics()


def test_list_offsets_fails_over_from_a_hung_leader(cluster: LocalCluster) -> None:
    create_topic(cluster, "fo-offsets", partitions=1, replication_factor=3)
    tp = TopicPartition("fo-offsets", 0)
    with Admin(
        cluster.bootstrap, request_timeout_ms=ATTEMPT_MS, default_api_timeout_ms=OVERALL_MS
    ) as admin:
        # The client's metadata now names this leader, so the next call goes to it first.
        assert admin.list_offsets({tp: "earliest"}) == {tp: OffsetAndTimestamp(0, -1)}
        leader = admin.describe_topic("fo-offsets").partitions[0].leader
        assert leader is not None
        hung = cluster.node(leader)
        assert hung.process is not None
        hung.process.signal(signal.SIGSTOP)
        try:
            # The leadership moves once the hung node's lease runs out: the call waits for
            # that itself, by retrying.
            got = admin.list_offsets({tp: "earliest"})
            new_leader = admin.describe_topic("fo-offsets").partitions[0].leader
        finally:
            hung.process.signal(signal.SIGCONT)
        assert got == {tp: OffsetAndTimestamp(0, -1)}
        assert new_leader is not None and new_leader != leader
