"""A storage node's re-registration after its lease is lost (strom.storage.node): it goes on
until the registration it holds is live and no loss of it came meanwhile, and a watchdog
re-registers when the node's own key stays missing from its view. The registration is a fake
(the real one against etcd: tests/integration/test_node_registration.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from strom.storage import node as node_module
from strom.storage.node import StorageNode


class _FakeRegistration:
    """Registers at once; ``lose_during`` calls make the new lease's keepalive report it lost
    before reregister returns (what a busy event loop makes of a loss that comes a little
    after the worker thread registered)."""

    def __init__(self, lose_during: int = 0) -> None:
        self.calls = 0
        self.lose_during = lose_during

    def reregister(self, on_lost: Callable[[], None]) -> None:
        self.calls += 1
        if self.calls <= self.lose_during:
            on_lost()

    def live(self) -> bool:
        return True


class _FakeConfig:
    node_id = 1


class _FakeView:
    def __init__(self) -> None:
        self.nodes: dict[int, Any] = {}


def _node(registration: _FakeRegistration) -> StorageNode:
    """A StorageNode with only what lease loss touches (no etcd, no data dir)."""
    node = object.__new__(StorageNode)
    node._loop = asyncio.get_running_loop()
    node._stopping = asyncio.Event()
    node._reregister = None
    node._lost_again = False
    node.registration = registration  # type: ignore[assignment]
    node.config = _FakeConfig()  # type: ignore[assignment]
    node.view = _FakeView()  # type: ignore[assignment]
    return node


async def _settled(node: StorageNode) -> None:
    """Until the re-registration has ended and no other was started meanwhile (a loss hops
    to the loop with call_soon_threadsafe, so it is handled before the task resumes)."""
    while node._reregister is None:
        await asyncio.sleep(0)
    while True:
        task = node._reregister
        await task
        await asyncio.sleep(0)
        if node._reregister is task:
            return


def test_a_lease_lost_during_the_re_registration_is_registered_again() -> None:
    """Found from outside at 2,000 partitions: the loss of the new lease while the
    re-registration task had not finished was dropped (the task still ran), and the node
    stayed unregistered for good. One re-registration per loss."""

    async def main() -> None:
        reg = _FakeRegistration(lose_during=2)
        node = _node(reg)
        node._on_lease_lost()
        await asyncio.wait_for(_settled(node), 10)
        assert reg.calls == 3

    asyncio.run(main())


def test_a_registration_that_is_not_live_is_made_again() -> None:
    """A re-registration whose keepalive has not reached etcd for longer than the TTL is not
    done: the loop tries again until the registration it holds is live."""

    class _Stale(_FakeRegistration):
        def live(self) -> bool:
            return self.calls >= 2

    async def main() -> None:
        reg = _Stale()
        node = _node(reg)
        node._on_lease_lost()
        await asyncio.wait_for(_settled(node), 10)
        assert reg.calls == 2

    asyncio.run(main())


def test_the_watchdog_re_registers_a_node_missing_from_its_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever left the node unregistered, its key missing from its own view for
    REGISTRATION_WATCHDOG_S (0 here: two ticks) makes it re-register; present, nothing."""
    monkeypatch.setattr(node_module, "REGISTRATION_WATCHDOG_S", 0.0)
    node: Any = None

    class _BackInView(_FakeRegistration):
        def reregister(self, on_lost: Callable[[], None]) -> None:
            super().reregister(on_lost)
            node.view.nodes[1] = object()  # the watch brings the new key

    async def main() -> None:
        nonlocal node
        reg = _BackInView()
        node = _node(reg)
        node.view.nodes[1] = object()
        ticks = 0

        async def tick(seconds: float) -> bool:  # the watchdog's 1 s sleeps, at once
            nonlocal ticks
            ticks += 1
            await asyncio.sleep(0)
            return node._stopping.is_set()

        node._sleep = tick  # type: ignore[method-assign]
        watchdog = asyncio.create_task(node._registration_watchdog())
        while ticks < 10:
            await asyncio.sleep(0)
        assert reg.calls == 0
        del node.view.nodes[1]
        await asyncio.wait_for(_settled_after(node, lambda: reg.calls > 0), 10)
        ticks = 0
        while ticks < 10:  # back in the view: no more re-registrations
            await asyncio.sleep(0)
        node._stopping.set()
        await asyncio.wait_for(watchdog, 5)
        assert reg.calls == 1

    asyncio.run(main())


async def _settled_after(node: StorageNode, cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0)
    await _settled(node)
