"""The Admin client's calls on the partition leaders' logs (ListOffsets, DeleteRecords), one
request per leader through :meth:`~strom.client.admin_calls.AdminCalls._per_leader`, mixed
into :class:`strom.client.admin.Admin` as :class:`RecordsAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from strom.api import storage_pb2
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import by_topic, offset_spec, tp_map
from strom.client.admin_types import OffsetSpec
from strom.client.kwnames import INT64_MAX
from strom.client.types import OffsetAndTimestamp, TopicPartition
from strom.errors import InvalidArgumentError, InvalidRequestError

_ISOLATION = {
    "read_uncommitted": storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
    "read_committed": storage_pb2.ISOLATION_LEVEL_READ_COMMITTED,
}


class RecordsAdmin(AdminCalls):
    """Offsets and records, one request per partition leader (ListOffsets, DeleteRecords)."""

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Look offsets up on each partition's leader (one request per leader).

        "earliest" is the log start offset, "latest" the offset the next committed record will
        get (the high watermark), both with timestamp -1; Kafka's numbers for them, -2 and -1
        (and -3 for "max_timestamp"), are taken too. A time gives the first record at or
        after it and that record's timestamp, "max_timestamp" the largest timestamp and the
        offset of the first record holding it (as Kafka 3.8+); when no record matches, the
        partition maps to None (as Kafka's ``offsets_for_times``). With "read_committed", a
        record at or after the last stable offset does not match yet.

        A partition that cannot be looked up (no live leader within the call's timeout, an
        unknown partition) does not lose the others' answers: the error raised, of its own
        class, is a PartialResultError too, with ``results`` and ``errors`` by partition.
        """
        if isolation_level not in _ISOLATION:
            raise InvalidRequestError(
                f"isolation_level must be one of {', '.join(_ISOLATION)}, not {isolation_level!r}"
            )
        wanted = {tp: offset_spec(tp, s) for tp, s in tp_map(specs, "list_offsets").items()}

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.ListOffsetsRequest:
            req = storage_pb2.ListOffsetsRequest(
                replica_id=-1, isolation_level=_ISOLATION[isolation_level]
            )
            for topic, parts in by_topic(group).items():
                req.topics.add(
                    topic=topic,
                    partitions=[
                        storage_pb2.ListOffsetsPartition(
                            partition=p, current_leader_epoch=-1, timestamp=ts
                        )
                        for p, ts in parts
                    ],
                )
            return req

        def results(
            resp: storage_pb2.ListOffsetsResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, OffsetAndTimestamp | None]]:
            for t in resp.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.topic, p.partition)
                    value = OffsetAndTimestamp(p.offset, p.timestamp) if p.offset >= 0 else None
                    yield tp, p.error_code, p.error_message, value

        return self._per_leader(wanted, "ListOffsets", request, results)

    def delete_records(
        self, before: Mapping[TopicPartition, int | Literal["latest"]]
    ) -> dict[TopicPartition, int]:
        """Delete every record below the given offset of each partition; returns each
        partition's new low watermark (its first readable offset). "latest" (or -1, as in
        Kafka's DeleteRecords) deletes everything committed. An offset above the high
        watermark raises OffsetOutOfRangeError, a topic whose cleanup.policy lacks "delete"
        PolicyViolationError (as Kafka). Offsets are never reused: the next record still
        gets the next offset.

        Each partition is deleted on its own: when some are refused, the others are still
        deleted, and the error raised (of the first refusal's class) is a
        PartialResultError too, whose ``results`` holds the new low watermark of each
        partition deleted and ``errors`` the error of each refused."""
        wanted: dict[TopicPartition, int] = {}
        for tp, offset in tp_map(before, "delete_records").items():
            if offset == "latest" or (offset == -1 and not isinstance(offset, bool)):
                wanted[tp] = -1
            elif (
                isinstance(offset, int)
                and not isinstance(offset, bool)
                and 0 <= offset <= INT64_MAX
            ):
                wanted[tp] = offset
            else:
                raise InvalidArgumentError(
                    f"{tp.topic}-{tp.partition}: delete_records takes an offset >= 0 and <= "
                    f"{INT64_MAX} (an int64) or 'latest' / -1 (everything committed), not "
                    f"{offset!r}"
                )

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.DeleteRecordsRequest:
            req = storage_pb2.DeleteRecordsRequest(timeout_ms=self._server_wait_ms)
            for topic, parts in by_topic(group).items():
                req.topics.add(
                    topic=topic,
                    partitions=[
                        storage_pb2.DeleteRecordsPartition(partition=p, offset=o) for p, o in parts
                    ],
                )
            return req

        def results(
            resp: storage_pb2.DeleteRecordsResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, int]]:
            for t in resp.topics:
                for p in t.partitions:
                    yield (
                        TopicPartition(t.topic, p.partition),
                        p.error_code,
                        p.error_message,
                        p.low_watermark,
                    )

        return self._per_leader(wanted, "DeleteRecords", request, results)
