"""``strom produce`` and ``strom consume``: console tools (basic form).

produce reads lines from stdin and sends them in batches (one Produce request per batch and
partition); consume fetches from partition leaders and prints each record's value.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import defaultdict
from typing import Any, BinaryIO

from strom.api import common_pb2, storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.partitioner import partition_for_key
from strom.errors import error_for, is_retriable
from strom.record import decode_batches, encode_batch

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
    p.add_argument("--batch-size", type=int, default=1000, help="records per batch")

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


def run_produce(args: argparse.Namespace, stdin: BinaryIO, out: Any) -> int:
    acks = ACKS[args.acks]
    sep = args.key_separator.encode() if args.key_separator else None
    interactive = stdin.isatty()
    with ClusterClient(args.bootstrap) as client:
        n = client.partition_count(args.topic)
        if args.partition is not None and not 0 <= args.partition < n:
            raise error_for(
                common_pb2.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {args.topic!r} has no partition {args.partition} (it has {n})",
            )
        sticky = itertools.cycle(range(n))
        pending: dict[int, tuple[list[bytes | None], list[bytes]]] = defaultdict(lambda: ([], []))
        sent = 0

        def flush() -> None:
            nonlocal sent
            keyless_partition = next(sticky)
            for part, (keys, values) in list(pending.items()):
                target = keyless_partition if part == -1 else part
                batch = encode_batch(
                    values, keys=keys if any(keys) else None, compression=args.compression
                )
                _produce(client, args.topic, target, batch, acks)
                sent += len(values)
            pending.clear()

        for count, raw in enumerate(iter(stdin.readline, b""), start=1):
            line = raw.rstrip(b"\r\n")
            key: bytes | None = None
            if sep is not None:
                k, found, v = line.partition(sep)
                key, line = (k, v) if found else (None, line)
            if args.partition is not None:
                part = args.partition
            elif key is not None:
                part = partition_for_key(key, n)
            else:
                part = -1  # keyless: sticky per batch
            keys, values = pending[part]
            keys.append(key)
            values.append(line)
            if interactive or count % args.batch_size == 0:
                flush()
        flush()
    print(f"produced {sent} records to {args.topic}", file=sys.stderr)
    return 0


def _produce(client: ClusterClient, topic: str, partition: int, batch: bytes, acks: int) -> None:
    req = storage_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=30000,
        topics=[
            storage_pb2.ProduceTopicData(
                topic=topic,
                partitions=[
                    storage_pb2.ProducePartitionData(
                        partition=partition, records=batch, current_leader_epoch=-1
                    )
                ],
            )
        ],
    )

    def call(stub: Any) -> Any:
        return stub.Produce(req, timeout=client.timeout_s)

    def retriable(resp: Any) -> bool:
        if acks == 0 or not resp.topics:
            return False
        code = resp.topics[0].partitions[0].error_code
        return code != NONE and is_retriable(code)

    resp = client.with_leader(topic, partition, call, retriable)
    if acks != 0 and resp.topics:
        r = resp.topics[0].partitions[0]
        if r.error_code != NONE:
            raise error_for(r.error_code, f"{topic}-{partition}: {r.error_message}")


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
