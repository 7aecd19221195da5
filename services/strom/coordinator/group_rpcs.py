"""The consumer-group RPCs: ConsumerGroupHeartbeat, ListGroups, DescribeGroups and
DeleteGroups (DESIGN §7).

The group protocol itself is the engine :class:`strom.coordinator.group.ConsumerGroup`; these
handlers find the group's shard, run the engine call durably
(:meth:`CoordinatorCore._mutate`) and translate its result into the response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc

from strom.api import coordinator_pb2 as pb
from strom.clock import steady_ms
from strom.coordinator.core import rpc
from strom.coordinator.group import ConsumerGroup, GroupState, HeartbeatResult, HostNode
from strom.coordinator.request_bounds import (
    MAX_GROUP_ID_CHARS,
    MAX_MEMBER_ID_CHARS,
    check_group_id,
    check_id,
    check_rebalance_timeout,
)
from strom.coordinator.storage_io import StorageIO
from strom.errors import ErrorCode, GroupIdNotFoundError
from strom.security.acl import Op, Res
from strom.security.config import server as server_security
from strom.security.interceptor import CURRENT_PRINCIPAL

E = ErrorCode
log = logging.getLogger("strom.coordinator")


def _client_host(peer: str | None) -> str:
    """``ipv4:127.0.0.1:5555`` / ``ipv6:[::1]:5555`` → the host part."""
    if not peer:
        return ""
    _, _, rest = peer.partition(":")
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or rest


def _assignment_pb(parts: Mapping[str, Iterable[int]]) -> pb.Assignment:
    a = pb.Assignment()
    for t in sorted(parts):
        ps = sorted(parts[t])
        if ps:
            a.topic_partitions.add(topic=t, partitions=ps)
    return a


def _describable_topics() -> Callable[[str], bool] | None:
    """With ACLs on: whether the calling principal (the interceptor's CURRENT_PRINCIPAL) may
    DESCRIBE a topic, as the ACLs stand when asked; a member's regex resolves only to such
    topics. None with ACLs off (every topic)."""
    sec = server_security()
    if not sec.acls:
        return None
    principal, authorizer = CURRENT_PRINCIPAL.get(), sec.authorizer
    return lambda topic: authorizer.allowed(principal, Op.DESCRIBE, Res.TOPIC, topic)


def _log_group_change(group_id: str, result: HeartbeatResult) -> None:
    """One INFO line per change of a group's membership or subscriptions (durable by
    now), as Kafka's group coordinator logs each rebalance; none for a plain heartbeat."""
    if result.group_epoch != result.previous_group_epoch:
        epoch = f"epoch {result.previous_group_epoch} -> {result.group_epoch}"
    else:
        epoch = f"epoch {result.group_epoch} (no rebalance)"
    log.info(
        "group %s: %s: %s; %d members",
        group_id,
        epoch,
        result.change,
        result.members,
        extra={
            "fields": {
                "group": group_id,
                "group_epoch": result.group_epoch,
                "members": result.members,
            }
        },
    )


