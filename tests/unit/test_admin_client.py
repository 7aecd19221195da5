"""The Admin client's own logic against a fake ClusterClient: argument checks (nothing is
sent), per-leader fan-out with retries, the first-failure rule of multi-item calls and the
conversion of controller answers into typed results."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from strom.api import common_pb2, controller_pb2, storage_pb2
from strom.api import metadata_pb2 as md
from strom.cli.admin_parser import _time_spec
from strom.client.admin import (
    Admin,
    ConfigSource,
    ElectionResult,
    NewTopic,
    NodeState,
    PartitionInfo,
)
from strom.client.admin_requests import partition_info as _partition_info
from strom.client.types import OffsetAndTimestamp, TopicPartition
from strom.errors import (
    BrokerNotAvailableError,
    ElectionNotNeededError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PartialResultError,
    PreferredLeaderNotAvailableError,
    StromError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)

E = common_pb2.ErrorCode
TP = TopicPartition


class _Call:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def result(self) -> Any:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


class _Unimplemented(grpc.RpcError):
    """What a node answers for a method it does not have (an older version)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return "Method not found!"


class FakeCluster:
    """Leaders per partition, scripted storage answers and canned controller answers."""

    timeout_s = 1.0
    retry_s = 2.0

    def __init__(self) -> None:
        self.leaders: dict[TopicPartition, str] = {}
        self.after_refresh: dict[TopicPartition, str] = {}
        self.storage_calls: list[tuple[str, str, Any]] = []
        self.attempt_timeouts: list[float] = []
        self.answer: Callable[[str, str, Any], Any] = lambda addr, method, req: None
        self.controller: dict[str, Any] = {}
        self.controller_calls: list[tuple[str, Any]] = []
        self.closed = False

    def controller_call(self, method: str, request: Any, **timeouts: float) -> Any:
        self.controller_calls.append((method, request))
        return self.controller[method]

    def topic_metadata(self, topic: str, *, refresh: bool = True) -> None:
        if refresh:
            self.leaders.update(self.after_refresh)
        if not any(tp.topic == topic for tp in self.leaders):
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}", retriable=False)

    def leader_of(self, topic: str, partition: int, *, refresh: bool = False) -> str:
        return self.leaders[TP(topic, partition)]

    def storage(self, addr: str) -> Any:
        cluster = self

        class Method:
            def __init__(self, name: str) -> None:
                self.name = name

            def future(self, request: Any, timeout: float) -> _Call:
                cluster.storage_calls.append((addr, self.name, request))
                cluster.attempt_timeouts.append(timeout)
                return _Call(cluster.answer(addr, self.name, request))

        class Stub:
            ListOffsets = Method("ListOffsets")
            DeleteRecords = Method("DeleteRecords")
            DescribeProducers = Method("DescribeProducers")

        return Stub()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def admin(fake: FakeCluster) -> Admin:
    return Admin(cluster_client=fake, request_timeout_ms=300, default_api_timeout_ms=300)


def _asked(request: storage_pb2.ListOffsetsRequest) -> list[tuple[str, int, int]]:
    return [(t.topic, p.partition, p.timestamp) for t in request.topics for p in t.partitions]


def _offsets_answer(
    codes: dict[TopicPartition, int],
) -> Callable[[str, str, Any], storage_pb2.ListOffsetsResponse]:
    def answer(addr: str, method: str, req: Any) -> storage_pb2.ListOffsetsResponse:
        resp = storage_pb2.ListOffsetsResponse()
        for t in req.topics:
            tr = resp.topics.add(topic=t.topic)
            for p in t.partitions:
                code = codes.get(TP(t.topic, p.partition), E.NONE)
                ok = code == E.NONE
                tr.partitions.add(
                    partition=p.partition,
                    error_code=code,
                    error_message="" if ok else f"not here ({addr})",
                    offset=100 + p.partition if ok else -1,
                    timestamp=-1,
                )
        return resp

    return answer


# ---------------------------------------------------------------------------------------------
# per-leader fan-out


