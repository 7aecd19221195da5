"""gRPC-level benchmarks: a storage node's Produce/Fetch against bare gRPC with the same
payload sizes (DESIGN §11: per-request work must be amortised over large batches).

``bench_echo`` starts a bare grpc.aio server in a separate process (like a storage node is)
whose generic handlers take and return raw bytes, and measures the transport alone:
*echo upload* sends ``batch_bytes`` and gets two bytes back, *echo download* sends a few
bytes and gets ``batch_bytes`` back, *echo upload (stream)* is the upload as messages on
``concurrency`` open two-way streams (one message in flight on each) instead of a call each:
what a call costs beyond a message is their difference (small ``batch_bytes`` show it).
``bench_produce_fetch`` does the same traffic through
a storage node: Produce of a pre-built batch of about ``batch_bytes`` (acks=1), then Fetch of
the same batches. Both sides use the same client: requests serialized once up front, raw
bytes on the wire calls (no client-side protobuf parsing in the timed loop), ``concurrency``
requests in flight. So the ratio of the two is what the node's own work costs.

Numbers are printed, never asserted. The ``strom bench`` wiring lives with the CLI; running
this module directly is the stand-alone form::

    python -m strom.bench.grpc_bench run --bootstrap 127.0.0.1:9092 --topic bench
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from strom.api import storage_pb2 as pb
from strom.bench import cpu
from strom.bench.stats import Result, report
from strom.devcluster.procs import free_port, port_open, wait_for
from strom.errors import ErrorCode, error_for
from strom.grpc_options import GRPC_OPTIONS
from strom.record import encode_batch

ECHO_SERVICE = "strom.bench.Echo"
_SIZE = struct.Struct(">Q")
PRODUCE = "/strom.v1.StorageService/Produce"
FETCH = "/strom.v1.StorageService/Fetch"
METADATA = "/strom.v1.StorageService/Metadata"


# -- the bare echo server ----------------------------------------------------------------------


class _Spool:
    """Appends uploads to files the way a log does (roll at 128 MiB, keep 1 GiB), so the
    *echo upload + write* baseline pays the same page-cache cost a Produce does."""

    SEGMENT = 128 << 20
    KEEP = 8

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.files: list[str] = []
        self.fd = -1
        self.size = 0

    def write(self, data: bytes) -> None:
        if self.fd < 0 or self.size >= self.SEGMENT:
            if self.fd >= 0:
                os.close(self.fd)
            path = os.path.join(self.dir, f"{len(self.files):08d}.spool")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self.size = 0
            self.files.append(path)
            while len(self.files) > self.KEEP:
                os.unlink(self.files.pop(0))
        self.size += os.write(self.fd, data)


async def serve_echo(port: int, host: str = "127.0.0.1", spool_dir: str | None = None) -> None:
    """A grpc.aio server with the storage node's options and raw-bytes methods."""
    cache: dict[int, bytes] = {}
    spool = _Spool(spool_dir or tempfile.mkdtemp(prefix="strom-echo-"))

    async def upload(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"ok"

    async def upload_write(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        spool.write(request)
        return b"ok"

    async def upload_stream(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for _ in requests:
            yield b"ok"

    async def download(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        (size,) = _SIZE.unpack(request)
        data = cache.get(size)
        if data is None:
            data = cache[size] = os.urandom(size)
        return data

    server = grpc.aio.server(options=list(GRPC_OPTIONS))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                ECHO_SERVICE,
                {
                    "Upload": grpc.unary_unary_rpc_method_handler(upload),
                    "UploadWrite": grpc.unary_unary_rpc_method_handler(upload_write),
                    "UploadStream": grpc.stream_stream_rpc_method_handler(upload_stream),
                    "Download": grpc.unary_unary_rpc_method_handler(download),
                },
            )
        ]
    )
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await server.wait_for_termination()


# -- the client side ---------------------------------------------------------------------------


async def _drive(
    call: Callable[[int], Awaitable[int]],
    count: int,
    concurrency: int,
    server: cpu.ServerCpu | None = None,
) -> tuple[float, list[float], int, cpu.CpuUsage]:
    """Run ``call(i)`` for i in 0..count-1 with ``concurrency`` in flight.

    Returns (seconds, per-call latencies, sum of what the calls returned (bytes), the CPU
    it cost this process and ``server`` or the configured servers).
    """
    latencies: list[float] = []
    moved = 0
    next_i = 0

    async def worker() -> None:
        nonlocal next_i, moved
        while next_i < count:
            i = next_i
            next_i += 1
            t = time.perf_counter()
            got = await call(i)  # (not `moved += await ...`: that reads `moved` first)
            latencies.append(time.perf_counter() - t)
            moved += got

    meter = cpu.start(server)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(concurrency, 1))))
    seconds = time.perf_counter() - t0
    return seconds, latencies, moved, meter.stop()


