"""strom: a distributed, partitioned, replicated commit log.

Applications import the clients from here::

    from strom import Producer, Consumer, Admin, TopicPartition

The package is split by role (see DESIGN §10): ``strom.record`` and ``strom.log`` are pure
engines; ``strom.storage``, ``strom.controller`` and ``strom.coordinator`` wire them to gRPC and
etcd; ``strom.client`` holds the clients (``strom.aio`` their asyncio faces). The client names
are loaded on first use, so services that never touch them do not pay for the import.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_CLIENT_NAMES = frozenset(
    {
        "Admin",
        "BatchMetadata",
        "Consumer",
        "GroupMetadata",
        "NewTopic",
        "OffsetAndMetadata",
        "OffsetAndTimestamp",
        "Producer",
        "RecordMetadata",
        "TopicPartition",
    }
)

__all__ = sorted([*_CLIENT_NAMES, "Record", "StromError", "__version__"])


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        import strom.client

        return getattr(strom.client, name)
    if name == "Record":
        from strom.record import Record

        return Record
    if name == "StromError":
        from strom.errors import StromError

        return StromError
    raise AttributeError(f"module 'strom' has no attribute {name!r}")
