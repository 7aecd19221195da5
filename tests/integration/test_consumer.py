"""The Consumer against a real local cluster (issue: Python clients, the consumer part).

One cluster (etcd, one controller, three storage nodes) serves the whole module; every test
uses its own topics. Test data goes in through raw Produce RPCs (ClusterClient + encode_batch)
so these tests do not depend on the Producer. The leader-failover test SIGKILLs a node, so it
runs last.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pytest

from strom.api import common_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.consumer import (
    CONSUMER_SCHEMA,
    Consumer,
    IllegalStateError,
    NoOffsetForPartitionError,
)
from strom.client.types import OffsetAndTimestamp, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import (
    ConcurrentModificationError,
    InvalidGroupIdError,
    OffsetOutOfRangeError,
    RecordDeserializationError,
    UnknownTopicOrPartitionError,
    is_retriable,
)
from strom.record import Record, encode_batch
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
NONE = common_pb2.ErrorCode.NONE


@pytest.fixture(scope="module")
def cluster(three_node_cluster: LocalCluster) -> LocalCluster:
    # The session's three-node cluster (topics here are named "c-..."; the failover test's
    # killed leader is restarted after it).
    return three_node_cluster


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[ClusterClient]:
    with ClusterClient(cluster.bootstrap, retry_s=20) as client:
        yield client


def produce(
    client: ClusterClient,
    topic: str,
    partition: int,
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]] | None] | None = None,
    timestamps: Sequence[int] | None = None,
) -> int:
    """One batch through the leader with acks=all; returns its base offset."""
    req = storage_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=10_000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=topic,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=partition,
                        records=encode_batch(
                            list(values), keys=keys, headers=headers, timestamps=timestamps
                        ),
                        current_leader_epoch=-1,
                    )
                ],
            )
        ],
    )

    def failed(resp: storage_pb2.ProduceResponse) -> bool:
        code = resp.topics[0].partitions[0].error_code
        return code != NONE and is_retriable(code)

    r = client.with_leader(topic, partition, lambda s: s.Produce(req, timeout=15), failed)
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE, p.error_message
    return p.base_offset


def delete_records(client: ClusterClient, topic: str, partition: int, offset: int) -> int:
    req = storage_pb2.DeleteRecordsRequest(
        timeout_ms=10_000,
        topics=[
            storage_pb2.DeleteRecordsTopic(
                topic=topic,
                partitions=[storage_pb2.DeleteRecordsPartition(partition=partition, offset=offset)],
            )
        ],
    )
    r = client.with_leader(
        topic,
        partition,
        lambda s: s.DeleteRecords(req, timeout=15),
        lambda resp: is_retriable(resp.topics[0].partitions[0].error_code),
    )
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE, p.error_message
    return p.low_watermark


def drain(consumer: Consumer, n: int, timeout: float = 15.0) -> list[Record]:
    """Poll until ``n`` records arrived (and check nothing more is pending right away)."""
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} records after {timeout}s"
        out.extend(consumer.poll(timeout_ms=200))
    assert len(out) == n, f"expected {n} records, got {len(out)}"
    return out


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


# -- reading ----------------------------------------------------------------------------------


def test_assign_and_poll_read_everything_in_order(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    create_topic(cluster, "c-order", partitions=2)
    expected: dict[int, list[Record]] = {0: [], 1: []}
    for p, batches in ((0, 3), (1, 2)):
        for b in range(batches):
            vs = values(f"p{p}b{b}", 50)
            keys = [f"k{i}".encode() if i % 2 else None for i in range(50)]
            hdrs = [[("h", f"{i}".encode())] if i % 3 == 0 else None for i in range(50)]
            base = produce(admin, "c-order", p, vs, keys=keys, headers=hdrs)
            for i, v in enumerate(vs):
                h = (("h", f"{i}".encode()),) if i % 3 == 0 else ()
                expected[p].append(Record(keys[i], v, h, -1, base + i, "c-order", p))
    tps = [TopicPartition("c-order", 0), TopicPartition("c-order", 1)]
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_poll_records=70) as consumer:
        consumer.assign(tps)
        assert consumer.assignment() == set(tps)
        got = drain(consumer, 250)
        assert all(len(batch) <= 70 for batch in [got[i : i + 70] for i in range(0, 250, 70)])
        for p in (0, 1):
            mine = [r for r in got if r.partition == p]
            assert [r.offset for r in mine] == list(range(len(expected[p])))  # in order, all
            assert [(r.key, r.value, r.headers, r.offset, r.topic) for r in mine] == [
                (e.key, e.value, e.headers, e.offset, e.topic) for e in expected[p]
            ]
            assert all(r.timestamp > 0 for r in mine)
        assert consumer.position(tps[0]) == 150 and consumer.position(tps[1]) == 100
        assert consumer.highwater(tps[0]) == 150
        assert consumer.poll(timeout_ms=50) == []
        # Records produced while the consumer waits at the end arrive through the long poll.
        produce(admin, "c-order", 1, [b"late"])
        (late,) = drain(consumer, 1)
        assert (late.partition, late.offset, late.value) == (1, 100, b"late")


def test_deserializers_turn_bytes_into_objects_and_a_failing_one_loses_nothing(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    """kafka-python's key_deserializer / value_deserializer (the consumer had none: found
    from outside). A record the deserializer refuses is named (RecordDeserializationError)
    with the position at it, the records before it are delivered, and skipping it with a
    seek loses nothing else."""
    create_topic(cluster, "c-deser", partitions=2)
    produce(admin, "c-deser", 0, [b"1", b"2", b"oops", b"4"], keys=[b"a", None, b"c", b"d"])
    produce(admin, "c-deser", 1, [b"10", b"20"])
    tps = [TopicPartition("c-deser", 0), TopicPartition("c-deser", 1)]
    with Consumer(
        cluster.bootstrap,
        auto_offset_reset="earliest",
        key_deserializer=bytes.decode,
        value_deserializer=int,
    ) as consumer:
        consumer.assign(tps)
        got: list[Record] = []
        with pytest.raises(RecordDeserializationError) as failed:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                got.extend(consumer.poll(timeout_ms=200))
        err = failed.value
        assert (err.topic, err.partition, err.offset) == ("c-deser", 0, 2)
        assert "oops" in str(err.__cause__)
        assert consumer.position(tps[0]) == 2  # at the refused record
        consumer.seek(tps[0], err.offset + 1)
        got.extend(drain(consumer, 6 - len(got) - 1))
    assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == [
        (0, 0, "a", 1),
        (0, 1, None, 2),
        (0, 3, "d", 4),
        (1, 0, None, 10),
        (1, 1, None, 20),
    ]
    with pytest.raises(TypeError, match="value_deserializer must be a callable"):
        Consumer(cluster.bootstrap, value_deserializer="utf-8")


def _fetch_threads(consumer: Consumer) -> list[str]:
    """Record the name of the thread making each of ``consumer``'s Fetch calls."""
    names: list[str] = []
    fetcher = consumer._fetcher
    fetch = fetcher._fetch

    def recording(*args: object, **kwargs: object) -> None:
        names.append(threading.current_thread().name)
        fetch(*args, **kwargs)  # type: ignore[arg-type]

    fetcher._fetch = recording  # type: ignore[method-assign]
    return names


