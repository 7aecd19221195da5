"""Python side of ``strom.v1.ErrorCode``: retriable flags, descriptions and exceptions.

Every RPC result carries an ``ErrorCode`` (protos/strom/v1/common.proto). Clients and services
turn a non-NONE code into an exception with :func:`error_for` (or :func:`raise_for_error`) and
decide whether to retry from :attr:`StromError.retriable`, so that retry policy lives in one
table instead of in every call site. The table mirrors the "Retriable: yes/no" comment of each
code in common.proto; tests/unit/test_errors.py fails when the two disagree or a code is missing.

"Retriable" means a client library may retry on its own (after the action the code's comment
names, e.g. refreshing metadata or finding the coordinator again) until its overall timeout;
non-retriable errors go to the caller or trigger a specific recovery (e.g. a consumer rejoining
its group after FENCED_MEMBER_EPOCH).

Errors raised on the client side without a server code (connection failures, client timeouts)
use :class:`StromError` with ``code=None``.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

from strom.api import common_pb2

ErrorCode = common_pb2.ErrorCode


class ErrorInfo(NamedTuple):
    """What strom knows about one error code."""

    retriable: bool
    description: str


_E = ErrorCode
#: Every ErrorCode -> (retriable, description). Keep in step with common.proto's comments.
ERRORS: dict[int, ErrorInfo] = {
    _E.NONE: ErrorInfo(False, "success"),
    # general
    _E.UNKNOWN_SERVER_ERROR: ErrorInfo(False, "the server hit an unexpected condition"),
    _E.INVALID_REQUEST: ErrorInfo(False, "the request is malformed or inconsistent"),
    _E.REQUEST_TIMED_OUT: ErrorInfo(True, "the server timed out; the outcome is unknown"),
    _E.POLICY_VIOLATION: ErrorInfo(False, "a server-side policy forbids the request"),
    _E.UNSUPPORTED_VERSION: ErrorInfo(False, "the server does not support this feature/format"),
    _E.BROKER_NOT_AVAILABLE: ErrorInfo(True, "a node the request refers to is not live"),
    _E.METADATA_STORE_FULL: ErrorInfo(False, "etcd is out of space and refuses every write"),
    # topics, partitions, configs
    _E.UNKNOWN_TOPIC_OR_PARTITION: ErrorInfo(True, "the topic or partition does not exist"),
    _E.TOPIC_ALREADY_EXISTS: ErrorInfo(False, "a topic with this name already exists"),
    _E.INVALID_TOPIC: ErrorInfo(False, "the topic name is invalid or not allowed here"),
    _E.INVALID_PARTITIONS: ErrorInfo(False, "the partition count is invalid"),
    _E.INVALID_REPLICATION_FACTOR: ErrorInfo(False, "the replication factor is invalid"),
    _E.INVALID_REPLICA_ASSIGNMENT: ErrorInfo(False, "the replica assignment is invalid"),
    _E.INVALID_CONFIG: ErrorInfo(False, "a config name or value is invalid"),
    _E.TOPIC_DELETION_IN_PROGRESS: ErrorInfo(True, "a topic of this name is being deleted"),
    _E.INCONSISTENT_TOPIC_ID: ErrorInfo(False, "the topic was deleted and re-created"),
    # log and records
    _E.OFFSET_OUT_OF_RANGE: ErrorInfo(False, "the offset is outside the partition's log"),
    _E.CORRUPT_MESSAGE: ErrorInfo(False, "a record batch failed validation (CRC, header)"),
    _E.MESSAGE_TOO_LARGE: ErrorInfo(False, "a record batch exceeds max.message.bytes"),
    _E.INVALID_RECORD: ErrorInfo(False, "a record batch breaks a topic rule"),
    _E.STORAGE_ERROR: ErrorInfo(True, "the node cannot access the partition's log directory"),
    _E.OFFSET_NOT_AVAILABLE: ErrorInfo(True, "the leader cannot answer the offset yet"),
    _E.INVALID_TIMESTAMP: ErrorInfo(
        False, "a batch timestamp is outside message.timestamp.before/after.max.ms"
    ),
    # leadership and replication
    _E.NOT_LEADER_OR_FOLLOWER: ErrorInfo(True, "this node is not the partition's leader"),
    _E.LEADER_NOT_AVAILABLE: ErrorInfo(True, "the partition has no leader right now"),
    _E.FENCED_LEADER_EPOCH: ErrorInfo(True, "the leader epoch in the request is stale"),
    _E.UNKNOWN_LEADER_EPOCH: ErrorInfo(True, "the leader epoch is newer than the node knows"),
    _E.NOT_ENOUGH_REPLICAS: ErrorInfo(True, "ISR below min.insync.replicas; nothing appended"),
    _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorInfo(
        True, "ISR shrank below min.insync.replicas after the append"
    ),
    _E.REPLICA_NOT_AVAILABLE: ErrorInfo(True, "the replica is not available on this node"),
    _E.INELIGIBLE_REPLICA: ErrorInfo(False, "the proposed ISR contains an ineligible replica"),
    _E.INVALID_PARTITION_EPOCH: ErrorInfo(False, "the partition state changed (stale epoch)"),
    _E.PREFERRED_LEADER_NOT_AVAILABLE: ErrorInfo(
        True, "the preferred replica is not live or not in the ISR"
    ),
    _E.ELIGIBLE_LEADERS_NOT_AVAILABLE: ErrorInfo(True, "no replica is eligible to lead"),
    _E.ELECTION_NOT_NEEDED: ErrorInfo(False, "the wanted leader already leads"),
    _E.REASSIGNMENT_IN_PROGRESS: ErrorInfo(False, "a partition reassignment is in progress"),
    _E.NO_REASSIGNMENT_IN_PROGRESS: ErrorInfo(False, "no reassignment is in progress"),
    # idempotent producers
    _E.OUT_OF_ORDER_SEQUENCE: ErrorInfo(False, "a sequence gap: an earlier batch was lost"),
    _E.DUPLICATE_SEQUENCE: ErrorInfo(False, "the batch was already appended (treat as success)"),
    _E.INVALID_PRODUCER_EPOCH: ErrorInfo(False, "the producer was fenced by a newer epoch"),
    _E.UNKNOWN_PRODUCER_ID: ErrorInfo(False, "the leader has no state for this producer id"),
    # controller
    _E.NOT_CONTROLLER: ErrorInfo(True, "this controller is not the active one"),
    _E.STALE_NODE_INCARNATION: ErrorInfo(False, "the request comes from a stale node process"),
    # group coordinator
    _E.NOT_COORDINATOR: ErrorInfo(True, "this coordinator does not own the group's shard"),
    _E.COORDINATOR_LOAD_IN_PROGRESS: ErrorInfo(True, "the coordinator is still loading the group"),
    _E.COORDINATOR_NOT_AVAILABLE: ErrorInfo(True, "no coordinator owns the group's shard now"),
    _E.UNKNOWN_MEMBER_ID: ErrorInfo(False, "the member is not in the group"),
    _E.FENCED_MEMBER_EPOCH: ErrorInfo(False, "the member's epoch was fenced; rejoin"),
    _E.FENCED_INSTANCE_ID: ErrorInfo(False, "another consumer took over this instance id"),
    _E.UNRELEASED_INSTANCE_ID: ErrorInfo(False, "the instance id is held by a live member"),
    _E.GROUP_ID_NOT_FOUND: ErrorInfo(False, "the group does not exist"),
    _E.NON_EMPTY_GROUP: ErrorInfo(False, "the group still has members"),
    _E.STALE_MEMBER_EPOCH: ErrorInfo(False, "the member epoch is older than the current one"),
    _E.INVALID_GROUP_ID: ErrorInfo(False, "the group id is invalid"),
    _E.UNSUPPORTED_ASSIGNOR: ErrorInfo(False, "the requested assignor does not exist"),
    _E.GROUP_MAX_SIZE_REACHED: ErrorInfo(False, "the group has reached its maximum size"),
    _E.INVALID_REGULAR_EXPRESSION: ErrorInfo(False, "the subscription regex is invalid"),
    _E.GROUP_SUBSCRIBED_TO_TOPIC: ErrorInfo(False, "the group is still subscribed to the topic"),
    _E.UNSTABLE_OFFSET_COMMIT: ErrorInfo(True, "an offset commit is still pending"),
    _E.OFFSET_METADATA_TOO_LARGE: ErrorInfo(False, "the offset metadata string is too long"),
    # transactions
    _E.INVALID_TXN_STATE: ErrorInfo(False, "the request does not fit the transaction's state"),
    _E.PRODUCER_FENCED: ErrorInfo(False, "a newer producer with this transactional id took over"),
    _E.CONCURRENT_TRANSACTIONS: ErrorInfo(True, "the previous transaction is still completing"),
    _E.TRANSACTIONAL_ID_NOT_FOUND: ErrorInfo(False, "the transactional id is unknown"),
    _E.INVALID_TRANSACTION_TIMEOUT: ErrorInfo(False, "the transaction timeout is out of range"),
    _E.INVALID_PRODUCER_ID_MAPPING: ErrorInfo(
        False, "the producer id does not belong to the transactional id"
    ),
    _E.TRANSACTION_COORDINATOR_FENCED: ErrorInfo(
        True, "a newer transaction coordinator owns the shard"
    ),
    # security
    _E.TOPIC_AUTHORIZATION_FAILED: ErrorInfo(False, "the ACLs do not allow the topic"),
    _E.SECURITY_DISABLED: ErrorInfo(False, "ACLs are not enforced on this cluster (no --acls)"),
    _E.GROUP_AUTHORIZATION_FAILED: ErrorInfo(False, "the ACLs do not allow the group"),
    _E.CLUSTER_AUTHORIZATION_FAILED: ErrorInfo(False, "the ACLs do not allow it on the cluster"),
    _E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ErrorInfo(
        False, "the ACLs do not allow the transactional id"
    ),
}
del _E

#: Codes after which a client refreshes its cluster metadata (leaders, nodes, controller)
#: before retrying.
METADATA_REFRESH_CODES: frozenset[int] = frozenset(
    {
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INCONSISTENT_TOPIC_ID,
        ErrorCode.STORAGE_ERROR,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NOT_CONTROLLER,
    }
)

#: A Fetch's per-partition codes after which the partition's leader is looked up again
#: before it is fetched again (the consumer's fetcher and the Spark connector's reader).
FETCH_LEADER_CODES: frozenset[int] = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.STORAGE_ERROR,
        ErrorCode.BROKER_NOT_AVAILABLE,
    }
)

#: Codes after which a client looks its group coordinator up again (FindCoordinator).
COORDINATOR_REFRESH_CODES: frozenset[int] = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
    }
)


def error_name(code: int | None) -> str:
    """The ErrorCode name of `code` ("CLIENT_ERROR" for None, a placeholder if unknown)."""
    if code is None:
        return "CLIENT_ERROR"
    try:
        return ErrorCode.Name(code)
    except ValueError:
        return f"UNKNOWN_ERROR_CODE_{code}"


def is_retriable(code: int) -> bool:
    """Whether a client may retry after `code`; unknown codes (a newer server) are not."""
    info = ERRORS.get(code)
    return info.retriable if info is not None else False


class StromError(Exception):
    """Base of every strom error.

    Attributes:
        code: the ``ErrorCode`` value, or None for errors raised on the client side.
        retriable: whether a client may retry (from :data:`ERRORS` unless overridden).
        message: human-readable detail (the server's error_message, or the code's description).
    """

    #: The code instances of this class carry unless given another; None on the base class.
    default_code: ClassVar[int | None] = None

    def __init__(
        self,
        message: str | None = None,
        *,
        code: int | None = None,
        retriable: bool | None = None,
    ) -> None:
        self.code: int | None = code if code is not None else self.default_code
        info = ERRORS.get(self.code) if self.code is not None else None
        self.retriable: bool = (
            retriable if retriable is not None else (info.retriable if info else False)
        )
        self.message: str = message or (info.description if info else "strom error")
        super().__init__(self.message)

    @property
    def name(self) -> str:
        """The ErrorCode name, e.g. "NOT_LEADER_OR_FOLLOWER"."""
        return error_name(self.code)

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"

    def __repr__(self) -> str:
        cls = type(self).__name__
        return f"{cls}({self.message!r}, code={self.code}, retriable={self.retriable})"

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive Exception's default pickling; Spark executors and
        # multiprocessing workers send these exceptions back pickled.
        return (_rebuild, (type(self), self.message, self.code, self.retriable))


def _rebuild(cls: type[StromError], message: str, code: int | None, retriable: bool) -> StromError:
    return cls(message, code=code, retriable=retriable)


# ---- general ----


class UnknownServerError(StromError):
    """UNKNOWN_SERVER_ERROR: an unexpected failure on the server."""

    default_code = ErrorCode.UNKNOWN_SERVER_ERROR


class InvalidRequestError(StromError):
    """INVALID_REQUEST: the request is malformed (a client bug)."""

    default_code = ErrorCode.INVALID_REQUEST


class InvalidArgumentError(InvalidRequestError, ValueError):
    """An Admin argument refused before anything is sent: a ValueError, as the Producer's and
    the Consumer's, and an InvalidRequestError, as the Admin documented (found from outside:
    the three clients raised different types for the same mistake; both ``except`` clauses
    keep working)."""


class InvalidArgumentTypeError(InvalidRequestError, TypeError):
    """As :class:`InvalidArgumentError` for an argument of the wrong type: a TypeError."""


class RequestTimedOutError(StromError):
    """REQUEST_TIMED_OUT: the server gave up waiting; the outcome is unknown."""

    default_code = ErrorCode.REQUEST_TIMED_OUT


class PolicyViolationError(StromError):
    """POLICY_VIOLATION: a server-side policy forbids the request."""

    default_code = ErrorCode.POLICY_VIOLATION


class UnsupportedVersionError(StromError):
    """UNSUPPORTED_VERSION: the server does not support the feature or format."""

    default_code = ErrorCode.UNSUPPORTED_VERSION


class BrokerNotAvailableError(StromError):
    """BROKER_NOT_AVAILABLE: a node the request refers to is not live."""

    default_code = ErrorCode.BROKER_NOT_AVAILABLE


class MetadataStoreFullError(StromError):
    """METADATA_STORE_FULL: etcd is out of space (NOSPACE alarm) and refuses every write
    until an operator frees space and disarms the alarm; the message says how."""

    default_code = ErrorCode.METADATA_STORE_FULL


# ---- topics, partitions, configs ----


class UnknownTopicOrPartitionError(StromError):
    """UNKNOWN_TOPIC_OR_PARTITION: no such topic or partition (or not known yet)."""

    default_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class TopicAlreadyExistsError(StromError):
    """TOPIC_ALREADY_EXISTS: CreateTopics for an existing name."""

    default_code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidTopicError(StromError):
    """INVALID_TOPIC: the topic name is invalid or not allowed here."""

    default_code = ErrorCode.INVALID_TOPIC


class InvalidPartitionsError(StromError):
    """INVALID_PARTITIONS: the partition count is invalid."""

    default_code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(StromError):
    """INVALID_REPLICATION_FACTOR: the replication factor is invalid."""

    default_code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidReplicaAssignmentError(StromError):
    """INVALID_REPLICA_ASSIGNMENT: a manual replica assignment is invalid."""

    default_code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class InvalidConfigError(StromError):
    """INVALID_CONFIG: a config name or value is invalid."""

    default_code = ErrorCode.INVALID_CONFIG


class TopicDeletionInProgressError(StromError):
    """TOPIC_DELETION_IN_PROGRESS: a topic of that name is still being deleted."""

    default_code = ErrorCode.TOPIC_DELETION_IN_PROGRESS


class InconsistentTopicIdError(StromError):
    """INCONSISTENT_TOPIC_ID: the topic was deleted and re-created."""

    default_code = ErrorCode.INCONSISTENT_TOPIC_ID


# ---- log and records ----


class OffsetOutOfRangeError(StromError):
    """OFFSET_OUT_OF_RANGE: the offset is outside the partition's log."""

    default_code = ErrorCode.OFFSET_OUT_OF_RANGE


