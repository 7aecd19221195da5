"""Hostile record batches against the decoder (issue 13): arbitrary bytes, every header field
set to anything with a valid CRC over it, garbage behind valid CRCs, decompression bombs of
every codec, and a coverage-guided atheris run. Whatever comes in, the only way to fail is
:class:`InvalidBatchError` naming the byte position; never a pyarrow/numpy/cramjam exception,
a crash, or an allocation the size a bomb asks for."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import cramjam
import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strom.record import InvalidBatchError, decode_batches, encode_batch, scan_batches
from strom.record.codecs import MAX_DECOMPRESSED_BYTES
from strom.record.header import CRC_START, HEADER_SIZE, pack_header

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode_fully(buf: bytes) -> int:
    """Decode everything a consumer would; the number of records."""
    n = 0
    for b in decode_batches(buf):
        n += len(b.records())
        b.to_arrow()
    return n


def with_header(body: bytes, **fields: int) -> bytes:
    """A batch with these header fields and a CRC that matches (so decoding goes deep)."""
    f = {
        "base_offset": 0,
        "partition_leader_epoch": 0,
        "attributes": 0,
        "last_offset_delta": 0,
        "base_timestamp": 0,
        "max_timestamp": 0,
        "producer_id": -1,
        "producer_epoch": -1,
        "base_sequence": -1,
        "record_count": 1,
        **fields,
        "body_length": len(body),
    }
    crc = crc32c.crc32c(body, crc32c.crc32c(pack_header(crc=0, **f)[CRC_START:]))
    return pack_header(crc=crc, **f) + body


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data: bytes) -> None:
    try:
        decode_fully(data)
    except InvalidBatchError as exc:
        assert exc.position >= 0


int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@FUZZ
@given(
    values=st.lists(st.binary(max_size=32), min_size=1, max_size=20),
    codec=st.sampled_from(["none", "gzip", "snappy", "lz4", "zstd"]),
    attributes=st.integers(-(2**15), 2**15 - 1),
    last_offset_delta=int32,
    record_count=int32,
    base_offset=int64,
    timestamps=st.tuples(int64, int64),
    producer=st.tuples(int64, st.integers(-(2**15), 2**15 - 1), int32),
    body_cut=st.none() | st.integers(0, 200),
)
def test_any_header_with_a_valid_crc(
    values: list[bytes],
    codec: str,
    attributes: int,
    last_offset_delta: int,
    record_count: int,
    base_offset: int,
    timestamps: tuple[int, int],
    producer: tuple[int, int, int],
    body_cut: int | None,
) -> None:
    body = encode_batch(values, compression=codec)[HEADER_SIZE:]
    if body_cut is not None:
        body = body[:body_cut]
    batch = with_header(
        body,
        attributes=attributes,
        last_offset_delta=last_offset_delta,
        record_count=record_count,
        base_offset=base_offset,
        base_timestamp=timestamps[0],
        max_timestamp=timestamps[1],
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
    )
    for producer_batch in (False, True):
        with contextlib.suppress(InvalidBatchError):
            scan_batches(batch, producer_batch=producer_batch)
    with contextlib.suppress(InvalidBatchError):
        decode_fully(batch)


@FUZZ
@given(body=st.binary(max_size=2048), codec=st.integers(0, 7), count=st.integers(0, 50))
def test_garbage_body_behind_a_valid_crc(body: bytes, codec: int, count: int) -> None:
    batch = with_header(
        body, attributes=codec, record_count=count, last_offset_delta=max(count - 1, 0)
    )
    with pytest.raises(InvalidBatchError):
        decode_fully(batch)


@FUZZ
@given(
    batches=st.lists(
        st.lists(st.binary(max_size=16), min_size=1, max_size=5), min_size=2, max_size=4
    ),
    cut=st.integers(1, 60),
)
def test_a_stream_truncated_anywhere_in_the_last_batch(
    batches: list[list[bytes]], cut: int
) -> None:
    data = b"".join(encode_batch(v) for v in batches)
    bad = data[: len(data) - min(cut, len(encode_batch(batches[-1])))]
    with pytest.raises(InvalidBatchError):
        decode_fully(bad)


# -- decompression bombs ---------------------------------------------------------------------

_BOMB = textwrap.dedent(
    """
    import resource, sys
    import cramjam, crc32c
    from strom.record import InvalidBatchError, decode_batches
    from strom.record.header import CRC_START, pack_header

    # 1.5 GiB of address space: a bomb that gets decompressed for real dies of MemoryError.
    resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
    codec = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[sys.argv[1]]
    body = open(sys.argv[2], "rb").read()
    f = dict(base_offset=0, body_length=len(body), partition_leader_epoch=0, attributes=codec,
             last_offset_delta=0, base_timestamp=0, max_timestamp=0, producer_id=-1,
             producer_epoch=-1, base_sequence=-1, record_count=1)
    crc = crc32c.crc32c(body, crc32c.crc32c(pack_header(crc=0, **f)[CRC_START:]))
    batch = pack_header(crc=crc, **f) + body
    try:
        decode_batches(batch)[0].records()
    except InvalidBatchError as exc:
        print("refused:", exc)
        sys.exit(0)
    print("decoded a bomb")
    sys.exit(1)
    """
)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_bombs_are_refused_without_allocating_them(
    codec: str, tmp_path: Path
) -> None:
    """A body that decompresses to 4 GiB (zstd: 130 KB on the wire) is refused at the bound
    (256 MiB) in a process that could not even hold 1.5 GiB."""
    size = 4 << 30 if codec in ("zstd", "gzip") else 300 << 20  # lz4/snappy ratios are low
    chunk = b"\0" * (64 << 20)
    if codec == "zstd":
        c = cramjam.zstd.Compressor(level=3)
    elif codec == "gzip":
        c = cramjam.gzip.Compressor(level=1)
    else:
        c = None
    if c is not None:
        for _ in range(size // len(chunk)):
            c.compress(chunk)
        body = bytes(c.finish())
    elif codec == "lz4":
        body = bytes(cramjam.lz4.compress(b"\0" * size))
    else:
        body = bytes(cramjam.snappy.compress_raw(b"\0" * size))
    assert size > MAX_DECOMPRESSED_BYTES
    path = tmp_path / "bomb"
    path.write_bytes(body)
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB, codec, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "decompresses to more than" in proc.stdout


# -- coverage-guided fuzzing (atheris) -------------------------------------------------------

_ATHERIS = textwrap.dedent(
    """
    import sys
    import atheris

    with atheris.instrument_imports(include=["strom.record"]):
        from strom.record import InvalidBatchError, decode_batches, encode_batch

    SEEDS = [encode_batch([b"a", b"bb"], keys=[b"k", None], compression=c)
             for c in ("none", "gzip", "snappy", "lz4", "zstd")]

    def target(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        choice = fdp.ConsumeIntInRange(0, 2)
        if choice == 0:
            buf = fdp.ConsumeBytes(fdp.remaining_bytes())
        else:  # mutate a valid batch: the header fields stay plausible more often
            buf = bytearray(SEEDS[fdp.ConsumeIntInRange(0, len(SEEDS) - 1)])
            for _ in range(fdp.ConsumeIntInRange(1, 8)):
                if fdp.remaining_bytes() < 2:
                    break
                buf[fdp.ConsumeIntInRange(0, len(buf) - 1)] = fdp.ConsumeInt(1) & 0xFF
            if choice == 2:  # fix the CRC up so the body is decoded
                import crc32c, struct
                if len(buf) >= 61:
                    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
        try:
            for b in decode_batches(bytes(buf)):
                b.records()
                b.to_arrow()
        except InvalidBatchError:
            pass

    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
    """
)


# skip is justified: pyproject.toml's dev extra installs atheris exactly where it has a wheel
# (Linux x86_64, what CI runs); there the test runs and a missing atheris fails it.
@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="atheris has wheels for Linux x86_64 only (the dev extra installs it there)",
)
def test_atheris_coverage_guided_decoder_fuzzing(tmp_path: Path) -> None:
    """A bounded libFuzzer run (STROM_FUZZ_SECONDS, default 20) over the decoder; any
    exception other than InvalidBatchError is a crash and fails the run."""
    try:
        import atheris  # noqa: F401  (the fuzz script imports it; checked here to name it)
    except ImportError:
        pytest.fail("atheris is missing: install the dev extra (scripts/bootstrap.sh does)")
    seconds = int(os.environ.get("STROM_FUZZ_SECONDS", "20"))
    script = tmp_path / "fuzz_decoder.py"
    script.write_text(_ATHERIS)
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            f"-max_total_time={seconds}",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={tmp_path}/",
            "-print_final_stats=1",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "stat::number_of_executed_units" in proc.stderr
