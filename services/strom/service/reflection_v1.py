"""gRPC server reflection under its stable name, ``grpc.reflection.v1``, beside ``v1alpha``.

Tools newer than grpcio-reflection (grpcurl 1.9, Postman, grpcui, other languages' clients)
ask ``grpc.reflection.v1.ServerReflection`` first, and some ask nothing else; the Python
package (1.85 here) serves only ``v1alpha``. The two versions' messages are the same fields
under another package name, so the same wire bytes serve both: the v1alpha servicer answers
the v1 method too, and a copy of the reflection file's descriptor renamed to the v1 package
goes into the descriptor pool, so that the v1 service can be described like any other.
When grpcio-reflection ships ``v1`` itself, :func:`enable` uses it instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_ALPHA = ".grpc.reflection.v1alpha."
_V1 = ".grpc.reflection.v1."


def _register_descriptor() -> None:
    """The v1 reflection file in the default pool (idempotent): v1alpha's, renamed."""
    pool = descriptor_pool.Default()
    try:
        pool.FindServiceByName(SERVICE_NAME)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = "grpc/reflection/v1/reflection.proto"
    fdp.package = "grpc.reflection.v1"
    for msg in fdp.message_type:
        for fld in msg.field:
            if fld.HasField("type_name"):  # set on message fields only (proto2 presence)
                fld.type_name = fld.type_name.replace(_ALPHA, _V1)
    for svc in fdp.service:
        for method in svc.method:
            method.input_type = method.input_type.replace(_ALPHA, _V1)
            method.output_type = method.output_type.replace(_ALPHA, _V1)
    pool.AddSerializedFile(fdp.SerializeToString())


def enable(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve reflection as v1alpha and v1, each listing ``service_names`` and both of them."""
    names = [*service_names, reflection.SERVICE_NAME, SERVICE_NAME]
    try:
        from grpc_reflection.v1 import reflection as v1  # type: ignore[import-not-found]
    except ImportError:
        v1 = None
    reflection.enable_server_reflection(names, server)
    if v1 is not None:  # pragma: no cover - a grpcio-reflection that has it
        v1.enable_server_reflection(names, server)
        return
    _register_descriptor()
    servicer = reflection.aio.ReflectionServicer(names)  # what v1alpha uses on aio servers
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