class CorruptMessageError(StromError):
    """CORRUPT_MESSAGE: a record batch failed validation (header, CRC, counts)."""

    default_code = ErrorCode.CORRUPT_MESSAGE


class MessageTooLargeError(StromError):
    """MESSAGE_TOO_LARGE: a record batch exceeds the topic's max.message.bytes."""

    default_code = ErrorCode.MESSAGE_TOO_LARGE


#: kafka-python's name for it (``kafka.errors.MessageSizeTooLargeError``, error code 10), so
#: that code ported from kafka-python catches strom's oversized records unchanged.
MessageSizeTooLargeError = MessageTooLargeError


class InvalidRecordError(StromError):
    """INVALID_RECORD: a batch breaks a rule of the log (a producer's control batch, a
    transactional batch without a producer id)."""

    default_code = ErrorCode.INVALID_RECORD


class StorageError(StromError):
    """STORAGE_ERROR: the node cannot access the partition's log directory."""

    default_code = ErrorCode.STORAGE_ERROR


class OffsetNotAvailableError(StromError):
    """OFFSET_NOT_AVAILABLE: the (new) leader cannot answer the offset lookup yet."""

    default_code = ErrorCode.OFFSET_NOT_AVAILABLE


class InvalidTimestampError(StromError):
    """INVALID_TIMESTAMP: a batch's timestamp is too far from the leader's clock for the
    topic's message.timestamp.before.max.ms / message.timestamp.after.max.ms."""

    default_code = ErrorCode.INVALID_TIMESTAMP


