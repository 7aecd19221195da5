"""The codecs' decompression sizes its first buffer from a zstd frame's stated content size
(a body more than 8x compressible was decompressed twice, into a buffer too small first),
without trusting it: a frame whose stated size is wrong is corrupt (zstd checks it), one that
states more than the bound is refused before anything is allocated."""

from __future__ import annotations

import cramjam
import pytest

from strom.record import codecs
from strom.record.errors import InvalidBatchError


def _zstd(data: bytes) -> bytes:
    return bytes(cramjam.zstd.compress(data, level=1))


def _with_stated_size(frame: bytes, size: int) -> bytes:
    """``frame`` (single segment, 4-byte content size, no dictionary) stating ``size``."""
    assert frame[4] >> 6 == 2 and (frame[4] >> 5) & 1 and frame[4] & 3 == 0, frame[:6].hex()
    return frame[:5] + size.to_bytes(4, "little") + frame[9:]


@pytest.mark.parametrize("size", [0, 1, 255, 256, 70_000, 1 << 20])
def test_the_stated_size_is_read_and_the_body_decodes(size: int) -> None:
    data = (b"page-view " * (size // 10 + 1))[:size]
    frame = _zstd(data)
    assert codecs.zstd_content_size(frame) == size
    assert bytes(codecs.decompress(codecs.ZSTD, frame)) == data


def test_no_stated_size_is_none_and_other_bytes_are_not_read_as_a_frame() -> None:
    streamed = cramjam.zstd.Compressor(level=1)
    streamed.compress(b"x" * 1000)
    frame = bytes(streamed.finish())
    if codecs.zstd_content_size(frame) is None:  # (a streamed frame may state none)
        assert bytes(codecs.decompress(codecs.ZSTD, frame)) == b"x" * 1000
    assert codecs.zstd_content_size(b"") is None
    assert codecs.zstd_content_size(b"\x28\xb5\x2f") is None
    assert codecs.zstd_content_size(b"not a zstd frame at all") is None


def test_a_frame_whose_stated_size_is_wrong_is_refused_as_corrupt() -> None:
    """zstd itself checks the stated size against what the frame holds (as before)."""
    data = b"hello world " * 10_000  # 120,000 bytes, far more than 8x compressible
    for stated in (10, 200_000):
        lying = _with_stated_size(_zstd(data), stated)
        assert codecs.zstd_content_size(lying) == stated
        with pytest.raises(InvalidBatchError, match="does not decompress"):
            codecs.decompress(codecs.ZSTD, lying)


def test_a_frame_stating_more_than_the_bound_is_refused_at_once() -> None:
    bomb = _with_stated_size(_zstd(b"\0" * 70_000), (4 << 30) - 1)  # "4 GiB"
    with pytest.raises(InvalidBatchError, match="decompresses to more than 1000 bytes"):
        codecs.decompress(codecs.ZSTD, bomb, max_bytes=1000)
    with pytest.raises(InvalidBatchError, match="decompresses to more than"):
        codecs.decompress(codecs.ZSTD, bomb)


@pytest.mark.parametrize("stated", [0, 1])
def test_a_frame_stating_a_tiny_size_starts_from_the_first_guess(
    stated: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first buffer is never below the first guess (64 KiB here), whatever the frame
    states: from a one-byte buffer, a frame that lies small would be decompressed once per
    x8 growth whenever the codec reports it as an overflow. (zstd refuses a frame whose
    stated size is wrong at the first attempt either way: corrupt, as before.)"""
    attempts = []
    real = codecs._DECOMPRESS_INTO[codecs.ZSTD]

    def counting(data: object, out: object) -> int:
        attempts.append(len(out))  # type: ignore[arg-type]
        return real(data, out)

    monkeypatch.setitem(codecs._DECOMPRESS_INTO, codecs.ZSTD, counting)
    lying = _with_stated_size(_zstd(b"page-view " * 50_000), stated)
    with pytest.raises(InvalidBatchError, match="does not decompress"):
        codecs.decompress(codecs.ZSTD, lying)
    assert attempts == [1 << 16], attempts
    # A frame that states 0 and holds nothing still decodes in one attempt.
    attempts.clear()
    assert bytes(codecs.decompress(codecs.ZSTD, _zstd(b""))) == b""
    assert len(attempts) == 1
