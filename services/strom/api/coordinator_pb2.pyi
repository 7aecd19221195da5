from strom.api import common_pb2 as _common_pb2
from strom.api import storage_pb2 as _storage_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_STATE_UNSPECIFIED: _ClassVar[TransactionState]
    TRANSACTION_STATE_EMPTY: _ClassVar[TransactionState]
    TRANSACTION_STATE_ONGOING: _ClassVar[TransactionState]
    TRANSACTION_STATE_PREPARE_COMMIT: _ClassVar[TransactionState]
    TRANSACTION_STATE_PREPARE_ABORT: _ClassVar[TransactionState]
    TRANSACTION_STATE_COMPLETE_COMMIT: _ClassVar[TransactionState]
    TRANSACTION_STATE_COMPLETE_ABORT: _ClassVar[TransactionState]
    TRANSACTION_STATE_DEAD: _ClassVar[TransactionState]

class GroupState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_STATE_UNSPECIFIED: _ClassVar[GroupState]
    GROUP_STATE_EMPTY: _ClassVar[GroupState]
    GROUP_STATE_ASSIGNING: _ClassVar[GroupState]
    GROUP_STATE_RECONCILING: _ClassVar[GroupState]
    GROUP_STATE_STABLE: _ClassVar[GroupState]
    GROUP_STATE_DEAD: _ClassVar[GroupState]

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_UNSPECIFIED: _ClassVar[MemberState]
    MEMBER_STATE_STABLE: _ClassVar[MemberState]
    MEMBER_STATE_UNREVOKED_PARTITIONS: _ClassVar[MemberState]
    MEMBER_STATE_UNRELEASED_PARTITIONS: _ClassVar[MemberState]
TRANSACTION_STATE_UNSPECIFIED: TransactionState
TRANSACTION_STATE_EMPTY: TransactionState
TRANSACTION_STATE_ONGOING: TransactionState
TRANSACTION_STATE_PREPARE_COMMIT: TransactionState
TRANSACTION_STATE_PREPARE_ABORT: TransactionState
TRANSACTION_STATE_COMPLETE_COMMIT: TransactionState
TRANSACTION_STATE_COMPLETE_ABORT: TransactionState
TRANSACTION_STATE_DEAD: TransactionState
GROUP_STATE_UNSPECIFIED: GroupState
GROUP_STATE_EMPTY: GroupState
GROUP_STATE_ASSIGNING: GroupState
GROUP_STATE_RECONCILING: GroupState
GROUP_STATE_STABLE: GroupState
GROUP_STATE_DEAD: GroupState
MEMBER_STATE_UNSPECIFIED: MemberState
MEMBER_STATE_STABLE: MemberState
MEMBER_STATE_UNREVOKED_PARTITIONS: MemberState
MEMBER_STATE_UNRELEASED_PARTITIONS: MemberState

class ConsumerGroupHeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "instance_id", "rack_id", "rebalance_timeout_ms", "subscribed_topic_names", "subscribed_topic_regex", "server_assignor", "owned_topic_partitions", "host_node_id", "host_node_incarnation_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_REGEX_FIELD_NUMBER: _ClassVar[int]
    SERVER_ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    OWNED_TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    HOST_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_NODE_INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str
    rack_id: str
    rebalance_timeout_ms: int
    subscribed_topic_names: _containers.RepeatedScalarFieldContainer[str]
    subscribed_topic_regex: str
    server_assignor: str
    owned_topic_partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    host_node_id: int
    host_node_incarnation_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., instance_id: _Optional[str] = ..., rack_id: _Optional[str] = ..., rebalance_timeout_ms: _Optional[int] = ..., subscribed_topic_names: _Optional[_Iterable[str]] = ..., subscribed_topic_regex: _Optional[str] = ..., server_assignor: _Optional[str] = ..., owned_topic_partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., host_node_id: _Optional[int] = ..., host_node_incarnation_id: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("topic_partitions",)
    TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic_partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    def __init__(self, topic_partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ...) -> None: ...

class ConsumerGroupHeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "member_id", "member_epoch", "heartbeat_interval_ms", "assignment")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ...) -> None: ...

class OffsetCommitRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "topics", "committer_id", "commit_sequence")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    COMMITTER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[OffsetCommitTopic]
    committer_id: str
    commit_sequence: int
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[OffsetCommitTopic, _Mapping]]] = ..., committer_id: _Optional[str] = ..., commit_sequence: _Optional[int] = ...) -> None: ...

class OffsetCommitTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetCommitPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetCommitPartition, _Mapping]]] = ...) -> None: ...

class OffsetCommitPartition(_message.Message):
    __slots__ = ("partition", "committed_offset", "committed_leader_epoch", "metadata")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    partition: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str
    def __init__(self, partition: _Optional[int] = ..., committed_offset: _Optional[int] = ..., committed_leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class OffsetCommitResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[OffsetCommitTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[OffsetCommitTopicResult, _Mapping]]] = ...) -> None: ...

class OffsetCommitTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetCommitPartitionResult]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetCommitPartitionResult, _Mapping]]] = ...) -> None: ...

class OffsetCommitPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class OffsetFetchRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "topics", "require_stable")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_STABLE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    require_stable: bool
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., require_stable: _Optional[bool] = ...) -> None: ...

class OffsetFetchResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[OffsetFetchTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[OffsetFetchTopicResult, _Mapping]]] = ...) -> None: ...

class OffsetFetchTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetFetchPartitionResult]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetFetchPartitionResult, _Mapping]]] = ...) -> None: ...

class OffsetFetchPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "committed_offset", "committed_leader_epoch", "metadata")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    committed_offset: int
    committed_leader_epoch: int
    metadata: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., committed_offset: _Optional[int] = ..., committed_leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("states_filter",)
    STATES_FILTER_FIELD_NUMBER: _ClassVar[int]
    states_filter: _containers.RepeatedScalarFieldContainer[GroupState]
    def __init__(self, states_filter: _Optional[_Iterable[_Union[GroupState, str]]] = ...) -> None: ...

class ListedGroup(_message.Message):
    __slots__ = ("group_id", "state", "shard", "member_count")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    state: GroupState
    shard: int
    member_count: int
    def __init__(self, group_id: _Optional[str] = ..., state: _Optional[_Union[GroupState, str]] = ..., shard: _Optional[int] = ..., member_count: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "shards", "groups")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    shards: _containers.RepeatedScalarFieldContainer[int]
    groups: _containers.RepeatedCompositeFieldContainer[ListedGroup]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., shards: _Optional[_Iterable[int]] = ..., groups: _Optional[_Iterable[_Union[ListedGroup, _Mapping]]] = ...) -> None: ...

class DescribeGroupsRequest(_message.Message):
    __slots__ = ("group_ids", "include_offsets")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    include_offsets: bool
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., include_offsets: _Optional[bool] = ...) -> None: ...

class DescribedMember(_message.Message):
    __slots__ = ("member_id", "instance_id", "rack_id", "client_id", "client_host", "member_epoch", "state", "subscribed_topic_names", "subscribed_topic_regex", "assignment", "target_assignment", "partitions_pending_revocation")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_REGEX_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_PENDING_REVOCATION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    instance_id: str
    rack_id: str
    client_id: str
    client_host: str
    member_epoch: int
    state: MemberState
    subscribed_topic_names: _containers.RepeatedScalarFieldContainer[str]
    subscribed_topic_regex: str
    assignment: Assignment
    target_assignment: Assignment
    partitions_pending_revocation: Assignment
    def __init__(self, member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., rack_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., member_epoch: _Optional[int] = ..., state: _Optional[_Union[MemberState, str]] = ..., subscribed_topic_names: _Optional[_Iterable[str]] = ..., subscribed_topic_regex: _Optional[str] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., target_assignment: _Optional[_Union[Assignment, _Mapping]] = ..., partitions_pending_revocation: _Optional[_Union[Assignment, _Mapping]] = ...) -> None: ...

