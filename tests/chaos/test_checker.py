"""The checker finds each kind of violation in a small hand-made history (and passes a clean
one): a checker that cannot fail proves nothing about the runs it passes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.chaos.checker import check
from tests.chaos.workload import GROUP, TXN_GROUP


def clean() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], dict[str, list[str]]]:
    """Writer w sends 4 records to partition 0 (offsets 0-3), all acknowledged; member m
    receives them and commits 4; the pipeline transforms all 4 and commits 4."""
    events: list[dict[str, Any]] = []
    t = 0.0

    def ev(op: str, **kw: Any) -> None:
        nonlocal t
        t += 1
        events.append({"t": t, "op": op, **kw})

    for s in range(4):
        ev("send", w="w", s=s, k="k")
    for s in range(4):
        ev("ack", w="w", s=s, p=0, o=s)
    ev("assign", m="m", parts=[0])
    ev("recv", m="m", p=0, o=[0, 1], v=["w:0", "w:1"])
    ev("commit", m="m", id=1, mode="sync", offsets={"0": 2})
    ev("commit_ok", m="m", id=1, offsets={"0": 2})
    ev("recv", m="m", p=0, o=[2, 3], v=["w:2", "w:3"])
    ev("commit", m="m", id=2, mode="async", offsets={"0": 4})
    ev("commit_ok", m="m", id=2, offsets={"0": 4})
    ev("offsets", g=GROUP, offsets={"0": 2})
    ev("offsets", g=GROUP, offsets={"0": 4})
    ev("txn_begin", x="x", id=1, inputs={"0": [0, 3]}, n=4)
    ev("txn_commit", x="x", id=1)
    final = {
        "input": {"0": [[o, "k", f"w:{o}"] for o in range(4)]},
        "input_hw": {"0": 4},
        "output_committed": {"0": [[o, f"0:{o}", f"w:{o}"] for o in range(4)]},
        "output_lso": {"0": 5},
        "output_hw": {"0": 5},
        "output_uncommitted_count": 4,
        "committed": {GROUP: {"0": 4}, TXN_GROUP: {"0": 4}},
    }
    batches = [[0, 1, 111], [2, 3, 222]]
    replicas = {
        n: {"chaos-0": {"batches": copy.deepcopy(batches), "problems": []}}
        for n in ("node-1", "node-2", "node-3")
    }
    assignment = {"chaos-0": ["node-1", "node-2", "node-3"]}
    return events, final, replicas, assignment


def test_a_clean_history_passes() -> None:
    report = check(*clean())
    assert report.ok, report.as_dict()
    assert report.counts["acknowledged"] == 4
    assert report.counts["records_received"] == 4
    assert report.counts["replica_batches_compared"] == 6


def test_an_acknowledgement_without_offset_counts_when_the_record_is_there_once() -> None:
    events, final, replicas, assignment = clean()
    events[5]["o"] = -1  # w:1 acknowledged as a duplicate of an old batch: offset unknown
    report = check(events, final, replicas, assignment)
    assert report.ok and report.counts["acknowledged_offset_unknown"] == 1
    del final["input"]["0"][1]
    final["input"]["0"] = [[i, k, v] for i, (_, k, v) in enumerate(final["input"]["0"])]
    final["input_hw"]["0"] = 3
    lost = check(events, final).violations["lost"]
    assert any(v.startswith("w:1 acknowledged (offset unknown)") for v in lost), lost


def _mutated(kind: str) -> Any:
    events, final, replicas, assignment = clean()
    recs = final["input"]["0"]
    if kind == "lost":
        del recs[1]
        recs[:] = [[i, r[1], r[2]] for i, r in enumerate(recs)]
        final["input_hw"]["0"] = 3
    elif kind == "duplicated":
        recs.append([4, "k", "w:2"])
        final["input_hw"]["0"] = 5
    elif kind == "duplicated_unacknowledged":
        events.append({"t": 99, "op": "send", "w": "w", "s": 9, "k": "k"})
        recs += [[4, "k", "w:9"], [5, "k", "w:9"]]
        final["input_hw"]["0"] = 6
    elif kind == "phantom":
        recs.append([4, "k", "z:1"])
        final["input_hw"]["0"] = 5
    elif kind == "reordered":
        recs[1][2], recs[2][2] = recs[2][2], recs[1][2]
    elif kind == "offset_gap":
        recs[3][0] = 5
        final["input_hw"]["0"] = 6
    elif kind == "read_mismatch":
        events[9]["v"] = ["w:0", "w:7"]
    elif kind == "group_skipped":
        events[9]["o"], events[9]["v"] = [0], ["w:0"]
    elif kind == "member_commit_regression":
        events.append({"t": 99, "op": "commit_ok", "m": "m", "id": 3, "offsets": {"0": 1}})
    elif kind == "committed_offset_regression":
        events.append({"t": 99, "op": "offsets", "g": GROUP, "offsets": {"0": 3}})
    elif kind == "txn_duplicated":
        final["output_committed"]["0"].append([5, "0:2", "w:2"])
    elif kind == "txn_lost":
        del final["output_committed"]["0"][0]
    elif kind == "txn_output_beyond_offsets":
        final["committed"][TXN_GROUP]["0"] = 3
    elif kind == "txn_wrong_value":
        final["output_committed"]["0"][0][2] = "w:3"
    elif kind == "txn_hanging":
        final["output_lso"]["0"] = 2
    elif kind == "replica_diverged":
        replicas["node-2"]["chaos-0"]["batches"][1][2] = 333
    elif kind == "replica_short":
        replicas["node-3"]["chaos-0"]["batches"].pop()
    elif kind == "replica_gap":
        replicas["node-1"]["chaos-0"]["batches"][1][0] = 3
    elif kind == "replica_missing":
        del replicas["node-3"]["chaos-0"]
    else:  # pragma: no cover - a typo in the parametrization
        raise AssertionError(kind)
    return events, final, replicas, assignment


@pytest.mark.parametrize(
    "kind",
    [
        "lost",
        "duplicated",
        "duplicated_unacknowledged",
        "phantom",
        "reordered",
        "offset_gap",
        "read_mismatch",
        "group_skipped",
        "member_commit_regression",
        "committed_offset_regression",
        "txn_duplicated",
        "txn_lost",
        "txn_output_beyond_offsets",
        "txn_wrong_value",
        "txn_hanging",
        "replica_diverged",
        "replica_short",
        "replica_gap",
        "replica_missing",
    ],
)
def test_each_violation_is_found(kind: str) -> None:
    report = check(*_mutated(kind))
    assert not report.ok
    assert report.counts[kind] >= 1, report.as_dict()