def test_list_offsets_one_request_per_leader_and_retry_after_leader_moves(
    fake: FakeCluster, admin: Admin
) -> None:
    fake.leaders = {TP("t", 0): "A", TP("t", 1): "B", TP("t", 2): "A", TP("u", 0): "B"}
    fake.after_refresh = {TP("t", 2): "B"}
    moved = {TP("t", 2): E.NOT_LEADER_OR_FOLLOWER}

    def answer(addr: str, method: str, req: Any) -> Any:
        codes = moved if addr == "A" else {}
        return _offsets_answer(codes)(addr, method, req)

    fake.answer = answer
    got = admin.list_offsets(
        {TP("t", 0): "latest", TP("t", 1): "earliest", TP("t", 2): 5, TP("u", 0): "max_timestamp"}
    )
    assert got == {
        TP("t", 0): OffsetAndTimestamp(100, -1),
        TP("t", 1): OffsetAndTimestamp(101, -1),
        TP("t", 2): OffsetAndTimestamp(102, -1),
        TP("u", 0): OffsetAndTimestamp(100, -1),
    }
    first_round = {addr: _asked(req) for addr, _, req in fake.storage_calls[:2]}
    assert first_round == {
        "A": [("t", 0, -1), ("t", 2, 5)],
        "B": [("t", 1, -2), ("u", 0, -3)],
    }
    assert [(addr, _asked(req)) for addr, _, req in fake.storage_calls[2:]] == [
        ("B", [("t", 2, 5)])
    ]


