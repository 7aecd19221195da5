"""``strom topics reassign --plan FILE --execute|--verify|--cancel`` and ``--generate``:
whole reassignment plans, as ``kafka-reassign-partitions.sh`` takes them.

Over the Admin API (``alter_partition_reassignments``, ``list_partition_reassignments``,
``describe_topics``, ``describe_cluster``, ``elect_leaders``); the file formats, checks and
the generator are :mod:`strom.cli.reassignplan` (pure, unit-tested). Many partitions per
call, so draining a node of thousands of partitions needs no scripting of the Admin API.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from strom.argtypes import UsageError, byte_size
from strom.cli import reassignplan
from strom.cli.reassignplan import FOLLOWER_RATE, LEADER_RATE
from strom.client.admin import Admin, ConfigSource, PartitionInfo
from strom.client.types import TopicPartition
from strom.controller.placement import PlacementNode
from strom.errors import ElectionNotNeededError, PartialResultError, StromError

#: Partitions per AlterPartitionReassignments call: a plan of any size goes in calls of a
#: bounded message size, each answered within the request timeout.
BATCH = 1000

_SINGLE_FLAGS = (("topic", "a topic"), ("partition", "--partition"), ("replicas", "--replicas"))
_PLAN_ACTIONS = (("execute", "--execute"), ("verify", "--verify"), ("cancel", "--cancel"))
_THROTTLE_FLAGS = (
    ("throttle", "--throttle"),
    ("additional", "--additional"),
    ("preserve_throttles", "--preserve-throttles"),
)
_GENERATE_FLAGS = (
    ("topics_csv", "--topics"),
    ("topics_file", "--topics-to-move-json-file"),
    ("nodes", "--nodes"),
)


def add_arguments(r: argparse.ArgumentParser) -> None:
    """The plan flags of ``topics reassign`` (beside its one-partition form)."""
    r.add_argument(
        "--plan",
        "--reassignment-json-file",
        dest="plan",
        metavar="FILE",
        help='a reassignment plan in Kafka\'s JSON ({"version":1,"partitions":[{"topic":T,'
        '"partition":P,"replicas":[ID,...]}]}), with --execute, --verify or --cancel',
    )
    r.add_argument(
        "--execute",
        action="store_true",
        help="with --plan: print the current assignment (save it to roll back), then start "
        "every move of the plan",
    )
    r.add_argument(
        "--verify",
        action="store_true",
        help="with --plan: each partition done, in progress or not matching; exit 0 only "
        "when all are done",
    )
    r.add_argument(
        "--preferred",
        action="store_true",
        help="with --verify: elect the preferred (first) replica of every partition done",
    )
    r.add_argument(
        "--throttle",
        type=byte_size,
        metavar="RATE",
        help="with --execute: copy at most RATE bytes/s per node (10MiB, 5MB or bytes; "
        "Kafka's --throttle): sets the throttled replicas of the moving partitions' topics "
        "and the nodes' replication throttle rate; --execute --throttle again changes it",
    )
    r.add_argument(
        "--additional",
        action="store_true",
        help="with --execute: Kafka's flag for executing while moves are in progress (strom "
        "always allows it; with --throttle it changes a running move's rate)",
    )
    r.add_argument(
        "--preserve-throttles",
        action="store_true",
        help="with --verify or --cancel: leave the throttle configs and rate in place (by "
        "default --verify removes them once no move of the plan is in progress, --cancel "
        "once cancelled; a move still copying keeps its own)",
    )
    r.add_argument(
        "--generate",
        action="store_true",
        help="print the current assignment of --topics and a proposed one over --nodes "
        "(balanced, rack-aware, replication factor kept, replicas kept in place where the "
        "balance allows)",
    )
    r.add_argument("--topics", dest="topics_csv", metavar="T1,T2", help="with --generate")
    r.add_argument(
        "--topics-to-move-json-file",
        dest="topics_file",
        metavar="FILE",
        help='with --generate: Kafka\'s {"version":1,"topics":[{"topic":T}]}',
    )
    r.add_argument(
        "--nodes",
        "--broker-list",
        dest="nodes",
        metavar="ID,ID,...",
        help="with --generate: the nodes to place replicas on",
    )


def _given(args: argparse.Namespace, flags: Sequence[tuple[str, str]]) -> list[str]:
    return [name for dest, name in flags if getattr(args, dest, None) not in (None, False)]


def _refuse(args: argparse.Namespace, mode: str, flags: Sequence[tuple[str, str]]) -> None:
    given = _given(args, flags)
    if given:
        raise UsageError(f"{mode} does not take {given[0]}")


def check_usage(args: argparse.Namespace) -> str:
    """Which form of ``topics reassign`` the arguments are (``single``, ``plan`` or
    ``generate``); UsageError naming the flag that does not fit or what is wrong in a file,
    before any connection (the files are small next to the cluster calls: read twice)."""
    if args.generate:
        _refuse(args, "--generate", (*_SINGLE_FLAGS, ("plan", "--plan"), *_PLAN_ACTIONS))
        _refuse(args, "--generate", (("preferred", "--preferred"), *_THROTTLE_FLAGS))
        if len(_given(args, _GENERATE_FLAGS[:2])) != 1:
            raise UsageError("--generate needs one of --topics or --topics-to-move-json-file")
        if args.nodes is None:
            raise UsageError("--generate needs --nodes ID,ID,...")
        reassignplan.parse_node_list(args.nodes)
        if args.topics_file is not None:
            reassignplan.parse_topics_to_move(
                read_file(args.topics_file, "--topics-to-move-json-file")
            )
        else:
            _topic_list(args.topics_csv)
        return "generate"
    if args.plan is not None:
        _refuse(args, "--plan", (*_SINGLE_FLAGS, *_GENERATE_FLAGS))
        actions = _given(args, _PLAN_ACTIONS)
        if len(actions) != 1:
            raise UsageError("--plan needs one of --execute, --verify or --cancel")
        if args.preferred and not args.verify:
            raise UsageError("--preferred goes with --verify")
        if not args.execute:
            _refuse(args, f"{actions[0]}", _THROTTLE_FLAGS[:2])
        elif args.preserve_throttles:
            raise UsageError("--preserve-throttles goes with --verify or --cancel")
        reassignplan.parse_plan(read_file(args.plan, "--plan"))  # refused before connecting
        return "plan"
    _refuse(args, "a one-partition reassign", (*_GENERATE_FLAGS, *_PLAN_ACTIONS[:2]))
    _refuse(args, "a one-partition reassign", (("preferred", "--preferred"), *_THROTTLE_FLAGS))
    if args.topic is None or args.partition is None:
        raise UsageError("give a topic and --partition, or --plan FILE, or --generate")
    return "single"


def read_file(path: str, flag: str) -> str:
    """A file's text; UsageError naming the flag when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc})") from None


