"""The sender's rule for Produce requests a hung leader leaves unanswered
(``SenderLoop._overdue``): looked up again past a grace, given up as a timed-out attempt once
a partition's leader moved, its late answer ignored. Fakes for the leaders; the integration
test is tests/integration/test_producer_hung_nodes.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from strom import Producer
from strom.api import storage_pb2
from strom.client.accumulator import PartitionQueue, ProducerBatch
from strom.client.metadata import PartitionLeader
from strom.client.produce_answers import _Shipment
from strom.client.sender import OVERDUE_GRACE_S, OVERDUE_RECHECK_S, _Outstanding
from strom.client.streams import _Answer
from strom.client.types import TopicPartition

NOWHERE = "127.0.0.1:1"
OLD, NEW = "10.0.0.1:9092", "10.0.0.2:9092"


@pytest.fixture
def producer() -> Iterator[Producer]:
    """A producer whose sender thread has ended (closed): the test plays the sender."""
    p = Producer(NOWHERE, delivery_timeout_ms=60_000)
    p.close(timeout=1)
    p._leaders[TopicPartition("t", 0)] = PartitionLeader(1, OLD, 3)
    yield p


def _in_flight(p: Producer, due: float, epoch: int = 3) -> tuple[_Outstanding, ProducerBatch]:
    """A one-batch request to OLD for t-0, in flight as the sender leaves it."""
    pq = p._queues.setdefault(("t", 0), PartitionQueue("t", 0))
    b = ProducerBatch("t", 0, pa.table({"value": pa.array([b"v"], pa.binary())}))
    pq.add_closed(b)
    b.sent = True
    b.base_sequence = 0
    pq.in_flight += 1
    p._in_flight[OLD] = p._in_flight.get(OLD, 0) + 1
    tracked = _Outstanding(OLD, [_Shipment(pq, [b], epoch, False)], due)
    p._outstanding[tracked] = None
    return tracked, b


def test_a_request_not_overdue_costs_one_look(producer: Producer) -> None:
    now = time.monotonic()
    tracked, b = _in_flight(producer, now + 0.4)
    producer._leaders[TopicPartition("t", 0)] = PartitionLeader(2, NEW, 4)  # (not looked at)
    assert producer._overdue(now) == pytest.approx(0.4)
    assert tracked in producer._outstanding and b.sent and not b.maybe_written


def test_an_overdue_request_whose_leader_stayed_is_looked_up_again_and_waits(
    producer: Producer,
) -> None:
    now = time.monotonic()
    tracked, b = _in_flight(producer, now - 0.1)
    assert producer._overdue(now) == pytest.approx(OVERDUE_RECHECK_S)
    assert tracked.checked and tracked in producer._outstanding
    assert "t" in producer._metadata.stale()
    assert producer._client.demoted(OLD)
    assert b.sent and producer._queues[("t", 0)].in_flight == 1


@pytest.mark.parametrize("leader", [PartitionLeader(2, NEW, 4), PartitionLeader(1, OLD, 4)])
def test_a_request_whose_leader_moved_is_given_up_as_timed_out_and_its_answer_ignored(
    producer: Producer, leader: PartitionLeader
) -> None:
    now = time.monotonic()
    tracked, b = _in_flight(producer, now - OVERDUE_GRACE_S)
    # A younger request to the same node, not due yet: the node answers in order.
    _, b2 = _in_flight(producer, now + 0.9)
    producer._overdue(now)
    assert tracked.checked
    producer._leaders[TopicPartition("t", 0)] = leader  # the metadata thread's lookup
    assert producer._overdue(now + 0.1) is None
    assert not producer._outstanding
    pq = producer._queues[("t", 0)]
    # As an attempt that timed out: may have been written, retried in order.
    assert b.maybe_written and b2.maybe_written and not b.sent and not b2.sent
    assert pq.retrying and pq.in_flight == 0 and producer._in_flight[OLD] == 0
    assert b.attempts == 1 and list(pq.batches) == [b, b2]
    # The old leader's late answer settles nothing.
    late = storage_pb2.ProduceResponse(
        topics=[
            storage_pb2.ProduceTopicResponse(
                topic="t", partitions=[storage_pb2.ProducePartitionResponse(partition=0)]
            )
        ]
    )
    producer._complete(OLD, tracked.entries, _Answer(late, None), None, now, tracked)
    assert not b.result.done and pq.retrying and producer._in_flight[OLD] == 0
