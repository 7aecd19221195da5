"""The client side of consumer groups without a cluster: heartbeat answers are fed to a
:class:`GroupMember` through a fake coordinator stub, and the application-thread half
(``on_poll``) is checked against a fake consumer."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from strom.api import coordinator_pb2
from strom.client.group_member import GroupMember, make_group
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import (
    AuthorizationError,
    StaleMemberEpochError,
    StromError,
    UnknownTopicOrPartitionError,
    UnsupportedAssignorError,
)
from strom.errors import ErrorCode as E
from tests.unit.test_txn_overdue_calls import FakeFuture

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


class FakeConsumer:
    def __init__(self, group_id: str | None = "g") -> None:
        self.group_id = group_id
        self.client_id = "c1"
        self._client = SimpleNamespace()
        self._timeout_s = 1.0
        self._backoff_s = 0.01
        self._read_committed = False
        self.config: dict[str, Any] = {
            "enable_auto_commit": True,
            "auto_commit_interval_ms": 60_000,
            "max_poll_interval_ms": 300_000,
            "group_instance_id": None,
            "group_remote_assignor": None,
        }
        self.closed = False
        self.applied: list[set[TopicPartition]] = []
        self._fetcher = SimpleNamespace(marks=self._marks)

    def _marks(self, tps: set[TopicPartition]) -> dict[TopicPartition, tuple[int, int | None]]:
        """(generation, position) of the assigned ones, as the Fetcher answers."""
        assigned = self.applied[-1] if self.applied else set()
        return {tp: (0, 100 + tp.partition) for tp in tps if tp in assigned}

    def _apply_assignment(self, parts: Iterable[TopicPartition]) -> None:
        self.applied.append(set(parts))

    def _consumed_positions(self, parts: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: pos for tp, (_, pos) in self._marks(set(parts)).items() if pos is not None}


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("revoked", parts))

    def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("assigned", parts))


class _Unary:
    """A fake stub method, called as gRPC's are: directly, or ``.future(...)`` (what
    GroupMember's attempts use), answered at once either way."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __get__(self, obj: Any, owner: Any) -> Any:
        return _Unary(self.fn.__get__(obj, owner))

    def __call__(self, req: Any, **kw: Any) -> Any:
        return self.fn(req, **kw)

    def future(self, req: Any, **kw: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(self.fn(req, **kw))
        except Exception as exc:
            fut.set_exception(exc)
        return fut


class FakeStub:
    def __init__(self, *responses: coordinator_pb2.ConsumerGroupHeartbeatResponse) -> None:
        self.responses = list(responses)
        self.requests: list[coordinator_pb2.ConsumerGroupHeartbeatRequest] = []

    @_Unary
    def ConsumerGroupHeartbeat(self, req: Any, **_: Any) -> Any:
        self.requests.append(req)
        return self.responses.pop(0)


def _resp(epoch: int, parts: list[int] | None = None, code: int = E.NONE) -> Any:
    r = coordinator_pb2.ConsumerGroupHeartbeatResponse(
        error_code=code, member_id="m", member_epoch=epoch, heartbeat_interval_ms=200
    )
    if parts is not None:
        r.assignment.SetInParent()
        if parts:
            r.assignment.topic_partitions.add(topic="t", partitions=parts)
    return r


@pytest.fixture
def member() -> tuple[GroupMember, FakeConsumer, Listener, FakeStub, list[Any]]:
    consumer = FakeConsumer()
    m = make_group(consumer)  # type: ignore[arg-type]
    assert isinstance(m, GroupMember)
    listener = Listener()
    stub = FakeStub()
    commits: list[Any] = []
    m._stub = lambda timeout_s: (stub, "addr")  # type: ignore[method-assign]
    m.commit = lambda offsets, timeout_s: commits.append(dict(offsets))  # type: ignore[method-assign]
    with m._lock:
        m._topics, m._listener, m._subscribed = ("t",), listener, True
    return m, consumer, listener, stub, commits


def test_no_group_no_membership() -> None:
    assert make_group(FakeConsumer(group_id=None)) is None  # type: ignore[arg-type]


def test_join_then_reconcile_growth_and_shrink_on_the_application_thread(member: Any) -> None:
    m, consumer, listener, stub, commits = member
    stub.responses = [_resp(1, [0, 1, 2]), _resp(1, [2]), _resp(2)]
    assert m._heartbeat_once() == pytest.approx(0.2)
    assert stub.requests[0].member_epoch == 0 and stub.requests[0].subscribed_topic_names == ["t"]
    assert consumer.applied == []  # the heartbeat thread never touches the consumer
    m.on_poll(consumer)
    assert consumer.applied == [{T0, T1, T2}]
    assert listener.calls == [("assigned", [T0, T1, T2])]

    m._heartbeat_once()  # the coordinator takes 0 and 1 away
    assert [list(tp.partitions) for tp in stub.requests[1].owned_topic_partitions] == [[0, 1, 2]]
    m.on_poll(consumer)
    assert listener.calls[-1] == ("revoked", [T0, T1])
    assert commits == [{T0: OffsetAndMetadata(100), T1: OffsetAndMetadata(101)}]
    assert consumer.applied[-1] == {T2}
    m._heartbeat_once()  # reports the revocation at once
    assert [list(tp.partitions) for tp in stub.requests[2].owned_topic_partitions] == [[2]]
    assert m.member_epoch == 2


def test_a_heartbeat_during_installation_reports_what_is_being_installed(member: Any) -> None:
    """The heartbeat thread may report while the application thread installs a new
    assignment, or before it has looked at it: it reports those partitions as owned, so the
    coordinator cannot free them for another member while this one may still consume them."""
    m, consumer, _listener, stub, _ = member
    stub.responses = [_resp(1, [0, 1, 2]), _resp(1), _resp(1), _resp(1)]
    m._heartbeat_once()
    m._heartbeat_once()  # before the application looks: the next poll will take them
    assert [list(tp.partitions) for tp in stub.requests[1].owned_topic_partitions] == [[0, 1, 2]]
    during: list[Any] = []

    def apply(parts: Iterable[TopicPartition]) -> None:
        m._heartbeat_once()  # the heartbeat thread runs in the middle of the installation
        during.append(stub.requests[-1])
        FakeConsumer._apply_assignment(consumer, parts)

    consumer._apply_assignment = apply  # type: ignore[method-assign]
    m.on_poll(consumer)
    assert [list(tp.partitions) for tp in during[0].owned_topic_partitions] == [[0, 1, 2]]
    m._heartbeat_once()
    assert [list(tp.partitions) for tp in stub.requests[-1].owned_topic_partitions] == [[0, 1, 2]]
    assert m._installing is None


@pytest.mark.parametrize(("max_poll_ms", "sent"), [(600_000, 600_000), (2**40, 2**31 - 1)])
def test_heartbeats_carry_max_poll_interval_as_the_rebalance_timeout(
    max_poll_ms: int, sent: int
) -> None:
    """Found from outside: the field was never sent, so the coordinator's 5-minute default
    fenced a consumer that allowed itself 10 minutes between polls when a rebalance started
    meanwhile. Kafka's consumer sends max.poll.interval.ms; values past int32 are clamped."""
    consumer = FakeConsumer()
    consumer.config["max_poll_interval_ms"] = max_poll_ms
    m = make_group(consumer)  # type: ignore[arg-type]
    assert isinstance(m, GroupMember)
    stub = FakeStub(_resp(1, [0]), _resp(1), _resp(-1))
    m._stub = lambda timeout_s: (stub, "addr")  # type: ignore[method-assign]
    with m._lock:
        m._topics, m._subscribed = ("t",), True
    m._heartbeat_once()  # the join
    m._heartbeat_once()  # a regular heartbeat
    m._leave()
    assert [r.rebalance_timeout_ms for r in stub.requests] == [sent, sent, sent]


def test_a_poll_inside_rebalance_elsewhere_leaves_the_rebalance_to_the_next_poll(
    member: Any,
) -> None:
    """strom.aio answers polls on the event loop, where a listener cannot run (a coroutine
    could not be waited for): such a poll leaves the new assignment alone, and says it is
    pending so the aio consumer makes the next poll in a worker thread."""
    m, consumer, listener, stub, _ = member
    stub.responses = [_resp(1, [0, 1])]
    assert not m.rebalance_pending()
    m._heartbeat_once()
    assert m.rebalance_pending()
    with m.rebalance_elsewhere():
        m.on_poll(consumer)
    assert consumer.applied == [] and listener.calls == []
    done = threading.Thread(target=m.on_poll, args=(consumer,))  # another thread: not deferred
    with m.rebalance_elsewhere():
        done.start()
        done.join()
    assert consumer.applied == [{T0, T1}] and listener.calls == [("assigned", [T0, T1])]
    assert not m.rebalance_pending()


def test_fenced_member_drops_everything_before_rejoining(member: Any) -> None:
    m, consumer, listener, stub, _ = member
    stub.responses = [_resp(3, [0]), _resp(-1, code=E.FENCED_MEMBER_EPOCH), _resp(4, [1])]
    m._heartbeat_once()
    m.on_poll(consumer)
    assert m._heartbeat_once() == 0.0
    assert m._fenced and m.member_epoch == 0
    m.on_poll(consumer)  # the lost partitions are dropped on the application thread
    assert consumer.applied[-1] == set() and listener.calls[-1] == ("revoked", [T0])
    assert not m._fenced
    m._heartbeat_once()
    assert stub.requests[-1].member_epoch == 0 and not stub.requests[-1].owned_topic_partitions
    m.on_poll(consumer)
    assert consumer.applied[-1] == {T1}


def test_fatal_heartbeat_errors_surface_in_poll(member: Any) -> None:
    m, consumer, _, stub, _ = member
    stub.responses = [_resp(-1, code=E.UNSUPPORTED_ASSIGNOR)]
    m._heartbeat_once()
    with pytest.raises(UnsupportedAssignorError):
        m.on_poll(consumer)
    m.on_poll(consumer)  # reported once


def test_coordinator_moves_are_rediscovered(member: Any) -> None:
    m, _, _, stub, _ = member
    m._coordinator = "old:1"
    stub.responses = [_resp(-1, code=E.NOT_COORDINATOR)]
    assert m._heartbeat_once() == pytest.approx(0.05)  # backoff, then FindCoordinator
    assert m._coordinator is None


def test_a_commit_refused_for_a_stale_epoch_waits_for_the_heartbeat_that_brings_the_new_one(
    member: Any,
) -> None:
    """Found from outside: a sync commit made while the coordinator had bumped the member's
    epoch, before the heartbeat bringing it came back, failed with a non-retriable
    StaleMemberEpochError. It asks for a heartbeat at once, and retries with the new epoch."""
    m, *_ = member
    with m._lock:
        m.member_epoch = m._last_epoch = 1
        m._owned = {T0}
    sent: list[int] = []

    def request(method: str, req: Any, timeout_s: float) -> Any:
        sent.append(req.member_epoch)
        code = E.STALE_MEMBER_EPOCH if req.member_epoch == 1 else E.NONE
        return coordinator_pb2.OffsetCommitResponse(error_code=code)

    def heartbeat() -> None:  # the heartbeat thread, asked to go now
        assert m._wake.wait(30)
        m._heartbeat_once()

    m._request = request
    m._stub = lambda timeout_s: (FakeStub(_resp(2)), "addr")
    beat = threading.Thread(target=heartbeat)
    beat.start()
    try:
        assert m._send_commit({T0: OffsetAndMetadata(5)}, 1) == {}
    finally:
        m._wake.set()
        beat.join(30)
    assert sent == [1, 2]


def test_a_stale_epoch_commit_of_partitions_given_to_another_member_is_not_retried(
    member: Any,
) -> None:
    """A commit queued before a revocation (an async one, say) and refused for the old epoch
    was retried under the new epoch for every partition in it, although the coordinator
    checks only the member and its epoch: the offsets of a partition the rebalance gave to
    another member overwrote that member's commits, and the partition was read again from
    the older offset. Only a commit of partitions this member still holds is retried."""
    m, *_ = member
    with m._lock:
        m.member_epoch = m._last_epoch = 1
        m._owned = {T1}  # T0 was revoked and reported given up since the commit was queued
    sent: list[int] = []

    def request(method: str, req: Any, timeout_s: float) -> Any:
        sent.append(req.member_epoch)
        code = E.STALE_MEMBER_EPOCH if req.member_epoch == 1 else E.NONE
        return coordinator_pb2.OffsetCommitResponse(error_code=code)

    def heartbeat() -> None:
        assert m._wake.wait(30)
        m._heartbeat_once()

    m._request = request
    m._stub = lambda timeout_s: (FakeStub(_resp(2)), "addr")
    beat = threading.Thread(target=heartbeat)
    beat.start()
    try:
        with pytest.raises(StaleMemberEpochError, match=r"t-0 .*another member"):
            m._send_commit({T0: OffsetAndMetadata(5), T1: OffsetAndMetadata(7)}, 1)
    finally:
        m._wake.set()
        beat.join(30)
    assert sent == [1], "retried under the new epoch"


class _Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.PERMISSION_DENIED

    def details(self) -> str:
        return "DESCRIBE on group g denied"


class FetchStub:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    @_Unary
    def OffsetFetch(self, req: Any, **_: Any) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (_Refused(), AuthorizationError),
        (
            coordinator_pb2.OffsetFetchResponse(
                error_code=E.UNKNOWN_SERVER_ERROR, error_message="boom"
            ),
            StromError,
        ),
    ],
)
def test_a_failed_offset_lookup_raises_what_it_is_not_nothing_committed(
    member: Any, answer: Any, error: type[StromError]
) -> None:
    """Found while making poll() wait out coordinator failovers (it now skips retriable
    lookup errors): a refusal by the ACLs came back as a retriable "OffsetFetch failed",
    and an error for the whole lookup was ignored, so every partition read as "nothing
    committed" and the consumer started from auto_offset_reset. Both raise, not retriable."""
    m, *_ = member
    m._stub = lambda timeout_s: (FetchStub(answer), "addr")
    with pytest.raises(error) as raised:
        m.committed([T0], 1.0)
    assert not raised.value.retriable


