"""Process helpers of local clusters (strom.devcluster.procs): waits and start failures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from strom.devcluster.procs import ClusterError, ManagedProcess, ProcessExited, wait_for


def test_wait_for_ends_at_once_when_a_process_it_waits_on_exited() -> None:
    """Found from outside: the error a condition raised for an exited member was retried
    until the timeout (`strom dev up` waited 60 s), then shown inside the timeout's message."""
    calls = []

    def exited() -> bool:
        calls.append(1)
        raise ProcessExited("storage-node 1 exited during start")

    with pytest.raises(ProcessExited, match="storage-node 1 exited"):
        wait_for(exited, timeout=5, what="storage-node 1 to serve", interval=0.01)
    assert len(calls) == 1


def test_wait_for_retries_other_errors_and_names_the_last_on_timeout() -> None:
    calls = []

    def failing() -> bool:
        calls.append(1)
        raise ConnectionError(f"refused {len(calls)}")

    with pytest.raises(ClusterError, match=r"waiting for a node .*refused") as info:
        wait_for(failing, timeout=0.05, what="a node", interval=0.01)
    assert not isinstance(info.value, ProcessExited)
    assert len(calls) >= 2


def test_an_exit_during_start_shows_this_run_s_last_log_lines_only(tmp_path: Path) -> None:
    """The log file is appended across runs: a start failure shows what this run wrote, as
    lines, not the earlier runs' lines."""
    log = tmp_path / "node.log"
    say = "import sys; [print(a) for a in sys.argv[1:]]; sys.exit(3)"
    first = ManagedProcess("n", [sys.executable, "-c", say, "old run"], log).start()
    first.proc.wait()  # type: ignore[union-attr]
    lines = [f"line {i}" for i in range(20)]
    second = ManagedProcess("n", [sys.executable, "-c", say, *lines, "the reason"], log).start()
    second.proc.wait()  # type: ignore[union-attr]
    msg = str(second.exited("storage-node 1"))
    head, tail = msg.split("\n", 1)
    assert head == f"storage-node 1 exited with status 3 during start; the end of its log ({log}):"
    assert tail.splitlines() == [*lines[-7:], "the reason"]
    assert "old run" not in msg
