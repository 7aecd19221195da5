"""The ``strom`` command.

Services run as ``strom controller ...``, ``strom storage-node ...`` and ``strom coordinator
...`` (each parses its own flags, YAML file and STROM_* environment); everything else is a
client-side tool. Errors print one line naming the problem, never a traceback: exit 2 for
bad arguments (argparse's, and :class:`strom.argtypes.UsageError` for checks made after
parsing), exit 1 for what failed on the way or in the cluster. A client's deliberate refusal
of an argument (its ValueError, or a TypeError it raises on purpose) is one line too; any
other TypeError is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

# gRPC's C core logs failed TLS handshakes at INFO to stderr; the command reports the failure
# itself, in one line. Set before grpc is first imported (an explicit setting wins).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from strom import __version__
from strom.argtypes import UsageError, byte_size, int_at_least, number_above

#: Service subcommands and the module whose ``main(argv)`` runs them.
SERVICES = {
    "controller": "strom.controller.cli",
    "storage-node": "strom.storage.cli",
    "coordinator": "strom.coordinator.cli",
}


#: Sizes like ``1048576``, ``64KiB``, ``1MiB`` (strom.argtypes.byte_size).
_size = byte_size


#: Argument types for whole and other numbers (the services' own, strom.service.flags).
_positive = int_at_least(1)
_non_negative = int_at_least(0)
_above_zero = number_above(0.0)


def _fresh_demo_dir(text: str) -> str:
    """``strom demo --dir``: a directory to create, or an empty one. A demo does not reuse
    a previous run's data: its cluster would find the demo's topics there already (found
    from outside: a second run started the cluster and Spark, then failed after 19 s with
    TOPIC_ALREADY_EXISTS). Refused before anything starts."""
    import shlex
    from pathlib import Path

    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    if path.is_dir() and any(path.iterdir()):
        kind = "holds a previous run" if (path / "cluster").exists() else "is not empty"
        raise argparse.ArgumentTypeError(
            f"{text} {kind} (a demo starts from a new or empty directory): give another "
            f"--dir, or remove it first: rm -r {shlex.quote(text)}"
        )
    return text


_zero_or_more = number_above(0.0, inclusive=True)


def build_parser() -> argparse.ArgumentParser:
    from strom.cli.acls import add_acls_parser
    from strom.cli.admin import add_cluster_parser, add_topics_parser
    from strom.cli.console import add_console_parsers
    from strom.cli.dev import add_dev_parser
    from strom.cli.dumplog import add_dump_log_parser
    from strom.cli.groups import add_groups_parser
    from strom.cli.transactions import add_transactions_parser

    parser = argparse.ArgumentParser(prog="strom", description="strom: a distributed commit log")
    parser.add_argument("--version", action="version", version=f"strom {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap", "-b", help="HOST:PORT[,HOST:PORT...] of storage nodes ($STROM_BOOTSTRAP)"
    )
    common.add_argument(
        "--ssl-cafile",
        metavar="FILE",
        help="CA bundle to verify the cluster's TLS ($STROM_SSL_CAFILE)",
    )
    common.add_argument(
        "--ssl-certfile", metavar="FILE", help="client certificate for mTLS ($STROM_SSL_CERTFILE)"
    )
    common.add_argument(
        "--ssl-keyfile", metavar="FILE", help="key of --ssl-certfile ($STROM_SSL_KEYFILE)"
    )
    common.add_argument(
        "--token-file", metavar="FILE", help="bearer token to authenticate with ($STROM_TOKEN_FILE)"
    )

    for name in SERVICES:
        sub.add_parser(name, help=f"run a {name} (see `strom {name} --help`)", add_help=False)
    add_dev_parser(sub)
    # The administrative commands also take a bound on the whole command (Kafka's tools'
    # --timeout): a cluster that is down costs a minute of retries otherwise.
    timed = argparse.ArgumentParser(add_help=False, parents=[common])
    timed.add_argument(
        "--timeout",
        type=number_above(0),
        metavar="SECONDS",
        help="give up after this long (exit 1; a request already sent may still take effect) "
        "instead of retrying while the cluster does not answer (default: the clients' own, "
        "about a minute)",
    )
    add_topics_parser(sub, timed)
    add_cluster_parser(sub, timed)
    add_groups_parser(sub, timed)
    add_transactions_parser(sub, timed)
    add_acls_parser(sub, timed)
    add_console_parsers(sub, common)
    add_dump_log_parser(sub)

    # Server CPU per million records (strom.bench.cpu): the services' Prometheus endpoints.
    metered = argparse.ArgumentParser(add_help=False)
    metered.add_argument(
        "--metrics",
        metavar="URL,...",
        help="the services' /metrics endpoints (HOST:PORT or URLs) whose "
        "process_cpu_seconds_total gives server CPU ($STROM_METRICS; default: those of the "
        "`strom dev up` cluster in $STROM_DEV_DIR when the bootstrap is its)",
    )

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
    lg.add_argument(
        "--warm",
        action="store_true",
        help="first write and delete a scratch file as large as the run",
    )
    lg.add_argument("--json", action="store_true", help="print one JSON object")

    cp = bsub.add_parser(
        "compaction", help="one compaction pass of a log on local disk, as its keys grow"
    )
    cp.add_argument("--records", type=_positive, default=1_000_000)
    cp.add_argument("--keys", type=_positive, default=100_000, help="distinct keys")
    cp.add_argument("--batch-records", type=_positive, default=50)
    cp.add_argument("--record-size", type=_positive, default=20)
    cp.add_argument("--segment-bytes", type=_size, default=4 << 20, help="segment.bytes (4MiB)")
    cp.add_argument("--dir", default=None, help="where to put the log (default: system tmp)")
    cp.add_argument("--json", action="store_true", help="print one JSON object")

    gb = bsub.add_parser(
        "grpc",
        parents=[common, metered],
        help="Produce/Fetch of pre-built batches against one node, beside a bare gRPC echo",
    )
    gb.add_argument("--topic", required=True, help="an existing topic (leader is measured)")
    gb.add_argument("--partition", type=int, default=0)
    gb.add_argument("--batch-size", type=_size, default=1 << 20, help="request bytes (1MiB)")
    gb.add_argument("--total", type=_size, default=1 << 30, help="bytes per phase (1GiB)")
    gb.add_argument("--concurrency", type=_positive, default=4, help="requests in flight")
    gb.add_argument("--acks", default="1", choices=["0", "1", "all"])
    gb.add_argument("--record-size", type=_positive, default=1024)
    gb.add_argument("--no-echo", action="store_true", help="skip the bare gRPC baseline")
    gb.add_argument("--json", action="store_true")

    gr = bsub.add_parser(
        "grpc-records",
        parents=[common, metered],
        help="RecordService (ProduceRecords/Subscribe, Python and Node.js) beside the batch API",
    )
    gr.add_argument("--topic", default="strom-bench-records", help="prefix of the topics made")
    gr.add_argument(
        "--address",
        default=None,
        help="gRPC target of the callers (default: every bootstrap node, calls spread round-robin)",
    )
    gr.add_argument("--records", type=_positive, default=200_000)
    gr.add_argument("--record-size", type=_positive, default=100, help="value bytes")
    gr.add_argument("--keys", type=_positive, default=1000, help="distinct record keys")
    gr.add_argument("--batch", type=_positive, default=1000, help="records per call")
    gr.add_argument("--in-flight", type=_positive, default=4, help="ProduceRecords outstanding")
    gr.add_argument("--partitions", type=_positive, default=6)
    gr.add_argument("--replication-factor", type=_positive, default=1)
    gr.add_argument(
        "--rate", type=_above_zero, default=200.0, help="records/s of the latency phase"
    )
    gr.add_argument("--latency-records", type=_positive, default=2000)
    gr.add_argument(
        "--records-per-message",
        type=_positive,
        default=10_000,
        help="records per Subscribe message and per batch-API poll (the same for both)",
    )
    gr.add_argument("--no-node", action="store_true", help="skip the Node.js caller")
    gr.add_argument(
        "--node-route",
        choices=("any", "leaders", "both"),
        default="both",
        help="Node.js calls to any node (forwarded), to each partition's leader, or both runs",
    )
    gr.add_argument("--progress", action="store_true", help="progress bar even if not a tty")
    gr.add_argument("--json", action="store_true", help="print one JSON object")

    fo = bsub.add_parser(
        "failover",
        help="SIGKILL → healed, N trials: a partition leader (first acks=all produce), the "
        "active controller (first admin request) or a node leading many partitions (all led)",
    )
    fo.add_argument(
        "--target",
        default="leader",
        choices=["leader", "controller", "node"],
        help="what is killed (default: a partition leader)",
    )
    fo.add_argument(
        "--partitions",
        type=_positive,
        default=1000,
        help="--target node: partitions the killed node leads (default 1000)",
    )
    fo.add_argument("--trials", type=_positive, default=None, help="default 10 (node: 3)")
    fo.add_argument("--json", action="store_true", help="print one JSON object")
    fo.add_argument("--dir", default=None, help="where the local cluster lives (default tmp)")

    su = bsub.add_parser(
        "startup",
        help="a storage node's restart (after SIGKILL and after SIGTERM) against GiB of log",
    )
    su.add_argument("--gib", type=_above_zero, default=2.0, help="GiB of log to write first")
    su.add_argument("--partitions", type=_positive, default=4, help="they are spread over")
    su.add_argument("--trials", type=_positive, default=1, help="restarts of each kind")
    su.add_argument("--json", action="store_true", help="print one JSON object")
    su.add_argument("--dir", default=None, help="where the local cluster lives (default tmp)")

    sc = bsub.add_parser(
        "scale",
        help="cost curves on a local cluster: topic creation, etcd bytes, node memory and "
        "start-up, controller change cost vs partitions; produce spread; many connections",
    )
    sc.add_argument(
        "--max-partitions",
        type=_positive,
        default=10_000,
        help="largest topic of the 10, 100, 1000, 10000 steps (default 10000)",
    )
    sc.add_argument(
        "--max-spread", type=_positive, default=600, help="of the 1, 6, 60, 600 spread steps"
    )
    sc.add_argument("--records", type=_positive, default=200_000, help="per spread step")
    sc.add_argument(
        "--connections",
        type=int,
        default=1_000,
        help="concurrent clients on the node, half producers, half consumers (0: skip)",
    )
    sc.add_argument("--workers", type=_positive, default=10, help="processes they run in")
    sc.add_argument("--seconds", type=_above_zero, default=20.0, help="connections phase length")
    sc.add_argument(
        "--interval-ms", type=_above_zero, default=500.0, help="between a producer's records"
    )
    sc.add_argument("--changes", type=_positive, default=3, help="changes timed per size")
    sc.add_argument(
        "--out", default="strom-bench-scale", help="directory for the PNG plots and scale.json"
    )
    sc.add_argument("--dir", default=None, help="where the local cluster lives (default tmp)")
    sc.add_argument("--json", action="store_true", help="print one JSON object")

    tl = bsub.add_parser(
        "tls",
        help="TLS (mTLS, ACLs on) against plaintext: produce, fetch and e2e on two local "
        "clusters in one run",
    )
    tl.add_argument("--records", type=_positive, default=200_000, help="per produce phase")
    tl.add_argument("--record-size", type=_positive, default=100, help="value bytes")
    tl.add_argument("--nodes", type=_positive, default=3, help="storage nodes per cluster")
    tl.add_argument("--replication-factor", type=_positive, default=3)
    tl.add_argument("--partitions", type=_positive, default=3)
    tl.add_argument("--acks", default="all", choices=["0", "1", "all"])
    tl.add_argument("--batch-size", type=_size, default=256 * 1024, help="batch bytes")
    tl.add_argument("--linger-ms", type=_zero_or_more, default=5.0, help="produce phase linger")
    tl.add_argument("--rate", type=_above_zero, default=5_000.0, help="records/s of the e2e phase")
    tl.add_argument("--e2e-records", type=_positive, default=20_000)
    tl.add_argument("--rounds", type=_positive, default=1, help="alternate the phases N times")
    tl.add_argument("--dir", default=None, help="where the clusters live (default tmp)")
    tl.add_argument("--progress", action="store_true", help="progress bar even if not a tty")
    tl.add_argument("--json", action="store_true", help="print one JSON object")

    go = bsub.add_parser(
        "goals",
        help="every goal of the performance issue, each by its documented command, on local "
        "clusters of its own: runs, range and met or not, beside the machine's speed",
    )
    go.add_argument("--runs", type=_positive, default=3, help="runs of each goal")
    go.add_argument(
        "--scale",
        type=_above_zero,
        default=1.0,
        help="multiply the record counts (and trials) by this: 0.1 for a quick look, whose "
        "numbers are not the goals' (default: %(default)s)",
    )
    go.add_argument(
        "--skip",
        default="",
        metavar="PHASE,...",
        help="phases to leave out: latency, producer, consumer, commits, rf3, batching, failover",
    )
    go.add_argument("--dir", default=None, help="where the local clusters live (default tmp)")
    go.add_argument("--json", action="store_true", help="print one JSON object")

    cm = bsub.add_parser(
        "commits",
        help="offset commits/s from many committers at once, appends per commit, latency, CPU "
        "(local cluster; --compare: also with one append per commit)",
    )
    cm.add_argument("--committers", type=_positive, default=64, help="concurrent committers")
    cm.add_argument("--seconds", type=_above_zero, default=10.0, help="length of each run")
    cm.add_argument("--partitions", type=_positive, default=1, help="partitions per commit")
    cm.add_argument(
        "--nodes",
        type=_positive,
        default=1,
        help="storage nodes (__consumer_offsets is replicated to min(3, nodes), acks=all)",
    )
    cm.add_argument(
        "--compare",
        action="store_true",
        help="also run the coordinator with --max-write-batch-records 1 (one append per commit)",
    )
    cm.add_argument("--dir", default=None, help="where the local cluster lives (default tmp)")
    cm.add_argument("--json", action="store_true", help="print one JSON object")

    rb = bsub.add_parser(
        "rebalance", help="group of 3, one leaves: time to rebalance, consumption gaps"
    )
    rb.add_argument("--trials", type=_positive, default=5)
    rb.add_argument("--rate", type=_above_zero, default=5000.0, help="records/s produced")
    rb.add_argument("--dir", default=None, help="where the local cluster lives (default tmp)")
    rb.add_argument(
        "--heartbeat-interval-ms",
        type=_positive,
        default=None,
        help="coordinator --group-heartbeat-interval-ms (default: the coordinator's)",
    )
    rb.add_argument("--json", action="store_true", help="print one JSON object")

    for mode, text in (
        ("produce", "Producer throughput and ack latency (Kafka's producer perf tool)"),
        ("consume", "Consumer throughput from the earliest offset"),
        ("e2e", "end-to-end latency: produce at --rate, consume in the same process or another"),
    ):
        cb = bsub.add_parser(mode, parents=[common, metered], help=text)
        cb.add_argument(
            "--topic",
            default="strom-bench",
            help="an existing topic holding --records"
            if mode == "consume"
            else "created if missing",
        )
        cb.add_argument("--records", type=_positive, default=1_000_000)
        cb.add_argument("--record-size", type=_positive, default=100, help="value bytes")
        cb.add_argument(
            "--partitions",
            type=_positive,
            help="for a new topic (default 1); an existing topic with another count is used as "
            "it is, with a warning",
        )
        cb.add_argument("--replication-factor", type=_positive, default=1, help="new topic")
        cb.add_argument(
            "--acks",
            default="all",
            choices=["0", "1", "all"],
            help="all (the default, as Kafka's) keeps the producer idempotent; 1 and 0 turn "
            "idempotence off",
        )
        cb.add_argument("--batch-size", type=_size, default=256 * 1024, help="batch bytes")
        cb.add_argument(
            "--linger-ms",
            type=_zero_or_more,
            default=0.0 if mode == "e2e" else 5.0,
            help="producer linger (default: 5; e2e: 0, latency first)",
        )
        cb.add_argument(
            "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
        )
        cb.add_argument(
            "--rate",
            type=_above_zero,
            default=10_000.0 if mode == "e2e" else None,
            help="records/s to aim for (default: as fast as possible; e2e: 10000)",
        )
        cb.add_argument(
            "--api",
            default="poll" if mode == "consume" else "send",
            choices=["poll", "arrow"] if mode == "consume" else ["send", "batch"],
            help="produce: send() per record or send_batch(); consume: poll() or poll_arrow()",
        )
        cb.add_argument("--no-idempotence", action="store_true", help="enable_idempotence=False")
        if mode == "produce":
            cb.add_argument(
                "--keys",
                type=_positive,
                default=None,
                metavar="N",
                help="keyed records with N distinct keys (partition by key hash; default: keyless)",
            )
            cb.add_argument(
                "--transactional",
                action="store_true",
                help="compare the idempotent producer with transactions of --transaction-size "
                "records (commit latency percentiles)",
            )
            cb.add_argument(
                "--transaction-size",
                type=_positive,
                action="append",
                help="records per transaction; repeatable (default: 1000 and 100000)",
            )
            cb.add_argument(
                "--rounds",
                type=_positive,
                default=1,
                help="--transactional: run the phases this many times, interleaved, and "
                "report each phase's median round (default: %(default)s)",
            )
        if mode == "consume":
            cb.add_argument(
                "--poll-records",
                type=_positive,
                default=10_000,
                help="most records one poll returns (default: %(default)s)",
            )
            cb.add_argument(
                "--max-partition-fetch-bytes",
                type=_size,
                default=1 << 20,
                help="the consumer's most bytes per partition per fetch (default 1MiB, as "
                "Kafka's; larger pieces cost fewer calls per record, and more memory)",
            )
        if mode in ("consume", "e2e"):
            cb.add_argument(
                "--group",
                default=None,
                help="consume as a member of this consumer group (default: assigned partitions)",
            )
            cb.add_argument(
                "--commit",
                default="async" if mode == "e2e" else "none",
                choices=["async", "sync", "none"],
                help="with --group: commit after every poll this way (default: %(default)s)",
            )
        if mode == "e2e":
            cb.add_argument(
                "--duration",
                type=_above_zero,
                default=None,
                help="seconds to run at --rate (sets --records to rate x duration): a soak",
            )
            cb.add_argument(
                "--warmup-records",
                type=_non_negative,
                default=1000,
                help="records sent and read back before the clock starts (connections, "
                "producer id, a new topic's followers starting to fetch): default %(default)s",
            )
            cb.add_argument(
                "--lead-in",
                type=_zero_or_more,
                default=None,
                metavar="SECONDS",
                help="seconds of records sent at --rate before the measured ones and not "
                "measured: the start of the schedule is not the steady state (default 0.3)",
            )
            cb.add_argument(
                "--trace",
                action="store_true",
                help="also time each leg of every record's way (send, Produce, Fetch, poll): "
                "the latency budget",
            )
            cb.add_argument(
                "--consumer-process",
                action="store_true",
                help="consume in a process of its own, as two services would (default: a "
                "thread of the bench's process, sharing its interpreter lock); not with --trace",
            )
            cb.add_argument(
                "--cpu-hog",
                type=int,
                default=0,
                metavar="N",
                help="run N busy-looping processes beside the bench (the machine under load)",
            )
        cb.add_argument("--progress", action="store_true", help="progress bar even if not a tty")
        cb.add_argument("--json", action="store_true", help="print one JSON object")

    sp = bsub.add_parser(
        "spark",
        help="Spark connector: read count/groupBy and write rows/s beside an in-memory source",
    )
    sp.add_argument("--bootstrap", "-b", help="use this cluster (default: start a local one)")
    sp.add_argument("--records", type=_positive, default=3_000_000)
    sp.add_argument("--partitions", type=_positive, default=6)
    sp.add_argument("--record-size", type=_positive, default=100, help="value bytes")
    sp.add_argument("--runs", type=_positive, default=3, help="timed runs (best is reported)")
    sp.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    sp.add_argument("--nodes", type=_positive, default=1, help="storage nodes of a local cluster")
    sp.add_argument("--dir", default=None, help="where the local cluster lives (default tmp)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")

    demo = sub.add_parser(
        "demo", help="the main job: a Spark pipeline over a local cluster (needs strom[spark])"
    )
    demo.add_argument(
        "--dir",
        type=_fresh_demo_dir,
        default=None,
        help="keep the run's data and logs here: a new or empty directory (one holding a "
        "previous run is refused: remove it or give another); default: a temp dir",
    )
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="the cluster-internals demo instead: produce/consume, a node and a controller killed",
    )
    demo.add_argument(
        "--engine", action="store_true", help="only the storage-engine demo (no processes)"
    )
    demo.add_argument("--records", type=_positive, default=200_000, help="--cluster: records")
    demo.add_argument(
        "--events", type=_positive, default=100_000, help="Spark demo: first page views"
    )
    demo.add_argument(
        "--seconds", type=_above_zero, default=10.0, help="Spark demo: how long the service streams"
    )
    return parser


def _bench_clients(args: argparse.Namespace) -> int:
    from strom.bench import clients, cpu
    from strom.bench.stats import report

    progress = True if args.progress else None
    options = dict(
        acks=args.acks if args.acks == "all" else int(args.acks),
        batch_size=args.batch_size,
        linger_ms=args.linger_ms,
        compression=args.compression,
        enable_idempotence=False if args.no_idempotence else None,  # None: with acks=all
    )
    clients.ensure_topic(
        args.bootstrap,
        args.topic,
        args.partitions,
        args.replication_factor,
        create=args.bench_mode != "consume",  # consume reads a topic; an empty new one is no run
    )
    if args.bench_mode == "consume":
        # A topic holding fewer records than asked for used to be read to its end, 10 s of
        # waiting, and reported as a run of what it held, exit 0 (found from outside).
        held = clients.records_held(args.bootstrap, args.topic)
        if held < args.records:
            raise ValueError(
                f"topic {args.topic!r} holds {held:,} records, fewer than --records "
                f"{args.records:,} (produce more first, or ask for fewer)"
            )
    if args.bench_mode == "produce" and args.transactional:
        from strom.bench.transactions import ROUND_RATES, bench_transactions, summary

        options.pop("acks")
        options.pop("enable_idempotence")
        results = bench_transactions(
            args.bootstrap,
            args.topic,
            records=args.records,
            record_size=args.record_size,
            sizes=args.transaction_size or (1_000, 100_000),
            rounds=args.rounds,
            progress=progress,
            **options,
        )
        ctx = {
            "mode": "produce --transactional",
            "topic": args.topic,
            "records": args.records,
            "rounds": args.rounds,
            "server_cpu": cpu.server_source(),
        }
        if args.rounds > 1:
            ctx["round_records_per_s"] = {k: [round(x) for x in v] for k, v in ROUND_RATES.items()}
        if args.json:
            print(report(results, as_json=True, context=ctx))
        else:
            print(report([], as_json=False, context=ctx))
            print(summary(results))
        return 0
    consumed: list[Any] = []
    machine: dict[str, Any] = {}
    if args.bench_mode in ("produce", "consume"):
        from strom.bench.machine import calibrate_cluster

        machine = calibrate_cluster(args.bootstrap, args.topic)  # the idle cluster, first
    if args.bench_mode == "produce":
        result = clients.bench_produce(
            args.bootstrap,
            args.topic,
            records=args.records,
            record_size=args.record_size,
            api=args.api,
            rate=args.rate,
            keys=args.keys,
            progress=progress,
            **options,
        )
    elif args.bench_mode == "consume":
        consumed = clients.bench_consume(
            args.bootstrap,
            args.topic,
            records=args.records,
            api=args.api,
            poll_records=args.poll_records,
            group=args.group,
            commit=args.commit,
            progress=progress,
            max_partition_fetch_bytes=args.max_partition_fetch_bytes,
        )
        result = consumed[0]
    else:
        from strom.bench.e2e import bench_e2e

        rate = args.rate or 10_000.0
        if args.duration is not None:
            args.records = max(int(rate * args.duration), 1)
        result = bench_e2e(
            args.bootstrap,
            args.topic,
            records=args.records,
            record_size=args.record_size,
            rate=rate,
            progress=progress,
            group=args.group,
            commit=args.commit,
            cpu_hogs=args.cpu_hog,
            trace=args.trace,
            warmup_records=args.warmup_records,
            **({} if args.lead_in is None else {"lead_in_s": args.lead_in}),
            consumer_process=args.consumer_process,
            **options,
        )
    ctx = {
        "mode": args.bench_mode,
        "topic": args.topic,
        "records": args.records,
        "record_size": args.record_size,
        "api": args.api,
        **({"rate": args.rate} if args.rate else {}),
        **{k: v for k, v in options.items() if args.bench_mode != "consume"},
    }
    if args.bench_mode == "e2e":
        from strom.bench.e2e import LEAD_IN_S

        ctx.update(
            group=args.group or "-",
            cpu_hog=args.cpu_hog,
            warmup_records=args.warmup_records,
            lead_in_s=LEAD_IN_S if args.lead_in is None else args.lead_in,
            consumer="process" if args.consumer_process else "thread",
        )
    if args.bench_mode == "consume":
        ctx.update(
            poll_records=args.poll_records,
            group=args.group or "-",
            commit=args.commit,
            max_partition_fetch_bytes=args.max_partition_fetch_bytes,
        )
    ctx["server_cpu"] = cpu.server_source()
    if machine:
        from strom.bench.machine import brief

        ctx["machine"] = brief(machine)
    shown = consumed or [result]
    print(report(shown, as_json=args.json, context=ctx))
    if consumed and result.records < args.records:  # a group's commits, markers: fewer
        print(
            f"strom bench consume: read {result.records:,} of the {args.records:,} records "
            "asked for (nothing more arrived for 10 s)",
            file=sys.stderr,
        )
        return 1
    if args.bench_mode == "e2e" and not result.clean:  # type: ignore[attr-defined]
        print("strom bench e2e: records were failed, lost or duplicated", file=sys.stderr)
        return 1
    return 0


def _bench_grpc_records(args: argparse.Namespace) -> int:
    from strom.bench import cpu
    from strom.bench.grpc_records import bench_grpc_records
    from strom.bench.stats import report
    from strom.client.cluster import parse_bootstrap

    bootstrap = ",".join(parse_bootstrap(args.bootstrap))
    results, ratios = bench_grpc_records(
        bootstrap,
        args.topic,
        address=args.address,
        records=args.records,
        size=args.record_size,
        keys=args.keys,
        batch=args.batch,
        in_flight=args.in_flight,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        rate=args.rate,
        latency_records=args.latency_records,
        node=False if args.no_node else None,
        node_route=args.node_route,
        per_message=args.records_per_message,
        progress=True if args.progress else None,
    )
    ctx = {
        "mode": "grpc-records",
        "records": args.records,
        "record_size": args.record_size,
        "keys": args.keys,
        "batch": args.batch,
        "in_flight": args.in_flight,
        "node_route": args.node_route,
        "records_per_message": args.records_per_message,
        "partitions": args.partitions,
        "replication_factor": args.replication_factor,
        "latency_rate": args.rate,
        "server_cpu": cpu.server_source(),
        **ratios,
    }
    print(report(results, as_json=args.json, context=ctx))
    return 0


def _run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.command == "bench":
        from strom.bench import cpu
        from strom.bench.engine import bench_compaction, bench_log, bench_record
        from strom.bench.stats import report

        if hasattr(args, "metrics"):  # a bench against a running cluster
            cpu.use_server(cpu.discover(args.metrics, args.bootstrap))

        if args.bench_mode == "spark":
            from strom.cli.spark import run_bench_spark

            return run_bench_spark(args, out)
        if args.bench_mode == "failover":
            import json

            from strom.bench import failover

            trials = args.trials or (3 if args.target == "node" else 10)
            if args.target == "controller":
                times = failover.bench_controller_failover(trials, args.dir)
                what = "active controller SIGKILL -> admin request served"
            elif args.target == "node":
                times = failover.bench_node_failover(trials, args.partitions, args.dir)
                what = f"node leading {args.partitions} partitions SIGKILL -> all led again"
            else:
                times = failover.bench_failover(trials, args.dir)
                what = "leader SIGKILL -> acks=all produce"
            if args.json:
                ctx = {"mode": "failover", "target": args.target, "trials": trials}
                if args.target == "node":
                    ctx["partitions"] = args.partitions
                print(json.dumps({"context": ctx, "seconds": times}), file=out)
            else:
                print(failover.summary(times, what), file=out)
            return 0
        if args.bench_mode == "startup":
            import json

            from strom.bench import startup

            if args.gib <= 0:
                raise ValueError(f"--gib must be > 0, not {args.gib}")
            rows = startup.bench_startup(args.gib, args.partitions, args.trials, args.dir)
            if args.json:
                ctx = {"mode": "startup", "gib": args.gib, "partitions": args.partitions}
                print(json.dumps({"context": ctx, "restarts": rows}), file=out)
            return 0
        if args.bench_mode == "tls":
            from pathlib import Path

            from strom.bench import tls

            results = tls.bench_tls(
                records=args.records,
                record_size=args.record_size,
                nodes=args.nodes,
                replication_factor=args.replication_factor,
                partitions=args.partitions,
                acks=args.acks if args.acks == "all" else int(args.acks),
                rate=args.rate,
                e2e_records=args.e2e_records,
                rounds=args.rounds,
                root=Path(args.dir) if args.dir else None,
                progress=True if args.progress else None,
                batch_size=args.batch_size,
                linger_ms=args.linger_ms,
            )
            ctx = {
                "mode": "tls",
                "records": args.records,
                "record_size": args.record_size,
                "nodes": args.nodes,
                "replication_factor": args.replication_factor,
                "partitions": args.partitions,
                "acks": args.acks,
                "e2e_rate": args.rate,
                "rounds": args.rounds,
                "server_cpu": "each cluster's service processes",
            }
            if args.json:
                ctx.update(tls.comparison(results))
                print(report(results, as_json=True, context=ctx), file=out)
            else:
                print(report([], as_json=False, context=ctx), file=out)
                print(tls.summary(results), file=out)
            return 0
        if args.bench_mode == "scale":
            import json
            from pathlib import Path

            from strom.bench import scale

            if args.connections < 0:
                raise ValueError(f"--connections must be >= 0, not {args.connections}")
            result = scale.bench_scale(
                max_partitions=args.max_partitions,
                max_spread=args.max_spread,
                records=args.records,
                connections=args.connections,
                workers=args.workers,
                seconds=args.seconds,
                interval_ms=args.interval_ms,
                changes=args.changes,
                directory=args.dir,
            )
            out_dir = Path(args.out)
            plots = scale.plot(result, out_dir)
            result["context"] = {
                "mode": "scale",
                "max_partitions": args.max_partitions,
                "records": args.records,
                "connections": args.connections,
                "plots": [str(p) for p in plots],
            }
            (out_dir / "scale.json").write_text(json.dumps(result, indent=1))
            if args.json:
                print(json.dumps(result), file=out)
            else:
                print(scale.tables(result), file=out)
                print(f"\nplots and scale.json in {out_dir}", file=out)
            return 0
        if args.bench_mode == "rebalance":
            from strom.bench import groups

            result = groups.bench_rebalance(
                args.trials,
                args.rate,
                args.dir,
                verbose=not args.json,
                heartbeat_interval_ms=args.heartbeat_interval_ms,
            )
            print(groups.to_json(result) if args.json else groups.summary(result), file=out)
            return 0
        if args.bench_mode == "grpc":
            from strom.bench import grpc_bench
            from strom.client.cluster import parse_bootstrap

            argv = [
                "run",
                "--bootstrap",
                parse_bootstrap(args.bootstrap)[0],
                "--topic",
                args.topic,
                "--partition",
                str(args.partition),
                "--batch-bytes",
                str(args.batch_size),
                "--total-bytes",
                str(args.total),
                "--concurrency",
                str(args.concurrency),
                "--acks",
                "-1" if args.acks == "all" else args.acks,
                "--record-size",
                str(args.record_size),
                *(["--no-echo"] if args.no_echo else []),
            ]
            return grpc_bench.main([*argv, "--json"] if args.json else argv)
        if args.bench_mode == "goals":
            import json

            from strom.bench import goals

            skip = [x.strip() for x in args.skip.split(",") if x.strip()]
            found, machine = goals.bench_goals(
                runs=args.runs,
                scale=args.scale,
                skip=skip,
                directory=args.dir,
                log=lambda line: print(f"strom bench goals: {line}", file=sys.stderr, flush=True),
            )
            if args.json:
                ctx = {"mode": "goals", "runs": args.runs, "scale": args.scale, "machine": machine}
                print(json.dumps({"context": ctx, "goals": [g.as_dict() for g in found]}), file=out)
            else:
                print(goals.table(found, machine), file=out)
            return 1 if any(g.error for g in found) else 0
        if args.bench_mode == "commits":
            from strom.bench.commits import bench_commits

            results, extra = bench_commits(
                committers=args.committers,
                seconds=args.seconds,
                partitions=args.partitions,
                nodes=args.nodes,
                compare=args.compare,
                directory=args.dir,
            )
            ctx = {
                "mode": "commits",
                "committers": args.committers,
                "seconds": args.seconds,
                "partitions_per_commit": args.partitions,
                "nodes": args.nodes,
                **extra,
            }
        elif args.bench_mode in ("produce", "consume", "e2e"):
            return _bench_clients(args)
        elif args.bench_mode == "grpc-records":
            return _bench_grpc_records(args)
        elif args.bench_mode == "record":
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
        elif args.bench_mode == "compaction":
            results = bench_compaction(
                records=args.records,
                keys=args.keys,
                batch_records=args.batch_records,
                record_size=args.record_size,
                segment_bytes=args.segment_bytes,
                directory=args.dir,
            )
            ctx = {
                "mode": "compaction",
                "records": args.records,
                "keys": args.keys,
                "batch_records": args.batch_records,
                "record_size": args.record_size,
                "segment_bytes": args.segment_bytes,
            }
        else:
            results = bench_log(
                total_bytes=args.total,
                batch_bytes=args.batch_size,
                record_size=args.record_size,
                directory=args.dir,
                fsync=args.fsync,
                warm=args.warm,
            )
            ctx = {
                "mode": "log",
                "total": args.total,
                "batch_size": args.batch_size,
                "record_size": args.record_size,
                "fsync": args.fsync,
                "warm": args.warm,
            }
        print(report(results, as_json=args.json, context=ctx), file=out)
        return 0
    if args.command == "demo":
        from strom.cli.demo import run_cluster_demo, run_demo

        if args.engine:
            return run_demo(args.dir)
        if args.cluster:
            return run_cluster_demo(args.dir, args.records)
        from strom.cli.spark import run_spark_demo

        return run_spark_demo(args, out)
    if args.command == "dev":
        from strom.cli.dev import run_dev

        return run_dev(args, out)
    if args.command == "topics":
        from strom.cli.admin import run_topics

        return run_topics(args, out)
    if args.command == "cluster":
        from strom.cli.admin import run_cluster

        return run_cluster(args, out)
    if args.command == "groups":
        from strom.cli.groups import run_groups

        return run_groups(args, out)
    if args.command == "transactions":
        from strom.cli.transactions import run_transactions

        return run_transactions(args, out)
    if args.command == "acls":
        from strom.cli.acls import run_acls

        return run_acls(args, out)
    if args.command == "quotas":
        from strom.cli.acls import run_quotas

        return run_quotas(args, out)
    if args.command == "dump-log":
        from strom.cli.dumplog import run_dump_log

        return run_dump_log(args, out)
    if args.command == "produce":
        from strom.cli.console import run_produce

        return run_produce(args, sys.stdin.buffer, out)
    if args.command == "consume":
        from strom.cli.console import run_consume

        try:
            return run_consume(args, sys.stdout.buffer)
        except BrokenPipeError:
            return 0
    return 2


def _prog(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The name of the subcommand ``args`` ran, ``strom topics alter``, as argparse names it
    in its own usage errors: the subparsers followed by the names parsed into their dests."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not subs or name not in subs[0].choices:
            return parser.prog
        parser = subs[0].choices[name]


#: What a subcommand takes, for the error about arguments it does not know.
_TAKES = {
    "strom topics alter": "it takes --set KEY=VALUE or --config KEY=VALUE, --delete KEY "
    "and --partitions N",
}


def _unrecognized(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]
) -> NoReturn:
    """Arguments no parser knew: one line under the subcommand's name, as argparse's other
    usage errors (found from outside: `strom topics alter t --config k=v` was refused as
    `strom: error: unrecognized arguments`, naming neither the subcommand nor its flags)."""
    prog = _prog(parser, args)
    hint = _TAKES.get(prog, f"see `{prog} --help`")
    print(f"{prog}: error: unrecognized arguments: {' '.join(extras)} ({hint})", file=sys.stderr)
    raise SystemExit(2)


def _check_bootstrap(args: argparse.Namespace) -> None:
    """A ``--bootstrap`` that is not HOST:PORT[,...] is a usage error, before connecting
    (found from outside: ``--bootstrap foo`` exited 1, as a failure in the cluster)."""
    if getattr(args, "bootstrap", None) is None:
        return
    from strom.client.cluster import parse_bootstrap

    try:
        parse_bootstrap(args.bootstrap)
    except ValueError as exc:
        raise UsageError(f"argument --bootstrap/-b: {exc}") from None


def _argument_error(exc: TypeError) -> bool:
    """Whether ``exc`` is a client's refusal of an argument, raised on purpose by a ``raise``
    statement of strom's own code (``topic must be a non-empty str``): a one-line error of the
    command. Any other TypeError (one Python raises on a wrong operation) is a bug, and keeps
    its traceback."""
    import linecache
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../strom
    if not os.path.abspath(last.filename).startswith(package + os.sep):
        return False
    line = last.line or linecache.getline(last.filename, last.lineno or 0)
    return line.lstrip().startswith("raise TypeError")


def _give_up_after(seconds: float, prog: str, bootstrap: str) -> None:
    """``--timeout``: end the process with a one-line error once ``seconds`` have passed.
    A timer rather than a bound passed to every client the command makes: the wait that
    hurts (a down cluster) is spread over several of them, each retrying on its own."""

    def expire() -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        # What the clients last saw of the nodes, and its hint (a TLS cluster reached without
        # TLS, say): read from the module if a client ran, never imported from this thread.
        cluster = sys.modules.get("strom.client.cluster")
        seen = cluster.last_unanswered() if cluster is not None else None
        print(
            f"{prog}: error: no result within --timeout {seconds:g} s (is the cluster "
            f"{'at ' + bootstrap + ' ' if bootstrap else ''}up? a request already sent may "
            "still take effect)" + (f"; last seen: {seen}" if seen else ""),
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SERVICES:
        return int(importlib.import_module(SERVICES[argv[0]]).main(argv[1:]) or 0)
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _unrecognized(parser, args, extras)
    from strom.errors import StromError

    # The security flags reach every client of the command through the environment they
    # also read (strom.security.channel.client_security), which is told the flags' names for
    # its messages about their files.
    copied: dict[str, str] = {}
    for flag, env in (
        ("ssl_cafile", "STROM_SSL_CAFILE"),
        ("ssl_certfile", "STROM_SSL_CERTFILE"),
        ("ssl_keyfile", "STROM_SSL_KEYFILE"),
        ("token_file", "STROM_TOKEN_FILE"),
    ):
        if getattr(args, flag, None):
            os.environ[env] = getattr(args, flag)
            copied[env] = "--" + flag.replace("_", "-")
    if copied or "strom.security.channel" in sys.modules:  # else nothing to name or reset
        from strom.security.channel import name_env_settings

        name_env_settings(copied)
    if getattr(args, "timeout", None) is not None:
        bootstrap = getattr(args, "bootstrap", None) or os.environ.get("STROM_BOOTSTRAP", "")
        # When the timer will fire: commands that can report part of a result (``topics
        # offsets``) bound their own calls by it (strom.cli.admin._within_timeout).
        args.give_up_at = time.monotonic() + args.timeout
        _give_up_after(args.timeout, f"strom {args.command}", bootstrap)
    try:
        _check_bootstrap(args)
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`strom topics describe t | head -3`): stop quietly, as Unix
        # tools do, with stdout on /dev/null so the interpreter's last flush does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        print(f"{_prog(parser, args)}: error: {exc}", file=sys.stderr)
        return 2
    except (StromError, ValueError, OSError) as exc:
        # A strom error's class names its kind (AuthorizationError, ...); "ValueError" or
        # "OSError" would add nothing to a message that already says what was wrong.
        kind = f" ({type(exc).__name__})" if isinstance(exc, StromError) else ""
        print(f"strom {args.command}: error: {exc}{kind}", file=sys.stderr)
        return 1
    except TypeError as exc:
        if not _argument_error(exc):
            raise
        print(f"strom {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the cluster tools talk to processes that may not exist
        from strom.cli.spark import SparkMissingError
        from strom.devcluster.procs import ClusterError

        if isinstance(exc, (ClusterError, SparkMissingError)):
            print(f"strom {args.command}: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
