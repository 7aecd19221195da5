"""A replica folder whose partition.metadata records another topic id is set aside, not
deleted, and an operator can put it back.

Found from outside (/tmp/rev-incident/repro_topicid.sh): one hex digit changed in an RF=1
replica's ``partition.metadata`` made the restarted storage node delete the partition's whole
log ("deleting local replicas: logs-2" at info level, high watermark 13490 -> 267, 8.7 MB ->
100 KB), with no metric and no alert. The node now renames the folder aside as it does strays
(``<topic>-<p>-stray-<time>``), warns naming the folder, both ids and where it went, counts it
(``strom_storage_replicas_set_aside_total{reason="topic_id_mismatch"}``), and starts the
partition empty; the runbook in docs/reliability.md ("Replicas set aside") gets every record
back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import wait_for
from strom.storage.manager import read_topic_id, write_topic_id
from tests.conftest import create_topic, member_metric

pytestmark = pytest.mark.integration
TOPIC = "logs"
RECORDS = 300


def _read_all(bootstrap: str, expect: int) -> list[bytes]:
    """The partition's values from its start, once ``expect`` of them were read."""
    tp = TopicPartition(TOPIC, 0)
    out: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])

        def all_read() -> bool:
            out.extend(r.value for r in c.poll(timeout_ms=200))
            return len(out) >= expect

        wait_for(all_read, timeout=30, what=f"{expect} records read back")
        assert c.end_offsets([tp])[tp] == expect
    return out


def _restart(cluster: LocalCluster, node: Member) -> None:
    node.start()
    cluster.wait_serving(node)
    cluster.wait_cluster_ready()


def _flip_one_digit(metadata: Path) -> str:
    """Change the first character of the recorded topic id (what repro_topicid.sh does)."""
    text = metadata.read_text()
    i = text.index("topic_id: ") + len("topic_id: ")
    metadata.write_text(text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1 :])
    flipped = read_topic_id(metadata.parent)
    assert flipped is not None
    return flipped


def test_a_damaged_topic_id_sets_the_rf1_replica_aside_and_the_runbook_restores_it(
    make_cluster,
) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    node = cluster.nodes[0]
    data_dir = Path(node.argv[node.argv.index("--data-dir") + 1])
    folder = data_dir / f"{TOPIC}-0"
    create_topic(cluster, TOPIC)
    sent = [b"v%d" % i for i in range(RECORDS)]
    with Producer(cluster.bootstrap, acks="all") as p:
        for v in sent:
            p.send(TOPIC, value=v, partition=0)
        p.flush()
    assert node.process is not None and node.process.stop() == 0
    topic_id = read_topic_id(folder)
    assert topic_id is not None
    segments = {f.name: f.stat().st_size for f in folder.glob("*.log")}
    damaged = _flip_one_digit(folder / "partition.metadata")
    log_size = node.log_path.stat().st_size

    _restart(cluster, node)
    wait_for(
        lambda: list(data_dir.glob(f"{TOPIC}-0-stray-*")),
        timeout=30,
        what="the folder with the damaged id set aside",
    )
    (aside,) = data_dir.glob(f"{TOPIC}-0-stray-*")
    # Every record is still on disk, under the damaged id, for the operator.
    assert {f.name: f.stat().st_size for f in aside.glob("*.log")} == segments
    assert read_topic_id(aside) == damaged
    # The partition started empty under the cluster's id, as the assigned topic's.
    assert read_topic_id(folder) == topic_id
    with Consumer(cluster.bootstrap) as c:
        tp = TopicPartition(TOPIC, 0)
        assert c.end_offsets([tp])[tp] == 0
    with open(node.log_path, "rb") as f:
        f.seek(log_size)
        lines = [json.loads(x) for x in f.read().decode().splitlines() if x.startswith("{")]
    (warned,) = [x for x in lines if "records topic id" in x["msg"]]
    assert warned["level"] == "warning"
    for part in (str(folder), damaged, topic_id, str(aside), f"log end offset {RECORDS}"):
        assert part in warned["msg"], part
    assert not [x for x in lines if "deleting local replicas" in x["msg"]]
    labels = {"reason": "topic_id_mismatch", "topic": TOPIC}
    assert member_metric(node, "strom_storage_replicas_set_aside_total", **labels) == 1

    # The runbook: stop the node, put the folder back under its name with the topic's id.
    assert node.process is not None and node.process.stop() == 0
    shutil.rmtree(folder)  # nothing was written to the empty partition meanwhile
    aside.rename(folder)
    write_topic_id(folder, topic_id, fsync=True)
    _restart(cluster, node)
    assert _read_all(cluster.bootstrap, RECORDS) == sent
    with Producer(cluster.bootstrap, acks="all") as p:
        assert p.send(TOPIC, value=b"after", partition=0).result(timeout=30).offset == RECORDS
