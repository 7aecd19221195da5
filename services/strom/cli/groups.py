"""``strom groups list|describe|delete|delete-offsets|reset-offsets``: consumer groups from
the shell, as Kafka's ``kafka-consumer-groups.sh`` does it.

The commands are the Admin client's group calls (``list_groups``, ``describe_groups``,
``list_group_offsets``, ``alter_group_offsets``, ``delete_group_offsets``,
``delete_groups``; their coordinator calls are in :mod:`strom.client.group_admin`, which
``describe --json`` uses to print the coordinator's answer whole). Offsets are reset with an
admin OffsetCommit (member epoch -1), which the coordinator accepts only while the group has
no members, so a reset never races consumers; without ``--execute`` the command only prints
what it would do (a dry run, like Kafka's tool).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from strom.api import coordinator_pb2
from strom.argtypes import UsageError, group_id, iso_time_ms
from strom.cli import counted
from strom.cli.admin import answering_client
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.group_admin import (
    GroupListingIncompleteError,
    describe_group,
    group_state,
    non_empty_error,
    partition_lag,
)
from strom.client.offsets import EARLIEST, LATEST, list_offsets
from strom.client.types import TopicPartition
from strom.controlchars import CONTROL_CHARS
from strom.errors import (
    ErrorCode,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    StromError,
    error_for,
)

E = ErrorCode


#: Exit status of ``groups list`` when some coordinator shards did not answer.
INCOMPLETE = 2
#: Control characters and the backslash that escapes them.
_UNPRINTABLE = re.compile(rf"[{CONTROL_CHARS}\\]")


def shown(name: str) -> str:
    """A name as the text output prints it: control characters escaped (``\\x00``), and the
    backslash too so an escape cannot be forged. Coordinators refuse such ids, but older
    ones stored them."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", name)


def add_groups_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    groups = sub.add_parser(
        "groups", help="list, describe, delete consumer groups; delete or reset their offsets"
    )
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
    d = gsub.add_parser(
        "describe",
        parents=[common],
        help="members, offsets and lag",
        description="Members, committed offsets, log end offsets and lag (log end minus "
        "committed, as Kafka's tool computes it). A negative lag is a committed offset past "
        "the log end (records deleted or expired, a reset past the end, the topic created "
        "again): the group's next fetch there gets OFFSET_OUT_OF_RANGE and resets by its "
        "auto.offset.reset; it is shown as is and named on stderr. With --json an unknown "
        "lag is null.",
    )
    d.add_argument("group", nargs="*", type=group_id, help="one or more groups")
    d.add_argument(
        "--all-groups",
        action="store_true",
        help="every group (Kafka's --all-groups); with --json a list, one object per group",
    )
    d.add_argument("--json", action="store_true")
    rm = gsub.add_parser("delete", parents=[common], help="delete groups without members")
    rm.add_argument("group", nargs="+", type=group_id)
    do = gsub.add_parser(
        "delete-offsets",
        parents=[common],
        help="delete a group's committed offsets of some topics (Kafka's --delete-offsets)",
        description="Delete the group's committed offsets of the topics given (of every "
        "partition it committed, or only those listed). Refused for a topic some member of "
        "the group is subscribed to (GROUP_SUBSCRIBED_TO_TOPIC: its offsets are kept, exit 1); "
        "the other topics' offsets are deleted. Prints each partition and the offset deleted.",
    )
    do.add_argument("group", type=group_id)
    do.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="TOPIC[:P,P...]",
        help="topic (optionally only some partitions); repeatable",
    )
    r = gsub.add_parser(
        "reset-offsets",
        parents=[common],
        help="set a group's committed offsets (dry run unless --execute)",
    )
    r.add_argument("group", type=group_id)
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,P...]",
        help="topic (optionally only some partitions); repeatable",
    )
    which.add_argument(
        "--all-topics",
        action="store_true",
        help="every partition the group has committed an offset for (as Kafka's tool)",
    )
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument(
        "--to-current",
        action="store_true",
        help="to the committed offset (Kafka's --to-current); a partition with nothing "
        "committed is set to its latest offset, as Kafka's tool does (said on stderr)",
    )
    how.add_argument("--to-offset", type=int, metavar="OFFSET")
    how.add_argument(
        "--to-datetime",
        metavar="ISO8601",
        help="e.g. 2024-05-01T12:00:00Z; without a timezone it is local time, as in Kafka",
    )
    how.add_argument(
        "--to-duration",
        metavar="PnDTnHnMnS",
        help="to the first offset at or after this long ago (ISO 8601 duration, as Kafka's "
        "tool takes it: PT1H, P1DT12H, PT30M, PT0.5S)",
    )
    how.add_argument(
        "--by-duration",
        metavar="PnDTnHnMnS",
        help="the same as --to-duration, under the name Kafka's kafka-consumer-groups uses",
    )
    how.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="from the committed offset; a partition with nothing committed shifts from its "
        "earliest offset (Kafka's tool refuses it; the command says so on stderr)",
    )
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="apply (default: dry run)")
    mode.add_argument(
        "--dry-run", action="store_true", help="only print the plan (the default, as Kafka's)"
    )


