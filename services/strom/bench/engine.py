"""``strom bench record``, ``strom bench log`` and ``strom bench compaction``: the engines
alone, no network.

These measure what the brokers' hot paths are built from: encoding/decoding batches (the
client side) and appending/reading whole batches in a partition log (the broker side), and
what one compaction pass of a log costs as its keys grow (the cleaner runs beside both).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from strom.bench import cpu
from strom.bench.stats import Result
from strom.log import Log, LogConfig, compact
from strom.record import decode_batches, encode_arrow, encode_batch


def _values(count: int, size: int) -> list[bytes]:
    # Mildly compressible payloads (a random prefix per record on a repeated body), so the
    # codecs do real work without making compression look better than real data would.
    body = os.urandom(max(size, 1))
    return [os.urandom(8)[: min(8, size)] + body[: max(size - 8, 0)] for _ in range(count)]


def bench_record(
    *, records: int, record_size: int, batch_records: int, compression: str
) -> list[Result]:
    """Encode and decode ``records`` records of ``record_size`` bytes in batches."""
    values = _values(batch_records, record_size)
    n_batches = max(records // batch_records, 1)
    payload = n_batches * batch_records * record_size

    t0 = time.perf_counter()
    meter = cpu.start()
    for _ in range(n_batches):
        data = encode_batch(values, compression=compression)
    enc = Result(
        "encode (list)",
        n_batches,
        n_batches * batch_records,
        payload,
        time.perf_counter() - t0,
        cpu=meter.stop(),
    )

    table = pa.table({"value": pa.array(values, pa.binary())})
    t0 = time.perf_counter()
    meter = cpu.start()
    for _ in range(n_batches):
        encode_arrow(table, compression=compression)
    enc_arrow = Result(
        "encode (arrow)",
        n_batches,
        n_batches * batch_records,
        payload,
        time.perf_counter() - t0,
        cpu=meter.stop(),
    )

    blob = data * min(n_batches, 100)
    per_blob = min(n_batches, 100)
    rounds = max(n_batches // per_blob, 1)
    t0 = time.perf_counter()
    meter = cpu.start()
    for _ in range(rounds):
        for b in decode_batches(blob):
            b.to_arrow()
    dec_arrow = Result(
        "decode to_arrow",
        rounds * per_blob,
        rounds * per_blob * batch_records,
        rounds * per_blob * batch_records * record_size,
        time.perf_counter() - t0,
        cpu=meter.stop(),
    )

    t0 = time.perf_counter()
    meter = cpu.start()
    for _ in range(rounds):
        for b in decode_batches(blob):
            b.records()
    dec_py = Result(
        "decode records()",
        rounds * per_blob,
        rounds * per_blob * batch_records,
        rounds * per_blob * batch_records * record_size,
        time.perf_counter() - t0,
        cpu=meter.stop(),
    )
    return [enc, enc_arrow, dec_arrow, dec_py]


def _warm_page_cache(directory: Path, total_bytes: int, chunk: bytes) -> Result:
    """Write and delete a scratch file as large as the run: the same bytes through plain
    ``os.write``. On a VM whose guest memory was handed back to the host, the first touch of
    page-cache memory costs far more than the copy itself; this pays it up front so the
    engine's own cost is what gets measured (and shows the raw write rate beside it)."""
    path = directory / "warmup.tmp"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    meter = cpu.start()
    written = 0
    try:
        while written < total_bytes:
            written += os.write(fd, chunk)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - t0
    usage = meter.stop()
    path.unlink()
    return Result("raw os.write (warm-up)", written // len(chunk), 0, written, seconds, [], usage)


def bench_log(
    *,
    total_bytes: int,
    batch_bytes: int,
    record_size: int,
    directory: str | None,
    fsync: bool,
    warm: bool = False,
) -> list[Result]:
    """Append pre-built batches of ~``batch_bytes`` to a fresh log, then read it back."""
    per_batch = max(batch_bytes // record_size, 1)
    batch = encode_batch(_values(per_batch, record_size))
    n_batches = max(total_bytes // len(batch), 1)
    tmp = Path(tempfile.mkdtemp(prefix="strom-bench-", dir=directory))
    results: list[Result] = []
    try:
        if warm:
            results.append(_warm_page_cache(tmp, n_batches * len(batch), batch))
        log = Log(tmp / "bench-0", LogConfig(), fsync=fsync)
        lat: list[float] = []
        t0 = time.perf_counter()
        meter = cpu.start()
        for _ in range(n_batches):
            s = time.perf_counter()
            log.append(batch, leader_epoch=0)
            lat.append(time.perf_counter() - s)
        if fsync:
            log.flush()
        append = Result(
            "log append" + (" + fsync" if fsync else ""),
            n_batches,
            n_batches * per_batch,
            n_batches * len(batch),
            time.perf_counter() - t0,
            lat,
            meter.stop(),
        )

        lat = []
        offset = 0
        got = 0
        batches = 0
        leo = log.log_end_offset
        t0 = time.perf_counter()
        meter = cpu.start()
        while offset < leo:
            s = time.perf_counter()
            r = log.read(offset, batch_bytes)
            lat.append(time.perf_counter() - s)
            got += len(r.data)
            batches += 1
            offset = r.next_offset
        seconds = time.perf_counter() - t0
        read = Result("log read (sequential)", batches, leo, got, seconds, lat, meter.stop())
        log.close()
        return [*results, append, read]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_compaction(
    *,
    records: int,
    keys: int,
    batch_records: int,
    record_size: int,
    segment_bytes: int,
    directory: str | None,
) -> list[Result]:
    """One compaction pass over a fresh log of ``records`` keyed records (keys written round
    robin over ``keys`` distinct ones, in batches of ``batch_records``): what the cleaner's
    time does as the distinct keys grow (it must stay about linear in the log's size)."""
    value = os.urandom(max(record_size, 1))
    tmp = Path(tempfile.mkdtemp(prefix="strom-bench-", dir=directory))
    cfg = LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)})
    try:
        log = Log(tmp / "bench-0", cfg, fsync=False)
        written = 0
        while written < records:
            n = min(batch_records, records - written)
            ks = [b"key-%d" % ((written + j) % keys) for j in range(n)]
            log.append(encode_batch([value] * n, keys=ks), leader_epoch=0)
            written += n
        log.roll()
        size = log.size_bytes
        t0 = time.perf_counter()
        meter = cpu.start()
        stats = compact(log, now=int(time.time() * 1000) + 1)
        seconds = time.perf_counter() - t0
        usage = meter.stop()
        log.close()
        name = (
            f"compaction pass ({keys:,} keys, "
            f"{stats.records_before:,} -> {stats.records_after:,} records)"
        )
        return [Result(name, None, records, size, seconds, [], usage)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
