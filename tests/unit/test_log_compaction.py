"""Unit tests for log compaction (DESIGN §5): latest record per key, tombstones, lag,
offsets kept, tiling kept, atomic swap and restarts after compaction."""

from __future__ import annotations

import os
import random
import threading
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import pytest

from strom.log import CorruptLogError, Log, LogConfig, LogManager, compact
from strom.log import cleaner as cleaner_mod
from strom.record import (
    HEADER_SIZE,
    InvalidBatchError,
    Record,
    decode_batches,
    decode_records,
    encode_batch,
)

T0 = 1_700_000_000_000
HOUR = 3600 * 1000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def kv_batch(
    pairs: Sequence[tuple[bytes | None, bytes | None]],
    ts: int = T0,
    codec: str = "none",
) -> bytes:
    return encode_batch(
        [v for _, v in pairs],
        keys=[k for k, _ in pairs],
        timestamps=[ts] * len(pairs),
        compression=codec,
    )


def cfg(**configs: object) -> LogConfig:
    base = {"cleanup.policy": "compact", "segment.bytes": "2048", "delete.retention.ms": HOUR}
    base.update({k.replace("_", "."): v for k, v in configs.items()})
    return LogConfig.from_dict(base)


def make_log(path: Path, clock: Clock | None = None, **configs: object) -> Log:
    return Log(path, cfg(**configs), fsync=False, clock=clock or Clock())


def read_all(log: Log, max_bytes: int = 1 << 20) -> list[Record]:
    offset = log.log_start_offset
    out: list[Record] = []
    while offset < log.log_end_offset:
        res = log.read(offset, max_bytes)
        assert res.data
        out.extend(r for r in decode_records(res.data) if r.offset >= offset)
        offset = res.next_offset
    return out


def kv(records: Sequence[Record]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in records]


def check_tiling(log: Log) -> None:
    for seg in log.segments:
        expected = seg.base_offset
        for h in seg.batch_headers():
            assert h.base_offset == expected
            assert h.partition_leader_epoch == log.epochs.epoch_for(h.base_offset)
            expected = h.next_offset
        if seg.size:
            assert expected == seg.next_offset


def expected_compacted(
    appended: list[tuple[int, bytes | None, bytes | None]],
    cleanable_end: int,
    *,
    drop_tombstones: bool,
) -> list[tuple[int, bytes | None, bytes | None]]:
    """The model of one pass: below ``cleanable_end`` keep null keys and the latest record
    of each key (judged over the whole log); drop tombstones when asked."""
    latest: dict[bytes, int] = {}
    for off, k, _ in appended:
        if k is not None:
            latest[k] = off
    out = []
    for off, k, v in appended:
        if (
            off >= cleanable_end
            or k is None
            or (latest[k] == off and not (drop_tombstones and v is None))
        ):
            out.append((off, k, v))
    return out


