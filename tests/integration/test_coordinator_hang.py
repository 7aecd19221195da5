"""Clients whose coordinator hangs (SIGSTOP: alive, connected, silent) go on with the one
that takes its shards over, within their request timeouts.

Found from outside, on a dev cluster with two coordinators: the coordinator owning a
transactional id or a group was SIGSTOPped, and another took its shards over within ~3 s,
but the clients kept asking the hung one:

- a transactional producer spent AddPartitionsToTxn's whole budget on one attempt there, and
  the abort that followed was refused by the new owner (INVALID_TXN_STATE, COMPLETE_COMMIT:
  it had never seen the transaction), leaving the producer in abortable error for good;
- a group member's commit() and committed() each spent request_timeout_ms on one attempt
  there, the next call went there again, and a rebalance waited ~60 s.

Each test stops the owning coordinator (found with FindCoordinator, as the clients find it)
and resumes it in a ``finally``; clients use request timeouts of a few seconds.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from strom import Consumer, Producer, TopicPartition
from strom.api import storage_pb2
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.errors import RequestTimedOutError
from tests.conftest import TopicFactory, coordinator_of, coordinator_owning, module_cluster

pytestmark = pytest.mark.integration

#: The clients' request_timeout_ms, in seconds: what a hang may cost them at most, once.
REQUEST_TIMEOUT_S = 4.0
TXN = storage_pb2.COORDINATOR_TYPE_TRANSACTION
GROUP = storage_pb2.COORDINATOR_TYPE_GROUP

cluster = module_cluster(
    nodes=1,
    controllers=1,
    coordinators=2,
    coordinator_args=[
        "--group-heartbeat-interval-ms",
        "200",
        "--group-session-timeout-ms",
        "20000",
        "--offsets-partitions",
        "2",
        "--transaction-state-partitions",
        "2",
    ],
)
HEALED_CLUSTERS = ("cluster",)


@contextmanager
def _hung_owner(cluster: LocalCluster, key: str, key_type: int) -> Iterator[Member]:
    """SIGSTOP the coordinator owning ``key`` for the block (once the shards are settled);
    SIGCONT when the block ends."""
    member = coordinator_owning(cluster, key, key_type)
    assert member.process is not None
    member.process.signal(signal.SIGSTOP)
    try:
        yield member
    finally:
        member.process.signal(signal.SIGCONT)


def _wait_taken_over(cluster: LocalCluster, key: str, key_type: int, hung: Member) -> None:
    wait_for(
        lambda: coordinator_of(cluster, key, key_type) != hung.address,
        timeout=30,
        what=f"another coordinator owning {key!r}",
    )


def _read_committed(cluster: LocalCluster, topic: str, partitions: int, want: int) -> list[bytes]:
    """Every value of ``topic`` a read_committed consumer sees: polled until ``want`` came
    and the consumer stands at every partition's LSO (or 30 s passed). Why not up to the LSO
    read once: EndTxn answers once the decision is logged and the markers follow (Kafka's
    rule), so right after the last commit its records may not be visible yet (CI)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(
        cluster.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
    ) as c:
        c.assign(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out.extend(r.value for r in c.poll(timeout_ms=200))
            if len(out) >= want:
                ends = c.end_offsets(tps)
                if all(c.position(tp) >= ends[tp] for tp in tps):
                    break
        return sorted(out)


def test_a_transaction_goes_on_at_the_coordinator_that_took_over(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """AddPartitionsToTxn's first attempt, at the cached coordinator that hangs, ends after
    request_timeout_ms; the retry finds the new owner, and the transaction commits."""
    topic = new_topic(cluster, partitions=2)
    tid = f"hang-goes-on-{topic}"
    with Producer(
        cluster.bootstrap,
        transactional_id=tid,
        request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
    ) as p:
        p.init_transactions()
        with p.transaction():
            p.send(topic, b"before", partition=0)
        with _hung_owner(cluster, tid, TXN) as hung:
            assert p._txn is not None and p._txn._coordinator == hung.address
            _wait_taken_over(cluster, tid, TXN, hung)
            # The old client spent AddPartitionsToTxn's whole budget on the hung one and
            # failed here with RequestTimedOutError.
            with p.transaction():
                p.send(topic, b"during", partition=1)
        with p.transaction():
            p.send(topic, b"after", partition=0)
    assert _read_committed(cluster, topic, 2, 3) == [b"after", b"before", b"during"]


def test_an_abort_of_a_transaction_that_never_reached_a_coordinator_succeeds(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """The reviewer's wedge: AddPartitionsToTxn got no answer from the coordinator that hung
    (here its budget, the batch's delivery_timeout_ms, allows one attempt), so the transaction
    failed; its abort reaches the new owner, which never saw the transaction and answers
    INVALID_TXN_STATE (its last transaction committed). That abort succeeds: the producer
    goes on, and read_committed sees exactly the committed transactions."""
    topic = new_topic(cluster, partitions=1)
    tid = f"hang-abort-{topic}"
    with Producer(
        cluster.bootstrap,
        transactional_id=tid,
        request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
        delivery_timeout_ms=1500,
    ) as p:
        p.init_transactions()
        with p.transaction():
            p.send(topic, b"committed before", partition=0)
        with _hung_owner(cluster, tid, TXN) as hung:
            p.begin_transaction()
            p.send(topic, b"never added", partition=0)
            with pytest.raises(RequestTimedOutError, match="AddPartitionsToTxn"):
                p.commit_transaction()
            _wait_taken_over(cluster, tid, TXN, hung)
            p.abort_transaction()  # at the new owner, which never saw the transaction
            with p.transaction():
                p.send(topic, b"committed during", partition=0)
        with p.transaction():
            p.send(topic, b"committed after", partition=0)
    assert _read_committed(cluster, topic, 1, 3) == [
        b"committed after",
        b"committed before",
        b"committed during",
    ]


def test_group_calls_and_a_rebalance_go_on_at_the_coordinator_that_took_over(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """commit() and committed() at a cached coordinator that hangs give up on it within
    half of request_timeout_ms and ask the new owner; a member joining meanwhile gets its
    partitions without waiting on the hung coordinator, and no record is read twice."""
    topic = new_topic(cluster, partitions=2)
    group = f"hang-{topic}"
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Producer(cluster.bootstrap) as producer:
        for i in range(20):
            producer.send(topic, b"%d" % i, partition=i % 2)
        producer.flush(30)
    timeout_ms = int(REQUEST_TIMEOUT_S * 1000)
    seen: Counter[tuple[int, int]] = Counter()

    def consumer() -> Consumer:
        return Consumer(
            cluster.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            request_timeout_ms=timeout_ms,
        )

    def poll(c: Consumer) -> None:
        records = c.poll(timeout_ms=100)
        seen.update((r.partition, r.offset) for r in records)
        if records:
            c.commit()

    with consumer() as a, consumer() as reader:
        a.subscribe([topic])
        wait_for(lambda: poll(a) or len(a.assignment()) == 2, timeout=30, what="A's partitions")
        wait_for(lambda: poll(a) or sum(seen.values()) == 20, timeout=30, what="20 records")
        a.commit()
        reader.committed(tps)  # (the reader, never a member, now knows the coordinator)
        with _hung_owner(cluster, group, GROUP) as hung:
            _wait_taken_over(cluster, group, GROUP, hung)
            # Each failed with RequestTimedOutError at the hung one before (its one attempt
            # took the whole request timeout); no wall-clock bound here (a loaded machine).
            committed = reader.committed(tps)
            assert {tp: om.offset for tp, om in committed.items()} == {tps[0]: 10, tps[1]: 10}
            a.commit()
            with consumer() as b:
                b.subscribe([topic])

                def split() -> bool:
                    poll(a)
                    poll(b)
                    return len(a.assignment()) == 1 and len(b.assignment()) == 1

                wait_for(split, timeout=60, what="A and B a partition each")
                assert not set(a.assignment()) & set(b.assignment())
                with Producer(cluster.bootstrap) as producer:
                    for i in range(20, 40):
                        producer.send(topic, b"%d" % i, partition=i % 2)
                wait_for(
                    lambda: split() and sum(seen.values()) >= 40,
                    timeout=30,
                    what="the next 20 records",
                )
        # Resumed, the old coordinator is stale: nothing is stuck on it.
        wait_for(lambda: poll(a) or True, timeout=5, what="a poll")
        a.commit()
    assert len(seen) == 40 and max(seen.values()) == 1, "a record was read twice"


def test_a_group_call_that_gets_no_answer_is_a_timeout_naming_the_coordinator(
    cluster: LocalCluster, new_topic: TopicFactory
) -> None:
    """With no coordinator answering in time, committed() raises RequestTimedOutError
    (retriable) naming the coordinator, not a bare StromError; the next call asks the
    coordinator that took over, not the hung one again."""
    topic = new_topic(cluster, partitions=1)
    group = f"hang-named-{topic}"
    tp = TopicPartition(topic, 0)
    with Consumer(cluster.bootstrap, group_id=group, request_timeout_ms=1000) as c:
        assert c.committed(tp) is None
        with _hung_owner(cluster, group, GROUP) as hung:
            with pytest.raises(RequestTimedOutError, match=hung.address) as raised:
                c.committed(tp)  # (1 s: before another coordinator can take over)
            assert raised.value.retriable
            _wait_taken_over(cluster, group, GROUP, hung)
            assert c.committed(tp) is None
