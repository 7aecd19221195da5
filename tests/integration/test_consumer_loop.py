"""The Consumer's iteration (``for record in consumer`` / ``next(consumer)``) mixed with the
calls an application makes from the loop's body: pause/resume, position, poll, commit, and
close with a rebalance listener. Real cluster (the session's one-node cluster, with its group
coordinator); every test uses its own topic and group."""

from __future__ import annotations

import pytest

from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def _records(cluster: LocalCluster, topic: str, partitions: int, n: int) -> list[TopicPartition]:
    """``topic`` with ``n`` records in each of its ``partitions``."""
    create_topic(cluster, topic, partitions)
    with Producer(cluster.bootstrap) as producer:
        for p in range(partitions):
            producer.send_batch(topic, [b"r%d" % i for i in range(n)], partition=p).result(10)
    return [TopicPartition(topic, p) for p in range(partitions)]


def _fetched(consumer: Consumer, tps: list[TopicPartition], n: int) -> None:
    """Wait until the fetcher holds all ``n`` records of each partition, so the first poll
    returns them all (the cases below need records behind the one in hand)."""
    for tp in tps:
        consumer.position(tp)
    wait_for(
        lambda: all(consumer.highwater(tp) == n for tp in tps),
        timeout=10,
        what="the records to be fetched",
    )


def _consumer(cluster: LocalCluster, group: str) -> Consumer:
    # consumer_timeout_ms only so that a regression (records never coming back) ends the loop.
    return Consumer(
        cluster.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )


def test_pausing_the_partition_in_hand_inside_the_loop_loses_nothing(
    one_node_cluster: LocalCluster,
) -> None:
    """pause() + resume() of the record's own partition in the loop's body: the records of
    the poll behind it come again after resume, and neither position() nor a commit skips
    them (found from outside: the loop got offsets 0-2 of 10, position() said 10)."""
    (tp,) = _records(one_node_cluster, "loop-pause-self", 1, 10)
    with _consumer(one_node_cluster, "loop-pause-self") as c:
        c.assign([tp])
        _fetched(c, [tp], 10)
        seen, at_pause = [], None
        for r in c:
            seen.append(r.offset)
            if r.offset == 2:
                c.pause([tp])
                c.commit()
                at_pause = (c.position(tp), c.committed(tp).offset)
                c.resume([tp])
            if len(seen) == 10:
                break
        assert at_pause == (3, 3)
        assert seen == list(range(10))


def test_pausing_another_partition_inside_the_loop_loses_nothing(
    one_node_cluster: LocalCluster,
) -> None:
    """Pausing the other partition at the first record: a commit then covers none of its
    records (they were not handed out), and they all come after resume (found from outside:
    its position jumped to 10 and the commit wrote 10: ten records lost and committed)."""
    tps = _records(one_node_cluster, "loop-pause-other", 2, 10)
    with _consumer(one_node_cluster, "loop-pause-other") as c:
        c.assign(tps)
        _fetched(c, tps, 10)
        seen: list[tuple[int, int]] = []
        committed = {}
        for r in c:
            seen.append((r.partition, r.offset))
            if len(seen) == 1:
                current, other = tps[r.partition], tps[1 - r.partition]
                c.pause([other])
                c.commit()
                committed = {tp: om.offset for tp, om in c.committed(tps).items()}
                assert c.position(other) == 0
                c.resume([other])
            if len(seen) == 20:
                break
        assert committed == {current: 1, other: 0}
        assert sorted(seen) == [(p, o) for p in (0, 1) for o in range(10)]


def test_a_listener_commits_in_on_partitions_revoked_during_close(
    one_node_cluster: LocalCluster,
) -> None:
    """close() (here ``with``'s exit) runs on_partitions_revoked before the consumer counts
    as closed, as Kafka's does: the listener's commit(), position() and assignment() work
    (found from outside: commit() raised "the consumer is closed", only logged, and nothing
    was committed)."""
    (tp,) = _records(one_node_cluster, "loop-close-listener", 1, 10)
    seen: list[object] = []

    class Listener:
        def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
            try:
                consumer.commit()
                seen.append((parts, consumer.assignment(), consumer.position(tp)))
            except Exception as exc:  # the listener wrapper only logs: keep it for the test
                seen.append(exc)

    with _consumer(one_node_cluster, "loop-close-listener") as consumer:
        consumer.subscribe(["loop-close-listener"], listener=Listener())
        for n, _ in enumerate(consumer, 1):
            if n == 10:
                break
    assert consumer.closed
    assert seen == [([tp], {tp}, 10)]
    with _consumer(one_node_cluster, "loop-close-listener") as check:
        assert check.committed(tp).offset == 10


def test_position_and_poll_inside_an_iteration_agree_with_commit(
    one_node_cluster: LocalCluster,
) -> None:
    """While an iteration hands out a poll's records, position() is after the record in
    hand (what commit() commits), and a poll() made meanwhile starts with the records not
    handed out, the iteration going on after it (found from outside: position() said 10 at
    the first of 10 records, and next(), poll() then returned nothing at position 10 while
    commit() committed 1 and the next next() returned 1)."""
    (tp,) = _records(one_node_cluster, "loop-position", 1, 10)
    with _consumer(one_node_cluster, "loop-position") as c:
        c.assign([tp])
        _fetched(c, [tp], 10)
        assert next(c).offset == 0
        assert c.position(tp) == 1
        c.commit()
        assert c.committed(tp).offset == 1
        got: list[int] = []
        wait_for(
            lambda: got.extend(r.offset for r in c.poll(200)) or len(got) >= 9,
            timeout=10,
            what="the records the iteration had not handed out",
        )
        assert got == list(range(1, 10))
        assert c.position(tp) == 10
        with Producer(one_node_cluster.bootstrap) as producer:
            producer.send("loop-position", b"r10", partition=0).get(10)
        assert next(c).offset == 10  # the iteration goes on after what poll() returned
    with _consumer(one_node_cluster, "loop-position-for") as c:  # the same in a for loop
        c.assign([tp])
        _fetched(c, [tp], 11)
        for r in c:
            assert (r.offset, c.position(tp)) == (0, 1)
            break


def test_position_and_commit_at_every_record_of_a_poll_over_several_partitions(
    one_node_cluster: LocalCluster,
) -> None:
    """At every record of a poll spanning three partitions, position() of each partition is
    its count of records handed out so far (the offsets are contiguous from 0), and a
    commit made there covers exactly those: the per-partition index position() and commit()
    bisect (they scanned the rest of the poll on every call before, O(n^2) per poll) agrees
    with the records handed out, whichever partition the record in hand belongs to."""
    tps = _records(one_node_cluster, "loop-every", 3, 40)
    with _consumer(one_node_cluster, "loop-every") as c:
        c.assign(tps)
        _fetched(c, tps, 40)
        handed = dict.fromkeys(tps, 0)
        for r in c:
            handed[TopicPartition(r.topic, r.partition)] += 1
            assert {tp: c.position(tp) for tp in tps} == handed
            if sum(handed.values()) in (1, 41, 119):
                c.commit()
                assert {tp: c.committed(tp).offset for tp in tps} == handed
            if sum(handed.values()) == 120:
                break
        assert handed == dict.fromkeys(tps, 40)
