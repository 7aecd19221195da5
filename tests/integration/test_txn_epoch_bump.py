"""A transactional producer whose batch failed goes on after ``abort_transaction()`` alone:
the abort gets a new epoch (InitProducerId with the current id and epoch, Kafka's KIP-360
bump) and every partition numbers from 0 under it; a newer instance still fences it.

Found from outside: after a batch failed "may have been written" (its leader paused past
delivery_timeout_ms, then replaced) every later transaction failed with
OutOfOrderSequenceError until init_transactions(), which the README's loop never calls.

Real etcd, controller, storage nodes and coordinator as processes; waits are on conditions.
"""

from __future__ import annotations

import signal

import pytest

from strom import Consumer, Producer, TopicPartition
from strom.client.admin import Admin
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import MessageTooLargeError, ProducerFencedError, StromError
from tests.conftest import TopicFactory

pytestmark = pytest.mark.integration


def _leader(cluster: LocalCluster, topic: str) -> int:
    with Admin(cluster.bootstrap) as admin:
        return admin.describe_topic(topic).partitions[0].leader


def _full_isr(cluster: LocalCluster, topic: str) -> bool:
    with Admin(cluster.bootstrap) as admin:
        return len(admin.describe_topic(topic).partitions[0].isr) == 3


def _read_committed(cluster: LocalCluster, topic: str) -> list[bytes | None]:
    """Every value a read_committed consumer sees in partition 0, up to its end."""
    tp = TopicPartition(topic, 0)
    values: list[bytes | None] = []
    with Consumer(
        cluster.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    ) as c:
        c.assign([tp])
        c.seek_to_beginning([tp])
        end = c.end_offsets([tp])[tp]

        def read() -> bool:
            values.extend(r.value for r in c.poll(timeout_ms=200))
            return c.position(tp) >= end

        wait_for(read, timeout=60, what=f"{topic} read to {end}")
    return values


def test_an_abort_after_a_batch_that_may_have_been_written_gets_a_new_epoch(
    three_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """The reviewer's repro: a record of the transaction is acknowledged, the leader is
    paused (SIGSTOP) until the next record expires "may have been written" and another
    node leads (so that record is not in the log and its sequence can never be followed
    under this epoch), the commit fails and the transaction is aborted; the next
    transactions commit, and read_committed sees each committed record once and none of
    the aborted ones."""
    cluster = three_node_cluster
    topic = new_topic(cluster, 1, 3, {"min.insync.replicas": "2"})
    wait_for(lambda: _full_isr(cluster, topic), timeout=60, what="a full ISR")
    with Producer(
        cluster.bootstrap,
        transactional_id=f"bump-{topic}",
        linger_ms=0,
        delivery_timeout_ms=1500,
        request_timeout_ms=1000,
    ) as p:
        p.init_transactions()
        with p.transaction():
            p.send(topic, b"t0").result(timeout=30)
        p.begin_transaction()
        p.send(topic, b"t1-first").result(timeout=30)
        paused = _leader(cluster, topic)
        process = cluster.node(paused).process
        assert process is not None
        process.signal(signal.SIGSTOP)
        try:
            with pytest.raises(StromError, match="may have been written"):
                p.send(topic, b"t1-lost").result(timeout=30)
            wait_for(
                lambda: _leader(cluster, topic) not in (paused, -1),
                timeout=60,
                what="another node leading the partition",
            )
        finally:
            process.signal(signal.SIGCONT)
        with pytest.raises(StromError):
            p.commit_transaction(30)
        p.abort_transaction(60)
        committed = []
        for i in range(2, 6):
            value = f"t{i}".encode()
            with p.transaction(60):
                p.send(topic, value).result(timeout=30)
            committed.append(value)
    assert _read_committed(cluster, topic) == [b"t0", *committed]


def test_a_newer_instance_still_fences_a_producer_whose_batch_failed(
    three_node_cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """A failed batch makes the abort ask for a new epoch of the same producer id; once a
    second instance of the transactional id has initialised it, the first one's abort is
    refused (ProducerFencedError) instead of bumping the epoch past the new instance's, and
    the new instance goes on. A record larger than the topic's max.message.bytes is the
    failed batch (refused by its leader)."""
    cluster = three_node_cluster
    topic = new_topic(cluster, 1, 1, {"max.message.bytes": "4096"})
    tid = f"fence-{topic}"
    with Producer(cluster.bootstrap, transactional_id=tid, linger_ms=0) as first:
        first.init_transactions()
        # The bump after a failed batch keeps the producer going...
        first.begin_transaction()
        with pytest.raises(MessageTooLargeError):
            first.send(topic, b"x" * 20_000).result(timeout=30)
        first.abort_transaction(60)
        with first.transaction(60):
            first.send(topic, b"first-ok").result(timeout=30)
        # ... but not past a newer instance.
        first.begin_transaction()
        first.send(topic, b"first-aborted").result(timeout=30)
        with pytest.raises(MessageTooLargeError):
            first.send(topic, b"x" * 20_000).result(timeout=30)
        with Producer(cluster.bootstrap, transactional_id=tid, linger_ms=0) as second:
            second.init_transactions(60)
            with pytest.raises(ProducerFencedError):
                first.abort_transaction(60)
            with pytest.raises(ProducerFencedError):
                first.begin_transaction()
            with second.transaction(60):
                second.send(topic, b"second").result(timeout=30)
    assert _read_committed(cluster, topic) == [b"first-ok", b"second"]
