"""Server reflection as ``grpc.reflection.v1`` beside ``v1alpha`` (strom.service.reflection_v1),
on a real in-process grpc.aio server: clients that ask only v1 (found from outside) list and
describe strom's services, and v1alpha still answers."""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from strom.api import records_pb2  # noqa: F401  (RecordService's descriptor in the pool)
from strom.service import reflection_v1

V1_METHOD = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


async def _ask(
    target: str, requests: list[reflection_pb2.ServerReflectionRequest]
) -> list[reflection_pb2.ServerReflectionResponse]:
    """One v1 reflection stream (the v1 messages have v1alpha's fields and numbers)."""
    async with grpc.aio.insecure_channel(target) as ch:
        call = ch.stream_stream(
            V1_METHOD,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )(iter(requests), timeout=10)
        return [r async for r in call]


def test_v1_and_v1alpha_list_and_describe_the_services() -> None:
    async def main() -> None:
        server = grpc.aio.server()
        reflection_v1.enable(["strom.v1.RecordService"], server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        target = f"127.0.0.1:{port}"
        try:
            listed, described, own = await _ask(
                target,
                [
                    reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="strom.v1.RecordService"
                    ),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol=reflection_v1.SERVICE_NAME
                    ),
                ],
            )
            names = {s.name for s in listed.list_services_response.service}
            assert {
                "strom.v1.RecordService",
                "grpc.reflection.v1alpha.ServerReflection",
                "grpc.reflection.v1.ServerReflection",
            } <= names
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in described.file_descriptor_response.file_descriptor_proto
            ]
            assert "strom/v1/records.proto" in {f.name for f in files}
            (v1_file,) = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in own.file_descriptor_response.file_descriptor_proto
            ]
            assert v1_file.package == "grpc.reflection.v1"
            method = v1_file.service[0].method[0]
            assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
            async with grpc.aio.insecure_channel(target) as ch:  # v1alpha as before
                stub = reflection_pb2_grpc.ServerReflectionStub(ch)
                req = reflection_pb2.ServerReflectionRequest(list_services="")
                alpha = [r async for r in stub.ServerReflectionInfo(iter([req]), timeout=10)]
            assert names == {s.name for s in alpha[0].list_services_response.service}
        finally:
            await server.stop(0)

    asyncio.run(main())
