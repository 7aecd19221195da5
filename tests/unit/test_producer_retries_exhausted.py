"""A batch whose retries ran out fails with the leader's error, as in Kafka; one past
delivery_timeout_ms fails with a timeout naming that error.

Found from outside: ``Producer(retries=0)`` sending to a partition under min.insync.replicas
raised ``RequestTimedOutError: not acknowledged within delivery_timeout_ms=5000 (last error:
NOT_ENOUGH_REPLICAS ...)`` at the first answer, where Kafka raises NotEnoughReplicasException.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pytest

from strom import Producer
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.futures import FutureRecordMetadata
from strom.client.sender import RETRY_LOG_INTERVAL_S, RETRY_QUIET_S
from strom.errors import NotEnoughReplicasError, RequestTimedOutError

NOWHERE = "127.0.0.1:1"  # nothing is sent: the leader's answer is handed to the producer


def _answered_not_enough_replicas(retries: int, age_s: float) -> FutureRecordMetadata:
    """One batch, ``age_s`` old, that the leader refused with NOT_ENOUGH_REPLICAS."""
    p = Producer(NOWHERE, retries=retries, delivery_timeout_ms=5000)
    try:
        pq = PartitionQueue("t", 0)
        batch = ProducerBatch("t", 0, pa.table({"value": pa.array([b"v"], pa.binary())}))
        pq.add_closed(batch)
        batch.created = time.monotonic() - age_s
        batch.sent = True
        pq.in_flight = 1
        err = NotEnoughReplicasError("t-0: ISR [1] below min.insync.replicas=2")
        p._retry(pq, [batch], err, time.monotonic())
        return FutureRecordMetadata(batch.result, 0)
    finally:
        p.close(timeout=1)


def test_retries_run_out_fails_with_the_leaders_error() -> None:
    future = _answered_not_enough_replicas(retries=0, age_s=0)
    with pytest.raises(NotEnoughReplicasError, match=r"min\.insync\.replicas"):
        future.result(timeout=1)


def test_past_the_delivery_timeout_fails_with_a_timeout_naming_the_last_error() -> None:
    future = _answered_not_enough_replicas(retries=5, age_s=10)
    with pytest.raises(RequestTimedOutError, match=r"last error: .*min\.insync\.replicas"):
        future.result(timeout=1)


def test_an_expired_batch_says_the_time_counts_from_its_creation() -> None:
    """Found from outside: records appended 0.1 s before their batch expired failed with
    "not written within delivery_timeout_ms=20000". Expiry counts from the batch's creation
    (as Kafka's), and the error now says so in Kafka's words."""
    p = Producer(NOWHERE, delivery_timeout_ms=5000)
    try:
        pq = PartitionQueue("t", 0)
        batch = ProducerBatch("t", 0, pa.table({"value": pa.array([b"a", b"b"], pa.binary())}))
        pq.add_closed(batch)
        batch.created = time.monotonic() - 6
        p._queues[("t", 0)] = pq
        p._expire(time.monotonic())
        future = FutureRecordMetadata(batch.result, 1)  # the record appended last
        with pytest.raises(RequestTimedOutError) as raised:
            future.result(timeout=1)
    finally:
        p.close(timeout=1)
    message = raised.value.message
    assert "expiring 2 record(s)" in message and "not written" in message
    assert "ms has passed since batch creation (delivery_timeout_ms=5000)" in message
    assert "within delivery_timeout_ms" not in message


def test_retries_are_logged_as_warnings_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found from outside: a producer retrying NOT_ENOUGH_REPLICAS for its whole 45 s
    delivery timeout logged nothing before its final error. Each retried partition now logs a
    WARNING (Kafka logs every retry), at most one per RETRY_LOG_INTERVAL_S, counting those
    it did not log."""
    p = Producer(NOWHERE, retries=1000, delivery_timeout_ms=60_000)
    caplog.set_level(logging.WARNING, logger="strom.client.producer")
    try:
        pq = PartitionQueue("t", 3)
        batch = ProducerBatch("t", 3, pa.table({"value": pa.array([b"a", b"b"], pa.binary())}))
        pq.add_closed(batch)
        err = NotEnoughReplicasError("t-3: ISR [1] below min.insync.replicas=2")
        now = time.monotonic()
        batch.created = now
        batch.sent = True
        pq.in_flight = 1
        p._retry(pq, [batch], err, now + 0.5)  # younger than RETRY_QUIET_S: DEBUG only
        batch.created = now - RETRY_QUIET_S
        for i in range(5):  # five retries within one interval: one line
            batch.sent = True
            pq.in_flight = 1
            p._retry(pq, [batch], err, now + i)
        batch.sent = True
        pq.in_flight = 1
        p._retry(pq, [batch], err, now + RETRY_LOG_INTERVAL_S + 0.5)
    finally:
        p.close(timeout=1)
    lines = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("t-3: retrying 2 record(s) (retry 2, ")
    assert "min.insync.replicas=2" in lines[0]
    assert "4 more retries since the last line" in lines[1]
    assert all(r.levelno == logging.WARNING for r in caplog.records if "retrying" in r.message)
