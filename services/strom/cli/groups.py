"""``strom groups list|describe|delete|reset-offsets``: consumer groups from the shell, as
Kafka's ``kafka-consumer-groups.sh`` does it.

The commands talk to the group coordinators directly (FindCoordinator on a storage node for
one group; every shard's owner, FindCoordinator with ``all_shards``, for ``list``). Offsets are
reset with an admin OffsetCommit (member epoch -1), which the coordinator accepts only while
the group has no members, so a reset never races consumers; without ``--execute`` the command
only prints what it would do (a dry run, like Kafka's tool).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc

from strom.api import coordinator_pb2, coordinator_pb2_grpc
from strom.argtypes import UsageError, iso_time_ms
from strom.client.cluster import ClusterClient, older_node
from strom.client.offsets import EARLIEST, LATEST, list_offsets
from strom.client.types import TopicPartition
from strom.errors import (
    COORDINATOR_REFRESH_CODES,
    CoordinatorNotAvailableError,
    ErrorCode,
    NonEmptyGroupError,
    StromError,
    error_for,
)

E = ErrorCode
_RETRY = (*COORDINATOR_REFRESH_CODES, E.COORDINATOR_LOAD_IN_PROGRESS, E.REQUEST_TIMED_OUT)
_STATES = {
    coordinator_pb2.GROUP_STATE_EMPTY: "Empty",
    coordinator_pb2.GROUP_STATE_ASSIGNING: "Assigning",
    coordinator_pb2.GROUP_STATE_RECONCILING: "Reconciling",
    coordinator_pb2.GROUP_STATE_STABLE: "Stable",
    coordinator_pb2.GROUP_STATE_DEAD: "Dead",
}


#: Exit status of ``groups list`` when some coordinator shards did not answer.
INCOMPLETE = 2


def add_groups_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    groups = sub.add_parser("groups", help="list, describe, delete consumer groups, reset offsets")
    gsub = groups.add_subparsers(dest="groups_cmd", metavar="ACTION")
    gsub.required = True
    ls = gsub.add_parser(
        "list",
        parents=[common],
        help="every group, from every coordinator",
        description="Every group, from every coordinator. When some coordinator shards do not "
        "answer, the groups found are printed, a warning goes to stderr and the exit status is "
        f"{INCOMPLETE} (stdout stays plain rows or, with --json, one JSON array).",
    )
    ls.add_argument("--json", action="store_true")
    d = gsub.add_parser("describe", parents=[common], help="members, offsets and lag")
    d.add_argument("group")
    d.add_argument("--json", action="store_true")
    rm = gsub.add_parser("delete", parents=[common], help="delete groups without members")
    rm.add_argument("group", nargs="+")
    r = gsub.add_parser(
        "reset-offsets",
        parents=[common],
        help="set a group's committed offsets (dry run unless --execute)",
    )
    r.add_argument("group")
    r.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="TOPIC[:P,P...]",
        help="topic (optionally only some partitions); repeatable",
    )
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument("--to-offset", type=int, metavar="OFFSET")
    how.add_argument(
        "--to-datetime",
        metavar="ISO8601",
        help="e.g. 2024-05-01T12:00:00Z; without a timezone it is local time, as in Kafka",
    )
    how.add_argument("--shift-by", type=int, metavar="N", help="from the committed offset")
    r.add_argument("--execute", action="store_true", help="apply (default: dry run)")


def run_groups(args: argparse.Namespace, out: Any) -> int:
    if args.groups_cmd == "reset-offsets":  # bad arguments: a usage error, before connecting
        for spec in args.topic:
            _topic_spec(spec)
        if args.to_datetime is not None:
            _datetime_ms(args.to_datetime)
    with ClusterClient(args.bootstrap) as client:
        return int(_COMMANDS[args.groups_cmd](client, args, out) or 0)


# -- coordinator calls -------------------------------------------------------------------------


def _find(client: ClusterClient, group: str) -> str | None:
    try:
        return client.find_coordinator(group)
    except CoordinatorNotAvailableError:
        return None


def _call(client: ClusterClient, group: str, method: str, req: Any, code_of: Any = None) -> Any:
    """A CoordinatorService call for ``group`` on its coordinator, retried while the
    coordinator moves or loads. ``code_of(resp)`` picks the group-level error code."""
    code_of = code_of or (lambda r: r.error_code)
    deadline = time.monotonic() + client.retry_s
    last = "no coordinator"
    while True:
        addr = _find(client, group)
        if addr is not None:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(addr))
            try:
                resp = getattr(stub, method)(req, timeout=client.timeout_s)
            except grpc.RpcError as exc:
                if (old := older_node(exc, addr, method)) is not None:
                    raise old from None
                last = f"{addr}: {exc.code().name}"
            else:
                code = code_of(resp)
                if code not in _RETRY:
                    return resp
                last = f"{addr}: {ErrorCode.Name(code)}"
        if time.monotonic() >= deadline:
            raise StromError(f"no coordinator answered for group {group!r} ({last})")
        time.sleep(0.2)


def _describe_group(client: ClusterClient, group: str) -> coordinator_pb2.DescribedGroup:
    req = coordinator_pb2.DescribeGroupsRequest(group_ids=[group], include_offsets=True)
    resp = _call(client, group, "DescribeGroups", req, lambda r: r.groups[0].error_code)
    return resp.groups[0]


# -- commands ----------------------------------------------------------------------------------


def _list(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    # Every shard's owner from FindCoordinator, not DescribeCluster: that needs DESCRIBE on
    # the cluster, and listing only DESCRIBE on the groups listed (found from outside).
    owners = client.coordinator_shards()
    addresses = sorted({a for a in owners.values() if a is not None})
    groups: dict[str, coordinator_pb2.ListedGroup] = {}
    shards: set[int] = set()
    for addr in addresses:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(addr))
        try:
            resp = stub.ListGroups(coordinator_pb2.ListGroupsRequest(), timeout=client.timeout_s)
        except grpc.RpcError:
            continue
        shards.update(resp.shards)
        for g in resp.groups:
            groups[g.group_id] = g
    owned = set(owners)  # a shard with no owner right now is missing from the list too
    if args.json:
        rows = [
            {"group": g.group_id, "state": _STATES.get(g.state, "?"), "members": g.member_count}
            for _, g in sorted(groups.items())
        ]
        print(json.dumps(rows), file=out)
    else:
        for gid, g in sorted(groups.items()):
            print(f"{gid}\t{_STATES.get(g.state, '?')}\t{g.member_count} members", file=out)
    if owned - shards or not addresses:
        # On stderr with its own exit status: on stdout it made the --json output invalid
        # JSON, and a script could not tell a partial list from a whole one (found from
        # outside).
        missing = sorted(owned - shards)
        print(
            "strom groups list: incomplete: some coordinator shards are not available"
            + (f" (shards {missing})" if missing else ""),
            file=sys.stderr,
        )
        return INCOMPLETE
    return 0


def _describe(client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    d = _describe_group(client, args.group)
    if d.error_code != E.NONE:
        raise error_for(d.error_code, d.error_message)
    if args.json:
        from strom.cli.jsonout import message_dict

        got = message_dict(d)
        got["state"] = _STATES.get(d.state, "?")  # as `list` and the text say it ("Empty")
        print(json.dumps(got, indent=2), file=out)
        return
    print(
        f"group {d.group_id}: {_STATES.get(d.state, '?')}, epoch {d.group_epoch}, "
        f"assignor {d.assignor_name}, {len(d.members)} members",
        file=out,
    )
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER")]
    for o in d.offsets:
        rows.append(
            (
                o.topic,
                str(o.partition),
                "-" if o.committed_offset < 0 else str(o.committed_offset),
                "-" if o.end_offset < 0 else str(o.end_offset),
                "-" if o.lag < 0 else str(o.lag),
                o.member_id or "-",
            )
        )
    _table(rows, out)
    for m in d.members:
        # A partition the member must still give up is its own until it reports it revoked
        # (found from outside: such a partition was on no member line).
        held = [
            f"{tp.topic}-{p}" for tp in m.assignment.topic_partitions for p in tp.partitions
        ] + [
            f"{tp.topic}-{p} (revoking)"
            for tp in m.partitions_pending_revocation.topic_partitions
            for p in tp.partitions
        ]
        parts = ", ".join(held)
        print(f"member {m.member_id} ({m.client_id}@{m.client_host}): {parts or '-'}", file=out)


def _delete(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    failed = 0
    for gid in args.group:
        req = coordinator_pb2.DeleteGroupsRequest(group_ids=[gid])
        r = _call(client, gid, "DeleteGroups", req, lambda r: r.results[0].error_code).results[0]
        if r.error_code == E.NONE:
            print(f"deleted group {gid}", file=out)
        else:
            failed += 1
            # On stderr, as every failure of the CLI: they were on stdout among the deleted
            # groups (found from outside).
            print(
                f"strom groups: error: group {gid}: {ErrorCode.Name(r.error_code)} "
                f"{r.error_message}".rstrip(),
                file=sys.stderr,
            )
    return 1 if failed else 0


def _topic_spec(spec: str) -> tuple[str, list[int] | None]:
    """``--topic TOPIC[:P,P...]`` as (topic, partitions or None for all); UsageError."""
    topic, colon, parts = spec.partition(":")
    if not colon:
        return topic, None
    items = [p.strip() for p in parts.split(",")]
    if not all(p.isdigit() for p in items):
        raise UsageError(
            f"--topic {spec!r}: after the colon comes a list of partition numbers, "
            "e.g. orders:0,2 (or just the topic for all its partitions)"
        )
    return topic, [int(p) for p in items]


def _topic_partitions(client: ClusterClient, specs: list[str]) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    for spec in specs:
        topic, partitions = _topic_spec(spec)
        count = client.partition_count(topic)
        wanted: Sequence[int] = range(count) if partitions is None else partitions
        for p in wanted:
            if not 0 <= p < count:
                raise ValueError(f"topic {topic!r} has no partition {p} (it has {count})")
            out.append(TopicPartition(topic, p))
    return list(dict.fromkeys(out))  # "orders:0,0" once, not two rows for one partition


def _datetime_ms(text: str) -> int:
    """--to-datetime in ms: without a timezone, local time (Kafka's reset tool's rule, and
    ``topics offsets --time``'s)."""
    try:
        return iso_time_ms(text)
    except ValueError as exc:
        raise UsageError(f"--to-datetime {exc}") from None


def plan_reset(
    tps: list[TopicPartition],
    *,
    committed: dict[TopicPartition, int],
    earliest: dict[TopicPartition, int],
    latest: dict[TopicPartition, int],
    by_time: dict[TopicPartition, int] | None = None,
    to_offset: int | None = None,
    shift_by: int | None = None,
    to_earliest: bool = False,
) -> dict[TopicPartition, int]:
    """The new offset of each partition, clamped to [earliest, latest] as Kafka's tool does.

    ``by_time`` holds the ListOffsets answers for ``--to-datetime`` (-1 = no record that late:
    the end). A shift from a partition with nothing committed starts from its earliest offset.
    """
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        lo, hi = earliest[tp], latest[tp]
        if to_earliest:
            new = lo
        elif to_offset is not None:
            new = to_offset
        elif shift_by is not None:
            new = committed.get(tp, lo) + shift_by
        elif by_time is not None:
            found = by_time.get(tp, -1)
            new = hi if found < 0 else found
        else:
            new = hi
        out[tp] = min(max(new, lo), hi)
    return out


def _reset(client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    d = _describe_group(client, args.group)
    if d.error_code not in (E.NONE, E.GROUP_ID_NOT_FOUND):
        raise error_for(d.error_code, d.error_message)
    if d.error_code == E.NONE and d.members:
        raise NonEmptyGroupError(
            f"group {args.group!r} has {len(d.members)} active members: stop them first "
            "(offsets can only be reset while the group is empty)"
        )
    tps = _topic_partitions(client, args.topic)
    committed = {
        TopicPartition(o.topic, o.partition): o.committed_offset
        for o in d.offsets
        if o.committed_offset >= 0
    }

    def lookup(spec: int) -> dict[TopicPartition, int]:
        found = list_offsets(
            client, client.cache, dict.fromkeys(tps, spec), timeout_s=client.retry_s, backoff_s=0.1
        )
        return {tp: r.offset for tp, r in found.items()}

    earliest, latest = lookup(EARLIEST), lookup(LATEST)
    by_time = lookup(_datetime_ms(args.to_datetime)) if args.to_datetime else None
    plan = plan_reset(
        tps,
        committed=committed,
        earliest=earliest,
        latest=latest,
        by_time=by_time,
        to_offset=args.to_offset,
        shift_by=args.shift_by,
        to_earliest=args.to_earliest,
    )
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET")]
    for tp in tps:
        cur = committed.get(tp)
        rows.append((tp.topic, str(tp.partition), "-" if cur is None else str(cur), str(plan[tp])))
    _table(rows, out)
    if not args.execute:
        print("(dry run: nothing changed; add --execute to apply)", file=out)
        return
    req = coordinator_pb2.OffsetCommitRequest(group_id=args.group, member_epoch=-1)
    topics: dict[str, Any] = {}
    for tp, offset in sorted(plan.items()):
        if tp.topic not in topics:
            topics[tp.topic] = req.topics.add(topic=tp.topic)
        topics[tp.topic].partitions.add(
            partition=tp.partition, committed_offset=offset, committed_leader_epoch=-1
        )
    resp = _call(client, args.group, "OffsetCommit", req)
    if resp.error_code != E.NONE:
        raise error_for(resp.error_code, resp.error_message)
    for t in resp.topics:
        for p in t.partitions:
            if p.error_code != E.NONE:
                raise error_for(p.error_code, f"{t.topic}-{p.partition}: {p.error_message}")
    print(f"reset {len(plan)} offsets of group {args.group}", file=out)


def _table(rows: list[tuple[str, ...]], out: Any) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


_COMMANDS = {"list": _list, "describe": _describe, "delete": _delete, "reset-offsets": _reset}
