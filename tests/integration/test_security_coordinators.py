"""Coordinator-to-coordinator calls under mTLS and ACLs: a TxnOffsetCommit whose group and
transactional id have different coordinators asks the transaction's coordinator for its state
(DescribeTransactions) with the coordinator's own certificate, a super user, so a client that
is none gets its offsets committed with only its own grants.

Real processes: etcd (TLS), a controller, a storage node and two coordinators.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strom import Admin, Consumer, OffsetAndMetadata, Producer, TopicPartition
from strom.api import metadata_pb2 as md
from strom.api import storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.transactions import GroupMetadata
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.integration.test_security import Env, allow

pytestmark = pytest.mark.integration

TOPIC = "sec-txn"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    tls = e.service_args()
    e.cluster = LocalCluster(
        tmp_path / "c",
        nodes=1,
        controllers=1,
        coordinators=2,
        node_args=tls,
        controller_args=tls,
        coordinator_args=[*tls, "--offsets-partitions", "2", "--transaction-state-partitions", "2"],
        security=e.security(e.admin),
        etcd_tls=(e.node.cert, e.node.key, e.ca.ca_file),
    )
    try:
        e.cluster.start()
        yield e
    finally:
        e.cluster.kill()


def _ids_on_two_coordinators(c: ClusterClient) -> tuple[str, str] | None:
    """A group id and a transactional id whose coordinators differ (None until the two
    coordinators each serve a shard of the kind asked)."""
    groups = {c.find_coordinator(f"g{i}", timeout_s=10): f"g{i}" for i in range(16)}
    txns = {
        c.find_coordinator(f"t{i}", storage_pb2.COORDINATOR_TYPE_TRANSACTION, timeout_s=10): f"t{i}"
        for i in range(16)
    }
    for address, gid in groups.items():
        other = [tid for a, tid in txns.items() if a != address]
        if other:
            return gid, other[0]
    return None


def test_a_txn_offset_commit_across_coordinators_passes_acls(env: Env) -> None:
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic(TOPIC, partitions=1, replication_factor=1)
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        gid, tid = wait_for(
            lambda: _ids_on_two_coordinators(c),
            timeout=60,
            what="a group and a transactional id on different coordinators",
        )
    who = "User:CN=alice"
    txn, group = md.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID, md.ACL_RESOURCE_TYPE_GROUP
    topic = md.ACL_RESOURCE_TYPE_TOPIC
    env.acls(
        allow(who, md.ACL_OPERATION_WRITE, topic, TOPIC),
        allow(who, md.ACL_OPERATION_READ, topic, TOPIC),
        allow(who, md.ACL_OPERATION_WRITE, txn, tid),
        allow(who, md.ACL_OPERATION_DESCRIBE, txn, tid),
        allow(who, md.ACL_OPERATION_READ, group, gid),
    )
    tp = TopicPartition(TOPIC, 0)
    with Producer(env.bootstrap, **env.client(env.alice, transactional_id=tid)) as p:  # type: ignore[arg-type]
        wait_for(lambda: p.init_transactions(10) or True, timeout=30, what="the grants applied")
        with p.transaction():
            p.send(TOPIC, b"r").result(10)
            p.send_offsets_to_transaction({tp: OffsetAndMetadata(7)}, GroupMetadata(gid), 30)
    with Consumer(env.bootstrap, **env.client(env.alice, group_id=gid)) as consumer:  # type: ignore[arg-type]
        # (The group's offsets complete after EndTxn's answer.)
        def committed() -> int | None:
            om = consumer.committed([tp], timeout_ms=30_000)[tp]
            return om.offset if om is not None else None

        assert wait_for(committed, timeout=30, what="the offset committed") == 7
