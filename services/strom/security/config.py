"""A process's security settings: TLS for what it serves and what it dials, how callers
authenticate, whether ACLs apply, and TLS to etcd.

Services read them from flags (``--tls-cert``, ``--tls-key``, ``--tls-ca``,
``--tls-client-auth``, ``--auth-tokens``, ``--auth-token-verifier``, ``--client-token-file``,
``--acls``, ``--super-users``, ``--etcd-ca``, ``--etcd-cert``, ``--etcd-key``; see
:func:`add_arguments`) and install them once with :func:`configure`: the gRPC server, every
channel the service opens to another strom service (replication, AlterPartition, markers,
coordinator writes) and its etcd client then use them. Clients pass a :class:`ChannelSecurity`
(``Producer(..., ssl_cafile=..., ssl_certfile=..., ssl_keyfile=..., token=...)``).

Outgoing channels of a service present the service's own certificate (mTLS between services)
and, if given, its ``--client-token-file`` token (read again when the file changes).
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from strom.security.acl import Authorizer
from strom.security.channel import (
    CLIENT_ENV,
    ChannelSecurity,
    ClientTokenFile,
    _read,
    client_security,
    default_channel,
    replace_default_channel,
    set_default_channel,
)
from strom.security.principal import (
    _RDN,
    TokenFile,
    Verifier,
    _split_unescaped,
    canonical_principal,
    load_verifier,
    principal_of_certificate,
    user,
)
from strom.security.tls_reload import TlsFiles

log = logging.getLogger("strom.security")

__all__ = [
    "CLIENT_AUTH",
    "CLIENT_ENV",
    "ChannelSecurity",
    "EtcdSecurity",
    "ServerSecurity",
    "add_arguments",
    "client_security",
    "configure",
    "default_channel",
    "etcd",
    "server",
]

#: gRPC Python can either not ask for client certificates or require (and verify) them.
CLIENT_AUTH = ("none", "required")


def _check_pem(
    cert: bytes | None,
    key: bytes | None,
    ca: bytes | None,
    flags: tuple[str, str, str],
    paths: tuple[Any, Any, Any],
    check_validity: bool = False,
) -> None:
    """Fail with the flag and file named when a certificate, key or CA bundle is not what it
    should be. gRPC only says "Failed to bind to address" when it cannot use them (its own
    reason goes to stderr), which reads like a taken port. ``check_validity``: the
    certificate must also be valid now (a served one: clients refuse it otherwise)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_flag, key_flag, ca_flag = flags
    cert_path, key_path, ca_path = paths
    first = None
    loaded: dict[str, list[x509.Certificate]] = {}
    for data, flag, path in ((cert, cert_flag, cert_path), (ca, ca_flag, ca_path)):
        if data is None:
            continue
        try:
            certs = loaded[flag] = x509.load_pem_x509_certificates(data)
        except ValueError:
            raise ValueError(f"{flag} {path}: no PEM certificate in it") from None
        if flag == cert_flag:
            first = certs[0]
            if check_validity:
                from strom.security.tls_reload import expiry_problem

                problem = expiry_problem(data)
                if problem:
                    raise ValueError(f"{flag} {path}: {problem}")
    # The other services verify this certificate with their own --tls-ca (the same bundle):
    # one from another CA, renewed by mistake, made the service unreachable while its reload
    # said it was serving it.
    chained = cert_flag not in loaded or ca_flag not in loaded
    if check_validity and not chained and not _chains_to(loaded[cert_flag], loaded[ca_flag]):
        raise ValueError(
            f"{cert_flag} {cert_path}: the certificate is not signed by a CA of "
            f"{ca_flag} {ca_path}; the other services and the clients would refuse it"
        )
    if key is not None:
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as exc:
            why = "it is encrypted" if isinstance(exc, TypeError) else "no PEM private key in it"
            raise ValueError(f"{key_flag} {key_path}: {why}") from None
        if first is not None:
            raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            if private.public_key().public_bytes(*raw) != first.public_key().public_bytes(*raw):
                raise ValueError(f"{key_flag} {key_path} is not the key of {cert_flag} {cert_path}")


