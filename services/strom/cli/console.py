"""``strom produce`` and ``strom consume``: console tools (basic form).

produce reads lines from stdin and sends them in batches (one Produce request per batch and
partition); consume fetches from partition leaders and prints each record's value.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from strom.api import common_pb2
from strom.argtypes import (
    INT32_MAX,
    INT64_MAX,
    LONG_MS_MAX,
    UsageError,
    int_at_least,
    number_above,
    topic_name,
)
from strom.cli import counted
from strom.errors import InvalidRequestError, MessageTooLargeError, StromError, error_for
from strom.record.header import TimestampType

NONE = common_pb2.ErrorCode.NONE
ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1}


def add_console_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("produce", parents=[common], help="send stdin lines as records")
    p.add_argument("topic", type=topic_name)
    p.add_argument(
        "--key-separator",
        type=_separator,
        help="split each line into KEY<sep>VALUE (a line without it is an error, as in "
        "Kafka's console producer)",
    )
    p.add_argument(
        "--partition",
        type=int_at_least(0, maximum=INT32_MAX),
        help="send everything to this partition",
    )
    p.add_argument("--acks", default="1", choices=sorted(ACKS), help="0, 1 or all")
    p.add_argument(
        "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    # Checked here so a bad value names the flag, not the Producer's keyword.
    p.add_argument(
        "--batch-size",
        type=int_at_least(1, maximum=INT32_MAX),
        default=256 * 1024,
        help="batch bytes (default: 256KiB)",
    )
    p.add_argument(
        "--linger-ms",
        type=number_above(0.0, inclusive=True, maximum=LONG_MS_MAX),
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
    p.add_argument(
        "--producer-property",
        action="append",
        type=_property,
        default=[],
        metavar="KEY=VALUE",
        help="a Producer setting, by Kafka's name or the keyword (max.request.size=16777216, "
        "request_timeout_ms=60000); repeatable. Known: " + ", ".join(PRODUCER_PROPERTIES),
    )

    c = sub.add_parser(
        "consume",
        parents=[common],
        help="print records of a topic",
        description="Print the records of a topic, one a line: the value, or what --print-key "
        "or --format make of it. A null key or value (a tombstone) prints as null, an empty "
        "one as nothing, as in Kafka's console consumer.",
    )
    c.add_argument("topic", type=topic_name)
    c.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    c.add_argument(
        "--partition", type=int_at_least(0, maximum=INT32_MAX), help="only this partition"
    )
    c.add_argument(
        "--offset",
        type=_start_offset,
        metavar="OFFSET|earliest|latest",
        help="start offset of --partition: a number >= 0, earliest or latest",
    )
    c.add_argument("--max-messages", type=int_at_least(1), help="exit after this many records")
    c.add_argument(
        "--timeout-ms",
        type=int_at_least(0, maximum=LONG_MS_MAX),
        help="exit when no record arrived for this long (default: wait forever)",
    )
    c.add_argument(
        "--print-key",
        action="store_true",
        help="print KEY<sep>VALUE (a null key or value prints as null, an empty one as "
        "nothing, as in Kafka's console consumer)",
    )
    c.add_argument(
        "--print-timestamp",
        action="store_true",
        help="start each line with the record's timestamp as TYPE:MILLISECONDS (CreateTime: "
        "the producer's, LogAppendTime: the leader's) and the key separator, as Kafka's "
        "console consumer's print.timestamp=true",
    )
    c.add_argument("--group", type=_not_blank, help="consume as a member of this consumer group")
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
        "(fields: topic, partition, offset, timestamp, timestamp_type (CreateTime or "
        "LogAppendTime), key, value, headers; a null key, value or header value is printed "
        "as null)",
    )
    c.add_argument("--key-separator", type=_separator, default="\t")
    c.add_argument(
        "--consumer-property",
        action="append",
        type=_property,
        default=[],
        metavar="KEY=VALUE",
        help="a Consumer setting, by Kafka's name or the keyword (max.partition.fetch.bytes="
        "16777216); repeatable. Known: " + ", ".join(CONSUMER_PROPERTIES),
    )


#: ``--producer-property`` / ``--consumer-property`` keys: each client keyword that takes a
#: plain value (number, string, boolean) and has no flag of its own (--acks, --group, ...),
#: with how its value is read. Kafka's dotted names (max.request.size) name them too.
_INT, _FLOAT, _STR = int, float, str
PRODUCER_PROPERTIES: dict[str, Any] = {
    "buffer_memory": _INT,
    "client_id": _STR,
    "delivery_timeout_ms": _INT,
    "max_block_ms": _INT,
    "max_in_flight": _INT,
    "max_request_size": _INT,
    "metadata_max_age_ms": _INT,
    "request_timeout_ms": _INT,
    "retries": _INT,
    "retry_backoff_max_ms": _INT,
    "retry_backoff_ms": _INT,
}
CONSUMER_PROPERTIES: dict[str, Any] = {
    "auto_commit_interval_ms": _INT,
    "check_crcs": bool,
    "client_id": _STR,
    "enable_auto_commit": bool,
    "fetch_max_bytes": _INT,
    "fetch_max_wait_ms": _INT,
    "fetch_min_bytes": _INT,
    "group_instance_id": _STR,
    "heartbeat_interval_ms": _INT,
    "max_partition_fetch_bytes": _INT,
    "max_poll_interval_ms": _INT,
    "max_poll_records": _INT,
    "request_timeout_ms": _INT,
    "retry_backoff_max_ms": _INT,
    "retry_backoff_ms": _INT,
    "session_timeout_ms": _INT,
}
#: Keys that have a flag of their own: the message names the flag.
_FLAGGED = {
    "acks": "--acks",
    "compression": "--compression",
    "compression_type": "--compression",
    "linger_ms": "--linger-ms",
    "batch_size": "--batch-size",
    "group_id": "--group",
    "isolation_level": "--isolation-level",
    "auto_offset_reset": "--from-beginning",
    "bootstrap_servers": "--bootstrap",
}
#: Kafka's names whose keyword is spelled otherwise.
_ALIASES = {"max_in_flight_requests_per_connection": "max_in_flight"}


def _property(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of --producer-property / --consumer-property (checked against the client
    when the command knows which one)."""
    key, found, value = text.partition("=")
    if not found or not key.strip():
        raise argparse.ArgumentTypeError(f"a property is KEY=VALUE, got {text!r}")
    return key.strip(), value


