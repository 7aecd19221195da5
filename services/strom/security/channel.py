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

import asyncio
import base64
import contextlib
import dataclasses
import functools
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("strom.security")

#: The gRPC metadata key of a bearer token.
TOKEN_METADATA = "authorization"


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)


class _Encrypted(Exception):
    """Raised by the password callback: OpenSSL would otherwise ask on the terminal."""


def _no_password() -> bytes:
    raise _Encrypted


def _check_client_files(
    cert: bytes | None,
    ca: bytes | None,
    paths: tuple[str | Path | None, str | Path | None, str | Path | None],
    names: tuple[str, str, str] = ("ssl_cafile", "ssl_certfile", "ssl_keyfile"),
) -> None:
    """Fail with the file named when the client certificate, its key or the CA bundle cannot
    work: gRPC says only "Failed to create security handshaker" for a key that is not the
    certificate's (its reason goes to stderr), and a server requiring client certificates
    closes the connection on an expired one, which the client sees as "Socket closed", and
    retries until it gives up.

    With the standard library's ``ssl``, which every client loads anyway, rather than
    ``cryptography`` as the services' check does: that would add ~6,000 objects to each
    client process for its full garbage collections to walk (docs/benchmarks.md, "A client's
    heap"). A certificate signed by a CA the servers do not trust cannot be told here."""
    ca_path, cert_path, key_path = paths
    ca_name, cert_name, key_name = names
    if cert is not None:
        blocks = _PEM_CERT.findall(cert)
        if not blocks:
            raise ValueError(f"{cert_name} {cert_path}: no PEM certificate in it")
        now = datetime.now(UTC)
        for n, block in enumerate(blocks, 1):
            which = "the certificate" if n == 1 else f"certificate {n} in it (of the chain)"
            try:
                not_before, not_after = _validity(base64.b64decode(block))
            except (ValueError, IndexError):
                raise ValueError(f"{cert_name} {cert_path}: {which} does not parse") from None
            if now > not_after:
                raise ValueError(
                    f"{cert_name} {cert_path}: {which} expired on {not_after:%Y-%m-%d %H:%M:%S}"
                    " UTC; servers refuse it: renew it"
                )
            if now < not_before:
                raise ValueError(
                    f"{cert_name} {cert_path}: {which} is not valid before "
                    f"{not_before:%Y-%m-%d %H:%M:%S} UTC (is this machine's clock right?)"
                )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_cert_chain(cert_path, key_path, password=_no_password)  # type: ignore[arg-type]
        except _Encrypted:
            raise ValueError(
                f"{key_name} {key_path}: it is encrypted (give the key without a passphrase)"
            ) from None
        except ssl.SSLError as exc:
            # An RSA key with an EC certificate (or the reverse) is NO_CERTIFICATE_ASSIGNED
            # to OpenSSL 3: the key was taken for a slot of its own type, which has no
            # certificate (the raw reason was all the user saw).
            if exc.reason in (
                "KEY_VALUES_MISMATCH",
                "KEY_TYPE_MISMATCH",
                "NO_CERTIFICATE_ASSIGNED",
            ):
                raise ValueError(
                    f"{key_name} {key_path} is not the key of {cert_name} {cert_path}"
                ) from None
            if "PEM lib" in str(exc):  # what OpenSSL says of a file without a key
                raise ValueError(f"{key_name} {key_path}: no PEM private key in it") from None
            raise ValueError(
                f"{key_name} {key_path} with {cert_name} {cert_path}: {exc.reason or exc}"
            ) from None
        except OSError as exc:  # the files changed since they were read
            raise ValueError(f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    if ca is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
                cadata=ca.decode("latin-1")
            )
        except ssl.SSLError:
            raise ValueError(f"{ca_name} {ca_path}: no PEM certificate in it") from None


def _validity(der: bytes) -> tuple[datetime, datetime]:
    """notBefore and notAfter of a DER certificate. RFC 5280, 4.1: Certificate ::= SEQUENCE
    { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER, signature
    SEQUENCE, issuer SEQUENCE, validity SEQUENCE { notBefore Time, notAfter Time }, ... },
    ... }. ValueError (or IndexError) when it is not shaped so."""

    def tlv(i: int, *tags: int) -> tuple[int, int, int]:
        """(tag, start, end) of the DER element at ``i``, whose tag must be one of ``tags``."""
        tag, size = der[i], der[i + 1]
        i += 2
        if size & 0x80:
            width = size & 0x7F
            if not 0 < width <= 4:
                raise ValueError("bad length")
            size, i = int.from_bytes(der[i : i + width], "big"), i + width
        if tag not in tags or i + size > len(der):
            raise ValueError("not a certificate")
        return tag, i, i + size

    _, i, _ = tlv(0, 0x30)  # Certificate
    _, i, _ = tlv(i, 0x30)  # tbsCertificate
    tag, start, end = tlv(i, 0xA0, 0x02)  # version, or the serial number
    if tag == 0xA0:
        _, start, end = tlv(end, 0x02)
    _, _, end = tlv(end, 0x30)  # signature algorithm
    _, _, end = tlv(end, 0x30)  # issuer
    _, start, _ = tlv(end, 0x30)  # validity
    tag1, s1, e1 = tlv(start, 0x17, 0x18)
    tag2, s2, e2 = tlv(e1, 0x17, 0x18)
    return _time(tag1, der[s1:e1]), _time(tag2, der[s2:e2])


