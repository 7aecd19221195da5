"""The README's exactly-once loop goes on within seconds when its transaction coordinator, or
its input group's coordinator, hangs (SIGSTOP: alive, connected, silent).

Found from outside: with the default request_timeout_ms (30 s) every call the loop makes to
a coordinator (EndTxn, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit) waited the whole
30 s at a hung one, although the standby coordinator owned its shards ~3 s after the hang.
A call unanswered for a second now has its coordinator looked up again every second, and
leaves for the new owner as soon as there is one (``TransactionManager._attempt``, the
consumer's overdue-Fetch rule, DESIGN §8).

Each test hangs the coordinator owning the key right when the call is made, keeps the default
30 s request timeout and bounds the call far below it; read_committed then sees exactly the
committed records.
"""

from __future__ import annotations

import time

import pytest

from strom import Consumer, Producer, TopicPartition
from strom.api import storage_pb2
from strom.client.types import OffsetAndMetadata
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import (
    TopicFactory,
    coordinator_of,
    coordinator_owning,
    module_cluster,
    paused,
)

pytestmark = pytest.mark.integration

TXN = storage_pb2.COORDINATOR_TYPE_TRANSACTION
GROUP = storage_pb2.COORDINATOR_TYPE_GROUP
#: The clients' request timeout (the default): what one call waited at a hung coordinator.
REQUEST_TIMEOUT_MS = 30_000
#: A call made while its coordinator hangs: the takeover (the lease's 2 s TTL, the shard's
#: load) plus a lookup every second. Generous for a loaded machine, far below the 30 s the
#: old client waited.
BOUND_S = 15.0

cluster = module_cluster(
    nodes=3,
    controllers=1,
    coordinators=2,
    coordinator_args=["--offsets-partitions", "2", "--transaction-state-partitions", "2"],
)
HEALED_CLUSTERS = ("cluster",)


def _producer(cluster: LocalCluster, tid: str) -> Producer:
    return Producer(cluster.bootstrap, transactional_id=tid, request_timeout_ms=REQUEST_TIMEOUT_MS)


def _read_committed(cluster: LocalCluster, topic: str) -> list[bytes]:
    """Every value of ``topic`` (one partition) a read_committed consumer sees, up to the
    LSO (which waits for the markers of every transaction decided so far)."""
    tp = TopicPartition(topic, 0)
    with Consumer(
        cluster.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    ) as c:
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and c.position(tp) < end:
            out.extend(r.value for r in c.poll(timeout_ms=200))
        return sorted(out)


def test_a_commit_leaves_a_hung_transaction_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """EndTxn at the transaction coordinator that hangs goes to the one that took over."""
    topic = new_topic(cluster)
    tid = f"overdue-commit-{topic}"
    with _producer(cluster, tid) as p:
        p.init_transactions()
        with p.transaction():
            p.send(topic, b"before")
        p.begin_transaction()
        p.send(topic, b"during")
        p.flush(30)  # (its partition is added: only EndTxn is left)
        with paused(coordinator_owning(cluster, tid, TXN, settled=(TXN, GROUP))):
            at = time.monotonic()
            p.commit_transaction()
            took = time.monotonic() - at
        print(f"commit_transaction() with its coordinator hung: {took:.1f} s")
        assert took < BOUND_S, took  # (the old client: ~30 s)
        with p.transaction():
            p.send(topic, b"after")
    assert _read_committed(cluster, topic) == [b"after", b"before", b"during"]


def test_a_transactions_first_send_leaves_a_hung_transaction_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """AddPartitionsToTxn (a transaction's first send to a partition) at the transaction
    coordinator that hangs goes to the one that took over; so does the EndTxn after it."""
    topic = new_topic(cluster)
    tid = f"overdue-add-{topic}"
    with _producer(cluster, tid) as p:
        p.init_transactions()
        with p.transaction():
            p.send(topic, b"before")
        with paused(coordinator_owning(cluster, tid, TXN, settled=(TXN, GROUP))):
            at = time.monotonic()
            with p.transaction():
                p.send(topic, b"during")
            took = time.monotonic() - at
        print(f"a transaction with its coordinator hung: {took:.1f} s")
        assert took < BOUND_S, took  # (the old client: ~30 s)
        with p.transaction():
            p.send(topic, b"after")
    assert _read_committed(cluster, topic) == [b"after", b"before", b"during"]


