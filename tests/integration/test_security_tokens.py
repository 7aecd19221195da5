"""Bearer-token authentication on real processes (issue 16): TLS without client
certificates, a static token file and ACLs. A valid token's principal is what the ACLs see; a
bad token, or none, is UNAUTHENTICATED; the services reach each other with their own token
(--client-token-file), as a super user; an updated token file applies without a restart."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strom import Admin, Producer
from strom.api import controller_pb2, storage_pb2
from strom.api import metadata_pb2 as md
from strom.client.cluster import ClusterClient
from strom.devcluster.certs import CertificateAuthority
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import AuthenticationError
from strom.security import ChannelSecurity
from tests.conftest import member_metric

from .test_security import _code, allow, eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path, Path]]:
    root: Path = tmp_path_factory.mktemp("tokens")
    ca = CertificateAuthority(root / "ca")
    server = ca.issue("strom-node")
    tokens = root / "tokens.txt"
    tokens.write_text("node-token strom-service\nadmin-token admin\ncarol-token carol\n")
    (root / "service.token").write_text("node-token\n")
    args = [
        "--tls-cert",
        str(server.cert),
        "--tls-key",
        str(server.key),
        "--tls-ca",
        str(ca.ca_file),
        "--auth-tokens",
        str(tokens),
        "--client-token-file",
        str(root / "service.token"),
        # A verifier that raises on a bad token, the token in its message, as PyJWT-style
        # verifiers do (ip_address("bad-token") raises ValueError naming it).
        "--auth-token-verifier",
        "ipaddress:ip_address",
        "--acls",
        "--super-users",
        # The comma form of earlier versions, still read so (each part has its User:).
        "User:strom-service,User:admin",
    ]
    cluster = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=0,
        node_args=args,
        controller_args=args,
        security=ChannelSecurity.from_files(ca.ca_file, token="admin-token"),
    )
    try:
        cluster.start()
        with Admin(cluster.bootstrap, ssl_cafile=str(ca.ca_file), token="admin-token") as a:
            a.create_topic("orders", partitions=1, replication_factor=1)
        yield cluster, ca.ca_file, tokens
    finally:
        cluster.kill()


def test_a_tokens_principal_is_what_the_acls_see(env: tuple[LocalCluster, Path, Path]) -> None:
    cluster, ca, _ = env
    with ClusterClient(
        cluster.bootstrap, security=ChannelSecurity.from_files(ca, token="admin-token")
    ) as c:
        c.controller_call(
            "CreateAcls",
            controller_pb2.CreateAclsRequest(
                acls=[
                    allow(
                        "User:carol", md.ACL_OPERATION_WRITE, md.ACL_RESOURCE_TYPE_TOPIC, "orders"
                    )
                ]
            ),
        )
    with Producer(cluster.bootstrap, ssl_cafile=str(ca), token="carol-token") as p:
        assert eventually(lambda: p.send("orders", b"from carol")).result(10).offset >= 0


def test_bad_or_missing_tokens_are_unauthenticated(env: tuple[LocalCluster, Path, Path]) -> None:
    cluster, ca, _ = env
    for token in ("wrong", None):
        with ClusterClient(
            cluster.bootstrap, security=ChannelSecurity.from_files(ca, token=token)
        ) as c:
            req = storage_pb2.MetadataRequest()
            got = _code(lambda c=c, req=req: c.storage(cluster.bootstrap).Metadata(req, timeout=5))
            assert got == grpc.StatusCode.UNAUTHENTICATED


def test_a_changed_token_file_applies_without_a_restart(
    env: tuple[LocalCluster, Path, Path],
) -> None:
    cluster, ca, tokens = env
    sec = ChannelSecurity.from_files(ca, token="dave-token")
    with ClusterClient(cluster.bootstrap, security=sec) as c:
        req = storage_pb2.MetadataRequest()

        def code() -> grpc.StatusCode:
            return _code(lambda: c.storage(cluster.bootstrap).Metadata(req, timeout=5))

        assert code() == grpc.StatusCode.UNAUTHENTICATED
        tokens.write_text(tokens.read_text() + "dave-token dave\n")
        wait_for(lambda: code() == grpc.StatusCode.OK, timeout=5, what="the new token accepted")


def test_a_verifier_that_raises_refuses_the_token_without_showing_it(
    env: tuple[LocalCluster, Path, Path],
) -> None:
    """Found from outside: the verifier's exception ended the call UNKNOWN, its message (the
    token in it) sent back to the client."""
    cluster, ca, _ = env
    secret = "bad-secret-token"
    with ClusterClient(
        cluster.bootstrap, security=ChannelSecurity.from_files(ca, token=secret), retry_s=0
    ) as c:
        req = storage_pb2.MetadataRequest()
        with pytest.raises(grpc.RpcError) as raw:
            c.storage(cluster.bootstrap).Metadata(req, timeout=5)
        assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert secret not in (raw.value.details() or "")
        with pytest.raises(AuthenticationError) as refused:
            c.metadata()
        assert secret not in str(refused.value)
    log = cluster.nodes[0].log_path
    wait_for(
        lambda: "the bearer token verifier raised ValueError" in log.read_text(),
        timeout=5,
        what="the verifier's failure logged",
    )
    assert secret not in log.read_text()


def test_a_bad_token_file_version_still_revokes_removed_tokens(
    env: tuple[LocalCluster, Path, Path],
) -> None:
    """Found from outside: a rewrite that removed a token but had one bad line kept the old
    table in force, so the removed token went on authenticating, and nothing said so."""
    cluster, ca, tokens = env
    node = cluster.nodes[0]
    sec = ChannelSecurity.from_files(ca, token="carol-token")
    with ClusterClient(cluster.bootstrap, security=sec) as c:
        req = storage_pb2.MetadataRequest()

        def code() -> grpc.StatusCode:
            return _code(lambda: c.storage(cluster.bootstrap).Metadata(req, timeout=5))

        assert code() == grpc.StatusCode.OK
        # The series exists at 0 before any error (born at 1, its alert's increase() would
        # stay 0: found from outside).
        page = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5)
        assert 'strom_service_auth_token_file_errors_total{service="storage"} 0.0' in (
            page.read().decode()
        )
        errors = member_metric(
            node, "strom_service_auth_token_file_errors_total", service="storage"
        )
        good = tokens.read_text()
        # carol removed; erin added with a space in her principal, which makes the line bad.
        tokens.write_text(
            "".join(line for line in good.splitlines(True) if "carol" not in line)
            + "erin-token User:CN=erin, O=acme\n"
        )
        try:
            assert code() == grpc.StatusCode.UNAUTHENTICATED  # the removal applies
            assert (
                member_metric(node, "strom_service_auth_token_file_errors_total", service="storage")
                == errors + 1
            )
            text = node.log_path.read_text()
            assert f"bearer tokens file {tokens}: line " in text and "found 3 words" in text
            assert "erin-token" not in text
        finally:
            tokens.write_text(good)
        wait_for(lambda: code() == grpc.StatusCode.OK, timeout=5, what="carol's token back")


def test_a_byte_order_mark_or_a_non_ascii_token_shuts_out_no_other_token(
    env: tuple[LocalCluster, Path, Path],
) -> None:
    """Found from outside: a token file starting with a UTF-8 byte order mark, or holding a
    non-ASCII token, refused every bearer token (hmac.compare_digest raised TypeError on each
    call) and counted no error. Now the mark is dropped, the non-ASCII token's line is a bad
    line (counted), and so is a token given a second principal; the other tokens work."""
    cluster, ca, tokens = env
    node = cluster.nodes[0]

    def code(token: str) -> grpc.StatusCode:
        sec = ChannelSecurity.from_files(ca, token=token)
        with ClusterClient(cluster.bootstrap, security=sec, retry_s=0) as c:
            req = storage_pb2.MetadataRequest()
            return _code(lambda: c.storage(cluster.bootstrap).Metadata(req, timeout=5))

    good = tokens.read_text()
    errors = member_metric(node, "strom_service_auth_token_file_errors_total", service="storage")
    tokens.write_text(
        "\ufeff" + "café-token User:carol\n" + good + "dup-token alice\ndup-token admin\n",
        encoding="utf-8",
    )
    try:
        assert code("carol-token") == grpc.StatusCode.OK
        assert code("dup-token") == grpc.StatusCode.UNAUTHENTICATED
        assert (
            member_metric(node, "strom_service_auth_token_file_errors_total", service="storage")
            == errors + 1
        )
        text = node.log_path.read_text()
        assert "line 1: the token has a character that is not printable ASCII" in text
        dup = len(good.splitlines()) + 2  # the first dup-token line
        assert f"line {dup + 1}: the token of line {dup} again, with another principal" in text
        assert "café-token" not in text and "dup-token" not in text
    finally:
        tokens.write_text(good)


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[LocalCluster, Path, Path, Path]]:
    """Two storage nodes and a controller that reach each other with a service token."""
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.issue("strom-node")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("node-token strom-service\nadmin-token admin\n")
    service_token = tmp_path / "service.token"
    service_token.write_text("node-token\n")
    args = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    args += ["--tls-ca", str(ca.ca_file), "--auth-tokens", str(tokens)]
    args += ["--client-token-file", str(service_token)]
    cluster = LocalCluster(
        tmp_path / "c",
        nodes=2,
        controllers=1,
        coordinators=0,
        node_args=[*args, "--replica-lag-time-max-ms", "1000"],
        controller_args=args,
        security=ChannelSecurity.from_files(ca.ca_file, token="admin-token"),
    )
    try:
        cluster.start()
        yield cluster, ca.ca_file, tokens, service_token
    finally:
        cluster.kill()


def test_the_services_token_rotates_without_a_restart(
    two_nodes: tuple[LocalCluster, Path, Path, Path],
) -> None:
    """The procedure docs/security.md gives: the new token added to the tokens file, the
    services' token switched to it, the old one removed. Found from outside: the services read
    their own token once, so the follower's fetches went on with the removed one and were
    refused until it restarted."""
    cluster, ca, tokens, service_token = two_nodes
    admin = {"ssl_cafile": str(ca), "token": "admin-token"}
    with Admin(cluster.bootstrap, **admin) as a:  # type: ignore[arg-type]
        a.create_topic("t", partitions=1, replication_factor=2)
    pids = [n.process.pid for n in cluster.nodes]  # type: ignore[union-attr]

    def produce_and_replicate(n: int) -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=0, **admin) as producer:  # type: ignore[arg-type]
            for i in range(n):
                producer.send("t", b"%d" % i).result(timeout=30)
        labels = {"topic": "t", "partition": "0"}

        def replicated() -> bool:
            ends = [
                member_metric(m, "strom_storage_log_end_offset", **labels) for m in cluster.nodes
            ]
            return min(ends) == max(ends) >= n

        wait_for(replicated, timeout=30, what=f"both replicas at the same end, {n}")

    produce_and_replicate(3)
    tokens.write_text(tokens.read_text() + "node-token-2 strom-service\n")
    service_token.write_text("node-token-2\n")
    tokens.write_text("node-token-2 strom-service\nadmin-token admin\n")
    # The follower's fetch stream was opened with the old token: when its connection drops
    # (a network blip, here the kernel's socket kill) the new stream must carry the new one.
    for node in cluster.nodes:
        subprocess.run(
            ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{node.port}"],
            capture_output=True,
            check=False,
        )
    produce_and_replicate(6)
    assert [n.process.pid for n in cluster.nodes] == pids  # type: ignore[union-attr]
