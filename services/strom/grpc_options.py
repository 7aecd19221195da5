"""The gRPC options every strom process uses for its channels and servers (message size
limits). A module of its own so that clients need not import the service runtime (and with
it etcd, Prometheus and the health and reflection services) to read two numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Large enough for several 1 MiB batches per partition in one request.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
)

#: The largest ProduceRecords request a node reads (RecordService; strom.storage.records_api
#: says why). Here so that the security rules, which run before the handler, know it too.
MAX_PRODUCE_RECORDS_REQUEST_BYTES = 64 << 20
