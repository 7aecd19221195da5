"""Topics with the longest legal names (249 characters) deleted and created again, on the
session's three-node cluster.

Found from outside: a storage node deleted a replica by renaming ``<topic>-<p>`` to
``<topic>-<p>.deleted`` and set a stray aside as ``<topic>-<p>-stray-<time>``; from 246
(deleted) or 227 (stray) characters on the name passed 255 bytes, the rename failed, the
failure was only logged, the records stayed on disk, and a topic created again under the
name started with them on every replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import TopicDeletionInProgressError
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def _long(prefix: str, length: int = 249) -> str:
    return prefix + "x" * (length - len(prefix))


def _entries(cluster: LocalCluster, node_id: int, topic: str) -> list[str]:
    """What node ``node_id``'s data dir holds for ``topic`` (its replica folders, whether
    live, being deleted or set aside, all start with the topic's first 200 characters)."""
    data = cluster.root / f"node-{node_id}"
    return sorted(p.name for p in Path(data).iterdir() if p.name.startswith(topic[:200]))


def _produce(cluster: LocalCluster, topic: str, values: list[bytes]) -> list[int]:
    with Producer(cluster.bootstrap) as p:
        futures = [p.send(topic, v, partition=0) for v in values]
        return [f.result(timeout=30).offset for f in futures]


def _create_again(admin: Admin, topic: str, assignment: list[int]) -> None:
    def created() -> bool:
        try:
            admin.create_topic(topic, replica_assignment={0: assignment})
        except TopicDeletionInProgressError:
            return False
        return True

    wait_for(created, timeout=30, what=f"{topic[:20]}... created again")


def _read_from_the_start(cluster: LocalCluster, topic: str) -> list[tuple[int, bytes]]:
    """The partition's records from its log start, read once the end offset shows them."""
    tp = TopicPartition(topic, 0)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        got: list[tuple[int, bytes]] = []

        def all_read() -> bool:
            got.extend((r.offset, r.value) for r in c.poll(timeout_ms=200))
            return bool(got) and got[-1][0] >= end - 1

        wait_for(all_read, timeout=20, what="the partition read to its end")
        return got


def test_a_deleted_249_character_topic_leaves_nothing_and_its_successor_starts_empty(
    three_node_cluster: LocalCluster,
) -> None:
    cluster = three_node_cluster
    topic = _long("lgdel")
    create_topic(cluster, topic, 1, 3)
    assert _produce(cluster, topic, [b"old-%d" % i for i in range(10)]) == list(range(10))
    assert all(_entries(cluster, n, topic) == [f"{topic}-0"] for n in (1, 2, 3))
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic(topic)
        wait_for(
            lambda: not any(_entries(cluster, n, topic) for n in (1, 2, 3)),
            timeout=20,
            what="every replica of the deleted topic removed from disk",
        )
        _create_again(admin, topic, [1, 2, 3])
    assert _produce(cluster, topic, [b"new-0", b"new-1"]) == [0, 1]
    assert _read_from_the_start(cluster, topic) == [(0, b"new-0"), (1, b"new-1")]
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic(topic)


def test_a_stray_of_a_235_character_topic_is_set_aside_and_not_served_by_its_successor(
    three_node_cluster: LocalCluster,
) -> None:
    """Node 3 is down while the topic is deleted: at its start its replica is a stray, set
    aside under a name that fits (it failed, and stayed a log); the topic created again with
    node 3 as its leader starts empty instead of replicating the old records to the others.
    235 characters: short enough for the live replicas' old ``.deleted`` rename, too long
    for the stray one's."""
    cluster = three_node_cluster
    topic = _long("lgstray", 235)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, replica_assignment={0: [1, 2, 3]})
        assert _produce(cluster, topic, [b"old-%d" % i for i in range(10)]) == list(range(10))
        node3 = cluster.node(3)
        assert node3.process is not None
        node3.process.kill()  # SIGKILL
        admin.delete_topic(topic)
        wait_for(
            lambda: not _entries(cluster, 1, topic) and not _entries(cluster, 2, topic),
            timeout=20,
            what="the live replicas removed",
        )
        assert _entries(cluster, 3, topic) == [f"{topic}-0"]
        node3.start()
        cluster.wait_serving(node3)
        cluster.wait_cluster_ready()

        def set_aside() -> bool:
            names = _entries(cluster, 3, topic)
            return len(names) == 1 and "-0-stray-" in names[0]

        wait_for(set_aside, timeout=30, what="node 3's stray replica set aside")
        (aside,) = _entries(cluster, 3, topic)
        assert len(aside.encode()) <= 255
        _create_again(admin, topic, [3, 1, 2])
    assert _produce(cluster, topic, [b"new-0"]) == [0]
    assert _read_from_the_start(cluster, topic) == [(0, b"new-0")]
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic(topic)
