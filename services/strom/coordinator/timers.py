"""The coordinator's timers: members past their session or rebalance deadline are expired (the
removal persisted like any change), and so are members whose storage node's registration
ended (RecordService streams' members: :mod:`strom.coordinator.node_sessions`); transactions
past their timeout are aborted, and the consumer-lag gauges are refreshed, the offsets of
deleted topics are dropped, and groups left empty with nothing committed are deleted (DESIGN
§7).

One loop serves them all, sleeping until the earliest group deadline (at most a second).
Deadlines are on :func:`strom.clock.steady_ms`, so a step of the wall clock neither expires
every member at once nor keeps a dead one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from strom.clock import steady_ms
from strom.coordinator import metrics
from strom.coordinator.group import ExpiredMember, ExpireResult
from strom.coordinator.storage_io import StorageIO
from strom.errors import StromError

log = logging.getLogger("strom.coordinator")

#: How long a group stays EMPTY with nothing committed before it is deleted, by default
#: (Kafka deletes such a group on its offsets cleanup, ``offsets.retention.check.interval.ms``).
EMPTY_GROUP_RETENTION_MS = 600_000
#: How long a group stays EMPTY before its committed offsets expire with it, by default
#: (Kafka's ``offsets.retention.minutes``, 7 days, KIP-211; counted from when this process
#: first saw the group empty, in memory: a restart or a shard move starts it over).
OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000
#: Longest time between two looks for such groups (a shorter retention looks more often).
EMPTY_GROUP_CHECK_MAX_MS = 30_000


class Timers(StorageIO):
    """The timer loop: member expiry, transaction timeouts, lag gauges."""

    _lag_labels: set[tuple[str, str, str]]
    #: The series of PAST_END exported (committed offsets past the log end).
    _past_end_labels: set[tuple[str, str, str]]
    #: What the last sweep of deleted topics' offsets saw: live topic ids, loaded shards.
    _swept: tuple[dict[str, str], frozenset[tuple[int, int]]] | None
    #: ``--empty-group-retention-ms``: see :meth:`_drop_empty_groups`.
    empty_group_retention_ms: int = EMPTY_GROUP_RETENTION_MS
    #: ``--offsets-retention-ms``: see :meth:`_drop_empty_groups`.
    offsets_retention_ms: int = OFFSETS_RETENTION_MS
    #: Group id -> steady ms it was first seen idle (rebuilt on every look).
    _empty_since: dict[str, int]
    _next_empty_check: int

    async def _abort_expired(self) -> None:
        raise NotImplementedError  # strom.coordinator.txn_service.TransactionRpcs

    async def _timer_loop(self) -> None:
        """Expire members past their deadlines (persisting the removal), abort transactions
        past their timeout, refresh lag gauges."""
        next_lag = time.monotonic() + self.lag_interval_s
        while not self._stopping:
            now = steady_ms()
            wake_at = now + 1000
            live_nodes = self._node_sessions.live()
            for shard in list(self.shards.values()):
                if not shard.loaded:
                    continue
                for gid, group in list(shard.groups.items()):
                    if group.has_gone_hosts(live_nodes):
                        await self._fence_gone_hosts(gid, live_nodes)
                    deadline = group.next_deadline_ms()
                    if deadline is None:
                        continue
                    if deadline <= now:
                        await self._expire(gid)
                    else:
                        wake_at = min(wake_at, deadline)
            await self._abort_expired()
            await self._drop_stale_offsets()
            await self._drop_empty_groups()
            if time.monotonic() >= next_lag:
                next_lag = time.monotonic() + self.lag_interval_s
                with contextlib.suppress(Exception):
                    await self._refresh_lag()
            await asyncio.sleep(max(0.02, (wake_at - steady_ms()) / 1000.0))

    async def _expire(self, group_id: str) -> None:
        try:
            result = await self._mutate(
                group_id, lambda g: g.expire(steady_ms()), lambda r: r.records, create=False
            )
        except StromError as exc:
            log.info("expiring members of %s failed: %s", group_id, exc)
            return
        _log_removed(group_id, result, lambda m: f"{m.reason} timeout")

    async def _fence_gone_hosts(self, group_id: str, live_nodes: dict[int, int]) -> None:
        """Remove the group's members whose storage node's registration ended (a RecordService
        stream's member dies with its node: see ConsumerGroup.fence_gone_hosts), persisting
        the removal like a session expiry's, so their partitions move now, not after the
        session timeout."""
        try:
            result = await self._mutate(
                group_id,
                lambda g: g.fence_gone_hosts(live_nodes),
                lambda r: r.records,
                create=False,
            )
        except StromError as exc:
            log.info("removing members of %s hosted by gone nodes failed: %s", group_id, exc)
            return
        _log_removed(
            group_id, result, lambda m: "the storage node running it left the cluster or restarted"
        )

    async def _drop_stale_offsets(self) -> None:
        """Tombstone the committed offsets of deleted topics, as Kafka does when a topic is
        deleted: kept, a topic created again under the same name would resume at the old
        topic's offsets and skip its first records, and describe would list the dead topic
        for good. Swept when the live topics change and when a shard (re)loads (its log may
        hold offsets of topics deleted while nobody owned it); a sweep that failed (a write
        refused) is tried again on the next tick."""
        ids = self._topic_ids()
        loaded = frozenset((s.index, s.generation) for s in self.shards.values() if s.loaded)
        if self._swept == (ids, loaded):
            return
        complete = True
        for shard in list(self.shards.values()):
            if not shard.loaded:
                continue
            for gid, group in list(shard.groups.items()):
                if len(group.live_offsets(ids)) == len(group.offsets):
                    continue
                try:
                    result = await self._mutate(
                        gid, lambda g: g.drop_stale_offsets(ids), lambda r: r.records, create=False
                    )
                except StromError as exc:
                    log.info("dropping deleted topics' offsets of %s failed: %s", gid, exc)
                    complete = False
                    continue
                log.info(
                    "dropped %d committed offsets of deleted topics from group %s",
                    len(result.records),
                    gid,
                    extra={"fields": {"group": gid}},
                )
        if complete:
            self._swept = (ids, loaded)

    async def _drop_empty_groups(self) -> None:
        """Delete the groups that stayed EMPTY with no committed and no transactional offsets
        for ``empty_group_retention_ms``, as Kafka's offsets cleanup does (else every consumer
        that closed without committing leaves an EMPTY group in memory for good). The deletion is
        DeleteGroups' (tombstones appended before the group is dropped), so a reload does not
        bring it back; the engine checks again under the shard lock. The time is counted from
        when this process first saw the group so (a reloaded shard starts over), looked at
        every half retention, at most every :data:`EMPTY_GROUP_CHECK_MAX_MS`.

        A group that stayed empty for ``offsets_retention_ms`` is deleted with its committed
        offsets, as Kafka expires the offsets of a group empty for ``offsets.retention.minutes``
        (KIP-211). A
        group with members keeps its offsets however old they are."""
        now = steady_ms()
        if now < self._next_empty_check:
            return
        retention, offsets_retention = self.empty_group_retention_ms, self.offsets_retention_ms
        shortest = min(retention, offsets_retention)
        self._next_empty_check = now + max(50, min(shortest // 2, EMPTY_GROUP_CHECK_MAX_MS))
        seen: dict[str, int] = {}
        due: list[tuple[str, bool]] = []
        for shard in list(self.shards.values()):
            if not shard.loaded:
                continue
            for gid, group in shard.groups.items():
                if group.idle:
                    since = seen[gid] = self._empty_since.get(gid, now)
                    with_offsets = bool(group.offsets)
                    if now - since >= (offsets_retention if with_offsets else retention):
                        due.append((gid, with_offsets))
        self._empty_since = seen
        for gid, with_offsets in due:
            await self._delete_empty_group(gid, with_offsets)

    async def _delete_empty_group(self, group_id: str, with_offsets: bool = False) -> None:
        try:
            records = await self._mutate(
                group_id,
                lambda g: g.delete_if_idle(with_offsets=with_offsets),
                lambda r: r,
                create=False,
            )
        except StromError as exc:
            log.info("deleting empty group %s failed: %s", group_id, exc)
            return
        if records:
            self._empty_since.pop(group_id, None)
            self._forget_lag([group_id])
            log.info(
                "deleted group %s: empty %s for %d ms",
                group_id,
                "(its committed offsets expired)" if with_offsets else "with no committed offsets",
                self.offsets_retention_ms if with_offsets else self.empty_group_retention_ms,
                extra={"fields": {"group": group_id}},
            )

    async def _refresh_lag(self) -> None:
        committed: dict[tuple[str, str, int], int] = {}
        ids = self._topic_ids()
        for shard in list(self.shards.values()):
            if shard.loaded:
                for gid, g in shard.groups.items():
                    for (t, p), om in g.live_offsets(ids).items():
                        committed[(gid, t, p)] = om.offset
        ends = await self._end_offsets({(t, p) for _, t, p in committed})
        # A shard unloaded while ListOffsets was in flight has had its series dropped
        # (_forget_lag): its groups are not exported again.
        live = {gid for s in list(self.shards.values()) if s.loaded for gid in s.groups}
        labels = set()
        past: set[tuple[str, str, str]] = set()
        for (gid, t, p), off in committed.items():
            if gid not in live:
                continue
            key = (gid, t, str(p))
            end = ends.get((t, p))
            if end is None:
                # No answer (the leader is moving or down): the last value stays, so a lag
                # alert does not go quiet exactly while the partition is in trouble.
                if key in self._lag_labels:
                    labels.add(key)
                if key in self._past_end_labels:
                    past.add(key)
                continue
            labels.add(key)
            metrics.LAG.labels(*key).set(max(0, end - off))
            if off > end:
                past.add(key)
                metrics.PAST_END.labels(*key).set(off - end)
        for key in self._lag_labels - labels:
            with contextlib.suppress(KeyError):
                metrics.LAG.remove(*key)
        self._lag_labels = labels
        self._forget_past_end(self._past_end_labels - past)
        self._past_end_labels = past

    def _forget_past_end(self, keys: Iterable[tuple[str, str, str]]) -> None:
        """Drop PAST_END series (the offset is back within the log, or the lag is gone)."""
        for key in list(keys):
            self._past_end_labels.discard(key)
            with contextlib.suppress(KeyError):
                metrics.PAST_END.remove(*key)

    def _forget_lag(self, group_ids: Iterable[str]) -> None:
        """Drop the lag series of groups this coordinator stopped serving (their shard was
        unloaded: lost, handed over, or the process is stopping)."""
        gone = set(group_ids)
        for key in [k for k in self._lag_labels if k[0] in gone]:
            self._lag_labels.discard(key)
            with contextlib.suppress(KeyError):
                metrics.LAG.remove(*key)
        self._forget_past_end([k for k in self._past_end_labels if k[0] in gone])


def _log_removed(group_id: str, result: ExpireResult, why: Callable[[ExpiredMember], str]) -> None:
    """Count and log each member a timer removed (``why``: the reason in the line)."""
    for m in result.expired:
        metrics.EXPIRED.labels(m.reason).inc()
        log.info(
            "removed member %s of group %s (%s): group epoch %d, %d members",
            m.member_id,
            group_id,
            why(m),
            result.group_epoch,
            result.members,
            extra={
                "fields": {
                    "group": group_id,
                    "member": m.member_id,
                    "group_epoch": result.group_epoch,
                    "members": result.members,
                }
            },
        )
