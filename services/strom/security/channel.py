"""How a process dials strom: TLS, a client certificate, a bearer token
(:class:`ChannelSecurity`), from arguments or the ``STROM_SSL_*`` / ``STROM_TOKEN*``
environment (:func:`client_security`).

Why a module of its own: clients (Producer, Consumer, Admin, the CLI) need only this, and
everything else under :mod:`strom.security` serves (certificate checks with ``cryptography``,
ACLs, quotas, interceptors). A client process that imported it all carried ~10,000 more
objects for Python's full garbage collections to walk, each collection pausing every thread
of the process (docs/benchmarks.md, "A client's heap").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

#: The gRPC metadata key of a bearer token.
TOKEN_METADATA = "authorization"


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None or path == "":
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call (works on plaintext channels too,
    unlike gRPC's call credentials)."""

    def __init__(self, token: str) -> None:
        self._md = (TOKEN_METADATA, f"Bearer {token}")

    def _details(self, d: Any) -> Any:
        md = list(d.metadata or ())
        md.append(self._md)
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)


class _AioTokenInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._md = (TOKEN_METADATA, f"Bearer {token}")

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(d.metadata or ()))
        md.add(*self._md)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request)

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request_iterator)

    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


@dataclass(frozen=True)
class ChannelSecurity:
    """How to dial strom: TLS (a CA to verify servers, and a client certificate for mTLS)
    and/or a bearer token. All None: plaintext, anonymous (the default)."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    token: str | None = None

    @classmethod
    def from_files(
        cls,
        ssl_cafile: str | Path | None = None,
        ssl_certfile: str | Path | None = None,
        ssl_keyfile: str | Path | None = None,
        token: str | None = None,
    ) -> ChannelSecurity:
        """The client settings (kafka-python's names); a bad file gives a clear ValueError."""
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (a client certificate)")
        return cls(
            _read(ssl_cafile, "ssl_cafile"),
            _read(ssl_certfile, "ssl_certfile"),
            _read(ssl_keyfile, "ssl_keyfile"),
            token or None,
        )

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel to ``address``."""
        if self.tls:
            ch = grpc.secure_channel(address, self.credentials(), options=list(options))
        else:
            ch = grpc.insecure_channel(address, options=list(options))
        if self.token:
            ch = grpc.intercept_channel(ch, _TokenInterceptor(self.token))
        return ch

    def aio_channel(
        self, address: str, options: Sequence[tuple[str, Any]] = ()
    ) -> grpc.aio.Channel:
        """An asyncio channel to ``address``."""
        interceptors = [_AioTokenInterceptor(self.token)] if self.token else None
        if self.tls:
            return grpc.aio.secure_channel(
                address, self.credentials(), options=list(options), interceptors=interceptors
            )
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


#: What this process dials with when nothing else is given (services: set by
#: :func:`strom.security.config.configure` from their flags).
_DEFAULT_CHANNEL = ChannelSecurity()


def default_channel() -> ChannelSecurity:
    return _DEFAULT_CHANNEL


def set_default_channel(security: ChannelSecurity) -> None:
    """Install the process's own channel settings (a service's certificate and token)."""
    global _DEFAULT_CHANNEL
    _DEFAULT_CHANNEL = security


#: Environment variables a client reads when no setting is passed (the CLI's flags set them).
CLIENT_ENV = ("STROM_SSL_CAFILE", "STROM_SSL_CERTFILE", "STROM_SSL_KEYFILE", "STROM_TOKEN_FILE")


def client_security(
    ssl_cafile: str | Path | None = None,
    ssl_certfile: str | Path | None = None,
    ssl_keyfile: str | Path | None = None,
    token: str | None = None,
) -> ChannelSecurity:
    """A client's channel settings: the arguments, else ``STROM_SSL_CAFILE``,
    ``STROM_SSL_CERTFILE``, ``STROM_SSL_KEYFILE`` and ``STROM_TOKEN`` / ``STROM_TOKEN_FILE``
    from the environment, else the process's default (plaintext)."""
    env = os.environ
    ca = ssl_cafile or env.get("STROM_SSL_CAFILE") or None
    cert = ssl_certfile or env.get("STROM_SSL_CERTFILE") or None
    key = ssl_keyfile or env.get("STROM_SSL_KEYFILE") or None
    if token is None:
        token = env.get("STROM_TOKEN") or None
        if token is None and env.get("STROM_TOKEN_FILE"):
            raw = _read(env["STROM_TOKEN_FILE"], "STROM_TOKEN_FILE")
            token = (raw or b"").decode().strip() or None
    if ca is None and cert is None and key is None and token is None:
        return _DEFAULT_CHANNEL
    return ChannelSecurity.from_files(ca, cert, key, token)
