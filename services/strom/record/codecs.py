"""Batch body compression codecs (DESIGN §4: attribute bits 0-2).

The whole Arrow IPC body of a batch is compressed as one frame, so compression cost is paid
once per batch, not per record. All codecs come from ``cramjam`` (one maintained Rust library
for the lot) and use self-describing standard formats, so decompression needs no stored size:

* gzip (1): RFC 1952 gzip member
* snappy (2): raw snappy block (its varint preamble carries the length)
* lz4 (3): LZ4 frame format
* zstd (4): zstd frame
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cramjam

from strom.record.errors import InvalidBatchError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4

CODEC_IDS: dict[str, int] = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
CODEC_NAMES: dict[int, str] = {v: k for k, v in CODEC_IDS.items()}

# Levels favour speed: strom compresses on the producer's hot path. gzip level 1 is still
# ~3x smaller on text; lz4 level 0 ("fast") is the frame default of librdkafka.
_COMPRESS: dict[int, Callable[[Any], Any]] = {
    GZIP: lambda b: cramjam.gzip.compress(b, level=1),
    SNAPPY: cramjam.snappy.compress_raw,
    LZ4: lambda b: cramjam.lz4.compress(b, level=1),
    ZSTD: lambda b: cramjam.zstd.compress(b, level=1),
}
_DECOMPRESS_INTO: dict[int, Callable[[Any, Any], int]] = {
    GZIP: cramjam.gzip.decompress_into,
    SNAPPY: cramjam.snappy.decompress_raw_into,
    LZ4: cramjam.lz4.decompress_into,
    ZSTD: cramjam.zstd.decompress_into,
}

#: The most a batch body may decompress to. Compressed bodies are small on the wire (a
#: batch is at most max.message.bytes), but a hostile one can be a decompression bomb: 1 MiB
#: of zstd expands to 32 GiB. Whoever decodes bodies (consumers, the log cleaner of a compacted
#: topic, a coordinator replaying its log) must not be made to allocate that. 256 MiB is the
#: largest gRPC message strom sends, so no legitimate body gets near it.
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
#: First output buffer: this many times the compressed size (grown x8 while it overflows).
_FIRST_RATIO = 8


def codec_id(codec: str | int | None) -> int:
    """Return the numeric codec id for a name (``"zstd"``) or an id; ``ValueError`` if unknown."""
    if codec is None:
        return NONE
    if isinstance(codec, int) and not isinstance(codec, bool):
        if codec in CODEC_NAMES:
            return codec
    elif isinstance(codec, str) and codec.lower() in CODEC_IDS:
        return CODEC_IDS[codec.lower()]
    raise ValueError(
        f"unknown compression {codec!r}: expected one of {', '.join(sorted(CODEC_IDS))}"
    )


def compress(codec: int, data: Any) -> Any:
    """Compress ``data`` (any buffer) with ``codec``; ``NONE`` returns it unchanged."""
    if codec == NONE:
        return data
    return _COMPRESS[codec](data)


def decompress(codec: int, data: Any, *, position: int = 0, max_bytes: int | None = None) -> Any:
    """Decompress a batch body; corrupt input, or a body that would decompress to more than
    ``max_bytes``, raises :class:`InvalidBatchError`.

    The output goes into a buffer of bounded size (uninitialised, so untouched pages cost no
    memory) that grows by x8 while the body overflows it, up to ``max_bytes``: a bomb fails at
    the bound instead of allocating what it claims.
    """
    if codec == NONE:
        return data
    if max_bytes is None:  # (read at call time: one place to change it)
        max_bytes = MAX_DECOMPRESSED_BYTES
    fn = _DECOMPRESS_INTO.get(codec)
    if fn is None:
        raise InvalidBatchError(
            f"batch at byte {position}: unknown codec id {codec}", position=position
        )
    size = min(max_bytes, max(1 << 16, len(memoryview(data)) * _FIRST_RATIO))
    if codec == SNAPPY:  # raw snappy states its length up front: no guessing
        try:
            size = cramjam.snappy.decompress_raw_len(data)
        except Exception as exc:
            raise _corrupt(codec, position, exc) from exc
        if size > max_bytes:
            raise _too_large(codec, position, max_bytes)
    elif codec == ZSTD:
        stated = zstd_content_size(data)
        if stated is not None:
            if stated > max_bytes:
                raise _too_large(codec, position, max_bytes)
            # Never below the first guess: a frame stating 0 or 1 but holding more would
            # grow from one byte, a failed attempt per x8.
            size = max(stated, size)
    # Here, not at the top: the header module imports this one, and what reads only
    # headers (the CLI's parser) should not load numpy.
    import numpy as np

    while True:
        out = np.empty(size, dtype=np.uint8)
        try:
            n = fn(data, out)
        except Exception as exc:  # cramjam raises DecompressionError (and ValueErrors)
            if size < max_bytes and _overflowed(exc):
                size = min(max_bytes, size * 8)
                continue
            if _overflowed(exc):
                raise _too_large(codec, position, max_bytes) from exc
            raise _corrupt(codec, position, exc) from exc
        return memoryview(out)[:n]


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_DICT_ID_BYTES = (0, 1, 2, 4)


def zstd_content_size(data: Any) -> int | None:
    """The decompressed size a zstd frame's header states (its Frame_Content_Size, which
    cramjam's and most encoders write), or None when the header does not state one.

    Why: a body more than 8x compressible (``_FIRST_RATIO``) was decompressed twice, the first
    attempt into a buffer too small; with the stated size the first buffer fits. The frame
    header is RFC 8878 §3.1.1.1: magic, descriptor, [window], [dictionary id], [content size]."""
    head = bytes(memoryview(data)[:18])
    if len(head) < 5 or head[:4] != _ZSTD_MAGIC:
        return None
    fhd = head[4]
    fcs_flag, single_segment = fhd >> 6, (fhd >> 5) & 1
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        return None
    at = 5 + (0 if single_segment else 1) + _ZSTD_DICT_ID_BYTES[fhd & 3]
    if len(head) < at + width:
        return None
    value = int.from_bytes(head[at : at + width], "little")
    return value + 256 if width == 2 else value


def _overflowed(exc: Exception) -> bool:
    text = str(exc)
    return "whole buffer" in text or "smaller than required" in text


def _corrupt(codec: int, position: int, exc: Exception) -> InvalidBatchError:
    return InvalidBatchError(
        f"batch at byte {position}: {CODEC_NAMES[codec]} body does not decompress ({exc})",
        position=position,
    )


def _too_large(codec: int, position: int, max_bytes: int) -> InvalidBatchError:
    return InvalidBatchError(
        f"batch at byte {position}: {CODEC_NAMES[codec]} body decompresses to more than "
        f"{max_bytes} bytes (a decompression bomb, or a body too large to decode)",
        position=position,
        too_large=True,
        limit=max_bytes,
    )
