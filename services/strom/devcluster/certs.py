"""A local certificate authority for development clusters, benchmarks and tests.

``strom dev up --tls`` and ``strom bench tls`` need real X.509 certificates without asking
the user for OpenSSL incantations: a CA, and certificates it signs that serve as server
(valid for ``localhost`` and ``127.0.0.1``) and as client (the subject CN is the principal,
``User:CN=<name>``). Made with the ``cryptography`` library; keys are P-256. Not for
production: the CA key sits next to the certificates, unencrypted (each key file is
readable by its owner only, 0600).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    """A certificate and its key as files."""

    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(dir_: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    c, k = dir_ / f"{stem}.crt", dir_ / f"{stem}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        k,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return Pem(c, k)


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only.

    FIX (found from outside): keys were written with the umask's mode (0644 as a rule), so any
    local user could read the dev CA's key and mint an admin certificate. The file is created
    0600 under a temporary name and renamed over ``path``: there is no moment when the key is
    on disk with a wider mode (as a chmod after writing leaves), and a key issued again over
    an old, wider file gets a new file rather than the old mode.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class CertificateAuthority:
    """A CA that signs server and client certificates into ``dir_``."""

    def __init__(self, dir_: Path, name: str = "strom-test-ca") -> None:
        self.dir = dir_
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = _write(dir_, name, self.cert, self.key)

    @classmethod
    def load(cls, dir_: Path, name: str) -> CertificateAuthority:
        """The CA written earlier into ``dir_`` as ``<name>.crt`` / ``<name>.key``."""
        self = cls.__new__(cls)
        self.dir, self.name = dir_, name
        crt, key = dir_ / f"{name}.crt", dir_ / f"{name}.key"
        if not crt.exists() or not key.exists():
            raise FileNotFoundError(f"no certificate authority {name!r} in {dir_}")
        self.cert = x509.load_pem_x509_certificate(crt.read_bytes())
        loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        self.key = loaded
        self.pem = Pem(crt, key)
        return self

    @property
    def ca_file(self) -> Path:
        return self.pem.cert

    def issue(
        self,
        cn: str,
        *,
        expired: bool = False,
        dns_names: Sequence[str] | None = None,
        days: int = 30,
        stem: str | None = None,
    ) -> Pem:
        """A certificate for ``cn`` usable as server (127.0.0.1, localhost; or only
        ``dns_names``, as a Kubernetes pod's certificate) and client, valid for ``days``
        from now, written as ``<stem>.crt`` / ``<stem>.key`` (default: after ``cn``)."""
        names: list[x509.GeneralName] = (
            [x509.DNSName(n) for n in dns_names]
            if dns_names is not None
            else [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (
            (now - dt.timedelta(days=10), now - dt.timedelta(days=1))
            if expired
            else (now - dt.timedelta(days=1), now + dt.timedelta(days=days))
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return _write(self.dir, stem or cn + ("-expired" if expired else ""), cert, key)
