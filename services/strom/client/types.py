"""Small value types the clients hand to and get from users (Kafka's names, so habits carry
over): ``TopicPartition``, ``RecordMetadata``, ``OffsetAndTimestamp`` and ``OffsetAndMetadata``.

``Record`` (what consumers return) lives in :mod:`strom.record` because the batch decoder
builds it; it is re-exported from :mod:`strom`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from strom.argtypes import INT32_MAX, INT64_MAX
from strom.client.kwnames import int_option


class TopicPartition(NamedTuple):
    """One partition of one topic; hashable, so it keys offset maps."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``offset`` is -1 with acks=0 (nothing comes back),
    and for a retry the leader recognised as one of a batch written before its last five of
    this producer but could not find in its log by the batch's header (DUPLICATE_SEQUENCE,
    design §6: beyond the search's bound, or deleted): written once, its offset not known.
    A retry of such an older batch that the leader finds reports its real offset."""

    topic: str
    partition: int
    offset: int
    timestamp: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class OffsetAndTimestamp(NamedTuple):
    """Result of ``offsets_for_times``: the first offset at or after the asked timestamp and
    that record's timestamp."""

    offset: int
    timestamp: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next offset to read, as in Kafka) with an optional note."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


def add_offsets(req: Any, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
    """Fill ``req.topics`` of an OffsetCommit or TxnOffsetCommit request (the same shape)
    with ``offsets``: one entry per topic, partitions in order."""
    by_topic: dict[str, Any] = {}
    for tp, om in sorted(offsets.items()):
        entry = by_topic.get(tp.topic)
        if entry is None:
            entry = by_topic[tp.topic] = req.topics.add(topic=tp.topic)
        entry.partitions.add(
            partition=tp.partition,
            committed_offset=om.offset,
            committed_leader_epoch=om.leader_epoch,
            metadata=om.metadata,
        )


def checked_topic_partition(tp: Any) -> TopicPartition:
    """A caller's ``(topic, partition)`` as a TopicPartition, or a clear error naming it."""
    if isinstance(tp, tuple) and len(tp) == 2:  # TopicPartition is a 2-tuple too
        topic, partition = tp
    else:
        raise TypeError(f"expected a TopicPartition(topic, partition), got {tp!r}")
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"topic must be a non-empty str, got {topic!r}")
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise TypeError(f"partition must be an int, got {partition!r}")
    if not 0 <= partition <= INT32_MAX:  # (an int32 on the wire)
        raise ValueError(f"partition must be >= 0 and <= {INT32_MAX}, got {partition} ({topic})")
    return TopicPartition(topic, partition)


def checked_offsets(offsets: Any, what: str) -> dict[TopicPartition, OffsetAndMetadata]:
    """A caller's offsets to commit (``{TopicPartition: OffsetAndMetadata or int}``) checked,
    or a TypeError/ValueError naming ``what`` and the partition: every call that commits
    offsets takes this one shape, and a value the wire cannot carry (int64 offset, int32
    epoch, str note) must fail here, not inside protobuf."""
    if not isinstance(offsets, Mapping):
        raise TypeError(
            f"{what} takes offsets as {{TopicPartition: OffsetAndMetadata}}, got {offsets!r}"
        )
    out = {}
    for key, value in offsets.items():
        tp = checked_topic_partition(key)
        om = OffsetAndMetadata(value) if isinstance(value, int) else value
        where = f"{what} offset for {tp.topic}-{tp.partition}"
        if not isinstance(om, OffsetAndMetadata):
            raise ValueError(f"{where} must be an offset >= 0 or an OffsetAndMetadata, got {om!r}")
        int_option(where, om.offset, 0, INT64_MAX)
        int_option(f"{where}: leader_epoch", om.leader_epoch, -1, INT32_MAX)
        if not isinstance(om.metadata, str):
            raise TypeError(f"{where}: metadata must be a str, got {om.metadata!r}")
        out[tp] = om
    return out
