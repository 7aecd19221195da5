"""strom.client.commit_queue: one committer's commits in order (issue 9, defect 1).

The queue is driven with a fake ``send`` (the coordinator's part is tested on real processes
in tests/integration/test_commit_order.py): a gate lets a test hold the request in flight, so
what piles up behind it is deterministic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from strom.client.commit_queue import CommitQueue, CommitQueueClosedError
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import RequestTimedOutError, StromError, UnknownTopicOrPartitionError

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class FakeCoordinator:
    """Records every request; ``gate`` (when cleared) holds the next request in flight."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[TopicPartition, int], int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_partitions: set[TopicPartition] = set()
        self.fail_all: StromError | None = None
        self.committed: dict[TopicPartition, int] = {}
        #: The timeout each request was given (0: none, the sender's own).
        self.timeouts: list[float] = []

    def send(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], seq: int, timeout_s: float = 0
    ) -> Mapping:
        self.timeouts.append(timeout_s)
        self.entered.set()
        assert self.gate.wait(10)
        self.requests.append(({tp: om.offset for tp, om in offsets.items()}, seq))
        if self.fail_all is not None:
            raise self.fail_all
        errors: dict[TopicPartition, Any] = {}
        for tp, om in offsets.items():
            if tp in self.fail_partitions:
                errors[tp] = UnknownTopicOrPartitionError(f"{tp}: no such partition")
            else:
                self.committed[tp] = om.offset
        return errors


def _om(offset: int) -> dict[TopicPartition, OffsetAndMetadata]:
    return {A: OffsetAndMetadata(offset)}


def test_a_sync_commit_waits_for_the_async_ones_before_it_and_their_callbacks() -> None:
    fake = FakeCoordinator()
    q = CommitQueue(fake.send)
    fake.gate.clear()
    events: list[Any] = []
    q.commit_async(_om(1), lambda o, e: events.append(("cb", o[A].offset, e)))
    assert fake.entered.wait(5)  # the first request is in flight and held
    for i in range(2, 1002):
        q.commit_async(_om(i), lambda o, e: events.append(("cb", o[A].offset, e)))
    t = threading.Thread(target=lambda: (q.commit(_om(5000), 10), events.append("sync")))
    t.start()
    deadline = time.monotonic() + 10
    while q.queued < 1001 and time.monotonic() < deadline:  # the sync commit joined the queue
        fake.entered.wait(0.001)
    fake.gate.set()
    t.join(10)
    # Every callback ran, in order, before the synchronous commit returned.
    assert events == [("cb", i, None) for i in range(1, 1002)] + ["sync"]
    assert fake.committed[A] == 5000
    # Commits waiting behind the held request went out merged: 1001 commits, 2 requests.
    assert [(r[A], seq) for r, seq in fake.requests] == [(1, 1), (5000, 2)]
    q.close(5)


def test_merged_commits_get_only_their_own_partitions_errors() -> None:
    fake = FakeCoordinator()
    q = CommitQueue(fake.send)
    fake.gate.clear()
    first = q.commit_async(_om(1))
    assert fake.entered.wait(5)
    fake.fail_partitions = {B}
    seen: dict[str, BaseException | None] = {}
    q.commit_async({A: OffsetAndMetadata(2)}, lambda o, e: seen.__setitem__("a", e))
    q.commit_async({B: OffsetAndMetadata(3)}, lambda o, e: seen.__setitem__("b", e))
    last = q.commit_async({A: OffsetAndMetadata(4)})
    fake.gate.set()
    first.result(5)
    last.result(5)
    assert seen["a"] is None
    assert isinstance(seen["b"], UnknownTopicOrPartitionError)
    assert fake.committed == {A: 4}
    q.close(5)


def test_a_whole_request_error_reaches_every_commit_in_it() -> None:
    fake = FakeCoordinator()
    fake.fail_all = StromError("UNKNOWN_MEMBER_ID: fenced")
    q = CommitQueue(fake.send)
    errors: list[BaseException | None] = []
    q.commit_async(_om(1), lambda o, e: errors.append(e))
    with pytest.raises(StromError, match="fenced"):
        q.commit(_om(2), 5)
    assert len(errors) == 1 and "fenced" in str(errors[0])
    q.close(5)


def test_a_sync_commit_that_times_out_in_the_queue_is_never_sent() -> None:
    fake = FakeCoordinator()
    q = CommitQueue(fake.send)
    fake.gate.clear()
    q.commit_async(_om(1))
    assert fake.entered.wait(5)
    with pytest.raises(RequestTimedOutError, match="commit not done within"):
        q.commit(_om(2), 0.05)
    fake.gate.set()
    assert q.flush(5)
    assert [r for r, _ in fake.requests] == [{A: 1}]
    q.close(5)


