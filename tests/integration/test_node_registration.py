"""A storage node's registration after its lease is lost, against a real etcd."""

from __future__ import annotations

import threading
import uuid

import pytest

from strom.api import metadata_pb2 as md
from strom.devcluster.procs import EtcdServer, wait_for
from strom.metadata import MetadataStore, MetadataUnavailableError
from strom.storage.registration import NodeRegistration

pytestmark = pytest.mark.integration


def test_reregister_waits_out_its_own_expiring_key(etcd: EtcdServer) -> None:
    """When the lost lease's key (our own incarnation) is still there, re-registering must
    not count it as done: it retries until that key expires and holds the key again under a
    lease it keeps alive."""
    store = MetadataStore(etcd.endpoint, f"test-{uuid.uuid4().hex[:8]}")
    reg = NodeRegistration(
        store, node_id=1, host="127.0.0.1", port=1, metrics_port=0, rack=None, session_timeout_s=2
    )
    lost = threading.Event()
    try:
        reg.register(lost.set)
        assert reg.keepalive is not None
        reg.keepalive.stop(revoke=True)  # our lease is gone (as after expiry) ...
        stale = store.grant_lease(2)  # ... but our key lingers under a lease nobody refreshes
        store.put(reg.key, reg.value, lease=stale)
        try:
            reg.reregister(lost.set)
            raise AssertionError("re-registered while the stale key still stood")
        except MetadataUnavailableError:
            pass  # the node's loop retries this

        def again() -> bool:
            try:
                reg.reregister(lost.set)
            except MetadataUnavailableError:
                return False
            return True

        wait_for(again, timeout=15, what="a re-registration once the stale key expired")
        current = store.get(reg.key, md.NodeRegistration)
        assert current is not None and current.value.incarnation_id == reg.incarnation_id
        assert reg.keepalive is not None and reg.lease is not None and reg.lease.id != stale.id
        _, meta = store.client.get(reg.key)
        assert meta.lease_id == reg.lease.id  # bound to the lease that is kept alive
    finally:
        reg.close()
        store.close()


def test_reregister_keeps_a_registration_that_is_live(etcd: EtcdServer) -> None:
    """The node's watchdog re-registers when its view lacks the key; a view behind etcd must
    not make it drop a live registration (the new key would wait out the old lease). Asked
    while its lease lives, reregister keeps key and lease; once the key is gone (deleted by
    hand), it makes a new one."""
    store = MetadataStore(etcd.endpoint, f"test-{uuid.uuid4().hex[:8]}")
    reg = NodeRegistration(
        store, node_id=1, host="127.0.0.1", port=1, metrics_port=0, rack=None, session_timeout_s=2
    )
    lost = threading.Event()
    try:
        reg.register(lost.set)
        lease, keepalive = reg.lease, reg.keepalive
        reg.reregister(lost.set)
        assert reg.lease is lease and reg.keepalive is keepalive and reg.live()
        _, meta = store.client.get(reg.key)
        assert meta.lease_id == lease.id
        store.client.delete(reg.key)
        reg.reregister(lost.set)
        assert reg.lease is not None and reg.lease.id != lease.id and reg.live()
        _, meta = store.client.get(reg.key)
        assert meta.lease_id == reg.lease.id
    finally:
        reg.close()
        store.close()
