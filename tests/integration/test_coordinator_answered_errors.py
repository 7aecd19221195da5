"""Appends the storage nodes answer with a retriable error (here NOT_ENOUGH_REPLICAS) are no
sign that the coordinator is cut from them: every coordinator would see the same, so the
shard is kept and its clients are not told "cannot reach the storage nodes"
(``strom.coordinator.storage_io.storage_unreachable``).

Real processes: etcd, a controller, one storage node and two coordinators.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from strom import Admin, Consumer, OffsetAndMetadata, TopicPartition
from strom.api import metadata_pb2 as md
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import CoordinatorLoadInProgressError, StromError
from strom.metadata import MetadataStore
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def test_answered_append_errors_keep_the_shard_and_do_not_say_unreachable(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """``min.insync.replicas=2`` on a one-replica ``__consumer_offsets``: every append is
    answered NOT_ENOUGH_REPLICAS. The commit fails REQUEST_TIMED_OUT naming that; the shard's
    reloads fail the same way, answered COORDINATOR_LOAD_IN_PROGRESS with the reason; the shard
    keeps its owner past RELEASE_AFTER_S. Before, the 10 s of answered errors counted as
    "unreachable": COORDINATOR_NOT_AVAILABLE "cannot reach the storage nodes", and the shard was
    released to the other coordinator (which met the same and handed it back)."""
    c = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=2,
        coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
    )
    create_topic(c, "answered")
    tp = TopicPartition("answered", 0)
    admin = Admin(c.bootstrap)
    consumer = Consumer(c.bootstrap, group_id="answered-group", enable_auto_commit=False)
    store = MetadataStore(c.etcd.endpoint, c.cluster_name)
    try:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(1)}, timeout_ms=60_000)
        owner = store.get(store.keys.coordinator(0), md.CoordinatorShardOwner)
        assert owner is not None and owner.value.epoch >= 0
        admin.alter_configs("__consumer_offsets", set={"min.insync.replicas": 2})

        def commit_error() -> StromError | None:
            try:
                consumer.commit({tp: OffsetAndMetadata(2)}, timeout_ms=3000)
            except StromError as exc:
                assert "cannot reach" not in exc.message, exc
                assert "did not take it" not in exc.message, exc
                return exc
            return None  # the node has not applied the new setting yet

        # The reload's fence append is answered NOT_ENOUGH_REPLICAS too: the shard still
        # loads, saying why (checked on every error on the way there, above).
        def loading_for_replicas() -> bool:
            exc = commit_error()
            return (
                isinstance(exc, CoordinatorLoadInProgressError)
                and "NOT_ENOUGH_REPLICAS" in exc.message
            )

        wait_for(loading_for_replicas, timeout=90, what="LOAD_IN_PROGRESS for NOT_ENOUGH_REPLICAS")
        # A second failed load attempt: unserved longer than RELEASE_AFTER_S by now.
        wait_for(loading_for_replicas, timeout=60, what="the reload failing again")
        now = store.get(store.keys.coordinator(0), md.CoordinatorShardOwner)
        assert now is not None and now.value.incarnation_id == owner.value.incarnation_id
        assert now.create_revision == owner.create_revision, "the shard was released"
        admin.alter_configs("__consumer_offsets", delete=["min.insync.replicas"])
        consumer.commit({tp: OffsetAndMetadata(3)}, timeout_ms=60_000)
        assert consumer.committed([tp], timeout_ms=30_000)[tp].offset == 3
    finally:
        store.close()
        consumer.close()
        admin.close()
