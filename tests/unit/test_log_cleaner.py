"""When the log cleaner cleans (issue 9, item 4): Kafka's rules on a deterministic clock.

A compacted log is due when its dirty ratio (bytes not cleaned since the last pass over
clean + those bytes, counting only the cleanable part) is above min.cleanable.dirty.ratio, or
at once when its oldest dirty segment is older than max.compaction.lag.ms; the dirtiest log is
cleaned first; the high watermark and min.compaction.lag.ms bound what may be cleaned; the
first dirty offset survives restarts (cleaner-offset-checkpoint) and truncation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.log import (
    Log,
    LogConfig,
    LogManager,
    cleanable_range,
    compact,
    dirtiest_first,
    measure_logs,
    select_logs,
)
from strom.log.manager import CLEANER_OFFSETS
from strom.record import decode_records, encode_batch

T0 = 1_700_000_000_000
HOUR = 3_600_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def config(**overrides: object) -> LogConfig:
    base: dict[str, object] = {"cleanup.policy": "compact", "delete.retention.ms": HOUR}
    base.update({k.replace("_", "."): v for k, v in overrides.items()})
    return LogConfig.from_dict(base)


def make(path: Path, clock: Clock | None = None, **overrides: object) -> Log:
    clock = clock or Clock()
    return Log(path, config(**overrides), fsync=False, clock=clock, monotonic=clock)


def add_segment(log: Log, keys: list[bytes], ts: int = T0, tag: bytes = b"v") -> None:
    """One batch (same size for the same number of keys) in a segment of its own."""
    log.append(encode_batch([tag] * len(keys), keys=keys, timestamps=[ts] * len(keys)))
    log.roll()


def values(log: Log) -> dict[bytes | None, list[bytes | None]]:
    out: dict[bytes | None, list[bytes | None]] = {}
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        res = log.read(offset, 1 << 20)
        for r in decode_records(res.data):
            if r.offset >= offset:
                out.setdefault(r.key, []).append(r.value)
        offset = res.next_offset
    return out


def segment_sizes(log: Log) -> list[int]:
    return [s.size for s in log.segments[:-1]]


# -------------------------------------------------------------------------------- dirty ratio


def test_a_new_log_is_all_dirty_and_due(tmp_path: Path) -> None:
    log = make(tmp_path / "c-0")
    for i in range(4):
        add_segment(log, [b"k%d" % i])
    r = cleanable_range(log)
    assert (r.first_dirty_offset, r.first_uncleanable_offset) == (0, 4)
    assert (r.clean_bytes, r.cleanable_bytes) == (0, sum(segment_sizes(log)))
    assert r.dirty_ratio == 1.0 and r.due and not r.needs_compaction_now
    # An empty log, or one with only an active segment, has nothing to clean.
    empty = make(tmp_path / "c-1")
    assert not cleanable_range(empty).due
    empty.append(encode_batch([b"v"], keys=[b"k"], timestamps=[T0]))
    assert not cleanable_range(empty).due and cleanable_range(empty).total_bytes == 0


def test_dirty_ratio_decides_against_min_cleanable_dirty_ratio(tmp_path: Path) -> None:
    log = make(tmp_path / "c-0", min_cleanable_dirty_ratio="0.5")
    for i in range(4):  # distinct keys: cleaning removes nothing, sizes stay equal
        add_segment(log, [b"k%d" % i])
    stats = compact(log)
    assert stats.first_dirty_offset == 4 == log.first_dirty_offset
    after = cleanable_range(log)
    assert after.cleanable_bytes == 0 and after.dirty_ratio == 0.0 and not after.due
    add_segment(log, [b"k9"])  # 1 dirty segment after 4 clean ones: ratio 1/5
    r = cleanable_range(log)
    size = segment_sizes(log)[-1]  # the clean four were merged into one segment
    assert (r.clean_bytes, r.cleanable_bytes) == (4 * size, size)
    assert r.dirty_ratio == pytest.approx(0.2)
    assert not r.due  # 0.2 is not above 0.5
    for ratio, due in [("0.19", True), ("0.2", False), ("0.21", False), ("0", True)]:
        log.update_config(config(min_cleanable_dirty_ratio=ratio))
        assert cleanable_range(log).due is due, ratio  # Kafka: due when strictly above
    for _ in range(4):  # 5 of 9 dirty: above one half
        add_segment(log, [b"k9"])
    log.update_config(config(min_cleanable_dirty_ratio="0.5"))
    r = cleanable_range(log)
    assert r.dirty_ratio == pytest.approx(5 / 9) and r.due
    compact(log)
    assert log.first_dirty_offset == 9 and not cleanable_range(log).due
    assert values(log)[b"k9"] == [b"v"]  # four older k9 records cleaned away


# ------------------------------------------------------------------------ max compaction lag


def test_max_compaction_lag_forces_a_clean_below_the_ratio(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = make(
        tmp_path / "c-0", clock, min_cleanable_dirty_ratio="0.9", max_compaction_lag_ms="1000"
    )
    for i in range(9):
        add_segment(log, [b"k%d" % i], ts=T0)
    compact(log, now=T0)
    add_segment(log, [b"k0"], ts=T0 + 500)  # the dirty segment's first batch: T0 + 500
    assert cleanable_range(log, now=T0 + 1500).compaction_delay_ms == 0
    assert not cleanable_range(log, now=T0 + 1500).due  # ratio 0.1 and lag not passed
    r = cleanable_range(log, now=T0 + 1501)
    assert r.dirty_ratio == pytest.approx(0.1)
    assert r.compaction_delay_ms == 1 and r.needs_compaction_now and r.due
    compact(log, now=T0 + 1501)
    assert values(log)[b"k0"] == [b"v"] and log.first_dirty_offset == 10
    assert cleanable_range(log, now=T0 + 10**9).compaction_delay_ms == 0  # nothing dirty


def test_max_compaction_lag_needs_something_cleanable(tmp_path: Path) -> None:
    """Past the lag but held back by min.compaction.lag.ms (a young record in the same
    segment): nothing is cleanable, so the log is not due (Kafka: cleanableBytes > 0)."""
    log = make(tmp_path / "c-0", max_compaction_lag_ms="1000", min_compaction_lag_ms="1000")
    log.append(encode_batch([b"a"], keys=[b"k"], timestamps=[T0]))
    # (999 ms later by record time: one more would roll the segment, segment.ms counting
    # record time as Kafka's does.)
    log.append(encode_batch([b"b"], keys=[b"k"], timestamps=[T0 + 999]))
    log.roll()
    r = cleanable_range(log, now=T0 + 1500)
    assert r.needs_compaction_now and r.cleanable_bytes == 0 and not r.due
    assert cleanable_range(log, now=T0 + 2000).due


def test_active_segment_rolls_by_max_compaction_lag(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = make(tmp_path / "c-0", clock, max_compaction_lag_ms="1000")
    log.append(encode_batch([b"a"], keys=[b"k"], timestamps=[T0]))
    clock.now = T0 + 999
    log.append(encode_batch([b"b"], keys=[b"k"], timestamps=[clock.now]))
    assert len(log.segments) == 1
    clock.now = T0 + 1000  # segment.ms is 7 days, but a compacted log rolls by the lag
    log.append(encode_batch([b"c"], keys=[b"k"], timestamps=[clock.now]))
    assert [s.base_offset for s in log.segments] == [0, 2]
    assert cleanable_range(log, now=clock.now + 1).due


# ------------------------------------------------------------------- what may not be cleaned


def test_min_compaction_lag_bounds_the_cleanable_range(tmp_path: Path) -> None:
    log = make(tmp_path / "c-0", min_compaction_lag_ms="1000")
    add_segment(log, [b"k"], ts=T0)
    add_segment(log, [b"k"], ts=T0 + 500)
    add_segment(log, [b"k"], ts=T0 + 900)
    size = segment_sizes(log)[0]
    r = cleanable_range(log, now=T0 + 1000)
    assert (r.first_uncleanable_offset, r.cleanable_bytes) == (1, size)
    assert r.dirty_ratio == 1.0  # only the cleanable part counts
    r = cleanable_range(log, now=T0 + 1500)
    assert (r.first_uncleanable_offset, r.cleanable_bytes) == (2, 2 * size)
    compact(log, now=T0 + 1000)
    assert log.first_dirty_offset == 1


def test_high_watermark_bounds_cleaning_and_the_key_map(tmp_path: Path) -> None:
    """Records at or above the high watermark may still be truncated (a new leader without
    them): they must not make older records obsolete, and their segments are not cleaned."""
    log = make(tmp_path / "c-0")
    add_segment(log, [b"a"], tag=b"old")  # offset 0
    add_segment(log, [b"a"], tag=b"new")  # offset 1, not yet replicated
    add_segment(log, [b"b"])  # offset 2
    r = cleanable_range(log, max_offset=1)
    assert r.first_uncleanable_offset == 1 and r.cleanable_bytes == segment_sizes(log)[0]
    compact(log, max_offset=1)
    assert values(log)[b"a"] == [b"old", b"new"]  # "new" is above the high watermark
    assert log.first_dirty_offset == 1
    compact(log, max_offset=3)  # once replicated, "new" wins
    assert values(log)[b"a"] == [b"new"] and log.first_dirty_offset == 3


# -------------------------------------------------------------------------------- selection


def test_dirtiest_log_is_cleaned_first(tmp_path: Path) -> None:
    logs: dict[str, Log] = {}
    for name, clean, dirty in [("low", 3, 1), ("high", 1, 3), ("mid", 2, 2), ("none", 4, 0)]:
        lg = make(tmp_path / name, min_cleanable_dirty_ratio="0.2")
        for i in range(clean):
            add_segment(lg, [b"c%d" % i])
        compact(lg)
        for i in range(dirty):
            add_segment(lg, [b"d%d" % i])
        logs[name] = lg
    deleting = make(tmp_path / "del")
    deleting.update_config(LogConfig.from_dict({"cleanup.policy": "delete"}))
    add_segment(deleting, [b"x"])
    candidates = [(name, lg, None) for name, lg in logs.items()] + [("del", deleting, None)]
    measured = measure_logs(candidates)
    assert [name for name, _ in measured] == ["low", "high", "mid", "none"]  # no "del"
    order = select_logs(candidates)
    assert [name for name, _ in order] == ["high", "mid", "low"]  # "none" is not due
    assert [round(r.dirty_ratio, 2) for _, r in order] == [0.75, 0.5, 0.25]
    assert dirtiest_first(measured) == order
    # With a higher minimum only the dirtiest stays due.
    for lg in logs.values():
        lg.update_config(config(min_cleanable_dirty_ratio="0.6"))
    assert [name for name, _ in select_logs(candidates)] == ["high"]


# --------------------------------------------------------------------- checkpoint, truncation


def test_first_dirty_offset_survives_a_restart(tmp_path: Path) -> None:
    configs = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.5"}
    mgr = LogManager(tmp_path, fsync=False, configs=lambda topic: configs)
    log = mgr.get_or_create("t", 0)
    for i in range(4):
        add_segment(log, [b"k%d" % i])
    compact(log)
    add_segment(log, [b"k9"])
    # On reopen the empty active segment is dropped and the newest one becomes active.
    add_segment(log, [b"k8"])
    mgr.close()
    assert (tmp_path / CLEANER_OFFSETS).exists()
    mgr2 = LogManager(tmp_path, fsync=False, configs=lambda topic: configs)
    log2 = mgr2.get("t", 0)
    assert log2 is not None and log2.first_dirty_offset == 4
    r = cleanable_range(log2)
    assert r.dirty_ratio == pytest.approx(0.2) and not r.due  # not all dirty again
    mgr2.close()


def test_truncation_and_retention_move_the_first_dirty_offset(tmp_path: Path) -> None:
    log = make(tmp_path / "c-0")
    for i in range(4):
        add_segment(log, [b"k%d" % i])
    compact(log)
    assert log.first_dirty_offset == 4
    log.truncate_to(2)  # a follower truncating: the checkpoint never points past the end
    assert log.first_dirty_offset == 2
    add_segment(log, [b"k2"])
    add_segment(log, [b"k3"])
    log.delete_records(3)  # the log start passes the checkpoint: measured from the start
    assert cleanable_range(log).first_dirty_offset == 3
    log.truncate_fully_and_start_at(10)
    assert log.first_dirty_offset == 10
    # A checkpoint outside the log (damaged, or from a log that was replaced) counts as
    # "everything dirty", as Kafka does.
    log.close()
    reopened = Log(tmp_path / "c-0", config(), fsync=False, first_dirty_offset=99)
    assert reopened.first_dirty_offset == reopened.log_start_offset


# ------------------------------------------------------------------ emptied batches shrink


def test_emptied_batches_merge_except_each_producers_recent_ones(tmp_path: Path) -> None:
    """An Arrow body costs ~600 bytes even empty, so a segment of small batches whose records
    are all superseded must not stay almost as large as it was: emptied batches merge into one,
    except each idempotent producer's last five (the producer state is rebuilt from them).
    Before, emptied idempotent batches were all kept, and a compacted log of small batches
    barely shrank, which kept its dirty ratio low for ever."""
    from strom.log.producer_state import list_snapshots, snapshot_path

    d = tmp_path / "c-0"
    log = make(d)
    for seq in range(30):
        log.append(
            encode_batch(
                [b"v%d" % seq],
                keys=[b"k"],
                timestamps=[T0 + seq],
                producer_id=7,
                producer_epoch=0,
                base_sequence=seq,
            )
        )
    log.roll()
    log.append(encode_batch([b"latest"], keys=[b"k"], timestamps=[T0]))
    before = log.segments[0].size
    max_ts = log.segments[0].max_timestamp
    compact(log)
    seg = log.segments[0]
    headers = seg.batch_headers()
    assert [(h.base_offset, h.last_offset, h.producer_id) for h in headers] == [
        (0, 24, -1),  # one empty batch for the 25 older ones
        *[(o, o, 7) for o in range(25, 30)],  # the producer's last five keep their headers
    ]
    assert [h.base_sequence for h in headers[1:]] == [25, 26, 27, 28, 29]
    assert seg.size < before / 4
    assert seg.max_timestamp == max_ts == T0 + 29  # the merged run keeps its newest time
    assert values(log) == {b"k": [b"latest"]}
    # A rebuild from the headers alone (no snapshot) finds the same producer state, so a
    # retry of the producer's last batch is still recognised.
    log.close()
    for off in list_snapshots(d):
        snapshot_path(d, off).unlink()
    log2 = make(d)
    assert {e.producer_id: e.last_seq for e in log2.producers} == {7: 29}
    retry = encode_batch(
        [b"v29"], keys=[b"k"], timestamps=[T0 + 29], producer_id=7, producer_epoch=0,
        base_sequence=29,
    )  # fmt: skip
    again = log2.append(retry)
    assert again.duplicates == 1 and again.first_offset == 29
