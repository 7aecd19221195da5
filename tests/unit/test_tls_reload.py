"""TlsFiles: a service's certificate, key and CA read again when they change, and only when
the new set can be served; ChannelCache: channels made again with the new files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from strom.devcluster.certs import CertificateAuthority
from strom.security import channel as channel_module
from strom.security.channel import ChannelCache, ChannelSecurity
from strom.security.config import _check_pem
from strom.security.tls_reload import TlsFiles


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def check(cert: bytes | None, key: bytes | None, ca: bytes | None) -> None:
    _check_pem(cert, key, ca, ("--tls-cert", "--tls-key", "--tls-ca"), ("c", "k", "a"), True)


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    ca = CertificateAuthority(tmp_path / "ca")
    first, second = ca.issue("one"), ca.issue("two")
    live = tmp_path / "live"
    live.mkdir()
    cert, key, bundle = live / "tls.crt", live / "tls.key", live / "ca.crt"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    bundle.write_bytes(ca.ca_file.read_bytes())
    clock = Clock()
    files = TlsFiles(
        (cert, key, bundle),
        (cert.read_bytes(), key.read_bytes(), bundle.read_bytes()),
        check,
        clock=clock,
    )
    return files, clock, (cert, key), first, second, ca


def test_a_renewed_certificate_is_taken_after_the_next_look(setup) -> None:  # type: ignore[no-untyped-def]
    files, clock, (cert, key), _, second, _ = setup
    cert.write_bytes(second.cert.read_bytes())
    key.write_bytes(second.key.read_bytes())
    assert files.maybe_reload() is False  # not looked at more than once a second
    clock.now += 1.0
    assert files.maybe_reload() is True
    assert files.files[0] == second.cert.read_bytes()
    assert files.generation == 1
    assert files.server_config() is not None  # the listener gets it once
    assert files.server_config() is None


def test_a_set_that_cannot_be_served_leaves_the_old_one_in_force(setup) -> None:  # type: ignore[no-untyped-def]
    files, clock, (cert, key), first, second, ca = setup
    # The certificate written before its key: they do not match yet.
    cert.write_bytes(second.cert.read_bytes())
    clock.now += 1.0
    assert files.maybe_reload() is False
    assert files.files[0] == first.cert.read_bytes() and files.generation == 0
    # Then the key arrives: the pair is taken, and the moment between is no error.
    key.write_bytes(second.key.read_bytes())
    clock.now += 1.0
    assert files.maybe_reload() is True
    assert files.refusals == 0
    # An expired certificate is not taken either, nor a file that is gone.
    expired = ca.issue("two", expired=True)
    cert.write_bytes(expired.cert.read_bytes())
    key.write_bytes(expired.key.read_bytes())
    for _ in range(3):
        clock.now += 1.0
        assert files.maybe_reload() is False
    assert files.refusals == 1  # once per version, when it is still bad a second later
    cert.unlink()
    for _ in range(2):
        clock.now += 1.0
        assert files.maybe_reload() is False
    assert files.refusals == 2
    assert files.files[0] == second.cert.read_bytes() and files.generation == 1


def test_files_touched_but_not_changed_are_not_a_new_set(setup) -> None:  # type: ignore[no-untyped-def]
    files, clock, (cert, _), first, _, _ = setup
    cert.write_bytes(first.cert.read_bytes())  # same bytes, new mtime
    clock.now += 1.0
    assert files.maybe_reload() is False
    assert files.generation == 0


def test_the_channel_cache_makes_its_channels_again_with_new_files(
    monkeypatch: pytest.MonkeyPatch,
    setup,  # type: ignore[no-untyped-def]
) -> None:
    _, _, _, first, second, ca = setup
    monkeypatch.setattr(channel_module, "_DEFAULT_CHANNEL", ChannelSecurity())
    monkeypatch.setattr(channel_module, "_RELOAD", None)
    channel_module.set_default_channel(
        ChannelSecurity(ca.ca_file.read_bytes(), first.cert.read_bytes(), first.key.read_bytes())
    )

    async def run() -> tuple[bool, bool, int]:
        cache = ChannelCache()
        a = cache.get("127.0.0.1:1")
        same = cache.get("127.0.0.1:1") is a
        channel_module.replace_default_channel(
            ca.ca_file.read_bytes(), second.cert.read_bytes(), second.key.read_bytes()
        )
        b = cache.get("127.0.0.1:1")
        assert channel_module.default_channel().cert == second.cert.read_bytes()
        await cache.close()
        return same, b is not a, len(cache)

    assert asyncio.run(run()) == (True, True, 0)


def test_a_certificate_of_a_ca_the_bundle_lacks_is_not_taken(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Found from outside: a renewed certificate from another CA was taken ("serving and
    dialling with the new certificate") and made the service unreachable; it is refused like
    any set that cannot be served, and so is such a certificate at start."""
    files, clock, (cert, key), first, _, _ = setup
    stranger = CertificateAuthority(tmp_path / "other", "other-ca").issue("one")
    cert.write_bytes(stranger.cert.read_bytes())
    key.write_bytes(stranger.key.read_bytes())
    for _ in range(2):
        clock.now += 1.0
        assert files.maybe_reload() is False
    assert files.refusals == 1 and files.files[0] == first.cert.read_bytes()
    with pytest.raises(ValueError, match="not signed by a CA of --tls-ca"):
        check(stranger.cert.read_bytes(), stranger.key.read_bytes(), files.files[2])