class Commits:
    """``GroupMember._request`` for OffsetCommit: answers from ``answers`` in turn (per
    partition: its error code, NONE when missing); each request's partitions kept."""

    def __init__(self, *answers: dict[TopicPartition, int]) -> None:
        self.answers = list(answers)
        self.sent: list[set[TopicPartition]] = []
        self.sequences: list[int] = []

    def __call__(self, method: str, req: Any, timeout_s: float) -> Any:
        assert method == "OffsetCommit" and timeout_s > 0
        self.sequences.append(req.commit_sequence)
        parts = {TopicPartition(t.topic, p.partition) for t in req.topics for p in t.partitions}
        self.sent.append(parts)
        errors = self.answers[min(len(self.sent), len(self.answers)) - 1]
        resp = coordinator_pb2.OffsetCommitResponse()
        for tp in sorted(parts):
            code = errors.get(tp, E.NONE)
            resp.topics.add(topic=tp.topic).partitions.add(
                partition=tp.partition, error_code=code, error_message=E.Name(code)
            )
        return resp


def _topics(**counts: int) -> Any:
    """The cluster client's ``topic_metadata``: ``counts`` partitions per known topic."""

    def topic_metadata(topic: str) -> Any:
        if topic not in counts:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}", retriable=False)
        return SimpleNamespace(partitions=[None] * counts[topic])

    return topic_metadata


