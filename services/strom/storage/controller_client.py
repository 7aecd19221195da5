"""Calls from a storage node to the active controller (AlterPartition, AllocateProducerIds,
ControlledShutdown), wherever the controller is: found from the cluster view's controller
key, following a NOT_CONTROLLER answer to the new one."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from strom.api import controller_pb2_grpc
from strom.errors import ErrorCode
from strom.grpc_options import GRPC_OPTIONS
from strom.metadata import ClusterView
from strom.security.channel import ChannelCache

# The replication logger, not this module's: operators filter replication's lines on
# "strom.storage.replication", where they were before the module was split.
log = logging.getLogger("strom.storage.replication")

E = ErrorCode


class ControllerClient:
    """Calls the active controller (found from the view's controller key)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        # A call unanswered within its deadline makes the next go on a new connection
        # (ChannelCache): the callers resend (IsrManager after 0.5 s).
        self._channels = ChannelCache(GRPC_OPTIONS)
        #: Why the last call got no answer (for the logs of callers that give up).
        self.last_failure = ""

    def _stub(self, host: str, port: int) -> controller_pb2_grpc.ControllerServiceStub:
        return controller_pb2_grpc.ControllerServiceStub(self._channels.get(f"{host}:{port}"))

    async def call(self, method: str, request: Any, timeout: float = 5.0) -> Any | None:
        """Send to the active controller, following NOT_CONTROLLER once; None if none
        answers. gRPC UNIMPLEMENTED propagates (callers decide)."""
        info = self.view.controller_info()
        if info is None:
            self.last_failure = "no active controller in the cluster view"
            return None
        host, port = info.host, info.port
        for _ in range(3):
            stub = self._stub(host, port)
            try:
                resp = await getattr(stub, method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.debug("%s to controller %s:%d failed: %s", method, host, port, exc.code())
                self.last_failure = f"{exc.code().name} from {host}:{port}"
                return None
            if resp.error_code == E.NOT_CONTROLLER and resp.controller.node_id >= 0:
                if (resp.controller.host, resp.controller.port) == (host, port):
                    return resp
                host, port = resp.controller.host, resp.controller.port
                continue
            return resp
        self.last_failure = "redirected by NOT_CONTROLLER three times"
        return None

    async def close(self) -> None:
        await self._channels.close()
