"""``strom bench goals``: every measured goal of the performance issue (#15) in one run.

Each goal is measured by the very ``strom bench`` command docs/benchmarks.md gives for it, run
as a process of its own (``--json``), so a number here is the number a reader gets by typing
that command; the commands run against local clusters this mode starts and stops itself
(etcd, one controller, one coordinator, and one storage node, or three for the RF=3 line and
the commit batching). Each goal runs ``--runs`` times; the report gives every run, their
range and whether the goal was met in all, some or none of them, beside the machine's own
speed (a fixed Python loop and a gRPC round trip), without which numbers from different
machines do not compare (docs/benchmarks.md, "Where each goal stands").

The verdicts are measurements printed for a reader, never asserted by a test: the tests only
check that every goal is measured and reported.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strom.argtypes import UsageError
from strom.bench.machine import calibrate_cluster
from strom.devcluster.cluster import LocalCluster

#: The phases, in the order they run; ``--skip`` takes these names.
PHASES = ("latency", "producer", "consumer", "commits", "rf3", "batching", "failover")


@dataclass
class Goal:
    """One line of the report: a goal, the command that measures it and what each run gave."""

    item: int
    text: str
    unit: str
    #: The goal's bound; None = reported only (the issue asks for the number, not a bound).
    limit: float | None
    #: True: a run meets the goal at or above ``limit``; False: at or below it.
    at_least: bool
    command: str = ""
    values: list[float] = field(default_factory=list)
    error: str = ""

    def met(self) -> str:
        """``yes`` (every run), ``no`` (none), ``k of n`` or ``report`` (no bound)."""
        if self.error:
            return "error"
        if self.limit is None or not self.values:
            return "report" if self.values else "-"
        ok = sum(v >= self.limit if self.at_least else v <= self.limit for v in self.values)
        if ok == len(self.values):
            return "yes"
        return "no" if ok == 0 else f"{ok} of {len(self.values)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "goal": self.text,
            "unit": self.unit,
            "limit": self.limit,
            "at_least": self.at_least,
            "command": self.command,
            "values": self.values,
            "met": self.met(),
            **({"error": self.error} if self.error else {}),
        }


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def table(goals: Sequence[Goal], machine: dict[str, Any]) -> str:
    """The report: one line per goal, then each goal's command."""
    lines = [
        "strom bench goals: issue 15's goals on this machine "
        f"(a fixed Python loop {machine.get('python_loop_ms', '?')} ms, gRPC round trip "
        f"p50 {machine.get('grpc_round_trip_p50_us', '?')} µs; docs/benchmarks.md, "
        "'Where each goal stands', gives both for every measurement)",
        "",
        f"{'item':<5} {'goal':<66} {'runs':<30} {'range':<22} met",
    ]
    for g in goals:
        runs = " ".join(_fmt(v) for v in g.values) if g.values else g.error[:30] or "-"
        span = f"{_fmt(min(g.values))} to {_fmt(max(g.values))} {g.unit}" if g.values else ""
        lines.append(f"{g.item:<5} {g.text:<66} {runs:<30} {span:<22} {g.met()}")
    lines.append("")
    lines.append("commands (each run against a fresh local cluster of this mode's own):")
    seen: set[str] = set()
    for g in goals:
        if g.command and g.command not in seen:
            seen.add(g.command)
            lines.append(f"  {g.command}")
    errors = [g for g in goals if g.error]
    for g in errors:
        lines.append(f"error in '{g.text}': {g.error}")
    return "\n".join(lines)


class _Runner:
    """Runs ``strom bench ...`` commands as processes of their own and reads their JSON."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    def run(self, args: Sequence[str], *, timeout: float = 1800) -> dict[str, Any]:
        argv = [self.python, "-m", "strom.cli.main", "bench", *args, "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"exit {done.returncode}: {tail}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def _shown(args: Sequence[str]) -> str:
    """The command as a user would type it (the cluster's address and metrics left out)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--bootstrap", "--metrics", "--dir"):
            skip = True
            continue
        out.append("G" if out and out[-1] == "--group" else a)
    return "strom bench " + shlex.join(out)


@contextmanager
def _cluster(root: Path, nodes: int) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root / f"cluster-{uuid.uuid4().hex[:6]}", nodes=nodes, controllers=1)
    try:
        cluster.start(timeout=120)
        yield cluster
    finally:
        cluster.kill()


