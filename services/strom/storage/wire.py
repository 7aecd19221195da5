"""Zero-copy protobuf wire handling for the two bulk RPCs (Produce requests, Fetch responses).

Why: with the generated code, a 1 MiB batch is copied three times per request on top of what
gRPC itself does: into the protobuf arena when the request is parsed, out again when
``records`` is read, and (for Fetch) into the arena and out once more when the response is
built and serialized. At ~1 GB/s on loopback those copies are a large share of a request's
cost. The message *structure* is tiny (a topic name, a few integers per partition), so it is
parsed and written by hand here, and the record bytes are only ever referenced:

* :func:`parse_produce_request` returns views whose ``records`` is a ``memoryview`` into the
  request buffer gRPC handed over; the log writes it to disk from there.
* :func:`encode_fetch_response` serializes each partition's small fields with protobuf and
  splices the record bytes in as field 10 (protobuf allows fields in any order), so the
  response is assembled by a single ``b"".join``.

The result is byte-for-byte valid ``strom.v1`` protobuf: clients use the generated classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from strom.api import storage_pb2 as pb
from strom.protowire import encode_varint

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The request bytes are not a valid message (a whole-request error)."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint too long")


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """Yield (field number, wire type, value) where value is an int or a (start, end) span."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if wt == _VARINT:
            v, pos = _varint(buf, pos, end)
            yield num, wt, v
        elif wt == _LEN:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise WireError(f"field {num} runs past the end of its message")
            yield num, wt, (pos, pos + n)
            pos += n
        elif wt == _I64:
            pos += 8
        elif wt == _I32:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wt} for field {num}")
    if pos != end:
        raise WireError("message runs past its end")


def top_level_string(raw: bytes | bytearray | memoryview, number: int) -> str | None:
    """String field ``number`` of the serialized message ``raw``, read from its top level
    without parsing the rest: its last occurrence (protobuf's rule for a singular field), ""
    when absent; None when the top level is not valid wire format or the string is not UTF-8
    (the caller then parses the whole message)."""
    buf = memoryview(raw)
    found = ""
    try:
        for num, wt, value in _fields(buf, 0, len(buf)):
            if num == number and wt == _LEN:
                found = bytes(buf[value[0] : value[1]]).decode()
    except (WireError, UnicodeDecodeError):
        return None
    return found


@dataclass(slots=True)
class ProducePartitionView:
    """Duck-types :class:`strom.v1.ProducePartitionData` with ``records`` not copied."""

    partition: int = 0
    records: memoryview | bytes = b""
    current_leader_epoch: int = 0


@dataclass(slots=True)
class ProduceTopicView:
    """Duck-types :class:`strom.v1.ProduceTopicData`."""

    topic: str = ""
    partitions: list[ProducePartitionView] = field(default_factory=list)
    topic_id: str = ""


@dataclass(slots=True)
class ProduceRequestView:
    """Duck-types :class:`strom.v1.ProduceRequest` (what the servicer reads of it)."""

    acks: int = 0
    timeout_ms: int = 0
    topics: list[ProduceTopicView] = field(default_factory=list)
    transactional_id: str = ""


#: Produce requests up to this size are parsed by the generated (C) parser instead.
SMALL_REQUEST_BYTES = 16 * 1024


def decode_produce_request(data: bytes) -> pb.ProduceRequest | ProduceRequestView:
    """The server's deserializer for Produce: a small request by the generated parser (the
    C one: 1-3 µs, where walking the fields in Python takes 13-16 µs; each read of a small
    request's ``records`` copies it, well under a µs), a large one by
    :func:`parse_produce_request` (its record bytes never copied). The servicer reads both
    alike."""
    if len(data) <= SMALL_REQUEST_BYTES:
        return pb.ProduceRequest.FromString(data)
    return parse_produce_request(data)


