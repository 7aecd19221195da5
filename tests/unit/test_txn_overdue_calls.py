"""TransactionManager's coordinator calls leave a coordinator that stopped answering once
another owns the key (``TransactionManager._attempt``, DESIGN §8), and only then.

The coordinator's stub is replaced by futures this test completes (or never does) and the
cluster client by a script of FindCoordinator answers; the grace and the recheck interval
are shortened. The real takeover is in tests/integration/test_txn_coordinator_overdue.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from strom.api import coordinator_pb2, storage_pb2
from strom.client import coordinator_calls, transactions
from strom.client.transactions import TransactionManager, TxnPhase
from strom.errors import CoordinatorNotAvailableError, ProducerClosedError

GRACE_S = 0.05


class DeadlineExceeded(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "deadline exceeded"


class FakeFuture:
    """A unary call in flight: completed by :meth:`answer`, or cancelled, or ended by its
    deadline as gRPC ends it."""

    def __init__(self, timeout: float) -> None:
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()
        self._done = threading.Event()
        self._callbacks: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self.cancelled = False
        self._resp: Any = None
        self._error: grpc.RpcError | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _expire(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
        self._error = DeadlineExceeded()
        self._finish()

    def _finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def answer(self, resp: Any) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
        self._resp = resp
        self._finish()
        return True

    def cancel(self) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
        self.cancelled = True
        self._finish()
        return True

    def result(self) -> Any:
        assert not self.cancelled, "the result of a cancelled call was asked for"
        if self._error is not None:
            raise self._error
        return self._resp


class Coordinators:
    """The coordinators' EndTxn calls, by address, and the owner FindCoordinator names."""

    def __init__(self, owners: list[str | None]) -> None:
        #: What each lookup answers, in turn (the last one from then on); None: no owner.
        self.owners = owners
        self.lookups = 0
        self.sent: list[tuple[str, FakeFuture]] = []
        self.on_send: Callable[[str, FakeFuture], None] = lambda addr, fut: None

    # -- the ClusterClient the manager uses ----------------------------------------------

    def channel(self, address: str) -> str:
        return address

    def find_coordinator(self, key: str, key_type: int, *, timeout_s: float) -> str:
        owner = self.owners[min(self.lookups, len(self.owners) - 1)]
        self.lookups += 1
        if owner is None:
            raise CoordinatorNotAvailableError(f"no coordinator for {key!r}")
        return owner

    # -- the stub ------------------------------------------------------------------------

    def stub(self, channel: str) -> Any:
        coordinators = self

        class Method:
            def future(self, req: Any, timeout: float, metadata: Any = None) -> FakeFuture:
                fut = FakeFuture(timeout)
                coordinators.sent.append((channel, fut))
                coordinators.on_send(channel, fut)
                return fut

        class Stub:
            EndTxn = Method()

        return Stub()


@pytest.fixture
def coordinators(monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinators]:
    c = Coordinators(["a:1"])
    monkeypatch.setattr(coordinator_calls, "OVERDUE_GRACE_S", GRACE_S)
    monkeypatch.setattr(coordinator_calls, "OVERDUE_RECHECK_S", GRACE_S)
    monkeypatch.setattr(transactions.coordinator_pb2_grpc, "CoordinatorServiceStub", c.stub)
    yield c
    for _, fut in c.sent:  # (nothing left waiting)
        fut.cancel()


def _manager(c: Coordinators) -> TransactionManager:
    m = TransactionManager(c, "tx", 60_000, request_timeout_s=30, retry_backoff_s=0.01)  # type: ignore[arg-type]
    m.producer_id, m.producer_epoch, m.phase = 7, 0, TxnPhase.COMMITTING
    return m


def _end(m: TransactionManager) -> Any:
    return m._call("EndTxn", coordinator_pb2.EndTxnRequest(committed=True), 30)


OK = coordinator_pb2.EndTxnResponse()


def test_a_call_goes_to_the_new_owner_once_the_key_moved(coordinators: Coordinators) -> None:
    # The first lookup finds a:1, which never answers; a:1 is still the owner at the first
    # recheck, none at the next (its lease ended), then b:2 (it took the shard over).
    coordinators.owners = ["a:1", "a:1", None, "b:2"]
    coordinators.on_send = lambda addr, fut: addr == "b:2" and fut.answer(OK)
    m = _manager(coordinators)
    assert _end(m) is OK
    (a, first), (b, second) = coordinators.sent
    assert (a, b) == ("a:1", "b:2")
    assert first.cancelled and not second.cancelled
    assert m._coordinator == "b:2"  # (the next call goes there)


def test_a_slow_owner_is_waited_for(coordinators: Coordinators) -> None:
    """While the key's owner is the coordinator asked, its late answer is taken."""
    coordinators.owners = ["a:1"]
    m = _manager(coordinators)
    lookups_before_answer = 4

    def answer_later(addr: str, fut: FakeFuture) -> None:
        def poll() -> None:
            if coordinators.lookups >= lookups_before_answer:
                fut.answer(OK)
            else:
                threading.Timer(GRACE_S / 5, poll).start()

        poll()

    coordinators.on_send = answer_later
    assert _end(m) is OK
    assert [addr for addr, _ in coordinators.sent] == ["a:1"]
    assert not coordinators.sent[0][1].cancelled
    assert coordinators.lookups >= lookups_before_answer


def test_a_group_call_goes_to_the_groups_new_coordinator(coordinators: Coordinators) -> None:
    """TxnOffsetCommit's coordinator (the group's) is not cached: the attempt that left the
    hung one goes to the new owner it found, without looking it up once more."""
    coordinators.owners = ["g:1", "g:1", "g:2"]
    coordinators.on_send = lambda addr, fut: addr == "g:2" and fut.answer(OK)
    m = _manager(coordinators)
    resp = m._call(
        "EndTxn",  # (the fake stub has one method; the key type is what matters)
        coordinator_pb2.EndTxnRequest(),
        30,
        key="group",
        key_type=storage_pb2.COORDINATOR_TYPE_GROUP,
    )
    assert resp is OK
    assert [addr for addr, _ in coordinators.sent] == ["g:1", "g:2"]
    assert coordinators.lookups == 3 and m._coordinator is None


def test_closing_the_producer_abandons_the_attempt(coordinators: Coordinators) -> None:
    m = _manager(coordinators)
    coordinators.on_send = lambda addr, fut: threading.Timer(GRACE_S, m.closed.set).start()
    with pytest.raises(ProducerClosedError, match="EndTxn abandoned"):
        _end(m)
    assert coordinators.sent[0][1].cancelled


def test_an_abandoned_commit_counts_as_unanswered(coordinators: Coordinators) -> None:
    """An EndTxn given up on at the old owner, whose call then runs out of time, leaves the
    commit pending (it may be in): only commit_transaction() may follow."""
    coordinators.owners = ["a:1", "b:2"]  # neither answers
    m = _manager(coordinators)
    m.started = True
    with pytest.raises(transactions.RequestTimedOutError, match="EndTxn did not succeed"):
        m.end(True, 0.5)
    assert m.pending_end is True
    assert coordinators.sent[0][1].cancelled
