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
import random
import sys
from collections.abc import Callable, Sequence

from strom.metadata import MetadataUnavailableError, parse_endpoints
from strom.service import runtime
from strom.service.config import ConfigFileError, parse_with_sources, split_host_port

PROG = "strom controller"


def _host_port(text: str) -> str:
    try:
        _host, port = split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} in {text!r} is out of range")
    return text


def _endpoints(text: str) -> str:
    try:
        parse_endpoints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, not {value}")
        return value

    parse.__name__ = "int"
    return parse


def _port_or_disabled(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (-1 disables metrics)")
    return value


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the controller's flags to ``parser`` (the ``strom controller`` subcommand)."""
    parser.add_argument(
        "--etcd",
        required=True,
        type=_endpoints,
        metavar="HOST:PORT[,HOST:PORT]",
        help="etcd endpoints holding the cluster metadata",
    )
    parser.add_argument(
        "--listen",
        default="0.0.0.0:9093",
        type=_host_port,
        metavar="HOST:PORT",
        help="gRPC address to bind (default: %(default)s)",
    )
    parser.add_argument(
        "--advertise",
        default=None,
        type=_host_port,
        metavar="HOST:PORT",
        help="address clients are told to use (default: --listen, 0.0.0.0 as 127.0.0.1)",
    )
    parser.add_argument(
        "--metrics-port",
        default=9103,
        type=_port_or_disabled,
        help="Prometheus /metrics HTTP port; -1 disables it (default: %(default)s)",
    )
    parser.add_argument(
        "--cluster", default="strom", help="cluster name: the etcd prefix /strom/<name>/"
    )
    parser.add_argument(
        "--controller-id",
        default=None,
        type=_int_at_least(0),
        help="this controller's id (default: random)",
    )
    parser.add_argument(
        "--session-timeout-s",
        default=2,
        type=_int_at_least(2, " (etcd's minimum lease TTL)"),
        help="etcd lease TTL: how soon a standby takes over from a dead controller "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--default-partitions",
        default=1,
        type=_int_at_least(1),
        help="partitions of a topic created with num_partitions -1 (default: %(default)s)",
    )
    parser.add_argument(
        "--default-replication-factor",
        default=1,
        type=_int_at_least(1),
        help="replication factor of a topic created with -1 (default: %(default)s)",
    )
    parser.add_argument(
        "--etcd-max-txn-ops",
        default=128,
        type=_int_at_least(3),
        help="etcd's --max-txn-ops; topics with more partitions are written in several "
        "transactions, the topic key last (default: %(default)s)",
    )
    parser.add_argument(
        "--etcd-connect-timeout-s",
        default=10.0,
        type=float,
        help="give up starting when etcd does not answer within this (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )
    parser.add_argument(
        "--auto-leader-rebalance",
        default=True,
        type=_bool,
        metavar="true|false",
        help="give leadership back to a partition's preferred replica once it is in sync again "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--fast-failure-detection",
        default=True,
        type=_bool,
        metavar="true|false",
        help="watch every node's gRPC health stream and, when a node refuses connections, "
        "revoke its lease at once instead of waiting for it to expire (default: %(default)s)",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML file with any of these settings")


def _advertised(listen: str, advertise: str | None) -> tuple[str, int]:
    host, port = split_host_port(advertise or listen)
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    return host, port


def _fail(message: str, code: int = 1) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Build the controller from parsed flags and serve until SIGTERM; the exit code."""
    from strom.controller.service import ControllerService, ControllerStartupError

    host, port = _advertised(args.listen, args.advertise)
    controller_id = (
        args.controller_id if args.controller_id is not None else random.randrange(1 << 31)
    )
    metrics_port = args.metrics_port if args.metrics_port >= 0 else None
    runtime.setup_logging(args.log_level, "controller")
    service = ControllerService(
        etcd=args.etcd,
        cluster=args.cluster,
        controller_id=controller_id,
        advertise_host=host,
        advertise_port=port,
        metrics_port=metrics_port or 0,
        session_timeout_s=args.session_timeout_s,
        default_partitions=args.default_partitions,
        default_replication_factor=args.default_replication_factor,
        max_txn_ops=args.etcd_max_txn_ops,
        connect_timeout_s=args.etcd_connect_timeout_s,
        auto_leader_rebalance=args.auto_leader_rebalance,
        fast_failure_detection=args.fast_failure_detection,
    )
    try:
        return runtime.run(service, args.listen, metrics_port)
    except (ControllerStartupError, MetadataUnavailableError) as exc:
        return _fail(str(exc))
    except RuntimeError as exc:
        # grpc raises RuntimeError("Failed to bind to address ...") for a port in use.
        if "bind" in str(exc).lower():
            return _fail(f"cannot listen on {args.listen}: {exc}")
        raise
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """``strom controller`` as a standalone program (flags > STROM_* env > YAML)."""
    parser = argparse.ArgumentParser(prog=PROG, description="run a strom controller")
    add_arguments(parser)
    try:
        args = parse_with_sources(parser, argv)
    except ConfigFileError as exc:
        return _fail(str(exc), 2)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
