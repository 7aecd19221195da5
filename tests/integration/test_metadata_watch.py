"""Watches against a real etcd: cancelling one watch leaves the others alone, a watch whose
revision was compacted away resyncs once instead of re-creating itself for ever."""

from __future__ import annotations

import signal
import threading

import pytest

from strom.api import metadata_pb2 as md
from strom.devcluster.procs import EtcdServer, wait_for
from strom.metadata import ClusterView, MetadataStore, MetadataUnavailableError

pytestmark = pytest.mark.integration


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    from strom.service import metrics as service_metrics

    return REGISTRY.get_sample_value(name, {"service": service_metrics.SERVICE, **labels}) or 0.0


def _watch_creations() -> float:
    return _sample("strom_metadata_etcd_request_seconds_count", op="watch")


def test_cancelling_a_watch_made_before_an_etcd_timeout_leaves_a_newer_watch_alone(
    etcd: EtcdServer,
) -> None:
    """Found from outside: etcd numbers watches per stream from 0, and the etcd3 client
    starts a new shared stream after any request times out, so a watch made before the
    timeout and one made after held the same id; cancelling the first (an election's
    resign()) silently removed the second (the controller's cluster view froze)."""
    store = MetadataStore(etcd.endpoint, "c-collide", timeout=1.0)
    other = MetadataStore(etcd.endpoint, "c-collide")
    seen: list[str] = []
    first = store.watch_prefix(
        store.keys.controller, store.revision() + 1, lambda evs, r: seen.extend(e.key for e in evs)
    )
    other.put(other.keys.controller, md.ControllerInfo(controller_id=1))
    wait_for(lambda: seen, timeout=10, what="the first watch to deliver")

    assert etcd.process is not None
    etcd.process.signal(signal.SIGSTOP)  # etcd hangs: one read times out
    try:
        with pytest.raises(MetadataUnavailableError):
            store.get(store.keys.cluster, md.ClusterInfo)
    finally:
        etcd.process.signal(signal.SIGCONT)

    view = ClusterView(store)
    view.start()
    other.put(other.keys.node(1), md.NodeRegistration(node_id=1))
    wait_for(lambda: 1 in view.live_nodes(), timeout=10, what="the view to follow")

    first.cancel()
    other.put(other.keys.node(2), md.NodeRegistration(node_id=2))
    try:
        wait_for(lambda: 2 in view.live_nodes(), timeout=10, what="the view to go on following")
    finally:
        view.stop()


def test_a_watch_from_a_compacted_revision_resets_once_and_then_follows(
    etcd: EtcdServer,
) -> None:
    """Found from outside: etcd 3.4 answers a watch from a compacted revision with
    ``created`` and then a separate cancel naming the compaction; that cancel was taken for a
    broken stream and the watch was made again from the same revision, about five times a
    second for ever, delivering nothing."""
    store = MetadataStore(etcd.endpoint, "c-compact")
    prefix = store.keys.nodes_prefix
    for i in range(3):
        store.put(store.keys.node(i), md.NodeRegistration(node_id=i))
    store.client.compact(store.revision())

    seen: list[str] = []
    resets = threading.Event()
    before = _watch_creations()
    watch = store.watch_prefix(
        prefix, 2, lambda evs, r: seen.extend(e.key for e in evs), on_reset=resets.set
    )
    try:
        wait_for(resets.is_set, timeout=10, what="the watch to reset")
        store.put(store.keys.node(9), md.NodeRegistration(node_id=9))
        wait_for(lambda: store.keys.node(9) in seen, timeout=10, what="a change after the reset")
        made = _watch_creations()
        store.put(store.keys.node(10), md.NodeRegistration(node_id=10))
        wait_for(lambda: store.keys.node(10) in seen, timeout=10, what="the next change")
    finally:
        watch.cancel()
    # One refused creation and one from the current revision (and a spare for a slow
    # machine); none while it follows.
    assert made - before <= 3
    assert _watch_creations() == made
