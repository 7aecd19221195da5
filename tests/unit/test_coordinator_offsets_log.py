"""__consumer_offsets records (strom.coordinator.offsets_log): encodings round-trip, keys are
stable bytes, replay keeps the latest value per key, tombstones delete, batches carry the
producer fencing information."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.api import coordinator_pb2
from strom.coordinator.offsets_log import (
    GroupMetadata,
    GroupRecord,
    GroupSnapshot,
    MemberAssignment,
    MemberMetadata,
    OffsetAndMetadata,
    RecordKey,
    RecordKind,
    ShardState,
    current_assignment_key,
    current_assignment_record,
    current_assignment_tombstone,
    decode_current_assignment,
    decode_group_metadata,
    decode_key,
    decode_member_metadata,
    decode_offset,
    decode_target_assignment,
    encode_group_batch,
    group_metadata_key,
    group_metadata_record,
    group_metadata_tombstone,
    member_metadata_record,
    member_metadata_tombstone,
    offset_commit_key,
    offset_commit_record,
    offset_commit_tombstone,
    shard_for_group,
    target_assignment_member_record,
    target_assignment_metadata_key,
    target_assignment_metadata_record,
)
from strom.record import InvalidBatchError, encode_batch

META = GroupMetadata(7, {"a": 3, "b": 1}, "uniform", 1_700_000_000_000)
MEMBER = MemberMetadata(
    instance_id="host-1",
    rack_id="r1",
    client_id="billing",
    client_host="10.0.0.5",
    subscribed_topic_names=("a", "b"),
    subscribed_topic_regex=None,
    server_assignor="range",
    rebalance_timeout_ms=300_000,
)
CURRENT = MemberAssignment(
    member_epoch=7,
    previous_member_epoch=6,
    state=coordinator_pb2.MEMBER_STATE_UNREVOKED_PARTITIONS,
    assigned={"a": [0, 2]},
    pending_revocation={"b": [0]},
)


def test_keys_are_stable_bytes_and_kinds_never_collide() -> None:
    # Compaction compares key bytes: they must not change across versions.
    assert offset_commit_key("g", "t", 1).hex() == "0a080a01671201741801"
    assert group_metadata_key("g").hex() == "12030a0167"
    assert target_assignment_metadata_key("g").hex() == "22030a0167"
    assert current_assignment_key("g", "m").hex() == "32060a016712016d"
    assert offset_commit_key("g", "t", 1) == offset_commit_key("g", "t", 1)
    assert group_metadata_key("g") != target_assignment_metadata_key("g")
    assert decode_key(offset_commit_key("g", "t", 0)) == RecordKey(
        RecordKind.OFFSET_COMMIT, "g", topic="t", partition=0
    )
    assert decode_key(current_assignment_key("g", "m")) == RecordKey(
        RecordKind.CURRENT_MEMBER_ASSIGNMENT, "g", member_id="m"
    )


def test_values_round_trip() -> None:
    om = OffsetAndMetadata(42, 3, "meta", 123, "topic-uuid")
    rec = offset_commit_record("g", "t", 5, om)
    assert decode_offset(rec.value) == om
    assert decode_group_metadata(group_metadata_record("g", META).value) == META
    assert decode_member_metadata(member_metadata_record("g", "m", MEMBER).value) == MEMBER
    regex_member = MemberMetadata(subscribed_topic_regex="orders-.*")
    rec = member_metadata_record("g", "m", regex_member)
    assert decode_member_metadata(rec.value) == regex_member
    assert decode_current_assignment(current_assignment_record("g", "m", CURRENT).value) == CURRENT
    target = {"b": [3, 1], "a": [0], "empty": []}
    rec = target_assignment_member_record("g", "m", target)
    assert decode_target_assignment(rec.value) == {"a": [0], "b": [1, 3]}


@settings(max_examples=50, deadline=None)
@given(
    group=st.text(min_size=1, max_size=10),
    topic=st.text(min_size=1, max_size=10),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(-1, 2**63 - 1),
    epoch=st.integers(-1, 2**31 - 1),
    metadata=st.text(max_size=20),
)
def test_offset_round_trip_property(
    group: str, topic: str, partition: int, offset: int, epoch: int, metadata: str
) -> None:
    om = OffsetAndMetadata(offset, epoch, metadata, 1, "")
    rec = offset_commit_record(group, topic, partition, om)
    assert decode_key(rec.key) == RecordKey(
        RecordKind.OFFSET_COMMIT, group, topic=topic, partition=partition
    )
    assert decode_offset(rec.value) == om


def _group_records(gid: str) -> list[GroupRecord]:
    return [
        group_metadata_record(gid, META),
        member_metadata_record(gid, "m1", MEMBER),
        target_assignment_member_record(gid, "m1", {"a": [0, 2]}),
        target_assignment_metadata_record(gid, 7),
        current_assignment_record(gid, "m1", CURRENT),
        offset_commit_record(gid, "a", 0, OffsetAndMetadata(10)),
        offset_commit_record(gid, "a", 1, OffsetAndMetadata(20)),
    ]


def test_replay_rebuilds_groups_through_batches() -> None:
    shard = ShardState()
    buf = encode_group_batch(
        _group_records("g1"), producer_id=9, producer_epoch=2, base_sequence=0, now_ms=1
    ) + encode_group_batch(_group_records("g2"), producer_id=9, producer_epoch=3, now_ms=2)
    assert shard.apply_batches(buf) == 14
    assert set(shard.groups) == {"g1", "g2"}
    snap = shard.groups["g1"]
    assert snap == GroupSnapshot(
        group_id="g1",
        metadata=META,
        assignment_epoch=7,
        members={"m1": MEMBER},
        targets={"m1": {"a": [0, 2]}},
        current={"m1": CURRENT},
        offsets={("a", 0): OffsetAndMetadata(10), ("a", 1): OffsetAndMetadata(20)},
    )
    assert shard.producer_id == 9 and shard.producer_epoch == 3
    assert shard.next_offset == 7  # both batches were encoded at base offset 0
    assert shard.offsets("g1")[("a", 1)].offset == 20
    assert shard.offsets("nope") == {}


def test_replay_latest_wins_and_tombstones_delete() -> None:
    shard = ShardState()
    shard.apply_records(_group_records("g"))
    shard.apply_records(
        [
            offset_commit_record("g", "a", 0, OffsetAndMetadata(11)),
            offset_commit_record("g", "a", 0, OffsetAndMetadata(12, metadata="x")),
            offset_commit_tombstone("g", "a", 1),
            offset_commit_tombstone("g", "zzz", 9),  # deleting what is not there is fine
            group_metadata_record("g", GroupMetadata(8, {"a": 3}, "range", 5)),
            current_assignment_tombstone("g", "m1"),
            member_metadata_tombstone("g", "m1"),
        ]
    )
    snap = shard.groups["g"]
    assert snap.offsets == {("a", 0): OffsetAndMetadata(12, metadata="x")}
    assert snap.metadata == GroupMetadata(8, {"a": 3}, "range", 5)
    assert snap.members == {} and snap.current == {}
    assert snap.targets == {"m1": {"a": [0, 2]}}  # its own tombstone has not come yet
    # Deleting the group: tombstones, GroupMetadata last, drop everything.
    shard.apply(group_metadata_tombstone("g").key, None)
    assert "g" not in shard.groups
    # Tombstones for unknown groups do not create them.
    shard.apply(group_metadata_tombstone("ghost").key, None)
    shard.apply(offset_commit_tombstone("ghost", "a", 0).key, None)
    assert shard.groups == {}


def test_group_disappears_when_its_last_key_is_deleted() -> None:
    shard = ShardState()
    shard.apply_records([offset_commit_record("simple", "a", 0, OffsetAndMetadata(1))])
    assert shard.groups["simple"].metadata is None
    shard.apply_records([offset_commit_tombstone("simple", "a", 0)])
    assert "simple" not in shard.groups


def test_unknown_kinds_and_keyless_records_are_skipped() -> None:
    # A newer coordinator's record kind: an unknown oneof field number (here 15).
    future_key = bytes([0x7A, 0x03, 0x0A, 0x01, 0x67])
    assert decode_key(future_key) is None
    shard = ShardState()
    shard.apply(future_key, b"\x08\x01")
    shard.apply(None, b"junk")
    assert shard.groups == {} and shard.skipped == 2


def test_records_that_do_not_decode_are_skipped_and_counted() -> None:
    """Found from outside: a client's record in __consumer_offsets (key b"x") raised
    DecodeError on every load of its shard, whose groups then stayed unavailable for good.
    Such a record is skipped and counted; the records around it still apply, and a value
    that does not decode leaves no empty group behind."""
    shard = ShardState()
    buf = (
        encode_group_batch(_group_records("g1"), now_ms=1)
        + encode_batch([b"y"], keys=[b"x"], base_offset=7)
        + encode_batch([b"\xff"], keys=[offset_commit_key("ghost", "a", 0)], base_offset=8)
        + encode_batch([b"\xff"], keys=[offset_commit_key("g1", "a", 0)], base_offset=9)
        + encode_group_batch(_group_records("g2"), now_ms=2)
    )
    assert shard.apply_batches(buf) == 14
    assert set(shard.groups) == {"g1", "g2"}
    assert shard.groups["g1"].offsets[("a", 0)] == OffsetAndMetadata(10)  # the bad one skipped
    assert shard.undecodable == 3
    assert shard.first_undecodable is not None
    assert shard.first_undecodable.startswith("offset 7: DecodeError")


def test_control_batches_are_skipped_and_corruption_detected() -> None:
    shard = ShardState()
    control = encode_batch([b"\x00"], keys=[b"\x00"], control=True, producer_id=4, producer_epoch=1)
    assert shard.apply_batches(control) == 0
    assert shard.producer_id == 4 and shard.producer_epoch == 1
    good = bytearray(encode_group_batch(_group_records("g")))
    good[-1] ^= 0xFF
    with pytest.raises(InvalidBatchError):
        ShardState().apply_batches(bytes(good))


def test_encode_group_batch_needs_records() -> None:
    with pytest.raises(ValueError):
        encode_group_batch([])


def test_shard_for_group_uses_murmur2() -> None:
    from strom.client.partitioner import murmur2

    for gid in ("g", "billing", "ünïcode", ""):
        assert shard_for_group(gid, 50) == (murmur2(gid.encode()) & 0x7FFFFFFF) % 50
    assert {shard_for_group(f"group-{i}", 8) for i in range(100)} == set(range(8))
    with pytest.raises(ValueError):
        shard_for_group("g", 0)