# ---- leadership and replication ----


class NotLeaderError(StromError):
    """NOT_LEADER_OR_FOLLOWER: this node is not the partition's leader."""

    default_code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class LeaderNotAvailableError(StromError):
    """LEADER_NOT_AVAILABLE: the partition has no leader right now."""

    default_code = ErrorCode.LEADER_NOT_AVAILABLE


class FencedLeaderEpochError(StromError):
    """FENCED_LEADER_EPOCH: the leader epoch the request carries is stale."""

    default_code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(StromError):
    """UNKNOWN_LEADER_EPOCH: the leader epoch is newer than the node knows."""

    default_code = ErrorCode.UNKNOWN_LEADER_EPOCH


class NotEnoughReplicasError(StromError):
    """NOT_ENOUGH_REPLICAS: ISR below min.insync.replicas; nothing was appended."""

    default_code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(StromError):
    """NOT_ENOUGH_REPLICAS_AFTER_APPEND: appended, but the ISR shrank before commit."""

    default_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class ReplicaNotAvailableError(StromError):
    """REPLICA_NOT_AVAILABLE: the replica is not available on this node."""

    default_code = ErrorCode.REPLICA_NOT_AVAILABLE


class IneligibleReplicaError(StromError):
    """INELIGIBLE_REPLICA: an AlterPartition ISR contains an ineligible replica."""

    default_code = ErrorCode.INELIGIBLE_REPLICA


