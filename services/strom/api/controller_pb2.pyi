from strom.api import common_pb2 as _common_pb2
from strom.api import metadata_pb2 as _metadata_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOURCE_TYPE_UNSPECIFIED: _ClassVar[ResourceType]
    RESOURCE_TYPE_TOPIC: _ClassVar[ResourceType]
    RESOURCE_TYPE_NODE: _ClassVar[ResourceType]

class ConfigSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONFIG_SOURCE_UNSPECIFIED: _ClassVar[ConfigSource]
    CONFIG_SOURCE_DEFAULT: _ClassVar[ConfigSource]
    CONFIG_SOURCE_STATIC_NODE_CONFIG: _ClassVar[ConfigSource]
    CONFIG_SOURCE_TOPIC: _ClassVar[ConfigSource]
    CONFIG_SOURCE_DYNAMIC_DEFAULT_NODE_CONFIG: _ClassVar[ConfigSource]

class AlterConfigOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALTER_CONFIG_OP_SET: _ClassVar[AlterConfigOp]
    ALTER_CONFIG_OP_DELETE: _ClassVar[AlterConfigOp]
    ALTER_CONFIG_OP_APPEND: _ClassVar[AlterConfigOp]
    ALTER_CONFIG_OP_SUBTRACT: _ClassVar[AlterConfigOp]

class ElectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELECTION_TYPE_PREFERRED: _ClassVar[ElectionType]
    ELECTION_TYPE_UNCLEAN: _ClassVar[ElectionType]
RESOURCE_TYPE_UNSPECIFIED: ResourceType
RESOURCE_TYPE_TOPIC: ResourceType
RESOURCE_TYPE_NODE: ResourceType
CONFIG_SOURCE_UNSPECIFIED: ConfigSource
CONFIG_SOURCE_DEFAULT: ConfigSource
CONFIG_SOURCE_STATIC_NODE_CONFIG: ConfigSource
CONFIG_SOURCE_TOPIC: ConfigSource
CONFIG_SOURCE_DYNAMIC_DEFAULT_NODE_CONFIG: ConfigSource
ALTER_CONFIG_OP_SET: AlterConfigOp
ALTER_CONFIG_OP_DELETE: AlterConfigOp
ALTER_CONFIG_OP_APPEND: AlterConfigOp
ALTER_CONFIG_OP_SUBTRACT: AlterConfigOp
ELECTION_TYPE_PREFERRED: ElectionType
ELECTION_TYPE_UNCLEAN: ElectionType

class ReplicaAssignment(_message.Message):
    __slots__ = ("partition", "replicas")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatableTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatableTopic(_message.Message):
    __slots__ = ("name", "num_partitions", "replication_factor", "assignments", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_partitions: int
    replication_factor: int
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaAssignment]
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[ReplicaAssignment, _Mapping]]] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[CreatableTopicResult, _Mapping]]] = ...) -> None: ...

class CreatableTopicResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message", "topic_id", "num_partitions", "replication_factor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    topic_id: str
    num_partitions: int
    replication_factor: int
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topic_id: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    topics: _containers.RepeatedCompositeFieldContainer[DeletableTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[DeletableTopicResult, _Mapping]]] = ...) -> None: ...

class DeletableTopicResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message", "topic_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    topic_id: str
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topic_id: _Optional[str] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatePartitionsTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatePartitionsTopic(_message.Message):
    __slots__ = ("name", "count", "assignments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaAssignment]
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[ReplicaAssignment, _Mapping]]] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[CreatePartitionsTopicResult, _Mapping]]] = ...) -> None: ...

class CreatePartitionsTopicResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeConfigsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "config_names")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAMES_FIELD_NUMBER: _ClassVar[int]
    resource_type: ResourceType
    resource_name: str
    config_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource_type: _Optional[_Union[ResourceType, str]] = ..., resource_name: _Optional[str] = ..., config_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeConfigsRequest(_message.Message):
    __slots__ = ("resources", "include_documentation")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DOCUMENTATION_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[DescribeConfigsResource]
    include_documentation: bool
    def __init__(self, resources: _Optional[_Iterable[_Union[DescribeConfigsResource, _Mapping]]] = ..., include_documentation: _Optional[bool] = ...) -> None: ...

class ConfigEntry(_message.Message):
    __slots__ = ("name", "value", "source", "read_only", "sensitive", "documentation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    source: ConfigSource
    read_only: bool
    sensitive: bool
    documentation: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., source: _Optional[_Union[ConfigSource, str]] = ..., read_only: _Optional[bool] = ..., sensitive: _Optional[bool] = ..., documentation: _Optional[str] = ...) -> None: ...

class DescribeConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    results: _containers.RepeatedCompositeFieldContainer[DescribeConfigsResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., results: _Optional[_Iterable[_Union[DescribeConfigsResult, _Mapping]]] = ...) -> None: ...

class DescribeConfigsResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error_code", "error_message", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: ResourceType
    resource_name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    configs: _containers.RepeatedCompositeFieldContainer[ConfigEntry]
    def __init__(self, resource_type: _Optional[_Union[ResourceType, str]] = ..., resource_name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[ConfigEntry, _Mapping]]] = ...) -> None: ...

class AlterableConfig(_message.Message):
    __slots__ = ("name", "op", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: AlterConfigOp
    value: str
    def __init__(self, name: _Optional[str] = ..., op: _Optional[_Union[AlterConfigOp, str]] = ..., value: _Optional[str] = ...) -> None: ...

class AlterConfigsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: ResourceType
    resource_name: str
    configs: _containers.RepeatedCompositeFieldContainer[AlterableConfig]
    def __init__(self, resource_type: _Optional[_Union[ResourceType, str]] = ..., resource_name: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[AlterableConfig, _Mapping]]] = ...) -> None: ...

class AlterConfigsRequest(_message.Message):
    __slots__ = ("resources", "validate_only")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[AlterConfigsResource]
    validate_only: bool
    def __init__(self, resources: _Optional[_Iterable[_Union[AlterConfigsResource, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class AlterConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    results: _containers.RepeatedCompositeFieldContainer[AlterConfigsResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., results: _Optional[_Iterable[_Union[AlterConfigsResult, _Mapping]]] = ...) -> None: ...

class AlterConfigsResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error_code", "error_message")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    resource_type: ResourceType
    resource_name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, resource_type: _Optional[_Union[ResourceType, str]] = ..., resource_name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ("include_coordinators",)
    INCLUDE_COORDINATORS_FIELD_NUMBER: _ClassVar[int]
    include_coordinators: bool
    def __init__(self, include_coordinators: _Optional[bool] = ...) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "cluster_id", "controller_epoch", "nodes", "coordinator_shards", "transaction_shards")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_SHARDS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_SHARDS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    cluster_id: str
    controller_epoch: int
    nodes: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.NodeRegistration]
    coordinator_shards: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.CoordinatorShardOwner]
    transaction_shards: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.CoordinatorShardOwner]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., cluster_id: _Optional[str] = ..., controller_epoch: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[_metadata_pb2.NodeRegistration, _Mapping]]] = ..., coordinator_shards: _Optional[_Iterable[_Union[_metadata_pb2.CoordinatorShardOwner, _Mapping]]] = ..., transaction_shards: _Optional[_Iterable[_Union[_metadata_pb2.CoordinatorShardOwner, _Mapping]]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("include_internal",)
    INCLUDE_INTERNAL_FIELD_NUMBER: _ClassVar[int]
    include_internal: bool
    def __init__(self, include_internal: _Optional[bool] = ...) -> None: ...

class ListedTopic(_message.Message):
    __slots__ = ("name", "topic_id", "partition_count", "internal")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    partition_count: int
    internal: bool
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., partition_count: _Optional[int] = ..., internal: _Optional[bool] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    topics: _containers.RepeatedCompositeFieldContainer[ListedTopic]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[ListedTopic, _Mapping]]] = ...) -> None: ...

class DescribeTopicsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class PartitionDescription(_message.Message):
    __slots__ = ("partition", "state", "offline_replicas")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    state: _metadata_pb2.PartitionState
    offline_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., state: _Optional[_Union[_metadata_pb2.PartitionState, _Mapping]] = ..., offline_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class TopicDescription(_message.Message):
    __slots__ = ("name", "error_code", "error_message", "metadata", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    metadata: _metadata_pb2.TopicMetadata
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionDescription]
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., metadata: _Optional[_Union[_metadata_pb2.TopicMetadata, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[PartitionDescription, _Mapping]]] = ...) -> None: ...

class DescribeTopicsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    topics: _containers.RepeatedCompositeFieldContainer[TopicDescription]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicDescription, _Mapping]]] = ...) -> None: ...

class AlterPartitionItem(_message.Message):
    __slots__ = ("topic", "topic_id", "partition", "leader_epoch", "partition_epoch", "new_isr", "leader_recovery_state", "new_isr_incarnations", "resign_reason")
    class NewIsrIncarnationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_RECOVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    NEW_ISR_INCARNATIONS_FIELD_NUMBER: _ClassVar[int]
    RESIGN_REASON_FIELD_NUMBER: _ClassVar[int]
    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: _containers.RepeatedScalarFieldContainer[int]
    leader_recovery_state: _metadata_pb2.LeaderRecoveryState
    new_isr_incarnations: _containers.ScalarMap[int, str]
    resign_reason: str
    def __init__(self, topic: _Optional[str] = ..., topic_id: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., new_isr: _Optional[_Iterable[int]] = ..., leader_recovery_state: _Optional[_Union[_metadata_pb2.LeaderRecoveryState, str]] = ..., new_isr_incarnations: _Optional[_Mapping[int, str]] = ..., resign_reason: _Optional[str] = ...) -> None: ...

