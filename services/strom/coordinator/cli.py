"""``strom coordinator``: flags, configuration sources and process entry point.

Same conventions as ``strom controller`` (flags > ``STROM_*`` environment > ``--config`` YAML;
start-up problems an operator can fix end with one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from strom.service import flags

PROG = "strom coordinator"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the coordinator's flags to ``parser``."""
    flags.add_endpoint_arguments(parser, listen="0.0.0.0:9094", metrics_port=9104)
    parser.add_argument(
        "--coordinator-id",
        default=None,
        type=flags.int_at_least(0),
        help="this coordinator's id (default: random)",
    )
    parser.add_argument(
        "--offsets-partitions",
        default=8,
        type=flags.int_at_least(1),
        help="shards (partitions of __consumer_offsets) when this coordinator creates the "
        "topic; an existing topic keeps its count (default: %(default)s)",
    )
    parser.add_argument(
        "--transaction-state-partitions",
        default=8,
        type=flags.int_at_least(1),
        help="shards (partitions of __transaction_state) when this coordinator creates the "
        "topic (transaction.state.log.num.partitions; default: %(default)s)",
    )
    parser.add_argument(
        "--transaction-max-timeout-ms",
        default=900_000,
        type=flags.int_at_least(1),
        help="largest transaction.timeout.ms a producer may ask for "
        "(transaction.max.timeout.ms; default: %(default)s)",
    )
    parser.add_argument(
        "--transactional-id-expiration-ms",
        default=604_800_000,  # txn_service.ID_EXPIRATION_MS
        type=flags.int_at_least(1),
        help="remove a transactional id with nothing open after this long without a change "
        "(transactional.id.expiration.ms; default: %(default)s, 7 days)",
    )
    parser.add_argument(
        "--offsets-replication-factor",
        default=3,
        type=flags.int_at_least(1),
        help="replication factor of __consumer_offsets and __transaction_state; the "
        "coordinator waits for this many live storage nodes before creating them "
        "(offsets.topic.replication.factor; default: %(default)s)",
    )
    parser.add_argument(
        "--session-timeout-s",
        default=2,
        type=flags.int_at_least(2, " (etcd's minimum lease TTL)"),
        help="etcd lease TTL of the shard keys: how soon another coordinator takes over "
        "from a dead one (default: %(default)s)",
    )
    parser.add_argument(
        "--group-session-timeout-ms",
        default=45_000,
        type=flags.int_at_least(1),
        help="a member that does not heartbeat for this long is removed "
        "(group.consumer.session.timeout.ms, default: %(default)s)",
    )
    parser.add_argument(
        "--group-heartbeat-interval-ms",
        # Kafka's default is 5 s. Members learn a new assignment only from a heartbeat
        # response, so the interval bounds how fast a rebalance completes; 500 ms keeps a
        # graceful leave under a second for two small RPCs per member per second.
        default=500,
        type=flags.int_at_least(1),
        help="heartbeat interval told to members; bounds how fast partitions move "
        "(group.consumer.heartbeat.interval.ms, default: %(default)s)",
    )
    parser.add_argument(
        "--group-max-size",
        default=None,
        type=flags.int_at_least(1),
        help="most members a group may have (default: no limit)",
    )
    parser.add_argument(
        "--max-write-batch-records",
        default=4096,
        type=flags.int_at_least(1),
        help="most records one append to a shard's log carries: the commits and group changes "
        "that queued while the previous append was in flight go out together up to this many "
        "(1: one operation per append; default: %(default)s)",
    )
    parser.add_argument(
        "--empty-group-retention-ms",
        default=600_000,  # timers.EMPTY_GROUP_RETENTION_MS
        type=flags.int_at_least(1),
        help="delete a group that stayed empty (no members) with no committed and no "
        "transactional offsets for this long, as Kafka's offsets cleanup does (its "
        "offsets.retention.check.interval.ms; default: %(default)s, 10 minutes; counted "
        "like --offsets-retention-ms); a group with committed offsets is kept",
    )
    parser.add_argument(
        "--offsets-retention-ms",
        default=604_800_000,  # timers.OFFSETS_RETENTION_MS
        type=flags.int_at_least(1),
        help="delete a group that stayed empty (no members) for this long together with its "
        "committed offsets, as Kafka's offsets.retention.minutes (KIP-211); counted in memory "
        "from when the serving coordinator first saw the group empty, so a coordinator "
        "restart or a shard move starts the count over; a group with members keeps its "
        "offsets (default: %(default)s, 7 days)",
    )
    parser.add_argument(
        "--lag-metrics-interval-s",
        default=10.0,
        type=float,
        help="how often strom_coordinator_consumer_lag is refreshed (default: %(default)s)",
    )
    flags.add_process_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Build the coordinator from parsed flags and serve until SIGTERM; the exit code."""
    from strom.coordinator.group import GroupConfig
    from strom.coordinator.service import CoordinatorService, CoordinatorStartupError

    proc = flags.start_process(PROG, args, "coordinator", args.coordinator_id)
    if isinstance(proc, int):
        return proc
    service = CoordinatorService(
        etcd=args.etcd,
        cluster=args.cluster,
        coordinator_id=proc.ident,
        advertise_host=proc.host,
        advertise_port=proc.port,
        metrics_port=proc.metrics_port or 0,
        offsets_partitions=args.offsets_partitions,
        offsets_replication_factor=args.offsets_replication_factor,
        lease_ttl_s=args.session_timeout_s,
        group_config=GroupConfig(
            session_timeout_ms=args.group_session_timeout_ms,
            heartbeat_interval_ms=args.group_heartbeat_interval_ms,
            max_size=args.group_max_size,
        ),
        connect_timeout_s=args.etcd_connect_timeout_s,
        lag_interval_s=max(args.lag_metrics_interval_s, 0.1),
        txn_partitions=args.transaction_state_partitions,
        txn_max_timeout_ms=args.transaction_max_timeout_ms,
        max_write_batch_records=args.max_write_batch_records,
        empty_group_retention_ms=args.empty_group_retention_ms,
        offsets_retention_ms=args.offsets_retention_ms,
    )
    service.txn_id_expiration_ms = args.transactional_id_expiration_ms
    return flags.serve(
        PROG,
        service,
        args.listen,
        proc.metrics_port,
        (CoordinatorStartupError,),
        flags.server_limits(args),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``strom coordinator`` as a standalone program (flags > STROM_* env > YAML)."""
    parser = flags.OneLineParser(prog=PROG, description="run a strom group coordinator")
    add_arguments(parser)
    return flags.standalone(PROG, parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
