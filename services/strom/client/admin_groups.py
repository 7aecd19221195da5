"""The Admin client's consumer-group calls, on the groups' coordinators, mixed into
:class:`strom.client.admin.Admin` as :class:`GroupsAdmin`; the coordinator calls and typed
results it shares with the ``strom groups`` CLI are in :mod:`strom.client.group_admin`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from strom.api import coordinator_pb2
from strom.client import group_admin
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import (
    NONE,
    admin_errors,
    by_topic,
    checked_group_id,
    checked_group_ids,
    group_error,
    group_partition_error,
    partition_failures,
    raise_first,
    tp_list,
)
from strom.client.group_admin import GroupDescription, GroupListing, GroupState
from strom.client.types import OffsetAndMetadata, TopicPartition, add_offsets, checked_offsets
from strom.errors import ErrorCode, InvalidRequestError, StromError


class GroupsAdmin(AdminCalls):
    """Consumer groups and their committed offsets, on the groups' coordinators."""

    def _group_call(
        self, group: str, method: str, req: Any, code_of: Callable[[Any], int] | None = None
    ) -> Any:
        if self._closed:
            raise StromError("the Admin client is closed")
        return group_admin.group_call(
            self._client,
            group,
            method,
            req,
            code_of,
            timeout_s=self.request_timeout_ms / 1000,
            retry_s=self.default_api_timeout_ms / 1000,
        )

    def list_groups(self, states: Iterable[GroupState | str] | None = None) -> list[GroupListing]:
        """Every consumer group (only those in ``states``, e.g. ``["Empty"]``, when given),
        sorted by id, from every group coordinator.

        One pass, not retried: when some coordinator shard has no owner right now or its
        owner does not answer, raises :class:`GroupListingIncompleteError` (retriable), whose
        ``groups`` holds the groups the other shards listed and ``missing_shards`` the shards
        missing. With ACLs on, groups the caller may not describe are left out.
        """
        if self._closed:
            raise StromError("the Admin client is closed")
        if isinstance(states, str):
            raise InvalidRequestError(f"list_groups takes a list of states, not {states!r}")
        try:
            codes = [group_admin.group_state_code(s) for s in states or ()]
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return group_admin.list_groups(
            self._client, codes, timeout_s=self.request_timeout_ms / 1000
        )

    def describe_groups(
        self, group_ids: Iterable[str], *, include_offsets: bool = False
    ) -> dict[str, GroupDescription]:
        """Describe groups: state, epochs, assignor, members with their assignments (and the
        partitions they still have to give up). ``include_offsets`` adds each partition's
        committed offset, log end and lag (a ListOffsets round to the partition leaders).

        A group that does not exist raises GroupIdNotFoundError naming it (the first failed
        group's error, as every Admin call taking several items; the others are listed).
        """
        gids = checked_group_ids(group_ids, "describe_groups")
        out: dict[str, GroupDescription] = {}
        failures: list[tuple[str, StromError]] = []
        for gid in gids:
            d = group_admin.describe_group(
                self._client,
                gid,
                include_offsets=include_offsets,
                timeout_s=self.request_timeout_ms / 1000,
                retry_s=self.default_api_timeout_ms / 1000,
            )
            if d.error_code != NONE:
                failures.append((gid, group_error(d.error_code, d.error_message, gid)))
            else:
                out[gid] = group_admin.group_description(d)
        raise_first(failures)
        return out

    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (the next offset it reads), sorted by partition:
        every committed one, or those of ``partitions``, where a partition with nothing
        committed maps to None (as Kafka's ``listConsumerGroupOffsets``). An unknown group has
        nothing committed. Lag is ``admin.list_offsets({tp: "latest"})`` minus these."""
        gid = checked_group_id(group_id)
        tps = None if partitions is None else tp_list(partitions, "list_group_offsets")
        req = coordinator_pb2.OffsetFetchRequest(group_id=gid, member_epoch=-1)
        for topic, parts in by_topic(dict.fromkeys(tps or ())).items():
            req.topics.add(topic=topic, partitions=sorted(p for p, _ in parts))
        resp = self._group_call(gid, "OffsetFetch", req)
        if resp.error_code != NONE:
            raise group_error(resp.error_code, resp.error_message, gid)
        out: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(tps or ())
        failures: list[tuple[str, StromError]] = []
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition)
                if p.error_code != NONE:
                    failures.append(
                        (f"{tp.topic}-{tp.partition}", group_partition_error(p, gid, tp))
                    )
                elif p.committed_offset >= 0:
                    out[tp] = OffsetAndMetadata(
                        p.committed_offset, p.metadata, p.committed_leader_epoch
                    )
        raise_first(failures)
        return dict(sorted(out.items()))

    def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> None:
        """Set the group's committed offsets (creating the group if it does not exist), as
        Kafka's ``alterConsumerGroupOffsets`` and ``strom groups reset-offsets`` do.

        Only while the group has no members: otherwise NonEmptyGroupError naming the group
        (and nothing changes), since its members would overwrite the new offsets with their
        next commit. The coordinator checks this atomically with the commit. A partition it
        refuses (an unknown topic, metadata too large) raises that partition's error; the
        other partitions were set.
        """
        gid = checked_group_id(group_id)
        with admin_errors():
            wanted = checked_offsets(offsets, "alter_group_offsets")
        if not wanted:
            return
        req = coordinator_pb2.OffsetCommitRequest(group_id=gid, member_epoch=-1)
        add_offsets(req, wanted)
        resp = self._group_call(gid, "OffsetCommit", req)
        if resp.error_code == ErrorCode.NON_EMPTY_GROUP:
            raise group_admin.non_empty_error(gid)
        if resp.error_code != NONE:
            raise group_error(resp.error_code, resp.error_message, gid)
        raise_first(partition_failures(resp, gid))

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Delete the group's committed offsets of ``partitions`` (Kafka's
        ``deleteConsumerGroupOffsets``). A partition of a topic some member is subscribed to
        keeps its offset and raises GroupSubscribedToTopicError naming it (the others are
        deleted); an unknown group raises GroupIdNotFoundError."""
        gid = checked_group_id(group_id)
        tps = tp_list(partitions, "delete_group_offsets")
        if not tps:
            return
        req = coordinator_pb2.DeleteOffsetsRequest(group_id=gid)
        for topic, parts in by_topic(dict.fromkeys(tps)).items():
            req.topics.add(topic=topic, partitions=sorted(p for p, _ in parts))
        resp = self._group_call(gid, "DeleteOffsets", req)
        if resp.error_code != NONE:
            raise group_error(resp.error_code, resp.error_message, gid)
        raise_first(partition_failures(resp, gid))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups and their committed offsets (Kafka's ``deleteConsumerGroups``).
        Only groups without members: a group with members raises NonEmptyGroupError, an
        unknown one GroupIdNotFoundError, each naming the group (the first failure; the
        message lists the others, and the groups not listed were deleted)."""
        failures: list[tuple[str, StromError]] = []
        for gid in checked_group_ids(group_ids, "delete_groups"):
            req = coordinator_pb2.DeleteGroupsRequest(group_ids=[gid])
            resp = self._group_call(gid, "DeleteGroups", req, lambda r: r.results[0].error_code)
            r = resp.results[0]
            if r.error_code != NONE:
                failures.append((gid, group_error(r.error_code, r.error_message, gid)))
        raise_first(failures)