def run(admin: Admin, args: argparse.Namespace, out: Any) -> int:
    """``topics reassign`` with --plan or --generate; the exit status."""
    if args.generate:
        return _generate(admin, args, out)
    plan = reassignplan.parse_plan(read_file(args.plan, "--plan"))
    if args.execute:
        return _execute(admin, plan, out, args.throttle)
    if args.verify:
        return _verify(admin, plan, args.preferred, out, not args.preserve_throttles)
    return _cancel(admin, plan, out, not args.preserve_throttles)


def _described(admin: Admin, topics: Sequence[str]) -> dict[TopicPartition, PartitionInfo]:
    """The partitions of those of ``topics`` that exist (the others are left to the caller
    to name)."""
    known = set(admin.list_topics(internal=True))
    wanted = [t for t in dict.fromkeys(topics) if t in known]
    found = admin.describe_topics(wanted) if wanted else {}
    return {TopicPartition(t, p.partition): p for t, d in found.items() for p in d.partitions}


def _original(p: PartitionInfo) -> list[int]:
    """A partition's replicas before any move in progress, in their order then (what a
    rollback returns to, its first the preferred leader): during a move ``replicas`` holds
    the target's order first, so the order is the controller's ``original_replicas``, as a
    cancel uses it (strom.controller.leadership.original_replicas); a replica missing there
    keeps its place after the others."""
    adding = set(p.adding_replicas)
    kept = [r for r in p.replicas if r not in adding]
    order = {r: i for i, r in enumerate(p.original_replicas)}
    return sorted(kept, key=lambda r: order.get(r, len(order)))


def _say_error(tp: TopicPartition, exc: StromError) -> None:
    detail = exc.message.removeprefix(f"{tp.topic}-{tp.partition}: ")
    print(f"{tp.topic}-{tp.partition}: {exc.name} {detail}".rstrip(), file=sys.stderr)


