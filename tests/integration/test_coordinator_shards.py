"""Shard ownership of a group coordinator against a real etcd and a real storage node: the
coordinator runs in this process (its shard table is what is looked at), the cluster's other
services are processes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from strom.api import coordinator_pb2, coordinator_pb2_grpc
from strom.coordinator.service import CoordinatorService
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode as E
from tests.conftest import create_topic
from tests.integration.grpc_proxy import GrpcProxy, cluster_behind_proxy, produce_to

pytestmark = pytest.mark.integration


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _one_shard_coordinator(cluster: LocalCluster, advertise_port: int) -> CoordinatorService:
    """A coordinator in this process (id 7) for ``cluster``, one shard of each kind."""
    return CoordinatorService(
        etcd=cluster.etcd.endpoint,
        cluster=cluster.cluster_name,
        coordinator_id=7,
        advertise_host="127.0.0.1",
        advertise_port=advertise_port,
        offsets_partitions=1,
        offsets_replication_factor=1,
        txn_partitions=1,
    )


def _serves_both(svc: CoordinatorService) -> bool:
    return all(0 in k.shards and k.shards[0].loaded for k in (svc.group_kind, svc.txn_kind))


async def _serving_with_producer(svc: CoordinatorService, topic: str, tid: str) -> tuple[int, int]:
    """Once ``svc`` (started) serves both shards and sees ``topic``: ``tid``'s producer id and
    epoch from InitProducerId."""
    from strom.api import storage_pb2

    await _until(lambda: _serves_both(svc), 60, "both shards loaded")
    await _until(lambda: topic in svc._topics(), 30, "the topic in the view")
    init = await svc.InitProducerId(
        storage_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=600_000),
        None,
    )
    assert init.error_code == E.NONE, init
    return init.producer_id, init.producer_epoch


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


PRODUCE = "/strom.v1.StorageService/Produce"


@contextlib.contextmanager
def _one_shard_each(tmp_path: Path) -> Iterator[tuple[LocalCluster, GrpcProxy]]:
    """A one-node cluster behind a proxy with one coordinator owning one group shard and one
    transaction shard (every write goes through the same proxied node), ready to serve."""
    with cluster_behind_proxy(
        tmp_path / "c",
        controllers=1,
        coordinators=1,
        coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
    ) as (cluster, proxy):
        cluster.wait_coordinators_ready()
        yield cluster, proxy


RETRIABLE = {E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR}


def _commit_request(topic: str, offset: int) -> coordinator_pb2.OffsetCommitRequest:
    req = coordinator_pb2.OffsetCommitRequest(group_id="g-cancelled", member_epoch=-1)
    req.topics.add(topic=topic).partitions.add(partition=0, committed_offset=offset)
    return req


def _commit(stub: coordinator_pb2_grpc.CoordinatorServiceStub, topic: str, offset: int) -> None:
    """Commit until the coordinator answers NONE (retrying its retriable refusals)."""

    def done() -> bool:
        try:
            resp = stub.OffsetCommit(_commit_request(topic, offset), timeout=10)
        except grpc.RpcError:
            return False
        code = resp.topics[0].partitions[0].error_code if resp.topics else resp.error_code
        assert code == E.NONE or code in RETRIABLE, resp
        return code == E.NONE

    wait_for(done, timeout=30, what=f"a commit of offset {offset}")


def _committed(stub: coordinator_pb2_grpc.CoordinatorServiceStub, topic: str) -> int:
    def fetch() -> int | None:
        req = coordinator_pb2.OffsetFetchRequest(group_id="g-cancelled", member_epoch=-1)
        req.topics.add(topic=topic, partitions=[0])
        try:
            resp = stub.OffsetFetch(req, timeout=10)
        except grpc.RpcError:
            return None
        if resp.error_code in RETRIABLE:
            return None
        p = resp.topics[0].partitions[0]
        return None if p.error_code in RETRIABLE else p.committed_offset

    return wait_for(fetch, timeout=30, what="the committed offset")


def test_a_commit_cancelled_during_its_write_does_not_swallow_the_next_one(
    tmp_path: Path,
) -> None:
    """A coordinator RPC whose caller gives up (deadline passed) is cancelled while its shard
    write is in flight; the append still lands. The coordinator did not count it, so its next
    write reused the same sequence numbers and the node took it for a retry of that append:
    acknowledged, never written, and gone after a coordinator restart (found as a shard
    writing sequence 78 when its log ended at 81)."""
    with _one_shard_each(tmp_path) as (cluster, proxy):
        topic = create_topic(cluster, "cancelled-writes")
        coord = cluster.coordinators[0]
        channel = grpc.insecure_channel(coord.address)
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        _commit(stub, topic, 10)

        # The commit's own append: the transaction shard's load appends a fence batch of its
        # own, which may come after the group shard's commits are served.
        hold = proxy.hold(PRODUCE, after=1_000_000, matches=produce_to("__consumer_offsets"))
        with pytest.raises(grpc.RpcError) as cancelled:
            stub.OffsetCommit(_commit_request(topic, 20), timeout=1.0)
        assert cancelled.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert hold.held.is_set(), "the commit's append never reached the node"
        hold.released.set()  # the append of offset 20 lands now

        _commit(stub, topic, 30)
        assert _committed(stub, topic) == 30
        channel.close()

        coord.process.kill()  # SIGKILL: the next owner knows only what the log holds
        coord.start()
        cluster.wait_serving(coord)
        cluster.wait_coordinators_ready()
        with grpc.insecure_channel(coord.address) as channel2:
            stub2 = coordinator_pb2_grpc.CoordinatorServiceStub(channel2)
            assert _committed(stub2, topic) == 30


def _group_commit(group: str, topic: str, offset: int) -> coordinator_pb2.OffsetCommitRequest:
    req = coordinator_pb2.OffsetCommitRequest(group_id=group, member_epoch=-1)
    req.topics.add(topic=topic).partitions.add(partition=0, committed_offset=offset)
    return req


def _group_fetch(group: str, topic: str) -> coordinator_pb2.OffsetFetchRequest:
    req = coordinator_pb2.OffsetFetchRequest(group_id=group, member_epoch=-1)
    req.topics.add(topic=topic, partitions=[0])
    return req


def test_commits_that_arrive_during_an_append_share_the_next_one_and_survive_a_new_owner(
    tmp_path: Path,
) -> None:
    """Group commit: while one append to a shard is in flight, the commits of 49 other groups
    queue; they go to the log as one append, each is answered only once it is durable (an
    OffsetFetch made meanwhile waits too), and the next owner of the shard, which knows only
    the log, reads every one of them back."""
    with cluster_behind_proxy(tmp_path / "c", controllers=1, coordinators=0) as (cluster, proxy):
        topic = create_topic(cluster, "group-commit")

        def service(coordinator_id: int) -> CoordinatorService:
            return CoordinatorService(
                etcd=cluster.etcd.endpoint,
                cluster=cluster.cluster_name,
                coordinator_id=coordinator_id,
                advertise_host="127.0.0.1",
                advertise_port=1,  # nobody calls it over the network here
                offsets_partitions=1,
                offsets_replication_factor=1,
                txn_partitions=1,
            )

        async def loaded(svc: CoordinatorService) -> Any:
            # Both kinds' shards: loading one appends a fence batch, and the transaction
            # shard's must not land among the Produce calls counted below.
            for kind in (svc.txn_kind, svc.group_kind):
                await _until(
                    lambda k=kind: 0 in k.shards and k.shards[0].loaded, 60, "shards loaded"
                )
            return svc.group_kind.shards[0]

        async def first_owner() -> None:
            svc = service(7)
            await svc.start()
            try:
                shard = await loaded(svc)
                warm = await svc.OffsetCommit(_group_commit("g-warm", topic, 1), None)
                assert warm.topics[0].partitions[0].error_code == E.NONE, warm

                before = proxy.calls.get(PRODUCE, 0)
                hold = proxy.hold(  # until released below
                    PRODUCE, after=1_000_000, matches=produce_to("__consumer_offsets")
                )
                first = asyncio.ensure_future(
                    svc.OffsetCommit(_group_commit("g-0", topic, 100), None)
                )
                await _until(hold.held.is_set, 30, "the first commit's append at the node")
                rest = [
                    asyncio.ensure_future(
                        svc.OffsetCommit(_group_commit(f"g-{i}", topic, 100 + i), None)
                    )
                    for i in range(1, 50)
                ]
                await _until(lambda: len(shard.writes) == 49, 30, "49 commits queued")
                read = asyncio.ensure_future(svc.OffsetFetch(_group_fetch("g-7", topic), None))
                # A commit of a group unknown to the shard, refused by the engine while a
                # delete or a commit it depends on might still fail: it waits too.
                refused = asyncio.ensure_future(
                    svc.OffsetCommit(
                        coordinator_pb2.OffsetCommitRequest(
                            group_id="g-none", member_id="m", member_epoch=3
                        ),
                        None,
                    )
                )
                for _ in range(100):  # let both run as far as they can (no clock involved)
                    await asyncio.sleep(0)
                assert not any(f.done() for f in [first, *rest]), "answered before durable"
                assert not read.done(), "an OffsetFetch answered before the commits were durable"
                assert not refused.done(), "a refusal answered before earlier writes were durable"

                hold.released.set()
                answers = await asyncio.gather(first, *rest)
                assert [a.topics[0].partitions[0].error_code for a in answers] == [E.NONE] * 50
                assert (await read).topics[0].partitions[0].committed_offset == 107
                assert (await refused).error_code == E.UNKNOWN_MEMBER_ID
                assert proxy.calls[PRODUCE] - before == 2, "the 49 queued commits took more appends"
            finally:
                await svc.stop()

        async def next_owner() -> None:
            svc = service(8)
            await svc.start()
            try:
                await loaded(svc)
                for i in range(50):
                    resp = await svc.OffsetFetch(_group_fetch(f"g-{i}", topic), None)
                    assert resp.topics[0].partitions[0].committed_offset == 100 + i, (i, resp)
            finally:
                await svc.stop()

        asyncio.run(first_owner())
        asyncio.run(next_owner())


def test_an_end_txn_abandoned_during_its_write_still_completes_the_transaction(
    tmp_path: Path,
) -> None:
    """EndTxn(commit) whose caller gives up while the PREPARE_COMMIT record is being written:
    the record lands, so the decision is in the log. The coordinator must not keep the old
    state in memory (a timeout would then abort a transaction the log says is committed):
    it waits for the append, reloads the shard from the log, and the reload completes the
    commit: its records become readable with read_committed."""
    from strom.client.consumer import Consumer
    from strom.client.producer import Producer
    from strom.client.types import TopicPartition

    with _one_shard_each(tmp_path) as (cluster, proxy):
        topic = create_topic(cluster, "abandoned-end")
        with Producer(
            cluster.bootstrap, transactional_id="t-abandoned", transaction_timeout_ms=600_000
        ) as p:
            p.init_transactions()
            p.begin_transaction()
            p.send(topic, b"decided")
            state = p.prepare_transaction()

        hold = proxy.hold(  # the PREPARE_COMMIT append
            PRODUCE, after=1_000_000, matches=produce_to("__transaction_state")
        )
        with grpc.insecure_channel(cluster.coordinators[0].address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
            with pytest.raises(grpc.RpcError) as gave_up:
                stub.EndTxn(
                    coordinator_pb2.EndTxnRequest(
                        transactional_id="t-abandoned",
                        producer_id=state.producer_id,
                        producer_epoch=state.producer_epoch,
                        committed=True,
                    ),
                    timeout=1.0,
                )
        assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert hold.held.is_set(), "EndTxn's append never reached the node"
        hold.released.set()

        tp = TopicPartition(topic, 0)
        with Consumer(
            cluster.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
        ) as c:
            c.assign([tp])
            got: list[bytes | None] = []

            def committed() -> bool:
                got.extend(r.value for r in c.poll(timeout_ms=200))
                return got == [b"decided"]

            wait_for(committed, timeout=60, what="the committed transaction's record")


def test_requests_waiting_on_a_shard_given_up_meanwhile_answer_not_coordinator(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: requests that found their shard served, then waited for its lock
    while the coordinator gave the shard up (SIGTERM, a hand-over, a lost lease), read the
    emptied table and answered INVALID_PRODUCER_ID_MAPPING, fatal to a healthy transactional
    producer. Every RPC of both shard kinds that waits on the lock must answer NOT_COORDINATOR
    instead (the client looks its coordinator up again), never an error made from the
    emptied state."""
    from strom.api import storage_pb2

    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    topic = create_topic(cluster, "moving")
    tid, gid = "t-moving", "g-moving"

    async def main() -> None:
        svc = _one_shard_coordinator(cluster, advertise_port=1)  # nobody calls it here
        await svc.start()
        try:
            pid, epoch = await _serving_with_producer(svc, topic, tid)
            ids = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
            add = coordinator_pb2.AddPartitionsToTxnRequest(**ids)
            add.topics.add(topic=topic, partitions=[0])
            txn_commit = coordinator_pb2.TxnOffsetCommitRequest(
                **ids, group_id=gid, member_epoch=-1
            )
            txn_commit.topics.add(topic=topic).partitions.add(partition=0, committed_offset=1)
            commit = coordinator_pb2.OffsetCommitRequest(group_id=gid, member_epoch=-1)
            commit.topics.add(topic=topic).partitions.add(partition=0, committed_offset=1)
            calls: dict[str, tuple[Any, Callable[[], Any]]] = {
                "AddPartitionsToTxn": (svc.txn_kind, lambda: svc.AddPartitionsToTxn(add, None)),
                "AddOffsetsToTxn": (
                    svc.txn_kind,
                    lambda: svc.AddOffsetsToTxn(
                        coordinator_pb2.AddOffsetsToTxnRequest(**ids, group_id=gid), None
                    ),
                ),
                "EndTxn": (
                    svc.txn_kind,
                    lambda: svc.EndTxn(coordinator_pb2.EndTxnRequest(**ids, committed=True), None),
                ),
                "InitProducerId": (
                    svc.txn_kind,
                    lambda: svc.InitProducerId(
                        storage_pb2.InitProducerIdRequest(
                            transactional_id=tid, transaction_timeout_ms=600_000
                        ),
                        None,
                    ),
                ),
                "TxnOffsetCommit": (svc.group_kind, lambda: svc.TxnOffsetCommit(txn_commit, None)),
                "OffsetCommit": (svc.group_kind, lambda: svc.OffsetCommit(commit, None)),
            }
            answers = {}
            for name, (kind, call) in calls.items():
                await _until(
                    lambda: _serves_both(svc), 60, f"both shards served again before {name}"
                )
                shard = kind.shards[0]
                async with shard.lock:
                    task = asyncio.create_task(call())
                    await _until(
                        lambda lock=shard.lock: bool(lock._waiters),
                        10,
                        f"{name} waiting on the shard lock",
                    )
                    svc._unload(shard)  # as stop(), a hand-over or a lost lease do
                resp = await asyncio.wait_for(task, 30)
                code = resp.error_code
                if not code and getattr(resp, "topics", None):
                    code = resp.topics[0].partitions[0].error_code
                answers[name] = E.Name(code)
            assert answers == dict.fromkeys(calls, "NOT_COORDINATOR")
        finally:
            await svc.stop()

    asyncio.run(main())


