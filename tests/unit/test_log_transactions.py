"""Transactions in the partition log (issue 12; DESIGN §6 "Transactions"): open transactions
hold the last stable offset back, markers close them, aborted ranges are indexed for
read_committed, and all of it survives restarts, crashes, replication, truncation and
retention, because it is rebuilt from the batches themselves."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest

from strom.log import Log, ProducerStateError
from strom.log.producer_state import (
    _SNAP_BATCH,
    _SNAP_CRC,
    _SNAP_HEAD,
    _SNAP_MAGIC,
    _SNAP_PRODUCER_V1,
    _SNAP_PRODUCER_V2,
    ProducerStateManager,
    list_snapshots,
    snapshot_path,
)
from strom.log.transactions import decode_marker, encode_marker
from strom.record import decode_batches, encode_batch
from tests.unit.test_log import T0, Clock, crash, make_log, read_all


def tbatch(
    pid: int, seq: int, n: int = 1, *, epoch: int = 0, txn: bool = True, ts: int = T0
) -> bytes:
    """A (transactional) producer's batch of ``n`` records at sequence ``seq``."""
    return encode_batch(
        [f"p{pid}-{seq + i}".encode() for i in range(n)],
        timestamps=[ts] * n,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
    )


def lso(log: Log) -> int:
    return log.last_stable_offset(log.log_end_offset)


def aborted(log: Log) -> list[tuple[int, int, int]]:
    return [(e.producer_id, e.first_offset, e.last_offset) for e in log.aborted.entries]


def test_markers_round_trip_and_are_control_batches() -> None:
    data = encode_marker(7, 3, committed=False, coordinator_epoch=12)
    (b,) = decode_batches(data)
    h = b.header
    assert h.is_control and h.is_transactional and (h.producer_id, h.producer_epoch) == (7, 3)
    assert h.base_sequence == -1
    m = decode_marker(data)
    assert (m.committed, m.coordinator_epoch) == (False, 12)
    assert decode_marker(encode_marker(7, 3, committed=True, coordinator_epoch=1)).committed


def test_an_open_transaction_holds_the_lso_until_its_marker(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(encode_batch([b"plain"], timestamps=[T0]))  # offset 0, no transaction
    first = log.append(tbatch(1, 0, 2)).first_offset  # 1..2
    log.append(tbatch(2, 0, 1))  # 3: a second producer's transaction
    log.append(tbatch(1, 2, 1))  # 4: still producer 1's first transaction
    assert first == 1 and lso(log) == 1
    assert log.producers.ongoing == {1: 1, 2: 3}
    commit = log.append_marker(1, 0, committed=True, coordinator_epoch=0)
    assert commit.first_offset == 5 and lso(log) == 3  # producer 2's is still open
    log.append_marker(2, 0, committed=False, coordinator_epoch=0)  # 6
    assert lso(log) == log.log_end_offset == 7
    assert aborted(log) == [(2, 3, 6)]
    # The LSO never passes the high watermark.
    assert log.last_stable_offset(4) == 4
    # A new transaction of producer 1 continues its sequence and opens at its first batch.
    assert log.append(tbatch(1, 3, 1)).first_offset == 7 and lso(log) == 7


def test_the_lso_never_falls_below_the_log_start(tmp_path) -> None:
    """Found from outside: a transaction open at offset 0, five plain records, then
    DeleteRecords up to 3: the LSO stayed at 0, below the log start, so ListOffsets(latest,
    read_committed) answered 0 while earliest was 3, and a read_committed consumer at
    "latest" looped out of range. The LSO counts from the log start, as in Kafka."""
    log = make_log(tmp_path / "t-0")
    log.append(tbatch(1, 0, 1))  # 0: the transaction's first record
    for i in range(5):
        log.append(encode_batch([b"plain%d" % i], timestamps=[T0]))  # 1..5
    assert lso(log) == 0
    assert log.delete_records(3) == 3
    assert lso(log) == 3  # the transaction is still open: no further than the log start
    assert log.last_stable_offset(2) == 2  # and never above the high watermark
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)
    assert lso(log) == log.log_end_offset == 7


