"""Prometheus metrics of the group coordinator: RPC latency and errors by result, shards
owned and loaded, writes, members, lag, groups by state, and rebalances with their duration.

The latency, group-state and rebalance metrics are attached by :func:`instrument` (wrappers
around the service's RPC methods, its ``_mutate`` and ``_unload``), so the service code that
handles requests stays as it is.

A *rebalance* starts when the group epoch goes up (a member joined or left, a subscription or
the topics changed) and ends when every member has converged to the new target (STABLE), or
the group emptied. A group that is loaded onto another coordinator mid-rebalance is dropped
from this process's tracking (its duration is not observed).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from strom.api import coordinator_pb2_grpc
from strom.coordinator.group import ConsumerGroup, GroupState
from strom.coordinator.txn_state import TxnState
from strom.service.metrics import LATENCY_BUCKETS, timed_rpcs

#: Every RPC the coordinator serves (the generated servicer's methods).
RPCS = tuple(
    name
    for name in vars(coordinator_pb2_grpc.CoordinatorServiceServicer)
    if not name.startswith("_")
)

REQUEST_LATENCY = Histogram(
    "strom_coordinator_request_latency_seconds",
    "Time to answer a CoordinatorService RPC, by RPC and result (the whole-request error, "
    "else the first item's error; NONE = success, CANCELLED = the client cancelled the call)",
    ["rpc", "result"],
    buckets=LATENCY_BUCKETS,
)
GROUPS = Gauge(
    "strom_coordinator_groups",
    "Groups in the shards this coordinator has loaded, by state (empty, assigning, "
    "reconciling, stable)",
    ["state"],
)
REBALANCES = Counter(
    "strom_coordinator_rebalances",
    "Rebalances started: a group left STABLE/EMPTY because its membership, subscriptions or "
    "topics changed",
)
REBALANCE_SECONDS = Histogram(
    "strom_coordinator_rebalance_duration_seconds",
    "From a rebalance's start to every member converged on the new assignment (or the group empty)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
RPC_ERRORS = Counter(
    "strom_coordinator_request_errors_total",
    "Coordinator RPC answers with a group-level error, by RPC and error",
    ["rpc", "error"],
)
SHARDS_OWNED = Gauge(
    "strom_coordinator_shards_owned",
    "Group shards (__consumer_offsets partitions) this coordinator owns and has loaded; "
    "transaction shards are not counted",
)
GROUP_SHARDS = Gauge(
    "strom_coordinator_group_shards",
    "Group shards of the cluster (partitions of __consumer_offsets; 0 before it exists), as "
    "this coordinator sees them: compared with the sum of strom_coordinator_shards_owned it "
    "shows shards nobody serves (every coordinator reports; use max())",
)
SHARD_LOADS = Counter("strom_coordinator_shard_loads_total", "Shard (re)loads completed")
UNDECODABLE_RECORDS = Counter(
    "strom_coordinator_undecodable_records_total",
    "Records a shard load skipped because their key or value did not decode (no coordinator "
    "wrote them, or they are damaged), by shard kind; counted again at each load of the shard",
    ["kind"],
)
SHARD_HAND_OVERS = Counter(
    "strom_coordinator_shard_hand_overs_total",
    "Shards this coordinator handed over to balance the live coordinators (another one loads "
    "them), by shard kind",
    ["kind"],
)
SHARD_RELEASES = Counter(
    "strom_coordinator_shard_releases_total",
    "Shards this coordinator released because it could not reach the storage nodes (another "
    "coordinator takes them), by shard kind",
    ["kind"],
)
MEMBERS = Gauge("strom_coordinator_members", "Members of the groups in the loaded shards")
EXPIRED = Counter(
    "strom_coordinator_members_expired_total",
    "Members removed by a timer, by reason: session, rebalance (timeouts), node (the storage "
    "node running the member left the cluster or restarted)",
    ["reason"],
)
WRITES = Counter(
    "strom_coordinator_writes_total",
    "Batches appended to the shards' logs (__consumer_offsets, __transaction_state), by shard "
    "kind and cause: operations (queued commits, group changes, transaction steps, several per "
    "batch when they queued behind one in flight) or fence (a shard being loaded)",
    ["kind", "cause"],
)
WRITE_OPERATIONS = Counter(
    "strom_coordinator_write_operations_total",
    "Operations (commits, group changes, transaction steps) made durable, by shard kind; "
    'divided by strom_coordinator_writes_total{cause="operations"} it is how many shared '
    "one append",
    ["kind"],
)
for _kind in ("group", "transaction"):
    WRITE_OPERATIONS.labels(_kind)
    for _cause in ("operations", "fence"):
        WRITES.labels(_kind, _cause)
SUPERSEDED_COMMITS = Counter(
    "strom_coordinator_superseded_commits_total",
    "Partition offsets an OffsetCommit left alone because a newer commit of the same committer "
    "had already set them (a delayed or late-retried request)",
)
LAG = Gauge(
    "strom_coordinator_consumer_lag",
    "High watermark minus committed offset, per group and partition (0 when the committed "
    "offset is past the high watermark: strom_coordinator_consumer_offset_past_end says so)",
    ["group", "topic", "partition"],
)
#: Why a gauge of its own and not a negative lag: the lag is summed over partitions (the
#: alerts' recording rule, the dashboard), where a negative value would hide another
#: partition's lag.
PAST_END = Gauge(
    "strom_coordinator_consumer_offset_past_end",
    "Committed offset minus high watermark where the committed offset is past it (records "
    "deleted or expired, a reset past the end, the topic created again): the group's next "
    "fetch gets OFFSET_OUT_OF_RANGE and resets; exported only while positive",
    ["group", "topic", "partition"],
)

_STATES = (GroupState.EMPTY, GroupState.ASSIGNING, GroupState.RECONCILING, GroupState.STABLE)
for _s in _STATES:
    GROUPS.labels(_s.name.lower())
_SETTLED = (GroupState.STABLE, GroupState.EMPTY, GroupState.DEAD)


class RebalanceTracker:
    """Turns the groups seen after each change into rebalance counts and durations.

    A rebalance starts when the group epoch goes up (what the assignment depends on
    changed) and ends when the group is STABLE (or EMPTY) again; one that completes within
    the same heartbeat (a lone member joining) is observed with the time since that change.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: group id -> when its current rebalance started
        self.started: dict[str, float] = {}
        #: group id -> the group epoch seen last
        self.epochs: dict[str, int] = {}

    def observe(self, group_id: str, state: GroupState, group_epoch: int, since: float) -> None:
        """``since``: clock value when the change that led to this state began."""
        now = self.clock()
        if state is GroupState.DEAD:
            self.forget([group_id])
            return
        last = self.epochs.get(group_id)
        self.epochs[group_id] = group_epoch
        if last is not None and group_epoch > last and group_id not in self.started:
            self.started[group_id] = since
            REBALANCES.inc()
        if state in _SETTLED:
            t0 = self.started.pop(group_id, None)
            if t0 is not None:
                REBALANCE_SECONDS.observe(max(now - t0, 0.0))

    def forget(self, group_ids: Iterable[str]) -> None:
        for gid in group_ids:
            self.started.pop(gid, None)
            self.epochs.pop(gid, None)


