"""Python's cyclic garbage collector in a long-running service: measure its pauses, and keep
the objects a started service holds for its whole life out of them.

Why: CPython's full (generation 2) collection walks every tracked object the process has.
A started storage node holds some 60,000-100,000 of them for good (modules, protobuf
descriptors and messages, gRPC and etcd clients, partition state), and walking them took
16-22 ms on the 2-core test machine, during which the event loop answers nothing: every
record produced or fetched at that moment waits. Such collections come every few seconds
under load, so they set the tail of end-to-end latency. :func:`freeze_started_heap`, run
once a service has started, moves what exists then into the permanent generation
(``gc.freeze``): later full collections walk only what was made since. Nothing is leaked:
frozen objects are still freed by reference counting; only cycles among them are not
collected, and a started service's long-lived state is not garbage.

``strom_service_gc_pause_seconds{service, generation}`` shows each collection's pause (a JVM
service's GC pause metric, for the same reason), so an operator sees whether a latency spike
was a collection; ``strom_service_gc_frozen_objects`` how much the freeze took out of them.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Gauge, Histogram

from strom.service import metrics

GC_PAUSE = Histogram(
    "strom_service_gc_pause_seconds",
    "How long each garbage collection of the process stopped it, by generation (2 = full); "
    "the event loop answers nothing meanwhile",
    ["service", "generation"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

GC_FROZEN = Gauge(
    "strom_service_gc_frozen_objects",
    "Objects of the started service moved out of garbage collection (gc.freeze): what full "
    "collections no longer walk",
    ["service"],
)

_started: list[float] = []
_installed = False


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.perf_counter())
    elif _started:
        pause = time.perf_counter() - _started.pop()
        GC_PAUSE.labels(metrics.SERVICE, str(info.get("generation", -1))).observe(pause)


def observe_gc_pauses() -> None:
    """Time every collection of this process into ``strom_service_gc_pause_seconds``
    (idempotent)."""
    global _installed
    if not _installed:
        gc.callbacks.append(_on_gc)
        _installed = True


def freeze_started_heap() -> int:
    """Collect once, then move every object that exists into the permanent generation, so
    later full collections do not walk a started service's long-lived state. Returns how
    many objects were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    GC_FROZEN.labels(metrics.SERVICE).set(frozen)
    return frozen
