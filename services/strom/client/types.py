"""Small value types the clients hand to and get from users (Kafka's names, so habits carry
over): ``TopicPartition``, ``RecordMetadata``, ``OffsetAndTimestamp`` and ``OffsetAndMetadata``.

``Record`` (what consumers return) lives in :mod:`strom.record` because the batch decoder
builds it; it is re-exported from :mod:`strom`.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """One partition of one topic; hashable, so it keys offset maps."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``offset`` is -1 with acks=0 (nothing comes back)."""

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