@contextlib.contextmanager
def _caught_up(
    cluster: LocalCluster, admin: ClusterClient, topic: str, n: int
) -> Iterator[Consumer]:
    """A consumer of ``topic``-0 (made with ``n`` records) that has read them all and whose
    partition is therefore held for its own fetch in the next poll that waits."""
    create_topic(cluster, topic)
    produce(admin, topic, 0, values("a", n))
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        assert [r.offset for r in drain(consumer, n)] == list(range(n))
        assert consumer.poll(timeout_ms=100) == []  # caught up: the partition is held
        yield consumer


def test_a_waiting_poll_fetches_on_its_own_thread(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    # Caught up, a poll that waits long-polls the leader itself (no hand-off from a fetch
    # thread); records produced one at a time meanwhile all arrive, once, in order.
    with _caught_up(cluster, admin, "c-inline", 5) as consumer:
        threads = _fetch_threads(consumer)
        got: list[Record] = []
        for i in range(20):
            produce(admin, "c-inline", 0, [f"b-{i}".encode()])
            got.extend(drain(consumer, 1))
        assert [r.value for r in got] == values("b", 20)
        assert [r.offset for r in got] == list(range(5, 25))
        assert threads, "no fetch was made"
        me = threading.current_thread().name
        assert all(name == me for name in threads), f"fetched by workers: {set(threads) - {me}}"


def test_a_poll_that_never_waits_still_gets_caught_up_partitions(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    # A partition held for the application's own fetch must not starve a consumer that
    # then only polls with timeout 0: such a poll hands it back to the fetch threads.
    with _caught_up(cluster, admin, "c-nowait", 3) as consumer:
        produce(admin, "c-nowait", 0, values("b", 4))
        got: list[Record] = []
        wait_for(
            lambda: bool(got.extend(consumer.poll(timeout_ms=0))) or len(got) >= 4,
            timeout=10,
            what="poll(0) to return the records produced after catching up",
        )
        assert [r.offset for r in got] == list(range(3, 7))
        assert [r.value for r in got] == values("b", 4)


def test_an_exception_in_a_polls_own_fetch_leaves_the_partition_fetchable(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    # A KeyboardInterrupt (or any exception) raised inside the Fetch a poll makes itself
    # reaches the caller; the partition is not left "in flight" for ever: polling goes on.
    with _caught_up(cluster, admin, "c-inlineexc", 2) as consumer:
        fetcher = consumer._fetcher
        real_ask, real_follow = fetcher._ask, fetcher._follow_answer

        def interrupted(*args: object) -> bytes:
            fetcher._ask = real_ask  # type: ignore[method-assign]  # once
            fetcher._follow_answer = real_follow  # type: ignore[method-assign]
            raise KeyboardInterrupt

        # (The poll's own fetch follows: storage.proto, FetchRequest.follow.)
        fetcher._ask = interrupted  # type: ignore[method-assign]
        fetcher._follow_answer = interrupted  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            consumer.poll(timeout_ms=5000)
        assert fetcher._follow is None  # ended: its answer may have been taken
        produce(admin, "c-inlineexc", 0, values("b", 3))
        assert [r.value for r in drain(consumer, 3)] == values("b", 3)


def test_close_ends_a_poll_blocked_in_its_own_fetch(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    create_topic(cluster, "c-closeinline")
    tp = TopicPartition("c-closeinline", 0)
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=60_000)
    consumer.assign([tp])
    # The first fetch is a fetch thread's (parked for up to a minute); a record ends it, and
    # from then on the caught-up partition is left to the polling thread.
    assert consumer.poll(timeout_ms=100) == []
    produce(admin, "c-closeinline", 0, [b"first"])
    assert [r.value for r in drain(consumer, 1)] == [b"first"]
    threads = _fetch_threads(consumer)
    result: list[list[Record]] = []

    def poll() -> None:
        result.append(consumer.poll(timeout_ms=60_000))

    t = threading.Thread(target=poll, name="long-poller", daemon=True)
    t.start()
    wait_for(lambda: "long-poller" in threads, timeout=10, what="the poll to fetch itself")
    started = time.monotonic()
    consumer.close()
    t.join(10)
    assert not t.is_alive(), "close() did not end the poll blocked in its own Fetch"
    assert time.monotonic() - started < 10
    assert result == [[]]


def test_a_second_thread_inside_the_consumer_is_refused(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    """A Consumer is for one thread, as Kafka's (ConcurrentModificationException): a second
    thread entering poll/commit/seek/assign... while a first is inside gets
    ConcurrentModificationError at once (found from outside: four threads polling one
    consumer got thousands of records twice, skipped offsets, and an IndexError from the
    fetcher). close() from another thread still ends a blocked poll."""
    create_topic(cluster, "c-threads")
    tp = TopicPartition("c-threads", 0)
    for i in range(10):
        produce(admin, "c-threads", 0, values(f"b{i}", 2000))
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_poll_records=50)
    consumer.assign([tp])
    got: list[int] = []
    refused: list[ConcurrentModificationError] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while len(got) < 20_000 and not errors:
            try:
                got.extend(r.offset for r in consumer.poll(timeout_ms=100))
            except ConcurrentModificationError as exc:
                refused.append(exc)
            except BaseException as exc:  # (reported below)
                errors.append(exc)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(got) == list(range(20_000))  # none twice, none skipped
    assert refused and "another thread" in str(refused[0])

    # One thread blocked inside poll(): the others are refused, close() is not.
    blocked: list[list[Record]] = []
    t = threading.Thread(target=lambda: blocked.append(consumer.poll(timeout_ms=60_000)))
    t.start()
    wait_for(lambda: consumer._owner != 0, timeout=10, what="the poll to begin")
    for call in (
        lambda: consumer.poll(),
        lambda: consumer.seek(tp, 0),
        lambda: consumer.position(tp),
        lambda: consumer.assign([tp]),
        lambda: consumer.pause([tp]),
        lambda: next(iter(consumer)),
    ):
        with pytest.raises(ConcurrentModificationError, match="in use by another thread"):
            call()
    consumer.close()
    t.join(10)
    assert not t.is_alive() and blocked == [[]]


def test_iteration_blocks_for_records_and_stops_on_close(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    create_topic(cluster, "c-iter")
    produce(admin, "c-iter", 0, values("a", 30))
    tp = TopicPartition("c-iter", 0)
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    consumer.assign([tp])
    seen: list[int] = []
    for rec in consumer:
        seen.append(rec.offset)
        if len(seen) == 30:
            break
    assert seen == list(range(30))
    assert produce(admin, "c-iter", 0, values("b", 10)) == 30
    for rec in consumer:  # leaving early puts the position back to the first unseen record
        assert rec.offset == 30
        break
    assert consumer.position(tp) == 31
    assert next(consumer).offset == 31
    consumer.seek(tp, 35)  # a seek wins over what the iterator had already polled
    assert next(consumer).offset == 35
    consumer.seek(tp, 40)

    # A blocked iteration ends when another thread closes the consumer.
    done = threading.Event()

    def iterate() -> None:
        for _ in consumer:
            pass
        done.set()

    t = threading.Thread(target=iterate, daemon=True)
    t.start()
    produce(admin, "c-iter", 0, [b"last"])
    # (position() is the consumer's thread's, as every call that reads or moves positions:
    # from this thread it would raise ConcurrentModificationError while the loop polls)
    wait_for(
        lambda: consumer._fetcher.position(tp) == 41, timeout=5, what="the iterator to catch up"
    )
    consumer.close()
    assert done.wait(5), "iteration did not stop on close()"
    t.join(5)
    with pytest.raises(IllegalStateError, match="closed"):
        consumer.poll()


def test_poll_arrow_equals_poll(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-arrow", partitions=2)
    for p in (0, 1):
        for b in range(3):
            produce(
                admin,
                "c-arrow",
                p,
                values(f"{p}-{b}", 40),
                keys=[b"k%d" % i for i in range(40)],
                headers=[[("n", b"%d" % i)] if i % 2 else None for i in range(40)],
            )
    tps = [TopicPartition("c-arrow", p) for p in (0, 1)]
    with (
        Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c1,
        Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c2,
    ):
        c1.assign(tps)
        c2.assign(tps)
        records = drain(c1, 240)
        tables = []
        deadline = time.monotonic() + 15
        while sum(t.num_rows for t in tables) < 240:
            assert time.monotonic() < deadline
            tables.append(c2.poll_arrow(timeout_ms=200, max_records=50))
            assert tables[-1].num_rows <= 50
            assert tables[-1].schema.equals(CONSUMER_SCHEMA)
        table = pa.concat_tables(tables)
        assert table.num_rows == 240
        from_arrow = sorted(
            (
                r["partition"],
                r["offset"],
                r["key"],
                r["value"],
                tuple((h["key"], h["value"]) for h in r["headers"] or ()),
                int(r["timestamp"].timestamp() * 1000),
                r["topic"],
            )
            for r in table.to_pylist()
        )
        from_poll = sorted(
            (r.partition, r.offset, r.key, r.value, r.headers, r.timestamp, r.topic)
            for r in records
        )
        assert from_arrow == from_poll

        # Both ways may be mixed: they share the position.
        c1.seek(tps[0], 10)
        first = c1.poll(timeout_ms=5000, max_records=5)
        assert [r.offset for r in first if r.partition == 0][:1] == [10]
        c1.pause([tps[1]])
        rest = c1.poll_arrow(timeout_ms=5000)
        offsets = rest.column("offset").to_pylist()
        assert offsets[0] == c1.position(tps[0]) - len(offsets)
        assert c1.position(tps[0]) == 120
        assert c1.poll_arrow().num_rows == 0


# -- positions --------------------------------------------------------------------------------


def test_seek_and_positions(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-seek")
    for b in range(4):
        produce(admin, "c-seek", 0, values(f"b{b}", 25))
    tp = TopicPartition("c-seek", 0)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_poll_records=10) as c:
        c.assign([tp])
        assert c.position(tp) == 0
        assert [r.offset for r in c.poll(5000)] == list(range(10))
        # Seeking into the middle of a batch skips the batch's head; buffered data from before
        # the seek is never returned after it.
        c.seek(tp, 37)
        assert c.position(tp) == 37
        got = drain(c, 63)
        assert [r.offset for r in got] == list(range(37, 100))
        c.seek_to_beginning()
        assert c.position(tp) == 0
        assert c.poll(5000)[0].offset == 0
        c.seek_to_end([tp])
        assert c.position(tp) == 100
        assert c.poll(timeout_ms=50) == []
        c.seek(tp, 99)
        assert [r.offset for r in c.poll(5000)] == [99]


def test_beginning_and_end_offsets_after_delete_records(
    admin: ClusterClient, cluster: LocalCluster
) -> None:
    create_topic(cluster, "c-delete")
    for b in range(3):
        produce(admin, "c-delete", 0, values(f"b{b}", 20))
    tp = TopicPartition("c-delete", 0)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 60}
        assert delete_records(admin, "c-delete", 0, 25) == 25
        assert c.beginning_offsets([tp]) == {tp: 25}
        assert c.end_offsets([tp]) == {tp: 60}
        c.assign([tp])
        got = drain(c, 35)
        assert [r.offset for r in got] == list(range(25, 60))


def test_offsets_for_times(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-times")
    base = 1_700_000_000_000
    for b in range(3):
        produce(admin, "c-times", 0, values(f"b{b}", 10), timestamps=[base + 1000 * b] * 10)
    tp = TopicPartition("c-times", 0)
    with Consumer(cluster.bootstrap) as c:
        found = c.offsets_for_times({tp: base + 1500})
        assert found == {tp: OffsetAndTimestamp(20, base + 2000)}
        assert c.offsets_for_times({tp: 0}) == {tp: OffsetAndTimestamp(0, base)}
        assert c.offsets_for_times({tp: base + 10_000}) == {tp: None}
        c.assign([tp])
        c.seek(tp, found[tp].offset)
        assert c.poll(5000)[0].timestamp == base + 2000


def test_pause_and_resume(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-pause", partitions=2)
    for p in (0, 1):
        produce(admin, "c-pause", p, values(f"p{p}", 20))
    p0, p1 = TopicPartition("c-pause", 0), TopicPartition("c-pause", 1)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([p0, p1])
        c.pause([p0])
        assert c.paused() == {p0}
        got = drain(c, 20)
        assert {r.partition for r in got} == {1}
        assert c.poll(timeout_ms=100) == []
        c.resume([p0])
        assert c.paused() == set()
        got = drain(c, 20)
        assert {r.partition for r in got} == {0}
        assert [r.offset for r in got] == list(range(20))


def test_auto_offset_reset(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-reset")
    produce(admin, "c-reset", 0, values("old", 30))
    tp = TopicPartition("c-reset", 0)
    with (
        Consumer(cluster.bootstrap) as latest,
        Consumer(cluster.bootstrap, auto_offset_reset="earliest") as earliest,
        Consumer(cluster.bootstrap, auto_offset_reset="none") as none,
    ):
        for c in (latest, earliest, none):
            c.assign([tp])
        assert latest.position(tp) == 30  # the default is "latest"
        assert earliest.position(tp) == 0
        with pytest.raises(NoOffsetForPartitionError, match="auto_offset_reset='none'"):
            none.poll()
        produce(admin, "c-reset", 0, values("new", 5))
        assert [r.value for r in drain(latest, 5)] == values("new", 5)
        assert len(drain(earliest, 35)) == 35
        none.seek(tp, 33)
        assert [r.offset for r in drain(none, 2)] == [33, 34]

        # OFFSET_OUT_OF_RANGE (the records are gone): the policy decides.
        assert delete_records(admin, "c-reset", 0, 20) == 20
        for c in (latest, earliest, none):
            c.seek(tp, 5)
        assert [r.offset for r in drain(earliest, 15)] == list(range(20, 35))
        assert latest.poll(timeout_ms=300) == []
        assert latest.position(tp) == 35
        with pytest.raises(OffsetOutOfRangeError, match="out of range") as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                none.poll(timeout_ms=200)
        assert info.value.partitions == {tp: 5}  # type: ignore[attr-defined]
        with pytest.raises(OffsetOutOfRangeError):  # sticky until the application seeks
            none.poll()
        none.seek(tp, 34)
        assert [r.offset for r in drain(none, 1)] == [34]


# -- errors -----------------------------------------------------------------------------------


def test_clear_errors_for_bad_arguments(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-args", partitions=2)
    tp = TopicPartition("c-args", 0)
    with pytest.raises(ValueError, match="auto_offset_reset"):
        Consumer(cluster.bootstrap, auto_offset_reset="smallest")
    with pytest.raises(ValueError, match="read_committed"):
        Consumer(cluster.bootstrap, isolation_level="committed")
    with Consumer(cluster.bootstrap) as c:
        assert "c-args" in c.topics()
        assert c.partitions_for_topic("c-args") == {0, 1}
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
            c.partitions_for_topic("no-such-topic")
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
            c.assign([TopicPartition("no-such-topic", 0)])
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 2"):
            c.assign([TopicPartition("c-args", 2)])
        with pytest.raises(ValueError, match="partition must be >= 0"):
            c.assign([TopicPartition("c-args", -1)])
        with pytest.raises(TypeError):
            c.assign("c-args")  # type: ignore[arg-type]
        with pytest.raises(IllegalStateError, match="no partitions"):
            c.poll()
        with pytest.raises(UnknownTopicOrPartitionError):
            c.end_offsets([TopicPartition("no-such-topic", 0)])
        with pytest.raises(IllegalStateError, match="not assigned"):
            c.seek(tp, 0)
        c.assign([tp])
        with pytest.raises(ValueError, match="offset must be >= 0"):
            c.seek(tp, -1)
        with pytest.raises(ValueError, match=r"offset must be .*<= 9223372036854775807 .*int64"):
            c.seek(tp, 2**63)
        with pytest.raises(IllegalStateError, match="not assigned"):
            c.pause([TopicPartition("c-args", 1)])
        with pytest.raises(IllegalStateError, match="not assigned"):
            c.position(TopicPartition("c-args", 1))
        with pytest.raises(ValueError, match=">= 0"):
            c.offsets_for_times({tp: -5})
        with pytest.raises(ValueError, match="timeout_ms"):
            c.poll(timeout_ms=-1)
        with pytest.raises(ValueError, match="max_records"):
            c.poll(max_records=0)
        with pytest.raises(InvalidGroupIdError, match="group_id"):
            c.subscribe(["c-args"])
        with pytest.raises(InvalidGroupIdError, match="group_id"):
            c.commit()
        with pytest.raises(InvalidGroupIdError, match="group_id"):
            c.committed(tp)
    with pytest.raises(IllegalStateError, match="closed"):
        c.poll()
    with pytest.raises(IllegalStateError, match="closed"):
        c.assign([tp])


# -- leader failover (kills a node: keep it last) ---------------------------------------------


def test_consuming_across_a_leader_failover(admin: ClusterClient, cluster: LocalCluster) -> None:
    create_topic(cluster, "c-failover", replication_factor=3, config={"min.insync.replicas": "2"})
    tp = TopicPartition("c-failover", 0)

    def state() -> tuple[int, list[int]]:
        p = admin.metadata(["c-failover"]).topics[0].partitions[0]
        return p.leader, sorted(p.isr)

    wait_for(lambda: len(state()[1]) == 3, timeout=20, what="a full ISR")
    for b in range(10):
        produce(admin, "c-failover", 0, values(f"before{b}", 20))
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_poll_records=50) as c:
        c.assign([tp])
        got = drain(c, 200)
        assert c.poll(timeout_ms=100) == []  # parked in a long poll on the leader now
        leader, _ = state()
        cluster.node(leader).process.kill()  # SIGKILL
        for b in range(10):  # routed to the new leader once it is elected
            produce(admin, "c-failover", 0, values(f"after{b}", 20))
        got += drain(c, 200, timeout=30)
        assert state()[0] not in (leader, -1)
    assert [r.offset for r in got] == list(range(400))  # no gap, no duplicate
    assert [r.value for r in got] == [v for b in range(10) for v in values(f"before{b}", 20)] + [
        v for b in range(10) for v in values(f"after{b}", 20)
    ]


def test_a_partition_without_a_leader_does_not_stop_the_others(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: with one partition's only replica down, a consumer assigned it
    and the healthy ones (``auto_offset_reset='earliest'``, nothing committed) printed
    nothing: every poll's offset lookup waited for the offline partition's leader and then
    raised LeaderNotAvailableError, throwing away the positions found for the others. Kafka's
    consumer reads the healthy partitions and keeps asking for the missing leader; so does
    this one, and it reads the offline partition too once its node is back."""
    two = make_cluster(nodes=2, controllers=1)
    topic = create_topic(two, "c-half-offline", partitions=2)
    with ClusterClient(two.bootstrap) as client:
        leaders = {p.partition: p.leader for p in client.topic_metadata(topic).partitions}
        assert sorted(leaders.values()) == [1, 2], leaders  # one partition on each node
        for p in (0, 1):
            produce(client, topic, p, values(f"p{p}-", 20))
    down = two.node(leaders[0])
    down.process.stop()  # partition 0's only replica
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    with Consumer(two.bootstrap, auto_offset_reset="earliest", request_timeout_ms=60_000) as c:
        c.assign(tps)
        got = drain(c, 20, timeout=30)
        assert {r.partition for r in got} == {1}
        assert [r.value for r in got] == values("p1-", 20)
        down.start()
        got = drain(c, 20, timeout=60)
        assert [r.value for r in got] == values("p0-", 20)
