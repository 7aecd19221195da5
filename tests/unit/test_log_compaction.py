"""Unit tests for log compaction (DESIGN §5): latest record per key, tombstones, lag,
offsets kept, tiling kept, atomic swap and restarts after compaction."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import random
import threading
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from strom.log import (
    CorruptLogError,
    InvalidAppendError,
    Log,
    LogConfig,
    LogManager,
    cleaner_scan,
    cleaner_swap,
    compact,
)
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
    clock = clock or Clock()
    return Log(path, cfg(**configs), fsync=False, clock=clock, monotonic=clock)


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
    segments = len(log.segments)
    stats = compact(log, now=T0 + HOUR)
    # Every sealed segment was rewritten; the small rewritten ones merged into fewer files.
    assert stats.segments_cleaned == segments - 1
    assert stats.segments_merged > 0 and len(log.segments) == segments - stats.segments_merged
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
    stats = compact(log, now=T0 + 1500)
    # Segment 1, emptied, merges into segment 0's file (their empty batches into one).
    assert (stats.segments_cleaned, stats.segments_merged) == (2, 1)
    assert [s.base_offset for s in log.segments] == [0, 2]
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
            seg.abandon()


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

    real_fsync_dir = cleaner_swap.fsync_dir

    def crash_after_swap_file(directory: Path) -> None:
        if list(directory.glob("*.swap")):
            raise SystemExit("crash")  # the process dies with a complete .swap on disk
        real_fsync_dir(directory)

    monkeypatch.setattr(cleaner_swap, "fsync_dir", crash_after_swap_file)
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


def old_leader_read(leader: Log, offset: int, max_bytes: int) -> bytes:
    """What a leader of a version before reads cut fillers (commit f9fc1a3) served for a
    fetch at ``offset``: whole batches from the base of the one holding it."""
    base = max(h.base_offset for h in leader.batch_headers() if h.base_offset <= offset)
    return bytes(leader.read(base, max_bytes).data)


def _follower_behind_a_compacted_leader(tmp_path: Path) -> tuple[Log, Log]:
    """A follower holding offsets 0..9 and a leader whose cleaner merged emptied batches
    into one filler straddling 10 (the follower's log end)."""
    leader = make_log(tmp_path / "leader" / "c-0", segment_bytes=16384)
    follower = make_log(tmp_path / "follower" / "c-0", segment_bytes=16384)
    for i in range(10):
        leader.append(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]))
    catch_up(follower, leader)
    for i in range(10, 70):
        leader.append(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)]))
    compact(leader, now=T0 + HOUR)
    straddling = [h for h in leader.batch_headers() if h.base_offset < 10 <= h.last_offset]
    assert straddling and straddling[0].record_count == 0
    return leader, follower


@pytest.mark.parametrize("max_bytes", [1, 1 << 20])
def test_a_follower_cuts_a_whole_filler_from_an_older_leader(
    tmp_path: Path, max_bytes: int
) -> None:
    """Found from outside (rolling upgrade): a leader still on a version that serves the
    cleaner's merged filler whole sends, for a fetch at the follower's log end 10, a batch
    starting below 10. The upgraded follower refused it ("below the log end offset") once a
    second and never rejoined the ISR, so its readiness stayed NOT_SERVING and a
    readiness-gated rolling update stalled. The follower now cuts such a filler at its log
    end itself."""
    leader, follower = _follower_behind_a_compacted_leader(tmp_path)
    first = old_leader_read(leader, follower.log_end_offset, max_bytes)
    assert decode_batches(first)[0].header.base_offset < follower.log_end_offset
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_as_follower(old_leader_read(leader, follower.log_end_offset, max_bytes))
    copied = [r for r in kv(read_all(follower)) if r[0] >= 10]
    assert copied == [r for r in kv(read_all(leader)) if r[0] >= 10]
    check_tiling(follower)
    follower.close()
    again = make_log(tmp_path / "follower" / "c-0", segment_bytes=16384)
    assert [r for r in kv(read_all(again)) if r[0] >= 10] == copied


