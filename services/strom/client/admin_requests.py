"""The Admin client's request and answer helpers: its arguments checked (raising what the
server would, so that one ``except`` clause covers both), errors given the item they concern,
and answers read into the types of :mod:`strom.client.admin_types`.

Pure functions with no connection of their own; :class:`strom.client.admin.Admin` calls them
around its RPCs (and the ``strom`` CLI reads topic descriptions with them too).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from strom.api import common_pb2, controller_pb2, metadata_pb2
from strom.argtypes import datetime_ms
from strom.client.admin_types import (
    Assignment,
    ConfigEntry,
    ConfigSource,
    ConfigValue,
    Node,
    PartitionInfo,
    TopicDescription,
)
from strom.client.kwnames import INT32_MAX, INT64_MAX, int_option
from strom.client.types import TopicPartition, checked_topic_partition
from strom.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidConfigError,
    InvalidGroupIdError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    InvalidTopicError,
    StromError,
    error_for,
    partial_result_error,
)

NONE = common_pb2.ErrorCode.NONE
V = TypeVar("V")

_SPECIAL_OFFSETS = {"latest": -1, "earliest": -2, "max_timestamp": -3}


# ---------------------------------------------------------------------------------------------
# Argument checks (they raise what the server would, so one except clause covers both)


def topic_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"a topic name must be a non-empty string, not {name!r}")
    return name


def topic_names(names: Iterable[str] | str, what: str) -> list[str]:
    if isinstance(names, str):
        raise InvalidRequestError(f"{what} takes a list of topic names, not the string {names!r}")
    out = [topic_name(n) for n in names]
    if len(set(out)) != len(out):
        dups = sorted({n for n in out if out.count(n) > 1})
        raise InvalidRequestError(f"{what}: topics named more than once: {', '.join(dups)}")
    return out


@contextmanager
def admin_errors() -> Iterator[None]:
    """The clients' shared checks raise TypeError/ValueError; the Admin raises them as
    InvalidArgumentTypeError/InvalidArgumentError, which are both those and the
    InvalidRequestError it documents, so either ``except`` clause catches them."""
    try:
        yield
    except StromError:
        raise
    except TypeError as exc:
        raise InvalidArgumentTypeError(str(exc)) from None
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def positive_count(
    value: int | None, what: str, error: type[StromError], *, default_ok: bool = True
) -> int:
    """-1 (the server's "cluster default") for None when ``default_ok``, else a positive int32,
    refused as ``error`` (the error class the server would answer with)."""
    if value is None and default_ok:
        return -1
    try:
        return int_option(what, value, 1, INT32_MAX, " (a positive int32)")
    except (TypeError, ValueError) as exc:
        hint = " (leave it out for the cluster default)" if default_ok else ""
        raise error(f"{exc}{hint}") from None


def _int32_index(value: object) -> bool:
    """Whether ``value`` is an int (not a bool) >= 0 that the wire's int32 carries."""
    try:
        int_option("", value, 0, INT32_MAX)
    except (TypeError, ValueError):
        return False
    return True


def topic_partition(item: object) -> TopicPartition:
    with admin_errors():
        return checked_topic_partition(item)


def tp_list(items: Iterable[Any], what: str) -> list[TopicPartition]:
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise InvalidRequestError(f"{what} takes TopicPartitions, not {items!r}")
    return list(dict.fromkeys(topic_partition(item) for item in items))


def tp_map(items: Mapping[Any, V], what: str) -> dict[TopicPartition, V]:
    if not isinstance(items, Mapping):
        raise InvalidRequestError(f"{what} takes a mapping of TopicPartition to a value")
    return {topic_partition(k): v for k, v in items.items()}


def _config_value(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise InvalidConfigError(f"config '{name}': value {value!r} is not a str, int, float or bool")


def config_strings(config: Mapping[str, ConfigValue] | None) -> dict[str, str]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise InvalidConfigError(f"configs must be a mapping of name to value, not {config!r}")
    out = {}
    for name, value in config.items():
        if not isinstance(name, str) or not name:
            raise InvalidConfigError(f"config names must be non-empty strings, not {name!r}")
        out[name] = _config_value(name, value)
    return out


def replica_list(replicas: object, what: str) -> list[int]:
    if isinstance(replicas, str | bytes) or not isinstance(replicas, Iterable):
        raise InvalidReplicaAssignmentError(f"{what}: replicas must be a list of node ids")
    out = list(replicas)
    if not out or not all(map(_int32_index, out)):
        raise InvalidReplicaAssignmentError(
            f"{what}: replicas must be a non-empty list of node ids (ints >= 0 and <= "
            f"{INT32_MAX}), not {out!r}"
        )
    return out


def replica_assignments(
    assignment: Assignment | None, topic: str
) -> list[controller_pb2.ReplicaAssignment]:
    if assignment is None:
        return []
    if isinstance(assignment, Mapping):
        items = list(assignment.items())
    elif isinstance(assignment, Sequence) and not isinstance(assignment, str | bytes):
        items = list(enumerate(assignment))
    else:
        raise InvalidReplicaAssignmentError(
            f"topic {topic!r}: replica_assignment must map partition -> node ids"
        )
    out = []
    for partition, replicas in items:
        if not _int32_index(partition):
            raise InvalidReplicaAssignmentError(
                f"topic {topic!r}: partition {partition!r} in replica_assignment is not an "
                f"index (an int >= 0 and <= {INT32_MAX})"
            )
        out.append(
            controller_pb2.ReplicaAssignment(
                partition=partition, replicas=replica_list(replicas, f"{topic}-{partition}")
            )
        )
    return sorted(out, key=lambda a: a.partition)


def offset_spec(tp: TopicPartition, spec: object) -> int:
    if isinstance(spec, str):
        try:
            return _SPECIAL_OFFSETS[spec]
        except KeyError:
            pass
    elif isinstance(spec, datetime):
        try:
            return datetime_ms(spec)  # naive: local time
        except ValueError as exc:
            raise InvalidRequestError(f"{tp.topic}-{tp.partition}: {exc}") from None
    elif isinstance(spec, int) and not isinstance(spec, bool) and -3 <= spec <= INT64_MAX:
        return spec  # (-1, -2, -3: Kafka's ListOffsets numbers for latest, earliest, max)
    raise InvalidArgumentError(
        f"{tp.topic}-{tp.partition}: offset spec {spec!r} is not 'earliest' (-2), 'latest' "
        f"(-1), 'max_timestamp' (-3), a timestamp in ms since the epoch (>= 0 and <= "
        f"{INT64_MAX}: an int64) or a datetime"
    )


# ---------------------------------------------------------------------------------------------
# Error context


def _names_item(message: str, names: Sequence[str]) -> bool:
    return any(n in message for n in names)


def with_context(exc: StromError, context: str, *names: str) -> StromError:
    """The same error, its message prefixed with ``context`` unless it already names the item
    (server messages mostly do: "topic 'x' already exists")."""
    if _names_item(exc.message, names or (context,)):
        return exc
    new = type(exc)(f"{context}: {exc.message}", code=exc.code, retriable=exc.retriable)
    new.__cause__ = exc.__cause__
    return new


def _item_error(code: int, message: str, context: str, *names: str) -> StromError:
    return with_context(error_for(code, message or None), context, *names)


def topic_error(code: int, message: str, topic: str) -> StromError:
    return _item_error(code, message, f"topic {topic!r}", repr(topic), f'"{topic}"')


def partition_error(code: int, message: str, tp: TopicPartition) -> StromError:
    return _item_error(code, message, f"{tp.topic}-{tp.partition}", f"{tp.topic}-{tp.partition}")


def raise_first(failures: Sequence[tuple[str, StromError]]) -> None:
    """Raise the first failure; its message lists the others (which the server also refused,
    while every item not listed took effect)."""
    if not failures:
        return
    _, first = failures[0]
    if len(failures) == 1:
        raise first
    others = [label for label, _ in failures[1:]]
    shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
    raise type(first)(
        f"{first.message} (also failed: {shown})", code=first.code, retriable=first.retriable
    ) from first


def _listing(labels: Sequence[str]) -> str:
    """Up to five labels, then how many there are in all."""
    more = f", ... ({len(labels)} in all)" if len(labels) > 5 else ""
    return ", ".join(labels[:5]) + more


def raise_partial(
    wanted: Iterable[TopicPartition],
    done: Mapping[TopicPartition, Any],
    failed: Mapping[TopicPartition, StromError],
) -> None:
    """Raise the first partition refused (in the caller's order) as a PartialResultError of
    its own class carrying every result and every error; its message lists the others
    refused and the partitions done (whose result, e.g. a deletion, took effect). Found
    from outside: ``delete_records`` over several partitions reported only the refusal, and
    the deletions done were neither returned nor said."""
    order = list(wanted)
    refused = [tp for tp in order if tp in failed]
    if not refused:
        return
    first = failed[refused[0]]
    notes = []
    if len(refused) > 1:
        notes.append(
            "also failed: " + _listing([f"{tp.topic}-{tp.partition}" for tp in refused[1:]])
        )
    succeeded = [tp for tp in order if tp in done]
    if succeeded:
        notes.append("done: " + _listing([f"{tp.topic}-{tp.partition}" for tp in succeeded]))
    message = f"{first.message} ({'; '.join(notes)})" if notes else first.message
    results = {tp: done[tp] for tp in succeeded}
    errors = {tp: failed[tp] for tp in refused}
    raise partial_result_error(first, message, results, errors) from first


# ---------------------------------------------------------------------------------------------
# Answers read into the result types


def partition_info(p: controller_pb2.PartitionDescription) -> PartitionInfo:
    if not p.HasField("state"):
        # The partition key is missing (being written, or lost): say so rather than invent 0s.
        return PartitionInfo(p.partition, None, -1, (), (), tuple(p.offline_replicas))
    s = p.state
    return PartitionInfo(
        partition=p.partition,
        leader=s.leader if s.leader >= 0 else None,
        leader_epoch=s.leader_epoch,
        replicas=tuple(s.replicas),
        isr=tuple(s.isr),
        offline_replicas=tuple(p.offline_replicas),
        adding_replicas=tuple(s.adding_replicas),
        removing_replicas=tuple(s.removing_replicas),
        partition_epoch=s.partition_epoch,
        recovering=s.leader_recovery_state == metadata_pb2.LEADER_RECOVERY_STATE_RECOVERING,
        original_replicas=tuple(s.original_replicas),
    )


def replication_factor_of(configured: int, partitions: tuple[PartitionInfo, ...]) -> int:
    """The first partition's replica count, as Kafka's describe shows it: reassignments change
    it while the topic keeps the count chosen at creation. During a move the replicas being
    added do not count yet. ``configured`` when no partition state is known."""
    for p in partitions:
        if p.replicas:
            adding = set(p.adding_replicas)
            return sum(1 for r in p.replicas if r not in adding)
    return configured


def topic_description(t: controller_pb2.TopicDescription) -> TopicDescription:
    m = t.metadata
    partitions = tuple(partition_info(p) for p in sorted(t.partitions, key=lambda p: p.partition))
    return TopicDescription(
        name=t.name,
        topic_id=m.topic_id,
        internal=m.internal or t.name.startswith("__"),
        replication_factor=replication_factor_of(m.replication_factor, partitions),
        partitions=partitions,
        configs=dict(sorted(m.configs.items())),
        created_ms=m.created_ms,
    )


def node_of(n: common_pb2.Node | None) -> Node | None:
    if n is None or n.node_id < 0 or not n.port:
        return None
    return Node(n.node_id, n.host, n.port, n.rack if n.HasField("rack") else None)


_SOURCES = {
    controller_pb2.CONFIG_SOURCE_DEFAULT: ConfigSource.DEFAULT,
    controller_pb2.CONFIG_SOURCE_TOPIC: ConfigSource.TOPIC,
    controller_pb2.CONFIG_SOURCE_STATIC_NODE_CONFIG: ConfigSource.NODE,
    controller_pb2.CONFIG_SOURCE_DYNAMIC_DEFAULT_NODE_CONFIG: ConfigSource.DYNAMIC_NODE,
}


def config_entries(configs: Iterable[Any]) -> dict[str, ConfigEntry]:
    """A DescribeConfigs result's entries by name (topics' and nodes' alike)."""
    return {
        c.name: ConfigEntry(
            name=c.name,
            value=c.value if c.HasField("value") else None,
            source=_SOURCES.get(c.source, ConfigSource.UNKNOWN),
            read_only=c.read_only,
            sensitive=c.sensitive,
            documentation=c.documentation,
        )
        for c in configs
    }


# ---------------------------------------------------------------------------------------------
# Consumer groups


def by_topic(group: Mapping[TopicPartition, V]) -> dict[str, list[tuple[int, V]]]:
    out: dict[str, list[tuple[int, V]]] = {}
    for tp, value in group.items():
        out.setdefault(tp.topic, []).append((tp.partition, value))
    return out


def checked_group_id(group_id: object) -> str:
    if not isinstance(group_id, str) or not group_id:
        raise InvalidGroupIdError(f"a group id must be a non-empty string, not {group_id!r}")
    return group_id


def checked_group_ids(group_ids: Iterable[str], what: str) -> list[str]:
    if isinstance(group_ids, str) or not isinstance(group_ids, Iterable):
        raise InvalidRequestError(f"{what} takes a list of group ids, not {group_ids!r}")
    return list(dict.fromkeys(checked_group_id(g) for g in group_ids))


def group_error(code: int, message: str, group: str) -> StromError:
    return _item_error(code, message, f"group {group!r}", repr(group), f'"{group}"')


def group_partition_error(p: Any, group: str, tp: TopicPartition) -> StromError:
    where = f"group {group!r}, {tp.topic}-{tp.partition}"
    return with_context(error_for(p.error_code, p.error_message or None), where, where)


def partition_failures(resp: Any, group: str) -> list[tuple[str, StromError]]:
    """The refused partitions of an OffsetCommit or DeleteOffsets answer (the same shape)."""
    return [
        (
            f"{t.topic}-{p.partition}",
            group_partition_error(p, group, TopicPartition(t.topic, p.partition)),
        )
        for t in resp.topics
        for p in t.partitions
        if p.error_code != NONE
    ]
