"""The connector's pure parts: options, schema, range planning, filter pushdown, the Arrow
conversion, and the stream reader's offset logic (with a fake cluster view: no I/O here)."""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Mapping

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from strom.api import storage_pb2
from strom.client.types import TopicPartition
from strom.errors import UnknownTopicOrPartitionError
from strom.record import decode_batches, encode_batch
from strom.record.schema import HEADERS_TYPE
from strom_spark import source
from strom_spark.arrow import to_spark_batch
from strom_spark.errors import DataLossError, OptionError, StromSparkError
from strom_spark.lookup import ClusterView
from strom_spark.options import (
    ReadOptions,
    offsets_from_json,
    offsets_json,
    parse_duration_ms,
    parse_read_options,
    parse_write_options,
)
from strom_spark.planning import OffsetRange, push_filters, rate_limit, split_ranges
from strom_spark.schema import arrow_schema, spark_schema
from strom_spark.source import RangePartition, StromBatchReader, StromStreamReader
from strom_spark.txn import Slot

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
T2 = TopicPartition("t", 2)
BOOT = {"bootstrap": "127.0.0.1:9092"}


# -- schema ------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [False, True])
def test_arrow_schema_is_what_pyspark_derives(headers: bool) -> None:
    assert arrow_schema(headers).equals(to_arrow_schema(spark_schema(headers), timezone="UTC"))
    names = [f.name for f in spark_schema(headers).fields]
    kafka = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert names == kafka + (["headers"] if headers else [])


# -- options ----------------------------------------------------------------------------------


def test_read_options_parse_kafka_names_case_insensitively() -> None:
    o = parse_read_options(
        {
            "BOOTSTRAP": "h1:1,h2:2",
            "subscribe": "a, b,a",
            "startingOffsets": '{"a": {"0": 5, "1": -2}, "b": {"0": -2}}',
            "endingoffsets": "latest",
            "minPartitions": "4",
            "maxRecordsPerPartition": "100",
            "failOnDataLoss": "FALSE",
            "includeHeaders": "true",
            "kafka.max.partition.fetch.bytes": "65536",
        },
        streaming=False,
    )
    assert o.bootstrap == ("h1:1", "h2:2")
    assert o.subscription.kind == "subscribe" and o.subscription.topics == ("a", "b")
    assert o.starting.kind == "offsets"
    assert o.starting.mapping == {
        TopicPartition("a", 0): 5,
        TopicPartition("a", 1): -2,
        TopicPartition("b", 0): -2,
    }
    assert o.ending.kind == "latest"
    assert (o.min_partitions, o.max_records_per_partition) == (4, 100)
    assert o.fail_on_data_loss is False and o.include_headers is True
    assert o.max_partition_fetch_bytes == 65536
    s = parse_read_options({**BOOT, "assign": '{"t": [0, 2]}'}, streaming=True)
    assert s.subscription.partitions == (T0, T2)
    assert s.starting.kind == "latest"  # a stream starts at the end by default
    assert parse_read_options({**BOOT, "subscribe": "t"}, streaming=False).starting.kind == (
        "earliest"
    )
    k = parse_read_options(
        {"kafka.bootstrap.servers": "h:1", "subscribePattern": "t.*"}, streaming=True
    )
    assert k.bootstrap == ("h:1",) and k.subscription.pattern == "t.*"


