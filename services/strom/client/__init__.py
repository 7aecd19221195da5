"""strom clients.

``Producer``, ``Consumer`` and ``Admin`` are what applications use (asyncio versions in
:mod:`strom.aio`); ``ClusterClient`` is the low-level, synchronous RPC layer (bootstrap,
metadata, controller redirects) that they and the CLI build on.
"""

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
