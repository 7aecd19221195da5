"""Hostile requests for every RPC, built from the service descriptors.

:func:`services_of` asks a running process (gRPC server reflection) which services it
serves, so an RPC added later is covered without touching this file. :func:`requests_for`
fills a method's request message with hostile values field by field: empty and huge names,
path-like names (``../x``, ``a/b``), NUL bytes, names of internal topics, negative and huge
numbers (partition -1, max_bytes 2^31-1, offsets 2^63-1), unknown enum values, junk bytes,
repeated fields with 0..3 entries including exact duplicates (the same partition twice in one
request), nested messages down to a few levels. Deterministic variants first, then seeded
random ones, so a failure names its variant and replays.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from strom.record import encode_batch

F = FieldDescriptor

#: Never 1-3: the test clusters' node ids (a ControlledShutdown of a real node is not hostile
#: input, it is an operation).
INT32 = [0, -1, -(2**31), 2**31 - 1, 7, 1000]
INT64 = [0, -1, -(2**63), 2**63 - 1, 7]
UINT32 = [0, 7, 2**32 - 1]
UINT64 = [0, 7, 2**64 - 1]
STRINGS = [
    "",
    "../x",
    "a/b",
    ".",
    "..",
    "nul\x00byte",
    "é✓" * 4,
    "__consumer_offsets",
    "x" * 300,
    "y" * 70_000,
    "-",
    " spaced ",
]
BYTES = [
    b"",
    b"\x00" * 61,
    bytes(range(256)),
    encode_batch([b"v"]),  # a valid batch: reaches deeper checks where a batch goes
    encode_batch([b"v"])[:40],
    b"\xff" * 70_000,
]
FLOATS = [0.0, -1.0, 1e308, float("nan")]
ENUMS = [0, 1, 999, -7, 2**31 - 1]


def pool_for(field: FieldDescriptor) -> list[Any]:
    t = field.type
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return INT32
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return INT64
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return UINT32
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return UINT64
    if t == F.TYPE_STRING:
        return STRINGS
    if t == F.TYPE_BYTES:
        return BYTES
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return FLOATS
    if t == F.TYPE_BOOL:
        return [False, True]
    if t == F.TYPE_ENUM:
        return ENUMS
    raise TypeError(f"no hostile values for field type {t}")


@dataclass(frozen=True)
class Variant:
    name: str
    request: Message


def _pick(values: list[Any], variant: int, salt: int, rnd: random.Random | None) -> Any:
    if rnd is not None:
        return rnd.choice(values)
    return values[(variant + salt) % len(values)]


def fill(msg: Message, variant: int, rnd: random.Random | None = None, depth: int = 0) -> None:
    """Set every field of ``msg`` to a hostile value (see the module docstring)."""
    seen_oneofs: set[str] = set()
    for salt, field in enumerate(msg.DESCRIPTOR.fields):
        oneof = field.containing_oneof
        if oneof is not None:
            if oneof.name in seen_oneofs:
                continue
            members = list(oneof.fields)
            field = members[(variant + salt) % len(members)] if rnd is None else rnd.choice(members)
            seen_oneofs.add(oneof.name)
        name = field.name
        is_message = field.type == F.TYPE_MESSAGE
        if field.is_repeated:
            count = (variant + salt) % 4 if rnd is None else rnd.randint(0, 3)
            if is_message and field.message_type.GetOptions().map_entry:
                _fill_map(getattr(msg, name), field, variant, rnd, depth, count)
                continue
            if is_message:
                if depth >= 4:
                    continue
                container = getattr(msg, name)
                for i in range(count):
                    # Entries 0 and 1 are the same (a duplicated partition, topic, ...).
                    fill(container.add(), variant + (i // 2), rnd, depth + 1)
            else:
                values = pool_for(field)
                picked = _pick(values, variant, salt, rnd)
                getattr(msg, name).extend([picked] * count)
            continue
        if is_message:
            if depth < 4:
                fill(getattr(msg, name), variant, rnd, depth + 1)
            continue
        setattr(msg, name, _pick(pool_for(field), variant, salt, rnd))


def _fill_map(
    container: Any,
    field: FieldDescriptor,
    variant: int,
    rnd: random.Random | None,
    depth: int,
    count: int,
) -> None:
    key_f = field.message_type.fields_by_name["key"]
    val_f = field.message_type.fields_by_name["value"]
    for i in range(count):
        key = _pick(pool_for(key_f), variant + i, 0, rnd)
        if val_f.type == F.TYPE_MESSAGE:
            if depth < 4:
                fill(container[key], variant + i, rnd, depth + 1)
        else:
            container[key] = _pick(pool_for(val_f), variant + i, 1, rnd)


def requests_for(
    method: MethodDescriptor, *, fixed: int = 8, randomized: int = 8, seed: int = 13
) -> Iterator[Variant]:
    cls = message_factory.GetMessageClass(method.input_type)
    yield Variant("empty", cls())
    for v in range(fixed):
        m = cls()
        fill(m, v)
        yield Variant(f"fixed-{v}", m)
    rnd = random.Random(f"{seed}:{method.full_name}")
    for v in range(randomized):
        m = cls()
        fill(m, v, rnd)
        yield Variant(f"random-{seed}-{v}", m)


def services_of(address: str) -> list[ServiceDescriptor]:
    """Every service ``address`` serves (server reflection), minus reflection itself."""
    with grpc.insecure_channel(address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        pool = descriptor_pool.DescriptorPool(db)
        out = []
        for name in db.get_services():
            if name.startswith("grpc.reflection."):
                continue
            out.append(pool.FindServiceByName(name))
        # Resolve every message type now, while the channel is open.
        for svc in out:
            for m in svc.methods:
                message_factory.GetMessageClass(m.input_type)
                message_factory.GetMessageClass(m.output_type)
        return out


#: Statuses that are a clear answer to a bad request. UNKNOWN (an unhandled exception in
#: the servicer), INTERNAL and DATA_LOSS are not.
CLEAR = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNAVAILABLE,
}


def call(
    channel: grpc.Channel, method: MethodDescriptor, request: Message, timeout: float
) -> tuple[grpc.StatusCode, str]:
    """Invoke ``method`` with ``request``; (status, details). Streams: read a few answers."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    out_cls = message_factory.GetMessageClass(method.output_type)
    ser, de = (lambda m: m.SerializeToString()), out_cls.FromString
    try:
        if method.client_streaming and method.server_streaming:
            stream = channel.stream_stream(path, request_serializer=ser, response_deserializer=de)
            for i, _ in enumerate(stream(iter([request, request]), timeout=timeout)):
                if i >= 3:
                    break
        elif method.client_streaming:
            channel.stream_unary(path, request_serializer=ser, response_deserializer=de)(
                iter([request, request]), timeout=timeout
            )
        elif method.server_streaming:
            stream = channel.unary_stream(path, request_serializer=ser, response_deserializer=de)
            responses = stream(request, timeout=timeout)
            for i, _ in enumerate(responses):
                if i >= 3:
                    responses.cancel()
                    break
        else:
            channel.unary_unary(path, request_serializer=ser, response_deserializer=de)(
                request, timeout=timeout
            )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:  # we cancelled a stream after 3 answers
            return grpc.StatusCode.OK, ""
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""
