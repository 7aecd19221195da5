"""The nemesis: a fault schedule drawn from a seed, and the thread that plays it.

:func:`plan` turns ``(seed, duration, cluster shape)`` into a list of :class:`Fault` — the
same seed always gives the same list, which is what ``make chaos SEED=...`` replays. The
:class:`Nemesis` applies each fault at its time and heals it after its duration; faults
overlap freely across *domains* (etcd, controllers, coordinators, storage nodes, clients,
clocks), within a domain at most one process is impaired at a time, and a storage-node fault
waits (up to ``gate_s``) until the last healed node's old lease has surely expired and every
partition is fully replicated again: that is the failure model under which strom promises no
loss (DESIGN §6: one node failing at a time). Waiting
makes the *timing* of a replay depend on how fast the cluster heals; the faults, their
targets and their order are the seed's. Everything applied, healed or skipped is written to
the nemesis history.

Kinds:

- ``kill``: SIGKILL, restart after the duration (etcd members, controllers, coordinators,
  storage nodes).
- ``pause``: SIGSTOP for longer than the etcd lease, then SIGCONT.
- ``isolate``: the proxy stalls everything to and from the target (a partition); with
  network namespaces its interface goes down.
- ``isolate_etcd``: the target cannot talk to etcd (an etcd member: to its peers).
- ``oneway``: what the target sends is stalled, what it receives still arrives (or the
  reverse, ``params.inbound``).
- ``pair``: a partition between two services only.
- With network namespaces (``--network netns``) the partitions are blackhole routes in the
  processes' namespaces (tests/chaos/netns.py), resets are ``ss -K``, and there is no delay.
- ``delay``: every chunk to and from the target waits ``params.ms``.
- ``reset``: every connection of the target is reset mid-stream (instant).
- ``clock``: the target's wall clock jumps by ``params.ms`` (strom.clock), back at the end.
- ``wipe``: a storage node is killed, its data dir deleted (a new disk), and started empty.
- ``client_kill``: a workload process is SIGKILLed (the workload restarts it).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.cluster import ChaosCluster, Proc
from tests.chaos.history import History

#: (kind, weight): how often each fault is drawn.
WEIGHTS: list[tuple[str, float]] = [
    ("kill", 4),
    ("pause", 2),
    ("isolate", 2),
    ("isolate_etcd", 1.5),
    ("oneway", 1.5),
    ("pair", 1),
    ("delay", 1),
    ("reset", 1.5),
    ("clock", 1.5),
    ("wipe", 0.7),
    ("client_kill", 1),
]

#: Kinds that impair their target (one per domain at a time).
IMPAIRING = {"kill", "pause", "isolate", "isolate_etcd", "oneway", "pair", "wipe"}


@dataclass(order=True)
class Fault:
    at: float
    kind: str = field(compare=False)
    target: str = field(compare=False)
    duration: float = field(compare=False)
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 2),
            "kind": self.kind,
            "target": self.target,
            "duration": round(self.duration, 2),
            **({"params": self.params} if self.params else {}),
        }


def domain(name: str) -> str:
    return name.rsplit("-", 1)[0]


def plan(
    seed: int,
    duration_s: float,
    *,
    services: list[str],
    etcd: list[str],
    clients: list[str],
    mean_gap_s: float = 4.0,
    lease_s: float = 2.0,
    exclude: frozenset[str] = frozenset(),
) -> list[Fault]:
    """The fault schedule for ``seed`` (see the module docstring); ``exclude`` leaves kinds
    out (``delay`` with network namespaces, which have no netem here)."""
    rnd = random.Random(seed)
    kinds, weights = zip(*[(k, w) for k, w in WEIGHTS if k not in exclude], strict=True)
    nodes = [s for s in services if s.startswith("node-")]
    faults: list[Fault] = []
    t = rnd.uniform(3, 6)
    while t < duration_s - 8:
        kind = rnd.choices(kinds, weights)[0]
        params: dict[str, Any] = {}
        if kind == "wipe":
            target = rnd.choice(nodes)
            duration = rnd.uniform(1, 6)
        elif kind == "client_kill":
            target = rnd.choice(clients)
            duration = 0.0
        elif kind == "clock":
            target = rnd.choice(services)
            params["ms"] = rnd.choice([-1, 1]) * rnd.randint(30_000, 20 * 60_000)
            duration = rnd.uniform(5, 30)
        elif kind == "pair":
            target = rnd.choice(services)
            params["peer"] = rnd.choice([s for s in services + etcd if s != target])
            duration = rnd.uniform(3, 15)
        else:
            target = rnd.choice(services + etcd)
            if kind == "pause":
                duration = rnd.uniform(lease_s + 0.5, lease_s * 4)
            elif kind == "delay":
                params["ms"] = rnd.choice([20, 50, 100, 250, 500])
                duration = rnd.uniform(3, 15)
            elif kind == "reset":
                duration = 0.0
            elif kind == "oneway":
                params["inbound"] = rnd.random() < 0.5
                duration = rnd.uniform(3, 15)
            elif kind == "kill":
                duration = rnd.choice([0.0, rnd.uniform(0.5, 10)])
            else:
                duration = rnd.uniform(3, 15)
        faults.append(Fault(round(t, 3), kind, target, round(duration, 3), params))
        t += rnd.expovariate(1.0 / mean_gap_s)
    return faults


class Nemesis:
    """Plays a schedule against a cluster (see the module docstring)."""

    def __init__(
        self,
        cluster: ChaosCluster,
        faults: list[Fault],
        history: History,
        *,
        fully_replicated: Callable[[], bool],
        kill_client: Callable[[str], bool],
        gate_s: float = 30.0,
        lease_s: float = 2.0,
    ) -> None:
        self.cluster = cluster
        self.faults = sorted(faults)
        self.h = history
        self.fully_replicated = fully_replicated
        self.kill_client = kill_client
        self.gate_s = gate_s
        self.stop_event = threading.Event()
        self.busy: dict[str, str] = {}  # domain -> process name impaired
        self.lease_s = lease_s
        #: A healed storage node keeps its domain busy until this monotonic time: a process
        #: restarted at once still looks alive (and in the ISR) until its old lease expires,
        #: so "fully replicated" means nothing before then.
        self.node_settles_at = 0.0
        self.rules: dict[int, dict[str, Any]] = {}  # active proxy rules by fault id
        self.heals: list[tuple[float, int, Callable[[], None]]] = []
        self.applied: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Stop drawing faults, heal every one still active."""
        self.stop_event.set()
        self._thread.join(timeout=120)
        self.heal_all()

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            for fault in self.faults:
                while not self.stop_event.is_set():
                    self._heal_due()
                    wait = self._t0 + fault.at - time.monotonic()
                    if wait <= 0:
                        break
                    self.stop_event.wait(min(wait, 0.1))
                if self.stop_event.is_set():
                    return
                self._apply_when_allowed(fault)
            while not self.stop_event.is_set():
                self._heal_due()
                self.stop_event.wait(0.1)
        except BaseException as exc:  # reported by the runner; the run fails
            self.error = exc
            self.h.write("nemesis_error", err=f"{type(exc).__name__}: {exc}")

    def _heal_due(self) -> None:
        now = time.monotonic()
        while self.heals and self.heals[0][0] <= now:
            _, _, heal = heapq.heappop(self.heals)
            heal()

    def _later(self, delay: float, heal: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.heals, (time.monotonic() + delay, self._seq, heal))

    def _apply_when_allowed(self, f: Fault) -> None:
        deadline = time.monotonic() + self.gate_s
        while not self.stop_event.is_set():
            reason = self._blocked(f)
            if reason is None:
                self._apply(f)
                return
            if time.monotonic() > deadline:
                self.skipped[f.kind] = self.skipped.get(f.kind, 0) + 1
                self.h.write("skip", fault=f.as_dict(), why=reason)
                return
            self._heal_due()
            self.stop_event.wait(0.25)

    def _blocked(self, f: Fault) -> str | None:
        if f.kind not in IMPAIRING:
            return None
        names = [f.target, f.params["peer"]] if f.kind == "pair" else [f.target]
        for name in names:
            d = domain(name)
            if d in ("etcd", "controller", "coordinator", "node") and d in self.busy:
                return f"{d} {self.busy[d]} is impaired"
        if any(domain(n) == "node" for n in names):
            if time.monotonic() < self.node_settles_at:
                return "a storage node was just healed (its old lease may still be alive)"
            if not self.fully_replicated():
                return "partitions are under-replicated"
        return None

    def _impair(self, name: str) -> None:
        self.busy[domain(name)] = name

    def _release(self, name: str) -> None:
        if self.busy.get(domain(name)) == name:
            del self.busy[domain(name)]
        if domain(name) == "node":
            self.node_settles_at = time.monotonic() + self.lease_s + 2.0

    # -- applying faults ---------------------------------------------------------------------

    def _record(self, f: Fault, **extra: Any) -> None:
        self.applied[f.kind] = self.applied.get(f.kind, 0) + 1
        self.h.write("fault", fault=f.as_dict(), **extra)

    def _healed(self, f: Fault, **extra: Any) -> None:
        self.h.write("heal", fault=f.as_dict(), **extra)

    def _apply(self, f: Fault) -> None:
        c = self.cluster
        if f.kind == "client_kill":
            if self.kill_client(f.target):
                self._record(f)
            return
        if f.kind == "reset":
            if c.net is not None:
                n = c.net.kill_connections(f.target)
            else:
                assert c.proxy is not None
                n = c.proxy.command(cmd="reset", **{"from": ["*"], "to": [f.target]})["reset"]
            self._record(f, connections=n)
            return
        p = c.by_name(f.target)
        if f.kind in IMPAIRING:
            self._impair(f.target)
            if f.kind == "pair":
                self._impair(f.params["peer"])
        if f.kind == "kill":
            c.kill(p)
            self._record(f)
            self._later(f.duration, lambda: self._restart(f, p))
        elif f.kind == "wipe":
            c.wipe(p)
            self._record(f)
            self._later(f.duration, lambda: self._restart(f, p))
        elif f.kind == "pause":
            c.pause(p)
            self._record(f)
            self._later(f.duration, lambda: self._resume(f, p))
        elif f.kind == "clock":
            c.set_clock(p, f.params["ms"])
            self._record(f)
            self._later(f.duration, lambda: self._clock_back(f, p))
        elif c.net is not None:
            undo = self._netns_fault(f)
            self._record(f, network="netns")
            self._later(f.duration, lambda: self._netns_heal(f, undo))
        else:
            rules = self._rules_for(f)
            self._seq += 1
            rid = self._seq
            self.rules[rid] = {"fault": f, "rules": rules}
            self._push_rules()
            self._record(f)
            self._later(f.duration, lambda: self._drop_rules(f, rid))

    def _rules_for(self, f: Fault) -> list[dict[str, Any]]:
        t = f.target
        etcd = [p.name for p in self.cluster.etcd]
        if f.kind == "isolate":
            return [
                {"kind": "stall", "from": [t], "to": ["*"]},
                {"kind": "stall", "from": ["*"], "to": [t]},
            ]
        if f.kind == "isolate_etcd":
            others = [e for e in etcd if e != t] if t.startswith("etcd-") else etcd
            return [
                {"kind": "stall", "from": [t], "to": others},
                {"kind": "stall", "from": others, "to": [t]},
            ]
        if f.kind == "oneway":
            if f.params.get("inbound"):
                return [{"kind": "stall", "from": ["*"], "to": [t]}]
            return [{"kind": "stall", "from": [t], "to": ["*"]}]
        if f.kind == "pair":
            peer = f.params["peer"]
            return [
                {"kind": "stall", "from": [t], "to": [peer]},
                {"kind": "stall", "from": [peer], "to": [t]},
            ]
        if f.kind == "delay":
            ms = f.params["ms"]
            return [
                {"kind": "delay", "from": [t], "to": ["*"], "ms": ms},
                {"kind": "delay", "from": ["*"], "to": [t], "ms": ms},
            ]
        raise ValueError(f"no proxy rules for {f.kind}")

    def _netns_fault(self, f: Fault) -> Callable[[], None]:
        """Apply a partition with routes or links in network namespaces; returns the undo."""
        net = self.cluster.net
        assert net is not None
        t = f.target
        everyone = [n for n in net.hosts if n != t]
        etcd = [p.name for p in self.cluster.etcd]
        pairs: list[tuple[str, str]] = []
        if f.kind == "isolate":
            net.link(t, False)
            return lambda: net.link(t, True)
        if f.kind == "isolate_etcd":
            others = [e for e in etcd if e != t]
            pairs = [(t, o) for o in others] + [(o, t) for o in others]
        elif f.kind == "oneway":
            if f.params.get("inbound"):
                pairs = [(o, t) for o in everyone]
            else:
                pairs = [(t, o) for o in [*everyone, "host"]]
        elif f.kind == "pair":
            peer = f.params["peer"]
            pairs = [(t, peer), (peer, t)]
        else:
            raise ValueError(f"no network-namespace fault for {f.kind}")
        for src, dst in pairs:
            net.block(src, dst)

        def undo() -> None:
            for src, dst in pairs:
                net.unblock(src, dst)

        return undo

    def _netns_heal(self, f: Fault, undo: Callable[[], None]) -> None:
        undo()
        self._release(f.target)
        if f.kind == "pair":
            self._release(f.params["peer"])
        self._healed(f)

    def _push_rules(self) -> None:
        rules = [r for entry in self.rules.values() for r in entry["rules"]]
        assert self.cluster.proxy is not None
        self.cluster.proxy.command(cmd="rules", rules=rules)

    def _drop_rules(self, f: Fault, rid: int) -> None:
        if self.rules.pop(rid, None) is None:
            return
        self._push_rules()
        self._release(f.target)
        if f.kind == "pair":
            self._release(f.params["peer"])
        self._healed(f)

    def _restart(self, f: Fault, p: Proc) -> None:
        self.cluster.launch(p)
        self._release(p.name)
        self._healed(f)

    def _resume(self, f: Fault, p: Proc) -> None:
        self.cluster.resume(p)
        self._release(p.name)
        self._healed(f)

    def _clock_back(self, f: Fault, p: Proc) -> None:
        self.cluster.set_clock(p, 0)
        self._healed(f)

    def heal_all(self) -> None:
        """Run every pending heal now (restart, resume, clocks back, rules dropped)."""
        while self.heals:
            _, _, heal = heapq.heappop(self.heals)
            heal()
        self.rules.clear()
        if self.cluster.proxy is not None:
            self.cluster.proxy.command(cmd="rules", rules=[])
        if self.cluster.net is not None:
            self.cluster.net.heal()
        for p in self.cluster.procs.values():
            if p.paused:
                self.cluster.resume(p)
            self.cluster.set_clock(p, 0)
            if not p.alive():
                self.cluster.launch(p)
        self.busy.clear()
        self.h.write("healed_all")