def test_timestamp_options_take_precedence_as_in_kafka() -> None:
    o = parse_read_options(
        {
            **BOOT,
            "subscribe": "t",
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"t": {"0": 1000}}',
            "startingTimestamp": "2000",
            "endingOffsetsByTimestamp": '{"t": {"0": 3000}}',
        },
        streaming=False,
    )
    assert (o.starting.kind, o.starting.timestamp) == ("timestamp", 2000)
    assert o.ending.kind == "timestamps" and o.ending.mapping == {T0: 3000}


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "t"}, False, "option bootstrap is required"),
        ({**BOOT}, False, "exactly one of the options subscribe"),
        ({**BOOT, "subscribe": "t", "assign": '{"t": [0]}'}, False, "got subscribe, assign"),
        ({**BOOT, "subscribe": " , "}, False, "subscribe names no topic"),
        ({**BOOT, "subscribePattern": "("}, False, "not a valid regular expression"),
        ({**BOOT, "assign": "[0]"}, False, "assign must be JSON"),
        ({**BOOT, "assign": '{"t": ["x"]}'}, False, "list of partition numbers"),
        ({**BOOT, "subscribe": "t", "startingOffsets": "latest"}, False, "not valid for a batch"),
        ({**BOOT, "subscribe": "t", "endingOffsets": "earliest"}, False, "not valid for a batch"),
        ({**BOOT, "subscribe": "t", "startingOffsets": "first"}, False, "must be earliest, latest"),
        ({**BOOT, "subscribe": "t", "startingOffsets": "{"}, False, "not valid JSON"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, False, "not a number"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, False, ">= 0, or -2"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, False, "-1 (latest)"),
        ({**BOOT, "subscribe": "t", "endingOffsets": "latest"}, True, "for batch reads"),
        ({**BOOT, "subscribe": "t", "minPartitions": "0"}, False, "minPartitions must be >= 1"),
        ({**BOOT, "subscribe": "t", "minPartitions": "two"}, False, "must be an integer"),
        ({**BOOT, "subscribe": "t", "failOnDataLoss": "yes"}, False, "must be true or false"),
        ({**BOOT, "subscribe": "t", "maxTriggerDelay": "soon"}, True, "must be a duration"),
        ({**BOOT, "subscribe": "t", "startingTimestamp": "-5"}, False, "must be >= 0"),
        (
            {**BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "9"},
            True,
            "larger than maxOffsetsPerTrigger",
        ),
        ({**BOOT, "subscribe": "t", "startingOffset": "earliest"}, False, "unknown strom read"),
        ({"bootstrap": "nohost", "subscribe": "t"}, False, "is not HOST:PORT"),
        (
            {"bootstrap": "h:1", "kafka.bootstrap.servers": "h:2", "subscribe": "t"},
            False,
            "given twice",
        ),
    ],
)
def test_bad_read_options_name_the_option(
    options: dict[str, str], streaming: bool, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STROM_BOOTSTRAP", raising=False)
    with pytest.raises(OptionError) as info:
        parse_read_options(options, streaming=streaming)
    assert message in str(info.value)


def test_read_options_are_checked_at_load_in_either_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """``load()`` (the source's ``schema()``) names a bad read option, as Spark's Kafka source
    does, instead of the streaming query failing at start() inside PySpark's own error (found
    from outside); an option valid in one mode passes there (the mode is not known yet), and
    a write's options are left to the writer."""
    monkeypatch.delenv("STROM_BOOTSTRAP", raising=False)
    base = {"bootstrap": "h:1", "subscribe": "t"}
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger must be >= 1, got -5"):
        source.StromDataSource({**base, "maxOffsetsPerTrigger": "-5"}).schema()
    with pytest.raises(OptionError, match="bootstrap is required"):
        source.StromDataSource({"subscribe": "t"}).schema()
    for fine in ({"startingOffsets": "latest"}, {"endingOffsets": "latest"}, {}):
        assert source.StromDataSource({**base, **fine}).schema() == spark_schema(False)
    assert source.StromDataSource({"topic": "out"}).schema() == spark_schema(False)


def test_write_options() -> None:
    w = parse_write_options(
        {**BOOT, "topic": "out", "kafka.acks": "1", "kafka.compression.type": "LZ4"}
    )
    assert (w.topic, w.acks, w.compression) == ("out", "1", "lz4")
    for bad, message in (
        ({**BOOT, "kafka.acks": "2"}, "kafka.acks must be all, 1 or 0"),
        ({**BOOT, "kafka.compression.type": "brotli"}, "must be one of none"),
        ({**BOOT, "subscribe": "t"}, "unknown strom write option 'subscribe'"),
    ):
        with pytest.raises(OptionError, match=message):
            parse_write_options(bad)


def test_exactly_once_options_and_slots() -> None:
    assert parse_write_options(BOOT).exactly_once is False  # at least once unless asked
    w = parse_write_options(
        {
            **BOOT,
            "topic": "out",
            "ExactlyOnce": "TRUE",
            "transactionalIdPrefix": "etl.clicks",
            "kafka.transaction.timeout.ms": "90000",
        }
    )
    assert (w.exactly_once, w.transactional_id_prefix, w.transaction_timeout_ms) == (
        True,
        "etl.clicks",
        90_000,
    )
    slot = Slot.make(w, "q1", 3)
    assert (slot.transactional_id, slot.group) == ("etl.clicks-q1-3", "etl.clicks-q1-3")
    assert slot.key == TopicPartition("out", 0)
    # Without a topic option (a topic column), the offset is kept under __consumer_offsets-0.
    w = parse_write_options({**BOOT, "exactlyOnce": "true"})
    assert Slot.make(w, "q1", 0) == Slot(
        "strom-spark-sink-q1-0", "strom-spark-sink-q1-0", TopicPartition("__consumer_offsets", 0)
    )
    for bad, message in (
        ({**BOOT, "exactlyOnce": "1"}, "exactlyOnce must be true or false"),
        ({**BOOT, "transactionalIdPrefix": "x"}, "only applies with exactlyOnce=true"),
        ({**BOOT, "exactlyOnce": "true", "transactionalIdPrefix": "a/b"}, "1 to 200 characters"),
        ({**BOOT, "exactlyOnce": "true", "kafka.acks": "0"}, "needs kafka.acks=all"),
        ({**BOOT, "kafka.transaction.timeout.ms": "5"}, "must be >= 1000"),
    ):
        with pytest.raises(OptionError, match=message):
            parse_write_options(bad)
    assert parse_read_options({**BOOT, "subscribe": "t"}, streaming=False).read_committed is False
    r = parse_read_options(
        {**BOOT, "subscribe": "t", "kafka.isolation.level": "READ_COMMITTED"}, streaming=True
    )
    assert r.read_committed is True
    with pytest.raises(OptionError, match="must be read_uncommitted or read_committed"):
        parse_read_options(
            {**BOOT, "subscribe": "t", "kafka.isolation.level": "x"}, streaming=False
        )


def test_durations_and_offset_json_round_trip() -> None:
    assert parse_duration_ms("500", "d") == 500
    assert parse_duration_ms("30s", "d") == 30_000
    assert parse_duration_ms("15m", "d") == 900_000
    assert parse_duration_ms("2h", "d") == 7_200_000
    offsets = {T1: 7, T0: 3, TopicPartition("a", 10): 1}
    as_json = offsets_json(offsets)
    assert as_json == {"a": {"10": 1}, "t": {"0": 3, "1": 7}}
    assert offsets_from_json(as_json) == offsets


# -- planning ---------------------------------------------------------------------------------


def test_split_ranges_like_the_kafka_source() -> None:
    big, small, empty = OffsetRange(T0, 0, 1000), OffsetRange(T1, 500, 600), OffsetRange(T2, 5, 5)
    assert split_ranges([big, small, empty]) == [big, small]  # one task per non-empty range
    by_max = split_ranges([big, small], max_records=300)
    assert [(r.tp, r.start, r.end) for r in by_max] == [
        (T0, 0, 250),
        (T0, 250, 500),
        (T0, 500, 750),
        (T0, 750, 1000),
        (T1, 500, 600),
    ]
    by_min = split_ranges([big, small], min_partitions=11)
    assert sum(1 for r in by_min if r.tp == T0) == 10 and sum(r.tp == T1 for r in by_min) == 1
    assert sum(r.size for r in by_min) == 1100
    # contiguous, in order, no overlap
    t0 = [r for r in by_min if r.tp == T0]
    assert all(a.end == b.start for a, b in itertools.pairwise(t0))
    assert split_ranges([OffsetRange(T0, 0, 3)], min_partitions=10) == [
        OffsetRange(T0, 0, 1),
        OffsetRange(T0, 1, 2),
        OffsetRange(T0, 2, 3),
    ]


def test_rate_limit_shares_the_limit_in_proportion() -> None:
    start = {T0: 0, T1: 100}
    latest = {T0: 900, T1: 200, T2: 0}
    assert rate_limit(5000, start, latest) == latest
    limited = rate_limit(100, start, latest)
    assert limited == {T0: 90, T1: 110, T2: 0}
    # a tiny share rounds up so the partition is not starved
    assert rate_limit(10, {T0: 0, T1: 0}, {T0: 1000, T1: 1})[T1] == 1
    # a new partition (missing from start) counts from 0
    assert rate_limit(10, {T0: 0}, {T0: 10, T1: 10}) == {T0: 5, T1: 5}


def test_push_filters_takes_partition_offset_topic_and_narrows_timestamps() -> None:
    ts = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    ts_ms = int(ts.timestamp() * 1000)
    fs = [
        EqualTo(("partition",), 1),
        GreaterThanOrEqual(("offset",), 100),
        LessThan(("offset",), 200),
        LessThanOrEqual(("offset",), 150),
        In(("topic",), ("t", "u")),
        IsNotNull(("offset",)),
        GreaterThan(("timestamp",), ts),
        EqualTo(("key",), b"k"),
        Not(EqualTo(("partition",), 2)),
        StringStartsWith(("topic",), "t"),
    ]
    pushed, rest = push_filters(fs)
    assert rest == [fs[6], fs[7], fs[8], fs[9]]  # timestamp stays with Spark too
    assert rest[0] is fs[6]
    assert pushed.partitions == frozenset({1}) and pushed.topics == frozenset({"t", "u"})
    assert (pushed.offset_lo, pushed.offset_hi) == (100, 151)
    assert pushed.timestamp_lo_ms == ts_ms
    assert pushed.keeps(T1) and not pushed.keeps(T0) and not pushed.keeps(TopicPartition("v", 1))
    assert pushed.narrow(OffsetRange(T1, 0, 1000)) == OffsetRange(T1, 100, 151)
    assert pushed.narrow(OffsetRange(T1, 0, 50)).size == 0
    p2, _ = push_filters([GreaterThan(("partition",), 0), LessThan(("partition",), 2)])
    assert [p2.keeps(tp) for tp in (T0, T1, T2)] == [False, True, False]
    p3, _ = push_filters([EqualTo(("offset",), 5), EqualTo(("offset",), 6)])
    assert p3.impossible and not p3.keeps(T0)


# -- Arrow conversion -------------------------------------------------------------------------


def _batches(*encoded: bytes) -> list:
    return decode_batches(b"".join(encoded))


def test_to_spark_batch_builds_exact_columns_without_python_rows() -> None:
    b1 = encode_batch(
        [b"v0", b"v1", None],
        keys=[b"k0", None, b"k2"],
        # an empty list (as the Spark sink writes an empty array) reads as null
        headers=pa.array([[("h", b"x")], [], [("a", None), ("b", b"y")]], type=HEADERS_TYPE),
        timestamps=[1_000, 999, 1_002],
        base_offset=10,
        compression="zstd",
    )
    b2 = encode_batch(
        [b"w0", b"w1"], base_offset=13, log_append_time=True, now_ms=5_000, timestamps=[1, 2]
    )
    rb = to_spark_batch(_batches(b1, b2), "t", 3, 0, 100, include_headers=True)
    assert rb is not None and rb.schema.equals(arrow_schema(True))
    rows = rb.to_pylist()
    assert [r["offset"] for r in rows] == [10, 11, 12, 13, 14]
    assert [r["value"] for r in rows] == [b"v0", b"v1", None, b"w0", b"w1"]
    assert [r["key"] for r in rows] == [b"k0", None, b"k2", None, None]
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {3}
    us = [r["timestamp"] for r in rows]
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    assert [int((u - epoch).total_seconds() * 1000) for u in us] == [1000, 999, 1002, 2, 2]
    assert [r["timestampType"] for r in rows] == [0, 0, 0, 1, 1]
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert rows[1]["headers"] is None  # as Spark's Kafka source: no headers is null
    assert rows[3]["headers"] is None and rows[4]["headers"] is None
    assert rows[2]["headers"] == [{"key": "a", "value": None}, {"key": "b", "value": b"y"}]
    # the range cuts rows exactly, across batch edges
    cut = to_spark_batch(_batches(b1, b2), "t", 3, 11, 14)
    assert cut is not None and cut.schema.equals(arrow_schema(False))
    assert cut.column("offset").to_pylist() == [11, 12, 13]
    assert to_spark_batch(_batches(b1, b2), "t", 3, 15, 20) is None


def test_timestamps_are_microseconds_for_spark() -> None:
    rb = to_spark_batch(_batches(encode_batch([b"a", b"b"], timestamps=[1, 2])), "t", 0, 0, 10)
    assert rb is not None
    assert rb.column("timestamp").cast(pa.int64()).to_pylist() == [1000, 2000]


def test_a_timestamp_microseconds_cannot_hold_is_null_not_wrapped() -> None:
    """Found from outside: a record stamped 2**62 ms (the cluster and the gRPC API take it
    when the topic allows) was read as 1970-01-01: ms * 1000 wrapped in int64. Spark's
    timestamps are int64 microseconds; such a record's is null, its neighbours' exact."""
    ts = [1_700_000_000_000, 2**62, (2**63 - 1) // 1000]
    rb = to_spark_batch(_batches(encode_batch([b"a"] * 3, timestamps=ts)), "t", 0, 0, 10)
    assert rb is not None
    got = rb.column("timestamp").cast(pa.int64()).to_pylist()
    assert got == [1_700_000_000_000_000, None, (2**63 - 1) // 1000 * 1000]


# -- stream reader offsets (fake view) ---------------------------------------------------------


class FakeView:
    """Stands in for ClusterView: partitions and offsets the test sets. Like the real one, an
    offset lookup fails on a partition without a leader (``leaderless``) or gone from the
    cluster's metadata (``gone``: its topic was deleted)."""

    def __init__(self, latest: dict[TopicPartition, int], earliest: dict | None = None) -> None:
        self.latest_offsets = dict(latest)
        self.earliest_offsets = dict(earliest or {})
        self.leaderless: set[TopicPartition] = set()
        self.gone: set[TopicPartition] = set()

    def partitions(self, sub: object, *, missing_ok: bool = False) -> list[TopicPartition]:
        if self.gone and not missing_ok:
            raise StromSparkError("strom: unknown topic")
        return sorted(set(self.latest_offsets) - self.gone)

    def known(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [tp for tp in tps if tp not in self.gone]

    def ready(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [tp for tp in tps if tp not in self.leaderless | self.gone]

    def _check(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            if tp in self.gone:
                raise StromSparkError(f"LEADER_NOT_AVAILABLE: {tp} is not in the metadata")
            if tp in self.leaderless:
                raise StromSparkError(
                    f"LEADER_NOT_AVAILABLE: {tp.topic}-{tp.partition} has no live leader"
                )

    def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self._check(tps)
        return {tp: self.latest_offsets[tp] for tp in tps}

    def earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self._check(tps)
        return {tp: self.earliest_offsets.get(tp, 0) for tp in tps}

    def close(self) -> None:
        pass


def _stream(view: FakeView, **options: str) -> StromStreamReader:
    reader = StromStreamReader(
        parse_read_options({**BOOT, "subscribe": "t", **options}, streaming=True)
    )
    reader._view = view  # type: ignore[assignment]
    return reader


def test_stream_latest_offset_respects_limits_and_reports_latest() -> None:
    view = FakeView({T0: 100, T1: 300})
    reader = _stream(view, maxOffsetsPerTrigger="40")
    assert reader.getDefaultReadLimit() == ReadMaxRows(40)
    start = {"t": {"0": 0, "1": 0}}
    end = reader.latestOffset(start, ReadMaxRows(40))
    assert end == {"t": {"0": 10, "1": 30}}
    assert reader.reportLatestOffset() == {"t": {"0": 100, "1": 300}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 100, "1": 300}}
    # a new partition joins from offset 0
    view.latest_offsets[T2] = 5
    assert reader.latestOffset({"t": {"0": 100, "1": 300}}, ReadMaxRows(40)) == {
        "t": {"0": 100, "1": 300, "2": 5}
    }
    # the planned ranges start new partitions at 0, and split nothing by default
    parts = reader.partitions({"t": {"0": 100, "1": 300}}, {"t": {"0": 100, "1": 300, "2": 5}})
    assert [(p.value.partition, p.value.start, p.value.end) for p in parts] == [(2, 0, 5)]
    assert all(isinstance(p, RangePartition) for p in parts)


def test_stream_skips_partitions_without_a_leader_for_a_trigger() -> None:
    view = FakeView({T0: 100, T1: 50})
    reader = _stream(view)
    view.leaderless = {T1}
    # a known partition keeps its offset, a new one waits for a later trigger
    assert reader.latestOffset({"t": {"1": 20}}, ReadAllAvailable()) == {"t": {"0": 100, "1": 20}}
    assert reader.latestOffset({"t": {"0": 0}}, ReadAllAvailable()) == {"t": {"0": 100}}
    # the planned batch reads t-0 without looking t-1 up (it would fail, as it used to)
    parts = reader.partitions({"t": {"0": 40, "1": 20}}, {"t": {"0": 100, "1": 20}})
    assert [(p.value.partition, p.value.start, p.value.end) for p in parts] == [(0, 40, 100)]
    view.leaderless = set()
    assert reader.latestOffset({"t": {"0": 100}}, ReadAllAvailable()) == {"t": {"0": 100, "1": 50}}


U0 = TopicPartition("u", 0)


def test_stream_drops_partitions_whose_topic_is_gone() -> None:
    """A deleted topic (subscribePattern or subscribe) is data loss, reported through
    failOnDataLoss; with false the stream goes on without it. Kept in the offsets, it failed
    every later batch and every restart from the checkpoint."""
    view = FakeView({T0: 100, U0: 9})
    view.gone = {U0}
    start = {"t": {"0": 40}, "u": {"0": 7}}
    strict = _stream(view, **{"fetchOffset.retryIntervalMs": "1"})
    with pytest.raises(DataLossError, match=r"u-0 \(read up to 7\) is gone from the cluster"):
        strict.latestOffset(start, ReadAllAvailable())
    lenient = _stream(view, failOnDataLoss="false", **{"fetchOffset.retryIntervalMs": "1"})
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 100}}
    parts = lenient.partitions(start, end)
    assert [(p.value.topic, p.value.start, p.value.end) for p in parts] == [("t", 40, 100)]
    # a batch planned before the topic went (its offsets log keeps u-0 at its offset, as
    # older versions planned it) is replayed without looking u-0 up
    for reader in (strict, lenient):
        parts = reader.partitions(start, {"t": {"0": 100}, "u": {"0": 7}})
        assert [(p.value.topic, p.value.start, p.value.end) for p in parts] == [("t", 40, 100)]
    # one planned with a range of u-0 to read: that range is lost
    planned = {"t": {"0": 100}, "u": {"0": 9}}
    with pytest.raises(DataLossError, match="u-0: the query needs offsets 7 to 8, but the"):
        strict.partitions(start, planned)
    parts = lenient.partitions(start, planned)
    assert [(p.value.topic, p.value.start, p.value.end) for p in parts] == [("t", 40, 100)]


def test_stream_asks_metadata_again_before_calling_a_topic_gone() -> None:
    """A node may not know a topic for a moment: asked again, it is no loss."""

    class Forgetful(FakeView):
        def partitions(self, sub: object, *, missing_ok: bool = False) -> list[TopicPartition]:
            got = super().partitions(sub, missing_ok=missing_ok)
            self.gone = set()
            return got

    view = Forgetful({T0: 100, U0: 9})
    view.gone = {U0}
    reader = _stream(view, **{"fetchOffset.retryIntervalMs": "1"})
    end = reader.latestOffset({"t": {"0": 40}, "u": {"0": 7}}, ReadAllAvailable())
    assert end == {"t": {"0": 100}, "u": {"0": 9}}


def test_stream_asks_again_before_calling_a_shrunk_log_data_loss() -> None:
    """A watermark that lags for a moment (a new leader) is asked again, and is no loss;
    one that stays below what was read is, or with failOnDataLoss=false the partition goes
    on from its new end."""

    class Lagging(FakeView):
        def __init__(self, answers: list[int]) -> None:
            super().__init__({T0: answers[0], T1: 50})
            self.answers = answers[1:]

        def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            got = super().latest(tps)
            if self.answers and T0 in got:
                self.latest_offsets[T0] = self.answers.pop(0)
            return got

    start = {"t": {"0": 100, "1": 50}}
    view = Lagging([90, 95, 120])  # low twice, then past what was read
    reader = _stream(view, **{"fetchOffset.retryIntervalMs": "1"})
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 120, "1": 50}}
    assert not view.answers

    reader = _stream(FakeView({T0: 30, T1: 50}), **{"fetchOffset.retryIntervalMs": "1"})
    with pytest.raises(DataLossError, match="read it up to offset 100, but it ends at 30 now"):
        reader.latestOffset(start, ReadAllAvailable())
    lenient = _stream(
        FakeView({T0: 30, T1: 50}),
        failOnDataLoss="false",
        **{"fetchOffset.retryIntervalMs": "1"},
    )
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 30, "1": 50}}
    assert lenient.partitions(start, end) == []  # nothing to read; the next batch starts at 30


