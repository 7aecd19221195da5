"""The producer does not make gRPC start a thread per request (strom.client.spin).

gRPC's synchronous ``.future()`` calls complete on a per-channel thread that gRPC starts when
the channel's first such call begins and stops when the last ends; a producer sending one
request at a time used to start one thread per request. The producer now holds a Health/Watch
stream open on each node's channel, so the thread stays up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """How many threads the process started since the fixture began."""
    started = [0]
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started[0] += 1
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    yield lambda: started[0]


def test_one_request_at_a_time_reuses_grpcs_completion_thread(
    one_node_cluster: LocalCluster, new_topic: Callable[..., str], thread_starts: Callable[[], int]
) -> None:
    topic = new_topic(one_node_cluster)
    with Producer(one_node_cluster.bootstrap, linger_ms=0) as p:
        p.send(topic, b"warm").result(timeout=30)  # connection, metadata, producer id
        before = thread_starts()
        for i in range(200):  # each waits for its answer: one request in flight, then none
            meta = p.send(topic, b"v%d" % i).result(timeout=30)
            assert meta.offset == i + 1
        started = thread_starts() - before
    assert started <= 5, f"{started} threads started for 200 requests"


def test_the_producer_recovers_its_stream_after_the_node_restarts(
    one_node_cluster: LocalCluster, new_topic: Callable[..., str], thread_starts: Callable[[], int]
) -> None:
    """The held stream ends with the node; records still flow, and once the node is back the
    producer holds a new stream (threads stop being started per request again)."""
    cluster = one_node_cluster
    topic = new_topic(cluster)
    with Producer(cluster.bootstrap, linger_ms=0, delivery_timeout_ms=60_000) as p:
        p.send(topic, b"first").result(timeout=30)
        cluster.restart(cluster.nodes[0])
        for i in range(5):  # through the restart: each waits for the node to be back
            p.send(topic, b"x%d" % i).result(timeout=60)
        before = thread_starts()
        for i in range(200):
            p.send(topic, b"v%d" % i).result(timeout=30)
        started = thread_starts() - before
    assert started <= 5, f"{started} threads started for 200 requests after the restart"
