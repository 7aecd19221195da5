"""TLS, mTLS, authentication, ACLs and quotas on real processes (issue 16), with real
certificates made in the test: etcd over TLS with a client certificate, every strom service
serving TLS and requiring client certificates, ACLs on (default deny), the services' own
certificate a super user.

- a plaintext client, a client trusting another CA and one with an expired certificate are
  refused;
- a principal without WRITE cannot produce (the error names the missing permission), one
  with it can; a DENY beats an ALLOW; a prefixed ACL covers topics created later;
- an ACL change reaches the storage node, the controller and the coordinator within a second,
  without a restart;
- every ControllerService and CoordinatorService RPC refuses a principal without ACLs
  (walking the service descriptors: a new RPC cannot be added unchecked);
- a produce quota throttles (throttle_time_ms), it does not drop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.api import (
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
    records_pb2,
    records_pb2_grpc,
    storage_pb2,
)
from strom.api import metadata_pb2 as md
from strom.client.cluster import ClusterClient
from strom.devcluster.certs import CertificateAuthority, Pem
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import (
    AuthenticationError,
    AuthorizationError,
    ClusterAuthorizationFailedError,
    ErrorCode,
    GroupAuthorizationFailedError,
    StromError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from strom.record import encode_batch
from strom.security import ChannelSecurity
from strom.service.headers import INTERNAL_TOPICS_METADATA_KEY
from tests.conftest import member_metric

pytestmark = pytest.mark.integration


class Env:
    def __init__(self, root: Path) -> None:
        self.ca = CertificateAuthority(root / "ca")
        self.node = self.ca.issue("strom-node")
        self.admin = self.ca.issue("admin")
        self.alice = self.ca.issue("alice")
        self.bob = self.ca.issue("bob")
        self.nobody = self.ca.issue("nobody")  # never gets an ACL
        self.writer = self.ca.issue("writer")  # WRITE on every topic, nothing else
        self.hog = self.ca.issue("hog")  # far over a produce quota (its debt is never paid)
        self.viewer = self.ca.issue("viewer")  # DESCRIBE on orders, nothing else
        self.patterned = self.ca.issue("patterned")  # READ on pat-orders and groups pat-*
        self.expired = self.ca.issue("alice", expired=True)
        self.other_ca = CertificateAuthority(root / "other", "other-ca")
        self.stranger = self.other_ca.issue("alice")
        self.cluster: LocalCluster | None = None

    def service_args(self) -> list[str]:
        """Every service's flags: mTLS with the node certificate, ACLs with the node and
        admin as super users, and TLS to etcd."""
        return [
            *("--tls-cert", str(self.node.cert), "--tls-key", str(self.node.key)),
            *("--tls-ca", str(self.ca.ca_file), "--tls-client-auth", "required"),
            *("--acls", "--super-users", "User:CN=strom-node;User:CN=admin"),
            *("--etcd-ca", str(self.ca.ca_file), "--etcd-cert", str(self.node.cert)),
            *("--etcd-key", str(self.node.key)),
        ]

    def security(self, who: Pem | None, ca: Path | None = None, token: str | None = None):
        return ChannelSecurity.from_files(
            ca or self.ca.ca_file,
            who.cert if who else None,
            who.key if who else None,
            token,
        )

    def client(self, who: Pem | None, **kw: object) -> dict[str, object]:
        """Producer/Consumer/Admin keyword arguments for ``who``."""
        out: dict[str, object] = {"ssl_cafile": str(self.ca.ca_file)}
        if who is not None:
            out.update(ssl_certfile=str(who.cert), ssl_keyfile=str(who.key))
        out.update(kw)
        return out

    @property
    def bootstrap(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap

    def acls(self, *bindings: md.AclBinding) -> None:
        with ClusterClient(self.bootstrap, security=self.security(self.admin)) as c:
            resp = c.controller_call("CreateAcls", controller_pb2.CreateAclsRequest(acls=bindings))
        assert all(r.code == 0 for r in resp.results), resp

    def quota(self, principal: str, **rates: float) -> None:
        """Set ``principal``'s quota (as the admin); no rates removes it."""
        with ClusterClient(self.bootstrap, security=self.security(self.admin)) as c:
            c.controller_call(
                "AlterClientQuotas",
                controller_pb2.AlterClientQuotasRequest(
                    quotas=[md.ClientQuota(principal=principal, **rates)]
                ),
            )


