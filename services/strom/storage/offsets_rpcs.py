"""Offset RPCs of a partition's log: ListOffsets (by timestamp, earliest, latest),
OffsetForLeaderEpoch (where an epoch ended, for a follower's or consumer's truncation) and
DeleteRecords (advance the log start offset) (DESIGN §5, §8).

All are answered by the partition's leader, one error code per partition.
"""

from __future__ import annotations

import asyncio

import grpc

from strom.api import storage_pb2
from strom.errors import ErrorCode
from strom.storage.partition import Partition
from strom.storage.replica_claims import is_replica_list_offsets
from strom.storage.request_quota import counted_request
from strom.storage.rpc_base import (
    StorageCore,
    _fail_partition,
    _Refusal,
    _timed,
    isolation_error,
    per_partition,
)

pb = storage_pb2
E = ErrorCode

#: ListOffsets sentinels.
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
#: How long DeleteRecords waits for the followers when the request names no timeout.
DELETE_RECORDS_DEFAULT_TIMEOUT_S = 30.0


class OffsetRpcs(StorageCore):
    """ListOffsets, OffsetForLeaderEpoch, DeleteRecords."""

    @_timed("ListOffsets")
    @counted_request
    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        resp = pb.ListOffsetsResponse()
        hints: set[int] = set()
        # A replica's view (the log end) only for replica_id >= 1: an unset field sends 0,
        # which is a client's (strom.storage.replica_claims). With ACLs on, a replica's view
        # needed CLUSTER_ACTION (strom.security.rules).
        replica = is_replica_list_offsets(request)
        read_committed = not replica and (
            request.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED
        )
        parts = per_partition(request.topics, resp.topics, timestamp=-1, offset=-1, leader_epoch=-1)
        bad_isolation = isolation_error(request)
        for topic, lp, pr in parts:
            try:
                if bad_isolation is not None:
                    raise _Refusal(E.INVALID_REQUEST, bad_isolation)
                await self._list_offset(topic, lp, replica, pr, hints, read_committed)
            except Exception as exc:
                _fail_partition(pr, "list offsets of", topic, lp.partition, exc)
                pr.timestamp = pr.offset = -1
                pr.leader_epoch = -1
        return resp

    async def _list_offset(
        self,
        topic: str,
        lp: pb.ListOffsetsPartition,
        replica: bool,
        pr: pb.ListOffsetsPartitionResponse,
        hints: set[int],
        read_committed: bool = False,
    ) -> None:
        part = self._leader(topic, lp.partition, lp.current_leader_epoch, hints)
        lg = part.log
        ts = lp.timestamp
        if not replica and ts != EARLIEST and part.high_watermark < part.leader_epoch_start_offset:
            # A new leader's high watermark is its old follower one until the followers report
            # (Kafka's KIP-207): answering from it would take the end of the log back a few
            # offsets ("latest" went 5311 -> 5300 after a leader move).
            raise _Refusal(
                E.OFFSET_NOT_AVAILABLE,
                f"{topic}-{lp.partition} has a new leader whose high watermark "
                f"({part.high_watermark}) has not reached the start of its leadership "
                f"({part.leader_epoch_start_offset}) yet; retry",
            )
        if ts == LATEST:
            if replica:
                pr.offset = lg.log_end_offset
            elif read_committed:
                pr.offset = part.last_stable_offset
            else:
                pr.offset = part.high_watermark
            pr.leader_epoch = part.leader_epoch
        elif ts == EARLIEST:
            pr.offset = lg.log_start_offset
            pr.leader_epoch = lg.epochs.epoch_for(pr.offset)
        elif ts == MAX_TIMESTAMP:
            # Decodes the batch holding the maximum: a worker thread, not the loop.
            found = await asyncio.to_thread(lg.max_timestamp_offset)
            # As Kafka: a match a consumer of this isolation could not read yet is no match
            # (read_committed reads stop at the last stable offset).
            limit = part.last_stable_offset if read_committed else part.high_watermark
            if found is not None and (replica or found[0] < limit):
                pr.offset, pr.timestamp = found
                pr.leader_epoch = lg.epochs.epoch_for(found[0])
        elif ts >= 0:
            # Decodes (at most) the batch holding the match: a worker thread, not the loop.
            hit = await asyncio.to_thread(lg.offset_for_timestamp, ts)
            limit = part.last_stable_offset if read_committed else part.high_watermark
            if hit is not None and (replica or hit[0] < limit):
                pr.offset, pr.timestamp, pr.leader_epoch = hit
        else:
            raise _Refusal(E.INVALID_REQUEST, f"timestamp {ts} is not -1, -2, -3 or >= 0")

    @_timed("OffsetForLeaderEpoch")
    @counted_request
    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetForLeaderEpochResponse:
        resp = pb.OffsetForLeaderEpochResponse()
        hints: set[int] = set()
        for topic, op, pr in per_partition(
            request.topics, resp.topics, leader_epoch=-1, end_offset=-1
        ):
            try:
                part = self._leader(topic, op.partition, op.current_leader_epoch, hints)
                epoch, end = part.log.epochs.end_offset_for(
                    op.leader_epoch, part.log.log_end_offset
                )
                pr.leader_epoch, pr.end_offset = epoch, end
            except Exception as exc:
                _fail_partition(pr, "epoch lookup of", topic, op.partition, exc)
        return resp

    @_timed("DeleteRecords")
    @counted_request
    async def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRecordsResponse:
        resp = pb.DeleteRecordsResponse()
        hints: set[int] = set()
        deleted: list[tuple[Partition, int, pb.DeleteRecordsPartitionResult]] = []
        for topic, dp, pr in per_partition(request.topics, resp.topics, low_watermark=-1):
            try:
                if topic.startswith("__"):  # strom's internal namespace, as Kafka refuses
                    raise _Refusal(
                        E.INVALID_TOPIC,
                        f"cannot delete records of {topic}-{dp.partition}: the topic is "
                        "internal (committed offsets, transaction state)",
                    )
                part = self._leader(topic, dp.partition, -1, hints)
                _check_deletable(part)
                hw = part.high_watermark
                offset = hw if dp.offset == -1 else dp.offset
                if offset < 0 or offset > hw:
                    raise _Refusal(
                        E.OFFSET_OUT_OF_RANGE,
                        f"cannot delete below offset {dp.offset} of {topic}-"
                        f"{dp.partition}: it must be in [0, {hw}] (the high watermark; "
                        '"latest" or -1 means the high watermark)',
                    )
                # Unlinks whole segments below the new start: a worker thread.
                pr.low_watermark = await asyncio.to_thread(part.log.delete_records, offset)
                part.maybe_advance_high_watermark()
                self.manager.refresh_gauges(part)
                # Parked follower fetches answer now, with the new start to adopt.
                self.manager.appended.notify(part.tp, 1 << 30)
                deleted.append((part, offset, pr))
            except Exception as exc:
                _fail_partition(pr, "delete records of", topic, dp.partition, exc)
                pr.low_watermark = -1
        logs = self.manager.logs
        if deleted and logs is not None:
            # The new log starts are durable before the answer: they
            # reached the checkpoint file only every --checkpoint-interval-ms, and a leader
            # killed before that came back with the deleted records readable again.
            try:
                await asyncio.to_thread(logs.checkpoint)
            except Exception as exc:
                for _, _, pr in deleted:
                    pr.error_code = E.STORAGE_ERROR
                    pr.error_message = f"the new log start could not be made durable: {exc}"
                    pr.low_watermark = -1
                return resp
        if deleted:
            await self._wait_for_low_watermarks(deleted, request.timeout_ms, context)
        return resp

    @staticmethod
    async def _wait_for_low_watermarks(
        deleted: list[tuple[Partition, int, pb.DeleteRecordsPartitionResult]],
        timeout_ms: int,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Answer once every in-sync follower moved its log start too (Kafka's
        DelayedDeleteRecords: the answer came when only the leader had
        deleted, and a leader killed at once left a new leader with the records readable).
        Past ``timeout_ms`` (30 s when unset), or the call's deadline, the partition answers
        REQUEST_TIMED_OUT: the deletion stands and reaches the followers; retrying is safe."""
        asked = timeout_ms / 1000 if timeout_ms > 0 else DELETE_RECORDS_DEFAULT_TIMEOUT_S
        timeout = asked
        left = context.time_remaining()
        if left is not None:
            timeout = min(timeout, max(left - 0.05, 0.0))
        lows = await asyncio.gather(
            *(part.wait_for_low_watermark(offset, timeout) for part, offset, _ in deleted)
        )
        # Say what bounded the wait: a client retrying until its own deadline sends a last
        # request with almost no time left, and "within 0.0 s" alone read as if nothing had
        # been waited for.
        if timeout < asked:
            waited = f"the {timeout:.1f} s the call's deadline left (timeout_ms {asked:.1f} s)"
        else:
            waited = f"timeout_ms ({asked:.1f} s)"
        for (part, offset, pr), low in zip(deleted, lows, strict=True):
            if low is not None:
                pr.low_watermark = low
                continue
            pr.low_watermark = -1
            where = f"{part.topic}-{part.index}: records below {offset} are deleted on the leader"
            if not part.is_leader:
                pr.error_code = E.NOT_LEADER_OR_FOLLOWER
                pr.error_message = (
                    f"{where}, but it lost the leadership before every in-sync replica had "
                    "moved its log start"
                )
                continue
            behind = ", ".join(f"node {r}" for r in part.followers_below_log_start(offset))
            pr.error_code = E.REQUEST_TIMED_OUT
            pr.error_message = (
                f"{where}, but not every in-sync replica had moved its log start past it "
                f"within {waited} (still behind: {behind or 'none now'}; low watermark "
                f"{part.low_watermark()}); the deletion stands and reaches them, retrying "
                "is safe"
            )


def _check_deletable(part: Partition) -> None:
    """POLICY_VIOLATION unless the topic's cleanup.policy includes ``delete`` (as Kafka).

    On a compacted-only topic the log is a table: the latest value of every key. Moving its
    start would drop keys whose latest value lies below it, which compaction never does
    (a key vanished from a key -> latest-value table)."""
    if not part.log.config.delete:
        raise _Refusal(
            E.POLICY_VIOLATION,
            f"records of {part.topic}-{part.index} cannot be deleted: its cleanup.policy is "
            f"{part.log.config.cleanup_policy!r}, and DeleteRecords needs one with 'delete'",
        )
