from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_STARTING: _ClassVar[NodeState]
    NODE_STATE_RUNNING: _ClassVar[NodeState]
    NODE_STATE_SHUTTING_DOWN: _ClassVar[NodeState]

class LeaderRecoveryState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEADER_RECOVERY_STATE_RECOVERED: _ClassVar[LeaderRecoveryState]
    LEADER_RECOVERY_STATE_RECOVERING: _ClassVar[LeaderRecoveryState]

class AclOperation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_OPERATION_UNSPECIFIED: _ClassVar[AclOperation]
    ACL_OPERATION_ALL: _ClassVar[AclOperation]
    ACL_OPERATION_READ: _ClassVar[AclOperation]
    ACL_OPERATION_WRITE: _ClassVar[AclOperation]
    ACL_OPERATION_CREATE: _ClassVar[AclOperation]
    ACL_OPERATION_DELETE: _ClassVar[AclOperation]
    ACL_OPERATION_ALTER: _ClassVar[AclOperation]
    ACL_OPERATION_DESCRIBE: _ClassVar[AclOperation]
    ACL_OPERATION_CLUSTER_ACTION: _ClassVar[AclOperation]

class AclResourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_RESOURCE_TYPE_UNSPECIFIED: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_TOPIC: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_GROUP: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_CLUSTER: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_TRANSACTIONAL_ID: _ClassVar[AclResourceType]

