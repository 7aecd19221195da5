"""Throughput and latency summaries shared by every ``strom bench`` mode."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from strom.bench.cpu import CpuUsage


@dataclass
class Result:
    """One measured phase: counts, elapsed time and per-operation latencies (seconds)."""

    name: str
    #: Requests, calls or batches of the phase; None when the bench cannot know it (the
    #: producer's own batching), shown as "-" rather than a made-up 0 batches/s.
    batches: int | None
    records: int
    bytes: int
    seconds: float
    latencies: list[float] = field(default_factory=list, repr=False)
    #: CPU seconds the phase cost the bench process and the servers (see strom.bench.cpu).
    cpu: CpuUsage | None = field(default=None, repr=False)
    #: CPU seconds of the calling thread alone (produce with send(): the cost send() puts on
    #: the application's thread, the sender thread's work excluded).
    caller_cpu_s: float | None = field(default=None, repr=False)

    def summary(self) -> dict[str, float | int | str | None]:
        s = max(self.seconds, 1e-12)
        out: dict[str, float | int | str | None] = {
            "name": self.name,
            "batches": self.batches,
            "records": self.records,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 4),
            "batches_per_s": None if self.batches is None else round(self.batches / s, 1),
            "records_per_s": round(self.records / s, 1),
            "mb_per_s": round(self.bytes / s / 1e6, 1),
        }
        if self.latencies:
            out.update({f"{k}_ms": v for k, v in percentiles_ms(self.latencies).items()})
        if self.cpu is not None:
            out.update(self.cpu.per_million(self.records))  # type: ignore[arg-type]
        if self.caller_cpu_s is not None and self.records:
            out["caller_cpu_us_per_record"] = round(self.caller_cpu_s / self.records * 1e6, 3)
        return out

    def line(self) -> str:
        d = self.summary()
        per_s = d["batches_per_s"]
        batches = "-" if per_s is None else f"{per_s:,.0f}"
        text = (
            f"{self.name:<24} {d['records_per_s']:>14,.0f} records/s "
            f"{batches:>10} batches/s {d['mb_per_s']:>9,.1f} MB/s"
        )
        if self.latencies:
            text += (
                f"   latency ms p50 {d['p50_ms']} p95 {d['p95_ms']} p99 {d['p99_ms']}"
                f" p99.9 {d['p99.9_ms']}"
            )
        if self.cpu is not None and self.records:
            server = d.get("server_cpu_s_per_M_records")
            text += (
                f"   CPU s per M records: client {d['client_cpu_s_per_M_records']}"
                f" server {'n/a' if server is None else server}"
            )
        if "caller_cpu_us_per_record" in d:
            text += f"   caller thread {d['caller_cpu_us_per_record']} µs/record"
        return text


def percentiles_ms(
    latencies_s: list[float], ps: tuple[float, ...] = (50, 95, 99, 99.9)
) -> dict[str, float]:
    """``{"p50": ms, ...}`` of latencies given in seconds, rounded to µs."""
    lat = np.asarray(latencies_s) * 1e3
    return {f"p{p}": round(float(v), 3) for p, v in zip(ps, np.percentile(lat, ps), strict=True)}


def report(results: list[Result], *, as_json: bool, context: dict[str, object]) -> str:
    if as_json:
        return json.dumps({"context": context, "results": [r.summary() for r in results]})
    head = "  ".join(f"{k}={v}" for k, v in context.items())
    return "\n".join([head] + [r.line() for r in results])


__all__ = ["Result", "asdict", "report"]