def run_groups(args: argparse.Namespace, out: Any) -> int:
    if args.groups_cmd in ("reset-offsets", "delete-offsets"):  # before connecting
        for spec in args.topic or ():
            _topic_spec(spec)
    if args.groups_cmd == "reset-offsets":
        if args.to_datetime is not None:
            _datetime_ms(args.to_datetime)
        flag = "--to-duration"
        if args.by_duration is not None:  # Kafka's name for it: one option from here on
            args.to_duration, flag = args.by_duration, "--by-duration"
        if args.to_duration is not None:
            duration_ms(args.to_duration, flag)
    if args.groups_cmd == "describe" and bool(args.all_groups) == bool(args.group):
        raise UsageError("give a group (or several) or --all-groups")
    with answering_client(args.bootstrap) as client:
        return int(_COMMANDS[args.groups_cmd](client, args, out) or 0)


def _admin(client: ClusterClient) -> Admin:
    """The Admin on the command's connections (its calls are the groups' API)."""
    return Admin(cluster_client=client)


def _describe_group(client: ClusterClient, group: str) -> coordinator_pb2.DescribedGroup:
    """The coordinator's answer as is: ``describe --json`` prints every field of it."""
    return describe_group(
        client, group, include_offsets=True, timeout_s=client.timeout_s, retry_s=client.retry_s
    )


# -- commands ----------------------------------------------------------------------------------


