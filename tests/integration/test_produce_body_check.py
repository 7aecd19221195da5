"""Batch bodies a reader cannot decode, against a real storage-node process (found from
outside: a raw Produce, acks=-1, of garbage under a valid header and CRC was acknowledged,
then every reader stopped at it for good; ListOffsets by time over it answered
UNKNOWN_SERVER_ERROR with a traceback in the node's log every time).

etcd and one storage node; partition states are written into etcd by the test (as
``test_storage_node`` does). Waiting is on conditions, never fixed sleeps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strom.devcluster.procs import EtcdServer, wait_for
from strom.errors import ErrorCode as E
from strom.record import encode_batch
from tests.integration.test_storage_node import (
    Cluster,
    fetch_one,
    list_offset,
    produce_one,
    values_of,
    wait_hosted,
)
from tests.unit.reframe import garbage_body_variants, rot_stored_body

pytestmark = pytest.mark.integration

LATEST = -1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("bodycheck")
    etcd = EtcdServer(root).start()
    c = Cluster(etcd, root)
    try:
        c.node(1).start()
        yield c
    finally:
        for n in c.nodes.values():
            n.close()
        c.store.close()
        etcd.kill()


def node_log(cluster: Cluster) -> str:
    return (cluster.root / "node-1.log").read_text(errors="replace")


def test_produce_refuses_each_garbage_body_and_appends_nothing(cluster: Cluster) -> None:
    """Each variant: CORRUPT_MESSAGE naming the partition and the batch, the log end
    unchanged, and a good batch after it takes offset 0 and reads back."""
    n1 = cluster.node(1)
    good = encode_batch([b"a", b"b", b"c"])
    variants = garbage_body_variants(good)
    cluster.create_topic("bv", {p: [1] for p in range(len(variants))})
    wait_hosted(n1, "bv", list(range(len(variants))))
    for p, (name, bad) in enumerate(sorted(variants.items())):
        r = produce_one(n1, "bv", p, bad, acks=-1)
        assert r.error_code == E.CORRUPT_MESSAGE, (name, r.error_message)
        assert f"bv-{p}: batch at byte 0" in r.error_message, (name, r.error_message)
        assert list_offset(n1, "bv", p, LATEST).offset == 0, name
        ok = produce_one(n1, "bv", p, good, acks=-1)
        assert (ok.error_code, ok.base_offset) == (E.NONE, 0), name
        values = values_of(fetch_one(n1, "bv", p, 0).records)
        assert values == [(0, b"a"), (1, b"b"), (2, b"c")], name
    assert "Traceback" not in node_log(cluster)


def test_list_offsets_by_time_over_a_stored_undecodable_batch(cluster: Cluster) -> None:
    """A batch stored before the append check (or rotted on disk under a recomputed CRC):
    ListOffsets by a time it holds answers CORRUPT_MESSAGE naming the partition and the
    batch's offset, without a traceback; times it does not hold still answer."""
    n1 = cluster.node(1)
    cluster.create_topic("ts", {0: [1]})
    wait_hosted(n1, "ts", [0])
    t0 = 1_700_000_000_000
    for i in range(3):
        stamps = [t0 + 10 * i, t0 + 10 * i + 1]
        r = produce_one(n1, "ts", 0, encode_batch([b"x", b"y"], timestamps=stamps), acks=-1)
        assert r.error_code == E.NONE
    wait_for(
        lambda: list_offset(n1, "ts", 0, LATEST).offset == 6, timeout=10, what="high watermark 6"
    )
    rot_stored_body(n1.data_dir / "ts-0", 2)
    bad = list_offset(n1, "ts", 0, t0 + 5)  # the first record at or after it is offset 2
    assert bad.error_code == E.CORRUPT_MESSAGE, bad.error_message
    assert "ts-0" in bad.error_message and "batch at offset 2" in bad.error_message
    assert list_offset(n1, "ts", 0, t0).offset == 0
    assert list_offset(n1, "ts", 0, t0 + 15).offset == 4
    assert "Traceback" not in node_log(cluster)


def test_repeated_time_lookups_over_an_undecodable_batch_log_once_a_window(
    cluster: Cluster,
) -> None:
    """Every lookup over the batch is refused CORRUPT_MESSAGE, but the node logs it once
    per window (CORRUPT_LOG_INTERVAL_S, 60 s), not once per request; the batch is the
    producer's bytes, not damage of this replica, so the node keeps leading the partition."""
    n1 = cluster.node(1)
    cluster.create_topic("tsw", {0: [1]})
    wait_hosted(n1, "tsw", [0])
    t0 = 1_700_000_000_000
    for i in range(2):
        stamps = [t0 + 10 * i, t0 + 10 * i + 1]
        r = produce_one(n1, "tsw", 0, encode_batch([b"x", b"y"], timestamps=stamps), acks=-1)
        assert r.error_code == E.NONE
    wait_for(
        lambda: list_offset(n1, "tsw", 0, LATEST).offset == 4, timeout=10, what="high watermark 4"
    )
    rot_stored_body(n1.data_dir / "tsw-0", 2)
    for _ in range(20):
        bad = list_offset(n1, "tsw", 0, t0 + 5)
        assert bad.error_code == E.CORRUPT_MESSAGE, bad.error_message
    lines = [line for line in node_log(cluster).splitlines() if "tsw-0: batch" in line]
    assert len(lines) == 1 and "batch at offset 2" in lines[0], lines
    # Still the leader: reads and writes of the partition are served.
    assert fetch_one(n1, "tsw", 0, 0).error_code == E.NONE
    more = produce_one(n1, "tsw", 0, encode_batch([b"z"]), acks=-1)
    assert (more.error_code, more.base_offset) == (E.NONE, 4), more.error_message