def _target(cluster: LocalCluster) -> list[str]:
    metrics = ",".join(f"127.0.0.1:{m.metrics_port}" for m in cluster.members)
    return ["--bootstrap", cluster.bootstrap, "--metrics", metrics]


class Goals:
    """The measurements, phase by phase; :attr:`goals` holds the report's lines."""

    def __init__(
        self,
        root: Path,
        *,
        runs: int,
        scale: float,
        runner: _Runner | None = None,
        log: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.root = root
        self.runs = runs
        self.scale = scale
        self.runner = runner or _Runner()
        self.log = log
        self.goals: list[Goal] = []
        self.machine: dict[str, Any] = {}

    def _n(self, records: int, least: int = 1_000) -> int:
        return max(int(records * self.scale), least)

    def goal(self, item: int, text: str, unit: str, limit: float | None, *, at_least: bool) -> Goal:
        g = Goal(item, text, unit, limit, at_least)
        self.goals.append(g)
        return g

    def measure(
        self,
        args: Sequence[str],
        target: Sequence[str],
        reads: Sequence[tuple[Goal, Callable[[dict[str, Any]], float]]],
    ) -> dict[str, Any] | None:
        """One run of ``strom bench <args>``; each (goal, read) takes its value from the JSON."""
        for g, _ in reads:
            g.command = _shown(args)
        self.log(f"running {_shown(args)}")
        try:
            out = self.runner.run([*args, *target])
        except Exception as exc:  # a failed run is reported on its lines, the rest goes on
            for g, _ in reads:
                g.error = str(exc)
            return None
        for g, read in reads:
            g.values.append(round(read(out), 4))
        return out

    def fill(
        self, topic: str, partitions: int, records: int, target: Sequence[str], goals: list[Goal]
    ) -> bool:
        """Write the records the consumer lines read; False (and the goals marked) if it
        failed."""
        self.log(f"writing {records:,} records to {topic}")
        args = ["produce", "--topic", topic, "--partitions", str(partitions), "--records"]
        try:
            self.runner.run([*args, str(records), "--api", "batch", *target])
        except Exception as exc:
            for g in goals:
                g.error = f"filling {topic}: {exc}"
            return False
        return True

    # -- phases ----------------------------------------------------------------------------

    def latency(self, cluster: LocalCluster) -> None:
        """Item 1 on one node: the assigned consumer and the group, at 10,000/s; 1k and 50k."""
        t = _target(cluster)
        self.machine = calibrate_cluster(cluster.bootstrap)
        n = str(self._n(30_000))
        a50 = self.goal(
            1, "e2e p50 ≤ 1.5 ms at 10,000/s (assigned consumer)", "ms", 1.5, at_least=False
        )
        a99 = self.goal(
            1, "e2e p99 ≤ 5 ms at 10,000/s (assigned consumer)", "ms", 5.0, at_least=False
        )
        a999 = self.goal(1, "e2e p99.9 at 10,000/s (assigned consumer)", "ms", None, at_least=False)
        g50 = self.goal(
            1, "e2e p50 ≤ 1.5 ms at 10,000/s (group, async commits)", "ms", 1.5, at_least=False
        )
        g99 = self.goal(
            1, "e2e p99 ≤ 5 ms at 10,000/s (group, async commits)", "ms", 5.0, at_least=False
        )
        for i in range(self.runs):
            self.measure(
                [
                    "e2e",
                    "--topic",
                    f"goal-e2e-{i}",
                    "--records",
                    n,
                    "--rate",
                    "10000",
                    "--consumer-process",
                ],
                t,
                [(a50, _p("p50_ms")), (a99, _p("p99_ms")), (a999, _p("p99.9_ms"))],
            )
            self.measure(
                [
                    "e2e",
                    "--topic",
                    f"goal-e2eg-{i}",
                    "--records",
                    n,
                    "--rate",
                    "10000",
                    "--group",
                    f"goal-g{i}-{uuid.uuid4().hex[:6]}",
                    "--consumer-process",
                ],
                t,
                [(g50, _p("p50_ms")), (g99, _p("p99_ms"))],
            )
        for rate, records in (("1000", 10_000), ("50000", 150_000)):
            ps = [
                self.goal(
                    1, f"e2e {q} at {int(rate):,}/s (assigned consumer)", "ms", None, at_least=False
                )
                for q in ("p50", "p99", "p99.9")
            ]
            self.measure(
                [
                    "e2e",
                    "--topic",
                    f"goal-e2e-{rate}",
                    "--records",
                    str(self._n(records)),
                    "--rate",
                    rate,
                    "--consumer-process",
                ],
                t,
                [(ps[0], _p("p50_ms")), (ps[1], _p("p99_ms")), (ps[2], _p("p99.9_ms"))],
            )

    def producer(self, cluster: LocalCluster) -> None:
        """Item 2: one producer process, keyless and keyed."""
        t = _target(cluster)
        n = str(self._n(2_000_000))
        for keyed in (False, True):
            kind = "keyed" if keyed else "keyless"
            send = self.goal(
                2, f"send() ≤ 1 µs of caller CPU per record ({kind})", "µs", 1.0, at_least=False
            )
            rate = self.goal(
                2, f"≥ 1 M records/s from one producer ({kind})", "M/s", 1.0, at_least=True
            )
            for i in range(self.runs):
                args = ["produce", "--topic", f"goal-p-{kind}-{i}", "--records", n]
                if keyed:
                    args += ["--keys", "1000"]
                self.measure(args, t, [(send, _p("caller_cpu_us_per_record")), (rate, _mrate)])

    def consumer(self, cluster: LocalCluster) -> None:
        """Item 2: ``poll()`` and ``poll_arrow()`` of data already on the node."""
        t = _target(cluster)
        total = self._n(30_000_000, least=20_000)
        poll = self.goal(2, "poll() ≥ 1.5 M records/s (500 per poll)", "M/s", 1.5, at_least=True)
        arrow = self.goal(
            2, "poll_arrow() ≥ 10 M records/s (4 MiB fetches)", "M/s", 10.0, at_least=True
        )
        if not self.fill("goal-arrow4", 4, total, t, [poll, arrow]):
            return
        for _ in range(self.runs):
            self.measure(
                [
                    "consume",
                    "--topic",
                    "goal-arrow4",
                    "--records",
                    str(min(self._n(2_000_000), total)),
                    "--poll-records",
                    "500",
                ],
                t,
                [(poll, _mrate)],
            )
            self.measure(
                [
                    "consume",
                    "--topic",
                    "goal-arrow4",
                    "--records",
                    str(total),
                    "--api",
                    "arrow",
                    "--max-partition-fetch-bytes",
                    "4MiB",
                ],
                t,
                [(arrow, _mrate)],
            )

    def commits(self, cluster: LocalCluster) -> None:
        """Item 3: a synchronous commit's p50; a commit after every poll against none."""
        t = _target(cluster)
        total = self._n(6_000_000, least=20_000)
        sync = self.goal(3, "synchronous commit p50 ≤ 2 ms", "ms", 2.0, at_least=False)
        share = self.goal(
            3,
            "consume, async commit per 1,000-record poll ≥ 80 % of none",
            "%",
            80.0,
            at_least=True,
        )
        if not self.fill("goal-commits", 1, total, t, [sync, share]):
            return
        for i in range(self.runs):
            group = f"goal-c{i}-{uuid.uuid4().hex[:6]}"
            base = [
                "consume",
                "--topic",
                "goal-commits",
                "--records",
                str(total),
                "--poll-records",
                "1000",
            ]
            self.measure(
                [
                    "consume",
                    "--topic",
                    "goal-commits",
                    "--records",
                    str(min(self._n(2_000_000), total)),
                    "--poll-records",
                    "1000",
                    "--group",
                    group + "-s",
                    "--commit",
                    "sync",
                ],
                t,
                [(sync, lambda out: float(out["results"][1]["p50_ms"]))],
            )
            try:
                none = self.runner.run([*base, "--group", group + "-n", "--commit", "none", *t])
                asyn = self.runner.run([*base, "--group", group + "-a", "--commit", "async", *t])
            except Exception as exc:
                share.error = str(exc)
                continue
            share.command = _shown([*base, "--group", "G", "--commit", "async"]) + " (and none)"
            share.values.append(round(100 * _rate(asyn) / _rate(none), 1))

    def rf3(self, cluster: LocalCluster) -> None:
        """Item 1: RF=3, acks=all, on three nodes."""
        t = _target(cluster)
        p50 = self.goal(1, "RF=3 acks=all e2e p50 at 10,000/s", "ms", None, at_least=False)
        p99 = self.goal(1, "RF=3 acks=all e2e p99 ≤ 10 ms at 10,000/s", "ms", 10.0, at_least=False)
        for i in range(self.runs):
            self.measure(
                [
                    "e2e",
                    "--topic",
                    f"goal-rf3-{i}",
                    "--partitions",
                    "1",
                    "--replication-factor",
                    "3",
                    "--acks",
                    "all",
                    "--linger-ms",
                    "0",
                    "--rate",
                    "10000",
                    "--records",
                    str(self._n(30_000)),
                    "--consumer-process",
                ],
                t,
                [(p50, _p("p50_ms")), (p99, _p("p99_ms"))],
            )

    def batching(self) -> None:
        """Item 3: commits batched per coordinator (this bench starts its own clusters)."""
        per = self.goal(3, "commits per append, 64 committers, RF=3", "", None, at_least=True)
        gain = self.goal(
            3, "batched commits/s > one append per commit (ratio > 1)", "x", 1.0, at_least=True
        )
        seconds = str(max(round(10 * self.scale, 1), 2))
        args = ["commits", "--committers", "64", "--seconds", seconds, "--compare", "--nodes", "3"]
        for _ in range(self.runs):
            self.measure(
                [*args, "--dir", str(self.root)],
                [],
                [
                    (per, lambda out: float(out["context"]["batched_commits_per_append"])),
                    (gain, lambda out: _rate(out, 0) / _rate(out, 1)),
                ],
            )
        for g in (per, gain):
            g.command = _shown(args)

    def failover(self) -> None:
        """Item 4 (these benches start their own clusters)."""
        ctl = self.goal(
            4, "admin served by a standby ≤ 0.5 s after SIGKILL (median)", "s", 0.5, at_least=False
        )
        partitions = self._n(1000, least=50)
        node = self.goal(
            4,
            f"{partitions:,} partitions re-led ≤ 2 s after their node's SIGKILL (median)",
            "s",
            2.0,
            at_least=False,
        )
        trials = str(max(3, round(10 * min(self.scale, 1))))
        for g, args in (
            (ctl, ["failover", "--target", "controller", "--trials", trials]),
            (
                node,
                [
                    "failover",
                    "--target",
                    "node",
                    "--partitions",
                    str(partitions),
                    "--trials",
                    str(max(2, round(5 * min(self.scale, 1)))),
                ],
            ),
        ):
            self.measure(
                [*args, "--dir", str(self.root)],
                [],
                [(g, lambda out: statistics.median(out["seconds"]))],
            )
            g.command = _shown(args)


def _p(key: str) -> Callable[[dict[str, Any]], float]:
    return lambda out: float(out["results"][0][key])


def _rate(out: dict[str, Any], i: int = 0) -> float:
    return float(out["results"][i]["records_per_s"])


def _mrate(out: dict[str, Any]) -> float:
    return _rate(out) / 1e6


def bench_goals(
    *,
    runs: int = 3,
    scale: float = 1.0,
    skip: Sequence[str] = (),
    directory: str | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> tuple[list[Goal], dict[str, Any]]:
    """Every phase not in ``skip``; the goals and the machine's figures."""
    unknown = sorted(set(skip) - set(PHASES))
    if unknown:
        raise UsageError(f"--skip {','.join(unknown)}: not a phase (phases: {', '.join(PHASES)})")
    with tempfile.TemporaryDirectory(prefix="strom-bench-goals-", dir=directory) as tmp:
        g = Goals(Path(tmp), runs=runs, scale=scale, log=log)
        one_node = [p for p in ("latency", "producer", "consumer", "commits") if p not in skip]
        for phase in one_node:  # a fresh cluster each: one phase's topics do not slow the next
            log(f"phase {phase}: starting a 1-node cluster")
            with _cluster(g.root, 1) as cluster:
                getattr(g, phase)(cluster)
        if "rf3" not in skip:
            log("phase rf3: starting a 3-node cluster")
            with _cluster(g.root, 3) as cluster:
                g.rf3(cluster)
                if not g.machine:
                    g.machine = calibrate_cluster(cluster.bootstrap)
        if "batching" not in skip:
            log("phase batching")
            g.batching()
        if "failover" not in skip:
            log("phase failover")
            g.failover()
        if not g.machine:
            from strom.bench.machine import python_loop_s

            g.machine = {"python_loop_ms": round(python_loop_s() * 1e3, 1)}
        return g.goals, g.machine
