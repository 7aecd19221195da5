"""An idempotent producer whose batch failed while its followers were paused (SIGSTOP) goes
on writing, and every record it reports written is at the offset it reports.

Found from outside:

- a batch the leader appended (answered NOT_ENOUGH_REPLICAS_AFTER_APPEND or timed out, then
  refused NOT_ENOUGH_REPLICAS on its retries) expired and was reported "not sent"; its
  sequence went to the next batch, which the leader took for a retry of it and answered
  with its offset: that record was reported written and was nowhere in the log;
- after a batch refused NOT_ENOUGH_REPLICAS failed, every later batch of the partition was
  refused OUT_OF_ORDER_SEQUENCE for good.

Real etcd, controller and storage nodes as processes; waits are on conditions.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import pytest

from strom import Consumer, Producer, RecordMetadata, TopicPartition
from strom.client.admin import Admin
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import NotEnoughReplicasError, StromError
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


Where = tuple[int, int]  # (partition, offset)


def _isr(cluster: LocalCluster, topic: str, partition: int = 0) -> tuple[int, tuple[int, ...]]:
    with Admin(cluster.bootstrap) as admin:
        p = admin.describe_topic(topic).partitions[partition]
    return p.leader, tuple(sorted(p.isr))


def _topic(cluster: LocalCluster, name: str, partitions: int = 1) -> str:
    create_topic(cluster, name, partitions, 3, {"min.insync.replicas": "2"})
    for p in range(partitions):
        wait_for(lambda p=p: len(_isr(cluster, name, p)[1]) == 3, timeout=30, what="full ISRs")
    return name


def _where(md: RecordMetadata) -> Where:
    return md.partition, md.offset


@contextmanager
def _followers_paused(cluster: LocalCluster, topic: str) -> Iterator[list[int]]:
    """Both followers stopped (SIGSTOP) for the block; after it, resumed and back in sync."""
    leader, isr = _isr(cluster, topic)
    followers = [n for n in isr if n != leader]
    for n in followers:
        cluster.node(n).process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        yield followers
    finally:
        for n in followers:
            cluster.node(n).process.signal(signal.SIGCONT)  # type: ignore[union-attr]
    wait_for(lambda: len(_isr(cluster, topic)[1]) >= 2, timeout=60, what="the ISR back")


def _wait_until_the_leader_refuses(cluster: LocalCluster, topic: str) -> None:
    """Wait until the leader itself refuses a batch before appending it (NOT_ENOUGH_REPLICAS).

    The controller's ISR (what describe shows) can be ahead of the leader's: followers whose
    session ran out leave the ISR in etcd, and the leader applies that from its watch a
    moment later; a batch sent in between is appended and fails as "may have been written"
    (a CI run). Probes come from another producer: their records are not the test's."""

    def refused() -> bool:
        try:
            probe.send(topic, b"probe").result(timeout=30)
        except NotEnoughReplicasError:
            return True
        except StromError:
            return False  # appended, then not committed in time: the leader's ISR was full
        return False

    with Producer(
        cluster.bootstrap,
        acks="all",
        linger_ms=0,
        retries=0,
        delivery_timeout_ms=1500,
        request_timeout_ms=1000,
    ) as probe:
        wait_for(refused, timeout=60, what="the leader refusing for want of replicas")


