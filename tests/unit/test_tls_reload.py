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