class InvalidPartitionEpochError(StromError):
    """INVALID_PARTITION_EPOCH: AlterPartition based on a stale partition state."""

    default_code = ErrorCode.INVALID_PARTITION_EPOCH


class PreferredLeaderNotAvailableError(StromError):
    """PREFERRED_LEADER_NOT_AVAILABLE: the preferred replica cannot lead now."""

    default_code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


class EligibleLeadersNotAvailableError(StromError):
    """ELIGIBLE_LEADERS_NOT_AVAILABLE: no replica is eligible to lead."""

    default_code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


class ElectionNotNeededError(StromError):
    """ELECTION_NOT_NEEDED: the wanted leader already leads (treat as success)."""

    default_code = ErrorCode.ELECTION_NOT_NEEDED


class ReassignmentInProgressError(StromError):
    """REASSIGNMENT_IN_PROGRESS: conflicts with a reassignment in progress."""

    default_code = ErrorCode.REASSIGNMENT_IN_PROGRESS


class NoReassignmentInProgressError(StromError):
    """NO_REASSIGNMENT_IN_PROGRESS: nothing to cancel (treat as success)."""

    default_code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


# ---- idempotent producers ----


class OutOfOrderSequenceError(StromError):
    """OUT_OF_ORDER_SEQUENCE: a sequence gap; the producer must bump its epoch."""

    default_code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class DuplicateSequenceError(StromError):
    """DUPLICATE_SEQUENCE: already appended long ago (success, offsets unknown)."""

    default_code = ErrorCode.DUPLICATE_SEQUENCE


