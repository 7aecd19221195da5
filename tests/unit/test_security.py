"""The security engines alone (issue 16): ACL decisions (Kafka's rules), the RPC rule table
covering every method of every service, client quotas as token buckets, token files."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from strom.api import (
    controller_pb2,
    coordinator_pb2,
    records_pb2,
    storage_pb2,
)
from strom.api import metadata_pb2 as md
from strom.errors import ErrorCode
from strom.security.acl import (
    CLUSTER,
    SOME,
    Acl,
    Authorizer,
    Op,
    Res,
    matches_filter,
    validate,
)
from strom.security.config import ServerSecurity
from strom.security.interceptor import AuthInterceptor
from strom.security.principal import TOKEN_FILE_ERRORS, TokenFile, bearer_token, load_verifier
from strom.security.quotas import QuotaManager
from strom.security.rules import FILTERS, RULES
from strom.service import metrics as service_metrics
from strom.storage.wire import parse_produce_request

ALICE = "User:CN=alice"


def acl(
    op: Op, res: Res, name: str, *, who: str = ALICE, allow: bool = True, prefixed: bool = False
) -> Acl:
    return Acl(who, op, allow, res, name, prefixed)


def test_default_deny_super_users_and_implied_describe() -> None:
    a = Authorizer(["User:admin"])
    assert not a.allowed(ALICE, Op.READ, Res.TOPIC, "t")  # nothing matches: no
    assert a.allowed("User:admin", Op.DELETE, Res.TOPIC, "t")  # super user: yes
    a.replace([acl(Op.WRITE, Res.TOPIC, "t")])
    assert a.allowed(ALICE, Op.WRITE, Res.TOPIC, "t")
    assert a.allowed(ALICE, Op.DESCRIBE, Res.TOPIC, "t")  # WRITE implies DESCRIBE
    assert not a.allowed(ALICE, Op.READ, Res.TOPIC, "t")
    assert not a.allowed(ALICE, Op.WRITE, Res.TOPIC, "u")
    assert not a.allowed(ALICE, Op.WRITE, Res.GROUP, "t")  # another resource type
    assert not a.allowed("User:CN=bob", Op.WRITE, Res.TOPIC, "t")


def test_deny_wins_for_its_own_operation_only() -> None:
    a = Authorizer()
    a.replace(
        [
            acl(Op.ALL, Res.TOPIC, "*"),
            acl(Op.READ, Res.TOPIC, "secret", allow=False),
        ]
    )
    assert a.allowed(ALICE, Op.READ, Res.TOPIC, "public")
    assert not a.allowed(ALICE, Op.READ, Res.TOPIC, "secret")
    assert a.allowed(ALICE, Op.DESCRIBE, Res.TOPIC, "secret")  # DENY READ is not DENY DESCRIBE
    a.replace([acl(Op.ALL, Res.TOPIC, "*"), acl(Op.ALL, Res.TOPIC, "secret", allow=False)])
    assert not a.allowed(ALICE, Op.DESCRIBE, Res.TOPIC, "secret")


def test_prefixes_wildcards_and_any_principal() -> None:
    a = Authorizer()
    a.replace(
        [
            acl(Op.READ, Res.TOPIC, "team-a.", prefixed=True),
            acl(Op.READ, Res.GROUP, "*", who="User:*"),
            acl(Op.ALTER, Res.CLUSTER, CLUSTER),
        ]
    )
    assert a.allowed(ALICE, Op.READ, Res.TOPIC, "team-a.clicks")
    assert not a.allowed(ALICE, Op.READ, Res.TOPIC, "team-b.clicks")
    assert a.allowed("User:anyone", Op.READ, Res.GROUP, "g")
    assert a.allowed(ALICE, Op.ALTER, Res.CLUSTER, "whatever-name")


def test_an_idempotent_producer_id_needs_write_on_some_topic() -> None:
    """KIP-679: InitProducerId without a transactional id needs WRITE on some topic (it
    needed nothing: anyone authenticated could have producer ids handed out). WRITE on at
    least one topic that no DENY takes back, by the principal or ``User:*``."""
    rule = RULES["/strom.v1.StorageService/InitProducerId"]
    assert list(rule(storage_pb2.InitProducerIdRequest())) == [(Op.WRITE, Res.TOPIC, SOME)]
    assert list(rule(storage_pb2.InitProducerIdRequest(transactional_id="tx"))) == [
        (Op.WRITE, Res.TRANSACTIONAL_ID, "tx")
    ]
    a = Authorizer(["User:admin"])

    def some(*acls: Acl, who: str = ALICE) -> bool:
        a.replace(acls)
        return a.allowed(who, Op.WRITE, Res.TOPIC, SOME)

    assert a.allowed("User:admin", Op.WRITE, Res.TOPIC, SOME)  # a super user
    assert not some()  # nothing
    assert not some(acl(Op.READ, Res.TOPIC, "t"), acl(Op.WRITE, Res.GROUP, "g"))
    assert some(acl(Op.WRITE, Res.TOPIC, "t"))
    assert some(acl(Op.ALL, Res.TOPIC, "team.", prefixed=True))
    assert some(acl(Op.WRITE, Res.TOPIC, "*", who="User:*"))
    assert not some(acl(Op.WRITE, Res.TOPIC, "t"), who="User:CN=bob")
    # A DENY takes back what it covers entirely, for its own operation (or ALL).
    assert not some(acl(Op.WRITE, Res.TOPIC, "t"), acl(Op.WRITE, Res.TOPIC, "t", allow=False))
    assert not some(acl(Op.WRITE, Res.TOPIC, "t"), acl(Op.ALL, Res.TOPIC, "*", allow=False))
    assert not some(
        acl(Op.WRITE, Res.TOPIC, "team.a", prefixed=True),
        acl(Op.WRITE, Res.TOPIC, "team.", prefixed=True, allow=False),
    )
    assert some(acl(Op.WRITE, Res.TOPIC, "t"), acl(Op.READ, Res.TOPIC, "*", allow=False))
    assert some(acl(Op.WRITE, Res.TOPIC, "*"), acl(Op.WRITE, Res.TOPIC, "t", allow=False))
    assert some(
        acl(Op.WRITE, Res.TOPIC, "team.", prefixed=True),
        acl(Op.WRITE, Res.TOPIC, "team.a", prefixed=True, allow=False),
    )


def test_bindings_round_trip_validate_and_filter() -> None:
    b = acl(Op.WRITE, Res.TOPIC, "t.", prefixed=True).to_proto()
    assert Acl.from_proto(b) == acl(Op.WRITE, Res.TOPIC, "t.", prefixed=True)
    assert acl(Op.WRITE, Res.TOPIC, "t").key == acl(Op.WRITE, Res.TOPIC, "t").key
    assert acl(Op.WRITE, Res.TOPIC, "t").key != acl(Op.READ, Res.TOPIC, "t").key
    assert validate(b) is None
    bad = md.AclBinding(principal="alice", operation=md.ACL_OPERATION_READ)
    assert "User:" in (validate(bad) or "")
    f = controller_pb2.AclBindingFilter(principal=ALICE, resource_type=md.ACL_RESOURCE_TYPE_TOPIC)
    assert matches_filter(Acl.from_proto(b), f)
    assert not matches_filter(
        Acl.from_proto(b), controller_pb2.AclBindingFilter(principal="User:x")
    )


@pytest.mark.parametrize(
    ("module", "service"),
    [
        (storage_pb2, "StorageService"),
        (controller_pb2, "ControllerService"),
        (coordinator_pb2, "CoordinatorService"),
        (records_pb2, "RecordService"),
    ],
)
def test_every_rpc_of_every_service_has_a_rule(module: object, service: str) -> None:
    """A new RPC cannot be added unchecked: the interceptor refuses methods without a rule,
    and this fails first."""
    desc = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    missing = [m.name for m in desc.methods if f"/{desc.full_name}/{m.name}" not in RULES]
    assert missing == []


def test_rules_name_what_the_request_names() -> None:
    req = storage_pb2.ProduceRequest()
    req.topics.add(topic="a")
    req.topics.add(topic="b")
    assert list(RULES["/strom.v1.StorageService/Produce"](req)) == [
        (Op.WRITE, Res.TOPIC, "a"),
        (Op.WRITE, Res.TOPIC, "b"),
    ]
    # An internal topic is the coordinators' alone: also CLUSTER_ACTION (found from outside).
    req.topics.add(topic="__consumer_offsets")
    for method in ("Produce", "ProduceStream"):
        assert (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER) in list(
            RULES[f"/strom.v1.StorageService/{method}"](req)
        )
    # A transactional producer's request also needs WRITE on its transactional id (Kafka's
    # rule; found from outside), in the C-parsed and the large-request forms alike.
    txn = storage_pb2.ProduceRequest(transactional_id="orders-tx")
    txn.topics.add(topic="a")
    big = parse_produce_request(txn.SerializeToString())
    for r in (txn, big):
        assert list(RULES["/strom.v1.StorageService/Produce"](r)) == [
            (Op.WRITE, Res.TOPIC, "a"),
            (Op.WRITE, Res.TRANSACTIONAL_ID, "orders-tx"),
        ]
    alter = controller_pb2.AlterConfigsRequest()
    alter.resources.add(resource_type=1, resource_name="__transaction_state")
    assert list(RULES["/strom.v1.ControllerService/AlterConfigs"](alter)) == [
        (Op.ALTER, Res.TOPIC, "__transaction_state"),
        (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER),
    ]
    fetch = storage_pb2.FetchRequest(replica_id=3, replica_incarnation="inc")
    assert list(RULES["/strom.v1.StorageService/Fetch"](fetch)) == [
        (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER)
    ]
    # replica_id left unset (0, as a grpc-js caller sends it) is a consumer's fetch, not
    # node 0's: READ on the topics, not CLUSTER_ACTION (it was refused for want of it).
    unset = storage_pb2.FetchRequest()
    unset.topics.add(topic="t")
    assert list(RULES["/strom.v1.StorageService/Fetch"](unset)) == [(Op.READ, Res.TOPIC, "t")]
    unset.replica_incarnation = "inc"  # node 0's follower names its incarnation
    assert list(RULES["/strom.v1.StorageService/Fetch"](unset)) == [
        (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER)
    ]
    # ListOffsets: a replica's (log-end) view needs CLUSTER_ACTION too; unset is a client's.
    lo = storage_pb2.ListOffsetsRequest()
    lo.topics.add(topic="t")
    assert list(RULES["/strom.v1.StorageService/ListOffsets"](lo)) == [
        (Op.DESCRIBE, Res.TOPIC, "t")
    ]
    lo.replica_id = 2
    assert list(RULES["/strom.v1.StorageService/ListOffsets"](lo)) == [
        (Op.DESCRIBE, Res.TOPIC, "t"),
        (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER),
    ]
    # A grant to a followed fetch reads nothing, whatever its replica_id says.
    grant = storage_pb2.FetchRequest(replica_id=0, follow_answers=4)
    assert list(RULES["/strom.v1.StorageService/FetchStream"](grant)) == []
    grant.follow = True  # (not a grant: a follow of nothing, by a "follower")
    grant.replica_incarnation = "inc"
    assert list(RULES["/strom.v1.StorageService/FetchStream"](grant)) == [
        (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER)
    ]
    txn = coordinator_pb2.TxnOffsetCommitRequest(transactional_id="tx", group_id="g")
    txn.topics.add(topic="t")
    sub = records_pb2.SubscribeRequest(group_id="g", topics=["t"])
    sub.partitions.add(topic="u", partition=0)
    want = {(Op.READ, Res.TOPIC, "t"), (Op.READ, Res.TOPIC, "u"), (Op.READ, Res.GROUP, "g")}
    assert set(RULES["/strom.v1.RecordService/Subscribe"](sub)) == want
    # RecordService's handlers take the raw bytes, and so does the interceptor's check.
    assert set(RULES["/strom.v1.RecordService/Subscribe"](sub.SerializeToString())) == want
    produce = records_pb2.ProduceRecordsRequest(topic="t").SerializeToString()
    assert list(RULES["/strom.v1.RecordService/ProduceRecords"](produce)) == [
        (Op.WRITE, Res.TOPIC, "t")
    ]
    # Bytes that do not parse: no check here; the handler refuses them (INVALID_ARGUMENT).
    assert list(RULES["/strom.v1.RecordService/ProduceRecords"](b"\xff\xff")) == []
    assert set(RULES["/strom.v1.CoordinatorService/TxnOffsetCommit"](txn)) == {
        (Op.WRITE, Res.TRANSACTIONAL_ID, "tx"),
        (Op.READ, Res.GROUP, "g"),
        (Op.READ, Res.TOPIC, "t"),
    }


def test_quotas_throttle_to_the_rate_and_fall_back_to_the_default() -> None:
    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    assert q.throttle(ALICE, "produce", 10**9) == 0  # no quotas: never
    q.replace(
        {
            ALICE: md.ClientQuota(principal=ALICE, produce_bytes_per_second=1000),
            "User:*": md.ClientQuota(principal="User:*", requests_per_second=2),
        }
    )
    assert q.throttle(ALICE, "produce", 1000) == 0  # one second of burst
    assert q.throttle(ALICE, "produce", 500) == pytest.approx(0.5)  # 500 B ahead of 1000 B/s
    now[0] += 0.5
    assert q.throttle(ALICE, "produce", 0) == 0  # caught up
    now[0] += 10  # (the default's 2 requests per second apply to alice too)
    assert q.throttle(ALICE, "fetch", 10**9) == 0  # fetch is not limited for alice
    bob = "User:CN=bob"  # the default: 2 requests per second
    assert [q.throttle(bob, "fetch", 1) for _ in range(3)] == [0, 0, pytest.approx(0.5)]


def test_each_kind_of_quota_falls_back_to_the_default_on_its_own() -> None:
    """Found from outside: a principal's own entry was taken as a whole, so alice, given
    only a produce rate, fetched unthrottled past the ``User:*`` fetch rate (Kafka resolves
    each kind separately)."""
    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    q.replace(
        {
            "User:*": md.ClientQuota(principal="User:*", fetch_bytes_per_second=1000),
            ALICE: md.ClientQuota(principal=ALICE, produce_bytes_per_second=1_000_000),
        }
    )
    assert q.throttle(ALICE, "fetch", 3000) == pytest.approx(2.0)  # the default's fetch rate
    assert q.throttle(ALICE, "produce", 1_000_000) == 0  # her own produce rate


def test_a_quota_change_keeps_the_debt_of_every_principal() -> None:
    """Found from outside: every change of the quotas cleared every bucket, forgiving the
    debt of principals whose rates had not changed (and any etcd change reloaded them)."""
    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    bob = "User:CN=bob"
    quotas = {ALICE: md.ClientQuota(principal=ALICE, fetch_bytes_per_second=1000)}
    q.replace(quotas)
    assert q.throttle(ALICE, "fetch", 5000) == pytest.approx(4.0)
    now[0] += 1
    q.replace({**quotas, bob: md.ClientQuota(principal=bob, fetch_bytes_per_second=1)})
    assert q.throttle(ALICE, "fetch", 0) == pytest.approx(3.0)  # still 3000 B ahead
    # A changed rate: the debt so far stays, paid at the new rate.
    q.replace({ALICE: md.ClientQuota(principal=ALICE, fetch_bytes_per_second=500)})
    assert q.throttle(ALICE, "fetch", 0) == pytest.approx(6.0)
    q.replace({})  # no limit any more: nothing held
    assert q.throttle(ALICE, "fetch", 10**9) == 0


def test_only_acl_and_quota_changes_reload_them() -> None:
    """Found from outside: every etcd event under the cluster's root (a topic config, a
    producer-id block any principal's InitProducerId causes) reloaded the quotas, which
    forgave every debt."""
    import threading

    from strom.metadata.keys import Keys
    from strom.metadata.store import Versioned, WatchEvent
    from strom.metadata.view import RESYNC
    from strom.security import follow

    class View:  # the part of ClusterView follow() reads
        keys = Keys("c")
        lock = threading.RLock()
        acls: dict[str, Versioned] = {}
        quotas = {
            ALICE: Versioned(
                "k", md.ClientQuota(principal=ALICE, fetch_bytes_per_second=1000), 1, 1
            )
        }
        listeners: list = []

        def add_listener(self, fn) -> None:  # type: ignore[no-untyped-def]
            self.listeners.append(fn)

    view, now = View(), [0.0]
    q = QuotaManager(clock=lambda: now[0])
    sec = ServerSecurity(acls=True)
    follow(view, sec, q)  # type: ignore[arg-type]
    assert q.throttle(ALICE, "fetch", 3000) == pytest.approx(2.0)
    (notify,) = view.listeners
    notify([WatchEvent(view.keys.root + "producer_ids", b"", 2)])
    notify([WatchEvent(view.keys.topics_prefix + "orders", b"", 3)])
    assert q.throttle(ALICE, "fetch", 0) == pytest.approx(2.0)  # the debt stands
    view.acls["x"] = Versioned("x", acl(Op.READ, Res.TOPIC, "t").to_proto(), 4, 4)
    notify([WatchEvent(view.keys.acls_prefix + "x", b"", 4)])
    assert sec.authorizer.allowed(ALICE, Op.READ, Res.TOPIC, "t")
    view.quotas.clear()
    notify([RESYNC])
    assert q.throttle(ALICE, "fetch", 10**6) == 0


def test_a_bad_token_file_version_still_revokes_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside: after a rewrite with one bad line the old table stayed in force,
    so a removed token kept authenticating, silently, and the file was read and parsed again
    on every call while it stayed bad."""
    f = tmp_path / "tokens"
    f.write_text("t-alice alice\nt-bob User:bob\n")
    tokens = TokenFile(f)
    assert tokens("t-bob") == "User:bob"
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(
        Path, "read_text", lambda self, **kw: reads.append(self) or read_text(self, **kw)
    )
    errors = TOKEN_FILE_ERRORS.labels(service_metrics.SERVICE)
    before = errors._value.get()
    # bob removed, carol added with a space in her principal (the reviewer's file).
    f.write_text("t-alice alice\nt-carol User:CN=carol, O=acme\n")
    with caplog.at_level("ERROR", logger="strom.security"):
        for _ in range(3):
            assert tokens("t-bob") is None  # the removal applies
            assert tokens("t-carol") is None  # the bad line's token does not authenticate
            assert tokens("t-alice") == "User:alice"  # the good lines do
    assert len(reads) == 1  # read once for the version, not on every call
    assert errors._value.get() == before + 1
    [record] = caplog.records
    message = record.getMessage()
    assert str(f) in message and "line 2: expected '<token> <principal>', found 3 words" in message
    assert "t-carol" not in message  # the log never shows a token
    # A file that cannot be read (here: not UTF-8) authenticates no token, and is counted.
    caplog.clear()
    f.write_bytes(b"t-alice alice\n\xff\n")
    with caplog.at_level("ERROR", logger="strom.security"):
        assert tokens("t-alice") is None and tokens("t-alice") is None
    assert errors._value.get() == before + 2 and len(caplog.records) == 1
    assert "no bearer token authenticates" in caplog.records[0].getMessage()
    f.unlink()
    assert tokens("t-alice") is None  # gone: still nothing
    f.write_text("t-alice alice\n")
    assert tokens("t-alice") == "User:alice"  # fixed: applies at once
    # At start, a bad file is refused, naming the line (not showing it).
    f.write_text("t-x one two\n")
    with pytest.raises(ValueError, match=r"tokens:1: expected .* found 3 words") as refused:
        TokenFile(f)
    assert "t-x" not in str(refused.value)


