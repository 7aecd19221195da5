"""Client quotas leave the cluster's own work alone (found from outside): on an mTLS cluster
with ACLs, a ``User:*`` default of 1000 B/s made every group commit take ~2.8 s (the
coordinator's append to ``__consumer_offsets`` was charged to the services' principal) and a
20 KB ProduceRecords sent to a node that is not the partition's leader ~20 s (the node's
forward to the leader was charged to it too). The services' own principal (the subject of
their certificate under mTLS, their service token's with bearer tokens) is now never
charged; a client's is, where its call arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strom import Admin, TopicPartition
from strom.api import controller_pb2, records_pb2, records_pb2_grpc, storage_pb2
from strom.api import metadata_pb2 as md
from strom.client.cluster import ClusterClient
from strom.devcluster.certs import CertificateAuthority, Pem
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.record import encode_batch
from strom.security import ChannelSecurity
from tests.conftest import member_metric

pytestmark = pytest.mark.integration

DEFAULT_RATE = 1000  # B/s: the User:* default of produce and fetch


class Env:
    """A 2-node cluster with ACLs whose services authenticate to each other with their
    certificate (``mtls``) or with a service token over TLS (``tokens``); the clients
    ``admin`` (a super user) and ``bob`` authenticate the same way."""

    def __init__(self, root: Path, mode: str) -> None:
        self.mode = mode
        self.ca = CertificateAuthority(root / "ca")
        self.node = self.ca.issue("strom-node")
        self.certs = {"admin": self.ca.issue("admin"), "bob": self.ca.issue("bob")}
        self.tokens = root / "tokens.txt"
        self.tokens.write_text("node-token strom-service\nadmin-token admin\nbob-token bob\n")
        self.service_token = root / "service.token"
        self.service_token.write_text("node-token\n")
        self.cluster: LocalCluster | None = None

    def args(self) -> list[str]:
        """Every service's security flags."""
        tls = [*("--tls-cert", str(self.node.cert), "--tls-key", str(self.node.key))]
        tls += ["--tls-ca", str(self.ca.ca_file), "--acls"]
        tls += ["--etcd-ca", str(self.ca.ca_file)]
        tls += ["--etcd-cert", str(self.node.cert), "--etcd-key", str(self.node.key)]
        if self.mode == "mtls":
            supers = "User:CN=strom-node;User:CN=admin"
            return [*tls, "--tls-client-auth", "required", "--super-users", supers]
        tokens = ["--auth-tokens", str(self.tokens), "--client-token-file", str(self.service_token)]
        return [*tls, *tokens, "--super-users", "User:strom-service;User:admin"]

    def principal(self, who: str) -> str:
        return f"User:CN={who}" if self.mode == "mtls" else f"User:{who}"

    def security(self, who: str) -> ChannelSecurity:
        if self.mode == "mtls":
            pem: Pem = self.certs[who]
            return ChannelSecurity.from_files(self.ca.ca_file, pem.cert, pem.key)
        return ChannelSecurity.from_files(self.ca.ca_file, token=f"{who}-token")

    def client(self, who: str) -> dict[str, str]:
        if self.mode == "mtls":
            pem = self.certs[who]
            return {
                "ssl_cafile": str(self.ca.ca_file),
                "ssl_certfile": str(pem.cert),
                "ssl_keyfile": str(pem.key),
            }
        return {"ssl_cafile": str(self.ca.ca_file), "token": f"{who}-token"}

    @property
    def bootstrap(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap

    def controller_call(self, method: str, request: object) -> object:
        with ClusterClient(self.bootstrap, security=self.security("admin")) as c:
            return c.controller_call(method, request)


@pytest.fixture(scope="module", params=["mtls", "tokens"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp(f"quota-services-{request.param}")
    e = Env(root, request.param)
    args = e.args()
    cluster = LocalCluster(
        root / "c",
        nodes=2,
        controllers=1,
        coordinators=1,
        node_args=args,
        controller_args=args,
        coordinator_args=[
            *args,
            "--offsets-partitions",
            "1",
            "--transaction-state-partitions",
            "1",
        ],
        security=e.security("admin"),
        etcd_tls=(e.node.cert, e.node.key, e.ca.ca_file),
    )
    e.cluster = cluster
    try:
        cluster.start()
        yield e
    finally:
        cluster.kill()


def _throttled(env: Env) -> float:
    """Requests throttled on every node, of either kind."""
    assert env.cluster is not None
    return sum(
        member_metric(n, "strom_storage_throttled_requests_total", kind=kind)
        for n in env.cluster.nodes
        for kind in ("produce", "fetch")
    )


def _default_applies_on_every_node(env: Env, topic: str, partitions: int) -> None:
    """Wait until bob (the default's 1000 B/s) is throttled by each partition's leader: the
    quotas have reached every node."""
    with ClusterClient(env.bootstrap, security=env.security("bob")) as c:
        for p in range(partitions):
            req = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
            req.topics.add(topic=topic).partitions.add(
                partition=p, records=encode_batch([b"b" * 1500]), current_leader_epoch=-1
            )

            def throttled(p: int = p, req: storage_pb2.ProduceRequest = req) -> bool:
                try:
                    node = c.storage(c.leader_of(topic, p))
                    return node.Produce(req, timeout=60).throttle_time_ms > 0
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.PERMISSION_DENIED:  # ACL not there yet
                        raise
                    return False

            wait_for(throttled, timeout=60, what=f"the default quota on partition {p}'s leader")


def test_a_default_quota_does_not_throttle_commits_or_forwarded_records(env: Env) -> None:
    topic = "quota-fwd"
    with Admin(env.bootstrap, **env.client("admin")) as admin:  # type: ignore[arg-type]
        admin.create_topic(topic, partitions=2, replication_factor=1)
    env.controller_call(
        "CreateAcls",
        controller_pb2.CreateAclsRequest(
            acls=[
                md.AclBinding(
                    principal=env.principal("bob"),
                    operation=md.ACL_OPERATION_WRITE,
                    permission=md.ACL_PERMISSION_ALLOW,
                    resource_type=md.ACL_RESOURCE_TYPE_TOPIC,
                    resource_name=topic,
                    pattern_type=md.PATTERN_TYPE_LITERAL,
                )
            ]
        ),
    )
    fast = 100_000_000.0
    env.controller_call(
        "AlterClientQuotas",
        controller_pb2.AlterClientQuotasRequest(
            quotas=[
                md.ClientQuota(
                    principal="User:*",
                    produce_bytes_per_second=DEFAULT_RATE,
                    fetch_bytes_per_second=DEFAULT_RATE,
                ),
                # The admin (our client here) has a rate of its own, far above what it sends.
                md.ClientQuota(
                    principal=env.principal("admin"),
                    produce_bytes_per_second=fast,
                    fetch_bytes_per_second=fast,
                ),
            ]
        ),
    )
    _default_applies_on_every_node(env, topic, 2)
    before = _throttled(env)

    # Group commits: each is an append to __consumer_offsets by the coordinator, as
    # the services' principal; ten of them are several KB, seconds of a 1000 B/s rate.
    with Admin(env.bootstrap, **env.client("admin")) as admin:  # type: ignore[arg-type]
        for offset in range(10):
            admin.alter_group_offsets("quota-group", {TopicPartition(topic, 0): offset})
        committed = admin.list_group_offsets("quota-group")
    assert committed[TopicPartition(topic, 0)].offset == 9
    assert _throttled(env) == before, "a node throttled the coordinator's appends"

    # 20 KB to each partition through one node: the other node's partition is forwarded to
    # its leader as the services' principal (20 s of the default's rate).
    with ClusterClient(env.bootstrap, security=env.security("admin")) as c:
        assert {c.leader_of(topic, p) for p in range(2)} == {
            n.address
            for n in env.cluster.nodes  # type: ignore[union-attr]
        }, "each node leads one partition"
        first = env.cluster.nodes[0].address  # type: ignore[union-attr]
        stub = records_pb2_grpc.RecordServiceStub(c.channel(first))
        for p in range(2):
            resp = stub.ProduceRecords(
                records_pb2.ProduceRecordsRequest(
                    topic=topic,
                    partition=p,
                    records=records_pb2.RecordColumns(values=[b"f" * 20_000]),
                ),
                timeout=60,
            )
            assert [r.error_code for r in resp.results] == [0], resp

    assert _throttled(env) == before, "a node throttled a forward to the leader"
