"""One chaos run: cluster, workload, nemesis, heal, final reads, replica scan, checker.

``python -m tests.chaos.run --duration 20m [--seed N] [--out DIR]`` (``make chaos``). The
seed is printed first and stored in ``DIR/seed``; the same seed replays the same fault
schedule (``DIR/plan.json``). At the end ``DIR/report.json`` holds the checker's verdict and
the numbers (faults by kind, records acknowledged, lost, duplicated, ...). A failed run keeps
everything: ``DIR/history/*.jsonl``, every process log under ``DIR/cluster/logs``, the data
dirs and the seed; a passing run deletes the data dirs unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from strom import Admin, Consumer, TopicPartition
from strom.api import storage_pb2, storage_pb2_grpc
from strom.devcluster.procs import ClusterError, ManagedProcess
from strom.errors import StromError, TopicAlreadyExistsError
from tests.chaos import final as final_mod
from tests.chaos.checker import check
from tests.chaos.cluster import REPO, ChaosCluster
from tests.chaos.history import History, read_history
from tests.chaos.nemesis import Nemesis, plan
from tests.chaos.workload import GROUP, INPUT, OUTPUT, TXN_GROUP

INTERNAL = ("__consumer_offsets", "__transaction_state")


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 20m)")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


@dataclass
class Client:
    name: str
    role: str
    incarnation: int = 0
    process: ManagedProcess | None = None
    exits: list[int | None] = field(default_factory=list)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


class Workload:
    """Keeps the workload processes running: fixed producers, pipelines and a monitor
    (restarted when they exit or are killed) and a changing population of group members."""

    def __init__(
        self,
        cluster: ChaosCluster,
        out: Path,
        seed: int,
        history: History,
        *,
        producers: int,
        rate: float,
        pipelines: int,
        members: tuple[int, int] = (1, 3),
        member_lifetime_s: tuple[float, float] = (15.0, 90.0),
    ) -> None:
        self.cluster = cluster
        self.hdir = out / "history"
        self.logs = out / "cluster" / "logs"
        self.seed = seed
        self.h = history
        self.rate = rate
        self.rnd = random.Random(f"{seed}:workload")
        self.members = members
        self.member_lifetime_s = member_lifetime_s
        self.clients: dict[str, Client] = {}
        for i in range(producers):
            self.clients[f"producer-{i}"] = Client(f"producer-{i}", "producer")
        for i in range(pipelines):
            self.clients[f"pipeline-{i}"] = Client(f"pipeline-{i}", "pipeline")
        self.clients["monitor"] = Client("monitor", "monitor")
        self._member_seq = 0
        self._member_target = members[1]
        self._stopping: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    @property
    def fixed_names(self) -> list[str]:
        return [n for n, c in self.clients.items() if c.role in ("producer", "pipeline")]

    def start(self) -> None:
        for c in list(self.clients.values()):
            self._launch(c)
        self._thread.start()

    def _argv(self, c: Client) -> list[str]:
        argv = [
            sys.executable, "-m", "tests.chaos.workload", c.role, self.cluster.bootstrap,
            "--name", c.name, "--incarnation", str(c.incarnation), "--out", str(self.hdir),
            "--seed", str(self.seed), "--rate", str(self.rate),
        ]  # fmt: skip
        if c.role == "member":
            argv += ["--lifetime-s", f"{self.rnd.uniform(*self.member_lifetime_s):.1f}"]
        return argv

    def _launch(self, c: Client) -> None:
        env = {"PYTHONPATH": str(REPO)}
        c.process = ManagedProcess(c.name, self._argv(c), self.logs / f"{c.name}.log", env=env)
        c.process.start()
        self.cluster.register_client(c.name, c.process.pid)
        self.h.write("client_start", name=c.name, incarnation=c.incarnation, pid=c.process.pid)

    def _run(self) -> None:
        next_target_change = time.monotonic() + 20
        while not self._stop.wait(0.3):
            with self._lock:
                for c in list(self.clients.values()):
                    if c.alive() or c.name in self._stopping or c.process is None:
                        continue
                    code = c.process.proc.returncode if c.process.proc else None
                    c.exits.append(code)
                    self.h.write("client_exit", name=c.name, code=code)
                    c.process = None
                    if c.role != "member":
                        c.incarnation += 1
                        self._launch(c)
                    else:
                        del self.clients[c.name]
                if time.monotonic() > next_target_change:
                    self._member_target = self.rnd.randint(*self.members)
                    next_target_change = time.monotonic() + self.rnd.uniform(10, 40)
                alive = [c for c in self.clients.values() if c.role == "member" and c.alive()]
                if len(alive) < self._member_target and "member" not in self._stopping:
                    self._member_seq += 1
                    m = Client(f"member-{self._member_seq}", "member")
                    self.clients[m.name] = m
                    self._launch(m)

    def kill(self, name: str) -> bool:
        """SIGKILL one client ("member" = a random live member); False if none matched."""
        with self._lock:
            if name == "member":
                alive = sorted(
                    c.name for c in self.clients.values() if c.role == "member" and c.alive()
                )
                if not alive:
                    return False
                name = self.rnd.choice(alive)
            c = self.clients.get(name)
            if c is None or not c.alive():
                return False
            assert c.process is not None
            c.process.kill()
            self.h.write("client_killed", name=name)
            return True

    def stop_role(self, role: str, timeout: float) -> list[str]:
        """SIGTERM every client of ``role`` and wait; names of those that had to be killed."""
        with self._lock:
            self._stopping.add(role)
            victims = [c for c in self.clients.values() if c.role == role]
            for c in victims:
                self._stopping.add(c.name)
                if c.alive():
                    c.process.signal(signal.SIGTERM)  # type: ignore[union-attr]
        killed = []
        deadline = time.monotonic() + timeout
        for c in victims:
            if c.process is None:
                continue
            try:
                c.process.proc.wait(timeout=max(0.1, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                c.process.kill()
                killed.append(c.name)
            self.h.write("client_stopped", name=c.name, code=c.process.proc.returncode)  # type: ignore[union-attr]
        return killed

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for c in self.clients.values():
            if c.alive():
                c.process.kill()  # type: ignore[union-attr]


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed if args.seed is not None else random.randrange(1 << 31)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = Path(args.out or f"/tmp/strom-chaos/{stamp}-seed{self.seed}").resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "seed").write_text(f"{self.seed}\n")
        self.h = History(self.out / "history" / "nemesis.jsonl", src="nemesis")
        self.cluster: ChaosCluster | None = None
        self.workload: Workload | None = None
        self.nemesis: Nemesis | None = None
        self.problems: list[str] = []

    def log(self, msg: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # -- cluster queries (direct addresses, around the proxy) --------------------------------

    def metadata(self, topics: list[str]) -> storage_pb2.MetadataResponse | None:
        assert self.cluster is not None
        for n in self.cluster.nodes:
            if not n.alive() or n.paused:
                continue
            with grpc.insecure_channel(n.direct) as ch:
                try:
                    return storage_pb2_grpc.StorageServiceStub(ch).Metadata(
                        storage_pb2.MetadataRequest(topics=topics), timeout=3
                    )
                except grpc.RpcError:
                    continue
        return None

    def fully_replicated(self) -> bool:
        assert self.cluster is not None
        md = self.metadata([INPUT, OUTPUT, *INTERNAL])
        if md is None or len(md.nodes) < len(self.cluster.nodes):
            return False
        for t in md.topics:
            if t.error_code != 0 or not t.partitions:
                return False
            for p in t.partitions:
                if p.leader < 0 or sorted(p.isr) != sorted(p.replicas):
                    return False
        return True

    def _create_topic(self, name: str, partitions: int) -> bool:
        """Create ``name`` (RF=3, min.insync.replicas=2); False to try again (a node of a
        loaded machine may be re-registering just then)."""
        assert self.cluster is not None
        md = self.metadata([])
        if md is None or len(md.nodes) < 3:
            return False
        with Admin(self.cluster.bootstrap) as admin:
            try:
                admin.create_topic(
                    name, partitions=partitions, replication_factor=3,
                    config={"min.insync.replicas": "2"},
                )  # fmt: skip
            except TopicAlreadyExistsError:
                return True
            except StromError as exc:
                self.h.write("create_topic_retry", topic=name, err=str(exc)[:200])
                return False
        return True

    def assignment(self) -> dict[str, list[str]]:
        md = self.metadata([INPUT, OUTPUT])
        assert md is not None
        return {
            f"{t.name}-{p.partition}": [f"node-{r}" for r in p.replicas]
            for t in md.topics
            for p in t.partitions
        }

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        self.log(f"seed {self.seed}, {args.duration:.0f}s of faults, output in {self.out}")
        cluster = self.cluster = ChaosCluster(
            self.out / "cluster",
            nodes=args.nodes,
            network=args.network,
            coordinator_args=[
                "--group-session-timeout-ms", "10000",
                "--group-heartbeat-interval-ms", "500",
                "--offsets-partitions", "3",
                "--transaction-state-partitions", "3",
            ],
        )  # fmt: skip
        services = [p.name for p in cluster.services]
        etcd = [p.name for p in cluster.etcd]
        clients = [f"producer-{i}" for i in range(args.producers)]
        clients += [f"pipeline-{i}" for i in range(args.pipelines)] + ["member"]
        exclude = frozenset({"delay"}) if args.network == "netns" else frozenset()
        faults = plan(
            self.seed, args.duration, services=services, etcd=etcd, clients=clients,
            exclude=exclude,
        )  # fmt: skip
        (self.out / "plan.json").write_text(json.dumps([f.as_dict() for f in faults], indent=1))
        try:
            return self._run(faults)
        finally:
            if self.workload is not None:
                self.workload.close()
            cluster.kill_all()

    def _run(self, faults: list[Any]) -> int:
        args = self.args
        cluster = self.cluster
        assert cluster is not None
        t0 = time.monotonic()
        cluster.start()
        self.log(f"cluster up in {time.monotonic() - t0:.0f}s; bootstrap {cluster.bootstrap}")
        for name, parts in ((INPUT, args.partitions), (OUTPUT, 3)):
            cluster.until(
                lambda name=name, parts=parts: self._create_topic(name, parts),
                timeout=120,
                what=f"topic {name} created",
            )
        cluster.until(self.fully_replicated, timeout=120, what="topics fully replicated")
        self.workload = Workload(
            cluster, self.out, self.seed, self.h,
            producers=args.producers, rate=args.rate, pipelines=args.pipelines,
        )  # fmt: skip
        self.workload.start()
        self.nemesis = Nemesis(
            cluster, faults, self.h,
            fully_replicated=self.fully_replicated, kill_client=self.workload.kill,
        )  # fmt: skip
        self.log(f"workload and nemesis running ({len(faults)} faults planned)")
        self.nemesis.start()
        end = time.monotonic() + args.duration
        next_note = time.monotonic() + 60
        while time.monotonic() < end and self.nemesis.error is None:
            # time is the behaviour: the run lasts --duration (a 1 s poll of the nemesis).
            time.sleep(1)
            if time.monotonic() > next_note:
                next_note += 60
                self.log(f"faults so far: {self.nemesis.applied}")
        self.nemesis.stop()
        if self.nemesis.error is not None:
            self.problems.append(f"nemesis failed: {self.nemesis.error!r}")
        self.log(f"faults applied {self.nemesis.applied}, skipped {self.nemesis.skipped}; healing")
        return self._finish()

    def _finish(self) -> int:
        cluster, workload = self.cluster, self.workload
        assert cluster is not None and workload is not None
        try:
            cluster.wait_etcd_healthy(120)
            for p in cluster.services:
                cluster.wait_serving(p, 120)
            cluster.until(self.fully_replicated, timeout=180, what="full replication after healing")
        except ClusterError as exc:
            self.problems.append(f"cluster did not heal: {exc}")
        healed = time.monotonic()
        self._run_after_healing(workload, seconds=5, timeout=120)
        killed = workload.stop_role("producer", timeout=120)
        if killed:
            self.problems.append(f"producers did not stop within 120s: {killed}")
        self.log("producers stopped; waiting for the groups to consume everything")
        caught_up = self._wait_caught_up(timeout=240)
        if not caught_up:
            self.problems.append("liveness: the groups did not consume everything within 240s")
            self._diagnose("not_caught_up")
        for role in ("member", "pipeline", "monitor"):
            killed = workload.stop_role(role, timeout=60)
            if killed:
                self.h.write("client_stop_killed", names=killed)
        self.log(f"workload stopped {time.monotonic() - healed:.0f}s after healing; final reads")
        final = final_mod.final_reads(cluster.bootstrap)
        self.problems.extend(final.pop("problems"))
        (self.out / "final.json").write_text(json.dumps(final))
        assignment = self.assignment()
        try:
            cluster.until(self.fully_replicated, timeout=120, what="full replication at the end")
        except ClusterError as exc:
            self.problems.append(str(exc))
        # Followers fetch up to the leader's log end right after the HW moves; give them the
        # same long-poll round before stopping (stop is graceful: logs are closed cleanly).
        # No event shows a follower's log end here (the chaos cluster's services run without
        # metrics, and every RPC answers with the leader's), so this margin stays a fixed one.
        time.sleep(2)  # no event stands for it: see above
        cluster.stop()
        replicas = final_mod.scan_replicas({n.name: n.data_dir for n in cluster.nodes})  # type: ignore[misc]
        (self.out / "replicas.json").write_text(json.dumps(replicas))
        events = read_history(self.out / "history")
        report = check(events, final, replicas, assignment)
        for problem in self.problems:
            report.violate("run", problem)
        tracebacks = scan_logs(cluster.root / "logs")
        if tracebacks:
            report.notes.append(f"tracebacks in process logs: {tracebacks}")
        result = report.as_dict()
        result["seed"] = self.seed
        result["duration_s"] = self.args.duration
        result["faults"] = dict(sorted(self.nemesis.applied.items())) if self.nemesis else {}
        result["faults_skipped"] = (
            dict(sorted(self.nemesis.skipped.items())) if self.nemesis else {}
        )
        result["client_exits"] = {c.name: c.exits for c in workload.clients.values() if c.exits}
        (self.out / "report.json").write_text(json.dumps(result, indent=1))
        self.log(summary(result))
        if report.ok and not self.args.keep:
            for n in cluster.nodes + cluster.etcd:
                if n.data_dir is not None:
                    shutil.rmtree(n.data_dir, ignore_errors=True)
        if not report.ok:
            self.log(f"FAILED: history, logs, data dirs and seed kept in {self.out}")
        return 0 if report.ok else 1

    def _diagnose(self, what: str) -> None:
        """Keep what the groups and transactions look like now (``strom groups describe``,
        ``strom transactions list``) beside the history: a liveness failure then says which
        member, partition or transaction held things up."""
        cluster = self.cluster
        assert cluster is not None
        path = self.out / f"{what}.txt"
        commands = [
            ["groups", "describe", GROUP],
            ["groups", "describe", TXN_GROUP],
            ["transactions", "list"],
        ]
        with path.open("w") as f:
            for cmd in commands:
                argv = [sys.executable, "-m", "strom.cli.main", *cmd, "-b", cluster.bootstrap]
                f.write(f"$ strom {' '.join(cmd)}\n")
                f.flush()
                try:
                    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
                    f.write(done.stdout + done.stderr + "\n")
                except subprocess.TimeoutExpired:
                    f.write("(no answer within 60 s)\n")
                except OSError as exc:  # the report matters more than this diagnosis
                    f.write(f"(could not run it: {exc})\n")
        self.log(f"state of the groups and transactions kept in {path}")

    def _wait_caught_up(self, timeout: float) -> bool:
        cluster = self.cluster
        assert cluster is not None
        deadline = time.monotonic() + timeout
        with Consumer(cluster.bootstrap, request_timeout_ms=10_000) as c:
            tps = [TopicPartition(INPUT, p) for p in sorted(c.partitions_for_topic(INPUT))]
            ends = {tp.partition: o for tp, o in c.end_offsets(tps).items()}
        while time.monotonic() < deadline:
            try:
                done = all(
                    final_mod.committed_offsets(cluster.bootstrap, g, INPUT).get(p, -1) >= end
                    for g in (GROUP, TXN_GROUP)
                    for p, end in ends.items()
                )
            except Exception as exc:  # a query failing while things settle: try again
                self.h.write("catch_up_query_failed", err=repr(exc)[:200])
                done = False
            if done:
                return True
            time.sleep(2)  # poll interval of the condition above (each poll asks every group)
        return False

    def _input_end(self) -> int:
        """The input topic's end offsets (high watermarks) added up."""
        assert self.cluster is not None
        with Consumer(self.cluster.bootstrap, request_timeout_ms=10_000) as c:
            tps = [TopicPartition(INPUT, p) for p in sorted(c.partitions_for_topic(INPUT))]
            return sum(c.end_offsets(tps).values())

    def _run_after_healing(self, workload: Workload, *, seconds: float, timeout: float) -> None:
        """Until the producers appended ``seconds`` worth of their rate on the healed cluster
        (the workload runs a little there before it stops): a count of records, not a guessed
        stretch of time. Not a check: a cluster too slow for it is only noted."""
        producers = sum(1 for c in workload.clients.values() if c.role == "producer")
        wanted = max(1, int(seconds * workload.rate * producers))
        ends: list[int] = []

        def appended() -> bool:
            ends.append(self._input_end())
            return ends[-1] - ends[0] >= wanted

        try:
            assert self.cluster is not None
            self.cluster.until(appended, timeout=timeout, what=f"{wanted} records after healing")
        except ClusterError as exc:
            self.h.write("after_healing_slow", err=str(exc)[:300])
            self.log(f"the healed cluster took fewer records than planned: {exc}")