def fill(log: Log, n_batches: int, *, ts: int = T0, epoch: int = 0) -> list:
    appended = []
    for i in range(n_batches):
        pairs = [
            (b"k%d" % ((i * 3 + j) % 5), b"v%d-%d" % (i, j)) for j in range(3)
        ]  # 5 keys, rewritten over and over
        if i % 4 == 1:
            pairs.append((None, b"nokey%d" % i))
        info = log.append(kv_batch(pairs, ts=ts + i), leader_epoch=epoch + i // 5)
        appended.extend((info.first_offset + j, k, v) for j, (k, v) in enumerate(pairs))
    return appended


# ----------------------------------------------------------------------------------- basics


def test_latest_value_per_key_survives_with_its_offset(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0")
    appended = fill(log, 20)
    assert len(log.segments) > 3
    active_base = log.active.base_offset
    active_bytes = log.active.log_path.read_bytes()
    leo = log.log_end_offset
    stats = compact(log, now=T0 + HOUR)
    assert stats.segments_cleaned == len(log.segments) - 1
    assert stats.records_after < stats.records_before
    assert stats.bytes_after < stats.bytes_before
    got = kv(read_all(log))
    assert got == expected_compacted(appended, active_base, drop_tombstones=False)
    # Every key's latest value is there, at its original offset.
    latest = {k: (off, v) for off, k, v in appended if k is not None}
    assert {k: (off, v) for off, k, v in got if k is not None} == latest
    # Null-key records are never compacted away.
    assert [r for r in appended if r[1] is None] == [r for r in got if r[1] is None]
    # The active segment is untouched; offsets and the log end did not move.
    assert log.active.log_path.read_bytes() == active_bytes
    assert log.log_end_offset == leo and log.log_start_offset == 0
    check_tiling(log)
    # Small reads (one batch at a time) see the same.
    assert kv(read_all(log, max_bytes=1)) == got
    # Empty batches keep the segments tiled: every offset below the end belongs to a batch.
    covered = []
    for h in log.batch_headers():
        covered.extend(range(h.base_offset, h.next_offset))
    assert covered == list(range(leo))
    # A second pass changes nothing.
    again = compact(log, now=T0 + HOUR)
    assert again.segments_cleaned == 0
    assert kv(read_all(log)) == got


@pytest.mark.parametrize("codec", ["none", "gzip", "zstd", "lz4", "snappy"])
def test_compaction_keeps_batch_fields(tmp_path: Path, codec: str) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    log.append(kv_batch([(b"a", b"1"), (b"b", b"1"), (b"a", b"2")], codec=codec), leader_epoch=3)
    log.append(kv_batch([(b"b", b"2")], ts=T0 + 7), leader_epoch=4)
    log.append(kv_batch([(b"c", b"1")]), leader_epoch=4)  # the active segment
    before = {h.base_offset: h for h in log.batch_headers()}
    compact(log, now=T0 + HOUR)
    after = {h.base_offset: h for h in log.batch_headers()}
    assert after.keys() == before.keys()
    for base, h in after.items():
        b = before[base]
        assert (h.last_offset_delta, h.partition_leader_epoch, h.codec) == (
            b.last_offset_delta,
            b.partition_leader_epoch,
            b.codec,
        )
        assert h.max_timestamp == b.max_timestamp
    assert kv(read_all(log)) == [(2, b"a", b"2"), (3, b"b", b"2"), (4, b"c", b"1")]
    check_tiling(log)


def test_null_keys_and_headers_survive(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    data = encode_batch(
        [b"x", b"y", b"z"],
        keys=[None, b"k", None],
        headers=[[("h", b"1")], None, [("h", None)]],
        timestamps=[T0, T0 + 1, T0 + 2],
    )
    log.append(data)
    log.append(kv_batch([(b"k", b"new")]))
    log.append(kv_batch([(b"other", b"1")]))
    compact(log, now=T0 + HOUR)
    recs = read_all(log)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in recs[:2]] == [
        (0, None, b"x", (("h", b"1"),), T0),
        (2, None, b"z", (("h", None),), T0 + 2),
    ]
    assert kv(recs[2:]) == [(3, b"k", b"new"), (4, b"other", b"1")]


def test_log_append_time_topic(tmp_path: Path) -> None:
    clock = Clock(T0 + 500)
    log = make_log(
        tmp_path / "c-0", clock, segment_bytes=1024, message_timestamp_type="LogAppendTime"
    )
    log.append(kv_batch([(b"a", b"1"), (b"b", b"1")]))
    clock.now += 10
    log.append(kv_batch([(b"a", b"2")]))
    log.append(kv_batch([(b"z", b"1")]))
    compact(log, now=clock.now + HOUR)
    recs = read_all(log)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in recs] == [
        (1, b"b", b"1", T0 + 500),
        (2, b"a", b"2", T0 + 510),
        (3, b"z", b"1", T0 + 510),
    ]


def test_compaction_does_nothing_for_a_single_segment(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0")
    log.append(kv_batch([(b"a", b"1"), (b"a", b"2")]))
    stats = compact(log, now=T0 + HOUR)
    assert stats.segments_cleaned == 0
    assert len(read_all(log)) == 2


# ------------------------------------------------------------------------------- tombstones


def test_tombstones_kept_until_delete_retention(tmp_path: Path) -> None:
    clock = Clock()
    log = make_log(tmp_path / "c-0", clock, segment_bytes=1024, delete_retention_ms=1000)
    for ts, pairs in [
        (T0, [(b"a", b"1"), (b"b", b"1")]),
        (T0 + 100, [(b"a", None)]),  # tombstone for a, alone in its segment
        (T0 + 200, [(b"c", b"1")]),
        (T0 + 300, [(b"d", b"1")]),  # active
    ]:
        clock.now = ts  # written at its timestamp: its segment's time
        log.append(kv_batch(pairs, ts=ts))
    assert [s.base_offset for s in log.segments] == [0, 2, 3, 4]
    compact(log, now=T0 + 1000)  # tombstone is 900 ms old: kept, but the old value goes
    assert kv(read_all(log)) == [
        (1, b"b", b"1"),
        (2, b"a", None),
        (3, b"c", b"1"),
        (4, b"d", b"1"),
    ]
    compact(log, now=T0 + 1100)  # exactly delete.retention.ms old: still kept
    assert (2, b"a", None) in kv(read_all(log))
    compact(log, now=T0 + 1101)
    assert kv(read_all(log)) == [(1, b"b", b"1"), (3, b"c", b"1"), (4, b"d", b"1")]
    check_tiling(log)
    # The offset of the tombstone is not reused: the range is covered by an empty batch.
    assert log.append(kv_batch([(b"e", b"1")])).first_offset == 5


def test_tombstones_age_by_their_segment_not_their_record_timestamp(tmp_path: Path) -> None:
    """Found from outside: tombstones were judged by their record timestamp (CreateTime, the
    producer's), so a tombstone stamped two days ago went on the first cleaning, whatever
    delete.retention.ms (1 day by default) said. They now go once their segment has taken no
    append for longer than delete.retention.ms, on the broker's clock, and a cleaning (or a
    restart after one) does not make the segment look new."""
    day = 24 * HOUR
    clock = Clock(T0)
    d = tmp_path / "c-0"
    log = Log(d, LogConfig.from_dict({"cleanup.policy": "compact"}), fsync=False, clock=clock)
    assert log.config.delete_retention_ms == day  # the default
    log.append(kv_batch([(b"a", b"1")], ts=T0 - 3 * day))
    log.append(kv_batch([(b"a", None)], ts=T0 - 2 * day))  # a tombstone, CreateTime 2 days old
    log.append(kv_batch([(b"b", b"1")], ts=T0))
    log.roll()
    clock.now += HOUR
    log.append(kv_batch([(b"c", b"1")], ts=clock.now))  # active
    compact(log)
    assert kv(read_all(log)) == [(1, b"a", None), (2, b"b", b"1"), (3, b"c", b"1")]
    log.close()
    clock.now = T0 + day  # the segment was written at T0: exactly a day old
    log = Log(d, LogConfig.from_dict({"cleanup.policy": "compact"}), fsync=False, clock=clock)
    assert log.segments[0].last_append_ms == T0  # kept by the cleaning's rewrite
    compact(log)
    assert (1, b"a", None) in kv(read_all(log))
    clock.now += 1
    compact(log)
    assert kv(read_all(log)) == [(2, b"b", b"1"), (3, b"c", b"1")]
    check_tiling(log)


def test_tombstone_followed_by_new_value(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024, delete_retention_ms=0)
    log.append(kv_batch([(b"a", b"1")]))
    log.append(kv_batch([(b"a", None)]))
    log.append(kv_batch([(b"a", b"3")]))
    log.append(kv_batch([(b"x", b"1")]))
    compact(log, now=T0 + HOUR)
    assert kv(read_all(log)) == [(2, b"a", b"3"), (3, b"x", b"1")]


def test_tombstone_in_active_segment_is_kept(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024, delete_retention_ms=0)
    log.append(kv_batch([(b"a", b"1")]))
    log.append(kv_batch([(b"a", None)]))  # active
    compact(log, now=T0 + HOUR)
    assert kv(read_all(log)) == [(1, b"a", None)]


def test_tombstone_removal_cannot_resurrect_an_older_value(tmp_path: Path) -> None:
    """Regression: segments were picked for cleaning one by one, so an old tombstone could
    be removed while an older, still-uncleaned segment (kept back by min.compaction.lag.ms
    because of one young record) held a value it had deleted."""
    now = T0 + 10 * HOUR
    log = make_log(
        tmp_path / "c-0",
        Clock(now),
        segment_bytes=1024,
        delete_retention_ms=0,
        min_compaction_lag_ms=HOUR,
    )
    # Segment 0: an old value of "a" next to a young record (the segment is too young).
    log.append(encode_batch([b"old", b"1"], keys=[b"a", b"young"], timestamps=[T0, now]))
    log.append(kv_batch([(b"a", None)], ts=T0 + 1))  # segment 1: an old tombstone for "a"
    log.append(kv_batch([(b"z", b"1")], ts=T0 + 2))
    log.append(kv_batch([(b"active", b"1")], ts=now))
    assert [s.base_offset for s in log.segments] == [0, 2, 3, 4]
    compact(log, now=now)
    latest: dict[bytes | None, bytes | None] = {}
    for _, k, v in kv(read_all(log)):
        latest[k] = v
    assert latest.get(b"a") is None  # "a" stays deleted


# ------------------------------------------------------------------------------ lag, active


def test_min_compaction_lag(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024, min_compaction_lag_ms=1000)
    log.append(kv_batch([(b"a", b"1")], ts=T0))
    log.append(kv_batch([(b"a", b"2")], ts=T0 + 500))
    log.append(kv_batch([(b"a", b"3")], ts=T0 + 900))
    before = kv(read_all(log))
    assert compact(log, now=T0 + 999).segments_cleaned == 0
    assert kv(read_all(log)) == before
    # Only segment 0 is old enough at T0 + 1000; segment 1 at T0 + 1500.
    assert compact(log, now=T0 + 1000).segments_cleaned == 1
    assert kv(read_all(log)) == [(1, b"a", b"2"), (2, b"a", b"3")]
    assert compact(log, now=T0 + 1500).segments_cleaned == 1
    assert kv(read_all(log)) == [(2, b"a", b"3")]


def test_delete_and_compact_policy(tmp_path: Path) -> None:
    log = make_log(
        tmp_path / "c-0", segment_bytes=1024, cleanup_policy="compact,delete", retention_ms=1000
    )
    log.append(kv_batch([(b"a", b"1")], ts=T0))
    log.append(kv_batch([(b"a", b"2")], ts=T0 + 5000))
    log.append(kv_batch([(b"b", b"1")], ts=T0 + 5000))
    compact(log, now=T0 + 5000)
    assert kv(read_all(log)) == [(1, b"a", b"2"), (2, b"b", b"1")]
    assert log.apply_retention(now=T0 + 5000) == 1  # the now-empty old segment
    assert log.log_start_offset == 1
    assert kv(read_all(log)) == [(1, b"a", b"2"), (2, b"b", b"1")]


# --------------------------------------------------------------------------------- restarts


def _manager(data_dir: Path, **configs: object) -> LogManager:
    conf = {"cleanup.policy": "compact", "segment.bytes": "2048"}
    conf.update({k.replace("_", "."): str(v) for k, v in configs.items()})
    return LogManager(data_dir, fsync=False, clock=Clock(), configs=lambda topic: conf)


def _crash(mgr: LogManager) -> None:
    for _, log in mgr:
        for seg in log.segments:
            if not seg.closed:
                os.close(seg.fd)
                seg.closed = True


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("flushed", [True, False])
def test_reopen_after_compaction(tmp_path: Path, clean: bool, flushed: bool) -> None:
    mgr = _manager(tmp_path)
    log = mgr.get_or_create("c", 0)
    fill(log, 20)
    if flushed:
        mgr.flush_all()  # compaction then rewrites segments below the recovery point
    compact(log, now=T0 + HOUR)
    after = kv(read_all(log))
    entries = log.epochs.entries()
    if clean:
        mgr.close()
    else:
        _crash(mgr)
    log2 = _manager(tmp_path).get("c", 0)
    assert log2.truncated_bytes_on_recovery == 0
    assert kv(read_all(log2)) == after
    assert kv(read_all(log2, max_bytes=1)) == after
    assert log2.epochs.entries() == entries
    check_tiling(log2)
    # And it compacts further after the restart.
    info = log2.append(kv_batch([(b"k0", b"last")]), leader_epoch=50)
    log2.roll()
    compact(log2, now=T0 + HOUR)
    k0 = [(o, v) for o, k, v in kv(read_all(log2)) if k == b"k0"]
    assert k0 == [(info.first_offset, b"last")]


def test_interrupted_swap_is_finished_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = _manager(tmp_path)
    log = mgr.get_or_create("c", 0)
    appended = fill(log, 20)
    mgr.flush_all()
    active_base = log.active.base_offset

    real_fsync_dir = cleaner_mod.fsync_dir

    def crash_after_swap_file(directory: Path) -> None:
        if list(directory.glob("*.swap")):
            raise SystemExit("crash")  # the process dies with a complete .swap on disk
        real_fsync_dir(directory)

    monkeypatch.setattr(cleaner_mod, "fsync_dir", crash_after_swap_file)
    with pytest.raises(SystemExit):
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    d = tmp_path / "c-0"
    swaps = list(d.glob("*.swap"))
    assert len(swaps) == 1
    _crash(mgr)
    log2 = _manager(tmp_path).get("c", 0)
    assert not list(d.glob("*.swap")) and not list(d.glob("*.cleaned"))
    got = kv(read_all(log2))
    # The first segment is the compacted one; the rest is as appended.
    first_end = log2.segments[1].base_offset
    model = expected_compacted(appended, active_base, drop_tombstones=False)
    assert [r for r in got if r[0] < first_end] == [r for r in model if r[0] < first_end]
    assert [r for r in got if r[0] >= first_end] == [r for r in appended if r[0] >= first_end]
    check_tiling(log2)
    compact(log2, now=T0 + HOUR)
    assert kv(read_all(log2)) == model


def test_interrupted_cleaning_is_discarded_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = _manager(tmp_path)
    log = mgr.get_or_create("c", 0)
    fill(log, 20)
    before = kv(read_all(log))
    real_replace = os.replace

    def crash_before_rename(src: object, dst: object) -> None:
        if str(src).endswith(".cleaned"):
            raise SystemExit("crash")  # dies with a complete .cleaned but no .swap
        real_replace(src, dst)

    monkeypatch.setattr(cleaner_mod.os, "replace", crash_before_rename)
    with pytest.raises(SystemExit):
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    d = tmp_path / "c-0"
    assert list(d.glob("*.cleaned"))
    _crash(mgr)
    log2 = _manager(tmp_path).get("c", 0)
    assert not list(d.glob("*.cleaned"))
    assert kv(read_all(log2)) == before


def test_crash_between_swap_rename_and_index_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new .log is in place but its indexes are the old segment's: they must not be
    trusted on restart."""
    mgr = _manager(tmp_path, index_interval_bytes=0)
    log = mgr.get_or_create("c", 0)
    appended = fill(log, 20)
    mgr.flush_all()
    active_base = log.active.base_offset
    real_replace = os.replace
    seen: list[str] = []

    def crash_after_swap(src: object, dst: object) -> None:
        real_replace(src, dst)
        if str(src).endswith(".swap"):
            seen.append(str(dst))
            raise SystemExit("crash")

    monkeypatch.setattr(cleaner_mod.os, "replace", crash_after_swap)
    with pytest.raises(SystemExit):
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    assert len(seen) == 1
    _crash(mgr)
    log2 = _manager(tmp_path, index_interval_bytes=0).get("c", 0)
    got = kv(read_all(log2))
    assert kv(read_all(log2, max_bytes=1)) == got
    first_end = log2.segments[1].base_offset
    model = expected_compacted(appended, active_base, drop_tombstones=False)
    assert [r for r in got if r[0] < first_end] == [r for r in model if r[0] < first_end]
    assert [r for r in got if r[0] >= first_end] == [r for r in appended if r[0] >= first_end]
    check_tiling(log2)
    for seg in log2.segments:
        assert len(seg.index.rel) == len(seg.batch_headers())
        assert seg.time_index.max_timestamp == max(h.max_timestamp for h in seg.batch_headers())


# ---------------------------------------------------------------------- safety under races


def test_truncation_during_compaction_is_not_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a follower truncation while the cleaner was rewriting (outside the lock)
    was undone by the swap, and the key map built before it removed values that were again
    the latest."""
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    log.append(kv_batch([(b"a", b"1")]))  # 0
    log.append(kv_batch([(b"b", b"1")]))  # 1
    log.append(kv_batch([(b"a", b"2")]))  # 2: makes offset 0 obsolete...
    log.append(kv_batch([(b"c", b"1")]))  # 3 active
    real_rewrite = cleaner_mod._rewrite
    calls = []

    def rewrite_while_truncating(*args: object, **kwargs: object) -> object:
        if not calls:
            log.truncate_to(2)  # ...until a new leader says 2.. never happened
        calls.append(1)
        return real_rewrite(*args, **kwargs)

    monkeypatch.setattr(cleaner_mod, "_rewrite", rewrite_while_truncating)
    compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    assert log.log_end_offset == 2
    assert kv(read_all(log)) == [(0, b"a", b"1"), (1, b"b", b"1")]
    check_tiling(log)
    assert not list(log.directory.glob("*.swap")) and not list(log.directory.glob("*.cleaned"))


def test_retention_during_compaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    for i in range(4):
        log.append(kv_batch([(b"a", b"%d" % i)]))
    real_rewrite = cleaner_mod._rewrite
    calls = []

    def rewrite_while_deleting(*args: object, **kwargs: object) -> object:
        if not calls:
            log.delete_records(2)  # deletes segments 0 and 1 under the cleaner's feet
        calls.append(1)
        return real_rewrite(*args, **kwargs)

    monkeypatch.setattr(cleaner_mod, "_rewrite", rewrite_while_deleting)
    compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    # The pass is dropped, and the deleted segment is not brought back by a swap.
    assert [s.base_offset for s in log.segments] == [2, 3]
    assert not [p for p in log.directory.iterdir() if p.suffix in (".swap", ".cleaned")]
    assert not (log.directory / "00000000000000000000.log").exists()
    assert kv(read_all(log)) == [(2, b"a", b"2"), (3, b"a", b"3")]
    compact(log, now=T0 + HOUR)  # the next pass does the work
    assert kv(read_all(log)) == [(3, b"a", b"3")]
    check_tiling(log)


def test_appends_go_on_while_a_cleaning_pass_decodes_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads, checks and groups the segments outside the log's lock (only each file's
    read holds it): it used to hold the lock over the whole first read of the log, and every
    append and read of the partition waited for it."""
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    for i in range(4):
        log.append(kv_batch([(b"a", b"%d" % i)]))
    decoding = threading.Event()
    release = threading.Event()
    real = cleaner_mod._segment_batches

    def held_decode(*args: object) -> object:
        decoding.set()
        assert release.wait(30)
        return real(*args)

    monkeypatch.setattr(cleaner_mod, "_segment_batches", held_decode)
    stats: list[cleaner_mod.CleanerStats] = []
    cleaner = threading.Thread(target=lambda: stats.append(compact(log, now=T0 + HOUR)))
    cleaner.start()
    appended = threading.Event()
    try:
        assert decoding.wait(30)
        writer = threading.Thread(
            target=lambda: (log.append(kv_batch([(b"b", b"x")])), appended.set()), daemon=True
        )
        writer.start()
        assert appended.wait(10), "the append waited for the cleaner's decode"
        assert log.read(0, 1 << 20).data  # so did reads
    finally:
        release.set()
        cleaner.join(30)
    assert stats and stats[0].segments_cleaned > 0
    assert kv(read_all(log)) == [(3, b"a", b"3"), (4, b"b", b"x")]
    check_tiling(log)


def test_compaction_keeps_each_keys_latest_record_among_many_keys(tmp_path: Path) -> None:
    """The records kept are found by a binary search in the sorted key map: every key's
    latest record (and each record without a key) stays, every older one goes."""
    log = make_log(tmp_path / "c-0", segment_bytes=64 * 1024)
    rng = random.Random(7)
    latest: dict[bytes, int] = {}
    offset = 0
    for _ in range(300):
        pairs: list[tuple[bytes | None, bytes | None]] = []
        for _ in range(rng.randrange(1, 40)):
            key = None if rng.random() < 0.05 else b"k%d" % rng.randrange(2000)
            pairs.append((key, b"v%d" % offset))
            if key is not None:
                latest[key] = offset
            offset += 1
        log.append(kv_batch(pairs))
    before = {r.offset: r for r in read_all(log)}
    log.roll()
    compact(log, now=T0 + HOUR)
    kept = {r.offset for r in read_all(log)}
    expected = set(latest.values()) | {o for o, r in before.items() if r.key is None}
    assert kept == expected
    check_tiling(log)


def test_compaction_refuses_corrupt_segments(tmp_path: Path) -> None:
    """The cleaner re-frames batches with a fresh CRC: it must not bless corrupt ones."""
    for field, where in [("body", HEADER_SIZE + 4), ("epoch", 15), ("base_offset", 7)]:
        log = make_log(tmp_path / field, segment_bytes=4096)
        for i in range(12):
            log.append(kv_batch([(b"a", b"%d" % i), (b"b", b"%d" % i)]), leader_epoch=1)
        victim = log.segments[0]
        second = victim.batch_headers()[1].position
        raw = bytearray(victim.log_path.read_bytes())
        raw[second + where] ^= 0x40
        os.pwrite(victim.fd, bytes(raw[second + where : second + where + 1]), second + where)
        with pytest.raises(CorruptLogError):
            compact(log, now=T0 + HOUR)
        # Nothing was swapped: the damage is still refused, never served as records: by the
        # log's read checks (a base offset or epoch out of sequence), or, as a body byte in a
        # batch whose CRC this process took when it was appended, by the reader's own check.
        with pytest.raises((CorruptLogError, InvalidBatchError)):
            read_all(log)
        assert victim in log.segments


def test_compaction_after_lowering_max_message_bytes_keeps_every_latest_value(
    tmp_path: Path,
) -> None:
    """Found from outside: the swap re-read the rewritten segment under the topic's current
    max.message.bytes, so a batch accepted under a larger, older limit counted as corrupt:
    the segment was cut there and every key after it was gone (on every replica at once)."""
    log = make_log(tmp_path / "c-0", max_message_bytes=8 << 20, segment_bytes=16 << 20)
    log.append(kv_batch([(b"a", b"old")]))
    log.append(kv_batch([(b"big", b"x" * (3 << 20))]))  # above the old bound of 2 MiB
    for i in range(5):
        log.append(kv_batch([(b"k%d" % i, b"v%d" % i)]))
    log.append(kv_batch([(b"a", b"new")]))
    log.roll()
    log.append(kv_batch([(b"z", b"active")]))
    log.update_config(cfg(max_message_bytes=1 << 20, segment_bytes=16 << 20))
    stats = compact(log, now=T0 + HOUR)
    assert stats.segments_cleaned == 1
    got = {k: v for _, k, v in kv(read_all(log))}
    assert got == {
        b"a": b"new",
        b"big": b"x" * (3 << 20),
        **{b"k%d" % i: b"v%d" % i for i in range(5)},
        b"z": b"active",
    }
    check_tiling(log)


def test_a_rewritten_segment_that_would_not_recover_whole_is_not_swapped_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap's safety net: a rewrite that the swap's recovery would cut (here a torn last
    batch stands in for any rule the two disagree on) keeps the old segment, fails the pass
    loudly and leaves no files behind, instead of dropping the cut records silently."""
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    for i in range(6):
        log.append(kv_batch([(b"a", b"%d" % i), (b"b%d" % i, b"x")]))
    before = kv(read_all(log))
    old_segments = list(log.segments)
    real_rewrite = cleaner_mod._rewrite

    def torn_rewrite(*args: object, **kwargs: object) -> object:
        data, kept_before, kept_after = real_rewrite(*args, **kwargs)
        return (data[:-1] if data else data), kept_before, kept_after

    monkeypatch.setattr(cleaner_mod, "_rewrite", torn_rewrite)
    with pytest.raises(CorruptLogError, match="swap refused"):
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    assert log.segments == old_segments
    assert kv(read_all(log)) == before
    assert not [p for p in log.directory.iterdir() if p.suffix in (".swap", ".cleaned")]
    assert log.first_dirty_offset == 0  # the pass did not count
    compact(log, now=T0 + HOUR)
    assert kv(read_all(log)) == [r for r in before if r[1] != b"a" or r[2] == b"5"]
    check_tiling(log)


def test_reads_after_compaction_pass_all_checks(tmp_path: Path) -> None:
    log = make_log(tmp_path / "c-0", segment_bytes=1024, delete_retention_ms=0)
    for i in range(30):
        k = b"k%d" % (i % 4)
        log.append(kv_batch([(k, None if i % 7 == 0 else b"v%d" % i)]), leader_epoch=i // 10)
    compact(log, now=T0 + HOUR)
    for seg in log.segments:
        data = seg.log_path.read_bytes()
        for b in decode_batches(data):  # CRCs valid
            b.body()  # bodies parse
    check_tiling(log)
    for offset in range(log.log_end_offset):
        res = log.read(offset, max_bytes=1)
        assert res.data


# ------------------------------------------------------------------------------- replicas


def catch_up(follower: Log, leader: Log, max_bytes: int = 1 << 20) -> int:
    """Replicate as the storage node's fetcher does: read the leader from the follower's log
    end, append what it returns as follower; returns the number of fetches."""
    fetches = 0
    while follower.log_end_offset < leader.log_end_offset:
        res = leader.read(follower.log_end_offset, max_bytes)
        assert res.data
        follower.append_as_follower(res.data)
        fetches += 1
    return fetches


@pytest.mark.parametrize("max_bytes", [1, 1 << 20])
def test_lagging_follower_catches_up_with_a_compacted_leader(
    tmp_path: Path, max_bytes: int
) -> None:
    """Found from outside: the cleaner merges runs of emptied batches into one, so the leader
    could hold one batch for offsets 0..23 while a follower that fell behind held the single
    batches 0..9. The leader served the whole merged batch for a fetch at 10, which the
    follower refused ("below the log end offset") on every fetch: never back in the ISR. The
    leader now serves such a filler cut to start at the fetch offset."""
    leader = make_log(tmp_path / "leader" / "c-0", segment_bytes=16384)
    follower = make_log(tmp_path / "follower" / "c-0", segment_bytes=16384)
    for i in range(10):
        leader.append(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]))
    catch_up(follower, leader)
    assert follower.log_end_offset == 10  # then the follower stops (killed)
    for i in range(10, 70):
        leader.append(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]))
    compact(leader, now=T0 + HOUR)
    straddling = [h for h in leader.batch_headers() if h.base_offset < 10 <= h.last_offset]
    assert straddling and straddling[0].record_count == 0  # the case the reviewer hit
    catch_up(follower, leader, max_bytes)
    assert follower.log_end_offset == leader.log_end_offset
    # What the follower copied is the leader's log from 10 on (below, its own uncompacted
    # copy, which its own cleaner will compact).
    copied = [r for r in kv(read_all(follower)) if r[0] >= 10]
    assert copied == [r for r in kv(read_all(leader)) if r[0] >= 10]
    assert copied[-3:] == [(67, b"k1", b"v67"), (68, b"k2", b"v68"), (69, b"k0", b"v69")]
    check_tiling(follower)
    # The follower's copy survives a restart (recovery re-checks every batch).
    follower.close()
    again = make_log(tmp_path / "follower" / "c-0", segment_bytes=16384)
    assert [r for r in kv(read_all(again)) if r[0] >= 10] == copied


