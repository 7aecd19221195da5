"""Unit tests for the leader-epoch cache and its checkpoint file (DESIGN §5, §6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from strom.log.epoch_cache import FILE_NAME, LeaderEpochCache
from strom.log.errors import InvalidAppendError


def make(tmp_path: Path, entries: list[tuple[int, int]] = ()) -> LeaderEpochCache:  # type: ignore[assignment]
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def test_empty(tmp_path: Path) -> None:
    cache = make(tmp_path)
    assert cache.entries() == []
    assert cache.latest_epoch == -1
    assert cache.epoch_for(0) == -1
    assert cache.end_offset_for(0, 10) == (-1, -1)
    assert not (tmp_path / FILE_NAME).exists()  # nothing written until there is history


def test_assign_and_lookup(tmp_path: Path) -> None:
    cache = make(tmp_path)
    assert cache.assign(0, 0)
    assert not cache.assign(0, 5)  # same epoch: no change
    assert cache.assign(3, 10)
    assert cache.assign(4, 25)
    assert not cache.assign(-1, 30)  # unset epochs are ignored
    assert cache.entries() == [(0, 0), (3, 10), (4, 25)]
    assert cache.latest_epoch == 4
    assert [cache.epoch_for(o) for o in (0, 9, 10, 24, 25, 1000)] == [0, 0, 3, 3, 4, 4]


def test_epoch_before_first_entry(tmp_path: Path) -> None:
    cache = make(tmp_path, [(2, 100)])
    assert cache.epoch_for(99) == -1
    assert cache.epoch_for(100) == 2


def test_assign_rejects_going_back(tmp_path: Path) -> None:
    cache = make(tmp_path, [(1, 0), (2, 10)])
    with pytest.raises(InvalidAppendError, match="older"):
        cache.assign(1, 20)
    with pytest.raises(InvalidAppendError, match="before"):
        cache.assign(3, 5)
    assert cache.entries() == [(1, 0), (2, 10)]


def test_end_offset_for(tmp_path: Path) -> None:
    cache = make(tmp_path, [(1, 0), (3, 10), (6, 25)])
    leo = 40
    assert cache.end_offset_for(0, leo) == (-1, -1)  # older than all history
    assert cache.end_offset_for(1, leo) == (1, 10)
    assert cache.end_offset_for(2, leo) == (1, 10)  # unknown epoch: the largest below it
    assert cache.end_offset_for(3, leo) == (3, 25)
    assert cache.end_offset_for(5, leo) == (3, 25)
    assert cache.end_offset_for(6, leo) == (6, leo)
    assert cache.end_offset_for(9, leo) == (6, leo)


def test_truncate_from_end(tmp_path: Path) -> None:
    cache = make(tmp_path, [(1, 0), (3, 10), (6, 25)])
    cache.truncate_from_end(30)  # nothing starts at or after 30
    assert cache.entries() == [(1, 0), (3, 10), (6, 25)]
    cache.truncate_from_end(25)
    assert cache.entries() == [(1, 0), (3, 10)]
    cache.truncate_from_end(11)
    assert cache.entries() == [(1, 0), (3, 10)]
    cache.truncate_from_end(0)
    assert cache.entries() == []
    assert LeaderEpochCache(tmp_path).entries() == []


def test_truncate_from_start(tmp_path: Path) -> None:
    cache = make(tmp_path, [(1, 0), (3, 10), (6, 25)])
    cache.truncate_from_start(0)
    assert cache.entries() == [(1, 0), (3, 10), (6, 25)]
    cache.truncate_from_start(5)  # the epoch covering 5 now starts there
    assert cache.entries() == [(1, 5), (3, 10), (6, 25)]
    cache.truncate_from_start(10)  # epoch 1 is wholly below 10
    assert cache.entries() == [(3, 10), (6, 25)]
    cache.truncate_from_start(30)
    assert cache.entries() == [(6, 30)]
    assert cache.epoch_for(30) == 6
    assert LeaderEpochCache(tmp_path).entries() == [(6, 30)]
    # Below the first entry: nothing to forget.
    cache.truncate_from_start(2)
    assert cache.entries() == [(6, 30)]


def test_persistence_across_reopen(tmp_path: Path) -> None:
    make(tmp_path, [(0, 0), (2, 7), (5, 100)])
    text = (tmp_path / FILE_NAME).read_text()
    assert text == "0\n3\n0 0\n2 7\n5 100\n"  # Kafka's format: version, count, entries
    again = LeaderEpochCache(tmp_path)
    assert again.entries() == [(0, 0), (2, 7), (5, 100)]
    assert again.latest_epoch == 5
    assert not again.damaged
    again.clear()
    assert LeaderEpochCache(tmp_path).entries() == []
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


@pytest.mark.parametrize(
    "content",
    [
        "",
        "garbage",
        "1\n1\n0 0\n",  # unknown version
        "0\n2\n0 0\n",  # count does not match
        "0\nx\n0 0\n",
        "0\n1\n0\n",
        "0\n1\n0 zero\n",
        "0\n2\n0 0\n1 2 3\n",
    ],
)
def test_damaged_checkpoint_reads_as_empty(tmp_path: Path, content: str) -> None:
    (tmp_path / FILE_NAME).write_text(content)
    cache = LeaderEpochCache(tmp_path)
    assert cache.entries() == []
    assert cache.latest_epoch == -1
    assert cache.damaged
    # And it can be written over.
    cache.assign(1, 0)
    assert LeaderEpochCache(tmp_path).entries() == [(1, 0)]


def test_binary_garbage_checkpoint_reads_as_empty(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"\xff\xfe\x00\x81" * 10)
    cache = LeaderEpochCache(tmp_path)
    assert cache.entries() == []
    assert cache.damaged


def test_inconsistent_checkpoint_keeps_consistent_prefix(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("0\n4\n1 0\n3 10\n2 20\n5 30\n")
    cache = LeaderEpochCache(tmp_path)
    assert cache.entries() == [(1, 0), (3, 10)]
    assert cache.damaged


def test_clear_writes_only_when_there_was_history(tmp_path: Path) -> None:
    """Start-up clears every untrusted cache: an empty one costs no checkpoint write, one
    with history is emptied on disk too (a reload sees no epochs)."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    empty = make(tmp_path / "a")
    empty.clear()
    assert not (tmp_path / "a" / FILE_NAME).exists()
    full = make(tmp_path / "b", [(1, 0), (3, 10)])
    full.clear()
    assert full.entries() == [] and LeaderEpochCache(tmp_path / "b").entries() == []
