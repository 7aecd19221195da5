"""Validation of admin requests: topic names, partition counts, replication factors, manual
replica assignments and topic configs (a pure engine: no gRPC, no etcd).

Every check raises the :mod:`strom.errors` exception whose code the RPC result carries
(INVALID_TOPIC, INVALID_PARTITIONS, ...), with a message that names the offending value, so
the controller turns a failure into a per-topic result with one ``except StromError``.
The rules are Kafka's, so names and limits that work there work here.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from strom.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
)
from strom.log.config import validate_configs
from strom.log.errors import ConfigError

#: Kafka's limit: the name plus a partition suffix must fit a 255-byte file name.
MAX_TOPIC_NAME_LENGTH = 249
#: Upper bound on a topic's partition count: each partition is an etcd key, a directory on
#: every replica and a watch event on every node; beyond this something is surely a typo.
MAX_PARTITIONS = 10_000
#: Upper bound on the replication factor (Kafka has none; more than this is a typo).
MAX_REPLICATION_FACTOR = 32
#: Prefix reserved for strom's own topics (``__consumer_offsets``).
INTERNAL_PREFIX = "__"
#: The internal topics strom's coordinators keep their state in (coordinator.offsets_log and
#: coordinator.txn_state name them too; a unit test checks they agree): never deleted. Other
#: ``__`` names are still internal (clients cannot produce to them) but may be deleted, so an
#: operator can remove one created by mistake.
COORDINATOR_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
_ILLEGAL_CHAR = re.compile(r"[^a-zA-Z0-9._-]")


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is in the internal namespace (starts with ``__``)."""
    return name.startswith(INTERNAL_PREFIX)


def validate_topic_name(name: str, *, allow_internal: bool = False) -> None:
    """Check a topic name against Kafka's rules.

    Raises:
        InvalidTopicError: empty, longer than 249 characters, "." or "..", characters other
            than ASCII letters, digits, '.', '_' and '-', or an internal name (``__`` prefix)
            when ``allow_internal`` is false.
    """
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long; at most {MAX_TOPIC_NAME_LENGTH} allowed"
        )
    if not _LEGAL.fullmatch(name):
        bad = "".join(dict.fromkeys(_ILLEGAL_CHAR.findall(name)))
        raise InvalidTopicError(
            f"topic name {name!r} contains invalid characters {bad!r}; "
            "allowed are ASCII letters, digits, '.', '_' and '-'"
        )
    if is_internal_topic(name) and not allow_internal:
        raise InvalidTopicError(
            f"topic name {name!r} starts with {INTERNAL_PREFIX!r}, which is reserved for "
            "strom's internal topics"
        )


def colliding_topic(name: str, existing: Iterable[str]) -> str | None:
    """An existing topic whose name differs from ``name`` only by '.' versus '_', if any.

    Kafka refuses such pairs because metric names replace '.' with '_', so the two topics'
    metrics would be indistinguishable; strom's Prometheus labels keep names as they are,
    but operators moving between the two systems expect the same rule.
    """
    norm = name.replace(".", "_")
    for other in existing:
        if other != name and other.replace(".", "_") == norm:
            return other
    return None


def resolve_partition_count(num_partitions: int, default: int) -> int:
    """The partition count to create: ``-1`` means ``default``; else 1..MAX_PARTITIONS."""
    count = default if num_partitions == -1 else num_partitions
    if count < 1:
        raise InvalidPartitionsError(
            f"number of partitions must be at least 1 (or -1 for the default), not {num_partitions}"
        )
    if count > MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"number of partitions {count} is more than the maximum of {MAX_PARTITIONS}"
        )
    return count


def resolve_replication_factor(replication_factor: int, default: int) -> int:
    """The replication factor to use: ``-1`` means ``default``; else 1..MAX_REPLICATION_FACTOR.

    Whether there are enough live nodes is the placement's check (it knows the nodes).
    """
    rf = default if replication_factor == -1 else replication_factor
    if rf < 1:
        raise InvalidReplicationFactorError(
            f"replication factor must be at least 1 (or -1 for the default), "
            f"not {replication_factor}"
        )
    if rf > MAX_REPLICATION_FACTOR:
        raise InvalidReplicationFactorError(
            f"replication factor {rf} is more than the maximum of {MAX_REPLICATION_FACTOR}"
        )
    return rf


def validate_topic_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """Validate topic config overrides; return them normalised (as stored in etcd).

    Raises:
        InvalidConfigError: the message names the key and the rule it breaks.
    """
    try:
        return validate_configs(configs)
    except ConfigError as exc:
        raise InvalidConfigError(str(exc)) from None


#: Topic configs that name partitions of the topic (``partition:node`` items).
THROTTLED_REPLICA_CONFIGS = (
    "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas",
)


def check_throttled_partitions(name: str, configs: Mapping[str, str], count: int) -> None:
    """A throttled-replicas list naming a partition the topic does not have is refused
    (InvalidConfigError naming the config): a typo there would throttle nothing, silently.
    Kafka checks only the form; strom also knows the topic's partition count."""
    for key in THROTTLED_REPLICA_CONFIGS:
        beyond = sorted(p for p in throttled_partition_numbers(configs.get(key, "")) if p >= count)
        if beyond:
            raise InvalidConfigError(
                f"config '{key}' names partition {beyond[0]} of topic {name!r}, which has "
                f"{count} partition(s) (0..{count - 1})"
            )


