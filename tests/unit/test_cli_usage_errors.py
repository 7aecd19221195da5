"""Arguments the ``strom`` command refuses are usage errors: exit 2 and one error line under
the subcommand's name, naming the flag, before any connection (found from outside: checks
made after parsing exited 1 as a failure, under the parent command's name, ``strom topics:
error:``, and some named the client's keyword, ``batch_size``, not the flag)."""

from __future__ import annotations

from typing import Any

import pytest

from strom.cli.main import main
from strom.client.cluster import ClusterClient
from strom.client.consumer import Consumer
from strom.client.producer import Producer
from strom.devcluster.cluster import LocalCluster

B = ["--bootstrap", "127.0.0.1:1"]


@pytest.fixture
def nothing_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way the commands reach a cluster (or start one) fails the test."""

    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the command went on to connect")

    for cls in (ClusterClient, Producer, Consumer, LocalCluster):
        monkeypatch.setattr(cls, "__init__", refuse)


@pytest.mark.usefixtures("nothing_connects")
@pytest.mark.parametrize(
    ("argv", "prog", "flag"),
    [
        (["topics", "create", "x", "--config", "foo", *B], "strom topics create", "--config"),
        (["topics", "alter", "clicks", *B], "strom topics alter", "--set"),
        (["topics", "reassign", "t", "--partition", "0", *B], "strom topics reassign", "--cancel"),
        (
            ["topics", "reassign", "t", "--partition", "0", "--replicas", "a,b", *B],
            "strom topics reassign",
            "--replicas 'a,b'",
        ),
        (
            # Found from outside: "2,,3" was taken as [2, 3].
            ["topics", "reassign", "t", "--partition", "0", "--replicas", "2,,3", *B],
            "strom topics reassign",
            "--replicas '2,,3'",
        ),
        (["consume", "t", "--offset", "5", *B], "strom consume", "--offset"),
        (
            ["consume", "t", "--group", "g", "--partition", "0", *B],
            "strom consume",
            "--group",
        ),
        (
            ["groups", "reset-offsets", "g", "--topic", "t:x", "--to-latest", *B],
            "strom groups reset-offsets",
            "--topic 't:x'",
        ),
        (
            ["groups", "reset-offsets", "g", "--topic", "t", "--to-datetime", "bad", *B],
            "strom groups reset-offsets",
            "--to-datetime 'bad'",
        ),
        (
            ["topics", "add-partitions", "t", "--partitions", "3", "--replica-assignment", "1:x"],
            "strom topics add-partitions",
            "--replica-assignment '1:x': list 1 ('1:x') is not node ids joined by ':'",
        ),
        (
            ["topics", "add-partitions", "t", "--partitions", "3", "--replica-assignment", "1,"],
            "strom topics add-partitions",
            "--replica-assignment '1,': list 2 ('') is not node ids",
        ),
        (["cluster", "configs", "--alter", *B], "strom cluster configs", "--alter needs --set"),
        (
            ["cluster", "configs", "1", "--delete", "leader.replication.throttled.rate", *B],
            "strom cluster configs",
            "give no node id",
        ),
        (
            ["cluster", "configs", "--set", "leader.replication.throttled.rate=x", *B],
            "strom cluster configs",
            "--set leader.replication.throttled.rate: not a size: 'x'",
        ),
        (["cluster", "configs", "--set", "novalue", *B], "strom cluster configs", "--set"),
        (["dev", "up", "--nodes", "0"], "strom dev up", "--nodes"),
        (["dev", "up", "--controllers", "0"], "strom dev up", "--controllers"),
        (["dev", "up", "--coordinators", "-1"], "strom dev up", "--coordinators"),
        (["produce", "t", "--batch-size", "0", *B], "strom produce", "--batch-size"),
        (["produce", "t", "--linger-ms", "-1", *B], "strom produce", "--linger-ms"),
    ],
)
def test_bad_arguments_are_usage_errors_of_the_subcommand(
    argv: list[str], prog: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exit_:  # refused by argparse itself (a flag's type)
        code = exit_.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # One error line, the last (argparse's own errors print the usage above it).
    errors = [line for line in err.splitlines() if ": error:" in line]
    assert errors == [err.strip().splitlines()[-1]], err
    assert errors[0].startswith(f"{prog}: error: ") and flag in errors[0], errors[0]
    assert "batch_size" not in err and "linger_ms" not in err


@pytest.mark.usefixtures("nothing_connects")
@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["dev", "up", "--cluster", "bad/name"], "strom dev up"),
        (["dev", "up", "--cluster", ""], "strom dev up"),
        (["controller", "--etcd", "127.0.0.1:1", "--cluster", "bad/name"], "strom controller"),
        (["coordinator", "--etcd", "127.0.0.1:1", "--cluster", "bad/name"], "strom coordinator"),
        (
            [
                "storage-node",
                "--etcd",
                "127.0.0.1:1",
                "--node-id",
                "0",
                "--data-dir",
                "/x",
                "--cluster",
                "bad/name",
            ],
            "strom storage-node",
        ),
    ],
)
def test_a_cluster_name_with_a_slash_is_refused_before_anything_starts(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found from outside: only the storage node checked it, so `strom dev up --cluster
    bad/name` started etcd and the controllers, which created the cluster 'bad/name'."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{prog}: error: argument --cluster: ")
    assert "must be a non-empty name without '/'" in err[-1]


@pytest.mark.usefixtures("nothing_connects")
@pytest.mark.parametrize(
    ("argv", "prog", "said"),
    [
        (["topics", "create", ""], "strom topics create", "argument topic: the topic name"),
        (["topics", "delete", "t", ""], "strom topics delete", "argument topics: the topic"),
        (["topics", "describe", " "], "strom topics describe", "argument topics: the topic"),
        (["topics", "configs", ""], "strom topics configs", "argument topic: the topic"),
        (
            ["topics", "add-partitions", "", "--partitions", "2"],
            "strom topics add-partitions",
            "argument topic: the topic",
        ),
        (["groups", "describe", ""], "strom groups describe", "argument group: the group id"),
        (["groups", "delete", "g", ""], "strom groups delete", "argument group: the group id"),
        (
            ["groups", "reset-offsets", "", "--all-topics", "--to-latest"],
            "strom groups reset-offsets",
            "argument group: the group id",
        ),
        (
            ["groups", "reset-offsets", "g", "--topic", ":0", "--to-latest"],
            "strom groups reset-offsets",
            "--topic ':0': the topic name",
        ),
        (
            ["transactions", "producers", ""],
            "strom transactions producers",
            "argument topic: the topic name",
        ),
        (
            ["transactions", "describe", ""],
            "strom transactions describe",
            "argument transactional_id: the transactional id",
        ),
    ],
)
def test_an_empty_topic_or_group_name_is_a_usage_error(
    argv: list[str], prog: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found from outside: `topics create ""` and `groups describe|delete|reset-offsets ""`
    failed in the cluster (exit 1) and `topics delete ""` said `topic '' does not exist`,
    where the README promised a usage error."""
    try:
        code = main([*argv, *B])
    except SystemExit as exit_:  # refused by argparse itself (the argument's type)
        code = exit_.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error:" in line]
    assert errors == [err.strip().splitlines()[-1]], err
    assert errors[0].startswith(f"{prog}: error: ") and said in errors[0], errors[0]
    assert errors[0].endswith("must not be empty"), errors[0]
