"""A recovery that cuts a log is counted on the node's /metrics, not only logged.

Found from outside: a node's log said "orders-0: recovery truncated 2552049 bytes ... the log
now ends at offset 3871", and nothing else did: no metric, so no alert. The node now counts
such logs and the bytes cut, by topic (``strom_storage_recovery_truncations_total``,
``strom_storage_recovery_truncated_bytes_total``; alert StromStorageRecoveryTruncated).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from tests.conftest import create_topic, member_metric

pytestmark = pytest.mark.integration
TOPIC = "orders"
RECORDS = 100
#: Bytes appended to the last segment: shorter than a batch header, so a torn batch.
TORN = 40


def test_a_log_cut_by_recovery_at_start_is_counted_and_the_records_before_it_kept(
    make_cluster,
) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    node = cluster.nodes[0]
    data_dir = Path(node.argv[node.argv.index("--data-dir") + 1])
    create_topic(cluster, TOPIC)
    sent = [b"v%d" % i for i in range(RECORDS)]
    with Producer(cluster.bootstrap, acks="all") as p:
        for v in sent:
            p.send(TOPIC, value=v, partition=0)
        p.flush()
    assert node.process is not None
    node.process.kill()  # a crash (SIGKILL, reaped): the start after it recovers the log
    (segment,) = (data_dir / f"{TOPIC}-0").glob("*.log")
    with open(segment, "ab") as f:
        f.write(b"\x7f" * TORN)  # the start of a batch the crash tore

    node.start()
    cluster.wait_serving(node)
    cluster.wait_cluster_ready()
    assert member_metric(node, "strom_storage_recovery_truncations_total", topic=TOPIC) == 1
    cut = member_metric(node, "strom_storage_recovery_truncated_bytes_total", topic=TOPIC)
    assert cut == TORN
    tp = TopicPartition(TOPIC, 0)
    got: list[bytes] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])

        def all_read() -> bool:
            got.extend(r.value for r in c.poll(timeout_ms=200))
            return len(got) >= RECORDS

        wait_for(all_read, timeout=30, what="every record read back")
        assert c.end_offsets([tp])[tp] == RECORDS
    assert got == sent
