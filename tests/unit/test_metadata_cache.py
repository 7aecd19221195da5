"""The client's metadata cache (strom.client.metadata) on its own: a scripted metadata source
stands in for the storage nodes (the cache is a pure engine; the clients that use it run
against real clusters in tests/integration)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from strom.api import common_pb2, controller_pb2, storage_pb2
from strom.client.metadata import MetadataCache, PartitionLeader
from strom.client.types import TopicPartition
from strom.errors import (
    BrokerNotAvailableError,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)

NODES = {1: ("h1", 9001), 2: ("h2", 9002)}


def answer(
    topics: dict[str, list[tuple[int, int]]],
    *,
    topic_id: str = "id-1",
    nodes: dict[int, tuple[str, int]] = NODES,
    unknown: Sequence[str] = (),
) -> storage_pb2.MetadataResponse:
    """A Metadata answer: topic -> [(leader node, leader epoch) per partition]."""
    md = storage_pb2.MetadataResponse(cluster_id="c")
    for node_id, (host, port) in nodes.items():
        md.nodes.add(node_id=node_id, host=host, port=port)
    for name, parts in topics.items():
        t = md.topics.add(name=name, topic_id=topic_id)
        for p, (leader, epoch) in enumerate(parts):
            t.partitions.add(partition=p, leader=leader, leader_epoch=epoch)
    for name in unknown:
        md.topics.add(name=name, error_code=common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    return md


class Source:
    """Answers Metadata calls from a script; records what was asked."""

    def __init__(self, reply: Callable[[list[str]], storage_pb2.MetadataResponse]) -> None:
        self.reply = reply
        self.calls: list[tuple[list[str], float | None]] = []
        self.retry_s = 0.5
        #: What the controller has in etcd: topic -> partition count.
        self.controller_topics: dict[str, int] = {}

    def metadata(
        self, topics: Sequence[str] | None = None, *, retry_s: float | None = None, **_: Any
    ) -> storage_pb2.MetadataResponse:
        self.calls.append((list(topics or []), retry_s))
        return self.reply(list(topics or []))

    def controller_call(self, method: str, request: Any) -> Any:
        assert method == "DescribeTopics"
        resp = controller_pb2.DescribeTopicsResponse()
        for name in request.topics:
            if name in self.controller_topics:
                t = resp.topics.add(name=name, error_code=common_pb2.ErrorCode.NONE)
                for p in range(self.controller_topics[name]):
                    t.partitions.add(partition=p)
            else:
                resp.topics.add(
                    name=name, error_code=common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
        return resp


def test_refresh_fills_leaders_counts_and_addresses() -> None:
    src = Source(lambda _: answer({"t": [(1, 3), (2, 4), (7, 1), (-1, 2)]}))
    cache = MetadataCache(src)
    cache.refresh(["t"])
    assert cache.get(TopicPartition("t", 0)) == PartitionLeader(1, "h1:9001", 3)
    assert cache.get(TopicPartition("t", 1)) == PartitionLeader(2, "h2:9002", 4)
    # A leader on a node that is not registered (down), and no leader at all: no address.
    assert cache.get(TopicPartition("t", 2)) == PartitionLeader(7, None, 1)
    assert cache.get(TopicPartition("t", 3)) == PartitionLeader(-1, None, 2)
    assert cache.partition_count("t") == 4
    # The live dicts answer plain (topic, partition) tuples: the producer's hot path.
    assert cache.counts.get("t") == 4
    assert cache.leaders.get(("t", 1)).address == "h2:9002"  # type: ignore[union-attr]
    assert not cache.has_leaders("t")
    # One pass over the nodes, no retry loop: callers keep their own deadlines.
    assert src.calls == [(["t"], 0.0)]


def test_epoch_never_goes_backwards() -> None:
    replies = [answer({"t": [(1, 5)]}), answer({"t": [(2, 3)]})]
    src = Source(lambda _: replies.pop(0))
    cache = MetadataCache(src)
    tp = TopicPartition("t", 0)
    cache.refresh(["t"])
    assert cache.get(tp) == PartitionLeader(1, "h1:9001", 5)
    cache.refresh(["t"])  # a node that has not seen the latest election answers
    assert cache.get(tp) == PartitionLeader(1, "h1:9001", 5)
    # Hints from responses: only a newer epoch is adopted.
    assert not cache.learn(tp, 2, 5, None)
    assert not cache.learn(tp, 2, 4, "h2:9002")
    assert cache.learn(tp, 2, 6, None)  # address from the nodes the cache knows
    assert cache.get(tp) == PartitionLeader(2, "h2:9002", 6)
    # A refresh racing the hint with the older leader does not undo it.
    src.reply = lambda _: answer({"t": [(1, 5)]})
    cache.refresh(["t"])
    assert cache.get(tp) == PartitionLeader(2, "h2:9002", 6)
    # The same epoch again is taken (e.g. the leader's node registered again).
    src.reply = lambda _: answer({"t": [(2, 6)]}, nodes={1: ("h1", 9001)})
    cache.refresh(["t"])
    assert cache.get(tp) == PartitionLeader(2, None, 6)


def test_recreated_topic_starts_afresh_and_deleted_topic_is_forgotten() -> None:
    src = Source(lambda _: answer({"t": [(1, 9), (1, 9)]}))
    cache = MetadataCache(src)
    cache.refresh(["t"])
    # Deleted and created again: a new topic id, epochs from 0, fewer partitions.
    src.reply = lambda _: answer({"t": [(2, 0)]}, topic_id="id-2")
    cache.refresh(["t"])
    assert cache.get(TopicPartition("t", 0)) == PartitionLeader(2, "h2:9002", 0)
    assert cache.get(TopicPartition("t", 1)) is None
    assert cache.partition_count("t") == 1
    src.reply = lambda _: answer({}, unknown=["t"])
    cache.refresh(["t"])
    assert cache.get(TopicPartition("t", 0)) is None
    assert cache.partition_count("t") is None


def test_concurrent_refreshes_of_covered_topics_share_one_call() -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow(topics: list[str]) -> storage_pb2.MetadataResponse:
        entered.set()
        assert release.wait(5)
        return answer({t: [(1, 1)] for t in topics})

    src = Source(slow)
    cache = MetadataCache(src)
    first = threading.Thread(target=cache.refresh, args=(["a", "b"],))
    first.start()
    assert entered.wait(5)
    waiters = [threading.Thread(target=cache.refresh, args=(["a"],)) for _ in range(3)]
    for w in waiters:
        w.start()
    release.set()
    for t in [first, *waiters]:
        t.join(5)
        assert not t.is_alive()
    assert src.calls == [(["a", "b"], 0.0)]
    assert cache.get(TopicPartition("a", 0)) == PartitionLeader(1, "h1:9001", 1)
    # A topic the flight in progress does not cover gets its own call.
    cache.refresh(["c"])
    assert [c for c, _ in src.calls] == [["a", "b"], ["c"]]


def test_waiters_see_the_refresh_error() -> None:
    release = threading.Event()
    entered = threading.Event()

    def failing(_: list[str]) -> storage_pb2.MetadataResponse:
        entered.set()
        assert release.wait(5)
        raise BrokerNotAvailableError("no strom node answered")

    cache = MetadataCache(Source(failing))
    errors: list[BaseException] = []

    def refresh() -> None:
        try:
            cache.refresh(["a"])
        except BrokerNotAvailableError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=refresh)]
    threads[0].start()
    assert entered.wait(5)
    threads.append(threading.Thread(target=refresh))
    threads[1].start()
    release.set()
    for t in threads:
        t.join(5)
    assert len(errors) == 2


def test_stale_topics_refresh_with_exponential_backoff_until_fixed() -> None:
    src = Source(lambda _: answer({"t": [(-1, 1)]}))  # no leader yet (an election)
    cache = MetadataCache(src, backoff_s=0.1, backoff_max_s=0.3)
    cache.refresh_stale(now=0.0)
    assert src.calls == []  # nothing stale
    cache.mark_stale("t")
    times = [0.0, 0.05, 0.11, 0.25, 0.32, 0.55, 0.63, 0.85, 0.94]
    called = []
    for now in times:
        before = len(src.calls)
        cache.refresh_stale(now=now)
        called.append(len(src.calls) > before)
    # Waits 0.1, 0.2, then capped at 0.3 while refreshing finds no leader.
    assert called == [True, False, True, False, True, False, True, False, True]
    assert cache.stale() == {"t"}
    src.reply = lambda _: answer({"t": [(2, 2)]})
    cache.refresh_stale(now=1.3)
    assert cache.stale() == set()
    assert cache.has_leaders("t")
    n = len(src.calls)
    cache.refresh_stale(now=1.32)
    assert len(src.calls) == n
    # Stale again after a success: the backoff starts from its first step again.
    cache.mark_stale("t")
    cache.refresh_stale(now=1.35)
    assert len(src.calls) == n
    cache.refresh_stale(now=1.41)
    assert len(src.calls) == n + 1


def test_failed_stale_refresh_keeps_the_topic_stale() -> None:
    def down(_: list[str]) -> storage_pb2.MetadataResponse:
        raise BrokerNotAvailableError("no strom node answered")

    src = Source(down)
    cache = MetadataCache(src, backoff_s=0.1, backoff_max_s=1.0)
    cache.mark_stale("t")
    cache.refresh_stale(now=0.0)  # does not raise
    assert cache.stale() == {"t"}
    src.reply = lambda _: answer({"t": [(1, 1)]})
    cache.refresh_stale(now=0.05)  # still backing off
    assert len(src.calls) == 1
    cache.refresh_stale(now=0.11)
    assert cache.stale() == set()
    assert len(src.calls) == 2


def test_topic_waits_for_nodes_to_learn_a_topic_the_controller_has() -> None:
    replies = [answer({}, unknown=["new"]), answer({}, unknown=["new"]), answer({"new": [(1, 0)]})]
    src = Source(lambda _: replies.pop(0))
    src.controller_topics = {"new": 1}
    cache = MetadataCache(src)
    entry = cache.topic("new")
    assert entry.name == "new" and len(entry.partitions) == 1
    assert cache.get(TopicPartition("new", 0)) == PartitionLeader(1, "h1:9001", 0)
    # Cached: no call without refresh.
    n = len(src.calls)
    assert cache.topic("new", refresh=False).name == "new"
    assert len(src.calls) == n


def test_unknown_topic_fails_at_once_when_the_controller_lacks_it() -> None:
    src = Source(lambda _: answer({}, unknown=["nope"]))
    cache = MetadataCache(src)
    with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic 'nope'") as info:
        cache.topic("nope")
    assert not info.value.retriable
    assert len(src.calls) == 1


def test_new_partitions_are_waited_for_when_the_controller_has_them() -> None:
    # create_partitions(t, 3) committed; the nodes' watches bring the news a moment later.
    replies = [answer({"t": [(1, 0)]}), answer({"t": [(1, 0)]}), answer({"t": [(1, 0)] * 3})]
    src = Source(lambda _: replies.pop(0))
    src.controller_topics = {"t": 3}
    cache = MetadataCache(src)
    assert cache.count_covering("t", 2) == 3
    assert not replies  # asked the nodes until they knew
    assert cache.counts["t"] == 3
    assert cache.get(TopicPartition("t", 2)) == PartitionLeader(1, "h1:9001", 0)


def test_a_partition_beyond_the_controllers_count_fails_at_once() -> None:
    src = Source(lambda _: answer({"t": [(1, 0)]}))
    src.controller_topics = {"t": 3}
    cache = MetadataCache(src)
    with pytest.raises(
        UnknownTopicOrPartitionError, match="has no partition 5 \\(it has 3\\)"
    ) as info:
        cache.count_covering("t", 5)
    assert not info.value.retriable
    assert len(src.calls) == 1  # no waiting for what cannot come
    with pytest.raises(UnknownTopicOrPartitionError, match="has no partition -1"):
        cache.count_covering("t", -1)


def test_new_partitions_the_nodes_never_learn_fail_retriably_naming_it() -> None:
    src = Source(lambda _: answer({"t": [(1, 0)]}))
    src.controller_topics = {"t": 2}
    src.retry_s = 0.3
    cache = MetadataCache(src)
    with pytest.raises(UnknownTopicOrPartitionError, match="nodes have not learnt it yet") as info:
        cache.count_covering("t", 1)
    assert info.value.retriable
    assert len(src.calls) > 1


def test_leader_of_names_the_problem() -> None:
    src = Source(lambda _: answer({"t": [(1, 1), (-1, 1)]}))
    cache = MetadataCache(src)
    assert cache.leader_of("t", 0) == "h1:9001"
    with pytest.raises(UnknownTopicOrPartitionError, match="has no partition 2 \\(it has 2\\)"):
        cache.leader_of("t", 2)
    n = len(src.calls)
    with pytest.raises(LeaderNotAvailableError, match="t-1 has no live leader"):
        cache.leader_of("t", 1)
    assert len(src.calls) == n + 1  # looked up once more before giving up


def test_cache_without_source_takes_hints_only() -> None:
    cache = MetadataCache(None)
    tp = TopicPartition("t", 0)
    assert cache.learn(tp, 1, 0, "h1:9001")
    assert cache.get(tp) == PartitionLeader(1, "h1:9001", 0)
    with pytest.raises(Exception, match="no cluster"):
        cache.topic("t")


def test_next_refresh_in_tells_the_refresher_when_to_wake() -> None:
    src = Source(lambda _: answer({"t": [(-1, 1)]}))
    cache = MetadataCache(src, backoff_s=0.1, backoff_max_s=1.0)
    assert cache.next_refresh_in(now=0.0) is None  # nothing stale: sleep until marked
    cache.mark_stale("t")
    assert cache.next_refresh_in(now=0.0) <= 0  # type: ignore[operator]
    cache.refresh_stale(now=0.0)
    assert cache.next_refresh_in(now=0.0) == pytest.approx(0.1)
    cache.refresh_stale(now=0.1)
    assert cache.next_refresh_in(now=0.1) == pytest.approx(0.2)


def test_a_topic_the_nodes_do_not_know_stops_being_stale_but_keeps_its_backoff() -> None:
    src = Source(lambda _: answer({}, unknown=["gone"]))
    cache = MetadataCache(src, backoff_s=0.1, backoff_max_s=1.0)
    cache.mark_stale("gone")
    cache.refresh_stale(now=0.0)
    assert cache.stale() == set()  # no endless refreshing of a deleted topic
    cache.mark_stale("gone")  # a user of it marks it again: the backoff goes on growing
    cache.refresh_stale(now=0.05)
    assert len(src.calls) == 1
    cache.refresh_stale(now=0.11)
    assert len(src.calls) == 2
    assert cache.next_refresh_in(now=0.11) is None
    cache.mark_stale("gone")
    assert cache.next_refresh_in(now=0.11) == pytest.approx(0.2)