class GroupPartitionOffset(_message.Message):
    __slots__ = ("topic", "partition", "committed_offset", "committed_leader_epoch", "metadata", "end_offset", "lag", "member_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str
    end_offset: int
    lag: int
    member_id: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., committed_offset: _Optional[int] = ..., committed_leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ..., end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., member_id: _Optional[str] = ...) -> None: ...

class DescribedGroup(_message.Message):
    __slots__ = ("group_id", "error_code", "error_message", "state", "group_epoch", "assignment_epoch", "assignor_name", "members", "offsets")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    state: GroupState
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    members: _containers.RepeatedCompositeFieldContainer[DescribedMember]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupPartitionOffset]
    def __init__(self, group_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., state: _Optional[_Union[GroupState, str]] = ..., group_epoch: _Optional[int] = ..., assignment_epoch: _Optional[int] = ..., assignor_name: _Optional[str] = ..., members: _Optional[_Iterable[_Union[DescribedMember, _Mapping]]] = ..., offsets: _Optional[_Iterable[_Union[GroupPartitionOffset, _Mapping]]] = ...) -> None: ...

class DescribeGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[DescribedGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[DescribedGroup, _Mapping]]] = ...) -> None: ...

class DeleteGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteGroupsResult(_message.Message):
    __slots__ = ("group_id", "error_code", "error_message")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, group_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteGroupsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DeleteGroupsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DeleteGroupsResult, _Mapping]]] = ...) -> None: ...

class DeleteOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "topics")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    def __init__(self, group_id: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ...) -> None: ...

class DeleteOffsetsPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteOffsetsTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteOffsetsPartitionResult]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[DeleteOffsetsPartitionResult, _Mapping]]] = ...) -> None: ...

class DeleteOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[DeleteOffsetsTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[DeleteOffsetsTopicResult, _Mapping]]] = ...) -> None: ...

class AddPartitionsToTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "topics")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ...) -> None: ...

class AddPartitionsToTxnResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[AddPartitionsToTxnTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[AddPartitionsToTxnTopicResult, _Mapping]]] = ...) -> None: ...

class AddPartitionsToTxnTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[AddPartitionsToTxnPartitionResult]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[AddPartitionsToTxnPartitionResult, _Mapping]]] = ...) -> None: ...

class AddPartitionsToTxnPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class AddOffsetsToTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "group_id")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., group_id: _Optional[str] = ...) -> None: ...

class AddOffsetsToTxnResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class EndTxnRequest(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "committed")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., committed: _Optional[bool] = ...) -> None: ...

class EndTxnResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class TxnOffsetCommitRequest(_message.Message):
    __slots__ = ("transactional_id", "group_id", "producer_id", "producer_epoch", "member_id", "member_epoch", "topics")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    member_id: str
    member_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[OffsetCommitTopic]
    def __init__(self, transactional_id: _Optional[str] = ..., group_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[OffsetCommitTopic, _Mapping]]] = ...) -> None: ...

class CompleteTxnOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "producer_id", "producer_epoch", "committed")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    def __init__(self, group_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., committed: _Optional[bool] = ...) -> None: ...

class CompleteTxnOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeTransactionsRequest(_message.Message):
    __slots__ = ("transactional_ids",)
    TRANSACTIONAL_IDS_FIELD_NUMBER: _ClassVar[int]
    transactional_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, transactional_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionDescription]
    def __init__(self, transactions: _Optional[_Iterable[_Union[TransactionDescription, _Mapping]]] = ...) -> None: ...

