"""Every record an idempotent producer reports written across a leader failover reports its
real offset: the new leader answers a retry of a batch older than the last five it remembers
of the producer with the offsets of that batch, found in its log by the batch header
(``Log._find_older_batch``, design §6).

Found from outside: after a failover, records were acknowledged with offset -1 (30 of
192,100, even with max_in_flight=1): one request carried many batches of a partition, the
new leader had more than five of them, and the retries of the older ones were answered
DUPLICATE_SEQUENCE, with no offsets (195 of some 250 records here, before the fix).

Real etcd, controller and storage nodes as processes; waits are on conditions.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from strom import Consumer, Producer, RecordMetadata, TopicPartition
from strom.client.admin import Admin
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def _partition(cluster: LocalCluster, topic: str) -> tuple[int, list[int]]:
    with Admin(cluster.bootstrap) as admin:
        p = admin.describe_topic(topic).partitions[0]
    return p.leader, list(p.isr)


def _log(cluster: LocalCluster, topic: str) -> dict[int, bytes | None]:
    """offset -> value of every record of partition 0."""
    tp = TopicPartition(topic, 0)
    out: dict[int, bytes | None] = {}
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek_to_beginning([tp])
        end = c.end_offsets([tp])[tp]

        def read() -> bool:
            out.update((r.offset, r.value) for r in c.poll(timeout_ms=200))
            return c.position(tp) >= end

        wait_for(read, timeout=60, what=f"{topic} read to {end}")
    return out


def test_records_acknowledged_across_a_failover_report_their_offsets(
    make_cluster: object, tmp_path: Path
) -> None:
    """A producer of one-record batches (linger 0, max_in_flight 5) keeps sending bursts
    (each of which one request could carry whole) while a
    follower is paused (SIGSTOP: it stays in the ISR for a while, so nothing is committed
    and the batches pile up unanswered, though the other follower copies them), then the
    leader is killed and that follower takes over with every batch the producer is
    retrying. Each acknowledged record must report the offset that holds it."""
    cluster = make_cluster(nodes=3, controllers=1, coordinators=0)  # type: ignore[operator]
    topic = create_topic(cluster, "failover-offsets", 1, 3, {"min.insync.replicas": "1"})
    wait_for(lambda: len(_partition(cluster, topic)[1]) == 3, timeout=60, what="a full ISR")
    leader, isr = _partition(cluster, topic)
    paused, successor = (n for n in isr if n != leader)
    sent: list[tuple[bytes, Future[RecordMetadata]]] = []
    stop = threading.Event()
    with Producer(
        cluster.bootstrap,
        acks="all",
        linger_ms=0,
        batch_size=1,  # (one record a batch)
        max_in_flight=5,
        delivery_timeout_ms=180_000,
        request_timeout_ms=5000,
    ) as p:

        def produce() -> None:
            i = 0
            while not stop.is_set():
                for _ in range(50):  # a burst: many batches ready at once, for one request
                    value = b"r%06d" % i
                    sent.append((value, p.send(topic, value)))
                    i += 1
                time.sleep(0.05)  # pacing: bursts, not a flood of the buffer

        def unanswered() -> int:
            return sum(1 for _, f in list(sent) if not f.done())

        sender = threading.Thread(target=produce, daemon=True)
        sender.start()
        try:
            wait_for(lambda: sum(f.done() for _, f in list(sent)) >= 50, timeout=60, what="acks")
            cluster.node(paused).process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
            try:
                wait_for(lambda: unanswered() >= 200, timeout=30, what="unanswered records")
                cluster.node(leader).process.kill()  # type: ignore[union-attr]
                stop.set()  # (one-record batches: the backlog is what there is to answer)
                wait_for(
                    lambda: _partition(cluster, topic)[0] == successor,
                    timeout=90,
                    what=f"node {successor} leading",
                )
            finally:
                cluster.node(paused).process.signal(signal.SIGCONT)  # type: ignore[union-attr]
            cluster.node(leader).start()
            cluster.wait_serving(cluster.node(leader), timeout=60)
            wait_for(lambda: unanswered() == 0, timeout=180, what="every record answered")
        finally:
            stop.set()
            sender.join(timeout=30)
        p.flush(60)
    acked = {v: f.result() for v, f in sent if f.exception() is None}
    assert len(acked) == len(sent), [f.exception() for _, f in sent if f.exception()][:3]
    unknown = [v for v, md in acked.items() if md.offset < 0]
    assert not unknown, f"{len(unknown)} acknowledged records report offset -1: {unknown[:5]}"
    log = _log(cluster, topic)
    wrong = {v: md.offset for v, md in acked.items() if log.get(md.offset) != v}
    assert not wrong, f"{len(wrong)} records are not at the offset reported: {list(wrong)[:5]}"
    assert sorted(log.values()) == sorted(acked)  # each once
