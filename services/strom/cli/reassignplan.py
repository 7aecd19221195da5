"""Reassignment plans as Kafka's tools write them: parsing, checking, generating, verifying.

A pure engine (no gRPC, no etcd) under ``strom topics reassign --plan/--generate`` and
``strom topics elect-leaders --path-to-json-file``, so that an operator moving thousands of
partitions hands one file to one command instead of scripting the Admin API, and the files
of ``kafka-reassign-partitions.sh`` / ``kafka-leader-election.sh`` work unchanged.

Bad input raises :class:`strom.argtypes.UsageError` naming the flag and what is wrong (the
``strom`` command prints it on one line, exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from strom.argtypes import UsageError
from strom.client.types import TopicPartition
from strom.controller.placement import PlacementNode, assign_replicas

#: A plan: each partition's target replica list (preferred leader first), in file order.
Plan = dict[TopicPartition, list[int]]

_NODE_ID_MAX = 2**31 - 1


def _load(text: str, flag: str) -> dict[str, Any]:
    """The JSON object of a file given with ``flag``."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{flag}: the file must hold a JSON object")
    version = doc.get("version", 1)
    if version != 1:
        raise UsageError(f"{flag}: version {version!r} is not supported (only 1)")
    return doc


def _entries(doc: dict[str, Any], key: str, flag: str) -> list[dict[str, Any]]:
    entries = doc.get(key)
    if not isinstance(entries, list):
        raise UsageError(f'{flag}: the file has no "{key}" list')
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise UsageError(f'{flag}: "{key}"[{k}] is not an object')
    return entries


def _topic_partition(entry: dict[str, Any], where: str, flag: str) -> TopicPartition:
    topic, partition = entry.get("topic"), entry.get("partition")
    if not isinstance(topic, str) or not topic:
        raise UsageError(f'{flag}: {where} has no "topic" name')
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise UsageError(f'{flag}: {where} ({topic}) has no "partition" number >= 0')
    return TopicPartition(topic, partition)


