"""``strom bench e2e``: end-to-end latency, with every record accounted for.

A producer thread sends numbered records at ``--rate`` records/s, each at its scheduled time
(record i at start + i / rate, never before), each value starting with its number, its
scheduled time and the time ``send()`` was called; a consumer (assigned, or a group member
that commits as it goes) receives them. Latency counts from the scheduled time, as the
performance goals are stated: a record the producer thread sent late (it overslept, or waited
for the interpreter lock) counts its lateness, so a slow sender cannot hide its queueing
(no coordinated omission). The latency from ``send()`` is reported beside it. Unlike a plain perf
tool, the run also checks what a pipeline's user cares about: every send that failed (with
its first error), every acknowledged record that never arrived, every record that arrived
twice, and the longest a record took. That is what turned "an e2e run stalled for more than
60 s" into an explanation (issue 9, defect 3): the stall was records the producer had failed
with a spurious OUT_OF_ORDER_SEQUENCE, which an unchecked bench could only wait for until it
gave up.

``cpu_hog`` starts that many busy-looping processes for the run (the machine under load);
``reorder_every`` is for tests that put a reordering gRPC proxy in front of the node.

``consumer_process`` receives in a process of its own, as two services would: in one process
the producer's and the consumer's threads share one interpreter lock, which on 2 cores costs
the records ~0.5 ms of p50 (docs/benchmarks.md). Send times are ``perf_counter_ns``, the
system's monotonic clock, so the two processes' stamps compare.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strom.bench import cpu
from strom.bench.clients import Progress
from strom.bench.machine import calibrate_cluster
from strom.bench.machine import describe as describe_machine
from strom.bench.stats import Result, percentiles_ms
from strom.client.admin import Admin
from strom.client.types import TopicPartition

#: Records sent at the rate before the measured ones (the same stream, stamped as warm-up), in
#: seconds of the schedule. Why: the clock used to start right after the CPU meter's first
#: reading (a scrape of every service's /metrics, ~5 ms of the node's interpreter lock) and an
#: idle pause, and ``perf sched`` showed the first 150-250 records of every run late by
#: 12-28 ms while the node, the producer and the consumer caught up: 0.5-0.8 % of a 30,000-record
#: run, enough to set p99 (docs/benchmarks.md, "The start of a run").
LEAD_IN_S = 0.3
#: Value prefix: run nonce, record number, send time (perf_counter ns). The nonce tells this
#: run's records from a group's leftovers of an earlier run.
STAMP = struct.Struct(">Iqq")
#: The e2e bench's prefix: STAMP's fields with the scheduled time in place of the send time,
#: then the time ``send()`` was called.
E2E_STAMP = struct.Struct(">Iqqq")


@dataclass
class E2EResult(Result):
    """A :class:`Result` plus the delivery check."""

    sent: int = 0
    failed: int = 0
    first_error: str = ""
    lost: int = 0
    duplicates: int = 0
    #: Records that took longer than a second from send to receive.
    slow: int = 0
    commits: int = 0
    commit_errors: int = 0
    #: Each record's latency from its send() call (``latencies`` count from its schedule).
    from_send: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: With ``trace``: each leg's latency percentiles (ms), see :func:`latency_budget`.
    budget: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The machine's prices for a gRPC round trip and a thread hand-off, measured before the
    #: run (:mod:`strom.bench.machine`): latencies compare across machines only with these.
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Every record sent was acknowledged and received exactly once."""
        return not (self.failed or self.lost or self.duplicates or self.commit_errors)

    def summary(self) -> dict[str, float | int | str | None]:
        out = super().summary()
        if self.latencies:
            out["max_ms"] = round(max(self.latencies) * 1e3, 3)
        if self.from_send:
            q = percentiles_ms(self.from_send, (50, 99, 99.9))
            out.update({f"from_send_{k}_ms": v for k, v in q.items()})
        out.update(
            sent=self.sent,
            failed=self.failed,
            lost=self.lost,
            duplicates=self.duplicates,
            slow_over_1s=self.slow,
            commits=self.commits,
            commit_errors=self.commit_errors,
        )
        if self.first_error:
            out["first_error"] = self.first_error
        if self.budget:
            out["budget_ms"] = self.budget  # type: ignore[assignment]
        if self.machine:
            out["machine"] = self.machine  # type: ignore[assignment]
        return out

    def line(self) -> str:
        d = self.summary()
        text = super().line()
        if self.latencies:
            text += f" max {d['max_ms']}"
        if self.from_send:
            text += f"\n{'from send()':<24} latency ms" + "".join(
                f" {k} {d[f'from_send_{k}_ms']}" for k in ("p50", "p99", "p99.9")
            )
        text += (
            f"\n{'delivery':<24} sent {self.sent:,}  failed {self.failed:,}  lost {self.lost:,}"
            f"  duplicated {self.duplicates:,}  slower than 1 s {self.slow:,}"
        )
        if self.commits or self.commit_errors:
            text += f"  commits {self.commits:,} (errors {self.commit_errors:,})"
        if self.first_error:
            text += f"\n{'first error':<24} {self.first_error}"
        if self.machine:
            text += "\n" + describe_machine(self.machine)
        if self.budget:
            text += f"\n{'latency budget (ms)':<44} {'p50':>8} {'p99':>8} {'p99.9':>8}"
            for leg, q in self.budget.items():
                text += f"\n  {leg:<42} {q['p50']:>8.3f} {q['p99']:>8.3f} {q['p99.9']:>8.3f}"
        return text


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """``processes`` busy-looping Python processes while the block runs."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def bench_e2e(
    bootstrap: str | None,
    topic: str,
    *,
    records: int,
    record_size: int,
    rate: float = 10_000,
    progress: bool | None = None,
    group: str | None = None,
    commit: str = "async",
    cpu_hogs: int = 0,
    grace_s: float = 30.0,
    trace: bool = False,
    warmup_records: int = 1000,
    lead_in_s: float = LEAD_IN_S,
    consumer_process: bool = False,
    **producer_options: Any,
) -> E2EResult:
    """Send ``records`` at ``rate``; receive them with an assigned consumer, or as a member of
    ``group`` committing after every poll (``commit`` = async, sync or none). Returns when
    every acknowledged record arrived, or when nothing arrived for ``grace_s`` after the last
    send was answered. ``trace``: also time each leg of every record's way (the budget).
    ``warmup_records`` go first, outside the measurement (see :func:`_send_warm_up`);
    then ``lead_in_s`` of records at ``rate``, not measured either (see :data:`LEAD_IN_S`).
    ``consumer_process``: receive in a process of its own (see the module docstring); the
    client CPU is then both processes'."""
    from strom.client.producer import Producer

    if commit not in ("async", "sync", "none"):
        raise ValueError(f"commit must be async, sync or none, got {commit!r}")
    with Admin(bootstrap) as admin:
        parts = admin.describe_topic(topic).partitions
    # Before anything is sent: the idle cluster's price of the steps a record's way is made
    # of, printed beside the result (strom.bench.machine).
    machine = calibrate_cluster(bootstrap, topic)
    tps = [TopicPartition(topic, p.partition) for p in parts]
    pad = b"x" * max(record_size - E2E_STAMP.size, 0)
    lock = threading.Lock()
    acked = [0]
    failures: list[BaseException] = []
    nonce = int.from_bytes(os.urandom(4), "big")
    warm_nonce = nonce ^ 0xFFFFFFFF
    bar = Progress(records, "e2e", enabled=progress)

    def sent(_md: object, err: BaseException | None) -> None:
        with lock:
            if err is None:
                acked[0] += 1
            else:
                failures.append(err)

    lead_in = max(int(lead_in_s * rate), 0)
    #: perf_counter_ns of the first measured record's scheduled time (set by produce()).
    measured_from = [0]

    def produce(p: Any, done: threading.Event) -> None:
        try:
            step = 1e9 / rate
            t0 = time.perf_counter_ns()
            measured_from[0] = t0 + int(lead_in * step)
            for j in range(lead_in + records):
                due = t0 + int(j * step)
                ahead = due - time.perf_counter_ns()
                if ahead > 0:
                    time.sleep(ahead / 1e9)
                if j < lead_in:  # the same stream, stamped as warm-up: not measured
                    value = E2E_STAMP.pack(warm_nonce, j, due, time.perf_counter_ns()) + pad
                    p.send(topic, value)
                    continue
                value = E2E_STAMP.pack(nonce, j - lead_in, due, time.perf_counter_ns()) + pad
                p.send(topic, value, callback=sent)
            p.flush()
        finally:
            done.set()

    def expected() -> int:
        with lock:
            return acked[0]

    tracer = _Tracer(nonce, records) if trace else None
    consumer_options: dict[str, Any] = {"fetch_max_wait_ms": 100, "fetch_min_bytes": 1}
    if group is not None:
        consumer_options.update(group_id=group, enable_auto_commit=False)
    job = _ReceiveJob(bootstrap, topic, tps, group, commit, consumer_options, nonce, records)
    done = threading.Event()
    if consumer_process:
        if trace:
            raise ValueError("trace needs the consumer in the bench's process (one clock)")
        with (
            cpu_hog(cpu_hogs),
            _ReceiverProcess(job) as child,
            Producer(bootstrap, **producer_options) as p,
        ):
            _send_warm_up(p, topic, warm_nonce, pad, warmup_records)
            child.warm(warm_nonce, warmup_records)
            _settle_heap()
            meter = cpu.start()
            produce(p, done)
            rx = child.finish(expected(), grace_s)
            seconds = time.perf_counter() - measured_from[0] / 1e9
            usage = meter.stop()
            usage.client_s += rx.cpu_s
        bar.update(rx.got)
    else:
        with (
            cpu_hog(cpu_hogs),
            job.consumer() as c,
            Producer(bootstrap, **producer_options) as p,
        ):
            _send_warm_up(p, topic, warm_nonce, pad, warmup_records)
            _read_warm_up(c, warm_nonce, warmup_records)
            _settle_heap()
            rx = _Receiver(c, job, bar)
            with _tracing(tracer):
                t = threading.Thread(target=produce, args=(p, done), name="e2e-producer")
                t.daemon = True
                meter = cpu.start()
                t.start()
                while True:
                    rx.poll_once(tracer)
                    if done.is_set() and rx.finished(expected(), grace_s):
                        break
                seconds = time.perf_counter() - measured_from[0] / 1e9
                t.join()
                usage = meter.stop()
    bar.finish()
    # The CPU meter ran through the lead-in too: its records take their share.
    usage = usage.scaled(records / (records + lead_in))
    unique = int(np.count_nonzero(rx.seen))
    lat = np.asarray(rx.latencies)
    return E2EResult(
        "end-to-end",
        None,
        rx.got,
        rx.got * record_size,
        seconds,
        rx.latencies,
        usage,
        sent=records,
        failed=len(failures),
        first_error=repr(failures[0]) if failures else "",
        lost=max(acked[0] - unique, 0),
        duplicates=int(np.sum(rx.seen[rx.seen > 1] - 1)),
        slow=int(np.count_nonzero(lat > 1.0)),
        commits=rx.commits,
        commit_errors=rx.commit_errors,
        from_send=rx.from_send,
        extra={"foreign": rx.foreign} if rx.foreign else {},
        budget=tracer.budget() if tracer is not None else {},
        machine=machine,
    )


