"""The arguments of ``strom topics ...`` and ``strom cluster ...``: their argparse parsers
(``add_topics_parser``, ``add_cluster_parser``, which ``strom.cli.parser`` adds to the
``strom`` command) and the argument types only they take (``KEY=VALUE`` lists, times and
offsets).
"""

from __future__ import annotations

import argparse
from typing import Any

from strom.argtypes import INT32_MAX, UsageError, int_at_least, iso_time_ms, topic_name
from strom.cli import reassign, reassignplan
from strom.client.admin import OffsetSpec

_TIME_ALIASES: dict[str, OffsetSpec] = {
    "earliest": "earliest",
    "beginning": "earliest",
    "-2": "earliest",
    "latest": "latest",
    "end": "latest",
    "-1": "latest",
    "max": "max_timestamp",
    "max_timestamp": "max_timestamp",
    "-3": "max_timestamp",
}


def _kv(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _time_spec(text: str) -> OffsetSpec:
    """earliest | latest | max | ms since the epoch | an ISO 8601 time (-1/-2/-3 as Kafka's
    GetOffsetShell takes them)."""
    t = text.strip().lower()
    if t in _TIME_ALIASES:
        return _TIME_ALIASES[t]
    if t.isdigit():
        if int(t) >= 2**63:
            raise argparse.ArgumentTypeError(f"not a time: {text!r} (too large)")
        return int(t)
    try:
        return iso_time_ms(text)  # without a timezone: local time, as --to-datetime
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not a time: {exc}; or earliest, latest, max, ms since the epoch"
        ) from None


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an offset is >= 0, not {value}")
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"an offset is below 2**63, not {value}")
    return value