class InvalidProducerEpochError(StromError):
    """INVALID_PRODUCER_EPOCH: the producer was fenced by a newer epoch. Fatal for an
    idempotent producer; in a transaction abortable: ``abort_transaction()`` asks the
    coordinator for the id back, which it gives when its own timeout abort bumped the epoch
    (Kafka's KIP-588), and ProducerFencedError follows when a new instance did."""

    default_code = ErrorCode.INVALID_PRODUCER_EPOCH


class UnknownProducerIdError(StromError):
    """UNKNOWN_PRODUCER_ID: no state for the producer id; bump the epoch and restart at 0."""

    default_code = ErrorCode.UNKNOWN_PRODUCER_ID


# ---- controller ----


class NotControllerError(StromError):
    """NOT_CONTROLLER: not the active controller; retry at the one the response names."""

    default_code = ErrorCode.NOT_CONTROLLER


class StaleNodeIncarnationError(StromError):
    """STALE_NODE_INCARNATION: the request comes from a previous life of the node."""

    default_code = ErrorCode.STALE_NODE_INCARNATION


# ---- group coordinator ----


class NotCoordinatorError(StromError):
    """NOT_COORDINATOR: this coordinator does not own the group; find it again."""

    default_code = ErrorCode.NOT_COORDINATOR


class CoordinatorLoadInProgressError(StromError):
    """COORDINATOR_LOAD_IN_PROGRESS: the coordinator is still loading the shard."""

    default_code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class CoordinatorNotAvailableError(StromError):
    """COORDINATOR_NOT_AVAILABLE: no coordinator owns the group's shard right now."""

    default_code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class UnknownMemberIdError(StromError):
    """UNKNOWN_MEMBER_ID: not a member of the group; rejoin with epoch 0."""

    default_code = ErrorCode.UNKNOWN_MEMBER_ID


class FencedMemberEpochError(StromError):
    """FENCED_MEMBER_EPOCH: the member was fenced; drop partitions and rejoin."""

    default_code = ErrorCode.FENCED_MEMBER_EPOCH


class FencedInstanceIdError(StromError):
    """FENCED_INSTANCE_ID: another consumer took over this group instance id."""

    default_code = ErrorCode.FENCED_INSTANCE_ID


class UnreleasedInstanceIdError(StromError):
    """UNRELEASED_INSTANCE_ID: the group instance id is held by a live member."""

    default_code = ErrorCode.UNRELEASED_INSTANCE_ID


class GroupIdNotFoundError(StromError):
    """GROUP_ID_NOT_FOUND: the group does not exist."""

    default_code = ErrorCode.GROUP_ID_NOT_FOUND


