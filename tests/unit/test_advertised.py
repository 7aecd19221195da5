"""What a service advertises for a wildcard ``--listen`` without ``--advertise``: this
host's name when it resolves here to this host's own non-loopback addresses, else
127.0.0.1, with the start-up warning (the real processes: tests/integration/
test_advertised_address.py). Name resolution is faked: the choice is the pure part."""

from __future__ import annotations

import argparse
import socket
from typing import Any

import pytest

from strom.service import flags

V4, V6 = socket.AF_INET, socket.AF_INET6
LOCAL = {"10.1.2.3", "fd00::7"}


def _resolver(table: dict[str, list[str]]) -> Any:
    def resolve(name: str, family: int) -> list[tuple[int, tuple[Any, ...]]]:
        out = []
        for ip in table.get(name, []):
            fam = V6 if ":" in ip else V4
            if family in (socket.AF_UNSPEC, fam):
                out.append((fam, (ip, 0) if fam == V4 else (ip, 0, 0, 0)))
        return out

    return resolve


def _is_local(_family: int, sockaddr: tuple[Any, ...]) -> bool:
    return sockaddr[0] in LOCAL


def _choose(listen_host: str, names: list[str], table: dict[str, list[str]]) -> tuple[str, str]:
    return flags.wildcard_host(
        listen_host, names=names, resolve=_resolver(table), is_local=_is_local
    )


def test_a_name_of_this_host_s_own_address_is_advertised() -> None:
    table = {"pod-0.svc.local": ["10.1.2.3"], "pod-0": ["10.1.2.3"]}
    assert _choose("0.0.0.0", ["pod-0.svc.local", "pod-0"], table) == (
        "pod-0.svc.local",
        "this host's name",
    )


def test_the_plain_name_when_the_canonical_one_is_localhost() -> None:
    table = {"localhost": ["127.0.0.1"], "box": ["10.1.2.3"]}
    assert _choose("[::]", ["localhost", "box"], table)[0] == "box"


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ({"laptop": ["127.0.1.1"]}, "this host's name 'laptop' resolves to loopback 127.0.1.1"),
        ({}, "this host's name 'laptop' resolves to no IPv4 address"),
        ({"laptop": ["10.9.9.9"]}, "resolves to 10.9.9.9, not an address of this host"),
        ({"laptop": ["10.1.2.3", "127.0.0.1"]}, "resolves to loopback 127.0.0.1"),
        # A 0.0.0.0 listener takes no IPv6: a name with only an IPv6 address is no use.
        ({"laptop": ["fd00::7"]}, "resolves to no IPv4 address"),
    ],
)
def test_loopback_when_the_name_is_not_this_host_s(table: dict[str, list[str]], why: str) -> None:
    host, reason = _choose("0.0.0.0", ["laptop"], table)
    assert host == "127.0.0.1" and why in reason


def test_an_ipv6_wildcard_takes_an_ipv6_name() -> None:
    assert _choose("[::]", ["v6"], {"v6": ["fd00::7"]})[0] == "v6"
    assert _choose("::", ["v6"], {"v6": ["fd00::7"]})[0] == "v6"


def test_the_warning_names_the_address_and_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flags, "wildcard_host", lambda host: ("127.0.0.1", "because"))
    address = flags.advertised_address(":9092", None)
    assert (address.host, address.port) == ("127.0.0.1", 9092)
    assert address.warning is not None
    assert "--listen :9092" in address.warning and "advertising 127.0.0.1:9092" in address.warning
    assert "(because)" in address.warning and "--advertise HOST:PORT" in address.warning
    monkeypatch.setattr(flags, "wildcard_host", lambda host: ("node-1.example", "its name"))
    address = flags.advertised_address("0.0.0.0:9092", None)
    assert address.host == "node-1.example" and address.warning is not None
    assert "advertising node-1.example:9092 (its name)" in address.warning


def test_flags_that_name_the_address_need_no_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_guess(host: str) -> tuple[str, str]:
        raise AssertionError("guessed")

    monkeypatch.setattr(flags, "wildcard_host", no_guess)
    assert flags.advertised_address("0.0.0.0:1", "n1.example:2") == flags.Advertised(
        "n1.example", 2
    )
    assert flags.advertised_address("10.0.0.5:7000", None) == flags.Advertised("10.0.0.5", 7000)


@pytest.mark.parametrize("text", ["0.0.0.0:9092", "[::]:9092", ":9092"])
def test_a_wildcard_advertise_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="wildcard, which nobody can dial"):
        flags.advertise_address(text)
    with pytest.raises(ValueError, match="wildcard, which nobody can dial"):
        flags.advertised_address("0.0.0.0:9092", text)