@dataclass
class _ReceiveJob:
    """What the receiving side needs (picklable: it crosses to the consumer process)."""

    bootstrap: str | None
    topic: str
    tps: list[TopicPartition]
    group: str | None
    commit: str
    consumer_options: dict[str, Any]
    nonce: int
    records: int

    @contextlib.contextmanager
    def consumer(self) -> Iterator[Any]:
        """A consumer at the partitions' ends: assigned, or a member of ``group`` once it
        owns them all ("latest" resolved now, before anything is sent)."""
        from strom.client.consumer import Consumer

        with Consumer(self.bootstrap, auto_offset_reset="latest", **self.consumer_options) as c:
            if self.group is None:
                c.assign(self.tps)
                for tp in self.tps:
                    c.position(tp)
            else:
                c.subscribe([self.topic])
                deadline = time.monotonic() + 30
                while c.assignment() != set(self.tps) and time.monotonic() < deadline:
                    c.poll(timeout_ms=100)
                for tp in c.assignment():
                    c.position(tp)
            yield c


class _Receiver:
    """The receiving side's bookkeeping: which records came, how late, and the commits."""

    def __init__(self, c: Any, job: _ReceiveJob, bar: Progress | None = None) -> None:
        self._c = c
        self._job = job
        self._bar = bar
        #: From the scheduled time, and from the send() call, in arrival order: numpy arrays
        #: filled as records come (the first ``_n`` entries), not lists of Python floats,
        #: whose length every full collection of the receiving process used to walk (a
        #: 300,000-record run's consumer paused 25-49 ms per collection, growing).
        self._lat = np.empty(job.records, dtype=np.float64)
        self._from_send = np.empty(job.records, dtype=np.float64)
        self._n = 0
        self.seen = np.zeros(job.records, dtype=np.uint8)
        self.got = 0
        self.commits = 0
        self.commit_errors = 0
        self.foreign = 0
        self.cpu_s = 0.0
        self.last_progress = time.monotonic()

    @property
    def latencies(self) -> list[float]:
        """Each arrival's latency from its scheduled time (seconds)."""
        return self._lat[: self._n].tolist()

    @property
    def from_send(self) -> list[float]:
        """Each arrival's latency from its send() call (seconds)."""
        return self._from_send[: self._n].tolist()

    def __getstate__(self) -> dict[str, Any]:
        """The bookkeeping only: the consumer and the progress bar stay in the child."""
        return {**self.__dict__, "_c": None, "_bar": None}

    def _committed(self, _offsets: object, err: BaseException | None) -> None:
        self.commits += 1
        if err is not None:
            self.commit_errors += 1

    def poll_once(self, tracer: _Tracer | None = None) -> None:
        """One poll: stamp what came, then commit after it as the job says."""
        c, job = self._c, self._job
        batch = c.poll(timeout_ms=200)
        now = time.perf_counter_ns()
        measured = 0
        for rec in batch:
            run, i, due, ns = E2E_STAMP.unpack_from(rec.value)
            if run == job.nonce ^ 0xFFFFFFFF:
                continue  # the lead-in
            if run != job.nonce or not 0 <= i < job.records:
                self.foreign += 1
                continue
            measured += 1
            self.seen[i] += 1
            n = self._n
            if n == len(self._lat):  # duplicates arrived: room for them
                self._lat = np.resize(self._lat, 2 * n)
                self._from_send = np.resize(self._from_send, 2 * n)
            self._lat[n] = (now - due) / 1e9
            self._from_send[n] = (now - ns) / 1e9
            self._n = n + 1
            if tracer is not None:
                tracer.polled(rec.topic, rec.partition, rec.offset, i, ns, now)
        if not batch:
            return
        self.got += measured
        self.last_progress = time.monotonic()
        if self._bar is not None:
            self._bar.update(self.got)
        if job.group is not None and job.commit == "async":
            c.commit_async(callback=self._committed)
        elif job.group is not None and job.commit == "sync":
            try:
                c.commit()
                self.commits += 1
            except Exception:
                self.commit_errors += 1

    def finished(self, expected: int, grace_s: float) -> bool:
        """Every acknowledged record came, or nothing came for ``grace_s``."""
        if int(np.count_nonzero(self.seen)) >= expected:
            return True
        return time.monotonic() - self.last_progress > grace_s