def _count(batch_bytes: int, total_bytes: int) -> int:
    return max(total_bytes // max(batch_bytes, 1), 1)


async def _echo(
    target: str, batch_bytes: int, total_bytes: int, concurrency: int, server: cpu.ServerCpu
) -> list[Result]:
    n = _count(batch_bytes, total_bytes)
    payload = os.urandom(batch_bytes)
    size_req = _SIZE.pack(batch_bytes)
    async with grpc.aio.insecure_channel(target, options=list(GRPC_OPTIONS)) as ch:
        up = ch.unary_unary(f"/{ECHO_SERVICE}/Upload")
        down = ch.unary_unary(f"/{ECHO_SERVICE}/Download")
        up_write = ch.unary_unary(f"/{ECHO_SERVICE}/UploadWrite")
        await up(b"warm-up", timeout=10)

        async def one_up(i: int) -> int:
            await up(payload, timeout=60)
            return batch_bytes

        async def one_up_write(i: int) -> int:
            await up_write(payload, timeout=60)
            return batch_bytes

        async def one_down(i: int) -> int:
            return len(await down(size_req, timeout=60))

        streams: asyncio.Queue[Any] = asyncio.Queue()
        for _ in range(concurrency):
            streams.put_nowait(ch.stream_stream(f"/{ECHO_SERVICE}/UploadStream")())

        async def one_up_stream(i: int) -> int:
            stream = await streams.get()  # one message in flight per stream
            await stream.write(payload)
            if await stream.read() is grpc.aio.EOF:
                raise RuntimeError("the echo server ended an upload stream")
            streams.put_nowait(stream)
            return batch_bytes

        s_up, l_up, b_up, c_up = await _drive(one_up, n, concurrency, server)
        s_st, l_st, b_st, c_st = await _drive(one_up_stream, n, concurrency, server)
        s_down, l_down, b_down, c_down = await _drive(one_down, n, concurrency, server)
        s_w, l_w, b_w, c_w = await _drive(one_up_write, n, concurrency, server)
        while not streams.empty():
            streams.get_nowait().cancel()
    return [
        Result("echo upload", n, 0, b_up, s_up, l_up, c_up),
        Result("echo upload (stream)", n, 0, b_st, s_st, l_st, c_st),
        Result("echo download", n, 0, b_down, s_down, l_down, c_down),
        Result("echo upload + write", n, 0, b_w, s_w, l_w, c_w),
    ]


def bench_echo(batch_bytes: int, total_bytes: int, *, concurrency: int = 4) -> list[Result]:
    """Bare gRPC throughput with ``batch_bytes`` messages, server in a separate process."""
    port = free_port()
    spool = tempfile.mkdtemp(prefix="strom-echo-")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "strom.bench.grpc_bench",
            "echo-server",
            "--port",
            str(port),
            "--spool-dir",
            spool,
        ],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"echo server exited with {proc.returncode}")
            return port_open("127.0.0.1", port)

        wait_for(up, timeout=20, what="the echo server")
        server = cpu.ServerCpu(pids=(proc.pid,))
        return asyncio.run(
            _echo(f"127.0.0.1:{port}", batch_bytes, total_bytes, concurrency, server)
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(spool, ignore_errors=True)


async def _leader_address(bootstrap: str, topic: str, partition: int) -> str:
    async with grpc.aio.insecure_channel(bootstrap.split(",")[0].strip()) as ch:
        call = ch.unary_unary(
            METADATA,
            request_serializer=pb.MetadataRequest.SerializeToString,
            response_deserializer=pb.MetadataResponse.FromString,
        )
        resp: pb.MetadataResponse = await call(pb.MetadataRequest(topics=[topic]), timeout=10)
    mt = resp.topics[0]
    if mt.error_code != ErrorCode.NONE:
        raise error_for(mt.error_code, f"topic {topic}: {mt.error_message}")
    for mp in mt.partitions:
        if mp.partition == partition:
            for node in resp.nodes:
                if node.node_id == mp.leader:
                    return f"{node.host}:{node.port}"
            raise error_for(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition} has no leader")
    raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")


async def _produce_fetch(
    bootstrap: str,
    topic: str,
    partition: int,
    batch_bytes: int,
    total_bytes: int,
    concurrency: int,
    record_size: int,
    acks: int = 1,
) -> list[Result]:
    target = await _leader_address(bootstrap, topic, partition)
    per_batch = max(batch_bytes // record_size, 1)
    value = os.urandom(record_size)
    batch = encode_batch([value] * per_batch)
    n = _count(len(batch), total_bytes)
    produce_req = pb.ProduceRequest(
        acks=acks,
        timeout_ms=30_000,
        topics=[
            pb.ProduceTopicData(
                topic=topic,
                partitions=[
                    pb.ProducePartitionData(
                        partition=partition, records=batch, current_leader_epoch=-1
                    )
                ],
            )
        ],
    ).SerializeToString()
    first = -1
    async with grpc.aio.insecure_channel(target, options=list(GRPC_OPTIONS)) as ch:
        produce = ch.unary_unary(PRODUCE)
        fetch = ch.unary_unary(FETCH)

        async def one_produce(i: int) -> int:
            nonlocal first
            raw = await produce(produce_req, timeout=60)
            r = pb.ProduceResponse.FromString(raw).topics[0].partitions[0]  # ~100 bytes
            if r.error_code != ErrorCode.NONE:
                raise error_for(r.error_code, r.error_message)
            if first < 0 or r.base_offset < first:
                first = r.base_offset
            return len(batch)

        s_p, l_p, b_p, c_p = await _drive(one_produce, n, concurrency)

        def fetch_req(offset: int) -> bytes:
            return pb.FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=1,
                max_bytes=len(batch),
                topics=[
                    pb.FetchTopic(
                        topic=topic,
                        partitions=[
                            pb.FetchPartition(
                                partition=partition,
                                fetch_offset=offset,
                                current_leader_epoch=-1,
                                last_fetched_epoch=-1,
                                log_start_offset=-1,
                                partition_max_bytes=len(batch),
                            )
                        ],
                    )
                ],
            ).SerializeToString()

        # The produced batches sit at first + i * per_batch: fetch them back one per request.
        requests = [fetch_req(first + i * per_batch) for i in range(n)]

        async def one_fetch(i: int) -> int:
            raw = await fetch(requests[i], timeout=60)
            if len(raw) < len(batch):
                resp = pb.FetchResponse.FromString(raw).topics[0].partitions[0]
                raise error_for(resp.error_code or ErrorCode.UNKNOWN_SERVER_ERROR, str(resp))
            return len(batch)

        s_f, l_f, b_f, c_f = await _drive(one_fetch, n, concurrency)
    name = f"produce (acks={'all' if acks == -1 else acks})"
    return [
        Result(name, n, n * per_batch, b_p, s_p, l_p, c_p),
        Result("fetch", n, n * per_batch, b_f, s_f, l_f, c_f),
    ]


def bench_produce_fetch(
    bootstrap: str,
    topic: str,
    partition: int,
    batch_bytes: int,
    total_bytes: int,
    *,
    concurrency: int = 4,
    record_size: int = 1024,
    acks: int = 1,
) -> list[Result]:
    """Produce ``total_bytes`` in pre-built batches of ~``batch_bytes`` to an existing
    partition through its leader, then fetch them back one batch per request."""
    return asyncio.run(
        _produce_fetch(
            bootstrap,
            topic,
            partition,
            batch_bytes,
            total_bytes,
            concurrency,
            record_size,
            acks,
        )
    )


# -- stand-alone entry point -------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strom.bench.grpc_bench")
    sub = parser.add_subparsers(dest="cmd", required=True)
    es = sub.add_parser("echo-server", help="run the bare echo server (used by bench_echo)")
    es.add_argument("--port", type=int, required=True)
    es.add_argument("--spool-dir", help="where *echo upload + write* appends")
    rn = sub.add_parser("run", help="echo vs Produce/Fetch against a running node")
    rn.add_argument("--bootstrap", required=True)
    rn.add_argument("--topic", required=True)
    rn.add_argument("--partition", type=int, default=0)
    rn.add_argument("--batch-bytes", type=int, default=1 << 20)
    rn.add_argument("--total-bytes", type=int, default=1 << 30)
    rn.add_argument("--concurrency", type=int, default=4)
    rn.add_argument("--acks", type=int, default=1, choices=[0, 1, -1])
    rn.add_argument("--record-size", type=int, default=1024)
    rn.add_argument("--no-echo", action="store_true", help="skip the bare gRPC baseline")
    rn.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "echo-server":
        from strom.storage.node import tune_malloc

        tune_malloc()  # as a storage node does, so the comparison isolates the node's work
        asyncio.run(serve_echo(args.port, spool_dir=args.spool_dir))
        return 0
    echo = (
        []
        if args.no_echo
        else bench_echo(args.batch_bytes, args.total_bytes, concurrency=args.concurrency)
    )
    node = bench_produce_fetch(
        args.bootstrap,
        args.topic,
        args.partition,
        args.batch_bytes,
        args.total_bytes,
        concurrency=args.concurrency,
        record_size=args.record_size,
        acks=args.acks,
    )
    ctx = {
        "batch_bytes": args.batch_bytes,
        "total_bytes": args.total_bytes,
        "concurrency": args.concurrency,
        "acks": args.acks,
        "record_size": args.record_size,
        "server_cpu": f"echo: its process; node: {cpu.server_source()}",
    }
    print(report(echo + node, as_json=args.json, context=ctx))
    if echo and not args.json:

        def rate(r: Result) -> float:
            return r.bytes / r.seconds

        base = {r.name: r for r in echo}
        print(
            f"produce / echo upload = {rate(node[0]) / rate(base['echo upload']):.0%}   "
            f"produce / echo upload + write = "
            f"{rate(node[0]) / rate(base['echo upload + write']):.0%}   "
            f"fetch / echo download = {rate(node[1]) / rate(base['echo download']):.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
