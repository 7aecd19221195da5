"""``strom dev up --port``: the first storage node listens on Kafka's 9092 by default (the
README's snippets name 127.0.0.1:9092), on ``--port`` when given, and a directory's nodes keep
their ports across ``dev down`` / ``dev up``.

Found from outside: ``dev up`` took free ports only, so the README's
``Admin("127.0.0.1:9092")`` waited 60 s and raised BrokerNotAvailableError, and every
``dev up`` moved the ports, so an exported STROM_BOOTSTRAP went stale.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from strom.cli.dev import DEFAULT_PORT, _node_ports
from strom.devcluster.procs import free_port, port_free

pytestmark = pytest.mark.integration

SMALL = ("--nodes", "2", "--controllers", "1", "--coordinators", "0")


def strom(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k != "STROM_BOOTSTRAP"},
    )


def bootstrap_of(up: subprocess.CompletedProcess[str]) -> str:
    assert up.returncode == 0, up.stderr
    (line,) = [x for x in up.stdout.splitlines() if x.startswith("bootstrap: ")]
    return line.removeprefix("bootstrap: ")


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "dev"
    yield root
    if (root / "cluster.json").exists():
        strom("dev", "down", "--dir", str(root))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port some other program holds (9092 if free: the default must find it taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", DEFAULT_PORT if port_free(DEFAULT_PORT) else 0))
        s.listen()
        yield s


def test_the_port_is_kept_across_down_and_up(dev_dir: Path) -> None:
    port = free_port()
    first = bootstrap_of(strom("dev", "up", *SMALL, "--dir", str(dev_dir), "--port", str(port)))
    assert first.split(",")[0] == f"127.0.0.1:{port}"
    assert strom("dev", "down", "--dir", str(dev_dir)).returncode == 0
    again = strom("dev", "up", *SMALL, "--dir", str(dev_dir))
    assert bootstrap_of(again) == first  # every node's port: an exported bootstrap holds
    assert "is taken" not in again.stdout


def test_a_taken_port_given_is_one_line_error(dev_dir: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    up = strom("dev", "up", *SMALL, "--dir", str(dev_dir), "--port", str(port), timeout=60)
    assert up.returncode == 1 and up.stdout == ""
    assert up.stderr.strip() == (
        f"strom dev: error: --port {port}: 127.0.0.1:{port} is taken; choose another port"
    )
    assert not (dev_dir / "cluster.json").exists()  # nothing started


def test_a_taken_default_port_falls_back_and_says_so(
    dev_dir: Path, listener: socket.socket
) -> None:
    # The listener holds 9092, or another program already did: taken all the same.
    up = strom("dev", "up", *SMALL, "--dir", str(dev_dir))
    node1 = bootstrap_of(up).split(",")[0]
    assert node1 != f"127.0.0.1:{DEFAULT_PORT}"
    assert (
        f"storage node 1: port {DEFAULT_PORT} (the default) is taken, so it listens on "
        f"{node1} instead"
    ) in up.stdout


def test_the_default_is_kafkas_port(tmp_path: Path) -> None:
    wanted, taken = _node_ports(tmp_path, 3, None)
    if port_free(DEFAULT_PORT):
        assert wanted == {1: DEFAULT_PORT} and taken == {}
    else:
        assert wanted == {} and taken == {1: f"port {DEFAULT_PORT} (the default)"}
