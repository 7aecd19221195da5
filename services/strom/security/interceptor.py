"""Authentication and authorization of every RPC a service serves (a grpc.aio interceptor).

For each call: who is calling (the client certificate's subject with mTLS, else a bearer
token's principal; a caller that proves neither gets UNAUTHENTICATED and nothing else), then,
with ACLs on, whether that principal may do what the method needs
(:data:`strom.security.rules.RULES`: PERMISSION_DENIED names the operation and resource that
is missing). Methods without a rule are refused (fail closed). Listing calls are filtered to
what the principal may see. The principal is also put in :data:`CURRENT_PRINCIPAL` for the
handler (quotas are per principal).

gRPC's aio interceptors see only the method and metadata, not the peer certificate, so the
checks wrap the method's handler and run with the call's context.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from strom.api import common_pb2
from strom.security.acl import SOME, Res
from strom.security.config import ServerSecurity
from strom.security.principal import ANONYMOUS, bearer_token, principal_of_auth_context
from strom.security.rules import FILTERS, RULES, UNAUTHENTICATED_SERVICES

log = logging.getLogger("strom.security")

#: The authenticated principal of the call being handled.
CURRENT_PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar(
    "strom_principal", default=ANONYMOUS
)

#: On a request stream with ACLs on: why the call's principal may not make a request now
#: (None: it may). For requests a handler makes up itself, which no interceptor sees: a
#: followed Fetch's continuations (storage.proto, FetchRequest.follow) are checked with it.
#: Also set for a RecordService Subscribe stream, which checks its one request again while
#: it delivers, so a revoked ACL ends it as it ends a followed Fetch.
STREAM_REQUEST_DENIED: contextvars.ContextVar[Callable[[Any], str | None] | None] = (
    contextvars.ContextVar("strom_stream_request_denied", default=None)
)

_RES_NAMES = {
    Res.TOPIC: "topic",
    Res.GROUP: "group",
    Res.CLUSTER: "the cluster",
    Res.TRANSACTIONAL_ID: "transactional id",
}


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """See the module docstring."""

    def __init__(self, security: ServerSecurity) -> None:
        self.security = security
        self._verifier_errors = 0  # verifier exceptions since the last one logged
        self._verifier_logged = -math.inf

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(UNAUTHENTICATED_SERVICES):
            return handler
        metadata = tuple(handler_call_details.invocation_metadata or ())
        return self._wrap(handler, method, metadata)

    async def _admit(
        self, method: str, metadata: tuple[Any, ...], request: Any, context: Any
    ) -> str:
        """The caller's principal once authenticated and authorized; aborts the call
        otherwise. A request stream (``request`` None) is only authenticated here: its
        requests are authorized one by one (:meth:`_wrap`)."""
        sec = self.security
        principal = None
        try:
            principal = principal_of_auth_context(context.auth_context())
        except Exception:  # a certificate that does not parse: not authenticated
            principal = None
        if principal is None and sec.tokens is not None:
            token = bearer_token(metadata)
            if token is not None:
                principal = self._verify(token)
                if principal is None:
                    await context.abort(
                        grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not valid"
                    )
        if principal is None:
            if sec.authenticates:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "authentication required: present a client certificate or a bearer token",
                )
            principal = ANONYMOUS
        if sec.acls:
            rule = RULES.get(method)
            if rule is None:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, f"{method} has no authorization rule"
                )
            if request is not None:
                denial = self._denial(method, principal, request)
                if denial is not None:
                    await context.abort(
                        grpc.StatusCode.PERMISSION_DENIED,
                        denial[0],
                        trailing_metadata=_denial_trailer(*denial),
                    )
        return principal

    def _verify(self, token: str) -> str | None:
        """The token's principal, or None. A verifier that raises on a bad token (as PyJWT's
        do) refuses it too: the exception used to end the call UNKNOWN with its message,
        token included, sent back to the client. The log names the
        exception without the token, at most once a minute (a client sending bad tokens
        must not flood it)."""
        assert self.security.tokens is not None
        try:
            return self.security.tokens(token)
        except Exception as exc:
            self._verifier_errors += 1
            now = time.monotonic()
            if now >= self._verifier_logged + 60:
                why = str(exc).replace(token, "<token>")
                log.warning(
                    "the bearer token verifier raised %s: %s; refused as UNAUTHENTICATED "
                    "(%d calls refused so since the last such message)",
                    type(exc).__name__,
                    why,
                    self._verifier_errors,
                )
                self._verifier_logged, self._verifier_errors = now, 0
            return None

    def _denied(self, method: str, principal: str, request: Any) -> str | None:
        """Why ``principal`` may not make ``request`` to ``method`` (None: it may)."""
        denial = self._denial(method, principal, request)
        return None if denial is None else denial[0]

    def _denial(self, method: str, principal: str, request: Any) -> tuple[str, Res, bool] | None:
        """Why ``principal`` may not make ``request`` to ``method``, the kind of resource
        refused, and whether the right was needed on any resource of it (None: it may)."""
        for op, res, name in RULES[method](request):
            if not self.security.authorizer.allowed(principal, op, res, name):
                if name == SOME:
                    what = f"any {_RES_NAMES[res]}"
                else:
                    what = _RES_NAMES[res] + ("" if res is Res.CLUSTER else f" {name!r}")
                return f"{principal} is not allowed {op.name} on {what}", res, name == SOME
        return None

    def _filter(self, method: str, principal: str, request: Any, response: Any) -> None:
        f = FILTERS.get(method)
        if f is not None and self.security.acls:
            f(self.security.authorizer, principal, request, response)

    def _wrap(
        self, handler: grpc.RpcMethodHandler, method: str, metadata: tuple[Any, ...]
    ) -> grpc.RpcMethodHandler:
        """The handler with the checks in front (and, for unary answers, the filter after)."""
        admit, filt = self._admit, self._filter
        denied_of = self._denied
        check = self.security.acls
        ser = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                principal = await admit(method, metadata, request, context)
                token = CURRENT_PRINCIPAL.set(principal)
                try:
                    response = await inner(request, context)
                finally:
                    CURRENT_PRINCIPAL.reset(token)
                filt(method, principal, request, response)
                return response

            return grpc.unary_unary_rpc_method_handler(unary_unary, **ser)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream
            if not inspect.isasyncgenfunction(inner_us):
                # A handler that writes its answers with context.write (RecordService's
                # Subscribe) is a coroutine: awaited, not iterated.

                async def unary_stream_writes(request: Any, context: Any) -> Any:
                    principal = await admit(method, metadata, request, context)
                    CURRENT_PRINCIPAL.set(principal)
                    if check:  # the handler authorizes its request again as ACLs change
                        STREAM_REQUEST_DENIED.set(
                            lambda request: denied_of(method, principal, request)
                        )
                    return await inner_us(request, context)

                return grpc.unary_stream_rpc_method_handler(unary_stream_writes, **ser)

            async def unary_stream(request: Any, context: Any) -> Any:
                CURRENT_PRINCIPAL.set(await admit(method, metadata, request, context))
                async for item in inner_us(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(unary_stream, **ser)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: Any, context: Any) -> Any:
                CURRENT_PRINCIPAL.set(await admit(method, metadata, None, context))
                return await inner_su(requests, context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, **ser)
        inner_ss = handler.stream_stream

        async def authorized(requests: Any, principal: Any, denied: list[str]) -> Any:
            # Each request as it arrives; the first one refused ends the requests the
            # handler sees, and, once it has answered those before it, the stream
            # (storage.proto: a refused request ends the stream with its status).
            async for request in requests:
                why = denied_of(method, principal, request)
                if why is not None:
                    denied.append(why)
                    return
                yield request

        async def start(context: Any) -> Any:
            principal = await admit(method, metadata, None, context)
            CURRENT_PRINCIPAL.set(principal)
            if check:
                STREAM_REQUEST_DENIED.set(lambda request: denied_of(method, principal, request))
            return principal

        if not inspect.isasyncgenfunction(inner_ss):
            # A handler that writes its answers with context.write (FetchStream, through
            # strom.service.stream_writes) is a coroutine: awaited, not iterated.

            async def stream_stream_writes(requests: Any, context: Any) -> None:
                principal = await start(context)
                denied: list[str] = []
                await inner_ss(
                    authorized(requests, principal, denied) if check else requests, context
                )
                if denied:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied[0])

            return grpc.stream_stream_rpc_method_handler(stream_stream_writes, **ser)

        async def stream_stream(requests: Any, context: Any) -> Any:
            principal = await start(context)
            denied: list[str] = []
            answers = inner_ss(
                authorized(requests, principal, denied) if check else requests, context
            )
            async for item in answers:
                yield item
            if denied:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied[0])

        return grpc.stream_stream_rpc_method_handler(stream_stream, **ser)


#: The ErrorCode of a refusal, by the kind of resource refused (Kafka's
#: TOPIC_/GROUP_/CLUSTER_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
_DENIAL_CODES = {
    Res.TOPIC: common_pb2.TOPIC_AUTHORIZATION_FAILED,
    Res.GROUP: common_pb2.GROUP_AUTHORIZATION_FAILED,
    Res.CLUSTER: common_pb2.CLUSTER_AUTHORIZATION_FAILED,
    Res.TRANSACTIONAL_ID: common_pb2.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def _denial_trailer(why: str, res: Res, some: bool = False) -> tuple[tuple[str, bytes], ...]:
    """The ``strom-error-bin`` trailer of a refusal: its ErrorCode by the resource refused,
    so a client in any language can tell a group or cluster refusal from a topic one (found
    from outside: only topic refusals had a code). ``some``: the right was needed on any
    resource of the kind (an idempotent producer id needs WRITE on some topic), which Kafka
    reports as CLUSTER_AUTHORIZATION_FAILED."""
    code = common_pb2.CLUSTER_AUTHORIZATION_FAILED if some else _DENIAL_CODES[res]
    err = common_pb2.Error(code=code, message=why)
    return (("strom-error-bin", err.SerializeToString()),)


def interceptors(security: ServerSecurity) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors a server needs for ``security`` (none when nothing is enforced)."""
    return [AuthInterceptor(security)] if security.enforced else []