def test_close_sends_what_is_queued_then_refuses_more() -> None:
    fake = FakeCoordinator()
    q = CommitQueue(fake.send)
    done = [q.commit_async(_om(i)) for i in range(5)]
    q.close(5)
    assert all(d.done() and d.exception() is None for d in done)
    assert fake.committed[A] == 4
    with pytest.raises(CommitQueueClosedError):
        q.commit_async(_om(9))


def test_a_commit_from_a_callback_does_not_wait_on_itself() -> None:
    fake = FakeCoordinator()
    q = CommitQueue(fake.send)
    inner: list[BaseException | None] = []

    def cb(_o: Any, _e: BaseException | None) -> None:
        try:
            q.commit(_om(7), 5)
            inner.append(None)
        except BaseException as exc:  # pragma: no cover - the assertion below shows it
            inner.append(exc)

    q.commit_async(_om(6), cb).result(5)
    assert inner == [None]
    assert fake.committed[A] == 7
    assert [seq for _, seq in fake.requests] == [1, 2]
    q.close(5)


def test_async_commits_linger_until_a_sync_commit_sends_them_merged() -> None:
    """With a linger the first commit goes at once; later asynchronous ones wait (here: a
    minute) and a synchronous commit sends them with itself, in one request, in order."""
    fake = FakeCoordinator()
    q = CommitQueue(fake.send, linger_s=60)
    q.commit_async(_om(1)).result(5)  # nothing before it: not held back by the linger
    events: list[Any] = []
    held = [q.commit_async(_om(i), lambda o, e: events.append(o[A].offset)) for i in range(2, 12)]
    assert q.queued == 10 and not any(f.done() for f in held)
    q.commit(_om(50), 5)  # returns well before the minute is up
    assert events == list(range(2, 12))
    assert [(r[A], seq) for r, seq in fake.requests] == [(1, 1), (50, 2)]
    q.close(5)


def test_flush_and_close_do_not_wait_for_the_linger() -> None:
    fake = FakeCoordinator()
    q = CommitQueue(fake.send, linger_s=60)
    q.commit_async(_om(1)).result(5)
    q.commit_async(_om(2))
    q.commit_async(_om(3))
    assert q.flush(5)
    assert [r[A] for r, _ in fake.requests] == [1, 3]
    last = q.commit_async(_om(4))
    q.close(5)
    assert last.done() and last.exception() is None
    assert [r[A] for r, _ in fake.requests] == [1, 3, 4]


def test_a_sync_commit_on_an_idle_queue_is_sent_from_its_callers_thread_in_order() -> None:
    """With nothing queued or in flight, commit() sends from the caller's thread (no hand-off
    to the commit thread and back); commits made while it is in flight wait for it, never
    overlap it, and go out after it, in order; a sync commit behind a busy queue still waits
    for its turn on the commit thread."""
    fake = FakeCoordinator()
    threads: list[str] = []
    active, most = [0], [0]
    lock = threading.Lock()

    def send(
        offsets: dict[TopicPartition, OffsetAndMetadata], seq: int, timeout_s: float = 0
    ) -> Mapping:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        threads.append(threading.current_thread().name)
        try:
            return fake.send(offsets, seq, timeout_s)
        finally:
            with lock:
                active[0] -= 1

    q = CommitQueue(send, name="commit-thread")
    q.commit(_om(1), 5)
    assert threads == [threading.current_thread().name]
    assert fake.timeouts == [5]  # the caller's timeout bounds it (a close's budget, say)
    fake.gate.clear()
    fake.entered.clear()
    caller = threading.Thread(target=q.commit, args=(_om(2), 5), name="app-thread")
    caller.start()
    assert fake.entered.wait(5)  # the sync commit is in flight, from its own thread
    later = [q.commit_async(_om(i)) for i in (3, 4)]
    assert q.queued == 2 and not any(f.done() for f in later)
    fake.gate.set()
    caller.join(5)
    assert [f.result(5) for f in later] == [None, None]
    assert q.flush(5)
    assert [(r[A], seq) for r, seq in fake.requests] == [(1, 1), (2, 2), (4, 3)]
    assert threads[1:] == ["app-thread", "commit-thread"]
    assert fake.timeouts == [5, 5, 0]  # the queued ones: the sender's own
    assert most[0] == 1
    q.close(5)
