"""``strom topics ...`` and ``strom cluster ...``: cluster administration from the shell.

The commands are thin over :class:`strom.client.admin.Admin`, so the CLI and Python programs
check arguments, route requests and report errors the same way. Only the ``--json`` forms of
``topics describe`` and ``cluster describe`` print the controller's answer as it comes (its
proto JSON), which scripts may already parse.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from strom.api import common_pb2, controller_pb2
from strom.argtypes import (
    INT32_MAX,
    UsageError,
    byte_size,
    int_at_least,
    iso_time_ms,
    topic_name,
)
from strom.cli import counted, reassign, reassignplan
from strom.cli.jsonout import message_dict, message_json
from strom.client.admin import (
    DEFAULT_API_TIMEOUT_MS,
    DEFAULT_REQUEST_TIMEOUT_MS,
    Admin,
    ConfigEntry,
    OffsetSpec,
    PartitionInfo,
    TopicDescription,
)
from strom.client.admin_requests import partition_info, replication_factor_of
from strom.client.cluster import ClusterClient
from strom.client.types import TopicPartition
from strom.errors import (
    ERRORS,
    ElectionNotNeededError,
    InvalidConfigError,
    PartialResultError,
    StromError,
    TopicAlreadyExistsError,
    error_for,
)

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


def controller_client(bootstrap: str | None) -> ClusterClient:
    """The connection of a command that calls the controller, with the Admin client's own
    default timeouts (30 s an attempt, 60 s a call).

    FIX (found from outside): the commands used ClusterClient's defaults, 10 s an attempt,
    no more than the controller's wait for its view to show a write (VIEW_WAIT_S): when the
    view lagged, the attempt was cut off just before the answer and the retry of `strom topics
    create` reported TOPIC_ALREADY_EXISTS for the topic the same command had just created."""
    return ClusterClient(
        bootstrap,
        timeout_s=DEFAULT_REQUEST_TIMEOUT_MS / 1000,
        retry_s=DEFAULT_API_TIMEOUT_MS / 1000,
    )


@contextlib.contextmanager
def answering_client(bootstrap: str | None) -> Iterator[ClusterClient]:
    """The connection of a command that asks the group or transaction coordinators, once a
    storage node has answered: nodes are asked again until the clients' API timeout (or the
    command's ``--timeout``), as every other admin command does, and a cluster that never
    answers fails as theirs do (``no strom node answered at ...``).

    FIX (found from outside): these commands find the coordinators with FindCoordinator, one
    pass over the nodes, so with nothing answering ``strom groups list`` failed in a second
    (``no strom node answered FindCoordinator``), ``groups describe`` after 15 s, and neither
    ever gave the ``--timeout`` message the README promised."""
    with controller_client(bootstrap) as client:
        client.metadata(skip_topics=True)
        yield client


def _check_usage(args: argparse.Namespace) -> None:
    """UsageError for arguments argparse cannot check alone, before any connection."""
    if args.topics_cmd == "create":
        _kv(args.config, "--config")
    elif args.topics_cmd == "alter":
        if args.partitions is None and not args.set and not args.delete:
            raise UsageError("nothing to alter: give --set, --delete or --partitions")
        _kv(args.set, "--set")
    elif args.topics_cmd == "reassign":
        if reassign.check_usage(args) == "single":
            _replicas(args)
    elif args.topics_cmd == "elect-leaders":
        _election_scope(args)
    elif args.topics_cmd == "add-partitions" and args.replica_assignment is not None:
        replica_lists(args.replica_assignment)


def run_topics(args: argparse.Namespace, out: Any) -> int:
    _check_usage(args)
    with controller_client(args.bootstrap) as client:
        admin = Admin(cluster_client=client)
        return _TOPIC_COMMANDS[args.topics_cmd](admin, client, args, out) or 0


def _create(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    try:
        t = admin.create_topic(
            args.topic,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            config=_kv(args.config, "--config"),
            validate_only=args.validate_only,
        )
    except TopicAlreadyExistsError:
        if not args.if_not_exists:
            raise
        print(f"topic {args.topic} already exists (--if-not-exists: left as it is)", file=out)
        return
    verb = "would create" if args.validate_only else "created"
    print(
        f"{verb} topic {t.name} ({counted(t.partitions, 'partition')}, replication factor "
        f"{t.replication_factor})",
        file=out,
    )


def _list(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    names = admin.list_topics(internal=args.internal)
    if args.json:  # as the other list commands take it (found from outside)
        print(json.dumps(sorted(names)), file=out)
        return
    for name in names:
        print(name, file=out)


#: A partition filter of ``topics describe``: whether the topic's partition is to be shown.
PartitionFilter = Callable[[str, PartitionInfo], bool]


@dataclass(frozen=True)
class PartitionCondition:
    """A ``topics describe`` partition filter and the flag its rows carry first: each row
    says which condition it met (found from outside: ``--under-min-isr-partitions`` rows said
    only "(under-replicated)")."""

    flag: str
    test: PartitionFilter


class MinIsr:
    """Each topic's effective min.insync.replicas (its override, else the default), asked
    once per topic: what a partition's ISR is held against to be marked ``under-min-isr``."""

    def __init__(self, admin: Admin) -> None:
        self._admin = admin
        self._known: dict[str, int] = {}

    def learn(self, topic: str, configs: dict[str, ConfigEntry]) -> None:
        """Take it from configs already described (the unfiltered listing prints them)."""
        self._known[topic] = _min_isr_value(configs)

    def __call__(self, topic: str) -> int:
        if topic not in self._known:
            configs = self._admin.describe_configs(topic, names=["min.insync.replicas"])
            self._known[topic] = _min_isr_value(configs)
        return self._known[topic]


