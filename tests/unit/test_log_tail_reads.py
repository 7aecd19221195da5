"""The newest batches' positions (``LogSegment.locate``): a caught-up reader's read goes to
its batch without walking the headers after the last offset-index entry, and gets exactly
what the walk would give, after appends, truncation, reopening and crash recovery."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strom.log import CorruptLogError, Log
from strom.log import segment as segment_module
from strom.log.segment import TAIL_BATCHES
from strom.record import decode_records
from tests.unit.test_log import Clock, batch, crash, make_log

#: One offset-index entry for the whole test log: every read depends on the tail (or walks).
SPARSE = {"index_interval_bytes": 1 << 20}


def fill(log: Log, batches: int, epoch: int = 0) -> None:
    for i in range(batches):
        log.append(batch(1 + i % 3, tag=f"b{i}-"), leader_epoch=epoch)


def walked(log: Log, offset: int) -> tuple[int, int] | None:
    """Where the offset index and a walk over the headers put ``offset`` (the old way)."""
    seg = next(s for s in reversed(log.segments) if s.base_offset <= offset)
    bases, positions = seg._tail_bases, seg._tail_positions
    seg._tail_bases, seg._tail_positions = bases[:0], positions[:0]
    try:
        return seg.locate(offset)
    finally:
        seg._tail_bases, seg._tail_positions = bases, positions


def check_every_offset(log: Log) -> None:
    """Each offset reads from the batch that holds it, as the walk finds it, records in order."""
    for offset in range(log.log_start_offset, log.log_end_offset):
        seg = next(s for s in reversed(log.segments) if s.base_offset <= offset)
        assert seg.locate(offset) == walked(log, offset), offset
        records = list(decode_records(log.read(offset, 1 << 20).data))
        assert records[0].offset <= offset < records[-1].offset + 1
        assert [r.offset for r in records] == list(range(records[0].offset, records[-1].offset + 1))
        assert records[-1].offset == seg.next_offset - 1  # a read ends with its segment


def test_a_tail_read_takes_one_pread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(tmp_path / "t-0", **SPARSE)
    fill(log, 60)
    calls: list[int] = []
    real_pread = os.pread

    def counting(fd: int, n: int, position: int) -> bytes:
        calls.append(position)
        return real_pread(fd, n, position)

    monkeypatch.setattr(segment_module.os, "pread", counting)
    leo = log.log_end_offset
    res = log.read(leo - 1, 1 << 20, max_offset=leo)
    assert [r.offset for r in decode_records(res.data)][-1] == leo - 1
    assert len(calls) == 1  # the data itself; the walk read ~60 headers first
    calls.clear()
    # Without the tail the same read walks from the only index entry, header by header.
    seg = log.segments[-1]
    seg._tail_bases, seg._tail_positions = seg._tail_bases[:0], seg._tail_positions[:0]
    assert log.read(leo - 1, 1 << 20, max_offset=leo).data == res.data
    assert len(calls) > 50


def test_every_offset_after_appends_past_the_tail_bound(tmp_path: Path) -> None:
    log = make_log(tmp_path / "t-0", **SPARSE)
    fill(log, TAIL_BATCHES * 2 + 7)
    seg = log.segments[-1]
    assert 0 < len(seg._tail_bases) <= TAIL_BATCHES
    assert seg._tail_bases[0] > seg.base_offset  # the older batches are walked to
    check_every_offset(log)


def test_every_offset_with_the_default_index_and_rolled_segments(tmp_path: Path) -> None:
    log = make_log(tmp_path / "t-0", segment_bytes=16384)
    fill(log, 300)
    assert len(log.segments) > 2
    check_every_offset(log)


def test_truncation_keeps_the_tail_exact(tmp_path: Path) -> None:
    log = make_log(tmp_path / "t-0", **SPARSE)
    fill(log, 90)
    cut = log.log_end_offset - 40
    log.truncate_to(cut)
    assert log.log_end_offset <= cut
    check_every_offset(log)
    fill(log, 20, epoch=1)  # appends after the cut land where the tail says
    check_every_offset(log)


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_a_reopened_log_reads_its_tail_exactly(tmp_path: Path, how: str) -> None:
    log = make_log(tmp_path / "t-0", **SPARSE)
    fill(log, 70)
    leo = log.log_end_offset
    if how == "clean":
        log.close()
        again = Log(
            log.directory,
            log.config,
            recovery_point=leo,
            clean_shutdown=True,
            fsync=False,
            clock=Clock(),
        )
    else:
        crash(log)
        again = Log(log.directory, log.config, recovery_point=0, fsync=False, clock=Clock())
    assert again.log_end_offset == leo
    assert len(again.segments[-1]._tail_bases) > 0
    check_every_offset(again)
    fill(again, 10)
    check_every_offset(again)


def test_a_damaged_base_offset_at_the_tail_is_refused(tmp_path: Path) -> None:
    """The position comes from memory, the read still checks the batch it finds there."""
    log = make_log(tmp_path / "t-0", **SPARSE)
    fill(log, 10)
    seg = log.segments[-1]
    position, base = seg._tail_positions[-1], seg._tail_bases[-1]
    raw = bytearray(os.pread(seg.fd, 8, position))
    raw[7] ^= 0x01
    os.pwrite(seg.fd, bytes(raw), position)
    with pytest.raises(CorruptLogError, match="offset"):
        log.read(base, 1 << 20)