def test_a_read_inside_a_batch_with_records_is_not_cut(tmp_path: Path) -> None:
    """Only fillers are cut: a batch with records is served whole from its base offset (a
    consumer skips the records below its position)."""
    log = make_log(tmp_path / "c-0")
    log.append(kv_batch([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]))
    res = log.read(1)
    assert [h.base_offset for h in (b.header for b in decode_batches(res.data))] == [0]


# --------------------------------------------------------------------------------- memory


def _traced_peak_of_compaction(path: Path, segments: int) -> int:
    """Peak bytes Python allocated during one cleaning pass over a log of ``segments``
    segments of 256 KiB (16 batches of one 16 KiB value each, 4 keys, so every segment is
    rewritten), plus a small active segment."""
    seg_bytes = 256 << 10
    log = make_log(path, segment_bytes=seg_bytes)
    value = os.urandom(16 << 10)
    i = 0
    while len(log.segments) <= segments:
        log.append(kv_batch([(b"k%d" % (i % 4), value)]))
        i += 1
    assert len(log.segments) == segments + 1
    tracemalloc.start()
    try:
        stats = compact(log, now=T0 + HOUR)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats.segments_cleaned == segments
    log.close()
    return peak


def test_a_cleaning_pass_holds_one_segment_at_a_time_not_the_log(tmp_path: Path) -> None:
    """Found from outside: a pass read every segment below the high watermark in full and
    kept them all decoded until its end, so its memory grew with the log (a 200 MB log took
    ~215 MB more; a multi-GB compacted topic would have the node OOM-killed at every pass).
    Now it holds the key map and one segment: the peak for 8 segments stays near the peak
    for 1 (it was about 5 times as much). Segment bytes are read into Python objects, which
    tracemalloc counts deterministically; a first pass warms up what any pass allocates
    once (caches, lazily imported code)."""
    _traced_peak_of_compaction(tmp_path / "warm-0", 1)
    one = _traced_peak_of_compaction(tmp_path / "one-0", 1)
    many = _traced_peak_of_compaction(tmp_path / "many-0", 8)
    assert many < 1.5 * one, (one, many)


