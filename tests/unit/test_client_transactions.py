"""TransactionManager's rule for ending a transaction the coordinator may not know of.

A transaction that registered nothing ends without EndTxn (as Kafka's producer ends it): the
coordinator may still be completing the previous one, and refuses an EndTxn then. What counts
as registered: an Add*ToTxn that succeeded, or one that got no answer (a lost answer may have
added it); a refusal the coordinator answered added nothing. The coordinator calls are
replaced by a script of answers (the manager's ``_call``)."""

from __future__ import annotations

from typing import Any

import pytest

from strom.api import common_pb2, coordinator_pb2, storage_pb2
from strom.client.transactions import GroupMetadata, TransactionManager, TxnPhase
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.devcluster.procs import wait_for
from strom.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    RequestTimedOutError,
    StaleMemberEpochError,
    StromError,
    TopicAuthorizationFailedError,
    TransactionOutcomeUnknownError,
    error_for,
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
        if callable(answer):  # (what happens while the call is out, then its answer)
            answer = answer()
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


def no_open_transaction() -> InvalidTxnStateError:
    """The coordinator's refusal of an abort when its transaction of this producer id and
    epoch is the previous one, committed."""
    err = InvalidTxnStateError("cannot abort the transaction of 'tx': it is COMPLETE_COMMIT")
    err.answered = True  # type: ignore[attr-defined]
    return err


def test_an_abort_of_a_transaction_the_coordinator_never_registered_succeeds() -> None:
    """Found from outside: AddPartitionsToTxn went unanswered (its coordinator hung, another
    took over); the abort, answered INVALID_TXN_STATE (COMPLETE_COMMIT: the previous
    transaction), left the producer in abortable error for good, every later abort and
    begin refused. Nothing of the transaction was registered, so nothing was written in it:
    the abort has nothing to do and succeeds, and the producer goes on."""
    m = Scripted(
        RequestTimedOutError("AddPartitionsToTxn did not succeed"),
        no_open_transaction(),
        added(E.NONE),
        coordinator_pb2.EndTxnResponse(),
    )
    m.begin()
    with pytest.raises(RequestTimedOutError):
        m.add_partitions([("t", 0)], 1)
    m.fail(RequestTimedOutError("AddPartitionsToTxn did not succeed"))
    assert m.phase is TxnPhase.ABORTABLE_ERROR
    m.phase = TxnPhase.ABORTING  # as Producer.abort_transaction sets it
    m.end(False, 1)
    assert m.phase is TxnPhase.READY and m.error is None and m.pending_end is None
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.end(True, 1)
    assert m.calls == ["AddPartitionsToTxn", "EndTxn", "AddPartitionsToTxn", "EndTxn"]
    assert m.phase is TxnPhase.READY


def test_an_abort_refused_after_the_coordinator_accepted_partitions_is_fatal() -> None:
    """The coordinator accepted a partition, so records may have been written, yet it has no
    open transaction to abort: no abort can settle that. Fatal (ProducerFencedError, what a
    loop treats as "close the producer"), naming why and what to do, rather than abortable
    for ever; a commit refused so stays abortable."""
    m = Scripted(added(E.NONE), no_open_transaction())
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.phase = TxnPhase.ABORTING
    with pytest.raises(ProducerFencedError, match=r"no open transaction .* close this producer"):
        m.end(False, 1)
    assert m.phase is TxnPhase.FATAL_ERROR
    with pytest.raises(ProducerFencedError, match=r"no open transaction") as raised:
        m.require(TxnPhase.READY, action="begin_transaction()")
    assert raised.value.code == E.INVALID_TXN_STATE
    c = Scripted(added(E.NONE), no_open_transaction())
    c.begin()
    c.add_partitions([("t", 0)], 1)
    c.phase = TxnPhase.COMMITTING
    with pytest.raises(InvalidTxnStateError):
        c.end(True, 1)
    assert c.phase is TxnPhase.ABORTABLE_ERROR


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


class NoAnswer(Scripted):
    """A coordinator that never answers EndTxn (every ask times out)."""

    def _call(self, method: str, req: Any, timeout_s: float, **_: Any) -> Any:
        if method != "EndTxn":
            return super()._call(method, req, timeout_s)
        self.calls.append(method)
        raise RequestTimedOutError(f"{method} did not succeed within {timeout_s} s")


def _pending_commit(m: TransactionManager) -> None:
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.phase = TxnPhase.COMMITTING  # as Producer.commit_transaction sets it
    with pytest.raises(RequestTimedOutError):
        m.end(True, 1)
    assert m.pending_end is True


