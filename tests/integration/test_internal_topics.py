"""The internal topics (``__consumer_offsets``, ``__transaction_state``) are the coordinators'
alone (found from outside): one client record in ``__consumer_offsets`` whose key was no group
record made its shard fail every load after the next coordinator restart, and every group on
it answered COORDINATOR_LOAD_IN_PROGRESS for good.

- a client's Produce (and a Producer's send) to an internal topic is refused with
  INVALID_TOPIC naming it, and so is changing its cleanup.policy (other configs may be
  changed, as in Kafka); the coordinators keep writing;
- a record there that does not decode (written the coordinators' way, standing in for a
  damaged one) is skipped and counted when the shard loads; its groups stay available;
- during a rolling upgrade, while a coordinator of an older version (one that sends no
  header) owns a shard, headerless writes are accepted, as before the header existed.

With ACLs on, the same refusals apply to super users (tests/integration/test_security.py).
"""

from __future__ import annotations

import time

import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import metadata_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode, InvalidTopicError
from strom.metadata import MetadataStore
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


def test_headerless_internal_writes_are_accepted_only_while_an_old_coordinator_owns_a_shard(
    cluster: LocalCluster,
) -> None:
    """Found from outside (rolling upgrade from cabdcc8): coordinators from before the
    strom-internal-topics header never send it, so an upgraded leader refused all their
    writes and every shard it led stayed COORDINATOR_LOAD_IN_PROGRESS until the last
    coordinator was upgraded. The node now requires the header only while every shard owner
    is registered under coordinator_members/ (which old coordinators never write)."""
    cluster.wait_coordinators_ready()
    assert _produce(cluster, "__consumer_offsets").error_code == ErrorCode.INVALID_TOPIC
    # An old coordinator's shard key, as it writes it (coordinators/<shard>, no member key).
    # Shard 1 is past this cluster's one __consumer_offsets shard, so the real coordinator
    # keeps its own shard 0 and serves on.
    store = MetadataStore([cluster.etcd.endpoint], cluster.cluster_name)
    key = store.keys.coordinator(1)
    old = metadata_pb2.CoordinatorShardOwner(
        shard=1, coordinator_id=77, host="127.0.0.1", port=1, epoch=3, producer_id=5,
        incarnation_id="old-coordinator-77",
    )  # fmt: skip
    node = cluster.nodes[0]
    try:
        store.put(key, old)
        wait_for(
            lambda: _produce(cluster, "__consumer_offsets").error_code == ErrorCode.NONE,
            timeout=20,
            what="a headerless write accepted while the old coordinator owns a shard",
        )
        assert member_metric(node, "strom_storage_old_coordinator_writes_total") >= 1
        with open(node.log_path) as f:
            assert "coordinator 77 (127.0.0.1:1, incarnation old-coordinator-77)" in f.read()
    finally:
        store.delete(key)
    # Once it is gone (upgraded), the header is required again.
    wait_for(
        lambda: _produce(cluster, "__consumer_offsets").error_code == ErrorCode.INVALID_TOPIC,
        timeout=20,
        what="headerless writes refused again once every shard owner is registered",
    )
    store.close()
