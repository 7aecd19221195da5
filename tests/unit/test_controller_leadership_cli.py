"""``strom topics describe / elect-leaders / reassign`` against a fake controller client."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from strom.api import common_pb2, controller_pb2
from strom.api import metadata_pb2 as md
from strom.cli import admin

E = common_pb2.ErrorCode


class FakeClient:
    calls: list[tuple[str, Any]] = []
    answers: dict[str, Any] = {}
    timeout_s = 10.0
    retry_s = 15.0

    def __init__(self, bootstrap: Any, **_timeouts: Any) -> None:
        pass

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def controller_call(self, method: str, request: Any, **timeouts: float) -> Any:
        FakeClient.calls.append((method, request))
        return FakeClient.answers[method]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    FakeClient.calls = []
    FakeClient.answers = {}
    monkeypatch.setattr(admin, "ClusterClient", FakeClient)
    return FakeClient


def _run(*argv: str, status: int = 0) -> str:
    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-b", "--bootstrap", default="x:1")
    sub = parser.add_subparsers(dest="cmd")
    admin.add_topics_parser(sub, common)
    args = parser.parse_args(["topics", *argv])
    out = io.StringIO()
    assert admin.run_topics(args, out) == status
    return out.getvalue()


def _describe() -> controller_pb2.DescribeTopicsResponse:
    resp = controller_pb2.DescribeTopicsResponse()
    t = resp.topics.add(name="t")
    t.metadata.partition_count = 3
    t.metadata.replication_factor = 3
    t.partitions.add(
        partition=0, state=md.PartitionState(replicas=[1, 2, 3], leader=1, isr=[1, 2, 3])
    )
    t.partitions.add(
        partition=1,
        state=md.PartitionState(replicas=[2, 3, 1], leader=-1, leader_epoch=4, isr=[2]),
        offline_replicas=[2],
    )
    t.partitions.add(
        partition=2,
        state=md.PartitionState(
            replicas=[4, 3, 1], leader=3, isr=[3, 1], adding_replicas=[4], removing_replicas=[1]
        ),
    )
    return resp


def _describe_configs() -> controller_pb2.DescribeConfigsResponse:
    """The controller's answer for topic "t": one override, the rest defaults."""
    from strom.controller.configs import describe_topic_configs

    resp = controller_pb2.DescribeConfigsResponse()
    r = resp.results.add(resource_type=controller_pb2.RESOURCE_TYPE_TOPIC, resource_name="t")
    r.configs.extend(describe_topic_configs({"min.cleanable.dirty.ratio": "0.1"}))
    return resp


def test_describe_marks_partitions(fake: type[FakeClient]) -> None:
    fake.answers["DescribeTopics"] = _describe()
    fake.answers["DescribeConfigs"] = _describe_configs()
    lines = [x for x in _run("describe", "t").splitlines() if "Partition:" in x]
    assert "under-replicated" not in lines[0] and "offline" not in lines[0]
    assert "Leader: none" in lines[1] and "offline" in lines[1]
    assert "under-replicated" in lines[1]
    assert "reassigning: adding 4 removing 1" in lines[2]
    # Replicas 3 and 1, the copies it has, are in sync while 4 is added: a move is not
    # under-replicated (Kafka's rule: replicas - adding - ISR).
    assert "under-replicated" not in lines[2]


def test_describe_shows_the_replication_factor_the_partitions_have(
    fake: type[FakeClient],
) -> None:
    """Found from outside: after a reassignment to 4 replicas describe still said 3 (the
    count stored at creation); it shows the first partition's, as Kafka does."""
    resp = _describe()
    first = resp.topics[0].partitions[0].state
    first.replicas.append(4)
    first.isr.append(4)
    fake.answers["DescribeTopics"] = resp
    fake.answers["DescribeConfigs"] = _describe_configs()
    assert "ReplicationFactor: 4\t" in _run("describe", "t")
    # During a move the replicas being added do not count yet.
    resp = _describe()
    resp.topics[0].partitions[0].state.CopyFrom(resp.topics[0].partitions[2].state)
    fake.answers["DescribeTopics"] = resp
    assert "ReplicationFactor: 2\t" in _run("describe", "t")


