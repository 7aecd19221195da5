"""Run one asyncio gRPC service with health checking, reflection, Prometheus metrics,
structured logs and graceful SIGTERM handling.

A service provides a :class:`Service` object; :func:`run_service` owns the event loop, the
server and the order of shutdown: stop accepting, mark NOT_SERVING, let the service hand over
leadership and release leases, then finish in-flight RPCs within the grace period.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import re
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strom import __version__, security
from strom.grpc_options import GRPC_OPTIONS, SERVER_KEEPALIVE_OPTIONS
from strom.metadata import metrics as metadata_metrics
from strom.security import principal
from strom.security.tls_reload import POLL_INTERVAL_S, init_etcd_metrics
from strom.service import metrics, metrics_http, reflection_v1
from strom.service.decode_guard import DecodeGuard
from strom.service.gc_pauses import freeze_started_heap, observe_gc_pauses
from strom.service.health import HealthServicer
from strom.service.limits import ServerLimits

if TYPE_CHECKING:
    from strom.security.tls_reload import TlsFiles

log = logging.getLogger("strom.service")


class Service(Protocol):
    """What a strom service implements."""

    name: str

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Add servicers to ``server``; return their full service names (for reflection)."""

    async def start(self) -> None:
        """Connect to etcd, register, start background tasks (after the port is bound)."""

    async def stop(self) -> None:
        """Hand over leadership/ownership and release leases (before in-flight RPCs end)."""


#: The gRPC health service name of readiness (the chart's readiness probes ask it). A service
#: may have a ``readiness`` object with ``async run(report, stop)`` that reports more than
#: "started" (a storage node: back in its ISRs); for the others it follows the overall status.
READY_SERVICE = "strom.ready"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            out.update(extra)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _CancelledRpcFilter(logging.Filter):
    """Drops grpc.aio's error record for an RPC cancelled while the server stops (its
    ``CancelledError`` "not handled by _handle_exceptions"): a call in flight at a stop is
    cancelled by design, and the traceback it logged ended a refused start's one-line reason
    (found in CI: a readiness probe's Health/Check cancelled as a node refused another
    cluster's data dir put a traceback in the error `strom dev up` printed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (
            record.name.startswith("grpc.")
            and isinstance(exc, asyncio.CancelledError)
            and "not handled by _handle_exceptions" in record.getMessage()
        )


#: A setting whose name contains one of these holds a secret itself (not a file's path):
#: its value is never logged.
_SECRET_NAME = re.compile(r"password|passphrase|secret|credential", re.IGNORECASE)
#: What a hidden value reads as.
HIDDEN = "<hidden>"


def loggable_settings(settings: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """The settings a service runs with (flags > ``STROM_*`` environment > ``--config``
    file, as parsed), by name, with the values of secrets hidden (an unset one stays None,
    so the line still says it was not given)."""
    items = vars(settings) if isinstance(settings, argparse.Namespace) else dict(settings)
    out: dict[str, Any] = {}
    for name in sorted(items):
        value = items[name]
        if callable(value):  # argparse's func= of a subcommand
            continue
        out[name] = HIDDEN if value is not None and _SECRET_NAME.search(name) else value
    return out


def always_info(
    logger: logging.Logger, msg: str, *args: object, extra: Mapping[str, Any] | None = None
) -> None:
    """An INFO line written whatever the logger's level: the lines an operator must see to
    know what a service runs with (its start line, a level change) would otherwise vanish
    in a service started at ``warning``. Handlers and
    filters still apply; only the level check is skipped."""
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, msg, args, None, extra=extra)
    logger.handle(record)


def setup_logging(
    level: str = "info",
    service: str = "strom",
    settings: argparse.Namespace | Mapping[str, Any] | None = None,
) -> None:
    """JSON lines on stderr at ``level`` (the start level; strom.service.log_levels changes it
    at run time), and the service's first line: its version and, with ``settings``, the
    effective configuration in the ``config`` field (secrets hidden), so the logs tell
    which version ran with which etcd, ports, data dir or limits."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    handler.addFilter(_CancelledRpcFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    fields: dict[str, Any] = {
        "version": __version__,
        "python": platform.python_version(),
        "pid": os.getpid(),
    }
    if settings is not None:
        fields["config"] = loggable_settings(settings)
    always_info(
        logging.getLogger("strom"),
        "starting %s %s (python %s, pid %d)%s",
        service,
        __version__,
        fields["python"],
        fields["pid"],
        "; settings in 'config'" if settings is not None else "",
        extra={"fields": fields},
    )


#: How long a service's stop() may take unless it says otherwise (``stop_timeout_s``).
DEFAULT_STOP_TIMEOUT_S = 10.0


#: How often an idle service looks at its TLS files (a busy one looks at each connection).
TLS_FILES_LOOK_S = 10.0
#: How soon it looks again at a changed set it could not use yet (TlsFiles.look_again_soon).
TLS_FILES_LOOK_AGAIN_S = POLL_INTERVAL_S