def test_the_key_map_merged_segment_by_segment_gives_the_same_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key map is built from each segment's own map, merged (max offset per key) as the
    pass goes: merging after every segment must keep exactly what one merge at the end
    keeps."""

    def build(path: Path) -> Log:
        log = make_log(path, segment_bytes=1024, delete_retention_ms=0)
        for i in range(60):
            k = b"k%d" % (i * 7 % 11)
            log.append(kv_batch([(k, None if i % 9 == 0 else b"v%d" % i), (b"n%d" % i, b"x")]))
        return log

    once, merged = build(tmp_path / "once-0"), build(tmp_path / "merged-0")
    compact(once, now=T0 + HOUR)
    monkeypatch.setattr(cleaner_mod, "KEY_MAP_MERGE_ROWS", 0)
    compact(merged, now=T0 + HOUR)
    assert len(once.segments) > 3
    assert [s.log_path.read_bytes() for s in once.segments] == [
        s.log_path.read_bytes() for s in merged.segments
    ]
    assert kv(read_all(once)) == kv(read_all(merged)) != []


def test_a_segment_deleted_before_the_cleaner_reads_it_again_voids_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner reads each sealed segment a second time to rewrite it, after the first
    read released the lock: a segment deleted meanwhile (its descriptor closed, perhaps
    reused) is not read; the pass is void and the next one does the work."""
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    log.append(kv_batch([(b"a", b"0")]))  # 0: the latest of "a", so segment 0 is unchanged
    log.roll()
    log.append(kv_batch([(b"b", b"1")]))  # 1
    log.append(kv_batch([(b"b", b"2")]))  # 2: makes offset 1 obsolete
    log.roll()
    log.append(kv_batch([(b"c", b"3")]))  # 3 active
    real_rewrite = cleaner_mod._rewrite
    calls = []

    def rewrite_while_deleting(*args: object, **kwargs: object) -> object:
        if not calls:
            log.delete_records(3)  # deletes segments 0 and 1 before 1 is read again
        calls.append(1)
        return real_rewrite(*args, **kwargs)

    monkeypatch.setattr(cleaner_mod, "_rewrite", rewrite_while_deleting)
    stats = compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    assert calls == [1] and stats.segments_cleaned == 0
    assert log.first_dirty_offset == 0
    assert [s.base_offset for s in log.segments] == [3]
    assert kv(read_all(log)) == [(3, b"c", b"3")]
    check_tiling(log)