def test_a_token_file_rewritten_in_place_with_its_old_size_and_time_is_read_again(
    tmp_path: Path,
) -> None:
    """The change time tells it (as it tells a chmod that makes an unreadable file readable
    again, which nothing else would show)."""
    f = tmp_path / "tokens"
    f.write_text("t-old alice\n")
    tokens = TokenFile(f)
    st = f.stat()
    f.write_text("t-new alice\n")  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same modification time
    assert tokens("t-old") is None and tokens("t-new") == "User:alice"


def test_a_verifier_that_raises_refuses_and_is_logged_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def verifier(token: str) -> str | None:
        raise ValueError(f"Signature verification failed for token {token}")

    auth = AuthInterceptor(ServerSecurity(tokens=verifier))
    with caplog.at_level("WARNING", logger="strom.security"):
        assert auth._verify("bad-secret-token") is None
        assert auth._verify("bad-secret-token") is None  # within the minute: not logged
    [record] = caplog.records
    assert record.getMessage().startswith(
        "the bearer token verifier raised ValueError: Signature verification failed for "
        "token <token>; refused as UNAUTHENTICATED"
    )


def test_token_files_and_verifiers(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("# comment\nt1 alice\nt2 User:bob\n")
    tokens = TokenFile(f)
    assert (tokens("t1"), tokens("t2"), tokens("nope")) == ("User:alice", "User:bob", None)
    f.write_text("t3 carol\n")
    assert tokens("t3") == "User:carol" and tokens("t1") is None  # re-read on change
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) is None
    assert load_verifier("os.path:basename")("/a/b") == "b"
    with pytest.raises(ValueError, match="module:function"):
        load_verifier("nope")
    with pytest.raises(ValueError, match="cannot load"):
        load_verifier("no_such_module_x:f")


