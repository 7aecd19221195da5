"""Prometheus metrics of a storage node (served on ``--metrics-port`` /metrics).

Per-partition gauges are updated when the value changes (after an append, a retention pass,
a DeleteRecords), never by a scrape-time walk over every log. Their label children are cached
on the :class:`PartitionMetrics` object so that an append costs a few attribute lookups and
``set`` calls, not a label-dict lookup per metric.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from strom.metadata.view import changed_topics
from strom.service.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from strom.metadata import ClusterView, WatchEvent

BYTES_IN = Counter(
    "strom_storage_bytes_in", "Record bytes appended by Produce, by topic", ["topic"]
)
BYTES_OUT = Counter(
    "strom_storage_bytes_out",
    "Record bytes returned to consumers by Fetch, by topic (replication not included)",
    ["topic"],
)
RECORDS_OUT = Counter(
    "strom_storage_records_out",
    "Offsets returned to consumers by Fetch, by topic (from batch headers: the span of the "
    "batches sent, so offsets removed by compaction count too)",
    ["topic"],
)
RECONCILE_PASSES = Counter(
    "strom_storage_reconcile_passes",
    "Passes of the node's partition manager by what they looked at: every partition of the "
    "view (scope=all: start, the cluster key, a resync, a failed pass) or only the "
    "topics that changed (scope=topics)",
    ["scope"],
)
REPLICATION_BYTES_OUT = Counter(
    "strom_storage_replication_bytes_out",
    "Record bytes this node sent to follower replicas (as leader)",
)
REASSIGNMENT_BYTES_OUT = Counter(
    "strom_storage_reassignment_bytes_out",
    "Record bytes this node sent, as leader, to replicas a reassignment is adding (the copy a "
    "move makes, throttled or not), by topic",
    ["topic"],
)
REASSIGNMENT_BYTES_IN = Counter(
    "strom_storage_reassignment_bytes_in",
    "Record bytes this node appended to its replicas a reassignment is adding (fetched from "
    "their leaders), by topic",
    ["topic"],
)
REPLICATION_THROTTLED = Counter(
    "strom_storage_replication_throttled",
    "Partitions of follower fetches the replication throttle held back (fewer batches or "
    "none this round), by side: leader (sending to a throttled replica) or follower "
    "(fetching for one)",
    ["side"],
)
REPLICATION_THROTTLED_BYTES = Counter(
    "strom_storage_replication_throttled_bytes",
    "Record bytes charged to the replication throttle (sent to, or fetched for, throttled "
    "replicas not in the ISR), by side",
    ["side"],
)
REPLICATION_THROTTLE_RATE = Gauge(
    "strom_storage_replication_throttle_rate_bytes",
    "The replication throttle rate this node applies, bytes/s (0: no limit), by side "
    "(leader.replication.throttled.rate, follower.replication.throttled.rate)",
    ["side"],
)
#: Client ids a per-client counter exports at most (see :class:`_ClientChildren`).
MAX_CLIENT_IDS = 1000
#: A client id unused for this long makes room for a new one once MAX_CLIENT_IDS are exported
#: (Kafka expires idle client quota metrics after an hour too).
CLIENT_IDLE_S = 3600.0
#: The client_id of what client ids past MAX_CLIENT_IDS send.
OTHER_CLIENTS = "other"
_CLIENT_BOUND = (
    f"; at most {MAX_CLIENT_IDS} client ids per node: when that many are exported, one "
    f"unused for {CLIENT_IDLE_S / 3600:g} h makes room for a new one, else the new one "
    f'counts under client_id="{OTHER_CLIENTS}"'
)
CLIENT_BYTES_IN = Counter(
    "strom_storage_client_bytes_in",
    "Record bytes appended by Produce, by the client id the client sent (strom-client-id "
    "gRPC metadata; empty when it sent none; a RecordService ProduceRecords call's, through "
    "the node that forwards it)" + _CLIENT_BOUND,
    ["client_id"],
)
CLIENT_BYTES_OUT = Counter(
    "strom_storage_client_bytes_out",
    "Record bytes returned by consumer Fetch, by the client id the client sent (a "
    "RecordService Subscribe call's, else strom-node-<id>-subscribe for the node's own "
    "fetches for it)" + _CLIENT_BOUND,
    ["client_id"],
)
RECORDS_IN = Counter(
    "strom_storage_records_in",
    "Records appended by Produce (counted from batch headers), by topic",
    ["topic"],
)
PRODUCE_REQUESTS = Counter(
    "strom_storage_produce_requests",
    "Produce partition results by error code (NONE = appended)",
    ["error"],
)
PRODUCE_SHED = Counter(
    "strom_storage_produce_shed",
    "Produce requests (unary and on ProduceStream) and RecordService ProduceRecords calls "
    "refused with RESOURCE_EXHAUSTED (in-flight byte budget, a principal over its produce "
    "quota past its share of that budget, or memory limit)",
)
OLD_COORDINATOR_WRITES = Counter(
    "strom_storage_old_coordinator_writes",
    "Produce calls to an internal __ topic accepted without the strom-internal-topics header "
    "because a shard owner is a coordinator of an older version (no coordinator_members/ "
    "registration), which does not send it; 0 once every coordinator is upgraded",
)
OPEN_STREAMS = Gauge(
    "strom_storage_open_streams",
    "Open ProduceStream and FetchStream calls (clients, followers and coordinators holding a "
    "stream to this node)",
    ["method"],
)
FETCH_REQUESTS = Counter(
    "strom_storage_fetch_requests",
    "Fetch requests by kind of fetcher (consumer or follower replica)",
    ["kind"],
)
FETCH_FOLLOWED = Counter(
    "strom_storage_fetch_followed",
    "Consumer fetches a node started without a request: the continuations of followed "
    "FetchStream requests (FetchRequest.follow), each answered as a Fetch",
)
REQUEST_LATENCY = Histogram(
    "strom_storage_request_latency_seconds",
    "Time to answer a StorageService RPC (Fetch includes its long-poll wait), by RPC and "
    "result (the whole-request error, else the first partition's error; NONE = success, "
    "CANCELLED = the client cancelled the call)",
    ["rpc", "result"],
    buckets=LATENCY_BUCKETS,
)
PARTITIONS = Gauge("strom_storage_partitions", "Hosted partition replicas by role", ["role"])
LOG_END_OFFSET = Gauge(
    "strom_storage_log_end_offset", "Log end offset per partition", ["topic", "partition"]
)
LOG_START_OFFSET = Gauge(
    "strom_storage_log_start_offset", "Log start offset per partition", ["topic", "partition"]
)
HIGH_WATERMARK = Gauge(
    "strom_storage_high_watermark", "High watermark per partition", ["topic", "partition"]
)
LOG_SIZE = Gauge(
    "strom_storage_log_size_bytes", "Bytes on disk per partition log", ["topic", "partition"]
)
REPLICA_LAG = Gauge(
    "strom_storage_replica_lag_messages",
    "Replication lag in offsets: on a leader the largest follower lag behind its LEO, on a "
    "follower how far its LEO is behind the leader's high watermark",
    ["topic", "partition"],
)
UNDER_REPLICATED = Gauge(
    "strom_storage_under_replicated_partitions",
    "Partitions this node leads whose ISR is smaller than their replica list, not counting "
    "replicas a reassignment is adding (Kafka's rule)",
)
UNDER_MIN_ISR = Gauge(
    "strom_storage_under_min_isr_partitions",
    "Partitions this node leads whose ISR is smaller than min.insync.replicas (acks=all "
    "produces to them fail with NOT_ENOUGH_REPLICAS)",
)
OFFLINE_PARTITIONS = Gauge(
    "strom_storage_offline_partitions",
    "Partitions without a leader in this node's view of the cluster metadata",
)
APPEND_QUEUE = Histogram(
    "strom_storage_append_queue_seconds",
    "How long a Produce request's append waited for the writer thread (0 when it ran inline)",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
NODE_INFO = Gauge(
    "strom_storage_node_info",
    "Always 1; the node id of this storage node (the id `strom topics describe` and "
    "strom_controller_missing_node_replicas use): join series on `instance` to name the node, "
    "e.g. `up * on (cluster, instance) group_left (node_id) strom_storage_node_info`",
    ["node_id"],
)
DATA_DIR_FREE = Gauge(
    "strom_storage_data_dir_free_bytes",
    "Bytes available to the node on the file system of its data dir (statvfs, at scrape time)",
)
DATA_DIR_SIZE = Gauge(
    "strom_storage_data_dir_size_bytes",
    "Total size of the file system holding the node's data dir (statvfs, at scrape time)",
)
ISR_SHRINKS = Counter(
    "strom_storage_isr_shrinks", "Committed ISR changes that removed a follower (as leader)"
)
ISR_EXPANDS = Counter(
    "strom_storage_isr_expands", "Committed ISR changes that added a follower (as leader)"
)
PRODUCER_DUPLICATE_BATCHES = Counter(
    "strom_storage_producer_duplicate_batches",
    "Idempotent batches that repeated ones already appended: answered with their original "
    "offsets and not written again (producer retries)",
)
PRODUCER_REJECTED_BATCHES = Counter(
    "strom_storage_producer_rejected_batches",
    "Produce partition results refused by the idempotence check, by error "
    "(OUT_OF_ORDER_SEQUENCE, INVALID_PRODUCER_EPOCH = fenced, UNKNOWN_PRODUCER_ID, "
    "DUPLICATE_SEQUENCE, INVALID_RECORD)",
    ["error"],
)
INIT_PRODUCER_ID = Counter(
    "strom_storage_init_producer_id",
    "InitProducerId answers: a new producer id, an epoch bump, or the error code",
    ["result"],
)
CLEANER_MAX_DIRTY_RATIO = Gauge(
    "strom_storage_cleaner_max_dirty_ratio",
    "Largest dirty ratio (not-yet-cleaned share of the cleanable bytes) among this node's "
    "compacted logs at the last cleaner pass (Kafka's max-dirty-percent, as a ratio)",
)
CLEANER_MAX_COMPACTION_DELAY = Gauge(
    "strom_storage_cleaner_max_compaction_delay_seconds",
    "How far the most overdue compacted log is past its max.compaction.lag.ms at the last "
    "cleaner pass (0: none overdue)",
)
CLEANER_CLEANINGS = Counter(
    "strom_storage_cleaner_cleanings",
    "Compaction passes run, by why the log was due (dirty_ratio or max_compaction_lag)",
    ["reason"],
)

THROTTLED = Counter(
    "strom_storage_throttled_requests",
    "Answers held back because the principal was over its client quota, by kind: produce, "
    "fetch, requests (the other requests the request quota counts: Metadata, ListOffsets, "
    "InitProducerId, ...)",
    ["kind"],
)
TXN_MARKERS = Counter(
    "strom_storage_txn_markers",
    "Transaction markers appended (COMMIT, ABORT) or refused (the error code)",
    ["result"],
)
LAST_STABLE_OFFSET_LAG = Gauge(
    "strom_storage_last_stable_offset_lag",
    "High watermark minus last stable offset per partition this node leads: offsets held "
    "back from read_committed consumers by open transactions",
    ["topic", "partition"],
)
CORRUPT_READS = Counter(
    "strom_storage_corrupt_reads",
    "Requests refused because data this node stored failed a check when read (offset "
    "sequence, leader epoch, length; the CRC-32C at the first read after a restart, not "
    "again later: consumers check it): the partition's replica here is damaged, by partition",
    ["topic", "partition"],
)
APPEND_FAILURES = Counter(
    "strom_storage_append_failures",
    "Appends this node's disk refused (errno ENOSPC or EDQUOT: full; EIO or EROFS: failing), "
    "as leader (Produce, transaction markers: the node then hands the partition's leadership "
    "to another in-sync replica) or as follower (replication), by partition and errno; the "
    "replica then copies nothing for the partition until its disk has room again",
    ["topic", "partition", "errno"],
)
#: Why a replica folder was set aside (the ``reason`` label of REPLICAS_SET_ASIDE).
SET_ASIDE_UNASSIGNED = "unassigned"
SET_ASIDE_TOPIC_ID_MISMATCH = "topic_id_mismatch"
REPLICAS_SET_ASIDE = Counter(
    "strom_storage_replicas_set_aside",
    "Replica folders this node renamed aside (<topic>-<partition>-stray-<UTC time>, kept for "
    "an operator to recover or remove) instead of serving or deleting them, by reason and "
    "topic: topic_id_mismatch (its partition.metadata records another topic id than the one "
    "the cluster assigns to the partition, which then started empty here) or unassigned (a "
    "log on disk the cluster does not assign to this node); series stay for the life of the "
    "process",
    ["reason", "topic"],
)
RECOVERY_TRUNCATIONS = Counter(
    "strom_storage_recovery_truncations",
    "Logs whose recovery when opened cut data (a torn or corrupt batch, or a segment that "
    "lost offsets, and everything after it): the replica holds less than before, by topic; "
    "series stay for the life of the process",
    ["topic"],
)
RECOVERY_TRUNCATED_BYTES = Counter(
    "strom_storage_recovery_truncated_bytes",
    "Bytes of segment files those recoveries cut (strom_storage_recovery_truncations_total), "
    "by topic",
    ["topic"],
)
_PARTITION_GAUGES = (
    LOG_END_OFFSET,
    LOG_START_OFFSET,
    HIGH_WATERMARK,
    LOG_SIZE,
    REPLICA_LAG,
    LAST_STABLE_OFFSET_LAG,
)
#: The per-topic counters: exported while the node hosts a replica of the topic.
_TOPIC_COUNTERS = (
    BYTES_IN,
    BYTES_OUT,
    RECORDS_IN,
    RECORDS_OUT,
    REASSIGNMENT_BYTES_IN,
    REASSIGNMENT_BYTES_OUT,
)


class PartitionMetrics:
    """The cached label children of one partition's gauges and its topic's counters."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "high_watermark",
        "labels",
        "log_end_offset",
        "log_size",
        "log_start_offset",
        "lso_lag",
        "records_in",
        "records_out",
        "replica_lag",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.labels = (topic, str(partition))
        self.log_end_offset = LOG_END_OFFSET.labels(*self.labels)
        self.log_start_offset = LOG_START_OFFSET.labels(*self.labels)
        self.high_watermark = HIGH_WATERMARK.labels(*self.labels)
        self.log_size = LOG_SIZE.labels(*self.labels)
        self.replica_lag = REPLICA_LAG.labels(*self.labels)
        self.bytes_in = BYTES_IN.labels(topic)
        self.bytes_out = BYTES_OUT.labels(topic)
        self.records_in = RECORDS_IN.labels(topic)
        self.records_out = RECORDS_OUT.labels(topic)
        #: The leader-only last-stable-offset lag; None (no series) while not leading.
        self.lso_lag: Any = None

    def set_leading(self, leading: bool, lso_lag: int = 0) -> None:
        """Export the leader-only series while this replica leads, and drop it when it
        stops leading: a former leader would otherwise keep reporting its last value and a
        new leader would have no series until its high watermark moved."""
        if leading:
            if self.lso_lag is None:
                self.lso_lag = LAST_STABLE_OFFSET_LAG.labels(*self.labels)
            self.lso_lag.set(lso_lag)
        elif self.lso_lag is not None:
            self.lso_lag = None
            with contextlib.suppress(KeyError):
                LAST_STABLE_OFFSET_LAG.remove(*self.labels)

    def remove(self) -> None:
        """Drop the partition's series (replica deleted) so dashboards do not show ghosts."""
        self.lso_lag = None
        for g in (*_PARTITION_GAUGES, CORRUPT_READS):
            with contextlib.suppress(KeyError):
                g.remove(*self.labels)
        # APPEND_FAILURES' series outlived the partition.
        for name in _append_failure_errnos.pop(self.labels, ()):
            with contextlib.suppress(KeyError):
                APPEND_FAILURES.remove(*self.labels, name)


