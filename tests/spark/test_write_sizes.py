"""The Spark sink's task writer with rows of skewed sizes, against a real cluster (no Spark
session needed: TaskWriter is what each write task runs).

Found from outside (a Spark write of 100 small rows, two adjacent 9 MiB rows and 100 small
rows): the two big rows were put in one batch the topic refused although each fit; the task
failed saying "a row is too large ... raise kafka.max.request.size" when no row was, and the
abort said "0 rows of finished tasks stay written" while the task had written 191.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from strom import Admin, TopicPartition
from strom_spark.errors import OptionError, StromSparkError
from strom_spark.options import parse_write_options
from strom_spark.write import TaskWriter
from tests.spark.conftest import create_topic

pytestmark = pytest.mark.integration


def end_offset(bootstrap: str, topic: str) -> int:
    with Admin(bootstrap) as admin:
        return admin.list_offsets({TopicPartition(topic, 0): "latest"})[
            TopicPartition(topic, 0)
        ].offset


def write_task(bootstrap: str, topic: str, values: list[bytes], request_size: int) -> TaskWriter:
    """A task writer of ``values`` (one Arrow batch, partition 0), not yet closed."""
    opts = parse_write_options(
        {"bootstrap": bootstrap, "topic": topic, "kafka.max.request.size": str(request_size)}
    )
    writer = TaskWriter(opts, {topic: 1})
    batch = pa.record_batch(
        [pa.array(values, pa.binary()), pa.array([0] * len(values), pa.int32())],
        names=["value", "partition"],
    )
    writer.write(batch)
    return writer


def test_skewed_rows_that_each_fit_are_all_written(bootstrap: str) -> None:
    topic = f"spark-skew-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1, max_message_bytes=str(1 << 20))
    big = b"\x05" * 600_000
    values = [b"s%d" % i for i in range(100)] + [big, big] + [b"t%d" % i for i in range(100)]
    writer = write_task(bootstrap, topic, values, 800 * 1024)
    try:
        assert writer.close().rows == len(values)
    finally:
        writer.abort()
    assert end_offset(bootstrap, topic) == len(values)


def test_a_row_over_the_topics_limit_names_the_topic_limit_and_what_stays_written(
    bootstrap: str,
) -> None:
    """A row within kafka.max.request.size but over the topic's max.message.bytes: the error
    says the topic refused it (raising kafka.max.request.size cannot help) and how many of
    the task's rows stay written, which is what the log holds."""
    topic = f"spark-topic-limit-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1, max_message_bytes=str(100_000))
    values = [b"s%d" % i for i in range(100)] + [b"\x06" * 200_000] + [b"t"]
    writer = write_task(bootstrap, topic, values, 1 << 20)
    try:
        with pytest.raises(StromSparkError) as caught:
            writer.close()
    finally:
        writer.abort()
    msg = str(caught.value)
    assert "the topic refused a batch" in msg and "max.message.bytes" in msg, msg
    assert "Raise the option kafka.max.request.size" not in msg, msg
    written = end_offset(bootstrap, topic)
    assert written >= 100  # the small rows before the big one
    assert f"{written} rows of this task were acknowledged and stay written" in msg, msg


def test_kafka_max_request_size_above_the_largest_batch_is_refused() -> None:
    with pytest.raises(OptionError, match=r"kafka\.max\.request\.size must be <= 267386880"):
        parse_write_options(
            {"bootstrap": "127.0.0.1:1", "topic": "t", "kafka.max.request.size": str(1 << 30)}
        )
