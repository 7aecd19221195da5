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
others are gauges), labelled ``client_id`` and, for the per-topic and per-partition values,
``topic`` and ``partition``. A value that is NaN (an average with nothing in its window) is
left out of the scrape. A closed client keeps its last values until :func:`unregister`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["ClientCollector", "register", "unregister"]


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
                sample = f"strom_client_{kind}_{name.replace('-', '_')}"
                counter = sample.endswith("_total")
                family_name = sample.removesuffix("_total")
                family = families.get(family_name)
                if family is None:
                    family = families[family_name] = Metric(
                        family_name,
                        f"strom client {kind} metric {name} (docs/client-metrics.md)",
                        "counter" if counter else "gauge",
                    )
                family.add_sample(sample, {"client_id": client_id, **tags}, value)
        yield from families.values()


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
