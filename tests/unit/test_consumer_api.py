"""Consumer argument checking and state errors that need no cluster (construction does not
connect: nothing listens on the bootstrap address used here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from strom.client.consumer import (
    Consumer,
    IllegalStateError,
    NoOffsetForPartitionError,
)
from strom.client.types import TopicPartition
from strom.errors import InvalidGroupIdError, StromError

NOWHERE = "127.0.0.1:1"
TP = TopicPartition("t", 0)


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    c = Consumer(NOWHERE)
    yield c
    c.close()


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"auto_offset_reset": "smallest"}, ValueError, "'latest', 'earliest', 'none'"),
        ({"auto_offset_reset": None}, ValueError, "auto_offset_reset"),
        ({"isolation_level": "dirty"}, ValueError, "read_uncommitted"),
        ({"max_poll_records": 0}, ValueError, "max_poll_records must be >= 1"),
        ({"max_poll_records": 1.5}, TypeError, "max_poll_records must be an int"),
        ({"fetch_max_wait_ms": -1}, ValueError, "fetch_max_wait_ms"),
        ({"fetch_max_bytes": 0}, ValueError, "fetch_max_bytes"),
        ({"max_partition_fetch_bytes": 1 << 31}, ValueError, "int32"),
        ({"request_timeout_ms": True}, TypeError, "request_timeout_ms"),
        ({"retry_backoff_ms": 500, "retry_backoff_max_ms": 100}, ValueError, "backoff_max"),
        ({"group_id": ""}, ValueError, "group_id"),
        ({"bootstrap": "no-port"}, ValueError, "HOST:PORT"),
        # Found from outside: accepted, validated and ignored (the coordinator's flags
        # decide); refused like Kafka's KIP-848 consumer refuses them.
        ({"session_timeout_ms": 10_000}, ValueError, "--group-session-timeout-ms"),
        ({"heartbeat_interval_ms": 500}, ValueError, "--group-heartbeat-interval-ms"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, Any], exc: type, match: str) -> None:
    args = {"bootstrap": NOWHERE, **kwargs}
    with pytest.raises(exc, match=match):
        Consumer(**args)


def test_groups_need_a_group_id(consumer: Consumer) -> None:
    for call in (
        lambda: consumer.subscribe(["t"]),
        lambda: consumer.commit(),
        lambda: consumer.commit_async(),
        lambda: consumer.committed(TP),
        lambda: consumer.seek_to_committed(),
    ):
        with pytest.raises(InvalidGroupIdError, match="needs a group_id"):
            call()
    assert consumer.subscription() == set()


def test_a_group_id_plugs_in_the_group_membership() -> None:
    with Consumer(NOWHERE, group_id="g", enable_auto_commit=False) as c:
        assert c._group is not None  # built without any network I/O
        with pytest.raises(ValueError, match="topics or a pattern"):
            c.subscribe()


def test_seek_to_committed_names_partitions_not_assigned() -> None:
    with Consumer(NOWHERE, group_id="g", enable_auto_commit=False) as c:
        with pytest.raises(IllegalStateError, match=r"seek_to_committed\(\): t-0 not assigned"):
            c.seek_to_committed([TP])
        c.seek_to_committed()  # no partitions: nothing to do


def test_state_errors(consumer: Consumer) -> None:
    with pytest.raises(IllegalStateError, match="no partitions"):
        consumer.poll()
    with pytest.raises(IllegalStateError, match="no partitions"):
        consumer.poll_arrow()
    with pytest.raises(IllegalStateError, match="t-0 not assigned"):
        consumer.seek(TP, 3)
    for call in (
        lambda: consumer.seek_to_beginning([TP]),
        lambda: consumer.seek_to_end([TP]),
        lambda: consumer.position(TP),
        lambda: consumer.pause([TP]),
        lambda: consumer.resume([TP]),
        lambda: consumer.highwater(TP),
    ):
        with pytest.raises(IllegalStateError, match="not assigned"):
            call()
    assert consumer.assignment() == set() and consumer.paused() == set()
    consumer.seek_to_end()  # no partitions: nothing to do
    consumer.unsubscribe()


def test_argument_types(consumer: Consumer) -> None:
    with pytest.raises(TypeError, match="TopicPartition"):
        consumer.assign([("t",)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of TopicPartition"):
        consumer.assign(TP)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="partition must be an int"):
        consumer.assign([("t", "0")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="partition must be >= 0"):
        consumer.beginning_offsets([("t", -1)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="timeout_ms"):
        consumer.poll(timeout_ms="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_ms"):
        consumer.poll(timeout_ms=-5)
    with pytest.raises(ValueError, match="max_records"):
        consumer.poll_arrow(max_records=0)
    with pytest.raises(TypeError, match="dict"):
        consumer.offsets_for_times([TP])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        consumer.offsets_for_times({TP: -1})
    with pytest.raises(TypeError, match="int"):
        consumer.offsets_for_times({TP: 1.5})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="topic"):
        consumer.partitions_for_topic("")


def test_close_is_idempotent_and_final() -> None:
    c = Consumer(NOWHERE, client_id="closing")
    assert "closing" in repr(c)
    c.close()
    c.close()
    assert c.closed and "closed" in repr(c)
    for call in (
        lambda: c.poll(),
        lambda: c.poll_arrow(),
        lambda: c.assign([TP]),
        lambda: c.seek(TP, 0),
        lambda: iter(c),
        lambda: c.topics(),
        lambda: c.assignment(),  # found from outside: gave the partitions of before the close
        lambda: c.paused(),  # (the same: an empty set)
    ):
        with pytest.raises(IllegalStateError, match="closed"):
            call()


def test_no_offset_error_is_a_strom_error() -> None:
    assert issubclass(NoOffsetForPartitionError, StromError)
    assert issubclass(IllegalStateError, StromError)


def test_offsets_and_timestamps_beyond_int64_are_refused_naming_the_argument() -> None:
    """Found from outside: seek(tp, 2**63) was accepted and the next poll raised a bare
    ValueError from protobuf; commit and offsets_for_times the same. (seek: the integration
    test of bad arguments, it needs an assigned partition.)"""
    with Consumer(NOWHERE, group_id="g") as c:
        with pytest.raises(ValueError, match=r"commit offset for .* int64"):
            c.commit({TP: 2**63})
        with pytest.raises(ValueError, match=r"timestamp for .* int64"):
            c.offsets_for_times({TP: 2**63})
