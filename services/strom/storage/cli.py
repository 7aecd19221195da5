"""``strom storage-node``: run one storage node.

Settings come from flags, then ``STROM_*`` environment variables (``STROM_NODE_ID``,
``STROM_DATA_DIR``, ...), then ``--config FILE`` (YAML with the flag names as keys), in that
order of precedence. The flags every service has (``--etcd``, ``--listen``, ``--advertise``,
``--metrics-port``, ``--cluster``, ``--max-connections``, ``--log-level``, the security flags,
``--config``) and their checks come from :mod:`strom.service.flags`, as for the controller and
the coordinator. Bad input and start-up refusals (node id in use, etcd unreachable, data dir
unusable, recorded as another node's or cluster's in its ``meta.properties``, or without one
and holding none of the logs the cluster assigns this node id) print one line and exit
non-zero, never a traceback: a malformed flag or config file exits 2 (a usage error), a
setting the node refuses or a start-up failure exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from strom.metadata import MetadataUnavailableError, parse_endpoints
from strom.service import flags
from strom.service.config import split_host_port

if TYPE_CHECKING:
    from strom.storage.node import NodeConfig

PROG = "strom storage-node"

LOG_LEVELS = flags.LOG_LEVELS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The storage node's flags (shared with ``strom storage-node`` and dev clusters)."""
    parser.add_argument(
        "--node-id", type=flags.int_at_least(0), required=True, help="this node's id (>= 0)"
    )
    parser.add_argument("--data-dir", required=True, help="directory holding partition logs")
    flags.add_endpoint_arguments(parser, listen="0.0.0.0:9092", metrics_port=9102)
    parser.add_argument("--rack", default=None, help="rack / availability zone of this node")
    parser.add_argument(
        "--session-timeout-s",
        type=flags.int_at_least(1),
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
        type=flags.int_at_least(1),
        default=30_000,
        help="how often retention and compaction run (30000)",
    )
    parser.add_argument(
        "--checkpoint-interval-ms",
        type=flags.int_at_least(1),
        default=60_000,
        help="how often recovery points are flushed and checkpointed (60000)",
    )
    parser.add_argument(
        "--replica-lag-time-max-ms",
        type=flags.int_at_least(1),
        default=10_000,
        help="replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR "
        "(10000)",
    )
    parser.add_argument(
        "--max-inflight-produce-bytes",
        type=flags.int_at_least(1),
        default=256 * 1024 * 1024,
        help="produce request bytes worked on at once (appending, waiting for acks); more are "
        "refused with RESOURCE_EXHAUSTED and retried by clients (268435456)",
    )
    parser.add_argument(
        "--max-memory-bytes",
        type=flags.int_at_least(-1),
        default=-1,
        help="resident memory above which new produce requests are refused with "
        "RESOURCE_EXHAUSTED (-1: 80%% of the cgroup or machine memory; 0: no limit)",
    )
    parser.add_argument(
        "--subscribe-max-stall-ms",
        type=flags.int_at_least(1),
        default=300_000,
        help="a group Subscribe stream whose reader reads nothing this long while records "
        "wait ends (ABORTED) and leaves the group, so its partitions move to members that "
        "read (Kafka's max.poll.interval.ms) (300000)",
    )
    # The node retries etcd until it answers (a restart must not fail while etcd is
    # electing), so it has no --etcd-connect-timeout-s.
    flags.add_process_arguments(parser, etcd_connect_timeout=False)


def build_parser() -> argparse.ArgumentParser:
    parser = flags.OneLineParser(prog=PROG, description="Run a strom storage node.")
    add_arguments(parser)
    return parser


def node_config(args: argparse.Namespace) -> NodeConfig:
    """Validate parsed flags into a NodeConfig; ValueError names the bad setting.

    The flag types check values from the command line, the environment and the YAML file
    (:func:`strom.service.config.parse_with_sources`); every bound is checked here again
    for callers that build the namespace some other way.
    """
    from strom.storage.node import NodeConfig

    if flags.log_level(args.log_level) not in LOG_LEVELS:  # a namespace built otherwise
        raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    if args.node_id < 0:
        raise ValueError(f"--node-id must be >= 0, not {args.node_id}")
    listen_host, listen_port = split_host_port(args.listen, what="--listen")
    if not 0 <= listen_port <= 65535:
        raise ValueError(f"--listen port {listen_port} is out of range")
    address = flags.advertised_address(args.listen, args.advertise)
    adv_host, adv_port = address.host, address.port
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
    if args.subscribe_max_stall_ms <= 0:
        raise ValueError("--subscribe-max-stall-ms must be > 0")
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
        advertise_warning=address.warning,
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
        subscribe_max_stall_ms=args.subscribe_max_stall_ms,
    )


def run(args: argparse.Namespace) -> int:
    """Run a node until SIGTERM/SIGINT; the exit status (0 after a clean shutdown)."""
    try:
        config = node_config(args)
    except ValueError as exc:
        return flags.fail(PROG, str(exc))
    failed = flags.configure_security(PROG, args)
    if failed is not None:
        return failed
    from strom.service import runtime
    from strom.storage.node import StartupError, StorageNode, tune_malloc

    runtime.setup_logging(args.log_level, "storage-node", args)
    flags.warn_advertised(config.advertise_warning, config.advertise_host, config.advertise_port)
    tune_malloc()
    from strom.client import memory

    memory.leave_alone()  # the node's thresholds, not a Subscribe consumer's
    try:
        node = StorageNode(config)
    except (StartupError, OSError) as exc:
        return flags.fail(PROG, str(exc))
    except MetadataUnavailableError as exc:
        return flags.fail(PROG, f"cannot reach etcd at {config.etcd}: {exc}")
    return flags.serve(
        PROG,
        node,
        config.listen,
        config.metrics_port,
        (StartupError,),
        flags.server_limits(args),
        etcd=config.etcd,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``strom storage-node`` as a standalone program (flags > STROM_* env > YAML)."""
    return flags.standalone(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