U0, U1 = TopicPartition("u", 0), TopicPartition("u", 1)
UNKNOWN = E.UNKNOWN_TOPIC_OR_PARTITION


def test_a_commit_refused_for_a_topic_the_coordinator_does_not_know_yet_is_sent_again(
    member: Any,
) -> None:
    """CI saw a commit made right after its topic was created fail UNKNOWN_TOPIC_OR_PARTITION:
    the coordinator's view of the topics lags the nodes'. Those partitions (only those) are
    committed again, with the same sequence, while the topic exists in the metadata."""
    m, consumer, *_ = member
    consumer._client.topic_metadata = _topics(t=3)
    commits = Commits({T1: UNKNOWN, T2: UNKNOWN}, {T2: UNKNOWN}, {})
    m._request = commits
    offsets = {T0: OffsetAndMetadata(1), T1: OffsetAndMetadata(2), T2: OffsetAndMetadata(3)}
    assert m._send_commit(offsets, 4, 5.0) == {}
    assert commits.sent == [{T0, T1, T2}, {T1, T2}, {T2}]
    assert commits.sequences == [4, 4, 4]


def test_a_commit_for_a_topic_that_does_not_exist_fails_at_once(member: Any) -> None:
    """A topic the cluster does not have (or a partition past its count) is not retried:
    its error comes back at once, the others' commits stand."""
    m, consumer, *_ = member
    consumer._client.topic_metadata = _topics(t=3)
    commits = Commits({U0: UNKNOWN, U1: UNKNOWN, TopicPartition("t", 5): UNKNOWN})
    m._request = commits
    offsets = {
        T0: OffsetAndMetadata(1),
        TopicPartition("t", 5): OffsetAndMetadata(1),
        U0: OffsetAndMetadata(2),
        U1: OffsetAndMetadata(3),
    }
    errors = m._send_commit(offsets, 1, 30.0)
    assert set(errors) == {U0, U1, TopicPartition("t", 5)}
    assert all(isinstance(e, UnknownTopicOrPartitionError) for e in errors.values())
    assert "u-0" in str(errors[U0])
    assert len(commits.sent) == 1