class NonEmptyGroupError(StromError):
    """NON_EMPTY_GROUP: the operation needs a group without members."""

    default_code = ErrorCode.NON_EMPTY_GROUP


class StaleMemberEpochError(StromError):
    """STALE_MEMBER_EPOCH: commit with an old member epoch; retry with the new one."""

    default_code = ErrorCode.STALE_MEMBER_EPOCH


class InvalidGroupIdError(StromError):
    """INVALID_GROUP_ID: the group id is invalid (empty)."""

    default_code = ErrorCode.INVALID_GROUP_ID


class UnsupportedAssignorError(StromError):
    """UNSUPPORTED_ASSIGNOR: the requested server assignor does not exist."""

    default_code = ErrorCode.UNSUPPORTED_ASSIGNOR


class GroupMaxSizeReachedError(StromError):
    """GROUP_MAX_SIZE_REACHED: the group is full."""

    default_code = ErrorCode.GROUP_MAX_SIZE_REACHED


class InvalidRegularExpressionError(StromError):
    """INVALID_REGULAR_EXPRESSION: the subscription regex does not compile."""

    default_code = ErrorCode.INVALID_REGULAR_EXPRESSION


class GroupSubscribedToTopicError(StromError):
    """GROUP_SUBSCRIBED_TO_TOPIC: cannot delete offsets of a subscribed topic."""

    default_code = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC


class UnstableOffsetCommitError(StromError):
    """UNSTABLE_OFFSET_COMMIT: a commit for the partition is still pending."""

    default_code = ErrorCode.UNSTABLE_OFFSET_COMMIT


class OffsetMetadataTooLargeError(StromError):
    """OFFSET_METADATA_TOO_LARGE: the commit's metadata string is too long."""

    default_code = ErrorCode.OFFSET_METADATA_TOO_LARGE


class InvalidTxnStateError(StromError):
    """INVALID_TXN_STATE: the request does not fit the transaction's state."""

    default_code = ErrorCode.INVALID_TXN_STATE


class ProducerFencedError(StromError):
    """PRODUCER_FENCED: a newer instance with the same transactional id took over. Fatal:
    close the producer."""

    default_code = ErrorCode.PRODUCER_FENCED


class ConcurrentTransactionsError(StromError):
    """CONCURRENT_TRANSACTIONS: the previous transaction is still being completed."""

    default_code = ErrorCode.CONCURRENT_TRANSACTIONS


class TransactionalIdNotFoundError(StromError):
    """TRANSACTIONAL_ID_NOT_FOUND: the coordinator does not know the transactional id."""

    default_code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


class InvalidTransactionTimeoutError(StromError):
    """INVALID_TRANSACTION_TIMEOUT: transaction_timeout_ms is out of range."""

    default_code = ErrorCode.INVALID_TRANSACTION_TIMEOUT


class InvalidProducerIdMappingError(StromError):
    """INVALID_PRODUCER_ID_MAPPING: the producer id is not the transactional id's."""

    default_code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


class TransactionCoordinatorFencedError(StromError):
    """TRANSACTION_COORDINATOR_FENCED: a newer transaction coordinator owns the shard."""

    default_code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class ConcurrentModificationError(StromError):
    """A client meant for one thread was entered by a second one while a first was inside
    (Kafka's ConcurrentModificationException, "KafkaConsumer is not safe for multi-threaded
    access"): a Consumer polled from several threads hands records out twice and skips
    others. Raised on the second thread, at once; the first goes on undisturbed."""


class ForkedClientError(StromError):
    """A client made before ``os.fork()`` was used in the child: gRPC connections do not
    survive a fork (the child has none of the threads that serve them), so create clients
    after the fork, in each process (strom.client.forks)."""


class AuthenticationError(StromError):
    """The server did not accept who the client is (gRPC UNAUTHENTICATED): no client
    certificate or bearer token, or one it does not trust. Not retriable."""

    @property
    def name(self) -> str:
        return "AUTHENTICATION_FAILED" if self.code is None else super().name


class AuthorizationError(StromError):
    """The server's ACLs do not allow the request (gRPC PERMISSION_DENIED); the message names
    the missing permission. Not retriable."""

    @property
    def name(self) -> str:
        return "AUTHORIZATION_FAILED" if self.code is None else super().name


class TopicAuthorizationFailedError(AuthorizationError):
    """TOPIC_AUTHORIZATION_FAILED: the principal may not describe the topic it named."""

    default_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(AuthorizationError):
    """GROUP_AUTHORIZATION_FAILED: the principal may not use the consumer group it named."""

    default_code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(AuthorizationError):
    """CLUSTER_AUTHORIZATION_FAILED: the principal lacks a right on the cluster (or, for an
    idempotent producer id, WRITE on any topic)."""

    default_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class TransactionalIdAuthorizationFailedError(AuthorizationError):
    """TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the principal may not use the transactional id
    it named (Kafka's TransactionalIdAuthorizationException)."""

    default_code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class SecurityDisabledError(StromError):
    """SECURITY_DISABLED: an ACL request reached a controller started without ``--acls``
    (Kafka's SecurityDisabledException): entries added there would protect nothing."""

    default_code = ErrorCode.SECURITY_DISABLED


