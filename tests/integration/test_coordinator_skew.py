"""A coordinator whose wall clock disagrees with the storage nodes' keeps working.

The coordinator stamps its ``__consumer_offsets`` / ``__transaction_state`` batches with its
own clock; the nodes used to apply the topics' ``message.timestamp.after.max.ms`` (1 h by
default) to them, so a coordinator 2 h ahead had its fence batch refused INVALID_TIMESTAMP
on every load: shards never loaded, every commit and transaction answered
COORDINATOR_LOAD_IN_PROGRESS until it timed out (found from outside). Kafka's coordinators
write with the leader broker's clock, where skew cannot do this; strom's nodes skip the
timestamp checks on internal topics (``strom.storage.servicer._append_jobs``).

Real processes: etcd, a controller, a storage node, and the coordinator with the test-only
clock offset file (``STROM_TEST_CLOCK_OFFSET_FILE``, see ``strom.clock``) 2 h ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from strom import Consumer, OffsetAndMetadata, Producer, TopicPartition
from strom.clock import OFFSET_ENV
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
#: Two hours: past the default message.timestamp.after.max.ms (1 h).
AHEAD_MS = 2 * 3_600_000


def test_a_coordinator_ahead_of_the_nodes_commits_offsets_and_transactions(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    clock = tmp_path / "coordinator-clock.ms"
    clock.write_text(str(AHEAD_MS))
    c = make_cluster(
        nodes=1,
        controllers=1,
        coordinator_args=["--offsets-partitions", "1", "--transaction-state-partitions", "1"],
        coordinator_env={OFFSET_ENV: str(clock)},
    )
    create_topic(c, "skewed")
    tp = TopicPartition("skewed", 0)
    with Consumer(c.bootstrap, group_id="skewed-group", enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(5)}, timeout_ms=60_000)
        assert consumer.committed([tp], timeout_ms=30_000)[tp].offset == 5
    with Producer(c.bootstrap, transactional_id="skewed-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("skewed", b"committed while the coordinator is 2 h ahead").result(30)
        producer.commit_transaction()
    with Consumer(
        c.bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    ) as reader:
        reader.assign([tp])
        # The record and the commit marker are both below the last stable offset.
        wait_for(
            lambda: reader.end_offsets([tp])[tp] == 2,
            timeout=30,
            what="the transaction's commit marker",
        )
        seen: list[bytes] = []
        wait_for(
            lambda: seen.extend(r.value for r in reader.poll(timeout_ms=200)) or bool(seen),
            timeout=30,
            what="the committed record",
        )
        assert seen == [b"committed while the coordinator is 2 h ahead"]
