"""A group consumer's coordinator calls (OffsetCommit, OffsetFetch, the heartbeat) go on
within seconds when the group's coordinator hangs (SIGSTOP: alive, connected, silent).

Found from outside: each attempt of these calls waited half of request_timeout_ms (15 s by
default) at a hung coordinator, although the standby coordinator owned its shards ~2.5 s
after the hang (its etcd lease ended). A call unanswered for a second now has the group's
coordinator looked up again every second, and leaves for the new owner as soon as there is
one (``GroupMember._attempt``, ``strom.client.coordinator_calls``; DESIGN §8).

The clients keep the default 30 s request timeout; the calls are bounded far below the old
~15 s. The group's session timeout is 6 s here: a heartbeat that waited its 15 s at the hung
coordinator reached the new owner only after that owner had expired the member (it loads
the group with fresh session deadlines), so the member lost its partitions.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import storage_pb2
from strom.client.types import OffsetAndMetadata
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import UnknownTopicOrPartitionError
from tests.conftest import (
    TopicFactory,
    coordinator_owning,
    module_cluster,
    paused,
)

pytestmark = pytest.mark.integration

GROUP = storage_pb2.COORDINATOR_TYPE_GROUP
#: The clients' request timeout (the default): an attempt at a hung coordinator waited half.
REQUEST_TIMEOUT_MS = 30_000
#: A call made while its coordinator hangs: the takeover (the lease's 2 s TTL, the shard's
#: load) plus a lookup every second. Generous for a loaded machine, below the ~15 s the old
#: client waited.
BOUND_S = 10.0
#: The coordinators' group session timeout (group.consumer.session.timeout.ms).
SESSION_TIMEOUT_S = 6.0

cluster = module_cluster(
    nodes=1,
    controllers=1,
    coordinators=2,
    coordinator_args=[
        "--group-heartbeat-interval-ms",
        "200",
        "--group-session-timeout-ms",
        str(int(SESSION_TIMEOUT_S * 1000)),
        "--offsets-partitions",
        "2",
        "--transaction-state-partitions",
        "2",
    ],
)
HEALED_CLUSTERS = ("cluster",)


class Listener:
    """Records the rebalance callbacks after the first assignment."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("assigned", parts))

    def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("revoked", parts))

    def on_partitions_lost(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("lost", parts))


def _consumer(cluster: LocalCluster, group: str) -> Consumer:
    return Consumer(
        cluster.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )


def _member(cluster: LocalCluster, group: str) -> Any:
    """The group's one member as its coordinator describes it."""
    with Admin(cluster.bootstrap) as admin:
        (member,) = admin.describe_groups([group])[group].members
    return member


def test_a_commit_and_the_heartbeat_leave_a_hung_group_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """commit() at the group's coordinator that hangs goes to the one that took over within
    seconds; so does the heartbeat, so the new owner does not expire the member: it keeps
    its partitions and epoch, no rebalance."""
    topic = new_topic(cluster, partitions=2)
    group = f"overdue-{topic}"
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Producer(cluster.bootstrap) as producer:
        for i in range(10):
            producer.send(topic, b"%d" % i, partition=i % 2)
        producer.flush(30)
    listener = Listener()
    with _consumer(cluster, group) as c:
        c.subscribe([topic], listener=listener)
        seen: list[Any] = []
        wait_for(
            lambda: seen.extend(c.poll(timeout_ms=100)) or len(seen) == 10,
            timeout=30,
            what="the 10 records",
        )
        c.commit()
        before = _member(cluster, group)
        assert set(before.assignment) == set(tps)
        listener.calls.clear()
        offsets = {tps[0]: OffsetAndMetadata(3), tps[1]: OffsetAndMetadata(4)}
        with paused(coordinator_owning(cluster, group, GROUP)):
            at = time.monotonic()
            c.commit(offsets)
            took = time.monotonic() - at
            print(f"commit() with the group coordinator hung: {took:.1f} s")
            assert took < BOUND_S, took  # (the old client: ~15 s)
            # Polling past the new owner's session timeout (it loaded the group ~2.5 s
            # after the hang, with fresh session deadlines): only heartbeats that reach it
            # keep the member (the old client's first one there came after ~15 s).
            until = at + 3.0 + SESSION_TIMEOUT_S + 2.0

            def polled_past_the_session_timeout() -> bool:
                c.poll(timeout_ms=100)
                return time.monotonic() >= until

            wait_for(polled_past_the_session_timeout, timeout=60, what="the session timeout")
            after = _member(cluster, group)
        assert (after.member_id, after.member_epoch) == (before.member_id, before.member_epoch)
        assert set(after.assignment) == set(tps)
        c.poll(timeout_ms=100)
        assert listener.calls == [], "the member lost or gave up its partitions"
        assert set(c.assignment()) == set(tps)
        assert {tp: om.offset for tp, om in c.committed(tps).items() if om} == {
            tps[0]: 3,
            tps[1]: 4,
        }