def test_a_commit_with_no_answer_is_settled_by_asking_again() -> None:
    """Found from outside: a commit that timed out left `with producer.transaction()` with an
    error the README's loop took as "not committed", and every later begin was refused. The
    block now asks again until the coordinator answers."""
    m = Scripted(
        added(E.NONE),
        RequestTimedOutError("EndTxn"),
        RequestTimedOutError("EndTxn again"),
        coordinator_pb2.EndTxnResponse(),
    )
    _pending_commit(m)
    m.settle_commit(1, 60)
    assert m.calls == ["AddPartitionsToTxn", "EndTxn", "EndTxn", "EndTxn"]
    assert m.phase is TxnPhase.READY and m.pending_end is None
    m.begin()


def test_a_refused_ask_again_is_raised_as_the_coordinators_answer() -> None:
    m = Scripted(added(E.NONE), RequestTimedOutError("EndTxn"), refused())
    _pending_commit(m)
    with pytest.raises(TopicAuthorizationFailedError):
        m.settle_commit(1, 60)
    assert m.phase is TxnPhase.ABORTABLE_ERROR and m.pending_end is None


def test_no_answer_for_the_whole_timeout_is_an_unknown_outcome() -> None:
    m = NoAnswer(added(E.NONE))
    _pending_commit(m)
    with pytest.raises(TransactionOutcomeUnknownError, match="may have committed"):
        m.settle_commit(0.01, 0.05)
    # Still pending: only the same commit may follow (an abort could contradict it).
    assert m.pending_end is True
    with pytest.raises(InvalidTxnStateError, match="call commit_transaction"):
        m.begin(1)


def test_begin_asks_again_about_an_abort_that_got_no_answer() -> None:
    """Found from outside: after an abort that timed out (the README's loop suppresses it and
    rewinds), every begin_transaction() was refused. Asking again is always safe for an
    abort, so begin does it; a begin that must not wait (strom.aio's) still refuses."""
    m = Scripted(added(E.NONE), RequestTimedOutError("EndTxn"), coordinator_pb2.EndTxnResponse())
    m.begin()
    m.add_partitions([("t", 0)], 1)
    m.phase = TxnPhase.ABORTING
    with pytest.raises(RequestTimedOutError):
        m.end(False, 1)
    with pytest.raises(InvalidTxnStateError, match="call abort_transaction"):
        m.begin(None)
    m.begin(1)
    assert m.calls == ["AddPartitionsToTxn", "EndTxn", "EndTxn"]
    assert m.phase is TxnPhase.IN_TRANSACTION and m.pending_end is None


def test_a_partitions_epoch_refusal_is_fatal_unless_the_transaction_outlived_its_timeout() -> None:
    """KIP-588: INVALID_PRODUCER_EPOCH from a partition ends only the transaction when the
    coordinator's timeout abort may have bumped the epoch (the transaction was open longer
    than transaction_timeout_ms), and the abort then asks the coordinator for the id back
    (InitProducerId with the producer's id and epoch) instead of EndTxn; a transaction
    within its timeout was fenced by a new instance: fatal, as before."""
    fenced_here = error_for(E.INVALID_PRODUCER_EPOCH, "epoch 1 took over")
    young = Scripted(added(E.NONE))
    young.begin()
    young.add_partitions([("t", 0)], 1)
    assert isinstance(young.epoch_error(fenced_here), ProducerFencedError)
    young.fail(fenced_here)
    assert young.phase is TxnPhase.FATAL_ERROR

    back = storage_pb2.InitProducerIdResponse(producer_id=7, producer_epoch=2)
    timed_out = answered(error_for(E.INVALID_PRODUCER_EPOCH, "transaction.timeout.ms passed"))
    old = Scripted(added(E.NONE), timed_out, back)
    old.timeout_ms = 1
    old.begin()
    old.add_partitions([("t", 0)], 1)
    wait_for(
        lambda: not isinstance(old.epoch_error(fenced_here), ProducerFencedError),
        timeout=5,
        what="1 ms",
    )
    failed = old.epoch_error(fenced_here)  # what the batch fails with: saying why
    assert "longer than transaction_timeout_ms=1" in str(failed)
    old.fail(failed)
    assert old.phase is TxnPhase.ABORTABLE_ERROR and old.bump_needed and old.error is failed
    assert old.error is not None and "longer than transaction_timeout_ms=1" in str(old.error)
    assert "call abort_transaction()" in str(old.error)
    assert old.recover(1) == (7, 2)
    assert old.calls == ["AddPartitionsToTxn", "EndTxn", "InitProducerId"]
    assert old.phase is TxnPhase.READY and not old.bump_needed and old.error is None

    # No answer: still abortable, and abort_transaction() may ask again.
    lost = Scripted(added(E.NONE), RequestTimedOutError("EndTxn"))
    lost.timeout_ms = 1
    lost.begin()
    lost.add_partitions([("t", 0)], 1)
    wait_for(lambda: lost._timed_out_note() != "", timeout=5, what="1 ms")
    lost.fail(fenced_here)
    lost.phase = TxnPhase.ABORTING  # as abort_transaction() sets it
    with pytest.raises(RequestTimedOutError):
        lost.recover(1)
    assert lost.phase is TxnPhase.ABORTABLE_ERROR and lost.bump_needed

    # The coordinator refuses the id back when another instance initialised it (as does a
    # coordinator that knows nothing of timeout aborts): fatal, and no InitProducerId.
    newer = Scripted(added(E.NONE), answered(ProducerFencedError("epoch 3 took over")))
    newer.timeout_ms = 1
    newer.begin()
    newer.add_partitions([("t", 0)], 1)
    wait_for(
        lambda: not isinstance(newer.epoch_error(fenced_here), ProducerFencedError),
        timeout=5,
        what="1 ms",
    )
    newer.fail(fenced_here)
    with pytest.raises(ProducerFencedError, match="epoch 3 took over"):
        newer.recover(1)
    assert newer.phase is TxnPhase.FATAL_ERROR
    assert newer.calls == ["AddPartitionsToTxn", "EndTxn"]