def _min_isr_value(configs: dict[str, ConfigEntry]) -> int:
    entry = configs.get("min.insync.replicas")
    return int(entry.value or 1) if entry is not None else 1


def _partition_filter(
    args: argparse.Namespace, min_isr: Callable[[str], int]
) -> PartitionCondition | None:
    """The filter of Kafka's ``kafka-topics --describe`` flags, None without one. The ISR of
    ``--under-min-isr-partitions`` is held against ``min_isr(topic)``."""
    if args.under_replicated_partitions:
        return PartitionCondition("under-replicated", lambda _topic, p: p.under_replicated)
    if args.unavailable_partitions:
        return PartitionCondition("offline", lambda _topic, p: p.offline)
    if not args.under_min_isr_partitions:
        return None
    return PartitionCondition("under-min-isr", lambda topic, p: len(p.isr) < min_isr(topic))


def _describe(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    min_isr = MinIsr(admin)
    wanted = _partition_filter(args, min_isr)
    if wanted is not None:
        _describe_filtered(client, args, wanted, min_isr, out)
        return
    if args.json:
        # The controller's answer as is (a stable shape for scripts), each partition with
        # the conditions the text marks.
        resp = _described(client, args.topics)
        topics = []
        for t in resp.topics:
            configs = admin.describe_configs(t.name)
            min_isr.learn(t.name, configs)
            d = _topic_dict(t, t.partitions, min_isr(t.name))
            # Every effective config with where its value comes from (default or topic).
            d["config_entries"] = [
                {"name": e.name, "value": e.value, "source": str(e.source)}
                for e in configs.values()
            ]
            topics.append(d)
        print(json.dumps(topics, indent=2), file=out)
        return
    for t in admin.describe_topics(args.topics or None).values():
        configs = admin.describe_configs(t.name)
        min_isr.learn(t.name, configs)
        _print_topic(t, min_isr(t.name), out)
        print("\tConfigs (value and source: topic override or strom default):", file=out)
        for e in configs.values():
            value = "(sensitive)" if e.sensitive else ("-" if e.value is None else e.value)
            print(f"\t\t{e.name}={value}\t({e.source})", file=out)


def _topic_dict(t: Any, partitions: Any, min_isr: int) -> dict[str, Any]:
    """A DescribeTopics topic as ``--json`` prints it: the controller's fields, and each
    partition's ``conditions`` (the flags the text rows end with, e.g. ``under-min-isr``),
    so that a script need not work them out again."""
    d = message_dict(t)
    d["partitions"] = []
    infos = []
    for p in partitions:
        row = message_dict(p)
        info = partition_info(p)
        infos.append(info)
        row["conditions"] = _conditions(info, min_isr)
        d["partitions"].append(row)
    meta = d.get("metadata")
    if isinstance(meta, dict) and infos:
        # The count the text shows (a reassignment may have changed it; found from outside:
        # the JSON kept the count chosen at creation), that one kept beside it.
        created = t.metadata.replication_factor
        meta["created_replication_factor"] = created
        meta["replication_factor"] = replication_factor_of(created, tuple(infos))
    return d


def _described(client: ClusterClient, topics: list[str]) -> Any:
    """The controller's DescribeTopics answer for ``topics`` (all when empty); the first
    topic it refused raises its error."""
    resp = client.controller_call(
        "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=topics)
    )
    failed = [t for t in resp.topics if t.error_code]
    if failed:
        raise error_for(failed[0].error_code, failed[0].error_message or failed[0].name)
    return resp


def _describe_filtered(
    client: ClusterClient,
    args: argparse.Namespace,
    wanted: PartitionCondition,
    min_isr: Callable[[str], int],
    out: Any,
) -> None:
    """``topics describe`` with a partition filter: as Kafka's tool, only the partitions that
    match, each line naming its topic (no topic lines, no configs; nothing when none
    matches). With ``--json`` the controller's answer, each topic's partitions filtered and
    the topics without a match left out. Each line's flags start with the condition met."""
    resp = _described(client, args.topics)
    rows = []
    for t in resp.topics if args.topics else sorted(resp.topics, key=lambda t: t.name):
        shown = [p for p in t.partitions if wanted.test(t.name, partition_info(p))]
        if not shown:
            continue
        if args.json:
            rows.append(_topic_dict(t, shown, min_isr(t.name)))
            continue
        for p in shown:
            line = _partition_line(partition_info(p), min_isr(t.name), met=wanted.flag)
            print(f"Topic: {t.name}\t{line}", file=out)
    if args.json:
        print(json.dumps(rows, indent=2), file=out)


def _delete(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Delete the topics in one request and say what became of each: the deleted ones on
    stdout, the others on stderr (exit 1). The controller deletes every topic it can even
    when another one fails; the command printed only the first failure, and the topics it
    had deleted went unmentioned (found from outside)."""
    names = list(dict.fromkeys(args.topics))
    resp = client.controller_call(
        "DeleteTopics",
        controller_pb2.DeleteTopicsRequest(
            topics=names, timeout_ms=max(1, admin.request_timeout_ms * 4 // 5)
        ),
    )
    failed = 0
    for r in resp.topics:
        if r.error_code == common_pb2.ErrorCode.NONE:
            print(f"deleted topic {r.name}", file=out)
            continue
        exc = error_for(r.error_code, r.error_message or None)
        text = exc.message if repr(r.name) in exc.message else f"topic {r.name!r}: {exc.message}"
        if args.if_exists and r.error_code == common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            print(f"strom topics: topic {r.name} does not exist (--if-exists)", file=sys.stderr)
            continue
        failed += 1
        print(f"strom topics: error: {text} ({type(exc).__name__})", file=sys.stderr)
    return 1 if failed else 0


def _alter(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    """Change configs and grow the partition count, all or nothing (docs/topic-configs.md):
    both are validated by the controller (validate_only) before either is applied.

    FIX (found from outside): the config change was applied first and the partition increase
    second, so ``--set retention.ms=4242 --partitions 2`` on a topic of 2 partitions failed
    (INVALID_PARTITIONS, exit 1) with retention.ms changed. Only a change made by someone else
    between the check and the write can still fail the second step; the first one's line is
    then already printed.
    """
    configs = bool(args.set or args.delete)
    settings = _kv(args.set, "--set")
    if configs:
        admin.alter_configs(args.topic, set=settings, delete=args.delete, validate_only=True)
    if args.partitions is not None:
        admin.create_partitions(args.topic, args.partitions, validate_only=True)
    if configs:
        admin.alter_configs(args.topic, set=settings, delete=args.delete)
        print(f"altered configs of topic {args.topic}", file=out)
    if args.partitions is not None:
        admin.create_partitions(args.topic, args.partitions)
        print(f"topic {args.topic} now has {counted(args.partitions, 'partition')}", file=out)


def replica_lists(text: str) -> list[list[int]]:
    """``--replica-assignment 1:2,2:3``: a list of node ids for each partition (Kafka's
    syntax); UsageError naming the part that is not one, or a node given twice in a list."""
    flag = f"--replica-assignment {text!r}"
    lists: list[list[int]] = []
    for i, part in enumerate(text.split(",")):
        ids = [x.strip() for x in part.split(":")]
        if not all(x.isdigit() for x in ids):
            raise UsageError(
                f"{flag}: list {i + 1} ({part.strip()!r}) is not node ids joined by ':' "
                "(one list per new partition, separated by ',', e.g. 1:2,2:3)"
            )
        nodes = [int(x) for x in ids]
        if any(n > INT32_MAX for n in nodes):
            raise UsageError(f"{flag}: node ids are 0 to {INT32_MAX}")
        if len(set(nodes)) != len(nodes):
            raise UsageError(f"{flag}: list {i + 1} ({part.strip()!r}) names a node twice")
        lists.append(nodes)
    return lists


def _new_assignment(admin: Admin, args: argparse.Namespace) -> dict[int, list[int]] | None:
    """``--replica-assignment`` keyed by the new partitions' numbers (the Admin API's form).
    One list per partition added; or, as Kafka's tool also takes it, one per partition of
    the grown topic, whose lists for the existing partitions must be their replicas now
    (they are not moved: UsageError naming `topics reassign`). Any other count is a
    UsageError saying how many lists are wanted."""
    if args.replica_assignment is None:
        return None
    lists = replica_lists(args.replica_assignment)
    topic = admin.describe_topic(args.topic)
    now = topic.partition_count
    added = args.partitions - now
    if added <= 0:
        return None  # the controller refuses the count, saying why (INVALID_PARTITIONS)
    if len(lists) == args.partitions:
        for p in topic.partitions:
            if list(p.replicas) != lists[p.partition]:
                raise UsageError(
                    f"--replica-assignment: list {p.partition + 1} "
                    f"({':'.join(map(str, lists[p.partition]))}) is for existing partition "
                    f"{p.partition}, whose replicas are {':'.join(map(str, p.replicas))}: "
                    "adding partitions does not move existing ones (`strom topics reassign` "
                    "does); give one list per new partition"
                )
        lists = lists[now:]
    if len(lists) != added:
        raise UsageError(
            f"--replica-assignment has {counted(len(lists), 'list')} but topic {args.topic} "
            f"grows from {now} to {args.partitions} partitions: give one list per new "
            f"partition ({added})"
        )
    return {now + i: nodes for i, nodes in enumerate(lists)}


def _add_partitions(
    admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any
) -> None:
    """Grow the topic; with ``--replica-assignment``, on the nodes given. A count that does
    not grow is left to the controller's refusal (INVALID_PARTITIONS), which says why."""
    admin.create_partitions(
        args.topic,
        args.partitions,
        replica_assignment=_new_assignment(admin, args),
        validate_only=args.validate_only,
    )
    if args.validate_only:
        print(f"topic {args.topic} can grow to {counted(args.partitions, 'partition')}", file=out)
    else:
        print(f"topic {args.topic} now has {counted(args.partitions, 'partition')}", file=out)


def _configs(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    _print_configs(admin.describe_configs(args.topic), args.json, out)


def _print_configs(entries: dict[str, Any], as_json: bool, out: Any) -> None:
    if as_json:
        print(
            json.dumps(
                [{**e._asdict(), "source": str(e.source)} for e in entries.values()], indent=2
            ),
            file=out,
        )
        return
    for e in entries.values():
        value = "(sensitive)" if e.sensitive else ("-" if e.value is None else e.value)
        flags = " read-only" if e.read_only else ""
        print(f"{e.name}={value}\t({e.source}{flags})", file=out)


def _partitions_of(admin: Admin, topics: list[str], only: list[int] | None) -> list[TopicPartition]:
    """The topics' partitions, or just ``only`` of each (unknown ones fail in the lookup)."""
    if only:
        return [TopicPartition(t, p) for t in topics for p in dict.fromkeys(only)]
    return [tp for d in admin.describe_topics(topics).values() for tp in d.topic_partitions]


def _within_timeout(admin: Admin, client: ClusterClient, args: argparse.Namespace) -> Admin:
    """``admin``, or with ``--timeout`` one whose calls end a little before the command's
    timer ends the process: a partition that cannot be answered (no live leader) is then
    reported with the others' answers, instead of the timer's "no result" blaming the
    cluster (found from outside)."""
    give_up_at = getattr(args, "give_up_at", None)
    if give_up_at is None:
        return admin
    left_ms = (give_up_at - time.monotonic()) * 1000
    # Room for the last attempt's answer and the printing: a tenth, at least half a second.
    budget = max(1, round(left_ms - max(500.0, left_ms / 10)))
    return Admin(
        cluster_client=client,
        request_timeout_ms=min(admin.request_timeout_ms, budget),
        default_api_timeout_ms=budget,
    )


V = TypeVar("V")
#: What an Admin call over partitions returned, and what it refused, by partition.
_Outcome = tuple[dict[TopicPartition, V], dict[TopicPartition, StromError]]


def _per_partition(call: Callable[[], dict[TopicPartition, V]]) -> _Outcome[V]:
    """What ``call`` (an Admin call over partitions) returned and what it refused, by
    partition: a PartialResultError keeps the partitions done, which are printed too."""
    try:
        return call(), {}
    except PartialResultError as exc:
        return dict(exc.results), dict(exc.errors)


def _print_refused(errors: dict[TopicPartition, StromError], args: argparse.Namespace) -> int:
    """One line on stderr per partition refused (its code, message and class, as the
    command's own errors read); the exit status: 1 if any."""
    for exc in errors.values():
        print(f"strom {args.command}: error: {exc} ({type(exc).__name__})", file=sys.stderr)
    return 1 if errors else 0


def _offsets(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Print each partition's offsets, and one error line per partition that could not be
    looked up (exit 1), as Kafka's kafka-get-offsets: found from outside, one partition
    without a live leader printed nothing for the healthy ones. With ``--json`` every
    partition asked for is a row; a refused one has its ``error`` (code and message) and
    null offsets (found from outside: it was only on stderr, so a script reading the JSON
    took a partial answer for a whole one)."""
    tps = _partitions_of(admin, list(dict.fromkeys(args.topics)), args.partition)
    if args.time is None:
        rows, errors = _earliest_and_latest(admin, client, args, tps)
    else:
        rows, errors = _offsets_at(admin, client, args, tps)
    if args.json:
        for tp, row in rows.items():
            exc = errors.get(tp)
            row["error"] = None if exc is None else {"code": exc.name, "message": exc.message}
        print(json.dumps(list(rows.values()), indent=2), file=out)
    else:
        for tp, row in rows.items():
            if tp not in errors:
                print(_offsets_line(row, args.time is None), file=out)
    out.flush()
    return _print_refused({tp: errors[tp] for tp in tps if tp in errors}, args)


#: Per partition asked for, in order: its ``topics offsets`` row (offsets None if refused),
#: and the partitions refused with why.
_OffsetRows = tuple[dict[TopicPartition, dict[str, Any]], dict[TopicPartition, StromError]]


def _earliest_and_latest(
    admin: Admin, client: ClusterClient, args: argparse.Namespace, tps: list[TopicPartition]
) -> _OffsetRows:
    """Each partition's earliest and latest offsets (-1 for no answer from the node)."""
    earliest, errors = _per_partition(
        lambda: _within_timeout(admin, client, args).list_offsets(dict.fromkeys(tps, "earliest"))
    )
    # Only where "earliest" answered: a partition without a leader is waited for once.
    latest, later = _per_partition(
        lambda: (
            _within_timeout(admin, client, args).list_offsets(dict.fromkeys(earliest, "latest"))
            if earliest
            else {}
        )
    )
    errors.update(later)
    rows = {}
    for tp in tps:
        e, la = earliest.get(tp), latest.get(tp)
        done = tp not in errors
        rows[tp] = {
            "topic": tp.topic,
            "partition": tp.partition,
            "earliest": (e.offset if e else -1) if done else None,
            "latest": (la.offset if la else -1) if done else None,
        }
    return rows, errors


def _offsets_at(
    admin: Admin, client: ClusterClient, args: argparse.Namespace, tps: list[TopicPartition]
) -> _OffsetRows:
    """Each partition's first offset at or after ``--time`` (None: no such record)."""
    found, errors = _per_partition(
        lambda: _within_timeout(admin, client, args).list_offsets(dict.fromkeys(tps, args.time))
    )
    rows = {}
    for tp in tps:
        hit = found.get(tp)
        rows[tp] = {
            "topic": tp.topic,
            "partition": tp.partition,
            "offset": hit.offset if hit else None,
            "timestamp": hit.timestamp if hit and hit.timestamp >= 0 else None,
        }
    return rows, errors


def _offsets_line(row: dict[str, Any], bounds: bool) -> str:
    """One partition of ``topics offsets`` as text: earliest and latest, or the offset at
    ``--time``."""
    head = f"Topic: {row['topic']}\tPartition: {row['partition']}"
    if bounds:
        return f"{head}\tEarliest: {row['earliest']}\tLatest: {row['latest']}"
    offset = "none" if row["offset"] is None else row["offset"]
    ts = "-" if row["timestamp"] is None else row["timestamp"]
    return f"{head}\tOffset: {offset}\tTimestamp: {ts}"


def _delete_records(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Print the new low watermark of each partition deleted, then one error line per
    partition refused (exit 1), as Kafka's kafka-delete-records: found from outside, a
    refusal was all it printed while the other partitions' records were gone."""
    tps = _partitions_of(admin, [args.topic], args.partition)
    before: int | Literal["latest"] = "latest" if args.all else args.before
    low, errors = _per_partition(
        lambda: _within_timeout(admin, client, args).delete_records(dict.fromkeys(tps, before))
    )
    for tp in tps:
        if tp in low:
            print(f"{tp.topic}-{tp.partition}: low watermark {low[tp]}", file=out)
    out.flush()
    return _print_refused(errors, args)


def _elect_leaders(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Run the elections; print each new leader on stdout and each failed election on stderr
    (its code and why), and exit 1 if any failed, as Kafka's kafka-leader-election does.
    ELECTION_NOT_NEEDED (the wanted leader already leads) is no failure.

    FIX (found from outside): with the preferred replica down the command printed
    "PREFERRED_LEADER_NOT_AVAILABLE PREFERRED_LEADER_NOT_AVAILABLE", then "elected 0
    leader(s)", and exited 0, so scripts took the failed election for a success.
    """
    results = admin.elect_leaders(_election_scope(args), unclean=args.unclean)
    elected = failed = 0
    for tp, r in results.items():
        if r.error is None:
            elected += 1
            print(
                f"{tp.topic}-{tp.partition}: leader {r.leader} (epoch {r.leader_epoch})", file=out
            )
        elif not isinstance(r.error, ElectionNotNeededError):
            failed += 1
            detail = r.error.message.removeprefix(f"{tp.topic}-{tp.partition}: ")
            if detail == r.error.name:  # a controller that sends only the code's name
                info = ERRORS.get(r.error.code) if r.error.code is not None else None
                detail = info.description if info else ""
            print(f"{tp.topic}-{tp.partition}: {r.error.name} {detail}".rstrip(), file=sys.stderr)
    print(
        f"elected {elected} leader(s)" + (f"; {failed} election(s) failed" if failed else ""),
        file=out,
    )
    return 1 if failed else 0


def _election_scope(args: argparse.Namespace) -> list[TopicPartition | str] | None:
    """What ``elect-leaders`` elects: the partitions of ``--path-to-json-file``, the
    ``--partition``s of the one topic given, the topics given, or None (every partition);
    UsageError for a mix."""
    if args.election_file is not None:
        if args.topics or args.partition:
            given = "a topic" if args.topics else "--partition"
            raise UsageError(f"--path-to-json-file does not take {given} (the file names them)")
        text = reassign.read_file(args.election_file, "--path-to-json-file")
        return list(reassignplan.parse_election_file(text))
    if args.partition:
        if len(args.topics) != 1:
            raise UsageError("--partition needs exactly one topic")
        return [TopicPartition(args.topics[0], p) for p in dict.fromkeys(args.partition)]
    return list(args.topics) or None


def _replicas(args: argparse.Namespace) -> list[int]:
    """The node ids of ``--replicas`` ([] with ``--cancel``); UsageError when not exactly one
    of them is given or the list is not node ids."""
    if args.cancel == bool(args.replicas):
        raise UsageError("give either --replicas ID,ID,... or --cancel")
    replicas: list[int] = []
    if args.replicas:
        try:
            parts = args.replicas.split(",")
            if any(not x.strip() for x in parts):
                # Found from outside: "2,,3" was taken as [2, 3] without a word.
                raise ValueError("an empty entry")
            replicas = [int(x) for x in parts]
        except ValueError:
            raise UsageError(f"--replicas {args.replicas!r} is not a list of node ids") from None
        if not all(0 <= r < 2**31 for r in replicas):
            raise UsageError(f"--replicas {args.replicas!r}: node ids are 0 to 2147483647")
    return replicas


def _reassign(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """One partition's move (or its cancel); with --plan or --generate, a whole plan's."""
    if reassign.check_usage(args) != "single":
        return reassign.run(admin, args, out)
    replicas = _replicas(args)
    tp = TopicPartition(args.topic, args.partition)
    admin.alter_partition_reassignments({tp: None if args.cancel else replicas})
    if args.cancel:
        print(f"cancelled the reassignment of {args.topic}-{args.partition}", file=out)
    else:
        print(
            f"reassigning {args.topic}-{args.partition} to replicas {','.join(map(str, replicas))}",
            file=out,
        )
    return 0


def _reassignments(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    wanted = set(args.topics)
    known = set(admin.list_topics(internal=True)) if wanted else set()
    missing = sorted(wanted - known)
    if missing:
        raise error_for(
            common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"unknown topic {', '.join(repr(t) for t in missing)}",
        )
    moving = {
        tp: r
        for tp, r in admin.list_partition_reassignments().items()
        if not wanted or tp.topic in wanted
    }
    for tp, r in moving.items():
        print(
            f"{tp.topic}-{tp.partition}\treplicas {_ids(r.replicas)}\t"
            f"adding {_ids(r.adding_replicas)}\tremoving {_ids(r.removing_replicas)}",
            file=out,
        )
    print(f"{len(moving)} reassignment(s) in progress", file=out)


def _ids(ids: Any) -> str:
    return ",".join(map(str, ids)) or "-"


# A command returns its exit status, or None for 0.
_TOPIC_COMMANDS: dict[
    str, Callable[[Admin, ClusterClient, argparse.Namespace, Any], int | None]
] = {
    "create": _create,
    "list": _list,
    "describe": _describe,
    "delete": _delete,
    "alter": _alter,
    "add-partitions": _add_partitions,
    "configs": _configs,
    "offsets": _offsets,
    "delete-records": _delete_records,
    "elect-leaders": _elect_leaders,
    "reassign": _reassign,
    "reassignments": _reassignments,
}


def _print_topic(t: TopicDescription, min_isr: int, out: Any) -> None:
    overrides = ", ".join(f"{k}={v}" for k, v in sorted(t.configs.items())) or "-"
    print(
        f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitions: {t.partition_count}\t"
        f"ReplicationFactor: {t.replication_factor}\tConfigs: {overrides}",
        file=out,
    )
    for p in t.partitions:
        print(f"\t{_partition_line(p, min_isr)}", file=out)


def _conditions(p: PartitionInfo, min_isr: int) -> list[str]:
    """The conditions a partition is marked with (what the filters of ``topics describe``
    select): found from outside, the unfiltered listing did not mark an ISR smaller than
    min.insync.replicas (acks=all writes failing) though ``--under-min-isr-partitions``
    listed it."""
    found = []
    if p.under_replicated:
        found.append("under-replicated")
    if p.offline:
        found.append("offline")
    if len(p.isr) < min_isr:
        found.append("under-min-isr")
    if p.reassigning:
        found.append("reassigning")
    if p.recovering:
        found.append("recovering")
    return found


def _partition_line(p: PartitionInfo, min_isr: int, met: str | None = None) -> str:
    """A partition as ``topics describe`` prints it (Kafka's fields, then strom's flags;
    ``met``, the condition a filtered listing showed it for, first)."""
    flags = [met] if met else []
    for c in _conditions(p, min_isr):
        if c == "reassigning":
            adding, removing = _ids(p.adding_replicas), _ids(p.removing_replicas)
            flags.append(f"reassigning: adding {adding} removing {removing}")
        elif c != met:
            flags.append(c)
    return (
        f"Partition: {p.partition}\tLeader: {'none' if p.leader is None else p.leader}\t"
        f"Epoch: {p.leader_epoch}\t"
        f"Replicas: {','.join(map(str, p.replicas))}\t"
        f"Isr: {','.join(map(str, p.isr))}"
        + (f"\tOffline: {','.join(map(str, p.offline_replicas))}" if p.offline_replicas else "")
        + (f"\t({', '.join(flags)})" if flags else "")
    )


def _node_config_changes(args: argparse.Namespace) -> tuple[dict[str, str], list[str]] | None:
    """``cluster configs``' --set/--delete as (set, delete), None when it only lists;
    UsageError for flags that do not fit together or a rate that is not a size, before any
    connection."""
    if not (args.alter or args.set or args.delete):
        return None
    if not (args.set or args.delete):
        raise UsageError("--alter needs --set KEY=VALUE or --delete KEY")
    if args.node is not None:
        raise UsageError(
            "--set/--delete change the dynamic configs of every node: give no node id "
            "(a node's static configs are its startup flags)"
        )
    if args.json:
        raise UsageError("--json goes with a listing, not with --set/--delete")
    settings = _kv(args.set, "--set")
    for key, value in settings.items():
        if key.endswith(".rate"):
            try:
                settings[key] = str(byte_size(value))
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--set {key}: {exc}") from None
    both = sorted(set(settings) & set(args.delete or ()))
    if both:
        raise UsageError(f"--set and --delete both name {both[0]}")
    return settings, list(dict.fromkeys(args.delete or ()))


def _cluster_configs(admin: Admin, args: argparse.Namespace, out: Any) -> int:
    """``cluster configs``: a node's static configs, the dynamic ones every node applies
    (the replication throttle rates reassignments set: found from outside, no command
    showed or removed them), or a change to those (checked by the controller first, so
    an unknown name or bad value is a usage error, as for the flags)."""
    changes = _node_config_changes(args)
    if changes is None:
        if args.node is not None:
            entries = admin.describe_configs(node=args.node)
        else:
            entries = admin.describe_node_configs()
        _print_configs(entries, args.json, out)
        return 0
    settings, delete = changes
    try:
        admin.alter_node_configs(set=settings, delete=delete, validate_only=True)
    except InvalidConfigError as exc:
        raise UsageError(str(exc)) from None
    admin.alter_node_configs(set=settings, delete=delete)
    if settings:  # as stored: the controller normalises (warn -> warning, critical -> error)
        stored = admin.describe_node_configs()
        settings = {k: (stored[k].value if k in stored else v) or v for k, v in settings.items()}
    done = [f"set {k}={v}" for k, v in settings.items()] + [f"deleted {k}" for k in delete]
    print(f"altered the dynamic configs of every node: {', '.join(done)}", file=out)
    return 0


def run_cluster(args: argparse.Namespace, out: Any) -> int:
    if args.cluster_cmd == "configs":
        _node_config_changes(args)  # usage errors before connecting
    with controller_client(args.bootstrap) as client:
        admin = Admin(cluster_client=client)
        if args.cluster_cmd == "configs":
            return _cluster_configs(admin, args, out)
        if args.json:
            # With the coordinators' shards (found from outside: always empty before).
            resp = client.controller_call(
                "DescribeCluster", controller_pb2.DescribeClusterRequest(include_coordinators=True)
            )
            print(message_json(resp), file=out)
            return 0
        cluster = admin.describe_cluster()
        c = cluster.controller
        print(f"Cluster: {cluster.cluster_id}", file=out)
        if c is None:
            print("Controller: none (election in progress)", file=out)
        else:
            print(f"Controller: {c.node_id} at {c.host}:{c.port}", file=out)
        for n in cluster.nodes:
            print(
                f"Node {n.node_id}\t{n.host}:{n.port}\track={n.rack or '-'}\tstate={n.state}",
                file=out,
            )
        shards = client.controller_call(
            "DescribeCluster", controller_pb2.DescribeClusterRequest(include_coordinators=True)
        )
        for line in _coordinator_lines(shards):
            print(line, file=out)
    return 0


def _coordinator_lines(resp: Any) -> list[str]:
    """One line per coordinator: the group and transaction shards it owns (an operator sees
    at a glance whether the shards are spread)."""
    owned: dict[tuple[int, str], tuple[list[int], list[int]]] = {}
    for kind, entries in ((0, resp.coordinator_shards), (1, resp.transaction_shards)):
        for s in entries:
            owned.setdefault((s.coordinator_id, f"{s.host}:{s.port}"), ([], []))[kind].append(
                s.shard
            )
    lines = []
    for (ident, address), (groups, txns) in sorted(owned.items()):
        lines.append(
            f"Coordinator {ident}\t{address}\tgroup shards={_ranges(sorted(groups))}"
            f"\ttransaction shards={_ranges(sorted(txns))}"
        )
    return lines


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" ("-" when empty)."""
    if not numbers:
        return "-"
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)
