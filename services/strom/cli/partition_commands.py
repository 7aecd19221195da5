"""The ``strom topics`` commands that act on partitions: ``offsets``, ``delete-records``,
``elect-leaders``, ``reassign`` and ``reassignments``, with what they share (the partitions
a command names, its ``--timeout``, and the per-partition errors it prints).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from strom.api import common_pb2
from strom.argtypes import UsageError
from strom.cli import reassign, reassignplan
from strom.cli.topic_listing import _ids
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.types import TopicPartition
from strom.errors import ERRORS, ElectionNotNeededError, PartialResultError, StromError, error_for


def _partitions_of(admin: Admin, topics: list[str], only: list[int] | None) -> list[TopicPartition]:
    """The topics' partitions, or just ``only`` of each (unknown ones fail in the lookup)."""
    if only:
        return [TopicPartition(t, p) for t in topics for p in dict.fromkeys(only)]
    return [tp for d in admin.describe_topics(topics).values() for tp in d.topic_partitions]


def _within_timeout(admin: Admin, client: ClusterClient, args: argparse.Namespace) -> Admin:
    """``admin``, or with ``--timeout`` one whose calls end a little before the command's
    timer ends the process: a partition that cannot be answered (no live leader) is then
    reported with the others' answers, instead of the timer's "no result" blaming the
    cluster."""
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
    looked up (exit 1), as Kafka's kafka-get-offsets. With ``--json`` every partition asked
    for is a row; a refused one has its ``error`` (code and message) and null offsets, so a
    script reading the JSON does not take a partial answer for a whole one."""
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
    partition refused (exit 1), as Kafka's kafka-delete-records."""
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
                # "2,,3" is a typo, not [2, 3].
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
