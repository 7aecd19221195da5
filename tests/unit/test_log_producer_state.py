"""Idempotent producers in the partition log (DESIGN §5, §6): retries answered with their
original offsets, refusals appending nothing, followers keeping the state, and the state
surviving restarts (snapshots, header scans), truncation, retention and compaction."""

from __future__ import annotations

import pytest

from strom.log import InvalidAppendError, Log, LogConfig, LogManager, ProducerStateError, compact
from strom.log.producer_state import list_snapshots, snapshot_path
from strom.record import InvalidBatchError, decode_records, encode_batch
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
    # An older batch than the rebuilt state keeps is found in the log by its header.
    older = log2.append(ibatch(1, 20))
    assert (older.first_offset, older.duplicates, older.bytes) == (offsets[20], 1, 0)
    assert log2.log_end_offset == leo
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


# -- a retry above a lowered max.message.bytes ---------------------------------------------
# Found from outside: a producer's batch appended just before its leader failed over, then
# retried after the topic's max.message.bytes was lowered, was refused MESSAGE_TOO_LARGE
# (the size was checked before the producer state) instead of being answered as the
# duplicate it is; the producer then failed records that were in the log.

_PAD = b"p" * 1000


def big(pid: int, seq: int, n: int, *, epoch: int = 0, transactional: bool = False) -> bytes:
    """An idempotent batch of ``n`` records of ~1 KB each (records ``r<seq>``...)."""
    return encode_batch(
        [f"r{seq + i}:".encode() + _PAD for i in range(n)],
        timestamps=[T0] * n,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=transactional,
    )


def lower_limit(log: Log, limit: int = 3000) -> None:
    """max.message.bytes lowered on the running log, as an alter of the topic does."""
    log.update_config(LogConfig.from_dict({"max.message.bytes": limit}))


def too_large(log: Log, data: bytes, **kwargs: object) -> InvalidBatchError:
    leo = log.log_end_offset
    with pytest.raises(InvalidBatchError) as err:
        log.append(data, **kwargs)  # type: ignore[arg-type]
    limit = log.config.max_message_bytes
    assert err.value.too_large and f"max.message.bytes={limit}" in str(err.value)
    assert log.log_end_offset == leo  # nothing appended
    return err.value


def test_a_remembered_batch_over_a_lowered_limit_is_answered_with_its_offsets(
    tmp_path,
) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(encode_batch([b"x"], timestamps=[T0]))
    first = log.append(big(1, 0, 6))  # ~6 KB, under the default limit
    second = log.append(big(1, 6, 2))
    leo = log.log_end_offset
    lower_limit(log)
    retry = log.append(big(1, 0, 6))  # its answer was lost; now over max.message.bytes
    assert (retry.first_offset, retry.last_offset, retry.duplicates) == (1, 6, 1)
    assert (retry.bytes, retry.record_count, log.log_end_offset) == (0, 0, leo)
    # A retried request of both, and one whose oversized repeat leads a new small batch.
    both = log.append(big(1, 0, 6) + big(1, 6, 2))
    assert (both.first_offset, both.last_offset, both.duplicates) == (1, 8, 2)
    info = log.append(big(1, 6, 2) + big(1, 8, 1))
    assert (info.first_offset, info.duplicates, info.record_count) == (7, 1, 1)
    assert (first.first_offset, second.first_offset) == (1, 7)
    assert log.log_end_offset == leo + 1


def test_batches_over_the_limit_that_repeat_nothing_are_still_refused_first(tmp_path) -> None:
    """Only an exact repeat skips the size check; any other batch over the limit is refused
    MESSAGE_TOO_LARGE before every other check, as before (a new batch, one out of
    sequence, one of another epoch, a non-idempotent one, one with a bad timestamp)."""
    log = make_log(tmp_path / "t-0", message_timestamp_after_max_ms=1000)
    log.append(big(1, 0, 6))
    lower_limit(log)
    too_large(log, big(1, 6, 6))  # new and in sequence
    too_large(log, big(1, 20, 6))  # a gap: still the size first
    too_large(log, big(1, 0, 5))  # overlaps the appended batch but repeats no batch
    too_large(log, big(1, 0, 6, epoch=1))  # the same range under another epoch
    too_large(log, big(2, 3, 6))  # an unknown producer
    too_large(log, encode_batch([_PAD * 4], timestamps=[T0]))  # not idempotent
    future = encode_batch([_PAD * 4], timestamps=[T0 + 10**9], producer_id=1, base_sequence=6)
    too_large(log, future, leader_epoch=0)
    # A repeat followed by a new batch over the limit: refused, naming the new one.
    repeat = big(1, 0, 6)
    err = too_large(log, repeat + big(1, 6, 6))
    assert err.position == len(repeat)
    assert log.append(big(1, 6, 2)).first_offset == 6  # the producer goes on in sequence


