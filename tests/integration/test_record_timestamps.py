"""Record timestamps on a local cluster of real processes (an outside reviewer's findings):

- ``message.timestamp.before.max.ms`` applies to every record of a batch, not only to its
  first: the Python producer's ``send(now); send(old)`` (one batch) and a ProduceRecords call
  with timestamps ``[now, old]`` were accepted;
- consumers see what a record's timestamp is (Kafka's ``timestampType``): ``Record``'s
  ``timestamp_type``, ``poll_arrow()``'s ``timestamp_type`` column and Subscribe's
  ``records.timestamp_types`` (read by the Node.js client), on a CreateTime and a
  LogAppendTime topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from strom import Consumer, Producer, TimestampType, TopicPartition
from strom.api import records_pb2, records_pb2_grpc
from strom.client.partitioner import partition_for_key
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import ErrorCode, InvalidTimestampError
from tests.integration.node_client import NodeProgram

pytestmark = pytest.mark.integration
rp = records_pb2
DAY_MS = 86_400_000
OLD = 1_000  # 1970: far older than a day


@pytest.fixture(scope="module")
def cluster(one_node_cluster: LocalCluster) -> LocalCluster:
    return one_node_cluster


@pytest.fixture(scope="module")
def stub(cluster: LocalCluster) -> Iterator[records_pb2_grpc.RecordServiceStub]:
    with grpc.insecure_channel(cluster.nodes[0].address) as ch:
        yield records_pb2_grpc.RecordServiceStub(ch)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def produce(stub: Any, **kw: Any) -> rp.ProduceRecordsResponse:
    """ProduceRecords, retried while the node does not know the topic yet (retriable)."""
    req = rp.ProduceRecordsRequest(**kw)
    return wait_for(
        lambda: (
            (r := stub.ProduceRecords(req, timeout=30)).error_code
            != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            and r
        ),
        timeout=15,
        what=f"ProduceRecords to {req.topic}",
    )


def read_all(cluster: LocalCluster, topic: str, n: int) -> list[Any]:
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        out: list[Any] = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            out.extend(c.poll(timeout_ms=1000))
    assert len(out) == n, f"read {len(out)} of {n} records of {topic}"
    return out


# -- message.timestamp.before.max.ms on every record ------------------------------------------


def test_the_producer_s_old_record_after_a_new_one_is_refused(
    cluster: LocalCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(cluster, config={"message.timestamp.before.max.ms": str(DAY_MS)})
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
        first = producer.send(topic, b"a", timestamp_ms=now_ms())
        second = producer.send(topic, b"b", timestamp_ms=OLD)  # same batch: caller's order
        producer.flush(timeout=60)
        for fut in (first, second):
            with pytest.raises(InvalidTimestampError) as err:
                fut.result(timeout=30)
            msg = str(err.value)
            assert f"offset delta 1 has timestamp {OLD}" in msg, msg
            assert f"message.timestamp.before.max.ms={DAY_MS}" in msg, msg
        fut = producer.send(topic, b"c")
        producer.flush(timeout=60)
        ok = fut.result(timeout=30)
    assert ok.offset == 0  # nothing of the refused batch was appended
    assert [r.value for r in read_all(cluster, topic, 1)] == [b"c"]


def test_produce_records_with_an_old_record_after_a_new_one_is_refused(
    cluster: LocalCluster, stub: Any, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(cluster, config={"message.timestamp.before.max.ms": str(DAY_MS)})
    now = now_ms()
    for stamps in ([now, OLD], [now, now - 3 * DAY_MS], [OLD]):
        resp = produce(
            stub,
            topic=topic,
            partition=0,
            records=rp.RecordColumns(values=[b"v"] * len(stamps), timestamps=stamps),
        )
        (result,) = resp.results
        assert result.error_code == ErrorCode.INVALID_TIMESTAMP, resp
        assert f"record {len(stamps) - 1} of the call has timestamp {stamps[-1]}" in (
            result.error_message
        ), resp
        assert list(resp.offsets) == [-1] * len(stamps)
    resp = produce(
        stub, topic=topic, partition=0, records=rp.RecordColumns(values=[b"ok"], timestamps=[now])
    )
    assert resp.results[0].error_code == 0 and list(resp.offsets) == [0]  # nothing before it
    assert [r.value for r in read_all(cluster, topic, 1)] == [b"ok"]


def test_only_the_partition_with_the_old_record_is_refused(
    cluster: LocalCluster, stub: Any, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(cluster, 2, config={"message.timestamp.before.max.ms": str(DAY_MS)})
    keys = [
        next(k for i in range(100) if partition_for_key(k := b"k%d" % i, 2) == p) for p in (0, 1)
    ]
    resp = produce(
        stub,
        topic=topic,
        records=rp.RecordColumns(keys=keys, values=[b"old", b"new"], timestamps=[OLD, now_ms()]),
    )
    by_partition = {r.partition: r for r in resp.results}
    assert by_partition[0].error_code == ErrorCode.INVALID_TIMESTAMP, resp
    assert by_partition[0].error_message.startswith(f"{topic}-0: record 0 of the call"), resp
    assert by_partition[1].error_code == 0 and list(resp.offsets) == [-1, 0], resp


def test_a_topic_without_a_before_limit_takes_old_records(
    cluster: LocalCluster, stub: Any, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(cluster)
    resp = produce(
        stub,
        topic=topic,
        partition=0,
        records=rp.RecordColumns(values=[b"a", b"b"], timestamps=[now_ms(), OLD]),
    )
    assert resp.results[0].error_code == 0 and list(resp.offsets) == [0, 1]
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
        futs = [producer.send(topic, v, timestamp_ms=t) for v, t in ((b"c", now_ms()), (b"d", OLD))]
        producer.flush(timeout=60)
        assert [f.result(timeout=30).offset for f in futs] == [2, 3]
    assert [r.timestamp for r in read_all(cluster, topic, 4)][1::2] == [OLD, OLD]


# -- timestamp types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [("CreateTime", TimestampType.CREATE_TIME), ("LogAppendTime", TimestampType.LOG_APPEND_TIME)],
)
def test_consumers_see_the_timestamp_type(
    cluster: LocalCluster,
    new_topic: Callable[..., str],
    tmp_path: Path,
    config: str,
    expected: TimestampType,
) -> None:
    topic = new_topic(cluster, config={"message.timestamp.type": config})
    with Producer(cluster.bootstrap) as producer:
        for v in (b"a", b"b", b"c"):
            producer.send(topic, v, timestamp_ms=OLD).result(timeout=30)
    tp = TopicPartition(topic, 0)

    recs = read_all(cluster, topic, 3)
    assert [r.timestamp_type for r in recs] == [expected] * 3
    assert all((r.timestamp == OLD) == (expected == TimestampType.CREATE_TIME) for r in recs)

    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        tables: list[pa.Table] = []
        wait_for(
            lambda: (
                tables.append(c.poll_arrow(timeout_ms=1000)) or sum(t.num_rows for t in tables) >= 3
            ),
            timeout=30,
            what="poll_arrow to return the 3 records",
        )
    table = pa.concat_tables(tables)
    assert table.column("timestamp_type").to_pylist() == [int(expected)] * 3

    args = ["--address", cluster.nodes[0].address, "--topic", topic, "--start", "earliest"]
    with NodeProgram("subscribe_stream.js", *args, log_dir=tmp_path) as prog:
        got = prog.wait_for(
            lambda lines: (
                len(
                    types := [
                        t for x in lines if x["event"] == "records" for t in x["timestampTypes"]
                    ]
                )
                >= 3
                and types
            ),
            60,
            "Subscribe to stream the 3 records",
        )
        prog.send("stop")
    name = "TIMESTAMP_TYPE_CREATE_TIME" if expected == 0 else "TIMESTAMP_TYPE_LOG_APPEND_TIME"
    assert got == [name] * 3