def _time(tag: int, raw: bytes) -> datetime:
    """A UTCTime (0x17, two-digit year: 50-99 are 19xx) or GeneralizedTime, in UTC."""
    text = raw.decode("ascii")
    if tag == 0x17:
        text = ("19" if int(text[:2]) >= 50 else "20") + text
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None or path == "":
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call (works on plaintext channels too,
    unlike gRPC's call credentials). ``token`` is asked at each call: a service's token file
    can change (:class:`ClientTokenFile`)."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token

    def _details(self, d: Any) -> Any:
        token = self._token()
        if not token:
            return d
        md = list(d.metadata or ())
        md.append((TOKEN_METADATA, f"Bearer {token}"))
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)


class _AioToken:
    """Adds the bearer token to an asyncio channel's calls: one subclass per kind of call.

    One class implementing all four interceptor interfaces was registered by
    ``grpc.aio`` as a unary-unary interceptor only (its channel sorts interceptors with an
    ``if``/``elif`` on their type), so streaming calls carried no token: a follower's
    ``FetchStream`` to a leader that authenticates with tokens was refused, and replication
    with ``--client-token-file`` (and no mTLS) never worked."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self._token = token

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        token = self._token()
        if not token:
            return d
        md = grpc.aio.Metadata(*(d.metadata or ()))
        md.add(TOKEN_METADATA, f"Bearer {token}")
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)


class _AioTokenUnaryUnary(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request)


class _AioTokenUnaryStream(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request)


class _AioTokenStreamUnary(_AioToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request_iterator)


class _AioTokenStreamStream(_AioToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(client_call_details), request_iterator)


def _aio_token_interceptors(token: Callable[[], str | None]) -> list[grpc.aio.ClientInterceptor]:
    """The token on every kind of call of an asyncio channel (see :class:`_AioToken`)."""
    kinds = (_AioTokenUnaryUnary, _AioTokenUnaryStream, _AioTokenStreamUnary, _AioTokenStreamStream)
    return [kind(token) for kind in kinds]


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
    #: Where a service's token is read again when it changes (``--client-token-file``); it
    #: then takes the place of ``token`` at every call, on channels already made too.
    token_file: ClientTokenFile | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def from_files(
        cls,
        ssl_cafile: str | Path | None = None,
        ssl_certfile: str | Path | None = None,
        ssl_keyfile: str | Path | None = None,
        token: str | None = None,
        *,
        names: tuple[str, str, str] = ("ssl_cafile", "ssl_certfile", "ssl_keyfile"),
    ) -> ChannelSecurity:
        """The client settings (kafka-python's names). A file that cannot work gives a
        ValueError naming it and the problem (unreadable, not PEM, an expired certificate, a
        key that is not the certificate's), before anything is dialled. ``names`` are the
        settings' names in those messages: where the caller took each file from."""
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError(f"{names[1]} and {names[2]} go together (a client certificate)")
        ca = _read(ssl_cafile, names[0])
        cert = _read(ssl_certfile, names[1])
        key = _read(ssl_keyfile, names[2])
        _check_client_files(cert, ca, (ssl_cafile, ssl_certfile, ssl_keyfile), names)
        return cls(ca, cert, key, token or None)

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def current_token(self) -> str | None:
        """The token to send with a call now."""
        if self.token_file is not None:
            return self.token_file.current()
        return self.token

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
        if self.token or self.token_file is not None:
            ch = grpc.intercept_channel(ch, _TokenInterceptor(self.current_token))
        return ch

    def aio_channel(
        self,
        address: str,
        options: Sequence[tuple[str, Any]] = (),
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> grpc.aio.Channel:
        """An asyncio channel to ``address``, its calls going through ``interceptors``."""
        interceptors = list(interceptors)
        if self.token or self.token_file is not None:
            interceptors += _aio_token_interceptors(self.current_token)
        if self.tls:
            return grpc.aio.secure_channel(
                address, self.credentials(), options=list(options), interceptors=interceptors
            )
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


class ClientTokenFile:
    """A service's own bearer token (``--client-token-file``), read again when the file
    changes: looked at (``stat``) at most once a second, from the calls that send it.

    The token was read once at start while the servers' token
    file (``--auth-tokens``) is re-read on change, so rotating the services' token in the
    Secret broke every service-to-service call until each pod restarted. A version that
    cannot be read, or is empty, is not used (the token read before stays; logged once)."""

    def __init__(
        self,
        path: str | Path,
        what: str = "--client-token-file",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self._what = what
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._stamp_now()
        token = self._read()
        if token is None:
            raise ValueError(f"{what} {path}: it is empty")
        self._token = token
        self._next_look = clock() + TOKEN_LOOK_S

    def _stamp_now(self) -> object:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return ("unreadable", exc.errno)
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)

    def _read(self) -> str | None:
        raw = _read(self.path, self._what)
        try:
            return (raw or b"").decode().strip() or None
        except UnicodeDecodeError:
            raise ValueError(f"{self._what} {self.path}: not UTF-8 text") from None

    def current(self) -> str:
        """The token in force (the file read again first if it changed)."""
        now = self._clock()
        if now < self._next_look:
            return self._token
        with self._lock:
            if now >= self._next_look:
                self._next_look = now + TOKEN_LOOK_S
                self._look()
        return self._token

    def _look(self) -> None:
        stamp = self._stamp_now()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            token = self._read()
        except ValueError as exc:
            log.error("%s; the token read before stays in use", exc)
            return
        if token is None:
            log.error(
                "%s %s: it is empty; the token read before stays in use", self._what, self.path
            )
        elif token != self._token:
            self._token = token
            log.warning(
                "%s %s changed: calls to the other services send the new token",
                self._what,
                self.path,
            )


#: How often a service's token file is looked at, at most (seconds).
TOKEN_LOOK_S = 1.0


#: What this process dials with when nothing else is given (services: set by
#: :func:`strom.security.config.configure` from their flags).
_DEFAULT_CHANNEL = ChannelSecurity()


#: A service's check for changed TLS files (:mod:`strom.security.tls_reload`); None in
#: clients, which read their files once.
_RELOAD: Callable[[], object] | None = None


def default_channel() -> ChannelSecurity:
    """The settings to dial with now: a service's TLS files are looked at first (at most once
    a second), so that a renewed certificate is used from the next channel on."""
    if _RELOAD is not None:
        _RELOAD()
    return _DEFAULT_CHANNEL


def set_default_channel(
    security: ChannelSecurity, reload: Callable[[], object] | None = None
) -> None:
    """Install the process's own channel settings (a service's certificate and token), and
    how to look for changed TLS files (``reload``), if they can change."""
    global _DEFAULT_CHANNEL, _RELOAD
    _DEFAULT_CHANNEL = security
    if reload is not None:
        _RELOAD = reload


def replace_default_channel(ca: bytes | None, cert: bytes | None, key: bytes | None) -> None:
    """New TLS files for the default settings (the token stays): channels made from now on
    use them, and :class:`ChannelCache` makes its channels again."""
    global _DEFAULT_CHANNEL
    _DEFAULT_CHANNEL = dataclasses.replace(_DEFAULT_CHANNEL, ca=ca, cert=cert, key=key)


class _DeadlineWatch:
    """Tells its :class:`ChannelCache` when a call of one channel missed its deadline."""

    def __init__(self, cache: ChannelCache, address: str) -> None:
        self.cache = cache
        self.address = address
        self.channel: grpc.aio.Channel | None = None  # set once the channel is made

    def watch(self, call: Any, details: grpc.aio.ClientCallDetails) -> Any:
        if details.timeout is not None:  # without a deadline there is nothing to miss
            call.add_done_callback(functools.partial(self._done, details))
        return call

    def _done(self, details: grpc.aio.ClientCallDetails, call: Any) -> None:
        if not call.cancelled():
            self.cache._checking(self._check(details, call))

    async def _check(self, details: grpc.aio.ClientCallDetails, call: Any) -> None:
        if await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self.channel is not None:
            self.cache._missed(self.address, self.channel, details)


class _DeadlineUnaryUnary(_DeadlineWatch, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return self.watch(await continuation(details, request), details)


class _DeadlineUnaryStream(_DeadlineWatch, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self.watch(await continuation(details, request), details)


class ChannelCache:
    """A service's asyncio channels to other strom services, one per address, made with
    :func:`default_channel`'s settings and made again when those changed (a renewed
    certificate): a channel keeps the credentials it was made with for every reconnect, so
    a cached one would present an expired certificate after the next restart of its peer.

    A call that got no answer within its deadline makes the next :meth:`get` of its address
    a new channel on a new connection (each cache has its own subchannel pool, or gRPC would
    hand the new channel the old connection): HTTP/2 puts every call of a channel on one
    connection, and one gone silent (a middlebox lost the flow, retransmissions backed off
    after a partition healed) holds every resend with it until TCP gives up.

    A replaced channel is closed after a grace period (calls in flight on it finish)."""

    #: How long a replaced channel's calls in flight may go on (seconds).
    CLOSE_GRACE_S = 60.0

    def __init__(self, options: Sequence[tuple[str, Any]] = ()) -> None:
        self._options = [*options, ("grpc.use_local_subchannel_pool", 1)]
        self._channels: dict[str, tuple[ChannelSecurity, grpc.aio.Channel]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address`` (made now if there is none, or the settings changed)."""
        security = default_channel()
        entry = self._channels.get(address)
        if entry is not None and entry[0] is security:
            return entry[1]
        watches = [_DeadlineUnaryUnary(self, address), _DeadlineUnaryStream(self, address)]
        channel = security.aio_channel(address, self._options, watches)
        for w in watches:
            w.channel = channel
        self._channels[address] = (security, channel)
        if entry is not None:
            self._close_later(entry[1])
        return channel

    def renew(self, address: str) -> None:
        """Make the next :meth:`get` of ``address`` a new channel, on a new connection (the
        old one is closed after the grace period)."""
        entry = self._channels.pop(address, None)
        if entry is not None:
            self._close_later(entry[1])

    def _missed(
        self, address: str, channel: grpc.aio.Channel, details: grpc.aio.ClientCallDetails
    ) -> None:
        """A call on ``channel`` missed its deadline: renew it, unless it was already."""
        entry = self._channels.get(address)
        if entry is not None and entry[1] is channel:
            method = details.method
            log.info(
                "%s to %s got no answer within %g s; calling it on a new connection",
                method.decode() if isinstance(method, bytes) else method,
                address,
                details.timeout,
            )
            self.renew(address)

    def _checking(self, check: Any) -> None:
        self._keep(asyncio.get_running_loop().create_task(check))

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        self._keep(asyncio.get_running_loop().create_task(channel.close(self.CLOSE_GRACE_S)))

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __len__(self) -> int:
        return len(self._channels)

    async def close(self) -> None:
        """Close every channel (calls in flight are cancelled)."""
        channels = [ch for _, ch in self._channels.values()]
        self._channels.clear()
        for task in list(self._tasks):
            task.cancel()
        for ch in channels:
            with contextlib.suppress(Exception):
                await ch.close()


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
    from the environment, else the process's default (plaintext).

    A problem with a file names the setting it came from: the argument, else the environment
    variable, or the flag a command copied into it (:func:`name_env_settings`). An argument of
    another type is a TypeError naming it (``ssl_cafile=5`` failed ten
    frames deep in pathlib)."""
    for name, value in (
        ("ssl_cafile", ssl_cafile),
        ("ssl_certfile", ssl_certfile),
        ("ssl_keyfile", ssl_keyfile),
    ):
        if value is not None and not isinstance(value, str | Path):
            raise TypeError(f"{name} must be a path (str or Path) or None, got {value!r}")
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str or None, got {type(token).__name__}")
    env = os.environ
    ca = ssl_cafile or env.get("STROM_SSL_CAFILE") or None
    cert = ssl_certfile or env.get("STROM_SSL_CERTFILE") or None
    key = ssl_keyfile or env.get("STROM_SSL_KEYFILE") or None
    if token is None:
        token = env.get("STROM_TOKEN") or None
        if token is None and env.get("STROM_TOKEN_FILE"):
            raw = _read(env["STROM_TOKEN_FILE"], _env_name("STROM_TOKEN_FILE"))
            token = (raw or b"").decode().strip() or None
    if ca is None and cert is None and key is None and token is None:
        return _DEFAULT_CHANNEL
    names = (
        "ssl_cafile" if ssl_cafile else _env_name("STROM_SSL_CAFILE"),
        "ssl_certfile" if ssl_certfile else _env_name("STROM_SSL_CERTFILE"),
        "ssl_keyfile" if ssl_keyfile else _env_name("STROM_SSL_KEYFILE"),
    )
    return ChannelSecurity.from_files(ca, cert, key, token, names=names)


#: The flag each of :data:`CLIENT_ENV` was copied from by the running command, if it was.
_FROM_FLAGS: dict[str, str] = {}


def name_env_settings(flags: dict[str, str]) -> None:
    """Name the flags (``{"STROM_TOKEN_FILE": "--token-file"}``) a command copied into the
    environment, for messages about their files: ``strom topics
    list --token-file /nonexistent`` said ``cannot read STROM_TOKEN_FILE /nonexistent``, a
    variable the user never set, and ``--ssl-cafile`` was named ``ssl_cafile``."""
    _FROM_FLAGS.clear()
    _FROM_FLAGS.update(flags)


def _env_name(variable: str) -> str:
    return _FROM_FLAGS.get(variable, variable)
