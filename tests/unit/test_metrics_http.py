"""Where /metrics binds for a --listen address (strom.service.metrics_http).

A wildcard listen host is both IP families (``::`` with IPV6_V6ONLY off) where the host can
open such a socket, and IPv4's ``0.0.0.0`` where it cannot (a kernel without IPv6): the
metrics port must start either way. A named host is kept, so loopback stays loopback.
"""

from __future__ import annotations

import socket
import urllib.request

import pytest

from strom.devcluster.procs import free_port, wait_for
from strom.service import metrics_http


@pytest.mark.parametrize("listen", ["0.0.0.0:9092", "[::]:9092", ":9092"])
def test_a_wildcard_is_both_families_where_the_host_has_ipv6(
    listen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_http, "dual_stack_available", lambda: True)
    assert metrics_http.metrics_host(listen) == "::"


@pytest.mark.parametrize("listen", ["0.0.0.0:9092", "[::]:9092", ":9092"])
def test_a_wildcard_falls_back_to_ipv4_on_a_host_without_ipv6(
    listen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_ipv6(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)  # type: ignore[arg-type]

    real_socket = socket.socket
    monkeypatch.setattr(metrics_http.socket, "socket", no_ipv6)
    assert not metrics_http.dual_stack_available()
    assert metrics_http.metrics_host(listen) == "0.0.0.0"
    # and the listener starts there
    monkeypatch.undo()
    port = free_port()
    metrics_http.start(port, "0.0.0.0")
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: urllib.request.urlopen(url, timeout=5).status == 200, timeout=30, what=url)


@pytest.mark.parametrize(
    ("listen", "host"),
    [
        ("127.0.0.1:9092", "127.0.0.1"),
        ("[::1]:9092", "::1"),
        ("node-1.example:9092", "node-1.example"),
    ],
)
def test_a_named_host_is_kept(listen: str, host: str) -> None:
    assert metrics_http.metrics_host(listen) == host
