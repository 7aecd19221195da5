"""Leader failover, controlled shutdown, preferred and unclean elections and reassignment,
against a real etcd and real controller processes.

Storage nodes are registrations under leases kept alive (revoking a lease is a node's death),
as in test_controller.py; the tests play the partition leader's part by calling AlterPartition.
Every wait polls a condition; nothing sleeps for a guessed duration.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from strom.api import common_pb2
from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.devcluster.procs import EtcdServer, wait_for
from strom.errors import ErrorCode
from strom.metadata import KeepAlive, MetadataStore
from tests.integration.test_controller import Controller, _describe, _results, _start, _topic

pytestmark = pytest.mark.integration
E = ErrorCode


class Nodes:
    """Fake storage nodes: registrations under leases kept alive (revoke = death)."""

    def __init__(self, etcd: EtcdServer, cluster: str) -> None:
        self.store = MetadataStore(etcd.endpoint, cluster)
        self.alive: dict[int, tuple[object, KeepAlive]] = {}
        self.regs: dict[int, md.NodeRegistration] = {}

    def add(self, node_id: int, ttl_s: int = 10) -> md.NodeRegistration:
        lease = self.store.grant_lease(ttl_s)
        reg = md.NodeRegistration(
            node_id=node_id,
            host="127.0.0.1",
            port=20000 + node_id,
            incarnation_id=str(uuid.uuid4()),
            start_time_ms=int(time.time() * 1000),
            state=md.NODE_STATE_RUNNING,
            software_version="test",
        )
        self.store.put(self.store.keys.node(node_id), reg, lease=lease)
        self.alive[node_id] = (lease, self.store.keep_alive(lease, lambda: None))
        self.regs[node_id] = reg
        return reg

    def set_state(self, node_id: int, state: int) -> None:
        lease, _ = self.alive[node_id]
        self.regs[node_id].state = state
        self.store.put(self.store.keys.node(node_id), self.regs[node_id], lease=lease)

    def kill(self, node_id: int, *, revoke: bool = True) -> None:
        """Revoke the node's lease (or, revoke=False, stop renewing it: a SIGKILL)."""
        self.alive.pop(node_id)[1].stop(revoke=revoke)

    def close(self) -> None:
        for _, ka in self.alive.values():
            ka.stop(revoke=True)
        self.store.close()


@pytest.fixture
def cluster() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def controllers() -> Iterator[list[Controller]]:
    started: list[Controller] = []
    yield started
    for c in started:
        c.close()


@pytest.fixture
def nodes(etcd: EtcdServer, cluster: str) -> Iterator[Nodes]:
    n = Nodes(etcd, cluster)
    yield n
    n.close()


def _state(ctl: Controller, topic: str, p: int = 0) -> md.PartitionState:
    return _describe(ctl.stub, topic).partitions[p].state


def _etcd_state(nodes: Nodes, topic: str, p: int = 0) -> md.PartitionState:
    v = nodes.store.get(nodes.store.keys.partition(topic, p), md.PartitionState)
    assert v is not None
    return v.value


def _alter_isr(ctl: Controller, nodes: Nodes, topic: str, isr: list[int], p: int = 0) -> None:
    """Play the leader: propose ``isr`` with the current epochs."""
    st = _state(ctl, topic, p)
    resp = ctl.stub.AlterPartition(
        pb.AlterPartitionRequest(
            leader_id=st.leader,
            leader_incarnation=nodes.regs[st.leader].incarnation_id,
            partitions=[
                pb.AlterPartitionItem(
                    topic=topic,
                    partition=p,
                    topic_id=st.topic_id,
                    leader_epoch=st.leader_epoch,
                    partition_epoch=st.partition_epoch,
                    new_isr=isr,
                )
            ],
        )
    )
    assert resp.error_code == E.NONE, resp.error_message
    assert resp.partitions[0].error_code == E.NONE, resp.partitions[0].error_message