def _log(cluster: LocalCluster, topic: str, partitions: int = 1) -> dict[Where, bytes | None]:
    """(partition, offset) -> value of every record of the topic."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[Where, bytes | None] = {}
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps)
        c.seek_to_beginning(tps)
        ends = c.end_offsets(tps)

        def read() -> bool:
            out.update(((r.partition, r.offset), r.value) for r in c.poll(timeout_ms=200))
            return all(c.position(tp) >= ends[tp] for tp in tps)

        wait_for(read, timeout=30, what=f"{topic} read to {ends}")
    return out


def _check(
    log: dict[Where, bytes | None],
    written: dict[bytes, Where],
    failed: dict[bytes, BaseException],
) -> None:
    """Every record reported written is at its offset, once; one reported failed is absent
    unless its error says it may have been written. A retry the leader took for one of a
    batch written before its last five (DUPLICATE_SEQUENCE: design §4) is reported written
    with its offset unknown, -1 (as Kafka's producer reports such a duplicate): once too."""
    values = list(log.values())
    for value, (partition, offset) in written.items():
        if offset != -1:
            assert log.get((partition, offset)) == value, (value, offset, log)
        else:
            assert value in values, (value, log)
        assert values.count(value) == 1, (value, log)
    for value, err in failed.items():
        if value in values:
            assert "may have been written" in str(err), (value, err, log)
            assert values.count(value) == 1, (value, log)


def test_an_appended_batch_that_expires_never_gives_its_sequence_away(
    three_node_cluster: LocalCluster,
) -> None:
    cluster = three_node_cluster
    topic = _topic(cluster, "epoch-expired")
    written: dict[bytes, Where] = {}
    failed: dict[bytes, BaseException] = {}
    with Producer(
        cluster.bootstrap,
        acks="all",
        linger_ms=0,
        delivery_timeout_ms=5000,
        request_timeout_ms=2000,
    ) as p:
        written[b"warm"] = _where(p.send(topic, b"warm").result(timeout=30))
        with _followers_paused(cluster, topic):
            # The leader appends A, then cannot commit it: the answer is a timeout or
            # NOT_ENOUGH_REPLICAS_AFTER_APPEND, its retries NOT_ENOUGH_REPLICAS, and it
            # expires while waiting for the next one.
            with pytest.raises(StromError) as a_failed:
                p.send(topic, b"A").result(timeout=60)
            failed[b"A"] = a_failed.value
        for value in (b"B", b"C"):  # the producer goes on, each at its own offset
            written[value] = _where(p.send(topic, value).result(timeout=60))
    log = _log(cluster, topic)
    _check(log, written, failed)
    assert b"A" in log.values()  # it was appended: the error must not say otherwise
    assert "may have been written" in str(failed[b"A"])


@pytest.mark.parametrize("retries", [0, None], ids=["retries=0", "default-retries"])
def test_a_batch_refused_before_append_does_not_stop_the_partition(
    three_node_cluster: LocalCluster, retries: int | None
) -> None:
    cluster = three_node_cluster
    topic = _topic(cluster, f"epoch-refused-{retries}")
    written: dict[bytes, Where] = {}
    failed: dict[bytes, BaseException] = {}
    extra = {} if retries is None else {"retries": retries}
    with Producer(
        cluster.bootstrap,
        acks="all",
        linger_ms=0,
        delivery_timeout_ms=3000,
        request_timeout_ms=2000,
        **extra,
    ) as p:
        written[b"warm"] = _where(p.send(topic, b"warm").result(timeout=30))
        with _followers_paused(cluster, topic) as followers:
            wait_for(
                lambda: not set(followers) & set(_isr(cluster, topic)[1]),
                timeout=60,
                what="the ISR below min.insync.replicas",
            )
            _wait_until_the_leader_refuses(cluster, topic)
            futures = {v: p.send(topic, v) for v in (b"A1", b"A2", b"A3")}
            for value, future in futures.items():
                with pytest.raises(StromError) as refused:
                    future.result(timeout=60)
                failed[value] = refused.value
            if retries == 0:
                assert isinstance(failed[b"A1"], NotEnoughReplicasError)
        for value in (b"B", b"C", b"D"):
            written[value] = _where(p.send(topic, value).result(timeout=60))
    log = _log(cluster, topic)
    _check(log, written, failed)
    assert not {b"A1", b"A2", b"A3"} & set(log.values())  # refused before any append


@pytest.mark.parametrize("partitions", [1, 3])
def test_records_sent_through_an_outage_are_where_they_are_reported(
    three_node_cluster: LocalCluster, partitions: int
) -> None:
    """A steady stream, several small batches in flight, while both followers of partition
    0 pause long enough for batches to expire (with 3 partitions they lead the others: those
    move, or get no answer); then the stream goes on."""
    cluster = three_node_cluster
    topic = _topic(cluster, f"epoch-stream-{partitions}", partitions)
    sent: list[tuple[bytes, Future[RecordMetadata]]] = []
    stop = threading.Event()
    p = Producer(
        cluster.bootstrap,
        acks="all",
        linger_ms=0,
        batch_size=256,  # a few records a batch: several batches in flight
        delivery_timeout_ms=4000,
        request_timeout_ms=1500,
    )

    def pump() -> None:
        i = 0
        while not stop.is_set():
            if len(sent) >= 100:  # at most 100 records unanswered
                with contextlib.suppress(Exception):
                    sent[-100][1].exception(timeout=30)
            sent.append((b"r%06d" % i, p.send(topic, b"r%06d" % i)))
            i += 1

    def outcomes(start: int = 0) -> tuple[int, int]:
        done = [f for _, f in sent[start:] if f.done()]
        failed = sum(1 for f in done if f.exception() is not None)
        return len(done) - failed, failed

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        wait_for(lambda: outcomes()[0] >= 200, timeout=60, what="records acknowledged")
        with _followers_paused(cluster, topic):
            start = len(sent)
            wait_for(lambda: outcomes(start)[1] >= 1, timeout=60, what="records failing")
        resumed = len(sent)
        wait_for(lambda: outcomes(resumed)[0] >= 200, timeout=60, what="records written again")
    finally:
        stop.set()
        thread.join(timeout=60)
        p.close(timeout=60)
    written = {v: _where(f.result()) for v, f in sent if f.exception() is None}
    failed = {v: f.exception() for v, f in sent if f.exception() is not None}
    assert failed  # the outage did fail some
    _check(_log(cluster, topic, partitions), written, failed)  # type: ignore[arg-type]


def test_a_transactional_producer_never_reuses_the_sequence_of_an_aborted_batch(
    three_node_cluster: LocalCluster,
) -> None:
    """A transaction's batch is appended, then expires (followers paused); the transaction
    aborts; the next transaction's record must be in the log where it is reported."""
    cluster = three_node_cluster
    topic = _topic(cluster, "epoch-txn")
    written: dict[bytes, Where] = {}
    failed: dict[bytes, BaseException] = {}
    with Producer(
        cluster.bootstrap,
        transactional_id="epoch-txn",
        linger_ms=0,
        delivery_timeout_ms=5000,
        request_timeout_ms=2000,
    ) as p:
        p.init_transactions()
        p.begin_transaction()
        written[b"pre"] = _where(p.send(topic, b"pre").result(timeout=30))  # partition added
        with _followers_paused(cluster, topic):
            with pytest.raises(StromError) as a_failed:
                p.send(topic, b"A").result(timeout=60)
            failed[b"A"] = a_failed.value
        with pytest.raises(StromError):
            p.commit_transaction()
        p.abort_transaction()
        with p.transaction():
            b = p.send(topic, b"B")
        written[b"B"] = _where(b.result(timeout=30))
    log = _log(cluster, topic)
    _check(log, written, failed)
    assert b"A" in log.values() and "may have been written" in str(failed[b"A"])
