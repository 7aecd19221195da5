"""``strom produce`` and ``strom consume``: console tools (basic form).

produce reads lines from stdin and sends them in batches (one Produce request per batch and
partition); consume fetches from partition leaders and prints each record's value.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from strom.api import common_pb2
from strom.argtypes import UsageError, int_at_least, number_above
from strom.cli import counted
from strom.errors import InvalidRequestError, error_for

NONE = common_pb2.ErrorCode.NONE
ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1}


def add_console_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("produce", parents=[common], help="send stdin lines as records")
    p.add_argument("topic")
    p.add_argument(
        "--key-separator",
        type=_separator,
        help="split each line into KEY<sep>VALUE (a line without it is an error, as in "
        "Kafka's console producer)",
    )
    p.add_argument("--partition", type=int, help="send everything to this partition")
    p.add_argument("--acks", default="1", choices=sorted(ACKS), help="0, 1 or all")
    p.add_argument(
        "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    # Checked here so a bad value names the flag (found from outside: the Producer's
    # message named its keyword, batch_size, and exited 1).
    p.add_argument(
        "--batch-size",
        type=int_at_least(1),
        default=256 * 1024,
        help="batch bytes (default: 256KiB)",
    )
    p.add_argument(
        "--linger-ms",
        type=number_above(0.0, inclusive=True),
        default=5.0,
        help="wait this long to fill batches",
    )
    p.add_argument(
        "--header",
        action="append",
        type=_header,
        metavar="NAME=VALUE",
        help="add this header to every record (repeatable)",
    )

    c = sub.add_parser("consume", parents=[common], help="print records of a topic")
    c.add_argument("topic")
    c.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    c.add_argument("--partition", type=int, help="only this partition")
    c.add_argument("--offset", type=int, help="start offset (needs --partition)")
    c.add_argument("--max-messages", type=int_at_least(1), help="exit after this many records")
    c.add_argument(
        "--timeout-ms",
        type=int_at_least(0),
        help="exit when no record arrived for this long (default: wait forever)",
    )
    c.add_argument("--print-key", action="store_true", help="print KEY<sep>VALUE")
    c.add_argument("--group", help="consume as a member of this consumer group")
    c.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_uncommitted",
        help="read_committed: only records of committed transactions (and non-transactional "
        "ones), stopping at open transactions",
    )
    c.add_argument(
        "--format",
        help="how to print each record, e.g. '{partition}:{offset} {key}={value} [{headers}]' "
        "(fields: topic, partition, offset, timestamp, key, value, headers)",
    )
    c.add_argument("--key-separator", type=_separator, default="\t")


def _separator(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _header(text: str) -> tuple[str, bytes]:
    name, found, value = text.partition("=")
    if not found or not name:
        raise argparse.ArgumentTypeError(f"a header is NAME=VALUE, got {text!r}")
    return name, value.encode()


def run_produce(args: argparse.Namespace, stdin: BinaryIO, out: Any) -> int:
    """Send each stdin line as a record through the Producer (batching, retries,
    idempotence); with a terminal on stdin each line is sent and acknowledged at once."""
    from strom.client.producer import Producer

    sep = args.key_separator.encode() if args.key_separator else None
    interactive = stdin.isatty()
    headers = list(args.header or []) or None
    sent = 0
    failures: list[BaseException] = []

    def on_delivery(_md: Any, err: BaseException | None) -> None:
        if err is not None and len(failures) < 10:
            failures.append(err)

    with (
        # SIGTERM closes the producer as EOF does: what was read is sent and acknowledged
        # (Kafka's console producer flushes in its shutdown hook); it used to be dropped.
        _sigterm_unwinds(),
        Producer(
            args.bootstrap,
            acks=ACKS[args.acks] if args.acks != "all" else "all",
            compression=args.compression,
            linger_ms=0 if interactive else args.linger_ms,
            batch_size=args.batch_size,
            enable_idempotence=args.acks == "all",  # Kafka's rule: only with acks=all
        ) as producer,
    ):
        # Fail fast on an unknown topic or partition before reading any input.
        partitions = producer.partitions_for(args.topic)
        if args.partition is not None and args.partition not in partitions:
            raise error_for(
                common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {args.topic!r} has no partition {args.partition} "
                f"(it has {len(partitions)})",
            )
        for number, raw in enumerate(iter(stdin.readline, b""), 1):
            line = raw.rstrip(b"\r\n")
            key: bytes | None = None
            if sep is not None:
                k, found, v = line.partition(sep)
                if not found:
                    producer.flush()
                    raise InvalidRequestError(
                        f"line {number} has no key separator {args.key_separator!r} "
                        f"(the {counted(sent, 'record')} before it were sent)"
                    )
                key, line = k, v
            fut = producer.send(
                args.topic,
                line,
                key=key,
                headers=headers,
                partition=args.partition,
                callback=on_delivery,
            )
            sent += 1
            if interactive:
                fut.result()
        producer.flush()
    if failures:
        raise failures[0]
    print(f"produced {counted(sent, 'record')} to {args.topic}", file=sys.stderr)
    return 0


_FIELDS = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")


def _formatter(args: argparse.Namespace) -> Any:
    """Turn a record into output bytes per ``--format`` (or ``--print-key``)."""
    template = args.format
    if template is None:
        if not args.print_key:
            return lambda r: (r.value or b"") + b"\n"
        sep = args.key_separator.encode()
        return lambda r: (r.key or b"") + sep + (r.value or b"") + b"\n"
    # Tried on values of the types the records give (numbers for partition, offset and
    # timestamp): '{offset:x}' was refused when every field was tried as a string (found
    # from outside).
    sample = {f: 0 if f in ("partition", "offset", "timestamp") else "" for f in _FIELDS}
    try:
        template.format(**sample)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"bad --format {template!r} ({exc}); fields: " + ", ".join(_FIELDS)
        ) from None

    def fmt(r: Any) -> bytes:
        text = template.format(
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            timestamp=r.timestamp,
            key=(r.key or b"").decode(errors="backslashreplace"),
            value=(r.value or b"").decode(errors="backslashreplace"),
            headers=",".join(
                f"{k}={(v or b'').decode(errors='backslashreplace')}" for k, v in r.headers or ()
            ),
        )
        return text.encode() + b"\n"

    return fmt


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Make SIGTERM end the command as Ctrl-C does: by unwinding, so that ``with Consumer``
    closes the consumer (commits when auto-committing, leaves its group). Python's default
    for SIGTERM ends the process on the spot, and the member stayed in its group until the
    session timeout (found from outside), holding up the rebalance that gives its
    partitions to the others. A second SIGTERM during the close ends the process at once.
    """

    def stop(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (run by a caller embedding the CLI)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_consume(args: argparse.Namespace, out: BinaryIO) -> int:
    """Print records through the Consumer: a group member with ``--group`` (committing as it
    goes), else the chosen partitions assigned directly."""
    from strom.client.consumer import Consumer
    from strom.client.types import TopicPartition

    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    if args.group and (args.partition is not None or args.offset is not None):
        raise UsageError("--group cannot be combined with --partition/--offset")
    fmt = _formatter(args)
    with (
        _sigterm_unwinds(),
        Consumer(
            args.bootstrap,
            group_id=args.group,
            auto_offset_reset="earliest" if args.from_beginning else "latest",
            client_id="strom-console-consumer",
            isolation_level=args.isolation_level,
        ) as consumer,
    ):
        if args.group:
            consumer.subscribe([args.topic])
        else:
            parts = sorted(consumer.partitions_for_topic(args.topic))
            if args.partition is not None:
                if args.partition not in parts:
                    raise error_for(
                        common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"topic {args.topic!r} has no partition {args.partition} "
                        f"(it has {len(parts)})",
                    )
                parts = [args.partition]
            tps = [TopicPartition(args.topic, p) for p in parts]
            consumer.assign(tps)
            if args.offset is not None:
                consumer.seek(tps[0], args.offset)
        printed = 0
        last_data = time.monotonic()
        while args.max_messages is None or printed < args.max_messages:
            left = None if args.max_messages is None else args.max_messages - printed
            records = consumer.poll(timeout_ms=200, max_records=left)
            _print_records(consumer, records, fmt, out)
            printed += len(records)
            if records:
                last_data = time.monotonic()
            elif (
                args.timeout_ms is not None
                and (time.monotonic() - last_data) * 1000 >= args.timeout_ms
            ):
                break
    return 0


# How many bytes may sit in the output's buffer before a flush: after each flush the records
# written so far have reached the reader's pipe, and a reader that goes away costs at most
# the records since then being printed again on the group's next run.
_FLUSH_BYTES = 4096


def _print_records(consumer: Any, records: list[Any], fmt: Any, out: BinaryIO) -> None:
    """Write ``records`` to ``out`` and flush. When that is cut short (Ctrl-C, SIGTERM, the
    reader going away, a failing write), each partition's position goes back to its first
    record that did not reach the output, so the commit made when the consumer closes covers
    only what was printed and the group's next run prints the rest. The records of a poll had
    all counted as consumed, and hundreds of them were skipped per stop (found from outside).

    A stop signal is noted and acted on between two records: raised at once, it could land
    after a write took a line but before the line was counted, and that line would be
    printed again by the next run. What was written is flushed, then the signal is raised
    again, with the command's own handlers back, to end it as before."""
    taken = 0  # records[:taken] were accepted by out.write (maybe still in its buffer)
    flushed = 0  # records[:flushed] reached the stream underneath: a flush after them returned
    pending = 0
    try:
        with _stop_signals_noted() as stops:
            for rec in records:
                if stops:
                    break
                line = fmt(rec)
                out.write(line)
                taken += 1
                pending += len(line)
                if pending >= _FLUSH_BYTES:
                    out.flush()
                    flushed, pending = taken, 0
            out.flush()
            flushed = taken
    except BaseException:
        # A closed pipe, a second stop signal, a failing record: what the buffer still held
        # may never reach the reader, so the next run starts at the last flush.
        _rewind(consumer, records[flushed:])
        raise
    if stops:
        _rewind(consumer, records[taken:])
        signal.raise_signal(stops[0])


@contextlib.contextmanager
def _stop_signals_noted() -> Iterator[list[int]]:
    """Note SIGINT and SIGTERM in the yielded list instead of raising; a second one raises
    at once (KeyboardInterrupt, or SystemExit as _sigterm_unwinds does), so that a reader
    that never reads cannot keep the command from ending. Signals the process ignores, or
    whose handler was not set from Python (it could not be put back), are left alone."""
    noted: list[int] = []

    def note(signum: int, _frame: Any) -> None:
        if noted:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        noted.append(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) not in (None, signal.SIG_IGN):
                previous[signum] = signal.signal(signum, note)
    except ValueError:  # not the main thread (run by a caller embedding the CLI)
        pass
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _rewind(consumer: Any, unprinted: list[Any]) -> None:
    """Seek each partition of ``unprinted`` back to its first record there."""
    from strom.client.types import TopicPartition

    first: dict[Any, int] = {}
    for rec in unprinted:
        first.setdefault(TopicPartition(rec.topic, rec.partition), rec.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)