def test_a_token_file_with_a_byte_order_mark_or_a_non_ascii_token_still_authenticates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: a UTF-8 byte order mark before the first token, or a token with a
    non-ASCII letter, made hmac.compare_digest raise TypeError on every call: no token
    authenticated, the good ones included, and the errors counter stayed at 0."""
    f = tmp_path / "tokens"
    f.write_bytes(b"\xef\xbb\xbfsvc-token User:svc\nalice-token User:alice\n")
    tokens = TokenFile(f)  # the mark is dropped: a good file
    assert tokens("svc-token") == "User:svc" and tokens("alice-token") == "User:alice"
    assert tokens("\ufeffsvc-token") is None and tokens("caf\xe9") is None
    assert tokens("\ud800") is None  # any str is compared, none raises
    errors = TOKEN_FILE_ERRORS.labels(service_metrics.SERVICE)
    before = errors._value.get()
    f.write_text("caf\xe9-token User:carol\nalice-token User:alice\n", encoding="utf-8")
    with caplog.at_level("ERROR", logger="strom.security"):
        assert tokens("alice-token") == "User:alice"  # the good line applies
        assert tokens("caf\xe9-token") is None  # the bad line's token does not
    assert errors._value.get() == before + 1
    [record] = caplog.records
    assert "line 1: the token has a character that is not printable ASCII" in (record.getMessage())
    assert "caf" not in record.getMessage()
    # At start such a file is refused, naming the line.
    with pytest.raises(ValueError, match=r"tokens:1: the token has a character that is not"):
        TokenFile(f)


def test_a_token_given_two_principals_is_a_bad_line_and_authenticates_neither(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found from outside: the last of two lines with the same token silently won. Which
    principal was meant cannot be told, so neither applies and the version is counted bad; the
    same token with the same principal twice is harmless."""
    f = tmp_path / "tokens"
    f.write_text("t-a alice\nt-a User:alice\nt-b bob\n")
    tokens = TokenFile(f)
    assert tokens("t-a") == "User:alice"
    errors = TOKEN_FILE_ERRORS.labels(service_metrics.SERVICE)
    before = errors._value.get()
    f.write_text("t-a alice\nt-b bob\nt-a admin\nt-a alice\n")
    with caplog.at_level("ERROR", logger="strom.security"):
        assert tokens("t-a") is None
        assert tokens("t-b") == "User:bob"
    assert errors._value.get() == before + 1
    message = caplog.records[0].getMessage()
    assert "line 3: the token of line 1 again, with another principal" in message
    assert "line 4: the token of line 1 again" in message and "t-a" not in message
    with pytest.raises(ValueError, match=r"tokens:3: the token of line 1 again"):
        TokenFile(f)


