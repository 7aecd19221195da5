"""The rows a strom read produces: the schema of Spark's Kafka source, so queries written
against Kafka run unchanged.

``key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
timestampType int`` and, with ``includeHeaders``, ``headers array<struct<key string, value
binary>>``. Every field is nullable, as in the Kafka source.

Spark accepts the Arrow batches a reader yields only when their schema equals the one it
derives from the declared Spark schema (names, types, nullability, list field names; timestamps
in microseconds, UTC), so the Arrow form is spelled out here next to the Spark form and a unit
test checks the two against pyspark's own conversion.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

#: Kafka's timestampType values: 0 = the producer's create time, 1 = the log's append time.
TIMESTAMP_TYPE_CREATE = 0
TIMESTAMP_TYPE_LOG_APPEND = 1

SPARK_HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
ARROW_HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
ARROW_HEADERS_TYPE = pa.list_(pa.field("element", ARROW_HEADER_STRUCT))
ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")

_SPARK_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_ARROW_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", ARROW_TIMESTAMP),
    pa.field("timestampType", pa.int32()),
]


def spark_schema(include_headers: bool = False) -> StructType:
    """The Spark schema of a read (``includeHeaders`` adds the ``headers`` column)."""
    fields = list(_SPARK_FIELDS)
    if include_headers:
        fields.append(StructField("headers", SPARK_HEADERS_TYPE))
    return StructType(fields)


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema of the batches a read yields; equal to pyspark's conversion of
    :func:`spark_schema`."""
    fields = list(_ARROW_FIELDS)
    if include_headers:
        fields.append(pa.field("headers", ARROW_HEADERS_TYPE))
    return pa.schema(fields)