def test_stream_min_offsets_wait_for_data_or_the_delay() -> None:
    view = FakeView({T0: 10})
    reader = _stream(view, minOffsetsPerTrigger="50", maxTriggerDelay="1h")
    assert reader.getDefaultReadLimit() == ReadMinRows(50)
    start = {"t": {"0": 0}}
    # The first trigger never waits (Kafka's): the backlog a query starts with is read.
    assert reader.latestOffset(start, ReadMinRows(50)) == {"t": {"0": 10}}
    after = {"t": {"0": 10}}
    view.latest_offsets[T0] = 20
    assert reader.latestOffset(after, ReadMinRows(50)) == after  # too little: skip the trigger
    view.latest_offsets[T0] = 60
    assert reader.latestOffset(after, ReadMinRows(50)) == {"t": {"0": 60}}
    view.latest_offsets[T0] = 70
    assert reader.latestOffset({"t": {"0": 60}}, ReadMinRows(50)) == {"t": {"0": 60}}
    reader._last_trigger = time.monotonic() - 3601  # the delay has passed
    assert reader.latestOffset({"t": {"0": 60}}, ReadMinRows(50)) == {"t": {"0": 70}}


def test_stream_available_now_stops_at_the_target() -> None:
    view = FakeView({T0: 50})
    reader = _stream(view, maxOffsetsPerTrigger="30", minOffsetsPerTrigger="10")
    reader.prepareForTriggerAvailableNow()
    view.latest_offsets[T0] = 500
    view.latest_offsets[T1] = 20  # created after the target: not part of this run
    first = reader.latestOffset({"t": {"0": 0}}, ReadMaxRows(30))
    assert first == {"t": {"0": 30}}
    assert reader.latestOffset(first, ReadMaxRows(30)) == {"t": {"0": 50}}
    assert reader.latestOffset({"t": {"0": 50}}, ReadMaxRows(30)) == {"t": {"0": 50}}


