"""Metrics every strom service process exports, whatever its role.

Why a ``service`` label instead of a name per role: these series come from the shared runtime
(the etcd client, the event loop, the build), so one name with ``service="storage"|"controller"|
"coordinator"`` lets one dashboard query cover all roles. The role-specific metrics carry the
role in their name (``strom_storage_*``, ``strom_controller_*``, ``strom_coordinator_*``).

:func:`set_service` is called once per process, before anything is observed (the services'
``run`` functions); the label children used on every call are cached per service.

``strom_build_info`` is the join target for dashboards: ``process_*`` series have no
``service`` label, so panels multiply them by ``strom_build_info`` to pick strom's targets and
name their role.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
from prometheus_client import Gauge, Histogram

import strom
from strom.errors import error_name

R = TypeVar("R")

#: Buckets for RPC handling time (the same as the storage node's, so panels line up).
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: Buckets for event-loop scheduling delay: a healthy loop answers in well under a millisecond.
QUEUE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

BUILD_INFO = Gauge(
    "strom_build_info",
    "Always 1; the strom version and the role of the process (join other series on it)",
    ["service", "version"],
)
SECURITY = Gauge(
    "strom_service_security",
    "1 when this process has the security setting on, 0 when off: tls (--tls-cert), "
    "client_auth (--tls-client-auth required), tokens (--auth-tokens), acls (--acls). Every "
    "process of a cluster should have the same; a process that differs serves what the others "
    "refuse (alert StromSecuritySettingsDiffer)",
    ["service", "setting"],
)
REQUEST_QUEUE = Histogram(
    "strom_service_request_queue_seconds",
    "How long a ready request handler waits for the event loop before it runs: the delay of a "
    "callback scheduled every 100 ms (the asyncio form of Kafka's request queue time)",
    ["service"],
    buckets=QUEUE_BUCKETS,
)

#: The role of this process, as used in the ``service`` label ("" until set_service).
SERVICE = ""

#: Names the runtime's Service objects use -> the short role names of metric labels.
_ROLE = {"storage-node": "storage", "controller": "controller", "coordinator": "coordinator"}


def role_of(service_name: str) -> str:
    """``storage-node`` -> ``storage``; controller and coordinator stay as they are."""
    return _ROLE.get(service_name, service_name)


def set_service(service_name: str) -> None:
    """Name this process's role in the shared metrics and publish ``strom_build_info``."""
    global SERVICE
    SERVICE = role_of(service_name)
    BUILD_INFO.labels(SERVICE, strom.__version__).set(1)


def publish_security(*, tls: bool, client_auth: bool, tokens: bool, acls: bool) -> None:
    """``strom_service_security`` of this process (after :func:`set_service`)."""
    for setting, on in (
        ("tls", tls),
        ("client_auth", client_auth),
        ("tokens", tokens),
        ("acls", acls),
    ):
        SECURITY.labels(SERVICE, setting).set(1 if on else 0)


async def sample_loop_lag(stop: asyncio.Event, interval_s: float = 0.1) -> None:
    """Observe how late a callback scheduled with ``call_soon`` runs, every ``interval_s``.

    A gRPC request's handler is such a callback: while the loop is busy decoding a large
    Produce or replaying a shard, every request that arrived waits in the ready queue for
    this long before its handler starts.
    """
    loop = asyncio.get_running_loop()
    hist = REQUEST_QUEUE.labels(SERVICE)
    while not stop.is_set():
        ran = loop.create_future()
        t0 = time.perf_counter()
        loop.call_soon(lambda f=ran: f.done() or f.set_result(time.perf_counter()))
        hist.observe(max(await ran - t0, 0.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


def result_code(
    resp: Any, fields: Iterable[str] = ("topics", "results", "partitions", "groups")
) -> int:
    """The outcome of an RPC: its whole-request error, else the first item's error (NONE = 0).

    Nested items (``topics[].partitions[]``) are looked at one level deep, as the answers
    of strom's admin and group RPCs are shaped. Runs once per request on the node's hot
    path: which fields a message type has is looked up once per type (a ``getattr`` of a
    field a protobuf message does not have raises inside, ~13 µs per Produce answer).
    """
    code = _error_code(resp)
    if code:
        return code
    for name in fields:
        if not _has(resp, name):
            continue
        for item in getattr(resp, name):
            code = _error_code(item)
            if code:
                return code
            if _has(item, "partitions"):
                for sub in item.partitions:
                    code = _error_code(sub)
                    if code:
                        return code
    return 0


def _error_code(obj: Any) -> int:
    return int(obj.error_code or 0) if _has(obj, "error_code") else 0


_HAS: dict[tuple[type, str], bool] = {}


def _has(obj: Any, name: str) -> bool:
    """Whether ``obj`` has the field ``name``: for a protobuf message, its type's descriptor
    says (cached per type); anything else is asked each time."""
    key = (type(obj), name)
    known = _HAS.get(key)
    if known is None:
        fields = getattr(getattr(type(obj), "DESCRIPTOR", None), "fields_by_name", None)
        if fields is None:
            return hasattr(obj, name)
        known = _HAS[key] = name in fields
    return known


def failure_result(exc: BaseException, context: Any) -> str:
    """The ``result`` label of a handler that raised: ``CANCELLED`` when the call was
    cancelled (the client went away or gave up, e.g. during a long-poll Fetch), the gRPC
    status a handler ended the call with (``context.abort``, e.g. ``RESOURCE_EXHAUSTED`` for a
    shed Produce), else ``UNKNOWN_SERVER_ERROR``. A fixed set, not the exception's class name,
    so the label's values stay few and mean the same as the error codes of answers."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    code = None
    with contextlib.suppress(Exception):
        code = context.code() if context is not None else None
    if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
        return str(code.name)
    return "UNKNOWN_SERVER_ERROR"


def timed_rpcs(
    cls: type,
    histogram: Histogram,
    rpcs: Iterable[str],
    result_of: Callable[[Any], int] = result_code,
) -> type:
    """Wrap the ``rpcs`` methods of servicer class ``cls`` so that each call observes its
    handling time in ``histogram{rpc, result}``, result being the error name of the answer
    (``NONE`` on success; :func:`failure_result` if the handler raised).

    Applied to the class once at import; the servicer code itself stays unchanged.
    """
    for rpc in rpcs:
        fn = getattr(cls, rpc)
        setattr(cls, rpc, _timed(rpc, fn, histogram, result_of))
    return cls


def timed(
    rpc: str, histogram: Histogram, result_of: Callable[[Any], int] = result_code
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """:func:`timed_rpcs` as a decorator of one handler (``@timed("Produce", HIST)``)."""
    return lambda fn: _timed(rpc, fn, histogram, result_of)


def _timed(
    rpc: str,
    fn: Callable[..., Awaitable[R]],
    histogram: Histogram,
    result_of: Callable[[Any], int],
) -> Callable[..., Awaitable[R]]:
    children: dict[str, Any] = {}

    def child(result: str) -> Any:
        c = children.get(result)
        if c is None:
            c = children[result] = histogram.labels(rpc, result)
        return c

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> R:
        t0 = time.perf_counter()
        result = "NONE"
        try:
            resp = await fn(self, request, context)
            result = error_name(result_of(resp))
            return resp
        except BaseException as exc:
            result = failure_result(exc, context)
            raise
        finally:
            child(result).observe(time.perf_counter() - t0)

    return wrapper
