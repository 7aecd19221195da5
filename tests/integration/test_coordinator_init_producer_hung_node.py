"""The transaction coordinator's InitProducerId while the lowest-id storage node hangs
(SIGSTOP: alive, registered, silent). The coordinator gets a new transactional id's producer
id from a storage node; it asked them one after another, lowest id first, 10 s each, so every
new transactional id waited 10 s for a hung node 1 (found from outside). It now asks the next
node too after 0.5 s, as the clients' lookups do."""

from __future__ import annotations

import time
from typing import Any

import pytest

from strom import Admin, Producer
from strom.client.cluster import ClusterClient
from strom.client.types import TopicPartition
from strom.devcluster.procs import wait_for
from tests.conftest import paused

pytestmark = pytest.mark.integration

#: Generous for a loaded machine; the old code took the node's 10 s attempt first.
BOUND_S = 5.0


def _leader(client: ClusterClient, topic: str) -> int:
    return int(client.topic_metadata(topic).partitions[0].leader)


def test_a_new_transactional_id_gets_its_producer_id_soon_while_node_1_hangs(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(
        nodes=2,
        controllers=1,
        coordinators=1,
        coordinator_args=[
            "--offsets-partitions",
            "1",
            "--transaction-state-partitions",
            "1",
            "--offsets-replication-factor",
            "1",
        ],
    )
    cluster.wait_coordinators_ready()
    with Producer(cluster.bootstrap, transactional_id="warm-up") as producer:
        producer.init_transactions()  # the transaction state's topic exists and is served
    # Nothing the transaction needs may live on node 1 but the producer ids it hands out.
    with Admin(cluster.bootstrap) as admin, ClusterClient(cluster.bootstrap) as client:
        for topic in ("__transaction_state", "__consumer_offsets"):
            if _leader(client, topic) != 2:
                admin.alter_partition_reassignments({TopicPartition(topic, 0): [2]})
            wait_for(
                lambda t=topic: (
                    client.topic_metadata(t, refresh=True).partitions[0].leader == 2
                    and not admin.list_partition_reassignments()
                ),
                timeout=60,
                what=f"{topic}-0 on node 2 alone",
            )
    with Producer(cluster.bootstrap, transactional_id="after-move") as producer:
        producer.init_transactions()  # the coordinator serves the moved shard
    with paused(cluster.node(1)):
        at = time.monotonic()
        with Producer(cluster.node(2).address, transactional_id="new-while-hung") as producer:
            producer.init_transactions()
            took = time.monotonic() - at
    assert took < BOUND_S, took
