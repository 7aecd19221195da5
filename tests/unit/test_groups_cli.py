"""``strom groups reset-offsets`` planning and argument parsing (no cluster)."""

from __future__ import annotations

import pytest

from strom.cli.groups import _datetime_ms, plan_reset
from strom.cli.main import build_parser
from strom.client.types import TopicPartition

A, B = TopicPartition("t", 0), TopicPartition("t", 1)
LO = {A: 5, B: 0}
HI = {A: 50, B: 10}


def _plan(**kw: object) -> dict[TopicPartition, int]:
    return plan_reset([A, B], committed={A: 20}, earliest=LO, latest=HI, **kw)  # type: ignore[arg-type]


def test_each_strategy_clamped_to_the_log() -> None:
    assert _plan(to_earliest=True) == {A: 5, B: 0}
    assert _plan() == {A: 50, B: 10}  # --to-latest
    assert _plan(to_offset=30) == {A: 30, B: 10}
    assert _plan(to_offset=0) == {A: 5, B: 0}
    assert _plan(shift_by=-100) == {A: 5, B: 0}
    assert _plan(shift_by=3) == {A: 23, B: 3}  # nothing committed on B: from its start
    assert _plan(by_time={A: 12, B: -1}) == {A: 12, B: 10}  # -1: no record that late


def test_datetimes_default_to_utc() -> None:
    assert _datetime_ms("1970-01-01T00:00:01Z") == 1000
    assert _datetime_ms("1970-01-01T00:00:02") == 2000


def test_reset_needs_exactly_one_strategy() -> None:
    parser = build_parser()
    args = parser.parse_args(["groups", "reset-offsets", "g", "--topic", "t:0,1", "--to-latest"])
    assert args.topic == ["t:0,1"] and not args.execute
    with pytest.raises(SystemExit):
        parser.parse_args(
            ["groups", "reset-offsets", "g", "--topic", "t", "--to-latest", "--to-earliest"]
        )