def test_aborted_transactions_for_a_fetch_range(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(tbatch(1, 0, 3))  # 0..2
    log.append(tbatch(2, 0, 1))  # 3
    log.append_marker(1, 0, committed=False, coordinator_epoch=0)  # 4
    log.append(tbatch(2, 1, 1))  # 5
    log.append_marker(2, 0, committed=False, coordinator_epoch=0)  # 6
    log.append(tbatch(1, 3, 1))  # 7
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)  # 8
    assert aborted(log) == [(1, 0, 4), (2, 3, 6)]

    def hits(start: int, end: int) -> list[tuple[int, int]]:
        return [(a.producer_id, a.first_offset) for a in log.aborted_transactions(start, end)]

    assert hits(0, 9) == [(1, 0), (2, 3)]  # by first offset
    assert hits(5, 9) == [(2, 3)]  # producer 1's abort ended at 4
    assert hits(0, 3) == [(1, 0)]  # producer 2's began at 3
    assert hits(7, 9) == []


def test_producers_cannot_write_markers_and_transactions_need_idempotence(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    with pytest.raises(ProducerStateError) as err:
        log.append(encode_marker(1, 0, committed=True, coordinator_epoch=0, now_ms=T0))
    assert err.value.reason == "INVALID_RECORD" and "control batch" in err.value.message
    with pytest.raises(ProducerStateError) as err:
        log.append(encode_batch([b"x"], timestamps=[T0], transactional=True))
    assert err.value.reason == "INVALID_RECORD" and "idempotent" in err.value.message
    assert log.log_end_offset == 0


def test_a_marker_with_a_bumped_epoch_fences_the_old_producer(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(tbatch(1, 0, 2))
    # The coordinator aborted on timeout with epoch 1: the zombie's epoch 0 is refused.
    log.append_marker(1, 1, committed=False, coordinator_epoch=0)
    with pytest.raises(ProducerStateError) as err:
        log.append(tbatch(1, 2, 1))
    assert err.value.reason == "INVALID_PRODUCER_EPOCH"
    # ... and so is a marker of an older epoch.
    with pytest.raises(ProducerStateError):
        log.append_marker(1, 0, committed=True, coordinator_epoch=0)
    # The new instance (epoch 1) starts its sequence at 0.
    assert log.append(tbatch(1, 0, 1, epoch=1)).first_offset == 3


def test_a_marker_from_an_older_coordinator_epoch_is_fenced(tmp_path) -> None:
    """A coordinator that lost the shard (a zombie) must not decide a transaction the new
    owner decides: once a marker of coordinator epoch 3 is in, epoch 2's are refused, here,
    after a restart (snapshot or full scan) and on a follower that becomes leader."""
    d = tmp_path / "t-0"
    log = make_log(d)
    log.append(tbatch(1, 0, 2))
    log.append_marker(1, 0, committed=False, coordinator_epoch=3)
    log.append(tbatch(1, 2, 1))  # the next transaction of the same producer
    end = log.log_end_offset

    def refused(target: Log) -> None:
        with pytest.raises(ProducerStateError) as err:
            target.append_marker(1, 0, committed=True, coordinator_epoch=2)
        assert err.value.reason == "TRANSACTION_COORDINATOR_FENCED"
        assert target.log_end_offset == end  # nothing appended
        assert lso(target) == 3  # the open transaction stays open

    refused(log)
    follower = make_log(tmp_path / "follower")
    follower.append_as_follower(log.read(0, 1 << 20).data)
    refused(follower)
    log.close()
    refused(reopened := make_log(d))
    assert reopened.producer_batches_scanned == 0  # the snapshot carried the epoch
    crash(reopened)
    for off in list_snapshots(d):
        snapshot_path(d, off).unlink()
    refused(scanned := make_log(d))
    assert scanned.producer_batches_scanned > 0
    # The same or a newer coordinator epoch decides it.
    scanned.append_marker(1, 0, committed=True, coordinator_epoch=3)
    assert lso(scanned) == scanned.log_end_offset


def test_open_transactions_and_aborts_survive_clean_restarts_and_crashes(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = make_log(d, segment_bytes=1024)
    for i in range(10):  # aborted transactions spread over several segments
        log.append(tbatch(1, i * 2, 2))
        log.append_marker(1, 0, committed=i % 2 == 0, coordinator_epoch=0)
    log.append(tbatch(2, 0, 1))  # left open
    open_at = log.log_end_offset - 1
    expected = aborted(log)
    assert len(expected) == 5 and len(log.segments) > 2 and lso(log) == open_at
    log.close()
    clean = make_log(d, segment_bytes=1024)
    assert clean.producer_batches_scanned == 0  # from the snapshot (version 3)
    assert aborted(clean) == expected and lso(clean) == open_at
    clean.append(tbatch(2, 1, 1))
    crash(clean)
    # A crash: the newest snapshot predates the last batches; without any snapshot at all the
    # whole log is scanned and the index rebuilt from the markers themselves.
    for off in list_snapshots(d):
        snapshot_path(d, off).unlink()
    (d / "aborted-transactions").unlink()
    scanned = make_log(d, segment_bytes=1024)
    assert scanned.producer_batches_scanned > 20
    assert aborted(scanned) == expected and lso(scanned) == open_at
    scanned.append_marker(2, 0, committed=False, coordinator_epoch=0)
    assert aborted(scanned)[-1] == (2, open_at, scanned.log_end_offset - 1)


def test_followers_reach_the_same_state_from_the_leaders_bytes(tmp_path) -> None:
    leader = make_log(tmp_path / "leader")
    follower = make_log(tmp_path / "follower")
    leader.append(tbatch(1, 0, 2), leader_epoch=0)
    leader.append(tbatch(2, 0, 2), leader_epoch=0)
    leader.append_marker(1, 0, committed=False, coordinator_epoch=0, leader_epoch=0)
    follower.append_as_follower(leader.read(0, 1 << 20).data)
    assert aborted(follower) == aborted(leader) == [(1, 0, 4)]
    assert lso(follower) == lso(leader) == 2
    # As the new leader it closes the open transaction like the old one would have.
    follower.append_marker(2, 0, committed=True, coordinator_epoch=0, leader_epoch=1)
    assert lso(follower) == follower.log_end_offset


def test_truncation_reopens_a_transaction_whose_marker_was_cut(tmp_path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append(tbatch(1, 0, 2))  # 0..1
    marker = log.append_marker(1, 0, committed=False, coordinator_epoch=0).first_offset  # 2
    assert aborted(log) == [(1, 0, 2)] and lso(log) == 3
    log.truncate_to(marker)
    assert aborted(log) == [] and lso(log) == 0 and log.producers.ongoing == {1: 0}
    assert (tmp_path / "t-0" / "aborted-transactions").read_bytes() == b""


def test_retention_forgets_aborts_whose_data_is_gone(tmp_path) -> None:
    clock = Clock()
    log = make_log(tmp_path / "t-0", clock, segment_bytes=1024, retention_ms=1000)
    for i in range(8):
        if i == 4:  # the second half is written 10 s later, in newer segments
            clock.now += 10_000
            log.roll()
        log.append(tbatch(1, i * 2, 2, ts=clock.now))
        log.append_marker(1, 0, committed=False, coordinator_epoch=0)
    assert len(log.aborted) == 8
    clock.now += 500  # the first half is past retention.ms, the second is not
    assert log.apply_retention() > 0
    assert [e.last_offset for e in log.aborted.entries] == [14, 17, 20, 23]
    assert log.log_start_offset <= 12
    reopened = make_log(tmp_path / "t-0", clock, segment_bytes=1024, retention_ms=1000)
    assert [e.last_offset for e in reopened.aborted.entries] == [14, 17, 20, 23]


def test_version_2_snapshots_still_load() -> None:
    body = _SNAP_HEAD.pack(_SNAP_MAGIC, 2, 0, 10, 1) + _SNAP_PRODUCER_V2.pack(5, 2, 0, T0, 7)
    offset, state = ProducerStateManager.from_bytes(body + _SNAP_CRC.pack(crc32c.crc32c(body)))
    entry = state.get(5)
    assert offset == 10 and entry is not None and entry.txn_first_offset == 7
    assert entry.coordinator_epoch == -1 and state.first_unstable_offset == 7


def test_version_1_snapshots_still_load() -> None:
    body = _SNAP_HEAD.pack(_SNAP_MAGIC, 1, 0, 10, 1) + _SNAP_PRODUCER_V1.pack(5, 2, 1, T0)
    body += _SNAP_BATCH.pack(0, 3, 6, 9, T0)
    offset, state = ProducerStateManager.from_bytes(body + _SNAP_CRC.pack(crc32c.crc32c(body)))
    entry = state.get(5)
    assert offset == 10 and entry is not None and entry.epoch == 2
    assert entry.last_seq == 3 and entry.txn_first_offset == -1
    assert state.first_unstable_offset is None


def test_compaction_drops_aborted_records_and_keeps_markers(tmp_path) -> None:
    """Compaction (cleanup.policy=compact) with transactions: records of aborted
    transactions go (they were never visible), markers stay whole, and a restart rebuilds
    the same transactions from the cleaned log; nothing above the LSO is cleaned."""
    from strom.log import compact

    clock = Clock()
    d = tmp_path / "t-0"
    log = make_log(d, clock, segment_bytes=1024, cleanup_policy="compact")

    def kb(pid: int, seq: int, key: bytes, value: bytes) -> bytes:
        return encode_batch(
            [value],
            keys=[key],
            timestamps=[T0],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=seq,
            transactional=True,
        )

    log.append(kb(1, 0, b"a", b"a-committed"))  # 0
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)  # 1
    log.append(kb(1, 1, b"a", b"a-aborted"))  # 2: would be a's latest value, but aborted
    log.append(kb(1, 2, b"b", b"b-aborted"))  # 3
    log.append_marker(1, 0, committed=False, coordinator_epoch=0)  # 4
    log.append(kb(2, 0, b"c", b"c-open"))  # 5: open transaction, above the LSO
    log.roll()
    log.append(encode_batch([b"x"], keys=[b"z"], timestamps=[T0]))  # active segment
    assert lso(log) == 5
    compact(log, max_offset=lso(log))
    kept = {
        (b.header.base_offset, r.key, r.value)
        for s in log.segments
        for b in decode_batches(os.pread(s.fd, s.size, 0))
        if not b.header.is_control
        for r in b.records()
    }
    assert (0, b"a", b"a-committed") in kept  # the aborted later value does not replace it
    assert not {v for _, _, v in kept} & {b"a-aborted", b"b-aborted"}
    assert (5, b"c", b"c-open") in kept  # above the LSO: untouched
    markers = [h.base_offset for h in log.batch_headers() if h.is_control]
    assert markers == [1, 4]
    log.close()
    again = make_log(d, clock, segment_bytes=1024, cleanup_policy="compact")
    assert aborted(again) == [(1, 2, 4)] and lso(again) == 5


def test_compaction_removes_markers_of_emptied_transactions_after_delete_retention(
    tmp_path,
) -> None:
    """Kafka's rule for markers: once every record of a transaction is compacted away and the
    marker is older than delete.retention.ms, the marker goes too (with its transaction's
    emptied headers). A marker stays while its transaction still has a live record, while it
    is young, and when it is the producer's last one; a rebuild from the cleaned log finds no
    open transaction and the producer carries on."""
    from strom.log import compact

    clock = Clock()
    d = tmp_path / "t-0"
    cfg = {"segment_bytes": 1 << 20, "cleanup_policy": "compact", "delete_retention_ms": 1000}
    log = make_log(d, clock, **cfg)
    seq = 0

    def txn(key: bytes, value: bytes, committed: bool = True) -> None:
        nonlocal seq
        log.append(
            encode_batch(
                [value],
                keys=[key],
                timestamps=[clock.now],
                producer_id=1,
                producer_epoch=0,
                base_sequence=seq,
                transactional=True,
            )
        )
        seq += 1

    txn(b"a", b"a0")  # 0
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)  # 1: a0 is superseded
    txn(b"b", b"b-aborted")  # 2
    log.append_marker(1, 0, committed=False, coordinator_epoch=0)  # 3: aborted
    txn(b"live", b"L")  # 4
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)  # 5: L stays
    for i in range(5):  # 6..10: the producer's last five batches, one transaction
        txn(b"a", b"a%d" % (i + 1))
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)  # 11: the last marker
    log.roll()
    log.append(encode_batch([b"x"], keys=[b"z"], timestamps=[clock.now]))

    def markers() -> list[int]:
        return [h.base_offset for h in log.batch_headers() if h.is_control]

    compact(log, max_offset=lso(log))
    assert markers() == [1, 3, 5, 11]  # younger than delete.retention.ms: all stay
    clock.now += 1001
    compact(log, max_offset=lso(log))
    assert markers() == [5, 11]
    headers = list(log.batch_headers())
    assert headers[0].base_offset == 0 and headers[0].last_offset == 3  # one plain empty batch
    assert headers[0].producer_id == -1 and not headers[0].is_transactional
    kept = [(r.offset, r.key) for r in read_all(log) if r.offset not in markers()]
    assert kept == [(4, b"live"), (10, b"a"), (12, b"z")]
    assert lso(log) == log.log_end_offset
    crash(log)
    for off in list_snapshots(d):
        snapshot_path(d, off).unlink()
    rebuilt = make_log(d, clock, **cfg)
    assert lso(rebuilt) == rebuilt.log_end_offset and rebuilt.producers.ongoing == {}
    # The abort was rebuilt from markers: its marker is gone with its records, so is it.
    assert aborted(rebuilt) == []
    log = rebuilt
    txn(b"c", b"c0")  # the producer's sequence carries on after the rebuild
    assert lso(log) == log.log_end_offset - 1


