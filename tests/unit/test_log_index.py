"""Unit tests for the sparse per-segment indexes (DESIGN §5): offset index and time index."""

from __future__ import annotations

import struct
from pathlib import Path

from strom.log.index import OffsetIndex, TimeIndex

BASE = 1000


def off_index(tmp_path: Path, entries: list[tuple[int, int]]) -> OffsetIndex:
    idx = OffsetIndex(tmp_path / "00000000000000001000.index", BASE)
    for off, pos in entries:
        idx.append(off, pos)
    return idx


def time_index(tmp_path: Path, entries: list[tuple[int, int]]) -> TimeIndex:
    idx = TimeIndex(tmp_path / "00000000000000001000.timeindex", BASE)
    for ts, off in entries:
        idx.maybe_append(ts, off)
    return idx


# ---------------------------------------------------------------------------- offset index


def test_offset_index_lookup(tmp_path: Path) -> None:
    idx = off_index(tmp_path, [(1000, 0), (1010, 500), (1025, 1200)])
    assert idx.lookup(999) == (1000, 0)  # below everything: segment start
    assert idx.lookup(1000) == (1000, 0)
    assert idx.lookup(1009) == (1000, 0)
    assert idx.lookup(1010) == (1010, 500)
    assert idx.lookup(1024) == (1010, 500)
    assert idx.lookup(1025) == (1025, 1200)
    assert idx.lookup(10**9) == (1025, 1200)
    assert idx.last() == (1025, 1200)
    assert list(idx.rel) == [0, 10, 25]


def test_empty_offset_index(tmp_path: Path) -> None:
    idx = off_index(tmp_path, [])
    assert idx.lookup(5000) == (BASE, 0)
    assert idx.last() == (BASE, 0)


def test_offset_index_flush_is_incremental_and_loads_back(tmp_path: Path) -> None:
    idx = off_index(tmp_path, [(1000, 0), (1010, 500)])
    assert not idx.path.exists()
    idx.flush()
    assert idx.path.stat().st_size == 2 * OffsetIndex.entry_size
    idx.flush()  # nothing new: no change
    assert idx.path.stat().st_size == 2 * OffsetIndex.entry_size
    idx.append(1025, 1200)
    idx.flush(fsync=True)
    raw = idx.path.read_bytes()
    assert raw == b"".join(struct.pack(">ii", r, p) for r, p in [(0, 0), (10, 500), (25, 1200)])

    again = OffsetIndex(idx.path, BASE)
    assert again.load(log_size=2000)
    assert list(again.rel) == [0, 10, 25] and list(again.pos) == [0, 500, 1200]
    assert again.lookup(1030) == (1025, 1200)
    # Appending after a load writes only the new entries.
    again.append(1040, 1900)
    again.flush()
    assert idx.path.stat().st_size == 4 * OffsetIndex.entry_size


def test_offset_index_load_missing_file(tmp_path: Path) -> None:
    idx = off_index(tmp_path, [(1000, 0)])
    assert not idx.load(100)
    assert len(idx.rel) == 0


def test_offset_index_sanity_check_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    idx = OffsetIndex(path, BASE)
    cases = {
        "partial entry": struct.pack(">ii", 0, 0) + b"\x01\x02\x03",
        "offsets not increasing": struct.pack(">iiii", 5, 0, 5, 10),
        "positions not increasing": struct.pack(">iiii", 0, 10, 5, 10),
        "negative offset": struct.pack(">ii", -1, 0),
        "negative position": struct.pack(">ii", 0, -4),
        "position past the log": struct.pack(">iiii", 0, 0, 5, 4096),
        "random garbage": bytes(range(251, 256)) * 8 + b"\xff" * 8,
    }
    for name, data in cases.items():
        path.write_bytes(data)
        assert not idx.load(log_size=4096), name
        assert len(idx.rel) == 0 and len(idx.pos) == 0, name
    path.write_bytes(b"")
    assert idx.load(log_size=0)  # an empty index is sane


def test_offset_index_truncate_and_reset(tmp_path: Path) -> None:
    idx = off_index(tmp_path, [(1000, 0), (1010, 500), (1025, 1200)])
    idx.flush()
    idx.truncate_to_position(1200)  # cut exactly at an entry: it goes
    assert idx.last() == (1010, 500)
    idx.truncate_to_position(501)  # between entries: the earlier stays
    assert idx.last() == (1010, 500)
    assert idx.path.stat().st_size == 2 * OffsetIndex.entry_size
    idx.truncate_to_position(10_000)  # beyond everything: no change
    assert len(idx.rel) == 2
    idx.truncate_to_position(0)
    assert len(idx.rel) == 0
    assert idx.path.stat().st_size == 0
    idx.append(1000, 0)
    idx.flush()
    idx.reset()
    assert len(idx.rel) == 0 and idx.path.read_bytes() == b""


# ------------------------------------------------------------------------------ time index


def test_time_index_records_every_increase(tmp_path: Path) -> None:
    idx = time_index(tmp_path, [(100, 1000), (90, 1005), (100, 1007), (150, 1010), (300, 1020)])
    assert list(idx.ts) == [100, 150, 300]
    assert list(idx.rel) == [0, 10, 20]
    assert idx.max_timestamp == 300
    assert idx.lookup(0) == 1000
    assert idx.lookup(100) == 1000
    assert idx.lookup(101) == 1010
    assert idx.lookup(300) == 1020
    assert idx.lookup(301) is None
    assert time_index(tmp_path, []).lookup(0) is None
    assert time_index(tmp_path, []).max_timestamp == -1


def test_time_index_flush_load(tmp_path: Path) -> None:
    idx = time_index(tmp_path, [(100, 1000), (150, 1010)])
    idx.flush()
    idx.maybe_append(200, 1020)
    idx.flush(fsync=True)
    assert idx.path.stat().st_size == 3 * TimeIndex.entry_size
    again = TimeIndex(idx.path, BASE)
    assert again.load(next_offset=1030)
    assert list(again.ts) == [100, 150, 200] and list(again.rel) == [0, 10, 20]
    # An entry at or past the segment's next offset is insane.
    assert not again.load(next_offset=1020)
    assert len(again.ts) == 0
    assert not TimeIndex(tmp_path / "missing.timeindex", BASE).load(10)


def test_time_index_sanity_check_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "x.timeindex"
    idx = TimeIndex(path, BASE)
    cases = {
        "partial entry": struct.pack(">qi", 1, 0) + b"\x00",
        "timestamps not increasing": struct.pack(">qiqi", 100, 0, 100, 5),
        "offsets going back": struct.pack(">qiqi", 100, 5, 200, 4),
        "negative offset": struct.pack(">qi", 100, -1),
        "random garbage": b"\xa5" * 24,
    }
    for name, data in cases.items():
        path.write_bytes(data)
        assert not idx.load(next_offset=BASE + 100), name
        assert len(idx.ts) == 0, name


def test_time_index_truncate(tmp_path: Path) -> None:
    idx = time_index(tmp_path, [(100, 1000), (150, 1010), (300, 1020)])
    idx.flush()
    idx.truncate_to_offset(1015)
    assert list(idx.ts) == [100, 150]
    assert idx.path.stat().st_size == 2 * TimeIndex.entry_size
    idx.truncate_to_offset(1010)
    assert list(idx.ts) == [100]
    idx.truncate_to_offset(5000)
    assert list(idx.ts) == [100]
    idx.reset()
    assert idx.max_timestamp == -1 and idx.path.read_bytes() == b""
