"""Partition state: leader epochs, the high watermark over the ISR and acks=-1 waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode as E
from strom.log import Log, LogConfig
from strom.record import encode_batch
from strom.storage.partition import Partition


def _state(leader: int, epoch: int, isr: list[int], replicas: list[int] | None = None):
    return md.PartitionState(replicas=replicas or isr, leader=leader, leader_epoch=epoch, isr=isr)


def _log(tmp_path: Path) -> Log:
    return Log(tmp_path / "t-0", LogConfig(), fsync=False)


def test_sole_in_sync_leader_high_watermark_follows_the_log_end(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1]), lambda p, o, n: seen.append((o, n)))
    assert part.is_leader and part.high_watermark == 0
    lg.append(encode_batch([b"a", b"b"]), leader_epoch=0)
    assert part.maybe_advance_high_watermark() and part.high_watermark == 2
    assert seen == [(0, 2)]
    assert not part.maybe_advance_high_watermark()  # nothing new


def test_high_watermark_is_the_minimum_over_the_isr(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3]))
    lg.append(encode_batch([b"x"] * 10), leader_epoch=0)
    assert not part.maybe_advance_high_watermark() and part.high_watermark == 0
    assert not part.record_follower_end_offset(2, 10)
    assert part.record_follower_end_offset(3, 4) and part.high_watermark == 4
    assert part.record_follower_end_offset(3, 10) and part.high_watermark == 10
    # The ISR shrinks to the leader alone: the HW is the LEO.
    lg.append(encode_batch([b"y"]), leader_epoch=0)
    part.apply_state(_state(1, 0, [1], [1, 2, 3]))
    assert part.high_watermark == 11


def test_epoch_checks(tmp_path: Path) -> None:
    part = Partition(1, "t", 0, "id", _log(tmp_path), _state(1, 3, [1]))
    assert part.check_epoch(-1) is None and part.check_epoch(3) is None
    stale, newer = part.check_epoch(2), part.check_epoch(4)
    assert stale is not None and stale.code == E.FENCED_LEADER_EPOCH
    assert newer is not None and newer.code == E.UNKNOWN_LEADER_EPOCH
    assert part.apply_state(_state(2, 4, [2, 1])) and not part.is_leader
    assert not part.apply_state(_state(2, 4, [2]))  # ISR change only


def test_acks_all_waits_resolve_on_commit_timeout_or_lost_leadership(tmp_path: Path) -> None:
    async def main() -> None:
        lg = _log(tmp_path)
        part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2]))
        lg.append(encode_batch([b"x"] * 3), leader_epoch=0)
        waiter = asyncio.create_task(part.wait_for_high_watermark(2, 10.0))
        await asyncio.sleep(0)
        assert not waiter.done()
        part.record_follower_end_offset(2, 3)
        assert await waiter == 2  # committed with 2 replicas in sync
        assert await part.wait_for_high_watermark(5, 0.01) is None  # nothing there: times out
        # The ISR shrinks to the leader alone: the HW jumps to the log end, and the waiter
        # learns that only one replica was in sync when its records were committed.
        lg.append(encode_batch([b"y"] * 2), leader_epoch=0)
        shrunk = asyncio.create_task(part.wait_for_high_watermark(4, 10.0))
        await asyncio.sleep(0)
        assert not shrunk.done()
        part.apply_state(_state(1, 0, [1], replicas=[1, 2]))
        assert await shrunk == 1
        lost = asyncio.create_task(part.wait_for_high_watermark(9, 10.0))
        await asyncio.sleep(0)
        part.apply_state(_state(2, 1, [2]))
        assert await lost is None

    asyncio.run(main())


def test_low_watermark_waits_for_every_in_sync_replica(tmp_path: Path) -> None:
    """DeleteRecords answers once every in-sync follower reported the new log start (Kafka's
    low watermark); a follower leaving the ISR stops holding it back, a lost leadership or
    a timeout ends the wait with None."""

    async def main() -> None:
        lg = _log(tmp_path)
        part = Partition(1, "t", 0, "id", lg, _state(1, 0, [1, 2, 3]))
        lg.append(encode_batch([b"x"] * 10), leader_epoch=0)
        for f in (2, 3):
            part.record_follower_end_offset(f, 10)
        assert part.low_watermark() == -1  # no follower has told its log start yet
        lg.delete_records(6)
        waiter = asyncio.ensure_future(part.wait_for_low_watermark(6, 10.0))
        part.record_follower_log_start(2, 0)
        part.record_follower_log_start(3, 0)
        await asyncio.sleep(0)
        assert not waiter.done() and part.low_watermark() == 0
        part.record_follower_log_start(2, 6)
        await asyncio.sleep(0)
        assert not waiter.done()  # follower 3 still has the records
        part.apply_state(_state(1, 0, [1, 2], [1, 2, 3]))  # 3 leaves the ISR
        assert await waiter == 6
        # A follower joining the ISR before it moved its start holds it back again.
        part.apply_state(md.PartitionState(replicas=[1, 2, 3], leader=1, isr=[1, 2, 3]))
        assert part.low_watermark() == 0
        assert await part.wait_for_low_watermark(6, 0.01) is None  # timeout
        lost = asyncio.ensure_future(part.wait_for_low_watermark(6, 10.0))
        await asyncio.sleep(0)
        part.apply_state(_state(2, 1, [2, 3], [1, 2, 3]))  # leadership moves away
        assert await lost is None
        assert await part.wait_for_low_watermark(6, 10.0) is None  # not the leader

    asyncio.run(main())
