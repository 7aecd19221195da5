"""strom_storage_records_subscribe_records_total's series of a deleted topic stay deleted.

Found from outside (a soak with topic churn): a Subscribe stream's pump thread keeps polling
for a moment after the stream's handler returned, and counted "polled" records of a topic
after :func:`drop_deleted_topics` had dropped its series: the series came back and stayed.
The pump is driven by hand here (no thread, no cluster): the race is made to happen in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pyarrow as pa
import pytest

from strom.metadata.store import WatchEvent
from strom.storage import subscriptions
from strom.storage.subscriptions import Subscription, SubscriptionSpec, drop_deleted_topics

PREFIX = "/strom/c/topics/"


def polled_series(topic: str) -> bool:
    """Whether the registry exports a "polled" series of ``topic``."""
    for metric in subscriptions.SUBSCRIBE_RECORDS.collect():
        for sample in metric.samples:
            if sample.labels.get("topic") == topic and sample.labels.get("stage") == "polled":
                return True
    return False


def poll_table(topic: str, n: int) -> pa.Table:
    """What Consumer.poll_arrow gives: one partition's records."""
    return pa.table(
        {
            "topic": [topic] * n,
            "partition": [0] * n,
            "offset": list(range(n)),
            "key": [None] * n,
            "value": [b"v"] * n,
        },
        schema=pa.schema(
            [
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("key", pa.binary()),
                ("value", pa.binary()),
            ]
        ),
    )


class FakeView:
    """The node's view as the listener and the subscription ask it: topics by name."""

    def __init__(self, topics: set[str]) -> None:
        self.topics = topics
        self.keys = SimpleNamespace(topics_prefix=PREFIX)

    def topic(self, name: str) -> object | None:
        return object() if name in self.topics else None

    def delete(self, name: str) -> None:
        """As the view does: its state first, then its listeners."""
        self.topics.discard(name)
        drop_deleted_topics(self)([WatchEvent(PREFIX + name, None, 2)])  # type: ignore[arg-type]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def subscription(loop: asyncio.AbstractEventLoop, view: FakeView, topic: str) -> Subscription:
    """A group subscription whose pump is driven by the test (it owns no partition, so the
    records are counted polled and not queued)."""
    sub = Subscription(
        SubscriptionSpec(group_id="g", topics=[topic]),
        ["127.0.0.1:1"],
        loop,
        client_id="test",
        topic_live=lambda t: view.topic(t) is not None,
    )
    sub.consumer = SimpleNamespace(highwater=lambda tp: None)  # type: ignore[assignment]
    return sub


def test_records_polled_after_the_topic_was_deleted_do_not_bring_its_series_back(
    loop: asyncio.AbstractEventLoop,
) -> None:
    topic = "sub-series-deleted"
    view = FakeView({topic})
    sub = subscription(loop, view, topic)
    sub._emit_records(poll_table(topic, 3))
    assert polled_series(topic)

    view.delete(topic)
    assert not polled_series(topic)
    sub._emit_records(poll_table(topic, 2))  # the pump's poll after the delete
    assert not polled_series(topic)
    assert topic not in subscriptions._counted_topics


def test_a_stopped_subscription_counts_nothing(loop: asyncio.AbstractEventLoop) -> None:
    topic = "sub-series-stopped"
    sub = subscription(loop, FakeView({topic}), topic)
    sub.stop()  # the handler returned; the pump's last poll comes after
    sub._emit_records(poll_table(topic, 2))
    assert not polled_series(topic)
