"""``strom produce`` and ``strom consume``: console tools (basic form).

produce reads lines from stdin and sends them in batches (one Produce request per batch and
partition); consume fetches from partition leaders and prints each record's value.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, BinaryIO

from strom.api import common_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.errors import error_for, is_retriable
from strom.record import decode_batches

NONE = common_pb2.ErrorCode.NONE
ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1}


def add_console_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("produce", parents=[common], help="send stdin lines as records")
    p.add_argument("topic")
    p.add_argument("--key-separator", help="split each line into KEY<sep>VALUE")
    p.add_argument("--partition", type=int, help="send everything to this partition")
    p.add_argument("--acks", default="1", choices=sorted(ACKS), help="0, 1 or all")
    p.add_argument(
        "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    p.add_argument(
        "--batch-size", type=int, default=256 * 1024, help="batch bytes (default: 256KiB)"
    )
    p.add_argument("--linger-ms", type=float, default=5.0, help="wait this long to fill batches")
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
    c.add_argument("--max-messages", type=int, help="exit after this many records")
    c.add_argument(
        "--timeout-ms",
        type=int,
        help="exit when no record arrived for this long (default: wait forever)",
    )
    c.add_argument("--print-key", action="store_true", help="print KEY<sep>VALUE")
    c.add_argument("--key-separator", default="\t")


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

    with Producer(
        args.bootstrap,
        acks=ACKS[args.acks] if args.acks != "all" else "all",
        compression=args.compression,
        linger_ms=0 if interactive else args.linger_ms,
        batch_size=args.batch_size,
        enable_idempotence=args.acks != "0",
    ) as producer:
        # Fail fast on an unknown topic or partition before reading any input.
        partitions = producer.partitions_for(args.topic)
        if args.partition is not None and args.partition not in partitions:
            raise error_for(
                common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {args.topic!r} has no partition {args.partition} "
                f"(it has {len(partitions)})",
            )
        for raw in iter(stdin.readline, b""):
            line = raw.rstrip(b"\r\n")
            key: bytes | None = None
            if sep is not None:
                k, found, v = line.partition(sep)
                key, line = (k, v) if found else (None, line)
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
    print(f"produced {sent} records to {args.topic}", file=sys.stderr)
    return 0


def _start_offsets(
    client: ClusterClient, topic: str, partitions: list[int], earliest: bool
) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in partitions:
        req = storage_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                storage_pb2.ListOffsetsTopic(
                    topic=topic,
                    partitions=[
                        storage_pb2.ListOffsetsPartition(
                            partition=p, current_leader_epoch=-1, timestamp=-2 if earliest else -1
                        )
                    ],
                )
            ],
        )
        resp = client.with_leader(
            topic,
            p,
            lambda stub, req=req: stub.ListOffsets(req, timeout=client.timeout_s),
            lambda r: (
                r.topics[0].partitions[0].error_code != NONE
                and is_retriable(r.topics[0].partitions[0].error_code)
            ),
        )
        r = resp.topics[0].partitions[0]
        if r.error_code != NONE:
            raise error_for(r.error_code, f"{topic}-{p}: {r.error_message}")
        out[p] = r.offset
    return out


def run_consume(args: argparse.Namespace, out: BinaryIO) -> int:
    if args.offset is not None and args.partition is None:
        raise ValueError("--offset needs --partition")
    sep = args.key_separator.encode()
    with ClusterClient(args.bootstrap) as client:
        n = client.partition_count(args.topic)
        if args.partition is not None and not 0 <= args.partition < n:
            raise error_for(
                common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {args.topic!r} has no partition {args.partition} (it has {n})",
            )
        parts = [args.partition] if args.partition is not None else list(range(n))
        if args.offset is not None:
            positions = {args.partition: args.offset}
        else:
            positions = _start_offsets(client, args.topic, parts, args.from_beginning)
        printed = 0
        last_data = time.monotonic()
        while args.max_messages is None or printed < args.max_messages:
            got_any = False
            for p in parts:
                req = storage_pb2.FetchRequest(
                    replica_id=-1,
                    max_wait_ms=200 if len(parts) > 1 else 500,
                    min_bytes=1,
                    max_bytes=4 << 20,
                    topics=[
                        storage_pb2.FetchTopic(
                            topic=args.topic,
                            partitions=[
                                storage_pb2.FetchPartition(
                                    partition=p,
                                    fetch_offset=positions[p],
                                    current_leader_epoch=-1,
                                    partition_max_bytes=1 << 20,
                                )
                            ],
                        )
                    ],
                )
                resp = client.with_leader(
                    args.topic,
                    p,
                    lambda stub, req=req: stub.Fetch(req, timeout=30),
                    lambda r: (
                        r.topics[0].partitions[0].error_code != NONE
                        and is_retriable(r.topics[0].partitions[0].error_code)
                    ),
                )
                r = resp.topics[0].partitions[0]
                if r.error_code != NONE:
                    raise error_for(r.error_code, f"{args.topic}-{p}: {r.error_message}")
                for batch in decode_batches(r.records):
                    for rec in batch.records():
                        if rec.offset < positions[p]:
                            continue
                        if args.print_key:
                            out.write((rec.key or b"") + sep)
                        out.write((rec.value or b"") + b"\n")
                        printed += 1
                        got_any = True
                        if args.max_messages is not None and printed >= args.max_messages:
                            out.flush()
                            return 0
                    positions[p] = batch.header.next_offset
            out.flush()
            if got_any:
                last_data = time.monotonic()
            elif (
                args.timeout_ms is not None
                and (time.monotonic() - last_data) * 1000 >= args.timeout_ms
            ):
                break
    return 0
