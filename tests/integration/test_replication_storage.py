"""Replication between real storage-node processes, with a real controller (DESIGN §6).

etcd, one controller process (so AlterPartition commits for real) and three storage nodes.
Partition states are written into etcd by the test itself (replicas [1, 2, 3], leader 1), so
what is exercised is the storage side: replica fetchers, HW, acks=all, ISR shrink/expand
through AlterPartition, divergence truncation and epoch fencing. Waiting is always on a
condition (etcd, metrics, RPC answers), never a fixed sleep.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from strom.api import metadata_pb2 as md
from strom.devcluster.procs import EtcdServer, ManagedProcess, free_port, wait_for
from strom.errors import ErrorCode as E
from strom.metadata import MetadataStore
from tests.integration.test_storage_node import (
    CLUSTER,
    Cluster,
    Node,
    batch,
    fetch_one,
    produce_one,
    values_of,
)

pytestmark = pytest.mark.integration

LAG_MS = 1000


@dataclass
class ReplNode(Node):
    """A storage node with replication-friendly flags for tests."""

    def argv(self, **overrides: str) -> list[str]:
        return super().argv(
            **{
                "--replica-lag-time-max-ms": str(LAG_MS),
                # Pauses in these tests must not expire the lease (that is failover's job).
                "--session-timeout-s": "15",
                **overrides,
            }
        )

    def leo(self, topic: str, p: int = 0) -> float:
        return self.metric("strom_storage_log_end_offset", topic=topic, partition=str(p))

    def hw(self, topic: str, p: int = 0) -> float:
        return self.metric("strom_storage_high_watermark", topic=topic, partition=str(p))


class ReplCluster(Cluster):
    def node(self, node_id: int) -> ReplNode:
        if node_id not in self.nodes:
            self.nodes[node_id] = ReplNode(node_id, self.etcd.endpoint, self.root)
        return self.nodes[node_id]  # type: ignore[return-value]

    def state(self, topic: str, p: int = 0) -> md.PartitionState:
        cur = self.store.get(self.store.keys.partition(topic, p), md.PartitionState)
        assert cur is not None
        return cur.value

    def set_state(
        self, topic: str, p: int = 0, *, bump_epoch: bool = False, **changes: object
    ) -> md.PartitionState:
        """Overwrite fields (retrying the CAS: leaders and the controller change the state
        concurrently); ``bump_epoch`` sets leader_epoch to the current one + 1."""

        def attempt() -> md.PartitionState | None:
            key = self.store.keys.partition(topic, p)
            cur = self.store.get(key, md.PartitionState)
            assert cur is not None
            state = cur.value
            for k, v in changes.items():
                if isinstance(v, list):
                    del getattr(state, k)[:]
                    getattr(state, k).extend(v)
                else:
                    setattr(state, k, v)
            if bump_epoch:
                state.leader_epoch += 1
            state.partition_epoch += 1
            return state if self.store.cas(key, state, cur.mod_revision) else None

        return wait_for(attempt, timeout=10, what=f"state change of {topic}-{p}")

    def leader(self, topic: str, p: int = 0) -> ReplNode:
        return self.node(self.state(topic, p).leader)

    def produce_to_leader(self, topic: str, records: bytes, acks: int = -1) -> None:
        """Produce to whoever leads now (the controller may move leadership back to the
        preferred replica at any time), at its epoch, until accepted."""

        def attempt() -> bool:
            st = self.state(topic)
            r = produce_one(
                self.node(st.leader), topic, 0, records, acks=acks, epoch=st.leader_epoch
            )
            return r.error_code == E.NONE

        wait_for(attempt, timeout=20, what=f"a produce to the leader of {topic}")


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplCluster]:
    root = tmp_path_factory.mktemp("repl")
    etcd = EtcdServer(root).start()
    ctl_port = free_port()
    controller = ManagedProcess(
        "controller",
        [
            sys.executable,
            "-m",
            "strom.cli.main",
            "controller",
            "--etcd",
            etcd.endpoint,
            "--listen",
            f"127.0.0.1:{ctl_port}",
            "--metrics-port",
            str(free_port()),
            "--cluster",
            CLUSTER,
            "--controller-id",
            "0",
        ],
        root / "controller.log",
    ).start()
    store = MetadataStore(etcd.endpoint, CLUSTER)
    c: ReplCluster | None = None
    try:
        wait_for(
            lambda: (
                store.get(store.keys.controller, md.ControllerInfo) is not None
                and store.get(store.keys.cluster, md.ClusterInfo) is not None
            ),
            timeout=30,
            what="an active controller",
        )
        c = ReplCluster(etcd, root)
        for node_id in (1, 2, 3):
            c.node(node_id).start()
        yield c
    finally:
        if c is not None:
            for n in c.nodes.values():
                if n.proc is not None and n.proc.alive():
                    n.proc.signal(signal.SIGCONT)
                n.close()
            c.store.close()
        controller.kill()
        store.close()
        etcd.kill()


def _topic(rc: ReplCluster, name: str, min_isr: int = 2) -> None:
    rc.create_topic(name, {0: [1, 2, 3]}, {"min.insync.replicas": str(min_isr)})
    leader = rc.node(1)

    def ready() -> bool:
        r = produce_one(leader, name, 0, batch([b"probe"]), acks=1)
        return r.error_code == E.NONE

    wait_for(ready, timeout=20, what=f"{name} led by node 1")


def _converged(rc: ReplCluster, topic: str, leader: int = 1) -> None:
    want = rc.node(leader).leo(topic)

    def ok() -> bool:
        return all(rc.node(i).leo(topic) == want for i in (1, 2, 3)) and all(
            rc.node(i).hw(topic) == want for i in (1, 2, 3)
        )

    wait_for(ok, timeout=20, what=f"{topic}: all replicas at LEO = HW = {want}")


def test_followers_catch_up_and_acks_all_waits_for_them(rc: ReplCluster) -> None:
    _topic(rc, "r-basic")
    leader = rc.node(1)
    for i in range(5):
        r = produce_one(leader, "r-basic", 0, batch([b"v%d" % i, b"w%d" % i]), acks=-1)
        assert r.error_code == E.NONE, r.error_message
        # acks=all answers only once every ISR member has it: the HW is past the batch.
        assert leader.hw("r-basic") >= r.base_offset + 2
    _converged(rc, "r-basic")
    got = values_of(fetch_one(leader, "r-basic", 0, 0).records)
    assert [v for _, v in got] == [b"probe"] + [
        x for i in range(5) for x in (b"v%d" % i, b"w%d" % i)
    ]
    # Followers refuse produces and consumer fetches, naming the leader.
    r = produce_one(rc.node(2), "r-basic", 0, batch([b"x"]), acks=1)
    assert r.error_code == E.NOT_LEADER_OR_FOLLOWER and r.current_leader.leader_id == 1
    f = fetch_one(rc.node(3), "r-basic", 0, 0)
    assert f.error_code == E.NOT_LEADER_OR_FOLLOWER and f.current_leader.leader_id == 1


def test_paused_follower_leaves_and_rejoins_the_isr(rc: ReplCluster) -> None:
    _topic(rc, "r-isr")
    leader, f3 = rc.node(1), rc.node(3)
    _converged(rc, "r-isr")
    shrinks = leader.metric("strom_storage_isr_shrinks_total")
    assert f3.proc is not None
    f3.proc.signal(signal.SIGSTOP)
    try:
        # acks=all keeps working with min.insync.replicas=2: the produce waits until the
        # leader has dropped node 3 from the ISR (committed in etcd), then completes.
        r = produce_one(leader, "r-isr", 0, batch([b"a"]), acks=-1, timeout_ms=20_000)
        assert r.error_code == E.NONE, r.error_message
        assert list(rc.state("r-isr").isr) == [1, 2]
        assert leader.metric("strom_storage_isr_shrinks_total") >= shrinks + 1
        wait_for(
            lambda: leader.metric("strom_storage_under_replicated_partitions") >= 1,
            timeout=5,
            what="under-replicated gauge",
        )
        for i in range(3):
            r = produce_one(leader, "r-isr", 0, batch([b"b%d" % i]), acks=-1)
            assert r.error_code == E.NONE, r.error_message
    finally:
        f3.proc.signal(signal.SIGCONT)
    wait_for(
        lambda: list(rc.state("r-isr").isr) == [1, 2, 3],
        timeout=20,
        what="node 3 back in the ISR",
    )
    _converged(rc, "r-isr")
    wait_for(
        lambda: leader.metric("strom_storage_isr_expands_total") >= 1,
        timeout=5,
        what="ISR expansion counted",
    )


def test_min_insync_replicas_refuses_acks_all_before_appending(rc: ReplCluster) -> None:
    _topic(rc, "r-min", min_isr=3)
    leader, f2 = rc.node(1), rc.node(2)
    _converged(rc, "r-min")
    assert f2.proc is not None
    f2.proc.signal(signal.SIGSTOP)
    try:
        r = produce_one(leader, "r-min", 0, batch([b"lag"]), acks=1)
        assert r.error_code == E.NONE
        wait_for(lambda: list(rc.state("r-min").isr) == [1, 3], timeout=20, what="node 2 dropped")
        wait_for(
            lambda: (
                produce_one(leader, "r-min", 0, batch([b"no"]), acks=-1, timeout_ms=100).error_code
                == E.NOT_ENOUGH_REPLICAS
            ),
            timeout=10,
            what="NOT_ENOUGH_REPLICAS",
        )
        # The check comes before the append: a refused produce leaves the log as it was.
        before = leader.leo("r-min")
        r = produce_one(leader, "r-min", 0, batch([b"no"]), acks=-1)
        assert r.error_code == E.NOT_ENOUGH_REPLICAS
        assert leader.leo("r-min") == before
    finally:
        f2.proc.signal(signal.SIGCONT)
    wait_for(lambda: list(rc.state("r-min").isr) == [1, 2, 3], timeout=20, what="node 2 back")


def test_old_leader_truncates_its_divergent_tail(rc: ReplCluster) -> None:
    _topic(rc, "r-div")
    n1, n2, n3 = rc.node(1), rc.node(2), rc.node(3)
    for i in range(3):
        assert produce_one(n1, "r-div", 0, batch([b"c%d" % i]), acks=-1).error_code == E.NONE
    _converged(rc, "r-div")
    assert n2.proc is not None and n3.proc is not None
    n2.proc.signal(signal.SIGSTOP)
    n3.proc.signal(signal.SIGSTOP)
    try:
        # Make the followers lag, and wait until node 1 has dropped them: their parked
        # fetches have been answered by then, so nothing written next can reach them.
        assert produce_one(n1, "r-div", 0, batch([b"maybe"]), acks=1).error_code == E.NONE
        wait_for(lambda: list(rc.state("r-div").isr) == [1], timeout=20, what="ISR [1]")
        r = produce_one(n1, "r-div", 0, batch([b"lost-1", b"lost-2"]), acks=1)
        assert r.error_code == E.NONE
        # Leadership moves to node 2 (as a controller failover would do).
        rc.set_state("r-div", bump_epoch=True, leader=2, isr=[2, 3])
        # The old leader learns it from the watch and refuses writes from now on.
        wait_for(
            lambda: (
                produce_one(n1, "r-div", 0, batch([b"z"]), acks=1).error_code
                == E.NOT_LEADER_OR_FOLLOWER
            ),
            timeout=10,
            what="node 1 refusing produces",
        )
    finally:
        n2.proc.signal(signal.SIGCONT)
        n3.proc.signal(signal.SIGCONT)
    rc.produce_to_leader("r-div", batch([b"new"]))
    # Node 1 truncates via the epoch history and follows node 2 again, then rejoins (the
    # controller may then give it its preferred leadership back: ask etcd who leads).
    wait_for(lambda: list(rc.state("r-div").isr) == [1, 2, 3], timeout=20, what="node 1 in the ISR")
    _converged(rc, "r-div", leader=rc.state("r-div").leader)
    # (Not "node 1's end offset moved": the new leader's log can reach the divergent length,
    # e.g. when a produce above was retried after a timeout. The content is checked below.)
    leader_values = _values(rc.leader("r-div"), "r-div")
    assert b"lost-1" not in leader_values and b"new" in leader_values
    # Leadership on node 1 (if not there already): it serves exactly the converged log.
    if rc.state("r-div").leader != 1:
        rc.set_state("r-div", bump_epoch=True, leader=1, isr=[1, 2, 3])
    wait_for(
        lambda: (
            fetch_one(n1, "r-div", 0, 0).error_code == E.NONE
            and _values(n1, "r-div") == leader_values
        ),
        timeout=20,
        what="node 1 serving the converged log",
    )


def test_leader_epochs_are_fenced(rc: ReplCluster) -> None:
    _topic(rc, "r-fence")
    leader = rc.node(1)
    epoch = rc.state("r-fence").leader_epoch
    st = rc.set_state("r-fence", bump_epoch=True)
    wait_for(
        lambda: (
            produce_one(leader, "r-fence", 0, batch([b"x"]), epoch=st.leader_epoch).error_code
            == E.NONE
        ),
        timeout=10,
        what="node 1 at the new epoch",
    )
    r = produce_one(leader, "r-fence", 0, batch([b"old"]), epoch=epoch)
    assert r.error_code == E.FENCED_LEADER_EPOCH
    r = produce_one(leader, "r-fence", 0, batch([b"new"]), epoch=st.leader_epoch + 5)
    assert r.error_code == E.UNKNOWN_LEADER_EPOCH
    f = fetch_one(leader, "r-fence", 0, 0, epoch=epoch)
    assert f.error_code == E.FENCED_LEADER_EPOCH
    # Followers follow the new epoch too: acks=all still completes.
    r = produce_one(leader, "r-fence", 0, batch([b"y"]), acks=-1, epoch=st.leader_epoch)
    assert r.error_code == E.NONE, r.error_message


def _values(node: Node, topic: str) -> list[bytes]:
    f = fetch_one(node, topic, 0, 0)
    assert f.error_code == E.NONE, f.error_message
    return [v for _, v in values_of(f.records)]


def test_paused_old_leader_cannot_commit_after_losing_leadership(rc: ReplCluster) -> None:
    _topic(rc, "r-zombie")
    n1, n2 = rc.node(1), rc.node(2)
    assert produce_one(n1, "r-zombie", 0, batch([b"ok"]), acks=-1).error_code == E.NONE
    _converged(rc, "r-zombie")
    assert n1.proc is not None
    n1.proc.signal(signal.SIGSTOP)
    try:
        old = rc.state("r-zombie")
        st = rc.set_state("r-zombie", bump_epoch=True, leader=2, isr=[2, 3])
        wait_for(
            lambda: (
                produce_one(
                    n2, "r-zombie", 0, batch([b"new"]), acks=-1, epoch=st.leader_epoch
                ).error_code
                == E.NONE
            ),
            timeout=20,
            what="node 2 leading with node 3 in sync",
        )
    finally:
        n1.proc.signal(signal.SIGCONT)
    # Right after waking, node 1 may still believe it leads: acks=all must not succeed there.
    # (The client believes the old epoch, as the zombie does.)
    r = produce_one(
        n1, "r-zombie", 0, batch([b"zombie"]), acks=-1, timeout_ms=3000, epoch=old.leader_epoch
    )
    assert r.error_code in (
        E.NOT_LEADER_OR_FOLLOWER,
        E.REQUEST_TIMED_OUT,
        E.FENCED_LEADER_EPOCH,
    ), r
    wait_for(lambda: list(rc.state("r-zombie").isr) == [1, 2, 3], timeout=20, what="node 1 rejoins")
    _converged(rc, "r-zombie", leader=rc.state("r-zombie").leader)
    assert _values(rc.leader("r-zombie"), "r-zombie") == [b"probe", b"ok", b"new"]


def test_sigterm_on_a_leader_asks_the_controller_then_stops_cleanly(rc: ReplCluster) -> None:
    """Last in the module: node 1 goes away. Whether the controller implements
    ControlledShutdown or not (UNIMPLEMENTED), the node stops within a bounded time."""
    _topic(rc, "r-stop")
    n1 = rc.node(1)
    assert n1.proc is not None
    n1.proc.signal(signal.SIGTERM)
    wait_for(lambda: not n1.proc.alive(), timeout=20, what="node 1 to stop")  # type: ignore[union-attr]
    text = (rc.root / "node-1.log").read_text()
    assert "ControlledShutdown" in text or "controlled shutdown" in text
    assert "stopped cleanly" in text
    if "leads no partition any more" in text:  # the controller moved its leaderships first
        assert rc.state("r-stop").leader in (2, 3)
