"""``strom topics list`` and ``strom topics describe``: the topic listing, the partition
filters of ``describe`` (``--under-replicated-partitions``, ``--under-min-isr-partitions``
...) and how a topic and its partitions are printed (or given as JSON).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strom.api import controller_pb2
from strom.cli.jsonout import message_dict
from strom.client.admin import Admin, ConfigEntry, PartitionInfo, TopicDescription
from strom.client.admin_requests import partition_info, replication_factor_of
from strom.client.cluster import ClusterClient
from strom.errors import error_for


def _list(admin: Admin, client: ClusterClient, args: argparse.Namespace, out: Any) -> None:
    names = admin.list_topics(internal=args.internal)
    if args.json:  # as the other list commands take it
        print(json.dumps(sorted(names)), file=out)
        return
    for name in names:
        print(name, file=out)


#: A partition filter of ``topics describe``: whether the topic's partition is to be shown.
PartitionFilter = Callable[[str, PartitionInfo], bool]


@dataclass(frozen=True)
class PartitionCondition:
    """A ``topics describe`` partition filter and the flag its rows carry first: each row
    says which condition it met."""

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
        # The count the text shows (a reassignment may have changed it), the one chosen at
        # creation kept beside it.
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


def _ids(ids: Any) -> str:
    return ",".join(map(str, ids)) or "-"


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
    select), in the unfiltered listing too."""
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