def known_verifier(token: str) -> str | None:
    """A verifier for the test below: it knows one token."""
    return "User:from-verifier" if token == "v-token" else None


def test_the_verifier_is_asked_when_the_token_file_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside: with --auth-tokens and --auth-token-verifier (documented as
    and/or), a token file that raised ended the search, so the verifier was never asked. Each
    is asked whatever the other did; with none accepting, the first error is raised for the
    interceptor to log and refuse with."""
    from strom.security import config

    monkeypatch.setattr(config, "_SERVER", config._SERVER)
    monkeypatch.setattr(config, "_ETCD", config._ETCD)
    monkeypatch.setattr(config, "set_default_channel", lambda *a: None)
    f = tmp_path / "tokens"
    f.write_text("t-alice alice\n")
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    verifier = f"{__name__}:known_verifier"
    config.configure(
        parser.parse_args(["--auth-tokens", str(f), "--auth-token-verifier", verifier])
    )
    tokens = config.server().tokens
    assert tokens is not None
    assert tokens("t-alice") == "User:alice" and tokens("v-token") == "User:from-verifier"
    assert tokens("nope") is None

    def broken(self: TokenFile, token: str) -> str | None:
        raise TypeError("the file broke")

    monkeypatch.setattr(TokenFile, "__call__", broken)
    assert tokens("v-token") == "User:from-verifier"
    with pytest.raises(TypeError, match="the file broke"):
        tokens("nope")


def test_super_users_are_separated_by_semicolons_and_keep_their_subjects_commas() -> None:
    """Found from outside: --super-users was split on every comma, so
    'User:CN=strom,O=acme,User:CN=admin' made User:O=acme a super user (any certificate with
    just that subject) and not the service's certificate. Principals are separated by ';'
    (the flag may repeat); a value without ';' keeps its old meaning only where that cannot
    be misread, and is refused otherwise."""
    from strom.security.config import parse_super_users

    assert parse_super_users(["User:CN=strom,O=acme;User:CN=admin"]) == {
        "User:CN=strom,O=acme",
        "User:CN=admin",
    }
    assert parse_super_users(["User:CN=strom,O=acme", "admin"]) == {
        "User:CN=strom,O=acme",  # one certificate's subject: the parts after commas are RDNs
        "User:admin",
    }
    assert parse_super_users(["User:CN=strom,2.5.4.10=acme"]) == {"User:CN=strom,2.5.4.10=acme"}
    # The old comma-separated list of whole principals, each with its type: as before.
    assert parse_super_users(["User:CN=strom,User:CN=admin"]) == {
        "User:CN=strom",
        "User:CN=admin",
    }
    # RFC 4514 escapes are kept and do not separate.
    assert parse_super_users([r"User:CN=a\,b\;c,O=x;User:bob"]) == {
        r"User:CN=a\,b\;c,O=x",
        "User:bob",
    }
    # A single principal with a comma that is no RDN: end it with ';'.
    assert parse_super_users(["User:svc,eu;"]) == {"User:svc,eu"}
    assert parse_super_users([]) == frozenset()  # the flag not given (" ; " is refused: below)
    for ambiguous in (
        "User:CN=strom,O=acme,User:CN=admin",  # the reviewer's value
        "admin,bob",
        "User:svc,eu",
        "User:a;User:b,User:c",
    ):
        with pytest.raises(ValueError, match="separate principals with ';'"):
            parse_super_users([ambiguous])


def test_the_super_users_flag_repeats_and_refuses_a_value_it_cannot_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from strom.security import config

    monkeypatch.setattr(config, "_SERVER", config._SERVER)
    monkeypatch.setattr(config, "_ETCD", config._ETCD)
    monkeypatch.setattr(config, "set_default_channel", lambda *a: None)
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    argv = ["--super-users", "User:CN=strom,O=acme;User:CN=admin", "--super-users", "User:ops"]
    config.configure(parser.parse_args(argv))
    assert config.server().super_users == {"User:CN=strom,O=acme", "User:CN=admin", "User:ops"}
    assert config.server().authorizer.allowed(
        "User:CN=strom,O=acme", Op.ALTER, Res.CLUSTER, CLUSTER
    )
    assert not config.server().authorizer.allowed("User:O=acme", Op.ALTER, Res.CLUSTER, CLUSTER)
    bad = parser.parse_args(["--super-users", "User:CN=strom,O=acme,User:CN=admin"])
    with pytest.raises(ValueError, match="--super-users 'User:CN=strom,O=acme,User:CN=admin'"):
        config.configure(bad)


def test_coordinator_answers_leave_out_topics_the_principal_may_not_describe() -> None:
    """Found from outside: DESCRIBE on a group (or a transactional id) showed the names,
    committed offsets and log ends of every topic it touched, and DELETE on a group deleted
    the offsets of any topic. Kafka's rules: OffsetFetch answers TOPIC_AUTHORIZATION_FAILED
    for a topic named (and leaves topics out of the every-offset form); the descriptions
    leave them out; OffsetDelete needs READ on each topic."""
    a = Authorizer()
    a.replace([acl(Op.DESCRIBE, Res.GROUP, "shared"), acl(Op.DESCRIBE, Res.TOPIC, "orders")])
    method = "/strom.v1.CoordinatorService/"

    def fetch_answer() -> coordinator_pb2.OffsetFetchResponse:
        resp = coordinator_pb2.OffsetFetchResponse()
        for topic in ("hr-salaries", "orders"):
            resp.topics.add(topic=topic).partitions.add(
                partition=0, committed_offset=2, committed_leader_epoch=1, metadata="m"
            )
        return resp

    every = fetch_answer()
    FILTERS[method + "OffsetFetch"](a, ALICE, coordinator_pb2.OffsetFetchRequest(), every)
    assert [t.topic for t in every.topics] == ["orders"]
    named = fetch_answer()
    req = coordinator_pb2.OffsetFetchRequest(group_id="shared")
    req.topics.add(topic="hr-salaries")
    req.topics.add(topic="orders")
    FILTERS[method + "OffsetFetch"](a, ALICE, req, named)
    hidden, shown = named.topics[0].partitions[0], named.topics[1].partitions[0]
    assert hidden.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert (hidden.partition, hidden.committed_offset, hidden.metadata) == (0, -1, "")
    assert "DESCRIBE on topic 'hr-salaries'" in hidden.error_message
    assert (shown.error_code, shown.committed_offset) == (ErrorCode.NONE, 2)

    groups = coordinator_pb2.DescribeGroupsResponse()
    g = groups.groups.add(group_id="shared")
    m = g.members.add(member_id="m1", subscribed_topic_names=["hr-salaries", "orders"])
    for assignment in (m.assignment, m.target_assignment):
        assignment.topic_partitions.add(topic="hr-salaries", partitions=[0])
        assignment.topic_partitions.add(topic="orders", partitions=[0])
    g.offsets.add(topic="hr-salaries", partition=0, committed_offset=2, end_offset=2)
    g.offsets.add(topic="orders", partition=0, committed_offset=1, end_offset=3)
    FILTERS[method + "DescribeGroups"](a, ALICE, coordinator_pb2.DescribeGroupsRequest(), groups)
    assert "hr-salaries" not in str(groups)
    assert list(m.subscribed_topic_names) == ["orders"]
    assert [tp.topic for tp in m.assignment.topic_partitions] == ["orders"]
    assert [tp.topic for tp in m.target_assignment.topic_partitions] == ["orders"]
    assert [(o.topic, o.committed_offset) for o in g.offsets] == [("orders", 1)]

    txns = coordinator_pb2.DescribeTransactionsResponse()
    t = txns.transactions.add(transactional_id="tx-a")
    t.topics.add(topic="hr-salaries", partitions=[0])
    t.topics.add(topic="orders", partitions=[0])
    t.groups.extend(["hr-payroll", "shared"])
    FILTERS[method + "DescribeTransactions"](
        a, ALICE, coordinator_pb2.DescribeTransactionsRequest(), txns
    )
    assert [tp.topic for tp in t.topics] == ["orders"]
    assert list(t.groups) == ["shared"]  # nor the groups it may not describe

    delete = coordinator_pb2.DeleteOffsetsRequest(group_id="shared")
    delete.topics.add(topic="hr-salaries", partitions=[0])
    assert list(RULES[method + "DeleteOffsets"](delete)) == [
        (Op.DELETE, Res.GROUP, "shared"),
        (Op.READ, Res.TOPIC, "hr-salaries"),
    ]


def test_creating_an_internal_topic_needs_cluster_action() -> None:
    """Found from outside: CREATE on ``*`` and the coordinators' header made ``__`` topics no
    client could write and nobody could delete. The topics the coordinators really keep
    their state in stay undeletable; the controller names them as the coordinators do."""
    from strom.controller.validation import COORDINATOR_TOPICS
    from strom.coordinator.offsets_log import CONSUMER_OFFSETS_TOPIC
    from strom.coordinator.txn_state import TRANSACTION_STATE_TOPIC

    create = RULES["/strom.v1.ControllerService/CreateTopics"]
    req = controller_pb2.CreateTopicsRequest()
    req.topics.add(name="orders")
    assert list(create(req)) == [(Op.CREATE, Res.TOPIC, "orders")]
    req.topics.add(name="__junk")
    assert list(create(req)) == [
        (Op.CREATE, Res.TOPIC, "orders"),
        (Op.CREATE, Res.TOPIC, "__junk"),
        (Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER),
    ]
    assert {CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC} == COORDINATOR_TOPICS


def test_finding_every_coordinator_needs_no_cluster_describe() -> None:
    """FindCoordinator(all_shards) tells only where the coordinators are, as Metadata tells
    where the nodes are: listing groups or transactions needs DESCRIBE only on what is
    listed (found from outside: `strom groups list` needed DESCRIBE on the cluster). Keys
    named with it are still checked."""
    for service in ("StorageService", "CoordinatorService"):
        rule = RULES[f"/strom.v1.{service}/FindCoordinator"]
        assert list(rule(storage_pb2.FindCoordinatorRequest(all_shards=True))) == []
        named = storage_pb2.FindCoordinatorRequest(all_shards=True, keys=["g"])
        assert list(rule(named)) == [(Op.DESCRIBE, Res.GROUP, "g")]


def test_a_capped_hold_forgives_nothing_and_a_fetch_is_bounded_by_its_quota() -> None:
    """Found from outside: an answer is held at most MAX_THROTTLE_S and nothing else
    remembered the rest, so a request of any size passed at its size per 30 s. What the
    hold does not cover stays owed (the principal's next requests wait it out), and a fetch
    reads at most FETCH_WINDOW_S of its principal's fetch rate."""
    from strom.security.quotas import FETCH_WINDOW_S, MAX_THROTTLE_S

    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    assert q.fetch_limit(ALICE) == 0 and q.owed(ALICE, "produce") == 0  # no quotas
    q.replace(
        {
            ALICE: md.ClientQuota(principal=ALICE, produce_bytes_per_second=1000),
            "User:*": md.ClientQuota(principal="User:*", fetch_bytes_per_second=10_000),
        }
    )
    assert q.throttle(ALICE, "produce", 100_000) == MAX_THROTTLE_S  # 99 s ahead, held 30
    now[0] += MAX_THROTTLE_S
    assert q.owed(ALICE, "produce") == pytest.approx(99 - MAX_THROTTLE_S)
    assert q.owed(ALICE, "fetch") == 0
    assert q.fetch_limit(ALICE) == 10_000 * FETCH_WINDOW_S  # the default's fetch rate


def test_requests_of_a_principal_that_owes_wait_in_order_until_it_has_paid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node's side of the above: a request of a principal still ahead of its quota is
    served only once it is not (before anything is done for it), and its requests waiting
    together are served in the order they came (a producer's batches in flight must not be
    reordered). A principal that owes nothing does not wait."""
    import asyncio

    from strom.security import CURRENT_PRINCIPAL
    from strom.storage import rpc_base

    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    q.replace({ALICE: md.ClientQuota(principal=ALICE, produce_bytes_per_second=1000)})
    monkeypatch.setattr(rpc_base, "QUOTAS", q)
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:  # the fake clock's time passes at once
        now[0] += seconds
        await real_sleep(0)

    monkeypatch.setattr(rpc_base.asyncio, "sleep", sleep)
    served: list[tuple[str, float]] = []

    async def request(name: str, principal: str = ALICE) -> None:
        CURRENT_PRINCIPAL.set(principal)
        await rpc_base._wait_out_debt("produce")
        served.append((name, now[0]))
        q.throttle(principal, "produce", 1000)  # what serving it costs

    async def main() -> None:
        CURRENT_PRINCIPAL.set(ALICE)
        q.throttle(ALICE, "produce", 100_000)  # an answer held 30 s, 99 s ahead
        await asyncio.gather(*(request(n) for n in ("a", "b", "c")), request("bob", "User:bob"))

    asyncio.run(main())
    assert served[0][0] == "bob"  # first: it did not wait (the fake clock is shared)
    assert [n for n, _ in served[1:]] == ["a", "b", "c"]
    assert [t for _, t in served[1:]] == [pytest.approx(t) for t in (99.0, 100.0, 101.0)]
    assert not rpc_base._GATES  # nothing left behind


def test_the_produce_records_rule_reads_the_topic_without_parsing_the_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found from outside: with ACLs on, the rule parsed the whole ProduceRecords request on
    the event loop before the handler's size limit, and a 120 MB call cost the node its etcd
    lease. The topic is read from the wire format's top level (last occurrence wins, as
    protobuf's parser does); a call above the limit is not read at all (the handler refuses
    it before acting)."""
    from strom.api import records_pb2 as rp
    from strom.grpc_options import MAX_PRODUCE_RECORDS_REQUEST_BYTES
    from strom.storage.wire import top_level_string

    rule = RULES["/strom.v1.RecordService/ProduceRecords"]
    cols = rp.RecordColumns(values=[b"x" * 100] * 50, keys=[b"k"] * 50)
    plain = rp.ProduceRecordsRequest(
        topic="orders", partition=3, records=cols, acks=rp.ACKS_ALL, timeout_ms=5
    ).SerializeToString()
    seq = rp.ProduceRecordsRequest(topic="pay", producer=rp.ProducerSequence(producer_id=7))
    # A topic repeated: protobuf's parser keeps the last one, and so must the rule.
    twice = plain + rp.ProduceRecordsRequest(topic="other").SerializeToString()
    assert rp.ProduceRecordsRequest.FromString(twice).topic == "other"

    def no_parse(_raw: bytes) -> None:
        raise AssertionError("the request was parsed")

    monkeypatch.setattr(rp.ProduceRecordsRequest, "FromString", no_parse)
    assert list(rule(plain)) == [(Op.WRITE, Res.TOPIC, "orders")]
    assert list(rule(seq.SerializeToString())) == [(Op.WRITE, Res.TOPIC, "pay")]
    assert list(rule(twice)) == [(Op.WRITE, Res.TOPIC, "other")]
    assert list(rule(b"\0" * (MAX_PRODUCE_RECORDS_REQUEST_BYTES + 1))) == []
    # What the wire read cannot be sure of goes to the parser (which refuses garbage).
    monkeypatch.undo()
    assert top_level_string(b"\x0b\x00", 1) is None  # a group (wire type 3)
    assert top_level_string(b"\x0a\x02\xff\xfe", 1) is None  # not UTF-8
    assert list(rule(b"\x0a\x05ab")) == []  # truncated: not parsable, handler refuses


def test_super_users_are_written_as_rfc_4514_subjects_and_an_empty_value_is_refused() -> None:
    """Found from outside on the re-check: ``User:CN=strom, O=acme`` kept its space and never
    matched the certificate's principal (RFC 4514 writes none), and ``--super-users ';'``
    silently named nobody."""
    from strom.security.config import parse_super_users

    assert parse_super_users("User:CN=strom, O=acme;User:CN=admin") == {
        "User:CN=strom,O=acme",
        "User:CN=admin",
    }
    assert parse_super_users("User:CN=strom, O=acme") == {"User:CN=strom,O=acme"}
    assert parse_super_users(r"User:CN=x,O=Acme\, Inc;") == {r"User:CN=x,O=Acme\, Inc"}
    for empty in (";", " ; ", ""):
        with pytest.raises(ValueError, match="names no principal"):
            parse_super_users(empty)


def test_the_services_own_principals_are_never_charged() -> None:
    """Found from outside: a ``User:*`` default throttled the cluster's own calls (the
    coordinator's appends, a node's forward to a leader), which run as the services'
    principal. That principal is exempt; no client can be: ``User:ANONYMOUS`` (everyone,
    without authentication) and ``User:*`` are never taken as one."""
    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    service = "User:CN=strom"
    q.replace(
        {
            "User:*": md.ClientQuota(
                principal="User:*",
                produce_bytes_per_second=1000,
                fetch_bytes_per_second=1000,
                requests_per_second=1,
            )
        }
    )
    q.set_service_principals([service, "User:ANONYMOUS", "User:*"])
    assert q.exempt(service) and not q.exempt("User:ANONYMOUS") and not q.exempt("User:*")
    for _ in range(3):
        assert q.throttle(service, "produce", 100_000) == 0
        assert q.throttle(service, "fetch", 100_000) == 0
    assert q.owed(service, "produce") == 0 and q.fetch_limit(service) == 0
    assert q.throttle(ALICE, "produce", 100_000) > 0  # a client is charged as before
    assert q.throttle("User:ANONYMOUS", "produce", 100_000) > 0
    assert q.fetch_limit(ALICE) == 10_000
    q.set_service_principals(["User:CN=strom, O=acme"])  # as the services derive it
    assert q.exempt("User:CN=strom,O=acme") and not q.exempt(service)


def test_a_quota_stored_with_a_space_after_a_comma_applies_to_the_certificate() -> None:
    """Found from outside: ``strom quotas set 'User:CN=hank, O=x'`` stored the principal as
    typed and the certificate's ``User:CN=hank,O=x`` was never throttled. An entry stored so
    (by an older controller) applies to the certificate's principal."""
    now = [0.0]
    q = QuotaManager(clock=lambda: now[0])
    spaced = "User:CN=hank, O=x"
    q.replace({spaced: md.ClientQuota(principal=spaced, produce_bytes_per_second=1000)})
    assert q.throttle("User:CN=hank,O=x", "produce", 2000) == pytest.approx(1.0)


def test_a_service_is_exempt_as_the_principal_it_authenticates_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exemption follows how the services authenticate to each other: the subject of
    their certificate under mTLS (not without it: a server that does not ask for client
    certificates never sees one), the principal of their --client-token-file token with
    tokens; nothing without authentication (every caller is User:ANONYMOUS)."""
    from strom.devcluster.certs import CertificateAuthority
    from strom.security import config
    from strom.security.quotas import QUOTAS

    monkeypatch.setattr(config, "_SERVER", config._SERVER)
    monkeypatch.setattr(config, "_ETCD", config._ETCD)
    monkeypatch.setattr(config, "set_default_channel", lambda *a, **k: None)
    monkeypatch.setattr(QUOTAS, "_services", QUOTAS._services)
    ca = CertificateAuthority(tmp_path / "ca")
    node = ca.issue("strom-node")
    tokens = tmp_path / "tokens"
    tokens.write_text("svc-token User:strom-svc\nt-alice alice\n")
    own = tmp_path / "own-token"
    own.write_text("svc-token\n")
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    tls = ["--tls-cert", str(node.cert), "--tls-key", str(node.key), "--tls-ca", str(ca.ca_file)]
    for argv, exempt in (
        ([*tls, "--tls-client-auth", "required"], {"User:CN=strom-node"}),
        (tls, set()),  # TLS without client certificates: callers are anonymous
        (["--auth-tokens", str(tokens), "--client-token-file", str(own)], {"User:strom-svc"}),
        ([], set()),
    ):
        config.configure(parser.parse_args(argv))
        assert set(QUOTAS._services) == exempt, argv
