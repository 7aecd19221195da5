"""Who is calling: principals from client certificates and bearer tokens (DESIGN: Kafka's
``User:<name>`` principals).

- **mTLS**: the principal is the client certificate's subject, ``User:CN=alice,O=acme`` (RFC
  4514 order, as Kafka's default principal builder gives it).
- **Bearer tokens** (``authorization: Bearer <token>`` in the call metadata): a static token
  file (``--auth-tokens``: lines ``<token> <principal>``, re-read when it changes, so a
  Kubernetes Secret update applies without a restart; a bad version fails closed, see
  :class:`TokenFile`) and/or a pluggable verifier (``--auth-token-verifier
  module:function``, called with the token, returning the principal or None; one that
  raises refuses the token too, see :mod:`strom.security.interceptor`).
"""

from __future__ import annotations

import hmac
import importlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cryptography import x509
from prometheus_client import Counter

from strom.security.channel import TOKEN_METADATA
from strom.service import metrics as service_metrics

log = logging.getLogger("strom.security")

TOKEN_FILE_ERRORS = Counter(
    "strom_service_auth_token_file_errors",
    "Versions of the --auth-tokens file that were bad when re-read, each counted once: a "
    "bad line (not '<token> <principal>', a token not printable ASCII, a token given two "
    "principals; its token does not authenticate) or a file that cannot be read (no token "
    "authenticates); the log names the line and why",
    ["service"],
)

#: Whether this process serves with an --auth-tokens file (its error series then exists).
_token_files = False


def init_service_metrics() -> None:
    """Create the token file's error series at 0 once the service's name is known: a counter
     born at 1 on its first bad version has no increase, and its alert could never fire
    ."""
    if _token_files and service_metrics.SERVICE:
        TOKEN_FILE_ERRORS.labels(service_metrics.SERVICE)


ANONYMOUS = "User:ANONYMOUS"

Verifier = Callable[[str], "str | None"]


def user(name: str) -> str:
    """``alice`` → ``User:alice`` (a name that already has a type is kept)."""
    return name if name.startswith("User:") else f"User:{name}"


#: An RFC 4514 attribute, ``O=acme`` or ``2.5.4.10=acme``.
_RDN = re.compile(r"([A-Za-z][A-Za-z0-9-]*|[0-9]+(\.[0-9]+)*)=")


def _split_unescaped(text: str, sep: str) -> list[str]:
    r"""``text`` split on ``sep`` where it is not escaped by a backslash (RFC 4514 writes a
    ``,`` or ``;`` inside an attribute value as ``\,`` / ``\;``; the escape is kept)."""
    parts, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == sep:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _trim(part: str) -> str:
    r"""``part`` without the spaces around it, but an escaped one at its end (``\ ``) kept:
    RFC 4514 escapes a value's own trailing space."""
    part = part.lstrip()
    stripped = part.rstrip()
    if len(stripped) < len(part) and stripped.endswith("\\"):
        stripped += " "
    return stripped


