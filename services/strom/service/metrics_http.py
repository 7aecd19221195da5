"""The /metrics HTTP listener of a service, on both IP families when it listens everywhere.

Why not prometheus_client's ``start_http_server`` alone: given ``0.0.0.0`` it listens on IPv4
only, while gRPC on ``0.0.0.0`` takes IPv4 and IPv6, so on an IPv6-only Kubernetes cluster
(pods have only IPv6 addresses) the gRPC port answered and ``/metrics`` did not (found from
outside). A wildcard host (``0.0.0.0``, ``::`` or none) now binds ``::`` with IPV6_V6ONLY
off, which takes IPv4 too (as v4-mapped addresses), where the host can open IPv6 sockets at
all; elsewhere it stays ``0.0.0.0``.
"""

from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import start_http_server
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

#: Hosts that mean "every interface" in --listen.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
#: What a wildcard becomes: both families, or IPv4 alone on a host without IPv6.
DUAL_STACK = "::"
IPV4_ANY = "0.0.0.0"


def dual_stack_available() -> bool:
    """Whether this host can bind an IPv6 wildcard socket that takes IPv4 too (no IPv6 in
    the kernel, or IPV6_V6ONLY forced on: it cannot)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind((DUAL_STACK, 0))
    except OSError:
        return False
    return True


def metrics_host(listen: str) -> str:
    """The address /metrics binds for ``--listen``: its host, so a service that listens on
    loopback only (``strom dev up``) does not serve its metrics to the whole network (found
    from outside: they were bound to 0.0.0.0 regardless); a wildcard host (or none) is every
    interface of both families, ``::``, where the host has IPv6, else ``0.0.0.0``."""
    host = listen.rpartition(":")[0].strip("[]")
    if host not in WILDCARD_HOSTS:
        return host
    return DUAL_STACK if dual_stack_available() else IPV4_ANY


class _DualStackServer(ThreadingWSGIServer):
    """prometheus_client's threading WSGI server on an IPv6 socket that takes IPv4 too."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on stderr (as prometheus_client's own handler)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def start(port: int, host: str) -> None:
    """Serve /metrics on ``host``:``port`` in a daemon thread; OSError when it cannot bind.
    ``::`` (what :func:`metrics_host` makes of a wildcard) takes both IP families."""
    if host != DUAL_STACK:
        start_http_server(port, addr=host)
        return
    httpd = make_server(
        DUAL_STACK, port, make_wsgi_app(), _DualStackServer, handler_class=_QuietHandler
    )
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
