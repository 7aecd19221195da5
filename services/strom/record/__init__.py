"""Record batches: the unit of everything strom stores and moves (DESIGN §4).

Producers encode, brokers only read headers (:func:`scan_batches`) and patch the two
leader-set fields, consumers decode to Python records or to Arrow tables.

The names are loaded on first use (as :mod:`strom`'s are): a module that needs only the
header (``strom.record.header``, the CLI's argument parsing) does not import pyarrow and
numpy with the batch codec. Type checkers read the ``TYPE_CHECKING`` imports below, which
name the same modules (tests/unit/test_typing_surface.py keeps the two in step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strom.lazy_names import lazy_names

if TYPE_CHECKING:
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

#: Each lazily loaded name -> the module it comes from.
_LAZY: dict[str, str] = {
    "Record": "strom.record.batch",
    "RecordBatch": "strom.record.batch",
    "batches_to_arrow": "strom.record.batch",
    "decode_batches": "strom.record.batch",
    "decode_records": "strom.record.batch",
    "decode_to_arrow": "strom.record.batch",
    "encode_arrow": "strom.record.batch",
    "encode_batch": "strom.record.batch",
    "encode_body": "strom.record.batch",
    "encode_records": "strom.record.batch",
    "CODEC_IDS": "strom.record.codecs",
    "CODEC_NAMES": "strom.record.codecs",
    "codec_id": "strom.record.codecs",
    "InvalidBatchError": "strom.record.errors",
    "DEFAULT_MAX_BATCH_BYTES": "strom.record.header",
    "HEADER_SIZE": "strom.record.header",
    "MAGIC": "strom.record.header",
    "TIMESTAMP_CREATE": "strom.record.header",
    "TIMESTAMP_LOG_APPEND": "strom.record.header",
    "BatchHeader": "strom.record.header",
    "TimestampType": "strom.record.header",
    "patch_base_offset": "strom.record.header",
    "patch_leader_epoch": "strom.record.header",
    "read_header": "strom.record.header",
    "scan_batches": "strom.record.header",
    "set_log_append_time": "strom.record.header",
    "BODY_SCHEMA_V1": "strom.record.schema",
    "RECORDS_SCHEMA": "strom.record.schema",
}

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

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
