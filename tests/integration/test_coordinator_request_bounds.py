"""The coordinator refuses malformed transactional and group requests on the wire (found
from outside by a fuzzing review), on real processes: a storage node, a controller and two
coordinators, so that a group's coordinator and a transactional id's coordinator are the
same process for some ids and different processes for others.

- TxnOffsetCommit is checked against the transaction of its transactional id: a producer
  epoch out of the 16-bit range is INVALID_REQUEST, another epoch than the transaction
  coordinator's is refused, and a group the open transaction did not add (no
  AddOffsetsToTxn) is INVALID_TXN_STATE. Before, ``producer_epoch=40000`` with no
  AddOffsetsToTxn was taken, and the real producer's offsets were then refused as fenced.
- AddPartitionsToTxn with epoch -1 is INVALID_REQUEST, not "your transaction timed out".
- ConsumerGroupHeartbeat refuses group ids with control characters or 100 000 characters,
  100 000-character member ids and a negative rebalance timeout below -1, and still takes
  what the clients send (UUID member ids, -1 as "unchanged").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from strom.api import (
    controller_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from strom.client.cluster import ClusterClient
from strom.coordinator.offsets_log import shard_for_group
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
E = ErrorCode
TOPIC = "bounds"
SHARDS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("bounds")
    c = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=2,
        coordinator_args=[
            "--offsets-partitions",
            str(SHARDS),
            "--transaction-state-partitions",
            str(SHARDS),
        ],
    )
    try:
        c.start()
        create_topic(c, TOPIC, partitions=1)
        yield c
    finally:
        c.kill()


def _owners(cluster: LocalCluster) -> tuple[dict[int, str], dict[int, str]] | None:
    """(group shard → coordinator address, transaction shard → address), once every shard
    of both kinds has an owner."""
    with ClusterClient(cluster.bootstrap) as client:
        desc = client.controller_call(
            "DescribeCluster", controller_pb2.DescribeClusterRequest(include_coordinators=True)
        )
    groups = {o.shard: f"{o.host}:{o.port}" for o in desc.coordinator_shards}
    txns = {o.shard: f"{o.host}:{o.port}" for o in desc.transaction_shards}
    if len(groups) < SHARDS or len(txns) < SHARDS:
        return None
    return groups, txns


def _pair(cluster: LocalCluster, *, same_process: bool) -> tuple[str, str, str, str]:
    """A (transactional id, group id, its txn coordinator, its group coordinator) whose two
    coordinators are the same process, or not; waits for shard ownership to allow it."""

    def find() -> tuple[str, str, str, str] | None:
        owners = _owners(cluster)
        if owners is None:
            return None
        groups, txns = owners
        for i in range(64):
            tid, gid = f"tx-{uuid.uuid4().hex[:8]}-{i}", f"g-{uuid.uuid4().hex[:8]}-{i}"
            t_addr = txns[shard_for_group(tid, SHARDS)]
            g_addr = groups[shard_for_group(gid, SHARDS)]
            if (t_addr == g_addr) == same_process:
                return tid, gid, t_addr, g_addr
        return None

    return wait_for(find, timeout=90, what=f"ids with same_process={same_process}")


def _coordinator(address: str) -> coordinator_pb2_grpc.CoordinatorServiceStub:
    return coordinator_pb2_grpc.CoordinatorServiceStub(grpc.insecure_channel(address))


def _name(code: int) -> str:
    return E.Name(code)


def _txn_offset_commit(
    stub: Any, tid: str, gid: str, pid: int, epoch: int, offset: int
) -> tuple[str, str]:
    req = coordinator_pb2.TxnOffsetCommitRequest(
        transactional_id=tid, group_id=gid, producer_id=pid, producer_epoch=epoch, member_epoch=-1
    )
    req.topics.add(topic=TOPIC).partitions.add(
        partition=0, committed_offset=offset, committed_leader_epoch=-1
    )
    resp = stub.TxnOffsetCommit(req, timeout=30)
    code = resp.error_code or (resp.topics[0].partitions[0].error_code if resp.topics else 0)
    return _name(code), resp.error_message


@pytest.mark.parametrize("same_process", [True, False], ids=["local-txn", "remote-txn"])
def test_txn_offset_commit_must_belong_to_the_transaction_that_added_the_group(
    cluster: LocalCluster, same_process: bool
) -> None:
    tid, gid, t_addr, g_addr = _pair(cluster, same_process=same_process)
    txn, grp = _coordinator(t_addr), _coordinator(g_addr)
    init = txn.InitProducerId(
        storage_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000),
        timeout=30,
    )
    assert init.error_code == E.NONE, init
    pid, epoch = init.producer_id, init.producer_epoch

    # No transaction open at all: the offsets are not taken (before: pending for good).
    code, message = _txn_offset_commit(grp, tid, gid, pid, epoch, 999)
    assert code == "INVALID_TXN_STATE", message
    assert "AddOffsetsToTxn" in message
    # A transaction open, but for another group.
    ids = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
    other = txn.AddOffsetsToTxn(
        coordinator_pb2.AddOffsetsToTxnRequest(**ids, group_id=gid + "-other"), timeout=30
    )
    assert other.error_code == E.NONE, other
    code, message = _txn_offset_commit(grp, tid, gid, pid, epoch, 999)
    assert code == "INVALID_TXN_STATE", message
    # Epochs no producer holds, or not this transaction's.
    for bad in (40000, -1, 2**31 - 1):
        code, message = _txn_offset_commit(grp, tid, gid, pid, bad, 999)
        assert (code, message) == ("INVALID_REQUEST", f"producer_epoch={bad} is outside 0..32767")
    code, message = _txn_offset_commit(grp, tid, gid, pid, epoch + 1, 999)
    assert code == "PRODUCER_FENCED", message
    code, message = _txn_offset_commit(grp, tid, gid, pid + 1, epoch, 999)
    assert code == "INVALID_PRODUCER_ID_MAPPING", message

    # The real producer's offsets are then taken and committed with its transaction.
    added = txn.AddOffsetsToTxn(
        coordinator_pb2.AddOffsetsToTxnRequest(**ids, group_id=gid), timeout=30
    )
    assert added.error_code == E.NONE, added
    assert _txn_offset_commit(grp, tid, gid, pid, epoch, 5) == ("NONE", "")
    end = txn.EndTxn(coordinator_pb2.EndTxnRequest(**ids, committed=True), timeout=30)
    assert end.error_code == E.NONE, end

    def committed() -> int | None:
        resp = grp.OffsetFetch(
            coordinator_pb2.OffsetFetchRequest(group_id=gid, member_epoch=-1, require_stable=True),
            timeout=30,
        )
        assert resp.error_code == E.NONE, resp
        parts = [p for t in resp.topics for p in t.partitions]
        if parts and parts[0].error_code == E.NONE and parts[0].committed_offset >= 0:
            return parts[0].committed_offset
        return None

    assert wait_for(committed, timeout=30, what="the transaction's offset committed") == 5


def test_transactional_epochs_out_of_range_are_invalid_requests(cluster: LocalCluster) -> None:
    tid, _, t_addr, _ = _pair(cluster, same_process=True)
    txn = _coordinator(t_addr)
    init = txn.InitProducerId(
        storage_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000),
        timeout=30,
    )
    assert init.error_code == E.NONE, init
    pid = init.producer_id
    add = coordinator_pb2.AddPartitionsToTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=-1
    )
    add.topics.add(topic=TOPIC, partitions=[0])
    resp = txn.AddPartitionsToTxn(add, timeout=30)
    # Before: INVALID_PRODUCER_EPOCH "... aborted its transaction because
    # transaction.timeout.ms=60000 passed", though nothing had timed out.
    assert (_name(resp.error_code), resp.error_message) == (
        "INVALID_REQUEST",
        "producer_epoch=-1 is outside 0..32767",
    )
    # InitProducerId taking the id back with epoch -1 was taken as the timed-out epoch.
    again = txn.InitProducerId(
        storage_pb2.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=pid, producer_epoch=-1
        ),
        timeout=30,
    )
    assert _name(again.error_code) == "INVALID_REQUEST", again
    big = txn.AddOffsetsToTxn(
        coordinator_pb2.AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=0, group_id="g" * 100_000
        ),
        timeout=30,
    )
    assert (_name(big.error_code), big.error_message) == (
        "INVALID_REQUEST",
        "group_id is 100000 characters long, more than 1024",
    )


def _group_coordinator(cluster: LocalCluster, group_id: str) -> Any:
    node = storage_pb2_grpc.StorageServiceStub(
        grpc.insecure_channel(cluster.bootstrap.split(",")[0])
    )

    def find() -> str | None:
        c = node.FindCoordinator(
            storage_pb2.FindCoordinatorRequest(keys=[group_id]), timeout=10
        ).coordinators[0]
        return f"{c.node.host}:{c.node.port}" if c.error_code == E.NONE else None

    return _coordinator(wait_for(find, timeout=60, what=f"a coordinator for {group_id[:20]!r}"))


def _heartbeat(cluster: LocalCluster, **kw: Any) -> coordinator_pb2.ConsumerGroupHeartbeatResponse:
    kw.setdefault("member_id", str(uuid.uuid4()))
    kw.setdefault("member_epoch", 0)
    kw.setdefault("rebalance_timeout_ms", 30_000)
    kw.setdefault("subscribed_topic_names", [TOPIC])
    stub = _group_coordinator(cluster, kw["group_id"])
    return stub.ConsumerGroupHeartbeat(
        coordinator_pb2.ConsumerGroupHeartbeatRequest(**kw), timeout=30
    )


def test_heartbeats_with_malformed_ids_or_timeouts_are_refused(cluster: LocalCluster) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"group_id": "g\x00nul"}, "group_id 'g\\x00nul' holds the control character"),
        ({"group_id": "g\x1b[31m"}, "group_id 'g\\x1b[31m' holds the control character"),
        ({"group_id": "g" * 100_000}, "group_id is 100000 characters long, more than 1024"),
        (
            {"group_id": "g-mid", "member_id": "m" * 100_000},
            "member_id is 100000 characters long, more than 255",
        ),
        (
            {"group_id": "g-inst", "instance_id": "i" * 100_000},
            "instance_id is 100000 characters long, more than 1024",
        ),
        ({"group_id": "g-rt", "rebalance_timeout_ms": -(2**31)}, "rebalance_timeout_ms="),
        ({"group_id": "g-rt", "rebalance_timeout_ms": -2}, "rebalance_timeout_ms=-2 "),
    ]
    for kw, message in cases:
        resp = _heartbeat(cluster, **kw)
        assert _name(resp.error_code) == "INVALID_REQUEST", (kw.get("group_id", "")[:20], resp)
        assert resp.error_message.startswith(message), resp.error_message
        assert resp.member_id == ""  # the refused id is not echoed back
    # What the clients send is taken: a UUID member id, -1 ("unchanged") or 0 ("not sent"),
    # a Spark-style group id, a group id of the longest length allowed.
    spark_group = f"spark-kafka-source-{uuid.uuid4()}-1234567-driver-0"
    for kw in (
        {"group_id": spark_group, "rebalance_timeout_ms": -1},
        {"group_id": f"g-zero-{uuid.uuid4().hex}", "rebalance_timeout_ms": 0},
        {"group_id": "g" * 1024, "instance_id": "host-1.example.com"},
        {"group_id": "größe-ü-日本"},
    ):
        resp = _heartbeat(cluster, **kw)
        assert resp.error_code == E.NONE, resp
        assert resp.member_epoch >= 1, resp