class _DeadlineExceeded(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded"


def test_a_hung_leader_costs_one_attempt_not_the_whole_call(fake: FakeCluster) -> None:
    """Found from outside: each request to a leader was given the whole call's budget, so a
    leader that hung (SIGSTOP) used it up and the retry at the new leader never ran. An
    attempt now gets request_timeout_ms; the call retries within default_api_timeout_ms."""
    admin = Admin(cluster_client=fake, request_timeout_ms=200, default_api_timeout_ms=10_000)
    fake.leaders = {TP("t", 0): "A"}
    fake.after_refresh = {TP("t", 0): "B"}

    def answer(addr: str, method: str, req: Any) -> Any:
        if addr == "A":
            return _DeadlineExceeded()
        return _offsets_answer({})(addr, method, req)

    fake.answer = answer
    assert admin.list_offsets({TP("t", 0): "latest"}) == {TP("t", 0): OffsetAndTimestamp(100, -1)}
    assert [addr for addr, _, _ in fake.storage_calls] == ["A", "B"]
    assert all(t <= 0.2 for t in fake.attempt_timeouts), fake.attempt_timeouts


def test_timeouts_default_to_a_shared_clients_and_are_checked(fake: FakeCluster) -> None:
    """A shared ClusterClient (the CLI's) keeps its per-call timeout and overall budget;
    an overall timeout below the per-attempt one is refused, as Kafka refuses it."""
    a = Admin(cluster_client=fake)
    assert (a.request_timeout_ms, a.default_api_timeout_ms) == (1000, 2000)
    a = Admin(cluster_client=fake, request_timeout_ms=5000)
    assert a.default_api_timeout_ms == 5000
    with pytest.raises(InvalidRequestError, match="default_api_timeout_ms"):
        Admin(cluster_client=fake, request_timeout_ms=5000, default_api_timeout_ms=4000)
    with pytest.raises(InvalidRequestError, match="default_api_timeout_ms"):
        Admin(cluster_client=fake, default_api_timeout_ms=0)
    with Admin("127.0.0.1:1") as own:
        assert (own.request_timeout_ms, own.default_api_timeout_ms) == (30_000, 60_000)
        assert (own._client.timeout_s, own._client.retry_s) == (30.0, 60.0)


def test_a_partition_still_failing_at_the_deadline_raises_with_its_name(
    fake: FakeCluster, admin: Admin
) -> None:
    fake.leaders = {TP("t", 0): "A", TP("t", 1): "A"}
    fake.answer = _offsets_answer({TP("t", 1): E.NOT_LEADER_OR_FOLLOWER})
    with pytest.raises(NotLeaderError, match="t-1: not here"):
        admin.list_offsets({TP("t", 0): "latest", TP("t", 1): "latest"})


def test_first_failure_in_the_callers_order_lists_the_others(
    fake: FakeCluster, admin: Admin
) -> None:
    fake.leaders = {TP("t", p): "A" for p in range(4)}

    def answer(addr: str, method: str, req: Any) -> storage_pb2.DeleteRecordsResponse:
        resp = storage_pb2.DeleteRecordsResponse()
        for t in req.topics:
            tr = resp.topics.add(topic=t.topic)
            for p in t.partitions:
                if p.partition in (1, 3):
                    tr.partitions.add(
                        partition=p.partition,
                        error_code=E.OFFSET_OUT_OF_RANGE,
                        error_message="above the high watermark",
                        low_watermark=-1,
                    )
                else:
                    tr.partitions.add(partition=p.partition, low_watermark=p.offset)
        return resp

    fake.answer = answer
    with pytest.raises(OffsetOutOfRangeError) as info:
        admin.delete_records({TP("t", 3): 9, TP("t", 0): 1, TP("t", 1): 9, TP("t", 2): "latest"})
    assert str(info.value) == (
        "OFFSET_OUT_OF_RANGE: t-3: above the high watermark (also failed: t-1; done: t-0, t-2)"
    )
    # The partitions deleted are not lost with the refusal (found from outside).
    assert isinstance(info.value, PartialResultError)
    assert info.value.results == {TP("t", 0): 1, TP("t", 2): -1}
    assert list(info.value.errors) == [TP("t", 3), TP("t", 1)]
    assert all(isinstance(e, OffsetOutOfRangeError) for e in info.value.errors.values())
    assert "t-1: above the high watermark" in str(info.value.errors[TP("t", 1)])
    sent = fake.storage_calls[0][2]
    assert sent.timeout_ms > 0
    assert [(p.partition, p.offset) for p in sent.topics[0].partitions] == [
        (3, 9),
        (0, 1),
        (1, 9),
        (2, -1),
    ]
    assert admin.delete_records({TP("t", 0): 4, TP("t", 2): "latest"}) == {
        TP("t", 0): 4,
        TP("t", 2): -1,
    }


def test_unknown_topics_fail_without_retrying_and_unreachable_leaders_time_out(
    fake: FakeCluster, admin: Admin
) -> None:
    fake.leaders = {TP("t", 0): "A"}
    with pytest.raises(UnknownTopicOrPartitionError, match=r"nope-0: unknown topic 'nope'"):
        admin.list_offsets({TP("nope", 0): "latest"})
    assert not fake.storage_calls
    fake.answer = lambda addr, method, req: _Unavailable()
    with pytest.raises(BrokerNotAvailableError, match=r"t-0: ListOffsets at leader A.*UNAVAILABLE"):
        admin.list_offsets({TP("t", 0): "latest"})
    assert len(fake.storage_calls) > 1  # retried until the request timeout


# ---------------------------------------------------------------------------------------------
# argument checks: nothing reaches the cluster


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda a: a.create_topic("t", partitions=0), InvalidPartitionsError, "positive"),
        (lambda a: a.create_topic("t", 1, True), InvalidReplicationFactorError, "True"),
        (lambda a: a.create_topic(""), InvalidTopicError, "non-empty"),
        (lambda a: a.create_topic("t", config={"retention.ms": [1]}), InvalidConfigError, "t"),
        (
            lambda a: a.create_topic("t", 2, replica_assignment={0: [1]}),
            InvalidReplicaAssignmentError,
            "not both",
        ),
        (
            lambda a: a.create_topic("t", replica_assignment={0: ["x"]}),
            InvalidReplicaAssignmentError,
            "t-0",
        ),
        (lambda a: a.create_topics(["t"]), InvalidRequestError, "NewTopic"),
        (
            lambda a: a.create_topics([NewTopic("t"), NewTopic("t")]),
            InvalidRequestError,
            "more than once",
        ),
        (lambda a: a.delete_topics("t"), InvalidRequestError, "list of topic names"),
        (lambda a: a.create_partitions("t", -1), InvalidPartitionsError, "positive"),
        (lambda a: a.create_partitions("t", None), InvalidPartitionsError, "None"),
        (lambda a: a.describe_configs("t", node=1), InvalidRequestError, "exactly one"),
        (lambda a: a.describe_configs(node=-1), InvalidRequestError, "node id"),
        (
            lambda a: a.alter_configs("t", set={"a.b": 1}, subtract={"a.b": 2}),
            InvalidRequestError,
            "both set and subtract",
        ),
        (lambda a: a.list_offsets({TP("t", -1): "latest"}), InvalidRequestError, "partition"),
        (lambda a: a.list_offsets({TP("t", 0): "now"}), InvalidRequestError, "t-0"),
        (lambda a: a.list_offsets({TP("t", 0): True}), InvalidRequestError, "True"),
        (lambda a: a.list_offsets([TP("t", 0)]), InvalidRequestError, "mapping"),
        (
            lambda a: a.list_offsets({TP("t", 0): "latest"}, isolation_level="x"),
            InvalidRequestError,
            "isolation_level",
        ),
        (lambda a: a.delete_records({TP("t", 0): -2}), InvalidRequestError, "'latest' / -1"),
        (lambda a: a.list_offsets({TP("t", 0): -4}), InvalidRequestError, r"'latest' \(-1\)"),
        (
            lambda a: a.alter_partition_reassignments({TP("t", 0): "1,2"}),
            InvalidReplicaAssignmentError,
            "t-0",
        ),
    ],
)
def test_bad_arguments_raise_before_sending(
    fake: FakeCluster, admin: Admin, call: Callable[[Admin], Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        call(admin)
    assert not fake.controller_calls and not fake.storage_calls


def test_values_are_converted_and_sent(fake: FakeCluster, admin: Admin) -> None:
    resp = controller_pb2.CreateTopicsResponse()
    resp.topics.add(name="t", topic_id="id-1", num_partitions=3, replication_factor=2)
    fake.controller["CreateTopics"] = resp
    result = admin.create_topic(
        "t",
        config={"retention.ms": 60_000, "unclean.leader.election.enable": False},
        replica_assignment=[[1, 2], [2, 3], [3, 1]],
    )
    assert result == ("t", "id-1", 3, 2)
    req = fake.controller_calls[-1][1]
    item = req.topics[0]
    assert (item.num_partitions, item.replication_factor) == (-1, -1)
    assert dict(item.configs) == {
        "retention.ms": "60000",
        "unclean.leader.election.enable": "false",
    }
    assert [(a.partition, list(a.replicas)) for a in item.assignments] == [
        (0, [1, 2]),
        (1, [2, 3]),
        (2, [3, 1]),
    ]
    fake.controller["AlterConfigs"] = controller_pb2.AlterConfigsResponse(
        results=[controller_pb2.AlterConfigsResult(resource_name="t")]
    )
    admin.alter_configs("t", set={"retention.ms": 1}, delete="cleanup.policy")
    ops = fake.controller_calls[-1][1].resources[0].configs
    assert [(o.name, o.op, o.HasField("value")) for o in ops] == [
        ("retention.ms", controller_pb2.ALTER_CONFIG_OP_SET, True),
        ("cleanup.policy", controller_pb2.ALTER_CONFIG_OP_DELETE, False),
    ]
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    fake.leaders = {TP("t", 0): "A"}
    fake.answer = _offsets_answer({})
    admin.list_offsets({TP("t", 0): when})
    assert _asked(fake.storage_calls[-1][2]) == [("t", 0, int(when.timestamp() * 1000))]


def test_plural_create_raises_first_failure_of_its_own_class(
    fake: FakeCluster, admin: Admin
) -> None:
    resp = controller_pb2.CreateTopicsResponse()
    resp.topics.add(name="a", topic_id="x", num_partitions=1, replication_factor=1)
    resp.topics.add(name="b", error_code=E.TOPIC_ALREADY_EXISTS, error_message="exists already")
    resp.topics.add(name="c", error_code=E.INVALID_CONFIG, error_message="topic 'c': bad")
    fake.controller["CreateTopics"] = resp
    with pytest.raises(TopicAlreadyExistsError) as info:
        admin.create_topics([NewTopic("a"), NewTopic("b"), NewTopic("c")])
    assert info.value.message == "topic 'b': exists already (also failed: c)"


# ---------------------------------------------------------------------------------------------
# typed results


def test_partition_flags() -> None:
    def info(**state: Any) -> PartitionInfo:
        desc = controller_pb2.PartitionDescription(
            partition=0, state=md.PartitionState(**state), offline_replicas=state.pop("off", [])
        )
        return _partition_info(desc)

    healthy = info(replicas=[1, 2], leader=1, isr=[1, 2], leader_epoch=3)
    assert healthy.leader == 1 and healthy.preferred_leader == 1
    assert not (healthy.under_replicated or healthy.offline or healthy.reassigning)
    down = _partition_info(
        controller_pb2.PartitionDescription(
            partition=1,
            state=md.PartitionState(replicas=[2, 3], leader=-1, isr=[2]),
            offline_replicas=[2],
        )
    )
    assert down.leader is None and down.offline and down.under_replicated
    moving = info(
        replicas=[4, 3, 1], leader=3, isr=[3, 1], adding_replicas=[4], removing_replicas=[1]
    )
    assert moving.reassigning and moving.target_replicas == (4, 3)
    # 3 and 1, the copies it has, are in sync: not under-replicated while moving (Kafka's
    # rule); losing one of them is.
    assert moving.preferred_leader == 4 and not moving.under_replicated
    assert info(
        replicas=[4, 3, 1], leader=3, isr=[3], adding_replicas=[4], removing_replicas=[1]
    ).under_replicated
    unclean = info(
        replicas=[1], leader=1, isr=[1], leader_recovery_state=md.LEADER_RECOVERY_STATE_RECOVERING
    )
    assert unclean.recovering
    missing = _partition_info(controller_pb2.PartitionDescription(partition=7))
    assert missing.leader is None and missing.offline and missing.replicas == ()


def test_describe_configs_and_cluster(fake: FakeCluster, admin: Admin) -> None:
    resp = controller_pb2.DescribeConfigsResponse()
    r = resp.results.add(resource_type=controller_pb2.RESOURCE_TYPE_TOPIC, resource_name="t")
    r.configs.add(name="a", value="1", source=controller_pb2.CONFIG_SOURCE_TOPIC)
    r.configs.add(name="b", source=controller_pb2.CONFIG_SOURCE_DEFAULT, sensitive=True)
    fake.controller["DescribeConfigs"] = resp
    got = admin.describe_configs("t", names="a")
    assert list(fake.controller_calls[-1][1].resources[0].config_names) == ["a"]
    assert got["a"].source == ConfigSource.TOPIC and got["a"].value == "1"
    assert got["b"].value is None and got["b"].sensitive and got["b"].is_default
    r.error_code, r.error_message = E.UNKNOWN_TOPIC_OR_PARTITION, "gone"
    with pytest.raises(UnknownTopicOrPartitionError, match="topic 't': gone"):
        admin.describe_configs("t")

    cl = controller_pb2.DescribeClusterResponse(cluster_id="c", controller_epoch=7)
    cl.controller.CopyFrom(common_pb2.Node(node_id=0, host="h", port=9093))
    cl.nodes.add(node_id=2, host="n2", port=2, rack="r2", state=md.NODE_STATE_SHUTTING_DOWN)
    cl.nodes.add(node_id=1, host="n1", port=1, state=md.NODE_STATE_UNSPECIFIED)
    cl.coordinator_shards.add(shard=0, coordinator_id=5, host="c5", port=9094)
    fake.controller["DescribeCluster"] = cl
    desc = admin.describe_cluster(include_coordinators=True)
    assert desc.controller is not None and desc.controller.address == "h:9093"
    assert [(n.node_id, n.rack, n.state) for n in desc.nodes] == [
        (1, None, NodeState.STARTING),
        (2, "r2", NodeState.SHUTTING_DOWN),
    ]
    assert desc.coordinators[0].address == "c5:9094"
    cl.controller.node_id = -1
    assert admin.describe_cluster().controller is None


def test_elect_leaders_returns_outcomes_but_raises_for_unknown_partitions(
    fake: FakeCluster, admin: Admin
) -> None:
    desc = controller_pb2.DescribeTopicsResponse()
    t = desc.topics.add(name="t")
    t.metadata.partition_count = 2
    t.partitions.add(partition=0)
    t.partitions.add(partition=1)
    fake.controller["DescribeTopics"] = desc
    resp = controller_pb2.ElectLeadersResponse()
    resp.partitions.add(topic="t", partition=1, leader=2, leader_epoch=4)
    resp.partitions.add(
        topic="t", partition=0, error_code=E.ELECTION_NOT_NEEDED, leader=1, leader_epoch=0
    )
    resp.partitions.add(
        topic="u", partition=0, error_code=E.PREFERRED_LEADER_NOT_AVAILABLE, leader=-1
    )
    fake.controller["ElectLeaders"] = resp
    got = admin.elect_leaders(["t", TP("u", 0), TP("t", 1)])
    req = fake.controller_calls[-1][1]
    assert [(p.topic, p.partition) for p in req.partitions] == [("t", 0), ("t", 1), ("u", 0)]
    assert list(got) == [TP("t", 0), TP("t", 1), TP("u", 0)]
    assert got[TP("t", 1)] == ElectionResult(2, 4, None) and got[TP("t", 1)].elected
    assert isinstance(got[TP("t", 0)].error, ElectionNotNeededError)
    assert isinstance(got[TP("u", 0)].error, PreferredLeaderNotAvailableError)
    assert got[TP("u", 0)].leader is None
    resp.partitions.add(topic="t", partition=9, error_code=E.UNKNOWN_TOPIC_OR_PARTITION)
    with pytest.raises(UnknownTopicOrPartitionError, match="t-9"):
        admin.elect_leaders()


def test_close_is_idempotent_and_leaves_a_shared_client_open(fake: FakeCluster) -> None:
    with Admin(cluster_client=fake) as a:
        pass
    a.close()
    assert not fake.closed
    with pytest.raises(StromError, match="closed"):
        a.list_topics()
    with pytest.raises(InvalidRequestError, match="request_timeout_ms"):
        Admin(cluster_client=fake, request_timeout_ms=0)


def test_cli_time_specs() -> None:
    assert _time_spec("earliest") == "earliest" and _time_spec("-1") == "latest"
    assert _time_spec("MAX") == "max_timestamp" and _time_spec("1700000000000") == 1700000000000
    assert _time_spec("2024-01-02T03:04:05+00:00") == int(
        datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp() * 1000
    )
    with pytest.raises(argparse.ArgumentTypeError, match="not a time"):
        _time_spec("soon")


def test_a_leader_of_an_older_version_is_named_as_such(fake: FakeCluster, admin: Admin) -> None:
    """Found from outside: describe_producers (`strom transactions producers`) against a
    leader that predates DescribeProducers failed "UNKNOWN_SERVER_ERROR ... UNIMPLEMENTED
    Method not found!", once, not retried (it cannot succeed)."""
    fake.leaders = {TP("t", 0): "old:9092"}

    fake.answer = lambda addr, method, req: _Unimplemented()  # the call raises it
    with pytest.raises(UnsupportedVersionError) as err:
        admin.describe_producers([TP("t", 0)])
    assert err.value.message == (
        "t-0: the node at old:9092 does not know DescribeProducers: it runs an older strom "
        "version than this client"
    )
    assert len(fake.storage_calls) == 1