def test_an_aborted_index_without_aborts_writes_no_file(tmp_path: Path) -> None:
    """A new partition's log writes no empty abort index (a missing file loads as empty);
    one abort is written, and saving an emptied index keeps the file consistent."""
    from strom.log.transactions import AbortedIndex, AbortedTxn

    idx = AbortedIndex(tmp_path)
    idx.save()
    assert not idx.path.exists()
    idx.add(AbortedTxn(10, 7, 3))
    again = AbortedIndex(tmp_path)
    again.load(below=100)
    assert again.entries == [AbortedTxn(10, 7, 3)]
    again.entries = []
    again.save()  # the file exists: rewritten empty, not left stale
    third = AbortedIndex(tmp_path)
    third.load(below=100)
    assert third.entries == []


def _many_aborts(log: Log, clock: Clock, n: int) -> None:
    """``n`` aborted transactions of one producer over five keys, one committed value of
    key k0, then a roll so that all of it is sealed."""
    for i in range(n):
        log.append(
            encode_batch(
                [b"aborted %d" % i],
                keys=[b"k%d" % (i % 5)],
                timestamps=[clock.now],
                producer_id=1,
                producer_epoch=0,
                base_sequence=i,
                transactional=True,
            )
        )
        log.append_marker(1, 0, committed=False, coordinator_epoch=0)
    log.append(
        encode_batch(
            [b"committed"],
            keys=[b"k0"],
            timestamps=[clock.now],
            producer_id=1,
            producer_epoch=0,
            base_sequence=n,
            transactional=True,
        )
    )
    log.append_marker(1, 0, committed=True, coordinator_epoch=0)
    log.roll()
    log.append(encode_batch([b"x"], keys=[b"z"], timestamps=[clock.now]))