class TransactionDescription(_message.Message):
    __slots__ = ("transactional_id", "error_code", "error_message", "state", "producer_id", "producer_epoch", "transaction_timeout_ms", "transaction_start_ms", "topics", "groups", "shard")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_START_MS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    state: TransactionState
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_ms: int
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    groups: _containers.RepeatedScalarFieldContainer[str]
    shard: int
    def __init__(self, transactional_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., state: _Optional[_Union[TransactionState, str]] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., transaction_timeout_ms: _Optional[int] = ..., transaction_start_ms: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., groups: _Optional[_Iterable[str]] = ..., shard: _Optional[int] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("state_filters", "producer_id_filters")
    STATE_FILTERS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FILTERS_FIELD_NUMBER: _ClassVar[int]
    state_filters: _containers.RepeatedScalarFieldContainer[TransactionState]
    producer_id_filters: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, state_filters: _Optional[_Iterable[_Union[TransactionState, str]]] = ..., producer_id_filters: _Optional[_Iterable[int]] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("error_code", "transactions", "unloaded_shards")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    UNLOADED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    transactions: _containers.RepeatedCompositeFieldContainer[TransactionListing]
    unloaded_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., transactions: _Optional[_Iterable[_Union[TransactionListing, _Mapping]]] = ..., unloaded_shards: _Optional[_Iterable[int]] = ...) -> None: ...

class TransactionListing(_message.Message):
    __slots__ = ("transactional_id", "producer_id", "state")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    producer_id: int
    state: TransactionState
    def __init__(self, transactional_id: _Optional[str] = ..., producer_id: _Optional[int] = ..., state: _Optional[_Union[TransactionState, str]] = ...) -> None: ...

class TransactionLogKey(_message.Message):
    __slots__ = ("transactional_id",)
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    def __init__(self, transactional_id: _Optional[str] = ...) -> None: ...

class TransactionLogValue(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "transaction_timeout_ms", "state", "topics", "groups", "transaction_start_ms", "last_update_ms", "timed_out_epoch", "granted_from_epoch")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_START_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_MS_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FROM_EPOCH_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TransactionState
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    groups: _containers.RepeatedScalarFieldContainer[str]
    transaction_start_ms: int
    last_update_ms: int
    timed_out_epoch: int
    granted_from_epoch: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., transaction_timeout_ms: _Optional[int] = ..., state: _Optional[_Union[TransactionState, str]] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., groups: _Optional[_Iterable[str]] = ..., transaction_start_ms: _Optional[int] = ..., last_update_ms: _Optional[int] = ..., timed_out_epoch: _Optional[int] = ..., granted_from_epoch: _Optional[int] = ...) -> None: ...

class GroupRecordKey(_message.Message):
    __slots__ = ("offset_commit", "group_metadata", "member_metadata", "target_assignment_metadata", "target_assignment_member", "current_member_assignment", "pending_txn_offsets")
    OFFSET_COMMIT_FIELD_NUMBER: _ClassVar[int]
    GROUP_METADATA_FIELD_NUMBER: _ClassVar[int]
    MEMBER_METADATA_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_MEMBER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_MEMBER_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_TXN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offset_commit: OffsetCommitKey
    group_metadata: GroupMetadataKey
    member_metadata: MemberMetadataKey
    target_assignment_metadata: TargetAssignmentMetadataKey
    target_assignment_member: TargetAssignmentMemberKey
    current_member_assignment: CurrentMemberAssignmentKey
    pending_txn_offsets: PendingTxnOffsetsKey
    def __init__(self, offset_commit: _Optional[_Union[OffsetCommitKey, _Mapping]] = ..., group_metadata: _Optional[_Union[GroupMetadataKey, _Mapping]] = ..., member_metadata: _Optional[_Union[MemberMetadataKey, _Mapping]] = ..., target_assignment_metadata: _Optional[_Union[TargetAssignmentMetadataKey, _Mapping]] = ..., target_assignment_member: _Optional[_Union[TargetAssignmentMemberKey, _Mapping]] = ..., current_member_assignment: _Optional[_Union[CurrentMemberAssignmentKey, _Mapping]] = ..., pending_txn_offsets: _Optional[_Union[PendingTxnOffsetsKey, _Mapping]] = ...) -> None: ...

class PendingTxnOffsetsKey(_message.Message):
    __slots__ = ("group_id", "producer_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    producer_id: int
    def __init__(self, group_id: _Optional[str] = ..., producer_id: _Optional[int] = ...) -> None: ...

class PendingTxnOffsetsValue(_message.Message):
    __slots__ = ("producer_epoch", "offsets")
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    producer_epoch: int
    offsets: _containers.RepeatedCompositeFieldContainer[PendingTxnOffset]
    def __init__(self, producer_epoch: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[PendingTxnOffset, _Mapping]]] = ...) -> None: ...

