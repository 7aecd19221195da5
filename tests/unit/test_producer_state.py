"""The idempotent-producer engine alone (strom.log.producer_state, DESIGN §6): sequence and
epoch checks, the last five batches, wrap-around, eviction, expiry and snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strom.log.producer_state import (
    BATCHES_KEPT,
    DUPLICATE_SEQUENCE,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    MAX_SEQUENCE,
    OUT_OF_ORDER_SEQUENCE,
    UNKNOWN_PRODUCER_ID,
    BatchMetadata,
    ProducerStateError,
    ProducerStateManager,
    check_batch,
    list_snapshots,
    load_snapshot,
    next_sequence,
    snapshot_path,
    write_snapshot,
)
from strom.record.header import BatchHeader


def hdr(
    pid: int, epoch: int, seq: int, count: int = 1, base_offset: int = 0, ts: int = 100
) -> BatchHeader:
    """A batch header as a produce request (or the log, with ``base_offset``) carries it."""
    return BatchHeader(
        base_offset=base_offset,
        batch_length=49,
        partition_leader_epoch=0,
        magic=1,
        crc=0,
        attributes=0,
        last_offset_delta=count - 1,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        record_count=count,
    )


class Log:
    """A minimal stand-in for the partition log: offsets, check, update."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.leo = 0
        self.now = 1000

    def append(self, *batches: BatchHeader) -> list[BatchMetadata]:
        dups = self.state.check(batches)
        placed = []
        for h in batches[len(dups) :]:
            n = h.record_count
            placed.append(
                hdr(h.producer_id, h.producer_epoch, h.base_sequence, n, self.leo, h.max_timestamp)
            )
            self.leo += h.record_count
        self.state.update(placed, self.now)
        return dups


def reason(fn: object, *args: object) -> str:
    with pytest.raises(ProducerStateError) as err:
        fn(*args)  # type: ignore[operator]
    return err.value.reason


# -- single batches --------------------------------------------------------------------------


def test_non_idempotent_batches_are_never_checked() -> None:
    log = Log()
    assert log.append(hdr(-1, -1, -1, 3), hdr(-1, -1, -1, 2)) == []
    assert log.append(hdr(-1, -1, -1, 3)) == []  # the "same" batch again: appended again
    assert len(log.state) == 0 and log.leo == 8


def test_new_producer_must_start_at_zero() -> None:
    log = Log()
    assert reason(log.append, hdr(7, 0, 5)) == UNKNOWN_PRODUCER_ID
    assert log.append(hdr(7, 0, 0, 4)) == []
    e = log.state.get(7)
    assert e is not None and (e.epoch, e.last_seq, e.last_offset) == (0, 3, 3)


def test_in_order_appends_and_gaps() -> None:
    log = Log()
    log.append(hdr(1, 0, 0, 2))
    log.append(hdr(1, 0, 2, 3))
    assert reason(log.append, hdr(1, 0, 6, 1)) == OUT_OF_ORDER_SEQUENCE  # 5 is missing
    assert reason(log.append, hdr(1, 0, 3, 3)) == OUT_OF_ORDER_SEQUENCE  # overlaps 2..4
    assert log.leo == 5
    log.append(hdr(1, 0, 5, 1))
    assert log.state.get(1).last_seq == 5  # type: ignore[union-attr]


def test_retries_of_the_last_five_batches_get_their_original_offsets() -> None:
    log = Log()
    originals = []
    seq = 0
    for n in (1, 2, 3, 1, 4, 2, 5):  # seven batches; the last five are remembered
        originals.append((seq, n, log.leo))
        log.append(hdr(3, 0, seq, n))
        seq += n
    leo = log.leo
    for first, n, base in originals[-BATCHES_KEPT:]:
        (dup,) = log.append(hdr(3, 0, first, n))
        assert (dup.first_seq, dup.last_seq, dup.base_offset) == (first, first + n - 1, base)
        assert dup.last_offset == base + n - 1
    assert log.leo == leo  # nothing appended
    # Older batches were appended too, but their offsets are forgotten.
    for first, n, _ in originals[:2]:
        assert reason(log.append, hdr(3, 0, first, n)) == DUPLICATE_SEQUENCE
    # Same first sequence, different length: not a retry of anything.
    first, n, _ = originals[-1]
    assert reason(log.append, hdr(3, 0, first, n + 1)) == OUT_OF_ORDER_SEQUENCE


