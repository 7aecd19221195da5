"""A storage node's readiness (strom.storage.readiness): ready only when it is in the ISR of
every partition it replicates that has a live leader to catch up from; kept from the cluster
view's events, one partition per event, all of them when a node comes or goes."""

from __future__ import annotations

import asyncio
import random

from strom.api import metadata_pb2 as md
from strom.metadata import ClusterView, Keys, WatchEvent, encode
from strom.storage.readiness import InSyncReadiness, lags

ME = 2


class _FakeStore:
    def __init__(self) -> None:
        self.keys = Keys("unit")


def _setup() -> tuple[ClusterView, InSyncReadiness]:
    view = ClusterView(_FakeStore())  # type: ignore[arg-type]
    ready = InSyncReadiness(ME, view)
    view.add_listener(ready.on_view_events)
    return view, ready


def _put(view: ClusterView, key: str, msg: object) -> None:
    rev = view.revision + 1
    view._on_events([WatchEvent(key, encode(msg).encode(), rev)], rev)  # type: ignore[arg-type]


def _delete(view: ClusterView, key: str) -> None:
    rev = view.revision + 1
    view._on_events([WatchEvent(key, None, rev)], rev)


def _state(leader: int, isr: list[int], **kw: list[int]) -> md.PartitionState:
    return md.PartitionState(replicas=[0, 1, 2], leader=leader, isr=isr, **kw)


def test_what_holds_readiness_back() -> None:
    live = {0, 1, 2}
    assert lags(ME, _state(0, [0, 1]), live)
    assert not lags(ME, _state(0, [0, 1, 2]), live)
    assert not lags(ME, _state(2, [2]), live)  # leading: in its own ISR
    assert not lags(ME, _state(-1, [0]), live)  # offline: nothing to catch up from
    assert not lags(ME, _state(0, [0, 1]), {1, 2})  # the leader is not registered
    assert not lags(ME, _state(0, [0, 1], adding_replicas=[2]), live)  # a reassignment's copy
    assert not lags(ME, _state(0, [0, 1], removing_replicas=[2]), live)
    other = md.PartitionState(replicas=[0, 1], leader=0, isr=[0])
    assert not lags(ME, other, live)  # not a replica here


def test_readiness_follows_the_isr_and_the_leaders_registration() -> None:
    view, ready = _setup()
    k = view.keys
    for n in (0, 1, ME):
        _put(view, k.node(n), md.NodeRegistration(node_id=n))
    assert ready.ready()
    _put(view, k.partition("t", 0), _state(0, [0, 1]))
    _put(view, k.partition("t", 1), _state(1, [1, 0]))
    assert not ready.ready() and ready.lagging == {("t", 0), ("t", 1)}
    _put(view, k.partition("t", 0), _state(0, [0, 1, 2]))
    assert ready.lagging == {("t", 1)}
    _delete(view, k.node(1))  # t/1's leader gone: the controller will move it, not us
    assert ready.ready()
    _put(view, k.node(1), md.NodeRegistration(node_id=1))
    assert not ready.ready()
    _delete(view, k.partition("t", 1))  # the topic deleted
    assert ready.ready()


def test_a_node_missing_from_etcd_is_not_ready() -> None:
    """Found from outside: a node whose registration was gone for good (its lease lost)
    answered ready while every partition it led was offline."""
    view, ready = _setup()
    k = view.keys
    for n in (0, 1, ME):
        _put(view, k.node(n), md.NodeRegistration(node_id=n))
    _put(view, k.partition("t", 0), _state(ME, [ME]))  # leading: in its own ISR
    assert ready.ready()
    _delete(view, k.node(ME))
    assert not ready.ready() and ready.why_not() == "not registered in etcd"
    _put(view, k.node(ME), md.NodeRegistration(node_id=ME))
    assert ready.ready()


def test_the_kept_set_equals_a_full_recount_after_random_changes() -> None:
    view, ready = _setup()
    k = view.keys
    rng = random.Random(7)
    for n in (0, 1, ME):
        _put(view, k.node(n), md.NodeRegistration(node_id=n))
    for _ in range(500):
        roll = rng.random()
        if roll < 0.1:
            n = rng.choice([0, 1])
            if n in view.nodes:
                _delete(view, k.node(n))
            else:
                _put(view, k.node(n), md.NodeRegistration(node_id=n))
        elif roll < 0.2:
            _delete(view, k.partition("t", rng.randrange(8)))
        else:
            isr = sorted(rng.sample([0, 1, 2], rng.randint(1, 3)))
            leader = rng.choice([*isr, -1])
            _put(view, k.partition("t", rng.randrange(8)), _state(leader, isr))
        live = set(view.nodes)
        full = {tp for tp, v in view.partitions.items() if lags(ME, v.value, live)}
        assert ready.lagging == full


def test_run_reports_each_change_and_ends_when_stopped() -> None:
    view, ready = _setup()
    k = view.keys
    for n in (0, ME):
        _put(view, k.node(n), md.NodeRegistration(node_id=n))
    seen: list[bool] = []

    async def main() -> None:
        stop = asyncio.Event()
        reported = asyncio.Event()

        async def report(ok: bool) -> None:
            seen.append(ok)
            reported.set()

        task = asyncio.create_task(ready.run(report, stop))
        for state, want in ((_state(0, [0, 1]), False), (_state(0, [0, 1, 2]), True)):
            await reported.wait()
            reported.clear()
            # The view's watch runs on a thread of its own.
            await asyncio.to_thread(_put, view, k.partition("t", 0), state)
            await asyncio.wait_for(reported.wait(), 5)
            assert seen[-1] is want
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert seen == [True, False, True]
