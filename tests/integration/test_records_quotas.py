"""The record API (RecordService) under per-principal quotas, on a real TLS + ACL cluster
(found from outside, by a Node.js caller):

- a throttled answer is held at most what is left of the caller's deadline (less a margin):
  a written call was reported DEADLINE_EXCEEDED and its documented retry wrote it again;
  the storage service's own Produce is bounded the same way;
- ProduceRecordsResponse and Subscribe messages say how long they were held
  (``throttle_time_ms``);
- a Subscribe stream held by its caller's fetch quota ends PERMISSION_DENIED soon after its
  READ right is removed, is not expelled from its group as a stalled reader for the time
  the node held it, and its messages carry at most the caller's quota window of bytes;
- concurrent ProduceRecords calls of one principal do not all slip past its quota, and its
  calls waiting out a debt take part in the node's produce admission (RESOURCE_EXHAUSTED
  beyond its share); nor do concurrent storage Produce calls or pipelined ProduceStream
  requests (charged before the append, as ProduceRecords).

Each test has its own principal (a quota's debt outlives the test that made it) and small
rates (a few KB/s), so that calls of tens of KB are held for seconds.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from strom import Admin, TopicPartition
from strom.api import controller_pb2, records_pb2, records_pb2_grpc, storage_pb2
from strom.client.cluster import ClusterClient
from strom.devcluster.certs import Pem
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.record import encode_batch
from tests.conftest import member_metric
from tests.integration.test_security import GROUP, READ, TOPIC, WRITE, Env, allow

pytestmark = pytest.mark.integration

#: The node's --max-inflight-produce-bytes: a principal that owes may hold a quarter of it.
BUDGET = 400_000
#: The node's --subscribe-max-stall-ms (seconds): shorter than a quota hold below.
STALL_S = 3.0


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("records-quotas")
    e = Env(root)
    tls = e.service_args()
    e.cluster = LocalCluster(
        root / "c",
        nodes=1,
        controllers=1,
        coordinators=1,
        node_args=[
            *tls,
            *("--max-inflight-produce-bytes", str(BUDGET)),
            *("--subscribe-max-stall-ms", str(int(STALL_S * 1000))),
        ],
        controller_args=tls,
        coordinator_args=[*tls, "--offsets-partitions", "1", "--transaction-state-partitions", "1"],
        security=e.security(e.admin),
        etcd_tls=(e.node.cert, e.node.key, e.ca.ca_file),
    )
    try:
        e.cluster.start()
        yield e
    finally:
        e.cluster.kill()


def _topic(env: Env, name: str) -> None:
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        admin.create_topic(name, partitions=1, replication_factor=1)


def _end_offset(env: Env, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    with Admin(env.bootstrap, **env.client(env.admin)) as admin:  # type: ignore[arg-type]
        found = admin.list_offsets({tp: "latest"})[tp]
    assert found is not None
    return found.offset


def _fill(env: Env, topic: str, values: list[bytes]) -> None:
    """Append ``values`` to partition 0 as the admin (no quota)."""
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        req = storage_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
        req.topics.add(topic=topic).partitions.add(
            partition=0, records=encode_batch(values), current_leader_epoch=-1
        )
        node = c.storage(env.bootstrap)
        wait_for(  # the new topic's replica may not be open yet
            lambda: node.Produce(req, timeout=30).topics[0].partitions[0].error_code == 0,
            timeout=30,
            what="the records appended",
        )


def _records_call(topic: str, size: int, count: int = 1) -> records_pb2.ProduceRecordsRequest:
    values = [b"r" * (size // count)] * count
    return records_pb2.ProduceRecordsRequest(
        topic=topic, partition=0, records=records_pb2.RecordColumns(values=values)
    )


def _revoke(env: Env, principal: str, resource: str) -> None:
    with ClusterClient(env.bootstrap, security=env.security(env.admin)) as c:
        c.controller_call(
            "DeleteAcls",
            controller_pb2.DeleteAclsRequest(
                filters=[
                    controller_pb2.AclBindingFilter(principal=principal, resource_name=resource)
                ]
            ),
        )


def _throttled(env: Env, kind: str) -> float:
    node = env.cluster.nodes[0]  # type: ignore[union-attr]
    return member_metric(node, "strom_storage_throttled_requests_total", kind=kind)


def _help(member: Any, name: str) -> str:
    """The ``# HELP`` text of metric ``name`` on a member's /metrics."""
    with urllib.request.urlopen(
        f"http://127.0.0.1:{member.metrics_port}/metrics", timeout=5
    ) as page:
        text = page.read().decode()
    found = re.search(r"^# HELP " + re.escape(name) + r" (.*)$", text, re.MULTILINE)
    assert found is not None, f"{name} not exported"
    return found.group(1)


