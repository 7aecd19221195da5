"""A real gRPC proxy for fault injection: it forwards every call to one upstream server as raw
bytes and can hold a chosen call until a later one has been answered — the reordering that
gRPC allows between separate unary calls on one channel (DESIGN §6, "Order on the wire"),
made to happen on purpose instead of by luck.

Put it in front of a storage node (start the node with ``--advertise 127.0.0.1:<proxy port>``)
so that every client and peer reaches the node through it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import free_port

#: Methods the proxy forwards as server streams (every other one is unary).
_UNARY_STREAM = {"/grpc.health.v1.Health/Watch"}
#: Methods the proxy does not know (answered UNIMPLEMENTED, as a node of an older version
#: would): clients then make Produce and Fetch unary calls, whose order the proxy can change.
_UNKNOWN = {"/strom.v1.StorageService/ProduceStream", "/strom.v1.StorageService/FetchStream"}


@dataclass
class Hold:
    """One planned reordering: the ``nth`` call of ``method`` waits until ``after`` more calls
    of the same method have been answered by the upstream server."""

    method: str
    nth: int
    after: int = 1
    #: How long to wait for the later calls before letting the held one through anyway
    #: (None: the proxy's ``hold_timeout_s``).
    timeout_s: float | None = None
    #: Set when the chosen call arrived and is being held.
    held: threading.Event = field(default_factory=threading.Event)
    #: Set when the held call was let through because the later ones were answered.
    released: threading.Event = field(default_factory=threading.Event)
    #: True when the later calls never came and the hold gave up (the test should fail).
    gave_up: bool = False
    #: Only calls whose request this accepts count towards ``nth`` (None: every call): a
    #: test can pick its own call out of a service's background ones (a shard load's
    #: fence append, say). See :func:`produce_to`.
    matches: Callable[[bytes], bool] | None = None
    _seen: int = 0
    _answered_after: int = 0


class GrpcProxy:
    """Forwards 127.0.0.1:<port> to ``upstream`` call by call (see the module docstring)."""

    def __init__(self, upstream: str, port: int = 0, *, hold_timeout_s: float = 20.0) -> None:
        self.hold_timeout_s = hold_timeout_s
        self._channel = grpc.insecure_channel(upstream)
        self._lock = threading.Lock()
        self._holds: list[Hold] = []
        self._every: dict[str, tuple[int, int]] = {}
        self._made: dict[str, list[Hold]] = {}
        self.calls: dict[str, int] = {}
        self._server = grpc.server(ThreadPoolExecutor(max_workers=64))
        self._server.add_generic_rpc_handlers([_Forwarder(self)])
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self._server.start()

    def hold(
        self,
        method: str,
        nth: int = 1,
        after: int = 1,
        matches: Callable[[bytes], bool] | None = None,
    ) -> Hold:
        """Hold the ``nth`` call of ``method`` (counted from now, 1-based, among the calls
        ``matches`` accepts) until ``after`` later calls of it have been answered upstream."""
        h = Hold(method, nth, after, matches=matches)
        with self._lock:
            self._holds.append(h)
        return h

    def reorder(self, method: str, every: int) -> list[Hold]:
        """From now on hold every ``every``-th call of ``method`` until the next one was
        answered; returns the (growing) list of those holds."""
        with self._lock:
            self._every[method] = (every, 0)
            return self._made.setdefault(method, [])

    def close(self) -> None:
        with self._lock:
            holds, self._holds = self._holds, []
        for h in holds:
            h.released.set()
        self._server.stop(0)
        self._channel.close()

    # -- forwarding -------------------------------------------------------------------------

    def _before(self, method: str, request: bytes) -> Hold | None:
        """Count the call; the hold it must wait on, if it is a chosen one."""
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            if method in self._every:
                every, n = self._every[method]
                self._every[method] = (every, n + 1)
                if (n + 1) % every == 0:
                    # Short: the last call of a burst has no later one to wait for.
                    h = Hold(method, 1, timeout_s=1.0)
                    h.held.set()
                    self._holds.append(h)
                    self._made[method].append(h)
                    return h
            for h in self._holds:
                if h.method == method and not h.held.is_set():
                    if h.matches is not None and not h.matches(request):
                        continue
                    h._seen += 1
                    if h._seen == h.nth:
                        h.held.set()
                        return h
        return None

    def _after(self, method: str) -> None:
        with self._lock:
            for h in self._holds:
                if h.method == method and h.held.is_set() and not h.released.is_set():
                    h._answered_after += 1
                    if h._answered_after >= h.after:
                        h.released.set()

    def unary(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        call = self._channel.unary_unary(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            hold = self._before(method, request)
            wait = hold.timeout_s if hold is not None and hold.timeout_s else self.hold_timeout_s
            if hold is not None and not hold.released.wait(wait):
                hold.gave_up = True
                hold.released.set()
            try:
                return call(
                    request,
                    timeout=context.time_remaining(),
                    metadata=_forwarded(context.invocation_metadata()),
                )
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or "")
            finally:
                if hold is None:
                    self._after(method)

        return handle

    def server_stream(self, method: str) -> Callable[[bytes, grpc.ServicerContext], object]:
        call = self._channel.unary_stream(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> object:
            responses = call(request, metadata=_forwarded(context.invocation_metadata()))
            context.add_callback(responses.cancel)
            try:
                yield from responses
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    context.abort(exc.code(), exc.details() or "")

        return handle


def produce_to(topic: str) -> Callable[[bytes], bool]:
    """A :attr:`Hold.matches` for the Produce calls that append to ``topic``."""
    from strom.api import storage_pb2

    def matches(request: bytes) -> bool:
        return any(t.topic == topic for t in storage_pb2.ProduceRequest.FromString(request).topics)

    return matches


def _forwarded(metadata: Any) -> list[tuple[str, Any]]:
    """The caller's own metadata (e.g. the coordinators' internal-topics header), without
    the transport's (pseudo-headers, user-agent, grpc-*), which the proxy's call sets."""
    return [
        (m.key, m.value)
        for m in metadata or ()
        if not m.key.startswith((":", "grpc-")) and m.key != "user-agent"
    ]


class _Forwarder(grpc.GenericRpcHandler):
    def __init__(self, proxy: GrpcProxy) -> None:
        self.proxy = proxy

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method in _UNKNOWN:
            return None
        if method in _UNARY_STREAM:
            return grpc.unary_stream_rpc_method_handler(self.proxy.server_stream(method))
        return grpc.unary_unary_rpc_method_handler(self.proxy.unary(method))


@contextlib.contextmanager
def cluster_behind_proxy(root: Path, **kwargs: Any) -> Iterator[tuple[LocalCluster, GrpcProxy]]:
    """A started one-node LocalCluster (``kwargs``: its other arguments) whose node every
    client and service reaches through a :class:`GrpcProxy` (the node advertises the proxy's
    port); both are stopped on exit."""
    proxy_port = free_port()
    node_args = [*kwargs.pop("node_args", []), "--advertise", f"127.0.0.1:{proxy_port}"]
    cluster = LocalCluster(root, nodes=1, node_args=node_args, **kwargs)
    proxy = GrpcProxy(f"127.0.0.1:{cluster.nodes[0].port}", proxy_port)
    try:
        cluster.start()
        yield cluster, proxy
    finally:
        proxy.close()
        cluster.kill()