async def _watch_tls_files(files: TlsFiles, stop: asyncio.Event) -> None:
    """Look at the TLS files now and then even without traffic: an idle service (a standby
    controller) kept an expired certificate's end in its gauge after a renewal, and a bad new
    set was never reported. A changed set that fails is refused only
    when it still fails at the next look, so that look comes a second later, not ten: an idle
    service reported a bad renewal 10-20 s after it was written (its tests waited so)."""
    while not stop.is_set():
        wait_s = TLS_FILES_LOOK_AGAIN_S if files.look_again_soon else TLS_FILES_LOOK_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=wait_s)
        try:
            files.maybe_reload()
        except Exception:  # the next look tries again
            log.exception("looking at the TLS files failed")


async def serve(
    service: Service,
    listen: str,
    metrics_port: int | None,
    *,
    grace_s: float | None = None,
    metrics_host: str = "0.0.0.0",
    limits: ServerLimits | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then shut down in order. ``service.stop()`` gets
    ``grace_s`` (default: the service's own ``stop_timeout_s``, else 10 s) before the process
    gives up on it."""
    if grace_s is None:
        grace_s = float(getattr(service, "stop_timeout_s", DEFAULT_STOP_TIMEOUT_S))
    metrics.set_service(service.name)
    metadata_metrics.init_service()
    principal.init_service_metrics()
    observe_gc_pauses()
    sec = security.server_security()
    if sec.files is not None:
        sec.files.init_metrics()
    init_etcd_metrics(security.etcd().cert)
    metrics.publish_security(
        tls=sec.tls,
        client_auth=sec.client_auth == "required",
        tokens=sec.tokens is not None,
        acls=sec.acls,
    )
    server_limits = limits or ServerLimits()
    server = grpc.aio.server(
        options=[*GRPC_OPTIONS, *SERVER_KEEPALIVE_OPTIONS, *server_limits.grpc_options()],
        interceptors=[DecodeGuard(), *security.interceptors(sec)],
    )
    names = service.register(server)
    health_servicer = HealthServicer()
    # grpc's HealthServicer starts with "" = SERVING; until service.start() has finished
    # (etcd registration, recovery, ...) the process must not look ready to probes and tests.
    for name in ["", READY_SERVICE, *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection_v1.enable(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name], server
    )
    try:
        if sec.tls:
            bound = server.add_secure_port(listen, sec.credentials())
        else:
            bound = server.add_insecure_port(listen)
    except RuntimeError as exc:  # grpc reports a taken port this way
        raise OSError(f"cannot listen on {listen}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {listen}")
    if metrics_port is not None and metrics_port >= 0:
        try:
            metrics_http.start(metrics_port, metrics_host)
        except OSError as exc:
            # Named like a gRPC port in use (the bare "[Errno 98] Address already in use"
            # did not say which port).
            where = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
            raise OSError(
                f"cannot serve metrics on {where}:{metrics_port}: {exc.strerror or exc}"
            ) from None
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
    except BaseException:
        await server.stop(0)
        raise
    view = getattr(service, "view", None)
    if view is not None:
        security.follow(view, sec)  # ACLs and quotas from etcd, kept current
    frozen = freeze_started_heap()  # the started state lives as long as the process
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    readiness = getattr(service, "readiness", None)
    ready_task: asyncio.Task[None] | None = None
    if readiness is None:
        await health_servicer.set(READY_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    else:

        async def report(ready: bool) -> None:
            if stop.is_set():
                return
            status = health_pb2.HealthCheckResponse
            await health_servicer.set(
                READY_SERVICE, status.SERVING if ready else status.NOT_SERVING
            )
            why = getattr(readiness, "why_not", lambda: "catching up")
            log.info("%s %s", service.name, "ready" if ready else f"not ready: {why()}")

        ready_task = asyncio.create_task(readiness.run(report, stop), name="readiness")
    log.info("%s serving on %s (%s)", service.name, listen, sec.describe())
    log.debug("%d objects of the started service frozen out of garbage collection", frozen)
    lag_sampler = asyncio.create_task(metrics.sample_loop_lag(stop), name="loop-lag")
    tls_watch = None
    if sec.files is not None:
        tls_watch = asyncio.create_task(_watch_tls_files(sec.files, stop), name="tls-files")
    await stop.wait()
    await lag_sampler
    if tls_watch is not None:
        await tls_watch
    if ready_task is not None:
        await ready_task
    log.info("%s shutting down", service.name)
    for name in ["", READY_SERVICE, *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_servicer.close_watches()  # else server.stop waits the grace out for them
    try:
        await asyncio.wait_for(service.stop(), timeout=grace_s)
    except TimeoutError:
        log.warning("%s: stop() did not finish within %.0fs", service.name, grace_s)
    await server.stop(grace_s)
    log.info("%s stopped", service.name)