def canonical_principal(principal: str) -> str:
    """A certificate's principal as the services derive it (``User:`` + the subject in RFC
    4514 form, no space after a comma): ``User:CN=Smith\\, John, O=Acme`` →
    ``User:CN=Smith\\, John,O=Acme``. Anything that is not a subject of two or more
    attributes (``User:alice``, ``User:*``, a token's principal with a comma in it) is
    returned as it is. Shared by ``--super-users`` and the ACL commands (``strom acls add``,
    ``acls apply``), so that a principal typed with spaces matches the certificate it means
    (an ACL kept as typed never matched)."""
    kind, colon, name = principal.partition(":")
    if not colon:
        return principal
    parts = [_trim(p) for p in _split_unescaped(name, ",")]
    parts = [p for p in parts if p]
    if len(parts) < 2 or not all(_RDN.match(p) for p in parts):
        return principal
    return f"{kind}:{','.join(parts)}"


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
    """Static bearer tokens from a file, re-read when the file changes.

    A bad file fails the start. A later version that is bad must not keep the old table: that
    kept a revoked token working for as long as any other line of the file was wrong (found
    from outside). So a reload fails closed, as far as the file is bad: a bad line (see
    :func:`_parse`) is left out (its token does not authenticate; the good lines, removals
    included, apply), and a file that cannot be read or decoded as UTF-8 authenticates no
    token at all. Either is logged at ERROR and counted in
    ``strom_service_auth_token_file_errors_total`` once per version of the file, naming the
    line and why but never the token. A failed version's stamp is remembered like a good
    one's, so it is not read and parsed again on every call while it stays bad.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # A missing or bad file fails the start, with its name (OSError, ValueError).
        self._stamp: object = _stamp(os.stat(self.path))
        self._tokens, problems = _parse(self.path.read_text(encoding="utf-8"))
        if problems:
            raise ValueError(f"{self.path}:{problems[0]}")
        self._bad = False  # whether the version in force failed (logged as such)
        global _token_files
        _token_files = True
        init_service_metrics()

    def _reload(self) -> None:
        """Re-read the file if its stamp changed (the lock held)."""
        try:
            stamp: object = _stamp(os.stat(self.path))
        except OSError as exc:
            stamp = ("unreadable", exc.errno)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:  # gone, not permitted, not UTF-8
            self._tokens = {}
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._failed(f"cannot read it ({why}); no bearer token authenticates until it can")
            return
        tokens, problems = _parse(text)
        self._tokens = tokens
        if problems:
            shown = "; ".join(f"line {p}" for p in problems[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            self._failed(
                f"{shown}{more}; the tokens of those lines do not authenticate until they "
                f"are fixed, the {len(tokens)} good lines apply"
            )
        elif self._bad:
            self._bad = False
            log.warning("bearer tokens file %s: good again, %d tokens", self.path, len(tokens))

    def _failed(self, why: str) -> None:
        self._bad = True
        TOKEN_FILE_ERRORS.labels(service_metrics.SERVICE).inc()
        log.error("bearer tokens file %s: %s", self.path, why)

    def __call__(self, token: str) -> str | None:
        """The token's principal, or None. Compared as UTF-8 bytes: ``hmac.compare_digest``
        raises TypeError on a str with a non-ASCII character, and a file holding one (a
        UTF-8 byte order mark before its first token was enough) refused every token, the
        good ones too. ``surrogatepass``: any str encodes."""
        with self._lock:
            self._reload()
            tokens = self._tokens
        presented = token.encode("utf-8", "surrogatepass")
        for known, principal in tokens.items():
            if hmac.compare_digest(known, presented):
                return principal
        return None


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a new version of a file: the inode too (an atomic rename, as a Kubernetes
    Secret update makes, can keep the size and the second), and the change time (a chmod
    that makes an unreadable file readable again changes nothing else)."""
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino


def _printable_ascii(token: str) -> bool:
    """Whether a token can be sent at all: a gRPC metadata value (``authorization``) carries
    printable ASCII only, so a token with another character can never match (RFC 6750's
    b64token is a subset of these)."""
    return all("!" <= c <= "~" for c in token)


def _parse(text: str) -> tuple[dict[bytes, str], list[str]]:
    """The tokens (UTF-8 bytes, as :class:`TokenFile` compares them) of a token file's good
    lines, and what is wrong with each other line (``"<n>: ..."``; never the line itself,
    which holds a token).

    A UTF-8 byte order mark (as Windows editors write) was read as
    part of the first token, and a non-ASCII token was taken as it stood: either made every
    comparison raise, no token authenticated and nothing counted an error. A leading byte
    order mark is dropped; a token that is not printable ASCII is a bad line. So is a token
    given a second, different principal: the last line used to win, silently, and which one
    was meant cannot be told, so neither applies (fail closed, as for any bad line).
    """
    tokens: dict[bytes, str] = {}
    problems: list[str] = []
    first_line: dict[str, int] = {}  # token -> the line that gave it first
    conflicted: set[str] = set()
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            hint = " (a space in the principal?)" if len(parts) > 2 else ""
            problems.append(f"{n}: expected '<token> <principal>', found {len(parts)} words{hint}")
            continue
        token, principal = parts[0], user(parts[1])
        if not _printable_ascii(token):
            problems.append(
                f"{n}: the token has a character that is not printable ASCII (a gRPC call "
                "cannot send it; tokens are ASCII letters, digits and punctuation)"
            )
            continue
        key = token.encode()
        if token in first_line and (token in conflicted or tokens.get(key) != principal):
            problems.append(
                f"{n}: the token of line {first_line[token]} again, with another principal; "
                "neither line's principal applies"
            )
            conflicted.add(token)
            continue
        first_line.setdefault(token, n)
        tokens[key] = principal
    for token in conflicted:
        tokens.pop(token.encode(), None)
    return tokens, problems


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