def test_send_offsets_leaves_a_hung_group_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """TxnOffsetCommit at the input group's coordinator that hangs (the transaction
    coordinator answers) goes to the one that took over; the offsets commit with the
    transaction."""
    topic = new_topic(cluster)
    tid = f"overdue-offsets-{topic}"
    tp = TopicPartition(topic, 0)
    with _producer(cluster, tid) as p:
        p.init_transactions()
        with p.transaction():
            p.send(topic, b"before")
        txn_owner = coordinator_owning(cluster, tid, TXN, settled=(TXN, GROUP))
        group = next(
            g
            for g in (f"overdue-{topic}-{i}" for i in range(64))
            if coordinator_of(cluster, g, GROUP) != txn_owner.address
        )
        with paused(coordinator_owning(cluster, group, GROUP, settled=(TXN, GROUP))):
            at = time.monotonic()
            with p.transaction():
                p.send(topic, b"during")
                p.send_offsets_to_transaction({tp: OffsetAndMetadata(7)}, group)
            took = time.monotonic() - at
        print(f"send_offsets_to_transaction() + commit, the group coordinator hung: {took:.1f} s")
        assert took < BOUND_S, took  # (the old client: ~30 s)
    assert _read_committed(cluster, topic) == [b"before", b"during"]
    with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
        # (the offsets become the group's once the coordinator completed the transaction)
        wait_for(
            lambda: (om := c.committed([tp])[tp]) is not None and om.offset == 7,
            timeout=30,
            what="the transaction's offset committed",
        )


#: The transaction coordinator's own calls (DESIGN §8): completing a transaction whose input
#: group's coordinator hangs, until the producer's next transaction commits. The takeover
#: (~2.4 s) plus a look at the view every second; the old coordinator waited its
#: CompleteTxnOffsets call's whole 15 s (~15.3 s in all).
COMPLETION_BOUND_S = 10.0


def test_completing_offsets_leaves_a_hung_group_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """The transaction coordinator's CompleteTxnOffsets to the input group's coordinator that
    hangs after the offsets were sent goes to the coordinator that took the group over, so
    the producer's next transaction (refused CONCURRENT_TRANSACTIONS until the last one is
    complete) goes on within seconds; the offsets are committed."""
    topic = new_topic(cluster)
    tid = f"overdue-complete-{topic}"
    tp = TopicPartition(topic, 0)
    with _producer(cluster, tid) as p:
        p.init_transactions()
        txn_owner = coordinator_owning(cluster, tid, TXN, settled=(TXN, GROUP))
        group = next(
            g
            for g in (f"complete-{topic}-{i}" for i in range(64))
            if coordinator_of(cluster, g, GROUP) != txn_owner.address
        )
        group_owner = coordinator_owning(cluster, group, GROUP, settled=(TXN, GROUP))
        p.begin_transaction()
        p.send(topic, b"during")
        p.send_offsets_to_transaction({tp: OffsetAndMetadata(5)}, group)
        with paused(group_owner):
            at = time.monotonic()
            p.commit_transaction()
            with p.transaction():
                p.send(topic, b"after")
            took = time.monotonic() - at
        print(f"commit + the next transaction, the group coordinator hung: {took:.1f} s")
        assert took < COMPLETION_BOUND_S, took  # (the old coordinator: ~15.3 s)
    assert _read_committed(cluster, topic) == [b"after", b"during"]
    with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
        wait_for(
            lambda: (om := c.committed([tp])[tp]) is not None and om.offset == 5,
            timeout=30,
            what="the transaction's offset committed",
        )
