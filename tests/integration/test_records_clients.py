"""RecordService as an outside reviewer's Node.js (@grpc/grpc-js) client found it, against a
local cluster of real processes: keepalive on long streams, records above gRPC's default
receive limit, partitions added while a stream reads a topic, ProduceRecords' deadline, the
README's Node.js snippet, topic names and reflection.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from strom.api import common_pb2, records_pb2, records_pb2_grpc
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode
from tests.conftest import member_metric
from tests.integration.node_client import NODE_DIR, NodeProgram, node_binary

pytestmark = pytest.mark.integration
rp = records_pb2
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(three_node_cluster: LocalCluster) -> LocalCluster:
    return three_node_cluster


def _produce(address: str, **kw: Any) -> rp.ProduceRecordsResponse:
    """ProduceRecords, retried while the node does not know the topic yet (retriable)."""
    req = rp.ProduceRecordsRequest(**kw)
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = records_pb2_grpc.RecordServiceStub(ch)
        return wait_for(
            lambda: (
                (r := stub.ProduceRecords(req, timeout=30)).error_code
                != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                and r
            ),
            timeout=15,
            what=f"ProduceRecords to {req.topic}",
        )


def _records(lines: list[dict[str, Any]], partition: int | None = None) -> list[dict[str, Any]]:
    return [
        x
        for x in lines
        if x.get("event") == "records" and (partition is None or x["partition"] == partition)
    ]


def _assignments(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if x.get("event") == "assignment"]


def _ended(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if x.get("event") == "ended"]


def _readme_node_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```js\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 1, "the README has one Node.js snippet"
    return blocks[0]


def test_an_idle_stream_of_a_client_with_keepalive_lives_on(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """Found from outside: a client pinging every 10 s (grpc.keepalive_time_ms=10000, how a
    client notices a hung node) lost its idle Subscribe after ~40 s with RESOURCE_EXHAUSTED
    "Bandwidth exhausted": the servers kept gRPC's default of one ping per 5 minutes without
    data. The stream lives past that point, and still delivers."""
    topic = new_topic(cluster, 1, 1)
    args = ["--address", cluster.nodes[0].address, "--topic", topic, "--start", "latest"]
    with NodeProgram(
        "subscribe_stream.js", *args, "--keepalive-ms", "10000", log_dir=tmp_path
    ) as prog:
        prog.wait_for(_assignments, 60, "the first assignment")
        ended = None
        # time is the behaviour: the stream must outlive gRPC's ping policy (the old one died
        # at ~40 s); no event stands for "not ended", so this wait runs out to pass.
        with contextlib.suppress(AssertionError):  # not ended within 55 s: what must happen
            ended = prog.wait_for(_ended, 55, "the stream's end")
        assert ended is None, f"the idle stream ended: {ended}"
        assert prog.proc.poll() is None, f"the client exited: {prog.lines[-5:]}"
        _produce(cluster.nodes[1].address, topic=topic, records=rp.RecordColumns(values=[b"x"]))
        prog.wait_for(_records, 30, "the record produced after the idle minute")
        assert not _ended(prog.lines), prog.lines


def test_the_node_notices_a_subscriber_that_hangs(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """The node's own keepalive pings (by default every 30 s on a quiet connection, 20 s to
    answer; here 2 s and 2 s, through the flags): a reader that stops answering (SIGSTOP: its
    kernel still holds the TCP connection open) loses its stream within a few seconds past
    them, instead of holding it (and in a group, its partitions) for ever. The client sets no
    keepalive itself."""
    fast = ["--keepalive-time-ms", "2000", "--keepalive-timeout-ms", "2000"]
    cluster = make_cluster(nodes=1, controllers=1, coordinators=0, node_args=fast)
    topic = new_topic(cluster, 1, 1)
    node = cluster.nodes[0]
    gauge = "strom_storage_records_subscriptions"
    before = member_metric(node, gauge, kind="partitions")
    args = ["--address", node.address, "--topic", topic, "--start", "latest"]
    with NodeProgram("subscribe_stream.js", *args, log_dir=tmp_path) as prog:
        prog.wait_for(_assignments, 60, "the first assignment")
        assert member_metric(node, gauge, kind="partitions") == before + 1
        prog.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(
                lambda: member_metric(node, gauge, kind="partitions") == before,
                timeout=60,
                what="the node to end the stream of a reader that hangs",
            )
        finally:
            prog.proc.send_signal(signal.SIGCONT)


def test_a_record_above_4_mib_reaches_a_reader_with_the_documented_receive_limit(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """Found from outside: one record above 4 MiB (topics take 16 MiB) failed every default
    reader's stream with RESOURCE_EXHAUSTED "Received message larger than max", at the same
    offset on every resubscribe. A record is never split, so the documented rule is the fix:
    readers set grpc.max_receive_message_length to -1 (or the topics' max.message.bytes), as
    the README's snippet and the docs' example now do. With it the record arrives whole; the
    default still fails as the Subscribe error table says."""
    snippet = _readme_node_snippet()
    example = (NODE_DIR / "example.js").read_text()
    for code in (snippet, example):
        assert "'grpc.max_receive_message_length': -1" in code
        assert "'grpc.keepalive_time_ms': 10000" in code
    topic = new_topic(cluster, 1, 1)
    big = 5 << 20
    resp = _produce(
        cluster.nodes[1].address,
        topic=topic,
        records=rp.RecordColumns(values=[b"small", b"b" * big, b"after"]),
    )
    assert resp.results[0].error_code == ErrorCode.NONE, resp
    args = ["--address", cluster.nodes[0].address, "--topic", topic, "--start", "earliest"]
    with NodeProgram("subscribe_stream.js", *args, "--max-receive", "-1", log_dir=tmp_path) as prog:
        got = prog.wait_for(
            lambda ls: [s for x in _records(ls) for s in x["sizes"]][:3] == [5, big, 5],
            60,
            "the three records, the big one whole",
        )
        assert got and not _ended(prog.lines), prog.lines
    with NodeProgram("subscribe_stream.js", *args, log_dir=tmp_path) as prog:
        (end,) = prog.wait_for(_ended, 60, "the default reader's stream end")
        assert end["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], end
        assert "larger than max" in end["details"], end


def test_a_stream_of_a_whole_topic_reads_partitions_added_later(
    cluster: LocalCluster, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """Found from outside: Subscribe by ``topics`` without a group kept the partitions of its
    start (records.proto says it "reads every partition of each topic"): after
    ``strom topics add-partitions`` its assignment stayed [0] for 75 s and the new partition's
    records never came. It sends the new assignment and reads them from their first."""
    topic = new_topic(cluster, 1, 1)
    args = ["--address", cluster.nodes[0].address, "--topic", topic, "--start", "latest"]
    with NodeProgram("subscribe_stream.js", *args, log_dir=tmp_path) as prog:
        prog.wait_for(_assignments, 60, "the first assignment")
        with Admin(cluster.bootstrap) as admin:
            admin.create_partitions(topic, 3)
        # Written before the stream can have noticed: read all the same (from the earliest).
        resp = _produce(
            cluster.nodes[1].address,
            topic=topic,
            partition=2,
            records=rp.RecordColumns(values=[b"a", b"b"]),
        )
        assert resp.results[0].error_code == ErrorCode.NONE, resp
        prog.wait_for(
            lambda ls: [x for x in ls if x.get("partitions") == [0, 1, 2]],
            60,
            "an assignment with the new partitions",
        )
        got = prog.wait_for(lambda ls: _records(ls, 2), 60, "records of partition 2")
        assert got[0]["offsets"][:2] == [0, 1], got
        assert not _ended(prog.lines), prog.lines


def test_produce_past_the_callers_deadline_writes_nothing(
    cluster: LocalCluster, new_topic: Callable[..., str]
) -> None:
    """Found from outside: with a partition's only replica down, a ProduceRecords with a 3 s
    gRPC deadline got DEADLINE_EXCEEDED, and the node wrote its records ~8 s later when the
    replica came back (it kept to timeout_ms, 30 s): a caller retrying as the docs say wrote
    them twice. The node's work ends at the caller's deadline; records not handed to a leader
    by then are dropped. A marker sent through the same node after the replica is back (the
    node sends a partition's calls in order) lands at offset 0: nothing was written before."""
    topic = new_topic(cluster, 1, 1)
    with ClusterClient(cluster.bootstrap, retry_s=10) as client:
        leader_addr = client.leader_of(topic, 0)
    leader = next(n for n in cluster.nodes if n.address == leader_addr)
    other = next(n for n in cluster.nodes if n is not leader)
    _produce(other.address, topic=topic, partition=0, records=rp.RecordColumns(values=[b"warm"]))
    assert leader.process is not None
    leader.process.stop()
    try:
        with grpc.insecure_channel(other.address) as ch:
            stub = records_pb2_grpc.RecordServiceStub(ch)
            req = rp.ProduceRecordsRequest(
                topic=topic, partition=0, records=rp.RecordColumns(values=[b"late"])
            )
            # The node's work ends at the deadline it was given, which it learns a little
            # after the caller set it: it may answer first, with REQUEST_TIMED_OUT, or with
            # LEADER_NOT_AVAILABLE once the controller has marked the only replica's
            # partition offline (CI saw both), or the caller's deadline fires first.
            try:
                answer = stub.ProduceRecords(req, timeout=3)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
            else:
                codes = [r.error_code for r in answer.results]
                assert codes in (
                    [ErrorCode.REQUEST_TIMED_OUT],
                    [ErrorCode.LEADER_NOT_AVAILABLE],
                ), answer
    finally:
        cluster.restart(leader)
    resp = _produce(
        other.address, topic=topic, partition=0, records=rp.RecordColumns(values=[b"marker"])
    )
    assert resp.results[0].error_code == ErrorCode.NONE, resp
    assert list(resp.offsets) == [1], resp  # "warm" at 0, nothing of the late call


def test_the_readme_node_snippet_reports_a_failed_produce_and_a_stream_end(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Found from outside: the README's snippet printed a ProduceRecords refused with
    UNKNOWN_TOPIC_OR_PARTITION as a success (``err`` is null: the error is in the answer),
    and crashed on the Subscribe stream's 'error' event. Run as a user runs it (from the
    repository, the protos under ``protos``) against a real cluster, on a topic that does not
    exist: both failures are reported, and the process is not killed."""
    snippet = _readme_node_snippet()
    assert snippet.count("'127.0.0.1:9092'") == 1 and snippet.count("'clicks'") == 2
    missing = f"readme-missing-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "readme_snippet.js"
    script.write_text(
        snippet.replace("'127.0.0.1:9092'", repr(cluster.nodes[0].address)).replace(
            "'clicks'", repr(missing)
        )
    )
    proc = subprocess.run(
        [node_binary(), str(script)],
        cwd=ROOT,
        env={**os.environ, "NODE_PATH": str(NODE_DIR / "node_modules")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out  # not killed by an unhandled 'error' event
    assert f"produce failed: UNKNOWN_TOPIC_OR_PARTITION: unknown topic '{missing}'" in out, out
    assert "subscribe ended: NOT_FOUND" in out, out
    assert "[] []" not in out, out  # no empty "success"


def test_a_malformed_topic_name_is_invalid_topic_not_a_retriable_unknown(
    cluster: LocalCluster,
) -> None:
    """Found from outside: ProduceRecords to ``bad/name*`` answered UNKNOWN_TOPIC_OR_PARTITION
    (retriable: callers retry it as a topic created a moment ago) and Subscribe NOT_FOUND,
    though no topic can have that name. Kafka answers INVALID_TOPIC_EXCEPTION; so do these."""
    with grpc.insecure_channel(cluster.nodes[0].address) as ch:
        stub = records_pb2_grpc.RecordServiceStub(ch)
        resp = stub.ProduceRecords(
            rp.ProduceRecordsRequest(topic="bad/name*", records=rp.RecordColumns(values=[b"x"])),
            timeout=30,
        )
        assert resp.error_code == ErrorCode.INVALID_TOPIC, resp
        assert "'bad/name*' contains invalid characters '/*'" in resp.error_message
        assert not resp.results
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stub.Subscribe(rp.SubscribeRequest(topics=["ok", "bad/name*"]), timeout=30)))
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err  # type: ignore[attr-defined]
    assert "'bad/name*' contains invalid characters" in err.details()  # type: ignore[attr-defined]
    raw = dict(err.trailing_metadata() or ())["strom-error-bin"]  # type: ignore[attr-defined]
    assert common_pb2.Error.FromString(raw).code == ErrorCode.INVALID_TOPIC


def test_reflection_answers_as_v1_too(cluster: LocalCluster) -> None:
    """Reflection clients that ask only ``grpc.reflection.v1`` (the stable name; grpcio-
    reflection serves v1alpha alone) find RecordService on a node."""
    with grpc.insecure_channel(cluster.nodes[0].address) as ch:
        info = ch.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        answers = info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        names = {s.name for a in answers for s in a.list_services_response.service}
    assert {"strom.v1.RecordService", "grpc.reflection.v1.ServerReflection"} <= names
