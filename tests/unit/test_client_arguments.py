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
        (lambda: Consumer(NOWHERE, value_serializer=None), "did you mean 'value_deserializer'"),
        (lambda: Consumer(NOWHERE, interceptor_classes=[]), r"argument 'interceptor_classes'$"),
    ],
)
def test_unknown_keywords_name_strom_s_spelling(make: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        make()


def test_new_topic_still_takes_its_own_names() -> None:
    assert NewTopic("t", partitions=3, config={"retention.ms": "1"}).partitions == 3


@pytest.mark.parametrize(
    ("make", "read", "expected"),
    [
        (
            lambda **kw: Consumer(NOWHERE, group_id="g", **kw),
            lambda c: c.config["enable_auto_commit"],
            "enable_auto_commit",
        ),
        (lambda **kw: Consumer(NOWHERE, **kw), lambda c: c.config["check_crcs"], "check_crcs"),
        (lambda **kw: Producer(NOWHERE, **kw), lambda p: p.idempotent, "enable_idempotence"),
        (
            lambda **kw: aio.Consumer(NOWHERE, group_id="g", **kw)._sync,
            lambda c: c.config["enable_auto_commit"],
            "enable_auto_commit",
        ),
    ],
)
def test_boolean_settings_take_bools_and_kafka_s_strings_only(
    make: Any, read: Any, expected: str
) -> None:
    """``bool("false")`` is True: ``enable_auto_commit="false"`` turned auto-commit on (found
    from outside; so did ``enable_idempotence`` and ``check_crcs``). Settings read from the
    environment or a file arrive as strings: "true"/"false" in any case are taken, as by
    Kafka's config parser, anything else is refused naming the setting."""
    for given, value in ((False, False), ("false", False), ("FALSE", False), ("True", True)):
        client = make(**{expected: given})
        try:
            assert read(client) is value, given
        finally:
            client.close()
    with pytest.raises(ValueError, match=f"{expected} must be true or false, got 'no'"):
        make(**{expected: "no"})
    with pytest.raises(TypeError, match=f"{expected} must be a bool .*got int"):
        make(**{expected: 1})


def test_boolean_arguments_of_calls_are_strict() -> None:
    consumer = Consumer(NOWHERE)
    with pytest.raises(ValueError, match="autocommit must be true or false"):
        consumer.close(autocommit="off")
    consumer.close(autocommit="false")
    with Admin(NOWHERE) as admin, pytest.raises(TypeError, match="internal must be a bool"):
        admin.list_topics(internal=None)