def _until_throttled(env: Env, stub: Any, topic: str) -> None:
    """Send small calls (5 KB, above the one-second burst) until the principal's quota and
    ACL have reached the node: a call the node throttled (its answer held, so it owes
    nothing after it)."""

    def throttled() -> bool:
        before = _throttled(env, "produce")
        try:
            resp = stub.ProduceRecords(_records_call(topic, 5_000), timeout=30)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:  # the ACL not there yet
                raise
            return False
        assert resp.error_code == 0, resp
        return _throttled(env, "produce") > before

    wait_for(throttled, timeout=30, what="the quota applied by the node")


def test_a_throttled_produce_records_is_answered_within_its_deadline(env: Env) -> None:
    """Found from outside: the answer of a written call was held up to 30 s whatever its
    deadline, so it came back DEADLINE_EXCEEDED and the documented retry wrote it again.
    It is now held at most what is left of the deadline less a margin, says how long it was
    held, and the rest stays owed: the next call waits it out first, and one that times out
    there has had nothing written."""
    _topic(env, "rq-deadline")
    who = env.ca.issue("deadline")
    env.quota("User:CN=deadline", produce_bytes_per_second=2_000)
    env.acls(allow("User:CN=deadline", WRITE, TOPIC, "rq-deadline"))
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            _until_throttled(env, stub, "rq-deadline")
            before = _end_offset(env, "rq-deadline")
            # 40 KB at 2,000 B/s: ~20 s ahead, far beyond the call's 6 s deadline.
            resp = stub.ProduceRecords(_records_call("rq-deadline", 40_000, 10), timeout=6)
            assert resp.error_code == 0 and all(r.error_code == 0 for r in resp.results), resp
            assert resp.throttle_time_ms > 0
            assert list(resp.offsets) == list(range(before, before + 10))
            assert _end_offset(env, "rq-deadline") == before + 10  # written once
            # Still owing: the next call waits before anything is done for it.
            with pytest.raises(grpc.RpcError) as late:
                stub.ProduceRecords(_records_call("rq-deadline", 100), timeout=2)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _end_offset(env, "rq-deadline") == before + 10  # nothing of it was written
    finally:
        env.quota("User:CN=deadline")


