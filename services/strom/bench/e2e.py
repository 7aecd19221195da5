"""``strom bench e2e``: end-to-end latency, with every record accounted for.

A producer thread sends numbered records at ``--rate`` records/s, each value starting with
its number and send time; a consumer in the same process (assigned, or a group member that
commits as it goes) receives them and measures send -> receive latency. Unlike a plain perf
tool, the run also checks what a pipeline's user cares about: every send that failed (with
its first error), every acknowledged record that never arrived, every record that arrived
twice, and the longest a record took. That is what turned "an e2e run stalled for more than
60 s" into an explanation (issue 9, defect 3): the stall was records the producer had failed
with a spurious OUT_OF_ORDER_SEQUENCE, which an unchecked bench could only wait for until it
gave up.

``cpu_hog`` starts that many busy-looping processes for the run (the machine under load);
``reorder_every`` is for tests that put a reordering gRPC proxy in front of the node.
"""

from __future__ import annotations

import contextlib
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
from strom.bench.clients import Progress, _pace
from strom.bench.stats import Result
from strom.client.admin import Admin
from strom.client.types import TopicPartition

#: Value prefix: run nonce, record number, send time (perf_counter ns). The nonce tells this
#: run's records from a group's leftovers of an earlier run.
STAMP = struct.Struct(">Iqq")


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
    extra: dict[str, Any] = field(default_factory=dict)
    #: With ``trace``: each leg's latency percentiles (ms), see :func:`latency_budget`.
    budget: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Every record sent was acknowledged and received exactly once."""
        return not (self.failed or self.lost or self.duplicates or self.commit_errors)

    def summary(self) -> dict[str, float | int | str]:
        out = super().summary()
        if self.latencies:
            out["max_ms"] = round(max(self.latencies) * 1e3, 3)
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
        return out

    def line(self) -> str:
        d = self.summary()
        text = super().line()
        if self.latencies:
            text += f" max {d['max_ms']}"
        text += (
            f"\n{'delivery':<24} sent {self.sent:,}  failed {self.failed:,}  lost {self.lost:,}"
            f"  duplicated {self.duplicates:,}  slower than 1 s {self.slow:,}"
        )
        if self.commits or self.commit_errors:
            text += f"  commits {self.commits:,} (errors {self.commit_errors:,})"
        if self.first_error:
            text += f"\n{'first error':<24} {self.first_error}"
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
    **producer_options: Any,
) -> E2EResult:
    """Send ``records`` at ``rate``; receive them with an assigned consumer, or as a member of
    ``group`` committing after every poll (``commit`` = async, sync or none). Returns when
    every acknowledged record arrived, or when nothing arrived for ``grace_s`` after the last
    send was answered. ``trace``: also time each leg of every record's way (the budget).
    ``warmup_records`` go first, outside the measurement (see :func:`_warm_up`)."""
    from strom.client.consumer import Consumer
    from strom.client.producer import Producer

    if commit not in ("async", "sync", "none"):
        raise ValueError(f"commit must be async, sync or none, got {commit!r}")
    with Admin(bootstrap) as admin:
        parts = admin.describe_topic(topic).partitions
    tps = [TopicPartition(topic, p.partition) for p in parts]
    pad = b"x" * max(record_size - STAMP.size, 0)
    latencies: list[float] = []
    seen = np.zeros(records, dtype=np.uint8)
    lock = threading.Lock()
    acked = [0]
    failures: list[BaseException] = []
    commit_errors: list[BaseException] = []
    commits = [0]
    foreign = [0]
    nonce = int.from_bytes(os.urandom(4), "big")
    bar = Progress(records, "e2e", enabled=progress)

    def sent(_md: object, err: BaseException | None) -> None:
        with lock:
            if err is None:
                acked[0] += 1
            else:
                failures.append(err)

    def committed(_offsets: object, err: BaseException | None) -> None:
        commits[0] += 1
        if err is not None:
            commit_errors.append(err)

    tracer = _Tracer(nonce, records) if trace else None
    consumer_options: dict[str, Any] = {"fetch_max_wait_ms": 100, "fetch_min_bytes": 1}
    if group is not None:
        consumer_options.update(group_id=group, enable_auto_commit=False)
    with (
        cpu_hog(cpu_hogs),
        Consumer(bootstrap, auto_offset_reset="latest", **consumer_options) as c,
        Producer(bootstrap, **producer_options) as p,
    ):
        if group is None:
            c.assign(tps)
            for tp in tps:
                c.position(tp)  # resolve "latest" now, before anything is sent
        else:
            c.subscribe([topic])
            deadline = time.monotonic() + 30
            while c.assignment() != set(tps) and time.monotonic() < deadline:
                c.poll(timeout_ms=100)
            for tp in c.assignment():
                c.position(tp)
        _warm_up(p, c, topic, nonce ^ 0xFFFFFFFF, pad, warmup_records)
        with _tracing(tracer):
            done = threading.Event()

            def produce() -> None:
                try:
                    start = time.perf_counter()
                    for i in range(records):
                        value = STAMP.pack(nonce, i, time.perf_counter_ns()) + pad
                        p.send(topic, value, callback=sent)
                        if i % 10 == 0:
                            _pace(rate, start, i)
                    p.flush()
                finally:
                    done.set()

            t = threading.Thread(target=produce, name="e2e-producer", daemon=True)
            meter = cpu.start()
            start = time.perf_counter()
            t.start()
            got = 0
            last_progress = time.monotonic()
            while True:
                batch = c.poll(timeout_ms=200)
                now = time.perf_counter_ns()
                for rec in batch:
                    run, i, ns = STAMP.unpack_from(rec.value)
                    if run != nonce or not 0 <= i < records:
                        foreign[0] += 1
                        continue
                    seen[i] += 1
                    latencies.append((now - ns) / 1e9)
                    if tracer is not None:
                        tracer.polled(rec.topic, rec.partition, rec.offset, i, ns, now)
                if batch:
                    got += len(batch)
                    last_progress = time.monotonic()
                    bar.update(got)
                    if group is not None and commit == "async":
                        c.commit_async(callback=committed)
                    elif group is not None and commit == "sync":
                        try:
                            c.commit()
                            commits[0] += 1
                        except Exception as exc:
                            commit_errors.append(exc)
                if done.is_set():
                    with lock:
                        expected = acked[0]
                    if int(np.count_nonzero(seen)) >= expected:
                        break
                    if time.monotonic() - last_progress > grace_s:
                        break
            seconds = time.perf_counter() - start
            t.join()
            usage = meter.stop()
    bar.finish()
    unique = int(np.count_nonzero(seen))
    lat = np.asarray(latencies)
    return E2EResult(
        "end-to-end",
        0,
        got,
        got * record_size,
        seconds,
        latencies,
        usage,
        sent=records,
        failed=len(failures),
        first_error=repr(failures[0]) if failures else "",
        lost=max(acked[0] - unique, 0),
        duplicates=int(np.sum(seen[seen > 1] - 1)),
        slow=int(np.count_nonzero(lat > 1.0)),
        commits=commits[0],
        commit_errors=len(commit_errors),
        extra={"foreign": foreign[0]} if foreign[0] else {},
        budget=tracer.budget() if tracer is not None else {},
    )


def _warm_up(p: Any, c: Any, topic: str, nonce: int, pad: bytes, n: int) -> None:
    """Send ``n`` records and read them back before the clock starts: a new producer's
    connection and producer id, the consumer's first fetches and, on a new replicated topic,
    the followers' first fetches (an acks=all produce waits for them) are one-time costs of
    the first second, not the steady state the run measures. A warm-up that fails raises."""
    if n <= 0:
        return
    futures = [p.send(topic, STAMP.pack(nonce, i, time.perf_counter_ns()) + pad) for i in range(n)]
    p.flush(60)
    for f in futures:
        f.result(60)
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
