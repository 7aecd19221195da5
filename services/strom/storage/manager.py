"""The partition manager: turns the cluster view into open logs and partition states.

The ClusterView calls :meth:`PartitionManager.on_view_events` on its watch thread; the
manager hops to the event loop (``call_soon_threadsafe``) and runs one reconcile at a time,
however many events arrived meanwhile (coalesced). A change of topics and partition states
makes a pass over those topics only (up to :data:`MAX_NARROW_TOPICS`); the first pass, a watch
resync, a change of the cluster key and a failed pass look at everything; other keys (nodes,
ACLs, coordinators) make none. A replica's plan depends only on its own partition state, its
topic and its local log, so a narrow pass plans exactly what a full one would for what
changed (except stray logs on disk, which only full passes set aside, renamed
``<name>-stray-<time>`` for an operator to remove, and only once the data dir's identity is
confirmed: :mod:`strom.storage.identity`). Why: at 10,000
partitions a full pass spent ~35 ms of the node's event loop building and comparing every
assignment, for each created topic or leader change (O(N^2) to create N single-partition
topics one at a time). A reconcile deletes replicas that are no longer assigned (deleting a
directory runs in a worker thread), creates new ones, and applies leadership and config
changes to the rest. Partitions are
installed and updated only on the loop, so request handlers read them without locks.

Each log directory carries a ``partition.metadata`` file with the topic id it belongs to (as
Kafka does), so a topic deleted and re-created under the same name while this node was away
is recognised and its old data never served as the new topic's: a folder found recording
another topic id than the one assigned is set aside like a stray (never deleted: the file
may be the damaged part) and the partition starts empty.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from strom.api import metadata_pb2 as md
from strom.log import Log, LogConfig, LogManager
from strom.log.checkpoint import fsync_dir, write_atomic
from strom.log.manager import PARTITION_METADATA, log_dir_name
from strom.metadata import ClusterView, WatchEvent, changed_topics
from strom.service.limits import nofile_limit, open_fd_count
from strom.storage import metrics
from strom.storage.assignment import (
    Assignment,
    TopicPartition,
    desired_assignments,
    log_config,
    plan_changes,
    usable_configs,
)
from strom.storage.identity import DataDirIdentity, IdentityError, cluster_agreement
from strom.storage.longpoll import WaiterRegistry
from strom.storage.partition import Partition
from strom.storage.replication_quota import ReplicationQuotas

log = logging.getLogger("strom.storage.manager")

__all__ = ["PARTITION_METADATA", "PartitionManager", "read_topic_id", "write_topic_id"]

#: A wake-up for more changed topics than this looks at everything.
MAX_NARROW_TOPICS = 32

#: File descriptors left free when opening logs: connections (clients, replicas, etcd, the
#: controller), checkpoints and segment rolls need some. A node that spent its last ones on
#: logs could not even accept a connection or tell the controller to move the leaderships
#: of the logs it could not open (under ``ulimit -n 256`` a node led
#: 300 partitions it had no log for, its metrics and health endpoints hanging).
FD_RESERVE = 64
#: Errors of a log open that mean this process or the system is out of file descriptors.
FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
#: Seconds between two log lines about logs not opened for want of descriptors.
FD_LOG_INTERVAL_S = 60.0
#: Seconds before a pass tries such logs again (descriptors rarely come back sooner).
FD_RETRY_S = 5.0


class _FdBudget:
    """Descriptors a batch of log opens may still take: measured at its start, then counted
    down by the segments each open log holds, and measured again every ``REMEASURE`` opens
    once near the reserve (connections come and go meanwhile). Far from the limit it costs
    one listing of /proc/self/fd per batch: a start with 10,000 logs is one batch."""

    REMEASURE = 32

    def __init__(self) -> None:
        self.limit = nofile_limit()
        self._left: int | None = None
        self._since = 0
        self._measure()

    def _measure(self) -> None:
        used = open_fd_count() if self.limit is not None else None
        self._left = None if used is None or self.limit is None else self.limit - used
        self._since = 0

    def allows(self) -> bool:
        near = self._left is not None and self._left < 4 * FD_RESERVE
        if near and self._since >= self.REMEASURE:
            self._measure()
        return self._left is None or self._left > FD_RESERVE

    def took(self, n: int) -> None:
        self._since += 1
        if self._left is not None:
            self._left -= n


def read_topic_id(directory: Path) -> str | None:
    """The topic id recorded in a log directory (None if absent or unreadable)."""
    try:
        text = (directory / PARTITION_METADATA).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id" and value.strip():
            return value.strip()
    return None


def write_topic_id(directory: Path, topic_id: str, *, fsync: bool) -> None:
    write_atomic(
        directory / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n".encode(), fsync=fsync
    )


class _NotSetAside(Exception):
    """A folder recording another topic id could not be renamed aside (already logged): its
    partition is not hosted, and the next reconcile tries again."""


def _count_recovery(tp: TopicPartition, lg: Log) -> None:
    """Count a recovery that cut ``lg`` (the log itself warns with its file and offsets):
    the replica lost data, which an operator must be able to see and alert on, not only
    read in a log line."""
    if lg.truncated_bytes_on_recovery or lg.lost_on_recovery:
        metrics.RECOVERY_TRUNCATIONS.labels(tp[0]).inc()
        metrics.RECOVERY_TRUNCATED_BYTES.labels(tp[0]).inc(lg.truncated_bytes_on_recovery)


#: How many of the slowest logs to open the start-up line names.
SLOWEST_LOGS_NAMED = 3


def _log_opened(logs: LogManager) -> None:
    """One line for the logs opened at start: how many, how long it took, whether they had
    to be recovered (an unclean shutdown) and which were slowest, as Kafka's "Loaded N logs
    in X ms". After an unclean shutdown the node said only
    "recovered 22 logs", so nobody could tell how much of a slow start recovery was, or
    which partition held it up."""
    if not logs.logs:
        return
    slowest = sorted(logs.open_seconds.items(), key=lambda kv: -kv[1])[:SLOWEST_LOGS_NAMED]
    named = ", ".join(f"{t}-{p} {s * 1000:.0f} ms" for (t, p), s in slowest)
    how = "clean shutdown" if logs.clean_shutdown else "recovered after an unclean shutdown"
    log.info(
        "loaded %d logs in %.0f ms (%s); slowest: %s",
        len(logs.logs),
        logs.opened_in_s * 1000,
        how,
        named,
        extra={
            "fields": {
                "logs": len(logs.logs),
                "load_ms": round(logs.opened_in_s * 1000, 1),
                "clean_shutdown": logs.clean_shutdown,
                "slowest": {f"{t}-{p}": round(s * 1000, 1) for (t, p), s in slowest},
            }
        },
    )


def _aside_suffix() -> str:
    """``-stray-<UTC time to the ms>``: what a folder set aside gets after its name (no
    digit at the end, so no start opens it as a log)."""
    ms = time.time_ns() // 10**6
    return (
        "-stray-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    )


class PartitionManager:
    """Hosts this node's partition replicas (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        view: ClusterView,
        loop: asyncio.AbstractEventLoop | None,
        *,
        fsync: bool = True,
    ) -> None:
        self.node_id = node_id
        self.view = view
        self.loop = loop  # set by the node on start when not known at construction
        self.fsync = fsync
        self.logs: LogManager | None = None
        self.partitions: dict[TopicPartition, Partition] = {}
        self.metrics: dict[TopicPartition, metrics.PartitionMetrics] = {}
        #: Replication throttles of reassignments (leader and follower buckets), their
        #: rates set from the cluster's dynamic node configs (the node's view listener).
        self.replication_quotas = ReplicationQuotas()
        self._assignments: dict[TopicPartition, Assignment] = {}
        #: The partitions of ``_assignments`` by topic (what a narrow reconcile compares).
        self._installed_by_topic: dict[str, set[int]] = {}
        self._topic_ids: dict[TopicPartition, str | None] = {}
        #: Logs whose partition.metadata was written without fsync (they were empty): made
        #: durable by the next checkpoint, as Kafka flushes it with the log.
        self._unsynced_ids: set[TopicPartition] = set()
        # Consumers wait for the high watermark, followers for appends (DESIGN §6).
        self.committed = WaiterRegistry()
        self.appended = WaiterRegistry()
        self._dirty = False
        #: What the next reconcile looks at: these topics, or everything (None). Loop only.
        self._pending_topics: set[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False
        self.reconciles = 0
        #: Passes by scope ("all", "topics"), plans or not: what the narrowing saves.
        self.passes = {"all": 0, "topics": 0}
        #: Extra hook run (on the loop) after each reconcile; the node refreshes gauges.
        self.after_reconcile: Callable[[], None] | None = None
        #: The data dir's identity (set by the node): strays are set aside only once it is
        #: confirmed; None (tests of the manager alone): once the cluster is initialised.
        self.identity: DataDirIdentity | None = None
        #: Called (on the loop, once) with the one-line reason when etcd's cluster id is not
        #: the one the data dir records, or the cluster contradicts an identity the data dir
        #: adopted from the flags; reconciles change nothing from then on.
        self.on_foreign_cluster: Callable[[str], None] | None = None
        self._foreign: str | None = None
        #: The cluster id the view has shown in this process life (None: not yet known).
        self._cluster_id: str | None = None
        #: Assigned partitions whose log could not be opened for want of file descriptors
        #: (EMFILE, ENFILE, or fewer than FD_RESERVE left), with the reason: not hosted, and
        #: the IsrManager hands over those this node leads. Loop only.
        self.unopened: dict[TopicPartition, str] = {}
        self._fd_logged_at = -FD_LOG_INTERVAL_S

    # -- opening ---------------------------------------------------------------------------

    def topic_configs(self, topic: str) -> dict[str, Any]:
        """Topic overrides from the view (for logs opened at start); invalid keys dropped."""
        meta = self.view.topic(topic)
        return usable_configs(meta.configs, where=f"topic {topic}: ") if meta else {}

    def open(self, data_dir: Path) -> LogManager:
        """Open (and if needed recover) every log in ``data_dir``; blocking, run in a thread.

        The view must be started first so each log opens with its topic's configs (segment
        rolling, retention, the index interval).
        """
        logs = LogManager(data_dir, fsync=self.fsync, configs=self.topic_configs)
        self._topic_ids = {tp: read_topic_id(lg.directory) for tp, lg in logs}
        for tp, lg in logs:
            _count_recovery(tp, lg)
        _log_opened(logs)
        self.logs = logs
        return logs

    def _ev(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None, "PartitionManager.loop is set when the node starts"
        return self.loop

    # -- triggering ------------------------------------------------------------------------

    def on_view_events(self, events: list[WatchEvent]) -> None:
        """ClusterView listener (watch thread): schedule a reconcile on the loop over the
        topics the events changed (everything after a resync or a change of the cluster key;
        nothing for keys a reconcile does not read, such as nodes or ACLs)."""
        if self._stopped or self.loop is None:
            return
        topics = changed_topics(self.view.keys, events)
        if topics is not None and any(ev.key == self.view.keys.cluster for ev in events):
            topics = None  # "initialised" may have flipped: full passes handle strays
        if topics is None or topics:
            self.loop.call_soon_threadsafe(self.request_reconcile, topics)

    def request_reconcile(self, topics: set[str] | None = None) -> None:
        """Mark ``topics`` (None: everything) dirty; start the reconcile task unless one is
        running (loop only)."""
        if topics is None or self._pending_topics is None:
            self._pending_topics = None
        else:
            self._pending_topics |= topics
            if len(self._pending_topics) > MAX_NARROW_TOPICS:
                self._pending_topics = None
        if self._stopped or self.logs is None:
            self._dirty = True
            return
        self._dirty = True
        if self._task is None or self._task.done():
            self._idle.clear()
            self._task = self._ev().create_task(self._reconcile_loop(), name="reconcile")

    async def wait_idle(self) -> None:
        """Until no reconcile is pending or running (start-up and tests)."""
        while True:
            await self._idle.wait()
            if not self._dirty or self._stopped:
                return
            self.request_reconcile()

    async def _reconcile_loop(self) -> None:
        try:
            while self._dirty and not self._stopped:
                self._dirty = False
                topics, self._pending_topics = self._pending_topics, set()
                try:
                    await self._reconcile_once(topics)
                except Exception:
                    log.exception("reconcile failed; retrying on the next change or in 1s")
                    self._pending_topics = None  # what the failed pass left undone is unknown
                    self._ev().call_later(1.0, self.request_reconcile)
                    break
        finally:
            self._idle.set()

    # -- reconciling -----------------------------------------------------------------------

    def _snapshot(
        self, only: set[str] | None = None
    ) -> tuple[dict[str, md.TopicMetadata], dict[TopicPartition, md.PartitionState], str | None]:
        """The view's topics and partition states (of the ``only`` topics, when given) and
        the cluster id (None while the cluster key is absent: not initialised)."""
        with self.view.lock:
            if only is None:
                topics = {name: v.value for name, v in self.view.topics.items()}
                parts = {tp: v.value for tp, v in self.view.partitions.items()}
            else:
                topics = {n: v.value for n in only if (v := self.view.topics.get(n)) is not None}
                parts = {
                    (n, p): v.value
                    for n in only
                    for p, v in self.view.topic_partitions_locked(n).items()
                }
            cluster = self.view.cluster
        return topics, parts, cluster.cluster_id if cluster is not None else None

    async def _may_set_aside_strays(
        self,
        cluster_id: str | None,
        full: tuple[
            dict[str, md.TopicMetadata],
            dict[TopicPartition, md.PartitionState],
            Mapping[TopicPartition, str | None],
        ]
        | None,
    ) -> bool:
        """Whether this pass may set aside logs this process never hosted: the view describes
        an initialised cluster and the data dir is confirmed to be this node's in it. Records
        the cluster id in the data dir when it learns it; on a full pass (``full``: its
        topics, partition states and local logs) checks an identity adopted from the flags
        against the cluster. False (and :attr:`_foreign` set) when the data dir records
        another cluster id or the cluster assigns this node none of its logs."""
        if cluster_id is None:
            if self._cluster_id is not None:
                # Etcd restarted without its data (wiped, or
                # restored from before the cluster existed): the view resyncs to no cluster
                # key, no topics, and a pass would delete every replica this node serves.
                self._stop_foreign(
                    f"cluster {self.view.keys.cluster_name!r} in etcd has no cluster id any more "
                    f"(it had {self._cluster_id}): etcd lost its data, so the cluster's "
                    "topics are gone from it; nothing was changed: restore etcd's data, then "
                    "start the node"
                )
            return False
        if cluster_id:
            self._cluster_id = cluster_id
        ident = self.identity
        if ident is None:
            return True
        try:
            agreement = None
            if full is not None and cluster_id and not ident.confirmed:
                agreement = cluster_agreement(self.node_id, full[2], full[0], full[1])
            if agreement is not None or (cluster_id and not ident.check_cluster_id(cluster_id)):
                await asyncio.to_thread(ident.settle, cluster_id, agreement)
        except IdentityError as exc:
            self._stop_foreign(str(exc))
            return False
        return ident.may_set_aside_strays(cluster_id)

    def _stop_foreign(self, message: str) -> None:
        self._foreign = message
        if self.on_foreign_cluster is not None:
            self.on_foreign_cluster(message)
        else:
            log.error("%s", message)

    async def _reconcile_once(self, only: set[str] | None = None) -> None:
        """One pass over everything, or over the ``only`` topics (see the module docstring)."""
        assert self.logs is not None
        logs = self.logs
        scope = "all" if only is None else "topics"
        self.passes[scope] += 1
        metrics.RECONCILE_PASSES.labels(scope).inc()
        if self._foreign is not None:
            return  # this data dir is another cluster's: change nothing, the node stops
        topics, parts, cluster_id = self._snapshot(only)
        desired = desired_assignments(self.node_id, topics, parts)
        installed: Mapping[TopicPartition, Assignment] = self._assignments
        if only is None:
            local = {tp: self._topic_ids.get(tp) for tp, _ in logs}
        else:
            # The topics' installed and desired replicas (a stray log of theirs that is
            # neither waits for the next full pass, as strays of other topics do).
            installed = {
                (n, p): self._assignments[(n, p)]
                for n in only
                for p in self._installed_by_topic.get(n, ())
            }
            local = {
                tp: self._topic_ids.get(tp)
                for tp in {*installed, *desired}
                if logs.get(*tp) is not None
            }
        # Strays (logs on disk this process never hosted) are only set aside once the view is
        # known to describe an initialised cluster and the data dir's meta.properties names
        # this node in it, confirmed: a node pointed at the wrong --cluster, at an empty etcd
        # or started with another node's --node-id must not take its data out of service.
        full = (topics, parts, local) if only is None else None
        set_aside_strays = await self._may_set_aside_strays(cluster_id, full)
        if self._foreign is not None:
            return
        plan = plan_changes(desired, installed, local, set_aside_strays=set_aside_strays)
        if not plan:
            return
        self.reconciles += 1
        leaving = (*plan.delete, *plan.mismatched)
        going = [p for tp in leaving if (p := self._uninstall(tp)) is not None]
        for part in going:
            # Let a flush or cleaner pass running in a thread finish first.
            async with part.flush_lock, part.maintenance_lock:
                pass
        if plan.delete:
            names = ", ".join(f"{t}-{p}" for t, p in plan.delete)
            log.info("deleting local replicas: %s", names)
            await asyncio.to_thread(self._delete_logs, list(plan.delete))
        if plan.strays:
            await asyncio.to_thread(self._set_aside_logs, list(plan.strays))
        if plan.create:
            # The mismatched logs' partitions are among them: _create_logs sets those aside
            # (_set_aside_other_topics_log) before creating them afresh.
            created, short = await asyncio.to_thread(self._create_logs, list(plan.create))
            for a, lg in created:
                self.unopened.pop(a.tp, None)
                self._install(a, lg)
            self._note_unopened(short)
        for a in plan.update:
            self._update(a)
        if self.after_reconcile is not None:
            self.after_reconcile()

    def _delete_logs(self, tps: list[TopicPartition]) -> None:
        assert self.logs is not None
        for tp in tps:
            try:
                self.logs.delete(*tp)
            except OSError:
                log.exception("could not delete the log of %s-%d", *tp)
            self._topic_ids.pop(tp, None)

    def _set_aside_logs(self, tps: list[TopicPartition]) -> None:
        """Rename stray logs aside (``<topic>-<partition>-stray-<UTC time>``, the topic cut
        and followed by ``~<hash>`` when the name would pass 255 bytes) instead of deleting
        them: a stray is only judged so from the cluster view and the data dir's identity,
        and a mistake in either (a wrong --node-id) deleted every replica
        of a dir. An operator removes them once sure they are not needed."""
        assert self.logs is not None
        suffix = _aside_suffix()
        for tp in tps:
            try:
                aside = self.logs.set_aside(*tp, suffix)
            except (OSError, ValueError):
                log.exception("could not set aside the stray log of %s-%d", *tp)
                continue
            self._topic_ids.pop(tp, None)
            if aside is not None:
                metrics.REPLICAS_SET_ASIDE.labels(metrics.SET_ASIDE_UNASSIGNED, tp[0]).inc()
                log.warning(
                    "stray replica %s-%d (on disk, not assigned to this node) set aside as %s; "
                    "remove it once it is not needed",
                    *tp,
                    aside,
                )

    def _create_logs(
        self, wanted: list[Assignment]
    ) -> tuple[list[tuple[Assignment, Log]], dict[TopicPartition, str]]:
        """Open (or create) the logs of ``wanted`` (blocking). Returns the opened ones and
        those left unopened for want of file descriptors, with the reason."""
        assert self.logs is not None
        out = []
        short: dict[TopicPartition, str] = {}
        failed = False
        budget = _FdBudget()
        for a in wanted:
            overrides = usable_configs(a.config_dict(), where=f"{a.topic}-{a.partition}: ")
            opened = self.logs.get(a.topic, a.partition) is not None  # at start: all
            if not opened and not budget.allows():
                short[a.tp] = (
                    f"fewer than {FD_RESERVE} file descriptors left (RLIMIT_NOFILE {budget.limit})"
                )
                continue
            try:
                self._set_aside_other_topics_log(a)
                lg = self.logs.get_or_create(a.topic, a.partition, overrides)
                cfg = LogConfig.from_dict(overrides)
                if lg.config != cfg:
                    # A log opened at start (or left from before) with other settings.
                    lg.update_config(cfg)
                if a.topic_id and self._topic_ids.get(a.tp) != a.topic_id:
                    # Written (with its fsyncs) only when the directory does not record it yet:
                    # at start-up every partition passes here.
                    if read_topic_id(lg.directory) != a.topic_id:
                        # An empty log needs no fsync: if a crash loses the file, nothing is
                        # there to be mistaken for another topic's data, and the next start
                        # writes it again (half of a new partition's creation time).
                        durable = self.fsync and lg.log_end_offset > 0
                        write_topic_id(lg.directory, a.topic_id, fsync=durable)
                        if self.fsync and not durable:
                            self._unsynced_ids.add(a.tp)
                    self._topic_ids[a.tp] = a.topic_id
            except _NotSetAside:
                failed = True  # said why already
                continue
            except OSError as exc:
                if exc.errno not in FD_ERRNOS:
                    log.exception("could not open the log of %s-%d", a.topic, a.partition)
                    failed = True
                    continue
                short[a.tp] = f"{exc.strerror} (RLIMIT_NOFILE {budget.limit})"
                continue
            except Exception:
                log.exception("could not open the log of %s-%d", a.topic, a.partition)
                failed = True
                continue
            if not opened:
                budget.took(len(lg.segments))
                _count_recovery(a.tp, lg)  # a folder left on disk is recovered when opened
            out.append((a, lg))
        if failed or short:
            # Not installed, so the next reconcile tries again; make sure there is one.
            # Descriptors rarely come back within a second: those wait longer.
            loop = self._ev()
            delay = 1.0 if failed else FD_RETRY_S
            loop.call_soon_threadsafe(loop.call_later, delay, self.request_reconcile)
        return out, short

    def _note_unopened(self, short: dict[TopicPartition, str]) -> None:
        """Record the logs a pass could not open for want of file descriptors, and say so in
        one line a minute per node (a traceback per partition per retry buried the log)."""
        self.unopened.update(short)
        if not short:
            return
        now = time.monotonic()
        if now - self._fd_logged_at < FD_LOG_INTERVAL_S:
            return
        self._fd_logged_at = now
        names = sorted(self.unopened)
        shown = ", ".join(f"{t}-{p}" for t, p in names[:5])
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        log.error(
            "could not open the logs of %d partitions (%s%s): %s; this node does not host "
            "them and hands over those it leads; raise the open-file limit (ulimit -n, "
            "LimitNOFILE): a replica needs one descriptor per segment",
            len(names),
            shown,
            more,
            next(iter(short.values())),
        )

    def _set_aside_other_topics_log(self, a: Assignment) -> None:
        """Rename aside (as strays are: ``<name>-stray-<UTC time>``) the log folder of ``a``'s
        partition, open or only on disk, when its ``partition.metadata`` records another topic
        id than ``a``'s: the partition must start empty, never with another topic's records,
        and the folder must survive for an operator, because the id on disk may be the wrong
        one (a damaged file) as well as an earlier topic's of the same name. A log without a
        recorded id (an older strom's) is adopted. Raises :class:`_NotSetAside` (having said
        why) when the folder cannot be set aside, so the partition is not hosted and the next
        reconcile tries again.

        Set aside, not deleted: one changed character in an RF=1 replica's
        ``partition.metadata`` would destroy the partition's only copy (Kafka 3.7+,
        KAFKA-14616, renames such a log ``-stray`` too). A folder a failed delete left
        behind is set aside as well, or re-creating the name would serve its records."""
        assert self.logs is not None
        if not a.topic_id:
            return
        folder = self.logs.data_dir / log_dir_name(a.topic, a.partition)
        recorded = self._topic_ids[a.tp] if a.tp in self._topic_ids else read_topic_id(folder)
        if recorded is None or recorded == a.topic_id:
            return
        lg = self.logs.get(a.topic, a.partition)
        held = f" (log end offset {lg.log_end_offset})" if lg is not None else ""
        try:
            aside = self.logs.set_aside(a.topic, a.partition, _aside_suffix())
        except OSError as exc:
            log.error(
                "%s-%d: the log folder %s%s records topic id %s, but the cluster assigns the "
                "partition to this node as topic id %s, and it could not be set aside (%s): "
                "the partition is not hosted here until it can be; retrying",
                a.topic,
                a.partition,
                folder,
                held,
                recorded,
                a.topic_id,
                exc,
            )
            raise _NotSetAside from exc
        self._topic_ids.pop(a.tp, None)
        if aside is None:
            return  # gone meanwhile
        metrics.REPLICAS_SET_ASIDE.labels(metrics.SET_ASIDE_TOPIC_ID_MISMATCH, a.topic).inc()
        log.warning(
            "%s-%d: the log folder %s%s records topic id %s, but the cluster assigns the "
            "partition to this node as topic id %s (the topic was deleted and created again "
            "while this node was away, or the file was damaged): set it aside as %s, kept; "
            "the partition starts empty here. If those records are the topic's, the runbook in "
            "docs/reliability.md puts them back; else remove the folder",
            a.topic,
            a.partition,
            folder,
            held,
            recorded,
            a.topic_id,
            aside,
        )

    def _install(self, a: Assignment, lg: Log) -> None:
        m = metrics.PartitionMetrics(a.topic, a.partition)
        self.metrics[a.tp] = m
        part = Partition(
            self.node_id,
            a.topic,
            a.partition,
            a.topic_id,
            lg,
            a.state,
            on_high_watermark=self._on_high_watermark,
        )
        self.partitions[a.tp] = part
        self._assignments[a.tp] = a
        self._installed_by_topic.setdefault(a.topic, set()).add(a.partition)
        self.refresh_gauges(part)
        log.info(
            "hosting %s-%d (%s, leader epoch %d, log end offset %d)",
            a.topic,
            a.partition,
            "leader" if part.is_leader else f"follower of {part.leader}",
            part.leader_epoch,
            lg.log_end_offset,
        )

    def _update(self, a: Assignment) -> None:
        part = self.partitions.get(a.tp)
        if part is None:
            return
        old = self._assignments.get(a.tp)
        if old is None or old.configs != a.configs:
            cfg = log_config(a.config_dict(), where=f"{a.topic}-{a.partition}: ")
            if part.log.config != cfg:
                part.log.update_config(cfg)
                log.info("applied new configs to %s-%d", a.topic, a.partition)
        if part.apply_state(a.state):
            log.info(
                "%s-%d: now %s at leader epoch %d",
                a.topic,
                a.partition,
                "leader" if part.is_leader else f"follower of {part.leader}",
                part.leader_epoch,
            )
        self._assignments[a.tp] = a
        # Leadership may also have come from an AlterPartition answer before this pass.
        self._refresh_leader_gauges(part)
        # Parked fetches re-evaluate (they may now have to answer NOT_LEADER_OR_FOLLOWER).
        self.committed.wake(a.tp)
        self.appended.wake(a.tp)

    def _uninstall(self, tp: TopicPartition) -> Partition | None:
        self.unopened.pop(tp, None)
        part = self.partitions.pop(tp, None)
        if self._assignments.pop(tp, None) is not None:
            of_topic = self._installed_by_topic.get(tp[0])
            if of_topic is not None:
                of_topic.discard(tp[1])
                if not of_topic:
                    del self._installed_by_topic[tp[0]]
        if part is not None:
            part.close()
        m = self.metrics.pop(tp, None)
        if m is not None:
            m.remove()
            if tp[0] not in self._installed_by_topic:
                metrics.remove_topic(tp[0])
        self.committed.wake(tp)
        self.appended.wake(tp)
        return part

    # -- watermarks and gauges -------------------------------------------------------------

    def _on_high_watermark(self, part: Partition, old: int, new: int) -> None:
        m = self.metrics.get(part.tp)
        if m is not None:
            m.high_watermark.set(new)
            if part.is_leader:
                m.set_leading(True, new - part.last_stable_offset)
            elif m.lso_lag is not None:
                m.set_leading(False)

    def _refresh_leader_gauges(self, part: Partition) -> None:
        """Add or drop the leader-only series to match the replica's current role."""
        m = self.metrics.get(part.tp)
        if m is not None:
            leading = part.is_leader and not part.deleted
            m.set_leading(leading, part.high_watermark - part.last_stable_offset if leading else 0)

    def refresh_gauges(self, part: Partition) -> None:
        """Set all of a partition's gauges from its log (after structural changes)."""
        m = self.metrics.get(part.tp)
        if m is None:
            return
        lg = part.log
        m.log_end_offset.set(lg.log_end_offset)
        m.log_start_offset.set(lg.log_start_offset)
        m.high_watermark.set(part.high_watermark)
        m.log_size.set(lg.size_bytes)
        self._refresh_leader_gauges(part)

    def role_counts(self) -> tuple[int, int]:
        """(leaders, followers) among the hosted replicas; safe from any thread (the
        metrics scrape calls it)."""
        parts = list(self.partitions.values())
        leaders = sum(1 for p in parts if p.is_leader)
        return leaders, len(parts) - leaders

    def get(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def assignments(self) -> Mapping[TopicPartition, Assignment]:
        return dict(self._assignments)

    def sync_topic_ids(self) -> int:
        """fsync the partition.metadata files written without it (blocking; the node's
        periodic checkpoint). Returns how many were synced."""
        done = 0
        for tp in list(self._unsynced_ids):
            self._unsynced_ids.discard(tp)
            part = self.partitions.get(tp)
            if part is None or part.deleted:
                continue
            try:
                fd = os.open(part.log.directory / PARTITION_METADATA, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_dir(part.log.directory)
                done += 1
            except FileNotFoundError:
                continue  # deleted meanwhile
            except OSError:
                log.exception("could not sync the partition.metadata of %s-%d", *tp)
                self._unsynced_ids.add(tp)
        return done

    async def flush(self, part: Partition, *, force: bool = False) -> None:
        """fsync a partition's log in a worker thread if its flush settings (or ``force``)
        ask for it. One flush per partition at a time; callers arriving meanwhile re-check
        afterwards, so a burst of appends costs one or two fsyncs, not one each."""
        async with part.flush_lock:
            if part.deleted:
                return
            if force or part.log.needs_flush():
                await asyncio.to_thread(part.log.flush)

    # -- stopping --------------------------------------------------------------------------

    def release_waiters(self) -> None:
        """Shutdown, first step: parked fetches answer now, acks=-1 produces stop waiting
        for replication (they answer NOT_LEADER_OR_FOLLOWER: leadership is about to move)."""
        self.committed.close()
        self.appended.close()
        for part in self.partitions.values():
            part.release_waiters()

    async def stop(self) -> None:
        """No more reconciles; release every waiter; let a running reconcile step finish."""
        self._stopped = True
        self.release_waiters()
        if self._task is not None and not self._task.done():
            # A reconcile may be inside a worker thread; let it finish its step.
            await asyncio.wait({self._task}, timeout=5.0)
