"""gRPC health checking whose Watch streams end when the service shuts down.

A ``Health/Watch`` stream lasts until its client leaves: the active controller holds one to
every storage node (strom.controller.prober) and producers hold one per node
(strom.client.spin). gRPC's ``server.stop(grace)`` waits for every open call, so a node asked
to stop waited out its whole grace period (5 s) for streams that would never end by
themselves. :meth:`HealthServicer.close_watches` (called once the status is NOT_SERVING) ends
them after they have sent that status, and Watches that arrive later get the status and end
at once, so the server stops as soon as the real requests are done.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpc_health.v1 import health, health_pb2


class HealthServicer(health.aio.HealthServicer):
    """grpc's asyncio health servicer, plus an end to Watch streams at shutdown.

    Watch is its own loop (send the status when it changed, wait for the next change) rather
    than grpc's Watch wrapped in a task: cancelling that task while it was inside
    ``context.write`` left the send half-done, the final write then failed with
    GRPC_CALL_ERROR_TOO_MANY_OPERATIONS and the call never ended, so the server waited out
    its grace period after all (a controller stopped right after it started was SIGKILLed).
    Nothing here cancels a write."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = False
        self._changed = asyncio.Event()

    async def _set(self, service: str, status: Any) -> None:
        # grpc's set() and enter_graceful_shutdown() both store statuses here.
        await super()._set(service, status)
        self._pulse()

    def _pulse(self) -> None:
        """Wake every Watch (a status changed, or the service is closing)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        sent = None
        while True:
            changed = self._changed  # taken before the read: a later change wakes us
            status = self._status(request)
            if status != sent:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                sent = status
                continue  # it may have changed while the write was under way
            if self._closing:
                return  # after the last status: the stream ends with OK
            await changed.wait()

    def _status(self, request: health_pb2.HealthCheckRequest) -> Any:
        return self._server_status.get(
            request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        )

    def close_watches(self) -> None:
        """End every Watch stream (after its last status) and every later one at once."""
        self._closing = True
        self._pulse()
