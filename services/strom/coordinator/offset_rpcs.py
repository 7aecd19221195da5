"""The committed-offset RPCs: OffsetCommit, OffsetFetch and DeleteOffsets (DESIGN §7).

Offsets live in the group engine (:meth:`ConsumerGroup.commit_offsets` decides what a commit
may change, and which retried or delayed commits it supersedes); commits are made durable in
the group's ``__consumer_offsets`` shard before the answer (:meth:`CoordinatorCore._mutate`).
Transactional offset commits are in :mod:`strom.coordinator.txn_service`.
"""

from __future__ import annotations

from typing import Any

from strom.api import coordinator_pb2 as pb
from strom.clock import wall_ms
from strom.coordinator import metrics
from strom.coordinator.core import CoordinatorCore, rpc
from strom.coordinator.group import ConsumerGroup
from strom.coordinator.offsets_log import OffsetAndMetadata
from strom.coordinator.request_bounds import check_group_id
from strom.errors import ErrorCode, GroupIdNotFoundError, NotCoordinatorError, error_name

E = ErrorCode


class OffsetRpcs(CoordinatorCore):
    """OffsetCommit, OffsetFetch, DeleteOffsets."""

    @rpc()
    async def OffsetCommit(
        self, request: pb.OffsetCommitRequest, resp: pb.OffsetCommitResponse
    ) -> None:
        offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        try:
            # The topic's id goes with the offset: a topic deleted and created again under
            # the same name must not resume at the old topic's offsets.
            check_group_id(request.group_id)  # (a commit without a member creates the group)
            ids = self._topic_ids()
        except Exception as exc:
            self._fail("OffsetCommit", resp, exc)
            return
        for t in request.topics:
            for p in t.partitions:
                offsets[(t.topic, p.partition)] = OffsetAndMetadata(
                    offset=p.committed_offset,
                    leader_epoch=p.committed_leader_epoch,
                    metadata=p.metadata,
                    topic_id=ids.get(t.topic, ""),
                )

        def commit(group: ConsumerGroup) -> Any:
            return group.commit_offsets(
                request.member_id,
                request.member_epoch,
                offsets,
                now_ms=wall_ms(),
                topics=self._topics(),
                committer_id=request.committer_id,
                commit_sequence=request.commit_sequence,
            )

        try:
            result = await self._mutate(
                request.group_id, commit, lambda r: r.records, create=request.member_epoch < 0
            )
        except GroupIdNotFoundError:
            resp.error_code = E.UNKNOWN_MEMBER_ID  # type: ignore[assignment]
            resp.error_message = f"group {request.group_id!r} has no member {request.member_id!r}"
            metrics.RPC_ERRORS.labels("OffsetCommit", "UNKNOWN_MEMBER_ID").inc()
            return
        except Exception as exc:
            self._fail("OffsetCommit", resp, exc)
            return
        if result.superseded:
            metrics.SUPERSEDED_COMMITS.inc(result.superseded)
        for t in request.topics:
            tr = resp.topics.add(topic=t.topic)
            for p in t.partitions:
                code = result.errors.get((t.topic, p.partition), E.NONE)
                pr = tr.partitions.add(partition=p.partition, error_code=code)
                if code != E.NONE:
                    pr.error_message = commit_error(
                        code, t.topic, p, self.group_config.offset_metadata_max_bytes
                    )

    @rpc()
    async def OffsetFetch(
        self, request: pb.OffsetFetchRequest, resp: pb.OffsetFetchResponse
    ) -> None:
        try:
            shard = self._shard_of(request.group_id)
            group = shard.groups.get(request.group_id)
            if group is not None:
                group.validate_fetch(request.member_id, request.member_epoch)
            # Offsets of a deleted (or deleted and re-created) topic are not answered; the
            # timer loop tombstones them (Timers._drop_stale_offsets).
            committed = group.live_offsets(self._topic_ids()) if group is not None else {}
            # What was read may hold commits still being written: answer once they are
            # durable, and only if the shard was not reloaded or dropped meanwhile.
            generation = shard.generation
            await self._durable(shard)
            if not shard.loaded or shard.generation != generation:
                raise NotCoordinatorError(f"shard {shard.index} was reloaded or moved")
        except Exception as exc:
            self._fail("OffsetFetch", resp, exc)
            return
        wanted: dict[str, list[int]] = {}
        if request.topics:
            for tp in request.topics:
                ps = list(tp.partitions) or [p for t, p in committed if t == tp.topic]
                wanted.setdefault(tp.topic, []).extend(ps)
        else:
            for t, p in committed:
                wanted.setdefault(t, []).append(p)
        for topic in sorted(wanted):
            tr = resp.topics.add(topic=topic)
            for p in sorted(set(wanted[topic])):
                om = committed.get((topic, p))
                pr = tr.partitions.add(partition=p, committed_offset=-1, committed_leader_epoch=-1)
                if request.require_stable and group is not None and group.unstable(topic, p):
                    pr.error_code = E.UNSTABLE_OFFSET_COMMIT  # type: ignore[assignment]
                    pr.error_message = "a transaction has an offset pending for it"
                    continue
                if om is not None:
                    pr.committed_offset = om.offset
                    pr.committed_leader_epoch = om.leader_epoch
                    pr.metadata = om.metadata

    @rpc()
    async def DeleteOffsets(
        self, request: pb.DeleteOffsetsRequest, resp: pb.DeleteOffsetsResponse
    ) -> None:
        parts = [(tp.topic, p) for tp in request.topics for p in tp.partitions]
        try:
            result = await self._mutate(
                request.group_id,
                lambda g: g.delete_offsets(parts),
                lambda r: r.records,
                create=False,
            )
        except Exception as exc:
            self._fail("DeleteOffsets", resp, exc)
            return
        for tp in request.topics:
            tr = resp.topics.add(topic=tp.topic)
            for p in tp.partitions:
                code = result.errors.get((tp.topic, p), E.NONE)
                tr.partitions.add(partition=p, error_code=code)


def commit_error(code: int, topic: str, p: Any, limit: int) -> str:
    """A refused partition of a commit, in words (``p`` its OffsetCommitPartition): the
    name alone ("OFFSET_METADATA_TOO_LARGE") said neither the size nor the limit."""
    where = f"{topic}-{p.partition}"
    if code == E.OFFSET_METADATA_TOO_LARGE:
        size = len(p.metadata.encode())
        return f"{where}: the commit's metadata is {size} bytes, more than the {limit} kept"
    if code == E.UNKNOWN_TOPIC_OR_PARTITION:
        return f"there is no partition {where}"
    return f"{where}: {error_name(code)}"
