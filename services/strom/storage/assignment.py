"""Which partition replicas this node should host, and what to change to get there.

Pure functions over the cluster view's state (no etcd, no asyncio, no disk), so the
reconcile logic of the partition manager is tested alone. The manager recomputes the whole
desired set from the view on every change (idempotent reconcile): a missed or repeated
watch event can therefore never leave a replica behind or delete one twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strom.api import metadata_pb2 as md
from strom.log.config import CONFIG_KEYS, LogConfig, clamp_stored, parse_value
from strom.log.errors import ConfigError

log = logging.getLogger("strom.storage.assignment")

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Assignment:
    """One replica this node should host, with everything the manager applies to it."""

    topic: str
    partition: int
    topic_id: str
    state: md.PartitionState = field(compare=True, hash=False)
    configs: tuple[tuple[str, str], ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    def config_dict(self) -> dict[str, str]:
        return dict(self.configs)


def usable_configs(configs: Mapping[str, Any], *, where: str = "") -> dict[str, Any]:
    """The topic overrides that parse, dropping (and logging) any that do not.

    The controller validates configs on the way in, but a node must never refuse to open a
    log (or crash its reconcile) because of one bad value written by a newer or buggy writer:
    the log then runs with the default for that key.
    """
    out: dict[str, Any] = {}
    for name, raw in configs.items():
        if name not in CONFIG_KEYS:
            log.warning("%signoring unknown topic config %r", where, name)
            continue
        raw = clamp_stored(name, raw)
        try:
            parse_value(name, raw)
        except ConfigError as exc:
            log.warning("%signoring invalid topic config: %s", where, exc)
            continue
        out[name] = raw
    return out


def log_config(configs: Mapping[str, Any], *, where: str = "") -> LogConfig:
    """A :class:`LogConfig` from topic overrides, skipping invalid ones (see above)."""
    return LogConfig.from_dict(usable_configs(configs, where=where))


def desired_assignments(
    node_id: int,
    topics: Mapping[str, md.TopicMetadata],
    partitions: Mapping[TopicPartition, md.PartitionState],
) -> dict[TopicPartition, Assignment]:
    """Every partition whose replica list names ``node_id``, of a live (not deleting) topic.

    A partition key without its topic key, or whose ``topic_id`` names another incarnation of
    the topic, is ignored: it is the leftover of a deleted topic, and hosting it would
    resurrect data the controller is removing.
    """
    out: dict[TopicPartition, Assignment] = {}
    for (topic, p), state in partitions.items():
        if node_id not in state.replicas:
            continue
        meta = topics.get(topic)
        if meta is None or meta.deleting:
            continue
        if state.topic_id and meta.topic_id and state.topic_id != meta.topic_id:
            continue
        out[(topic, p)] = Assignment(
            topic=topic,
            partition=p,
            topic_id=meta.topic_id or state.topic_id,
            state=state,
            configs=tuple(sorted(meta.configs.items())),
        )
    return out


@dataclass
class Plan:
    """What one reconcile does, in this order: delete (and set strays and mismatched logs
    aside), then create, then update."""

    delete: list[TopicPartition] = field(default_factory=list)
    create: list[Assignment] = field(default_factory=list)
    update: list[Assignment] = field(default_factory=list)
    #: Logs found on disk that this process never hosted and the cluster does not assign to
    #: this node: renamed aside, not deleted (see :func:`plan_changes`).
    strays: list[TopicPartition] = field(default_factory=list)
    #: Logs this process did not host as the topic they record, whose ``partition.metadata``
    #: names another topic id than the one the cluster assigns: renamed aside like strays,
    #: then created afresh (their partition is in :attr:`create`).
    mismatched: list[TopicPartition] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.delete or self.create or self.update or self.strays or self.mismatched)


def plan_changes(
    desired: Mapping[TopicPartition, Assignment],
    installed: Mapping[TopicPartition, Assignment],
    local: Mapping[TopicPartition, str | None],
    *,
    set_aside_strays: bool,
) -> Plan:
    """Diff the desired replicas against what the node has.

    ``installed``: replicas currently served (with the assignment last applied);
    ``local``: every log on disk (open in the LogManager) with the topic id recorded beside
    it (None when unknown). An installed log is deleted when it is no longer desired, or when
    the view now gives its partition another topic id than the one this process served it as
    (the topic was deleted and created again under its name meanwhile); it is then created
    afresh. Logs that were never installed in this process life ("strays" found on disk at
    start) are only touched when ``set_aside_strays`` is set, i.e. once the view is known to
    describe this cluster and the data dir to be this node's, and then set aside
    (:attr:`Plan.strays`) rather than deleted, as Kafka does since 3.7: a wrong view or
    identity then costs nothing that cannot be renamed back.

    A log found on disk whose recorded topic id is not the assigned one is set aside too
    (:attr:`Plan.mismatched`, whatever ``set_aside_strays`` says: its partition must start
    empty either way, and a rename costs nothing) and its partition created afresh. Kafka
    does the same (KAFKA-14616). It was deleted, so one changed
    character in an RF=1 replica's ``partition.metadata`` destroyed the partition's only
    copy on the next start; a topic deleted and created again while the node was away is
    only the likelier reason, not the only one.
    """
    plan = Plan()
    recreate: set[TopicPartition] = set()
    for tp, local_id in local.items():
        want = desired.get(tp)
        if want is None:
            if tp in installed:
                plan.delete.append(tp)
            elif set_aside_strays:
                plan.strays.append(tp)
        elif local_id and want.topic_id and local_id != want.topic_id:
            recreate.add(tp)
            have = installed.get(tp)
            if have is not None and have.topic_id == local_id:
                plan.delete.append(tp)  # served here as the topic the cluster deleted
            else:
                plan.mismatched.append(tp)
    for tp in installed:
        if tp not in desired and tp not in local:
            plan.delete.append(tp)
    for tp, want in desired.items():
        have = installed.get(tp)
        if have is None or tp in recreate:
            plan.create.append(want)
        elif have != want:
            plan.update.append(want)
    plan.delete.sort()
    plan.strays.sort()
    plan.mismatched.sort()
    plan.create.sort(key=lambda a: a.tp)
    plan.update.sort(key=lambda a: a.tp)
    return plan