def test_checks_before_the_duplicate_answer_still_come_first(tmp_path) -> None:
    """A repeat over the limit still passes everything a repeat under it passes before it
    is answered: the leader epoch (a deposed leader answers nothing), the transactional
    checks, the structure and CRC, the producer's epoch (a batch of an epoch a newer one
    fenced is never a repeat)."""
    log = make_log(tmp_path / "t-0")
    log.append(big(1, 0, 6), leader_epoch=3)
    log.append(big(2, 0, 6, transactional=True), leader_epoch=3)
    lower_limit(log)
    with pytest.raises(InvalidAppendError, match="leader epoch 2 is older"):
        log.append(big(1, 0, 6), leader_epoch=2)
    with pytest.raises(ProducerStateError, match="transactional"):
        log.append(big(2, 0, 6, transactional=True), leader_epoch=3, transactional=False)
    damaged = bytearray(big(1, 0, 6))
    damaged[-1] ^= 1
    too_large(log, bytes(damaged), leader_epoch=3)  # the size refusal, as before
    assert log.append(big(2, 0, 6, transactional=True), leader_epoch=3).duplicates == 1
    # A newer epoch takes over: the old epoch's batch is no repeat (it is fenced), never
    # answered as written; refused for its size, as any batch that is not a repeat.
    log.append(ibatch(1, 0, epoch=1), leader_epoch=3)
    too_large(log, big(1, 0, 6), leader_epoch=3)
    assert refused(log, ibatch(1, 0)) == "INVALID_PRODUCER_EPOCH"


def test_halves_of_an_appended_batch_are_refused_and_append_nothing(tmp_path) -> None:
    """What the producer relies on when it splits a batch an earlier attempt may have
    written (strom.client.sender ``_split``): the halves keep its sequences, so if the
    whole batch is in the log no half repeats a remembered batch, the first is refused
    OUT_OF_ORDER_SEQUENCE (the second too, sent alone), and nothing is written twice. Had
    it not been written, the halves append in sequence."""
    log = make_log(tmp_path / "t-0")
    log.append(big(1, 0, 2))
    log.append(big(1, 2, 6))  # the whole batch, appended before the limit was lowered
    leo = log.log_end_offset
    lower_limit(log, 4000)
    assert refused(log, big(1, 2, 3) + big(1, 5, 3)) == "OUT_OF_ORDER_SEQUENCE"
    assert refused(log, big(1, 2, 3)) == "OUT_OF_ORDER_SEQUENCE"
    assert refused(log, big(1, 5, 3)) == "OUT_OF_ORDER_SEQUENCE"
    assert log.log_end_offset == leo
    assert len(read_all(log)) == 8
    # Not written: the halves of a batch over the limit append, in sequence.
    fresh = make_log(tmp_path / "u-0")
    fresh.append(big(1, 0, 2))
    lower_limit(fresh, 4000)
    too_large(fresh, big(1, 2, 6))
    assert fresh.append(big(1, 2, 3)).first_offset == 2
    assert fresh.append(big(1, 5, 3)).first_offset == 5
    assert [r.value.split(b":")[0] for r in read_all(fresh)] == [f"r{i}".encode() for i in range(8)]


def test_halves_of_a_batch_older_than_every_kept_one_are_duplicates(tmp_path) -> None:
    """The state keeps the last 5 batches; a half of an older appended batch lies wholly
    before them and is answered DUPLICATE_SEQUENCE (written, offsets forgotten), never
    appended again."""
    log = make_log(tmp_path / "t-0")
    log.append(big(1, 0, 6))
    for seq in range(6, 11):
        log.append(ibatch(1, seq))
    leo = log.log_end_offset
    lower_limit(log, 4000)
    too_large(log, big(1, 0, 6))  # not remembered any more: the size comes first
    assert refused(log, big(1, 0, 3)) == "DUPLICATE_SEQUENCE"
    assert refused(log, big(1, 3, 3)) == "DUPLICATE_SEQUENCE"
    assert log.log_end_offset == leo


# -- retries of batches older than every kept one: found in the log by their headers --------


def test_a_retry_older_than_the_kept_batches_gets_its_offsets_from_the_log(tmp_path) -> None:
    """Found from outside: after a failover, acknowledged records reported offset -1 (a
    retry of a batch older than the producer's last 5 was answered DUPLICATE_SEQUENCE, no
    offsets). The leader now finds the batch by its header: the retry gets its offsets, with
    other producers' records between the batches and across segments."""
    log = make_log(tmp_path / "t-0", segment_bytes=1024, message_timestamp_type="LogAppendTime")
    clock = log.clock
    placed = {}
    for i in range(20):  # batch i: sequences 2i..2i+1, then someone else's record
        clock.now = T0 + i
        placed[i] = log.append(ibatch(1, 2 * i, 2)).first_offset
        log.append(encode_batch([b"other"], timestamps=[T0]))
    assert len(log.segments) > 3
    leo = log.log_end_offset
    retry = log.append(ibatch(1, 6, 2))  # batch 3, exactly
    assert (retry.first_offset, retry.last_offset) == (placed[3], placed[3] + 1)
    assert (retry.duplicates, retry.bytes, retry.log_end_offset) == (1, 0, leo)
    assert retry.log_append_time_ms == T0 + 3  # its own append time, as for a kept one
    # A whole request of older batches, consecutive in the log: the first one's offset.
    contiguous = make_log(tmp_path / "u-0")
    for i in range(20):
        contiguous.append(ibatch(1, i))
    again = contiguous.append(ibatch(1, 3) + ibatch(1, 4) + ibatch(1, 5))
    assert (again.first_offset, again.last_offset, again.duplicates) == (3, 5, 3)
    assert contiguous.log_end_offset == 20
    # After a crash the rebuilt state (snapshot + headers) finds it the same way.
    crash(log)
    rebuilt = make_log(tmp_path / "t-0", segment_bytes=1024)
    assert rebuilt.append(ibatch(1, 6, 2)).first_offset == placed[3]
    assert rebuilt.log_end_offset == leo


