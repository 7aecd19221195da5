"""Just enough HTTP/2 to be a misbehaving gRPC client: the connection preface, HEADERS with
literal (unindexed, un-Huffman-coded) HPACK fields, and DATA frames carrying a length-prefixed
gRPC message that can be cut short on purpose. Real clients never do this; slow and broken
ones do, which is what the tests need."""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS = 0, 1, 4
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([ftype, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _literal(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def grpc_headers(path: str) -> bytes:
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "strom"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return b"".join(_literal(k, v) for k, v in fields)


def connect(host: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A connection that has sent the preface and an empty SETTINGS frame."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(PREFACE + frame(SETTINGS, 0, 0))
    return s


def stall_call(s: socket.socket, stream: int, path: str, message: bytes, sent: int) -> None:
    """Open call ``stream`` on ``path`` and send only the first ``sent`` bytes of the
    length-prefixed ``message`` (no END_STREAM): the server waits for the rest."""
    body = b"\x00" + struct.pack(">I", len(message)) + message
    assert sent <= 16_384, "one DATA frame (the default SETTINGS_MAX_FRAME_SIZE)"
    s.sendall(
        frame(HEADERS, END_HEADERS, stream, grpc_headers(path))
        + frame(DATA, 0, stream, body[:sent])
    )


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    """True if the peer closes (or resets) ``s`` within ``timeout`` seconds; frames it sends
    meanwhile (SETTINGS, GOAWAY) are read and dropped."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