def test_a_sequence_after_the_last_one_written_is_never_a_duplicate() -> None:
    """FIX (found from outside): a batch in the half of the sequence space before the oldest
    kept batch was answered DUPLICATE_SEQUENCE (as written, offsets forgotten) even when no
    record of the epoch ever had that sequence, so a caller's new records were acknowledged
    and dropped."""
    log = Log()
    for s in range(10):  # sequences 0..9, one record each; 5..9 are kept
        log.append(hdr(6, 0, s))
    for first in (11, 1_500_000_000, 2**30 + 5, MAX_SEQUENCE):
        assert reason(log.append, hdr(6, 0, first)) == OUT_OF_ORDER_SEQUENCE, first
    # Before every kept batch: still taken as a retry of an older batch (the Python producer
    # may have more than five batches of a partition unanswered; module docstring).
    assert reason(log.append, hdr(6, 0, 1, 2)) == DUPLICATE_SEQUENCE
    assert log.leo == 10
    # An epoch that may have wrapped (its newest record's offset is 2**31 or more above its
    # sequence): only half the space after the newest sequence is "after".
    state = ProducerStateManager()
    state.update([hdr(6, 0, 3, 1, base_offset=2**31 + 10)], 0)
    assert reason(state.check, [hdr(6, 0, MAX_SEQUENCE - 5)]) == DUPLICATE_SEQUENCE
    assert reason(state.check, [hdr(6, 0, 100)]) == OUT_OF_ORDER_SEQUENCE


def test_epochs_fence_and_restart_sequences() -> None:
    log = Log()
    log.append(hdr(9, 0, 0, 3))
    assert reason(log.append, hdr(9, 1, 3)) == OUT_OF_ORDER_SEQUENCE  # new epoch must start at 0
    log.append(hdr(9, 1, 0, 2))
    e = log.state.get(9)
    assert e is not None and (e.epoch, e.last_seq, len(e.batches)) == (1, 1, 1)
    assert reason(log.append, hdr(9, 0, 3)) == INVALID_PRODUCER_EPOCH  # the old epoch: fenced
    assert reason(log.append, hdr(9, 0, 0, 3)) == INVALID_PRODUCER_EPOCH  # even its retries
    assert log.append(hdr(9, 1, 0, 2))[0].base_offset == 3  # retry at the current epoch


def test_sequences_wrap_at_2_31() -> None:
    log = Log()
    assert next_sequence(MAX_SEQUENCE) == 0
    # A producer far into its sequences (seeded state) reaches the top and wraps to 0.
    st_ = log.state
    st_.update([hdr(4, 0, MAX_SEQUENCE - 2, 2, base_offset=0)], 0)  # 2^31-3 .. 2^31-2
    log.leo = 2
    h = hdr(4, 0, MAX_SEQUENCE, 3)  # 2^31-1, 0, 1
    assert h.last_sequence == 1
    log.append(h)
    assert st_.get(4).last_seq == 1  # type: ignore[union-attr]
    log.append(hdr(4, 0, 2, 1))
    (dup,) = log.append(hdr(4, 0, MAX_SEQUENCE, 3))  # a retry across the wrap
    assert dup.base_offset == 2
    assert reason(log.append, hdr(4, 0, 0, 1)) == OUT_OF_ORDER_SEQUENCE  # inside a kept batch


def test_idempotent_batches_need_an_epoch_and_a_sequence() -> None:
    log = Log()
    assert reason(log.append, hdr(5, 0, -1)) == INVALID_RECORD
    assert reason(log.append, hdr(5, -1, 0)) == INVALID_RECORD


def test_check_batch_directly() -> None:
    assert check_batch(None, 1, 0, 0, 4) is None
    assert reason(check_batch, None, 1, 0, 1, 4) == UNKNOWN_PRODUCER_ID


# -- several batches in one request ----------------------------------------------------------


def test_a_request_may_hold_consecutive_batches_of_one_producer() -> None:
    log = Log()
    assert log.append(hdr(1, 0, 0, 2), hdr(1, 0, 2, 2), hdr(2, 0, 0, 1), hdr(1, 0, 4, 1)) == []
    assert log.state.get(1).last_seq == 4  # type: ignore[union-attr]
    # Nothing of a request is kept when one batch fails, even if earlier ones were fine.
    leo = log.leo
    assert reason(log.append, hdr(1, 0, 5, 1), hdr(1, 0, 7, 1)) == OUT_OF_ORDER_SEQUENCE
    assert reason(log.append, hdr(1, 0, 5, 1), hdr(1, 0, 5, 1)) == OUT_OF_ORDER_SEQUENCE
    assert reason(log.append, hdr(1, 1, 0, 1), hdr(1, 0, 1, 1)) == INVALID_PRODUCER_EPOCH
    assert log.leo == leo
    # An epoch bump inside the request restarts at 0.
    assert log.append(hdr(1, 0, 5, 1), hdr(1, 1, 0, 1)) == []
    assert log.state.get(1).epoch == 1  # type: ignore[union-attr]


