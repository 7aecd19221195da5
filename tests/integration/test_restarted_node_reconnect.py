"""A node killed and restarted on the same address is reachable again at once: by a client
channel that kept dialing it through the outage, and by the other nodes, whose fetches put
it back in every ISR (found from outside: a follower's fetches from a restarted leader failed
for 13 s while another follower's worked, and the leader then shrank that healthy follower out
of five ISRs; gRPC's default reconnect backoff, 1 s growing 1.6x up to 120 s, on channels
that kept the old address)."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from strom import Consumer, Producer, TopicPartition
from strom.api import storage_pb2
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic
from tests.integration.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration

PARTITIONS = 6
RECORDS = 600
#: Connection attempts a client's channel makes to the dead node before it is restarted:
#: the 7th is ~26 s into the outage with gRPC's default backoff (1 s, growing 1.6x), which
#: then waits 16.8 s (+-20%) before the next; strom's makes them within ~3 s, then 1 s
#: apart.
FAILED_ATTEMPTS = 7
#: How soon after node 3 serves again the client reaches it and the ISRs are whole.
BOUND_S = 5.0


def answers(stub: Any) -> bool:
    """Whether the node behind ``stub`` answers a Metadata call."""
    try:
        stub.Metadata(storage_pb2.MetadataRequest(skip_topics=True), timeout=1)
    except grpc.RpcError:
        return False
    return True


def _isrs(admin: Admin, topic: str) -> list[list[int]]:
    return [list(p.isr) for p in admin.describe_topic(topic).partitions]


def test_a_restarted_node_is_reached_again_within_a_second_or_so(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(nodes=3, controllers=1, coordinators=0)
    topic = "restarted"
    create_topic(cluster, topic, partitions=PARTITIONS, replication_factor=3)
    with Admin(cluster.bootstrap) as admin:
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(RECORDS):
                producer.send(topic, str(i).encode(), partition=i % PARTITIONS)
            producer.flush()
        node3 = cluster.node(3)
        assert 3 in {p.leader for p in admin.describe_topic(topic).partitions}
        # The client reaches node 3 through a proxy that counts its connection attempts
        # (while the node is down, the proxy closes each one, as a dead node's port does).
        proxy = TcpProxy(node3.port)
        address = f"127.0.0.1:{proxy.port}"
        with ClusterClient(address, retry_s=0) as client:
            stub = client.storage(address)
            assert answers(stub)
            assert node3.process is not None
            node3.process.kill()
            attempts_before = proxy.accepted
            # The client keeps calling the dead node (as a client whose leader it was does
            # until it learns of another) until its channel has failed FAILED_ATTEMPTS
            # connection attempts, and the node is started again right after the last:
            # gRPC's default backoff then waits 13-20 s before the next one.
            wait_for(
                lambda: not answers(stub) and proxy.accepted - attempts_before >= FAILED_ATTEMPTS,
                timeout=120,
                what=f"{FAILED_ATTEMPTS} connection attempts to the dead node",
            )
            node3.start()
            cluster.wait_serving(node3, timeout=60)
            serving = time.monotonic()
            wait_for(lambda: answers(stub), timeout=60, what="the client to reach node 3 again")
            reached_after = time.monotonic() - serving
            assert reached_after < BOUND_S, f"the client reached node 3 {reached_after:.1f} s late"
        proxy.close()
        wait_for(
            lambda: all(len(isr) == 3 for isr in _isrs(admin, topic)),
            timeout=60,
            what="every ISR whole again",
        )
        whole_after = time.monotonic() - serving
        assert whole_after < BOUND_S, f"ISRs whole {whole_after:.1f} s after node 3 served"
    with Consumer(cluster.bootstrap) as consumer:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning(parts)
        seen: set[bytes] = set()
        wait_for(
            lambda: seen.update(r.value for r in consumer.poll(1000)) or len(seen) >= RECORDS,
            timeout=60,
            what="every record read back",
        )
    assert seen == {str(i).encode() for i in range(RECORDS)}
