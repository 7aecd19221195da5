"""``strom controller``: flags, configuration sources and process entry point.

The ``strom`` command wires its ``controller`` subcommand to :func:`add_arguments` and
:func:`run` (through :func:`strom.service.config.parse_with_sources`, so every flag can also
come from ``STROM_<FLAG>`` or the ``--config`` YAML file). :func:`main` does the same on its
own, for tests and ``python -m strom.controller.cli``.

Start-up problems an operator can fix (a bad flag, etcd unreachable, a port in use) end the
process with one plain line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from strom.service import flags

PROG = "strom controller"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the controller's flags to ``parser`` (the ``strom controller`` subcommand)."""
    flags.add_endpoint_arguments(parser, listen="0.0.0.0:9093", metrics_port=9103)
    parser.add_argument(
        "--controller-id",
        default=None,
        type=flags.int_at_least(0),
        help="this controller's id (default: random)",
    )
    parser.add_argument(
        "--session-timeout-s",
        default=2,
        type=flags.int_at_least(2, " (etcd's minimum lease TTL)"),
        help="etcd lease TTL: how soon a standby takes over from a dead controller "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--default-partitions",
        default=1,
        type=flags.int_at_least(1),
        help="partitions of a topic created with num_partitions -1 (default: %(default)s)",
    )
    parser.add_argument(
        "--default-replication-factor",
        default=1,
        type=flags.int_at_least(1),
        help="replication factor of a topic created with -1 (default: %(default)s)",
    )
    parser.add_argument(
        "--etcd-max-txn-ops",
        default=128,
        type=flags.int_at_least(3),
        help="etcd's --max-txn-ops; topics with more partitions are written in several "
        "transactions, the topic key last (default: %(default)s)",
    )
    parser.add_argument(
        "--auto-leader-rebalance",
        default=True,
        type=flags.boolean,
        metavar="true|false",
        help="give leadership back to a partition's preferred replica once it is in sync again "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--fast-failure-detection",
        default=True,
        type=flags.boolean,
        metavar="true|false",
        help="watch every node's gRPC health stream and, when a node refuses connections, "
        "revoke its lease at once instead of waiting for it to expire (default: %(default)s)",
    )
    flags.add_process_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Build the controller from parsed flags and serve until SIGTERM; the exit code."""
    from strom.controller.service import ControllerService, ControllerStartupError

    proc = flags.start_process(PROG, args, "controller", args.controller_id)
    if isinstance(proc, int):
        return proc
    service = ControllerService(
        etcd=args.etcd,
        cluster=args.cluster,
        controller_id=proc.ident,
        advertise_host=proc.host,
        advertise_port=proc.port,
        metrics_port=proc.metrics_port or 0,
        session_timeout_s=args.session_timeout_s,
        default_partitions=args.default_partitions,
        default_replication_factor=args.default_replication_factor,
        max_txn_ops=args.etcd_max_txn_ops,
        connect_timeout_s=args.etcd_connect_timeout_s,
        auto_leader_rebalance=args.auto_leader_rebalance,
        fast_failure_detection=args.fast_failure_detection,
    )
    return flags.serve(
        PROG,
        service,
        args.listen,
        proc.metrics_port,
        (ControllerStartupError,),
        flags.server_limits(args),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``strom controller`` as a standalone program (flags > STROM_* env > YAML)."""
    parser = flags.OneLineParser(prog=PROG, description="run a strom controller")
    add_arguments(parser)
    return flags.standalone(PROG, parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