def test_a_txn_offset_commit_never_lands_after_its_transactions_completion(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """TxnOffsetCommit for a group whose transaction coordinator is another process asks it
    for the transaction's state before taking the group's lock. If the transaction's
    completion (EndTxn's CompleteTxnOffsets) reaches the group in between, the commit must
    not land: its offsets would stay pending behind the completion for good (read_committed
    members refused UNSTABLE_OFFSET_COMMIT). It is answered CONCURRENT_TRANSACTIONS, and the
    retry, asking again, INVALID_TXN_STATE. The coordinator here serves both shards and asks
    itself over gRPC (as another process would be asked); the test holds the describe's
    answer until EndTxn completed."""

    cluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    topic = create_topic(cluster, "racing")
    tid, gid = "t-racing", "g-racing"

    async def main() -> None:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        svc = _one_shard_coordinator(cluster, advertise_port=port)
        svc.register(server)
        await server.start()
        await svc.start()
        try:
            pid, epoch = await _serving_with_producer(svc, topic, tid)
            ids = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}
            added = await svc.AddOffsetsToTxn(
                coordinator_pb2.AddOffsetsToTxnRequest(**ids, group_id=gid), None
            )
            assert added.error_code == E.NONE, added
            txn_commit = coordinator_pb2.TxnOffsetCommitRequest(
                **ids, group_id=gid, member_epoch=-1
            )
            txn_commit.topics.add(topic=topic).partitions.add(partition=0, committed_offset=5)

            # The remote path, with the describe's answer held until the completion landed.
            svc._owns_txn = lambda _tid: False  # type: ignore[method-assign]
            remote_txn = svc._remote_txn
            described, go = asyncio.Event(), asyncio.Event()

            async def held(transactional_id: str, context: Any) -> Any:
                meta = await remote_txn(transactional_id, context)
                described.set()
                await go.wait()
                return meta

            svc._remote_txn = held  # type: ignore[method-assign]
            task = asyncio.create_task(svc.TxnOffsetCommit(txn_commit, None))
            await asyncio.wait_for(described.wait(), 30)
            ended = await svc.EndTxn(coordinator_pb2.EndTxnRequest(**ids, committed=True), None)
            assert ended.error_code == E.NONE, ended
            shard = svc.group_kind.shards[0]

            def completed_at_group() -> bool:
                group = shard.groups.get(gid)
                done = group.pending.get(pid) if group is not None else None
                return done is not None and not done.offsets

            await _until(completed_at_group, 30, "the completion at the group")
            go.set()
            resp = await asyncio.wait_for(task, 30)
            code = resp.error_code or resp.topics[0].partitions[0].error_code
            assert E.Name(code) == "CONCURRENT_TRANSACTIONS", resp
            assert completed_at_group(), "offsets left pending behind the completion"
            again = await svc.TxnOffsetCommit(txn_commit, None)
            assert E.Name(again.error_code) == "INVALID_TXN_STATE", again
            assert completed_at_group()
        finally:
            await svc.stop()
            await server.stop(None)

    asyncio.run(main())