def test_a_topic_the_coordinator_never_learns_fails_when_the_commit_s_time_is_up(
    member: Any,
) -> None:
    m, consumer, *_ = member
    consumer._client.topic_metadata = _topics(t=3)
    commits = Commits({T1: UNKNOWN})
    m._request = commits
    errors = m._send_commit({T0: OffsetAndMetadata(1), T1: OffsetAndMetadata(2)}, 1, 0.3)
    assert set(errors) == {T1} and isinstance(errors[T1], UnknownTopicOrPartitionError)
    assert len(commits.sent) > 1 and all(sent == {T1} for sent in commits.sent[1:])


class SilentStub:
    """A coordinator that hangs: every heartbeat is a call in flight that never ends."""

    def __init__(self) -> None:
        self.sent: list[FakeFuture] = []
        self.sending = threading.Event()
        stub = self

        class Method:
            def future(self, req: Any, timeout: float, metadata: Any = None) -> FakeFuture:
                stub.sent.append(FakeFuture(timeout))
                stub.sending.set()
                return stub.sent[-1]

        self.ConsumerGroupHeartbeat = Method()


def test_stopping_the_member_abandons_a_heartbeat_left_unanswered(member: Any) -> None:
    """close() stops the heartbeat thread and joins it: a heartbeat at a coordinator that
    hangs is cancelled then, not waited for (up to half of request_timeout_ms)."""
    m, *_ = member
    m._attempt_s = 30.0
    stub = SilentStub()
    m._stub = lambda timeout_s: (stub, "hung:1")
    m._client.find_coordinator = lambda *a, **kw: "hung:1"  # (still the owner)
    beat = threading.Thread(target=m._heartbeat_once)
    beat.start()
    assert stub.sending.wait(10)
    m._stop.set()
    beat.join(5)
    assert not beat.is_alive(), "the heartbeat waited on the hung coordinator"
    assert stub.sent[0].cancelled