class PendingTxnOffset(_message.Message):
    __slots__ = ("topic", "partition", "committed_offset", "committed_leader_epoch", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., committed_offset: _Optional[int] = ..., committed_leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class OffsetCommitKey(_message.Message):
    __slots__ = ("group_id", "topic", "partition")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    partition: int
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class OffsetCommitValue(_message.Message):
    __slots__ = ("committed_offset", "committed_leader_epoch", "metadata", "commit_timestamp_ms", "topic_id", "committer_id", "commit_sequence")
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    committed_offset: int
    committed_leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    topic_id: str
    committer_id: str
    commit_sequence: int
    def __init__(self, committed_offset: _Optional[int] = ..., committed_leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ..., commit_timestamp_ms: _Optional[int] = ..., topic_id: _Optional[str] = ..., committer_id: _Optional[str] = ..., commit_sequence: _Optional[int] = ...) -> None: ...

class GroupMetadataKey(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class GroupMetadataValue(_message.Message):
    __slots__ = ("group_epoch", "subscribed_topic_partitions", "assignor_name", "created_ms")
    class SubscribedTopicPartitionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    group_epoch: int
    subscribed_topic_partitions: _containers.ScalarMap[str, int]
    assignor_name: str
    created_ms: int
    def __init__(self, group_epoch: _Optional[int] = ..., subscribed_topic_partitions: _Optional[_Mapping[str, int]] = ..., assignor_name: _Optional[str] = ..., created_ms: _Optional[int] = ...) -> None: ...

class MemberMetadataKey(_message.Message):
    __slots__ = ("group_id", "member_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class MemberMetadataValue(_message.Message):
    __slots__ = ("instance_id", "rack_id", "client_id", "client_host", "subscribed_topic_names", "subscribed_topic_regex", "server_assignor", "rebalance_timeout_ms")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_REGEX_FIELD_NUMBER: _ClassVar[int]
    SERVER_ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    rack_id: str
    client_id: str
    client_host: str
    subscribed_topic_names: _containers.RepeatedScalarFieldContainer[str]
    subscribed_topic_regex: str
    server_assignor: str
    rebalance_timeout_ms: int
    def __init__(self, instance_id: _Optional[str] = ..., rack_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., subscribed_topic_names: _Optional[_Iterable[str]] = ..., subscribed_topic_regex: _Optional[str] = ..., server_assignor: _Optional[str] = ..., rebalance_timeout_ms: _Optional[int] = ...) -> None: ...

class TargetAssignmentMetadataKey(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class TargetAssignmentMetadataValue(_message.Message):
    __slots__ = ("assignment_epoch",)
    ASSIGNMENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    assignment_epoch: int
    def __init__(self, assignment_epoch: _Optional[int] = ...) -> None: ...

class TargetAssignmentMemberKey(_message.Message):
    __slots__ = ("group_id", "member_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class TargetAssignmentMemberValue(_message.Message):
    __slots__ = ("topic_partitions",)
    TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic_partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    def __init__(self, topic_partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ...) -> None: ...

class CurrentMemberAssignmentKey(_message.Message):
    __slots__ = ("group_id", "member_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class CurrentMemberAssignmentValue(_message.Message):
    __slots__ = ("member_epoch", "previous_member_epoch", "state", "assigned_partitions", "partitions_pending_revocation")
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_PENDING_REVOCATION_FIELD_NUMBER: _ClassVar[int]
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned_partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    partitions_pending_revocation: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartitions]
    def __init__(self, member_epoch: _Optional[int] = ..., previous_member_epoch: _Optional[int] = ..., state: _Optional[_Union[MemberState, str]] = ..., assigned_partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ..., partitions_pending_revocation: _Optional[_Iterable[_Union[_common_pb2.TopicPartitions, _Mapping]]] = ...) -> None: ...