def test_a_throttled_storage_produce_is_answered_within_its_deadline(env: Env) -> None:
    """The storage service's unary Produce shares the hold: bounded by the deadline too."""
    _topic(env, "rq-storage")
    who = env.ca.issue("storage")
    env.quota("User:CN=storage", produce_bytes_per_second=2_000)
    env.acls(allow("User:CN=storage", WRITE, TOPIC, "rq-storage"))

    def request(size: int) -> storage_pb2.ProduceRequest:
        req = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        req.topics.add(topic="rq-storage").partitions.add(
            partition=0,
            records=encode_batch([b"s" * 1000] * (size // 1000)),
            current_leader_epoch=-1,
        )
        return req

    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            node = c.storage(env.bootstrap)

            def throttled() -> bool:
                try:
                    return node.Produce(request(5_000), timeout=30).throttle_time_ms > 0
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                        raise
                    return False

            wait_for(throttled, timeout=30, what="the quota applied by the node")
            before = _end_offset(env, "rq-storage")
            resp = node.Produce(request(40_000), timeout=6)  # ~20 s ahead
            assert resp.topics[0].partitions[0].error_code == 0
            assert resp.throttle_time_ms > 0
            assert _end_offset(env, "rq-storage") == before + 40
    finally:
        env.quota("User:CN=storage")


def _subscriber(env: Env, name: str, topic: str, rate: int, group: str = "") -> Pem:
    """A principal allowed to READ ``topic`` (and ``group``) with a fetch quota of
    ``rate``."""
    who = env.ca.issue(name)
    env.quota(f"User:CN={name}", fetch_bytes_per_second=rate)
    acls = [allow(f"User:CN={name}", READ, TOPIC, topic)]
    if group:
        acls.append(allow(f"User:CN={name}", READ, GROUP, group))
    env.acls(*acls)
    return who


def _open(stub: Any, request: records_pb2.SubscribeRequest) -> tuple[Any, Any]:
    """The stream and its first message, once the caller's READ has reached the node."""

    def opened() -> tuple[Any, Any] | None:
        stream = stub.Subscribe(request, timeout=120)
        try:
            return stream, next(stream)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return None

    return wait_for(opened, timeout=30, what="the READ ACL applied by the node")


def test_a_quota_held_subscription_ends_soon_after_its_read_is_removed(env: Env) -> None:
    """Found from outside: the READ check ran before the quota's waits, and the message was
    written after them without another, so a revoked reader got records seconds to minutes
    later. The hold now ends on a revocation, and the right is checked again before the
    write: the stream ends PERMISSION_DENIED within about two seconds."""
    _topic(env, "rq-revoke")
    _fill(env, "rq-revoke", [b"v" * 40_000])  # ~20 s of a 2,000 B/s fetch quota
    who = _subscriber(env, "revoked", "rq-revoke", 2_000)
    subscribe = records_pb2.SubscribeRequest(
        topics=["rq-revoke"], start=records_pb2.START_POSITION_EARLIEST
    )
    before = _throttled(env, "fetch")
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            stream, first = _open(stub, subscribe)
            assert first.HasField("assignment")
            # The record's message is charged: the node holds the stream for the quota.
            wait_for(lambda: _throttled(env, "fetch") > before, timeout=30, what="a hold")
            _revoke(env, "User:CN=revoked", "rq-revoke")
            revoked = time.monotonic()
            records = 0
            with pytest.raises(grpc.RpcError) as refused:
                for message in stream:
                    records += message.HasField("records")
            took = time.monotonic() - revoked
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The node applies an ACL change within a second and checks every second: not the
        # ~20 s the hold had left (a generous bound for a loaded machine).
        assert took < 10, took
        assert records == 0  # the held message was never written
    finally:
        env.quota("User:CN=revoked")


def test_a_quota_held_group_stream_is_not_a_stalled_reader(env: Env) -> None:
    """Found from outside: while the node held a group stream's messages for its caller's
    fetch quota, the stall timer kept counting, and the stream was ended ABORTED as a
    stalled reader (leaving its group) though its reader took every message at once. Held
    time no longer counts; and each message says how long it was held."""
    _topic(env, "rq-stall")
    _fill(env, "rq-stall", [b"w" * 8_000] * 8)  # each ~4 s of a 2,000 B/s quota
    who = _subscriber(env, "stalled", "rq-stall", 2_000, group="rq-stall-group")
    subscribe = records_pb2.SubscribeRequest(
        group_id="rq-stall-group",
        topics=["rq-stall"],
        start=records_pb2.START_POSITION_EARLIEST,
        max_records_per_message=1,
    )
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            stream, _ = _open(stub, subscribe)
            messages = []
            for message in stream:  # read at once: the reader never stalls
                if message.HasField("records"):
                    messages.append(message)
                else:  # the group never took the partition away
                    assert [tp.partitions for tp in message.assignment.partitions] == [[0]]
                if len(messages) == 4:  # each held longer than the node's stall bound
                    break
            stream.cancel()
        held = [m.throttle_time_ms for m in messages]
        assert all(ms > 0 for ms in held), held
        assert sum(held) > 2 * STALL_S * 1000, held
    finally:
        env.quota("User:CN=stalled")


def test_a_subscribe_message_carries_at_most_the_quota_window(env: Env) -> None:
    """A Fetch answer reads at most 10 s of its caller's fetch rate (fetch_limit); a
    Subscribe message had no such bound (found from outside: one message could carry
    hundreds of seconds of debt). It has now; the message says how long it was held."""
    from strom.security.quotas import FETCH_WINDOW_S

    rate = 5_000
    _topic(env, "rq-cap")
    _fill(env, "rq-cap", [b"c" * 1_000] * 150)  # 3x the window
    who = _subscriber(env, "capped", "rq-cap", rate)
    subscribe = records_pb2.SubscribeRequest(
        topics=["rq-cap"], start=records_pb2.START_POSITION_EARLIEST
    )
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            stream, _ = _open(stub, subscribe)
            message = next(m for m in stream if m.HasField("records"))
            stream.cancel()
        size = sum(len(v) for v in message.records.records.values)
        assert 0 < size <= rate * FETCH_WINDOW_S, size  # not the 150 KB the topic has
        assert message.throttle_time_ms > 0
    finally:
        env.quota("User:CN=capped")


def test_concurrent_produce_records_calls_do_not_slip_past_the_quota(env: Env) -> None:
    """Found from outside: charged after the write, concurrent calls of a principal owing
    nothing all passed (14 x 8 MiB at 10 KB/s written within 35 s). A call is charged as it
    is served, before the write: the others wait for the debt it made, and here time out
    with nothing written."""
    _topic(env, "rq-burst")
    who = env.ca.issue("burst")
    env.quota("User:CN=burst", produce_bytes_per_second=2_000)
    env.acls(allow("User:CN=burst", WRITE, TOPIC, "rq-burst"))
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            _until_throttled(env, stub, "rq-burst")
            before = _end_offset(env, "rq-burst")
            # Each ~15 s of the quota: after the first, the others wait beyond their deadline.
            calls: list[Future[Any]] = [
                stub.ProduceRecords.future(_records_call("rq-burst", 30_000, 5), timeout=10)
                for _ in range(4)
            ]
            ok = 0
            for call in calls:
                try:
                    ok += call.result().error_code == 0
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
        assert ok == 1
        assert _end_offset(env, "rq-burst") == before + 5 * ok  # only what was answered
    finally:
        env.quota("User:CN=burst")


def _storage_produce(topic: str, size: int) -> storage_pb2.ProduceRequest:
    """A storage Produce of ``size // 1000`` records of 1,000 bytes to partition 0."""
    req = storage_pb2.ProduceRequest(acks=1, timeout_ms=5000)
    req.topics.add(topic=topic).partitions.add(
        partition=0, records=encode_batch([b"s" * 1000] * (size // 1000)), current_leader_epoch=-1
    )
    return req


def _until_produce_throttled(node: Any, topic: str) -> None:
    """Send small storage Produce calls (5 KB, above the one-second burst) until the
    principal's quota and ACL have reached the node: a call the node held (so it owes
    nothing after it)."""

    def throttled() -> bool:
        try:
            return node.Produce(_storage_produce(topic, 5_000), timeout=30).throttle_time_ms > 0
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:  # the ACL not there yet
                raise
            return False

    wait_for(throttled, timeout=30, what="the quota applied by the node")


@pytest.mark.parametrize("stream", [False, True], ids=["Produce", "ProduceStream"])
def test_concurrent_storage_produce_requests_do_not_slip_past_the_quota(
    env: Env, stream: bool
) -> None:
    """Found from outside: the storage service's Produce and ProduceStream charged the
    quota after the append, so concurrent requests of a principal owing nothing all passed
    the wait and were appended at once (only their answers were held). Each is charged
    now as it is served, before the append, as ProduceRecords is: the others wait for the
    debt it made, and here reach their deadline with nothing appended."""
    name = "stream" if stream else "unary"
    topic = f"rq-storage-burst-{name}"
    _topic(env, topic)
    who = env.ca.issue(f"storage-burst-{name}")
    env.quota(f"User:CN=storage-burst-{name}", produce_bytes_per_second=2_000)
    env.acls(allow(f"User:CN=storage-burst-{name}", WRITE, TOPIC, topic))
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            node = c.storage(env.bootstrap)
            _until_produce_throttled(node, topic)
            before = _end_offset(env, topic)
            # Each 80 records, ~40 s of the quota (and above the size a node appends
            # without leaving its event loop, so the requests are served side by side):
            # after the first, the others wait beyond the 10 s deadline, or are refused at
            # once once the principal owes (its share of the in-flight budget).
            requests = [_storage_produce(topic, 80_000) for _ in range(4)]
            answers: list[storage_pb2.ProduceResponse] = []
            late = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
            if stream:
                with pytest.raises(grpc.RpcError) as ended:
                    for answer in node.ProduceStream(iter(requests), timeout=10):
                        answers.append(answer)
                assert ended.value.code() in late, ended.value
            else:
                calls: list[Future[Any]] = [node.Produce.future(r, timeout=10) for r in requests]
                for call in calls:
                    try:
                        answers.append(call.result())
                    except grpc.RpcError as exc:
                        assert exc.code() in late, exc
        assert len(answers) == 1, answers  # on the old code: all 4 appended and answered
        assert answers[0].topics[0].partitions[0].error_code == 0
        assert answers[0].throttle_time_ms > 0  # held (within the deadline)
        assert _end_offset(env, topic) == before + 80  # only what was answered
    finally:
        env.quota(f"User:CN=storage-burst-{name}")


def test_produce_records_calls_waiting_out_a_debt_are_shed_beyond_their_share(
    env: Env,
) -> None:
    """Found from outside: ProduceRecords took no part in the node's produce admission, so
    a principal's calls waiting out its debt all held their bytes until their deadlines.
    They may now hold at most a quarter of the node's in-flight budget; the calls beyond it
    are refused RESOURCE_EXHAUSTED at once, with nothing written."""
    _topic(env, "rq-shed")
    who = env.ca.issue("owing")
    env.quota("User:CN=owing", produce_bytes_per_second=1_000)
    env.acls(allow("User:CN=owing", WRITE, TOPIC, "rq-shed"))
    size = BUDGET // 10  # two waiting fit in a quarter of the budget, a third does not
    node = env.cluster.nodes[0]  # type: ignore[union-attr]
    try:
        with ClusterClient(env.bootstrap, security=env.security(who)) as c:
            stub = records_pb2_grpc.RecordServiceStub(c.channel(env.bootstrap))
            _until_throttled(env, stub, "rq-shed")
            before = _end_offset(env, "rq-shed")
            shed_before = member_metric(node, "strom_storage_produce_shed_total")
            # The first is served and charged (~40 s ahead), the next two wait out its debt
            # (past their deadline: nothing written), the others are refused at once.
            calls: list[Future[Any]] = [
                stub.ProduceRecords.future(_records_call("rq-shed", size), timeout=4)
                for _ in range(6)
            ]
            codes = []
            for call in calls:
                try:
                    codes.append((grpc.StatusCode.OK, call.result().error_code, ""))
                except grpc.RpcError as exc:
                    codes.append((exc.code(), 0, exc.details() or ""))
        shed = [d for code, _, d in codes if code == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert len(shed) >= 3, codes
        assert all("User:CN=owing is over its produce quota" in d for d in shed), shed
        # Counted as shed, and the counter's help says it counts ProduceRecords too (it
        # said "Produce requests" only).
        assert member_metric(node, "strom_storage_produce_shed_total") == shed_before + len(shed)
        assert "ProduceRecords" in _help(node, "strom_storage_produce_shed_total")
        written = sum(1 for code, err, _ in codes if code == grpc.StatusCode.OK and err == 0)
        assert _end_offset(env, "rq-shed") == before + written
    finally:
        env.quota("User:CN=owing")
