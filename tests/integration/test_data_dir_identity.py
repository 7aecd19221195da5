"""A storage node restarted on its data dir with the wrong identity refuses to start.

Found from outside: node 1 restarted on its data dir with ``--node-id 7`` (or ``--cluster``
naming another initialised cluster in the same etcd) saw every replica there as a stray and
deleted them all within seconds; an RF=1 topic came back empty when the right node returned.
The data dir now records its node id, cluster name and cluster id (``meta.properties``), and a
start that does not match exits with one line before it touches anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from strom.api import metadata_pb2 as md
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.client.types import TopicPartition
from strom.devcluster.cluster import LocalCluster, Member
from strom.devcluster.procs import ManagedProcess, wait_for
from strom.metadata import MetadataStore
from strom.storage.identity import IDENTITY_FILE, Identity, read_identity
from tests.conftest import create_topic

pytestmark = pytest.mark.integration
TOPIC = "precious"
RECORDS = 50
SEGMENT = "00000000000000000000.log"


def _files(data_dir: Path) -> dict[str, int]:
    """Every file under the data dir with its size (what must not change)."""
    return {
        str(p.relative_to(data_dir)): p.stat().st_size for p in data_dir.rglob("*") if p.is_file()
    }


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def _refused(argv: list[str]) -> str:
    """Run a storage node that must refuse to start; its one error line, the last it prints
    (its log lines go to stderr too)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("strom storage-node: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    return errors[0]


def _fill_and_stop(cluster: LocalCluster, node: Member, partitions: int) -> list[bytes]:
    """Create TOPIC, write RECORDS values spread over its partitions, stop the node
    cleanly; the values sent."""
    create_topic(cluster, TOPIC, partitions=partitions)
    sent = [b"v%d" % i for i in range(RECORDS)]
    with Producer(cluster.bootstrap, acks="all") as p:
        for i, v in enumerate(sent):
            p.send(TOPIC, value=v, partition=i % partitions)
        p.flush()
    assert node.process is not None
    assert node.process.stop() == 0
    return sent


def _read_all(bootstrap: str, partitions: int) -> list[bytes]:
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    out: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps)

        def all_read() -> bool:
            out.extend(r.value for r in c.poll(timeout_ms=200))
            return len(out) >= RECORDS

        wait_for(all_read, timeout=30, what="every record read back")
        assert sum(c.end_offsets(tps).values()) == RECORDS
    return out


def test_a_node_restarted_with_another_identity_refuses_and_keeps_its_replicas(
    make_cluster,
) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    node: Member = cluster.nodes[0]
    data_dir = Path(node.argv[node.argv.index("--data-dir") + 1])
    store = MetadataStore(cluster.etcd.endpoint, cluster.cluster_name)
    try:
        # The controller writes the cluster key once active, which may be after the node
        # started; the node records the cluster id when it first sees it.
        info = wait_for(
            lambda: store.get(store.keys.cluster, md.ClusterInfo),
            timeout=30,
            what="the cluster key",
        )
        cid = info.value.cluster_id
        wait_for(
            lambda: getattr(read_identity(data_dir), "cluster_id", None) == cid,
            timeout=30,
            what="the node recording the cluster id",
        )
        assert read_identity(data_dir) == Identity(node.ident, cluster.cluster_name, cid)

        sent = _fill_and_stop(cluster, node, 2)
        before = _files(data_dir)
        assert f"{TOPIC}-0/00000000000000000000.log" in before

        # Another node id: refused, naming the file, what it says and what the flags say.
        line = _refused(_with(node.argv, "--node-id", "7"))
        assert str(data_dir / IDENTITY_FILE) in line
        assert f"node {node.ident} of cluster 'strom' (id {cid})" in line
        assert "--node-id 7 --cluster strom" in line
        assert _files(data_dir) == before  # not even recovery: the clean marker is still there

        # Another cluster name, initialised in the same etcd.
        other = MetadataStore(cluster.etcd.endpoint, "other")
        try:
            other.create(other.keys.cluster, md.ClusterInfo(cluster_id="other-id", created_ms=1))
        finally:
            other.close()
        line = _refused(_with(node.argv, "--cluster", "other"))
        assert f"--node-id {node.ident} --cluster other" in line and IDENTITY_FILE in line
        assert _files(data_dir) == before

        # The same cluster name created again (another cluster id in etcd).
        store.put(store.keys.cluster, md.ClusterInfo(cluster_id="re-created", created_ms=2))
        line = _refused(node.argv)
        assert "now has id re-created" in line and f"(id {cid})" in line
        assert _files(data_dir) == before
        store.put(store.keys.cluster, info.value)

        # The right flags serve every record.
        node.start()
        cluster.wait_serving(node)
        assert sorted(_read_all(cluster.bootstrap, 2)) == sorted(sent)
    finally:
        store.close()