def test_a_follower_still_refuses_a_batch_with_records_below_its_end(tmp_path: Path) -> None:
    """Only a filler is cut: a batch with records starting below the log end is a real
    overlap, refused with the log unchanged."""
    other = make_log(tmp_path / "other" / "c-0")  # the follower's batches: 0 and 1
    leader = make_log(tmp_path / "leader" / "c-0")  # one batch 0..2
    follower = make_log(tmp_path / "follower" / "c-0")
    other.append(kv_batch([(b"a", b"1")]))
    other.append(kv_batch([(b"b", b"2")]))
    follower.append_as_follower(other.read(0).data)
    leader.append(kv_batch([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]))
    with pytest.raises(InvalidAppendError, match="below the log end offset 2"):
        follower.append_as_follower(leader.read(2).data)
    assert follower.log_end_offset == 2


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
    monkeypatch.setattr(cleaner_scan, "KEY_MAP_MERGE_ROWS", 0)
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


# ------------------------------------------------------------------------ merging segments


def _lookups(log: Log, stamps: Sequence[int]) -> list[tuple[int, int, int] | None]:
    return [log.offset_for_timestamp(t) for t in stamps]


def _producers(log: Log) -> dict[int, tuple[int, list[tuple[int, int, int, int]]]]:
    """Each producer's epoch and recent batches (sequences and offsets)."""
    return {
        e.producer_id: (
            e.epoch,
            [(b.first_seq, b.last_seq, b.base_offset, b.last_offset) for b in e.batches],
        )
        for e in log.producers
    }


def _first_at_or_after(records: Sequence[Record], t: int) -> tuple[int, int] | None:
    hits = [(r.offset, r.timestamp) for r in records if r.timestamp >= t]
    return hits[0] if hits else None


