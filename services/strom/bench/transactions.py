"""``strom bench produce --transactional``: what transactions cost a producer.

On one topic: the idempotent producer (``send`` per record, the baseline), then the
transactional producer with transactions of each size in ``sizes`` (begin, ``send`` the
records, ``commit_transaction``). Reported per phase: records/s, MB/s, and for the
transactional phases the commit latency (the ``commit_transaction()`` call: flush of the last
batches, EndTxn and the PREPARE_COMMIT write) as percentiles.

With ``rounds`` > 1 the phases run interleaved (baseline, sizes…, baseline, sizes…) and each
phase reports its median round: on a 2-core machine one run of a phase varies by ±15 %
(the client, the node and the coordinator share the cores), more than the cost measured, and
interleaving keeps a slow stretch of the machine from landing on one phase only.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

from strom.bench import cpu
from strom.bench.clients import Progress
from strom.bench.stats import Result


def _idempotent(
    bootstrap: str | None,
    topic: str,
    value: bytes,
    records: int,
    progress: bool | None,
    **options: Any,
) -> Result:
    from strom.client.producer import Producer

    with Producer(bootstrap, **options) as p:
        p.send(topic, value).result(30)  # metadata and connections warm
        bar = Progress(records, "idempotent", enabled=progress)
        meter = cpu.start()
        start = time.perf_counter()
        for i in range(records):
            p.send(topic, value)
            if i % 10_000 == 0:
                bar.update(i)
        p.flush()
        seconds = time.perf_counter() - start
        usage = meter.stop()
        bar.finish()
    return Result("idempotent", None, records, records * len(value), seconds, [], usage)


def _transactional(
    bootstrap: str | None,
    topic: str,
    value: bytes,
    records: int,
    size: int,
    progress: bool | None,
    **options: Any,
) -> Result:
    from strom.client.producer import Producer

    tid = f"strom-bench-{uuid.uuid4().hex[:8]}"
    commits: list[float] = []
    with Producer(bootstrap, transactional_id=tid, **options) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, value)
        p.commit_transaction()  # warm: coordinator found, partitions known
        bar = Progress(records, f"transactions of {size:,}", enabled=progress)
        meter = cpu.start()
        start = time.perf_counter()
        sent = 0
        while sent < records:
            n = min(size, records - sent)
            p.begin_transaction()
            for _ in range(n):
                p.send(topic, value)
            t0 = time.perf_counter()
            p.commit_transaction()
            commits.append(time.perf_counter() - t0)
            sent += n
            bar.update(sent)
        seconds = time.perf_counter() - start
        usage = meter.stop()
        bar.finish()
    name = f"txn of {size:,} (commit)"
    return Result(name, len(commits), records, records * len(value), seconds, commits, usage)


def bench_transactions(
    bootstrap: str | None,
    topic: str,
    *,
    records: int,
    record_size: int,
    sizes: Sequence[int] = (1_000, 100_000),
    rounds: int = 1,
    progress: bool | None = None,
    **producer_options: Any,
) -> list[Result]:
    """The phases' results (baseline first, then one per size): with several rounds, each
    phase's median round by records/s, its ``rounds`` rates kept in :data:`ROUND_RATES`."""
    value = b"x" * record_size
    options = {**producer_options, "acks": "all", "enable_idempotence": True}
    # A transaction holds at most every record: a phase is named by the size it runs, once.
    sizes = list(dict.fromkeys(min(size, records) for size in sizes))
    runs: list[list[Result]] = [[] for _ in range(1 + len(sizes))]
    for _ in range(max(rounds, 1)):
        runs[0].append(_idempotent(bootstrap, topic, value, records, progress, **options))
        for i, size in enumerate(sizes, 1):
            runs[i].append(
                _transactional(bootstrap, topic, value, records, size, progress, **options)
            )
    ROUND_RATES.clear()
    out = []
    for phase in runs:
        ordered = sorted(phase, key=_rate)
        ROUND_RATES[phase[0].name] = [_rate(r) for r in phase]
        out.append(ordered[(len(ordered) - 1) // 2])  # the median (lower one for even counts)
    return out


#: Records/s of every round per phase name, in run order (filled by bench_transactions).
ROUND_RATES: dict[str, list[float]] = {}


def _rate(r: Result) -> float:
    return r.records / max(r.seconds, 1e-9)


def summary(results: list[Result]) -> str:
    """The phases' lines and each transactional phase's cost against the baseline."""
    base = _rate(results[0])
    lines = [r.line() for r in results]
    for r in results[1:]:
        lines.append(f"{r.name:<24} {100 * (1 - _rate(r) / base):+.1f} % slower than idempotent")
    if any(len(v) > 1 for v in ROUND_RATES.values()):
        lines.append("rounds (records/s, in run order; each line above is its phase's median):")
        for name, rates in ROUND_RATES.items():
            spread = f"median {statistics.median(rates):,.0f}"
            lines.append(f"  {name:<24} " + "  ".join(f"{x:,.0f}" for x in rates) + f"  ({spread})")
    return "\n".join(lines)
