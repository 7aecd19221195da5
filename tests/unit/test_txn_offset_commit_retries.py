"""``send_offsets_to_transaction``'s TxnOffsetCommit: partitions refused with a retriable
error are sent again (only those), as AddPartitionsToTxn's are; any other refusal fails the
transaction at once. The coordinator calls are replaced by a script of answers (the calls
themselves are tested in test_txn_overdue_calls.py and the integration tests)."""

from __future__ import annotations

from typing import Any

import pytest

from strom.api import coordinator_pb2
from strom.api.common_pb2 import ErrorCode
from strom.client.transactions import GroupMetadata, TransactionManager, TxnPhase
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import CommitFailedError, StromError

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
OFFSETS = {A0: OffsetAndMetadata(5), A1: OffsetAndMetadata(6), B0: OffsetAndMetadata(7)}


def _answer(errors: dict[TopicPartition, int]) -> coordinator_pb2.OffsetCommitResponse:
    resp = coordinator_pb2.OffsetCommitResponse()
    for tp, code in errors.items():
        resp.topics.add(topic=tp.topic).partitions.add(
            partition=tp.partition, error_code=code, error_message=ErrorCode.Name(code)
        )
    return resp


class Script:
    """The manager's ``_call``: AddOffsetsToTxn accepted, TxnOffsetCommit answered from
    ``answers`` in turn; each TxnOffsetCommit's partitions kept."""

    def __init__(self, answers: list[dict[TopicPartition, int]]) -> None:
        self.answers = answers
        self.commits: list[set[TopicPartition]] = []

    def __call__(self, method: str, req: Any, timeout_s: float, **kw: Any) -> Any:
        assert timeout_s > 0
        if method == "AddOffsetsToTxn":
            return coordinator_pb2.AddOffsetsToTxnResponse()
        assert method == "TxnOffsetCommit"
        self.commits.append(
            {TopicPartition(t.topic, p.partition) for t in req.topics for p in t.partitions}
        )
        return _answer(self.answers[len(self.commits) - 1])


def _send(answers: list[dict[TopicPartition, int]], timeout_s: float = 10) -> Script:
    m = TransactionManager(None, "tx", 60_000, request_timeout_s=30, retry_backoff_s=0.01)  # type: ignore[arg-type]
    m.producer_id, m.producer_epoch, m.phase = 7, 0, TxnPhase.IN_TRANSACTION
    script = Script(answers)
    m._call = script  # type: ignore[method-assign]
    try:
        m.send_offsets(OFFSETS, GroupMetadata("g"), timeout_s)
    finally:
        script.error = m.error  # type: ignore[attr-defined]
    return script


def test_retriable_refusals_are_sent_again_alone() -> None:
    unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    loading = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    script = _send(
        [
            {A0: ErrorCode.NONE, A1: unknown, B0: unknown},
            {A1: ErrorCode.NONE, B0: loading},
            {B0: ErrorCode.NONE},
        ]
    )
    assert script.commits == [{A0, A1, B0}, {A1, B0}, {B0}]
    assert script.error is None  # type: ignore[attr-defined]


def test_a_refusal_that_is_not_retriable_fails_at_once() -> None:
    with pytest.raises(CommitFailedError):
        _send([{A0: ErrorCode.NONE, A1: ErrorCode.UNKNOWN_MEMBER_ID, B0: ErrorCode.NONE}])


def test_retriable_refusals_end_with_the_call_s_timeout() -> None:
    unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(StromError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        _send([{A0: unknown, A1: unknown, B0: unknown}] * 1000, timeout_s=0.2)
