from strom.api import common_pb2 as _common_pb2
from strom.api import storage_pb2 as _storage_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_GZIP: _ClassVar[Compression]
    COMPRESSION_SNAPPY: _ClassVar[Compression]
    COMPRESSION_LZ4: _ClassVar[Compression]
    COMPRESSION_ZSTD: _ClassVar[Compression]

class Acks(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACKS_ALL: _ClassVar[Acks]
    ACKS_LEADER: _ClassVar[Acks]
    ACKS_NONE: _ClassVar[Acks]

class StartPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    START_POSITION_LATEST: _ClassVar[StartPosition]
    START_POSITION_EARLIEST: _ClassVar[StartPosition]

class TimestampType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIMESTAMP_TYPE_CREATE_TIME: _ClassVar[TimestampType]
    TIMESTAMP_TYPE_LOG_APPEND_TIME: _ClassVar[TimestampType]
COMPRESSION_NONE: Compression
COMPRESSION_GZIP: Compression
COMPRESSION_SNAPPY: Compression
COMPRESSION_LZ4: Compression
COMPRESSION_ZSTD: Compression
ACKS_ALL: Acks
ACKS_LEADER: Acks
ACKS_NONE: Acks
START_POSITION_LATEST: StartPosition
START_POSITION_EARLIEST: StartPosition
TIMESTAMP_TYPE_CREATE_TIME: TimestampType
TIMESTAMP_TYPE_LOG_APPEND_TIME: TimestampType

class RecordColumns(_message.Message):
    __slots__ = ("keys", "values", "timestamps", "header_counts", "header_keys", "header_values", "null_keys", "null_values", "timestamp_types")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    HEADER_COUNTS_FIELD_NUMBER: _ClassVar[int]
    HEADER_KEYS_FIELD_NUMBER: _ClassVar[int]
    HEADER_VALUES_FIELD_NUMBER: _ClassVar[int]
    NULL_KEYS_FIELD_NUMBER: _ClassVar[int]
    NULL_VALUES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_TYPES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    timestamps: _containers.RepeatedScalarFieldContainer[int]
    header_counts: _containers.RepeatedScalarFieldContainer[int]
    header_keys: _containers.RepeatedScalarFieldContainer[str]
    header_values: _containers.RepeatedScalarFieldContainer[bytes]
    null_keys: _containers.RepeatedScalarFieldContainer[int]
    null_values: _containers.RepeatedScalarFieldContainer[int]
    timestamp_types: _containers.RepeatedScalarFieldContainer[TimestampType]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., values: _Optional[_Iterable[bytes]] = ..., timestamps: _Optional[_Iterable[int]] = ..., header_counts: _Optional[_Iterable[int]] = ..., header_keys: _Optional[_Iterable[str]] = ..., header_values: _Optional[_Iterable[bytes]] = ..., null_keys: _Optional[_Iterable[int]] = ..., null_values: _Optional[_Iterable[int]] = ..., timestamp_types: _Optional[_Iterable[_Union[TimestampType, str]]] = ...) -> None: ...

class ProduceRecordsRequest(_message.Message):
    __slots__ = ("topic", "partition", "records", "acks", "compression", "timeout_ms", "producer")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    records: RecordColumns
    acks: Acks
    compression: Compression
    timeout_ms: int
    producer: ProducerSequence
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., records: _Optional[_Union[RecordColumns, _Mapping]] = ..., acks: _Optional[_Union[Acks, str]] = ..., compression: _Optional[_Union[Compression, str]] = ..., timeout_ms: _Optional[int] = ..., producer: _Optional[_Union[ProducerSequence, _Mapping]] = ...) -> None: ...

class ProducerSequence(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "base_sequence")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    base_sequence: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., base_sequence: _Optional[int] = ...) -> None: ...

class ProduceRecordsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions", "offsets", "results", "throttle_time_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    results: _containers.RepeatedCompositeFieldContainer[ProduceRecordsPartitionResult]
    throttle_time_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., offsets: _Optional[_Iterable[int]] = ..., results: _Optional[_Iterable[_Union[ProduceRecordsPartitionResult, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class ProduceRecordsPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "base_offset", "record_count")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    base_offset: int
    record_count: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., base_offset: _Optional[int] = ..., record_count: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("group_id", "topics", "partitions", "start", "auto_commit", "max_records_per_message", "max_bytes_per_message", "isolation_level")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    AUTO_COMMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStart]
    start: StartPosition
    auto_commit: bool
    max_records_per_message: int
    max_bytes_per_message: int
    isolation_level: _storage_pb2.IsolationLevel
    def __init__(self, group_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., partitions: _Optional[_Iterable[_Union[PartitionStart, _Mapping]]] = ..., start: _Optional[_Union[StartPosition, str]] = ..., auto_commit: _Optional[bool] = ..., max_records_per_message: _Optional[int] = ..., max_bytes_per_message: _Optional[int] = ..., isolation_level: _Optional[_Union[_storage_pb2.IsolationLevel, str]] = ...) -> None: ...

class PartitionStart(_message.Message):
    __slots__ = ("topic", "partition", "offset", "timestamp_ms", "position")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    position: StartPosition
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., position: _Optional[_Union[StartPosition, str]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("records", "assignment", "throttle_time_ms")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    records: PartitionRecords
    assignment: SubscriptionAssignment
    throttle_time_ms: int
    def __init__(self, records: _Optional[_Union[PartitionRecords, _Mapping]] = ..., assignment: _Optional[_Union[SubscriptionAssignment, _Mapping]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class PartitionRecords(_message.Message):
    __slots__ = ("topic", "partition", "offsets", "records", "high_watermark")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    records: RecordColumns
    high_watermark: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ..., records: _Optional[_Union[RecordColumns, _Mapping]] = ..., high_watermark: _Optional[int] = ...) -> None: ...

class SubscriptionAssignment(_message.Message):
    __slots__ = ("subscription_id", "partitions", "member_id")
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    subscription_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    member_id: str
    def __init__(self, subscription_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., member_id: _Optional[str] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("subscription_id", "offsets")
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    subscription_id: str
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, subscription_id: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...

class PartitionOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    results: _containers.RepeatedCompositeFieldContainer[CommitOffsetsResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[CommitOffsetsResult, _Mapping]]] = ...) -> None: ...

class CommitOffsetsResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...