def test_a_chain_through_an_intermediate_in_the_certificate_file_is_taken(
    tmp_path: Path,
) -> None:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from strom.security.config import _chains_to

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def make(cn: str, issuer: x509.Name, key, signer, ca: bool) -> x509.Certificate:  # type: ignore[no-untyped-def]
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(signer, hashes.SHA256())
        )

    root = CertificateAuthority(tmp_path / "root", "root-ca")
    other = CertificateAuthority(tmp_path / "other", "other-ca")
    mid_key, leaf_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    mid = make("mid", root.cert.subject, mid_key, root.key, True)
    leaf = make("leaf", name("mid"), leaf_key, mid_key, False)
    assert _chains_to([leaf, mid], [root.cert])
    assert not _chains_to([leaf], [root.cert])  # the intermediate is missing
    assert not _chains_to([leaf, mid], [other.cert])


def test_an_idle_service_looks_at_its_files_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: only traffic made a service look at its TLS files, so an idle one
    (a standby controller) kept the old certificate's end in its gauge after a renewal."""
    from strom.service import runtime

    monkeypatch.setattr(runtime, "TLS_FILES_LOOK_S", 0.0)

    class Files:
        looks = 0
        look_again_soon = False

        def maybe_reload(self) -> bool:
            self.looks += 1
            if self.looks == 3:
                stop.set()
            return False

    stop = asyncio.Event()
    files = Files()
    asyncio.run(runtime._watch_tls_files(files, stop))  # type: ignore[arg-type]
    assert files.looks == 3


def test_an_idle_service_refuses_a_bad_set_at_the_next_look_a_second_later(
    setup,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A changed set that fails is refused only when it still fails at the next look (a
    certificate copied before its key is no error). An idle service's next look came with its
    10 s timer, so it reported a bad renewal 10-20 s after it was written; now a look that
    leaves such a set brings the next one after the one-second poll interval."""
    from strom.service import runtime

    files, clock, (cert, _), _, _, ca = setup
    monkeypatch.setattr(runtime, "TLS_FILES_LOOK_S", 3600.0)  # the idle timer: not within this
    monkeypatch.setattr(runtime, "TLS_FILES_LOOK_AGAIN_S", 0.05)
    cert.write_bytes(ca.issue("one", expired=True).cert.read_bytes())
    clock.now += 1.0
    assert files.maybe_reload() is False  # a connection's look: perhaps a write under way
    assert files.refusals == 0 and files.look_again_soon
    clock.now += 1.0

    async def watch() -> None:
        stop = asyncio.Event()
        watcher = asyncio.create_task(runtime._watch_tls_files(files, stop))
        try:
            async with asyncio.timeout(30):
                while files.refusals == 0:
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            await watcher

    asyncio.run(watch())
    assert files.refusals == 1 and not files.look_again_soon


def _issued_ahead(ca: CertificateAuthority, seconds: float) -> tuple[bytes, bytes]:
    """A certificate (and key) of ``ca`` whose notBefore is ``seconds`` ahead of now, as an
    issuer whose clock is ahead makes it."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "two")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + dt.timedelta(seconds=seconds))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def test_a_certificate_not_valid_yet_is_taken_once_it_is(
    setup,  # type: ignore[no-untyped-def]
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found from outside: a renewal whose notBefore was a few seconds ahead (the issuer's
    clock) was refused and its files never read again, so the service stayed on the old
    certificate until it expired. It is taken at a look once it is valid, logged once
    meanwhile, and not counted as a refused set."""
    from strom.devcluster.procs import wait_for

    files, clock, (cert, key), first, _, ca = setup
    early_cert, early_key = _issued_ahead(ca, 4.0)
    cert.write_bytes(early_cert)
    key.write_bytes(early_key)

    def look() -> bool:
        clock.now += 1.0
        return files.maybe_reload()

    assert look() is False and look() is False  # not valid yet
    assert files.files[0] == first.cert.read_bytes()
    wait_for(look, timeout=30, what="the certificate taken once valid")
    assert files.files[0] == early_cert and files.generation == 1
    assert files.refusals == 0
    waiting = [r for r in caplog.records if "not used yet" in r.getMessage()]
    assert len(waiting) == 1, [r.getMessage() for r in caplog.records]