def _create(ctl: Controller, name: str, replicas: list[int], **configs: str) -> None:
    t = _topic(name, **configs)
    t.num_partitions = -1
    t.replication_factor = -1
    t.assignments.add(partition=0, replicas=replicas)
    r = _results(ctl.stub.CreateTopics(pb.CreateTopicsRequest(topics=[t])))[name]
    assert r.error_code == E.NONE, r.error_message


def test_failover_shutdown_and_preferred_leader(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    for n in (1, 2, 3):
        nodes.add(n)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    _create(ctl, "t", [1, 2, 3])
    _create(ctl, "solo", [1])
    _create(ctl, "dirty", [1, 2], **{"unclean.leader.election.enable": "true"})
    _alter_isr(ctl, nodes, "dirty", [1])  # node 2 fell behind
    before = _etcd_state(nodes, "t")
    assert (before.leader, list(before.isr)) == (1, [1, 2, 3])

    # -- the leader dies: the next ISR member leads, epoch + 1, node 1 leaves the ISR
    started = time.monotonic()
    nodes.kill(1)
    wait_for(lambda: _etcd_state(nodes, "t").leader == 2, timeout=10, what="node 2 leads t-0")
    failover = time.monotonic() - started
    print(f"\nfailover: lease revoked -> new leader committed in {failover * 1000:.0f} ms")
    after = _etcd_state(nodes, "t")
    assert list(after.isr) == [2, 3]
    assert after.leader_epoch == before.leader_epoch + 1
    assert after.partition_epoch > before.partition_epoch
    assert failover < 2.0
    # no live ISR member: offline, the ISR keeps the last member
    wait_for(lambda: _etcd_state(nodes, "solo").leader == -1, timeout=10, what="solo offline")
    assert list(_etcd_state(nodes, "solo").isr) == [1]
    # unclean election enabled: node 2 leads alone, RECOVERING
    wait_for(lambda: _etcd_state(nodes, "dirty").leader == 2, timeout=10, what="dirty unclean")
    dirty = _etcd_state(nodes, "dirty")
    assert list(dirty.isr) == [2]
    assert dirty.leader_recovery_state == md.LEADER_RECOVERY_STATE_RECOVERING
    desc = _describe(ctl.stub, "t")
    assert list(desc.partitions[0].offline_replicas) == [1]
    wait_for(
        lambda: "strom_controller_offline_partitions 1.0" in ctl.metrics(),
        timeout=10,
        what="offline gauge",
    )
    text = ctl.metrics()
    assert 'strom_controller_leader_elections_total{reason="failure"}' in text
    assert 'strom_controller_leader_elections_total{reason="unclean"} 1.0' in text
    assert "strom_controller_failover_seconds_count" in text

    # -- node 1 comes back: not leader until it is in the ISR, then preferred leader again
    nodes.add(1)
    wait_for(lambda: _etcd_state(nodes, "solo").leader == 1, timeout=10, what="solo back")
    assert _etcd_state(nodes, "t").leader == 2
    # A replica that is not alive cannot join the ISR.
    st = _state(ctl, "t")
    resp = ctl.stub.AlterPartition(
        pb.AlterPartitionRequest(
            leader_id=2,
            leader_incarnation=nodes.regs[2].incarnation_id,
            partitions=[
                pb.AlterPartitionItem(
                    topic="t",
                    partition=0,
                    topic_id=st.topic_id,
                    leader_epoch=st.leader_epoch,
                    partition_epoch=st.partition_epoch,
                    new_isr=[2, 3, 9],
                )
            ],
        )
    )
    assert resp.partitions[0].error_code == E.INVALID_REQUEST  # 9 is not even a replica
    _alter_isr(ctl, nodes, "t", [1, 2, 3])
    wait_for(lambda: _etcd_state(nodes, "t").leader == 1, timeout=10, what="preferred back")
    assert _etcd_state(nodes, "t").leader_epoch == before.leader_epoch + 2

    # -- controlled shutdown of node 1: leadership moves, it leaves the ISR
    resp = ctl.stub.ControlledShutdown(
        pb.ControlledShutdownRequest(node_id=1, incarnation_id=nodes.regs[1].incarnation_id)
    )
    assert resp.error_code == E.NONE, resp.error_message
    assert [(tp.topic, tp.partition) for tp in resp.remaining_partitions] == [("solo", 0)]
    st = _etcd_state(nodes, "t")
    assert st.leader == 2 and list(st.isr) == [2, 3]
    stale = ctl.stub.ControlledShutdown(pb.ControlledShutdownRequest(node_id=1, incarnation_id="x"))
    assert stale.error_code == E.STALE_NODE_INCARNATION

    # -- SHUTTING_DOWN in the registration does the same for node 2
    nodes.set_state(2, md.NODE_STATE_SHUTTING_DOWN)
    wait_for(lambda: _etcd_state(nodes, "t").leader == 3, timeout=10, what="node 3 leads")
    assert list(_etcd_state(nodes, "t").isr) == [3]


def test_elect_leaders_and_reassignment(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    for n in (1, 2, 3, 4):
        nodes.add(n)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    _create(ctl, "t", [1, 2])
    _create(ctl, "u", [3, 4])
    nodes.kill(1)
    wait_for(lambda: _etcd_state(nodes, "t").leader == 2, timeout=10, what="node 2 leads")

    # -- preferred election: not available while node 1 is out of the ISR
    r = ctl.stub.ElectLeaders(
        pb.ElectLeadersRequest(partitions=[common_pb2.TopicPartition(topic="t")])
    )
    assert r.error_code == E.NONE
    assert r.partitions[0].error_code == E.PREFERRED_LEADER_NOT_AVAILABLE
    r = ctl.stub.ElectLeaders(pb.ElectLeadersRequest())
    by_tp = {(x.topic, x.partition): x for x in r.partitions}
    assert by_tp[("u", 0)].error_code == E.ELECTION_NOT_NEEDED
    assert by_tp[("u", 0)].leader == 3
    r = ctl.stub.ElectLeaders(
        pb.ElectLeadersRequest(partitions=[common_pb2.TopicPartition(topic="nope", partition=0)])
    )
    assert r.partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION

    # -- unclean election on request: u-0 loses both replicas' ISR except a dead one
    _alter_isr(ctl, nodes, "u", [3])
    nodes.kill(3)
    wait_for(lambda: _etcd_state(nodes, "u").leader == -1, timeout=10, what="u offline")
    r = ctl.stub.ElectLeaders(
        pb.ElectLeadersRequest(
            election_type=pb.ELECTION_TYPE_UNCLEAN,
            partitions=[common_pb2.TopicPartition(topic="u", partition=0)],
        )
    )
    assert r.partitions[0].error_code == E.NONE and r.partitions[0].leader == 4
    st = _etcd_state(nodes, "u")
    assert st.leader == 4 and st.leader_recovery_state == md.LEADER_RECOVERY_STATE_RECOVERING

    # -- reassignment t-0: [2] (1 is dead, out of ISR) -> [4, 2]
    r = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[
                pb.PartitionReassignment(topic="t", partition=0, replicas=[4, 2]),
            ]
        )
    )
    assert r.error_code == E.NONE and r.partitions[0].error_code == E.NONE
    st = _etcd_state(nodes, "t")
    assert list(st.replicas) == [4, 2, 1]
    assert list(st.adding_replicas) == [4] and list(st.removing_replicas) == [1]
    listed = ctl.stub.ListPartitionReassignments(pb.ListPartitionReassignmentsRequest())
    assert [(x.topic, list(x.adding_replicas)) for x in listed.reassignments] == [("t", [4])]
    bad = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[
                pb.PartitionReassignment(topic="u", partition=0, replicas=[4, 4]),
                pb.PartitionReassignment(topic="t", partition=3, replicas=[4]),
            ]
        )
    )
    codes = [x.error_code for x in bad.partitions]
    assert codes == [E.INVALID_REPLICA_ASSIGNMENT, E.UNKNOWN_TOPIC_OR_PARTITION]
    bad = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[pb.PartitionReassignment(topic="u", partition=0, replicas=[9])]
        )
    )
    assert bad.partitions[0].error_code == E.INVALID_REPLICA_ASSIGNMENT
    # The new replica catches up (the leader adds it to the ISR): the move completes and the
    # preferred replica (4) takes over.
    _alter_isr(ctl, nodes, "t", [2, 4])
    wait_for(lambda: list(_etcd_state(nodes, "t").replicas) == [4, 2], timeout=10, what="move done")
    wait_for(lambda: _etcd_state(nodes, "t").leader == 4, timeout=10, what="4 leads t-0")
    assert not ctl.stub.ListPartitionReassignments(
        pb.ListPartitionReassignmentsRequest()
    ).reassignments
    # start then cancel
    r = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[pb.PartitionReassignment(topic="t", partition=0, replicas=[2])]
        )
    )
    assert r.partitions[0].error_code == E.NONE
    # [4, 2] -> [2]: both already in the ISR, so it completes at once
    wait_for(lambda: list(_etcd_state(nodes, "t").replicas) == [2], timeout=10, what="shrunk")
    assert _etcd_state(nodes, "t").leader == 2
    r = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[pb.PartitionReassignment(topic="t", partition=0, replicas=[2, 4])]
        )
    )
    assert list(_etcd_state(nodes, "t").adding_replicas) == [4]
    r = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[pb.PartitionReassignment(topic="t", partition=0, cancel=True)]
        )
    )
    assert r.partitions[0].error_code == E.NONE
    st = _etcd_state(nodes, "t")
    assert list(st.replicas) == [2] and not st.adding_replicas and st.leader == 2
    # t was created with 2 replicas and now has 1: new partitions get 1, as describe shows.
    grown = ctl.stub.CreatePartitions(
        pb.CreatePartitionsRequest(topics=[pb.CreatePartitionsTopic(name="t", count=2)])
    )
    assert grown.topics[0].error_code == E.NONE, grown.topics[0].error_message
    assert len(_etcd_state(nodes, "t", 1).replicas) == 1

    # Found from outside: a cancel put the replicas back in another order (the removed ones
    # last), so the preferred leader changed and auto-rebalance moved leadership.
    nodes.add(5)
    _create(ctl, "v", [2, 4])
    r = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[pb.PartitionReassignment(topic="v", partition=0, replicas=[5, 4])]
        )
    )
    assert r.partitions[0].error_code == E.NONE
    before = _etcd_state(nodes, "v")
    assert list(before.replicas) == [5, 4, 2] and before.leader == 2  # 5 is not in sync
    r = ctl.stub.AlterPartitionReassignments(
        pb.AlterPartitionReassignmentsRequest(
            partitions=[pb.PartitionReassignment(topic="v", partition=0, cancel=True)]
        )
    )
    assert r.partitions[0].error_code == E.NONE
    st = _etcd_state(nodes, "v")
    assert list(st.replicas) == [2, 4] and list(st.isr) == [2, 4]
    assert st.leader == 2 and st.leader_epoch == before.leader_epoch


