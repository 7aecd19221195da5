"""Record batches: the unit of everything strom stores and moves (DESIGN §4).

Producers encode, brokers only read headers (:func:`scan_batches`) and patch the two
leader-set fields, consumers decode to Python records or to Arrow tables.
"""

from strom.record.batch import (
    Record,
    RecordBatch,
    batches_to_arrow,
    decode_batches,
    decode_records,
    decode_to_arrow,
    encode_arrow,
    encode_batch,
    encode_body,
    encode_records,
)
from strom.record.codecs import CODEC_IDS, CODEC_NAMES, codec_id
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    DEFAULT_MAX_BATCH_BYTES,
    HEADER_SIZE,
    MAGIC,
    TIMESTAMP_CREATE,
    TIMESTAMP_LOG_APPEND,
    BatchHeader,
    TimestampType,
    patch_base_offset,
    patch_leader_epoch,
    read_header,
    scan_batches,
    set_log_append_time,
)
from strom.record.schema import BODY_SCHEMA_V1, RECORDS_SCHEMA

__all__ = [
    "BODY_SCHEMA_V1",
    "CODEC_IDS",
    "CODEC_NAMES",
    "DEFAULT_MAX_BATCH_BYTES",
    "HEADER_SIZE",
    "MAGIC",
    "RECORDS_SCHEMA",
    "TIMESTAMP_CREATE",
    "TIMESTAMP_LOG_APPEND",
    "BatchHeader",
    "InvalidBatchError",
    "Record",
    "RecordBatch",
    "TimestampType",
    "batches_to_arrow",
    "codec_id",
    "decode_batches",
    "decode_records",
    "decode_to_arrow",
    "encode_arrow",
    "encode_batch",
    "encode_body",
    "encode_records",
    "patch_base_offset",
    "patch_leader_epoch",
    "read_header",
    "scan_batches",
    "set_log_append_time",
]