def test_older_retries_matching_no_batch_are_answered_without_offsets(tmp_path) -> None:
    """Only a batch with exactly the retried sequence range counts: half of an appended
    batch (a split) stays DUPLICATE_SEQUENCE (written, offsets unknown), as before, and
    nothing is appended. Older batches with others' records between them can not share one
    base offset: DUPLICATE_SEQUENCE too, never a wrong offset."""
    log = make_log(tmp_path / "t-0")
    for i in range(20):
        log.append(ibatch(1, 2 * i, 2))
        log.append(encode_batch([b"other"], timestamps=[T0]))
    leo = log.log_end_offset
    assert refused(log, ibatch(1, 6, 1)) == "DUPLICATE_SEQUENCE"  # first half of batch 3
    assert refused(log, ibatch(1, 7, 1)) == "DUPLICATE_SEQUENCE"  # its second half
    assert refused(log, ibatch(1, 6, 4)) == "DUPLICATE_SEQUENCE"  # batches 3 and 4 as one
    assert refused(log, ibatch(1, 6, 2) + ibatch(1, 8, 2)) == "DUPLICATE_SEQUENCE"
    assert refused(log, ibatch(1, 6, 2, epoch=1)) == "OUT_OF_ORDER_SEQUENCE"  # new epoch
    # An unfound older batch with a new one after it: DUPLICATE_SEQUENCE ("written") would
    # answer for the new batch too, which is not appended; refused as out of order instead.
    assert refused(log, ibatch(1, 7, 1) + ibatch(1, 40, 2)) == "OUT_OF_ORDER_SEQUENCE"
    assert log.log_end_offset == leo
    assert log.append(ibatch(1, 40, 2)).first_offset == leo  # alone, the new batch goes in


@pytest.mark.parametrize("segment_bytes", [1 << 30, 2048])
def test_the_search_for_an_older_batch_is_bounded(tmp_path, monkeypatch, segment_bytes) -> None:
    """A retry can not make the leader walk the whole log: a batch further back than the
    walk's bounds (offsets before where it would lie, headers, bytes) is answered
    DUPLICATE_SEQUENCE without offsets, as before; within them it is found (in one segment,
    and across several)."""
    from strom.log import duplicate_lookup

    def others(n: int) -> None:
        for _ in range(n):
            log.append(encode_batch([b"other"], timestamps=[T0]))

    log = make_log(tmp_path / "t-0", index_interval_bytes=1, segment_bytes=segment_bytes)
    others(30)
    log.append(ibatch(1, 0))  # offset 30
    others(50)
    for seq in range(1, 7):  # at 81..86; 1 is older than the kept 2..6
        log.append(ibatch(1, seq))
    # Were its producer's records contiguous, batch 0 would start at 82 - 2 = 80: it lies
    # 50 offsets before that, batch 1 exactly there.
    assert log.append(ibatch(1, 0)).first_offset == 30
    assert log.append(ibatch(1, 1)).first_offset == 81
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_OFFSETS", 49)
    assert refused(log, ibatch(1, 0)) == "DUPLICATE_SEQUENCE"  # one offset too far back
    assert log.append(ibatch(1, 1)).first_offset == 81
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_OFFSETS", 50)
    assert log.append(ibatch(1, 0)).first_offset == 30
    # The walk starts at offset 30 now; from offset 0 it passes 30 others' headers first.
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_OFFSETS", 100)
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_HEADERS", 30)
    assert refused(log, ibatch(1, 0)) == "DUPLICATE_SEQUENCE"
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_HEADERS", 31)
    assert log.append(ibatch(1, 0)).first_offset == 30
    # The byte bound keeps the part of the log nearest offset 80 (the walk starts where the
    # offset index says that many bytes lie before it): batch 0 starts `span` bytes before.
    span = sum(h.size for h in log.batch_headers() if 30 <= h.base_offset < 80)
    assert (len(log.segments) > 3) == (segment_bytes == 2048)
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_BYTES", span - 1)
    assert refused(log, ibatch(1, 0)) == "DUPLICATE_SEQUENCE"
    monkeypatch.setattr(duplicate_lookup, "OLDER_BATCH_SEARCH_BYTES", span)
    assert log.append(ibatch(1, 0)).first_offset == 30
    assert log.log_end_offset == 87
