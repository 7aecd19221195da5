"""Who is calling: principals from client certificates and bearer tokens (DESIGN: Kafka's
``User:<name>`` principals).

- **mTLS**: the principal is the client certificate's subject, ``User:CN=alice,O=acme`` (RFC
  4514 order, as Kafka's default principal builder gives it).
- **Bearer tokens** (``authorization: Bearer <token>`` in the call metadata): a static token
  file (``--auth-tokens``: lines ``<token> <principal>``, re-read when it changes, so a
  Kubernetes Secret update applies without a restart) and/or a pluggable verifier
  (``--auth-token-verifier module:function``, called with the token, returning the principal
  or None).
"""

from __future__ import annotations

import contextlib
import hmac
import importlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cryptography import x509

from strom.security.channel import TOKEN_METADATA

ANONYMOUS = "User:ANONYMOUS"

Verifier = Callable[[str], "str | None"]


def user(name: str) -> str:
    """``alice`` → ``User:alice`` (a name that already has a type is kept)."""
    return name if name.startswith("User:") else f"User:{name}"


def principal_of_certificate(pem: bytes) -> str:
    """``User:<subject>`` of a PEM certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    return user(cert.subject.rfc4514_string())


def principal_of_auth_context(auth: Mapping[str, Sequence[bytes]]) -> str | None:
    """The mTLS principal from a gRPC auth context (None when the peer sent no certificate)."""
    pem = auth.get("x509_pem_cert")
    if not pem:
        return None
    return principal_of_certificate(pem[0])


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == TOKEN_METADATA:
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class TokenFile:
    """Static bearer tokens from a file, re-read when the file changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._tokens: dict[str, str] = {}
        self._load()  # a missing or bad file fails the start, with its name

    def _load(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        tokens: dict[str, str] = {}
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{self.path}:{n}: expected '<token> <principal>', got {line!r}")
            tokens[parts[0]] = user(parts[1])
        self._tokens, self._stamp = tokens, stamp

    def __call__(self, token: str) -> str | None:
        with self._lock:
            with contextlib.suppress(OSError, ValueError):
                self._load()  # on failure keep the last good tokens (file being replaced)
            tokens = self._tokens
        for known, principal in tokens.items():
            if hmac.compare_digest(known, token):
                return principal
        return None


def load_verifier(spec: str) -> Verifier:
    """``module:function`` → the function (a clear error naming what is missing)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"a token verifier is 'module:function', got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load token verifier {spec!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"token verifier {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]
