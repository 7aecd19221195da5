"""Constructor arguments: types checked once, Kafka's names pointed to strom's.

Found from outside: ``Producer(linger_ms="5")`` failed with a bare ``'<' not supported``,
``Producer(batch_size=True)`` was taken, and kafka-python / confluent-kafka names
(``bootstrap_servers``, ``compression_type``, ``max_in_flight_requests_per_connection``,
``NewTopic(num_partitions=...)``) got a bare "unexpected keyword argument"."""

from __future__ import annotations

from typing import Any

import pytest

from strom import Admin, Consumer, NewTopic, Producer, aio

NOWHERE = "127.0.0.1:1"  # nothing is sent: only the settings are looked at


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"linger_ms": "5"}, TypeError, "linger_ms must be a number"),
        ({"linger_ms": True}, TypeError, "linger_ms must be a number"),
        ({"linger_ms": -1}, ValueError, "linger_ms must be >= 0"),
        ({"linger_ms": float("nan")}, ValueError, "linger_ms must be >= 0 and finite"),
        ({"batch_size": True}, TypeError, "batch_size must be an int, got True"),
        ({"batch_size": 1.5}, TypeError, "batch_size must be an int"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"buffer_memory": "64MB"}, TypeError, "buffer_memory must be an int"),
        ({"max_block_ms": "60000"}, TypeError, "max_block_ms must be an int"),
        ({"max_block_ms": -1}, ValueError, "max_block_ms must be >= 0"),
        ({"retries": None}, TypeError, "retries must be an int"),
        ({"retry_backoff_ms": "100"}, TypeError, "retry_backoff_ms must be an int"),
        ({"transaction_timeout_ms": 0}, ValueError, "transaction_timeout_ms must be >= 1"),
    ],
)
def test_producer_numbers_are_checked_once_with_their_name(
    args: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Producer(NOWHERE, **args)


def test_producer_numbers_that_fit_are_taken() -> None:
    p = Producer(NOWHERE, linger_ms=0.5, max_block_ms=0, retries=0, batch_size=1)
    p.close()
    assert p.linger_s == 0.0005 and p.batch_size == 1


@pytest.mark.parametrize("cls", [Producer, Consumer, Admin])
def test_bootstrap_servers_is_taken_as_bootstrap(cls: Any) -> None:
    client = cls(bootstrap_servers=[NOWHERE])
    try:
        assert client._client.bootstrap == [NOWHERE]
    finally:
        client.close()


def test_bootstrap_given_twice_is_refused() -> None:
    with pytest.raises(TypeError, match=r"twice: 'clicks' .*topics go to subscribe\(\)"):
        Consumer("clicks", bootstrap_servers=NOWHERE)  # kafka-python's KafkaConsumer(topic, ...)
    with pytest.raises(TypeError, match="twice"):
        Producer(bootstrap=NOWHERE, bootstrap_servers=NOWHERE)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Producer(NOWHERE, compression_type="gzip"), "strom calls it 'compression'"),
        (
            lambda: Producer(NOWHERE, max_in_flight_requests_per_connection=1),
            "strom calls it 'max_in_flight'",
        ),
        (lambda: aio.Producer(NOWHERE, compression_type="lz4"), "strom calls it 'compression'"),
        (lambda: NewTopic("t", num_partitions=3), "strom calls it 'partitions'"),
        (lambda: NewTopic("t", topic_configs={}), "strom calls it 'config'"),
        (lambda: Producer(NOWHERE, lingerms=5), "did you mean 'linger_ms'"),
        (lambda: Consumer(NOWHERE, group="g"), "did you mean 'group_id'"),
        (lambda: Admin(NOWHERE, request_timeout=5), "did you mean 'request_timeout_ms'"),
        (lambda: Consumer(NOWHERE, key_deserializer=None), r"argument 'key_deserializer'$"),
    ],
)
def test_unknown_keywords_name_strom_s_spelling(make: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        make()


def test_new_topic_still_takes_its_own_names() -> None:
    assert NewTopic("t", partitions=3, config={"retention.ms": "1"}).partitions == 3
