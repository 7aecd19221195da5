"""A client newer than the node it asks (a rolling upgrade): the node's real answer to a
method it does not have."""

from __future__ import annotations

import grpc
import pytest

from strom.api import controller_pb2, storage_pb2
from strom.client.cluster import ClusterClient, older_node
from strom.devcluster.cluster import LocalCluster
from strom.errors import UnsupportedVersionError


def test_a_method_the_node_lacks_is_reported_as_an_older_version(
    one_node_cluster: LocalCluster,
) -> None:
    """Found from outside: `strom transactions producers` against a node of an older version
    said "UNKNOWN_SERVER_ERROR ... UNIMPLEMENTED Method not found!". A method the node does
    not have (here one no version has) now says the node is older than the client."""
    addr = one_node_cluster.nodes[0].address
    with ClusterClient(addr) as client:
        call = client.channel(addr).unary_unary(
            "/strom.v1.StorageService/DescribeTheFuture",
            request_serializer=storage_pb2.DescribeProducersRequest.SerializeToString,
            response_deserializer=storage_pb2.DescribeProducersResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(storage_pb2.DescribeProducersRequest(), timeout=10)
        error = older_node(err.value, addr, "DescribeTheFuture")
        assert isinstance(error, UnsupportedVersionError) and not error.retriable
        assert error.message == (
            f"the node at {addr} does not know DescribeTheFuture: it runs an older strom "
            "version than this client"
        )
        # Any other failure is not taken for an older node (here: nothing listens there).
        with pytest.raises(grpc.RpcError) as err:
            client.storage("127.0.0.1:1").Metadata(storage_pb2.MetadataRequest(), timeout=10)
        assert older_node(err.value, "127.0.0.1:1", "Metadata") is None


def test_a_controller_call_the_process_lacks_is_not_retried_elsewhere(
    one_node_cluster: LocalCluster,
) -> None:
    """An UNIMPLEMENTED controller call ends at once, naming the process that lacks it: no
    other controller can answer it better while the old one is active. (A storage node,
    which serves no ControllerService, stands in for an older controller here.)"""
    addr = one_node_cluster.nodes[0].address
    with ClusterClient(addr, retry_s=30) as client:
        client._controller_addr = addr
        with pytest.raises(UnsupportedVersionError) as err:
            client.controller_call("DescribeCluster", controller_pb2.DescribeClusterRequest())
        assert err.value.message == (
            f"the node at controller {addr} does not know DescribeCluster: it runs an older "
            "strom version than this client"
        )