def eventually(fn, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    """``fn()`` once the services have applied a new ACL (each within a second of the
    write); AuthorizationError until then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except AuthorizationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling the condition "the ACL has reached this service"


def allow(
    principal: str, op: int, res: int, name: str, *, prefixed: bool = False, deny: bool = False
):
    return md.AclBinding(
        principal=principal,
        operation=op,  # type: ignore[arg-type]
        permission=md.ACL_PERMISSION_DENY if deny else md.ACL_PERMISSION_ALLOW,
        resource_type=res,  # type: ignore[arg-type]
        resource_name=name,
        pattern_type=md.PATTERN_TYPE_PREFIXED if prefixed else md.PATTERN_TYPE_LITERAL,
    )


TOPIC, GROUP = md.ACL_RESOURCE_TYPE_TOPIC, md.ACL_RESOURCE_TYPE_GROUP
INFLIGHT_BUDGET = 2 << 20  # the node's --max-inflight-produce-bytes
READ, WRITE, CREATE = md.ACL_OPERATION_READ, md.ACL_OPERATION_WRITE, md.ACL_OPERATION_CREATE


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("security")
    e = Env(root)
    tls = e.service_args()
    cluster = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=1,
        # A small in-flight produce budget, so that a throttled principal could fill it.
        node_args=[*tls, "--max-inflight-produce-bytes", str(INFLIGHT_BUDGET)],
        controller_args=tls,
        coordinator_args=[*tls, "--offsets-partitions", "1", "--transaction-state-partitions", "1"],
        security=e.security(e.admin),
        etcd_tls=(e.node.cert, e.node.key, e.ca.ca_file),
    )
    e.cluster = cluster
    try:
        cluster.start()
        with Admin(e.bootstrap, **e.client(e.admin)) as admin:  # type: ignore[arg-type]
            admin.create_topic("orders", partitions=1, replication_factor=1)
        yield e
    finally:
        cluster.kill()


def test_tls_refuses_plaintext_other_cas_and_expired_certificates(env: Env) -> None:
    addr = env.bootstrap
    for sec, says in (
        (ChannelSecurity(), "pass --ssl-cafile"),  # plaintext
        (env.security(None), "pass --ssl-certfile"),  # TLS without a client certificate
        # Does not trust the server.
        (env.security(env.alice, ca=env.other_ca.ca_file), "CERTIFICATE_VERIFY_FAILED"),
        # A client certificate from another CA: the server only closes the connection, so
        # the error names what to check (found from outside: it said only "Socket closed").
        (env.security(env.stranger), "signed by a CA the servers trust"),
    ):
        with (
            ClusterClient(addr, security=sec, retry_s=1, timeout_s=2) as c,
            pytest.raises(StromError, match=says),
        ):
            c.metadata()
    # A client that speaks TLS but whose certificate the servers refuse (or that has none)
    # is refused at once, not after its minute of retries: every node completing the
    # handshake and then closing the connection, twice over, is an answer (Kafka's SSL
    # authentication failure is not retried either).
    for sec, says in (
        (env.security(None), "pass --ssl-certfile"),
        (env.security(env.stranger), "signed by a CA the servers trust"),
    ):
        with (
            ClusterClient(addr, security=sec, retry_s=60, timeout_s=10) as c,
            pytest.raises(AuthenticationError, match=says),
        ):
            c.metadata()
    # A plaintext command bounded by --timeout names what it met and the hint (found from
    # outside: the timer's message dropped it; only the minute of retries gave it).
    done = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", "topics", "list", "-b", addr, "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("STROM_SSL_")},
    )
    assert done.returncode == 1, done.stderr
    assert "no result within --timeout 3 s" in done.stderr, done.stderr
    assert "if the cluster requires TLS, pass --ssl-cafile" in done.stderr, done.stderr
    # An expired certificate is refused before dialling, naming the file.
    with pytest.raises(ValueError, match=f"ssl_certfile {env.expired.cert}: .* expired on"):
        env.security(env.expired)
    # The same call with a good certificate works.
    with ClusterClient(addr, security=env.security(env.alice)) as c:
        assert c.metadata().cluster_id


def test_admin_calls_without_a_client_certificate_fail_at_once(env: Env) -> None:
    """The admin path too gives up once every node closed the connection twice over (found
    from outside: `strom topics list` without a client certificate retried for 61 s and ended
    BROKER_NOT_AVAILABLE "Socket closed"; its controller lookups make one pass per call, and
    the rule counted passes within one call)."""
    for who in (None, env.stranger):  # no certificate, one from another CA
        with Admin(env.bootstrap, **env.client(who)) as admin:  # type: ignore[arg-type]
            started = time.monotonic()
            with pytest.raises(AuthenticationError, match="closed the connection after the TLS"):
                admin.list_topics()
            assert time.monotonic() - started < 10
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", "topics", "list", "-b", env.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("STROM_SSL_")},
            "STROM_SSL_CAFILE": str(env.ca.ca_file),
        },
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert (
        "strom topics: error: AUTHENTICATION_FAILED: every strom node at "
        f"{env.bootstrap} closed the connection after the TLS handshake"
    ) in done.stderr, done.stderr
    assert "pass --ssl-certfile and --ssl-keyfile" in done.stderr, done.stderr
    assert elapsed < 20, f"took {elapsed:.1f} s"


def test_undecodable_requests_are_refused_before_the_authorization_rules_read_them(
    env: Env,
) -> None:
    """With ACLs on, a request that does not decode is INVALID_ARGUMENT too (the rules that
    read a request's topics never see it: an undecodable request must not reach them)."""
    assert env.cluster is not None
    for who, address, method in (
        (env.admin, env.bootstrap, "/strom.v1.StorageService/Metadata"),
        (
            env.nobody,
            env.cluster.controllers[0].address,
            "/strom.v1.ControllerService/CreateTopics",
        ),
    ):
        with env.security(who).channel(address) as channel:
            call = channel.unary_unary(method, request_serializer=None)
            with pytest.raises(grpc.RpcError) as info:
                call(b"\x0a\xff\xff\xff\xff\x0f", timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        assert "request could not be decoded as strom.v1." in (info.value.details() or "")


def test_write_needs_write_and_a_deny_beats_an_allow(env: Env) -> None:
    with (
        Producer(env.bootstrap, **env.client(env.bob, max_block_ms=5000)) as bob,  # type: ignore[arg-type]
        pytest.raises(AuthorizationError, match=r"User:CN=bob is not allowed DESCRIBE on topic"),
    ):
        bob.send("orders", b"nope").result(10)  # bob may not even see the topic
    env.acls(allow("User:CN=bob", md.ACL_OPERATION_DESCRIBE, TOPIC, "orders"))
    # An idempotent producer (the default) needs WRITE on some topic for its producer id
    # (Kafka's KIP-679; it needed nothing before): bob has none, and is told so at once, as
    # Kafka does, with CLUSTER_AUTHORIZATION_FAILED (found from outside: a topic refusal).
    with Producer(env.bootstrap, **env.client(env.bob, max_block_ms=5000)) as bob:  # type: ignore[arg-type]
        future = eventually(lambda: bob.send("orders", b"nope"))  # bob sees the topic now
        with pytest.raises(
            ClusterAuthorizationFailedError,
            match=r"User:CN=bob is not allowed WRITE on any topic",
        ):
            future.result(10)
    plain = env.client(env.bob, max_block_ms=5000, enable_idempotence=False)
    with (
        Producer(env.bootstrap, **plain) as bob,  # type: ignore[arg-type]
        pytest.raises(
            AuthorizationError, match=r"User:CN=bob is not allowed WRITE on topic 'orders'"
        ),
    ):
        bob.send("orders", b"nope").result(10)
    env.acls(allow("User:CN=alice", WRITE, TOPIC, "orders"))
    with Producer(env.bootstrap, **env.client(env.alice)) as alice:  # type: ignore[arg-type]
        assert eventually(lambda: alice.send("orders", b"yes")).result(10).offset >= 0
    env.acls(
        allow("User:CN=alice", READ, TOPIC, "orders"),
        allow("User:CN=alice", READ, TOPIC, "orders", deny=True),
    )
    with Consumer(env.bootstrap, **env.client(env.alice, auto_offset_reset="earliest")) as c:  # type: ignore[arg-type]
        c.assign([TopicPartition("orders", 0)])
        with pytest.raises(AuthorizationError, match="READ on topic 'orders'"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                c.poll(timeout_ms=200)


def test_only_the_coordinators_write_the_internal_topics(env: Env) -> None:
    """Found from outside: a Produce to __consumer_offsets needed only WRITE on it, and one
    record there whose key was no group record kept its shard from loading for good. A
    super user is refused (INVALID_TOPIC, as Kafka refuses it); the coordinators' header
    does not let in a client that has WRITE on every topic but not CLUSTER_ACTION."""
    req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
    req.topics.add(topic="__consumer_offsets").partitions.add(
        partition=0, records=encode_batch([b"y"], keys=[b"x"]), current_leader_epoch=-1
    )
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        pr = c.storage(env.bootstrap).Produce(req, timeout=10).topics[0].partitions[0]
    assert pr.error_code == ErrorCode.INVALID_TOPIC
    assert "topic '__consumer_offsets' is internal" in pr.error_message
    env.acls(allow("User:CN=writer", WRITE, TOPIC, "*"))
    internal = ((INTERNAL_TOPICS_METADATA_KEY, "true"),)
    with ClusterClient(env.bootstrap, security=env.security(env.writer)) as c:
        node = c.storage(env.bootstrap)

        def answer() -> str | None:
            """How the node answers; None while it has not applied the WRITE grant yet."""
            try:
                pr = node.Produce(req, timeout=10, metadata=internal).topics[0].partitions[0]
            except grpc.RpcError as exc:
                details = f"{exc.code().name}: {exc.details()}"
                return None if "WRITE on topic" in details else details
            return f"answered {pr.error_code}"

        got = wait_for(answer, timeout=10, what="the WRITE grant applied by the node")
    assert got == ("PERMISSION_DENIED: User:CN=writer is not allowed CLUSTER_ACTION on the cluster")


def _trailer_code(exc: grpc.RpcError) -> int | None:
    """The ErrorCode of a failed call's ``strom-error-bin`` trailer (None: no trailer)."""
    raw = dict(exc.trailing_metadata() or ()).get("strom-error-bin")  # type: ignore[attr-defined]
    return None if raw is None else common_pb2.Error.FromString(raw).code


def test_the_record_api_checks_the_callers_rights(env: Env) -> None:
    """RecordService with ACLs on (found from outside: every ProduceRecords and Subscribe
    failed with UNKNOWN, the super user's too: the rules got the raw request bytes, and
    Subscribe, a handler writing with context.write, was iterated)."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("rec", partitions=1, replication_factor=1)
    produce = records_pb2.ProduceRecordsRequest(
        topic="rec", records=records_pb2.RecordColumns(values=[b"r0", b"r1"])
    )
    subscribe = records_pb2.SubscribeRequest(
        topics=["rec"], start=records_pb2.START_POSITION_EARLIEST
    )

    def first_records(stub: Any) -> list[bytes]:
        for message in stub.Subscribe(subscribe, timeout=10):
            if message.HasField("records"):
                return list(message.records.records.values)
        return []

    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        admin_stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
        assert admin_stub.ProduceRecords(produce, timeout=10).error_code == 0
        assert first_records(admin_stub) == [b"r0", b"r1"]  # the super user
    with ClusterClient(env.bootstrap, security=env.security(env.bob)) as c:
        stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
        with pytest.raises(grpc.RpcError) as denied:
            stub.ProduceRecords(produce, timeout=10)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "User:CN=bob is not allowed WRITE on topic 'rec'" in str(denied.value.details())
        # The strom-error-bin trailer, as RecordService's other refusals (found from outside:
        # docs/grpc-clients.md did not list PERMISSION_DENIED, and it came without one).
        assert _trailer_code(denied.value) == common_pb2.TOPIC_AUTHORIZATION_FAILED
        with pytest.raises(grpc.RpcError) as denied:
            first_records(stub)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "not allowed READ on topic 'rec'" in str(denied.value.details())
        assert _trailer_code(denied.value) == common_pb2.TOPIC_AUTHORIZATION_FAILED
    env.acls(allow("User:CN=bob", READ, TOPIC, "rec"))
    with ClusterClient(env.bootstrap, security=env.security(env.bob)) as c:
        stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))

        def reads() -> list[bytes] | None:
            try:
                return first_records(stub)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                    raise
                return None  # the ACL has not reached the node yet

        assert wait_for(reads, timeout=10, what="READ on rec applied") == [b"r0", b"r1"]


def test_a_group_member_not_allowed_on_its_group_is_told_so(env: Env) -> None:
    """READ on the topic but not on the group: the consumer's poll raises the refusal
    (found from outside: it waited silently for a coordinator "not available yet" and
    `strom consume --group` ended after 30 s with nothing and rc 0)."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("grouped", partitions=1, replication_factor=1)
    env.acls(allow("User:CN=bob", READ, TOPIC, "grouped"))
    with Consumer(
        env.bootstrap,
        **env.client(env.bob, group_id="not-bobs", auto_offset_reset="earliest"),  # type: ignore[arg-type]
    ) as c:
        c.subscribe(["grouped"])
        start = time.monotonic()
        # GROUP_AUTHORIZATION_FAILED, Kafka's GroupAuthorizationException (found from
        # outside: a refusal of a group carried no code, only the status).
        with pytest.raises(GroupAuthorizationFailedError, match="User:CN=bob is not allowed"):
            while time.monotonic() - start < 20:
                c.poll(timeout_ms=200)
        assert time.monotonic() - start < 10


def test_a_prefix_acl_covers_topics_created_later(env: Env) -> None:
    env.acls(
        allow("User:CN=alice", CREATE, TOPIC, "team-a.", prefixed=True),
        allow("User:CN=alice", WRITE, TOPIC, "team-a.", prefixed=True),
    )
    with Admin(env.bootstrap, **env.client(env.alice)) as admin:  # type: ignore[arg-type]
        eventually(lambda: admin.create_topic("team-a.clicks", partitions=1, replication_factor=1))
        with pytest.raises(AuthorizationError, match=r"CREATE on topic 'team-b\.clicks'"):
            admin.create_topic("team-b.clicks", partitions=1, replication_factor=1)
    with Producer(env.bootstrap, **env.client(env.alice)) as p:  # type: ignore[arg-type]
        assert eventually(lambda: p.send("team-a.clicks", b"x")).result(10).offset == 0


def test_an_acl_change_reaches_every_service_within_a_second(env: Env) -> None:
    """Node (Produce), controller (CreateTopics) and coordinator (OffsetCommit): refused,
    then allowed less than a second after the ACL was written, with no restart."""
    sec = env.security(env.bob)
    with ClusterClient(env.bootstrap, security=sec) as c:
        controller = controller_pb2_grpc.ControllerServiceStub(
            c.channel(c.metadata().controller.host + ":" + str(c.metadata().controller.port))
        )
        coord = env.cluster.coordinators[0].address  # type: ignore[union-attr]
        coordinator = coordinator_pb2_grpc.CoordinatorServiceStub(c.channel(coord))
        node = c.storage(env.bootstrap)

        def produce() -> grpc.StatusCode:
            req = storage_pb2.ProduceRequest(acks=1, timeout_ms=1000)
            req.topics.add(topic="orders").partitions.add(partition=0, records=b"")
            return _code(lambda: node.Produce(req, timeout=5))

        def create() -> grpc.StatusCode:
            req = controller_pb2.CreateTopicsRequest(validate_only=True)
            req.topics.add(name="bob-topic", num_partitions=1, replication_factor=1)
            return _code(lambda: controller.CreateTopics(req, timeout=5))

        def commit() -> grpc.StatusCode:
            req = coordinator_pb2.OffsetCommitRequest(group_id="bob-group", member_epoch=-1)
            return _code(lambda: coordinator.OffsetCommit(req, timeout=5))

        checks = (produce, create, commit)
        assert [f() for f in checks] == [grpc.StatusCode.PERMISSION_DENIED] * 3
        written = time.monotonic()
        env.acls(
            allow("User:CN=bob", WRITE, TOPIC, "orders"),
            allow("User:CN=bob", CREATE, TOPIC, "bob-topic"),
            allow("User:CN=bob", READ, GROUP, "bob-group"),
        )
        wait_for(
            lambda: all(f() == grpc.StatusCode.OK for f in checks),
            timeout=1.0,
            what="the new ACLs applied by the node, the controller and the coordinator",
        )
        assert time.monotonic() - written < 1.0 + 1.0  # (CreateAcls itself waits for its view)


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("module", "service"),
    [(controller_pb2, "ControllerService"), (coordinator_pb2, "CoordinatorService")],
)
def test_every_admin_rpc_is_checked(env: Env, module: object, service: str) -> None:
    """A principal with no ACLs: every RPC of the service answers PERMISSION_DENIED, except
    the listing ones, which answer with nothing it may not see."""
    listing = {"ListTopics", "ListGroups", "ListTransactions"}
    desc = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    target = (
        env.cluster.coordinators[0].address  # type: ignore[union-attr]
        if service == "CoordinatorService"
        else env.cluster.controllers[0].address  # type: ignore[union-attr]
    )
    with ClusterClient(env.bootstrap, security=env.security(env.nobody)) as c:
        channel = c.channel(target)
        for method in desc.methods:
            req_cls = _message_class(method.input_type)
            resp_cls = _message_class(method.output_type)
            call = channel.unary_unary(
                f"/{desc.full_name}/{method.name}",
                request_serializer=req_cls.SerializeToString,
                response_deserializer=resp_cls.FromString,
            )
            req = req_cls()
            _fill(req)  # name something everywhere, so the per-name checks apply
            if method.name in listing:
                resp = call(req, timeout=5)
                assert not list(getattr(resp, "topics", [])) and not list(
                    getattr(resp, "groups", [])
                ), method.name
                continue
            assert _code(lambda call=call, req=req: call(req, timeout=5)) == (
                grpc.StatusCode.PERMISSION_DENIED
            ), method.name


def test_describing_every_topic_shows_only_what_the_principal_may_describe(env: Env) -> None:
    """DescribeTopics naming no topic (every topic; `strom topics describe`) is a listing:
    found from outside, it gave a principal with no grants every topic with its configs,
    replicas and ids."""
    with Admin(env.bootstrap, **env.client(env.nobody)) as nobody:  # type: ignore[arg-type]
        assert nobody.describe_topics() == {}
    env.acls(allow("User:CN=viewer", md.ACL_OPERATION_DESCRIBE, TOPIC, "orders"))
    with Admin(env.bootstrap, **env.client(env.viewer)) as viewer:  # type: ignore[arg-type]
        wait_for(
            lambda: list(viewer.describe_topics()) == ["orders"],
            timeout=10,
            what="the viewer's DESCRIBE on orders applied by the controller",
        )
        assert viewer.describe_topics()["orders"].topic_id
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        assert {"orders", "__consumer_offsets"} <= set(admin.describe_topics())


def _fill(msg, depth: int = 0) -> None:  # type: ignore[no-untyped-def]
    """Set every string field to "x", every repeated string to ["x"], and add one element to
    every repeated message (filled the same way), a few levels deep."""
    for f in msg.DESCRIPTOR.fields:
        repeated = f.is_repeated
        if f.type == f.TYPE_STRING:
            if repeated:
                getattr(msg, f.name).append("x")
            else:
                setattr(msg, f.name, "x")
        elif (
            f.type == f.TYPE_MESSAGE
            and repeated
            and depth < 3
            and not f.message_type.GetOptions().map_entry
        ):
            _fill(getattr(msg, f.name).add(), depth + 1)
        elif f.type == f.TYPE_ENUM and not repeated and f.name == "resource_type":
            setattr(msg, f.name, 1)  # a topic


def _message_class(descriptor):  # type: ignore[no-untyped-def]
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def test_a_produce_quota_throttles_instead_of_dropping(env: Env) -> None:
    env.acls(allow("User:CN=alice", WRITE, TOPIC, "orders"))
    env.quota("User:CN=alice", produce_bytes_per_second=20_000)
    from strom.record import encode_batch

    with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
        node = c.storage(env.bootstrap)
        throttled = []
        for _ in range(3):
            req = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
            req.topics.add(topic="orders").partitions.add(
                partition=0, records=encode_batch([b"x" * 1000] * 30), current_leader_epoch=-1
            )
            resp = node.Produce(req, timeout=30)
            assert resp.topics[0].partitions[0].error_code == 0  # appended, not dropped
            throttled.append(resp.throttle_time_ms)
    assert max(throttled) > 0
    env.quota("User:CN=alice")


def test_a_principal_over_its_quota_cannot_fill_the_nodes_produce_budget(env: Env) -> None:
    """Requests waiting out their principal's produce quota hold their bytes; they held
    them against the node's whole in-flight budget, so one principal far over its quota
    with requests in flight made every other principal's produce shed (RESOURCE_EXHAUSTED).
    Such requests now get a quarter of the budget per principal (half in all): the hog's
    extra requests are the ones shed, and another principal's produce goes through."""
    env.acls(
        allow("User:CN=hog", WRITE, TOPIC, "orders"),
        allow("User:CN=writer", WRITE, TOPIC, "*"),
    )
    env.quota("User:CN=hog", produce_bytes_per_second=1_000)
    chunk = INFLIGHT_BUDGET // 5  # 5 of them fill the budget

    def request(tag: bytes) -> storage_pb2.ProduceRequest:
        req = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        req.topics.add(topic="orders").partitions.add(
            partition=0,
            records=encode_batch([tag * 1000] * (chunk // 1000)),
            current_leader_epoch=-1,
        )
        return req

    node_process = env.cluster.nodes[0]  # type: ignore[union-attr]

    def throttled() -> float:
        return member_metric(node_process, "strom_storage_throttled_requests_total", kind="produce")

    with (
        ClusterClient(env.bootstrap, security=env.security(env.hog)) as hog,
        ClusterClient(env.bootstrap, security=env.security(env.writer)) as writer,
    ):
        node = hog.storage(env.bootstrap)
        small = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        small.topics.add(topic="orders").partitions.add(
            partition=0, records=encode_batch([b"s" * 1000] * 2), current_leader_epoch=-1
        )

        def quota_applied() -> bool:
            try:
                return node.Produce(small, timeout=10).throttle_time_ms > 0
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.PERMISSION_DENIED:  # the ACL not there yet
                    raise
                return False

        wait_for(quota_applied, timeout=10, what="the hog's ACL and quota applied")
        before = throttled()
        # Appended, then the hog owes ~400 s: its answer is held (at most 30 s).
        held = [node.Produce.future(request(b"h"), timeout=60)]
        try:
            wait_for(lambda: throttled() > before, timeout=20, what="the big request appended")
            later = [node.Produce.future(request(b"h"), timeout=60) for _ in range(4)]
            held.extend(later)
            # One of them waits (alone it passes: a quarter of the budget is 2.5 chunks);
            # the others are shed at once. On the old code all 4 waited.
            wait_for(
                lambda: sum(f.done() for f in later) == 3,
                timeout=10,
                what="the hog's requests beyond its share to be shed",
            )
            shed = [f.exception() for f in later if f.done()]
            assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in shed), shed
            assert all("User:CN=hog is over its produce quota" in e.details() for e in shed)
            other = writer.storage(env.bootstrap).Produce(request(b"w"), timeout=10)
            assert other.topics[0].partitions[0].error_code == 0
        finally:
            for f in held:
                f.cancel()
            env.quota("User:CN=hog")


def test_the_record_api_charges_the_callers_own_quota(env: Env) -> None:
    """A Subscribe stream's Consumer fetches as the node, so the caller's fetch quota never
    applied to what it read through the record API (and a ProduceRecords' inner Produce was
    charged to whichever caller it happened to run for). The node now charges the caller
    where its call arrives and holds its next message while it is over."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("rec-quota", partitions=1, replication_factor=1)
    env.acls(
        allow("User:CN=alice", WRITE, TOPIC, "rec-quota"),
        allow("User:CN=alice", READ, TOPIC, "rec-quota"),
    )
    env.quota("User:CN=alice", produce_bytes_per_second=20_000, fetch_bytes_per_second=20_000)
    node = env.cluster.nodes[0]  # type: ignore[union-attr]

    def throttled(kind: str) -> float:
        return member_metric(node, "strom_storage_throttled_requests_total", kind=kind)

    produced_before, fetched_before = throttled("produce"), throttled("fetch")
    values = [b"v" * 1000] * 30
    try:
        with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            for _ in range(3):  # 90 KB against 20 KB/s with one second of burst
                resp = stub.ProduceRecords(
                    records_pb2.ProduceRecordsRequest(
                        topic="rec-quota", records=records_pb2.RecordColumns(values=values)
                    ),
                    timeout=30,
                )
                assert resp.error_code == 0  # appended, not dropped
            assert throttled("produce") > produced_before
            got = 0
            subscribe = records_pb2.SubscribeRequest(
                topics=["rec-quota"],
                start=records_pb2.START_POSITION_EARLIEST,
                max_records_per_message=30,
            )
            for message in stub.Subscribe(subscribe, timeout=60):
                if message.HasField("records"):
                    got += len(message.records.records.values)
                if got >= 90:
                    break
        assert got >= 90  # everything read, only later
        assert throttled("fetch") > fetched_before
    finally:
        env.quota("User:CN=alice")


def test_a_fetch_reads_at_most_its_quota_window(env: Env) -> None:
    """Found from outside: nothing bounded a throttled principal's fetch, and an answer is
    held at most 30 s, so Fetch(max_bytes=50 MiB) at 10,000 B/s moved a 1.9 MB partition
    per 30 s (6.4x the quota). A principal with a fetch quota now reads at most
    FETCH_WINDOW_S of its rate per fetch (as Kafka does), whatever max_bytes asks."""
    from strom.security.quotas import FETCH_WINDOW_S

    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("fetch-quota", partitions=1, replication_factor=1)
    env.acls(allow("User:CN=alice", READ, TOPIC, "fetch-quota"))
    rate = 10_000
    limit = int(rate * FETCH_WINDOW_S)
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        node = c.storage(env.bootstrap)
        req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
        req.topics.add(topic="fetch-quota").partitions.add(
            partition=0, records=encode_batch([b"f" * 1000] * 50), current_leader_epoch=-1
        )
        for _ in range(6):  # 6 x 50 KB, three times the bound (the new topic's leader may
            # not have opened its replica yet: retried until it takes the batch)
            wait_for(
                lambda: node.Produce(req, timeout=30).topics[0].partitions[0].error_code == 0,
                timeout=30,
                what="the batch appended",
            )
    env.quota("User:CN=alice", fetch_bytes_per_second=rate)
    try:
        with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
            node = c.storage(env.bootstrap)
            req = storage_pb2.FetchRequest(replica_id=-1, max_bytes=50 << 20, max_wait_ms=0)
            req.topics.add(topic="fetch-quota").partitions.add(
                partition=0, fetch_offset=0, partition_max_bytes=50 << 20, current_leader_epoch=-1
            )

            def fetched() -> storage_pb2.FetchResponse | None:
                resp = node.Fetch(req, timeout=60)
                return resp if resp.throttle_time_ms else None  # the quota has reached it

            resp = wait_for(fetched, timeout=30, what="a throttled fetch answer")
        records = resp.topics[0].partitions[0].records
        assert 0 < len(records) <= limit, len(records)  # not the 300 KB asked for
    finally:
        env.quota("User:CN=alice")


def test_a_replica_claim_needs_cluster_action_and_an_unset_replica_id_is_a_consumer(
    env: Env,
) -> None:
    """Found from outside: replica_id >= 0 alone made a request a replica's. A principal
    with DESCRIBE saw a partition's log end by naming a node id in ListOffsets; a consumer
    in another language that left replica_id unset (0) was refused Fetch for want of
    CLUSTER_ACTION. A replica's claim (a Fetch naming a node and its incarnation, a
    ListOffsets naming a node) now needs CLUSTER_ACTION, as Kafka's follower fetch does,
    so it never reaches the follower path or its exemption from the fetch quota; an unset
    replica_id is a consumer's request: READ suffices and the fetch quota applies."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("claims", partitions=1, replication_factor=1)
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        node = c.storage(env.bootstrap)
        req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
        req.topics.add(topic="claims").partitions.add(
            partition=0, records=encode_batch([b"c" * 1000] * 50), current_leader_epoch=-1
        )
        for _ in range(4):  # 4 x 50 KB (retried until the new replica takes the batch)
            wait_for(
                lambda: node.Produce(req, timeout=30).topics[0].partitions[0].error_code == 0,
                timeout=30,
                what="the batch appended",
            )
    env.acls(
        allow("User:CN=alice", READ, TOPIC, "claims"),
        allow("User:CN=alice", md.ACL_OPERATION_DESCRIBE, TOPIC, "claims"),
    )
    rate = 10_000
    env.quota("User:CN=alice", fetch_bytes_per_second=rate)
    fetch = storage_pb2.FetchRequest(max_bytes=50 << 20, max_wait_ms=0)  # replica_id unset
    fetch.topics.add(topic="claims").partitions.add(
        partition=0, fetch_offset=0, partition_max_bytes=50 << 20, current_leader_epoch=-1
    )
    claim = storage_pb2.FetchRequest()
    claim.CopyFrom(fetch)
    claim.replica_id, claim.replica_incarnation = 1, "a-forged-incarnation"
    offsets = storage_pb2.ListOffsetsRequest(replica_id=1)
    offsets.topics.add(topic="claims").partitions.add(
        partition=0, current_leader_epoch=-1, timestamp=-1
    )
    try:
        with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
            node = c.storage(env.bootstrap)

            def throttled_fetch() -> storage_pb2.FetchResponse | None:
                """A consumer's answer, once the grants and the quota have reached the
                node (None until then)."""
                try:
                    resp = node.Fetch(fetch, timeout=60)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                        return None  # the READ grant has not reached the node yet
                    raise
                return resp if resp.throttle_time_ms else None

            resp = wait_for(throttled_fetch, timeout=30, what="a throttled consumer fetch")
            pr = resp.topics[0].partitions[0]
            assert pr.error_code == 0 and 0 < len(pr.records) <= rate * 10  # the quota window
            # Claiming to be node 1's follower (or asking node 1's view of the log end)
            # without CLUSTER_ACTION: refused before anything is read or exempted.
            for call, request in ((node.Fetch, claim), (node.ListOffsets, offsets)):
                with pytest.raises(grpc.RpcError) as err:
                    call(request, timeout=60)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert err.value.details() == (
                    "User:CN=alice is not allowed CLUSTER_ACTION on the cluster"
                )
            offsets.replica_id = -1  # a client's view: DESCRIBE suffices
            answer = node.ListOffsets(offsets, timeout=60).topics[0].partitions[0]
            assert answer.error_code == 0 and answer.offset == 200
    finally:
        env.quota("User:CN=alice")


def test_the_request_quota_counts_metadata_list_offsets_and_init_producer_id(env: Env) -> None:
    """Found from outside: `--requests-per-second` counted only Produce and Fetch, so 20
    InitProducerId calls (each may use up producer ids) went through in 0.5 s at 2/s. Every
    request a client makes to a node is counted now: over the rate, it waits."""
    env.acls(allow("User:CN=alice", WRITE, TOPIC, "orders"))  # (InitProducerId needs it)
    env.quota("User:CN=alice", requests_per_second=2)
    node_process = env.cluster.nodes[0]  # type: ignore[union-attr]

    def throttled() -> float:
        return member_metric(
            node_process, "strom_storage_throttled_requests_total", kind="requests"
        )

    before = throttled()
    try:
        with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
            node = c.storage(env.bootstrap)
            offsets = storage_pb2.ListOffsetsRequest(replica_id=-1)
            offsets.topics.add(topic="orders").partitions.add(
                partition=0, current_leader_epoch=-1, timestamp=-1
            )

            def held() -> bool:  # the quota has reached the node: alice's calls are held
                node.Metadata(storage_pb2.MetadataRequest(topics=["orders"]), timeout=60)
                node.ListOffsets(offsets, timeout=60)
                return throttled() > before

            wait_for(held, timeout=30, what="Metadata and ListOffsets held by the quota")
            start = time.monotonic()
            for _ in range(8):
                resp = node.InitProducerId(storage_pb2.InitProducerIdRequest(), timeout=60)
                assert resp.error_code == 0, resp
            assert time.monotonic() - start >= 3.0  # 8 calls at 2/s, with what it owed
    finally:
        env.quota("User:CN=alice")


def test_the_documented_node_tls_example_connects_with_a_client_certificate(env: Env) -> None:
    """docs/grpc-clients.md, "TLS and mTLS" (tests/node/tls_example.js): @grpc/grpc-js with
    createSsl(ca, key, cert) produces as the certificate's principal; without a client
    certificate the refused handshake is UNAVAILABLE "No connection established", as the
    docs warn (the same as a node that is down)."""
    from tests.integration.node_client import NODE_DIR, node_binary

    env.acls(allow("User:CN=alice", WRITE, TOPIC, "orders"))
    protos = Path(__file__).resolve().parents[2] / "protos"
    address = env.cluster.nodes[0].address  # type: ignore[union-attr]

    def run(*files: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [node_binary(), "tls_example.js", address, str(protos), "orders", *map(str, files)],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = run(env.ca.ca_file, env.alice.cert, env.alice.key)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("produced to orders 0@"), done.stdout
    refused = run(env.ca.ca_file)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "UNAVAILABLE: No connection established" in refused.stderr, refused.stderr


def test_quotas_are_set_listed_and_removed_from_the_cli(env: Env) -> None:
    """`strom quotas remove` (the README named it; it did not exist: found from outside);
    `set` changes only the rates it is given, 0 removing one, and refuses to run with none."""
    tls = [
        *("--ssl-cafile", str(env.ca.ca_file)),
        *("--ssl-certfile", str(env.admin.cert), "--ssl-keyfile", str(env.admin.key)),
        *("-b", env.bootstrap),
    ]

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "strom.cli.main", "quotas", *args, *tls],
            capture_output=True,
            timeout=60,
        )

    def cli(*args: str) -> str:
        done = run(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout.decode()

    def zed() -> dict[str, float]:
        rows = [q for q in json.loads(cli("list", "--json")) if q["principal"] == "User:CN=zed"]
        return {k: v for k, v in (rows[0] if rows else {}).items() if k != "principal" and v}

    cli("set", "User:CN=zed", "--produce-bytes-per-second", "5000")
    assert "User:CN=zed" in cli("list")
    # Found from outside: a set replaced the whole quota (the produce rate was dropped) ...
    cli("set", "User:CN=zed", "--fetch-bytes-per-second", "200")
    assert zed() == {"produce_bytes_per_second": 5000, "fetch_bytes_per_second": 200}
    # ... and a set without rates said "set" and deleted it: now refused, in one line.
    refused = run("set", "User:CN=zed")
    assert refused.returncode == 2
    assert len(refused.stderr.decode().strip().splitlines()) == 1, refused.stderr
    assert "at least one of" in refused.stderr.decode()
    assert zed() == {"produce_bytes_per_second": 5000, "fetch_bytes_per_second": 200}
    assert "quota of User:CN=zed set" in cli(
        "set", "User:CN=zed", "--produce-bytes-per-second", "0"
    )
    assert zed() == {"fetch_bytes_per_second": 200}  # 0 removed the produce rate only
    assert "quota of User:CN=zed removed" in cli(
        "set", "User:CN=zed", "--fetch-bytes-per-second", "0"
    )
    assert zed() == {}
    cli("set", "User:CN=zed", "--requests-per-second", "7")
    assert "quota of User:CN=zed removed" in cli("remove", "User:CN=zed")
    assert "User:CN=zed" not in cli("list")


def test_quota_principals_are_kept_as_the_services_derive_certificate_principals(
    env: Env,
) -> None:
    """Found from outside: `strom quotas set 'User:CN=hank, O=x'` stored the principal as
    typed (the ACL commands normalise it), so the quota never applied to the certificate's
    `User:CN=hank,O=x`. The CLI and the controller (whoever calls it) now store it as the
    services derive it, and `list`/`remove` typed with the space find it."""
    tls = [
        *("--ssl-cafile", str(env.ca.ca_file)),
        *("--ssl-certfile", str(env.admin.cert), "--ssl-keyfile", str(env.admin.key)),
        *("-b", env.bootstrap),
    ]
    spaced, derived = "User:CN=hank, O=x", "User:CN=hank,O=x"

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "strom.cli.main", "quotas", *args, *tls],
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.decode()

    def stored() -> dict[str, dict[str, float]]:
        rows = json.loads(cli("list", "--json"))
        return {q["principal"]: q for q in rows if "hank" in q["principal"]}

    assert f"quota of {derived} set" in cli("set", spaced, "--produce-bytes-per-second", "1000")
    assert list(stored()) == [derived]
    # set keeps the other rates of the entry it finds by the spaced form
    cli("set", spaced, "--fetch-bytes-per-second", "2000")
    assert stored()[derived]["produce_bytes_per_second"] == 1000
    assert stored()[derived]["fetch_bytes_per_second"] == 2000
    assert f"quota of {derived} removed" in cli("remove", spaced)
    assert stored() == {}
    # A raw AlterClientQuotas (any client, not the CLI) is stored the same way.
    env.quota(spaced, produce_bytes_per_second=1000)
    assert list(stored()) == [derived]
    env.quota(spaced)
    assert stored() == {}


def test_acls_remove_refuses_an_empty_resource_name_and_removes_nothing(env: Env) -> None:
    """`strom acls remove --principal P --topic ''` took the empty name for "no resource" and
    removed every entry of P, on groups too; `add --topic ''` died with a traceback (found
    from outside). An empty name is now refused before anything is sent."""
    tls = [
        *("--ssl-cafile", str(env.ca.ca_file)),
        *("--ssl-certfile", str(env.admin.cert), "--ssl-keyfile", str(env.admin.key)),
        *("-b", env.bootstrap),
    ]

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "strom.cli.main", "acls", *args, *tls],
            capture_output=True,
            timeout=60,
        )

    who = "User:CN=empty-names"
    for resource in (["--topic", "t-empty"], ["--group", "g-empty"]):
        added = cli("add", "--allow", who, "--operation", "write", *resource)
        assert added.returncode == 0, added.stderr
    for refused in (
        ["remove", "--principal", who, "--topic", ""],
        ["remove", "--operation", "write", "--group-prefix", ""],
        ["add", "--allow", who, "--operation", "read", "--topic", ""],
        ["remove", "--principal", "", "--topic", "t-empty"],
    ):
        done = cli(*refused)
        assert done.returncode == 2, (refused, done.stdout, done.stderr)
        assert b"must not be empty" in done.stderr and b"Traceback" not in done.stderr
    listed = json.loads(cli("list", "--principal", who, "--json").stdout)
    assert sorted(a["resource_name"] for a in listed) == ["g-empty", "t-empty"]
    assert cli("remove", "--principal", who).returncode == 0