def test_stream_available_now_does_not_leave_a_partition_without_a_leader_out() -> None:
    """Found from outside: a partition whose leader was down was left out of the run's
    target, and the run succeeded without reading it. Its lookup now fails the run."""
    view = FakeView({T0: 50, T1: 20})
    view.leaderless.add(T1)
    reader = _stream(view)
    with pytest.raises(StromSparkError, match="t-1 has no live leader"):
        reader.prepareForTriggerAvailableNow()


def test_stream_partitions_report_data_loss() -> None:
    view = FakeView({T0: 100, T1: 100}, earliest={T0: 40, T1: 0})
    reader = _stream(view)
    with pytest.raises(DataLossError, match=r"t-0: the query needs offsets from 10.*10 to 39"):
        reader.partitions({"t": {"0": 10, "1": 0}}, {"t": {"0": 100, "1": 100}})
    lenient = _stream(view, failOnDataLoss="false")
    parts = lenient.partitions({"t": {"0": 10, "1": 0}}, {"t": {"0": 100, "1": 100}})
    assert [(p.value.partition, p.value.start, p.value.end) for p in parts] == [
        (0, 40, 100),
        (1, 0, 100),
    ]


def test_batch_ranges_check_data_loss_and_bad_bounds() -> None:
    from strom_spark.lookup import check_ranges

    strict = parse_read_options({**BOOT, "subscribe": "t"}, streaming=False)
    lenient = parse_read_options(
        {**BOOT, "subscribe": "t", "failOnDataLoss": "false"}, streaming=False
    )
    earliest, latest = {T0: 40, T1: 0}, {T0: 100, T1: 50}
    with pytest.raises(DataLossError, match="offsets 10 to 39 were deleted"):
        check_ranges(strict, {T0: 10, T1: 0}, {T0: 100, T1: 50}, earliest, latest)
    assert check_ranges(lenient, {T0: 10, T1: 0}, {T0: 100, T1: 50}, earliest, latest) == [
        OffsetRange(T0, 40, 100),
        OffsetRange(T1, 0, 50),
    ]
    # the whole range was deleted: nothing left to read, not an error
    assert check_ranges(lenient, {T0: 10}, {T0: 30}, earliest, latest) == [OffsetRange(T0, 30, 30)]
    with pytest.raises(OptionError, match="up to offset 60, but it ends at 50"):
        check_ranges(strict, {T1: 0}, {T1: 60}, earliest, latest)
    with pytest.raises(OptionError, match="starts at offset 45, after its end 44"):
        check_ranges(strict, {T1: 45}, {T1: 44}, earliest, latest)


