"""Requests that do not decode are refused as INVALID_ARGUMENT, quietly.

grpc.aio decodes a request with the method's ``request_deserializer`` before any handler (or
interceptor's handler) sees it, and an exception there is "Unexpected [DecodeError] raised
by servicer method": an ERROR with a full traceback in the service's log, and UNKNOWN for the
caller: any client could flood the logs with garbage bytes, and a client in another
language with a wrong stub would be told nothing it could act on.

:class:`DecodeGuard` (a server interceptor, outermost, so that every method of every
service is covered: the generated servicers, the hand-written handler tables, health and
reflection) gives each handler a deserializer that returns an :class:`Undecodable` marker
instead of raising, and a behavior that answers the marker with INVALID_ARGUMENT naming the
method and the message type, before anything else (authorization included) looks at the
request. The log gets one WARNING a minute at most, naming the caller and the method, with
the count of the others refused since the last one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.message import DecodeError

from strom.lograte import LogLimiter

log = logging.getLogger("strom.service")

#: At most one log line per this many seconds about undecodable requests.
LOG_EVERY_S = 60.0


class Undecodable:
    """What the guarded deserializer returns for bytes that did not decode."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Reporter:
    """The rate limit of the WARNING about undecodable requests (one per process)."""

    def __init__(self) -> None:
        self._lines = LogLimiter(LOG_EVERY_S)

    def note(self, method: str, peer: str, what: str) -> None:
        unlogged = self._lines.occurred("undecodable")
        if unlogged is None:
            return
        log.warning(
            "refused a request to %s from %s as INVALID_ARGUMENT: %s (%d more undecodable "
            "requests refused since the last such message)",
            method,
            peer,
            what,
            unlogged,
        )


REPORTER = _Reporter()


@functools.cache
def request_type(method: str) -> str:
    """The full name of ``method``'s request message (``/strom.v1.StorageService/Metadata``
    -> ``strom.v1.MetadataRequest``), from the registered descriptors; "the request of
    <method>" when they do not have it. Cached: only methods with a handler get here."""
    service, _, name = method.lstrip("/").rpartition("/")
    try:
        found = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
    except KeyError:
        return f"the request of {method}"
    return str(found.input_type.full_name) if found is not None else f"the request of {method}"


def why(method: str, error: Exception) -> str:
    """What a refused caller is told: the message type it had to send; a decoder's own
    reason too when it gave one (protobuf's says only "Error parsing message")."""
    text = f"request could not be decoded as {request_type(method)}"
    if not isinstance(error, DecodeError) and str(error):
        text += f" ({error})"
    return text


async def refuse(method: str, request: Undecodable, context: Any) -> NoReturn:
    """End the call INVALID_ARGUMENT (grpc.aio's abort: no traceback, no ERROR line)."""
    what = why(method, request.error)
    REPORTER.note(method, context.peer(), what)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {what}")
    raise AssertionError("context.abort returned")  # pragma: no cover


def _deserializer(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def guarded(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:  # any decoder's failure: the caller sent bad bytes
            return Undecodable(exc)

    return guarded


def _checked(method: str, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    """A request stream whose first undecodable message ends the call."""

    async def checked() -> AsyncIterator[Any]:
        async for request in requests:
            if type(request) is Undecodable:
                await refuse(method, request, context)
            yield request

    return checked()


def _unary_request(method: str, behavior: Any, gen: bool) -> Any:
    if gen:

        async def unary_gen(request: Any, context: Any) -> AsyncIterator[Any]:
            if type(request) is Undecodable:
                await refuse(method, request, context)
            async for answer in behavior(request, context):
                yield answer

        return unary_gen

    async def unary(request: Any, context: Any) -> Any:
        if type(request) is Undecodable:
            await refuse(method, request, context)
        return await behavior(request, context)

    return unary


def _stream_request(method: str, behavior: Any, gen: bool) -> Any:
    if gen:

        async def stream_gen(requests: Any, context: Any) -> AsyncIterator[Any]:
            async for answer in behavior(_checked(method, requests, context), context):
                yield answer

        return stream_gen

    async def stream(requests: Any, context: Any) -> Any:
        return await behavior(_checked(method, requests, context), context)

    return stream


def _in_thread(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Awaitable[Any]]:
    """A plain function behavior (grpc_health's List) as grpc.aio runs one: in a thread."""

    async def run(request: Any, context: Any) -> Any:
        call = functools.partial(contextvars.copy_context().run, behavior, request, context)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    return run


_FACTORIES = {
    # behavior field -> (grpc's handler factory, streaming request)
    "unary_unary": (grpc.unary_unary_rpc_method_handler, False),
    "unary_stream": (grpc.unary_stream_rpc_method_handler, False),
    "stream_unary": (grpc.stream_unary_rpc_method_handler, True),
    "stream_stream": (grpc.stream_stream_rpc_method_handler, True),
}


def guard(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with undecodable requests refused (unchanged when it decodes nothing
    itself, as RecordService's raw-bytes methods; a plain function answering a stream, which
    no strom service has, is left as it is too)."""
    if handler.request_deserializer is None:
        return handler
    for field, (factory, streaming) in _FACTORIES.items():
        behavior = getattr(handler, field)
        if behavior is None:
            continue
        gen = inspect.isasyncgenfunction(behavior)
        if not gen and not inspect.iscoroutinefunction(behavior):
            if field != "unary_unary":
                return handler
            behavior = _in_thread(behavior)
        wrap = _stream_request if streaming else _unary_request
        return factory(  # type: ignore[no-any-return]
            wrap(method, behavior, gen),
            request_deserializer=_deserializer(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
    return handler


class DecodeGuard(grpc.aio.ServerInterceptor):
    """See the module docstring. Put it first in the server's interceptors: its handler is
    then the outermost, and no other interceptor's checks see an undecodable request."""

    def __init__(self) -> None:
        #: Method -> (the handler last guarded, its guarded form): a handler that is the
        #: same object call after call (no other interceptor rewraps it) is wrapped once.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: grpc answers UNIMPLEMENTED
            return handler
        method = handler_call_details.method
        known = self._guarded.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        guarded = guard(handler, method)
        self._guarded[method] = (handler, guarded)
        return guarded
