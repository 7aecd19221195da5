"""The partition log is split by what each module holds (strom.log.partition_log, recovery,
duplicate_lookup, time_lookup, removal, results); what others see must not follow the split:
the names they import from ``strom.log.partition_log``, the attributes each mixin says it
takes from ``Log``, and the logger name operators filter recovery's warnings on."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from strom.log import Log, LogConfig
from strom.log.duplicate_lookup import DuplicateLookup
from strom.log.recovery import LogRecovery
from strom.log.removal import LogRemoval
from strom.log.time_lookup import TimeLookup
from strom.record import encode_batch

MIXINS = (LogRecovery, DuplicateLookup, TimeLookup, LogRemoval)


def test_the_public_names_still_import_from_the_partition_log_module() -> None:
    from strom import log
    from strom.log import partition_log, results

    for name in partition_log.__all__:
        assert getattr(partition_log, name) is not None
    assert partition_log.AppendInfo is results.AppendInfo is log.AppendInfo
    assert partition_log.ReadResult is results.ReadResult is log.ReadResult
    assert partition_log.Log is log.Log
    assert callable(partition_log.now_ms)  # strom.log.manager's default clock


def test_every_attribute_a_mixin_declares_is_one_an_opened_log_has(tmp_path: Path) -> None:
    """The mixins' annotations are their contract with ``Log.__init__``: a name declared
    there but no longer set (renamed, dropped) would fail only on the path that reads it."""
    assert all(issubclass(Log, m) for m in MIXINS)
    lg = Log(tmp_path / "t-0", LogConfig(), fsync=False)
    try:
        for mixin in MIXINS:
            missing = [a for a in mixin.__annotations__ if not hasattr(lg, a)]
            assert not missing, f"{mixin.__name__} declares {missing}, which a Log lacks"
    finally:
        lg.close()


def test_recovery_warns_under_the_logs_logger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Operators filter on "strom.log": recovery's warning about a torn tail keeps that
    name though it comes from strom.log.recovery."""
    lg = Log(tmp_path / "t-0", LogConfig(), fsync=False)
    lg.append(encode_batch([b"a", b"b"]))
    lg.close()
    with open(tmp_path / "t-0" / f"{0:020d}.log", "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x40torn")  # a torn batch
    with caplog.at_level(logging.WARNING):
        lg = Log(tmp_path / "t-0", LogConfig(), fsync=False)
    try:
        assert lg.log_end_offset == 2
        (record,) = [r for r in caplog.records if "recovery truncated" in r.getMessage()]
        assert record.name == "strom.log"
    finally:
        lg.close()
