"""``strom groups reset-offsets`` planning and argument parsing (no cluster)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from strom.cli.admin_parser import _time_spec
from strom.cli.groups import _datetime_ms, plan_reset
from strom.cli.main import build_parser
from strom.client.admin_requests import offset_spec as _offset_spec
from strom.client.types import TopicPartition
from strom.errors import InvalidRequestError

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
    notes: list[str] = []
    assert _plan(to_current=True, notes=notes) == {A: 20, B: 10}  # nothing on B: its latest
    assert notes == [
        "t-1: no committed offset; setting its latest offset (10), as Kafka's tool does"
    ]


@pytest.fixture
def five_hours_behind_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC-5 (a POSIX TZ rule: no time zone database needed)."""
    monkeypatch.setenv("TZ", "XST+5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_time_without_a_timezone_is_local_time_in_every_command(
    five_hours_behind_utc: None,
) -> None:
    """One rule for both commands, Kafka's: local time (found from outside: ``topics offsets
    --time`` read local time, ``groups reset-offsets --to-datetime`` UTC)."""
    utc = 1_700_000_010_000  # 2023-11-14T22:13:30Z
    assert _datetime_ms("2023-11-14T22:13:30Z") == utc
    assert _datetime_ms("2023-11-14T17:13:30-05:00") == utc
    assert _datetime_ms("2023-11-14T22:13:30") == utc + 5 * 3600 * 1000
    assert _time_spec("2023-11-14T22:13:30") == utc + 5 * 3600 * 1000
    assert _time_spec("2023-11-14T22:13:30Z") == utc
    t = TopicPartition("t", 0)
    assert _offset_spec(t, datetime(2023, 11, 14, 22, 13, 30)) == utc + 5 * 3600 * 1000
    assert _datetime_ms("2023-11-14T22:13:30.123Z") == utc + 123  # exact, not a float's


def test_times_before_1970_are_refused() -> None:
    """They used to become -1 ("latest") or -2 ("earliest") in the offset lookup."""
    assert _datetime_ms("1970-01-01T00:00:00Z") == 0
    for text in ("1969-12-31T23:59:59.999Z", "1969-12-31T23:59:59.998Z", "1900-01-01T00:00:00Z"):
        with pytest.raises(ValueError, match=r"--to-datetime 19[0-9]{2}-.* is before 1970"):
            _datetime_ms(text)
        with pytest.raises(argparse.ArgumentTypeError, match="before 1970"):
            _time_spec(text)
    with pytest.raises(InvalidRequestError, match=r"t-0: .*before 1970"):
        _offset_spec(TopicPartition("t", 0), datetime(1969, 12, 31, 23, 59, 59, 999000, UTC))
    with pytest.raises(ValueError, match="not an ISO 8601 time"):
        _datetime_ms("yesterday")


def test_reset_needs_exactly_one_strategy() -> None:
    parser = build_parser()
    args = parser.parse_args(["groups", "reset-offsets", "g", "--topic", "t:0,1", "--to-latest"])
    assert args.topic == ["t:0,1"] and not args.execute
    with pytest.raises(SystemExit):
        parser.parse_args(
            ["groups", "reset-offsets", "g", "--topic", "t", "--to-latest", "--to-earliest"]
        )


def test_group_and_member_ids_are_printed_with_control_characters_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ids an older coordinator stored with control characters are escaped in the text
    output: raw, they garbled the terminal and split ``groups list``'s tab-separated lines
    (found from outside). JSON output escapes them already."""
    import io
    from types import SimpleNamespace

    from strom.api import coordinator_pb2
    from strom.cli import groups

    listed = [SimpleNamespace(group_id="g\x00\t\x1b[31mred\\", state="Empty", member_count=0)]
    admin = SimpleNamespace(list_groups=lambda: listed)
    monkeypatch.setattr(groups, "_admin", lambda client: admin)
    out = io.StringIO()
    assert groups._list(None, argparse.Namespace(json=False), out) == 0  # type: ignore[arg-type]
    assert out.getvalue() == "g\\x00\\x09\\x1b[31mred\\x5c\tEmpty\t0 members\n"

    d = coordinator_pb2.DescribedGroup(group_id="g\x07", assignor_name="range")
    d.members.add(member_id="m\r\n", client_id="c\x7f", client_host="h\x9b")
    d.offsets.add(topic="t", partition=0, committed_offset=1, end_offset=2, member_id="m\r\n")
    out = io.StringIO()
    groups._print_group(d, out)
    text = out.getvalue()
    assert "group g\\x07:" in text
    assert "member m\\x0d\\x0a (c\\x7f@h\\x9b): -" in text
    assert not any(ch in text for ch in "\x00\x07\x1b\r\x7f\x9b")
    assert groups.shown("größe-日本 ok") == "größe-日本 ok"
