"""``strom bench ...``: each benchmark's run from its parsed arguments, and its report.

Why a module of its own: the benchmarks are the larger part of what the command runs, and
each reads its own flags (:func:`strom.cli.parser.build_parser`); :mod:`strom.cli.main`
hands them ``args`` and keeps the dispatch and the error handling (a benchmark's ValueError
or a cluster that does not start is one line, as for every command). The benchmarks' modules
are imported by the branch that runs them, so the command starts without them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO


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
        # A topic holding fewer records than asked for would be read to its end and
        # reported as a run of what it held: refuse it up front.
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


def run_bench(args: argparse.Namespace, out: TextIO) -> int:
    """Run the benchmark ``args.bench_mode`` names and print its report to ``out``."""
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
