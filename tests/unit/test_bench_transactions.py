"""``strom bench produce --transactional`` names each phase by the transaction size it ran."""

from __future__ import annotations

from typing import Any

import pytest

from strom.bench import transactions
from strom.client import producer


class _Sent:
    def result(self, timeout: float | None = None) -> None:
        return None


class FakeProducer:
    """Counts the records each transaction committed; no cluster."""

    committed: list[int] = []

    def __init__(self, *_a: Any, **_k: Any) -> None:
        self.open = 0

    def __enter__(self) -> FakeProducer:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def send(self, *_a: Any, **_k: Any) -> _Sent:
        self.open += 1
        return _Sent()

    def flush(self) -> None:
        return None

    def init_transactions(self) -> None:
        return None

    def begin_transaction(self) -> None:
        self.open = 0

    def commit_transaction(self) -> None:
        FakeProducer.committed.append(self.open)


def test_a_phase_is_named_by_the_size_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: ``--records 5000`` ran one transaction of 5,000 records and
    labelled it "txn of 100,000"; sizes above the record count now run (and print) once."""
    monkeypatch.setattr(producer, "Producer", FakeProducer)
    FakeProducer.committed = []
    results = transactions.bench_transactions(
        None, "t", records=5000, record_size=1, sizes=(1_000, 100_000, 200_000), progress=False
    )
    assert [r.name for r in results] == [
        "idempotent",
        "txn of 1,000 (commit)",
        "txn of 5,000 (commit)",
    ]
    # Each phase's warm-up transaction (1 record), then its measured ones.
    assert FakeProducer.committed == [1, *[1000] * 5, 1, 5000]
    assert [r.batches for r in results[1:]] == [5, 1]
