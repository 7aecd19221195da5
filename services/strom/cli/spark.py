"""The CLI's Spark commands (``strom demo``, ``strom bench spark``): thin wrappers that check
PySpark and Java are there and say how to get them when not."""

from __future__ import annotations

import argparse
import os
import shutil
from typing import TextIO


class SparkMissingError(RuntimeError):
    """PySpark or a Java runtime is not installed."""


def _require_spark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkMissingError(
            "PySpark is not installed: `make demo` installs it, or "
            "`STROM_EXTRAS=spark bash scripts/bootstrap.sh` (pip install 'strom[spark]')"
        ) from None
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SparkMissingError(
            "Spark needs a Java runtime: apt-get install openjdk-17-jre-headless "
            "(scripts/bootstrap.sh does it with STROM_EXTRAS=spark)"
        )


def run_spark_demo(args: argparse.Namespace, out: TextIO) -> int:
    _require_spark()
    from strom_spark.demo import run_spark_demo as run

    return run(args.dir, events=args.events, stream_seconds=args.seconds, out=out)


def run_bench_spark(args: argparse.Namespace, out: TextIO) -> int:
    _require_spark()
    import sys

    from strom_spark.bench import report, run_bench

    result = run_bench(
        records=args.records,
        partitions=args.partitions,
        record_size=args.record_size,
        runs=args.runs,
        warmup=args.warmup,
        nodes=args.nodes,
        bootstrap=args.bootstrap,
        data_dir=args.dir,
        out=sys.stderr,
    )
    print(report(result, as_json=args.json), file=out)
    return 0