def _alter(
    admin: Admin, moves: dict[TopicPartition, list[int] | None]
) -> dict[TopicPartition, StromError]:
    """Send ``moves`` in batches; every partition refused, with why."""
    items = list(moves.items())
    refused: dict[TopicPartition, StromError] = {}
    for start in range(0, len(items), BATCH):
        batch = dict(items[start : start + BATCH])
        try:
            admin.alter_partition_reassignments(batch)
        except PartialResultError as exc:
            refused.update(exc.errors)
        except StromError as exc:
            if len(batch) != 1:
                # The whole call failed (no controller, ...): nothing is per partition, but
                # the batches before it were sent, which the operator must know.
                if start:
                    print(
                        f"sent {start} partition(s) of the plan before this failure "
                        f"({len(refused)} of them refused)",
                        file=sys.stderr,
                    )
                raise
            refused[next(iter(batch))] = exc
    return refused


def _execute(admin: Admin, plan: reassignplan.Plan, out: Any, throttle: int | None) -> int:
    """Print the current assignment as a plan (to roll back with), set the throttle when
    one is given, then start every move."""
    reassignplan.check_nodes(plan, (n.node_id for n in admin.describe_cluster().nodes))
    current = _described(admin, [tp.topic for tp in plan])
    rollback = {tp: _original(current[tp]) for tp in plan if tp in current}
    print("Current partition replica assignment\n", file=out)
    print(reassignplan.plan_json(rollback), file=out)
    print("\nSave this to use as the --plan of --execute to roll back\n", file=out)
    out.flush()
    if throttle is not None:
        _set_throttle(admin, plan, current, throttle, out)
    refused = _alter(admin, dict(plan))
    for tp, exc in refused.items():
        _say_error(tp, exc)
    started = len(plan) - len(refused)
    print(
        f"Started the reassignment of {started} partition(s)"
        + (f"; {len(refused)} refused" if refused else ""),
        file=out,
    )
    return 1 if refused else 0


def _throttle_configs(admin: Admin, topic: str) -> dict[str, str]:
    """A topic's throttled-replicas overrides (absent: none)."""
    names = [reassignplan.LEADER_THROTTLED, reassignplan.FOLLOWER_THROTTLED]
    found = admin.describe_configs(topic, names=names)
    return {
        n: e.value
        for n, e in found.items()
        if e.source == ConfigSource.TOPIC and e.value is not None and e.value.strip()
    }


def _set_throttle(
    admin: Admin,
    plan: reassignplan.Plan,
    current: dict[TopicPartition, PartitionInfo],
    rate: int,
    out: Any,
) -> None:
    """Throttle the plan's moves as Kafka's ``--execute --throttle`` does: the moving
    partitions' replicas in their topics' throttled-replicas configs (added to what is
    there: other moves may be throttled too), then the nodes' rate, before any move starts
    (so no copy runs unthrottled)."""
    now = {tp: (list(p.replicas), _original(p)) for tp, p in current.items()}
    entries = reassignplan.throttled_replicas(plan, now)
    for topic, (leader, follower) in sorted(entries.items()):
        have = _throttle_configs(admin, topic)
        changes = {
            name: reassignplan.merged_throttle(have.get(name), items)
            for name, items in (
                (reassignplan.LEADER_THROTTLED, leader),
                (reassignplan.FOLLOWER_THROTTLED, follower),
            )
            if items
        }
        admin.alter_configs(topic, set=changes)
    admin.alter_node_configs(set={LEADER_RATE: rate, FOLLOWER_RATE: rate})
    moving = sum(len(f) for _, f in entries.values())
    print(
        f"The replication throttle is {rate} bytes/s per node ({LEADER_RATE}, "
        f"{FOLLOWER_RATE}); throttled: {moving} replica(s) being added to "
        f"{len(entries)} topic(s). --verify removes it once the moves are done",
        file=out,
    )