def test_naive_timestamps_are_not_used_to_narrow() -> None:
    pushed, rest = push_filters([GreaterThan(("timestamp",), dt.datetime(2024, 1, 1))])
    assert pushed.timestamp_lo_ms is None and len(rest) == 1


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC),  # -1 ms: "latest"
        dt.datetime(1969, 12, 31, 23, 59, 59, 998000, tzinfo=dt.UTC),  # -2 ms: "earliest"
        dt.datetime(1960, 1, 1, tzinfo=dt.UTC),
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    ],
)
def test_bounds_before_1970_narrow_nothing(when: dt.datetime) -> None:
    """Records' timestamps are >= 0, and ListOffsets reads -1/-2/-3 as sentinels: such a
    bound (once sent as -1, "latest", so the read found nothing) is left to Spark."""
    for f in (GreaterThanOrEqual, GreaterThan, EqualTo):
        pushed, rest = push_filters([f(("timestamp",), when)])
        assert pushed.timestamp_lo_ms is None and len(rest) == 1


def test_lag_from_a_progress_report() -> None:
    from strom_spark import lag, total_lag
    from strom_spark.progress import end_offsets

    progress = {
        "sources": [
            {
                "startOffset": {"t": {"0": 0, "1": 0}},
                "endOffset": '{"t": {"0": 40, "1": 10}}',
                "latestOffset": {"t": {"0": 100, "1": 10}},
            }
        ]
    }
    assert lag(progress) == {T0: 60, T1: 0}
    assert total_lag(progress) == 60
    assert end_offsets(progress) == {T0: 40, T1: 10}
    assert lag({"sources": []}) == {}
    assert lag({"sources": [{"endOffset": None, "latestOffset": None}]}) == {}
    # query.lastProgress before the first micro-batch (the README's example called it there)
    assert lag(None) == {} and total_lag(None) == 0 and end_offsets(None) == {}