def test_committed_leaves_a_hung_group_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """committed() (OffsetFetch) at the group's coordinator that hangs goes to the one that
    took over within seconds and reads what was committed."""
    topic = new_topic(cluster, partitions=1)
    group = f"overdue-fetch-{topic}"
    tp = TopicPartition(topic, 0)
    with _consumer(cluster, group) as c:
        c.commit({tp: OffsetAndMetadata(7)})  # (an assign()-less "simple" commit)
        assert (om := c.committed([tp])[tp]) is not None and om.offset == 7
        with paused(coordinator_owning(cluster, group, GROUP)):
            at = time.monotonic()
            committed = c.committed([tp])[tp]
            took = time.monotonic() - at
        print(f"committed() with the group coordinator hung: {took:.1f} s")
        assert took < BOUND_S, took  # (the old client: ~15 s)
        assert committed is not None and committed.offset == 7


def test_admin_group_calls_leave_a_hung_group_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """An Admin's calls on a group (its offsets, a description: `strom groups describe`,
    an offsets reset) at the group's coordinator that hangs go to the one that took over
    within seconds (before: the whole attempt, request_timeout_ms)."""
    topic = new_topic(cluster, partitions=1)
    group = f"overdue-admin-{topic}"
    tp = TopicPartition(topic, 0)
    with _consumer(cluster, group) as c:
        c.commit({tp: OffsetAndMetadata(5)})
    with Admin(cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS) as admin:
        assert admin.list_group_offsets(group)[tp] is not None
        with paused(coordinator_owning(cluster, group, GROUP)):
            at = time.monotonic()
            offsets = admin.list_group_offsets(group)
            took = time.monotonic() - at
            described = admin.describe_groups([group])[group]
        print(f"list_group_offsets with the group coordinator hung: {took:.1f} s")
        assert took < BOUND_S, took  # (before: 30 s)
        assert (om := offsets[tp]) is not None and om.offset == 5
        assert described.group_id == group


def test_a_commit_for_a_topic_that_does_not_exist_fails_fast(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """A commit refused UNKNOWN_TOPIC_OR_PARTITION is sent again only while the topic exists
    (a coordinator's view may lag a topic just created): one for a topic the cluster does not
    have fails at once, with an error naming it; the other partitions commit."""
    topic = new_topic(cluster, partitions=1)
    tp, missing = TopicPartition(topic, 0), TopicPartition(f"no-such-{topic}", 0)
    with _consumer(cluster, f"missing-{topic}") as c:
        at = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError, match=f"no-such-{topic}-0"):
            c.commit({tp: OffsetAndMetadata(2), missing: OffsetAndMetadata(3)})
        took = time.monotonic() - at
        assert took < 5.0, took
        assert (om := c.committed([tp])[tp]) is not None and om.offset == 2
