"""A consumer's blocking calls end within their own time (Kafka's ``default.api.timeout.ms``
and the ``Duration`` of ``commitSync``, ``committed``, ``position``, ``endOffsets`` …).

Each test SIGSTOPs the process the call needs (the group coordinator, a partition's leader)
and schedules its SIGCONT at several times the call's timeout: the call must have ended, with
a retriable error naming what did not answer, while the process was still stopped (before,
every call waited ``request_timeout_ms``, 30 s, whatever the caller's own deadline was).
Nothing here measures speed: "ended while still stopped" is the behaviour.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from strom.client import Producer
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.errors import RequestTimedOutError, StromError
from tests.conftest import create_topic

TIMEOUT_MS = 1500


@contextmanager
def stopped(process: Any, resume_after_s: float) -> Iterator[threading.Event]:
    """``process`` SIGSTOPped; SIGCONT after ``resume_after_s`` or on leaving. The event is
    set when the timer resumed it (the call under test outlasted its timeout by far)."""
    resumed = threading.Event()

    def resume() -> None:
        resumed.set()
        process.signal(signal.SIGCONT)

    process.signal(signal.SIGSTOP)
    timer = threading.Timer(resume_after_s, resume)
    timer.start()
    try:
        yield resumed
    finally:
        timer.cancel()
        process.signal(signal.SIGCONT)


def _ends_while_stopped(process: Any, call: Callable[[], Any]) -> BaseException:
    """Run ``call`` with ``process`` stopped; it must raise before the timer resumes it."""
    with stopped(process, 5 * TIMEOUT_MS / 1000) as resumed:
        with pytest.raises(StromError) as info:
            call()
        assert not resumed.is_set(), "the call waited until the process was resumed"
    assert info.value.retriable, info.value
    return info.value


@pytest.fixture
def cluster(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    """Two nodes (one stays up to answer metadata) and one coordinator, with topic ``t``:
    two partitions of 10 records each. The coordinator's shard lease outlives the tests'
    pauses (back to back, 1.5 s each, against the default 2 s TTL it could expire between
    them under load: then the lookup, not the coordinator, is what does not answer)."""
    cluster = make_cluster(
        nodes=2, controllers=1, coordinators=1, coordinator_args=["--session-timeout-s", "10"]
    )
    create_topic(cluster, "t", partitions=2)
    with Producer(cluster.bootstrap) as producer:
        for p in (0, 1):
            producer.send_batch("t", [b"x"] * 10, partition=p).result(30)
    return cluster


def test_commit_and_committed_end_within_their_timeout_with_the_coordinator_stopped(
    cluster: LocalCluster,
) -> None:
    """commit(timeout_ms) and committed(timeout_ms) raise RequestTimedOutError while the
    coordinator is still stopped; once it runs again the same consumer commits and reads
    the offset back (the timed-out commit either landed or not: never a wrong offset)."""
    tp = TopicPartition("t", 0)
    coordinator = cluster.coordinators[0].process
    assert coordinator is not None
    with Consumer(cluster.bootstrap, group_id="g-commit", enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(3)})  # the coordinator found and working
        err = _ends_while_stopped(
            coordinator,
            lambda: consumer.commit({tp: OffsetAndMetadata(5)}, timeout_ms=TIMEOUT_MS),
        )
        assert isinstance(err, RequestTimedOutError), err
        err = _ends_while_stopped(
            coordinator, lambda: consumer.committed(tp, timeout_ms=TIMEOUT_MS)
        )
        assert isinstance(err, RequestTimedOutError), err
        assert "coordinator" in str(err)
        # Running again: the next calls (default timeout) go through.
        seen = consumer.committed(tp)
        assert seen is not None and seen.offset in (3, 5)
        consumer.commit({tp: OffsetAndMetadata(7)})
        seen = consumer.committed(tp)
        assert seen is not None and seen.offset == 7


def test_default_api_timeout_bounds_a_commit_and_a_position_lookup(cluster: LocalCluster) -> None:
    """``default_api_timeout_ms`` is the bound of calls given no timeout of their own: a
    commit, and position() of a partition whose start is its group's committed offset."""
    tp = TopicPartition("t", 1)
    coordinator = cluster.coordinators[0].process
    assert coordinator is not None
    with Consumer(
        cluster.bootstrap, group_id="g-default", default_api_timeout_ms=TIMEOUT_MS
    ) as consumer:
        assert consumer.config["default_api_timeout_ms"] == TIMEOUT_MS
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(4)})
        err = _ends_while_stopped(coordinator, lambda: consumer.commit({tp: OffsetAndMetadata(6)}))
        assert isinstance(err, RequestTimedOutError), err
    with Consumer(cluster.bootstrap, group_id="g-default") as fresh:
        fresh.assign([tp])
        # The position comes from the group's committed offset: the coordinator must answer.
        err = _ends_while_stopped(coordinator, lambda: fresh.position(tp, timeout_ms=TIMEOUT_MS))
        assert "t-1" in str(err), err
        assert fresh.position(tp) in (4, 6)  # running again: the committed offset


