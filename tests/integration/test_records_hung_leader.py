"""RecordService's ProduceRecords while the partition's leader hangs (SIGSTOP: a GC pause or a
network partition looks the same from outside), against real processes.

Found from outside:

- a call forwarded to a hung leader waited until the leader resumed (20 s pause: 20,072 ms)
  or the call's ``timeout_ms`` ran out (30 s), although the controller moved the partition
  within ~2 s: nothing gave the forwarded Produce up when the leader changed in the node's
  view (record_producers ``_LeaderWatch`` now does, design §8);
- with the docs' settings (default ``timeout_ms``, 30 s, and a 30 s call deadline) a hung
  leader gave a bare DEADLINE_EXCEEDED, never the node's REQUEST_TIMED_OUT: the node's wait
  ran to the deadline itself (records_api ``ANSWER_MARGIN_S``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from strom.api import records_pb2, records_pb2_grpc
from strom.client.admin import Admin
from strom.client.consumer import Consumer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode
from tests.conftest import create_topic, module_cluster, paused

pytestmark = pytest.mark.integration
rp = records_pb2
E = ErrorCode

cluster = module_cluster(nodes=3, controllers=1, coordinators=0)
HEALED_CLUSTERS = ("cluster",)


def leader_of(cluster: LocalCluster, topic: str) -> int:
    with Admin(cluster.bootstrap) as admin:
        leader = admin.describe_topic(topic).partitions[0].leader
    assert leader is not None and leader >= 0
    return leader


def other_node(cluster: LocalCluster, not_this: int) -> Member:
    return next(n for n in cluster.nodes if n.ident != not_this)


@pytest.fixture
def stub_via() -> Iterator[list[grpc.Channel]]:
    """Channels a test opened (closed after it)."""
    channels: list[grpc.Channel] = []
    yield channels
    for ch in channels:
        ch.close()


def stub_for(member: Member, channels: list[grpc.Channel]) -> records_pb2_grpc.RecordServiceStub:
    ch = grpc.insecure_channel(member.address)
    channels.append(ch)
    return records_pb2_grpc.RecordServiceStub(ch)


def read_log(bootstrap: str, tp: TopicPartition, n: int) -> list[tuple[int, bytes]]:
    """(offset, value) of ``tp``'s records up to its end offset (at least ``n``), in order."""
    out: list[tuple[int, bytes]] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        wait_for(lambda: c.end_offsets([tp])[tp] >= n, timeout=30, what=f"{n} records of {tp}")
        end = c.end_offsets([tp])[tp]
        deadline = time.monotonic() + 60
        while len(out) < end and time.monotonic() < deadline:
            out.extend((r.offset, r.value) for r in c.poll(timeout_ms=200))
    return out


def test_calls_forwarded_to_a_hung_leader_move_once_the_leader_moved(
    cluster: LocalCluster, stub_via: list[grpc.Channel]
) -> None:
    """One call at a time through a node that does not lead the partition, the leader paused:
    every call answers within a few seconds of the controller moving the partition (old: the
    call in flight waited for the leader to resume, or DEADLINE_EXCEEDED), and every record
    is in the log once, in order, at the offsets the calls returned."""
    topic = create_topic(
        cluster,
        "records-hung-leader",
        partitions=1,
        replication_factor=3,
        config={"min.insync.replicas": "2"},
    )
    tp = TopicPartition(topic, 0)
    old = leader_of(cluster, topic)
    stub = stub_for(other_node(cluster, old), stub_via)
    sent: list[bytes] = []
    offsets: list[int] = []

    def call(tag: str) -> float | None:
        """One call of 10 records; its seconds (None: the node does not know the topic yet)."""
        values = [b"%s-%d-%d" % (tag.encode(), len(sent), i) for i in range(10)]
        req = rp.ProduceRecordsRequest(
            topic=topic, partition=0, acks=rp.ACKS_ALL, records=rp.RecordColumns(values=values)
        )
        at = time.monotonic()
        # A 20 s deadline, above the bound below and the time the controller takes: the old
        # code's call to the hung leader ends at it (DEADLINE_EXCEEDED).
        resp = stub.ProduceRecords(req, timeout=20)
        took = time.monotonic() - at
        if resp.error_code == E.UNKNOWN_TOPIC_OR_PARTITION and not sent:
            return None
        assert resp.error_code == E.NONE, resp
        assert [r.error_code for r in resp.results] == [E.NONE], resp.results
        sent.extend(values)
        offsets.extend(resp.offsets)
        return took

    # (the node's producer id, and its sequences, are known to every replica before the pause)
    wait_for(lambda: call("before") is not None, timeout=15, what="a first call")
    for _ in range(4):
        call("before")
    with Consumer(cluster.bootstrap) as c:
        wait_for(lambda: c.end_offsets([tp])[tp] == len(sent), timeout=30, what="before replicated")
    times: list[float | None] = []
    with paused(cluster.node(old)):
        at = time.monotonic()
        while len(times) < 6:
            times.append(call("during"))
        paused_for = time.monotonic() - at
        new = leader_of(cluster, topic)
    assert new != old
    # The controller moves the partition ~2 s after the node stopped, then the node sees it
    # within a look (1 s); room for a loaded machine. Old: 20 s (the call's deadline).
    assert all(t is not None and t < 12.0 for t in times), times
    assert paused_for < 20.0, (paused_for, times)
    log = read_log(cluster.bootstrap, tp, len(sent))
    assert [v for _, v in log] == sent
    assert [o for o, _ in log] == offsets


def test_a_call_to_a_hung_leader_gets_the_nodes_timeout_before_its_deadline(
    cluster: LocalCluster, stub_via: list[grpc.Channel]
) -> None:
    """A call with the default timeout_ms (30 s) and a shorter gRPC deadline (3 s) to a
    partition whose only replica hangs (nothing can take over) is answered by the node with
    REQUEST_TIMED_OUT ("may or may not have been written") before the deadline; old:
    DEADLINE_EXCEEDED, the node's answer lost to the deadline."""
    topic = create_topic(cluster, "records-hung-rf1", partitions=1, replication_factor=1)
    leader = leader_of(cluster, topic)
    stub = stub_for(other_node(cluster, leader), stub_via)

    def req(value: bytes) -> rp.ProduceRecordsRequest:
        return rp.ProduceRecordsRequest(
            topic=topic, partition=0, acks=rp.ACKS_ALL, records=rp.RecordColumns(values=[value])
        )

    wait_for(
        lambda: stub.ProduceRecords(req(b"first"), timeout=30).error_code == E.NONE,
        timeout=15,
        what="a first call",
    )
    with paused(cluster.node(leader)):
        at = time.monotonic()
        resp = stub.ProduceRecords(req(b"hung"), timeout=3)
        took = time.monotonic() - at
    assert [r.error_code for r in resp.results] == [E.REQUEST_TIMED_OUT], resp
    assert "may or may not have been written" in resp.results[0].error_message, resp
    assert took < 3.0, took