def test_raw_acl_calls_keep_and_match_certificate_principals_as_the_services_derive_them(
    env: Env,
) -> None:
    """Found from outside: the CLI wrote "User:CN=a, O=b" as the services derive it from a
    certificate ("User:CN=a,O=b"), but a raw gRPC CreateAcls kept it as typed, and the entry
    never matched the certificate it meant. The controller canonicalises bindings and
    filters, whoever calls."""
    spaced, derived = "User:CN=raw, O=Strom", "User:CN=raw,O=Strom"
    env.acls(allow(spaced, READ, TOPIC, "raw-acls"))
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:

        def described(principal: str) -> list[str]:
            resp = c.controller_call(
                "DescribeAcls",
                controller_pb2.DescribeAclsRequest(
                    filter=controller_pb2.AclBindingFilter(principal=principal)
                ),
            )
            return [a.principal for a in resp.acls]

        assert described(derived) == [derived]
        assert described(spaced) == [derived]  # a filter typed with spaces finds it too
        resp = c.controller_call(
            "DeleteAcls",
            controller_pb2.DeleteAclsRequest(
                filters=[controller_pb2.AclBindingFilter(principal=spaced)]
            ),
        )
        assert [a.principal for a in resp.deleted] == [derived]
        assert described(derived) == []