def test_retries_first_then_new_batches() -> None:
    log = Log()
    log.append(hdr(1, 0, 0, 2), hdr(1, 0, 2, 2))
    dups = log.append(hdr(1, 0, 0, 2), hdr(1, 0, 2, 2), hdr(1, 0, 4, 1))
    assert [d.base_offset for d in dups] == [0, 2]
    assert log.leo == 5 and log.state.get(1).last_seq == 4  # type: ignore[union-attr]
    # A retry after new data in the same request is refused: retries are resent alone.
    assert reason(log.append, hdr(1, 0, 5, 1), hdr(1, 0, 4, 1)) == OUT_OF_ORDER_SEQUENCE
    assert reason(log.append, hdr(-1, -1, -1, 1), hdr(1, 0, 4, 1)) == OUT_OF_ORDER_SEQUENCE


# -- eviction, expiry ------------------------------------------------------------------------


def test_evict_below_the_log_start_and_expire_idle_producers() -> None:
    log = Log()
    log.append(hdr(1, 0, 0, 5))  # offsets 0..4
    log.now = 2000
    log.append(hdr(2, 0, 0, 5))  # offsets 5..9
    assert log.state.evict_below(5) == 1
    assert log.state.get(1) is None and log.state.get(2) is not None
    assert reason(log.append, hdr(1, 0, 5)) == UNKNOWN_PRODUCER_ID
    log.append(hdr(1, 1, 0))  # a bumped epoch starts over
    log.now = 5000
    log.append(hdr(1, 1, 1))
    assert log.state.expire(now_ms=2000 + 3000, expiration_ms=3000) == 1  # 2 seen at 2000
    assert [e.producer_id for e in log.state] == [1]
    assert log.state.expire(now_ms=10**12, expiration_ms=-1) == 0


# -- snapshots -------------------------------------------------------------------------------


def test_snapshot_files_round_trip_and_detect_damage(tmp_path: Path) -> None:
    log = Log()
    for pid in (1, 2, 3):
        for seq in range(7):
            log.append(hdr(pid, pid, seq, 1, ts=pid * 10 + seq))
    path = write_snapshot(tmp_path, log.leo, log.state)
    assert path == snapshot_path(tmp_path, log.leo) and list_snapshots(tmp_path) == [log.leo]
    back = load_snapshot(tmp_path, log.leo)
    assert {e.producer_id: (e.epoch, list(e.batches), e.last_seen_ms) for e in back} == {
        e.producer_id: (e.epoch, list(e.batches), e.last_seen_ms) for e in log.state
    }
    data = bytearray(path.read_bytes())
    data[30] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC"):
        load_snapshot(tmp_path, log.leo)
    path.write_bytes(b"")
    with pytest.raises(ValueError):
        load_snapshot(tmp_path, log.leo)
    empty = ProducerStateManager()
    assert len(ProducerStateManager.from_bytes(empty.to_bytes(0))[1]) == 0


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=20),
    start=st.one_of(st.just(0), st.integers(MAX_SEQUENCE - 200, MAX_SEQUENCE)),
)
def test_every_kept_batch_is_a_duplicate_and_only_the_next_sequence_appends(
    sizes: list[int], start: int
) -> None:
    state = ProducerStateManager()
    batches = []
    # A real log: an epoch's sequences start at 0 and each record took an offset, so a
    # producer at sequence ``start`` is at least that far into the log.
    seq, offset = start, start
    for n in sizes:
        h = hdr(11, 0, seq, n, base_offset=offset)
        if not batches and seq != 0:
            state.update([h], 0)  # seed the state (a producer mid-way through its sequences)
        else:
            assert state.check([hdr(11, 0, seq, n)]) == []
            state.update([h], 0)
        batches.append(h)
        seq, offset = next_sequence(seq, n), offset + n
    for i, h in enumerate(batches):
        retry = hdr(11, 0, h.base_sequence, h.record_count)
        if i >= len(batches) - BATCHES_KEPT:
            (dup,) = state.check([retry])
            assert (dup.base_offset, dup.last_offset) == (h.base_offset, h.last_offset)
        else:
            assert reason(state.check, [retry]) == DUPLICATE_SEQUENCE
    assert state.check([hdr(11, 0, seq, 1)]) == []
    for gap in (1, 2, 1000):
        assert reason(state.check, [hdr(11, 0, next_sequence(seq, gap), 1)]) == (
            OUT_OF_ORDER_SEQUENCE
        )
    assert ProducerStateManager.from_bytes(state.to_bytes(offset))[1].get(11).batches == (  # type: ignore[union-attr]
        state.get(11).batches  # type: ignore[union-attr]
    )
