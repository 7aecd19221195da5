"""The partition manager short of file descriptors (strom.storage.manager): it keeps
FD_RESERVE of them free, leaves the logs that do not fit (or whose open fails with EMFILE)
unopened and reports them, without a traceback per partition; logs already open (at start
the data dir's) are hosted whatever is left."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import pytest

from strom.api import metadata_pb2 as md
from strom.metadata import ClusterView, Keys
from strom.storage import manager as manager_module
from strom.storage.assignment import Assignment
from strom.storage.manager import PartitionManager


class _Store:
    keys = Keys("unit")


def _assignment(p: int) -> Assignment:
    return Assignment("t", p, "tid", md.PartitionState(replicas=[1], leader=1, isr=[1]))


def _manager(tmp_path: Path) -> PartitionManager:
    mgr = PartitionManager(1, ClusterView(_Store()), None, fsync=False)  # type: ignore[arg-type]
    mgr.open(tmp_path)
    return mgr


def test_logs_beyond_the_reserve_are_left_unopened_but_open_ones_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = _manager(tmp_path)
    assert mgr.logs is not None
    mgr.logs.get_or_create("t", 0)  # already open (as the data dir's logs at start)

    async def main() -> None:
        mgr.loop = asyncio.get_running_loop()
        # As if the process were at its limit: nothing new fits above the reserve.
        monkeypatch.setattr(manager_module, "nofile_limit", lambda: 100)
        monkeypatch.setattr(manager_module, "open_fd_count", lambda: 90)
        created, short = mgr._create_logs([_assignment(0), _assignment(1)])
        assert [a.tp for a, _ in created] == [("t", 0)]
        assert list(short) == [("t", 1)] and "file descriptors" in short[("t", 1)]
        assert mgr.logs is not None and mgr.logs.get("t", 1) is None

    asyncio.run(main())


def test_an_open_failing_with_emfile_is_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = _manager(tmp_path)
    assert mgr.logs is not None

    def emfile(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(mgr.logs, "get_or_create", emfile)

    async def main() -> None:
        mgr.loop = asyncio.get_running_loop()
        created, short = mgr._create_logs([_assignment(p) for p in range(20)])
        assert not created and len(short) == 20
        mgr._note_unopened(short)
        mgr._note_unopened(short)  # the next retry, within the minute: no line
        assert len(mgr.unopened) == 20

    with caplog.at_level(logging.INFO, logger="strom.storage.manager"):
        asyncio.run(main())
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and not lines[0].exc_info
    assert "could not open the logs of 20 partitions" in lines[0].getMessage()