#: (topic, partition) labels -> the errno labels APPEND_FAILURES has series of for them.
_append_failure_errnos: dict[tuple[str, str], set[str]] = {}


def count_append_failure(topic: str, partition: int, errno_name: str) -> None:
    """Count an append the disk refused, remembering its errno label, so that the
    partition's series of every errno go with the partition (PartitionMetrics.remove)."""
    labels = (topic, str(partition))
    _append_failure_errnos.setdefault(labels, set()).add(errno_name)
    APPEND_FAILURES.labels(*labels, errno_name).inc()


def remove_topic(topic: str) -> None:
    """Drop a topic's counters once the node hosts none of its replicas (topic deleted or
    moved away): otherwise deleted topics stay listed forever, and a topic re-created under
    the same name would add to the old one's totals."""
    for c in _TOPIC_COUNTERS:
        with contextlib.suppress(KeyError):
            c.remove(topic)


def count_partitions_with(role_counts: Callable[[], tuple[int, int]]) -> None:
    """Hosted replicas by role, counted when scraped: a count kept after every reconcile
    walked all of them for each change (O(N) per created topic at 10,000 partitions)."""
    PARTITIONS.labels("leader").set_function(lambda: role_counts()[0])
    PARTITIONS.labels("follower").set_function(lambda: role_counts()[1])