def _receive_in_child(conn: Any, job: _ReceiveJob) -> None:
    """The consumer process: join, read the warm-up back, then receive until the parent's
    count of acknowledged records came (or nothing came for its grace); sends the receiver's
    bookkeeping back, or ("error", text)."""
    try:
        with job.consumer() as c:
            conn.send("ready")
            warm_nonce, warmup = conn.recv()
            _read_warm_up(c, warm_nonce, warmup)
            _settle_heap()
            conn.send("warm")
            rx = _Receiver(c, job)
            cpu0 = time.process_time()
            end: tuple[int, float] | None = None
            while True:
                rx.poll_once()
                if end is None and conn.poll():
                    end = conn.recv()
                if end is not None and rx.finished(*end):
                    break
            rx.cpu_s = time.process_time() - cpu0
        conn.send(rx)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _ReceiverProcess:
    """The consumer process, driven over a pipe (see :func:`_receive_in_child`)."""

    def __init__(self, job: _ReceiveJob) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_receive_in_child, args=(child_conn, job), daemon=True)

    def __enter__(self) -> _ReceiverProcess:
        self._proc.start()
        self._expect("ready", 120)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)

    def _expect(self, what: str, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise RuntimeError(f"the consumer process did not answer ({what}) in {timeout:.0f} s")
        got = self._conn.recv()
        if isinstance(got, tuple) and got and got[0] == "error":
            raise RuntimeError(f"the consumer process failed: {got[1]}")
        return got

    def warm(self, nonce: int, records: int) -> None:
        """The child reads the warm-up's ``records`` back."""
        self._conn.send((nonce, records))
        self._expect("warm-up", 90)

    def finish(self, expected: int, grace_s: float) -> _Receiver:
        """Tell the child how many records were acknowledged; its bookkeeping once they came."""
        self._conn.send((expected, grace_s))
        rx = self._expect("results", grace_s + 600)
        assert isinstance(rx, _Receiver)
        return rx


def _settle_heap() -> None:
    """A full garbage collection before the clock starts (the consumer process does its own):
    what the start-up and the warm-up left is collected now, and the next full collection,
    which stops every thread of the process for 14-20 ms here, is as far away as it would be
    in a service that has been running for a while, instead of falling wherever the warm-up's
    allocations happened to leave the collector's counters. Later ones, in a long run, are
    measured like everything else."""
    gc.collect()


def _send_warm_up(p: Any, topic: str, nonce: int, pad: bytes, n: int) -> None:
    """Send ``n`` records before the clock starts (read back by :func:`_read_warm_up`): a new
    producer's connection and producer id, the consumer's first fetches and, on a new
    replicated topic, the followers' first fetches (an acks=all produce waits for them) are
    one-time costs of the first second, not the steady state the run measures. A warm-up that
    fails raises."""
    if n <= 0:
        return
    futures = [p.send(topic, STAMP.pack(nonce, i, time.perf_counter_ns()) + pad) for i in range(n)]
    p.flush(60)
    for f in futures:
        f.result(60)


def _read_warm_up(c: Any, nonce: int, n: int) -> None:
    """Read the ``n`` warm-up records back."""
    got = 0
    deadline = time.monotonic() + 60
    while got < n and time.monotonic() < deadline:
        got += sum(1 for r in c.poll(timeout_ms=100) if STAMP.unpack_from(r.value)[0] == nonce)
    if got < n:
        raise RuntimeError(f"the warm-up read {got} of its {n} records back within 60 s")


@contextlib.contextmanager
def _tracing(tracer: _Tracer | None) -> Iterator[None]:
    from strom.client import trace

    if tracer is None:
        yield
        return
    trace.sink = tracer.event
    try:
        yield
    finally:
        trace.sink = None


class _Tracer:
    """Collects the clients' hand-off stamps (strom.client.trace) and, after the run, each
    record's legs: send() -> Produce issued -> answer handled / Fetch answer parsed -> poll().
    All stamps are perf_counter_ns of this one process."""

    LEGS = (
        ("send() -> Produce issued (sender thread)", "send", "issued"),
        ("Produce issued -> answer handled", "issued", "acked"),
        ("Produce issued -> Fetch answer parsed", "issued", "fetched"),
        ("Fetch answer parsed -> poll() returns it", "fetched", "polled"),
        ("send() -> poll() returns it (total)", "send", "polled"),
    )

    def __init__(self, nonce: int, records: int) -> None:
        self._nonce = nonce
        self._records = records
        self._lock = threading.Lock()
        self._stamps = {k: np.zeros(records, dtype=np.int64) for k in ("issued", "acked")}
        self._fetched: list[tuple[int, list[tuple[str, int, int, int]]]] = []
        self._polled: list[tuple[str, int, int, int, int, int]] = []

    def event(self, point: str, t: int, payload: Any) -> None:
        """The sink: runs on the client threads, so it keeps only what the batches say."""
        if point == "fetch.received":
            ranges = [
                (a.topic, a.info.partition, b.base_offset, b.last_offset)
                for a, batches in payload
                if isinstance(batches, list)
                for b in batches
            ]
            with self._lock:
                self._fetched.append((t, ranges))
            return
        column = self._stamps["issued" if point == "produce.sent" else "acked"]
        for shipment in payload:
            for b in shipment.batches:
                for v in b.values:
                    run, i, _ = STAMP.unpack_from(v)
                    if run == self._nonce and 0 <= i < self._records and not column[i]:
                        column[i] = t

    def polled(self, topic: str, partition: int, offset: int, i: int, sent: int, t: int) -> None:
        self._polled.append((topic, partition, offset, i, sent, t))

    def budget(self) -> dict[str, dict[str, float]]:
        """Each leg's p50 / p99 / p99.9 in ms, over the records every stamp was taken for."""
        fetched: dict[tuple[str, int, int], int] = {}
        for t, ranges in self._fetched:
            for topic, partition, first, last in ranges:
                for o in range(first, last + 1):
                    fetched.setdefault((topic, partition, o), t)
        rows = []
        for topic, partition, offset, i, sent, t in self._polled:
            f = fetched.get((topic, partition, offset))
            issued, acked = self._stamps["issued"][i], self._stamps["acked"][i]
            if f and issued and acked:
                rows.append((sent, issued, acked, f, t))
        if not rows:
            return {}
        names = ("send", "issued", "acked", "fetched", "polled")
        cols = dict(zip(names, np.array(rows).T, strict=True))
        out = {}
        for name, a, b in self.LEGS:
            ms = (cols[b] - cols[a]) / 1e6
            out[name] = {
                "p50": round(float(np.percentile(ms, 50)), 3),
                "p99": round(float(np.percentile(ms, 99)), 3),
                "p99.9": round(float(np.percentile(ms, 99.9)), 3),
            }
        return out