def test_a_refused_request_ends_a_stream_after_the_answers_before_it(env: Env) -> None:
    """On ProduceStream each request is authorized: the first one refused ends the stream
    with PERMISSION_DENIED once the requests before it are answered, and the node applies
    nothing sent after it (storage.proto)."""
    from strom.record import encode_batch

    env.acls(allow("User:CN=alice", WRITE, TOPIC, "orders"))
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("secret", partitions=1, replication_factor=1)

    def request(topic: str, value: bytes) -> storage_pb2.ProduceRequest:
        req = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        req.topics.add(topic=topic).partitions.add(
            partition=0, records=encode_batch([value]), current_leader_epoch=-1
        )
        return req

    tp = TopicPartition("orders", 0)
    with Consumer(env.bootstrap, **env.client(env.admin)) as c:  # type: ignore[arg-type]
        end_before = c.end_offsets([tp])[tp]
    with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
        stream = c.storage(env.bootstrap).ProduceStream(
            iter(
                [
                    request("orders", b"allowed"),
                    request("secret", b"x"),
                    request("orders", b"after"),
                ]
            ),
            timeout=30,
        )
        first = next(stream)
        assert first.topics[0].partitions[0].error_code == 0
        assert first.topics[0].partitions[0].base_offset == end_before
        with pytest.raises(grpc.RpcError) as refused:
            next(stream)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "User:CN=alice is not allowed WRITE on topic 'secret'" in (refused.value.details() or "")
    with Consumer(env.bootstrap, **env.client(env.admin)) as c:  # type: ignore[arg-type]
        assert c.end_offsets([tp])[tp] == end_before + 1  # "after" was not appended


