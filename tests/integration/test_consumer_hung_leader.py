"""Consumers when a partition leader hangs (SIGSTOP: a long GC pause or a network partition
looks the same from outside) while a producer writes on, against real processes.

Found from outside: the controller moved the hung node's partitions within ~2 s and the
producer wrote to the new leaders at once, but a consumer's Fetch in flight to the hung node
(a long poll) waited out ``fetch_max_wait_ms + request_timeout_ms`` (~31 s) before the
partitions were fetched from their new leader; assigned, group and strom.aio consumers alike.
Now a Fetch unanswered ``OVERDUE_GRACE_S`` past its wait has its partitions' leaders looked
up again, and the partitions that moved are fetched from the new leader at once.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from strom import aio
from strom.client.admin import Admin
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import FAST_GROUPS, create_topic, module_cluster, paused

pytestmark = pytest.mark.integration

cluster = module_cluster(nodes=3, controllers=1, coordinators=1, coordinator_args=FAST_GROUPS)
HEALED_CLUSTERS = ("cluster",)

PARTITIONS = 6
#: The consumer's default request timeout (30 s): the old code stalled for all of it.
REQUEST_TIMEOUT_MS = 30_000
#: Generous for a loaded, shared machine, and far below the old ~31 s.
RESUMED_WITHIN_S = 12.0


@contextmanager
def live_producer(bootstrap: str, topic: str) -> Iterator[None]:
    """A producer writing to every partition of ``topic`` every few ms until the block ends
    (a short request timeout, as the reviewer's, so that it moves to a new leader fast)."""
    stop = threading.Event()

    def run() -> None:
        with Producer(
            bootstrap, acks="all", linger_ms=5, request_timeout_ms=3000, delivery_timeout_ms=60000
        ) as producer:
            seq = 0
            while not stop.is_set():
                for p in range(PARTITIONS):
                    producer.send(topic, b"%d:%d" % (p, seq), partition=p)
                seq += 1
                stop.wait(0.02)
            producer.flush(60)

    thread = threading.Thread(target=run, name="live-producer", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(90)


@dataclass
class LiveReader:
    """A consumer polling on a thread of its own (``poll`` gets one poll's records), and the
    offsets it read, per partition, in the order it read them."""

    poll: Callable[[], list[Any]]
    offsets: dict[int, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                records = self.poll()
                with self.lock:
                    for r in records:
                        self.offsets.setdefault(r.partition, []).append(r.offset)
        except BaseException as exc:
            self.error = exc

    def last(self, partition: int) -> int:
        """The last offset of ``partition`` read (-1: none yet); raises what the poll did."""
        if self.error is not None:
            raise AssertionError(f"the consumer's poll failed: {self.error!r}")
        with self.lock:
            seen = self.offsets.get(partition)
            return seen[-1] if seen else -1


@contextmanager
def _read_live(
    poll: Callable[[], Any], close: Callable[[], None], name: str
) -> Iterator[LiveReader]:
    """``poll`` called by a LiveReader on a thread of its own until the block ends, then
    ``close``; the reader's own failure fails the test."""
    reader = LiveReader(poll)
    thread = threading.Thread(target=reader.run, name=name, daemon=True)
    thread.start()
    try:
        yield reader
    finally:
        reader.stop.set()
        thread.join(30)
        close()
    assert reader.error is None, reader.error


def reading(consumer: Consumer) -> AbstractContextManager[LiveReader]:
    """``consumer`` read by a LiveReader until the block ends; closed then."""
    return _read_live(lambda: consumer.poll(timeout_ms=500), consumer.close, "live-reader")


@contextmanager
def reading_aio(consumer: aio.Consumer, tps: list[TopicPartition]) -> Iterator[LiveReader]:
    """``consumer`` (strom.aio) assigned ``tps`` and read by a LiveReader, on an event loop
    of the reader's thread, until the block ends; closed then."""
    loop = asyncio.new_event_loop()
    loop.run_until_complete(consumer.assign(tps))

    def close() -> None:
        loop.run_until_complete(consumer.close())
        loop.close()

    def poll() -> Any:
        return loop.run_until_complete(consumer.poll(timeout_ms=500))

    with _read_live(poll, close, "live-aio-reader") as reader:
        yield reader


def leaders(admin: Admin, topic: str) -> dict[int, int | None]:
    return {p.partition: p.leader for p in admin.describe_topic(topic).partitions}


def assert_in_order(reader: LiveReader, ends: dict[int, int]) -> None:
    """Every partition read from offset 0 to its end, each offset once, in order."""
    with reader.lock:
        for p in range(PARTITIONS):
            seen = reader.offsets.get(p, [])
            assert seen == list(range(ends[p])), (p, ends[p], _describe(seen))


def _describe(seen: list[int]) -> str:
    breaks = [(a, b) for a, b in itertools.pairwise(seen) if b != a + 1]
    return f"{len(seen)} records, first {seen[:1]}, breaks {breaks[:5]}"


def run_through_a_hung_leader(
    cluster: LocalCluster, topic: str, read: AbstractContextManager[LiveReader]
) -> None:
    """Live producer and a consumer reading (``read``); hang the leader of partition 0 and
    check that its partitions are read from their new leaders well before the request
    timeout, then that every record came once, in order."""
    with (
        Admin(cluster.bootstrap) as admin,
        live_producer(cluster.bootstrap, topic),
        read as reader,
    ):
        wait_for(
            lambda: all(reader.last(p) >= 20 for p in range(PARTITIONS)),
            timeout=60,
            what="the consumer reading every partition live",
        )
        old = leaders(admin, topic)
        victim = old[0]
        assert victim is not None
        moved = [p for p, node in old.items() if node == victim]
        with paused(cluster.node(victim)):
            stopped = time.monotonic()
            marks = {p: reader.last(p) for p in moved}
            wait_for(
                lambda: all(leaders(admin, topic)[p] not in (None, victim) for p in moved),
                timeout=30,
                what=f"the controller moving {moved} away from node {victim}",
            )
            # Records appended after the stop can only come from the new leader.
            wait_for(
                lambda: all(reader.last(p) > marks[p] + 10 for p in moved),
                timeout=REQUEST_TIMEOUT_MS / 1000.0 + 15,
                what=f"records of {moved} from their new leaders",
            )
            took = time.monotonic() - stopped
        assert took < RESUMED_WITHIN_S, (
            f"the consumer read {moved} again {took:.1f} s after their leader hung"
        )
    # (the producer flushed as its block ended; the reader closed before)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as tail:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = {tp.partition: off for tp, off in tail.end_offsets(tps).items()}
        tail.assign(tps)
        with reading(tail) as rest:
            wait_for(
                lambda: all(rest.last(p) >= ends[p] - 1 for p in range(PARTITIONS)),
                timeout=60,
                what="a fresh consumer reading everything",
            )
        assert_in_order(rest, ends)
    # The live consumer read in order too, with no gap or duplicate, up to where it stopped.
    with reader.lock:
        for p in range(PARTITIONS):
            seen = reader.offsets.get(p, [])
            assert seen == list(range(len(seen))), (p, _describe(seen))


def test_an_assigned_consumer_leaves_a_hung_leader_for_the_new_one(
    cluster: LocalCluster,
) -> None:
    topic = create_topic(cluster, "hung-cons-assign", partitions=PARTITIONS, replication_factor=3)
    consumer = Consumer(
        cluster.bootstrap, auto_offset_reset="earliest", request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    run_through_a_hung_leader(cluster, topic, reading(consumer))


def test_a_group_consumer_leaves_a_hung_leader_for_the_new_one(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, "hung-cons-group", partitions=PARTITIONS, replication_factor=3)
    consumer = Consumer(
        cluster.bootstrap,
        group_id="hung-cons-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    consumer.subscribe([topic])
    run_through_a_hung_leader(cluster, topic, reading(consumer))


def test_an_aio_consumer_leaves_a_hung_leader_for_the_new_one(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, "hung-cons-aio", partitions=PARTITIONS, replication_factor=3)
    consumer = aio.Consumer(
        cluster.bootstrap, auto_offset_reset="earliest", request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    run_through_a_hung_leader(cluster, topic, reading_aio(consumer, tps))


# -- close() with a Fetch outstanding to a hung leader ----------------------------------

#: The child: a caught-up consumer (its long polls parked at the leader), which closes when
#: told to once the leader hangs, reports the gRPC calls still alive after close(), and
#: returns from its script.
_CLOSING_CHILD = """
import gc, sys, time
import grpc._channel
from strom.client.consumer import Consumer
from strom.client.types import TopicPartition

bootstrap, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Consumer(bootstrap, auto_offset_reset="earliest")
c.assign([TopicPartition(topic, p) for p in range(partitions)])
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not all(
    c.highwater(TopicPartition(topic, p)) is not None for p in range(partitions)
):
    c.poll(timeout_ms=200)
for _ in range(3):
    c.poll(timeout_ms=100)  # caught up: long polls in flight now
print("READY", flush=True)
sys.stdin.readline()  # the leader hangs meanwhile
c.poll(timeout_ms=1500)  # a poll of its own reaching it (and the workers' long polls)
started = time.monotonic()
c.close()
took = time.monotonic() - started
alive = sum(
    1 for o in gc.get_objects() if isinstance(o, grpc._channel._MultiThreadedRendezvous)
)
print(f"CLOSED {took:.2f} {alive}", flush=True)
"""


def test_a_consumer_closes_and_its_process_exits_while_its_leader_hangs(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Seen once from outside: after close() returned (at once) the process never exited,
    its main thread stuck at interpreter shutdown in a gRPC call's ``__del__``: a call
    cancelled by close() was still alive (kept by a reference cycle through its own
    traceback) and was only collected at shutdown, where its lock can be held by a daemon
    thread frozen mid-way. close() must leave no call alive, and the process must exit."""
    topic = create_topic(cluster, "hung-cons-close", partitions=3, replication_factor=3)
    with Producer(cluster.bootstrap) as producer:
        for p in range(3):
            producer.send(topic, b"x", partition=p)
        producer.flush(30)
    with Admin(cluster.bootstrap) as admin:
        victim = leaders(admin, topic)[0]
    assert victim is not None
    script = tmp_path / "closing_child.py"
    script.write_text(_CLOSING_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), cluster.bootstrap, topic, "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY"
        with paused(cluster.node(victim)):
            child.stdin.write("go\n")
            child.stdin.flush()
            closed = child.stdout.readline().split()
            exited_in = time.monotonic()
            code = child.wait(timeout=30)
            exited_in = time.monotonic() - exited_in
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert closed[:1] == ["CLOSED"], closed
    took, alive = float(closed[1]), int(closed[2])
    assert took < 10, took
    assert alive == 0, f"{alive} gRPC calls still alive after close()"
    assert code == 0
    assert exited_in < 10, exited_in