def _issued_by(cert: Any, issuer: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _chains_to(chain: list[Any], roots: list[Any]) -> bool:
    """Whether the first certificate of ``chain`` (a certificate file: the leaf, then any
    intermediates) leads to one of ``roots`` (a CA bundle) through that file's certificates."""
    current, rest = chain[0], list(chain[1:])
    for _ in range(len(chain)):
        if any(_issued_by(current, root) for root in roots):
            return True
        issuer = next((c for c in rest if _issued_by(current, c)), None)
        if issuer is None:
            return False
        rest.remove(issuer)
        current = issuer
    return False


@dataclass
class ServerSecurity:
    """How a service serves: TLS, who may call (authentication) and what they may do."""

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None
    client_auth: str = "none"
    tokens: Callable[[str], str | None] | None = None
    acls: bool = False
    super_users: frozenset[str] = frozenset()
    #: Where ``cert``, ``key`` and ``ca`` are read again when they change (None: never).
    files: TlsFiles | None = None
    #: The ACLs in force (kept current from etcd by :func:`strom.security.follow_acls`).
    authorizer: Authorizer = field(init=False)

    def __post_init__(self) -> None:
        self.authorizer = Authorizer(self.super_users)

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def authenticates(self) -> bool:
        """Whether callers must prove who they are (a client certificate or a token)."""
        return self.client_auth != "none" or self.tokens is not None

    @property
    def enforced(self) -> bool:
        return self.authenticates or self.acls

    def describe(self) -> str:
        """One phrase for the start-up log: how this listener is protected."""
        parts = []
        if self.tls:
            parts.append(
                "TLS, client certificates required" if self.client_auth == "required" else "TLS"
            )
        else:
            parts.append("plaintext")
        if self.tokens is not None:
            parts.append("bearer tokens")
        if self.acls:
            parts.append(f"ACLs on ({len(self.super_users)} super users)")
        return ", ".join(parts)

    def credentials(self) -> grpc.ServerCredentials:
        """The listener's credentials: with ``files``, gRPC asks them before each new
        connection whether the certificate changed (a renewed one is served without a
        restart)."""
        assert self.cert is not None and self.key is not None
        if self.files is not None:
            return grpc.dynamic_ssl_server_credentials(
                self.files.server_configuration(),
                self.files.server_config,
                require_client_authentication=self.client_auth == "required",
            )
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.ca if self.client_auth == "required" else None,
            require_client_auth=self.client_auth == "required",
        )


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS to etcd (https endpoints, optionally with a client certificate)."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


_SERVER = ServerSecurity()
_ETCD = EtcdSecurity()


def server() -> ServerSecurity:
    return _SERVER