def test_a_followed_fetch_ends_when_its_read_acl_is_removed(env: Env) -> None:
    """A followed Fetch (storage.proto, FetchRequest.follow) is answered without new
    requests, so the node authorizes each of its continuations as it would a request: once
    the READ ACL is gone, the stream ends with PERMISSION_DENIED."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("followed", partitions=1, replication_factor=1)
    env.acls(allow("User:CN=alice", READ, TOPIC, "followed"))
    req = storage_pb2.FetchRequest(replica_id=-1, max_wait_ms=100, min_bytes=1, follow=True)
    req.topics.add(topic="followed").partitions.add(
        partition=0, fetch_offset=0, current_leader_epoch=-1, partition_max_bytes=1 << 20
    )
    once = storage_pb2.FetchRequest()
    once.CopyFrom(req)
    once.follow = False
    with ClusterClient(env.bootstrap, security=env.security(env.alice)) as c:
        node = c.storage(env.bootstrap)
        wait_for(
            lambda: _code(lambda: node.Fetch(once, timeout=5)) == grpc.StatusCode.OK,
            timeout=5,
            what="alice's READ applied by the node",
        )
        answers = node.FetchStream(iter([req]), timeout=30)
        assert next(answers).topics[0].partitions[0].error_code == 0
        assert next(answers).topics[0].partitions[0].error_code == 0  # a continuation
        with ClusterClient(env.bootstrap, security=env.security(env.admin)) as admin_client:
            admin_client.controller_call(
                "DeleteAcls",
                controller_pb2.DeleteAclsRequest(
                    filters=[
                        controller_pb2.AclBindingFilter(
                            principal="User:CN=alice", resource_name="followed"
                        )
                    ]
                ),
            )
        deadline = time.monotonic() + 10  # (the node applies an ACL change within 1 s)
        with pytest.raises(grpc.RpcError) as refused:
            while time.monotonic() < deadline:
                assert next(answers).topics[0].partitions[0].error_code == 0
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "User:CN=alice is not allowed READ on topic 'followed'" in (
        refused.value.details() or ""
    )


def test_a_record_api_subscription_ends_when_its_read_acl_is_removed(env: Env) -> None:
    """A Subscribe stream's Consumer reads as the node, so the stream was authorized only
    when it opened (found from outside: records kept coming after the READ ACL was
    removed). It checks its caller's rights again as it delivers: a revoke ends it with
    PERMISSION_DENIED, as it ends a followed Fetch."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("subscribed", partitions=1, replication_factor=1)
    env.acls(allow("User:CN=alice", READ, TOPIC, "subscribed"))
    subscribe = records_pb2.SubscribeRequest(
        topics=["subscribed"], start=records_pb2.START_POSITION_EARLIEST
    )
    with (
        Producer(env.bootstrap, linger_ms=0, **env.client(env.admin)) as producer,  # type: ignore[arg-type]
        ClusterClient(env.bootstrap, security=env.security(env.alice)) as c,
    ):
        stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))

        def records(stream: Any) -> list[bytes]:
            """The values of the stream's next records message."""
            for message in stream:
                if message.HasField("records"):
                    return list(message.records.records.values)
            return []

        producer.send("subscribed", b"before").result(10)

        def opened() -> Any:
            stream = stub.Subscribe(subscribe, timeout=60)
            try:
                assert records(stream) == [b"before"]
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                    raise
                return None  # the READ ACL has not reached the node yet
            return stream

        stream = wait_for(opened, timeout=10, what="alice's READ applied by the node")
        with ClusterClient(env.bootstrap, security=env.security(env.admin)) as admin_client:
            admin_client.controller_call(
                "DeleteAcls",
                controller_pb2.DeleteAclsRequest(
                    filters=[
                        controller_pb2.AclBindingFilter(
                            principal="User:CN=alice", resource_name="subscribed"
                        )
                    ]
                ),
            )
        deadline = time.monotonic() + 10  # (the node applies an ACL change within 1 s)
        with pytest.raises(grpc.RpcError) as refused:
            while time.monotonic() < deadline:
                producer.send("subscribed", b"after").result(10)
                assert records(stream) == [b"after"]
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "User:CN=alice is not allowed READ on topic 'subscribed'" in (
        refused.value.details() or ""
    )