def add_topics_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    topics = sub.add_parser("topics", help="create, list, describe, alter, delete topics")
    tsub = topics.add_subparsers(dest="topics_cmd", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser("create", parents=[common], help="create a topic")
    c.add_argument("topic", type=topic_name)
    c.add_argument(
        "--partitions",
        type=int_at_least(1, maximum=INT32_MAX),
        help="default: the controller's --default-partitions (1 unless set)",
    )
    c.add_argument(
        "--replication-factor",
        type=int_at_least(1, maximum=INT32_MAX),
        help="default: the controller's --default-replication-factor (1 unless set)",
    )
    c.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="topic config, with Kafka's names (docs/topic-configs.md)",
    )
    c.add_argument("--validate-only", action="store_true")
    c.add_argument(
        "--if-not-exists",
        action="store_true",
        help="a topic of that name already there is no error (exit 0; nothing is changed)",
    )
    tl = tsub.add_parser("list", parents=[common], help="list topics")
    tl.add_argument("--internal", action="store_true", help="include internal topics")
    tl.add_argument("--json", action="store_true", help="a JSON list of names")
    d = tsub.add_parser(
        "describe",
        parents=[common],
        help="describe topics (all by default): partitions, then every config and its source",
    )
    d.add_argument("topics", nargs="*", type=topic_name)
    d.add_argument("--json", action="store_true")
    only = d.add_mutually_exclusive_group()
    only.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions with a replica out of the ISR (no configs printed)",
    )
    only.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="only partitions without a live leader (no configs printed)",
    )
    only.add_argument(
        "--under-min-isr-partitions",
        action="store_true",
        help="only partitions whose ISR is smaller than the topic's min.insync.replicas "
        "(acks=all writes to them fail; no configs printed)",
    )
    rm = tsub.add_parser("delete", parents=[common], help="delete topics and their data")
    rm.add_argument("topics", nargs="+", type=topic_name)
    rm.add_argument(
        "--if-exists",
        action="store_true",
        help="a topic that does not exist is no error (it is named on stderr, exit 0)",
    )
    a = tsub.add_parser("alter", parents=[common], help="change configs or add partitions")
    a.add_argument("topic", type=topic_name)
    a.add_argument(
        "--set",
        "--config",
        dest="set",
        action="append",
        metavar="KEY=VALUE",
        help="set a config (--config too, as `topics create` and Kafka's tools take it)",
    )
    a.add_argument("--delete", action="append", metavar="KEY", help="reset a config")
    a.add_argument(
        "--partitions", type=int_at_least(1, maximum=INT32_MAX), help="new (larger) partition count"
    )
    ap = tsub.add_parser(
        "add-partitions", parents=[common], help="grow a topic to a larger partition count"
    )
    ap.add_argument("topic", type=topic_name)
    ap.add_argument(
        "--partitions",
        type=int_at_least(1, maximum=INT32_MAX),
        required=True,
        help="the new total (larger than now)",
    )
    ap.add_argument(
        "--replica-assignment",
        metavar="ID:ID,ID:ID,...",
        help="where the new partitions go, as Kafka's tool takes it: one colon-separated list "
        "of node ids per NEW partition, preferred leader first, each as long as the topic's "
        "replication factor (1:2,2:3 places the next two partitions on nodes 1,2 and 2,3; a "
        "list for every partition, the existing ones' as they are, is taken too); default: "
        "the controller spreads them",
    )
    ap.add_argument("--validate-only", action="store_true")
    cf = tsub.add_parser(
        "configs", parents=[common], help="a topic's effective configs and where they come from"
    )
    cf.add_argument("topic", type=topic_name)
    cf.add_argument("--json", action="store_true")
    o = tsub.add_parser(
        "offsets",
        parents=[common],
        help="earliest and latest offsets per partition (or the offset at --time)",
    )
    o.add_argument("topics", nargs="+", type=topic_name)
    o.add_argument(
        "--partition", type=int, action="append", help="only this partition (repeatable)"
    )
    o.add_argument(
        "--time",
        type=_time_spec,
        help="earliest, latest, max (largest timestamp), ms since the epoch or ISO 8601 "
        "(2024-05-01T12:00:00Z; without a timezone: local time): the first offset at or "
        "after it",
    )
    o.add_argument(
        "--json",
        action="store_true",
        help="a JSON list, one object per partition asked for; one that could not be looked "
        'up has its offsets null and an "error" ({"code", "message"}; null for the '
        "others), and the exit status is 1",
    )
    dr = tsub.add_parser(
        "delete-records",
        parents=[common],
        help="delete a topic's records below an offset (offsets are not reused)",
    )
    dr.add_argument("topic", type=topic_name)
    dr.add_argument(
        "--partition", type=int, action="append", help="only this partition (repeatable)"
    )
    which = dr.add_mutually_exclusive_group(required=True)
    which.add_argument("--before", type=_offset, metavar="OFFSET", help="delete below OFFSET")
    which.add_argument(
        "--all", action="store_true", help="delete every committed record (up to the end)"
    )
    e = tsub.add_parser(
        "elect-leaders",
        parents=[common],
        help="move leadership to preferred replicas (or --unclean: elect any live replica)",
    )
    e.add_argument("topics", nargs="*", type=topic_name, help="default: every topic")
    e.add_argument(
        "--partition",
        type=int_at_least(0, maximum=INT32_MAX),
        action="append",
        help="only this partition of the one topic given (repeatable)",
    )
    e.add_argument(
        "--path-to-json-file",
        dest="election_file",
        metavar="FILE",
        help='the partitions, as kafka-leader-election takes them: {"partitions":[{"topic":T,'
        '"partition":P}]} (no topics then)',
    )
    e.add_argument(
        "--unclean",
        action="store_true",
        help="for partitions without a leader, elect a live replica out of the ISR (may lose data)",
    )
    r = tsub.add_parser(
        "reassign",
        parents=[common],
        help="move partitions to other replicas (one, or a --plan file), or cancel moves",
    )
    r.add_argument("topic", nargs="?", type=topic_name, help="the partition's topic (one move)")
    r.add_argument("--partition", type=int_at_least(0, maximum=INT32_MAX))
    r.add_argument("--replicas", metavar="ID,ID,...", help="target replicas, preferred first")
    r.add_argument(
        "--cancel",
        action="store_true",
        help="cancel the move in progress (with --plan: every move of the plan in progress)",
    )
    reassign.add_arguments(r)
    ra = tsub.add_parser(
        "reassignments", parents=[common], help="list partition reassignments in progress"
    )
    ra.add_argument("topics", nargs="*", type=topic_name, help="default: every topic")


def add_cluster_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cl = sub.add_parser("cluster", help="cluster information")
    csub = cl.add_subparsers(dest="cluster_cmd", metavar="ACTION")
    csub.required = True
    d = csub.add_parser("describe", parents=[common], help="cluster id, controller, nodes")
    d.add_argument("--json", action="store_true")
    c = csub.add_parser(
        "configs",
        parents=[common],
        help="a storage node's static configs, or the cluster's dynamic ones (the replication "
        "throttle rates, the services' log levels) and changing them",
    )
    c.add_argument(
        "node",
        nargs="?",
        type=int_at_least(0),
        help="node id: its static configs; without it, the dynamic configs every node applies",
    )
    c.add_argument(
        "--alter",
        action="store_true",
        help="change the dynamic configs (Kafka's kafka-configs --entity-default --alter); "
        "implied by --set and --delete",
    )
    c.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="set a dynamic config of every node, e.g. "
        f"{reassignplan.LEADER_RATE}=10MiB (a rate in bytes/s: 1048576, 10MiB or 5MB), or "
        "log.level=debug (every service's log level at run time; log.level.<logger>=LEVEL "
        "for one logger, e.g. log.level.strom.storage.replication=debug)",
    )
    c.add_argument(
        "--delete",
        action="append",
        metavar="KEY",
        help="remove a dynamic config (a throttle rate: no limit; a log level: the level "
        "each service started at)",
    )
    c.add_argument("--json", action="store_true")
