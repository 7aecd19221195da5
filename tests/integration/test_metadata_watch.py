"""Watches against a real etcd: cancelling one watch leaves the others alone, a watch whose
revision was compacted away resyncs once instead of re-creating itself for ever, and one on
an etcd that came back without its data resyncs instead of waiting silently (and the
controller then creates no new cluster in place of the one it served)."""

from __future__ import annotations

import logging
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from strom.api import metadata_pb2 as md
from strom.controller.activation import ActiveRole
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import EtcdServer, wait_for
from strom.metadata import ClusterView, MetadataStore, MetadataUnavailableError
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    from strom.service import metrics as service_metrics

    return REGISTRY.get_sample_value(name, {"service": service_metrics.SERVICE, **labels}) or 0.0


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (a SIGSTOP takes effect some time after kill()
    returns: a read sent at once could still be answered)."""
    tasks = Path(f"/proc/{pid}/task")
    return all(
        (t / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t") for t in tasks.iterdir()
    )


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
        wait_for(lambda: _stopped(etcd.process.pid), timeout=10, what="etcd to stop")
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


def test_a_view_whose_missed_changes_were_compacted_away_resyncs(etcd: EtcdServer) -> None:
    """A view away from etcd while keys change and etcd compacts its history (etcd
    served other clients elsewhere meanwhile) resyncs on its return: it sees the new topic
    and the deleted node, and the reset is counted."""
    store = MetadataStore(etcd.endpoint, "c-view")
    store.put(store.keys.node(1), md.NodeRegistration(node_id=1))
    view = ClusterView(store)
    view.start()
    resets = _sample("strom_metadata_watch_resets_total", reason="compacted")
    try:
        etcd.kill()
        # The same etcd (its data, its member) on another client port: the view cannot
        # reach it there.
        away = EtcdServer(etcd.data_dir, peer_port=etcd.peer_port).start()
        try:
            writer = MetadataStore(away.endpoint, "c-view")
            writer.put(writer.keys.topic("t"), md.TopicMetadata(name="t", partition_count=1))
            writer.delete(writer.keys.node(1))
            writer.client.compact(writer.revision())
            writer.close()
        finally:
            away.kill()
        etcd.start()
        wait_for(
            lambda: view.topic("t") is not None and not view.live_nodes(),
            timeout=20,
            what="the view to resync",
        )
    finally:
        view.stop()
    assert _sample("strom_metadata_watch_resets_total", reason="compacted") == resets + 1


def test_a_failed_resync_is_retried_before_the_watch_goes_on(etcd: EtcdServer) -> None:
    """Found from outside: a reset moved the watch past the compaction before its owner took
    the new snapshot, and a snapshot that failed was swallowed: the owner went on without
    the changes it had missed. The reset now retries the snapshot and moves on after it."""
    store = MetadataStore(etcd.endpoint, "c-resync")
    prefix = store.keys.nodes_prefix
    start = store.revision() + 1
    store.put(store.keys.node(1), md.NodeRegistration(node_id=1))
    store.put(store.keys.topic("t"), md.TopicMetadata(name="t"))  # the watch's start ...
    store.client.compact(store.revision())  # ... is compacted away
    known: set[str] = set()
    tries: list[int] = []

    def snapshot() -> int:
        tries.append(1)
        if len(tries) == 1:  # as when etcd stays away longer than the owner's retries
            raise MetadataUnavailableError("etcd unavailable (the test's first snapshot)")
        rev, items = store.get_prefix_raw(prefix)
        known.update(e.key for e in items)
        return rev

    watch = store.watch_prefix(
        prefix, start, lambda evs, r: known.update(e.key for e in evs), on_reset=snapshot
    )
    try:
        wait_for(lambda: store.keys.node(1) in known, timeout=10, what="the missed change")
        store.put(store.keys.node(2), md.NodeRegistration(node_id=2))
        wait_for(lambda: store.keys.node(2) in known, timeout=10, what="the next change")
    finally:
        watch.cancel()
    assert len(tries) == 2


def test_a_view_resyncs_when_etcd_comes_back_without_its_data(etcd: EtcdServer) -> None:
    """Found from outside: an etcd restarted on an empty data dir is at a revision below the
    watches', accepts a watch from a future revision and stays silent, so running services
    never saw the cluster key go (and a storage node never stopped on a changed id). The
    view now resyncs: the cluster key, the nodes are gone, a new topic is there."""
    store = MetadataStore(etcd.endpoint, "c-wipe")
    store.put(store.keys.cluster, md.ClusterInfo(cluster_id="old"))
    for i in range(20):  # a revision well above an empty etcd's
        store.put(store.keys.node(1), md.NodeRegistration(node_id=1, port=i))
    view = ClusterView(store)
    view.start()
    assert view.cluster is not None and view.cluster.cluster_id == "old"
    resets = _sample("strom_metadata_watch_resets_total", reason="history_lost")
    try:
        etcd.kill()
        shutil.rmtree(etcd.data_dir / "etcd")  # the operator's disaster
        etcd.start()
        store.retry(
            lambda: store.put(store.keys.topic("t"), md.TopicMetadata(name="t")), deadline_s=20
        )
        wait_for(
            lambda: view.cluster is None and view.topic("t") is not None and not view.nodes,
            timeout=20,
            what="the view to resync",
        )
    finally:
        view.stop()
    assert view.seen_cluster_id == "old"  # what the controller needs to not create a new one
    assert _sample("strom_metadata_watch_resets_total", reason="history_lost") == resets + 1


class _Activation(ActiveRole):
    """The controller's activation steps, on a store and a view of their own."""

    def __init__(self, store: MetadataStore, view: ClusterView) -> None:
        self.store, self.view, self.cluster = store, view, "c-ctl"