def test_a_pattern_subscription_gets_only_topics_the_member_may_describe(env: Env) -> None:
    """Found from outside: a member subscribed by regex was assigned a topic its principal
    may not describe, and its consumer failed (LeaderNotAvailableError) instead of reading
    the topic it may. The coordinator resolves the regex to what the member may describe;
    a topic named in the subscription needs DESCRIBE, as in Kafka."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("pat-orders", partitions=1, replication_factor=1)
        admin.create_topic("pat-secret", partitions=1, replication_factor=1)
    env.acls(
        allow("User:CN=patterned", READ, TOPIC, "pat-orders"),
        allow("User:CN=patterned", READ, GROUP, "pat-", prefixed=True),
    )
    with Producer(env.bootstrap, **env.client(env.admin)) as p:  # type: ignore[arg-type]
        p.send("pat-orders", b"o").result(10)
        p.send("pat-secret", b"s").result(10)
    with Consumer(
        env.bootstrap,
        **env.client(env.patterned, group_id="pat-g", auto_offset_reset="earliest"),  # type: ignore[arg-type]
    ) as c:
        c.subscribe(pattern="pat-.*")
        got: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while not got:
            assert time.monotonic() < deadline, "nothing read from pat-orders"
            got.extend(r.value for r in eventually(lambda: c.poll(timeout_ms=200)))
        assert got == [b"o"]
        assert c.assignment() == {TopicPartition("pat-orders", 0)}
    with (
        Consumer(
            env.bootstrap,
            **env.client(env.patterned, group_id="pat-named", auto_offset_reset="earliest"),  # type: ignore[arg-type]
        ) as c,
        pytest.raises(AuthorizationError, match="DESCRIBE on topic 'pat-secret'"),
    ):
        c.subscribe(["pat-orders", "pat-secret"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            c.poll(timeout_ms=200)


def test_a_consumer_that_is_no_super_user_follows_past_its_first_grants(env: Env) -> None:
    """A consumer's followed fetch is granted more answers as it takes them (storage.proto,
    FetchRequest.follow_answers); a grant reads nothing and needs no permission, so a
    principal with READ on the topic only polls on, one record per answer, well past the
    first window of answers."""
    assert env.cluster is not None
    node = env.cluster.nodes[0]

    def followed() -> float:
        return member_metric(node, "strom_storage_fetch_followed_total")

    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("followed-on", partitions=1, replication_factor=1)
    env.acls(allow("User:CN=alice", READ, TOPIC, "followed-on"))
    tp = TopicPartition("followed-on", 0)
    before = followed()
    with (
        Producer(env.bootstrap, linger_ms=0, **env.client(env.admin)) as producer,  # type: ignore[arg-type]
        Consumer(env.bootstrap, auto_offset_reset="earliest", **env.client(env.alice)) as c,  # type: ignore[arg-type]
    ):
        c.assign([tp])
        eventually(lambda: c.poll(timeout_ms=100))  # (the ACL may still be on its way)
        fetcher = c._fetcher
        starts: list[object] = []
        real_start = fetcher._start_follow

        def start(*args: Any) -> Any:
            starts.append(args)
            return real_start(*args)

        fetcher._start_follow = start  # type: ignore[method-assign]
        for i in range(24):
            producer.send("followed-on", f"f{i}".encode(), partition=0).result(10)
            got: list[bytes | None] = []
            deadline = time.monotonic() + 20
            while not got:  # every poll's error is raised here, none is retried away
                assert time.monotonic() < deadline, f"record {i} never came"
                got.extend(r.value for r in c.poll(timeout_ms=200))
            assert got == [f"f{i}".encode()]
    assert followed() >= before + 16  # past two windows of 8 answers: grants went through
    # ... on one stream: a refused grant ends the stream after the window, and the consumer
    # then has to start its follow again.
    assert len(starts) <= 1


def test_a_group_or_transaction_shows_only_topics_the_principal_may_describe(env: Env) -> None:
    """Found from outside: a principal with only DESCRIBE on group `shared` saw, in `strom
    groups describe shared`, the name, committed offset and log end of `hr-salaries`, which
    it may not describe; OffsetFetch and DescribeTransactions told the same, and DELETE on
    the group alone deleted that topic's offset. Now those topics are left out (OffsetFetch
    naming one answers TOPIC_AUTHORIZATION_FAILED) and DeleteOffsets needs READ on it."""
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic("hr-salaries", partitions=1, replication_factor=1)
    with Producer(
        env.bootstrap,
        **env.client(env.admin, transactional_id="tx-a"),  # type: ignore[arg-type]
    ) as p:
        p.init_transactions(10)
        p.begin_transaction()
        p.send("hr-salaries", b"open").result(10)  # left open: DescribeTransactions names it
        coordinator = env.cluster.coordinators[0].address  # type: ignore[union-attr]
        commit = coordinator_pb2.OffsetCommitRequest(group_id="shared", member_epoch=-1)
        for topic, offset in (("hr-salaries", 2), ("orders", 0)):
            commit.topics.add(topic=topic).partitions.add(
                partition=0, committed_offset=offset, committed_leader_epoch=-1
            )
        with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(c.channel(coordinator))
            assert stub.OffsetCommit(commit, timeout=10).error_code == ErrorCode.NONE
        who = env.ca.issue("group-viewer")
        principal = "User:CN=group-viewer"
        DESCRIBE, TXN = md.ACL_OPERATION_DESCRIBE, md.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID
        env.acls(
            allow(principal, DESCRIBE, GROUP, "shared"),
            allow(principal, md.ACL_OPERATION_DELETE, GROUP, "shared"),
            allow(principal, DESCRIBE, TOPIC, "orders"),
            allow(principal, DESCRIBE, TXN, "tx-a"),
        )
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(c.channel(coordinator))

            def granted(call):  # type: ignore[no-untyped-def]
                """``call()`` once the coordinator has applied the grants; None before."""
                try:
                    return call()
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                        raise
                    return None

            every = wait_for(
                lambda: granted(
                    lambda: stub.OffsetFetch(
                        coordinator_pb2.OffsetFetchRequest(group_id="shared", member_epoch=-1),
                        timeout=10,
                    )
                ),
                timeout=10,
                what="the grants applied by the coordinator",
            )
            assert [t.topic for t in every.topics] == ["orders"]
            named = coordinator_pb2.OffsetFetchRequest(group_id="shared", member_epoch=-1)
            named.topics.add(topic="hr-salaries")
            pr = stub.OffsetFetch(named, timeout=10).topics[0].partitions[0]
            assert pr.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            assert pr.committed_offset == -1
            d = stub.DescribeGroups(
                coordinator_pb2.DescribeGroupsRequest(group_ids=["shared"], include_offsets=True),
                timeout=10,
            )
            assert "hr-salaries" not in str(d) and [o.topic for o in d.groups[0].offsets] == [
                "orders"
            ]
            txns = stub.DescribeTransactions(
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=["tx-a"]),
                timeout=10,
            )
            assert txns.transactions[0].error_code == ErrorCode.NONE
            assert not txns.transactions[0].topics
            delete = coordinator_pb2.DeleteOffsetsRequest(group_id="shared")
            delete.topics.add(topic="hr-salaries", partitions=[0])
            assert _code(lambda: stub.DeleteOffsets(delete, timeout=10)) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
        # A consumer asking for it is told why, not given "nothing committed".
        with (
            Consumer(env.bootstrap, **env.client(who, group_id="shared")) as consumer,  # type: ignore[arg-type]
            pytest.raises(TopicAuthorizationFailedError, match="DESCRIBE on topic 'hr-salaries'"),
        ):
            consumer.committed(TopicPartition("hr-salaries", 0))
        p.abort_transaction(10)
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:  # still there
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(c.channel(coordinator))
        named.topics[0].partitions.append(0)
        assert stub.OffsetFetch(named, timeout=10).topics[0].partitions[0].committed_offset == 2
    # The CLI, with the principal's rights: what it may see, nothing of the rest.
    done = subprocess.run(
        [
            *(sys.executable, "-m", "strom.cli.main", "groups", "describe", "shared"),
            *("--ssl-cafile", str(env.ca.ca_file), "-b", env.bootstrap),
            *("--ssl-certfile", str(who.cert), "--ssl-keyfile", str(who.key)),
        ],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "orders" in out and "hr-salaries" not in out, out


def test_only_the_services_create_internal_topics_and_stray_ones_can_be_deleted(env: Env) -> None:
    """Found from outside: a principal with only CREATE on every topic sent CreateTopics of
    `__junk2` with the coordinators' header and got a topic no client could write and even
    the admin could not delete ("internal and cannot be deleted"). Creating a `__` topic now
    needs CLUSTER_ACTION, as writing one does; one made anyway (by a super user here) can be
    deleted; the coordinators' own topics still cannot."""
    env.acls(allow("User:CN=carol", CREATE, TOPIC, "*"))
    carol = env.ca.issue("carol")
    internal = ((INTERNAL_TOPICS_METADATA_KEY, "true"),)
    controller = env.cluster.controllers[0].address  # type: ignore[union-attr]
    req = controller_pb2.CreateTopicsRequest()
    req.topics.add(name="__junk2", num_partitions=1, replication_factor=1)
    with ClusterClient(env.bootstrap, security=env.security(carol)) as c:
        stub = controller_pb2_grpc.ControllerServiceStub(c.channel(controller))

        def answer() -> str | None:
            """How the controller answers; None while it has not applied the CREATE grant."""
            try:
                resp = stub.CreateTopics(req, timeout=10, metadata=internal)
            except grpc.RpcError as exc:
                details = f"{exc.code().name}: {exc.details()}"
                return None if "CREATE on topic" in details else details
            return f"answered {ErrorCode.Name(resp.topics[0].error_code)}"

        got = wait_for(answer, timeout=10, what="the CREATE grant applied by the controller")
    assert got == "PERMISSION_DENIED: User:CN=carol is not allowed CLUSTER_ACTION on the cluster"
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        stub = controller_pb2_grpc.ControllerServiceStub(c.channel(controller))
        made = stub.CreateTopics(req, timeout=10, metadata=internal)
        assert made.topics[0].error_code == ErrorCode.NONE, made
        deleted = stub.DeleteTopics(
            controller_pb2.DeleteTopicsRequest(topics=["__junk2", "__consumer_offsets"]),
            timeout=30,
        )
    assert [(t.name, ErrorCode.Name(t.error_code)) for t in deleted.topics] == [
        ("__junk2", "NONE"),
        ("__consumer_offsets", "POLICY_VIOLATION"),
    ]


