"""strom.clock: the wall clock with the test offset, and the slewed clock the coordinator's
deadlines use (it follows a step of the wall clock at most 5 % faster or slower, never by a
jump)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from strom.clock import OFFSET_ENV


def _run(offset: Path, body: str) -> None:
    # A process of its own: the offset file is named at import.
    offset.write_text("0")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)],
        env={**os.environ, OFFSET_ENV: str(offset)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_wall_clock_step_moves_steady_ms_by_at_most_the_slew(tmp_path: Path) -> None:
    offset = tmp_path / "clock.ms"
    _run(
        offset,
        f"""
        import pathlib, time
        from strom.clock import SLEW, steady_ms, wall_ms
        # Each steady reading is bracketed by two monotonic ones: a process descheduled
        # between two reads must not look like the clock running fast or slow (CI saw
        # moved 126 ms against 112 ms measured after the reading, not around it).
        t0a = time.monotonic()
        w0, s0 = wall_ms(), steady_ms()
        t0b = time.monotonic()
        assert abs(s0 - w0) < 50, (s0, w0)  # it reads like the wall clock

        def check():
            before = time.monotonic()
            moved = steady_ms() - s0
            after = time.monotonic()
            low, high = (before - t0b) * 1000, (after - t0a) * 1000
            assert low * (1 - SLEW) - 2 <= moved <= high * (1 + SLEW) + 2, (moved, low, high)

        offset = pathlib.Path({str(offset)!r})
        offset.write_text("600000")  # ten minutes forward
        while wall_ms() - w0 < 600000:  # the file is re-read within 0.1 s
            time.sleep(0.01)
        for _ in range(20):
            time.sleep(0.01)
            check()
        offset.write_text("-600000")  # and back, past where it started
        while wall_ms() - w0 > -300000:
            time.sleep(0.01)
        last = steady_ms()
        for _ in range(20):
            time.sleep(0.01)
            check()
            assert steady_ms() >= last  # never backwards
            last = steady_ms()
        print("ok")
        """,
    )


def test_steady_ms_catches_up_with_a_small_step(tmp_path: Path) -> None:
    offset = tmp_path / "clock.ms"
    _run(
        offset,
        f"""
        import pathlib, time
        from strom.clock import steady_ms, wall_ms
        steady_ms()
        pathlib.Path({str(offset)!r}).write_text("100")  # 0.1 s: caught up in ~2 s at 5 %
        while wall_ms() - steady_ms() < 50:  # the file is re-read within 0.1 s
            time.sleep(0.01)
        t0 = time.monotonic()
        while wall_ms() - steady_ms() > 2:
            assert time.monotonic() - t0 < 20, (wall_ms(), steady_ms())
            time.sleep(0.02)
        took = time.monotonic() - t0
        assert took > 0.9, took  # slewed (at most 5 % of the time that passes), not stepped
        print("ok")
        """,
    )
