"""The ``strom`` command: benchmarks now; cluster, admin and console tools as they land."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from strom import __version__


def _size(text: str) -> int:
    """Parse sizes like ``1048576``, ``64KiB``, ``1MiB``, ``2GiB``, ``1MB``."""
    units = {
        "kib": 1 << 10,
        "mib": 1 << 20,
        "gib": 1 << 30,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "k": 1 << 10,
        "m": 1 << 20,
        "g": 1 << 30,
        "b": 1,
    }
    t = text.strip().lower()
    for suffix in sorted(units, key=len, reverse=True):
        if t.endswith(suffix):
            num = t[: -len(suffix)].strip()
            break
    else:
        suffix, num = "b", t
    try:
        value = int(float(num) * units[suffix])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1048576 or 1MiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strom", description="strom: a distributed commit log")
    parser.add_argument("--version", action="version", version=f"strom {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    bench = sub.add_parser("bench", help="measure throughput and latency")
    bsub = bench.add_subparsers(dest="bench_mode", metavar="MODE")
    bsub.required = True

    rec = bsub.add_parser("record", help="encode/decode record batches (no I/O)")
    rec.add_argument("--records", type=_positive, default=5_000_000)
    rec.add_argument("--record-size", type=_positive, default=100)
    rec.add_argument("--batch-records", type=_positive, default=1000)
    rec.add_argument(
        "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    rec.add_argument("--json", action="store_true", help="print one JSON object")

    lg = bsub.add_parser("log", help="append and read a partition log on local disk")
    lg.add_argument("--total", type=_size, default=2 << 30, help="bytes to append (2GiB)")
    lg.add_argument("--batch-size", type=_size, default=1 << 20, help="batch bytes (1MiB)")
    lg.add_argument("--record-size", type=_positive, default=100)
    lg.add_argument("--dir", default=None, help="where to put the log (default: system tmp)")
    lg.add_argument("--fsync", action="store_true", help="fsync after the appends")
    lg.add_argument("--json", action="store_true", help="print one JSON object")

    demo = sub.add_parser("demo", help="the main job: a demo pipeline over what exists so far")
    demo.add_argument("--dir", default=None, help="keep the data here (default: a temp dir)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        from strom.bench.engine import bench_log, bench_record
        from strom.bench.stats import report

        if args.bench_mode == "record":
            results = bench_record(
                records=args.records,
                record_size=args.record_size,
                batch_records=args.batch_records,
                compression=args.compression,
            )
            ctx = {
                "mode": "record",
                "records": args.records,
                "record_size": args.record_size,
                "batch_records": args.batch_records,
                "compression": args.compression,
            }
        else:
            results = bench_log(
                total_bytes=args.total,
                batch_bytes=args.batch_size,
                record_size=args.record_size,
                directory=args.dir,
                fsync=args.fsync,
            )
            ctx = {
                "mode": "log",
                "total": args.total,
                "batch_size": args.batch_size,
                "record_size": args.record_size,
                "fsync": args.fsync,
            }
        print(report(results, as_json=args.json, context=ctx))
        return 0
    if args.command == "demo":
        from strom.cli.demo import run_demo

        return run_demo(args.dir)
    return 2


if __name__ == "__main__":
    sys.exit(main())
