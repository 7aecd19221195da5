"""Protobuf's base-128 varint, for the few messages built or read at the wire level.

The produce request (client), its parsing and the Subscribe answers' throttle field (node)
are handled as bytes so batch bytes are never copied into generated messages
(:mod:`strom.client.wire`, :mod:`strom.storage.wire`); they share this encoder. The decoders
stay with their parsers: each raises its own error and one of them skips the bounds check on
the consumer's hot path."""

from __future__ import annotations


def encode_varint(value: int) -> bytes:
    """``value`` (≥ 0) as an unsigned protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