class AclPermission(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_PERMISSION_UNSPECIFIED: _ClassVar[AclPermission]
    ACL_PERMISSION_ALLOW: _ClassVar[AclPermission]
    ACL_PERMISSION_DENY: _ClassVar[AclPermission]

class PatternType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATTERN_TYPE_UNSPECIFIED: _ClassVar[PatternType]
    PATTERN_TYPE_LITERAL: _ClassVar[PatternType]
    PATTERN_TYPE_PREFIXED: _ClassVar[PatternType]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_STARTING: NodeState
NODE_STATE_RUNNING: NodeState
NODE_STATE_SHUTTING_DOWN: NodeState
LEADER_RECOVERY_STATE_RECOVERED: LeaderRecoveryState
LEADER_RECOVERY_STATE_RECOVERING: LeaderRecoveryState
ACL_OPERATION_UNSPECIFIED: AclOperation
ACL_OPERATION_ALL: AclOperation
ACL_OPERATION_READ: AclOperation
ACL_OPERATION_WRITE: AclOperation
ACL_OPERATION_CREATE: AclOperation
ACL_OPERATION_DELETE: AclOperation
ACL_OPERATION_ALTER: AclOperation
ACL_OPERATION_DESCRIBE: AclOperation
ACL_OPERATION_CLUSTER_ACTION: AclOperation
ACL_RESOURCE_TYPE_UNSPECIFIED: AclResourceType
ACL_RESOURCE_TYPE_TOPIC: AclResourceType
ACL_RESOURCE_TYPE_GROUP: AclResourceType
ACL_RESOURCE_TYPE_CLUSTER: AclResourceType
ACL_RESOURCE_TYPE_TRANSACTIONAL_ID: AclResourceType
ACL_PERMISSION_UNSPECIFIED: AclPermission
ACL_PERMISSION_ALLOW: AclPermission
ACL_PERMISSION_DENY: AclPermission
PATTERN_TYPE_UNSPECIFIED: PatternType
PATTERN_TYPE_LITERAL: PatternType
PATTERN_TYPE_PREFIXED: PatternType

class ClusterInfo(_message.Message):
    __slots__ = ("cluster_id", "created_ms", "metadata_version")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    created_ms: int
    metadata_version: int
    def __init__(self, cluster_id: _Optional[str] = ..., created_ms: _Optional[int] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class NodeRegistration(_message.Message):
    __slots__ = ("node_id", "host", "port", "metrics_port", "rack", "incarnation_id", "start_time_ms", "state", "software_version")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    host: str
    port: int
    metrics_port: int
    rack: str
    incarnation_id: str
    start_time_ms: int
    state: NodeState
    software_version: str
    def __init__(self, node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., metrics_port: _Optional[int] = ..., rack: _Optional[str] = ..., incarnation_id: _Optional[str] = ..., start_time_ms: _Optional[int] = ..., state: _Optional[_Union[NodeState, str]] = ..., software_version: _Optional[str] = ...) -> None: ...

class ControllerInfo(_message.Message):
    __slots__ = ("controller_id", "host", "port", "metrics_port", "epoch", "elected_ms", "incarnation_id")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ELECTED_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    controller_id: int
    host: str
    port: int
    metrics_port: int
    epoch: int
    elected_ms: int
    incarnation_id: str
    def __init__(self, controller_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., metrics_port: _Optional[int] = ..., epoch: _Optional[int] = ..., elected_ms: _Optional[int] = ..., incarnation_id: _Optional[str] = ...) -> None: ...

class TopicMetadata(_message.Message):
    __slots__ = ("topic_id", "name", "partition_count", "replication_factor", "configs", "created_ms", "deleting", "internal")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_FIELD_NUMBER: _ClassVar[int]
    topic_id: str
    name: str
    partition_count: int
    replication_factor: int
    configs: _containers.ScalarMap[str, str]
    created_ms: int
    deleting: bool
    internal: bool
    def __init__(self, topic_id: _Optional[str] = ..., name: _Optional[str] = ..., partition_count: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Mapping[str, str]] = ..., created_ms: _Optional[int] = ..., deleting: _Optional[bool] = ..., internal: _Optional[bool] = ...) -> None: ...

class PartitionState(_message.Message):
    __slots__ = ("replicas", "leader", "leader_epoch", "isr", "partition_epoch", "adding_replicas", "removing_replicas", "leader_recovery_state", "topic_id", "original_replicas")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_RECOVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    leader_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    partition_epoch: int
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    leader_recovery_state: LeaderRecoveryState
    topic_id: str
    original_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replicas: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., partition_epoch: _Optional[int] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ..., leader_recovery_state: _Optional[_Union[LeaderRecoveryState, str]] = ..., topic_id: _Optional[str] = ..., original_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class CoordinatorShardOwner(_message.Message):
    __slots__ = ("shard", "coordinator_id", "host", "port", "epoch", "producer_id", "acquired_ms", "incarnation_id", "metrics_port")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    shard: int
    coordinator_id: int
    host: str
    port: int
    epoch: int
    producer_id: int
    acquired_ms: int
    incarnation_id: str
    metrics_port: int
    def __init__(self, shard: _Optional[int] = ..., coordinator_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., epoch: _Optional[int] = ..., producer_id: _Optional[int] = ..., acquired_ms: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., metrics_port: _Optional[int] = ...) -> None: ...

class ProducerIdBlock(_message.Message):
    __slots__ = ("next_producer_id", "block_size", "last_assigned_to", "updated_ms")
    NEXT_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_ASSIGNED_TO_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    next_producer_id: int
    block_size: int
    last_assigned_to: int
    updated_ms: int
    def __init__(self, next_producer_id: _Optional[int] = ..., block_size: _Optional[int] = ..., last_assigned_to: _Optional[int] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class AclBinding(_message.Message):
    __slots__ = ("principal", "operation", "permission", "resource_type", "resource_name", "pattern_type")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    operation: AclOperation
    permission: AclPermission
    resource_type: AclResourceType
    resource_name: str
    pattern_type: PatternType
    def __init__(self, principal: _Optional[str] = ..., operation: _Optional[_Union[AclOperation, str]] = ..., permission: _Optional[_Union[AclPermission, str]] = ..., resource_type: _Optional[_Union[AclResourceType, str]] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[_Union[PatternType, str]] = ...) -> None: ...

class ClientQuota(_message.Message):
    __slots__ = ("principal", "produce_bytes_per_second", "fetch_bytes_per_second", "requests_per_second")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PRODUCE_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    FETCH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    principal: str
    produce_bytes_per_second: float
    fetch_bytes_per_second: float
    requests_per_second: float
    def __init__(self, principal: _Optional[str] = ..., produce_bytes_per_second: _Optional[float] = ..., fetch_bytes_per_second: _Optional[float] = ..., requests_per_second: _Optional[float] = ...) -> None: ...

class NodeConfigs(_message.Message):
    __slots__ = ("configs",)
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.ScalarMap[str, str]
    def __init__(self, configs: _Optional[_Mapping[str, str]] = ...) -> None: ...
