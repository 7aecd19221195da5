"""The data dir's identity file (strom.storage.identity): written once, checked every start.

A node started on an existing data dir with the wrong --node-id or --cluster deleted every
replica there as a stray (found from outside); these are the checks that now refuse it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.api import metadata_pb2 as md
from strom.storage.identity import (
    IDENTITY_FILE,
    Agreement,
    DataDirIdentity,
    Identity,
    IdentityError,
    cluster_agreement,
    parse_identity,
    read_identity,
)

CID = "5b8e2c1e-0000-4000-8000-000000000001"


def started(
    data_dir: Path,
    node_id: int = 1,
    cluster: str = "strom",
    cid: str = CID,
    agreement: Agreement | None = None,
):
    """A node's identity check as a start runs it: flags first, then the cluster id (and,
    for an identity not confirmed yet, what the cluster says of the dir's logs)."""
    ident = DataDirIdentity(data_dir, node_id, cluster, fsync=False)
    ident.check_flags()
    ident.settle(cid, agreement if not ident.confirmed else None)
    return ident


#: The dir's two logs: the cluster assigns both to this node.
AGREES = Agreement(logs=2, mine=2)
#: It assigns one to this node and the other only to node 3.
CONTESTED = Agreement(logs=2, mine=1, elsewhere={("orders", 3): (3,)})
#: It assigns neither to this node (a wrong --node-id on an older strom's dir).
DISAGREES = Agreement(logs=2, mine=0, elsewhere={("orders", 3): (3,), ("orders", 4): (2, 3)})


