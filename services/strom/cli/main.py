"""The ``strom`` command.

Services run as ``strom controller ...``, ``strom storage-node ...`` and ``strom coordinator
...`` (each parses its own flags, YAML file and STROM_* environment); everything else is a
client-side tool. Errors print one line naming the problem, never a traceback: exit 2 for
bad arguments (argparse's, and :class:`strom.argtypes.UsageError` for checks made after
parsing), exit 1 for what failed on the way or in the cluster. A client's deliberate refusal
of an argument (its ValueError, or a TypeError it raises on purpose) is one line too; any
other TypeError is a bug and keeps its traceback.

The arguments each subcommand takes are in :mod:`strom.cli.parser` (``build_parser``, still
imported from here), the benchmarks' runs in :mod:`strom.cli.bench_commands`; this module
runs a command and turns what it raises into those errors.
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
from typing import NoReturn

from strom.argtypes import UsageError
from strom.cli.parser import SERVICES, build_parser


def _run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.command == "bench":
        from strom.cli.bench_commands import run_bench

        return run_bench(args, out)
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
    usage errors, naming the subcommand and what it takes."""
    prog = _prog(parser, args)
    hint = _TAKES.get(prog, f"see `{prog} --help`")
    print(f"{prog}: error: unrecognized arguments: {' '.join(extras)} ({hint})", file=sys.stderr)
    raise SystemExit(2)


def _check_bootstrap(args: argparse.Namespace) -> None:
    """A ``--bootstrap`` that is not HOST:PORT[,...] is a usage error, before connecting
    (not exit 1, as a failure in the cluster)."""
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
        # offsets``) bound their own calls by it (strom.cli.partition_commands._within_timeout).
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