# ---- raised by the clients themselves (no server code) ----
# Here rather than next to the client raising them, so that applications catch them from
# ``strom.errors`` (and ``strom``) like every other error; the client modules re-export them.


class ProducerClosedError(StromError):
    """The producer was closed (or fenced) before the record could be sent."""


class ProducerCallbackError(StromError):
    """A call made from a delivery callback that would have to wait for the very thread
    running the callback (``flush()``): refused at once rather than hanging."""


class GroupListingIncompleteError(CoordinatorNotAvailableError):
    """Some coordinator shards did not answer ``list_groups``: the groups they hold are
    missing. Retriable (a shard gets an owner within the coordinators' session timeout);
    ``groups`` holds what the shards that answered listed (``GroupListing`` s),
    ``missing_shards`` the others."""

    def __init__(
        self,
        message: str | None = None,
        groups: list[Any] | None = None,
        missing_shards: list[int] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)  # code=, retriable= (StromError's pickling)
        self.groups: list[Any] = list(groups or [])
        self.missing_shards: list[int] = list(missing_shards or [])


class IllegalStateError(StromError):
    """The call does not fit the consumer's state (Kafka's IllegalStateException): seeking or
    pausing a partition that is not assigned, polling with nothing assigned, using a closed
    consumer, mixing assign() with subscribe()."""


