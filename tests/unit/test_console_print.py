"""How `strom consume` writes a poll's records: when the writing is cut short, the consumer's
positions go back to the first record that did not reach the output, so that the commit made
on close covers only printed records (the real processes: test_console_and_bench.py)."""

from __future__ import annotations

import io
import signal
from dataclasses import dataclass

import pytest

from strom.cli import console
from strom.client.types import TopicPartition


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int


class FakeConsumer:
    def __init__(self) -> None:
        self.seeks: dict[TopicPartition, int] = {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset


def records() -> list[Rec]:
    return [Rec("t", i % 2, 10 + i // 2) for i in range(8)]  # p0: 10..13, p1: 10..13


def fmt(r: Rec) -> bytes:
    return b"%d:%d\n" % (r.partition, r.offset)


class Output(io.BytesIO):
    """Calls ``on_write(n)`` before taking the n-th write (0-based); counts flushes."""

    def __init__(self, on_write: dict[int, object]) -> None:
        super().__init__()
        self.on_write = on_write
        self.writes = 0
        self.flushed = b""

    def write(self, data: bytes) -> int:  # type: ignore[override]
        action = self.on_write.get(self.writes)
        self.writes += 1
        if isinstance(action, BaseException):
            raise action
        if callable(action):
            action()
        return super().write(data)

    def flush(self) -> None:
        self.flushed = self.getvalue()


def test_all_records_printed_leaves_the_positions_alone() -> None:
    consumer, out = FakeConsumer(), Output({})
    console._print_records(consumer, records(), fmt, out)
    assert out.flushed.count(b"\n") == 8
    assert consumer.seeks == {}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_after_the_record_being_written(signum: int) -> None:
    """The signal arrives while the 4th record is written: that record is printed and
    counted, the rest are not printed, each partition goes back to its first unprinted
    record, and the signal then ends the command as the handlers in force say."""
    consumer, out = FakeConsumer(), Output({3: lambda: signal.raise_signal(signum)})
    expected: type[BaseException] = KeyboardInterrupt if signum == signal.SIGINT else SystemExit
    with console._sigterm_unwinds(), pytest.raises(expected):
        console._print_records(consumer, records(), fmt, out)
    assert out.flushed == b"0:10\n1:10\n0:11\n1:11\n"
    assert consumer.seeks == {TopicPartition("t", 0): 12, TopicPartition("t", 1): 12}


def test_an_ignored_signal_stays_ignored() -> None:
    """A command started with SIGINT ignored (`strom consume ... &` from a script) goes on."""
    consumer, out = FakeConsumer(), Output({3: lambda: signal.raise_signal(signal.SIGINT)})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        console._print_records(consumer, records(), fmt, out)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert out.flushed.count(b"\n") == 8 and consumer.seeks == {}


def test_a_closed_pipe_goes_back_to_the_last_flush() -> None:
    """What the output's buffer held when the reader went away may never have reached it:
    the next run starts at the last record a flush got through (a duplicate rather than a
    gap)."""
    consumer, out = FakeConsumer(), Output({5: BrokenPipeError(32, "Broken pipe")})
    # One flush after the first 2 records (each line is 5 bytes).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(console, "_FLUSH_BYTES", 10)
        with pytest.raises(BrokenPipeError):
            console._print_records(consumer, records(), fmt, out)
    assert out.flushed.count(b"\n") == 4
    assert consumer.seeks == {TopicPartition("t", 0): 12, TopicPartition("t", 1): 12}


def fmt_args(template: str) -> object:
    from argparse import Namespace

    return Namespace(format=template, print_key=False, print_timestamp=False, key_separator="\t")


@dataclass
class Full:
    topic: str = "t"
    partition: int = 1
    offset: int = 255
    timestamp: int = 1700000000000
    timestamp_type: int = 1
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: tuple = ()


def test_format_takes_number_specs_for_the_number_fields() -> None:
    """`--format '{offset:x}'` was refused: the template was tried with every field a
    string (found from outside)."""
    f = console._formatter(fmt_args("{partition:02d}@{offset:x} {timestamp:,} {value:>3}"))
    assert f(Full()) == b"01@ff 1,700,000,000,000   v\n"


@pytest.mark.parametrize("bad", ["{value:x}", "{nope}", "{offset.nope}", "{0}", "{offset"])
def test_a_format_that_cannot_print_a_record_is_refused_up_front(bad: str) -> None:
    with pytest.raises(ValueError, match="bad --format"):
        console._formatter(fmt_args(bad))


def test_print_timestamp_puts_kafkas_type_column_first() -> None:
    """Kafka's print.timestamp=true: TYPE:MS, then the key (with --print-key) and the value,
    each after the key separator; {timestamp_type} names the type in --format."""
    args = fmt_args(None)
    args.print_timestamp = True
    assert console._formatter(args)(Full()) == b"LogAppendTime:1700000000000\tv\n"
    args.print_key, args.key_separator = True, "|"
    assert console._formatter(args)(Full(timestamp_type=0)) == b"CreateTime:1700000000000|k|v\n"
    f = console._formatter(fmt_args("{timestamp_type}"))
    assert f(Full()) == b"LogAppendTime\n"
