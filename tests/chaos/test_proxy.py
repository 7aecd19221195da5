"""The fault proxy (tests/chaos/proxy.py) on real sockets: it names the dialling process,
stalls one direction or both and lets the stream continue where it was, delays, and resets
connections mid-stream."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.cluster import ProxyControl


class Echo:
    """A TCP server that sends back what it receives."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[ProxyControl, int]]:
    echo = Echo()
    proxy = ProxyControl(tmp_path / "proxy.log")
    try:
        port = proxy.command(cmd="listen", name="echo", upstream=echo.port, port=0)["port"]
        proxy.command(cmd="pid", pid=os.getpid(), name="tester")
        yield proxy, port
    finally:
        proxy.close()
        echo.close()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"hello")
    assert s.recv(5) == b"hello"  # the connection is up (and identified) before any rule
    return s


def test_stall_both_ways_holds_bytes_and_healing_delivers_them_in_order(
    proxied: tuple[ProxyControl, int],
) -> None:
    proxy, port = proxied
    s = _connect(port)
    proxy.command(cmd="rules", rules=[{"kind": "stall", "from": ["tester"], "to": ["echo"]}])
    s.sendall(b"during")
    s.settimeout(1.0)
    with pytest.raises(TimeoutError):  # nothing can come back while the partition lasts
        s.recv(10)
    proxy.command(cmd="rules", rules=[])
    s.settimeout(5)
    got = b""
    while len(got) < 6:
        got += s.recv(10)
    assert got == b"during"
    assert proxy.command(cmd="stats")["unidentified"] == 0


def test_one_way_stall_of_answers_lets_requests_through(proxied: tuple[ProxyControl, int]) -> None:
    proxy, port = proxied
    s = _connect(port)
    proxy.command(cmd="rules", rules=[{"kind": "stall", "from": ["echo"], "to": ["tester"]}])
    s.sendall(b"x" * 10)
    s.settimeout(1.0)
    with pytest.raises(TimeoutError):
        s.recv(10)
    proxy.command(cmd="rules", rules=[])
    s.settimeout(5)
    assert s.recv(10) == b"x" * 10


def test_a_rule_for_another_process_leaves_this_one_alone(
    proxied: tuple[ProxyControl, int],
) -> None:
    proxy, port = proxied
    s = _connect(port)
    proxy.command(cmd="rules", rules=[{"kind": "stall", "from": ["node-*"], "to": ["echo"]}])
    s.sendall(b"free")
    assert s.recv(4) == b"free"


def test_delay(proxied: tuple[ProxyControl, int]) -> None:
    proxy, port = proxied
    s = _connect(port)
    proxy.command(cmd="rules", rules=[{"kind": "delay", "from": ["*"], "to": ["*"], "ms": 300}])
    start = time.monotonic()
    s.sendall(b"slow")
    assert s.recv(4) == b"slow"
    assert time.monotonic() - start >= 0.55  # 300 ms each way


def test_reset_cuts_live_connections(proxied: tuple[ProxyControl, int]) -> None:
    proxy, port = proxied
    s = _connect(port)
    assert proxy.command(cmd="reset", **{"from": ["*"], "to": ["echo"]})["reset"] == 1
    s.settimeout(5)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        s.sendall(b"more")
        if not s.recv(10):
            raise ConnectionResetError("closed")
