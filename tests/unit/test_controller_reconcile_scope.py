"""Which partitions a reconciliation pass reads (strom.controller.reconcile): the changed
topics only, or everything after a change of nodes."""

from __future__ import annotations

import asyncio

from strom.controller.reconcile import MAX_NARROW_TOPICS, Reconciler
from strom.metadata import RESYNC, Keys, WatchEvent, changed_topics


def _reconciler() -> Reconciler:
    r = Reconciler.__new__(Reconciler)
    r._reconcile_wanted = asyncio.Event()
    r._node_gone_at = None
    r._reconcile_topics = set()  # as the loop leaves it after taking a pass's scope
    return r


def test_changed_topics_come_from_topic_and_partition_keys() -> None:
    keys = Keys("c")
    events = [
        WatchEvent(keys.topic("orders"), b"{}", 5),
        WatchEvent(keys.partition("clicks", 3), b"{}", 6),
        WatchEvent(keys.partition("gone", 0), None, 7),  # a deleted state: its topic is read
        WatchEvent(keys.node(1), b"{}", 8),  # not a topic (nodes widen the pass elsewhere)
    ]
    assert changed_topics(keys, events) == {"orders", "clicks", "gone"}
    assert changed_topics(keys, [RESYNC, *events]) is None  # a resync: everything


def test_wake_ups_accumulate_topics_until_one_asks_for_everything() -> None:
    r = _reconciler()
    r._reconcile_wanted_now(None, {"a"})
    r._reconcile_wanted_now(None, {"b"})
    assert r._reconcile_topics == {"a", "b"} and r._reconcile_wanted.is_set()
    r._reconcile_wanted_now(123.0)  # a node left: everything
    assert r._reconcile_topics is None and r._node_gone_at == 123.0
    r._reconcile_wanted_now(None, {"c"})  # still everything
    assert r._reconcile_topics is None


def test_many_changed_topics_read_everything() -> None:
    r = _reconciler()
    r._reconcile_wanted_now(None, {f"t{i}" for i in range(MAX_NARROW_TOPICS)})
    assert r._reconcile_topics is not None
    r._reconcile_wanted_now(None, {"one-more"})
    assert r._reconcile_topics is None
