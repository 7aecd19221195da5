"""strom.clock: the wall clock with the test offset, and the steady clock the coordinator's
deadlines use (it never jumps within a process, whatever the wall clock does)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from strom.clock import OFFSET_ENV

JUMP_MS = 600_000


def test_a_wall_clock_jump_moves_wall_ms_and_not_steady_ms(tmp_path: Path) -> None:
    # A process of its own: the offset file is named at import.
    offset = tmp_path / "clock.ms"
    offset.write_text("0")
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from strom.clock import steady_ms, wall_ms
        w0, s0, t0 = wall_ms(), steady_ms(), time.monotonic()
        assert abs(s0 - w0) < 50, (s0, w0)  # it reads like the wall clock
        pathlib.Path({str(offset)!r}).write_text("{JUMP_MS}")
        while wall_ms() - w0 < {JUMP_MS}:  # the file is re-read within 0.1 s
            time.sleep(0.01)
        elapsed_ms = (time.monotonic() - t0) * 1000
        assert abs((steady_ms() - s0) - elapsed_ms) < 50, (steady_ms() - s0, elapsed_ms)
        pathlib.Path({str(offset)!r}).write_text("-{JUMP_MS}")
        while wall_ms() - w0 > -{JUMP_MS // 2}:
            time.sleep(0.01)
        elapsed_ms = (time.monotonic() - t0) * 1000
        assert abs((steady_ms() - s0) - elapsed_ms) < 50, (steady_ms() - s0, elapsed_ms)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, OFFSET_ENV: str(offset)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