def parse_produce_request(data: bytes) -> ProduceRequestView:
    """Parse a serialized ProduceRequest; record bytes stay in ``data`` (memoryviews)."""
    buf = memoryview(data)
    req = ProduceRequestView()
    for num, wt, v in _fields(buf, 0, len(buf)):
        if num == 1 and wt == _VARINT:
            req.acks = _int32(v)
        elif num == 2 and wt == _VARINT:
            req.timeout_ms = _int32(v)
        elif num == 3 and wt == _LEN:
            req.topics.append(_topic(buf, *v))
        elif num == 4 and wt == _LEN:
            try:
                req.transactional_id = bytes(buf[v[0] : v[1]]).decode()
            except UnicodeDecodeError:
                raise WireError("transactional_id is not UTF-8") from None
    return req


def _topic(buf: memoryview, start: int, end: int) -> ProduceTopicView:
    t = ProduceTopicView()
    for num, wt, v in _fields(buf, start, end):
        if num == 1 and wt == _LEN:
            try:
                t.topic = bytes(buf[v[0] : v[1]]).decode()
            except UnicodeDecodeError:
                raise WireError("topic name is not UTF-8") from None
        elif num == 2 and wt == _LEN:
            p = ProducePartitionView()
            for n2, w2, v2 in _fields(buf, *v):
                if n2 == 1 and w2 == _VARINT:
                    p.partition = _int32(v2)
                elif n2 == 2 and w2 == _LEN:
                    p.records = buf[v2[0] : v2[1]]
                elif n2 == 3 and w2 == _VARINT:
                    p.current_leader_epoch = _int32(v2)
            t.partitions.append(p)
        elif num == 3 and wt == _LEN:
            try:
                t.topic_id = bytes(buf[v[0] : v[1]]).decode()
            except UnicodeDecodeError:
                raise WireError("topic_id is not UTF-8") from None
    return t


def _len_field(tag: int, payload_len: int) -> bytes:
    return bytes((tag,)) + encode_varint(payload_len)


_TOPIC_NAME_TAG = (1 << 3) | _LEN  # FetchTopicResponse.topic / FetchResponse.topics
_PARTITIONS_TAG = (2 << 3) | _LEN  # FetchTopicResponse.partitions
_RECORDS_TAG = (10 << 3) | _LEN  # FetchPartitionResponse.records


@dataclass(slots=True)
class FetchPartitionOut:
    """One partition's answer: the small fields as a message, the records beside it."""

    message: pb.FetchPartitionResponse
    records: bytes | memoryview = b""
    #: Where a read of this partition would go on after this answer (the end of the last
    #: batch in ``records``; the fetch offset when there are none): a followed FetchStream
    #: request continues from it. -1 when the partition failed or answered a divergence.
    next_offset: int = -1


@dataclass(slots=True)
class FetchTopicOut:
    topic: str
    partitions: list[FetchPartitionOut] = field(default_factory=list)


def encode_fetch_response(
    topics: Sequence[FetchTopicOut], endpoints: pb.FetchResponse | None = None
) -> bytes:
    """Serialize a FetchResponse without copying record bytes more than once (the join)."""
    pieces: list[bytes | memoryview] = []
    for t in topics:
        name = t.topic.encode()
        topic_pieces: list[bytes | memoryview] = [_len_field(_TOPIC_NAME_TAG, len(name)), name]
        for p in t.partitions:
            small = p.message.SerializeToString()
            n = len(p.records)
            if n:
                rec_head = _len_field(_RECORDS_TAG, n)
                size = len(small) + len(rec_head) + n
                topic_pieces += [_len_field(_PARTITIONS_TAG, size), small, rec_head, p.records]
            else:
                topic_pieces += [_len_field(_PARTITIONS_TAG, len(small)), small]
        topic_len = sum(len(x) for x in topic_pieces)
        pieces.append(_len_field(_TOPIC_NAME_TAG, topic_len))
        pieces += topic_pieces
    if endpoints is not None:
        pieces.append(endpoints.SerializeToString())  # only node_endpoints (field 2) set
    return b"".join(pieces)