def test_a_new_data_dir_records_the_node_and_cluster(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ident = started(data)
    assert read_identity(data) == Identity(1, "strom", CID)
    assert ident.may_set_aside_strays(CID) and not ident.adopted
    assert [p.name for p in data.iterdir()] == [IDENTITY_FILE]  # no temp file left
    # The next start finds the same identity and goes on.
    again = started(data)
    assert again.may_set_aside_strays(CID)


def test_the_flags_are_checked_without_touching_the_dir(tmp_path: Path) -> None:
    """A start refused later (a node id in use) must leave no trace: nothing is created."""
    data = tmp_path / "data"
    DataDirIdentity(data, 1, "strom").check_flags()
    assert not data.exists()


@pytest.mark.parametrize(
    ("node_id", "cluster", "flags"),
    [(7, "strom", "--node-id 7 --cluster strom"), (1, "other", "--node-id 1 --cluster other")],
)
def test_another_node_id_or_cluster_name_is_refused(
    tmp_path: Path, node_id: int, cluster: str, flags: str
) -> None:
    data = tmp_path / "data"
    started(data)
    (data / "t-0").mkdir()
    before = (data / IDENTITY_FILE).read_bytes()
    with pytest.raises(IdentityError) as err:
        DataDirIdentity(data, node_id, cluster).check_flags()
    msg = str(err.value)
    assert "\n" not in msg
    assert str(data / IDENTITY_FILE) in msg
    assert f"node 1 of cluster 'strom' (id {CID})" in msg  # what the file says
    assert f"started with {flags}" in msg  # what the flags say
    assert "--node-id 1 --cluster strom" in msg and "empty --data-dir" in msg  # the way out
    assert (data / IDENTITY_FILE).read_bytes() == before
    assert (data / "t-0").is_dir()


def test_a_changed_cluster_id_is_refused(tmp_path: Path) -> None:
    """The cluster was created again under the same name: the data is not its."""
    data = tmp_path / "data"
    started(data)
    ident = DataDirIdentity(data, 1, "strom")
    ident.check_flags()
    with pytest.raises(IdentityError, match=r"now has id other-id .*created again"):
        ident.settle("other-id")
    assert not ident.may_set_aside_strays("other-id")
    assert read_identity(data) == Identity(1, "strom", CID)


def test_the_cluster_id_is_recorded_once_known(tmp_path: Path) -> None:
    """A node may start before any controller wrote the cluster key: it records the id when
    it sees it, and deletes no stray before."""
    data = tmp_path / "data"
    ident = started(data, cid="")
    assert read_identity(data) == Identity(1, "strom", "")
    assert not ident.may_set_aside_strays("")
    assert not ident.check_cluster_id(CID)  # nothing to compare with yet
    ident.settle(CID)
    assert read_identity(data) == Identity(1, "strom", CID)
    assert ident.check_cluster_id(CID) and ident.may_set_aside_strays(CID)
    # An unknown id later (the cluster key gone) does not erase the recorded one.
    ident.settle("")
    assert read_identity(data) == Identity(1, "strom", CID)


def test_an_older_strom_s_data_dir_is_adopted_but_keeps_its_strays_on_that_start(
    tmp_path: Path,
) -> None:
    """The cluster confirms the flags (it assigns this node logs of the dir and nobody else
    the rest): recorded as confirmed, strays deleted from the next start on."""
    data = tmp_path / "data"
    (data / "orders-3").mkdir(parents=True)
    ident = started(data, agreement=AGREES)
    assert ident.adopted
    assert read_identity(data) == Identity(1, "strom", CID)
    assert not ident.may_set_aside_strays(CID)  # confirmed during this start: from the next
    assert started(data).may_set_aside_strays(CID)


def test_an_adoption_the_cluster_cannot_confirm_yet_is_recorded_as_unconfirmed(
    tmp_path: Path,
) -> None:
    """Found from outside: an older strom's dir started once with a wrong --node-id recorded
    that id as confirmed, and the next start with it deleted every replica. Unconfirmed (the
    cluster not initialised yet, or some logs assigned only to other nodes), the file says
    so, no stray is deleted at any start, and the cluster's agreement later confirms it."""
    data = tmp_path / "data"
    (data / "orders-3").mkdir(parents=True)
    ident = started(data, cid="")  # the cluster is not initialised
    rec = read_identity(data)
    assert rec is not None and rec.adopted and (rec.node_id, rec.cluster_id) == (1, "")
    assert "adopted=" in (data / IDENTITY_FILE).read_text()
    assert not ident.confirmed and not ident.may_set_aside_strays(CID)

    again = started(data, agreement=CONTESTED)  # recorded the cluster id, still unconfirmed
    assert read_identity(data) == Identity(1, "strom", CID, rec.adopted)
    assert again.adopted and not again.may_set_aside_strays(CID)
    assert not started(data, agreement=CONTESTED).may_set_aside_strays(CID)

    confirming = started(data, agreement=AGREES)
    assert read_identity(data) == Identity(1, "strom", CID)
    assert not confirming.may_set_aside_strays(CID)  # it started unconfirmed
    assert started(data).may_set_aside_strays(CID)


def test_an_adoption_the_cluster_contradicts_is_refused(tmp_path: Path) -> None:
    """The cluster assigns none of the dir's logs to the flags' node id: the dir is another
    node's, and the start is refused without writing anything."""
    data = tmp_path / "data"
    (data / "orders-3").mkdir(parents=True)
    (data / "orders-4").mkdir()
    with pytest.raises(IdentityError) as err:
        started(data, node_id=7, agreement=DISAGREES)
    msg = str(err.value)
    assert "\n" not in msg and str(data) in msg
    assert "holds 2 partition logs and no meta.properties" in msg
    assert "assigns none of them to node 7" in msg
    assert "(it assigns orders-3, orders-4 to nodes 2, 3)" in msg
    assert not (data / IDENTITY_FILE).exists()


def test_an_unconfirmed_identity_is_refused_without_sending_the_operator_to_it(
    tmp_path: Path,
) -> None:
    """Adopted from a wrong --node-id (the cluster unknown then): the right id is refused
    with advice that says the recorded one was only adopted and how to undo it, and the
    wrong one is refused once the cluster contradicts it."""
    data = tmp_path / "data"
    (data / "orders-3").mkdir(parents=True)
    started(data, node_id=7, cid="")
    adopted = read_identity(data)
    assert adopted is not None and adopted.adopted
    with pytest.raises(IdentityError) as err:
        DataDirIdentity(data, 3, "strom").check_flags()
    msg = str(err.value)
    assert f"adopted from the flags of a start on {adopted.adopted}" in msg
    assert "not confirmed" in msg and "started with --node-id 3 --cluster strom" in msg
    assert f"remove {data / IDENTITY_FILE} and start again" in msg
    with pytest.raises(IdentityError, match=r"records node 7 .* adopted from the flags on"):
        started(data, node_id=7, agreement=DISAGREES)
    assert read_identity(data) == adopted
    # The operator removes the file and starts with the right id: confirmed.
    (data / IDENTITY_FILE).unlink()
    started(data, node_id=3, agreement=Agreement(logs=1, mine=1))
    assert read_identity(data) == Identity(3, "strom", CID)


def _topic(name: str, tid: str, replicas: dict[int, list[int]]):
    meta = md.TopicMetadata(topic_id=tid, name=name, partition_count=len(replicas))
    parts = {(name, p): md.PartitionState(replicas=r, topic_id=tid) for p, r in replicas.items()}
    return meta, parts


def test_cluster_agreement_counts_evidence_for_and_against_a_node_id() -> None:
    """Logs of partitions the cluster assigns to the node id count for it; logs of live
    partitions it assigns only to other nodes count against it; logs of deleted or re-created
    topics count for neither (they are the strays a node's own dir may hold)."""
    a, a_parts = _topic("a", "ida", {0: [1, 2], 1: [2, 3]})
    b, b_parts = _topic("b", "idb", {0: [3]})
    gone, gone_parts = _topic("gone", "idg", {0: [1]})
    gone.deleting = True
    topics = {"a": a, "b": b, "gone": gone}
    parts = {**a_parts, **b_parts, **gone_parts}
    local = {("a", 0): "ida", ("a", 1): None, ("b", 0): "old-b", ("gone", 0): "idg"}
    assert cluster_agreement(1, local, topics, parts) == Agreement(
        logs=4, mine=1, elsewhere={("a", 1): (2, 3)}
    )
    assert cluster_agreement(2, local, topics, parts) == Agreement(logs=4, mine=2)
    assert cluster_agreement(2, local, topics, parts).confirmed
    assert cluster_agreement(1, {("x", 0): None}, topics, parts).refused
    assert cluster_agreement(1, {}, topics, parts).confirmed


def test_a_dir_with_only_deleted_logs_or_other_files_is_not_adopted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "orders-3.deleted").mkdir(parents=True)
    (data / "lost+found").mkdir()
    (data / "recovery-point-offset-checkpoint").write_text("0\n0\n")
    assert not started(data).adopted


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("version=1\nnode.id=x\ncluster.name=strom\n", "node.id 'x'"),
        ("version=1\nnode.id=1\n", "cluster.name is missing"),
        ("version=9\nnode.id=1\ncluster.name=strom\n", "version '9'"),
        ("node.id 1\n", "not key=value"),
    ],
)
def test_an_unusable_identity_file_refuses_the_start(
    tmp_path: Path, text: str, problem: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / IDENTITY_FILE).write_text(text)
    with pytest.raises(IdentityError) as err:
        DataDirIdentity(data, 1, "strom").check_flags()
    assert problem in str(err.value) and str(data / IDENTITY_FILE) in str(err.value)
    assert (data / IDENTITY_FILE).read_text() == text


def test_the_file_round_trips_and_refuses_line_breaks() -> None:
    ident = Identity(12, "prod=eu", CID)
    assert parse_identity(ident.encode().decode()) == ident
    adopted = Identity(12, "prod=eu", CID, "2026-11-29T03:00:00Z")
    assert parse_identity(adopted.encode().decode()) == adopted
    assert parse_identity("version=1\nnode.id=3\ncluster.name=c\n") == Identity(3, "c", "")
    with pytest.raises(IdentityError, match="line break"):
        Identity(1, "a\nnode.id=2").encode()
