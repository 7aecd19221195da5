"""Arrow schemas of the batch body (fixed per magic, DESIGN §4) and of decoded tables."""

from __future__ import annotations

import pyarrow as pa

HEADER_TYPE = pa.struct(
    [pa.field("key", pa.utf8(), nullable=False), pa.field("value", pa.binary())]
)
HEADERS_TYPE = pa.list_(pa.field("item", HEADER_TYPE))

#: The body schema of magic 1. Offsets are explicit so compaction can drop records.
BODY_SCHEMA_V1 = pa.schema(
    [
        pa.field("offset_delta", pa.int32(), nullable=False),
        pa.field("timestamp_delta", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")

#: What ``to_arrow()`` returns: absolute offsets and timestamps instead of deltas.
RECORDS_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)
