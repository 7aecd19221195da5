"""HOST:PORT checks of the services' --listen/--advertise and the clients' bootstrap: an
address nobody can dial is refused at once, naming what is wrong (found from outside: a
node advertised ``http://x:9092`` and registered it; ``h:p;h:p`` as a bootstrap was retried
for a minute before "Misformatted domain name")."""

from __future__ import annotations

import pytest

from strom.argtypes import host_problem
from strom.client.cluster import parse_bootstrap
from strom.service.config import split_host_port


@pytest.mark.parametrize(
    "host",
    ["localhost", "node-1.strom-headless.ns.svc.cluster.local", "10.0.0.7", "[::1]", "a_b"],
)
def test_hosts_that_can_be_dialled_pass(host: str) -> None:
    assert host_problem(host) is None


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("http://x", "URL scheme"),
        ("//x", "URL scheme"),
        ("::1", "IPv6 address without brackets"),
        ("fe80::1", "IPv6 address without brackets"),
        ("[zz]", "not an IPv6 address"),
        ("h:1;h", "one HOST:PORT per entry"),
        ("h:1 h", "one HOST:PORT per entry"),
        ("h/x", "one HOST:PORT per entry"),
    ],
)
def test_hosts_that_cannot_be_dialled_are_named(host: str, said: str) -> None:
    problem = host_problem(host)
    assert problem is not None and said in problem


def test_a_bootstrap_list_is_refused_at_its_bad_entry() -> None:
    assert parse_bootstrap(" a:1, [::1]:2 ") == ["a:1", "[::1]:2"]
    with pytest.raises(ValueError, match=r"'h:1;h:2'.*comma-separated"):
        parse_bootstrap("h:1;h:2")
    with pytest.raises(ValueError, match=r"'http://h:9092'.*URL scheme"):
        parse_bootstrap("a:1,http://h:9092")


def test_a_service_address_keeps_its_wildcard_and_refuses_the_rest() -> None:
    assert split_host_port(":5") == ("0.0.0.0", 5)
    assert split_host_port("[::]:9092") == ("[::]", 9092)
    with pytest.raises(ValueError, match=r"--advertise '::1:39998'.*brackets"):
        split_host_port("::1:39998", what="--advertise")
