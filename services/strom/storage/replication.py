"""Replication on a storage node (DESIGN §6), in two modules named after their sides:

- :mod:`strom.storage.replica_fetchers`: the follower side, one :class:`ReplicaFetchers`
  task per leader node, appending what it fetches and following the leader's log start,
  divergences and high watermark;
- :mod:`strom.storage.isr`: the leader side, :class:`IsrManager` proposing ISR changes
  (and leadership hand-overs) to the controller, and the replication gauges;

and the calls to the active controller both sides' node makes,
:mod:`strom.storage.controller_client`. This module keeps the import paths of the names
others took from it before the split; their log lines keep its logger name,
``strom.storage.replication``.
"""

from strom.storage.controller_client import ControllerClient
from strom.storage.isr import (
    ISR_REFUSED_BACKOFF_MAX_S,
    ISR_REFUSED_BACKOFF_S,
    UNOPENED_RETRY_S,
    IsrManager,
    leader_replica_lag,
    refresh_replication_gauges,
    running_nodes,
)
from strom.storage.replica_fetchers import (
    DISK_RETRY_S,
    FETCH_FAILURES_LOGGED,
    FETCH_MAX_BYTES,
    FETCH_MAX_WAIT_MS,
    FOLLOWER_OPTIONS,
    PARTITION_BACKOFF_S,
    ReplicaFetchers,
    divergence_truncation_offset,
)

__all__ = [
    "DISK_RETRY_S",
    "FETCH_FAILURES_LOGGED",
    "FETCH_MAX_BYTES",
    "FETCH_MAX_WAIT_MS",
    "FOLLOWER_OPTIONS",
    "ISR_REFUSED_BACKOFF_MAX_S",
    "ISR_REFUSED_BACKOFF_S",
    "PARTITION_BACKOFF_S",
    "UNOPENED_RETRY_S",
    "ControllerClient",
    "IsrManager",
    "ReplicaFetchers",
    "divergence_truncation_offset",
    "leader_replica_lag",
    "refresh_replication_gauges",
    "running_nodes",
]
