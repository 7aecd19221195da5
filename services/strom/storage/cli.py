"""``strom storage-node``: run one storage node.

Settings come from flags, then ``STROM_*`` environment variables (``STROM_NODE_ID``,
``STROM_DATA_DIR``, ...), then ``--config FILE`` (YAML with the flag names as keys), in that
order of precedence. Bad input and start-up refusals (node id in use, etcd unreachable,
data dir unusable) print one line and exit non-zero, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from strom import security
from strom.metadata import MetadataUnavailableError, parse_endpoints
from strom.service.config import ConfigFileError, parse_with_sources, split_host_port

if TYPE_CHECKING:
    from strom.storage.node import NodeConfig

PROG = "strom storage-node"

_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The storage node's flags (shared with ``strom storage-node`` and dev clusters)."""
    parser.add_argument("--node-id", type=int, required=True, help="this node's id (>= 0)")
    parser.add_argument("--data-dir", required=True, help="directory holding partition logs")
    parser.add_argument(
        "--listen", default="0.0.0.0:9092", help="HOST:PORT to serve gRPC on (0.0.0.0:9092)"
    )
    parser.add_argument(
        "--advertise",
        default=None,
        help="HOST:PORT clients and other nodes connect to (default: --listen, with a "
        "wildcard host replaced by 127.0.0.1)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9102, help="Prometheus /metrics port (9102)"
    )
    parser.add_argument("--etcd", required=True, help="etcd endpoints HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--cluster", default="strom", help="cluster name (etcd key prefix)")
    parser.add_argument("--rack", default=None, help="rack / availability zone of this node")
    parser.add_argument(
        "--session-timeout-s",
        type=int,
        default=2,
        help="etcd lease TTL: how long after a crash the node counts as dead (2, etcd's minimum)",
    )
    parser.add_argument(
        "--startup-fence-timeout-s",
        type=float,
        default=60.0,
        help="how long a restarting node that etcd still names leader or in-sync replica "
        "waits for the controller to fence its previous life before taking those roles (60)",
    )
    parser.add_argument(
        "--log-cleanup-interval-ms",
        type=int,
        default=30_000,
        help="how often retention and compaction run (30000)",
    )
    parser.add_argument(
        "--checkpoint-interval-ms",
        type=int,
        default=60_000,
        help="how often recovery points are flushed and checkpointed (60000)",
    )
    parser.add_argument(
        "--replica-lag-time-max-ms",
        type=int,
        default=10_000,
        help="replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR "
        "(10000)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=0,
        help="most client connections served at once; more are closed (0: half the open-file "
        "limit, at most 10000)",
    )
    parser.add_argument(
        "--max-inflight-produce-bytes",
        type=int,
        default=256 * 1024 * 1024,
        help="produce request bytes worked on at once (appending, waiting for acks); more are "
        "refused with RESOURCE_EXHAUSTED and retried by clients (268435456)",
    )
    parser.add_argument(
        "--max-memory-bytes",
        type=int,
        default=-1,
        help="resident memory above which new produce requests are refused with "
        "RESOURCE_EXHAUSTED (-1: 80%% of the cgroup or machine memory; 0: no limit)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=LOG_LEVELS,
        help="log level (info)",
    )
    security.add_arguments(parser)
    parser.add_argument("--config", default=None, help="YAML file with any of these settings")


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (``--help`` still shows the full usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=PROG, description="Run a strom storage node.")
    add_arguments(parser)
    return parser


def node_config(args: argparse.Namespace) -> NodeConfig:
    """Validate parsed flags into a NodeConfig; ValueError names the bad setting."""
    from strom.storage.node import NodeConfig

    if args.log_level not in LOG_LEVELS:  # argparse does not check env/YAML defaults
        raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    if args.node_id < 0:
        raise ValueError(f"--node-id must be >= 0, not {args.node_id}")
    listen_host, listen_port = split_host_port(args.listen, what="--listen")
    if not 0 <= listen_port <= 65535:
        raise ValueError(f"--listen port {listen_port} is out of range")
    if args.advertise:
        adv_host, adv_port = split_host_port(args.advertise, what="--advertise")
    else:
        adv_host, adv_port = listen_host, listen_port
    if adv_host in _WILDCARDS:
        adv_host = "127.0.0.1"
    if listen_port == 0 or adv_port == 0:
        raise ValueError("--listen/--advertise need a fixed port (others connect to it)")
    if not -1 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port {args.metrics_port} is out of range (-1 disables)")
    parse_endpoints(args.etcd)
    if not args.cluster or "/" in args.cluster:
        raise ValueError(f"--cluster {args.cluster!r} must be a non-empty name without '/'")
    if args.startup_fence_timeout_s < 0:
        raise ValueError("--startup-fence-timeout-s must be >= 0")
    if args.session_timeout_s < 1:
        raise ValueError("--session-timeout-s must be >= 1 (etcd raises it to its minimum)")
    if args.log_cleanup_interval_ms <= 0 or args.checkpoint_interval_ms <= 0:
        raise ValueError("--log-cleanup-interval-ms and --checkpoint-interval-ms must be > 0")
    if args.replica_lag_time_max_ms <= 0:
        raise ValueError("--replica-lag-time-max-ms must be > 0")
    if args.max_connections < 0:
        raise ValueError(f"--max-connections must be >= 0, not {args.max_connections}")
    if args.max_inflight_produce_bytes <= 0:
        raise ValueError("--max-inflight-produce-bytes must be > 0")
    if args.max_memory_bytes < -1:
        raise ValueError("--max-memory-bytes must be -1 (automatic), 0 (off) or a size")
    data_dir = Path(args.data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise ValueError(f"--data-dir {data_dir} exists and is not a directory")
    return NodeConfig(
        node_id=args.node_id,
        data_dir=data_dir,
        listen=f"{listen_host}:{listen_port}",
        advertise_host=adv_host,
        advertise_port=adv_port,
        metrics_port=args.metrics_port,
        etcd=args.etcd,
        cluster=args.cluster,
        rack=args.rack or None,
        session_timeout_s=args.session_timeout_s,
        startup_fence_timeout_s=args.startup_fence_timeout_s,
        log_cleanup_interval_ms=args.log_cleanup_interval_ms,
        checkpoint_interval_ms=args.checkpoint_interval_ms,
        replica_lag_time_max_ms=args.replica_lag_time_max_ms,
        max_connections=args.max_connections,
        max_inflight_produce_bytes=args.max_inflight_produce_bytes,
        max_memory_bytes=args.max_memory_bytes,
    )


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 1


def run(args: argparse.Namespace) -> int:
    """Run a node until SIGTERM/SIGINT; the exit status (0 after a clean shutdown)."""
    try:
        config = node_config(args)
        security.configure(args)
    except ValueError as exc:
        return _fail(str(exc))
    from strom.service.limits import ServerLimits
    from strom.service.runtime import serve, setup_logging
    from strom.storage.node import StartupError, StorageNode, tune_malloc

    setup_logging(args.log_level, "storage-node")
    tune_malloc()
    try:
        node = StorageNode(config)
        limits = ServerLimits(max_connections=config.max_connections)
        asyncio.run(serve(node, config.listen, config.metrics_port, limits=limits))
    except StartupError as exc:
        return _fail(str(exc))
    except MetadataUnavailableError as exc:
        return _fail(f"cannot reach etcd at {config.etcd}: {exc}")
    except OSError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parse_with_sources(parser, argv)
    except ConfigFileError as exc:
        return _fail(str(exc))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
