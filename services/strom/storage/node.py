"""The storage-node service: registration, partition manager, servicer, background tasks.

:class:`StorageNode` is the :class:`strom.service.runtime.Service` that ``serve()`` runs.
Start-up order matters and is:

0. read the data dir's ``meta.properties`` (:mod:`strom.storage.identity`): a dir that
   records another node id or cluster name refuses the start before anything touches it;
1. register ``nodes/<id>`` (STARTING) under a lease: refuses a node id held by a live
   process *before* touching the data dir, so two processes never write one log;
2. start the cluster view (snapshot + watch), so logs open with their topics' configs;
   refuse a data dir recorded for another cluster id, or one whose identity was adopted
   from the flags (no meta.properties) and whose logs the cluster assigns to other nodes;
   record the identity if it is new;
3. open the data dir (recovery after a crash) in a worker thread;
4. reconcile once (create/delete/update replicas), then publish RUNNING.

Replication runs as one fetcher task per leader node this node follows
(:mod:`strom.storage.replica_fetchers`, refreshed after every reconcile) and an ISR task
proposing AlterPartition (:mod:`strom.storage.isr`).
InitProducerId reserves producer id blocks from the same controller
(:mod:`strom.storage.producer_ids`).

Shutdown (SIGTERM) first asks the controller to move this node's leaderships away
(ControlledShutdown, bounded wait; skipped if no controller answers or it does not implement
it), then is the reverse of start-up: publish SHUTTING_DOWN, wake parked fetches, stop the gRPC
server (no new RPCs, in-flight ones finish), stop background work and replica fetchers, close
the logs (writes the clean-shutdown marker so the next start skips recovery) and revoke the
lease last, so the node is visibly alive until its data is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from strom.api import controller_pb2, storage_pb2
from strom.api import metadata_pb2 as md
from strom.log import compact, dirtiest_first, measure_logs
from strom.log.errors import disk_full_hint
from strom.metadata import (
    RESYNC,
    ClusterView,
    MetadataStore,
    MetadataUnavailableError,
    WatchEvent,
)
from strom.service import log_levels
from strom.service.limits import (
    Admission,
    default_max_connections,
    default_memory_limit,
    nofile_limit,
    open_fd_count,
)
from strom.storage import metrics, records_api, subscriptions
from strom.storage.controller_client import ControllerClient
from strom.storage.identity import (
    Agreement,
    DataDirIdentity,
    IdentityError,
    cluster_agreement,
    partition_dirs,
)
from strom.storage.isr import IsrManager, running_nodes
from strom.storage.manager import FD_RESERVE, PartitionManager, read_topic_id
from strom.storage.partition import Partition
from strom.storage.producer_ids import ProducerIdAllocator, controller_block_fetcher
from strom.storage.readiness import InSyncReadiness
from strom.storage.registration import NodeIdInUseError, NodeRegistration
from strom.storage.replica_fetchers import ReplicaFetchers
from strom.storage.servicer import StorageServicer, add_to_server

log = logging.getLogger("strom.storage")

SERVICE_NAME = storage_pb2.DESCRIPTOR.services_by_name["StorageService"].full_name
#: Timeout of one ControlledShutdown call that fences a previous life: longer than the
#: controller's wait for its own view (10 s, strom.controller.core._await_view).
CONTROLLED_SHUTDOWN_CALL_S = 15.0
#: At most one log line per this many seconds about a re-registration that keeps failing.
REREGISTER_LOG_EVERY_S = 10.0
#: How long the node's own key may be missing from its view before the watchdog
#: re-registers (longer than a lease loss takes to be reported and re-registered).
REGISTRATION_WATCHDOG_S = 5.0


def tune_malloc(
    trim_threshold: int = 256 << 20, mmap_threshold: int = 64 << 20, arena_max: int = 2
) -> bool:
    """Keep freed heap memory for reuse instead of returning it to the OS (glibc only).

    Every Produce request arrives as a fresh ~1 MiB ``bytes`` and every Fetch answer is a
    fresh ~1 MiB buffer. With glibc's defaults those buffers keep being mmapped/trimmed away
    and faulted back in, and the kernel zeroes every new page: profiling a node showed about
    a quarter of its CPU in page faults and ``clear_page``. Raising the trim and mmap
    thresholds lets the allocator recycle the same pages (at the cost of holding up to
    ``trim_threshold`` bytes of free heap), which cut the node's CPU per GiB by 15-35 %.

    That hold is per malloc arena, and glibc gives a process up to 8 per core (threads
    that allocate at once get their own). A node serving
    RecordService Subscribe streams (each with its own threads) grew to 1-1.4 GB and stayed
    there; ``arena_max`` arenas (as MALLOC_ARENA_MAX=2, the usual setting for Python
    servers: the interpreter lock serialises most allocation anyway) bound what is held.
    Returns False where mallopt is unavailable (not glibc); nothing else depends on it.
    """
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8  # from <malloc.h>
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(
            libc.mallopt(m_trim_threshold, trim_threshold)
            and libc.mallopt(m_mmap_threshold, mmap_threshold)
            and libc.mallopt(m_arena_max, arena_max)
        )
    except (OSError, AttributeError):
        return False


class StartupError(RuntimeError):
    """The node cannot start; the message is the one line the operator sees."""


@dataclass(frozen=True)
class NodeConfig:
    """Everything a storage node is configured with (from flags, env and YAML)."""

    node_id: int
    data_dir: Path
    listen: str
    advertise_host: str
    advertise_port: int
    metrics_port: int
    etcd: str
    cluster: str = "strom"
    #: Why the advertised address was guessed (a wildcard --listen without --advertise),
    #: logged once the node logs; None when the flags named it.
    advertise_warning: str | None = None
    rack: str | None = None
    session_timeout_s: int = 2
    log_cleanup_interval_ms: int = 30_000
    checkpoint_interval_ms: int = 60_000
    shutdown_grace_s: float = 5.0
    fsync: bool = True
    replica_lag_time_max_ms: int = 10_000
    controlled_shutdown_timeout_s: float = 5.0
    #: How long a restarting node waits for the controller to fence its previous life.
    startup_fence_timeout_s: float = 60.0
    max_connections: int = 0  # 0: strom.service.limits.default_max_connections()
    max_inflight_produce_bytes: int = 256 * 1024 * 1024
    max_memory_bytes: int = -1  # -1: strom.service.limits.default_memory_limit(); 0: none
    #: How long a group Subscribe stream's reader may read nothing while records wait.
    subscribe_max_stall_ms: int = 300_000


class StorageNode:
    """One storage node process (see the module docstring)."""

    name = "storage-node"

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.store = MetadataStore(config.etcd, config.cluster)
        self.view = ClusterView(self.store)
        #: The dynamic log levels (``log.level``, ``log.level.<logger>``) as they change.
        log_levels.follow(self.view)
        self.registration = NodeRegistration(
            self.store,
            node_id=config.node_id,
            host=config.advertise_host,
            port=config.advertise_port,
            metrics_port=config.metrics_port,
            rack=config.rack,
            session_timeout_s=config.session_timeout_s,
        )
        self.view.add_listener(metrics.OfflinePartitions(self.view).on_events)
        #: Readiness (health name ``strom.ready``): back in the ISR of every partition it
        #: replicates, so a rolling restart waits for this node before stopping the next.
        self.readiness = InSyncReadiness(config.node_id, self.view)
        self.view.add_listener(self.readiness.on_view_events)
        metrics.publish_node_id(config.node_id)
        metrics.watch_data_dir(config.data_dir)
        self.manager = PartitionManager(config.node_id, self.view, None, fsync=config.fsync)
        self.manager.after_reconcile = self._after_reconcile
        #: Whose data the data dir holds; the manager sets strays aside only once it matches.
        self.identity = DataDirIdentity(
            config.data_dir, config.node_id, config.cluster, fsync=config.fsync
        )
        self.manager.identity = self.identity
        self.manager.on_foreign_cluster = self._on_foreign_cluster
        metrics.count_partitions_with(self.manager.role_counts)
        self.servicer = StorageServicer(config.node_id, self.manager, self.view)
        self.controller = ControllerClient(self.view)
        incarnation = lambda: self.registration.incarnation_id or ""  # noqa: E731
        # InitProducerId: ids from blocks the active controller reserves (DESIGN §6).
        self.servicer.producer_ids = ProducerIdAllocator(
            controller_block_fetcher(self.controller.call, config.node_id, incarnation)
        )
        self.fetchers = ReplicaFetchers(config.node_id, self.manager, self.view, incarnation)
        self.isr = IsrManager(
            config.node_id,
            self.manager,
            self.controller,
            incarnation,
            config.replica_lag_time_max_ms,
            running=lambda: running_nodes(self.view),
        )
        self.servicer.on_out_of_sync_fetch = self.isr.kick
        # RecordService (records.proto): record-level produce/subscribe for any language.
        self.records = records_api.RecordService(
            config.node_id,
            self.view,
            lambda req: self.servicer.Produce(req, None),
            lambda req: self.servicer.InitProducerId(req, None),
            self._client_bootstrap,
            subscribe_max_stall_s=config.subscribe_max_stall_ms / 1000.0,
            incarnation=incarnation,
        )
        self.view.add_listener(subscriptions.drop_deleted_topics(self.view))
        # Replication throttle rates (the dynamic node configs every node applies).
        self.view.add_listener(self._on_node_configs)
        memory = config.max_memory_bytes
        self.admission = Admission(
            config.max_inflight_produce_bytes, default_memory_limit() if memory < 0 else memory
        )
        self.servicer.admission = self.admission
        self.records.admission = self.admission
        #: The gRPC server serving this node, while it exists. A weak reference: the node
        #: outlives serve() (metrics callbacks hold it), and a server still alive at exit
        #: keeps gRPC's poller thread running into interpreter shutdown, which printed
        #: "Error in sys.excepthook: / Original exception was:" after every failed start
        #:.
        self._server: weakref.ref[grpc.aio.Server] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reregister: asyncio.Task[None] | None = None
        #: Set by every loss of the lease; the re-registration loop clears it per attempt
        #: and goes on while a loss arrived during the attempt.
        self._lost_again = False
        self._registered = False

    def _on_node_configs(self, events: list[WatchEvent]) -> None:
        """ClusterView listener (watch thread): a change of ``node_configs`` (or a resync)
        sets the replication throttle rates, on the loop that charges the buckets."""
        key = self.view.keys.node_configs
        if not any(ev is RESYNC or ev.key == key for ev in events):
            return
        with self.view.lock:
            v = self.view.node_configs
            configs = dict(v.value.configs) if v is not None else {}
        loop = self._loop
        if loop is None or loop.is_closed():
            self._apply_node_configs(configs)
        else:
            loop.call_soon_threadsafe(self._apply_node_configs, configs)

    def _apply_node_configs(self, configs: dict[str, str]) -> None:
        quotas = self.manager.replication_quotas
        if quotas.apply(configs):
            log.info(
                "replication throttle rates: leader %s, follower %s bytes/s",
                quotas.leader.rate or "unlimited",
                quotas.follower.rate or "unlimited",
            )
        metrics.REPLICATION_THROTTLE_RATE.labels("leader").set(quotas.leader.rate or 0)
        metrics.REPLICATION_THROTTLE_RATE.labels("follower").set(quotas.follower.rate or 0)

    # -- Service protocol ------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> list[str]:
        self._server = weakref.ref(server)
        add_to_server(self.servicer, server)
        records_api.add_to_server(self.records, server)
        return [SERVICE_NAME, records_api.SERVICE_NAME]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.manager.loop = loop
        cfg = self.config
        try:
            # Read only: a start refused for another reason leaves the data dir as it was.
            await self._check_identity(self.identity.check_flags)
            try:
                await asyncio.to_thread(self.registration.register, self._on_lease_lost)
            except NodeIdInUseError as exc:
                raise StartupError(str(exc)) from None
            except MetadataUnavailableError as exc:
                raise StartupError(f"cannot reach etcd at {cfg.etcd}: {exc}") from None
            self._registered = True
            self.view.add_listener(self.manager.on_view_events)
            await asyncio.to_thread(self.view.start)
            await self._settle_identity()
            try:
                await asyncio.to_thread(self.manager.open, cfg.data_dir)
            except OSError as exc:
                raise StartupError(
                    f"cannot open data dir {cfg.data_dir}: {exc}{disk_full_hint(exc)}"
                ) from None
            await self._fence_previous_life()
            self.manager.request_reconcile()
            await self.manager.wait_idle()
            await asyncio.to_thread(
                self.store.retry,
                lambda: self.registration.set_state(md.NODE_STATE_RUNNING),
                deadline_s=30,
            )
        except BaseException:
            await self._abort_start()
            raise
        self._tasks = [
            loop.create_task(self.admission.run(self._stopping), name="memory-sampler"),
            loop.create_task(
                self._every(cfg.log_cleanup_interval_ms, self._cleanup), name="cleanup"
            ),
            loop.create_task(
                self._every(cfg.checkpoint_interval_ms, self._checkpoint), name="checkpoint"
            ),
            loop.create_task(self._flush_ms_loop(), name="flush-ms"),
            loop.create_task(self.isr.run(self._stopping), name="isr"),
            loop.create_task(self._registration_watchdog(), name="registration-watchdog"),
        ]
        self.fetchers.refresh()
        self._warn_if_short_of_descriptors()
        log.info(
            "node %d running: %d partitions, advertised as %s:%d, incarnation %s",
            cfg.node_id,
            len(self.manager.partitions),
            cfg.advertise_host,
            cfg.advertise_port,
            self.registration.incarnation_id,
        )

    def _warn_if_short_of_descriptors(self) -> None:
        """One line at start when the descriptors open now (mostly the logs: one per segment
        of each replica) plus the connections allowed (--max-connections, by default half
        the limit) come within FD_RESERVE of the open-file limit: at 1,200 partitions under
        ``ulimit -n 256`` the first sign was a node failing its logs and connections at
        run time."""
        limit, used = nofile_limit(), open_fd_count()
        if limit is None or used is None:
            return
        conns = self.config.max_connections or default_max_connections()
        if used + conns + FD_RESERVE <= limit:
            return
        log.warning(
            "the open-file limit (RLIMIT_NOFILE %d) is close: %d descriptors open with %d "
            "partitions (one per segment of each replica), and up to %d connections "
            "(--max-connections); logs that do not fit are not opened and their "
            "leaderships go to other replicas: raise the limit (ulimit -n, LimitNOFILE)",
            limit,
            used,
            len(self.manager.partitions),
            conns,
        )

    async def _settle_identity(self) -> None:
        """Step 2's check of the data dir against the cluster: a changed cluster id, and an
        identity adopted from the flags (an older strom's dir) that the cluster's assignment
        does not confirm, which a wrong --node-id would otherwise lock in (found from
        outside). Before the logs are opened, so a refusal leaves every file as it was."""
        cluster = self.view.cluster
        cluster_id = cluster.cluster_id if cluster else ""
        agreement = None
        if cluster_id and not self.identity.confirmed:
            agreement = await asyncio.to_thread(self._agreement_on_disk)
        await self._check_identity(self.identity.settle, cluster_id, agreement)

    def _agreement_on_disk(self) -> Agreement:
        """How the cluster's assignment agrees with this node id owning the data dir's logs
        (blocking: reads each log's partition.metadata)."""
        local = {
            tp: read_topic_id(path) for tp, path in partition_dirs(self.config.data_dir).items()
        }
        with self.view.lock:
            topics = {name: v.value for name, v in self.view.topics.items()}
            parts = {tp: v.value for tp, v in self.view.partitions.items()}
        return cluster_agreement(self.config.node_id, local, topics, parts)

    async def _check_identity(self, step: Callable[..., None], *args: object) -> None:
        """Run one step of the data dir's identity check (strom.storage.identity) in a
        thread; its refusal is the start's one line."""
        try:
            await asyncio.to_thread(step, *args)
        except IdentityError as exc:
            raise StartupError(str(exc)) from None
        except OSError as exc:
            raise StartupError(
                f"cannot open data dir {self.config.data_dir}: {exc}{disk_full_hint(exc)}"
            ) from None

    def _on_foreign_cluster(self, message: str) -> None:
        """The partition manager found the data dir is not this node's in this cluster while
        running (the cluster id in etcd changed: created again under the same name; or the
        cluster, once initialised, assigns none of the logs of a dir whose identity was
        adopted from the flags): stop, as a start would refuse."""
        log.error("%s; shutting down", message)
        os.kill(os.getpid(), signal.SIGTERM)

    def _roles_from_a_previous_life(self) -> int:
        """Partitions whose state in etcd still names this node leader or in-sync replica."""
        me = self.config.node_id
        with self.view.lock:
            states = [v.value for v in self.view.partitions.values()]
        return sum(1 for st in states if st.leader == me or me in st.isr)

    async def _fence_previous_life(self) -> None:
        """Before taking any partition role, have the controller fence this node's previous
        life: move its leaderships to other in-sync replicas and take it out of the ISRs.

        Normally the controller did that when the previous process's lease expired. But when
        it could not (paused, cut off from etcd, failing over) this incarnation registers while
        etcd still names the node leader or in-sync with the old leader epoch, and its log may
        be shorter than what it acknowledged (a replaced disk, writes lost with the machine):
        leading with that epoch would make the followers truncate to it, losing acknowledged
        records (found by the 20-minute chaos run). ControlledShutdown while this node is
        STARTING (not eligible) does exactly the fencing; the node rejoins ISRs by catching up.
        Waits for a controller (retrying) up to ``startup_fence_timeout_s``; a node that leads
        partitions no other in-sync replica can take keeps those.
        """
        roles = self._roles_from_a_previous_life()
        if roles == 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_fence_timeout_s
        req = controller_pb2.ControlledShutdownRequest(
            node_id=self.config.node_id, incarnation_id=self.registration.incarnation_id or ""
        )
        log.info(
            "etcd still names node %d leader or in-sync replica of %d partitions from its "
            "previous life; waiting for the controller to fence it before taking any role",
            self.config.node_id,
            roles,
        )
        while loop.time() < deadline:
            try:
                # The controller answers once its own view shows what it committed (up to
                # ~10 s when that view lags): a shorter timeout would never see a slow success.
                resp = await self.controller.call(
                    "ControlledShutdown",
                    req,
                    timeout=max(min(CONTROLLED_SHUTDOWN_CALL_S, deadline - loop.time()), 0.5),
                )
            except grpc.aio.AioRpcError:
                log.warning("controller does not implement ControlledShutdown; not fenced")
                return
            if resp is None and self._roles_from_a_previous_life() == 0:
                # No answer, but etcd (our view of it) no longer names this node anywhere:
                # the fencing happened (the answer was lost or is still on its way).
                log.info("previous life fenced (seen in the cluster view)")
                return
            if resp is not None and resp.error_code == 0:
                # The controller waited for its own view; make ours at least as new.
                rev = await asyncio.to_thread(self.store.revision)
                await asyncio.to_thread(
                    self.view.wait_for, lambda rev=rev: self.view.revision >= rev, 30.0
                )
                log.info(
                    "previous life fenced: %d partition roles left in etcd for this node",
                    self._roles_from_a_previous_life(),
                )
                return
            if resp is not None:
                log.info("fencing the previous life refused, retrying: %s", resp.error_message)
            await asyncio.sleep(0.5)
        log.warning(
            "no controller fenced node %d's previous life within %.0f s (last call: %s); "
            "taking the roles etcd gives it",
            self.config.node_id,
            self.config.startup_fence_timeout_s,
            self.controller.last_failure or "refused",
        )

    async def _abort_start(self) -> None:
        """Undo a partial start so that a failed start leaves no lease or open log behind."""
        self.view.stop()
        if self.manager.logs is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.manager.logs.close)
        if self._registered:
            await asyncio.to_thread(self.registration.close)
        self.store.close()

    async def _controlled_shutdown(self) -> None:
        """Ask the controller to move this node's leaderships away, then wait (bounded)
        until it leads nothing. Unreachable or UNIMPLEMENTED controller: go on stopping."""
        if self.manager.role_counts()[0] == 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.controlled_shutdown_timeout_s
        req = controller_pb2.ControlledShutdownRequest(
            node_id=self.config.node_id, incarnation_id=self.registration.incarnation_id or ""
        )
        while loop.time() < deadline:
            try:
                resp = await self.controller.call(
                    "ControlledShutdown", req, timeout=max(deadline - loop.time(), 0.1)
                )
            except grpc.aio.AioRpcError:
                log.info("controller does not implement ControlledShutdown; stopping anyway")
                return
            if resp is None:
                log.info("no controller answered ControlledShutdown; stopping anyway")
                return
            if resp.error_code != 0:
                log.info("ControlledShutdown refused: %s", resp.error_message)
                return
            # Partitions no other in-sync replica can take are not waited for.
            stuck = {(tp.topic, tp.partition) for tp in resp.remaining_partitions}

            def moved(stuck: set[tuple[str, int]] = stuck) -> bool:
                return all(p.tp in stuck for p in self.manager.partitions.values() if p.is_leader)

            # Wait (a little, then ask again) for the reconcile to show the moved leaderships.
            again = min(deadline, loop.time() + 1.0)
            while loop.time() < again and not moved():
                await asyncio.sleep(0.05)
            if moved():
                log.info(
                    "controlled shutdown: this node leads no partition any more%s",
                    f" except {len(stuck)} without another in-sync replica" if stuck else "",
                )
                return
        log.info("controlled shutdown did not move every leadership in time; stopping anyway")

    @property
    def stop_timeout_s(self) -> float:
        """What :meth:`stop` may take in the worst case: the controlled shutdown, three
        waits of ``shutdown_grace_s`` (the record streams, in-flight RPCs, background tasks)
        and the closing of the logs. The process waits that long for it (the runtime's 10 s
        default cut a stop short when no controller answered, leaving the logs unclosed and
        a recovery for the next start); the Helm chart's grace period (60 s) covers it."""
        cfg = self.config
        return cfg.controlled_shutdown_timeout_s + 3 * cfg.shutdown_grace_s + 20.0

    async def stop(self) -> None:
        cfg = self.config
        if self._registered and self.manager.logs is not None:
            try:
                await self._controlled_shutdown()
            except Exception:
                log.exception("controlled shutdown failed; stopping anyway")
        # Streams end (their groups rebalance now), the node's producers flush, while the
        # cluster still serves their requests.
        await self.records.close(cfg.shutdown_grace_s)
        self.servicer.shutting_down = True
        self.servicer.end_streams()  # clients' streams end now, not at the grace period's end
        self._stopping.set()
        self.manager.release_waiters()
        try:
            await asyncio.to_thread(self.registration.set_state, md.NODE_STATE_SHUTTING_DOWN)
        except MetadataUnavailableError as exc:
            log.warning("could not publish SHUTTING_DOWN: %s", exc)
        server = self._server() if self._server is not None else None
        if server is not None:
            # No new RPCs from here; in-flight ones (parked fetches were just woken) finish.
            await server.stop(cfg.shutdown_grace_s)
        if self._reregister is not None:
            self._reregister.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=cfg.shutdown_grace_s)
        await self.fetchers.stop()
        await self.controller.close()
        await asyncio.to_thread(self.servicer.writer.close)
        await asyncio.to_thread(self.manager.sync_topic_ids)
        await self.manager.stop()
        self.view.stop()
        try:
            if self.manager.logs is not None:
                await asyncio.to_thread(self.manager.logs.close)
        finally:
            # Also when closing the logs failed (a full disk): the lease goes now, not when
            # it expires, and the error (naming the file) ends the process after.
            await asyncio.to_thread(self.registration.close)
            self.store.close()
        log.info("node %d stopped cleanly", cfg.node_id)

    def _client_bootstrap(self) -> list[str]:
        """Addresses for the node's own clients (RecordService): this node, then the others."""
        cfg = self.config
        own = f"{cfg.advertise_host}:{cfg.advertise_port}"
        others = [
            f"{n.host}:{n.port}"
            for i, n in sorted(self.view.live_nodes().items())
            if i != cfg.node_id
        ]
        return [own, *others]

    # -- lease loss ------------------------------------------------------------------------

    def _on_lease_lost(self) -> None:
        """KeepAlive thread: the lease expired while etcd was unreachable."""
        if self._loop is not None and not self._stopping.is_set():
            self._loop.call_soon_threadsafe(self._start_reregister)

    def _start_reregister(self) -> None:
        """Re-register, or tell the running re-registration that a loss came meanwhile.

        A loss that came
        while the task was still running (the new lease lost before the busy loop let the
        task finish) was dropped, and the node stayed unregistered for good, silently."""
        self._lost_again = True
        if self._reregister is None or self._reregister.done():
            self._reregister = asyncio.get_running_loop().create_task(self._reregister_loop())

    async def _reregister_loop(self) -> None:
        """Re-register until the registration this node holds is live and no loss of it
        arrived during the attempt; each failure is logged (at most every few seconds)."""
        delay = 0.2
        failures = 0
        logged_at = -REREGISTER_LOG_EVERY_S
        loop = asyncio.get_running_loop()

        def failed(why: str) -> None:
            nonlocal failures, logged_at
            failures += 1
            if loop.time() - logged_at >= REREGISTER_LOG_EVERY_S:
                logged_at = loop.time()
                log.warning(
                    "node %d is not registered in etcd (%d failed attempts): %s; retrying",
                    self.config.node_id,
                    failures,
                    why,
                )

        while not self._stopping.is_set():
            self._lost_again = False
            try:
                await asyncio.to_thread(self.registration.reregister, self._on_lease_lost)
            except MetadataUnavailableError as exc:
                failed(str(exc))
                await self._sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except NodeIdInUseError as exc:
                log.error("%s; shutting down", exc)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if not self._lost_again and self.registration.live():
                return
            # Lost again before this attempt ended (or its keepalive has not reached etcd
            # for longer than the TTL): the registration it made may be gone already.
            failed("the registration was lost again while it was made")
            await self._sleep(0.2)

    async def _registration_watchdog(self) -> None:
        """Re-register when this node's own key has been missing from its cluster view for
        ``REGISTRATION_WATCHDOG_S``: whatever the path that left it unregistered, the node
        must not go on running, leading and answering ready without a registration. The
        re-registration asks etcd first and keeps a registration that is in fact live."""
        missing_since: float | None = None
        loop = asyncio.get_running_loop()
        while not await self._sleep(1.0):
            if self.config.node_id in self.view.nodes:
                missing_since = None
                continue
            now = loop.time()
            if missing_since is None:
                missing_since = now
            elif now - missing_since >= REGISTRATION_WATCHDOG_S and (
                self._reregister is None or self._reregister.done()
            ):
                log.warning(
                    "node %d's registration has been missing from etcd for %.0f s; re-registering",
                    self.config.node_id,
                    now - missing_since,
                )
                missing_since = None
                self._start_reregister()

    # -- background work -------------------------------------------------------------------

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; True when the node is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=max(seconds, 0.0))
        return self._stopping.is_set()

    async def _every(self, interval_ms: int, job: Callable[[], Awaitable[None]]) -> None:
        while not await self._sleep(interval_ms / 1000.0):
            try:
                await job()
            except Exception:
                log.exception("background job %s failed", job.__name__)

    def _live(self) -> list[Partition]:
        return [p for p in self.manager.partitions.values() if not p.deleted]

    async def _cleanup(self) -> None:
        """Retention on every log (and unlinking segment files whose file.delete.delay.ms is
        over), then compaction of the compacted logs that are due, dirtiest first (Kafka's
        log cleaner rules, see :mod:`strom.log.cleaner`); the file work runs in threads."""
        for part in self._live():
            if self._stopping.is_set():
                return
            lg = part.log
            try:
                async with part.maintenance_lock:
                    if part.deleted:
                        continue
                    deleted = await asyncio.to_thread(lg.apply_retention, None, part.high_watermark)
                    await asyncio.to_thread(lg.delete_expired_files)
                if deleted:
                    log.info(
                        "retention deleted %d segments of %s-%d; log start offset now %d",
                        deleted,
                        part.topic,
                        part.index,
                        lg.log_start_offset,
                    )
                part.maybe_advance_high_watermark()
                self.manager.refresh_gauges(part)
            except Exception:
                log.exception("cleaning %s-%d failed", part.topic, part.index)
        await self._compact_due_logs()

    async def _compact_due_logs(self) -> None:
        """Clean every compacted log that is due, the dirtiest first."""
        # Bounded by the last stable offset: an open transaction's records may still abort.
        candidates = [
            (p, p.log, p.last_stable_offset) for p in self._live() if p.log.config.compact
        ]
        if not candidates:
            metrics.CLEANER_MAX_DIRTY_RATIO.set(0)
            metrics.CLEANER_MAX_COMPACTION_DELAY.set(0)
            return
        ranges = await asyncio.to_thread(measure_logs, candidates)
        metrics.CLEANER_MAX_DIRTY_RATIO.set(max(r.dirty_ratio for _, r in ranges))
        metrics.CLEANER_MAX_COMPACTION_DELAY.set(
            max(r.compaction_delay_ms for _, r in ranges) / 1000.0
        )
        for part, rng in dirtiest_first(ranges):
            if self._stopping.is_set():
                return
            lg = part.log
            try:
                async with part.maintenance_lock:
                    if part.deleted:
                        continue
                    stats = await asyncio.to_thread(compact, lg, max_offset=part.last_stable_offset)
                reason = "max_compaction_lag" if rng.needs_compaction_now else "dirty_ratio"
                metrics.CLEANER_CLEANINGS.labels(reason).inc()
                log.info(
                    "compacted %s-%d (dirty ratio %.2f%s): %d segments (%d merged), "
                    "%d -> %d bytes; first dirty offset now %d",
                    part.topic,
                    part.index,
                    rng.dirty_ratio,
                    ", past max.compaction.lag.ms" if rng.needs_compaction_now else "",
                    stats.segments_cleaned,
                    stats.segments_merged,
                    stats.bytes_before,
                    stats.bytes_after,
                    stats.first_dirty_offset,
                )
                self.manager.refresh_gauges(part)
            except Exception:
                log.exception("compacting %s-%d failed", part.topic, part.index)

    async def _checkpoint(self) -> None:
        """fsync logs with unflushed sealed segments (Kafka flushes on roll, so recovery after
        a crash only rescans the active segment) and write the data dir's checkpoints."""
        logs = self.manager.logs
        if logs is None:
            return
        for part in self._live():
            lg = part.log
            if lg.recovery_point < lg.active.base_offset:
                try:
                    await self.manager.flush(part, force=True)
                except Exception:
                    log.exception("flushing %s-%d failed", part.topic, part.index)
        await asyncio.to_thread(self.manager.sync_topic_ids)
        await asyncio.to_thread(logs.checkpoint)

    async def _flush_ms_loop(self) -> None:
        """Enforce ``flush.ms``: fsync (in a thread) every log whose oldest unflushed append
        is older than its flush.ms; sleep until the next log is due (at most 1 s, so config
        changes are picked up)."""
        while not self._stopping.is_set():
            next_due = 1.0
            for part in self._live():
                lg = part.log
                flush_ms = lg.config.flush_ms
                if flush_ms < 0:
                    continue
                if lg.needs_flush():
                    try:
                        await self.manager.flush(part)
                    except Exception:
                        log.exception("flushing %s-%d failed", part.topic, part.index)
                # An idle log is looked at again within flush.ms (an append may come any
                # time); one with unflushed records exactly when it falls due.
                next_due = min(next_due, flush_ms / 1000.0)
                if lg.needs_flush(now=lg.last_flush_ms + flush_ms):
                    due = (lg.last_flush_ms + flush_ms - lg.clock()) / 1000.0
                    next_due = min(next_due, due)
            next_due = max(next_due, 0.01)
            if await self._sleep(next_due):
                return

    def _after_reconcile(self) -> None:
        if self._tasks:  # running: (re)start replica fetchers for the new roles
            self.fetchers.refresh()