def test_an_older_strom_s_data_dir_is_adopted_and_its_strays_wait_for_the_next_start(
    make_cluster,
) -> None:
    """A data dir without meta.properties (written before it existed) takes the flags'
    identity, confirmed by the cluster (it assigns the node the dir's log and nobody else the
    stray), but its stray logs are set aside (renamed, kept for an operator to remove) only
    from the next start on, once the recorded identity matched."""
    cluster: LocalCluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    node: Member = cluster.nodes[0]
    data_dir = Path(node.argv[node.argv.index("--data-dir") + 1])
    sent = _fill_and_stop(cluster, node, 1)
    (data_dir / IDENTITY_FILE).unlink()
    shutil.copytree(data_dir / f"{TOPIC}-0", data_dir / "ghost-0")  # no such topic: a stray
    ghost = (data_dir / "ghost-0" / SEGMENT).read_bytes()

    node.start()
    cluster.wait_serving(node)  # after the start's first (full) reconcile
    assert (data_dir / "ghost-0").is_dir()
    rec = read_identity(data_dir)
    assert rec is not None and not rec.adopted
    assert "no meta.properties (written by an older strom)" in node.log_path.read_text()

    cluster.restart(node)
    wait_for(lambda: not (data_dir / "ghost-0").exists(), timeout=20, what="the stray set aside")
    (aside,) = data_dir.glob("ghost-0-stray-*")
    assert (aside / SEGMENT).read_bytes() == ghost  # its records kept
    assert sorted(_read_all(cluster.bootstrap, 1)) == sorted(sent)


def test_an_older_strom_s_data_dir_started_with_a_wrong_node_id_locks_nothing_in(
    make_cluster, tmp_path: Path
) -> None:
    """Found from outside: an older strom's data dir (no meta.properties) started once with a
    wrong --node-id recorded that id as its own, the right id was refused (and told to use
    the wrong one), and the next start with the wrong id deleted every replica, an RF=1
    topic's records with them. Now a wrong id the cluster contradicts is refused without
    recording anything; one adopted while the cluster cannot tell (here another, empty
    --cluster) is recorded as unconfirmed, deletes nothing, and the right flags are told how
    to undo it; the right id then serves every record."""
    cluster: LocalCluster = make_cluster(nodes=1, controllers=1, coordinators=0)
    node: Member = cluster.nodes[0]
    data_dir = Path(node.argv[node.argv.index("--data-dir") + 1])
    sent = _fill_and_stop(cluster, node, 2)
    (data_dir / IDENTITY_FILE).unlink()  # as an older strom left it
    before = _files(data_dir)
    segments = {k: v for k, v in before.items() if k.endswith(".log")}
    assert len(segments) == 2

    # A wrong id: the cluster assigns none of the dir's logs to node 7. Refused, nothing
    # recorded, so the next try is refused the same way.
    wrong = _with(node.argv, "--node-id", "7")
    for _ in range(2):
        line = _refused(wrong)
        assert str(data_dir) in line and "no meta.properties" in line
        assert "assigns none of them to node 7" in line
        assert f"(it assigns {TOPIC}-0, {TOPIC}-1 to node {node.ident})" in line
        assert _files(data_dir) == before

    # A wrong id and a --cluster nothing is known of: adopted, unconfirmed, nothing deleted.
    stranger = ManagedProcess("wrong-node", _with(wrong, "--cluster", "fresh"), tmp_path / "w.log")
    stranger.start()
    try:
        wait_for(
            lambda: "node 7 running" in stranger.log_tail(200) or not stranger.alive(),
            timeout=30,
            what="the node started with the wrong flags running",
        )
        assert "is not confirmed: the cluster is not initialised yet" in stranger.log_tail(200)
    finally:
        assert stranger.stop() == 0, stranger.log_tail()
    adopted = read_identity(data_dir)
    assert adopted is not None and adopted.adopted and adopted.node_id == 7
    assert {k: v for k, v in _files(data_dir).items() if k.endswith(".log")} == segments

    # The right flags are not sent to node 7: told it was adopted and how to undo it.
    line = _refused(node.argv)
    assert "node 7 of cluster 'fresh'" in line and f"on {adopted.adopted}" in line
    assert f"remove {data_dir / IDENTITY_FILE} and start again" in line
    (data_dir / IDENTITY_FILE).unlink()

    node.start()
    cluster.wait_serving(node)
    assert sorted(_read_all(cluster.bootstrap, 2)) == sorted(sent)
    rec = read_identity(data_dir)
    assert rec is not None and (rec.node_id, rec.adopted) == (node.ident, "")  # confirmed
