"""``strom topics ...`` and ``strom cluster ...``: cluster administration from the shell.

The commands are thin over :class:`strom.client.admin.Admin`, so the CLI and Python programs
check arguments, route requests and report errors the same way. Only the ``--json`` forms of
``topics describe`` and ``cluster describe`` print the controller's answer as it comes (its
proto JSON), which scripts may already parse.

This module holds the commands' dispatch (``run_topics``, ``run_cluster``), their connection
(``controller_client``, ``answering_client``) and the commands that create, delete and alter
topics and describe the cluster; the rest is in modules named after what they hold:
:mod:`strom.cli.admin_parser` (the argparse parsers), :mod:`strom.cli.topic_listing`
(``topics list`` and ``describe``), :mod:`strom.cli.partition_commands` (``offsets``,
``delete-records``, ``elect-leaders``, ``reassign``, ``reassignments``) and
:mod:`strom.cli.configs` (``topics configs``, ``cluster configs``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from strom.api import common_pb2, controller_pb2
from strom.argtypes import INT32_MAX, UsageError
from strom.cli import counted, reassign
from strom.cli.admin_parser import _kv, add_cluster_parser, add_topics_parser
from strom.cli.configs import _cluster_configs, _configs, _node_config_changes
from strom.cli.jsonout import message_json
from strom.cli.partition_commands import (
    _delete_records,
    _elect_leaders,
    _election_scope,
    _offsets,
    _reassign,
    _reassignments,
    _replicas,
)
from strom.cli.topic_listing import MinIsr, PartitionCondition, PartitionFilter, _describe, _list
from strom.client.admin import DEFAULT_API_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS, Admin
from strom.client.cluster import ClusterClient
from strom.errors import TopicAlreadyExistsError, error_for

# The parsers and the describe filters live in their own modules; their documented import
# paths stay strom.cli.admin's.
__all__ = [
    "MinIsr",
    "PartitionCondition",
    "PartitionFilter",
    "add_cluster_parser",
    "add_topics_parser",
    "answering_client",
    "controller_client",
    "replica_lists",
    "run_cluster",
    "run_topics",
]


def controller_client(bootstrap: str | None) -> ClusterClient:
    """The connection of a command that calls the controller, with the Admin client's own
    default timeouts (30 s an attempt, 60 s a call): an attempt must outlast the
    controller's wait for its view to show a write (VIEW_WAIT_S), else it is cut off just
    before the answer and the retry of `strom topics create` finds the topic it created."""
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
    answers fails as theirs do (``no strom node answered at ...``), not after FindCoordinator's
    single pass over the nodes."""
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


def _delete(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Delete the topics in one request and say what became of each: the deleted ones on
    stdout, the others on stderr (exit 1): the controller deletes every topic it can even
    when another one fails."""
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
    both are validated by the controller (validate_only) before either is applied. Only a
    change made by someone else between the check and the write can still fail the second
    step; the first one's line is then already printed.
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


def run_cluster(args: argparse.Namespace, out: Any) -> int:
    if args.cluster_cmd == "configs":
        _node_config_changes(args)  # usage errors before connecting
    with controller_client(args.bootstrap) as client:
        admin = Admin(cluster_client=client)
        if args.cluster_cmd == "configs":
            return _cluster_configs(admin, args, out)
        if args.json:
            # With the coordinators' shards.
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