def test_a_controller_that_saw_the_cluster_id_does_not_create_a_new_one_after_a_wipe(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: the active controller created a fresh cluster id whenever the
    cluster key was missing, so etcd coming back without its data became a new cluster
    under the running services. A brand-new etcd still gets one."""
    store = MetadataStore(etcd.endpoint, "c-ctl")
    view = ClusterView(store)
    view.start()
    role = _Activation(store, view)
    try:
        role._ensure_cluster_key()  # a new cluster
        first = store.get(store.keys.cluster, md.ClusterInfo)
        assert first is not None and first.value.cluster_id
        wait_for(lambda: view.seen_cluster_id, timeout=10, what="the view to see the id")
        role._ensure_cluster_key()  # nothing to do
        again = store.get(store.keys.cluster, md.ClusterInfo)
        assert again is not None and again.mod_revision == first.mod_revision

        etcd.kill()
        shutil.rmtree(etcd.data_dir / "etcd")
        etcd.start()
        wait_for(
            lambda: view.cluster is None and view.revision < first.mod_revision,
            timeout=20,
            what="the view to resync",
        )
        with caplog.at_level(logging.ERROR, logger="strom.controller"):
            store.retry(role._ensure_cluster_key, deadline_s=20)
        assert store.get(store.keys.cluster, md.ClusterInfo) is None
        assert any("etcd lost its data" in r.getMessage() for r in caplog.records)
    finally:
        view.stop()


def test_a_running_cluster_whose_etcd_comes_back_empty_stops_its_nodes_and_keeps_their_data(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """The whole story with real processes: etcd restarted on an empty data dir under a
    running cluster. The storage node stops (its log files kept), and the active controller
    creates no new cluster id in place of the one the node's data belongs to."""
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    create_topic(cluster, "kept")
    node = cluster.nodes[0]
    data = cluster.root / "node-1"
    assert (data / "kept-0").is_dir()

    cluster.etcd.kill()
    shutil.rmtree(cluster.etcd.data_dir / "etcd")
    cluster.etcd.start()
    wait_for(lambda: not node.alive(), timeout=60, what="the storage node to stop")
    assert (data / "kept-0").is_dir()
    assert "etcd lost its data" in node.log_path.read_text()
    store = MetadataStore(cluster.etcd.endpoint, cluster.cluster_name)
    controller = cluster.controllers[0]
    wait_for(
        lambda: "not creating a new cluster" in controller.log_path.read_text(),
        timeout=60,
        what="the controller to refuse a new cluster id",
    )
    assert store.get(store.keys.cluster, md.ClusterInfo) is None
    assert controller.alive()
