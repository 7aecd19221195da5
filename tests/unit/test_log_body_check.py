"""Batch bodies a reader cannot decode (found from outside: a raw Produce of garbage under a
valid header and CRC was acknowledged, then stopped every reader of the partition there).

The leader's append decodes each data batch's body as its readers will and refuses what they
could not read, nothing appended; batches already stored that way (written before the check,
or a disk that rots under a recomputed CRC) are kept whole by compaction, reported once, and
answered CORRUPT_MESSAGE-worthy by ListOffsets by time (UndecodableBatchError)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from strom.log import CorruptLogError, Log, LogConfig, UndecodableBatchError, compact
from strom.record import InvalidBatchError, decode_records, encode_batch
from strom.record.batch import RecordBatch
from tests.unit.reframe import garbage_body_variants, rot_stored_body

T0 = 1_700_000_000_000


def make(path: Path, **configs: object) -> Log:
    cfg = LogConfig.from_dict({k.replace("_", "."): v for k, v in configs.items()})
    return Log(path, cfg, fsync=False)


def values(log: Log, offset: int = 0) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = max(offset, log.log_start_offset)
    while offset < log.log_end_offset:
        res = log.read(offset, 1 << 24)
        out.extend((r.offset, r.value) for r in decode_records(res.data) if r.offset >= offset)
        offset = res.next_offset
    return out


GOOD = encode_batch([b"a", b"b", b"c"])


@pytest.mark.parametrize("name", sorted(garbage_body_variants(GOOD)))
@pytest.mark.parametrize("before_max_ms", [None, 10**9])
def test_the_leader_refuses_a_body_its_readers_cannot_decode(
    tmp_path: Path, name: str, before_max_ms: int | None
) -> None:
    """Each variant is refused CORRUPT (InvalidBatchError naming the batch), with or
    without a timestamp check that reads the body anyway; nothing is appended, and a good
    batch after it takes offset 0 and reads back."""
    configs = {} if before_max_ms is None else {"message_timestamp_before_max_ms": before_max_ms}
    log = make(tmp_path / "t-0", **configs)
    bad = garbage_body_variants(GOOD)[name]
    with pytest.raises(InvalidBatchError, match="batch at byte 0"):
        log.append(bad)
    with pytest.raises(InvalidBatchError, match=f"batch at byte {len(GOOD)}"):
        log.append(GOOD + bad)  # a request is refused whole
    assert log.log_end_offset == 0
    assert log.append(GOOD).first_offset == 0
    assert values(log) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_follower_takes_the_leaders_bytes_without_decoding(tmp_path: Path) -> None:
    """Replication copies what the leader took; the check is the leader's alone (a follower
    refusing would stop replication of a log already holding such a batch)."""
    bad = bytearray(garbage_body_variants(GOOD)["zeros"])
    follower = make(tmp_path / "f-0")
    assert follower.append_as_follower(bytes(bad)) is not None
    assert follower.log_end_offset == 3


def compacted_log(tmp_path: Path) -> Log:
    """A compacted log of one-record batches, keys k0..k2 written three times over, in
    several sealed segments."""
    log = make(tmp_path / "c-0", segment_bytes=2048, cleanup_policy="compact")
    for i in range(18):
        log.append(encode_batch([f"v{i}".encode()], keys=[f"k{i % 3}".encode()]))
    log.roll()
    assert len(log.segments) > 2
    return log


def test_compaction_keeps_an_undecodable_stored_batch_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cleaner cannot know such a batch's keys: it keeps it as it is, compacts the rest
    (the pass completes), and logs one WARNING per partition, not one every pass."""
    log = compacted_log(tmp_path)
    rotted = rot_stored_body(log.directory, 4)
    with caplog.at_level(logging.WARNING, logger="strom.log.cleaner"):
        stats = compact(log)
        assert stats.undecodable_batches == 1
        assert stats.records_after < stats.records_before
        again = compact(log)  # a later pass: the same batch, no second warning
    assert again.undecodable_batches == 1
    warnings = [r for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert len(warnings) == 1 and "offset 4" in warnings[0].getMessage()
    assert log.read(4, 1, min_one=True).data[: len(rotted)] == rotted  # kept as it was
    # Every key's latest record survives, most older ones went.
    assert values(log, 5) == [(15, b"v15"), (16, b"v16"), (17, b"v17")]


def test_a_compaction_pass_decodes_an_undecodable_batch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads a segment up to three times (key map, transactions, rewrite); the
    batch that failed to decode is remembered for the rest of the pass, not decoded again."""
    log = compacted_log(tmp_path)
    rot_stored_body(log.directory, 4)
    failures: list[int] = []
    real = RecordBatch.body

    def body(self: RecordBatch) -> object:
        try:
            return real(self)
        except InvalidBatchError:
            failures.append(self.header.base_offset)
            raise

    monkeypatch.setattr(RecordBatch, "body", body)
    assert compact(log).undecodable_batches == 1
    assert failures == [4]
    failures.clear()
    compact(log)  # each pass decodes it once again (a new pass may see a rewritten log)
    assert failures == [4]


def test_time_lookups_over_an_undecodable_stored_batch_name_its_offset(tmp_path: Path) -> None:
    """ListOffsets by time decodes the batch holding the match: an undecodable one is an
    UndecodableBatchError naming its offset (the storage node answers CORRUPT_MESSAGE), not
    an unexpected error."""
    log = make(tmp_path / "t-0")
    for i in range(4):
        log.append(encode_batch([b"x", b"y"], timestamps=[T0 + 10 * i, T0 + 10 * i + 1]))
    rot_stored_body(log.directory, 4)
    assert log.offset_for_timestamp(T0 + 5)[:2] == (2, T0 + 10)
    with pytest.raises(UndecodableBatchError, match="batch at offset 4") as err:
        log.offset_for_timestamp(T0 + 15)
    assert err.value.offset == 4
    # Not disk damage: the handlers of CorruptLogError (leadership moves, a cleaner pass or
    # a follower stops) must not take the producer's bytes, the same on every replica, for it.
    assert not isinstance(err.value, CorruptLogError)
    rot_stored_body(log.directory, 6)  # the newest batch: max-timestamp lookups read it
    with pytest.raises(UndecodableBatchError, match="batch at offset 6"):
        log.max_timestamp_offset()