def scan_logs(logs: Path) -> dict[str, int]:
    """Process log -> number of tracebacks in it (reported; the checker decides on data)."""
    out = {}
    for path in sorted(logs.glob("*.log")):
        n = path.read_text(errors="replace").count("Traceback")
        if n:
            out[path.name] = n
    return out


def summary(result: dict[str, Any]) -> str:
    c = result["counts"]
    keys = [
        "acknowledged", "failed", "unknown_outcome", "unacknowledged_present", "lost",
        "duplicated", "duplicated_unacknowledged", "reordered", "offset_gap", "read_mismatch",
        "records_received", "group_skipped", "member_commit_regression",
        "committed_offset_regression", "txn_commit", "txn_abort", "txn_duplicated", "txn_lost",
        "txn_output_beyond_offsets", "replica_diverged", "replica_batches_compared",
    ]  # fmt: skip
    parts = [f"{k}={c.get(k, 0)}" for k in keys]
    verdict = "OK" if result["ok"] else "VIOLATIONS: " + ", ".join(result["violations"])
    return f"{verdict}\n  faults {result['faults']}\n  " + " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    ap.add_argument("--duration", type=parse_duration, default=parse_duration("2m"))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=None, help="output directory (default under /tmp/strom-chaos)")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--pipelines", type=int, default=2)
    ap.add_argument("--rate", type=float, default=40.0, help="records/s per producer")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs of a passing run")
    ap.add_argument(
        "--network",
        choices=["proxy", "netns"],
        default="proxy",
        help="faults through the TCP proxy on loopback (default), or real partitions with a "
        "network namespace per process (root only; no delays)",
    )
    args = ap.parse_args(argv)
    os.chdir(REPO)
    return Runner(args).run()


if __name__ == "__main__":
    sys.exit(main())