def test_listing_groups_and_transactions_needs_describe_only_on_them(env: Env) -> None:
    """Found from outside: `strom groups list` and `strom transactions list` refused every
    principal without DESCRIBE on the cluster (they asked DescribeCluster where the
    coordinators are), though ListGroups and ListTransactions answer with what the caller
    may describe, as the docs' table says. They find the coordinators with FindCoordinator
    now, and list only what the principal may see."""
    coordinator = env.cluster.coordinators[0].address  # type: ignore[union-attr]
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(c.channel(coordinator))
        for group in ("listed-g", "hidden-g"):
            commit = coordinator_pb2.OffsetCommitRequest(group_id=group, member_epoch=-1)
            commit.topics.add(topic="orders").partitions.add(
                partition=0, committed_offset=0, committed_leader_epoch=-1
            )
            assert stub.OffsetCommit(commit, timeout=10).error_code == ErrorCode.NONE
    for tid in ("listed-tx", "hidden-tx"):
        with Producer(env.bootstrap, **env.client(env.admin, transactional_id=tid)) as p:  # type: ignore[arg-type]
            p.init_transactions(10)
    who = env.ca.issue("lister")
    principal = "User:CN=lister"
    env.acls(
        allow(principal, md.ACL_OPERATION_DESCRIBE, GROUP, "listed-g"),
        allow(
            principal, md.ACL_OPERATION_DESCRIBE, md.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID, "listed-tx"
        ),
    )
    with ClusterClient(env.bootstrap, security=env.security(who)) as c:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(c.channel(coordinator))
        wait_for(
            lambda: (
                [
                    g.group_id
                    for g in stub.ListGroups(coordinator_pb2.ListGroupsRequest(), timeout=10).groups
                ]
                == ["listed-g"]
            ),
            timeout=10,
            what="the lister's grants applied by the coordinator",
        )

    def cli(*args: str) -> str:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "strom.cli.main", *args),
                *("--ssl-cafile", str(env.ca.ca_file), "-b", env.bootstrap),
                *("--ssl-certfile", str(who.cert), "--ssl-keyfile", str(who.key)),
            ],
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout.decode()

    assert [g["group"] for g in json.loads(cli("groups", "list", "--json"))] == ["listed-g"]
    listed = json.loads(cli("transactions", "list", "--json"))
    assert [t["transactional_id"] for t in listed] == ["listed-tx"]


def test_a_transactional_id_the_principal_may_not_use_is_refused_at_once(env: Env) -> None:
    """A transactional producer whose principal has no rights on its transactional id is told
    so by init_transactions(), as Kafka's TransactionalIdAuthorizationException, instead of
    being refused FindCoordinator (PERMISSION_DENIED) node after node and retrying until its
    timeout ran out with RequestTimedOutError (the transactions' own coordinator lookup took
    the refusal for a node that did not answer)."""
    with (
        Producer(
            env.bootstrap,
            **env.client(env.bob, transactional_id="tx-not-bobs"),  # type: ignore[arg-type]
        ) as p,
        pytest.raises(TransactionalIdAuthorizationFailedError, match="tx-not-bobs"),
    ):
        p.init_transactions(120)