def publish_node_id(node_id: int) -> None:
    """Export ``strom_storage_node_info{node_id}``. Why: Prometheus names a target by its
    metrics address (``instance``) while the cluster (``strom topics describe``, the
    controllers' series) names a storage node by its id; outside Kubernetes nothing else maps
    one to the other, so alerts and panels join on this series to say both."""
    NODE_INFO.labels(str(node_id)).set(1)


def watch_data_dir(data_dir: Path) -> None:
    """Report the free and total bytes of ``data_dir``'s file system when scraped."""

    def stat(field: str) -> float:
        try:
            st = os.statvfs(data_dir)
        except OSError:
            return math.nan
        blocks = st.f_bavail if field == "free" else st.f_blocks
        return float(blocks * st.f_frsize)

    DATA_DIR_FREE.set_function(lambda: stat("free"))
    DATA_DIR_SIZE.set_function(lambda: stat("size"))


class _ClientChildren:
    """The label children of one per-client counter, at most MAX_CLIENT_IDS of them.

    Why bounded: client ids come from clients, and a client that makes a new one per
    connection (or per stream) would otherwise add a series per connection that lives as
    long as the node (one per RecordService Subscribe call). The bound
    is the count, kept by dropping ids unused for CLIENT_IDLE_S when it is reached (checked
    at most once a minute then) and folding new ones into OTHER_CLIENTS while none are: a
    cap alone would fold every client that comes after a burst forever, an idle time alone
    would not bound a burst. A dropped id that comes back starts again from 0, which
    Prometheus's rate() reads as a counter reset."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.children: dict[str, Any] = {}
        self.used: dict[str, float] = {}
        self.other: Any = None
        self.next_sweep = 0.0

    def child(self, client_id: str, now: float) -> Any:
        child = self.children.get(client_id)
        if child is None:
            if client_id == OTHER_CLIENTS or (
                len(self.children) >= MAX_CLIENT_IDS and not self._make_room(now)
            ):
                if self.other is None:
                    self.other = self.counter.labels(OTHER_CLIENTS)
                return self.other
            child = self.children[client_id] = self.counter.labels(client_id)
        self.used[client_id] = now
        return child

    def _make_room(self, now: float) -> bool:
        """Drop the ids unused for CLIENT_IDLE_S; whether there is room now."""
        if now < self.next_sweep:
            return False
        self.next_sweep = now + 60.0
        for client_id in [c for c, t in self.used.items() if now - t >= CLIENT_IDLE_S]:
            del self.children[client_id], self.used[client_id]
            with contextlib.suppress(KeyError):
                self.counter.remove(client_id)
        return len(self.children) < MAX_CLIENT_IDS


_client_children: dict[Any, _ClientChildren] = {}


def client_counter(counter: Counter, client_id: str) -> Any:
    """The label child of a per-client counter for ``client_id`` (bounded: _ClientChildren)."""
    children = _client_children.get(counter)
    if children is None:
        children = _client_children[counter] = _ClientChildren(counter)
    return children.child(client_id, time.monotonic())


#: The client id of the RecordService callers an in-process Produce is made for (it has no
#: gRPC metadata): set by the node's LeaderRoute around the call.
CALLER_CLIENT_ID: contextvars.ContextVar[str] = contextvars.ContextVar(
    "strom_caller_client_id", default=""
)


def client_id_of(context: Any) -> str:
    """The ``strom-client-id`` a gRPC caller sent ("" when none); for an in-process call
    (``context`` None), CALLER_CLIENT_ID."""
    if context is None:
        return CALLER_CLIENT_ID.get()
    try:
        md = context.invocation_metadata()
    except Exception:
        return ""
    for key, value in md or ():
        if key == "strom-client-id":
            return str(value)
    return ""


class OfflinePartitions:
    """``strom_storage_offline_partitions`` as this node's cluster view shows it, kept per
    topic: a view change recounts the topics it touched (every topic after a resync), so a
    change costs its topics' partitions, not the cluster's (watch thread)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self._by_topic: dict[str, int] = {}

    def on_events(self, events: list[WatchEvent]) -> None:
        topics = changed_topics(self.view.keys, events)
        with self.view.lock:
            if topics is None:  # a resync: recount everything
                self._by_topic = {}
                topics = set(self.view.topics)
            for name in topics:
                n = self._count(name)
                if n:
                    self._by_topic[name] = n
                else:
                    self._by_topic.pop(name, None)
        OFFLINE_PARTITIONS.set(sum(self._by_topic.values()))

    def _count(self, name: str) -> int:
        """Partitions of a live topic without a leader (view lock held)."""
        v = self.view.topics.get(name)
        if v is None or v.value.deleting:
            return 0
        count = v.value.partition_count
        parts = self.view.topic_partitions_locked(name)
        return sum(1 for p, s in parts.items() if p < count and s.value.leader < 0)
