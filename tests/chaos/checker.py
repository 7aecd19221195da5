"""The checker: decides from the history (and the final reads and replica scans) whether a
chaos run kept strom's promises. It never talks to the cluster.

Promises checked (DESIGN §6; issue 13):

- **producers** (idempotent, acks=all, RF=3, min.insync.replicas=2): every acknowledged
  record is in the log exactly once, at the offset it was acknowledged with; a record never
  acknowledged is there at most once; one writer's records keep their order per partition;
  nothing is in the log that no writer sent.
- **offsets**: the input topic's offsets are exactly 0..HW-1 (no control batches or compaction
  there, so a hole is a skipped offset); every record a consumer received is the record the
  log holds at that offset (an offset is never reused for another record).
- **groups**: every record below the group's committed offset was received by some member
  (nobody skipped it); each member's successful commits never go backwards per partition;
  the committed offsets the monitor read never go backwards.
- **transactions** (read_committed output of the consume-transform-produce loop): every input
  record below the pipeline group's committed offset was transformed exactly once, none at or
  above it (outputs and offsets commit atomically); the output values match the inputs; no
  transaction is left hanging (LSO = HW at the end).
- **replicas**: below the HW every replica of every workload partition holds the same batches
  (CRC-32C of each batch's bytes), contiguous from offset 0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.workload import GROUP, TXN_GROUP

MAX_EXAMPLES = 12


@dataclass
class Report:
    counts: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: list[str] = field(default_factory=list)

    def violate(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.violations[kind]) < MAX_EXAMPLES:
            self.violations[kind].append(detail)

    @property
    def ok(self) -> bool:
        return not any(self.counts[k] for k in self.violations)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": dict(sorted(self.counts.items())),
            "violations": {k: v for k, v in self.violations.items() if v},
            "notes": self.notes,
        }


def _split(value: str) -> tuple[str, int] | None:
    writer, sep, seq = value.rpartition(":")
    if not sep or not seq.isdigit():
        return None
    return writer, int(seq)


def check(
    events: list[dict[str, Any]],
    final: dict[str, Any],
    replicas: dict[str, dict[str, Any]] | None = None,
    assignment: dict[str, list[str]] | None = None,
) -> Report:
    """``assignment``: "topic-p" -> the node names holding a replica of it."""
    r = Report()
    log = {int(p): recs for p, recs in final["input"].items()}
    hw = {int(p): o for p, o in final["input_hw"].items()}
    at: dict[tuple[int, int], str | None] = {}
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, recs in log.items():
        prev = -1
        for o, _k, v in recs:
            if o <= prev:
                r.violate("offset_order", f"partition {p}: offset {o} after {prev}")
            prev = o
            at[(p, o)] = v
            if v is not None:
                where[v].append((p, o))
        offsets = [o for o, _, _ in recs]
        if offsets != list(range(hw.get(p, 0))):
            missing = sorted(set(range(hw.get(p, 0))) - set(offsets))
            r.violate(
                "offset_gap",
                f"partition {p}: offsets below the HW {hw.get(p)} missing: {missing[:20]}",
            )
    r.counts["log_records"] = len(at)
    _check_producers(r, events, at, where)
    _check_reads(r, events, at)
    _check_group(r, events, final, log)
    _check_monitor(r, events)
    _check_transactions(r, events, final, log)
    if replicas is not None and assignment is not None:
        _check_replicas(r, replicas, assignment, final)
    return r


def _check_producers(
    r: Report,
    events: list[dict[str, Any]],
    at: dict[tuple[int, int], str | None],
    where: dict[str, list[tuple[int, int]]],
) -> None:
    sent: set[str] = set()
    acked: dict[str, tuple[int, int]] = {}
    failed: set[str] = set()
    for e in events:
        w = e.get("w")
        if w is None:
            continue
        op = e["op"]
        if op == "send":
            sent.add(f"{w}:{e['s']}")
        elif op == "ack":
            acked[f"{w}:{e['s']}"] = (e["p"], e["o"])
        elif op == "fail":
            failed.add(f"{w}:{e['s']}")
    r.counts["sent"] = len(sent)
    r.counts["acknowledged"] = len(acked)
    r.counts["failed"] = len(failed - acked.keys())
    r.counts["unknown_outcome"] = len(sent - acked.keys() - failed)
    for value, (p, o) in acked.items():
        if o < 0:
            # Acknowledged as a duplicate of a batch older than the leader remembers
            # (DUPLICATE_SEQUENCE, as in Kafka): written, offset unknown. Exactly once, then.
            r.counts["acknowledged_offset_unknown"] += 1
            if len(where.get(value, ())) != 1 or where[value][0][0] != p:
                r.violate(
                    "lost",
                    f"{value} acknowledged (offset unknown) on partition {p}, the log has it "
                    f"at {where.get(value, [])}",
                )
            continue
        if at.get((p, o)) != value:
            r.violate(
                "lost",
                f"{value} acknowledged at {p}@{o}, the log has {at.get((p, o))!r} there"
                + (f" (and has it at {where[value]})" if where.get(value) else ""),
            )
    for value, places in where.items():
        if len(places) > 1:
            kind = "duplicated" if value in acked else "duplicated_unacknowledged"
            r.violate(kind, f"{value} is in the log {len(places)} times: {places}")
        if value not in sent:
            r.violate("phantom", f"{value} at {places} was never sent")
    present_unacked = sum(1 for v in where if v in sent and v not in acked)
    r.counts["unacknowledged_present"] = present_unacked
    # One writer's records keep their send order within a partition.
    per: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for value, places in where.items():
        ws = _split(value)
        if ws is None:
            continue
        for p, o in places:
            per[(ws[0], p)].append((o, ws[1]))
    for (w, p), pairs in per.items():
        pairs.sort()
        seqs = [s for _, s in pairs]
        for i in range(1, len(seqs)):
            if seqs[i] <= seqs[i - 1]:
                r.violate(
                    "reordered",
                    f"writer {w} partition {p}: seq {seqs[i]} at offset {pairs[i][0]} after "
                    f"seq {seqs[i - 1]} at {pairs[i - 1][0]}",
                )
                break


def _check_reads(
    r: Report, events: list[dict[str, Any]], at: dict[tuple[int, int], str | None]
) -> None:
    """Every record a member received is what the log holds at that offset."""
    n = 0
    for e in events:
        if e["op"] != "recv":
            continue
        p = e["p"]
        for o, v in zip(e["o"], e["v"], strict=True):
            n += 1
            have = at.get((p, o), "<absent>")
            if have != v:
                r.violate(
                    "read_mismatch",
                    f"{e.get('m')} received {v!r} at {p}@{o}; the log has {have!r}",
                )
    r.counts["records_received"] = n


def _check_group(
    r: Report,
    events: list[dict[str, Any]],
    final: dict[str, Any],
    log: dict[int, list[tuple[int, Any, Any]]],
) -> None:
    received: dict[int, set[int]] = defaultdict(set)
    last_ok: dict[tuple[str, int], int] = {}
    commits = Counter[str]()
    for e in events:
        op = e["op"]
        if op == "recv":
            received[e["p"]].update(e["o"])
        elif op in ("commit", "commit_ok", "commit_fail") and "m" in e:
            commits[op if op != "commit" else f"commit_{e.get('mode')}"] += 1
            if op != "commit_ok":
                continue
            for ps, off in e["offsets"].items():
                key = (e["m"], int(ps))
                if key in last_ok and off < last_ok[key]:
                    r.violate(
                        "member_commit_regression",
                        f"{e['m']} partition {ps}: committed {off} after {last_ok[key]}",
                    )
                last_ok[key] = max(off, last_ok.get(key, off))
    r.counts.update({f"group_{k}": v for k, v in commits.items()})
    committed = {int(p): o for p, o in final["committed"].get(GROUP, {}).items()}
    for p, c in committed.items():
        below = [o for o, _, _ in log.get(p, []) if o < c]
        skipped = [o for o in below if o not in received[p]]
        if skipped:
            r.violate(
                "group_skipped",
                f"partition {p}: committed {c} but {len(skipped)} records below it were never "
                f"received, e.g. {skipped[:10]}",
            )
        r.counts["group_records_below_committed"] += len(below)


def _check_monitor(r: Report, events: list[dict[str, Any]]) -> None:
    seen: dict[tuple[str, int], tuple[int, float]] = {}
    for e in events:
        if e["op"] != "offsets":
            continue
        r.counts["monitor_reads"] += 1
        for ps, off in e["offsets"].items():
            key = (e["g"], int(ps))
            prev = seen.get(key)
            if prev is not None and off < prev[0]:
                r.violate(
                    "committed_offset_regression",
                    f"group {e['g']} partition {ps}: committed offset went from {prev[0]} to "
                    f"{off} ({e['t'] - prev[1]:.1f}s later)",
                )
            if prev is None or off >= prev[0]:
                seen[key] = (off, e["t"])


def _check_transactions(
    r: Report,
    events: list[dict[str, Any]],
    final: dict[str, Any],
    log: dict[int, list[tuple[int, Any, Any]]],
) -> None:
    outcomes = Counter[str]()
    for e in events:
        if e["op"].startswith("txn_"):
            outcomes[e["op"]] += 1
    r.counts.update(outcomes)
    values = {(p, o): v for p, recs in log.items() for o, _, v in recs}
    out_keys = Counter[tuple[int, int]]()
    for recs in final["output_committed"].values():
        for _o, k, v in recs:
            ps, _, os_ = (k or "").partition(":")
            if not (ps.isdigit() and os_.isdigit()):
                r.violate("txn_bad_output", f"output key {k!r} is not partition:offset")
                continue
            key = (int(ps), int(os_))
            out_keys[key] += 1
            if values.get(key) != v:
                r.violate(
                    "txn_wrong_value", f"output for {key} is {v!r}, input {values.get(key)!r}"
                )
    committed = {int(p): o for p, o in final["committed"].get(TXN_GROUP, {}).items()}
    for key, n in out_keys.items():
        if n > 1:
            r.violate("txn_duplicated", f"input {key[0]}@{key[1]} transformed {n} times")
        if key[1] >= committed.get(key[0], 0):
            r.violate(
                "txn_output_beyond_offsets",
                f"input {key[0]}@{key[1]} has committed output but the group's committed "
                f"offset is {committed.get(key[0], 0)}",
            )
    lost = 0
    for p, c in committed.items():
        for o, _, _ in log.get(p, []):
            if o < c and out_keys[(p, o)] == 0:
                lost += 1
                r.violate(
                    "txn_lost", f"input {p}@{o} is below the committed offset {c} but has no output"
                )
    r.counts["txn_outputs_committed"] = sum(out_keys.values())
    for p, lso in final["output_lso"].items():
        hw = final["output_hw"].get(p)
        if hw is not None and lso != hw:
            r.violate("txn_hanging", f"output partition {p}: LSO {lso} below HW {hw} at the end")


def _check_replicas(
    r: Report,
    replicas: dict[str, dict[str, Any]],
    assignment: dict[str, list[str]],
    final: dict[str, Any],
) -> None:
    hws = {f"chaos-{p}": o for p, o in final["input_hw"].items()}
    hws.update({f"chaos-out-{p}": o for p, o in final["output_hw"].items()})
    for tp, nodes in sorted(assignment.items()):
        hw = hws.get(tp)
        if hw is None:
            continue
        reference: list[list[int]] | None = None
        ref_node = ""
        for node in nodes:
            scan = replicas.get(node, {}).get(tp)
            if scan is None:
                r.violate("replica_missing", f"{node} has no directory for {tp}")
                continue
            for problem in scan["problems"]:
                r.violate("replica_corrupt", f"{node} {tp}: {problem}")
            below = [b for b in scan["batches"] if b[0] < hw]
            expected = 0
            for base, last, _crc in below:
                if base != expected:
                    r.violate("replica_gap", f"{node} {tp}: batch at {base}, expected {expected}")
                    break
                expected = last + 1
            if expected < hw:
                r.violate("replica_short", f"{node} {tp}: holds up to {expected}, HW is {hw}")
            if reference is None:
                reference, ref_node = below, node
            elif below != reference:
                diff = next(
                    (i for i, (a, b) in enumerate(zip(below, reference, strict=False)) if a != b),
                    min(len(below), len(reference)),
                )
                r.violate(
                    "replica_diverged",
                    f"{tp}: {node} and {ref_node} differ from batch #{diff} "
                    f"({below[diff] if diff < len(below) else None} vs "
                    f"{reference[diff] if diff < len(reference) else None})",
                )
            r.counts["replica_batches_compared"] += len(below)
