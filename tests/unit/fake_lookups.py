"""Fake StorageService stubs for the client's lookups (Metadata, FindCoordinator): each
node answers at once, fails, or hangs as a SIGSTOPped node does (nothing until the call's
deadline). Called either way gRPC stubs are: ``stub.Method(req, timeout=...)`` or
``stub.Method.future(req, timeout=...)``, so the client's logic, not the fake's, decides
which nodes it waits on."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

import grpc

#: A node's reply to one request: an answer, an RpcFailure, or HANG.
Reply = Callable[[Any], Any]
HANG = object()


class RpcFailure(grpc.RpcError):
    """A failed call as gRPC raises it: a status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeMethod:
    """One RPC of a fake node; ``asked`` counts the calls it got."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.asked = 0

    def future(self, req: Any, timeout: float) -> Future[Any]:
        """The call's future: done at once, or (a hang) failed DEADLINE_EXCEEDED by
        ``timeout`` unless cancelled first, as gRPC's is."""
        self.asked += 1
        fut: Future[Any] = Future()
        out = self.reply(req)
        if out is HANG:
            timer = threading.Timer(timeout, _expire, (fut,))
            timer.daemon = True
            timer.start()
            fut.add_done_callback(lambda _f: timer.cancel())
        elif isinstance(out, grpc.RpcError):
            fut.set_exception(out)
        else:
            fut.set_result(out)
        return fut

    def __call__(self, req: Any, timeout: float) -> Any:
        return self.future(req, timeout).result()


def _expire(fut: Future[Any]) -> None:
    with contextlib.suppress(InvalidStateError):  # (cancelled meanwhile)
        fut.set_exception(RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


class FakeNode:
    """A storage node's lookups: ``find_coordinator`` and ``metadata`` give the reply to
    each request (default: a hang)."""

    def __init__(
        self,
        find_coordinator: Reply = lambda _req: HANG,
        metadata: Reply = lambda _req: HANG,
    ) -> None:
        self.FindCoordinator = FakeMethod(find_coordinator)
        self.Metadata = FakeMethod(metadata)