def instrument(cls: type) -> type:
    """Attach the metrics above to the coordinator service class (once, at import)."""
    timed_rpcs(cls, REQUEST_LATENCY, RPCS)
    mutate = cls._mutate  # type: ignore[attr-defined]
    unload = cls._unload  # type: ignore[attr-defined]

    def tracker(self: Any) -> RebalanceTracker:
        t = self.__dict__.get("_rebalances")
        if t is None:
            t = self.__dict__["_rebalances"] = RebalanceTracker()
        return t

    @functools.wraps(mutate)
    async def _mutate(self: Any, group_id: str, fn: Callable[..., Any], *args: Any, **kw: Any):  # type: ignore[no-untyped-def]
        seen: list[ConsumerGroup] = []
        rebalances = tracker(self)

        def observed(group: ConsumerGroup) -> Any:
            if group_id not in rebalances.epochs:  # first sight: the epoch before the call
                rebalances.epochs[group_id] = group.group_epoch
            seen.append(group)
            return fn(group)

        since = rebalances.clock()
        result = await mutate(self, group_id, observed, *args, **kw)
        if seen:
            rebalances.observe(group_id, seen[-1].state, seen[-1].group_epoch, since)
        return result

    @functools.wraps(unload)
    def _unload(self: Any, shard: Any) -> None:
        tracker(self).forget(list(shard.groups))
        unload(self, shard)

    cls._mutate = _mutate  # type: ignore[attr-defined]
    cls._unload = _unload  # type: ignore[attr-defined]
    return cls