def etcd() -> EtcdSecurity:
    return _ETCD


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The security flags every service takes (see the module docstring)."""
    g = parser.add_argument_group("security")
    g.add_argument("--tls-cert", metavar="FILE", help="PEM certificate to serve TLS with")
    g.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    g.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="PEM CA bundle: verifies client certificates (mTLS) and the servers this "
        "service dials",
    )
    g.add_argument(
        "--tls-client-auth",
        default="none",
        choices=CLIENT_AUTH,
        help="client certificates: none (authenticate with bearer tokens, if any) or "
        "required (mTLS: the certificate subject is the principal) (default: %(default)s)",
    )
    g.add_argument(
        "--auth-tokens",
        metavar="FILE",
        help="static bearer tokens, lines '<token> <principal>' (re-read when changed)",
    )
    g.add_argument(
        "--auth-token-verifier",
        metavar="MODULE:FUNCTION",
        help="a function(token) -> principal or None that checks bearer tokens",
    )
    g.add_argument(
        "--client-token-file",
        metavar="FILE",
        help="bearer token this service presents to the other strom services (re-read when "
        "changed)",
    )
    g.add_argument(
        "--acls",
        action="store_true",
        help="authorize every request with the ACLs in etcd (default deny)",
    )
    g.add_argument(
        "--super-users",
        action="append",
        default=[],
        metavar="PRINCIPALS",
        help="principals allowed everything, separated by ';' (a certificate's subject has "
        "commas: 'User:CN=strom,O=acme;User:admin'); may be given more than once",
    )
    g.add_argument("--etcd-ca", metavar="FILE", help="PEM CA bundle of etcd's TLS certificate")
    g.add_argument("--etcd-cert", metavar="FILE", help="PEM client certificate for etcd")
    g.add_argument("--etcd-key", metavar="FILE", help="PEM private key of --etcd-cert")


#: A principal type, as in ``User:``: what a part after a comma of a ``--super-users`` value
#: cannot start with if it is an attribute of a certificate's subject (an RFC 4514 attribute
#: type has no ``:``).
_TYPED = re.compile(r"[A-Za-z][A-Za-z0-9_-]*:")


def parse_super_users(values: str | list[str]) -> frozenset[str]:
    """The principals of ``--super-users`` values (the flag may be given more than once).

    The value was split on every comma, but a certificate's
    principal has one per attribute of its subject: ``User:CN=strom,O=acme,User:CN=admin``
    made ``User:CN=strom``, ``User:O=acme`` and ``User:CN=admin`` super users, so a real
    PKI's service certificate was not one, and any certificate whose subject is just
    ``O=acme`` was. Principals are separated by ``;``, as Kafka's ``super.users`` does; a
    comma belongs to the principal. A value without ``;`` is read as before only when that
    cannot be misread: if every comma-separated part starts with a principal type
    (``User:a,User:b``) it is a list; if none after the first does and each of those is
    an attribute (``User:CN=strom,O=acme``), one principal. Anything else is refused (end
    a single principal with ``;`` to take it as it stands), and so is a ``;``-separated
    principal with a principal type after a comma (``User:a;User:b,User:c``).
    """
    out: set[str] = set()
    for value in [values] if isinstance(values, str) else values:
        pieces = [p.strip() for p in _split_unescaped(value, ";")]
        separated = len(pieces) > 1
        named = False
        for piece in pieces:
            if not piece:
                continue
            named = True
            parts = [p.strip() for p in _split_unescaped(piece, ",") if p.strip()]
            typed = [bool(_TYPED.match(p)) for p in parts]
            # A subject's attributes joined as RFC 4514 writes them, with no space after the
            # comma (an unescaped space there is not part of a value): "User:CN=a, O=b" was
            # kept with its space and never matched a certificate. The
            # ACL commands write a principal the same way (canonical_principal).
            subject = canonical_principal(",".join(parts))
            if len(parts) == 1:
                out.add(user(parts[0]))
            elif separated and not any(typed[1:]):
                out.add(user(subject))
            elif not separated and all(typed):
                out.update(parts)  # the old comma-separated list of whole principals
            elif not separated and not any(typed[1:]) and all(_RDN.match(p) for p in parts[1:]):
                out.add(user(subject))  # one certificate's subject
            else:
                raise ValueError(
                    f"--super-users {value!r}: cannot tell where one principal ends: separate "
                    "principals with ';' (a certificate's subject keeps its commas: "
                    "'User:CN=strom,O=acme;User:admin'), and end a single principal that has "
                    "a comma with ';'"
                )
        if not named:
            raise ValueError(f"--super-users {value!r} names no principal")
    return frozenset(out)


def service_principals(
    security: ServerSecurity, cert: bytes | None, token_file: ClientTokenFile | None
) -> set[str]:
    """The principals this service's calls to the other services are authenticated as,
    which the services of a cluster share (one certificate, one service token: the Helm
    chart, ``strom dev up --tls``): its certificate's subject when callers must present one
    (mTLS), and its ``--client-token-file`` token's principal when tokens authenticate.
    Without authentication every caller is ``User:ANONYMOUS``: none."""
    out: set[str] = set()
    if cert is not None and security.client_auth == "required":  # (checked: it parses)
        out.add(principal_of_certificate(cert))
    if token_file is not None and security.tokens is not None:
        try:
            principal = security.tokens(token_file.current())
        except Exception as exc:  # a verifier that refuses its own service's token
            log.warning("the service's own token was refused (%s): its calls are charged", exc)
            principal = None
        if principal:
            out.add(principal)
    return out


def _exempt_own_principals(
    security: ServerSecurity, files: TlsFiles | None, token_file: ClientTokenFile | None
) -> None:
    """Exempt the services' own principals from client quotas, now and after the
    certificate is renewed (its subject may change)."""
    from strom.security.quotas import QUOTAS

    def apply(cert: bytes | None) -> None:
        QUOTAS.set_service_principals(service_principals(security, cert, token_file))

    apply(security.cert)
    if files is not None:
        files.on_change(lambda new: apply(new[0]))


def configure(args: argparse.Namespace) -> None:
    """Install the process's settings from parsed flags (ValueError names what is wrong)."""
    global _SERVER, _ETCD
    cert = _read(getattr(args, "tls_cert", None), "--tls-cert")
    key = _read(getattr(args, "tls_key", None), "--tls-key")
    ca = _read(getattr(args, "tls_ca", None), "--tls-ca")
    client_auth = getattr(args, "tls_client_auth", "none") or "none"
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    paths = (
        getattr(args, "tls_cert", None),
        getattr(args, "tls_key", None),
        getattr(args, "tls_ca", None),
    )

    def check(cert: bytes | None, key: bytes | None, ca: bytes | None) -> None:
        _check_pem(cert, key, ca, ("--tls-cert", "--tls-key", "--tls-ca"), paths, True)

    check(cert, key, ca)
    files = None
    if cert is not None and key is not None:
        files = TlsFiles(paths, (cert, key, ca), check)
    if client_auth != "none" and (cert is None or ca is None):
        raise ValueError(
            f"--tls-client-auth {client_auth} needs --tls-cert, --tls-key and --tls-ca"
        )
    verifiers: list[Verifier] = []
    if getattr(args, "auth_tokens", None):
        try:
            verifiers.append(TokenFile(args.auth_tokens))
        except OSError as exc:
            raise ValueError(f"cannot read --auth-tokens {args.auth_tokens}: {exc}") from None
    if getattr(args, "auth_token_verifier", None):
        verifiers.append(load_verifier(args.auth_token_verifier))
    tokens = None
    if verifiers:

        def tokens(token: str) -> str | None:
            """The first principal the token file or the verifier gives, in that order.

            The docs promise the file and/or the verifier, but one
            that raised ended the search, so a token file that raised on every call (a
            non-ASCII token in it) kept a configured verifier from ever being asked. Each is
            asked whatever the one before did; when none accepts, the first exception is
            raised again, for the interceptor to log and refuse the token with."""
            error: Exception | None = None
            for v in verifiers:
                try:
                    p = v(token)
                except Exception as exc:
                    error = error or exc
                    continue
                if p:
                    return user(p)
            if error is not None:
                raise error
            return None

    # Read again when it changes, like --auth-tokens: a rotated service token is sent from
    # the next call on, on every channel to the other services.
    token_file = None
    if getattr(args, "client_token_file", None):
        token_file = ClientTokenFile(args.client_token_file)
    supers = parse_super_users(getattr(args, "super_users", None) or [])
    _SERVER = ServerSecurity(
        cert,
        key,
        ca,
        client_auth,
        tokens,
        bool(getattr(args, "acls", False)),
        supers,
        files,
    )
    own = ChannelSecurity(ca, cert, key, None, token_file)
    if files is None:
        set_default_channel(own)
    else:
        set_default_channel(own, files.maybe_reload)
        files.on_change(lambda new: replace_default_channel(new[2], new[0], new[1]))
    _exempt_own_principals(_SERVER, files, token_file)
    etcd_cert = _read(getattr(args, "etcd_cert", None), "--etcd-cert")
    etcd_key = _read(getattr(args, "etcd_key", None), "--etcd-key")
    if (etcd_cert is None) != (etcd_key is None):
        raise ValueError("--etcd-cert and --etcd-key go together")
    etcd_ca = getattr(args, "etcd_ca", None)
    _check_pem(
        etcd_cert,
        etcd_key,
        _read(etcd_ca, "--etcd-ca"),
        ("--etcd-cert", "--etcd-key", "--etcd-ca"),
        (getattr(args, "etcd_cert", None), getattr(args, "etcd_key", None), etcd_ca),
    )
    _ETCD = EtcdSecurity(_read(getattr(args, "etcd_ca", None), "--etcd-ca"), etcd_cert, etcd_key)