def test_a_high_watermark_below_the_first_dirty_offset_cleans_nothing_above_it(
    tmp_path: Path,
) -> None:
    """Found from outside: with the checkpointed first dirty offset above the high watermark
    (a high watermark read back lower after a restart, or lowered by a new leader), the
    cleaner rewrote sealed segments up to the first dirty offset and dropped their records
    at or above the high watermark, whose keys were not in its key map."""
    log = make_log(tmp_path / "c-0", segment_bytes=8192)
    log.append(kv_batch([(b"a", b"0")]))
    log.roll()  # [0]
    log.append(kv_batch([(b"b", b"1")]))
    log.append(kv_batch([(b"c", b"2")]))
    log.roll()  # [1, 2]
    log.append(kv_batch([(b"z", b"3")]))
    compact(log, now=T0 + HOUR)
    assert log.first_dirty_offset == 3
    log.append(kv_batch([(b"a", b"4")]))
    log.roll()
    log.append(kv_batch([(b"y", b"5")]))
    stats = compact(log, now=T0 + HOUR, max_offset=2)
    assert [(o, k, v) for o, k, v in kv(read_all(log))] == [
        (0, b"a", b"0"),
        (1, b"b", b"1"),
        (2, b"c", b"2"),
        (3, b"z", b"3"),
        (4, b"a", b"4"),
        (5, b"y", b"5"),
    ]
    assert log.first_dirty_offset == 3 and stats.first_dirty_offset == 3