def _list(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    incomplete: GroupListingIncompleteError | None = None
    try:
        groups = _admin(client).list_groups()
    except GroupListingIncompleteError as exc:
        incomplete, groups = exc, exc.groups
    if args.json:
        rows = [{"group": g.group_id, "state": g.state, "members": g.member_count} for g in groups]
        print(json.dumps(rows), file=out)
    else:
        for g in groups:
            print(f"{shown(g.group_id)}\t{g.state}\t{g.member_count} members", file=out)
    if incomplete is not None:
        # On stderr with its own exit status: on stdout it made the --json output invalid
        # JSON, and a script could not tell a partial list from a whole one (found from
        # outside).
        print(f"strom groups list: {incomplete.message}", file=sys.stderr)
        return INCOMPLETE
    return 0


def _describe(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """One group (a JSON object with --json), or several and ``--all-groups`` (a JSON list)."""
    code = 0
    names = list(dict.fromkeys(args.group))
    if args.all_groups:
        try:
            names = [g.group_id for g in _admin(client).list_groups()]
        except GroupListingIncompleteError as exc:
            names = [g.group_id for g in exc.groups]
            print(f"strom groups describe: {exc.message}", file=sys.stderr)
            code = INCOMPLETE
    described = []
    for name in names:
        d = _describe_group(client, name)
        if d.error_code != E.NONE:
            raise error_for(d.error_code, d.error_message)
        described.append(d)
    if args.json:
        from strom.cli.jsonout import message_dict

        rows = []
        for d in described:
            got = message_dict(d)
            got["state"] = group_state(d.state)  # as `list` and the text say it ("Empty")
            for o, row in zip(d.offsets, got.get("offsets", []), strict=True):
                row["lag"] = _lag_of(o)  # signed; null = unknown (-1 was ambiguous)
            rows.append(got)
        single = not args.all_groups and len(args.group) == 1
        print(json.dumps(rows[0] if single else rows, indent=2), file=out)
    else:
        for i, d in enumerate(described):
            if i:
                print(file=out)
            _print_group(d, out)
    _warn_past_end(described)
    return code


def _lag_of(o: coordinator_pb2.GroupPartitionOffset) -> int | None:
    """The partition's lag from its committed and end offsets (:func:`partition_lag`): the
    answer's own ``lag`` field cannot tell -1 from unknown, and older coordinators clamped a
    negative lag to 0."""
    return partition_lag(o.committed_offset, o.end_offset)


def _warn_past_end(described: list[coordinator_pb2.DescribedGroup]) -> None:
    """Name on stderr every partition whose committed offset is past its log end, so that a
    negative lag in the table or the JSON is not taken for a typo."""
    for d in described:
        for o in d.offsets:
            lag = _lag_of(o)
            if lag is not None and lag < 0:
                print(
                    f"strom groups describe: warning: group {d.group_id} {o.topic}-{o.partition}: "
                    f"committed offset {o.committed_offset} is past the log end "
                    f"{o.end_offset} (lag {lag}): its next fetch gets OFFSET_OUT_OF_RANGE and "
                    "resets by auto.offset.reset",
                    file=sys.stderr,
                )


def _print_group(d: coordinator_pb2.DescribedGroup, out: Any) -> None:
    print(
        f"group {shown(d.group_id)}: {group_state(d.state)}, epoch {d.group_epoch}, "
        f"assignor {d.assignor_name}, {len(d.members)} members",
        file=out,
    )
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER")]
    for o in d.offsets:
        lag = _lag_of(o)
        rows.append(
            (
                o.topic,
                str(o.partition),
                "-" if o.committed_offset < 0 else str(o.committed_offset),
                "-" if o.end_offset < 0 else str(o.end_offset),
                "-" if lag is None else str(lag),
                shown(o.member_id) or "-",
            )
        )
    _table(rows, out)
    for m in d.members:
        # A partition the member must still give up is its own until it reports it revoked.
        held = [
            f"{tp.topic}-{p}" for tp in m.assignment.topic_partitions for p in tp.partitions
        ] + [
            f"{tp.topic}-{p} (revoking)"
            for tp in m.partitions_pending_revocation.topic_partitions
            for p in tp.partitions
        ]
        parts = ", ".join(held)
        who = f"{shown(m.member_id)} ({shown(m.client_id)}@{shown(m.client_host)})"
        print(f"member {who}: {parts or '-'}", file=out)


def _delete(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    admin = _admin(client)
    failed = 0
    for gid in args.group:
        try:
            admin.delete_groups([gid])
        except StromError as exc:
            failed += 1
            # On stderr, as every failure of the CLI, not among the deleted groups.
            print(f"strom groups: error: group {gid}: {exc}", file=sys.stderr)
        else:
            print(f"deleted group {gid}", file=out)
    return 1 if failed else 0


def _delete_offsets(client: ClusterClient, args: argparse.Namespace, out: Any) -> int:
    """Kafka's ``--delete-offsets``: each topic's offsets deleted with one call, so that a
    topic the group's members are subscribed to (refused by the coordinator, which checks it
    atomically with the deletion) is told apart from the others, which are deleted."""
    admin = _admin(client)
    committed = {
        tp: om.offset for tp, om in admin.list_group_offsets(args.group).items() if om is not None
    }
    if not committed:
        admin.describe_groups([args.group])  # GroupIdNotFoundError for an unknown group
    wanted: dict[str, list[TopicPartition]] = {}
    for spec in args.topic:
        topic, partitions = _topic_spec(spec)
        if partitions is None:
            tps = [tp for tp in committed if tp.topic == topic]
        else:
            tps = [TopicPartition(topic, p) for p in partitions]
        wanted[topic] = list(dict.fromkeys([*wanted.get(topic, []), *tps]))
    rows = [("TOPIC", "PARTITION", "OFFSET", "STATUS")]
    deleted = refused = 0
    for topic, tps in wanted.items():
        if not tps:
            print(f"group {args.group} has no committed offsets of topic {topic}", file=out)
            continue
        try:
            admin.delete_group_offsets(args.group, tps)
        except GroupSubscribedToTopicError:
            refused += 1
            print(
                f"strom groups delete-offsets: error: group {args.group} has members "
                f"subscribed to topic {topic}: its offsets are kept (stop the members, or "
                "let them unsubscribe, first) (GroupSubscribedToTopicError)",
                file=sys.stderr,
            )
            status = "refused: subscribed"
        else:
            status = "deleted"
            deleted += sum(tp in committed for tp in tps)
        for tp in tps:
            offset = committed.get(tp)
            what = "nothing committed" if offset is None and status == "deleted" else status
            rows.append((topic, str(tp.partition), "-" if offset is None else str(offset), what))
    if len(rows) > 1:
        _table(rows, out)
    print(f"deleted {counted(deleted, 'offset')} of group {args.group}", file=out)
    return 1 if refused else 0


def _topic_spec(spec: str) -> tuple[str, list[int] | None]:
    """``--topic TOPIC[:P,P...]`` as (topic, partitions or None for all); UsageError."""
    topic, colon, parts = spec.partition(":")
    if not topic.strip():
        raise UsageError(f"--topic {spec!r}: the topic name must not be empty")
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


_DURATION = re.compile(
    r"P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def duration_ms(text: str, flag: str = "--to-duration") -> int:
    """``--to-duration`` (or ``--by-duration``, ``flag``: the one named in errors), an ISO
    8601 duration (``PT1H``, ``P1DT12H``: Kafka's form, read by Java's ``Duration.parse``),
    in ms; UsageError naming the form for anything else."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or not any(m.groupdict().values()) or text.strip().upper().endswith("T"):
        raise UsageError(
            f"{flag} {text!r} is not an ISO 8601 duration PnDTnHnMnS, e.g. PT1H "
            "(an hour ago), P1DT12H, PT30M"
        )
    unit_ms = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000}
    return round(sum(float(v) * unit_ms[k] for k, v in m.groupdict().items() if v))


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
    to_current: bool = False,
    notes: list[str] | None = None,
) -> dict[TopicPartition, int]:
    """The new offset of each partition, clamped to [earliest, latest] as Kafka's tool does.

    ``by_time`` holds the ListOffsets answers for ``--to-datetime`` (-1 = no record that late:
    the end). A shift from a partition with nothing committed starts from its earliest offset;
    ``to_current`` keeps the committed offset, or sets the latest where there is none (Kafka's
    ``--to-current``).
    ``notes`` gets a line for each offset moved into the log and each such shift, in Kafka's
    words: a clamp used to go unsaid, so ``--to-offset 7`` silently set the end (found from
    outside).
    """
    out: dict[TopicPartition, int] = {}
    said = notes if notes is not None else []
    for tp in tps:
        lo, hi = earliest[tp], latest[tp]
        if to_earliest:
            new = lo
        elif to_offset is not None:
            new = to_offset
        elif to_current:
            if tp not in committed:
                said.append(
                    f"{tp.topic}-{tp.partition}: no committed offset; setting its latest "
                    f"offset ({hi}), as Kafka's tool does"
                )
            new = committed.get(tp, hi)
        elif shift_by is not None:
            if tp not in committed:
                said.append(
                    f"{tp.topic}-{tp.partition}: no committed offset to shift; shifting from "
                    f"its earliest offset ({lo})"
                )
            new = committed.get(tp, lo) + shift_by
        elif by_time is not None:
            found = by_time.get(tp, -1)
            new = hi if found < 0 else found
        else:
            new = hi
        if new > hi:
            said.append(
                f"{tp.topic}-{tp.partition}: New offset ({new}) is higher than latest offset "
                f"({hi}); value will be set to {hi}"
            )
        elif new < lo:
            said.append(
                f"{tp.topic}-{tp.partition}: New offset ({new}) is lower than earliest offset "
                f"({lo}); value will be set to {lo}"
            )
        out[tp] = min(max(new, lo), hi)
    return out


def _reset(client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    admin = _admin(client)
    try:
        d = admin.describe_groups([args.group])[args.group]
    except GroupIdNotFoundError:
        pass  # a reset creates it
    else:
        if d.members:  # refused before the dry run too: its plan could not be applied
            raise non_empty_error(args.group, len(d.members))
    committed = {
        tp: om.offset for tp, om in admin.list_group_offsets(args.group).items() if om is not None
    }
    tps = list(committed) if args.all_topics else _topic_partitions(client, args.topic)
    if not tps:
        print(f"group {args.group} has no committed offsets: nothing to reset", file=out)
        return

    def lookup(spec: int) -> dict[TopicPartition, int]:
        found = list_offsets(
            client, client.cache, dict.fromkeys(tps, spec), timeout_s=client.retry_s, backoff_s=0.1
        )
        return {tp: r.offset for tp, r in found.items()}

    earliest, latest = lookup(EARLIEST), lookup(LATEST)
    by_time = None
    if args.to_datetime:
        by_time = lookup(_datetime_ms(args.to_datetime))
    elif args.to_duration:
        by_time = lookup(int(time.time() * 1000) - duration_ms(args.to_duration))
    notes: list[str] = []
    plan = plan_reset(
        tps,
        committed=committed,
        earliest=earliest,
        latest=latest,
        by_time=by_time,
        to_offset=args.to_offset,
        shift_by=args.shift_by,
        to_earliest=args.to_earliest,
        to_current=args.to_current,
        notes=notes,
    )
    for note in notes:  # on stderr, as Kafka's tool warns: stdout stays the table
        print(f"strom groups reset-offsets: {note}", file=sys.stderr)
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET")]
    for tp in tps:
        cur = committed.get(tp)
        rows.append((tp.topic, str(tp.partition), "-" if cur is None else str(cur), str(plan[tp])))
    _table(rows, out)
    if not args.execute:
        print("(dry run: nothing changed; add --execute to apply)", file=out)
        return
    admin.alter_group_offsets(args.group, plan)
    print(f"reset {len(plan)} offsets of group {args.group}", file=out)


def _table(rows: list[tuple[str, ...]], out: Any) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


_COMMANDS = {
    "list": _list,
    "describe": _describe,
    "delete": _delete,
    "delete-offsets": _delete_offsets,
    "reset-offsets": _reset,
}