def _committed_view(log: Log) -> list[tuple[int, bytes | None]]:
    """What a read_committed consumer keeps of the log: records not in an aborted range."""
    spans = [(e.producer_id, e.first_offset, e.last_offset) for e in log.aborted.entries]
    out = []
    for b in decode_batches(log.read(0, 1 << 24).data):
        h = b.header
        if h.is_control or any(
            pid == h.producer_id and first <= h.base_offset < last for pid, first, last in spans
        ):
            continue
        out += [(r.offset, r.value) for r in b.records()]
    return out


def test_the_cleaner_prunes_aborts_whose_markers_it_removed(tmp_path: Path) -> None:
    """Found from outside: on a compacted topic (its log start never moves) every abort's
    entry stayed in the aborted-transactions index for good, although the cleaner removed
    the transaction's records and marker: loaded at every start, listed to every
    read_committed fetch from an early offset. Now an entry goes with its marker, the file
    too, and read_committed answers stay the same."""
    from strom.log import compact

    clock = Clock()
    d = tmp_path / "t-0"
    cfg = {"segment_bytes": 4096, "cleanup_policy": "compact", "delete_retention_ms": 1000}
    log = make_log(d, clock, **cfg)
    _many_aborts(log, clock, 60)
    assert len(log.aborted) == 60
    before = _committed_view(log)
    fetch_before = log.aborted_transactions(0, log.log_end_offset)
    assert len(fetch_before) == 60
    clock.now += 1001
    stats = compact(log, max_offset=lso(log))
    markers = {h.base_offset for h in log.batch_headers() if h.is_control}
    # Only the aborts whose markers stay (the producer's last batches need them) are left.
    assert 0 < len(log.aborted) < 6 and stats.aborted_pruned == 60 - len(log.aborted)
    assert {e.last_offset for e in log.aborted.entries} <= markers
    assert _committed_view(log) == before
    assert (d / "aborted-transactions").stat().st_size == 24 * len(log.aborted)
    kept = aborted(log)
    log.close()
    again = make_log(d, clock, **cfg)
    assert aborted(again) == kept and _committed_view(again) == before
    crash(again)
    for off in list_snapshots(d):
        snapshot_path(d, off).unlink()
    rebuilt = make_log(d, clock, **cfg)  # the index rebuilt from the markers agrees
    assert aborted(rebuilt) == kept and _committed_view(rebuilt) == before


