"""strom clients.

``Producer``, ``Consumer`` and ``Admin`` are what applications use (asyncio versions in
:mod:`strom.aio`); ``ClusterClient`` is the low-level, synchronous RPC layer (bootstrap,
metadata, controller redirects) that they and the CLI build on.

The names are loaded on first use, as :mod:`strom`'s are: importing one client module (the
CLI's admin commands import ``strom.client.admin``) then does not import every other one,
and the consumer's pyarrow and numpy with them (~0.2 s of CPU at every ``strom`` command).
Type checkers read the names from the ``TYPE_CHECKING`` imports below, which name the same
modules (tests/unit/test_typing_surface.py keeps the two in step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strom.lazy_names import lazy_names

if TYPE_CHECKING:
    from strom.client.admin import Admin, NewTopic
    from strom.client.cluster import ClusterClient, parse_bootstrap
    from strom.client.consumer import Consumer
    from strom.client.producer import BatchMetadata, Producer
    from strom.client.transactions import GroupMetadata
    from strom.client.types import (
        OffsetAndMetadata,
        OffsetAndTimestamp,
        RecordMetadata,
        TopicPartition,
    )

#: Each lazily loaded name -> the module it comes from.
_LAZY: dict[str, str] = {
    "Admin": "strom.client.admin",
    "NewTopic": "strom.client.admin",
    "ClusterClient": "strom.client.cluster",
    "parse_bootstrap": "strom.client.cluster",
    "Consumer": "strom.client.consumer",
    "BatchMetadata": "strom.client.producer",
    "Producer": "strom.client.producer",
    "GroupMetadata": "strom.client.transactions",
    "OffsetAndMetadata": "strom.client.types",
    "OffsetAndTimestamp": "strom.client.types",
    "RecordMetadata": "strom.client.types",
    "TopicPartition": "strom.client.types",
}

__all__ = [
    "Admin",
    "BatchMetadata",
    "ClusterClient",
    "Consumer",
    "GroupMetadata",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
    "parse_bootstrap",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
