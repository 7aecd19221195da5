"""The group coordinator (DESIGN §2, §7): consumer-group membership, assignment and offsets.

The engines here are pure (no gRPC, no etcd, no clock), so the protocol can be tested alone:

* :mod:`strom.coordinator.assignors` -- the server-side assignors (``uniform``, ``range``).
* :mod:`strom.coordinator.group` -- one group's KIP-848 state machine and committed offsets.
  Its parts live beside it: :mod:`~strom.coordinator.group_types` (states, config, member,
  results), :mod:`~strom.coordinator.group_reconciliation` (epochs, target assignment,
  reconciliation), :mod:`~strom.coordinator.group_offsets` (committed and transactional
  offsets) and :mod:`~strom.coordinator.group_persistence` (snapshot and rebuild).
* :mod:`strom.coordinator.offsets_log` -- the ``__consumer_offsets`` record format and the
  replay of a shard's records into group snapshots.

The service that wires them to gRPC, etcd shard ownership and the internal topic lives beside
them (:mod:`strom.coordinator.service`, run by ``strom coordinator``:
:mod:`strom.coordinator.cli`); :mod:`strom.coordinator.lookup` answers FindCoordinator from an
etcd view for both coordinators and storage nodes. Importing this package does not load gRPC.
"""

from strom.coordinator.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    Assignment,
    MemberSpec,
    RangeAssignor,
    UniformAssignor,
    get_assignor,
)
from strom.coordinator.group import (
    ConsumerGroup,
    ExpiredMember,
    ExpireResult,
    GroupConfig,
    GroupState,
    HeartbeatResult,
    Member,
    MemberState,
    OffsetsResult,
)
from strom.coordinator.offsets_log import (
    CONSUMER_OFFSETS_TOPIC,
    GroupRecord,
    GroupSnapshot,
    OffsetAndMetadata,
    ShardState,
    encode_group_batch,
    shard_for_group,
)

__all__ = [
    "ASSIGNORS",
    "CONSUMER_OFFSETS_TOPIC",
    "DEFAULT_ASSIGNOR",
    "Assignment",
    "ConsumerGroup",
    "ExpireResult",
    "ExpiredMember",
    "GroupConfig",
    "GroupRecord",
    "GroupSnapshot",
    "GroupState",
    "HeartbeatResult",
    "Member",
    "MemberSpec",
    "MemberState",
    "OffsetAndMetadata",
    "OffsetsResult",
    "RangeAssignor",
    "ShardState",
    "UniformAssignor",
    "encode_group_batch",
    "get_assignor",
    "shard_for_group",
]