def test_a_crash_between_the_swap_and_the_index_rewrite_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segments are swapped in before the index is pruned: a crash in between leaves
    entries whose batches are empty (the same read_committed answers), a crash while the
    index file is rewritten leaves the old file whole (its temporary file is removed at
    start), and the next pass prunes."""
    from strom.log import compact
    from strom.log.transactions import AbortedIndex

    clock = Clock()
    d = tmp_path / "t-0"
    cfg = {"segment_bytes": 4096, "cleanup_policy": "compact", "delete_retention_ms": 1000}
    log = make_log(d, clock, **cfg)
    _many_aborts(log, clock, 40)
    before = _committed_view(log)
    clock.now += 1001

    class Killed(BaseException):
        """The process dying between the two steps."""

    def killed(*args: object, **kwargs: object) -> int:
        (d / "aborted-transactions.tmp").write_bytes(b"\x01" * 30)  # a torn rewrite
        raise Killed

    monkeypatch.setattr(AbortedIndex, "prune", killed)
    with pytest.raises(Killed):
        compact(log, max_offset=lso(log))
    monkeypatch.undo()
    assert not [h for h in log.batch_headers() if h.is_control][:-5]  # the swap happened
    crash(log)
    reopened = make_log(d, clock, **cfg)
    assert not (d / "aborted-transactions.tmp").exists()
    assert len(reopened.aborted) == 40  # stale, harmless
    assert _committed_view(reopened) == before
    reopened.first_dirty_offset = reopened.log_start_offset  # as the next due pass
    compact(reopened, max_offset=lso(reopened))
    assert len(reopened.aborted) < 6 and _committed_view(reopened) == before
    markers = {h.base_offset for h in reopened.batch_headers() if h.is_control}
    assert {e.last_offset for e in reopened.aborted.entries} <= markers


def test_fetch_range_lookups_look_only_near_the_range() -> None:
    """``overlapping`` is bounded by the longest transaction's span: a long transaction
    still overlaps a range it began in, and the answers match a full scan."""
    from strom.log.transactions import AbortedIndex, AbortedTxn

    idx = AbortedIndex(Path("/nonexistent"))
    txns = [AbortedTxn(i * 10 + 2, 1, i * 10) for i in range(1000)]
    txns.append(AbortedTxn(5_003, 2, 4_000))  # long: began at 4,000
    idx.entries = txns

    def full(start: int, end: int) -> list[AbortedTxn]:
        hits = [e for e in idx.entries if e.last_offset >= start and e.first_offset < end]
        return sorted(hits, key=lambda e: e.first_offset)

    for start, end in [(0, 5), (3, 25), (4_000, 4_001), (3_990, 4_010), (5_002, 5_010), (0, 1)]:
        assert idx.overlapping(start, end) == full(start, end), (start, end)
    assert AbortedTxn(5_003, 2, 4_000) in idx.overlapping(4_000, 4_001)


def test_a_rebuild_from_the_batches_keeps_each_producers_last_batch_time(tmp_path: Path) -> None:
    """Found from outside: after a SIGKILL (no snapshot of the last batches) a producer's
    reported last timestamp became the restart's time, so a hanging transaction looked
    fresh to `strom transactions find-hanging`. It is the last batch's max timestamp
    (Kafka's lastTimestamp), the same from a snapshot, a rebuild from the log and a
    follower; expiry still counts on the node's clock (a backfill's old timestamps must
    not expire an active producer)."""
    clock = Clock(T0 + 3_600_000)
    d = tmp_path / "t-0"
    log = make_log(d, clock)
    log.append(tbatch(1, 0, ts=T0))  # an open transaction written an hour "ago"
    log.append(tbatch(2, 0, ts=T0 + 5))
    clock.now += 10
    log.append_marker(2, 0, committed=True, coordinator_epoch=0)  # stamped by the clock
    want = {1: T0, 2: T0 + 3_600_010}

    def times(lg: Log) -> dict[int, int]:
        return {e.producer_id: e.last_timestamp_ms for e in lg.producers}

    assert times(log) == want
    follower = make_log(tmp_path / "f-0", Clock(T0 + 7_200_000))
    follower.append_as_follower(log.read(0, 1 << 20).data)
    assert times(follower) == want
    crash(log)
    assert list_snapshots(d) == []
    clock.now += 60_000
    rebuilt = make_log(d, clock)
    assert rebuilt.producer_batches_scanned == 3 and times(rebuilt) == want
    assert {e.last_seen_ms for e in rebuilt.producers} == {clock.now}  # expiry's clock
    assert rebuilt.producers.expire(clock.now + 1000, 2000) == 0  # not expired by ts
    rebuilt.close()
    clock.now += 60_000
    reopened = make_log(d, clock)
    assert reopened.producer_batches_scanned == 0 and times(reopened) == want


def test_version_3_snapshots_still_load_with_their_time_as_the_last_timestamp() -> None:
    from strom.log.producer_state import _SNAP_PRODUCER_V3

    body = _SNAP_HEAD.pack(_SNAP_MAGIC, 3, 0, 10, 1) + _SNAP_PRODUCER_V3.pack(5, 2, 0, T0, -1, 4)
    _, state = ProducerStateManager.from_bytes(body + _SNAP_CRC.pack(crc32c.crc32c(body)))
    entry = state.get(5)
    assert entry is not None and entry.coordinator_epoch == 4
    assert entry.last_seen_ms == entry.last_timestamp_ms == T0