class RecordDeserializationError(StromError):
    """A consumer's ``key_deserializer`` or ``value_deserializer`` raised for a record
    (Kafka's RecordDeserializationException). The consumer's position is at that record:
    ``seek(TopicPartition(e.topic, e.partition), e.offset + 1)`` skips it; nothing else of
    the poll was lost (the cause is ``__cause__``)."""

    def __init__(
        self,
        message: str | None = None,
        *,
        topic: str | None = None,
        partition: int = -1,
        offset: int = -1,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.topic = topic
        self.partition = partition
        self.offset = offset

    def __reduce__(self) -> tuple[object, ...]:
        where = {"topic": self.topic, "partition": self.partition, "offset": self.offset}
        return (functools.partial(type(self), **where), (self.message,))


class TransactionOutcomeUnknownError(StromError):
    """A ``with producer.transaction()`` block's commit got no answer, and asking the
    coordinator again for as long as the transaction timeout brought none: the transaction
    may be committed or not. Treat it like a fatal error: close the producer and restart
    the pipeline from its committed offsets (``init_transactions()`` of the new instance
    completes or aborts what this one left), or keep calling ``commit_transaction()`` until
    it answers. Rewinding and going on would process the records twice if it committed."""


class NoOffsetForPartitionError(StromError):
    """A partition has no position to start from and ``auto_offset_reset="none"`` forbids
    picking one: seek() it first."""


class PartialResultError(StromError):
    """Raised by a call over several partitions (``Admin.list_offsets``,
    ``Admin.delete_records``) when some of them failed while the others succeeded, and for
    a deletion took effect: ``results`` holds what each partition done returned (for
    ``delete_records`` its new low watermark), ``errors`` the error of each partition
    refused, and the message names both. Kafka answers such calls per partition too.

    Never raised as such: the error raised is of the first refusal's own class as well
    (:func:`partial_result_error`), so ``except OffsetOutOfRangeError`` still catches a
    refused deletion, and ``except PartialResultError`` reads what was done whatever the
    class."""

    #: The server-code class this error was made a partial one of (see partial_result_error).
    partial_of: ClassVar[type[StromError]] = StromError

    def __init__(
        self,
        message: str | None = None,
        results: dict[Any, Any] | None = None,
        errors: dict[Any, StromError] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.results: dict[Any, Any] = dict(results or {})
        self.errors: dict[Any, StromError] = dict(errors or {})

    def __reduce__(self) -> tuple[object, ...]:
        # The class is made at run time (no name to import), so it is rebuilt from its base.
        return (
            _rebuild_partial,
            (self.partial_of, self.message, self.code, self.retriable, self.results, self.errors),
        )


_PARTIAL_CLASSES: dict[type[StromError], type[PartialResultError]] = {}


def partial_result_error(
    first: StromError,
    message: str,
    results: dict[Any, Any],
    errors: dict[Any, StromError],
) -> PartialResultError:
    """A :class:`PartialResultError` that is also of ``first``'s class (the first refusal,
    whose code and retriable flag it takes), with ``message``; not raised."""
    base = first.partial_of if isinstance(first, PartialResultError) else type(first)
    cls = _PARTIAL_CLASSES.get(base)
    if cls is None:
        # The same name, so that messages and reprs read as the first refusal's class.
        made = type(
            base.__name__,
            (PartialResultError, base),
            {"partial_of": base, "__module__": base.__module__, "__qualname__": base.__qualname__},
        )
        cls = _PARTIAL_CLASSES.setdefault(base, made)  # one class per base, whatever thread
    return cls(message, results, errors, code=first.code, retriable=first.retriable)


def _rebuild_partial(
    base: type[StromError],
    message: str,
    code: int | None,
    retriable: bool,
    results: dict[Any, Any],
    errors: dict[Any, StromError],
) -> PartialResultError:
    first = base(message, code=code, retriable=retriable)
    return partial_result_error(first, message, results, errors)


class CommitFailedError(StromError):
    """An offset commit refused because this consumer is no longer the group member that
    may commit (``max_poll_interval_ms`` passed and it was expelled, it was fenced, or a
    rebalance moved its epoch on): Kafka's ``CommitFailedException``, kafka-python's
    ``CommitFailedError``. Its offsets were not committed; the consumer rejoins on its
    next ``poll()``, and the records since the last commit may be read again.

    Never raised as such: the error raised is of the coordinator's own class as well
    (:func:`commit_failed_error`: ``UnknownMemberIdError``, ``FencedMemberEpochError`` or
    ``StaleMemberEpochError``), so code that catches those classes still does, and code
    ported from Kafka catches ``CommitFailedError``."""

    #: The server-code class this error was made a commit failure of (commit_failed_error).
    commit_failed_of: ClassVar[type[StromError]] = StromError

    def __reduce__(self) -> tuple[object, ...]:
        # The class is made at run time (no name to import), so it is rebuilt from its base.
        return (
            _rebuild_commit_failed,
            (self.commit_failed_of, self.message, self.code, self.retriable),
        )


#: The group-level codes an offset commit is refused with because the committer is no
#: longer the member that may commit (see :class:`CommitFailedError`).
COMMIT_FAILED_CODES = frozenset(
    {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.STALE_MEMBER_EPOCH}
)

_COMMIT_FAILED_CLASSES: dict[type[StromError], type[CommitFailedError]] = {}


def commit_failed_error(error: StromError) -> StromError:
    """``error`` (a commit's refusal) as a :class:`CommitFailedError` of its own class too
    when its code is one of :data:`COMMIT_FAILED_CODES`; any other error unchanged."""
    if isinstance(error, CommitFailedError) or error.code not in COMMIT_FAILED_CODES:
        return error
    base = type(error)
    cls = _COMMIT_FAILED_CLASSES.get(base)
    if cls is None:
        # The same name, so that messages and reprs read as the coordinator's class.
        made = type(
            base.__name__,
            (CommitFailedError, base),
            {
                "commit_failed_of": base,
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
            },
        )
        cls = _COMMIT_FAILED_CLASSES.setdefault(base, made)  # one class per base
    return cls(error.message, code=error.code, retriable=error.retriable)


def _rebuild_commit_failed(
    base: type[StromError], message: str, code: int | None, retriable: bool
) -> StromError:
    return commit_failed_error(base(message, code=code, retriable=retriable))


def _collect(cls: type[StromError], into: dict[int, type[StromError]]) -> None:
    for sub in cls.__subclasses__():
        # (a class's own code only: a subclass that inherits one, as
        # GroupListingIncompleteError does, is not the class raised for it)
        own = "default_code" in vars(sub) and sub.__module__ == __name__
        if own and sub.default_code is not None:
            if sub.default_code in into:
                raise RuntimeError(f"two exception classes for {error_name(sub.default_code)}")
            into[sub.default_code] = sub
        _collect(sub, into)


#: ErrorCode -> the exception class raised for it (every code but NONE has one).
EXCEPTIONS: dict[int, type[StromError]] = {}
_collect(StromError, EXCEPTIONS)


def error_for(code: int, message: str | None = None) -> StromError:
    """The exception instance for a non-NONE `code` (not raised), with `message` if given.

    An unknown code (from a newer server) gives a plain, non-retriable :class:`StromError`.
    """
    if code == ErrorCode.NONE:
        raise ValueError("ErrorCode NONE is not an error")
    cls = EXCEPTIONS.get(code)
    if cls is None:
        return StromError(message or f"unknown error code {code}", code=code)
    return cls(message or None)


def raise_for_error(code: int, message: str | None = None) -> None:
    """Raise the exception for `code` unless it is NONE; the usual check on a result."""
    if code != ErrorCode.NONE:
        raise error_for(code, message)