def test_subscriptions_describe_themselves() -> None:
    o = parse_read_options({**BOOT, "assign": '{"t": [0, 2], "u": [1]}'}, streaming=False)
    assert o.subscription.describe() == 'assign={"t": [0, 2], "u": [1]}'


def test_a_stream_looks_past_a_deleted_subscribed_topic() -> None:
    """subscribe=t,u with u deleted: a running stream leaves u out (and reports what it had
    read of it as data loss); starting a query on it is still an error."""

    class Client:
        def topic_metadata(self, topic: str) -> object:
            if topic == "u":
                raise UnknownTopicOrPartitionError("u")
            return storage_pb2.MetadataTopic(
                name=topic, partitions=[storage_pb2.MetadataPartition(partition=0)]
            )

    view = ClusterView.__new__(ClusterView)
    view.client = Client()  # type: ignore[assignment]
    sub = parse_read_options({**BOOT, "subscribe": "t,u"}, streaming=True).subscription
    assert view.partitions(sub, missing_ok=True) == [T0]
    with pytest.raises(StromSparkError, match="unknown topic 'u'"):
        view.partitions(sub)
    assigned = parse_read_options({**BOOT, "assign": '{"t": [0, 1], "u": [0]}'}, streaming=True)
    assert view.partitions(assigned.subscription, missing_ok=True) == [T0]
    with pytest.raises(OptionError, match="assign names t-1"):
        view.partitions(assigned.subscription)


