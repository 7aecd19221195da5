"""`strom transactions producers` when one partition does not answer: the others are shown
and the failure is named (found from outside: the whole command failed after 30 s, hiding
the healthy partitions exactly when an operator hunts a hanging transaction)."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import pytest

from strom.cli import transactions
from strom.client.admin import ProducerState
from strom.client.types import TopicPartition
from strom.errors import LeaderNotAvailableError


class _Admin:
    """Stands in for the Admin client: partition 1 has no leader."""

    def __init__(self, **_: Any) -> None:
        pass

    def __enter__(self) -> _Admin:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def describe_topic(self, name: str) -> Any:
        return argparse.Namespace(partition_count=2)

    def describe_producers(self, tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
        if any(tp.partition == 1 for tp in tps):
            raise LeaderNotAvailableError("t-1 has no live leader")
        return {tp: [ProducerState(7, 0, 3, 0, -1, 12)] for tp in tps}


@pytest.mark.parametrize("as_json", [False, True])
def test_a_partition_without_a_leader_does_not_hide_the_others(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    monkeypatch.setattr(transactions, "Admin", _Admin)
    out = io.StringIO()
    args = argparse.Namespace(topic="t", partition=None, json=as_json)
    assert transactions._producers(None, args, out) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "t-1" in err and "no live leader" in err
    if as_json:
        rows = json.loads(out.getvalue())
        assert [(r["partition"], r["producer_id"]) for r in rows] == [(0, 7)]
    else:
        lines = out.getvalue().splitlines()
        assert len(lines) == 2 and lines[1].split()[:2] == ["0", "7"]
