"""Stateful property test of the storage engine (DESIGN §5).

Random sequences of appends, flushes, clean restarts, crashes with random damage to the
files, retention, DeleteRecords and compaction, on small segments so that they roll often.
The model is every record ever appended, by offset. After every step a full read must
serve offsets in strictly increasing order, each record equal to the model's record at that
offset, and (while nothing was compacted or lost in a crash) no gaps between the log start
and the log end. A ``CorruptLogError`` on read is accepted only after a byte was flipped on
disk: it is how damage is detected, and damage must never be served.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from strom.log import CorruptLogError, LogManager, compact
from strom.record import InvalidBatchError, decode_batches, encode_batch

T0 = 1_700_000_000_000
KEYS = [b"a", b"b", b"c", b"d", b"e", None]
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TOPIC = "p"

Entry = tuple[bytes | None, bytes | None]

record_st = st.tuples(
    st.sampled_from(KEYS),
    st.none() | st.binary(max_size=120),
)
batch_st = st.tuples(st.lists(record_st, min_size=1, max_size=12), st.sampled_from(CODECS))
request_st = st.lists(batch_st, min_size=1, max_size=3)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class LogMachine(RuleBasedStateMachine):
    """Drives one partition log through a LogManager, like a storage node would."""

    @initialize(
        segment_bytes=st.sampled_from([1024, 2048, 4096]),
        compacted=st.booleans(),
        interval=st.sampled_from([0, 1024, 4096]),
        initial=st.lists(request_st, max_size=8),
    )
    def start(
        self,
        segment_bytes: int,
        compacted: bool,
        interval: int,
        initial: list[list[tuple[list[Entry], str]]],
    ) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="strom-prop-"))
        self.clock = Clock()
        self.conf = {
            "segment.bytes": str(segment_bytes),
            "index.interval.bytes": str(interval),
            "cleanup.policy": "compact,delete" if compacted else "delete",
            "retention.ms": "-1",
            "delete.retention.ms": "0",
            "segment.ms": "20000",
        }
        self.manager = self._open_manager()
        self.log = self.manager.get_or_create(TOPIC, 0)
        self.model: dict[int, Entry] = {}
        self.epoch = 0
        self.damaged = False  # a byte was flipped in a file: CorruptLogError allowed
        self.holes = False  # compaction (or damage) may leave offsets without records
        self.ts = T0
        self.reads = 0
        for request in initial:
            self._append(request, False, 0)

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            for _, log in self.manager:
                log.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------

    def _open_manager(self) -> LogManager:
        return LogManager(self.tmp, fsync=False, clock=self.clock, configs=lambda t: self.conf)

    @property
    def dir(self) -> Path:
        return self.tmp / f"{TOPIC}-0"

    def _files(self, suffix: str) -> list[Path]:
        return sorted(p for p in self.dir.glob(f"*{suffix}") if p.is_file())

    def _reopened(self) -> None:
        log = self.manager.get(TOPIC, 0)
        assert log is not None
        self.log = log
        leo = log.log_end_offset
        # Offsets at or past the recovered end may be assigned again: forget them.
        for off in [o for o in self.model if o >= leo]:
            del self.model[off]
        self.epoch = max(self.epoch, log.latest_epoch())

    # -- operations ------------------------------------------------------------------------

    @rule(request=request_st, new_epoch=st.booleans(), dt=st.integers(0, 5000))
    def append(self, request: list[tuple[list[Entry], str]], new_epoch: bool, dt: int) -> None:
        self._append(request, new_epoch, dt)

    @rule(requests=st.lists(request_st, min_size=2, max_size=6), dt=st.integers(0, 3000))
    def append_burst(self, requests: list[list[tuple[list[Entry], str]]], dt: int) -> None:
        for request in requests:
            self._append(request, False, dt)

    def _append(self, request: list[tuple[list[Entry], str]], new_epoch: bool, dt: int) -> None:
        self.clock.now += dt
        if new_epoch:
            self.epoch += 1
        data = b""
        flat: list[Entry] = []
        for records, codec in request:
            self.ts += 1
            data += encode_batch(
                [v for _, v in records],
                keys=[k for k, _ in records],
                timestamps=[self.ts] * len(records),
                compression=codec,
            )
            flat.extend(records)
        leo = self.log.log_end_offset
        info = self.log.append(data, leader_epoch=self.epoch)
        assert info.first_offset == leo
        assert info.log_end_offset == leo + len(flat) == self.log.log_end_offset
        for i, entry in enumerate(flat):
            self.model[leo + i] = entry

    @rule(bad=st.integers(0, 2))
    def append_corrupt(self, bad: int) -> None:
        data = bytearray(encode_batch([b"x", b"y"], keys=[b"a", b"b"], timestamps=[T0, T0]))
        data[-1 - bad] ^= 0x10
        leo, size = self.log.log_end_offset, self.log.size_bytes
        try:
            self.log.append(bytes(data), leader_epoch=self.epoch)
        except InvalidBatchError:
            pass
        else:
            raise AssertionError("a corrupt batch was appended")
        assert (self.log.log_end_offset, self.log.size_bytes) == (leo, size)

    @rule()
    def flush(self) -> None:
        self.manager.flush_all()
        assert self.log.recovery_point == self.log.log_end_offset

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def clean_restart(self) -> None:
        leo = self.log.log_end_offset
        self.manager.close()
        self.manager = self._open_manager()
        self._reopened()
        assert self.log.truncated_bytes_on_recovery == 0 or self.damaged
        if not self.damaged:
            assert self.log.log_end_offset == leo

    @rule(
        damage=st.lists(
            st.sampled_from(["truncate", "flip", "garbage", "drop_index", "none"]),
            min_size=1,
            max_size=3,
        ),
        seed=st.integers(0, 2**32 - 1),
    )
    def crash_restart(self, damage: list[str], seed: int) -> None:
        rnd = random.Random(seed)
        # The process dies: descriptors close, indexes are not flushed, no marker.
        for _, log in self.manager:
            for seg in log.segments:
                seg.abandon()
        for kind in damage:
            # A crash tears or leaves junk only at the end of the active (last) segment.
            logs = self._files(".log")[-1:]
            if kind == "truncate" and logs and logs[0].stat().st_size:
                os.truncate(logs[0], rnd.randrange(logs[0].stat().st_size))
            elif kind == "flip":
                files = self._files(".log") + self._files(".index") + self._files(".timeindex")
                files = [p for p in files if p.stat().st_size]
                if files:
                    victim = rnd.choice(files)
                    raw = bytearray(victim.read_bytes())
                    raw[rnd.randrange(len(raw))] ^= 1 << rnd.randrange(8)
                    victim.write_bytes(bytes(raw))
                    self.damaged = True
                    self.holes = True
            elif kind == "garbage" and logs:
                with open(logs[-1], "ab") as f:
                    f.write(rnd.randbytes(rnd.randrange(1, 200)))
            elif kind == "drop_index":
                files = self._files(".index") + self._files(".timeindex")
                if files:
                    rnd.choice(files).unlink()
        self.manager = self._open_manager()
        self._reopened()

    @rule(dt=st.integers(0, 20_000), retention_ms=st.sampled_from([-1, 1000, 10_000]))
    def retention(self, dt: int, retention_ms: int) -> None:
        self.clock.now += dt
        self.conf["retention.ms"] = str(retention_ms)
        start = self.log.log_start_offset
        # A topic config change, applied the way a node would (the next restart reads conf).
        self.log.config = dataclasses.replace(self.log.config, retention_ms=retention_ms)
        self.log.apply_retention(now=self.clock.now)
        assert self.log.log_start_offset >= start
        assert self.log.log_start_offset <= self.log.log_end_offset

    @rule(bytes_limit=st.integers(0, 20_000))
    def retention_by_size(self, bytes_limit: int) -> None:
        cfg = self.log.config
        self.log.config = dataclasses.replace(cfg, retention_bytes=bytes_limit)
        self.log.apply_retention(now=self.clock.now)
        self.log.config = cfg
        assert self.log.log_start_offset <= self.log.log_end_offset

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        start, leo = self.log.log_start_offset, self.log.log_end_offset
        target = data.draw(st.integers(start, leo), label="target")
        assert self.log.delete_records(target) == max(start, target)

    @precondition(lambda self: self.log.config.compact)
    @rule(dt=st.integers(0, 10_000))
    def compact(self, dt: int) -> None:
        self.clock.now += dt
        try:
            compact(self.log, now=self.clock.now)
        except CorruptLogError:
            assert self.damaged, "compaction found corruption in an undamaged log"
        self.holes = True

    @rule(back=st.integers(0, 40))
    def truncate(self, back: int) -> None:
        start, leo = self.log.log_start_offset, self.log.log_end_offset
        target = max(start, leo - back)  # a follower cuts a recent, divergent suffix
        try:
            self.log.truncate_to(target)
        except CorruptLogError:
            assert self.damaged, "truncation found corruption in an undamaged log"
        new_leo = self.log.log_end_offset
        assert new_leo <= target or self.damaged
        assert self.log.log_start_offset <= new_leo
        for off in [o for o in self.model if o >= new_leo]:
            del self.model[off]
        # A follower truncates because a new leader took over.
        self.epoch += 1

    # -- the check -------------------------------------------------------------------------

    @invariant()
    def reads_match_the_model(self) -> None:
        if not hasattr(self, "log"):
            return
        log = self.log
        start, leo = log.log_start_offset, log.log_end_offset
        assert 0 <= start <= leo
        offset = start
        last = -1
        served: list[int] = []
        self.reads += 1
        max_bytes = [1, 700, 4096, 1 << 20][self.reads % 4]
        while offset < leo:
            try:
                res = log.read(offset, max_bytes)
            except CorruptLogError:
                assert self.damaged, f"CorruptLogError at {offset} without damage"
                later = [b for b in log._bases if b > offset]
                if not later:
                    break
                offset = later[0]
                continue
            if not res.data:
                assert self.damaged, f"empty read at {offset} < {leo}"
                break
            for b in decode_batches(res.data):
                h = b.header
                assert h.base_offset > last, "batches out of order"
                assert h.partition_leader_epoch == log.epochs.epoch_for(h.base_offset)
                for r in b.records():
                    if r.offset < offset:
                        continue  # the batch holding the requested offset starts earlier
                    assert r.offset > last, f"offset {r.offset} after {last}"
                    assert r.offset < leo
                    assert r.offset in self.model, f"offset {r.offset} was never appended"
                    assert (r.key, r.value) == self.model[r.offset], r.offset
                    last = r.offset
                    served.append(r.offset)
            assert res.next_offset > offset
            offset = res.next_offset
        if not self.holes and not self.damaged:
            assert served == list(range(start, leo)), "gap in an undamaged, uncompacted log"


LogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestLogProperties = LogMachine.TestCase
