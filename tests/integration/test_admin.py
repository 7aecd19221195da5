"""The Admin client against a real local cluster (etcd, a controller, three storage nodes on
three racks), one cluster for the whole module: every public method, and the errors users hit
(unknown topic, topic exists, bad config, shrinking partitions, deleting past the high
watermark). Test data goes in with raw Produce RPCs, so these tests do not depend on the
Producer. Every wait polls a condition."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from strom.api import storage_pb2
from strom.cli.main import main as strom_main
from strom.client.admin import (
    Admin,
    ConfigSource,
    NewTopic,
    NodeState,
    Reassignment,
)
from strom.client.cluster import ClusterClient
from strom.client.types import OffsetAndTimestamp, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import (
    BrokerNotAvailableError,
    ElectionNotNeededError,
    ErrorCode,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    NoReassignmentInProgressError,
    OffsetOutOfRangeError,
    PartialResultError,
    PolicyViolationError,
    StromError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    is_retriable,
)
from strom.record import encode_batch

pytestmark = pytest.mark.integration

RACKS = ["rack-a", "rack-b", "rack-c"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("admin") / "cluster", nodes=3, controllers=1, racks=RACKS
    )
    try:
        c.start()
        yield c
    finally:
        c.kill()


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap=cluster.bootstrap, request_timeout_ms=15_000) as a:
        yield a


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[ClusterClient]:
    with ClusterClient(cluster.bootstrap) as c:
        yield c


def _produce(
    client: ClusterClient, topic: str, partition: int, values: list[bytes], timestamps: list[int]
) -> int:
    """One batch with acks=all (so the high watermark covers it); returns its base offset."""
    req = storage_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=topic,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=partition,
                        records=encode_batch(values, timestamps=timestamps),
                        current_leader_epoch=-1,
                    )
                ],
            )
        ],
    )
    r = (
        client.with_leader(
            topic,
            partition,
            lambda s: s.Produce(req, timeout=10),
            lambda resp: is_retriable(resp.topics[0].partitions[0].error_code),
        )
        .topics[0]
        .partitions[0]
    )
    assert r.error_code == ErrorCode.NONE, r.error_message
    return r.base_offset


# ---------------------------------------------------------------------------------------------
# topics


def test_create_list_describe_delete(admin: Admin) -> None:
    created = admin.create_topic(
        "adm-orders", partitions=3, replication_factor=2, config={"retention.ms": 3_600_000}
    )
    assert created.name == "adm-orders" and created.topic_id
    assert (created.partitions, created.replication_factor) == (3, 2)

    dry = admin.create_topic("adm-dry", 5, validate_only=True)
    assert dry.topic_id == "" and dry.partitions == 5

    listed = admin.list_topics()
    assert "adm-orders" in listed and "adm-dry" not in listed
    assert listed["adm-orders"].partitions == 3
    assert listed["adm-orders"].topic_id == created.topic_id
    assert list(listed) == sorted(listed) and not any(n.startswith("__") for n in listed)

    d = admin.describe_topic("adm-orders")
    assert d.topic_id == created.topic_id and d.partition_count == 3
    assert d.replication_factor == 2 and not d.internal
    assert d.configs == {"retention.ms": "3600000"}
    assert d.topic_partitions == [TopicPartition("adm-orders", p) for p in range(3)]
    for p in d.partitions:
        assert len(p.replicas) == 2 and p.leader == p.replicas[0] == p.preferred_leader
        assert set(p.isr) == set(p.replicas) and p.leader_epoch >= 0
        assert not (p.under_replicated or p.offline or p.reassigning or p.recovering)
    assert not d.under_replicated_partitions and not d.offline_partitions

    results = admin.create_topics(
        [
            NewTopic("adm-a", partitions=2),
            NewTopic("adm-b", replica_assignment={0: [3, 1], 1: [1, 3]}),
        ]
    )
    assert results["adm-a"].partitions == 2
    assert (results["adm-b"].partitions, results["adm-b"].replication_factor) == (2, 2)
    b = admin.describe_topic("adm-b")
    assert [p.replicas for p in b.partitions] == [(3, 1), (1, 3)]
    assert [p.leader for p in b.partitions] == [3, 1]
    both = admin.describe_topics(["adm-b", "adm-a"])
    assert list(both) == ["adm-b", "adm-a"]
    everything = admin.describe_topics()
    assert {"adm-orders", "adm-a", "adm-b"} <= set(everything)

    admin.delete_topic("adm-orders")
    admin.delete_topics(["adm-a", "adm-b"])
    assert not {"adm-orders", "adm-a", "adm-b"} & set(admin.list_topics())
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-orders"):
        admin.describe_topic("adm-orders")


def test_topic_errors_name_the_topic(admin: Admin) -> None:
    admin.create_topic("adm-exists", 1)
    with pytest.raises(TopicAlreadyExistsError, match="'adm-exists' already exists"):
        admin.create_topic("adm-exists", 1)
    with pytest.raises(InvalidConfigError, match=r"retention.ms"):
        admin.create_topic("adm-badcfg", config={"retention.ms": "soon"})
    with pytest.raises(InvalidConfigError, match=r"no.such.config"):
        admin.create_topic("adm-badcfg", config={"no.such.config": 1})
    with pytest.raises(InvalidTopicError, match="invalid characters"):
        admin.create_topic("bad name!")
    with pytest.raises(InvalidTopicError, match="reserved"):
        admin.create_topic("__mine")
    with pytest.raises(InvalidPartitionsError, match="adm-zero"):
        admin.create_topic("adm-zero", partitions=0)
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topic("adm-rf", replication_factor=4)  # three nodes
    with pytest.raises(InvalidReplicaAssignmentError, match="adm-ra"):
        admin.create_topic("adm-ra", partitions=2, replica_assignment=[[1]])
    assert not {"adm-badcfg", "adm-zero", "adm-rf", "adm-ra"} & set(admin.list_topics())

    # Several at once: the first failure is raised; the other topics are created anyway.
    with pytest.raises(TopicAlreadyExistsError, match="adm-exists"):
        admin.create_topics([NewTopic("adm-new", 1), NewTopic("adm-exists", 1)])
    assert "adm-new" in admin.list_topics()
    with pytest.raises(InvalidConfigError, match=r"adm-x1.*also failed: adm-x2") as info:
        admin.create_topics(
            [
                NewTopic("adm-x1", config={"cleanup.policy": "nope"}),
                NewTopic("adm-x2", config={"segment.bytes": "-1"}),
            ]
        )
    assert info.value.code == ErrorCode.INVALID_CONFIG

    with pytest.raises(UnknownTopicOrPartitionError, match="adm-missing"):
        admin.delete_topic("adm-missing")
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-missing"):
        admin.delete_topics(["adm-new", "adm-missing"])
    assert "adm-new" not in admin.list_topics()
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-missing"):
        admin.describe_topics(["adm-exists", "adm-missing"])
    with pytest.raises(InvalidTopicError):
        admin.delete_topic("")
    with pytest.raises(InvalidRequestError, match="list of topic names"):
        admin.delete_topics("adm-exists")
    admin.delete_topic("adm-exists")


def test_create_partitions(admin: Admin) -> None:
    admin.create_topic("adm-grow", partitions=2, replication_factor=1)
    admin.create_partitions("adm-grow", 4, validate_only=True)
    assert admin.describe_topic("adm-grow").partition_count == 2
    admin.create_partitions("adm-grow", 4)
    d = admin.describe_topic("adm-grow")
    assert d.partition_count == 4 and all(p.leader is not None for p in d.partitions)
    with pytest.raises(InvalidPartitionsError, match=r"'adm-grow' has 4 partitions"):
        admin.create_partitions("adm-grow", 3)
    with pytest.raises(InvalidPartitionsError, match="adm-grow"):
        admin.create_partitions("adm-grow", 4)
    with pytest.raises(InvalidPartitionsError, match="positive"):
        admin.create_partitions("adm-grow", 0)
    admin.create_partitions("adm-grow", 5, replica_assignment={4: [2]})
    assert admin.describe_topic("adm-grow").partitions[4].replicas == (2,)
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-nothing"):
        admin.create_partitions("adm-nothing", 3)
    admin.delete_topic("adm-grow")


# ---------------------------------------------------------------------------------------------
# configs and the cluster


def test_describe_and_alter_configs(admin: Admin) -> None:
    admin.create_topic("adm-cfg", 1, config={"retention.ms": 3_600_000})
    configs = admin.describe_configs("adm-cfg")
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.TOPIC
    assert configs["cleanup.policy"].is_default and configs["cleanup.policy"].value == "delete"
    assert not any(c.read_only or c.sensitive for c in configs.values())
    assert list(configs) == sorted(configs)
    only = admin.describe_configs("adm-cfg", names=["segment.bytes"], documentation=True)
    assert list(only) == ["segment.bytes"] and only["segment.bytes"].documentation

    admin.alter_configs("adm-cfg", set={"retention.ms": 60_000, "cleanup.policy": "compact"})
    configs = admin.describe_configs("adm-cfg")
    assert configs["retention.ms"].value == "60000"
    assert configs["cleanup.policy"].value == "compact"
    assert admin.describe_topic("adm-cfg").configs == {
        "cleanup.policy": "compact",
        "retention.ms": "60000",
    }
    admin.alter_configs("adm-cfg", append={"cleanup.policy": "delete"})
    assert admin.describe_configs("adm-cfg")["cleanup.policy"].value == "compact,delete"
    admin.alter_configs("adm-cfg", subtract={"cleanup.policy": "compact"})
    assert admin.describe_configs("adm-cfg")["cleanup.policy"].value == "delete"
    admin.alter_configs("adm-cfg", delete=["retention.ms", "cleanup.policy"])
    configs = admin.describe_configs("adm-cfg")
    assert configs["retention.ms"].is_default and configs["cleanup.policy"].is_default
    admin.alter_configs("adm-cfg", set={"retention.ms": 1000}, validate_only=True)
    assert admin.describe_configs("adm-cfg")["retention.ms"].is_default

    with pytest.raises(InvalidConfigError, match=r"adm-cfg.*unknown config 'no.such'"):
        admin.alter_configs("adm-cfg", set={"no.such": "1"})
    with pytest.raises(InvalidConfigError, match=r"retention.ms"):
        admin.alter_configs("adm-cfg", set={"retention.ms": "soon"})
    with pytest.raises(InvalidConfigError, match=r"segment.bytes"):
        admin.alter_configs("adm-cfg", append={"segment.bytes": "1"})
    with pytest.raises(
        InvalidRequestError, match=r"'retention.ms' is given to both set and delete"
    ):
        admin.alter_configs("adm-cfg", set={"retention.ms": 1}, delete=["retention.ms"])
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-nope"):
        admin.alter_configs("adm-nope", set={"retention.ms": 1})
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-nope"):
        admin.describe_configs("adm-nope")
    with pytest.raises(InvalidRequestError, match="exactly one"):
        admin.describe_configs()
    admin.delete_topic("adm-cfg")


def test_node_configs_and_cluster(cluster: LocalCluster, admin: Admin) -> None:
    node = admin.describe_configs(node=2)
    assert node["node.id"].value == "2" and node["rack"].value == "rack-b"
    assert all(c.read_only and c.source == ConfigSource.NODE for c in node.values())
    with pytest.raises(BrokerNotAvailableError, match="node 99"):
        admin.describe_configs(node=99)

    desc = admin.describe_cluster()
    assert desc.cluster_id and desc.controller is not None and desc.controller_epoch > 0
    assert desc.controller.address == cluster.controllers[0].address
    assert [n.node_id for n in desc.nodes] == [1, 2, 3]
    assert [n.rack for n in desc.nodes] == RACKS
    assert all(n.state == NodeState.RUNNING and n.software_version for n in desc.nodes)
    assert {n.address for n in desc.nodes} == set(cluster.bootstrap.split(","))
    # The cluster's group coordinator owns every shard of __consumer_offsets.
    coordinators = admin.describe_cluster(include_coordinators=True).coordinators
    assert coordinators and {n.address for n in coordinators.values()} == {
        cluster.coordinators[0].address
    }
    # Its partition count maps groups to shards and its records are the groups' offsets:
    # neither may be changed by hand (found from outside: both were accepted).
    offsets = admin.describe_topic("__consumer_offsets")
    with pytest.raises(PolicyViolationError, match="internal: its partition count"):
        admin.create_partitions("__consumer_offsets", offsets.partition_count + 1)
    with pytest.raises(InvalidTopicError, match="cannot delete records of __consumer_offsets-0"):
        admin.delete_records({TopicPartition("__consumer_offsets", 0): "latest"})
    assert admin.describe_topic("__consumer_offsets").partition_count == offsets.partition_count


# ---------------------------------------------------------------------------------------------
# offsets and records


def test_list_offsets_and_delete_records(admin: Admin, client: ClusterClient) -> None:
    admin.create_topic("adm-data", partitions=3, replication_factor=2)
    base = int(time.time() * 1000) - 60_000
    for i in range(3):
        first = base + 10_000 * i
        _produce(
            client,
            "adm-data",
            0,
            [b"v%d" % (5 * i + j) for j in range(5)],
            [first + j for j in range(5)],
        )
    _produce(client, "adm-data", 1, [b"x"], [base])
    tp0, tp1, tp2 = (TopicPartition("adm-data", p) for p in range(3))

    ends = admin.list_offsets({tp0: "latest", tp1: "latest", tp2: "latest"})
    assert ends == {
        tp0: OffsetAndTimestamp(15, -1),
        tp1: OffsetAndTimestamp(1, -1),
        tp2: OffsetAndTimestamp(0, -1),
    }
    starts = admin.list_offsets({tp0: "earliest", tp2: "earliest"})
    assert starts == {tp0: OffsetAndTimestamp(0, -1), tp2: OffsetAndTimestamp(0, -1)}
    found = admin.list_offsets(
        {
            tp0: base + 10_002,
            tp1: base + 1,  # after its only record: nothing matches
            tp2: base,  # empty partition
        }
    )
    assert found == {tp0: OffsetAndTimestamp(7, base + 10_002), tp1: None, tp2: None}
    at = datetime.fromtimestamp((base + 20_000) / 1000, tz=UTC)
    assert admin.list_offsets({tp0: at})[tp0] == OffsetAndTimestamp(10, base + 20_000)
    # The record with the largest timestamp, the last of the batch at 10 (Kafka 3.8+).
    top = admin.list_offsets({tp0: "max_timestamp"})[tp0]
    assert top == OffsetAndTimestamp(14, base + 20_004)
    assert admin.list_offsets({tp0: "latest"}, isolation_level="read_committed")[tp0].offset == 15

    with pytest.raises(UnknownTopicOrPartitionError, match="adm-data-7"):
        admin.list_offsets({TopicPartition("adm-data", 7): "latest"})
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-ghost"):
        admin.list_offsets({TopicPartition("adm-ghost", 0): "latest"})
    with pytest.raises(InvalidRequestError, match=r"adm-data-0.*'soon'"):
        admin.list_offsets({tp0: "soon"})
    with pytest.raises(InvalidRequestError, match="-5"):
        admin.list_offsets({tp0: -5})

    assert admin.delete_records({tp0: 7}) == {tp0: 7}
    assert admin.list_offsets({tp0: "earliest"})[tp0] == OffsetAndTimestamp(7, -1)
    with pytest.raises(OffsetOutOfRangeError, match=r"adm-data-0.*high watermark"):
        admin.delete_records({tp0: 16})
    with pytest.raises(OffsetOutOfRangeError, match=r"adm-data-0.*also failed: adm-data-1"):
        admin.delete_records({tp2: 0, tp0: 100, tp1: 100})
    assert admin.delete_records({tp0: "latest", tp1: "latest"}) == {tp0: 15, tp1: 1}
    assert admin.list_offsets({tp0: "earliest", tp1: "earliest"}) == {
        tp0: OffsetAndTimestamp(15, -1),
        tp1: OffsetAndTimestamp(1, -1),
    }
    # Offsets are never reused: the next record still gets 15.
    assert _produce(client, "adm-data", 0, [b"next"], [base]) == 15
    # Kafka's numbers are taken too (found from outside: list_offsets refused -1, though
    # DeleteRecords documents "-1 = below the high watermark"): -1 latest, -2 earliest.
    assert admin.list_offsets({tp0: -1, tp1: -2}) == {
        tp0: OffsetAndTimestamp(16, -1),
        tp1: OffsetAndTimestamp(1, -1),
    }
    assert admin.delete_records({tp0: -1}) == {tp0: 16}
    with pytest.raises(InvalidRequestError, match="'latest' / -1"):
        admin.delete_records({tp0: -2})
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-ghost"):
        admin.delete_records({TopicPartition("adm-ghost", 0): 1})
    admin.delete_topic("adm-data")


def test_delete_records_over_partitions_reports_each_one_done_and_refused(
    cluster: LocalCluster,
    admin: Admin,
    client: ClusterClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found from outside: with one partition refused, `delete-records` printed only the
    refusal and Admin.delete_records raised naming only it, while the other partitions'
    records were gone. As Kafka's kafka-delete-records, each partition done is reported
    (the CLI's stdout, the error's ``results``) besides each refused (stderr, ``errors``)."""
    admin.create_topic("adm-part", partitions=2, replication_factor=2)
    tp0, tp1 = TopicPartition("adm-part", 0), TopicPartition("adm-part", 1)
    now = int(time.time() * 1000)
    _produce(client, "adm-part", 0, [b"x"] * 10, [now] * 10)  # adm-part-1 stays empty

    b = cluster.bootstrap
    assert strom_main(["topics", "delete-records", "adm-part", "--before", "5", "-b", b]) == 1
    out, err = capsys.readouterr()
    assert out == "adm-part-0: low watermark 5\n"
    assert err.count("\n") == 1 and err.startswith("strom topics: error: OFFSET_OUT_OF_RANGE")
    assert "adm-part-1" in err and "(OffsetOutOfRangeError)" in err
    assert admin.list_offsets({tp0: "earliest"})[tp0] == OffsetAndTimestamp(5, -1)

    with pytest.raises(OffsetOutOfRangeError) as info:
        admin.delete_records({tp0: 8, tp1: 3})
    exc = info.value
    assert isinstance(exc, PartialResultError)
    assert exc.results == {tp0: 8}
    assert list(exc.errors) == [tp1] and isinstance(exc.errors[tp1], OffsetOutOfRangeError)
    assert "adm-part-1" in str(exc) and "done: adm-part-0" in str(exc)
    assert admin.list_offsets({tp0: "earliest"})[tp0] == OffsetAndTimestamp(8, -1)
    admin.delete_topic("adm-part")