def client_properties(
    given: list[tuple[str, str]], known: dict[str, Any], flag: str
) -> dict[str, Any]:
    """The client keyword arguments of ``flag``'s KEY=VALUE pairs; UsageError naming the
    property for an unknown key or a value of the wrong kind (Kafka's console tools take
    any client setting so)."""
    out: dict[str, Any] = {}
    for key, text in given:
        name = key.replace(".", "_").replace("-", "_")
        name = _ALIASES.get(name, name)
        if name in _FLAGGED:
            raise UsageError(f"{flag} {key}: use {_FLAGGED[name]} instead")
        kind = known.get(name)
        if kind is None:
            raise UsageError(f"{flag} {key}: unknown; known: " + ", ".join(known))
        out[name] = _property_value(key, text, kind, flag)
    return out


def _property_value(key: str, text: str, kind: Any, flag: str) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise UsageError(f"{flag} {key}={text}: must be true or false")
        return text.lower() == "true"
    if kind is _STR:
        return text
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is _INT else "a number"
        raise UsageError(f"{flag} {key}={text}: must be {what}") from None


@contextlib.contextmanager
def _properties_named(props: dict[str, Any], flag: str) -> Iterator[None]:
    """A client's ValueError about a keyword given as a property becomes a usage error that
    names the property (``--producer-property max_request_size: must be at least 1``)."""
    try:
        yield
    except ValueError as exc:
        name = next((k for k in props if k in str(exc)), None)
        if name is None or isinstance(exc, UsageError):
            raise
        raise UsageError(f"{flag} {name}: {exc}") from None


def _not_blank(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _start_offset(text: str) -> int | str:
    """``--offset``: a number >= 0, or ``earliest`` / ``latest`` as Kafka's console consumer
    takes them; anything else is a usage error, not a failure in the cluster."""
    if text in ("earliest", "latest"):
        return text
    return int_at_least(0, " (or earliest, latest)", maximum=INT64_MAX)(text)


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
    idempotence); with a terminal on stdin each line is sent and acknowledged at once.

    A record that cannot be sent stops the command naming its input line and how many
    records were acknowledged."""
    from strom.client.producer import Producer

    props = client_properties(args.producer_property, PRODUCER_PROPERTIES, "--producer-property")
    sep = args.key_separator.encode() if args.key_separator else None
    interactive = stdin.isatty()
    headers = list(args.header or []) or None
    sent = 0
    acked = [0]
    failures: list[tuple[int, BaseException]] = []  # (line number, error), the first ten

    def on_delivery(number: int, _md: Any, err: BaseException | None) -> None:
        if err is None:
            acked[0] += 1
        elif len(failures) < 10:
            failures.append((number, err))

    with _properties_named(props, "--producer-property"):
        producer = Producer(
            args.bootstrap,
            acks=ACKS[args.acks] if args.acks != "all" else "all",
            compression=args.compression,
            linger_ms=0 if interactive else args.linger_ms,
            batch_size=args.batch_size,
            enable_idempotence=args.acks == "all",  # Kafka's rule: only with acks=all
            **props,
        )
    # SIGTERM closes the producer as EOF does: what was read is sent and acknowledged
    # (Kafka's console producer flushes in its shutdown hook); it used to be dropped.
    with _sigterm_unwinds(), producer:
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
                        f"(the {counted(acked[0], 'record')} before it were sent)"
                    )
                key, line = k, v
            try:
                fut = producer.send(
                    args.topic,
                    line,
                    key=key,
                    headers=headers,
                    partition=args.partition,
                    callback=functools.partial(on_delivery, number),
                )
                sent += 1
                if interactive:
                    fut.result()
            except StromError as exc:
                if not interactive:
                    producer.flush()  # what was read before it goes out, and is counted
                raise _at_line(exc, number, _sent_before(acked[0], sent)) from None
        producer.flush()
    if failures:
        number, err = min(failures, key=lambda f: f[0])
        if isinstance(err, StromError):
            raise _at_line(
                err, number, f"{acked[0]} of the {counted(sent, 'record')} read were sent"
            )
        raise err
    print(f"produced {counted(sent, 'record')} to {args.topic}", file=sys.stderr)
    return 0


def _sent_before(acked: int, before: int) -> str:
    """How many of the records read before a failing line were sent."""
    if acked == before:
        return f"the {counted(before, 'record')} before it were sent"
    return f"{acked} of the {counted(before, 'record')} before it were sent"


def _at_line(exc: StromError, number: int, sent: str) -> StromError:
    """``exc`` (same class and code) with the input line it is about and how many records
    went out (``sent``), and for a record above the producer's limit, how to raise it."""
    hint = ""
    if isinstance(exc, MessageTooLargeError) and "max_request_size" in exc.message:
        hint = " (raise the limit with --producer-property max.request.size=BYTES)"
    elif isinstance(exc, MessageTooLargeError) and "buffer_memory" in exc.message:
        hint = " (raise the buffer with --producer-property buffer.memory=BYTES)"
    message = f"line {number}: {exc.message}{hint}; {sent}"
    try:
        err = copy.copy(exc)
    except Exception:  # a subclass whose constructor takes other arguments
        return StromError(message, code=exc.code, retriable=exc.retriable)
    err.message = message
    return err


