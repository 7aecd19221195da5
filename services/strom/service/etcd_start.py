"""The etcd half of a controller's and a coordinator's start: reach etcd, then follow the
cluster's keys.

Both services start the same way (a store checked against etcd within the start timeout, a
:class:`~strom.metadata.ClusterView` with the service's listener and the dynamic log levels,
its snapshot taken), and each had its own copy of these steps; the storage node reaches etcd
through its own retrying start (:mod:`strom.storage.node`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from strom.metadata import ClusterView, MetadataStore, MetadataUnavailableError
from strom.service import log_levels


async def reach_etcd(
    etcd: str, cluster: str, connect_timeout_s: float, error: type[Exception]
) -> MetadataStore:
    """A store of ``cluster`` at ``etcd`` that answered within ``connect_timeout_s``.

    Raises ``error`` (the service's start-up error, which its CLI prints as one line) for a
    bad endpoint or an etcd that did not answer in time; the store is closed then, so a
    service that failed to start leaves no client threads behind."""
    try:
        store = MetadataStore(etcd, cluster)
    except ValueError as exc:
        raise error(str(exc)) from None
    try:
        await asyncio.to_thread(store.retry, store.revision, deadline_s=connect_timeout_s)
    except MetadataUnavailableError as exc:
        store.close()
        raise error(
            f"cannot reach etcd at {etcd} within {connect_timeout_s:.0f}s ({exc})"
        ) from None
    return store


def follow_cluster(store: MetadataStore, on_events: Callable[[list[Any]], None]) -> ClusterView:
    """The cluster's view with ``on_events`` and the dynamic log levels listening, not
    started yet: the caller keeps it first (``self.view = ...``), then starts it off the
    event loop (``await asyncio.to_thread(view.start)``: a snapshot is a blocking etcd
    read). The snapshot's RESYNC reaches ``on_events`` during ``start``, and a listener that
    reads the service's view then must find it."""
    view = ClusterView(store)
    view.add_listener(on_events)
    log_levels.follow(view)
    return view
