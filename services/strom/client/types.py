"""Small value types the clients hand to and get from users (Kafka's names, so habits carry
over): ``TopicPartition``, ``RecordMetadata``, ``OffsetAndTimestamp`` and ``OffsetAndMetadata``.

``Record`` (what consumers return) lives in :mod:`strom.record` because the batch decoder
builds it; it is re-exported from :mod:`strom`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


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