def _remove_throttle(
    admin: Admin,
    plan: Iterable[TopicPartition],
    out: Any,
    kept: Collection[TopicPartition] = (),
) -> None:
    """Take the partitions of ``plan`` out of their topics' throttled-replicas configs, and
    the nodes' rate once no reassignment is left in progress (Kafka's ``--verify`` clears the
    rates even then; a rate another move still runs under is kept here, and said so).

    The entries of ``kept`` stay (moves still copying: a refused cancel, a partition another
    reassignment now moves), and so does a ``*`` of their topics, so that no copy still
    running goes on unthrottled."""
    by_topic: dict[str, set[int]] = {}
    for tp in plan:
        if tp not in kept:
            by_topic.setdefault(tp.topic, set()).add(tp.partition)
    keep_topics = {tp.topic for tp in kept}
    known = set(admin.list_topics(internal=True))
    cleared = []
    for topic, partitions in sorted(by_topic.items()):
        if topic not in known:
            continue
        have = _throttle_configs(admin, topic)
        changes: dict[str, str] = {}
        gone: list[str] = []
        for name, old in have.items():
            if topic in keep_topics and old.strip() == "*":
                continue
            new = reassignplan.without_partitions(old, partitions)
            if new is None:
                gone.append(name)
            elif new != old:
                changes[name] = new
        if changes or gone:
            admin.alter_configs(topic, set=changes, delete=gone)
            cleared.append(topic)
    if cleared:
        print(f"Removed the throttled replicas of topic(s) {', '.join(cleared)}", file=out)
    if kept:
        print(
            f"Kept the throttled replicas of {_names(kept)}: still moving; --verify or "
            "--cancel with the plan removes them once the move is over",
            file=out,
        )
    # Only the rates: the same configs hold the log levels (log.level...), not ours to remove.
    rates = [
        n
        for n, e in admin.describe_node_configs().items()
        if n in (LEADER_RATE, FOLLOWER_RATE) and e.value is not None
    ]
    if not rates:
        return
    others = len(admin.list_partition_reassignments())
    if others:
        print(
            f"Kept the replication throttle rate: {others} reassignment(s) still in progress",
            file=out,
        )
        return
    admin.alter_node_configs(delete=rates)
    print(f"Removed the replication throttle rate ({', '.join(sorted(rates))})", file=out)


def _verify(
    admin: Admin, plan: reassignplan.Plan, preferred: bool, out: Any, unthrottle: bool = True
) -> int:
    """Each partition's state against the plan; exit 0 when every one is done. Once all
    are, the throttle of the plan is removed (unless ``unthrottle`` is False)."""
    current = _described(admin, [tp.topic for tp in plan])
    counts = {"done": 0, "in progress": 0, "not matching": 0}
    done: list[TopicPartition] = []
    for tp, target in plan.items():
        p = current.get(tp)
        name = f"{tp.topic}-{tp.partition}"
        if p is None:
            counts["not matching"] += 1
            print(f"{name}: not matching: no such partition", file=out)
            continue
        status = reassignplan.verify_status(
            target, p.replicas, p.adding_replicas, p.removing_replicas
        )
        counts[status] += 1
        if status == "done":
            done.append(tp)
            print(f"{name}: done", file=out)
        elif status == "in progress":
            print(
                f"{name}: in progress (adding {_ids(p.adding_replicas)}, removing "
                f"{_ids(p.removing_replicas)})",
                file=out,
            )
        else:
            print(
                f"{name}: not matching: replicas {_ids(_original(p))}"
                + (f" moving to {_ids(p.target_replicas)}" if p.reassigning else "")
                + f", plan {_ids(target)}",
                file=out,
            )
    print(", ".join(f"{n} {status}" for status, n in counts.items()), file=out)
    _verify_throttle(admin, plan, current, counts["in progress"], unthrottle, out)
    failed = 0
    if preferred:
        leaderless = [tp for tp in done if current[tp].leader != plan[tp][0]]
        failed = _elect_preferred(admin, leaderless, out)
    return 0 if counts["done"] == len(plan) and not failed else 1


def _verify_throttle(
    admin: Admin,
    plan: reassignplan.Plan,
    current: dict[TopicPartition, PartitionInfo],
    in_progress: int,
    unthrottle: bool,
    out: Any,
) -> None:
    """Remove the plan's throttle once none of its partitions is still in progress, as
    Kafka's ``--verify`` does (a "not matching" partition is not: left throttled, a
    superseded plan would leave its configs for ever); the entries of a partition another
    reassignment now moves stay, so that move stays throttled. A throttle kept is said, with
    how to remove it."""
    if not unthrottle:
        _say_preserved(out)
        return
    if in_progress:
        print(
            f"Kept the replication throttle: {in_progress} partition(s) of the plan still in "
            "progress; --verify again removes it once none is (or --cancel)",
            file=out,
        )
        return
    moving = [tp for tp in plan if tp in current and current[tp].reassigning]
    _remove_throttle(admin, plan, out, kept=moving)


