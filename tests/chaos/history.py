"""The history of a chaos run: one JSON object per line, one file per process.

Every workload process appends what it did and what came back (``op`` names the event,
``w`` the writer, ``t`` the wall time); lines are written whole and flushed at once, so a
SIGKILLed process leaves at most one torn last line, which the reader skips. The nemesis and
the final reads write their own files beside them. :func:`read_history` merges them all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class History:
    """Append-only JSON lines, safe to call from several threads."""

    def __init__(self, path: Path, **common: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self._common = common

    def write(self, op: str, **fields: Any) -> None:
        line = json.dumps({"t": round(time.time(), 4), "op": op, **self._common, **fields})
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return  # torn by a SIGKILL
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_history(directory: Path) -> list[dict[str, Any]]:
    """Every event of every file under ``directory``, in wall-time order (stable per file)."""
    events: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        events.extend(read_lines(path))
    events.sort(key=lambda e: e.get("t", 0.0))
    return events
