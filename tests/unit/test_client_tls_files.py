"""A client's TLS files are checked before anything is dialled (found from outside): an
expired client certificate used to end in "BROKER_NOT_AVAILABLE ... Socket closed" (the
Producer waiting out max_block_ms first), a key that is not the certificate's in gRPC's
"Failed to create security handshaker" under lines of C-core log. Now each names the file
and the problem, and the CLI prints it in one line. No cluster runs here."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from strom import Producer
from strom.cli.main import main
from strom.devcluster.certs import CertificateAuthority
from strom.security.channel import CLIENT_ENV, ChannelSecurity

NOWHERE = "127.0.0.1:1"  # nothing listens: every check must happen before dialling


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path / "ca")


def _future(ca: CertificateAuthority) -> tuple[Path, Path]:
    """A certificate of ``ca`` that becomes valid tomorrow, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "later")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .sign(ca.key, hashes.SHA256())
    )
    c, k = ca.dir / "later.crt", ca.dir / "later.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return c, k


def test_a_bad_client_certificate_key_or_ca_is_named_before_dialling(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    good, other = ca.issue("alice"), ca.issue("bob")
    expired = ca.issue("alice", expired=True)
    later_cert, later_key = _future(ca)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem file\n")
    encrypted = tmp_path / "encrypted.key"
    key = serialization.load_pem_private_key(good.key.read_bytes(), password=None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )

    def refused(cafile: Path, certfile: Path, keyfile: Path) -> str:
        with pytest.raises(ValueError) as exc:
            ChannelSecurity.from_files(cafile, certfile, keyfile)
        return str(exc.value)

    cafile = ca.ca_file
    assert refused(cafile, expired.cert, expired.key).startswith(
        f"ssl_certfile {expired.cert}: the certificate expired on "
    )
    assert f"ssl_certfile {later_cert}: the certificate is not valid before " in refused(
        cafile, later_cert, later_key
    )
    assert refused(cafile, good.cert, other.key) == (
        f"ssl_keyfile {other.key} is not the key of ssl_certfile {good.cert}"
    )
    # A key of another type (RSA with the dev CA's EC certificate): OpenSSL's own reason,
    # NO_CERTIFICATE_ASSIGNED, was all a user saw (found from outside).
    rsa_key = tmp_path / "rsa.key"
    rsa_key.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert refused(cafile, good.cert, rsa_key) == (
        f"ssl_keyfile {rsa_key} is not the key of ssl_certfile {good.cert}"
    )
    assert refused(cafile, garbage, good.key) == f"ssl_certfile {garbage}: no PEM certificate in it"
    assert refused(cafile, good.cert, garbage) == f"ssl_keyfile {garbage}: no PEM private key in it"
    assert "it is encrypted" in refused(cafile, good.cert, encrypted)
    assert (
        refused(garbage, good.cert, good.key) == f"ssl_cafile {garbage}: no PEM certificate in it"
    )
    # A certificate, its key and a CA that can work pass (a chain, leaf first, too).
    chain = tmp_path / "chain.crt"
    chain.write_bytes(good.cert.read_bytes() + ca.ca_file.read_bytes())
    assert ChannelSecurity.from_files(cafile, chain, good.key).cert is not None
    assert ChannelSecurity.from_files(cafile).ca is not None


def test_the_clients_and_the_cli_refuse_an_expired_certificate_at_once(
    ca: CertificateAuthority, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expired = ca.issue("alice", expired=True)
    tls = {"ssl_cafile": str(ca.ca_file), "ssl_certfile": str(expired.cert)}
    with pytest.raises(ValueError, match="expired on"):
        Producer(NOWHERE, **tls, ssl_keyfile=str(expired.key))  # not after max_block_ms
    for name in CLIENT_ENV:  # the CLI exports its flags: restore the environment after
        monkeypatch.setenv(name, "")
    code = main(
        [
            "topics",
            "list",
            "--bootstrap",
            NOWHERE,
            "--ssl-cafile",
            str(ca.ca_file),
            "--ssl-certfile",
            str(expired.cert),
            "--ssl-keyfile",
            str(expired.key),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    # Named by the flag given (it said ssl_certfile, the client's keyword).
    assert err.startswith(f"strom topics: error: --ssl-certfile {expired.cert}: the certificate ")
    assert "expired on" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("flag", "variable"),
    [("--token-file", "STROM_TOKEN_FILE"), ("--ssl-cafile", "STROM_SSL_CAFILE")],
)
def test_a_file_is_named_by_the_flag_or_the_variable_it_came_from(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    variable: str,
) -> None:
    """Found from outside: ``--token-file /nonexistent`` said ``cannot read STROM_TOKEN_FILE
    /nonexistent`` and ``--ssl-cafile`` was named ``ssl_cafile``."""
    missing = tmp_path / "nonexistent"
    for name in CLIENT_ENV:  # the CLI exports its flags: restore the environment after
        monkeypatch.setenv(name, "")
    assert main(["topics", "list", "--bootstrap", NOWHERE, flag, str(missing)]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err == f"strom topics: error: {flag} {missing}: cannot read it: No such file or directory"
    )
    # Set in the environment, not given as a flag: the variable is named.
    monkeypatch.setenv(variable, str(missing))
    assert main(["topics", "list", "--bootstrap", NOWHERE]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"strom topics: error: {variable} {missing}: cannot read it: No such file or directory"
    )