def test_compaction_merges_small_segments_into_few_files(tmp_path: Path) -> None:
    """Found from outside: every sealed segment was rewritten into a file of its own, so a
    compacted log kept one file and one open descriptor per segment ever rolled (60
    segments compacted to 60 files of 621 bytes). Adjacent cleaned segments now merge while
    they fit in segment.bytes, and the merged log reads, looks up timestamps and rebuilds
    its producer state exactly as the unmerged one would."""
    d = tmp_path / "c-0"
    log = make_log(d, segment_bytes=16384)
    appended = []
    for i in range(60):
        key = b"k%d" % (i % 3)
        if i % 5 == 0:  # an idempotent producer's batch now and then
            data = encode_batch(
                [b"p%d" % i],
                keys=[key],
                timestamps=[T0 + i * 1000],
                producer_id=7,
                producer_epoch=0,
                base_sequence=i // 5,
            )
        else:
            data = kv_batch([(key, b"v%d" % i)], ts=T0 + i * 1000)
        info = log.append(data, leader_epoch=i // 20)
        appended.append((info.first_offset, key, b"p%d" % i if i % 5 == 0 else b"v%d" % i))
        log.roll()
    log.append(kv_batch([(b"z", b"active")], ts=T0 + 60_000), leader_epoch=3)
    appended.append((60, b"z", b"active"))
    assert len(log.segments) == 61
    producers = _producers(log)
    stats = compact(log, now=T0 + HOUR)
    assert (stats.segments_cleaned, stats.segments_merged) == (60, 59)
    assert len(log.segments) == 2  # one merged segment (all of it fits) and the active one
    got = read_all(log)
    expected = expected_compacted(appended, 60, drop_tombstones=False)
    assert kv(got) == expected
    assert kv(read_all(log, max_bytes=1)) == expected
    check_tiling(log)
    covered = []
    for h in log.batch_headers():
        covered.extend(range(h.base_offset, h.next_offset))
    assert covered == list(range(61))
    # Timestamp lookups find the first kept record at or after each time.
    stamps = [T0 + t for t in range(-1, 61_000, 500)]
    want = [_first_at_or_after(got, t) for t in stamps]
    assert [r and r[:2] for r in _lookups(log, stamps)] == want
    assert _producers(log) == producers
    # Nothing left to do: a second pass neither rewrites nor merges.
    assert compact(log, now=T0 + HOUR).segments_cleaned == 0
    # Reopened (a producer state rebuilt from the headers alone), all still holds.
    log.close()
    for p in d.glob("*.snapshot"):
        p.unlink()
    log2 = make_log(d, segment_bytes=16384)
    assert [s.base_offset for s in log2.segments] == [0, 60]
    assert kv(read_all(log2)) == expected
    check_tiling(log2)
    assert [r and r[:2] for r in _lookups(log2, stamps)] == want
    assert _producers(log2) == producers
    assert (
        log2.append(
            encode_batch(
                [b"p"],
                keys=[b"k0"],
                timestamps=[T0 + 61_000],
                producer_id=7,
                producer_epoch=0,
                base_sequence=12,
            ),
            leader_epoch=3,
        ).duplicates
        == 0
    )


def test_a_one_key_topic_keeps_few_segments_over_many_passes(tmp_path: Path) -> None:
    """Found from outside: with one key and a pass every max.compaction.lag.ms, every pass
    left one more segment of one empty batch, without bound. Merged, the log stays at one
    cleaned segment (a filler and the latest record) plus the active one."""
    log = make_log(tmp_path / "c-0", segment_bytes=1 << 20)
    sizes = []
    for i in range(40):
        log.append(kv_batch([(b"k", b"v%d" % i)], ts=T0 + i))
        log.roll()  # segment.ms (max.compaction.lag.ms) rolls it
        log.append(kv_batch([(b"k", b"w%d" % i)], ts=T0 + i))
        compact(log, now=T0 + HOUR)
        assert len(log.segments) <= 2, i
        sizes.append(log.size_bytes)
        assert kv(read_all(log)) == [(2 * i + 1, b"k", b"w%d" % i)]
        check_tiling(log)
    assert max(sizes[2:]) == min(sizes[2:])  # no growth at all


def test_merging_stops_at_the_index_limit(tmp_path: Path) -> None:
    """A merged segment must stay indexable within segment.index.bytes, as an appended one
    does: each batch can add an entry to each index (24 bytes: 3 offset entries, 2 time)."""
    log = make_log(tmp_path / "c-0", segment_bytes=1 << 20, segment_index_bytes=24)
    for i in range(9):
        log.append(kv_batch([(b"k%d" % i, b"v")], ts=T0 + i))  # distinct keys: all kept
        log.roll()
    log.append(kv_batch([(b"z", b"v")], ts=T0 + 9))
    before = kv(read_all(log))
    stats = compact(log, now=T0 + HOUR)
    assert [len(s.batch_headers()) for s in log.segments] == [2, 2, 2, 2, 1, 1]
    assert stats.segments_merged == 4
    assert kv(read_all(log)) == before
    check_tiling(log)


def _merge_log(mgr: LogManager) -> tuple[Log, list, list]:
    """A log of 8 small sealed segments that one pass merges (into one) and an active one;
    returns it with what it reads before and after that pass."""
    log = mgr.get_or_create("c", 0)
    appended = []
    for i in range(8):
        info = log.append(kv_batch([(b"k%d" % (i % 3), b"v%d" % i)], ts=T0 + i))
        appended.append((info.first_offset, b"k%d" % (i % 3), b"v%d" % i))
        log.roll()
    log.append(kv_batch([(b"z", b"active")], ts=T0 + 8))
    appended.append((8, b"z", b"active"))
    mgr.flush_all()
    return log, appended, expected_compacted(appended, 8, drop_tombstones=False)


def _renames_of_a_pass(tmp_path: Path, delay: int, monkeypatch: pytest.MonkeyPatch) -> int:
    mgr = _manager(tmp_path, segment_bytes=1 << 20, file_delete_delay_ms=delay)
    log, _, _ = _merge_log(mgr)
    calls = []
    real_replace = os.replace

    def counting(src: object, dst: object) -> None:
        calls.append((src, dst))
        real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(cleaner_mod.os, "replace", counting)
        assert compact(log, now=T0 + HOUR).segments_merged == 7
    mgr.close()
    return len(calls)


def _killed_at_rename(n: int, *, after: bool = False) -> Callable[[object, object], None]:
    """``os.replace`` for a process killed just before its ``n``-th rename (or after it)."""
    real_replace = os.replace
    done = []

    def replace(src: object, dst: object) -> None:
        if len(done) + 1 == n and not after:
            raise SystemExit("crash")
        real_replace(src, dst)  # type: ignore[arg-type]
        done.append(dst)
        if len(done) == n and after:
            raise SystemExit("crash")

    return replace


@pytest.mark.parametrize("delay", [0, 60_000])
def test_a_crash_at_any_rename_of_a_merge_loses_and_resurrects_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay: int
) -> None:
    """The merge replaces 8 files by one: .cleaned -> .swap, each old segment's files ->
    .deleted, .swap -> .log. A process killed after any of those renames (or before the
    first) leaves a directory that opens to the log before the pass or after it, never a
    mix (overlapping segments, a replaced segment back, records lost)."""
    renames = _renames_of_a_pass(tmp_path / "count", delay, monkeypatch)
    assert renames >= 1 + 7 + 1
    outcomes = set()
    # Killed before each rename, after the last one (before the indexes are rebuilt), and
    # not at all.
    kills = [(n, False) for n in range(1, renames + 2)] + [(renames, True)]
    for n, after in kills:
        data_dir = tmp_path / f"crash{n}{after}"
        configs = {"segment_bytes": 1 << 20, "file_delete_delay_ms": delay}
        mgr = _manager(data_dir, index_interval_bytes=0, **configs)
        log, appended, model = _merge_log(mgr)
        with monkeypatch.context() as m:
            m.setattr(cleaner_mod.os, "replace", _killed_at_rename(n, after=after))
            with contextlib.suppress(SystemExit):
                compact(log, now=T0 + HOUR)
        _crash(mgr)
        log2 = _manager(data_dir, index_interval_bytes=0, **configs).get("c", 0)
        got = kv(read_all(log2))
        assert got in (appended, model), (n, after)
        assert kv(read_all(log2, max_bytes=1)) == got
        outcomes.add("after" if got == model else "before")
        check_tiling(log2)
        for seg in log2.segments:  # indexes of the segment's own batches (an entry each)
            assert len(seg.index.rel) == len(seg.batch_headers())
        segs = log2.segments
        assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(segs))
        names = [p.name for p in (data_dir / "c-0").iterdir()]
        assert not [n for n in names if n.endswith((".swap", ".cleaned", ".deleted"))]
        compact(log2, now=T0 + HOUR)
        assert kv(read_all(log2)) == model
        assert len(log2.segments) == 2
    assert outcomes == {"before", "after"}


