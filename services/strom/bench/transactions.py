"""``strom bench produce --transactional``: what transactions cost a producer.

In one run, on one topic: the idempotent producer (``send`` per record, the baseline), then
the transactional producer with transactions of each size in ``sizes`` (begin, ``send`` the
records, ``commit_transaction``). Reported per phase: records/s, MB/s, and for the
transactional phases the commit latency (the ``commit_transaction()`` call: flush of the last
batches, EndTxn and the PREPARE_COMMIT write) as percentiles.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from strom.bench import cpu
from strom.bench.clients import Progress
from strom.bench.stats import Result


def bench_transactions(
    bootstrap: str | None,
    topic: str,
    *,
    records: int,
    record_size: int,
    sizes: Sequence[int] = (1_000, 100_000),
    progress: bool | None = None,
    **producer_options: Any,
) -> list[Result]:
    from strom.client.producer import Producer

    value = b"x" * record_size
    options = {**producer_options, "acks": "all", "enable_idempotence": True}
    results: list[Result] = []
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
    results.append(Result("idempotent", 0, records, records * record_size, seconds, [], usage))
    for size in sizes:
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
        results.append(
            Result(
                f"txn of {size:,} (commit)",
                len(commits),
                records,
                records * record_size,
                seconds,
                commits,
                usage,
            )
        )
    return results


def summary(results: list[Result]) -> str:
    """The phases' lines and each transactional phase's cost against the baseline."""
    base = results[0].records / max(results[0].seconds, 1e-9)
    lines = [r.line() for r in results]
    for r in results[1:]:
        rate = r.records / max(r.seconds, 1e-9)
        lines.append(f"{r.name:<24} {100 * (1 - rate / base):+.1f} % slower than idempotent")
    return "\n".join(lines)
