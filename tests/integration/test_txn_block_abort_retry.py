"""A ``transaction()`` block whose abort fails (the transaction coordinator hung while the
block's records were still being sent) is aborted again when the next block begins, so the
README's exactly-once loop goes on once the coordinator answers. Found from outside: the
failed abort left the transaction in its abortable error with the error swallowed, and every
later block was refused "cannot begin_transaction() while abortable error" at once, for
ever (381 refusals in 30 s), although the coordinator had come back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from strom import Consumer, Producer
from strom.client.types import TopicPartition
from strom.errors import StromError
from tests.conftest import create_topic, paused

pytestmark = pytest.mark.integration


def test_the_loop_goes_on_after_a_block_whose_abort_failed(make_cluster: Any) -> None:
    cluster = make_cluster(nodes=1, controllers=1, coordinators=1)
    cluster.wait_coordinators_ready()
    topic = create_topic(cluster, "eos-out")
    producer = Producer(
        cluster.bootstrap,
        transactional_id="block-abort",
        max_block_ms=2000,
        delivery_timeout_ms=4000,
        request_timeout_ms=1500,
    )
    try:
        producer.init_transactions()
        with producer.transaction():
            producer.send(topic, b"before")
        with (
            paused(cluster.coordinators[0]),
            pytest.raises(StromError),
            producer.transaction(),
        ):
            producer.send(topic, b"lost")
        # The README's loop: an error out of the block is abortable, go on.
        refusals: list[str] = []
        deadline = time.monotonic() + 90
        while True:
            try:
                with producer.transaction():
                    producer.send(topic, b"after")
                break
            except StromError as exc:
                refusals.append(str(exc))
                # Each try aborts again (up to max_block_ms) until the coordinator answers;
                # the old code was refused at once, for ever (hundreds in seconds).
                assert len(refusals) < 50 and time.monotonic() < deadline, refusals[-3:]
    finally:
        producer.close()
    with Consumer(
        cluster.bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    ) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while b"after" not in seen and time.monotonic() < deadline:
            seen.extend(r.value for r in consumer.poll(timeout_ms=500))
    assert seen == [b"before", b"after"], seen
