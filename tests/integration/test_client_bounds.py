"""Clients built with the largest settings they accept still work against a real cluster,
and one past the largest is refused at construction, naming the setting.

Found from outside (a fuzzing review): settings had no maximum, so 2**63 was taken and then
killed the producer's sender thread (every send hung: ``metadata_max_age_ms``), made sends
never complete (``request_timeout_ms``), hung ``Admin.list_topics()`` for ever, or failed in
protobuf 7-9 frames deep without the argument's name. The maxima (strom.argtypes,
strom.client.kwnames) must not be so large that the clients fail again at them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from strom.client.admin import Admin
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.errors import InvalidTransactionTimeoutError
from tests.unit.test_client_bounds import (
    CONSUMER_MAXIMA,
    INT32_MAX,
    INT64_MAX,
    LONG_MS_MAX,
    PRODUCER_MAXIMA,
)

pytestmark = pytest.mark.integration

#: Every numeric Producer setting at its largest (the unit tests' table) but the transaction
#: timeout, which the coordinator bounds lower (max_request_size has its own, lower bound).
PRODUCER_LARGEST = {k: v for k, v in PRODUCER_MAXIMA.items() if k != "transaction_timeout_ms"}
#: Every numeric Consumer setting at its largest but fetch_min_bytes (2**31-1 bytes would
#: be waited for as long as fetch_max_wait_ms allows: that is what it means).
CONSUMER_LARGEST = {k: v for k, v in CONSUMER_MAXIMA.items() if k != "fetch_min_bytes"}


def _poll_until(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += [r.value for r in consumer.poll(timeout_ms=500)]
    return got


def test_clients_with_their_largest_settings_work_and_one_more_is_refused(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    cluster = one_node_cluster
    topic = new_topic(cluster)
    tp = TopicPartition(topic, 0)
    values = [b"a", b"b", b"c"]

    with Producer(cluster.bootstrap, **PRODUCER_LARGEST) as producer:
        futures = [producer.send(topic, v, partition=0) for v in values]
        producer.flush()
        assert [f.get(timeout=30).offset for f in futures] == [0, 1, 2]

    # A group member (heartbeats, rebalance timeout = max_poll_interval_ms on the wire).
    with Consumer(
        cluster.bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        **CONSUMER_LARGEST,
    ) as consumer:
        consumer.subscribe([topic])
        assert _poll_until(consumer, 3) == values
        consumer.commit()
        assert consumer.committed(tp).offset == 3

    # fetch_min_bytes at its largest: each fetch waits out fetch_max_wait_ms, then answers.
    with Consumer(
        cluster.bootstrap,
        auto_offset_reset="earliest",
        fetch_min_bytes=INT32_MAX,
        fetch_max_wait_ms=100,
    ) as consumer:
        consumer.assign([tp])
        assert _poll_until(consumer, 3) == values

    with Admin(
        cluster.bootstrap, request_timeout_ms=INT32_MAX, default_api_timeout_ms=INT32_MAX
    ) as admin:
        assert topic in admin.list_topics()
        assert admin.list_offsets({tp: INT64_MAX}) == {tp: None}  # (no record that late)
        assert admin.delete_records({tp: 1}) == {tp: 1}

    # The coordinator's own maximum (15 min by default) refuses the largest transaction
    # timeout the client takes: a clear error of its own, not protobuf's.
    with (
        Producer(
            cluster.bootstrap, transactional_id=f"t-{topic}", transaction_timeout_ms=INT32_MAX
        ) as txn,
        pytest.raises(InvalidTransactionTimeoutError),
    ):
        txn.init_transactions()

    # One past the largest: refused at once, naming the setting (it was taken, then hung).
    with pytest.raises(ValueError, match="metadata_max_age_ms must be"):
        Producer(cluster.bootstrap, metadata_max_age_ms=LONG_MS_MAX + 1)
    with pytest.raises(ValueError, match="request_timeout_ms must be"):
        Admin(cluster.bootstrap, request_timeout_ms=INT32_MAX + 1)
    with pytest.raises(ValueError, match="fetch_min_bytes must be"):
        Consumer(cluster.bootstrap, fetch_min_bytes=INT32_MAX + 1)


def test_a_poll_with_a_timeout_too_long_for_threading_waits_until_woken(
    one_node_cluster: LocalCluster, new_topic
) -> None:
    """``poll(timeout_ms=2**63)`` raised OverflowError ("timestamp out of range for platform
    time_t") at once; Kafka's poll waits as long as asked. It waits now, and close() from
    another thread ends it (with nothing)."""
    topic = new_topic(one_node_cluster)
    consumer = Consumer(one_node_cluster.bootstrap, auto_offset_reset="latest")
    consumer.assign([TopicPartition(topic, 0)])
    assert consumer.position(TopicPartition(topic, 0)) == 0  # (the poll waits for data)
    outcome: dict[str, Any] = {}

    def poll() -> None:
        try:
            outcome["records"] = consumer.poll(timeout_ms=2**63)
        except BaseException as exc:  # (reported by the asserts below)
            outcome["error"] = exc

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    thread.join(1.0)  # (it must still be waiting: the old code raised at once)
    assert thread.is_alive(), outcome
    consumer.close(autocommit=False)
    thread.join(30)
    assert outcome == {"records": []}
