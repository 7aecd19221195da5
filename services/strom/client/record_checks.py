"""What ``send()`` and ``send_batch()`` both check of a caller's records: the headers, a custom
partitioner's answer, a record's size, the topic name and a timestamp. Each bad input fails
at the call, naming what was wrong, before anything is queued (a batch that fails later, on
the sender thread, would say less and take its neighbours with it).

A module of its own because both the Producer (:mod:`strom.client.producer`) and its bulk
path (:mod:`strom.client.bulk`) call these, and the bulk path is imported by the Producer.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from strom.errors import InvalidRequestError, MessageTooLargeError

#: A custom partitioner: ``partitioner(key_bytes, partition_count)`` -> a partition number.
Partitioner = Callable[[bytes | None, int], int]


def record_headers(headers: Any) -> list[tuple[str, bytes | None]]:
    """A record's headers as DESIGN §1 has them, (str, bytes | None) pairs, from a list of
    pairs or a mapping (confluent-kafka takes both). A bytes key is decoded as UTF-8, as a
    Kafka user who writes ``b"trace-id"`` means; any other type is refused naming the
    header."""
    if isinstance(headers, Mapping):
        headers = headers.items()
    elif isinstance(headers, str | bytes) or not isinstance(headers, Iterable):
        raise TypeError(f"headers must be a list of (key, value) pairs, got {headers!r}")
    out = []
    for item in headers:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise TypeError(f"headers must be (key, value) pairs, got {item!r}")
        key, value = item
        out.append((_header_key(key), _header_value(key, value)))
    return out


def _header_key(key: Any) -> str:
    if type(key) is str:
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        try:
            return bytes(key).decode()
        except UnicodeDecodeError:
            raise ValueError(f"header key {bytes(key)!r} is not UTF-8: keys are text") from None
    if isinstance(key, str):
        return str(key)  # a str subclass
    raise TypeError(f"header key {key!r} must be a str (or UTF-8 bytes), got {type(key).__name__}")


def _header_value(key: Any, value: Any) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"header {key!r}: value must be bytes, str or None, got {type(value).__name__}")


def checked_pick(partitioner: Partitioner, pick: object, topic: str, n: int) -> int:
    """A custom partitioner's answer as a partition number, or a clear error at ``send``.

    Kafka's Java client refuses a partitioner's answer outside the topic's partitions at
    once too ("Invalid partition given with record"): a partition that never comes would
    wait out delivery_timeout_ms, and None would break the sender thread. An
    integer of another type (numpy's: ``operator.index``) is taken; bool is not."""
    name = getattr(partitioner, "__qualname__", None) or repr(partitioner)
    where = f"for topic {topic!r}, which has partitions [0, {n})"
    try:
        if isinstance(pick, bool):
            raise TypeError
        value = operator.index(pick)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"partitioner {name} returned {pick!r} {where}: a partitioner is called as "
            "partitioner(key_bytes, partition_count) and must return an int in that range"
        ) from None
    if not 0 <= value < n:
        raise ValueError(
            f"partitioner {name} returned partition {value} {where}: it must return an int "
            "in that range"
        )
    return value


def record_too_large(size: int, max_request_size: int, buffer_memory: int) -> MessageTooLargeError:
    """What ``send()`` (and ``send_batch()``, per row) raises for a record it never sends:
    over max_request_size, or over buffer_memory, which could never hold it (Kafka refuses
    it at once, its RecordTooLargeException)."""
    if size > max_request_size:
        return MessageTooLargeError(
            f"the record is {size} bytes, more than max_request_size={max_request_size}"
        )
    return MessageTooLargeError(
        f"the record is {size} bytes, more than buffer_memory={buffer_memory} (the producer's "
        "whole buffer could never hold it)"
    )


#: Timestamps are kept as float ms until encoded: exact below 2**53.
_MAX_TIMESTAMP_MS = 2**53


def _check_topic(topic: Any) -> None:
    """A caller's topic name, or a clear error (checked before a failure can be counted
    under it)."""
    if not topic or not isinstance(topic, str):
        raise InvalidRequestError(f"topic must be a non-empty string, got {topic!r}")


def _check_timestamp(ts: Any) -> int:
    """A caller's ``timestamp_ms`` as an int, or a clear error (not a failed batch later)."""
    if type(ts) is not int:
        try:
            if isinstance(ts, bool):
                raise TypeError
            ts = operator.index(ts)  # numpy and other integer types
        except TypeError:
            raise InvalidRequestError(
                f"timestamp_ms must be an int (ms since the epoch), got {ts!r}"
            ) from None
    if not 0 <= ts < _MAX_TIMESTAMP_MS:
        raise InvalidRequestError(
            "timestamp_ms must be ms since the epoch, 0 to 2**53 - 1 (send() keeps it as a "
            f"float until encoded; send_batch() takes any int64), got {ts}"
        )
    return ts