def test_offset_lookups_end_within_their_timeout_with_the_leader_stopped(
    cluster: LocalCluster,
) -> None:
    """end_offsets / beginning_offsets / offsets_for_times with the partition's leader
    stopped raise while it is stopped; a lookup of the other node's partition answers."""
    client = ClusterClient(cluster.bootstrap)
    try:
        leader0 = client.leader_of("t", 0)
        leader1 = client.leader_of("t", 1)
    finally:
        client.close()
    stopped_tp = TopicPartition("t", 0)
    # Both on one node: nothing to compare against.
    other = None if leader0 == leader1 else TopicPartition("t", 1)
    node = next(n for n in cluster.nodes if n.address == leader0).process
    assert node is not None
    with Consumer(cluster.bootstrap) as consumer:
        assert consumer.end_offsets([stopped_tp]) == {stopped_tp: 10}  # metadata cached
        _ends_while_stopped(node, lambda: consumer.end_offsets([stopped_tp], timeout_ms=TIMEOUT_MS))
        _ends_while_stopped(
            node, lambda: consumer.beginning_offsets([stopped_tp], timeout_ms=TIMEOUT_MS)
        )
        _ends_while_stopped(
            node, lambda: consumer.offsets_for_times({stopped_tp: 0}, timeout_ms=TIMEOUT_MS)
        )
        if other is not None:
            assert consumer.end_offsets([other], timeout_ms=TIMEOUT_MS) == {other: 10}
        assert consumer.end_offsets([stopped_tp]) == {stopped_tp: 10}  # running again


#: Bad ``timeout_ms`` values, the error each gets and the words it says.
BAD_TIMEOUTS: list[tuple[Any, type[Exception], str]] = [
    ("1000", TypeError, "timeout_ms must be a number"),
    (True, TypeError, "timeout_ms must be a number"),
    (float("nan"), TypeError, "timeout_ms must be a number"),
    (-1, ValueError, "timeout_ms must be >= 0"),
]


def test_a_bad_timeout_is_refused_naming_the_call_and_nothing_is_sent(
    cluster: LocalCluster,
) -> None:
    """A bad ``timeout_ms`` is refused before anything is sent, naming the call. (One test
    over the bad values: each case of a parametrized one started a cluster of its own.)"""
    tp = TopicPartition("t", 0)
    with Consumer(cluster.bootstrap, group_id="g-bad", enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        calls: list[tuple[str, Callable[[Any], Any]]] = [
            ("commit()", lambda t: consumer.commit({tp: OffsetAndMetadata(2)}, timeout_ms=t)),
            ("committed()", lambda t: consumer.committed(tp, timeout_ms=t)),
            ("position()", lambda t: consumer.position(tp, timeout_ms=t)),
            ("end_offsets()", lambda t: consumer.end_offsets([tp], timeout_ms=t)),
            ("beginning_offsets()", lambda t: consumer.beginning_offsets([tp], timeout_ms=t)),
            ("offsets_for_times()", lambda t: consumer.offsets_for_times({tp: 0}, timeout_ms=t)),
        ]
        for bad, error, words in BAD_TIMEOUTS:
            for name, call in calls:
                with pytest.raises(error, match=words) as info:
                    call(bad)
                assert name in str(info.value), (bad, name)
        assert consumer.committed(tp) is None  # the refused commit sent nothing
    for bad_default in (0, -5, "60000", 1.5):
        with pytest.raises((TypeError, ValueError), match="default_api_timeout_ms"):
            Consumer(cluster.bootstrap, default_api_timeout_ms=bad_default)
