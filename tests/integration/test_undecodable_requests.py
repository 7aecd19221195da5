"""A request whose bytes do not decode as the method's message is refused INVALID_ARGUMENT
naming the message type, and costs the service's log at most one line a minute (found from
outside: 500 garbage calls to StorageService/Metadata wrote 500 ERROR tracebacks, 396 kB
naming no caller, in 1.9 s, and the caller got UNKNOWN; the controller and the coordinator
alike). Real processes, garbage sent through a raw channel as a client in any language with
a wrong stub (or a hostile one) would."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor

from strom.api import controller_pb2
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster, Member
from tests.chaos.hostile import services_of

pytestmark = pytest.mark.integration

#: Field 1, length-delimited, with a length far past the end: no protobuf message decodes it.
GARBAGE = b"\x0a\xff\xff\xff\xff\x0f"
CALLS = 200


def _unary(address: str, method: str, calls: int) -> list[grpc.RpcError]:
    """The errors of ``calls`` garbage calls to ``method`` (each must fail)."""
    errors = []
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        for _ in range(calls):
            with pytest.raises(grpc.RpcError) as info:
                call(GARBAGE, timeout=30)
            errors.append(info.value)
    return errors


def _stream(address: str, method: str) -> grpc.RpcError:
    """The error of a request stream whose first message is garbage."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([GARBAGE]), timeout=30))
    return info.value


def _refused_as(error: grpc.RpcError, method: str, message_type: str) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    details = error.details() or ""
    assert details.startswith(f"{method}: request could not be decoded as {message_type}"), details


class _LogWatch:
    """The lines a member's log gains from here on."""

    def __init__(self, member: Member) -> None:
        self.path = member.log_path
        self.start = self.path.stat().st_size

    def lines(self) -> list[str]:
        with self.path.open("rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace").splitlines()


def _quiet(watch: _LogWatch, method: str) -> None:
    """No traceback or ERROR, and at most one line about the refused calls."""
    lines = watch.lines()
    assert not [line for line in lines if '"level": "error"' in line or "Traceback" in line], lines
    about = [line for line in lines if "could not be decoded" in line]
    assert len(about) <= 1, about
    for line in about:
        assert method in line and "127.0.0.1" in line, line  # the method and the caller


def test_garbage_to_a_storage_node_is_invalid_argument_and_quiet(
    one_node_cluster: LocalCluster,
) -> None:
    cluster = one_node_cluster
    node = cluster.nodes[0]
    watch = _LogWatch(node)
    metadata = "/strom.v1.StorageService/Metadata"
    for error in _unary(node.address, metadata, CALLS):
        _refused_as(error, metadata, "strom.v1.MetadataRequest")
    # Produce has a decoder of its own (large requests' records are not copied).
    produce = "/strom.v1.StorageService/Produce"
    for error in _unary(node.address, produce, 3):
        _refused_as(error, produce, "strom.v1.ProduceRequest")
    # Request streams: the first undecodable message ends the stream.
    for method, message_type in (
        ("/strom.v1.StorageService/FetchStream", "strom.v1.FetchRequest"),
        ("/strom.v1.StorageService/ProduceStream", "strom.v1.ProduceRequest"),
    ):
        _refused_as(_stream(node.address, method), method, message_type)
    _quiet(watch, metadata)
    # The node still answers good calls.
    with ClusterClient(cluster.bootstrap, retry_s=10) as client:
        assert client.metadata().nodes


def test_garbage_to_the_controller_and_the_coordinator_is_invalid_argument_and_quiet(
    one_node_cluster: LocalCluster,
) -> None:
    cluster = one_node_cluster
    for member, method, message_type in (
        (
            cluster.controllers[0],
            "/strom.v1.ControllerService/ListTopics",
            "strom.v1.ListTopicsRequest",
        ),
        (
            cluster.coordinators[0],
            "/strom.v1.CoordinatorService/ListGroups",
            "strom.v1.ListGroupsRequest",
        ),
    ):
        watch = _LogWatch(member)
        for error in _unary(member.address, method, CALLS):
            _refused_as(error, method, message_type)
        _quiet(watch, method)
    with ClusterClient(cluster.bootstrap, retry_s=10) as client:
        describe = controller_pb2.DescribeClusterRequest()
        assert client.controller_call("DescribeCluster", describe).nodes


def _garbage_call(channel: grpc.Channel, method: MethodDescriptor) -> grpc.RpcError:
    """The error of ``method`` called with GARBAGE as its (first) request."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    raw = {"request_serializer": None, "response_deserializer": None}
    with pytest.raises(grpc.RpcError) as info:
        if method.client_streaming:
            make = channel.stream_stream if method.server_streaming else channel.stream_unary
            answers = make(path, **raw)(iter([GARBAGE]), timeout=30)
        else:
            make = channel.unary_stream if method.server_streaming else channel.unary_unary
            answers = make(path, **raw)(GARBAGE, timeout=30)
        if method.server_streaming:
            list(answers)
    return info.value


def test_every_rpc_of_every_service_refuses_undecodable_bytes(
    one_node_cluster: LocalCluster,
) -> None:
    """Walks the services by server reflection (a new RPC is covered without a change): the
    strom services, health, and RecordService, whose methods parse their bytes themselves."""
    failures = []
    for member in one_node_cluster.members:
        watch = _LogWatch(member)
        with grpc.insecure_channel(member.address) as channel:
            for service in services_of(member.address):
                for method in service.methods:
                    error = _garbage_call(channel, method)
                    if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                        failures.append(
                            f"{method.full_name}: {error.code().name} {error.details()}"
                        )
        lines = watch.lines()
        assert not [line for line in lines if "Traceback" in line], lines
    assert not failures, "\n".join(failures)