def test_standby_reconciles_a_node_that_died_meanwhile(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    for n in (1, 2):
        nodes.add(n)
    a = _start(controllers, etcd, tmp_path, cluster, 1)
    a.wait_active()
    _create(a, "t", [1, 2])
    a.close()  # SIGKILL: its lease expires after the session timeout
    nodes.kill(1)  # dies while no controller is active
    assert _etcd_state(nodes, "t").leader == 1
    b = _start(controllers, etcd, tmp_path, cluster, 2)
    b.wait_active()
    wait_for(lambda: _etcd_state(nodes, "t").leader == 2, timeout=10, what="reconciled")
    st = _etcd_state(nodes, "t")
    assert list(st.isr) == [2] and st.leader_epoch == 1


def test_failover_time_with_many_partitions(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    for n in (1, 2, 3):
        nodes.add(n)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    r = _results(ctl.stub.CreateTopics(pb.CreateTopicsRequest(topics=[_topic("big", 300, 3)])))
    assert r["big"].error_code == E.NONE, r["big"].error_message
    keys = nodes.store.keys

    def states() -> list[md.PartitionState]:
        _, items = nodes.store.get_prefix(keys.partitions_of("big"), md.PartitionState)
        return [v.value for v in items.values()]

    led = sum(s.leader == 1 for s in states())
    assert led >= 90
    started = time.monotonic()
    nodes.kill(1)
    wait_for(
        lambda: all(s.leader not in (1, -1) and 1 not in s.isr for s in states()),
        timeout=10,
        interval=0.01,
        what="all partitions moved off node 1",
    )
    took = time.monotonic() - started
    print(f"\nfailover of {led} leaderships (300 partitions): {took * 1000:.0f} ms")
    assert took < 2.0


def test_a_dead_nodes_leaderships_split_over_the_survivors(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    """Found from outside: 2,000 partitions, RF 3 on 3 nodes; node 3 killed, all 667 of its
    leaderships went to node 1, because every partition it led had node 1 first behind it.
    Placement now spreads each leader's first followers, which the controller elects."""
    for n in (1, 2, 3):
        nodes.add(n)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    r = _results(ctl.stub.CreateTopics(pb.CreateTopicsRequest(topics=[_topic("t", 30, 3)])))
    assert r["t"].error_code == E.NONE, r["t"].error_message
    keys = nodes.store.keys

    def states() -> list[md.PartitionState]:
        _, items = nodes.store.get_prefix(keys.partitions_of("t"), md.PartitionState)
        return [v.value for v in items.values()]

    assert sum(s.leader == 3 and s.replicas[0] == 3 for s in states()) == 10
    nodes.kill(3)
    wait_for(
        lambda: all(s.leader not in (3, -1) for s in states()),
        timeout=10,
        what="all partitions moved off node 3",
    )
    moved = Counter(s.leader for s in states() if s.replicas[0] == 3)
    assert sum(moved.values()) == 10 and set(moved.values()) == {5}, moved


def test_enabling_unclean_election_elects_offline_partitions(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    for n in (1, 2):
        nodes.add(n)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    _create(ctl, "w", [1, 2])
    _alter_isr(ctl, nodes, "w", [1])
    nodes.kill(1)
    wait_for(lambda: _etcd_state(nodes, "w").leader == -1, timeout=10, what="w offline")
    resp = ctl.stub.AlterConfigs(
        pb.AlterConfigsRequest(
            resources=[
                pb.AlterConfigsResource(
                    resource_type=pb.RESOURCE_TYPE_TOPIC,
                    resource_name="w",
                    configs=[
                        pb.AlterableConfig(
                            name="unclean.leader.election.enable",
                            op=pb.ALTER_CONFIG_OP_SET,
                            value="true",
                        )
                    ],
                )
            ]
        )
    )
    assert resp.error_code == E.NONE and resp.results[0].error_code == E.NONE
    wait_for(lambda: _etcd_state(nodes, "w").leader == 2, timeout=10, what="unclean leader")


def test_failover_on_lease_expiry(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    """A SIGKILLed node: its lease (TTL 2 s, etcd's minimum) expires, then leadership moves."""
    nodes.add(1, ttl_s=2)
    nodes.add(2)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    _create(ctl, "k", [1, 2])
    started = time.monotonic()
    nodes.kill(1, revoke=False)
    wait_for(lambda: _etcd_state(nodes, "k").leader == 2, timeout=10, interval=0.01, what="moved")
    took = time.monotonic() - started
    print(f"\nfailover after the last lease renewal (TTL 2 s): {took * 1000:.0f} ms")
    assert took < 5.0


def test_a_partition_change_is_reconciled_by_a_pass_over_its_topic_only(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    """After changes of partition states (not of nodes), a pass reads just their topics
    (strom.controller.reconcile), and decides what a full pass would."""
    for n in (1, 2):
        nodes.add(n)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    _create(ctl, "narrow-a", [1, 2])
    _create(ctl, "narrow-b", [1, 2])

    def passes(scope: str) -> float:
        name = "strom_controller_reconcile_passes_total"
        return sum(
            s.value
            for fam in text_string_to_metric_families(ctl.metrics())
            for s in fam.samples
            if s.name == name and s.labels.get("scope") == scope
        )

    wait_for(lambda: passes("topics") >= 1, timeout=10, what="a pass over the new topics")
    full = passes("all")
    narrow = passes("topics")
    # A state whose leader (3) is not a live node: a leader must be elected from the ISR.
    key = nodes.store.keys.partition("narrow-b", 0)
    current = nodes.store.get(key, md.PartitionState)
    assert current is not None
    broken = md.PartitionState()
    broken.CopyFrom(current.value)
    broken.leader = 3
    broken.leader_epoch += 1
    del broken.isr[:]
    broken.isr.extend([3, 2])
    nodes.store.put(key, broken)
    wait_for(
        lambda: _etcd_state(nodes, "narrow-b").leader == 2, timeout=10, what="narrow-b led by 2"
    )
    fixed = _etcd_state(nodes, "narrow-b")
    assert list(fixed.isr) == [2] and fixed.leader_epoch > broken.leader_epoch
    assert passes("topics") > narrow
    assert passes("all") == full  # no node changed: nothing read every partition
    assert _etcd_state(nodes, "narrow-a").leader == 1  # the other topic is as it was


def test_a_starting_node_does_not_lead_a_new_partition(
    etcd: EtcdServer, tmp_path: Path, cluster: str, controllers: list[Controller], nodes: Nodes
) -> None:
    """Found from outside: at `strom dev up` topics were created with node 1, still STARTING,
    as leader; reconciliation moved leadership away at once and dropped node 1 from the ISR,
    counted as controlled_shutdown elections on a cluster where nothing shut down."""
    for n in (1, 2, 3):
        nodes.add(n)
    nodes.set_state(1, md.NODE_STATE_STARTING)
    ctl = _start(controllers, etcd, tmp_path, cluster, 1)
    ctl.wait_active()
    _create(ctl, "young", [1, 2, 3])
    st = _etcd_state(nodes, "young")
    assert (list(st.replicas), st.leader, list(st.isr)) == ([1, 2, 3], 2, [2, 3])
    assert st.leader_epoch == 0
    grown = ctl.stub.CreatePartitions(
        pb.CreatePartitionsRequest(
            topics=[
                pb.CreatePartitionsTopic(
                    name="young",
                    count=2,
                    assignments=[pb.ReplicaAssignment(partition=1, replicas=[1, 3, 2])],
                )
            ]
        )
    )
    assert grown.topics[0].error_code == E.NONE, grown.topics[0].error_message
    st = _etcd_state(nodes, "young", 1)
    assert (list(st.replicas), st.leader, list(st.isr)) == ([1, 3, 2], 3, [3, 2])

    # A leader registered again as STARTING (a restart within its lease) hands over as after
    # a failure, not as a controlled shutdown.
    nodes.set_state(1, md.NODE_STATE_RUNNING)
    _alter_isr(ctl, nodes, "young", [1, 2, 3])
    elected = ctl.stub.ElectLeaders(
        pb.ElectLeadersRequest(
            election_type=pb.ELECTION_TYPE_PREFERRED,
            partitions=[common_pb2.TopicPartition(topic="young", partition=0)],
        )
    )
    assert elected.partitions[0].leader == 1, elected.partitions[0].error_message
    nodes.set_state(1, md.NODE_STATE_STARTING)
    wait_for(lambda: _etcd_state(nodes, "young").leader == 2, timeout=10, what="node 2 leads")
    text = ctl.metrics()
    assert 'strom_controller_leader_elections_total{reason="controlled_shutdown"} 0.0' in text
    assert 'strom_controller_leader_elections_total{reason="failure"} 1.0' in text
