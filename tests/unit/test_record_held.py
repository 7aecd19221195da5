"""strom.record.held: the encode steps of a producer's sender never let go of the interpreter
lock (beside a busy thread each release cost the sender up to a switch interval), and they
compute what the plain numpy / bytes / crc32c calls compute."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import numpy as np
import pytest

from strom.record import decode_batches, encode_batch, held


class _Spinner:
    """A thread counting in Python: it advances only while it holds the interpreter lock.

    With a long switch interval, the main thread loses the lock only where it lets go of it
    itself, so a count that did not move across a call means the call kept the lock."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop:
            self.count += 1

    def __enter__(self) -> _Spinner:
        self._thread.start()
        deadline = time.monotonic() + 10
        while self.count == 0:  # let go (sleep) until the spinner has run
            assert time.monotonic() < deadline, "the spinner thread never ran"
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()

    def moved_during(self, call: Callable[[], Any]) -> bool:
        time.sleep(0)  # take the lock back from the spinner first (a fresh interval)
        before = self.count
        call()
        return self.count != before


@pytest.fixture
def spinner() -> Iterator[_Spinner]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # far longer than any call below takes (~1-5 ms)
    try:
        with _Spinner() as s:
            yield s
    finally:
        sys.setswitchinterval(old)


def _big_batch() -> dict[str, Any]:
    n = 3000  # over numpy's 500-item threshold, several slices
    return dict(
        values=[b"v" * 100] * n,
        keys=[str(i % 100).encode() for i in range(n)],
        timestamps=held.as_int64(np.arange(n, dtype=np.float64) * 0.37 + 1.7e12),
        producer_id=5,
        base_sequence=0,
    )


def test_the_probe_sees_a_call_that_lets_go(spinner: _Spinner) -> None:
    assert spinner.moved_during(lambda: time.sleep(0.01))


@pytest.fixture(scope="module")
def steps() -> dict[str, Callable[[], Any]]:
    """The calls, with their inputs built (and first uses paid) before the spinner runs: with
    the long switch interval every release of the lock costs the main thread 0.2 s."""
    blob = bytes(4 << 20)
    floats = np.arange(20_000, dtype=np.float64) * 1.5
    ints = np.arange(20_000, dtype=np.int64)
    big = _big_batch()
    calls: dict[str, Callable[[], Any]] = {
        "crc32c": lambda: held.crc32c(blob),
        "join": lambda: held.join([blob, blob]),
        "as_int64": lambda: held.as_int64(floats),
        "min_max": lambda: held.min_max(ints),
        "minus": lambda: held.minus(ints, 3),
        "encode_batch": lambda: encode_batch(**big),
    }
    for call in calls.values():
        call()
    return calls


@pytest.mark.parametrize(
    "name",
    ["crc32c", "join", "as_int64", "min_max", "minus", "encode_batch"],
)
def test_the_senders_encode_steps_keep_the_lock(
    steps: dict[str, Callable[[], Any]], spinner: _Spinner, name: str
) -> None:
    assert not spinner.moved_during(steps[name])


def test_held_steps_compute_what_the_plain_calls_do() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 499, 500, 501, 1234):
        floats = rng.random(n) * 1e13
        ints = rng.integers(-(2**60), 2**60, n)
        assert np.array_equal(held.as_int64(floats), floats.astype(np.int64))
        assert held.as_int64(ints) is ints
        assert held.min_max(ints) == (int(ints.min()), int(ints.max()))
        assert np.array_equal(held.minus(ints, 12345), ints - 12345)
    parts = [b"a" * 10, bytearray(b"b" * (1 << 20)), memoryview(b"c" * 7)]
    assert held.join(parts) == b"".join(parts)
    assert held.join(iter([b"x", b"y"])) == b"xy"
    assert held.crc32c(b"tail", held.crc32c(b"head")) == crc32c.crc32c(b"headtail")


def test_a_big_batch_reads_back() -> None:
    b = _big_batch()
    (batch,) = decode_batches(encode_batch(**b))
    records = batch.records()
    assert [r.key for r in records] == b["keys"]
    assert [r.timestamp for r in records] == b["timestamps"].tolist()
