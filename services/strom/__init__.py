"""strom: a distributed, partitioned, replicated commit log.

Applications import the clients from here::

    from strom import Producer, Consumer, Admin, TopicPartition

The package is split by role (see DESIGN §10): ``strom.record`` and ``strom.log`` are pure
engines; ``strom.storage``, ``strom.controller`` and ``strom.coordinator`` wire them to gRPC and
etcd; ``strom.client`` holds the clients (``strom.aio`` their asyncio faces). The client names
are loaded on first use, so services that never touch them do not pay for the import; type
checkers and IDEs read them from the ``TYPE_CHECKING`` imports below, which name the same
modules (tests/unit/test_typing_surface.py keeps the two in step).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from strom.lazy_names import lazy_names

# gRPC's C core writes its own INFO lines (a GOAWAY, a failed TLS handshake) straight to
# stderr, past Python's logging: an application using the clients got lines like
# ``I1130 ... chttp2_transport.cc:1403] ... Got goaway`` among its own output (found from
# outside). strom's clients report what matters through ``logging`` (``strom.*``), so the C
# core is told to say only errors. It reads the variable when grpc is first imported, which
# the clients do only after this runs; a value the user set wins (GRPC_VERBOSITY=INFO brings
# those lines back), and a grpc imported earlier keeps the verbosity it started with.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

if TYPE_CHECKING:
    from strom.client import (
        Admin,
        BatchMetadata,
        Consumer,
        GroupMetadata,
        NewTopic,
        OffsetAndMetadata,
        OffsetAndTimestamp,
        Producer,
        RecordMetadata,
        TopicPartition,
    )
    from strom.errors import (
        CommitFailedError,
        IllegalStateError,
        NoOffsetForPartitionError,
        ProducerClosedError,
        StromError,
    )
    from strom.record import Record, TimestampType

__version__ = "0.1.0"

#: Each lazily loaded name -> the module it comes from.
_LAZY: dict[str, str] = {
    "Admin": "strom.client",
    "BatchMetadata": "strom.client",
    "Consumer": "strom.client",
    "GroupMetadata": "strom.client",
    "NewTopic": "strom.client",
    "OffsetAndMetadata": "strom.client",
    "OffsetAndTimestamp": "strom.client",
    "Producer": "strom.client",
    "RecordMetadata": "strom.client",
    "TopicPartition": "strom.client",
    "Record": "strom.record",
    "TimestampType": "strom.record",
    # The errors applications catch besides the StromError family's server-code classes.
    "CommitFailedError": "strom.errors",
    "IllegalStateError": "strom.errors",
    "NoOffsetForPartitionError": "strom.errors",
    "ProducerClosedError": "strom.errors",
    "StromError": "strom.errors",
}

__all__ = [
    "Admin",
    "BatchMetadata",
    "CommitFailedError",
    "Consumer",
    "GroupMetadata",
    "IllegalStateError",
    "NewTopic",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "Producer",
    "ProducerClosedError",
    "Record",
    "RecordMetadata",
    "StromError",
    "TimestampType",
    "TopicPartition",
    "__version__",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