def _say_preserved(out: Any) -> None:
    """--preserve-throttles: what is left in place, and how to take it away later (nothing
    else will: the configs outlive the moves)."""
    print(
        "Kept the replication throttle (--preserve-throttles); remove it with --verify "
        "without that flag, or `strom topics alter TOPIC --delete "
        f"{reassignplan.LEADER_THROTTLED} --delete {reassignplan.FOLLOWER_THROTTLED}` and "
        f"`strom cluster configs --delete {LEADER_RATE} --delete {FOLLOWER_RATE}`",
        file=out,
    )


def _elect_preferred(admin: Admin, tps: list[TopicPartition], out: Any) -> int:
    """With --preferred: elect the first replica of the partitions done (led by another);
    how many elections failed."""
    if not tps:
        return 0
    failed = 0
    for tp, r in admin.elect_leaders(tps).items():
        if r.error is None:
            print(f"{tp.topic}-{tp.partition}: leader {r.leader} (preferred)", file=out)
        elif not isinstance(r.error, ElectionNotNeededError):
            failed += 1
            _say_error(tp, r.error)
    return failed


def _cancel(admin: Admin, plan: reassignplan.Plan, out: Any, unthrottle: bool = True) -> int:
    """Cancel every move of the plan in progress; each refused cancel is named (the
    controller refuses one that would need an unclean election). The plan's throttle is
    then removed (unless ``unthrottle`` is False), as Kafka's ``--cancel`` does."""
    moving = [tp for tp in admin.list_partition_reassignments() if tp in plan]
    refused = _alter(admin, dict.fromkeys(moving))
    for tp in moving:
        if tp in refused:
            _say_error(tp, refused[tp])
        else:
            print(f"{tp.topic}-{tp.partition}: cancelled", file=out)
    idle = len(plan) - len(moving)
    print(
        f"Cancelled {len(moving) - len(refused)} reassignment(s)"
        + (f"; {len(refused)} refused" if refused else "")
        + (f"; {idle} partition(s) of the plan had none in progress" if idle else ""),
        file=out,
    )
    if unthrottle:
        # A refused cancel leaves its move copying: its throttle stays with it.
        _remove_throttle(admin, plan, out, kept=list(refused))
    else:
        _say_preserved(out)
    return 1 if refused else 0


def _generate(admin: Admin, args: argparse.Namespace, out: Any) -> int:
    """Print the current assignment of the topics and a proposal over ``--nodes``."""
    if args.topics_file is not None:
        topics = reassignplan.parse_topics_to_move(
            read_file(args.topics_file, "--topics-to-move-json-file")
        )
    else:
        topics = _topic_list(args.topics_csv)
    wanted = reassignplan.parse_node_list(args.nodes)
    registered = {n.node_id: n for n in admin.describe_cluster().nodes}
    unknown = [x for x in wanted if x not in registered]
    if unknown:
        raise UsageError(
            f"--nodes: unknown node(s) {_ids(unknown)} (registered: {_ids(sorted(registered))})"
        )
    described = admin.describe_topics(topics)  # an unknown topic is named by the error
    current = {
        TopicPartition(t, p.partition): _original(p)
        for t in topics
        for p in described[t].partitions
    }
    nodes = [PlacementNode(x, registered[x].rack) for x in wanted]
    proposed = reassignplan.generate(current, nodes)
    print("Current partition replica assignment", file=out)
    print(reassignplan.plan_json(current), file=out)
    print("\nProposed partition reassignment configuration", file=out)
    print(reassignplan.plan_json(proposed), file=out)
    moved = reassignplan.moved_replicas(current, proposed)
    total = sum(len(r) for r in proposed.values())
    print(f"({moved} of {total} replicas would be copied to another node)", file=sys.stderr)
    return 0


def _topic_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",")]
    if not all(names):
        raise UsageError(f"--topics {text!r} has an empty name")
    return list(dict.fromkeys(names))


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids)) or "-"
