"""The data dir's identity file (strom.storage.identity): written once, checked every start.

A node started on an existing data dir with the wrong --node-id or --cluster deleted every
replica there as a stray (found from outside); these are the checks that now refuse it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.storage.identity import (
    IDENTITY_FILE,
    DataDirIdentity,
    Identity,
    IdentityError,
    parse_identity,
    read_identity,
)

CID = "5b8e2c1e-0000-4000-8000-000000000001"


def started(data_dir: Path, node_id: int = 1, cluster: str = "strom", cid: str = CID):
    """A node's identity check as a start runs it: flags first, then the cluster id."""
    ident = DataDirIdentity(data_dir, node_id, cluster, fsync=False)
    ident.check_flags()
    ident.settle(cid)
    return ident


def test_a_new_data_dir_records_the_node_and_cluster(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ident = started(data)
    assert read_identity(data) == Identity(1, "strom", CID)
    assert ident.may_delete_strays(CID) and not ident.adopted
    assert [p.name for p in data.iterdir()] == [IDENTITY_FILE]  # no temp file left
    # The next start finds the same identity and goes on.
    again = started(data)
    assert again.may_delete_strays(CID)


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
    assert not ident.may_delete_strays("other-id")
    assert read_identity(data) == Identity(1, "strom", CID)


def test_the_cluster_id_is_recorded_once_known(tmp_path: Path) -> None:
    """A node may start before any controller wrote the cluster key: it records the id when
    it sees it, and deletes no stray before."""
    data = tmp_path / "data"
    ident = started(data, cid="")
    assert read_identity(data) == Identity(1, "strom", "")
    assert not ident.may_delete_strays("")
    assert not ident.check_cluster_id(CID)  # nothing to compare with yet
    ident.settle(CID)
    assert read_identity(data) == Identity(1, "strom", CID)
    assert ident.check_cluster_id(CID) and ident.may_delete_strays(CID)
    # An unknown id later (the cluster key gone) does not erase the recorded one.
    ident.settle("")
    assert read_identity(data) == Identity(1, "strom", CID)


def test_an_older_strom_s_data_dir_is_adopted_but_keeps_its_strays_on_that_start(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    (data / "orders-3").mkdir(parents=True)
    ident = started(data)
    assert ident.adopted
    assert read_identity(data) == Identity(1, "strom", CID)
    assert not ident.may_delete_strays(CID)  # the flags were not confirmed by anything
    assert started(data).may_delete_strays(CID)  # the next start checks them


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
    assert parse_identity("version=1\nnode.id=3\ncluster.name=c\n") == Identity(3, "c", "")
    with pytest.raises(IdentityError, match="line break"):
        Identity(1, "a\nnode.id=2").encode()