@pytest.mark.parametrize("change", ["retention", "truncation"])
def test_a_crash_right_after_the_log_changed_under_a_swap_brings_nothing_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Found from outside (from reading): the .swap file was made before the check, under
    the lock, that the segment was neither deleted nor truncated meanwhile. Killed in
    between, the next start finished the swap and brought back the deleted segment or the
    truncated records. The .swap is now made under the lock after the check: a change
    meanwhile leaves no .swap to finish, whenever the process dies."""
    mgr = _manager(tmp_path, segment_bytes=1024)
    log = mgr.get_or_create("c", 0)
    for i in range(4):
        log.append(kv_batch([(b"a", b"%d" % i)]))
        log.roll()
    log.append(kv_batch([(b"b", b"x")]))
    mgr.flush_all()
    real_check = cleaner_swap._check_rewritten
    real_fsync_dir = cleaner_swap.fsync_dir

    def check_while_the_log_changes(*args: object) -> None:
        real_check(*args)
        if change == "retention":
            log.delete_records(2)  # segments 0 and 1 go
        else:
            log.truncate_to(1)  # a new leader: offsets 1.. never happened here

    def crash_with_a_swap_on_disk(directory: Path) -> None:
        if list(directory.glob("*.swap")):
            raise SystemExit("crash")
        real_fsync_dir(directory)

    monkeypatch.setattr(cleaner_swap, "_check_rewritten", check_while_the_log_changes)
    monkeypatch.setattr(cleaner_swap, "fsync_dir", crash_with_a_swap_on_disk)
    with contextlib.suppress(SystemExit):
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    expected = kv(read_all(log))
    _crash(mgr)
    log2 = _manager(tmp_path, segment_bytes=1024).get("c", 0)
    if change == "retention":
        assert expected == [(2, b"a", b"2"), (3, b"a", b"3"), (4, b"b", b"x")]
        assert log2.log_start_offset == 2
    else:
        assert expected == [(0, b"a", b"0")]
        assert log2.log_end_offset == 1
    assert kv(read_all(log2)) == expected
    check_tiling(log2)


def test_reads_during_a_merging_pass_see_the_log_before_or_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers take the log's lock for each read and the swap replaces the merged segments
    under it: a read during the pass gets the old segments or the merged one, whole. A read
    result taken before the swap stays readable after it (its bytes are the reader's)."""
    log = make_log(tmp_path / "c-0", segment_bytes=1 << 20)
    for i in range(30):
        log.append(kv_batch([(b"k%d" % (i % 4), b"v%d" % i)], ts=T0 + i))
        log.roll()
    log.append(kv_batch([(b"z", b"active")]))
    before = kv(read_all(log))
    held = log.read(0, 1 << 20)
    seen: list[list] = []
    real_check = cleaner_swap._check_rewritten

    def read_before_swap(*args: object) -> None:
        seen.append(kv(read_all(log)))  # the merged file is written, not yet swapped in
        real_check(*args)

    monkeypatch.setattr(cleaner_swap, "_check_rewritten", read_before_swap)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads: list[list] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                reads.append(kv(read_all(log, max_bytes=300)))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        stats = compact(log, now=T0 + HOUR)
    finally:
        stop.set()
        t.join(30)
    after = kv(read_all(log))
    assert stats.segments_merged == 29 and len(log.segments) == 2
    assert seen == [before]
    assert not errors
    # A read spanning the swap may start in the old segments and end in the merged one:
    # every record it got is one of the log's, in order, and none the pass kept is missing.
    for got in reads:
        assert set(after) <= set(got) <= set(before)
        assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
    assert kv(decode_records(held.data)) == before[:1]  # the old first segment's batch


