"""etcd operations against a real etcd: what strom does when etcd was down for a while, or
is out of space."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable

import grpc
import pytest

from strom.api import metadata_pb2 as md
from strom.client.admin import Admin
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import EtcdServer, wait_for
from strom.errors import MetadataStoreFullError
from strom.metadata import MetadataStore

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_a_lease_is_renewed_after_an_etcd_outage_of_twenty_seconds(etcd: EtcdServer) -> None:
    """etcd restores the leases it had after a restart, but gives them only their TTL and
    about a second more: the keeper must reach it again within that.

    Found from outside: after an outage of 10-30 s every lease expired once etcd was back
    (the controller then took every partition offline), because the keeper's channel waited
    out gRPC's default reconnect backoff (grown to 10 s and more by then) and every other
    refresh reached no etcd at all (its one endpoint was marked failed)."""
    store = MetadataStore(etcd.endpoint, "c-outage")
    lease = store.grant_lease(2)
    key = store.keys.node(1)
    store.put(key, md.NodeRegistration(node_id=1, host="h", port=1), lease=lease)
    lost = threading.Event()
    keeper = store.keep_alive(lease, lost.set)
    try:
        wait_for(lambda: keeper.refreshes >= 1, timeout=10, what="the first refresh")
        etcd.kill()
        # Refreshes are retried every 250 ms: 80 failures are an outage of about 20 s, long
        # enough for gRPC's default backoff to have grown past 10 s.
        wait_for(lambda: keeper.failures >= 80, timeout=120, what="80 failed refreshes")
        etcd.start()
        renewed = keeper.refreshes
        wait_for(
            lambda: keeper.refreshes > renewed or keeper.lost,
            timeout=60,
            what="the keeper to hear from etcd again",
        )
        assert not keeper.lost and not lost.is_set(), "the lease expired after the outage"
        assert store.get(key, md.NodeRegistration) is not None
    finally:
        keeper.stop(revoke=False)
        store.close()


def _fill(store: MetadataStore) -> None:
    """Overwrite one key outside the cluster's keys with big values until etcd refuses a
    write for lack of space: the history is kept, so every write adds to the database (as
    configs altered over and over did, found from outside), and compacting frees it."""
    value = b"x" * (256 * 1024)
    for _ in range(1000):
        try:
            store.client.put("/fill", value)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            return
    raise AssertionError("etcd took 256 MB without running out of space")


def _etcdctl(etcd: EtcdServer, *args: str) -> None:
    subprocess.run(
        ["etcdctl", "--endpoints", etcd.endpoint, *args],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _log_lines(path: object, text: str) -> int:
    with open(str(path), encoding="utf-8", errors="replace") as f:
        return sum(text in line for line in f)


def test_an_admin_request_fails_at_once_and_clearly_when_etcd_is_out_of_space(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: with etcd's NOSPACE alarm raised, every admin request was retried
    for 60 s and failed as BROKER_NOT_AVAILABLE "no active controller answered ... etcd did
    not answer: etcd unavailable: RESOURCE_EXHAUSTED: etcdserver: mvcc: database space
    exceeded", and no service logged a line about it."""
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=0,
        etcd_args=["--quota-backend-bytes", str(8 * 1024 * 1024)],
    )
    store = MetadataStore(cluster.etcd.endpoint, "fill")
    controller = cluster.controllers[0]
    try:
        _fill(store)
        with Admin(cluster.bootstrap) as admin:
            for name in ("after-nospace", "after-nospace-2"):
                with pytest.raises(MetadataStoreFullError) as raised:
                    admin.create_topic(name, partitions=1, replication_factor=1)
                message = str(raised.value)
                assert "out of space" in message and "NOSPACE" in message, message
                assert "etcdctl alarm disarm" in message and "etcdctl defrag" in message
                assert not raised.value.retriable
        # The controller said so in its log, once for both requests (once a minute at most).
        assert _log_lines(controller.log_path, "etcd is out of space") == 1

        # What the message says to do; then admin requests work again.
        _etcdctl(cluster.etcd, "compact", str(store.revision()))
        _etcdctl(cluster.etcd, "defrag", "--cluster")
        _etcdctl(cluster.etcd, "alarm", "disarm")
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("after-disarm", partitions=1, replication_factor=1)
    finally:
        store.close()