def throttled_partition_numbers(value: str) -> set[int]:
    """The partitions a valid throttled-replicas list names (``*`` names none itself)."""
    text = value.strip()
    if text in ("", "*"):
        return set()
    return {int(item.split(":")[0]) for item in text.split(",")}


def validate_assignments(
    assignments: Sequence[tuple[int, Sequence[int]]],
    *,
    first_partition: int,
    count: int,
    live_nodes: Collection[int],
    replication_factor: int | None = None,
) -> list[list[int]]:
    """Check a manual replica assignment; return replica lists in partition order.

    Args:
        assignments: (partition, replicas) pairs as requested.
        first_partition: the first partition index the assignment must cover.
        count: how many partitions (``first_partition .. first_partition + count - 1``).
        live_nodes: ids of registered nodes; replicas elsewhere are refused.
        replication_factor: required list length (the topic's, when adding partitions); None =
            any length, as long as every list has the same one.

    Raises:
        InvalidReplicaAssignmentError: partitions missing, repeated or out of range; empty
            lists, repeated or unknown nodes, or lists of different lengths.
    """
    wanted = range(first_partition, first_partition + count)
    by_partition: dict[int, list[int]] = {}
    for partition, replicas in assignments:
        if partition not in wanted:
            # Keys are easily taken for 0-based indexes of the new partitions: say that they
            # are the new partitions' own numbers.
            hint = (
                f" (the topic already has partitions 0..{first_partition - 1}: an assignment "
                "names each new partition by its partition number)"
                if first_partition
                else ""
            )
            raise InvalidReplicaAssignmentError(
                f"assignment for partition {partition} is outside the expected range "
                f"{first_partition}..{first_partition + count - 1}{hint}"
            )
        if partition in by_partition:
            raise InvalidReplicaAssignmentError(f"partition {partition} is assigned twice")
        by_partition[partition] = list(replicas)
    missing = [p for p in wanted if p not in by_partition]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise InvalidReplicaAssignmentError(f"no assignment for partition(s) {shown}")
    live = set(live_nodes)
    expected_len = replication_factor
    out: list[list[int]] = []
    for partition in wanted:
        replicas = by_partition[partition]
        if not replicas:
            raise InvalidReplicaAssignmentError(f"partition {partition} has no replicas")
        seen: set[int] = set()
        for node in replicas:
            if node in seen:
                raise InvalidReplicaAssignmentError(
                    f"partition {partition} lists node {node} more than once"
                )
            seen.add(node)
            if node not in live:
                raise InvalidReplicaAssignmentError(
                    f"partition {partition} names node {node}, which is not a live node "
                    f"(live: {', '.join(map(str, sorted(live))) or 'none'})"
                )
        if expected_len is None:
            expected_len = len(replicas)
        elif len(replicas) != expected_len:
            raise InvalidReplicaAssignmentError(
                f"partition {partition} has {len(replicas)} replicas but {expected_len} are "
                "expected; every partition needs the same replication factor"
            )
        out.append(replicas)
    return out


@dataclass
class NewTopic:
    """A validated CreateTopics item, ready for placement (or already placed by hand)."""

    name: str
    num_partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)
    #: Manual replica lists in partition order; None = the controller places replicas.
    assignments: list[list[int]] | None = None
    internal: bool = False


def validate_new_topic(
    name: str,
    num_partitions: int,
    replication_factor: int,
    assignments: Sequence[tuple[int, Sequence[int]]],
    configs: Mapping[str, str],
    *,
    live_nodes: Collection[int],
    default_partitions: int = 1,
    default_replication_factor: int = 1,
    allow_internal: bool = False,
) -> NewTopic:
    """Validate one CreateTopics item (everything but placement and existence).

    Raises the :class:`strom.errors.StromError` subclass whose code the result carries.
    """
    validate_topic_name(name, allow_internal=allow_internal)
    manual: list[list[int]] | None = None
    if assignments:
        if num_partitions != -1 or replication_factor != -1:
            raise InvalidRequestError(
                "num_partitions and replication_factor must be -1 when assignments are given "
                f"(got {num_partitions} and {replication_factor})"
            )
        if len(assignments) > MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"number of partitions {len(assignments)} is more than the maximum of "
                f"{MAX_PARTITIONS}"
            )
        manual = validate_assignments(
            assignments, first_partition=0, count=len(assignments), live_nodes=live_nodes
        )
        count, rf = len(manual), len(manual[0])
    else:
        count = resolve_partition_count(num_partitions, default_partitions)
        rf = resolve_replication_factor(replication_factor, default_replication_factor)
    normalised = validate_topic_configs(configs)
    check_throttled_partitions(name, normalised, count)
    return NewTopic(
        name=name,
        num_partitions=count,
        replication_factor=rf,
        configs=normalised,
        assignments=manual,
        internal=is_internal_topic(name),
    )


def validate_partition_increase(name: str, current: int, count: int) -> None:
    """CreatePartitions: the new total must be larger than the current count, within limits."""
    if count <= current:
        raise InvalidPartitionsError(
            f"topic {name!r} has {current} partitions; the new count must be larger, not {count}"
        )
    if count > MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"number of partitions {count} is more than the maximum of {MAX_PARTITIONS}"
        )