def test_a_full_disk_while_writing_a_cleaned_segment_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside: ENOSPC while writing ``.cleaned`` left the partial file behind,
    holding the disk's last free space until the next pass or restart. It is removed and
    the error raised; the log is as it was and the next pass does the work."""
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    for i in range(6):
        log.append(kv_batch([(b"a", b"%d" % i), (b"b%d" % i, b"x" * 200)]))
    before = kv(read_all(log))
    real_open = open

    class FullDisk:
        def __init__(self, f: object) -> None:
            self.f = f

        def write(self, data: bytes) -> int:
            self.f.write(bytes(data)[: len(data) // 2])  # type: ignore[attr-defined]
            self.f.flush()  # type: ignore[attr-defined]
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str) -> object:
            return getattr(self.f, name)

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

    def full_disk_open(path: object, *args: object, **kwargs: object) -> object:
        f = real_open(path, *args, **kwargs)  # type: ignore[call-overload]
        return FullDisk(f) if str(path).endswith(".cleaned") else f

    monkeypatch.setattr(cleaner_swap, "open", full_disk_open, raising=False)
    with pytest.raises(OSError) as err:
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC
    assert not [p for p in log.directory.iterdir() if p.suffix in (".cleaned", ".swap")]
    assert kv(read_all(log)) == before
    assert log.first_dirty_offset == 0
    compact(log, now=T0 + HOUR)
    assert kv(read_all(log)) == [r for r in before if r[1] != b"a" or r[2] == b"5"]


def test_an_error_reading_back_a_cleaned_segment_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a failed write: a failure after the ``.cleaned`` file is complete but before it
    becomes the ``.swap`` (the read-back check, the rename) removes it."""
    log = make_log(tmp_path / "c-0", segment_bytes=1024)
    for i in range(6):
        log.append(kv_batch([(b"a", b"%d" % i), (b"b%d" % i, b"x" * 200)]))
    before = kv(read_all(log))

    def failing_check(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(cleaner_swap, "_check_rewritten", failing_check)
    with pytest.raises(OSError, match="Input/output"):
        compact(log, now=T0 + HOUR)
    monkeypatch.undo()
    assert not [p for p in log.directory.iterdir() if p.suffix in (".cleaned", ".swap")]
    assert kv(read_all(log)) == before