def test_offset_lookups_outlast_a_hung_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that hangs (a stopped process) while leadership moves: each ListOffsets gives
    up well within the lookup budget, so the new leader is asked in time. Each call used to
    wait the whole request timeout (30 s), longer than the budget (15 s), and fail."""
    from strom.client import offsets
    from strom.client.metadata import MetadataCache
    from tests.unit.test_list_offsets import Clock, HungLeaderCluster

    clock = Clock()
    monkeypatch.setattr(offsets, "time", clock)
    view = ClusterView(parse_read_options({**BOOT, "subscribe": "t"}, streaming=True))
    cluster = HungLeaderCluster(clock, moves_after=2, timeout_s=view.client.timeout_s)
    view.client.close()
    view.client = cluster  # type: ignore[assignment]
    view.leaders = MetadataCache(cluster)
    assert view.earliest([T0]) == {T0: 7}


class FakeCluster(ClusterView):
    """A ClusterView (its own bound resolution and checks) over fixed offsets, without I/O.
    An offset lookup of a partition in ``down`` fails as the real one does when the
    partition's leader is down."""

    def __init__(self, opts: ReadOptions, latest: dict[TopicPartition, int], down: set) -> None:
        self.opts = opts
        self.latest_offsets = latest
        self.down = down

    def partitions(self, sub: object, *, missing_ok: bool = False) -> list[TopicPartition]:
        return sorted(self.latest_offsets)

    def _list(self, query: Mapping[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        for tp in query:
            if tp in self.down:
                raise StromSparkError(
                    f"strom: LEADER_NOT_AVAILABLE: {tp.topic}-{tp.partition} has no live leader"
                )
        return {tp: (0 if q == -2 else self.latest_offsets[tp], -1) for tp, q in query.items()}

    def close(self) -> None:
        pass


def _batch(monkeypatch: pytest.MonkeyPatch, filters: list, **options: str) -> list:
    opts = parse_read_options({**BOOT, "subscribe": "t", **options}, streaming=False)
    monkeypatch.setattr(source, "ClusterView", lambda o: FakeCluster(o, {T0: 10, T1: 20}, {T1}))
    reader = StromBatchReader(opts)
    reader.pushFilters(filters)
    return [(p.value.partition, p.value.start, p.value.end) for p in reader.partitions()]


def test_batch_read_looks_up_only_the_partitions_its_filters_keep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """t-1's leader is down: a read filtered to t-0 must not look it up (it failed)."""
    only_0 = [EqualTo(("partition",), 0)]
    assert _batch(monkeypatch, only_0) == [(0, 0, 10)]
    # JSON bounds may name partitions the filter leaves out: the same options work either way
    both = {
        "startingOffsets": '{"t": {"0": 2, "1": 5}}',
        "endingOffsets": '{"t": {"0": -1, "1": 6}}',
    }
    assert _batch(monkeypatch, only_0, **both) == [(0, 2, 10)]
    # but must still cover what is read, and name only partitions the subscription has
    with pytest.raises(OptionError, match="has no entry for t-0"):
        _batch(monkeypatch, only_0, startingOffsets='{"t": {"1": 5}}')
    with pytest.raises(OptionError, match="names t-2, which the query does not read"):
        _batch(monkeypatch, only_0, startingOffsets='{"t": {"0": 2, "2": 5}}')
    with pytest.raises(StromSparkError, match=r"t-1.*has no live leader"):
        _batch(monkeypatch, [])


def test_batch_range_errors_name_the_last_stable_offset_for_read_committed() -> None:
    from strom_spark.lookup import check_ranges

    opts = parse_read_options(
        {**BOOT, "subscribe": "t", "kafka.isolation.level": "read_committed"}, streaming=False
    )
    assert opts.read_committed
    with pytest.raises(OptionError, match=r"ends at 22 \(its last stable offset\)"):
        check_ranges(opts, {T0: 0}, {T0: 30}, {T0: 0}, {T0: 22})


def test_tls_and_token_options_reach_every_client(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Found from outside: the connector made its clients without security, so a TLS, mTLS
    or token cluster was reachable only through STROM_SSL_* / STROM_TOKEN* set on the driver
    and every executor. The ssl.* and token.file options are checked at load() and reach the
    clients of reads (cluster_for, on the executors; the driver's lookups) and writes."""
    from strom.devcluster.certs import CertificateAuthority
    from strom_spark import fetch
    from strom_spark.options import Security, parse_write_options
    from strom_spark.write import TaskWriter

    for var in ("STROM_SSL_CAFILE", "STROM_SSL_CERTFILE", "STROM_SSL_KEYFILE", "STROM_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("STROM_TOKEN_FILE", raising=False)
    ca = CertificateAuthority(tmp_path / "ca")
    app = ca.issue("spark-app")
    token = tmp_path / "token"
    token.write_text("spark-token\n")
    given = {
        "SSL.CAFile": str(ca.ca_file),  # case-insensitive, as Spark's options are
        "ssl.certfile": str(app.cert),
        "ssl.keyfile": str(app.key),
        "token.file": str(token),
    }
    base = {"bootstrap": "127.0.0.1:1", "subscribe": "t"}
    opts = parse_read_options({**base, **given}, streaming=False)
    assert opts.security == Security(str(ca.ca_file), str(app.cert), str(app.key), str(token))
    sec = opts.security.channel()
    assert sec.ca == ca.ca_file.read_bytes() and sec.cert == app.cert.read_bytes()
    assert sec.token == "spark-token"
    client, _ = fetch.cluster_for(opts)
    try:
        assert client.security == sec
    finally:
        client.close()
    with ClusterView(opts) as view:
        assert view.client.security == sec
    wopts = parse_write_options({"bootstrap": "127.0.0.1:1", "topic": "t", **given})
    assert wopts.security == opts.security
    writer = TaskWriter(wopts, {"t": 1})
    try:
        assert writer.producer._client.security == sec  # type: ignore[attr-defined]
    finally:
        writer.producer.close(timeout=0)

    # Mistakes fail at load(), naming the option.
    bad = [
        ({"ssl.cafile": str(tmp_path / "missing.crt")}, "option ssl.cafile .*missing.crt"),
        ({"ssl.certfile": str(app.cert)}, "ssl.certfile and ssl.keyfile go together"),
        (
            {"ssl.certfile": str(app.cert), "ssl.keyfile": str(ca.issue("other").key)},
            "option ssl.keyfile .* is not the key of option ssl.certfile",
        ),
        ({"token.file": str(tmp_path / "none")}, "option token.file .*cannot read it"),
        ({"ssl.cafile": str(token)}, "option ssl.cafile .*no PEM certificate"),
    ]
    for extra, message in bad:
        with pytest.raises(OptionError, match=message):
            parse_read_options({**base, **extra}, streaming=False)
        with pytest.raises(OptionError, match=message):
            parse_write_options({"bootstrap": "127.0.0.1:1", "topic": "t", **extra})
    # Without the options, the environment still applies (the clients' default).
    monkeypatch.setenv("STROM_TOKEN", "from-env")
    assert parse_read_options(base, streaming=False).security.channel().token == "from-env"