TRANSACTIONS = Gauge(
    "strom_coordinator_transactions",
    "Transactional ids in the shards this coordinator has loaded, by state (empty, ongoing, "
    "prepare_commit, prepare_abort, complete_commit, complete_abort)",
    ["state"],
)
TRANSACTIONAL_IDS_EXPIRED = Counter(
    "strom_coordinator_transactional_ids_expired",
    "Transactional ids removed after transactional.id.expiration.ms with nothing open",
)
TRANSACTIONS_ENDED = Counter(
    "strom_coordinator_transactions_ended",
    "Transactions completed (markers written everywhere), by outcome (commit, abort) and "
    "who ended them (client; timeout: transaction.timeout.ms passed; fenced: a new producer "
    "instance initialised the transactional id; recovered: a decided transaction a "
    "coordinator found unfinished when it took over the shard, and finished)",
    ["outcome", "by"],
)
TRANSACTION_SECONDS = Histogram(
    "strom_coordinator_transaction_duration_seconds",
    "From a transaction's first AddPartitionsToTxn/AddOffsetsToTxn to its completion",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0),
)
TXN_COMPLETION_SECONDS = Histogram(
    "strom_coordinator_transaction_completion_seconds",
    "From the commit/abort decision to every marker written (the markers' phase)",
    buckets=LATENCY_BUCKETS,
)


def _at_scrape(count: Callable[[], float]) -> Callable[[], float]:
    """``count`` for a scrape-time gauge. Scrapes run on the metrics server's thread while the
    event loop changes the shards; a walk that met a dict changing size is walked again."""

    def read() -> float:
        for _ in range(5):
            try:
                return count()
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return float("nan")

    return read


def count_at_scrape(
    group_shards: dict[int, Any],
    txn_shards: dict[int, Any],
    cluster_group_shards: Callable[[], int] = lambda: 0,
    lease_live: Callable[[], bool] = lambda: True,
) -> None:
    """Shards owned, members, groups and transactional ids by state, counted when Prometheus
    scrapes, not after every write: a pass over every group per commit made each commit cost
    what all the groups of the coordinator cost (``group_shards`` and ``txn_shards`` are the
    coordinator's live tables of loaded :class:`~strom.coordinator.shards.Shard`;
    ``cluster_group_shards`` reads the cluster's group shard count).

    While ``lease_live()`` is false (the shard keys' lease has surely expired, the process
    not having noticed yet: it was paused, or cannot reach etcd) nothing is counted as
    owned: other coordinators own those shards by then (the sum over coordinators would
    exceed the shard count)."""

    def loaded(shards: dict[int, Any]) -> list[Any]:
        if not lease_live():
            return []
        return [s for s in list(shards.values()) if s.loaded]

    def groups() -> list[ConsumerGroup]:
        return [g for s in loaded(group_shards) for g in list(s.groups.values())]

    SHARDS_OWNED.set_function(_at_scrape(lambda: len(loaded(group_shards))))
    GROUP_SHARDS.set_function(_at_scrape(cluster_group_shards))
    MEMBERS.set_function(_at_scrape(lambda: sum(len(g.members) for g in groups())))
    for state in _STATES:
        GROUPS.labels(state.name.lower()).set_function(
            _at_scrape(lambda st=state: sum(1 for g in groups() if g.state is st))
        )
    for tstate in TxnState:
        if tstate is TxnState.DEAD:
            continue
        TRANSACTIONS.labels(tstate.name.lower()).set_function(
            _at_scrape(
                lambda st=tstate: sum(
                    1
                    for s in loaded(txn_shards)
                    for t in list(s.transactions.values())
                    if t.state is st
                )
            )
        )
