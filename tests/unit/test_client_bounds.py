"""Every numeric setting of the clients has a maximum and a type, checked at construction,
and the method arguments that go on the wire as int32/int64 name themselves when too large.

Found from outside (a fuzzing review of the public API): settings were checked for a
minimum only, so ``Producer(metadata_max_age_ms=2**63)`` killed the sender thread ("timestamp
out of range for platform time_t") and every send hung, ``Admin(request_timeout_ms=2**63)
.list_topics()`` hung for ever, 2**63 elsewhere failed as protobuf's "Value out of range"
7-9 frames deep without the argument's name, and ``Consumer(group_remote_assignor=-1)`` was
taken, killed the heartbeat thread, and ``poll()`` returned nothing for ever. The Admin
raised InvalidRequestError where the Producer and Consumer raise ValueError/TypeError.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import pytest

from strom import Admin, Consumer, Producer, TopicPartition, aio
from strom.errors import InvalidRequestError, StromError

NOWHERE = "127.0.0.1:1"  # nothing is sent: only the settings are looked at
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
LONG_MS_MAX = 2**40  # (strom.argtypes.LONG_MS_MAX)

#: Each client's numeric settings and their largest accepted value: Kafka's int settings and
#: what goes on the wire as int32 up to 2**31-1, its long ms settings up to LONG_MS_MAX
#: (threading's timeouts overflow above), buffer_memory (Kafka's long) up to int64.
PRODUCER_MAXIMA = {
    "linger_ms": LONG_MS_MAX,
    "batch_size": INT32_MAX,
    "buffer_memory": INT64_MAX,
    "retries": INT32_MAX,
    "delivery_timeout_ms": INT32_MAX,
    "request_timeout_ms": INT32_MAX,
    "max_in_flight": INT32_MAX,
    "max_block_ms": LONG_MS_MAX,
    "retry_backoff_ms": LONG_MS_MAX,
    "retry_backoff_max_ms": LONG_MS_MAX,
    "metadata_max_age_ms": LONG_MS_MAX,
    "transaction_timeout_ms": INT32_MAX,
}
CONSUMER_MAXIMA = {
    "auto_commit_interval_ms": INT32_MAX,
    "commit_linger_ms": INT32_MAX,
    "fetch_min_bytes": INT32_MAX,
    "fetch_max_wait_ms": INT32_MAX,
    "fetch_max_bytes": INT32_MAX,
    "max_partition_fetch_bytes": INT32_MAX,
    "max_poll_records": INT32_MAX,
    "max_poll_interval_ms": INT32_MAX,
    "request_timeout_ms": INT32_MAX,
    "default_api_timeout_ms": INT32_MAX,
    "retry_backoff_ms": LONG_MS_MAX,
    "retry_backoff_max_ms": LONG_MS_MAX,
    "consumer_timeout_ms": LONG_MS_MAX,
}
ADMIN_MAXIMA = {"request_timeout_ms": INT32_MAX, "default_api_timeout_ms": INT32_MAX}
#: Numeric keywords with no maximum of their own here: max_request_size has a tighter one
#: (the largest batch a Fetch answer carries); session/heartbeat are refused whatever;
#: acks takes 'all', 1 or 0 only.
NOT_HERE = {"max_request_size", "session_timeout_ms", "heartbeat_interval_ms", "acks"}

CLIENTS = [(Producer, PRODUCER_MAXIMA), (Consumer, CONSUMER_MAXIMA), (Admin, ADMIN_MAXIMA)]


def _cases() -> list[tuple[Any, str, int]]:
    return [(cls, name, top) for cls, maxima in CLIENTS for name, top in maxima.items()]


@pytest.mark.parametrize("cls", [Producer, Consumer, Admin])
def test_every_numeric_setting_has_a_maximum(cls: Any) -> None:
    """The tables above hold every int / float keyword of each constructor, and each refuses
    2**63: a setting added later without a maximum fails here."""
    maxima = dict(CLIENTS)[cls]
    numeric = {
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY and any(t in str(p.annotation) for t in ("int", "float"))
    }
    assert numeric - NOT_HERE == set(maxima)
    for name in sorted(numeric - {"acks"}):
        with pytest.raises(ValueError, match=name):
            cls(NOWHERE, **{name: 2**63})


@pytest.mark.parametrize(("cls", "name", "top"), _cases())
def test_the_maximum_is_taken_and_above_it_or_another_type_refused_naming_the_setting(
    cls: Any, name: str, top: int
) -> None:
    extra: dict[str, Any] = {}
    if cls is Admin and name == "request_timeout_ms":
        extra["default_api_timeout_ms"] = top  # (never below request_timeout_ms)
    if name == "retry_backoff_ms":
        extra["retry_backoff_max_ms"] = top  # (the Consumer's is never below it)
    cls(NOWHERE, **{name: top}, **extra).close()
    for value in (top + 1, 2**63):
        with pytest.raises(ValueError, match=rf"^(INVALID_REQUEST: )?{name} must be .*<= {top}"):
            cls(NOWHERE, **{name: value}, **extra)
    for value in ("5", [], True):
        with pytest.raises(TypeError, match=name):
            cls(NOWHERE, **{name: value})


def test_aio_clients_check_the_same() -> None:
    with pytest.raises(ValueError, match=r"metadata_max_age_ms must be .*<= 1099511627776"):
        aio.Producer(NOWHERE, metadata_max_age_ms=2**63)
    with pytest.raises(ValueError, match=r"fetch_min_bytes must be .*<= 2147483647"):
        aio.Consumer(NOWHERE, fetch_min_bytes=2**63)
    with pytest.raises(ValueError, match=r"request_timeout_ms must be .*<= 2147483647"):
        aio.Admin(NOWHERE, request_timeout_ms=2**63)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Consumer(NOWHERE, group_remote_assignor=-1), TypeError, "group_remote_assignor"),
        (lambda: Consumer(NOWHERE, group_remote_assignor=[]), TypeError, "group_remote_assignor"),
        (lambda: Consumer(NOWHERE, group_remote_assignor=""), ValueError, "group_remote_assignor"),
        (lambda: Consumer(NOWHERE, group_instance_id=5), TypeError, "group_instance_id"),
        (lambda: Consumer(NOWHERE, client_id=5), TypeError, "client_id"),
        (lambda: Producer(NOWHERE, client_id=b"x"), TypeError, "client_id"),
        (lambda: Admin(NOWHERE, client_id=None), TypeError, "client_id"),
        (lambda: Producer(NOWHERE, acks=[]), ValueError, "acks must be"),
        (lambda: Producer(NOWHERE, acks={}), ValueError, "acks must be"),
        (lambda: Producer(NOWHERE, acks=True), ValueError, "acks must be"),
        (lambda: Producer(NOWHERE, compression=0), TypeError, "compression must be a str"),
        (lambda: Producer(NOWHERE, partitioner=5), TypeError, "partitioner must be a callable"),
        (lambda: Producer(NOWHERE, key_serializer="x"), TypeError, "key_serializer"),
        (lambda: Producer(NOWHERE, ssl_cafile=5), TypeError, "ssl_cafile must be a path"),
        (lambda: Consumer(NOWHERE, ssl_certfile=[]), TypeError, "ssl_certfile must be a path"),
        (lambda: Admin(NOWHERE, ssl_keyfile=1.5), TypeError, "ssl_keyfile must be a path"),
        (lambda: Admin(NOWHERE, token=5), TypeError, "token must be a str"),
    ],
)
def test_other_settings_of_the_wrong_type_name_themselves(
    make: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make()


def test_admin_raises_value_and_type_errors_that_are_invalid_request_errors_too() -> None:
    """As the Producer and Consumer (ValueError/TypeError), and still InvalidRequestError,
    which the Admin documented."""
    for value, error in ((0, ValueError), (2**63, ValueError), ("x", TypeError)):
        with pytest.raises(error) as caught:
            Admin(NOWHERE, request_timeout_ms=value)
        assert isinstance(caught.value, InvalidRequestError)
        assert "request_timeout_ms" in str(caught.value)
    with pytest.raises(ValueError, match="must be at least request_timeout_ms"):
        Admin(NOWHERE, request_timeout_ms=10, default_api_timeout_ms=5)


def test_admin_method_arguments_beyond_the_wire_s_range_name_themselves() -> None:
    tp = TopicPartition("t", 0)
    with Admin(NOWHERE) as admin:
        with pytest.raises(ValueError, match=r"t-0: delete_records takes an offset .*int64"):
            admin.delete_records({tp: 2**63})
        with pytest.raises(ValueError, match=r"t-0: offset spec .*int64"):
            admin.list_offsets({tp: 2**63})
        with pytest.raises(ValueError, match=r"partition must be >= 0 and <= 2147483647"):
            admin.delete_records({TopicPartition("t", 2**31): 0})
        with pytest.raises(StromError, match=r"must be >= 1 and <= 2147483647 \(a positive int32"):
            admin.create_partitions("t", 2**31)


def test_consumer_method_arguments_beyond_the_wire_s_range_name_themselves() -> None:
    with Consumer(NOWHERE) as consumer:
        with pytest.raises(ValueError, match=r"partition must be >= 0 and <= 2147483647"):
            consumer.assign([TopicPartition("t", 2**31)])
        with pytest.raises(ValueError, match=r"max_records must be .*<= 2147483647"):
            consumer.poll(max_records=2**31)


def test_a_heartbeat_thread_that_fails_is_raised_by_the_next_poll() -> None:
    """The heartbeat thread's unexpected error (a request it could not build killed it)
    is raised by poll(), which returned nothing for ever before, and the thread lives on."""
    consumer = Consumer(NOWHERE, group_id="g-heartbeat-fails")
    try:
        group = consumer._group

        def broken() -> float:
            raise RuntimeError("cannot build the request")

        group._heartbeat_once = broken  # type: ignore[method-assign]
        consumer.subscribe(["t"])
        deadline = time.monotonic() + 20
        raised: StromError | None = None
        while raised is None and time.monotonic() < deadline:
            try:
                consumer.poll(timeout_ms=200)
            except StromError as exc:
                raised = exc
        assert raised is not None, "poll() never raised the heartbeat thread's failure"
        assert "heartbeat thread failed" in str(raised) and "cannot build" in str(raised)
        assert group._thread is not None and group._thread.is_alive()
    finally:
        consumer.close(autocommit=False, timeout_ms=0)


def test_producer_timeouts_too_long_for_threading_wait_without_limit_or_name_themselves() -> None:
    """``producer.close(2**63)`` and ``future.get(timeout=2**63)`` raised OverflowError
    ("timestamp out of range for platform time_t"); Kafka's clients wait as asked, so such
    a timeout is no limit. A timeout that is no number is a TypeError naming it."""
    producer = Producer(NOWHERE, max_block_ms=0)
    try:
        producer.flush(2**63)  # (nothing queued: returns at once)
        with pytest.raises(TypeError, match="timeout must be a number of seconds"):
            producer.flush("10")
    finally:
        producer.close(2**63)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["produce", "t", "--batch-size", "2147483648"], "--batch-size: must be at most"),
        (["produce", "t", "--linger-ms", "1e300"], "--linger-ms: must be at most"),
        (["produce", "t", "--partition", "2147483648"], "--partition: must be at most"),
        (["consume", "t", "--partition", "2147483648"], "--partition: must be at most"),
        (["consume", "t", "--timeout-ms", str(2**63)], "--timeout-ms: must be at most"),
        (["consume", "t", "--partition", "0", "--offset", str(2**63)], "--offset: must be"),
        (["bench", "produce", "--batch-size", "3GiB"], "--batch-size: must be at most"),
        (["bench", "e2e", "--linger-ms", "1e300"], "--linger-ms: must be at most"),
        (["bench", "tls", "--batch-size", "3GiB"], "--batch-size: must be at most"),
    ],
)
def test_the_cli_flags_that_feed_the_clients_have_their_maxima(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error naming the flag, before any connection (they were taken, and failed
    in the client, or on the wire, naming the keyword or nothing)."""
    from strom.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main([*argv[:1], *argv[1:], "-b", NOWHERE] if argv[0] != "bench" else argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_consumer_metadata_thread_that_fails_is_raised_by_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The consumer's metadata thread (refreshes, overdue Fetches) waited and worked outside
    any ``try``: an unexpected error ended it silently, and partitions that needed a leader
    were never handed out again. poll() raises it now, as a fetch worker's."""
    from strom.client.fetch_overdue import OverdueFetches

    def broken(self: Any, now: float) -> float | None:
        raise RuntimeError("overdue check broke")

    monkeypatch.setattr(OverdueFetches, "_overdue", broken)
    consumer = Consumer(NOWHERE, group_id="g-metadata-fails")
    try:
        consumer.subscribe(["t"])
        deadline = time.monotonic() + 20
        seen: list[str] = []
        while time.monotonic() < deadline and not any("metadata thread" in m for m in seen):
            try:
                consumer.poll(timeout_ms=200)
            except StromError as exc:  # (the group's own errors, against NOWHERE, too)
                seen.append(str(exc))
        assert any("metadata thread failed" in m and "overdue check broke" in m for m in seen)
    finally:
        consumer.close(autocommit=False, timeout_ms=0)


def test_send_offsets_to_transaction_checks_its_offsets_as_commit_does() -> None:
    """Found from outside: ``{tp: 5}`` (which ``Consumer.commit`` takes) raised AttributeError
    ('int' object has no attribute 'offset') from deep inside; a bad value now names the
    call, and a plain int is an offset, as in commit."""
    tp = TopicPartition("t", 0)
    with Producer(NOWHERE, transactional_id="bounds-txn") as producer:
        with pytest.raises(ValueError, match=r"send_offsets_to_transaction offset for .* >= 0"):
            producer.send_offsets_to_transaction({tp: "5"}, "g")
        with pytest.raises(TypeError, match="send_offsets_to_transaction takes offsets"):
            producer.send_offsets_to_transaction([tp], "g")  # type: ignore[arg-type]
    from strom.client.types import OffsetAndMetadata, checked_offsets

    assert checked_offsets({("t", 0): 5}, "x") == {tp: OffsetAndMetadata(5)}


def test_alter_group_offsets_checks_its_offsets_as_commit_does() -> None:
    """The Admin's offsets go through the same check as commit()'s, raised as the Admin's
    errors: 2**63 (and an epoch past int32) failed inside protobuf, naming nothing."""
    from strom.client.types import OffsetAndMetadata
    from strom.errors import InvalidArgumentError, InvalidArgumentTypeError

    tp = TopicPartition("t", 0)
    cases: list[tuple[Any, type[Exception], str]] = [
        ({tp: 2**63}, InvalidArgumentError, r"offset for t-0 must be .*<= 9223372036854775807"),
        ({tp: -1}, InvalidArgumentError, r"offset for t-0 must be >= 0"),
        ({tp: "5"}, InvalidArgumentError, r"offset for t-0 must be an offset >= 0"),
        ({tp: OffsetAndMetadata(5, "", 2**31)}, InvalidArgumentError, r"t-0: leader_epoch"),
        ({tp: OffsetAndMetadata(5, 7)}, InvalidArgumentTypeError, r"t-0: metadata must be"),  # type: ignore[arg-type]
        ({tp: OffsetAndMetadata("5")}, InvalidArgumentTypeError, r"t-0 must be an int"),  # type: ignore[arg-type]
        ({("t", 2**31): 0}, InvalidArgumentError, r"partition must be >= 0 and <= 2147483647"),
        ({("t", "0"): 0}, InvalidArgumentTypeError, r"partition must be an int"),
    ]
    with Admin(NOWHERE) as admin:
        for offsets, error, match in cases:
            with pytest.raises(error, match=match) as caught:
                admin.alter_group_offsets("g", offsets)
            assert isinstance(caught.value, InvalidRequestError), offsets


def test_admin_replica_assignment_partitions_beyond_int32_name_the_topic() -> None:
    from strom import NewTopic
    from strom.errors import InvalidReplicaAssignmentError

    with Admin(NOWHERE) as admin:
        for assignment in ({2**31: [1]}, {0: [2**31]}, {0: [True]}):
            with pytest.raises(InvalidReplicaAssignmentError, match=r"(topic 't'|t-0): "):
                admin.create_topics([NewTopic("t", replica_assignment=assignment)])


def test_commit_and_send_offsets_refuse_an_epoch_or_note_the_wire_cannot_carry() -> None:
    from strom.client.types import OffsetAndMetadata, checked_offsets

    tp = TopicPartition("t", 0)
    with pytest.raises(ValueError, match=r"commit offset for t-0: leader_epoch must be"):
        checked_offsets({tp: OffsetAndMetadata(1, "", 2**31)}, "commit")
    with pytest.raises(TypeError, match=r"commit offset for t-0: metadata must be a str"):
        checked_offsets({tp: OffsetAndMetadata(1, b"x")}, "commit")  # type: ignore[arg-type]


def test_poll_refuses_a_nan_timeout() -> None:
    """Refused with the other bad timeouts, before anything else is looked at (a NaN
    deadline is never reached nor passed)."""
    with Consumer(NOWHERE) as consumer, pytest.raises(TypeError, match="timeout_ms must be a"):
        consumer.poll(timeout_ms=float("nan"))


def test_close_refuses_a_bad_timeout_as_poll_does_and_closes_after() -> None:
    """close() checks its timeout as every other call does (a NaN made its deadline NaN:
    every step then found no time left and was skipped, the leave and commit unsent)."""
    consumer = Consumer(NOWHERE)
    for bad, error in (
        (float("nan"), TypeError),
        ("5", TypeError),
        (True, TypeError),
        (-1, ValueError),
    ):
        with pytest.raises(error, match=r"close\(\): timeout_ms must be"):
            consumer.close(timeout_ms=bad)
        assert not consumer.closed
    consumer.close(timeout_ms=0)
    assert consumer.closed