def _node_ids(value: Any, what: str, flag: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise UsageError(f'{flag}: {what} has no "replicas" list of node ids')
    if any(isinstance(x, bool) or not isinstance(x, int) for x in value):
        raise UsageError(f"{flag}: {what}: replicas {value!r} are not all node ids")
    if any(not 0 <= x <= _NODE_ID_MAX for x in value):
        raise UsageError(f"{flag}: {what}: node ids are 0 to {_NODE_ID_MAX}, not {value!r}")
    if len(set(value)) != len(value):
        raise UsageError(f"{flag}: {what}: replicas {value!r} name a node twice")
    return list(value)


def parse_plan(text: str, flag: str = "--plan") -> Plan:
    """A reassignment file (``{"version":1,"partitions":[{"topic","partition","replicas"}]}``)
    as a plan. ``log_dirs`` other than all ``"any"`` is refused: strom nodes have one data
    directory, so a file that places replicas on given directories cannot be honoured and
    is not silently half-applied."""
    doc = _load(text, flag)
    plan: Plan = {}
    for k, entry in enumerate(_entries(doc, "partitions", flag)):
        tp = _topic_partition(entry, f'"partitions"[{k}]', flag)
        what = f"{tp.topic}-{tp.partition}"
        if tp in plan:
            raise UsageError(f"{flag}: {what} is in the plan twice")
        replicas = _node_ids(entry.get("replicas"), what, flag)
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None and (
            not isinstance(log_dirs, list) or any(d != "any" for d in log_dirs)
        ):
            raise UsageError(
                f'{flag}: {what}: "log_dirs" other than "any" is not supported (a strom node '
                "has one data directory); remove it"
            )
        plan[tp] = replicas
    if not plan:
        raise UsageError(f'{flag}: the plan has no partitions ("partitions" is empty)')
    return plan


def parse_topics_to_move(text: str, flag: str = "--topics-to-move-json-file") -> list[str]:
    """The topics of Kafka's topics-to-move file (``{"topics":[{"topic":"T"}],"version":1}``),
    in file order, each once."""
    doc = _load(text, flag)
    names: list[str] = []
    for k, entry in enumerate(_entries(doc, "topics", flag)):
        name = entry.get("topic")
        if not isinstance(name, str) or not name:
            raise UsageError(f'{flag}: "topics"[{k}] has no "topic" name')
        if name in names:
            raise UsageError(f"{flag}: topic {name} is listed twice")
        names.append(name)
    if not names:
        raise UsageError(f'{flag}: no topics ("topics" is empty)')
    return names


def parse_election_file(text: str, flag: str = "--path-to-json-file") -> list[TopicPartition]:
    """The partitions of Kafka's election file (``{"partitions":[{"topic","partition"}]}``),
    in file order; a partition listed twice is refused, as kafka-leader-election refuses it."""
    doc = _load(text, flag)
    tps: list[TopicPartition] = []
    for k, entry in enumerate(_entries(doc, "partitions", flag)):
        tp = _topic_partition(entry, f'"partitions"[{k}]', flag)
        if tp in tps:
            raise UsageError(f"{flag}: {tp.topic}-{tp.partition} is listed twice")
        tps.append(tp)
    if not tps:
        raise UsageError(f'{flag}: no partitions ("partitions" is empty)')
    return tps


def parse_node_list(text: str, flag: str = "--nodes") -> list[int]:
    """``1,2,3`` as node ids, each once."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UsageError(f"{flag} {text!r} is not a list of node ids")
    ids = [int(p) for p in parts]
    if any(x > _NODE_ID_MAX for x in ids):
        raise UsageError(f"{flag} {text!r}: node ids are 0 to {_NODE_ID_MAX}")
    if len(set(ids)) != len(ids):
        raise UsageError(f"{flag} {text!r} names a node twice")
    return ids


def check_nodes(plan: Mapping[TopicPartition, Sequence[int]], known: Iterable[int]) -> None:
    """UsageError naming the first partition whose replicas include a node not registered
    (before anything is started: a typo must not start half a plan)."""
    registered = set(known)
    for tp, replicas in plan.items():
        unknown = [r for r in replicas if r not in registered]
        if unknown:
            raise UsageError(
                f"--plan: {tp.topic}-{tp.partition}: unknown node(s) "
                f"{','.join(map(str, unknown))} (registered: "
                f"{','.join(map(str, sorted(registered))) or 'none'})"
            )


def plan_json(assignment: Mapping[TopicPartition, Sequence[int]]) -> str:
    """An assignment as a reassignment file (Kafka's format, log_dirs "any"), one partition a
    line so that diffs of two plans read well; it parses back with :func:`parse_plan`."""
    rows = [
        json.dumps(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "replicas": list(r),
                "log_dirs": ["any"] * len(r),
            }
        )
        for tp, r in assignment.items()
    ]
    return '{"version":1,"partitions":[\n' + ",\n".join(rows) + "\n]}"


def generate(
    current: Mapping[TopicPartition, Sequence[int]], nodes: Sequence[PlacementNode]
) -> Plan:
    """A proposed assignment of ``current``'s partitions over ``nodes``.

    Each topic (each group of its partitions of one replica count, which is kept) is laid
    out by the controller's own placement engine (:func:`assign_replicas`): leaders and
    replicas balanced within one over the nodes, rack-aware when the nodes have racks, the
    topics placed earlier in the plan counted as load so that the whole plan is balanced.
    Then the replica lists, which are interchangeable between partitions of one topic, are
    matched to the partitions that already hold most of each (a list that is the current
    one first), so that as few replicas as possible move; Kafka's --generate does not try.
    Raises UsageError when a partition has more replicas than ``nodes``.
    """
    groups: dict[tuple[str, int], list[TopicPartition]] = {}
    for tp, replicas in current.items():
        groups.setdefault((tp.topic, len(replicas)), []).append(tp)
    leader_load: dict[int, int] = {}
    replica_load: dict[int, int] = {}
    proposed: Plan = {}
    for k, ((topic, rf), tps) in enumerate(groups.items()):
        if rf > len(nodes):
            raise UsageError(
                f"--nodes: {topic} has {rf} replicas a partition, more than the "
                f"{len(nodes)} node(s) given"
            )
        lists = assign_replicas(
            nodes,
            len(tps),
            rf,
            start_index=k,
            leader_load=leader_load,
            replica_load=replica_load,
        )
        for tp, replicas in _match(tps, current, lists).items():
            proposed[tp] = replicas
            leader_load[replicas[0]] = leader_load.get(replicas[0], 0) + 1
            for r in replicas:
                replica_load[r] = replica_load.get(r, 0) + 1
    return {tp: proposed[tp] for tp in current}


def _match(
    tps: Sequence[TopicPartition],
    current: Mapping[TopicPartition, Sequence[int]],
    lists: list[list[int]],
) -> dict[TopicPartition, list[int]]:
    """Each partition's list among ``lists`` (one each), keeping most of its replicas: those
    whose current replicas are exactly a list's set first, then greedily by overlap (then by
    the leader kept)."""
    free = {k: lst for k, lst in enumerate(lists)}
    by_set: dict[frozenset[int], list[int]] = {}
    for k, lst in free.items():
        by_set.setdefault(frozenset(lst), []).append(k)
    out: dict[TopicPartition, list[int]] = {}
    rest: list[TopicPartition] = []
    for tp in tps:
        same = by_set.get(frozenset(current[tp]))
        if same:
            k = same.pop(0)
            out[tp] = free.pop(k)
        else:
            rest.append(tp)
    for tp in rest:
        held = set(current[tp])
        leader = current[tp][0]
        k = max(
            free,
            key=lambda k: (len(held & set(free[k])), free[k][0] == leader, -k),
        )
        out[tp] = free.pop(k)
    return out


def moved_replicas(current: Mapping[TopicPartition, Sequence[int]], proposed: Plan) -> int:
    """How many replicas a plan copies to a node that does not hold them yet."""
    return sum(len(set(r) - set(current.get(tp, ()))) for tp, r in proposed.items())


def verify_status(
    target: Sequence[int], replicas: Sequence[int], adding: Sequence[int], removing: Sequence[int]
) -> str:
    """``done``, ``in progress`` or ``not matching``: a partition's state against its plan.

    ``replicas`` is the partition's replica list as described (old and new during a move),
    ``adding``/``removing`` what a move in progress adds and drops."""
    gone = set(removing)
    moving_to = [r for r in replicas if r not in gone]
    if adding or removing:
        return "in progress" if moving_to == list(target) else "not matching"
    return "done" if list(replicas) == list(target) else "not matching"


#: The nodes' throttle rates (dynamic node configs; strom.storage.replication_quota, spelled
#: again here so that the command does not load the storage engine).
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
#: The topic configs naming the replicas a replication throttle applies to (Kafka's KIP-73).
LEADER_THROTTLED = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED = "follower.replication.throttled.replicas"


def throttled_replicas(
    plan: Mapping[TopicPartition, Sequence[int]],
    current: Mapping[TopicPartition, tuple[Sequence[int], Sequence[int]]],
) -> dict[str, tuple[list[str], list[str]]]:
    """The throttled replicas a plan's moves need, by topic, as Kafka's
    ``kafka-reassign-partitions.sh --throttle`` sets them: for each partition the plan
    moves, its current replicas (every one that may lead and so send the copy) in the
    leader list, and the replicas it adds in the follower list (``partition:node`` items).
    ``current`` holds each partition's (replicas now, replicas before any move in
    progress); partitions the plan leaves as they are get none."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for tp, target in plan.items():
        found = current.get(tp)
        if found is None:
            continue
        replicas, original = found
        adding = [r for r in target if r not in original]
        if not adding and list(target) == list(original):
            continue
        leader, follower = out.setdefault(tp.topic, ([], []))
        leader.extend(f"{tp.partition}:{r}" for r in replicas)
        follower.extend(f"{tp.partition}:{r}" for r in adding)
    return out


def merged_throttle(existing: str | None, items: Sequence[str]) -> str:
    """A throttled-replicas value with ``items`` added to ``existing`` (kept first, no
    repeats); ``*`` already throttles everything and stays."""
    old = (existing or "").strip()
    if old == "*":
        return old
    have = [i.strip() for i in old.split(",") if i.strip()]
    return ",".join(dict.fromkeys([*have, *items]))


def without_partitions(existing: str | None, partitions: Iterable[int]) -> str | None:
    """A throttled-replicas value without the items of ``partitions``: None when nothing is
    left (the config is then deleted). ``*`` goes too: it is what a finished or cancelled
    move leaves, as Kafka's ``--verify`` removes the configs whole."""
    old = (existing or "").strip()
    if not old or old == "*":
        return None
    gone = {str(p) for p in partitions}
    kept = [i.strip() for i in old.split(",") if i.strip() and i.split(":")[0].strip() not in gone]
    return ",".join(kept) or None