class AlterPartitionRequest(_message.Message):
    __slots__ = ("leader_id", "leader_incarnation", "partitions")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader_incarnation: str
    partitions: _containers.RepeatedCompositeFieldContainer[AlterPartitionItem]
    def __init__(self, leader_id: _Optional[int] = ..., leader_incarnation: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[AlterPartitionItem, _Mapping]]] = ...) -> None: ...

class AlterPartitionResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "state")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    state: _metadata_pb2.PartitionState
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., state: _Optional[_Union[_metadata_pb2.PartitionState, _Mapping]] = ...) -> None: ...

class AlterPartitionResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    partitions: _containers.RepeatedCompositeFieldContainer[AlterPartitionResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[AlterPartitionResult, _Mapping]]] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("election_type", "partitions", "timeout_ms")
    ELECTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    election_type: ElectionType
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    timeout_ms: int
    def __init__(self, election_type: _Optional[_Union[ElectionType, str]] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ElectLeadersResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "leader", "leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    leader: int
    leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    partitions: _containers.RepeatedCompositeFieldContainer[ElectLeadersResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[ElectLeadersResult, _Mapping]]] = ...) -> None: ...

class PartitionReassignment(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "cancel")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    cancel: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., cancel: _Optional[bool] = ...) -> None: ...

class AlterPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("partitions", "timeout_ms")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionReassignment]
    timeout_ms: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionReassignment, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class PartitionReassignmentResult(_message.Message):
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

class AlterPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionReassignmentResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[PartitionReassignmentResult, _Mapping]]] = ...) -> None: ...

class ListPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class OngoingReassignment(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "adding_replicas", "removing_replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class ListPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "reassignments")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    reassignments: _containers.RepeatedCompositeFieldContainer[OngoingReassignment]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., reassignments: _Optional[_Iterable[_Union[OngoingReassignment, _Mapping]]] = ...) -> None: ...

class ControlledShutdownRequest(_message.Message):
    __slots__ = ("node_id", "incarnation_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    incarnation_id: str
    def __init__(self, node_id: _Optional[int] = ..., incarnation_id: _Optional[str] = ...) -> None: ...

class ControlledShutdownResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "remaining_partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    REMAINING_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    remaining_partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., remaining_partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class AllocateProducerIdsRequest(_message.Message):
    __slots__ = ("node_id", "incarnation_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    incarnation_id: str
    def __init__(self, node_id: _Optional[int] = ..., incarnation_id: _Optional[str] = ...) -> None: ...

class AllocateProducerIdsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "first_producer_id", "count")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    FIRST_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    first_producer_id: int
    count: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., first_producer_id: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class CreateAclsRequest(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AclBinding]
    def __init__(self, acls: _Optional[_Iterable[_Union[_metadata_pb2.AclBinding, _Mapping]]] = ...) -> None: ...

class CreateAclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Error]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., results: _Optional[_Iterable[_Union[_common_pb2.Error, _Mapping]]] = ...) -> None: ...

class AclBindingFilter(_message.Message):
    __slots__ = ("principal", "operation", "permission", "resource_type", "resource_name", "pattern_type")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    operation: _metadata_pb2.AclOperation
    permission: _metadata_pb2.AclPermission
    resource_type: _metadata_pb2.AclResourceType
    resource_name: str
    pattern_type: _metadata_pb2.PatternType
    def __init__(self, principal: _Optional[str] = ..., operation: _Optional[_Union[_metadata_pb2.AclOperation, str]] = ..., permission: _Optional[_Union[_metadata_pb2.AclPermission, str]] = ..., resource_type: _Optional[_Union[_metadata_pb2.AclResourceType, str]] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[_Union[_metadata_pb2.PatternType, str]] = ...) -> None: ...

class DescribeAclsRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: AclBindingFilter
    def __init__(self, filter: _Optional[_Union[AclBindingFilter, _Mapping]] = ...) -> None: ...

class DescribeAclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "acls")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    acls: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AclBinding]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., acls: _Optional[_Iterable[_Union[_metadata_pb2.AclBinding, _Mapping]]] = ...) -> None: ...

class DeleteAclsRequest(_message.Message):
    __slots__ = ("filters",)
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[AclBindingFilter]
    def __init__(self, filters: _Optional[_Iterable[_Union[AclBindingFilter, _Mapping]]] = ...) -> None: ...

class DeleteAclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "deleted")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    deleted: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.AclBinding]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., deleted: _Optional[_Iterable[_Union[_metadata_pb2.AclBinding, _Mapping]]] = ...) -> None: ...

class AlterClientQuotasRequest(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.ClientQuota]
    def __init__(self, quotas: _Optional[_Iterable[_Union[_metadata_pb2.ClientQuota, _Mapping]]] = ...) -> None: ...

class AlterClientQuotasResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ...) -> None: ...

class DescribeClientQuotasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClientQuotasResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "controller", "quotas")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    controller: _common_pb2.Node
    quotas: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.ClientQuota]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., controller: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., quotas: _Optional[_Iterable[_Union[_metadata_pb2.ClientQuota, _Mapping]]] = ...) -> None: ...
