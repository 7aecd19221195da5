"""Idempotent producers in the partition log (DESIGN §5, §6): retries answered with their
original offsets, refusals appending nothing, followers keeping the state, and the state
surviving restarts (snapshots, header scans), truncation, retention and compaction."""

from __future__ import annotations

import pytest

from strom.log import Log, LogConfig, LogManager, ProducerStateError, compact
from strom.log.producer_state import list_snapshots, snapshot_path
from strom.record import decode_records, encode_batch
from tests.unit.test_log import T0, Clock, crash, make_log, read_all, values


def ibatch(
    pid: int, seq: int, n: int = 1, *, epoch: int = 0, tag: str = "r", keys: list | None = None
) -> bytes:
    """An idempotent producer's batch of ``n`` records starting at sequence ``seq``."""
    return encode_batch(
        [f"{tag}{seq + i}".encode() for i in range(n)],
        keys=keys,
        timestamps=[T0] * n,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def refused(log: Log, data: bytes) -> str:
    leo = log.log_end_offset
    with pytest.raises(ProducerStateError) as err:
        log.append(data, leader_epoch=log.latest_epoch() if log.latest_epoch() >= 0 else 0)
    assert log.log_end_offset == leo  # nothing appended
    return err.value.reason


def test_retry_of_an_appended_batch_returns_the_same_offsets(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(encode_batch([b"x", b"y"], timestamps=[T0] * 2))  # someone else's records first
    first = log.append(ibatch(1, 0, 3))
    second = log.append(ibatch(1, 3, 2))
    assert (first.first_offset, second.first_offset) == (2, 5)
    leo = log.log_end_offset
    retry = log.append(ibatch(1, 0, 3))
    assert (retry.first_offset, retry.last_offset, retry.duplicates) == (2, 4, 1)
    assert (retry.bytes, retry.record_count, retry.log_end_offset) == (0, 0, leo)
    assert log.append(ibatch(1, 3, 2)).first_offset == 5
    assert log.log_end_offset == leo
    assert values(read_all(log)) == [b"x", b"y", b"r0", b"r1", b"r2", b"r3", b"r4"]
    # A whole request retried (two batches) gets the first batch's offset.
    both = ibatch(1, 5, 1) + ibatch(1, 6, 2)
    assert log.append(both).first_offset == leo
    again = log.append(both)
    assert (again.first_offset, again.last_offset, again.duplicates) == (leo, leo + 2, 2)
    assert log.log_end_offset == leo + 3


def test_retried_batches_followed_by_new_ones(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(ibatch(1, 0, 2))
    info = log.append(ibatch(1, 0, 2) + ibatch(1, 2, 3))  # retry + the next batch
    assert (info.first_offset, info.last_offset, info.duplicates) == (0, 4, 1)
    assert info.record_count == 3 and log.log_end_offset == 5
    assert values(read_all(log)) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    # The retried batch is not at the end of the log any more: one base offset cannot
    # describe the answer, so the request is refused (the producer resends them apart).
    log.append(encode_batch([b"other"], timestamps=[T0]))
    assert refused(log, ibatch(1, 2, 3) + ibatch(1, 5, 1)) == "OUT_OF_ORDER_SEQUENCE"


def test_refusals_append_nothing(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(ibatch(1, 0, 2))
    assert refused(log, ibatch(1, 3)) == "OUT_OF_ORDER_SEQUENCE"
    assert refused(log, ibatch(2, 4)) == "UNKNOWN_PRODUCER_ID"
    # A good batch and a bad one in one request: neither is appended.
    assert (
        refused(log, encode_batch([b"ok"], timestamps=[T0]) + ibatch(1, 9))
        == "OUT_OF_ORDER_SEQUENCE"
    )
    log.append(ibatch(1, 0, epoch=1))
    assert refused(log, ibatch(1, 2)) == "INVALID_PRODUCER_EPOCH"
    assert values(read_all(log)) == [b"r0", b"r1", b"r0"]


def test_log_append_time_duplicates_report_the_original_time(tmp_path) -> None:
    clock = Clock()
    log = make_log(tmp_path / "t-0", clock, message_timestamp_type="LogAppendTime")
    first = log.append(ibatch(1, 0, 2))
    clock.now += 5000
    again = log.append(ibatch(1, 0, 2))
    assert first.log_append_time_ms == again.log_append_time_ms == T0


def test_clean_restart_loads_the_snapshot_without_scanning(tmp_path) -> None:
    mgr = LogManager(tmp_path, fsync=False, configs=lambda t: {"segment.bytes": "2048"})
    log = mgr.get_or_create("t", 0)
    for seq in range(40):
        log.append(ibatch(1, seq, tag="a"))
        log.append(ibatch(2, seq * 2, 2, tag="b"))
    assert len(log.segments) > 3
    assert len(list_snapshots(log.directory)) == 2  # one per roll; only the newest kept
    leo = log.log_end_offset
    mgr.close()
    assert list_snapshots(log.directory)[-1] == leo
    mgr2 = LogManager(tmp_path, fsync=False, configs=lambda t: {"segment.bytes": "2048"})
    log2 = mgr2.get("t", 0)
    assert log2 is not None and log2.producer_batches_scanned == 0
    assert log2.append(ibatch(1, 39, tag="a")).duplicates == 1
    assert log2.append(ibatch(2, 78, 2, tag="b")).first_offset == leo - 2
    assert log2.append(ibatch(1, 40, tag="a")).first_offset == leo
    mgr2.close()


def test_crash_recovery_rebuilds_the_state(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = make_log(d, segment_bytes=2048)
    offsets = {}
    for seq in range(30):
        offsets[seq] = log.append(ibatch(1, seq)).first_offset
    leo = log.log_end_offset
    crash(log)  # no close: no snapshot at the end, only the ones written on rolls
    log2 = make_log(d, segment_bytes=2048)
    assert log2.log_end_offset == leo
    # Only the batches after the newest roll snapshot were read.
    assert 0 < log2.producer_batches_scanned < 30
    for seq in range(25, 30):
        assert log2.append(ibatch(1, seq)).first_offset == offsets[seq]
    assert refused(log2, ibatch(1, 20)) == "DUPLICATE_SEQUENCE"
    crash(log2)
    # Without any snapshot (deleted, or a damaged one) the whole log is scanned.
    for off in list_snapshots(d)[:-1]:
        snapshot_path(d, off).unlink()
    snapshot_path(d, list_snapshots(d)[-1]).write_bytes(b"garbage")
    log3 = make_log(d, segment_bytes=2048)
    assert log3.producer_batches_scanned == 30 and not list_snapshots(d)
    assert log3.append(ibatch(1, 29)).first_offset == offsets[29]
    assert log3.append(ibatch(1, 30)).first_offset == leo


def test_truncation_rolls_the_state_back(tmp_path) -> None:
    log = make_log(tmp_path / "t-0", segment_bytes=1024)
    offsets = [log.append(ibatch(1, seq)).first_offset for seq in range(20)]
    assert len(list_snapshots(log.directory)) == 2
    log.truncate_to(offsets[12])  # batches 12.. are gone, and snapshots above the end
    assert all(o <= log.log_end_offset for o in list_snapshots(log.directory))
    assert log.producers.get(1).last_seq == 11  # type: ignore[union-attr]
    # The retry of batch 12 is new again and lands where it was; 11 is still a duplicate.
    assert log.append(ibatch(1, 12)).first_offset == offsets[12]
    assert log.append(ibatch(1, 11)).first_offset == offsets[11]
    assert log.append(ibatch(1, 13)).first_offset == offsets[13]
    log.truncate_fully_and_start_at(100)
    assert len(log.producers) == 0 and not list_snapshots(log.directory)
    assert refused(log, ibatch(1, 14)) == "UNKNOWN_PRODUCER_ID"


def test_followers_keep_the_state_and_deduplicate_as_new_leader(tmp_path) -> None:
    leader = make_log(tmp_path / "leader")
    follower = make_log(tmp_path / "follower")
    for seq in range(6):
        leader.append(ibatch(7, seq * 2, 2), leader_epoch=0)
    follower.append_as_follower(leader.read(0, 1 << 20).data)
    # The follower becomes leader (epoch 1); the producer retries its last batches there.
    leo = follower.log_end_offset
    assert follower.append(ibatch(7, 10, 2), leader_epoch=1).first_offset == 10
    assert follower.append(ibatch(7, 8, 2), leader_epoch=1).first_offset == 8
    assert follower.log_end_offset == leo
    assert follower.append(ibatch(7, 12, 2), leader_epoch=1).first_offset == leo


def test_retention_and_delete_records_forget_producers_below_the_start(tmp_path) -> None:
    clock = Clock()
    log = make_log(tmp_path / "t-0", clock, segment_bytes=1024)
    for seq in range(10):
        log.append(ibatch(1, seq))
    log.append(ibatch(2, 0))
    log.delete_records(log.log_end_offset - 1)  # producer 1's batches are all below
    assert log.producers.get(1) is None and log.producers.get(2) is not None
    assert refused(log, ibatch(1, 10)) == "UNKNOWN_PRODUCER_ID"
    assert log.append(ibatch(1, 0, epoch=1)).duplicates == 0  # bumped epoch: starts over
    # Expiry: idle for producer.id.expiration.ms (default one day).
    clock.now += LogConfig().producer_id_expiration_ms
    log.apply_retention()
    assert len(log.producers) == 0


def test_compaction_keeps_idempotent_batch_headers(tmp_path) -> None:
    """Emptied batches of different producers are not merged, so a rebuild after compaction
    still sees each producer's last sequence."""
    d = tmp_path / "t-0"
    log = make_log(d, cleanup_policy="compact")
    for seq in range(3):
        log.append(ibatch(1, seq, keys=[b"k"]))
        log.append(ibatch(2, seq, keys=[b"k"]))
    log.roll()
    log.append(encode_batch([b"latest"], keys=[b"k"], timestamps=[T0]))
    assert compact(log, now=T0 + 10**9).segments_cleaned == 1
    assert [r.value for r in decode_records(log.read(0).data)] == []
    log.close()
    for off in list_snapshots(d):
        snapshot_path(d, off).unlink()
    log2 = make_log(d, cleanup_policy="compact")
    assert log2.producer_batches_scanned == 7
    assert {e.producer_id: e.last_seq for e in log2.producers} == {1: 2, 2: 2}
    assert log2.append(ibatch(1, 3, keys=[b"k"])).duplicates == 0