def answered(err: StromError) -> StromError:
    err.answered = True  # type: ignore[attr-defined]  # as _call marks a coordinator's answer
    return err


def test_partitions_a_lagging_coordinator_does_not_know_yet_are_added_again() -> None:
    """Found from outside (a coordinator just resumed, its view of a new topic behind):
    AddPartitionsToTxn refused UNKNOWN_TOPIC_OR_PARTITION failed the transaction at once.
    As Kafka's producer, a refusal that is retriable is sent again within the call's time;
    one that is not fails the call as before."""
    m = Scripted(added(E.UNKNOWN_TOPIC_OR_PARTITION), added(E.NONE))
    m.begin()
    m.add_partitions([("t", 0)], 5)
    assert m.calls == ["AddPartitionsToTxn"] * 2 and m.added == {("t", 0)}
    m = Scripted(added(E.UNKNOWN_TOPIC_OR_PARTITION), added(E.TOPIC_AUTHORIZATION_FAILED))
    m.begin()
    with pytest.raises(TopicAuthorizationFailedError):
        m.add_partitions([("t", 0)], 5)
    assert not m.started and not m.added


def test_an_add_answered_after_its_transaction_ended_marks_nothing() -> None:
    """The producer's AddPartitionsToTxn runs beside its sender, and an abort does not wait
    for it: an answer that comes after the transaction ended (and the next one began) must
    not mark the partition added in the next one, whose batches would then be written with
    no transaction at the coordinator to end them."""
    m = Scripted()

    def abort_and_begin_meanwhile() -> coordinator_pb2.AddPartitionsToTxnResponse:
        assert m.started  # (set before the call went out: the abort sends EndTxn)
        m.end(False, 1)
        m.begin()
        return added(E.NONE)

    m.answers = [abort_and_begin_meanwhile, coordinator_pb2.EndTxnResponse()]
    m.begin()
    m.add_partitions([("t", 0)], 5)
    assert m.calls == ["AddPartitionsToTxn", "EndTxn"]
    assert m.phase is TxnPhase.IN_TRANSACTION and not m.added and not m.registered


def test_a_failed_batch_makes_the_abort_bump_the_epoch_until_it_is_answered() -> None:
    """Kafka's KIP-360 rule: a batch that failed in the transaction makes its abort ask for a
    new epoch (InitProducerId with the current id and epoch). A bump that got no answer
    leaves the producer READY but not able to begin until it is asked again; the answer
    clears it."""
    mgr = Scripted()
    mgr.phase = TxnPhase.IN_TRANSACTION
    mgr.batch_failed(RequestTimedOutError("t-0: the records may have been written"))
    assert mgr.phase is TxnPhase.ABORTABLE_ERROR and mgr.epoch_bump_required
    mgr.phase = TxnPhase.READY  # (aborted: EndTxn answered)
    mgr.answers = [RequestTimedOutError("InitProducerId did not succeed within 1.0 s")]
    with pytest.raises(RequestTimedOutError):
        mgr.bump_epoch(1)
    with pytest.raises(InvalidTxnStateError, match=r"call abort_transaction\(\) again"):
        mgr.begin(None)
    mgr.answers = [storage_pb2.InitProducerIdResponse(producer_id=7, producer_epoch=1)]
    assert mgr.bump_epoch(1) == (7, 1) and not mgr.epoch_bump_required
    assert mgr.calls == ["InitProducerId", "InitProducerId"]
    mgr.begin(None)
    assert mgr.phase is TxnPhase.IN_TRANSACTION
    # A batch failing outside a transaction (already failed for good) asks for nothing.
    idle = Scripted()
    idle.batch_failed(RequestTimedOutError("late"))
    assert not idle.epoch_bump_required
