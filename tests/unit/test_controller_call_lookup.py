"""A controller call asks the nodes which controller is active again after a retriable error
(found from outside, network-partition review).

An active controller cut off from etcd answered "etcd did not answer" (REQUEST_TIMED_OUT) to
every write, and the client kept its address: every attempt for the call's whole deadline
went to it, though the nodes named the standby that had taken over seconds after the cut.

Two in-process gRPC servers on loopback stand in for the controllers and one for a storage
node (no etcd here: what is tested is the client's choice of whom to ask).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from strom.api import common_pb2, controller_pb2, controller_pb2_grpc, storage_pb2, storage_pb2_grpc
from strom.client.cluster import ClusterClient
from strom.errors import ErrorCode

E = ErrorCode


class Controller(controller_pb2_grpc.ControllerServiceServicer):
    """Answers CreateTopics with ``code`` (and names itself as the controller)."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.port = 0
        self.calls = 0

    def CreateTopics(self, request: Any, context: Any) -> Any:
        self.calls += 1
        resp = controller_pb2.CreateTopicsResponse(
            error_code=self.code,  # type: ignore[arg-type]
            controller=common_pb2.Node(node_id=self.port, host="127.0.0.1", port=self.port),
        )
        if self.code == E.REQUEST_TIMED_OUT:
            resp.error_message = "etcd did not answer: etcd unavailable: deadline exceeded"
        return resp


class Node(storage_pb2_grpc.StorageServiceServicer):
    """A storage node whose Metadata names ``controller_port`` as the active controller."""

    def __init__(self) -> None:
        self.controller_port = 0

    def Metadata(self, request: Any, context: Any) -> Any:
        return storage_pb2.MetadataResponse(
            controller=common_pb2.Node(
                node_id=self.controller_port, host="127.0.0.1", port=self.controller_port
            )
        )


@pytest.fixture
def servers() -> Iterator[tuple[Controller, Controller, Node, int]]:
    cut_off, standby, node = Controller(E.REQUEST_TIMED_OUT), Controller(E.NONE), Node()
    started: list[grpc.Server] = []
    for servicer in (cut_off, standby):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
        servicer.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    storage_pb2_grpc.add_StorageServiceServicer_to_server(node, server)
    node_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    started.append(server)
    try:
        yield cut_off, standby, node, node_port
    finally:
        for s in started:
            s.stop(None)


def test_a_retriable_error_sends_the_next_attempt_to_the_controller_the_nodes_name(
    servers: tuple[Controller, Controller, Node, int],
) -> None:
    cut_off, standby, node, node_port = servers
    client = ClusterClient(f"127.0.0.1:{node_port}", timeout_s=2.0, retry_s=5.0)
    try:
        node.controller_port = cut_off.port
        client.metadata(skip_topics=True)  # the client last heard of the cut-off controller
        node.controller_port = standby.port  # the standby took over; the nodes know it
        started = time.monotonic()
        resp = client.controller_call("CreateTopics", controller_pb2.CreateTopicsRequest())
        elapsed = time.monotonic() - started
    finally:
        client.close()
    assert resp.error_code == E.NONE
    assert cut_off.calls == 1, "the cut-off controller was asked again"
    assert standby.calls == 1
    assert elapsed < 2.0