class GroupRpcs(StorageIO):
    """ConsumerGroupHeartbeat, ListGroups, DescribeGroups, DeleteGroups."""

    @rpc(with_context=True)
    async def ConsumerGroupHeartbeat(
        self,
        request: pb.ConsumerGroupHeartbeatRequest,
        resp: pb.ConsumerGroupHeartbeatResponse,
        context: grpc.aio.ServicerContext,
    ) -> None:
        resp.member_id = request.member_id
        resp.member_epoch = -1
        try:
            check_group_id(request.group_id)
            check_id(request.member_id, "member_id", MAX_MEMBER_ID_CHARS)
            if request.HasField("instance_id"):
                check_id(request.instance_id, "instance_id", MAX_GROUP_ID_CHARS)
            check_rebalance_timeout(request.rebalance_timeout_ms)
        except Exception as exc:
            resp.member_id = ""  # (not echoed back: it may be what was refused)
            self._fail("ConsumerGroupHeartbeat", resp, exc)
            return
        meta = dict(context.invocation_metadata() or ())
        client_id = str(meta.get("strom-client-id", ""))
        client_host = _client_host(context.peer())
        owned = {tp.topic: list(tp.partitions) for tp in request.owned_topic_partitions}
        topic_filter = _describable_topics()
        host: HostNode | None = None
        if request.HasField("host_node_id"):
            # A RecordService stream's member: bound to the session of its node's
            # registration as this coordinator sees it now (None while unseen), so that it is
            # removed once that registration ends (DESIGN §7; Timers._fence_gone_hosts).
            node, incarnation = request.host_node_id, request.host_node_incarnation_id
            host = HostNode(node, incarnation, self._node_sessions.session_of(node, incarnation))

        def beat(group: ConsumerGroup) -> Any:
            return group.heartbeat(
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                now_ms=steady_ms(),  # session deadlines: never moved by a wall-clock step
                topics=self._topics(),
                instance_id=request.instance_id if request.HasField("instance_id") else None,
                rack_id=request.rack_id if request.HasField("rack_id") else None,
                subscribed_topic_names=request.subscribed_topic_names,
                subscribed_topic_regex=(
                    request.subscribed_topic_regex
                    if request.HasField("subscribed_topic_regex")
                    else None
                ),
                server_assignor=(
                    request.server_assignor if request.HasField("server_assignor") else None
                ),
                owned_partitions=owned,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                client_id=client_id,
                client_host=client_host,
                topic_filter=topic_filter,
                host_node=host,
            )

        try:
            result = await self._mutate(request.group_id, beat, lambda r: r.records)
        except Exception as exc:
            self._fail("ConsumerGroupHeartbeat", resp, exc)
            return
        if result.change is not None:
            _log_group_change(request.group_id, result)
        resp.member_id = result.member_id
        resp.member_epoch = result.member_epoch
        resp.heartbeat_interval_ms = result.heartbeat_interval_ms
        if result.assignment is not None:
            resp.assignment.CopyFrom(_assignment_pb(result.assignment))

    @rpc()
    async def ListGroups(self, request: pb.ListGroupsRequest, resp: pb.ListGroupsResponse) -> None:
        states = set(request.states_filter)
        loading = []
        listed = []
        for s, shard in sorted(self.shards.items()):
            if not shard.loaded:
                loading.append(s)
                continue
            resp.shards.append(s)
            for gid, g in shard.groups.items():
                state = int(g.state)
                if state == pb.GROUP_STATE_DEAD or (states and state not in states):
                    continue
                listed.append(
                    pb.ListedGroup(group_id=gid, state=state, shard=s, member_count=len(g.members))
                )
        resp.groups.extend(sorted(listed, key=lambda g: g.group_id))
        if loading:
            resp.error_code = E.COORDINATOR_LOAD_IN_PROGRESS  # type: ignore[assignment]
            resp.error_message = f"shards {loading} are still loading"

    @rpc()
    async def DescribeGroups(
        self, request: pb.DescribeGroupsRequest, resp: pb.DescribeGroupsResponse
    ) -> None:
        for gid in request.group_ids:
            d = resp.groups.add(group_id=gid)
            try:
                shard = self._shard_of(gid)
                group = shard.groups.get(gid)
                if group is None or group.state is GroupState.DEAD:
                    raise GroupIdNotFoundError(f"group {gid!r} does not exist")
            except Exception as exc:
                self._fail("DescribeGroups", d, exc)
                continue
            d.state = int(group.state)  # type: ignore[assignment]
            d.group_epoch = group.group_epoch
            d.assignment_epoch = group.assignment_epoch
            d.assignor_name = group.assignor_name
            for mid in sorted(group.members):
                m = group.members[mid]
                dm = d.members.add(
                    member_id=mid,
                    client_id=m.metadata.client_id,
                    client_host=m.metadata.client_host,
                    member_epoch=m.member_epoch,
                    state=int(m.state),
                    subscribed_topic_names=list(m.metadata.subscribed_topic_names),
                )
                if m.metadata.instance_id is not None:
                    dm.instance_id = m.metadata.instance_id
                if m.metadata.rack_id is not None:
                    dm.rack_id = m.metadata.rack_id
                if m.metadata.subscribed_topic_regex is not None:
                    dm.subscribed_topic_regex = m.metadata.subscribed_topic_regex
                dm.assignment.CopyFrom(_assignment_pb(m.assigned))
                dm.target_assignment.CopyFrom(_assignment_pb(group.target.get(mid, {})))
                dm.partitions_pending_revocation.CopyFrom(_assignment_pb(m.pending_revocation))
            if request.include_offsets:
                await self._describe_offsets(group, d)

    async def _describe_offsets(self, group: ConsumerGroup, d: pb.DescribedGroup) -> None:
        offsets = group.live_offsets(self._topic_ids())
        parts = set(offsets)
        for m in group.members.values():
            # Every partition a member holds, those it must still give up too (a pending
            # revocation without a committed offset is still a row).
            for held in (m.assigned, m.pending_revocation):
                for t, ps in held.items():
                    parts.update((t, p) for p in ps)
        ends = await self._end_offsets(parts)
        for t, p in sorted(parts):
            om = offsets.get((t, p))
            end = ends.get((t, p), -1)
            committed = om.offset if om is not None else -1
            if end < 0:
                lag = -1
            elif committed >= 0:
                # Negative past the log end: clamped to 0 it would hide a group about to
                # get OFFSET_OUT_OF_RANGE and reset.
                lag = end - committed
            else:
                lag = 0 if end == 0 else -1
            d.offsets.add(
                topic=t,
                partition=p,
                committed_offset=committed,
                committed_leader_epoch=om.leader_epoch if om is not None else -1,
                metadata=om.metadata if om is not None else "",
                end_offset=end,
                lag=lag,
                member_id=group.owner_of(t, p) or "",
            )

    @rpc()
    async def DeleteGroups(
        self, request: pb.DeleteGroupsRequest, resp: pb.DeleteGroupsResponse
    ) -> None:
        for gid in request.group_ids:
            r = resp.results.add(group_id=gid)
            try:
                await self._mutate(gid, lambda g: g.delete(), lambda recs: recs, create=False)
            except Exception as exc:
                self._fail("DeleteGroups", r, exc)
