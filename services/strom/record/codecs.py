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
_DECOMPRESS: dict[int, Callable[[Any], Any]] = {
    GZIP: cramjam.gzip.decompress,
    SNAPPY: cramjam.snappy.decompress_raw,
    LZ4: cramjam.lz4.decompress,
    ZSTD: cramjam.zstd.decompress,
}


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


def decompress(codec: int, data: Any, *, position: int = 0) -> Any:
    """Decompress a batch body; corrupt input raises :class:`InvalidBatchError`."""
    if codec == NONE:
        return data
    fn = _DECOMPRESS.get(codec)
    if fn is None:
        raise InvalidBatchError(
            f"batch at byte {position}: unknown codec id {codec}", position=position
        )
    try:
        return fn(data)
    except Exception as exc:  # cramjam raises its own DecompressionError and ValueErrors
        raise InvalidBatchError(
            f"batch at byte {position}: {CODEC_NAMES[codec]} body does not decompress ({exc})",
            position=position,
        ) from exc
