"""Run the Node.js programs of tests/node (strom's RecordService from @grpc/grpc-js) from
pytest: start one, read the JSON lines it prints, wait for conditions on them, send it
commands on stdin.

Node.js and the packages are installed by scripts/bootstrap.sh (``npm ci``); a machine
without them fails these tests with that instruction rather than skipping them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NODE_DIR = Path(__file__).resolve().parents[1] / "node"


def node_binary() -> str:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        raise RuntimeError(
            "the Node.js tests need node and tests/node/node_modules: run scripts/bootstrap.sh "
            "(it installs nodejs/npm from Debian and runs npm ci in tests/node)"
        )
    return node


class NodeProgram:
    """One running ``node tests/node/<script>``; every JSON line it prints is kept."""

    def __init__(self, script: str, *args: str, log_dir: Path | None = None) -> None:
        self.script = script
        self.lines: list[dict[str, Any]] = []
        self.stderr_path = (log_dir or Path("/tmp")) / f"{Path(script).stem}-{id(self)}.stderr"
        self._stderr = self.stderr_path.open("wb")
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [node_binary(), str(NODE_DIR / script), *args],
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = {"event": "unparsed", "text": raw.decode(errors="replace")}
            with self._cond:
                self.lines.append(obj)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [x for x in self.lines if name is None or x.get("event") == name]

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float, what: str
    ) -> Any:
        """Wait until ``predicate(lines)`` is truthy; fails with the program's output."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                got = predicate(self.lines)
                if got:
                    return got
                left = end - time.monotonic()
                if left <= 0:
                    break
                if self.proc.poll() is not None and not self._reader.is_alive():
                    got = predicate(self.lines)
                    if got:
                        return got
                    break
                self._cond.wait(min(left, 0.5))
        raise AssertionError(
            f"node {self.script}: {what} not seen within {timeout} s "
            f"(exit code {self.proc.poll()}); last lines {self.lines[-5:]}; stderr "
            f"{self.stderr_path.read_text(errors='replace')[-2000:]}"
        )

    def last(self, name: str) -> dict[str, Any] | None:
        found = self.events(name)
        return found[-1] if found else None

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def result(self, timeout: float) -> dict[str, Any]:
        """For run-to-completion programs: the one JSON line printed, once it exits 0."""
        code = self.wait_exit(timeout)
        assert code == 0, (
            f"node {self.script} exited {code}: {self.lines[-3:]} "
            f"{self.stderr_path.read_text(errors='replace')[-2000:]}"
        )
        return self.lines[-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._stderr.close()

    def __enter__(self) -> NodeProgram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
