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
    """grpc's asyncio health servicer, plus an end to Watch streams at shutdown."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = asyncio.Event()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        if self._closing.is_set():
            await context.write(health_pb2.HealthCheckResponse(status=self._status(request)))
            return
        watch = asyncio.ensure_future(super().Watch(request, context))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({watch, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watch, closing):
                task.cancel()
            await asyncio.gather(watch, closing, return_exceptions=True)
        if closing.done() and not closing.cancelled():
            # The stream may have been between two writes: the last status, then the end.
            await context.write(health_pb2.HealthCheckResponse(status=self._status(request)))

    def _status(self, request: health_pb2.HealthCheckRequest) -> Any:
        return self._server_status.get(
            request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        )

    def close_watches(self) -> None:
        """End every Watch stream (after its last status) and every later one at once."""
        self._closing.set()
