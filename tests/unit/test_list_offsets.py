"""list_offsets' retry rules, with a fake cluster and a fake clock (no I/O, no waiting)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from strom.api import common_pb2, storage_pb2
from strom.client import offsets
from strom.client.metadata import MetadataCache
from strom.client.offsets import EARLIEST, list_offsets
from strom.client.types import TopicPartition
from strom.errors import LeaderNotAvailableError

TP = TopicPartition("t", 0)
HUNG, NEW = "127.0.0.1:1", "127.0.0.1:2"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class Deadline(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "deadline"


class HungLeaderCluster:
    """A partition led by a node that hangs (a stopped process: every call waits its whole
    timeout) until metadata has been asked ``moves_after`` times; then led by another."""

    def __init__(self, clock: Clock, moves_after: int, timeout_s: float = 30.0) -> None:
        self.clock = clock
        self.moves_after = moves_after
        self.timeout_s = timeout_s
        self.refreshes = 0
        self.calls: list[tuple[str, float]] = []

    def metadata(self, topics: Any = None, **kw: Any) -> storage_pb2.MetadataResponse:
        self.refreshes += 1
        leader = 2 if self.refreshes > self.moves_after else 1
        return storage_pb2.MetadataResponse(
            nodes=[
                common_pb2.Node(node_id=1, host="127.0.0.1", port=1),
                common_pb2.Node(node_id=2, host="127.0.0.1", port=2),
            ],
            topics=[
                storage_pb2.MetadataTopic(
                    name="t",
                    topic_id="id",
                    partitions=[
                        storage_pb2.MetadataPartition(
                            partition=0, leader=leader, leader_epoch=leader
                        )
                    ],
                )
            ],
        )

    def controller_call(self, method: str, request: Any, **timeouts: float) -> Any:
        raise AssertionError("not used")

    def storage(self, address: str) -> Any:
        def call(req: Any, *, timeout: float, metadata: Any = ()) -> Any:
            self.calls.append((address, timeout))
            if address == HUNG:
                self.clock.now += timeout  # a stopped process answers nothing
                raise Deadline()
            return storage_pb2.ListOffsetsResponse(
                topics=[
                    storage_pb2.ListOffsetsTopicResponse(
                        topic="t",
                        partitions=[
                            storage_pb2.ListOffsetsPartitionResponse(partition=0, offset=7)
                        ],
                    )
                ]
            )

        return SimpleNamespace(ListOffsets=call)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(offsets, "time", c)
    return c


def test_a_hung_leader_costs_one_short_try_and_the_new_leader_answers(clock: Clock) -> None:
    """With call_timeout_s, a call to a hung leader gives up early and never past the
    budget, so the lookup refreshes metadata and asks the new leader within it (it used to
    wait the client's whole request timeout, longer than the budget, and fail)."""
    cluster = HungLeaderCluster(clock, moves_after=2)
    leaders = MetadataCache(cluster)
    found = list_offsets(
        cluster, leaders, {TP: EARLIEST}, timeout_s=30.0, backoff_s=0.1, call_timeout_s=5.0
    )
    assert found[TP].offset == 7
    assert [a for a, _ in cluster.calls] == [HUNG, HUNG, NEW]
    assert all(t <= 5.0 for _, t in cluster.calls)


def test_a_call_never_waits_past_the_budget(clock: Clock) -> None:
    cluster = HungLeaderCluster(clock, moves_after=1000)
    start = clock.now
    with pytest.raises(LeaderNotAvailableError, match="unreachable: DEADLINE_EXCEEDED"):
        list_offsets(
            cluster,
            MetadataCache(cluster),
            {TP: EARLIEST},
            timeout_s=12.0,
            backoff_s=0.1,
            call_timeout_s=5.0,
        )
    assert clock.now - start <= 12.0 + 0.1 + 0.05
    assert len(cluster.calls) == 3  # 5 s, 5 s, then what was left


def test_without_call_timeout_each_call_waits_the_client_timeout(clock: Clock) -> None:
    """Other callers (the Consumer, the CLI) keep the client's request timeout per call."""
    cluster = HungLeaderCluster(clock, moves_after=1)
    found = list_offsets(
        cluster, MetadataCache(cluster), {TP: EARLIEST}, timeout_s=60.0, backoff_s=0.1
    )
    assert found[TP].offset == 7
    assert cluster.calls == [(HUNG, 30.0), (NEW, 30.0)]
