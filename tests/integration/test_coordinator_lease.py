"""A coordinator whose lease has surely lapsed answers from no shard.

Found from outside: a coordinator cut off from etcd (a network partition; or paused by
SIGSTOP, a long GC, a frozen VM, and woken while etcd cannot reach it) kept answering from
memory as long as its keeper had not heard from etcd that the lease was gone, while another
coordinator had taken its shards over: OffsetFetch handed out offsets the group had since
moved past. Here a proxy between the old owner and etcd swallows every byte both ways, so
the old owner can never hear of the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from strom import Consumer, OffsetAndMetadata, TopicPartition
from strom.api import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from strom.coordinator.offsets_log import shard_for_group
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic
from tests.integration.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration

SHARDS = 2


def _fetch(address: str, group: str) -> coordinator_pb2.OffsetFetchResponse:
    with grpc.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        return stub.OffsetFetch(
            coordinator_pb2.OffsetFetchRequest(group_id=group, member_epoch=-1), timeout=10
        )


def _offsets(resp: coordinator_pb2.OffsetFetchResponse) -> list[int]:
    return [p.committed_offset for t in resp.topics for p in t.partitions]


def _owner(cluster: LocalCluster, shard: int) -> str:
    """The address of the live owner of ``shard`` (loaded: epoch >= 0), or ""."""
    address, epoch = (cluster.coordinator_shards() or {}).get(shard, ("", -1))
    return address if epoch >= 0 else ""


def test_a_coordinator_cut_off_from_etcd_stops_answering_once_its_lease_lapses(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(
        nodes=1,
        controllers=1,
        coordinators=2,
        coordinator_args=[
            "--offsets-partitions",
            str(SHARDS),
            "--transaction-state-partitions",
            "1",
        ],
    )
    old, other = cluster.coordinators
    proxy = TcpProxy(int(cluster.etcd.endpoint.rsplit(":", 1)[1]))
    try:
        # The old coordinator reaches etcd through the proxy only.
        assert old.process is not None
        old.process.stop()
        i = old.argv.index("--etcd")
        old.argv[i + 1] = f"127.0.0.1:{proxy.port}"
        old.start()
        cluster.wait_serving(old)
        shards = cluster.wait_coordinators_ready(timeout=60)
        mine = next(s for s, (address, _) in shards.items() if address == old.address)
        group = next(g for g in (f"g{n}" for n in range(100)) if shard_for_group(g, SHARDS) == mine)
        create_topic(cluster, "lease", 1, 1)
        tp = TopicPartition("lease", 0)
        with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
            c.commit({tp: OffsetAndMetadata(100, "")})
        assert _offsets(_fetch(old.address, group)) == [100]

        proxy.partition()
        wait_for(
            lambda: _owner(cluster, mine) == other.address,
            timeout=60,
            what="the other coordinator to take the shard over",
        )
        with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
            c.commit({tp: OffsetAndMetadata(200, "")})
            assert c.committed(tp).offset == 200
        # The old owner still runs and still holds the shard in memory, but cannot renew.
        stale = _fetch(old.address, group)
        assert stale.error_code == common_pb2.NOT_COORDINATOR, (
            f"answered {common_pb2.ErrorCode.Name(stale.error_code)} {_offsets(stale)}"
        )
        assert "lease" in stale.error_message
    finally:
        proxy.cut()  # heals: the old coordinator reconnects and hears of the loss
    with Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
        assert c.committed(tp).offset == 200
    proxy.close()
