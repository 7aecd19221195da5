"""A bootstrap list none of whose names resolves fails at once, as Kafka's clients refuse
"no resolvable bootstrap urls" (found from outside: the CLI and Admin retried for a minute,
a Producer's send for 60 s, a group consumer's poll returned nothing for good). A list with
one name that resolves keeps retrying: that node may be starting. ``.invalid`` names never
resolve (RFC 6761)."""

from __future__ import annotations

import time

import pytest

from strom import Admin, Consumer, Producer
from strom.client.cluster import ClusterClient
from strom.errors import BrokerNotAvailableError, InvalidConfigError

BAD = "nosuch-strom.invalid:9092"


def _fails_fast(call: object) -> InvalidConfigError:
    started = time.monotonic()
    with pytest.raises(InvalidConfigError, match="no bootstrap address resolves") as info:
        call()  # type: ignore[operator]
    assert time.monotonic() - started < 10  # (the retries took 30-60 s)
    assert not info.value.retriable and "nosuch-strom.invalid" in str(info.value)
    return info.value


def test_a_lookup_fails_at_once_and_names_the_host() -> None:
    with ClusterClient(BAD, retry_s=30) as client:
        _fails_fast(client.metadata)
        _fails_fast(lambda: client.find_coordinator("g"))  # the same answer again


def test_each_client_says_so_rather_than_retrying() -> None:
    with Admin(BAD) as admin:
        _fails_fast(admin.list_topics)
    with Producer(BAD, max_block_ms=60_000) as producer:
        _fails_fast(lambda: producer.send("t", b"x").get(60))
    with Consumer(BAD, group_id="g") as consumer:
        consumer.subscribe(["t"])

        def poll_until_raised() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                consumer.poll(100)

        _fails_fast(poll_until_raised)


def test_a_list_with_one_name_that_resolves_keeps_retrying() -> None:
    # 127.0.0.1:1 resolves and refuses: a node that may come up, so the lookup retries.
    with (
        ClusterClient(f"{BAD},127.0.0.1:1", retry_s=1.0) as client,
        pytest.raises(BrokerNotAvailableError),
    ):
        client.metadata()