def test_delete_records_needs_the_delete_cleanup_policy(
    admin: Admin, client: ClusterClient
) -> None:
    """Found from outside: DeleteRecords was accepted on a cleanup.policy=compact topic and a
    key vanished from its key -> latest-value table. As Kafka, it is refused with
    POLICY_VIOLATION unless the policy includes delete; nothing moves."""
    admin.create_topic("adm-table", 1, 3, config={"cleanup.policy": "compact"})
    admin.create_topic("adm-both", 1, 3, config={"cleanup.policy": "compact,delete"})
    table, both = TopicPartition("adm-table", 0), TopicPartition("adm-both", 0)
    now = int(time.time() * 1000)
    for topic in ("adm-table", "adm-both"):
        _produce(client, topic, 0, [b"a", b"b", b"c"], [now] * 3)
    with pytest.raises(PolicyViolationError, match=r"adm-table-0.*cleanup.policy is 'compact'"):
        admin.delete_records({table: 2})
    with pytest.raises(PolicyViolationError, match="adm-table-0"):
        admin.delete_records({table: "latest"})
    assert admin.list_offsets({table: "earliest"})[table] == OffsetAndTimestamp(0, -1)
    assert admin.delete_records({both: 2}) == {both: 2}
    admin.delete_topics(["adm-table", "adm-both"])


