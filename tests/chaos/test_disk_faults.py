"""Disk faults on real storage nodes (issue 13).

- **Full disk**: the node's data dir is a small tmpfs (needs root to mount one; the test says
  so and skips otherwise). Produce fails for the partition with a clear STORAGE_ERROR naming
  the cause, Fetch keeps working, and once space is freed produce resumes; no torn batch is
  left, also across a crash and recovery.
- **Corrupted segment while down**: a follower is SIGKILLed, a byte in the middle of its
  segment is flipped and its tail torn off; at start it truncates at the last valid batch and
  re-fetches the rest from the leader, ending byte-identical to it.
- **Unreadable data dir**: the node refuses to start with one line naming the directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from strom import Admin, Producer
from strom.api import storage_pb2, storage_pb2_grpc
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import EtcdServer, free_port, wait_for
from strom.errors import ErrorCode as E
from strom.record import encode_batch
from tests.chaos.final import scan_log_dir
from tests.conftest import member_metric

pytestmark = pytest.mark.integration


def _require_mount(why: str) -> None:
    """Skip unless root (tmpfs mounts need it; the project's setup does not make the tests run
    as root, so this is an environment CI may lack, not a tool it installs); fail loudly when
    root lacks ``mount``, which Debian always has (util-linux), so a broken machine is not
    mistaken for one that cannot run the test."""
    if os.geteuid() != 0:
        # skip is justified: not root is a supported way to run the suite (see above).
        pytest.skip(f"{why}, and mounting a tmpfs needs root")
    if shutil.which("mount") is None:
        pytest.fail(f"{why}: running as root but the mount command is missing (install util-linux)")


def _mount_tmpfs(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


def _stub(address: str) -> storage_pb2_grpc.StorageServiceStub:
    return storage_pb2_grpc.StorageServiceStub(grpc.insecure_channel(address))


def _produce(
    address: str, topic: str, payload: bytes, epoch: int = 0
) -> storage_pb2.ProducePartitionResponse:
    """Produce ``payload`` to partition 0 (``epoch``: the leader epoch believed, -1 none)."""
    req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=10_000)
    req.topics.add(topic=topic).partitions.add(
        partition=0, records=encode_batch([payload]), current_leader_epoch=epoch
    )
    return _stub(address).Produce(req, timeout=30).topics[0].partitions[0]


def _fetch_all(address: str, topic: str) -> list[int]:
    """Offsets of every record of partition 0, read through Fetch from offset 0."""
    from strom.record import decode_batches

    offsets: list[int] = []
    pos = 0
    while True:
        req = storage_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=8 << 20)
        req.topics.add(topic=topic).partitions.add(
            partition=0, fetch_offset=pos, partition_max_bytes=8 << 20, current_leader_epoch=-1
        )
        pr = _stub(address).Fetch(req, timeout=30).topics[0].partitions[0]
        assert pr.error_code == E.NONE, pr.error_message
        if not pr.records:
            return offsets
        for b in decode_batches(pr.records):
            offsets.extend(r.offset for r in b.records())
            pos = b.last_offset + 1


# -- a full disk ----------------------------------------------------------------------------


def _small_disk_cluster(tmp_path: Path, nodes: int, node: int, size: str) -> Iterator[LocalCluster]:
    """A cluster of ``nodes`` whose node ``node`` keeps its data on a tmpfs of ``size``."""
    _require_mount("a full disk needs a small tmpfs")
    root = tmp_path / "c"
    _mount_tmpfs(root / f"node-{node}", size)
    c = LocalCluster(root, nodes=nodes, controllers=1, coordinators=0)
    try:
        c.start()
        yield c
    finally:
        c.kill()
        _umount(root / f"node-{node}")


@pytest.fixture
def full_disk_node(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _small_disk_cluster(tmp_path, 1, 1, "12m")


def test_full_disk_fails_produce_clearly_keeps_fetch_and_resumes(
    full_disk_node: LocalCluster,
) -> None:
    c = full_disk_node
    node = c.nodes[0]
    data = c.root / "node-1"
    with Admin(c.bootstrap) as admin:
        admin.create_topic(
            "full",
            partitions=1,
            replication_factor=1,
            config={"segment.bytes": str(1 << 20), "segment.index.bytes": str(64 << 10)},
        )
    ballast = data / "ballast"
    ballast.write_bytes(b"\0" * (3 << 20))  # freed later, as an operator would free space
    acked: list[int] = []
    # The partition takes produce once the node created its log (Metadata can show the
    # controller's decision a moment before): retry until the first record is in.
    deadline = time.monotonic() + 30
    while True:
        pr = _produce(node.address, "full", os.urandom(100_000))
        if pr.error_code == E.NONE or time.monotonic() > deadline:
            break
        assert pr.error_code in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_LEADER_OR_FOLLOWER), pr
        time.sleep(0.1)
    assert pr.error_code == E.NONE, pr
    acked.append(pr.base_offset)
    error = None
    for _ in range(200):
        pr = _produce(node.address, "full", os.urandom(100_000))
        if pr.error_code != E.NONE:
            error = pr
            break
        acked.append(pr.base_offset)
    assert error is not None, "the 12 MiB disk never filled up"
    assert error.error_code == E.STORAGE_ERROR, error
    assert "No space left" in error.error_message, error.error_message
    assert node.alive()
    # Fetch still works, and everything acknowledged is there, in order.
    assert _fetch_all(node.address, "full") == acked
    # Space comes back: produce resumes (the node is not stuck in a failed state).
    ballast.unlink()
    wait_for(
        lambda: _produce(node.address, "full", b"after").error_code == E.NONE,
        timeout=30,
        what="produce to succeed once space was freed",
    )
    offsets = _fetch_all(node.address, "full")
    assert offsets[: len(acked)] == acked and offsets == list(range(len(offsets)))
    # No torn batch on disk, also after a crash and the recovery that follows.
    scan = scan_log_dir(data / "full-0")
    assert scan["problems"] == [] and [b[0] for b in scan["batches"]] == offsets
    node.process.kill()  # type: ignore[union-attr]
    c.restart(node)
    # (Its only replica died: the partition has no leader until the controller elects the
    # restarted node again, a moment after it registers; CI fetched in between.)
    restarted = wait_for(
        lambda: _fetch_all(node.address, "full"),
        timeout=30,
        what="the restarted node leading full-0 again",
    )
    assert restarted == offsets


# -- a leader whose disk is full --------------------------------------------------------------


@pytest.fixture
def third_node_on_small_disk(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _small_disk_cluster(tmp_path, 3, 3, "16m")


def _fill(path: Path) -> None:
    """Write ``path`` until the file system it is on has no space left."""
    chunk = b"\0" * (256 << 10)
    with open(path, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)


def test_a_leader_whose_disk_is_full_hands_leadership_over_and_catches_up_once_freed(
    third_node_on_small_disk: LocalCluster,
) -> None:
    """Found from outside: node 3, leading an RF=3 partition (min.insync.replicas=2) on a
    full disk, refused every produce with STORAGE_ERROR and kept leading (the ISR stayed
    3,2,1) until the producer's delivery timeout, while two in-sync replicas stood by; as a
    follower on a full disk it logged a traceback a second. Its first failed append now has
    it resign (reason storage_error): the producer's retries go to the new leader and every
    record is acknowledged; as a follower it copies nothing while its disk stays full (it
    would otherwise rejoin the ISR at once, the partition having taken no write since, and
    lead again as the preferred replica), and a partition it only follows fails its append
    once, counted and logged in one line; once space is freed it catches up on both,
    rejoins the ISRs and leads again."""
    c = third_node_on_small_disk
    node3 = c.node(3)
    data = c.root / "node-3"
    topic = "fullleader"
    with Admin(c.bootstrap) as admin:
        admin.create_topic(
            topic,
            config={"min.insync.replicas": "2", "segment.bytes": str(1 << 20)},
            replica_assignment={0: [3, 1, 2]},
        )
        # And one that node 3 only follows.
        admin.create_topic("fullfollower", replica_assignment={0: [1, 2, 3]})

        def partition(name: str = topic) -> Any:
            return admin.describe_topic(name).partitions[0]

        wait_for(
            lambda: len(partition("fullfollower").isr) == 3,
            timeout=30,
            what="every replica of fullfollower in sync",
        )

        wait_for(
            lambda: partition().leader == 3 and len(partition().isr) == 3,
            timeout=30,
            what="node 3 to lead with every replica in sync",
        )
        with Producer(c.bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=60_000) as p:
            p.send(topic, b"before", partition=0).result(timeout=60)
            _fill(data / "ballast")
            futures = [p.send(topic, b"%05d" % i + b"." * 1000, partition=0) for i in range(300)]
            offsets = [f.result(timeout=90).offset for f in futures]
        assert offsets == list(range(1, 301))
        after = partition()
        assert after.leader in (1, 2) and 3 not in after.isr, after
        controller = c.controllers[0]
        assert (
            member_metric(
                controller, "strom_controller_leader_elections_total", reason="storage_error"
            )
            >= 1
        )
        # While its disk stays full node 3 copies nothing (it holds its fetches back), so it
        # neither rejoins the ISR nor is given leadership back as the preferred replica.
        with Producer(c.bootstrap, acks="all") as p:
            assert p.send(topic, b"while full", partition=0).result(timeout=60).offset == 301
        after = partition()
        assert after.leader in (1, 2) and 3 not in after.isr, after
        failures = {"topic": topic, "partition": "0", "errno": "ENOSPC"}
        assert member_metric(node3, "strom_storage_append_failures_total", **failures) >= 1
        # A follower's append that the full disk refuses: counted and logged in one line
        # (not a traceback a second), and it copies nothing more until there is room.
        with Producer(c.bootstrap, acks=1) as p:
            p.send("fullfollower", b"x" * 1000, partition=0).result(timeout=60)
        followed = {"topic": "fullfollower", "partition": "0", "errno": "ENOSPC"}
        wait_for(
            lambda: member_metric(node3, "strom_storage_append_failures_total", **followed) >= 1,
            timeout=30,
            what="node 3's append as follower to fail",
        )
        # Space comes back: node 3 copies what it missed, rejoins the ISR and, as the
        # preferred replica, is given leadership back (auto leader rebalance).
        (data / "ballast").unlink()
        wait_for(
            lambda: partition().leader == 3 and len(partition().isr) == 3,
            timeout=60,
            what="node 3 to catch up and lead again",
        )
        wait_for(
            lambda: len(partition("fullfollower").isr) == 3,
            timeout=60,
            what="node 3 back in fullfollower's ISR",
        )
        text = node3.log_path.read_text()
        for name in (topic, "fullfollower"):
            assert f"replicating {name}-0 from node" not in text  # no traceback per retry
        assert text.count("fullfollower-0: replicating from node 1: the disk refused") == 1
        with Producer(c.bootstrap, acks="all") as p:
            assert p.send(topic, b"after", partition=0).result(timeout=60).offset == 302
    ndir = c.root / f"node-{after.leader}" / f"{topic}-0"
    wait_for(
        lambda: scan_log_dir(data / f"{topic}-0")["batches"] == scan_log_dir(ndir)["batches"],
        timeout=30,
        what="node 3's copy to match the other replicas'",
    )


def test_a_node_stopped_and_restarted_on_a_full_disk_names_the_file_and_starts(
    full_disk_node: LocalCluster,
) -> None:
    """Found from outside: on a 100 % full disk, SIGTERM ended with ``[Errno 28] No space
    left on device`` (no file, no clean-shutdown marker) and every restart exited with
    ``cannot open data dir ...: [Errno 28]`` (rewriting recovered indexes). Now the stop
    names the file and how to free space, and the node starts with its indexes in memory,
    serves what it holds, and takes produce again once space is freed."""
    c = full_disk_node
    node = c.nodes[0]
    data = c.root / "node-1"
    with Admin(c.bootstrap) as admin:
        admin.create_topic(
            "fill", partitions=1, replication_factor=1, config={"segment.bytes": str(1 << 20)}
        )
    wait_for(
        lambda: _produce(node.address, "fill", b"first").error_code == E.NONE,
        timeout=30,
        what="the node to take produce",
    )
    acked = [0]
    for _ in range(200):
        pr = _produce(node.address, "fill", os.urandom(100_000))
        if pr.error_code != E.NONE:
            break
        acked.append(pr.base_offset)
    assert pr.error_code == E.STORAGE_ERROR, pr
    filler = data / "filler"
    _fill(filler)  # the last pages: 100 % full
    assert node.process is not None
    assert node.process.stop(timeout=30) == 1
    said = node.log_path.read_text()
    assert "No space left on device (writing " + str(data) in said, said[-2000:]
    assert "delete-records" in said
    node.start()
    c.wait_serving(node)
    wait_for(
        lambda: _fetch_all(node.address, "fill") == acked,
        timeout=30,
        what="the restarted node to serve every acknowledged record",
    )
    filler.unlink()
    wait_for(  # the restart made a new leader epoch: produce without checking it
        lambda: _produce(node.address, "fill", b"after", epoch=-1).error_code == E.NONE,
        timeout=30,
        what="produce to succeed once space was freed",
    )


# -- a segment corrupted while the node was down ---------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("disk") / "c", nodes=3, controllers=1, coordinators=0)
    try:
        c.start()
        yield c
    finally:
        c.kill()


def _leader_and_follower(c: LocalCluster, topic: str) -> tuple[Member, Member]:
    md = _stub(c.nodes[0].address).Metadata(storage_pb2.MetadataRequest(topics=[topic]), timeout=10)
    p = md.topics[0].partitions[0]
    leader = c.node(p.leader)
    follower = c.node(next(r for r in p.replicas if r != p.leader))
    return leader, follower


def test_a_segment_corrupted_while_down_is_truncated_and_fetched_again(
    cluster: LocalCluster,
) -> None:
    c = cluster
    with Admin(c.bootstrap) as admin:
        admin.create_topic(
            "corrupt", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
        )
    with Producer(c.bootstrap, linger_ms=0, batch_size=4096) as p:
        for i in range(400):
            p.send("corrupt", b"record-%05d" % i + b"." * 200, partition=0)
        p.flush()
    leader, follower = _leader_and_follower(c, "corrupt")
    fdir = c.root / f"node-{follower.ident}" / "corrupt-0"
    wait_for(
        lambda: scan_log_dir(fdir)["batches"][-1][1] == 399,
        timeout=30,
        what="the follower to have every record",
    )
    follower.process.kill()  # type: ignore[union-attr]  # a crash: no clean-shutdown marker
    seg = sorted(fdir.glob("*.log"))[-1]
    data = bytearray(seg.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0xFF  # a flipped byte inside some batch in the middle
    del data[len(data) - 100 :]  # and a torn tail
    seg.write_bytes(bytes(data))
    c.restart(follower)
    lscan = c.root / f"node-{leader.ident}" / "corrupt-0"

    def identical() -> bool:
        f, lead = scan_log_dir(fdir), scan_log_dir(lscan)
        return not f["problems"] and f["batches"] == lead["batches"]

    wait_for(identical, timeout=60, what="the follower to re-fetch and match the leader")
    log_text = follower.log_path.read_text()
    assert "truncat" in log_text.lower(), "recovery did not report the truncation"


def test_a_segment_that_lost_batches_while_down_is_truncated_and_fetched_again(
    cluster: LocalCluster,
) -> None:
    """Found from outside: a middle segment's .log emptied while the node was down has no
    torn batch to cut, so the replica started with a hole, said nothing, served reads that
    jumped it and rejoined the ISR. It now truncates at the hole, says so and re-fetches."""
    c = cluster
    with Admin(c.bootstrap) as admin:
        admin.create_topic(
            "holed",
            partitions=1,
            replication_factor=3,
            config={"min.insync.replicas": "2", "segment.bytes": "8192"},
        )
    with Producer(c.bootstrap, linger_ms=0, batch_size=4096) as p:
        for i in range(400):
            p.send("holed", b"record-%05d" % i + b"." * 200, partition=0)
        p.flush()
    leader, follower = _leader_and_follower(c, "holed")
    fdir = c.root / f"node-{follower.ident}" / "holed-0"
    wait_for(
        lambda: scan_log_dir(fdir)["batches"][-1][1] == 399,
        timeout=30,
        what="the follower to have every record",
    )
    follower.process.kill()  # type: ignore[union-attr]
    segs = sorted(fdir.glob("*.log"))
    assert len(segs) >= 4
    segs[1].write_bytes(b"")  # a middle segment lost all its batches
    c.restart(follower)
    lscan = c.root / f"node-{leader.ident}" / "holed-0"

    def identical() -> bool:
        f, lead = scan_log_dir(fdir), scan_log_dir(lscan)
        return not f["problems"] and f["batches"] == lead["batches"]

    wait_for(identical, timeout=60, what="the follower to re-fetch and match the leader")
    log_text = follower.log_path.read_text()
    assert f"{segs[1].name}: ends at offset" in log_text, "recovery did not report the hole"


# -- a data dir the node cannot use -----------------------------------------------------------


def test_an_unusable_data_dir_fails_the_start_naming_it(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd").start()
    data = tmp_path / "data"
    data.mkdir()
    try:
        if os.geteuid() == 0:
            _require_mount("root ignores permissions: an unusable dir needs a read-only tmpfs")
            _mount_tmpfs(data, "1m", "ro")  # root ignores permissions, not a read-only mount
        else:
            data.chmod(0)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "strom.cli.main",
                "storage-node",
                "--node-id",
                "7",
                "--data-dir",
                str(data / "logs"),
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--metrics-port",
                "-1",
                "--etcd",
                etcd.endpoint,
                "--cluster",
                "diskfault",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        with contextlib.suppress(OSError):
            data.chmod(0o755)
        if os.geteuid() == 0:
            _umount(data)
        etcd.kill()
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert str(data / "logs") in lines[-1], proc.stderr
    assert lines[-1].startswith("strom storage-node: error:"), proc.stderr
