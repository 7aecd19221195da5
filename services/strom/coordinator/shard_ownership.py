"""Shard ownership: claiming, loading and dropping the shards of ``__consumer_offsets`` and
``__transaction_state`` (DESIGN §7).

Shards. Group ``g`` lives in shard ``shard_for_group(g, S)``, partition ``s`` of the compacted
internal topic ``__consumer_offsets`` (the first coordinator creates it through the controller,
``cleanup.policy=compact``, replication factor min(3, live nodes)). A coordinator owns a shard
while its lease-bound key ``coordinators/<s>`` exists; it takes free shards by creating the key
(create-if-absent), so any number of coordinators can run and a dead one's shards are taken by
the others once its lease expires. All shard keys of one process share one lease: revoking it
on shutdown hands every shard over at once.

Loading (why it is safe to take over a shard a deposed owner may still write to): the new owner
replays the partition from its start (:class:`ShardState`, latest record per key wins), then
asks InitProducerId to bump the epoch of the producer id found there, and appends a *fence*
batch with that epoch (acks=all). From then on the leader refuses the previous owner's writes
(INVALID_PRODUCER_EPOCH). Whatever the previous owner appended before the fence is replayed
too; then the owner checks its etcd key is still its own, publishes the epoch in it and only
then serves. Until then requests are answered COORDINATOR_LOAD_IN_PROGRESS; requests for shards
owned elsewhere NOT_COORDINATOR.

Balance. Every coordinator process also keeps a lease-bound ``coordinator_members/<incarnation>``
key, so coordinators that own nothing are counted. A coordinator takes free shards up to its
fair share (the shard count over the live coordinators, rounded up); a free shard beyond that
only once it stayed free for ``FREE_GRACE_S`` (a coordinator below its share goes first, yet
no shard stays unowned because that one does not claim). A coordinator holding more than the
rounded-down share while another holds less hands one shard over per ``HAND_OVER_INTERVAL_S``:
it lets the shard's queued writes finish, stops serving it and deletes its key; the other
takes it and loads it as after a failover (else after a rolling restart one coordinator
would serve every group while the others idle). A shard handed over that nobody took
within ``FREE_GRACE_S`` (its taker hung) is taken back and hand-overs pause for
``HAND_OVER_BACKOFF_S``, until a coordinator registers anew (the hung one back with a new
lease, or another).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from typing import Any

import grpc

from strom.api import controller_pb2, controller_pb2_grpc
from strom.api import metadata_pb2 as md
from strom.clock import steady_ms, wall_ms
from strom.coordinator import metrics
from strom.coordinator.group import ConsumerGroup
from strom.coordinator.lookup import shard_count
from strom.coordinator.offsets_log import GroupRecord, encode_group_batch
from strom.coordinator.shard_writes import ShardWrites, settled
from strom.coordinator.shards import RELEASE_AFTER_S, Shard, ShardKind
from strom.coordinator.storage_io import (
    AppendRefused,
    ShardLost,
    failure_line,
    storage_unreachable,
)
from strom.coordinator.txn_state import TxnShardState
from strom.errors import (
    ErrorCode,
    StromError,
    error_name,
)
from strom.lograte import LogLimiter
from strom.metadata import LeaseLostError, MetadataUnavailableError
from strom.service.headers import INTERNAL_TOPICS_METADATA_KEY

log = logging.getLogger("strom.coordinator")
E = ErrorCode

#: Key of the fence record a new owner appends: a ``GroupRecordKey`` whose only field is the
#: unknown field 15 (empty), so replay skips it as "a kind this version does not know", and
#: compaction keeps just the latest one. (A documented oneof kind would be nicer: see the
#: issue note.)
#: A shard that fails to load for this long is logged (at WARNING; before, at DEBUG).
LOAD_FAILURE_GRACE_S = 5.0
#: How often a shard that still cannot load is logged again after that.
LOAD_FAILURE_LOG_INTERVAL_S = 30.0

FENCE_KEY = b"\x7a\x00"
#: How long a free shard beyond this coordinator's fair share waits for a coordinator below
#: its share before this one takes it anyway (also: a shard just handed over is not taken
#: back sooner).
FREE_GRACE_S = 5.0
#: At most one shard handed over per this many seconds: each move reloads the shard on its
#: new owner and sends its clients to look their coordinator up again.
HAND_OVER_INTERVAL_S = 1.0
#: Handing over pauses this long when a shard handed over was not taken by anyone.
HAND_OVER_BACKOFF_S = 60.0
#: A shard this coordinator released (it could not reach the storage nodes) that nobody
#: took within this long is taken back: longer than a healthy coordinator's wait for a
#: free shard beyond its share (FREE_GRACE_S), so one that can load it goes first.
RELEASE_TAKE_BACK_S = 2 * FREE_GRACE_S
#: A coordinator in storage trouble (it released a shard within its release backoff, or a
#: shard of its own cannot reach the nodes) takes a free shard only after this long: after
#: the releaser takes it back, so a shard nobody can load comes to rest with its releaser
#: instead of going round the coordinators.
TROUBLED_TAKE_S = 3 * FREE_GRACE_S
#: After a released shard came back (nobody took it), this coordinator releases no shard
#: for this long (doubling each time it happens, up to RELEASE_BACKOFF_MAX_S; back to this
#: once a load succeeds), or until a coordinator registers anew.
RELEASE_BACKOFF_S = 60.0
RELEASE_BACKOFF_MAX_S = 600.0


class ShardOwnership(ShardWrites):
    """The ownership loop, shard loading and unloading (writes: :class:`ShardWrites`)."""

    #: Shards whose load keeps failing (set by the service): logged first, then now and then.
    _load_failures: LogLimiter

    _waiting_logged: dict[str, bool]
    #: (kind, shard) -> when this process first saw it free, or handed it over.
    _free_since: dict[tuple[str, int], float]
    #: (kind, shard) handed over by this process and not yet seen owned by another.
    _handed_over: set[tuple[str, int]]
    _next_hand_over: float
    #: The coordinators' registrations (key, create revision) when the shard whose taker
    #: did not take it was handed over, while hand-overs are paused for it; else None.
    _members_at_pause: frozenset[tuple[str, int]] | None
    #: (kind, shard) handed over -> the registrations then (see _members_at_pause).
    _handed_with: dict[tuple[str, int], frozenset[tuple[str, int]]]
    #: (kind, shard) released by this process (storage unreachable) and not yet seen taken
    #: by another -> when (monotonic) it was released.
    _released: dict[tuple[str, int], float]
    #: (kind, shard) -> the incarnation last seen owning it (who freed a free shard).
    _last_owner: dict[tuple[str, int], str]
    #: The current release backoff (RELEASE_BACKOFF_S, doubling; see there).
    _release_backoff_s: float
    #: Until when (monotonic) this process counts as in storage trouble after a release.
    _troubled_until: float
    #: Until when releases pause (a released shard came back), and the registrations then
    #: (a registration since ends the pause, as for hand-overs).
    _releases_paused_until: float
    _releases_paused_with: frozenset[tuple[str, int]] | None

    async def _new_lease(self) -> None:
        assert self.store is not None
        store = self.store
        lease = await asyncio.to_thread(
            store.retry, lambda: store.grant_lease(self.lease_ttl_s), deadline_s=60
        )
        self._lease = lease
        self._keepalive = store.keep_alive(lease, lambda: self._from_thread(self._lease_lost))
        member = md.CoordinatorShardOwner(
            shard=-1,
            coordinator_id=self.coordinator_id,
            host=self.advertise_host,
            port=self.advertise_port,
            incarnation_id=self.incarnation_id,
            metrics_port=self.metrics_port,
        )
        key = store.keys.coordinator_member(self.incarnation_id)
        await asyncio.to_thread(
            store.retry, lambda: store.put(key, member, lease=lease), deadline_s=60
        )

    async def _lease_lost(self) -> None:
        """etcd dropped our lease (we could not refresh it in time): every shard key is gone,
        another coordinator may own the shards now. Drop them all and start over."""
        if self._stopping:
            return
        log.warning("coordinator %d lost its etcd lease; releasing all shards", self.coordinator_id)
        for shard in self._all_shards():
            self._unload(shard)
        await self._new_lease()
        if self._wake is not None:
            self._wake.set()

    def _owner(self, shard: Shard, epoch: int, producer_id: int) -> md.CoordinatorShardOwner:
        return md.CoordinatorShardOwner(
            shard=shard.index,
            coordinator_id=self.coordinator_id,
            host=self.advertise_host,
            port=self.advertise_port,
            epoch=epoch,
            producer_id=producer_id,
            acquired_ms=shard.acquired_ms,
            incarnation_id=self.incarnation_id,
            metrics_port=self.metrics_port,
        )

    def _all_shards(self) -> list[Shard]:
        return [s for kind in self.kinds for s in kind.shards.values()]

    async def _ownership_loop(self) -> None:
        """Create ``__consumer_offsets`` and ``__transaction_state`` if needed, claim free
        shards, drop lost ones; woken by every etcd change, with a slow tick as a safety net."""
        assert self._wake is not None
        noted_lease: Any = None
        while not self._stopping:
            self._wake.clear()
            for kind in self.kinds:
                try:
                    if await self._ensure_topic(kind):
                        await self._claim_shards(kind)
                except asyncio.CancelledError:
                    raise
                except LeaseLostError as exc:
                    # Our lease expired: every pass fails so until the keeper notices and
                    # _lease_lost takes a new one (which wakes this loop). Said once, not
                    # once per wake-up.
                    if noted_lease is not self._lease:
                        noted_lease = self._lease
                        log.warning(
                            "%s shard ownership pass: %s; waiting for a new lease", kind.name, exc
                        )
                    break
                except MetadataUnavailableError as exc:  # etcd away
                    log.warning("%s shard ownership pass: %s; retrying", kind.name, exc)
                except Exception:
                    log.exception("%s shard ownership pass failed", kind.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)

    async def _ensure_topic(self, kind: ShardKind) -> bool:
        """True once the kind's topic exists; asks the active controller to create it."""
        assert self.view is not None
        view = self.view
        if shard_count(view, topic=kind.topic) is not None:
            return True
        nodes = view.live_nodes()
        controller = view.controller_info()
        if not nodes or controller is None:
            return False  # woken again when they appear
        if len(nodes) < kind.replication_factor:
            # As Kafka: an internal topic is created with its full replication factor, never
            # a smaller one because some nodes were not up yet (a node loss would then take
            # every group or transaction of its shards offline).
            if not self._waiting_logged.get(kind.topic):
                log.warning(
                    "waiting for %d live storage nodes (%d now) to create %s with "
                    "replication factor %d (--offsets-replication-factor)",
                    kind.replication_factor,
                    len(nodes),
                    kind.topic,
                    kind.replication_factor,
                )
                self._waiting_logged[kind.topic] = True
            return False
        req = controller_pb2.CreateTopicsRequest(timeout_ms=10_000)
        req.topics.add(
            name=kind.topic,
            num_partitions=kind.partitions,
            replication_factor=kind.replication_factor,
            configs={"cleanup.policy": "compact"},
        )
        stub = controller_pb2_grpc.ControllerServiceStub(
            self._channel(f"{controller.host}:{controller.port}")
        )
        try:
            resp = await stub.CreateTopics(
                req, timeout=15.0, metadata=((INTERNAL_TOPICS_METADATA_KEY, "true"),)
            )
        except grpc.aio.AioRpcError as exc:
            log.info("CreateTopics %s: %s", kind.topic, exc.code().name)
            return False
        if resp.error_code != E.NONE:
            log.info("CreateTopics %s: %s", kind.topic, error_name(resp.error_code))
            return False
        for t in resp.topics:
            if t.error_code not in (E.NONE, E.TOPIC_ALREADY_EXISTS):
                log.warning(
                    "cannot create %s: %s %s",
                    kind.topic,
                    error_name(t.error_code),
                    t.error_message,
                )
                return False
            if t.error_code == E.NONE:
                log.info("created %s with %d partitions", kind.topic, t.num_partitions)
        return shard_count(view, topic=kind.topic) is not None

    async def _claim_shards(self, kind: ShardKind) -> None:
        assert self.view is not None and self.store is not None
        view, store = self.view, self.store
        shards = shard_count(view, topic=kind.topic) or 0
        owned = kind.shards
        with view.lock:
            owners = {s: v.value for s, v in kind.owners(view).items()}
            revision = view.revision
        for s, owner in owners.items():
            self._last_owner[(kind.name, s)] = owner.incarnation_id
            if owner.incarnation_id != self.incarnation_id:
                self._released.pop((kind.name, s), None)  # taken by another: it worked
        # Lost: our key vanished (lease expired) or belongs to someone else now.
        for s, shard in list(owned.items()):
            owner = owners.get(s)
            if revision >= shard.create_revision and (
                owner is None or owner.incarnation_id != self.incarnation_id
            ):
                log.warning("%s shard %d is no longer ours; dropping it", kind.name, s)
                self._unload(shard)
        # Ours in etcd but not served (dropped from memory after a fenced write or a failed
        # load while the key stayed ours): nobody else may take it until our lease ends, so
        # load it again (the load fences with a new epoch and re-checks the key).
        for s, owner in sorted(owners.items()):
            if owner.incarnation_id == self.incarnation_id and s not in owned and s < shards:
                released = self._released.get((kind.name, s))
                if released is not None:
                    if time.monotonic() - released < RELEASE_TAKE_BACK_S:
                        continue  # released: its delete is not in the view yet
                    # Still ours long after the release (a load's last put of the key
                    # landed after the delete): ours, so served again.
                    del self._released[(kind.name, s)]
                if self._stopping or self._lease is None:
                    return
                shard = Shard(s, kind, acquired_ms=wall_ms())
                with view.lock:
                    entry = kind.owners(view).get(s)
                if entry is None or entry.value.incarnation_id != self.incarnation_id:
                    continue
                shard.create_revision = entry.create_revision
                owned[s] = shard
                log.warning(
                    "%s shard %d is ours in etcd but was not served; loading it", kind.name, s
                )
                self._start_load(shard)
        # Spread shards: take free ones up to a fair share of the live coordinators (a lone
        # coordinator takes them all); beyond it only shards that stayed free a while.
        live = self._live_coordinators(owners)
        fair = math.ceil(shards / len(live))
        free = [s for s in range(shards) if s not in owners and s not in owned]
        now = time.monotonic()
        for s in free:
            self._free_since.setdefault((kind.name, s), now)
        for key in [k for k in self._free_since if k[0] == kind.name and k[1] not in free]:
            del self._free_since[key]
            if key in self._handed_over:  # taken by another coordinator: the move worked
                self._handed_over.discard(key)
                self._handed_with.pop(key, None)
        mine = len(owned)
        troubled = len(live) > 1 and self._troubled(now)
        for s in free:
            if self._stopping or self._lease is None:
                return
            since = self._free_since.get((kind.name, s), now)
            if (kind.name, s) in self._released:
                if now - self._released[(kind.name, s)] < RELEASE_TAKE_BACK_S:
                    continue  # released just now: for a coordinator that reaches the nodes
                self._take_back_released(kind, s, now)
            elif (kind.name, s) in self._handed_over:
                if now - since < FREE_GRACE_S:
                    continue  # handed over just now: for another coordinator to take
                log.warning(
                    "%s shard %d handed over was taken by nobody; taking it back and "
                    "pausing hand-overs for %.0f s",
                    kind.name,
                    s,
                    HAND_OVER_BACKOFF_S,
                )
                self._handed_over.discard((kind.name, s))
                self._next_hand_over = now + HAND_OVER_BACKOFF_S
                # Who was registered when it was handed over: a registration after that is
                # the taker back (or another), and ends the pause (_balance).
                self._members_at_pause = self._handed_with.pop(
                    (kind.name, s), self._member_sessions()
                )
            elif len(live) > 1 and mine >= fair and now - since < FREE_GRACE_S:
                continue
            elif troubled and now - since < TROUBLED_TAKE_S:
                continue  # (see TROUBLED_TAKE_S)
            if s in owners:
                continue
            shard = Shard(s, kind, acquired_ms=wall_ms())
            key = kind.key(store.keys, s)
            lease = self._lease
            created = await asyncio.to_thread(
                store.create, key, self._owner(shard, -1, -1), lease=lease
            )
            if not created:
                continue
            current = await asyncio.to_thread(store.get, key, md.CoordinatorShardOwner)
            if current is None or current.value.incarnation_id != self.incarnation_id:
                continue
            shard.create_revision = current.create_revision
            owned[s] = shard
            mine += 1
            log.info("took %s shard %d", kind.name, s, extra={"fields": {"shard": s}})
            self._note_taken_from_live(kind, s)
            self._start_load(shard)
            # One shard at a time, re-reading the owners: coordinators started together
            # interleave their claims instead of the first one taking everything.
            await asyncio.sleep(0.02)
            with view.lock:
                owners = {s2: v.value for s2, v in kind.owners(view).items()}
            live = self._live_coordinators(owners)
            fair = math.ceil(shards / len(live))
        await self._release_unreachable(kind)
        await self._balance(kind, shards)

    def _troubled(self, now: float) -> bool:
        """Whether this process is in storage trouble: it released a shard within its release
        backoff, or a shard of its own is unserved because the nodes do not answer it."""
        return now < self._troubled_until or any(
            sh.unreachable is not None for sh in self._all_shards()
        )

    def _releases_paused(self, now: float) -> bool:
        """Whether releasing is paused (a released shard came back, see RELEASE_BACKOFF_S);
        a coordinator registered since the pause began ends it (it may reach the nodes)."""
        if now >= self._releases_paused_until:
            return False
        paused_with = self._releases_paused_with
        if paused_with is not None and not self._member_sessions() <= paused_with:
            log.info("a coordinator registered since releases paused; resuming them")
            self._releases_paused_until = now
            return False
        return True

    async def _release_unreachable(self, kind: ShardKind) -> None:
        """Release the shards of ``kind`` that went unserved for :data:`RELEASE_AFTER_S`
        because the storage nodes do not answer this process, when another coordinator is
        registered to take them (it may reach the nodes). Alone, a coordinator keeps its
        shards (nobody else could serve them); a released shard nobody can load comes back
        and rests here (RELEASE_TAKE_BACK_S, TROUBLED_TAKE_S, RELEASE_BACKOFF_S)."""
        now = time.monotonic()
        due = [
            sh
            for sh in kind.shards.values()
            if not sh.loaded
            and sh.unreachable is not None
            and sh.unserved_since is not None
            and now - sh.unserved_since >= RELEASE_AFTER_S
        ]
        if not due or self._stopping or self._lease is None:
            return
        if not self._other_coordinators() or self._releases_paused(now):
            return
        for shard in sorted(due, key=lambda sh: sh.index):
            await self._release(kind, shard)

    async def _release(self, kind: ShardKind, shard: Shard) -> None:
        """Stop serving ``shard`` (not loaded: nothing of it is queued) and free its key."""
        assert self.store is not None and shard.unserved_since is not None
        if shard.loaded or kind.shards.get(shard.index) is not shard:
            return
        now = time.monotonic()
        why, unserved_s = shard.unreachable, now - shard.unserved_since
        self._unload(shard)
        key = (kind.name, shard.index)
        self._released[key] = now
        self._free_since[key] = now
        self._troubled_until = now + self._release_backoff_s
        store = self.store
        try:
            deleted = await asyncio.to_thread(
                store.retry,
                lambda: store.delete_if_owner(
                    kind.key(store.keys, shard.index), shard.create_revision
                ),
                deadline_s=10,
            )
        except Exception:
            self._released.pop(key, None)  # still ours in etcd: the next pass loads it again
            raise
        metrics.SHARD_RELEASES.labels(kind.name).inc()
        log.warning(
            "%s shard %d (%s-%d): cannot reach the storage nodes, unserved for %.0f s (%s); "
            "released it for another coordinator to take%s",
            kind.name,
            shard.index,
            kind.topic,
            shard.index,
            unserved_s,
            why,
            "" if deleted else " (its key was already gone)",
            extra={"fields": {"shard": shard.index, "kind": kind.name}},
        )

    def _take_back_released(self, kind: ShardKind, s: int, now: float) -> None:
        """A shard this process released was taken by nobody within RELEASE_TAKE_BACK_S:
        the other coordinators cannot load it either (or hang). It is taken back (the
        caller claims it) and releases pause, so it rests here."""
        self._released.pop((kind.name, s), None)
        pause = self._release_backoff_s
        self._release_backoff_s = min(pause * 2, RELEASE_BACKOFF_MAX_S)
        self._releases_paused_until = now + pause
        self._releases_paused_with = self._member_sessions()
        log.warning(
            "%s shard %d released was taken by nobody (the other coordinators cannot reach "
            "the storage nodes either, or hang); taking it back and releasing no shard for "
            "%.0f s",
            kind.name,
            s,
            pause,
        )

    def _note_taken_from_live(self, kind: ShardKind, s: int) -> None:
        """This process just took shard ``s``, which a coordinator that is still registered
        gave up (released: it could not reach the nodes; or handed over). Moving shards to
        that one does not work now: hand-overs pause (HAND_OVER_BACKOFF_S, or until a
        coordinator registers anew), so it is not handed the shard straight back."""
        previous = self._last_owner.get((kind.name, s))
        if previous is None or previous == self.incarnation_id:
            return
        if previous not in self._other_coordinators():
            return  # its owner is gone (lease expired): a failover, not a release
        self._next_hand_over = max(self._next_hand_over, time.monotonic() + HAND_OVER_BACKOFF_S)
        self._members_at_pause = self._member_sessions()

    def _live_coordinators(self, owners: dict[int, md.CoordinatorShardOwner]) -> set[str]:
        """Incarnations of the live coordinators: the registered ones and any still owning
        a shard (a dead one until its lease ends), this process included."""
        owning = {o.incarnation_id for o in owners.values()}
        return self._other_coordinators() | owning | {self.incarnation_id}

    def _member_sessions(self) -> frozenset[tuple[str, int]]:
        """The coordinators' registrations: a process registering again (after losing its
        lease) is a new one (its key's create revision)."""
        assert self.view is not None
        with self.view.lock:
            return frozenset(
                (k, v.create_revision) for k, v in self.view.coordinator_members.items()
            )

    async def _balance(self, kind: ShardKind, shards: int) -> None:
        """Hand one shard over when this coordinator holds more than the rounded-down share
        of the live coordinators and a registered one holds less (see the module doc)."""
        assert self.view is not None and self.store is not None
        now = time.monotonic()
        if self._stopping:
            return
        if now < self._next_hand_over:
            paused_with = self._members_at_pause
            if paused_with is None or self._member_sessions() <= paused_with:
                return
            # A coordinator registered since the pause (a new one, or one back from a hang
            # with a new lease): the pause was for a taker that did not answer, and this one
            # does.
            log.info("a coordinator registered since hand-overs paused; resuming them")
            self._next_hand_over = now
        self._members_at_pause = None
        view = self.view
        with view.lock:
            owners = {s: v.value for s, v in kind.owners(view).items()}
            members = {v.value.incarnation_id for v in view.coordinator_members.values()}
        others = members - {self.incarnation_id}
        if not others or self.incarnation_id not in members:
            return
        counts = Counter(o.incarnation_id for o in owners.values())
        share = shards // len(self._live_coordinators(owners))
        owned = kind.shards
        if len(owned) <= share or min(counts.get(m, 0) for m in others) >= share:
            return
        loaded = [sh for sh in owned.values() if sh.loaded]
        if not loaded:
            return
        shard = max(loaded, key=lambda sh: sh.index)
        self._next_hand_over = now + HAND_OVER_INTERVAL_S
        await self._hand_over(kind, shard)

    async def _hand_over(self, kind: ShardKind, shard: Shard) -> None:
        """Stop serving ``shard`` once its queued writes are durable, then free its key."""
        assert self.store is not None
        async with shard.lock:
            if not shard.loaded or kind.shards.get(shard.index) is not shard:
                return
            shard.loaded = False  # from here on: LOAD_IN_PROGRESS, then NOT_COORDINATOR
            tail = shard.write_tail
        if tail is not None:
            await settled(tail)
        if kind.shards.get(shard.index) is not shard:
            return  # lost or reloaded meanwhile: not ours to hand over any more
        self._unload(shard)
        key = (kind.name, shard.index)
        self._handed_over.add(key)
        self._handed_with[key] = self._member_sessions()
        self._free_since[key] = time.monotonic()
        store = self.store
        deleted = await asyncio.to_thread(
            store.retry,
            lambda: store.delete_if_owner(kind.key(store.keys, shard.index), shard.create_revision),
            deadline_s=10,
        )
        metrics.SHARD_HAND_OVERS.labels(kind.name).inc()
        log.info(
            "handed %s shard %d over to balance the coordinators%s",
            kind.name,
            shard.index,
            "" if deleted else " (its key was already gone)",
            extra={"fields": {"shard": shard.index}},
        )

    def _start_load(self, shard: Shard) -> None:
        shard.loaded = False
        if shard.unserved_since is None:
            shard.unserved_since = time.monotonic()
        shard.generation += 1
        if shard.loader is not None and not shard.loader.done():
            shard.loader.cancel()
        shard.loader = self._spawn(self._load_until_done(shard, shard.generation))

    def _unload(self, shard: Shard) -> None:
        shard.loaded = False
        shard.generation += 1
        # The shard's lag series go now, not at the next lag refresh: its new owner exports
        # them too, and sums over coordinators would count those groups twice.
        self._forget_lag(shard.groups)
        shard.groups = {}
        shard.transactions = {}
        for done in shard.completing.values():  # waiters look again (and find it moved)
            done.set()
        shard.completing.clear()
        if shard.loader is not None and not shard.loader.done():
            shard.loader.cancel()
        assert shard.kind is not None
        if shard.kind.shards.get(shard.index) is shard:
            del shard.kind.shards[shard.index]

    async def _load_until_done(self, shard: Shard, generation: int) -> None:
        delay = 0.1
        failing_since: float | None = None
        assert shard.kind is not None
        key = (shard.kind.name, shard.index)
        try:
            while not self._stopping and shard.generation == generation:
                try:
                    await self._load(shard, generation)
                    return
                except asyncio.CancelledError:
                    raise
                except ShardLost as exc:
                    log.warning("shard %d lost while loading: %s", shard.index, exc)
                    if shard.generation == generation:
                        self._unload(shard)
                    return
                except Exception as exc:
                    shard.load_error = exc.message if isinstance(exc, StromError) else str(exc)
                    shard.unreachable = failure_line(exc) if storage_unreachable(exc) else None
                    if isinstance(exc, AppendRefused):
                        self._note_refusal(shard, exc)  # (its fence: not a passing failure)
                    else:
                        if failing_since is None:
                            failing_since = time.monotonic()
                        self._note_load_failure(shard, exc, failing_since)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            if not shard.loaded:  # given up (moved, stopping): a later load starts afresh
                self._load_failures.ended(key)

    def _note_load_failure(self, shard: Shard, exc: Exception, failing_since: float) -> None:
        """A load attempt failed and is retried. Failures in the first
        :data:`LOAD_FAILURE_GRACE_S` are debug lines (a new internal topic's partitions open
        on their nodes a moment after it is created); then a WARNING naming the shard's kind
        and partition and why, and one line per :data:`LOAD_FAILURE_LOG_INTERVAL_S` with the
        failures left out: attempts come ten a second per offline shard."""
        assert shard.kind is not None
        where = f"{shard.kind.name} shard {shard.index} ({shard.kind.topic}-{shard.index})"
        why = failure_line(exc)
        failing_s = time.monotonic() - failing_since
        if failing_s < LOAD_FAILURE_GRACE_S:
            log.debug("%s cannot load yet: %s; retrying", where, why)
            return
        key = (shard.kind.name, shard.index)
        first = not self._load_failures.active(key)
        left_out = self._load_failures.occurred(key)
        if left_out is None:
            return
        fields = {"shard": shard.index, "kind": shard.kind.name, "topic": shard.kind.topic}
        log.warning(
            "%s %s for %.0fs: %s%s; retrying",
            where,
            "cannot load" if first else "still cannot load",
            failing_s,
            why,
            "" if first else f" ({left_out} more failures since the last such line)",
            extra={"fields": fields},
        )

    async def _load(self, shard: Shard, generation: int) -> None:
        """Replay, bump the producer epoch, fence, replay the rest, publish, serve."""
        assert self.store is not None and shard.kind is not None
        kind = shard.kind
        t0 = time.monotonic()
        state = kind.new_state()
        position = await self._replay(shard.index, state, 0, until=None, topic=kind.topic)
        pid, epoch = await self._init_producer(state.producer_id, state.producer_epoch)
        self._check_generation(shard, generation)
        fence = self._owner(shard, epoch, pid).SerializeToString()
        batch = encode_group_batch(
            [GroupRecord(FENCE_KEY, fence)], producer_id=pid, producer_epoch=epoch, base_sequence=0
        )
        fence_offset = await self._produce(shard.index, batch, kind.topic)
        metrics.WRITES.labels(kind.name, "fence").inc()
        # What the previous owner appended between our replay and the fence is state too.
        await self._replay(shard.index, state, position, until=fence_offset + 1, topic=kind.topic)
        self._check_generation(shard, generation)
        now = steady_ms()  # session deadlines and transaction timeouts count on this clock
        groups = {
            gid: ConsumerGroup.from_snapshot(snap, now_ms=now, config=self.group_config)
            for gid, snap in getattr(state, "groups", {}).items()
        }
        store = self.store
        key = kind.key(store.keys, shard.index)
        current = await asyncio.to_thread(store.get, key, md.CoordinatorShardOwner)
        if current is None or current.value.incarnation_id != self.incarnation_id:
            raise ShardLost("the shard key is not ours any more")
        await asyncio.to_thread(store.put, key, self._owner(shard, epoch, pid), lease=self._lease)
        self._check_generation(shard, generation)
        shard.groups = groups
        shard.transactions = _as_seen(state, now)
        shard.durable = state
        shard.producer_id, shard.producer_epoch, shard.next_sequence = pid, epoch, 1
        # Writes of the previous generation are not this state's: nothing waits on them now
        # (the writer still fails any left queued).
        shard.write_tail = None
        shard.load_error = None
        shard.unreachable = None
        shard.unserved_since = None
        self._release_backoff_s = RELEASE_BACKOFF_S
        shard.loaded = True
        metrics.SHARD_LOADS.inc()
        if state.undecodable:
            metrics.UNDECODABLE_RECORDS.labels(kind.name).inc(state.undecodable)
            log.warning(
                "%s shard %d: skipped %d records that do not decode (first at %s)",
                kind.name,
                shard.index,
                state.undecodable,
                state.first_undecodable,
            )
        if shard.transactions:
            self._resume_transactions(shard)
        failed = self._load_failures.ended((kind.name, shard.index))
        log.info(
            "loaded %s shard %d: %d groups, %d transactional ids, producer %d epoch %d, %.0f ms%s",
            kind.name,
            shard.index,
            len(groups),
            len(shard.transactions),
            pid,
            epoch,
            (time.monotonic() - t0) * 1000,
            f" (after failing to load for {failed[0] + LOAD_FAILURE_GRACE_S:.1f}s)"
            if failed is not None
            else "",
            extra={"fields": {"shard": shard.index, "producer_epoch": epoch}},
        )

    @staticmethod
    def _check_generation(shard: Shard, generation: int) -> None:
        if shard.generation != generation:
            raise asyncio.CancelledError()


def _as_seen(state: Any, now: int) -> dict[str, Any]:
    """A transaction shard's ids as this process keeps them from ``now`` (its steady clock):
    the writers' times moved onto this clock (``TxnShardState.shift_for``), those ahead of
    it clamped (``TxnMetadata.seen_at``). A group shard has none."""
    if not isinstance(state, TxnShardState):
        return {}
    own_skew = wall_ms() - now
    return {
        tid: meta.seen_at(now, state.shift_for(tid, own_skew))
        for tid, meta in state.transactions.items()
    }
