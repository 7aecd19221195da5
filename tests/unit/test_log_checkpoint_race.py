"""Checkpoints written from several threads at once (found by the chaos suite, issue 13).

A storage node writes the data dir's checkpoints from its periodic task, from replica
truncation and from deletes, each in a worker thread. They used to share one temporary file
name, so two concurrent writers raced: one ``os.replace`` failed with FileNotFoundError (the
replica fetcher of a partition then stopped for a backoff), or a half-written temp was
renamed into place.
"""

from __future__ import annotations

import threading
from pathlib import Path

from strom.log import LogManager
from strom.log.checkpoint import read_offsets, write_atomic


def test_concurrent_checkpoints_neither_fail_nor_tear(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, fsync=False)
    for p in range(20):
        mgr.get_or_create("t", p)
    errors: list[BaseException] = []

    def hammer() -> None:
        try:
            for _ in range(100):
                mgr.checkpoint()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(read_offsets(tmp_path / "recovery-point-offset-checkpoint")) == 20
    assert not list(tmp_path.glob("*.tmp"))
    mgr.close()


def test_write_atomic_from_many_threads_leaves_one_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(20):
                write_atomic(target, data, fsync=False)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(d,)) for d in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in payloads


def test_a_temp_file_left_by_a_crash_is_removed_on_open(tmp_path: Path) -> None:
    LogManager(tmp_path, fsync=False).close()
    stray = tmp_path / "recovery-point-offset-checkpoint.123.456.tmp"
    stray.write_bytes(b"half")
    LogManager(tmp_path, fsync=False).close()
    assert not stray.exists()


def test_deletes_and_closes_beside_checkpoints_do_not_deadlock(tmp_path: Path) -> None:
    """delete() held the manager's lock while it checkpointed (checkpoint lock second), the
    periodic checkpoint took them the other way round: a node deleting a topic froze for
    good (found from outside). Threads that do both must all finish."""
    mgr = LogManager(tmp_path, fsync=False)
    errors: list[BaseException] = []

    def checkpoints() -> None:
        try:
            for _ in range(300):
                mgr.checkpoint()
        except BaseException as exc:
            errors.append(exc)

    def deletes(base: int) -> None:
        try:
            for i in range(150):
                mgr.get_or_create("x", base + i)
                assert mgr.delete("x", base + i)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=checkpoints, daemon=True),
        threading.Thread(target=checkpoints, daemon=True),
        threading.Thread(target=deletes, args=(0,), daemon=True),
        threading.Thread(target=deletes, args=(1000,), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert errors == []
    closer = threading.Thread(target=mgr.close, daemon=True)
    busy = threading.Thread(target=checkpoints, daemon=True)
    busy.start()
    closer.start()
    closer.join(timeout=60)
    busy.join(timeout=60)
    assert not closer.is_alive() and not busy.is_alive(), "deadlocked"
    assert not list(tmp_path.glob("*.deleted"))
