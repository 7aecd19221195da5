"""The ``strom`` command's arguments: the argparse parser of every client-side subcommand
(``build_parser``) and the argument types its flags share.

Why a module of its own: what the command accepts (about 500 lines of flags and their help) is
read and changed apart from how a command runs (:mod:`strom.cli.main`: the dispatch and the
one-line errors) and from the benchmarks' runs (:mod:`strom.cli.bench_commands`). The
subcommands with modules of their own add their parsers from there (``add_*_parser``).
"""

from __future__ import annotations

import argparse

from strom import __version__
from strom.argtypes import INT32_MAX, LONG_MS_MAX, byte_size, int_at_least, number_above

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
#: The benchmarks' --linger-ms: the Producer's linger_ms, up to its maximum.
_linger_ms = number_above(0.0, inclusive=True, maximum=LONG_MS_MAX)


def _batch_size(text: str) -> int:
    """The benchmarks' --batch-size: a size (``256KiB``) the Producer's batch_size takes, at
    most 2**31-1 bytes (Kafka's int), so a larger one is a usage error naming the flag."""
    value = byte_size(text)
    if value > INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT32_MAX} bytes, not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from strom.cli.acls import add_acls_parser
    from strom.cli.admin_parser import add_cluster_parser, add_topics_parser
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
    tl.add_argument("--batch-size", type=_batch_size, default=256 * 1024, help="batch bytes")
    tl.add_argument("--linger-ms", type=_linger_ms, default=5.0, help="produce phase linger")
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
        cb.add_argument("--batch-size", type=_batch_size, default=256 * 1024, help="batch bytes")
        cb.add_argument(
            "--linger-ms",
            type=_linger_ms,
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