_FIELDS = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestamp_type",
    "key",
    "value",
    "headers",
)

#: A record's timestamp type as Kafka's tools print it (``TimestampType.toString``).
_TIMESTAMP_TYPE_NAMES = {
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}

#: What a null key, value or header value prints as: Kafka's console consumer's ``null``.
NULL = b"null"


def _or_null(data: bytes | None) -> bytes:
    """``data``, or ``null`` for None. A tombstone (null value) and a record without a key
    printed as an empty line and an empty key, so they could not be told from b"" (found
    from outside); an empty key or value still prints as nothing."""
    return NULL if data is None else data


def _timestamp_type_name(r: Any) -> str:
    return _TIMESTAMP_TYPE_NAMES.get(r.timestamp_type, str(r.timestamp_type))


def _formatter(args: argparse.Namespace) -> Any:
    """Turn a record into output bytes per ``--format``, or per ``--print-timestamp`` and
    ``--print-key`` (Kafka's console consumer's columns: ``CreateTime:ms``, key, value, each
    after the key separator)."""
    template = args.format
    print_timestamp = args.print_timestamp
    if template is None:
        sep = args.key_separator.encode()

        def line(r: Any) -> bytes:
            out = _or_null(r.value) + b"\n"
            if args.print_key:
                out = _or_null(r.key) + sep + out
            if print_timestamp:
                out = b"%s:%d%s%s" % (_timestamp_type_name(r).encode(), r.timestamp, sep, out)
            return out

        return line
    if print_timestamp or args.print_key:
        # Ignored before: a line without the key asked for looked like a keyless record.
        raise UsageError(
            "--format prints only what it names: put {timestamp_type}:{timestamp} or {key} "
            "in it instead of --print-timestamp / --print-key"
        )
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
            timestamp_type=_timestamp_type_name(r),
            key=_or_null(r.key).decode(errors="backslashreplace"),
            value=_or_null(r.value).decode(errors="backslashreplace"),
            headers=",".join(
                f"{k}={_or_null(v).decode(errors='backslashreplace')}" for k, v in r.headers or ()
            ),
        )
        return text.encode() + b"\n"

    return fmt


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Make SIGTERM end the command as Ctrl-C does: by unwinding, so that ``with Consumer``
    closes the consumer (commits when auto-committing, leaves its group). Python's default
    for SIGTERM ends the process on the spot, and the member would stay in its group until
    the session timeout, holding up the rebalance that gives its
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
    props = client_properties(args.consumer_property, CONSUMER_PROPERTIES, "--consumer-property")
    props.setdefault("client_id", "strom-console-consumer")
    fmt = _formatter(args)
    with _properties_named(props, "--consumer-property"):
        consumer = Consumer(
            args.bootstrap,
            group_id=args.group,
            auto_offset_reset="earliest" if args.from_beginning else "latest",
            isolation_level=args.isolation_level,
            **props,
        )
    with _sigterm_unwinds(), consumer:
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
            if args.offset == "earliest":
                consumer.seek_to_beginning(tps)
            elif args.offset == "latest":
                consumer.seek_to_end(tps)
            elif args.offset is not None:
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
    only what was printed and the group's next run prints the rest.

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