# ---------------------------------------------------------------------------------------------
# leaders and reassignments


def test_elect_leaders_and_reassignments(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("adm-move", replica_assignment={0: [1, 2]})
    tp = TopicPartition("adm-move", 0)
    result = admin.elect_leaders(["adm-move"])
    assert list(result) == [tp] and result[tp].leader == 1 and not result[tp].elected
    assert isinstance(result[tp].error, ElectionNotNeededError)
    unclean = admin.elect_leaders([tp], unclean=True)
    assert isinstance(unclean[tp].error, ElectionNotNeededError)
    assert tp in admin.elect_leaders()  # every partition of every topic

    # A reorder changes the preferred leader; the election then moves leadership to it.
    admin.alter_partition_reassignments({tp: [2, 1]})
    wait_for(
        lambda: admin.describe_topic("adm-move").partitions[0].replicas == (2, 1),
        timeout=10,
        what="the new replica order",
    )
    moved = admin.elect_leaders([tp])[tp]
    assert moved.leader == 2 and (moved.elected or isinstance(moved.error, ElectionNotNeededError))
    assert admin.describe_topic("adm-move").partitions[0].leader == 2

    # A move to node 3 while node 3 is paused cannot complete (node 3 cannot catch up), so it
    # is visible in progress; cancel it before node 3's lease (2 s) could expire.
    node3 = cluster.node(3)
    assert node3.process is not None
    node3.process.signal(signal.SIGSTOP)
    try:
        admin.alter_partition_reassignments({tp: [2, 3]})
        listed = admin.list_partition_reassignments()
        described = admin.describe_topic("adm-move").partitions[0]
        admin.alter_partition_reassignments({tp: None})
    finally:
        node3.process.signal(signal.SIGCONT)
    assert listed == {tp: Reassignment((2, 3, 1), (3,), (1,))}
    assert listed[tp].target_replicas == (2, 3)
    assert described.reassigning and described.adding_replicas == (3,)
    assert described.removing_replicas == (1,) and described.target_replicas == (2, 3)
    # 2 and 1, the copies it has, are in sync: a move is not under-replicated (Kafka's rule)
    assert not described.under_replicated
    assert admin.list_partition_reassignments() == {}
    assert admin.list_partition_reassignments([tp]) == {}
    assert admin.describe_topic("adm-move").partitions[0].replicas == (2, 1)

    with pytest.raises(NoReassignmentInProgressError, match="adm-move-0"):
        admin.alter_partition_reassignments({tp: None})
    with pytest.raises(InvalidReplicaAssignmentError, match=r"adm-move-0.*\[9\]"):
        admin.alter_partition_reassignments({tp: [9]})
    with pytest.raises(InvalidReplicaAssignmentError, match="adm-move-0"):
        admin.alter_partition_reassignments({tp: []})
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-move-5"):
        admin.alter_partition_reassignments({TopicPartition("adm-move", 5): [1]})
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-move-5"):
        admin.elect_leaders([TopicPartition("adm-move", 5)])
    with pytest.raises(UnknownTopicOrPartitionError, match="adm-nope"):
        admin.elect_leaders(["adm-nope"])
    wait_for(
        lambda: (
            all(n.state == NodeState.RUNNING for n in admin.describe_cluster().nodes)
            and len(admin.describe_cluster().nodes) == 3
        ),
        timeout=15,
        what="node 3 running again",
    )
    admin.delete_topic("adm-move")


# ---------------------------------------------------------------------------------------------
# the client itself and the CLI on top of it


def test_client_lifecycle_errors(cluster: LocalCluster) -> None:
    a = Admin(cluster.bootstrap, client_id="adm-test")
    assert "adm-life" not in a.list_topics()
    a.close()
    a.close()
    with pytest.raises(StromError, match="closed"):
        a.list_topics()
    with pytest.raises(InvalidRequestError, match="HOST:PORT"):
        Admin("no-port")
    start = time.monotonic()
    with (
        Admin("127.0.0.1:1", request_timeout_ms=500, default_api_timeout_ms=500) as dead,
        pytest.raises(BrokerNotAvailableError),
    ):
        dead.list_topics()
    assert time.monotonic() - start < 5


def test_cli_commands_over_the_admin_client(
    cluster: LocalCluster, client: ClusterClient, capsys: pytest.CaptureFixture[str]
) -> None:
    b = cluster.bootstrap

    def strom(*args: str) -> str:
        assert strom_main([*args, "-b", b]) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    assert "created topic adm-cli (2 partitions" in strom(
        "topics", "create", "adm-cli", "--partitions", "2", "--replication-factor", "1"
    )
    assert "would create topic adm-one (1 partition, replication factor 1)" in strom(
        "topics",
        "create",
        "adm-one",
        "--partitions",
        "1",
        "--replication-factor",
        "1",
        "--validate-only",
    )
    base = int(time.time() * 1000) - 1000
    _produce(client, "adm-cli", 0, [b"a", b"b", b"c"], [base, base + 1, base + 2])
    out = strom("topics", "offsets", "adm-cli")
    assert "Partition: 0\tEarliest: 0\tLatest: 3" in out
    assert "Partition: 1\tEarliest: 0\tLatest: 0" in out
    out = strom("topics", "offsets", "adm-cli", "--partition", "0", "--time", str(base + 1))
    assert out.strip() == f"Topic: adm-cli\tPartition: 0\tOffset: 1\tTimestamp: {base + 1}"
    assert "Offset: none" in strom("topics", "offsets", "adm-cli", "--time", str(base + 10))
    assert strom("topics", "delete-records", "adm-cli", "--partition", "0", "--before", "2") == (
        "adm-cli-0: low watermark 2\n"
    )
    out = strom("topics", "delete-records", "adm-cli", "--all")
    assert "adm-cli-0: low watermark 3" in out and "adm-cli-1: low watermark 0" in out
    assert "now has 3 partitions" in strom(
        "topics", "add-partitions", "adm-cli", "--partitions", "3"
    )
    assert "retention.ms=604800000\t(default)" in strom("topics", "configs", "adm-cli")
    strom("topics", "alter", "adm-cli", "--set", "retention.ms=1000")
    assert "retention.ms=1000\t(topic)" in strom("topics", "configs", "adm-cli")
    assert "rack=rack-a" in strom("cluster", "describe")
    assert "node.id=1\t(node read-only)" in strom("cluster", "configs", "1")
    assert "0 reassignment(s) in progress" in strom("topics", "reassignments")
    assert "0 reassignment(s) in progress" in strom("topics", "reassignments", "adm-cli")
    assert strom_main(["topics", "reassignments", "adm-nosuch", "-b", b]) == 1
    assert "unknown topic 'adm-nosuch'" in capsys.readouterr().err

    assert strom_main(["topics", "add-partitions", "adm-cli", "--partitions", "2", "-b", b]) == 1
    assert "'adm-cli' has 3 partitions" in capsys.readouterr().err
    assert strom_main(["topics", "delete-records", "adm-cli", "--before", "9", "-b", b]) == 1
    err = capsys.readouterr().err
    assert "OffsetOutOfRangeError" in err and "adm-cli-0" in err
    strom("topics", "delete", "adm-cli")


def test_cli_topics_delete_says_what_became_of_each_topic(
    cluster: LocalCluster, admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    """`strom topics delete nosuch t1` printed only "topic 'nosuch' does not exist" and
    exited 1, while t1 was deleted without a word (found from outside): each deleted topic
    is now on stdout and each failure on stderr."""
    for name in ("adm-del-1", "adm-del-2"):
        admin.create_topic(name, partitions=1, replication_factor=1)
    b = cluster.bootstrap
    code = strom_main(["topics", "delete", "adm-del-nosuch", "adm-del-1", "adm-del-2", "-b", b])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == "deleted topic adm-del-1\ndeleted topic adm-del-2\n"
    assert err.count("\n") == 1 and "'adm-del-nosuch'" in err
    assert "UnknownTopicOrPartitionError" in err
    assert not {"adm-del-1", "adm-del-2"} & set(admin.list_topics())


def test_admin_reads_without_a_controller_say_why(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """Found from outside: with every controller killed, describe failed with "no active
    controller answered: " and no reason, while the nodes went on serving."""
    c = make_cluster(nodes=1, controllers=1, coordinators=0)
    with Admin(c.bootstrap, request_timeout_ms=15_000) as a:
        a.create_topic("adm-orphan", partitions=1, replication_factor=1)
    for member in c.controllers:
        assert member.process is not None
        member.process.kill()
    with ClusterClient(c.bootstrap, retry_s=5) as client:
        # Once the dead controller's lease is gone the nodes name no controller, and still
        # answer metadata (producing and consuming need no controller).
        wait_for(
            lambda: not client.metadata().controller.port,
            timeout=20,
            what="the nodes know of no controller",
        )
        assert [t.name for t in client.metadata(["adm-orphan"]).topics] == ["adm-orphan"]
    with Admin(c.bootstrap, request_timeout_ms=1_000, default_api_timeout_ms=1_000) as a:
        for call in (lambda: a.describe_topics(["adm-orphan"]), a.describe_cluster):
            with pytest.raises(BrokerNotAvailableError) as info:
                call()
            assert "know of no active controller (every controller is down" in str(info.value)


def test_a_cancel_that_would_lose_acknowledged_records_is_refused(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A move of an RF=1 partition from node 3 to [1, 2]: node 1 catches up and leads, node 3
    dies (out of the ISR), records are acknowledged on node 1 alone. Cancelling now would go
    back to node 3's older copy and delete node 1's: refused, naming the unclean election it
    would need, and every acknowledged record stays readable (found from outside: the cancel
    was taken, the partition stayed offline and the records were lost)."""
    from strom.client import Consumer, Producer

    c = make_cluster(nodes=3, controllers=1, coordinators=0)
    tp = TopicPartition("adm-unclean", 0)
    with Admin(c.bootstrap) as admin, Producer(c.bootstrap, acks="all") as producer:
        admin.create_topic("adm-unclean", replica_assignment={0: [3]})
        wait_for(
            lambda: admin.describe_topic("adm-unclean").partitions[0].leader == 3,
            timeout=30,
            what="node 3 leading",
        )
        for i in range(10):
            producer.send("adm-unclean", b"before-%d" % i, partition=0)
        producer.flush(30)
        node2, node3 = c.node(2).process, c.node(3).process
        assert node2 is not None and node3 is not None
        node2.signal(signal.SIGSTOP)  # the move cannot complete while 2 is not in sync
        try:
            admin.alter_partition_reassignments({tp: [1, 2]})

            def node_1_leads() -> bool:
                p = admin.describe_topic("adm-unclean").partitions[0]
                if 1 in p.isr and p.leader != 1:
                    admin.elect_leaders([tp])  # the preferred (first target) replica
                return p.leader == 1

            wait_for(node_1_leads, timeout=60, what="node 1 in sync and leading")
            node3.signal(signal.SIGKILL)
            wait_for(
                lambda: admin.describe_topic("adm-unclean").partitions[0].isr == (1,),
                timeout=60,
                what="node 3 out of the ISR",
            )
            for i in range(5):
                producer.send("adm-unclean", b"after-%d" % i, partition=0)
            producer.flush(30)  # acknowledged by node 1 alone (min.insync.replicas=1)
            with pytest.raises(InvalidReplicaAssignmentError, match="unclean leader election"):
                admin.alter_partition_reassignments({tp: None})
            p = admin.describe_topic("adm-unclean").partitions[0]
            assert p.leader == 1 and p.reassigning
        finally:
            node2.signal(signal.SIGCONT)
    with Consumer(c.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        got: list[bytes] = []
        wait_for(
            lambda: got.extend(r.value for r in consumer.poll(500)) or len(got) >= 15,
            timeout=60,
            what="every acknowledged record",
        )
    assert got == [b"before-%d" % i for i in range(10)] + [b"after-%d" % i for i in range(5)]
