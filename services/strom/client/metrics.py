"""The clients' ``metrics()`` in an application's own Prometheus registry.

An application that exports its own Prometheus metrics (``prometheus_client``) can include
its producers' and consumers' with one call::

    from strom.client.metrics import register

    producer = Producer(...)
    register(producer)  # prometheus_client.REGISTRY unless registry= is given

Each scrape reads ``metrics()`` of every client registered with that registry (a custom
Collector, so nothing is counted twice and nothing runs between scrapes). Names become
``strom_client_producer_<name>`` / ``strom_client_consumer_<name>`` with ``-`` as ``_``
(``record-send-total`` -> ``strom_client_producer_record_send_total``, a counter; the
others are gauges), labelled ``client_id``. Two things differ from ``metrics()``, so that a
scrape follows Prometheus practice (``promtool check metrics`` passes it without warnings):

- Per-topic and per-partition values have names of their own, ``..._topic_<name>`` and
  ``..._partition_<name>``, labelled ``topic`` (and ``partition``), as Kafka keeps them in
  groups of their own (``producer-topic-metrics``): under the client-wide name, a
  ``sum by (client_id)`` would count every record twice.
- Times are in seconds, named ``..._seconds`` (``request-latency-avg``, ms, is
  ``strom_client_producer_request_latency_avg_seconds``; ``bufferpool-wait-time-ns-total``
  is ``strom_client_producer_bufferpool_wait_time_seconds_total``, and its duplicate under
  Kafka's older name is left out). ``metrics()`` keeps Kafka's names and units.

A value that is NaN (an average with nothing in its window) is left out of the scrape. A
closed client keeps its last values until :func:`unregister`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["ClientCollector", "prometheus_name", "register", "unregister"]


class MeteredClient(Protocol):
    """A strom client: a Producer or a Consumer (or strom.aio's)."""

    client_id: str

    def metrics(self) -> dict[str, float]: ...


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """``"records-lag{topic=t,partition=0}"`` -> ``("records-lag", {"topic": "t", ...})``
    (strom.client.stats.tagged's scheme; topic names hold no ``,`` ``=`` or ``}``)."""
    if not key.endswith("}") or "{" not in key:
        return key, {}
    name, inner = key[:-1].split("{", 1)
    tags = dict(part.split("=", 1) for part in inner.split(",") if "=" in part)
    return name, tags


def _kind(client: Any) -> str:
    """``producer`` or ``consumer``, from the client's class (strom.aio's too)."""
    name = type(getattr(client, "_sync", client)).__name__.lower()
    if "producer" in name:
        return "producer"
    if "consumer" in name:
        return "consumer"
    raise TypeError(f"not a strom Producer or Consumer: {type(client).__name__}")


class ClientCollector(Collector):
    """Reads the registered clients' ``metrics()`` at each scrape (see the module doc)."""

    def __init__(self, clients: Iterable[MeteredClient] = ()) -> None:
        self._lock = threading.Lock()
        self._clients: list[MeteredClient] = []
        for client in clients:
            self.add(client)

    def add(self, client: MeteredClient) -> None:
        """Include ``client`` in the scrapes (a TypeError for anything but a strom client)."""
        _kind(client)
        if not callable(getattr(client, "metrics", None)):
            raise TypeError(f"{type(client).__name__} has no metrics()")
        with self._lock:
            if all(c is not client for c in self._clients):
                self._clients.append(client)

    def remove(self, client: MeteredClient) -> None:
        with self._lock:
            self._clients = [c for c in self._clients if c is not client]

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the names come from the clients at scrape time (and two
        collectors of this kind in one registry would clash; :func:`register` keeps one)."""
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            clients = list(self._clients)
        families: dict[str, Metric] = {}
        for client in clients:
            kind = _kind(client)
            client_id = getattr(client, "_sync", client).client_id
            for key, value in client.metrics().items():
                if math.isnan(value):
                    continue
                name, tags = split_key(key)
                exported = prometheus_name(kind, name, tags)
                if exported is None:
                    continue
                sample, scale = exported
                counter = sample.endswith("_total")
                family_name = sample.removesuffix("_total")
                family = families.get(family_name)
                if family is None:
                    family = families[family_name] = Metric(
                        family_name,
                        f"strom client {kind} metric {name} (docs/client-metrics.md)",
                        "counter" if counter else "gauge",
                    )
                family.add_sample(sample, {"client_id": client_id, **tags}, value * scale)
        yield from families.values()


#: ``metrics()`` names in Kafka's units (ms, ns) -> (the Prometheus name, in seconds; the
#: factor to seconds). Prometheus wants base units, spelt out (promtool warns on ``_ms``).
_IN_SECONDS: dict[str, tuple[str, float]] = {
    **{
        f"{base}-{stat}": (f"{base}_{stat}_seconds".replace("-", "_"), 1e-3)
        for base in (
            "request-latency",
            "record-queue-time",
            "produce-throttle-time",
            "fetch-latency",
            "fetch-throttle-time",
            "commit-latency",
            "rebalance-latency",
            "heartbeat-response-time",
            "time-between-poll",
        )
        for stat in ("avg", "max")
    },
    "bufferpool-wait-time-ns-total": ("bufferpool_wait_time_seconds_total", 1e-9),
}

#: Left out of the scrape: Kafka's older name of a value exported under its newer one.
_DUPLICATES = frozenset({"bufferpool-wait-time-total"})


def prometheus_name(kind: str, name: str, tags: dict[str, str]) -> tuple[str, float] | None:
    """The sample name a ``metrics()`` value is exported under, and the factor that turns its
    value into the exported unit; None for a value not exported (a duplicate). Per-partition
    and per-topic values get a group of their own (``partition_``, ``topic_``), so that a sum
    over one name's series never adds a client's total to its parts."""
    if name in _DUPLICATES:
        return None
    base, scale = _IN_SECONDS.get(name, (name.replace("-", "_"), 1.0))
    group = "partition_" if "partition" in tags else "topic_" if "topic" in tags else ""
    return f"strom_client_{kind}_{group}{base}", scale


_collectors: dict[int, tuple[CollectorRegistry, ClientCollector]] = {}
_collectors_lock = threading.Lock()


def register(client: MeteredClient, registry: CollectorRegistry = REGISTRY) -> ClientCollector:
    """Export ``client``'s ``metrics()`` from ``registry`` (one collector per registry
    holds all the clients registered with it); returns that collector."""
    with _collectors_lock:
        entry = _collectors.get(id(registry))
        if entry is None or entry[0] is not registry:
            collector = ClientCollector()
            registry.register(collector)
            _collectors[id(registry)] = entry = (registry, collector)
    entry[1].add(client)
    return entry[1]


def unregister(client: MeteredClient, registry: CollectorRegistry = REGISTRY) -> None:
    """Stop exporting ``client`` (a closed one keeps its last values until then)."""
    with _collectors_lock:
        entry = _collectors.get(id(registry))
    if entry is not None and entry[0] is registry:
        entry[1].remove(client)
