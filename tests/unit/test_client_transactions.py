"""TransactionManager's rule for ending a transaction the coordinator may not know of.

A transaction that registered nothing ends without EndTxn (as Kafka's producer ends it): the
coordinator may still be completing the previous one, and refuses an EndTxn then. What counts
as registered: an Add*ToTxn that succeeded, or one that got no answer (a lost answer may have
added it); a refusal the coordinator answered added nothing. The coordinator calls are
replaced by a script of answers (the manager's ``_call``)."""

from __future__ import annotations

from typing import Any

import pytest

from strom.api import common_pb2, coordinator_pb2
from strom.client.transactions import GroupMetadata, TransactionManager, TxnPhase
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    RequestTimedOutError,
    StaleMemberEpochError,
    StromError,
    TopicAuthorizationFailedError,
)

E = common_pb2.ErrorCode


class Scripted(TransactionManager):
    def __init__(self, *answers: Any) -> None:
        super().__init__(None, "tx", 60_000, request_timeout_s=1, retry_backoff_s=0.01)  # type: ignore[arg-type]
        self.answers = list(answers)
        self.calls: list[str] = []
        self.producer_id, self.producer_epoch, self.phase = 7, 0, TxnPhase.READY

    def _call(self, method: str, req: Any, timeout_s: float, **_: Any) -> Any:
        self.calls.append(method)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def refused() -> StromError:
    err = TopicAuthorizationFailedError("not allowed to write to t")
    err.answered = True  # type: ignore[attr-defined]  # as _call marks a coordinator's refusal
    return err


def added(*codes: int) -> coordinator_pb2.AddPartitionsToTxnResponse:
    resp = coordinator_pb2.AddPartitionsToTxnResponse()
    tr = resp.topics.add(topic="t")
    for i, code in enumerate(codes):
        tr.partitions.add(partition=i, error_code=code)
    return resp


def test_nothing_registered_ends_without_endtxn() -> None:
    m = Scripted()
    m.begin()
    m.end(False, 1)
    m.begin()
    m.end(True, 1)
    assert m.calls == [] and m.phase is TxnPhase.READY


@pytest.mark.parametrize(
    ("answer", "ends_with_endtxn"),
    [
        (added(E.NONE), True),
        (added(E.NONE, E.TOPIC_AUTHORIZATION_FAILED), True),  # one of them was added
        (added(E.TOPIC_AUTHORIZATION_FAILED), False),
        (refused(), False),
        (RequestTimedOutError("AddPartitionsToTxn did not succeed"), True),  # maybe added
    ],
)
def test_an_add_counts_when_it_may_have_registered_something(
    answer: Any, ends_with_endtxn: bool
) -> None:
    m = Scripted(answer, coordinator_pb2.EndTxnResponse())
    m.begin()
    try:
        m.add_partitions([("t", 0), ("t", 1)], 1)
    except StromError:
        m.fail(StromError("the add failed"))
    m.end(False, 1)
    assert ("EndTxn" in m.calls) is ends_with_endtxn
    assert m.phase is TxnPhase.READY


def test_offsets_sent_count_too() -> None:
    m = Scripted(
        coordinator_pb2.AddOffsetsToTxnResponse(),
        coordinator_pb2.OffsetCommitResponse(),
        coordinator_pb2.EndTxnResponse(),
    )
    m.begin()
    m.send_offsets({TopicPartition("t", 0): OffsetAndMetadata(5)}, GroupMetadata("g"), 1)
    m.end(True, 1)
    assert m.calls == ["AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn"]


def test_an_abort_that_failed_can_be_tried_again() -> None:
    m = Scripted(added(E.NONE), RequestTimedOutError("EndTxn"), coordinator_pb2.EndTxnResponse())
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.phase = TxnPhase.ABORTING  # as Producer.abort_transaction sets it
    with pytest.raises(RequestTimedOutError):
        m.end(False, 1)
    # No answer: the abort may be in, so it is pending and only an abort may follow.
    assert m.phase is TxnPhase.ABORTING and m.pending_end is False
    with pytest.raises(InvalidTxnStateError, match="call abort_transaction"):
        m.require(TxnPhase.READY, action="begin_transaction()")
    m.end(False, 1)
    assert m.phase is TxnPhase.READY and m.pending_end is None


def test_a_refused_end_makes_the_transaction_abortable() -> None:
    """An answered refusal (not a missing answer) decided nothing: abort is the way on."""
    m = Scripted(added(E.NONE), refused())
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.phase = TxnPhase.COMMITTING
    with pytest.raises(StromError):
        m.end(True, 1)
    assert m.phase is TxnPhase.ABORTABLE_ERROR and m.pending_end is None


def test_a_fatal_error_ends_a_pending_end() -> None:
    """Found from outside: a pending commit asked again was fenced (the coordinator had
    aborted it at its timeout); abort_transaction() then advised calling commit again."""
    m = Scripted(added(E.NONE), RequestTimedOutError("EndTxn"))
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.phase = TxnPhase.COMMITTING
    with pytest.raises(RequestTimedOutError):
        m.end(True, 1)
    assert m.pending_end is True
    m.fail(ProducerFencedError("aborted after transaction.timeout.ms"))
    assert m.phase is TxnPhase.FATAL_ERROR and m.pending_end is None
    with pytest.raises(ProducerFencedError):
        m.require(TxnPhase.IN_TRANSACTION, action="abort_transaction()")


def test_offsets_refused_for_a_stale_member_epoch_leave_the_transaction_abortable() -> None:
    """A rebalance moved the member's epoch on while its offsets were on their way: the
    transaction fails with StaleMemberEpochError, abortable, not fatal (the README's
    exactly-once loop aborts, rewinds with seek_to_committed() and goes on)."""
    refusal = coordinator_pb2.OffsetCommitResponse()
    refusal.topics.add(topic="t").partitions.add(partition=0, error_code=E.STALE_MEMBER_EPOCH)
    m = Scripted(
        added(E.NONE),
        coordinator_pb2.AddOffsetsToTxnResponse(),
        refusal,
        coordinator_pb2.EndTxnResponse(),
    )
    m.begin()
    m.add_partitions([("t", 0)], 1)
    with pytest.raises(StaleMemberEpochError):
        m.send_offsets(
            {TopicPartition("t", 0): OffsetAndMetadata(5)}, GroupMetadata("g", "m", 4), 1
        )
    assert m.phase is TxnPhase.ABORTABLE_ERROR
    m.phase = TxnPhase.ABORTING  # as Producer.abort_transaction sets it
    m.end(False, 1)
    assert m.calls[-1] == "EndTxn" and m.phase is TxnPhase.READY
    m.begin()  # and the next transaction starts
