"""The service runtime's garbage-collector handling (strom.service.gc_pauses)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from strom.service import gc_pauses, metrics


def _count(generation: str) -> float:
    child = gc_pauses.GC_PAUSE.labels(metrics.SERVICE, generation)
    return sum(s.value for m in child.collect() for s in m.samples if s.name.endswith("_count"))


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # other tests of this process expect a normal collector


def test_every_collection_is_timed_by_generation() -> None:
    gc_pauses.observe_gc_pauses()
    gc_pauses.observe_gc_pauses()  # idempotent: one callback, one observation per collection
    assert gc.callbacks.count(gc_pauses._on_gc) == 1
    # No automatic collection in between (another thread of this test process allocating
    # set one off once in CI, and it was counted too): only the two asked for.
    gc.disable()
    try:
        before = {g: _count(g) for g in ("0", "2")}
        gc.collect(0)
        gc.collect()
        after = {g: _count(g) for g in ("0", "2")}
    finally:
        gc.enable()
    assert after["0"] == before["0"] + 1
    assert after["2"] == before["2"] + 1


def test_freezing_takes_the_started_heap_out_of_full_collections(unfrozen: None) -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    gc.unfreeze()
    kept = [Cycle() for _ in range(10_000)]  # long-lived state of a "started service"
    frozen = gc_pauses.freeze_started_heap()
    assert frozen >= 10_000
    # Never more than were frozen; fewer only when another thread of this test process
    # freed a frozen object since (that happened once in CI: one fewer).
    assert frozen - 1_000 <= gc.get_freeze_count() <= frozen
    # What a full collection walks now excludes the frozen objects ...
    walked = {id(o) for o in gc.get_objects()}
    assert not any(id(c) in walked for c in kept)
    assert len(walked) < frozen
    # ... and garbage made after the freeze is still collected.
    for _ in range(100):
        Cycle()
    assert gc.collect() >= 100
    assert all(c.me is c for c in kept)  # the frozen state itself is untouched
    sample = gc_pauses.GC_FROZEN.labels(metrics.SERVICE)._value.get()
    assert sample == frozen