def test_describe_shows_every_config_with_its_source(fake: type[FakeClient]) -> None:
    """Regression (issue 9): ``topics describe`` showed only overrides; it lists every
    effective config and whether it is the topic's override or strom's default."""
    from strom.log import CONFIG_KEYS

    fake.answers["DescribeTopics"] = _describe()
    fake.answers["DescribeConfigs"] = _describe_configs()
    out = _run("describe", "t")
    configs = [x.strip() for x in out.splitlines() if x.startswith("\t\t")]
    assert len(configs) == len(CONFIG_KEYS)
    assert "min.cleanable.dirty.ratio=0.1\t(topic)" in configs
    assert "cleanup.policy=delete\t(default)" in configs
    assert "max.compaction.lag.ms=9223372036854775807\t(default)" in configs
    req = next(r for m, r in fake.calls if m == "DescribeConfigs")
    assert [(x.resource_type, x.resource_name) for x in req.resources] == [
        (controller_pb2.RESOURCE_TYPE_TOPIC, "t")
    ]


def test_elect_leaders(fake: type[FakeClient], capsys: pytest.CaptureFixture[str]) -> None:
    """A failed election exits 1 and is printed on stderr with its code once and the reason
    (found from outside: "PREFERRED_LEADER_NOT_AVAILABLE PREFERRED_LEADER_NOT_AVAILABLE" and
    exit 0); ELECTION_NOT_NEEDED is no failure."""
    fake.answers["DescribeTopics"] = _describe()
    resp = controller_pb2.ElectLeadersResponse()
    resp.partitions.add(topic="t", partition=0, error_code=E.ELECTION_NOT_NEEDED, leader=1)
    resp.partitions.add(topic="t", partition=1, leader=3, leader_epoch=5)
    resp.partitions.add(
        topic="t",
        partition=2,
        error_code=E.PREFERRED_LEADER_NOT_AVAILABLE,
        error_message="preferred replica 4 is not running (down, starting or shutting down)",
        leader=-1,
    )
    fake.answers["ElectLeaders"] = resp
    out = _run("elect-leaders", "t", "--unclean", status=1)
    method, req = fake.calls[-1]
    assert method == "ElectLeaders" and req.election_type == controller_pb2.ELECTION_TYPE_UNCLEAN
    assert [(p.topic, p.partition) for p in req.partitions] == [("t", 0), ("t", 1), ("t", 2)]
    assert "t-1: leader 3 (epoch 5)" in out and "t-0" not in out and "t-2" not in out
    assert "elected 1 leader(s); 1 election(s) failed" in out
    assert capsys.readouterr().err == (
        "t-2: PREFERRED_LEADER_NOT_AVAILABLE preferred replica 4 is not running "
        "(down, starting or shutting down)\n"
    )
    # An older controller's message is the code's name: the code's description instead.
    resp.partitions[2].error_message = "PREFERRED_LEADER_NOT_AVAILABLE"
    _run("elect-leaders", "t", status=1)
    assert capsys.readouterr().err == (
        "t-2: PREFERRED_LEADER_NOT_AVAILABLE the preferred replica is not live or not in the ISR\n"
    )
    # Elected or not needed: exit 0.
    del resp.partitions[2]
    assert "elected 1 leader(s)\n" in _run("elect-leaders")
    assert not fake.calls[-1][1].partitions
    del resp.partitions[1]
    assert _run("elect-leaders", "t") == "elected 0 leader(s)\n"


def test_reassign(fake: type[FakeClient]) -> None:
    resp = controller_pb2.AlterPartitionReassignmentsResponse()
    resp.partitions.add(topic="t", partition=2)
    fake.answers["AlterPartitionReassignments"] = resp
    out = _run("reassign", "t", "--partition", "2", "--replicas", "4,3")
    req = fake.calls[-1][1]
    assert list(req.partitions[0].replicas) == [4, 3] and not req.partitions[0].cancel
    assert "reassigning t-2 to replicas 4,3" in out
    assert "cancelled" in _run("reassign", "t", "--partition", "2", "--cancel")
    assert fake.calls[-1][1].partitions[0].cancel
    with pytest.raises(ValueError):
        _run("reassign", "t", "--partition", "2")
    resp.partitions[0].error_code = E.INVALID_REPLICA_ASSIGNMENT
    with pytest.raises(Exception, match="t"):
        _run("reassign", "t", "--partition", "2", "--replicas", "4,4")
