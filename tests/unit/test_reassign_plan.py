"""Reassignment plan files and the plan generator (strom.cli.reassignplan), and the usage
checks of ``strom topics reassign --plan/--generate`` and ``elect-leaders
--path-to-json-file``: found from outside, strom had none of kafka-reassign-partitions.sh's
plan files, so moving thousands of partitions meant scripting the Admin API."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from strom.argtypes import UsageError
from strom.cli import reassignplan as rp
from strom.client.types import TopicPartition
from strom.controller.placement import PlacementNode


def _plan(*entries: dict) -> str:
    return json.dumps({"version": 1, "partitions": list(entries)})


def test_parse_plan_reads_kafkas_file_and_round_trips() -> None:
    text = _plan(
        {"topic": "a", "partition": 0, "replicas": [1, 2], "log_dirs": ["any", "any"]},
        {"topic": "a", "partition": 1, "replicas": [2, 3]},
    )
    plan = rp.parse_plan(text)
    assert plan == {TopicPartition("a", 0): [1, 2], TopicPartition("a", 1): [2, 3]}
    assert rp.parse_plan(rp.plan_json(plan)) == plan


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "must hold a JSON object"),
        ('{"version": 2, "partitions": []}', "version 2 is not supported"),
        ('{"version": 1}', 'no "partitions" list'),
        (_plan(), "has no partitions"),
        (_plan({"partition": 0, "replicas": [1]}), 'no "topic"'),
        (_plan({"topic": "a", "partition": -1, "replicas": [1]}), '"partition" number'),
        (_plan({"topic": "a", "partition": 0}), 'a-0 has no "replicas"'),
        (_plan({"topic": "a", "partition": 0, "replicas": []}), 'a-0 has no "replicas"'),
        (_plan({"topic": "a", "partition": 0, "replicas": ["1"]}), "not all node ids"),
        (_plan({"topic": "a", "partition": 0, "replicas": [1, 1]}), "name a node twice"),
        (_plan({"topic": "a", "partition": 0, "replicas": [-1]}), "node ids are 0 to"),
        (
            _plan(
                {"topic": "a", "partition": 0, "replicas": [1]},
                {"topic": "a", "partition": 0, "replicas": [2]},
            ),
            "a-0 is in the plan twice",
        ),
        (
            _plan({"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["/data"]}),
            '"log_dirs" other than "any" is not supported',
        ),
    ],
)
def test_parse_plan_refuses_malformed_files_naming_what(text: str, message: str) -> None:
    with pytest.raises(UsageError, match="^--plan: .*" + re.escape(message)):
        rp.parse_plan(text)


def test_topics_to_move_and_election_files() -> None:
    assert rp.parse_topics_to_move('{"version":1,"topics":[{"topic":"a"},{"topic":"b"}]}') == [
        "a",
        "b",
    ]
    with pytest.raises(UsageError, match="topic a is listed twice"):
        rp.parse_topics_to_move('{"topics":[{"topic":"a"},{"topic":"a"}]}')
    assert rp.parse_election_file('{"partitions":[{"topic":"a","partition":3}]}') == [
        TopicPartition("a", 3)
    ]
    with pytest.raises(UsageError, match=r"^--path-to-json-file: a-3 is listed twice"):
        rp.parse_election_file(
            '{"partitions":[{"topic":"a","partition":3},{"topic":"a","partition":3}]}'
        )


def test_node_lists_and_unknown_nodes() -> None:
    assert rp.parse_node_list("1, 2,3") == [1, 2, 3]
    for bad in ("1,,2", "a", "1,1", "-1"):
        with pytest.raises(UsageError, match=r"^--nodes"):
            rp.parse_node_list(bad)
    rp.check_nodes({TopicPartition("a", 0): [1, 2]}, [1, 2, 3])
    with pytest.raises(UsageError, match=r"a-0: unknown node\(s\) 9 \(registered: 1,2,3\)"):
        rp.check_nodes({TopicPartition("a", 0): [1, 9]}, [1, 2, 3])


def _current(topic: str, lists: list[list[int]]) -> dict[TopicPartition, list[int]]:
    return {TopicPartition(topic, p): r for p, r in enumerate(lists)}


def test_generate_balances_over_the_nodes_given_and_keeps_the_replication_factor() -> None:
    # 12 partitions of RF 2 all on nodes 1 and 2; 4 nodes now: 6 replicas and 3 leaders each.
    current = {**_current("a", [[1, 2], [2, 1]] * 3), **_current("b", [[1, 2]] * 6)}
    nodes = [PlacementNode(i) for i in (1, 2, 3, 4)]
    proposed = rp.generate(current, nodes)
    assert list(proposed) == list(current)
    assert all(len(r) == 2 and len(set(r)) == 2 for r in proposed.values())
    held = Counter(x for r in proposed.values() for x in r)
    assert held == {1: 6, 2: 6, 3: 6, 4: 6}
    assert Counter(r[0] for r in proposed.values()) == {1: 3, 2: 3, 3: 3, 4: 3}
    # Only what the balance needs moves: nodes 3 and 4 get their 12 replicas, no more.
    assert rp.moved_replicas(current, proposed) == 12


def test_generate_is_rack_aware_and_keeps_what_is_in_place() -> None:
    nodes = [PlacementNode(1, "r1"), PlacementNode(2, "r1"), PlacementNode(3, "r2")]
    nodes += [PlacementNode(4, "r2")]
    current = _current("t", [[1, 2], [3, 4], [1, 3], [2, 4]])
    proposed = rp.generate(current, nodes)
    rack = {n.node_id: n.rack for n in nodes}
    assert all(len({rack[x] for x in r}) == 2 for r in proposed.values()), proposed
    assert Counter(x for r in proposed.values() for x in r) == {1: 2, 2: 2, 3: 2, 4: 2}
    # The partitions already spanning both racks keep their replicas.
    assert set(proposed[TopicPartition("t", 2)]) == {1, 3}
    assert set(proposed[TopicPartition("t", 3)]) == {2, 4}


def test_generate_of_a_balanced_assignment_moves_nothing() -> None:
    current = _current("t", [[1, 2], [2, 3], [3, 1]])
    proposed = rp.generate(current, [PlacementNode(i) for i in (1, 2, 3)])
    assert rp.moved_replicas(current, proposed) == 0


def test_generate_refuses_more_replicas_than_nodes() -> None:
    with pytest.raises(UsageError, match=r"^--nodes: t has 3 replicas a partition"):
        rp.generate(_current("t", [[1, 2, 3]]), [PlacementNode(1), PlacementNode(2)])


def test_verify_status() -> None:
    assert rp.verify_status([2, 3], [2, 3], [], []) == "done"
    assert rp.verify_status([2, 3], [2, 3, 1], [3], [1]) == "in progress"
    assert rp.verify_status([2, 3], [2, 4, 1], [4], [1]) == "not matching"
    assert rp.verify_status([2, 3], [3, 2], [], []) == "not matching"


def _strom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *args, "-b", "127.0.0.1:1"],
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["reassign", "--plan", "P"], "--plan needs one of --execute, --verify or --cancel"),
        (["reassign", "--plan", "P", "--execute", "--verify"], "--plan needs one of"),
        (["reassign", "t", "--plan", "P", "--execute"], "--plan does not take a topic"),
        (["reassign", "--plan", "P", "--execute", "--nodes", "1"], "--plan does not take --nodes"),
        (["reassign", "--plan", "P", "--execute", "--preferred"], "--preferred goes with --verify"),
        (["reassign", "--generate", "--nodes", "1"], "--generate needs one of --topics"),
        (["reassign", "--generate", "--topics", "t"], "--generate needs --nodes"),
        (["reassign", "--generate", "--topics", "t", "--nodes", "1,x"], "--nodes '1,x'"),
        (
            ["reassign", "--generate", "--topics", "t", "--nodes", "1", "--plan", "P"],
            "--generate does not take --plan",
        ),
        (["reassign", "t", "--partition", "0", "--execute"], "does not take --execute"),
        (["reassign", "--execute"], "does not take --execute"),
        (["reassign", "t"], "give a topic and --partition, or --plan FILE, or --generate"),
        (["reassign", "--plan", "/nonexistent/p.json", "--verify"], "--plan /nonexistent"),
        (["elect-leaders", "--partition", "0"], "--partition needs exactly one topic"),
        (
            ["elect-leaders", "t", "--path-to-json-file", "F"],
            "--path-to-json-file does not take a topic",
        ),
        (["elect-leaders", "--path-to-json-file", "/nonexistent/f"], "cannot read it"),
    ],
)
def test_usage_errors_are_one_line_exit_2(argv: list[str], message: str) -> None:
    got = _strom("topics", *argv)
    err = got.stderr.decode()
    assert got.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_a_malformed_plan_file_is_a_usage_error(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(_plan({"topic": "a", "partition": 0, "replicas": [1, 1]}))
    got = _strom("topics", "reassign", "--plan", str(plan), "--execute")
    assert got.returncode == 2
    assert "--plan: a-0: replicas [1, 1] name a node twice" in got.stderr.decode()
