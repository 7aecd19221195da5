"""The internal topics (``__consumer_offsets``, ``__transaction_state``) are the coordinators'
alone (found from outside): one client record in ``__consumer_offsets`` whose key was no group
record made its shard fail every load after the next coordinator restart, and every group on
it answered COORDINATOR_LOAD_IN_PROGRESS for good.

- a client's Produce (and a Producer's send) to an internal topic is refused with
  INVALID_TOPIC naming it, and so is changing its cleanup.policy (other configs may be
  changed, as in Kafka); the coordinators keep writing;
- a record there that does not decode (written the coordinators' way, standing in for a
  damaged one) is skipped and counted when the shard loads; its groups stay available.

With ACLs on, the same refusals apply to super users (tests/integration/test_security.py).
"""

from __future__ import annotations

import time

import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import storage_pb2
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.errors import ErrorCode, InvalidTopicError
from strom.record import encode_batch
from strom.service.headers import INTERNAL_TOPICS_METADATA_KEY
from tests.conftest import create_topic, member_metric, module_cluster

pytestmark = pytest.mark.integration

cluster = module_cluster(nodes=1, controllers=1, coordinator_args=["--offsets-partitions", "1"])
HEALED_CLUSTERS = ("cluster",)


def _produce(cluster: LocalCluster, topic: str, *, internal: bool = False):  # type: ignore[no-untyped-def]
    """One record (key b"x", value b"y", the reviewer's) to partition 0 of ``topic``; with
    ``internal`` as strom's coordinators send it."""
    req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
    req.topics.add(topic=topic).partitions.add(
        partition=0, records=encode_batch([b"y"], keys=[b"x"]), current_leader_epoch=-1
    )
    metadata = ((INTERNAL_TOPICS_METADATA_KEY, "true"),) if internal else ()
    with ClusterClient(cluster.bootstrap) as c:
        resp = c.storage(cluster.bootstrap).Produce(req, timeout=10, metadata=metadata)
    return resp.topics[0].partitions[0]


def _consume_in_group(cluster: LocalCluster, topic: str, group: str) -> None:
    """Read the topic's one record in ``group`` and commit it."""
    with Consumer(
        cluster.bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    ) as c:
        c.subscribe([topic])
        got: list[object] = []
        deadline = time.monotonic() + 30
        while not got:
            assert time.monotonic() < deadline, f"nothing read from {topic} in {group}"
            got.extend(c.poll(timeout_ms=500))
        c.commit()


def test_clients_cannot_write_the_internal_topics(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, "internal-guard")
    with Producer(cluster.bootstrap) as p:
        p.send(topic, b"a").result(10)
    _consume_in_group(cluster, topic, "internal-guard-g")
    for internal in ("__consumer_offsets", "__transaction_state"):
        pr = _produce(cluster, internal)
        assert pr.error_code == ErrorCode.INVALID_TOPIC, pr
        assert f"topic {internal!r} is internal" in pr.error_message
    with Producer(cluster.bootstrap) as p, pytest.raises(InvalidTopicError, match="internal"):
        p.send("__consumer_offsets", b"y", key=b"x", partition=0).result(10)
    with Admin(cluster.bootstrap) as admin:
        with pytest.raises(InvalidTopicError, match=r"cleanup\.policy is strom's coordinators'"):
            admin.alter_configs("__consumer_offsets", {"cleanup.policy": "delete"})
        # Other configs are an operator's to tune, as in Kafka (found from outside: every
        # change was refused, so min.insync.replicas could not be raised).
        admin.alter_configs("__consumer_offsets", {"min.insync.replicas": "1"})
        configs = admin.describe_configs("__consumer_offsets")
        assert configs["min.insync.replicas"].value == "1"
        assert configs["cleanup.policy"].value == "compact"
    # The coordinator still writes its shard: the group commits and reads its offset back.
    with Producer(cluster.bootstrap) as p:
        p.send(topic, b"b").result(10)
    _consume_in_group(cluster, topic, "internal-guard-g")
    with Consumer(cluster.bootstrap, group_id="internal-guard-g") as c:
        assert c.committed(TopicPartition(topic, 0)).offset == 2  # type: ignore[union-attr]


def test_a_record_that_does_not_decode_does_not_keep_its_shard_from_loading(
    cluster: LocalCluster,
) -> None:
    topic = create_topic(cluster, "internal-corrupt")
    with Producer(cluster.bootstrap) as p:
        p.send(topic, b"a").result(10)
    _consume_in_group(cluster, topic, "internal-corrupt-g")
    # Written as a coordinator writes (clients no longer can): a stand-in for a damaged record.
    assert _produce(cluster, "__consumer_offsets", internal=True).error_code == 0
    coordinator = cluster.coordinators[0]
    assert coordinator.process is not None
    coordinator.process.kill()
    coordinator.start()
    cluster.wait_serving(coordinator)
    cluster.wait_coordinators_ready()  # (before: "loading shard 0 failed ...; retrying" forever)
    with Consumer(cluster.bootstrap, group_id="internal-corrupt-g") as c:
        assert c.committed(TopicPartition(topic, 0)).offset == 1  # type: ignore[union-attr]
    skipped = member_metric(
        coordinator, "strom_coordinator_undecodable_records_total", kind="group"
    )
    assert skipped >= 1
