"""Shard ownership of a group coordinator against a real etcd and a real storage node: the
coordinator runs in this process (its shard table is what is looked at), the cluster's other
services are processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from strom.coordinator.service import CoordinatorService
from strom.devcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_shard_dropped_from_memory_while_its_key_stays_ours_is_served_again(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A shard dropped from the coordinator's memory (after a fenced write, say) while its
    etcd key stayed under the coordinator's lease was never taken again: no other
    coordinator may take it before that lease ends, so it stayed unserved. The ownership pass
    loads it again."""
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)

    async def main() -> None:
        svc = CoordinatorService(
            etcd=cluster.etcd.endpoint,
            cluster=cluster.cluster_name,
            coordinator_id=7,
            advertise_host="127.0.0.1",
            advertise_port=1,  # nobody calls it here
            offsets_partitions=2,
            offsets_replication_factor=1,
            txn_partitions=1,
        )
        await svc.start()
        try:
            kind = svc.group_kind
            await _until(
                lambda: len(kind.shards) == 2 and all(s.loaded for s in kind.shards.values()),
                60,
                "both group shards loaded",
            )
            dropped = kind.shards[1]
            svc._unload(dropped)
            assert 1 not in kind.shards
            await _until(
                lambda: 1 in kind.shards and kind.shards[1].loaded,
                30,
                "shard 1 served again",
            )
            assert kind.shards[1] is not dropped
        finally:
            await svc.stop()

    asyncio.run(main())
