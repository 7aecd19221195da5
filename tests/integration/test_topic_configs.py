"""Kafka topic configs on a real local cluster (issue 9, item 4): etcd, a controller and a
storage node as processes, the `strom` CLI and the Python clients.

Before the fix ``min.cleanable.dirty.ratio`` was refused as an unknown config, the cleaner
rewrote every compacted log on every pass whatever its dirty ratio, and ``topics describe``
showed only the overrides.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from strom import Admin, Consumer, Producer, TopicPartition
from strom.devcluster.cluster import LocalCluster
from strom.devcluster.procs import wait_for
from strom.errors import InvalidConfigError, InvalidTimestampError, MessageTooLargeError

pytestmark = pytest.mark.integration


def strom(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"strom {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("topic-configs"),
        nodes=1,
        controllers=1,
        coordinators=0,
        node_args=["--log-cleanup-interval-ms", "200"],
    )
    try:
        c.start()
        yield c
    finally:
        c.kill()


def cleanings(c: LocalCluster) -> float:
    """strom_storage_cleaner_cleanings_total summed over reasons, from the node's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{c.nodes[0].metrics_port}/metrics").read()
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r"^strom_storage_cleaner_cleanings_total\{[^}]*\} (\S+)$", text.decode(), re.M
        )
    )


def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of partition 0, from the start to the end."""
    with Admin(bootstrap) as admin:
        end = admin.list_offsets({TopicPartition(topic, 0): "latest"})[TopicPartition(topic, 0)]
    out: list[tuple[int, bytes | None, bytes | None]] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while consumer.position(TopicPartition(topic, 0)) < end.offset:
            assert time.monotonic() < deadline, "could not read the topic to its end"
            out.extend((r.offset, r.key, r.value) for r in consumer.poll(timeout_ms=500))
    return out


def test_create_describe_and_refuse_through_the_cli(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    strom(
        "topics", "create", "cfg-cli", "--partitions", "1", "--replication-factor", "1",
        "--config", "cleanup.policy=compact",
        "--config", "min.cleanable.dirty.ratio=0.01",
        "--config", "max.compaction.lag.ms=600000",
        "--config", "segment.jitter.ms=1000",
        "--config", "preallocate=true",
        "-b", b,
    )  # fmt: skip
    desc = strom("topics", "describe", "cfg-cli", "-b", b).stdout
    lines = {x.strip() for x in desc.splitlines()}
    for line in (
        "min.cleanable.dirty.ratio=0.01\t(topic)",
        "cleanup.policy=compact\t(topic)",
        "max.compaction.lag.ms=600000\t(topic)",
        "segment.jitter.ms=1000\t(topic)",
        "preallocate=true\t(topic)",
        "delete.retention.ms=86400000\t(default)",
        "message.timestamp.after.max.ms=3600000\t(default)",
        "segment.index.bytes=10485760\t(default)",
        "file.delete.delay.ms=60000\t(default)",
    ):
        assert line in lines, f"{line!r} not in:\n{desc}"

    strom("topics", "alter", "cfg-cli", "--set", "min.cleanable.dirty.ratio=0.3", "-b", b)
    assert (
        "min.cleanable.dirty.ratio=0.3\t(topic)"
        in strom("topics", "describe", "cfg-cli", "-b", b).stdout
    )
    strom("topics", "alter", "cfg-cli", "--delete", "min.cleanable.dirty.ratio", "-b", b)
    assert (
        "min.cleanable.dirty.ratio=0.5\t(default)"
        in strom("topics", "describe", "cfg-cli", "-b", b).stdout
    )

    bad = strom(
        "topics", "create", "cfg-bad", "--config", "message.format.version=3.0", "-b", b,
        check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "'message.format.version' is not supported by strom" in bad.stderr
    assert "removed in Kafka 4.0" in bad.stderr
    bad = strom(
        "topics", "create", "cfg-bad", "--config", "min.cleanable.dirty.ratio=2", "-b", b,
        check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "min.cleanable.dirty.ratio" in bad.stderr
    assert "must be in [0, 1]" in bad.stderr
    assert "cfg-bad" not in strom("topics", "list", "-b", b).stdout.split()


def test_produce_limits_give_clear_errors(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    with Admin(b) as admin:
        admin.create_topic(
            "cfg-limits",
            partitions=1,
            replication_factor=1,
            config={"max.message.bytes": "4096", "message.timestamp.before.max.ms": "60000"},
        )
        with pytest.raises(InvalidConfigError, match=r"remote\.storage\.enable.*tiered"):
            admin.alter_configs("cfg-limits", set={"remote.storage.enable": "true"})
    with Producer(b, linger_ms=0) as producer:
        ok = producer.send("cfg-limits", b"small").result(timeout=30)
        with pytest.raises(MessageTooLargeError) as big:
            producer.send("cfg-limits", b"x" * 10_000).result(timeout=30)
        msg = str(big.value)
        assert "cfg-limits-0" in msg and "max.message.bytes=4096" in msg
        assert re.search(r"is \d{5} bytes", msg), msg
        old = int(time.time() * 1000) - 3_600_000
        with pytest.raises(
            InvalidTimestampError, match=r"message\.timestamp\.before\.max\.ms=60000"
        ):
            producer.send("cfg-limits", b"old", timestamp_ms=old).result(timeout=30)
        after = producer.send("cfg-limits", b"after").result(timeout=30)
    assert after.offset == ok.offset + 1  # nothing of the refused batches was appended
    assert [v for _, _, v in read_all(b, "cfg-limits")] == [b"small", b"after"]


def test_retention_empties_a_quiet_topic(cluster: LocalCluster) -> None:
    """retention.ms on a topic that stopped receiving records: its active segment expires
    too (found from outside: the last records stayed readable forever, as segment.ms rolls
    only on an append and retention skipped the active segment)."""
    b = cluster.bootstrap
    tp = TopicPartition("cfg-quiet", 0)
    with Admin(b) as admin:
        admin.create_topic(
            "cfg-quiet", partitions=1, replication_factor=1, config={"retention.ms": "1000"}
        )
        with Producer(b) as producer:
            for v in (b"a", b"b", b"c"):
                producer.send("cfg-quiet", v)
        wait_for(
            lambda: admin.list_offsets({tp: "earliest"})[tp].offset == 3,  # type: ignore[union-attr]
            timeout=30,
            what="the expired records deleted",
        )
        assert admin.list_offsets({tp: "latest"})[tp].offset == 3  # type: ignore[union-attr]
        with Producer(b) as producer:
            assert producer.send("cfg-quiet", b"d").result(10).offset == 3


def test_compacted_topics_are_cleaned_by_dirty_ratio(cluster: LocalCluster) -> None:
    """Two compacted topics get the same writes. The one with min.cleanable.dirty.ratio=0.01
    is cleaned, and cleaned again after a few more writes make it slightly dirty; the one with
    1.0 never is (a dirty ratio is never above 1, and max.compaction.lag.ms is unlimited)."""
    b = cluster.bootstrap
    base = {"cleanup.policy": "compact", "segment.bytes": "2048"}
    with Admin(b) as admin:
        admin.create_topic("cfg-low", 1, 1, config={**base, "min.cleanable.dirty.ratio": "0.01"})
        admin.create_topic("cfg-never", 1, 1, config={**base, "min.cleanable.dirty.ratio": "1"})
    keys = [b"k%d" % i for i in range(5)]

    def write(round_: int, n: int) -> None:
        with Producer(b, linger_ms=0) as producer:
            for i in range(n):
                for topic in ("cfg-low", "cfg-never"):
                    producer.send(topic, b"r%d-%d" % (round_, i), key=keys[i % 5])
                producer.flush()

    def values(topic: str) -> list[bytes | None]:
        return [v for _, _, v in read_all(b, topic)]

    before = cleanings(cluster)
    write(1, 150)
    # (The node counts a cleaning just after its result became readable: wait for both.)
    wait_for(
        lambda: len(values("cfg-low")) < 150 and cleanings(cluster) > before,
        timeout=60,
        what="cfg-low cleaned, and the cleaning counted",
    )
    first = cleanings(cluster)
    # Round 2 is 40 records (~3.5 kB at segment.bytes=2048), so at least one segment rolls
    # inside it: some round-2 records sit in a closed segment with newer values for their key
    # behind them, and a cleaning at the low ratio removes them too. (With only 20, all of
    # round 2 could sit in the active segment, which is never cleaned.)
    write(2, 40)  # every key gets newer values: the round-1 records become obsolete

    def cleaned_again() -> bool:
        if cleanings(cluster) <= first:
            return False
        now = values("cfg-low")
        return len(now) < 40 and not any(v.startswith(b"r1-") for v in now if v)

    wait_for(
        cleaned_again,
        timeout=60,
        what="cfg-low cleaned again at a low dirty ratio",
    )
    low, never = read_all(b, "cfg-low"), read_all(b, "cfg-never")
    assert len(never) == 190  # never cleaned: every record is there
    assert len(low) < 40
    for got in (low, never):
        latest = {k: v for _, k, v in got}
        assert latest == {keys[i % 5]: b"r2-%d" % i for i in range(35, 40)}
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(offsets) and offsets[-1] == 189


def test_lowering_max_message_bytes_does_not_let_the_cleaner_cut_bigger_batches(
    cluster: LocalCluster,
) -> None:
    """Found from outside: after max.message.bytes was lowered, the cleaner's swap re-read
    the rewritten segment under the new limit, took an older 3 MiB batch for corruption and
    cut the segment there: every key after it was gone, silently. Only the leader's produce
    check applies the limit (as in Kafka)."""
    b = cluster.bootstrap
    topic = "cfg-mmb-compact"
    with Admin(b) as admin:
        admin.create_topic(
            topic,
            1,
            1,
            config={
                "cleanup.policy": "compact",
                "max.message.bytes": str(8 << 20),
                "segment.bytes": str(16 << 20),
                "min.cleanable.dirty.ratio": "1",  # not cleaned before the change
            },
        )
    big = os.urandom(3 << 20)
    with Producer(b, linger_ms=0, max_request_size=8 << 20, batch_size=8 << 20) as producer:
        producer.send(topic, b"old", key=b"a").result(timeout=30)
        producer.send(topic, big, key=b"big").result(timeout=30)
        for i in range(5):
            producer.send(topic, b"v%d" % i, key=b"k%d" % i).result(timeout=30)
        producer.send(topic, b"new", key=b"a").result(timeout=30)
    with Admin(b) as admin:
        admin.alter_configs(
            topic,
            set={
                "max.message.bytes": str(1 << 20),
                "segment.bytes": "1024",  # the next append rolls: the segment is cleanable
                "min.cleanable.dirty.ratio": "0.01",
            },
        )
    before = cleanings(cluster)
    with Producer(b, linger_ms=0) as producer:
        sent = [0]

        def cleaned() -> bool:
            # Until the change reaches the node, an append does not roll: write again.
            producer.send(topic, b"z%d" % sent[0], key=b"z").result(timeout=30)
            sent[0] += 1
            values = [v for _, k, v in read_all(b, topic) if k == b"a"]
            return cleanings(cluster) > before and b"old" not in values

        wait_for(cleaned, timeout=60, interval=0.2, what="the topic compacted after the change")
    latest = {k: v for _, k, v in read_all(b, topic)}
    assert latest == {
        b"a": b"new",
        b"big": big,
        **{b"k%d" % i: b"v%d" % i for i in range(5)},
        b"z": b"z%d" % (sent[0] - 1),
    }


def followed_fetches(c: LocalCluster) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{c.nodes[0].metrics_port}/metrics").read()
    found = re.findall(
        r"^strom_storage_fetch_followed_total(?:\{[^}]*\})? (\S+)$", text.decode(), re.M
    )
    return sum(float(v) for v in found)


def test_a_followed_consumer_of_a_compacted_topic_misses_nothing_while_it_is_cleaned(
    cluster: LocalCluster,
) -> None:
    """A consumer caught up on a compacted topic (its fetches followed by the node) while the
    cleaner rewrites the segments behind it: it gets every record in offset order, each with
    the value written at that offset, and the log it leaves behind is compacted."""
    b = cluster.bootstrap
    topic, tp = "cfg-follow", TopicPartition("cfg-follow", 0)
    with Admin(b) as admin:
        admin.create_topic(
            topic,
            1,
            1,
            config={
                "cleanup.policy": "compact",
                "segment.bytes": "2048",
                "min.cleanable.dirty.ratio": "0.01",
            },
        )
    keys = [b"k%d" % i for i in range(5)]
    written: dict[int, tuple[bytes, bytes]] = {}
    seen: list[tuple[int, bytes | None, bytes | None]] = []
    followed_before = followed_fetches(cluster)
    with (
        Producer(b, linger_ms=0) as producer,
        Consumer(b, auto_offset_reset="earliest", fetch_max_wait_ms=500) as consumer,
    ):
        consumer.assign([tp])
        for round_ in range(4):
            cleaned_before = cleanings(cluster)
            for i in range(60):  # one batch each, so that segments roll within a round
                key, value = keys[i % 5], b"r%d-%d" % (round_, i)
                future = producer.send(topic, value, key=key)
                producer.flush()
                written[future.result(10).offset] = (key, value)
                # Caught up after every record: a record is read before the next one with its
                # key exists, so the cleaner (running all along) cannot have removed it yet.
                # (Reading only after the round raced the cleaner: compaction legitimately
                # removed early records the consumer had not reached.)
                end = max(written) + 1
                deadline = time.monotonic() + 30
                while consumer.position(tp) < end:
                    assert time.monotonic() < deadline, "the consumer did not catch up"
                    seen.extend((r.offset, r.key, r.value) for r in consumer.poll(timeout_ms=500))
            # The cleaner rewrites the closed segments behind the (caught-up) consumer.
            wait_for(
                lambda before=cleaned_before: cleanings(cluster) > before,
                timeout=60,
                what="a cleaning after this round",
            )
    assert followed_fetches(cluster) > followed_before  # the node followed this consumer
    assert [o for o, _, _ in seen] == sorted(written)  # all of them, in order, once each
    assert all(written[o] == (k, v) for o, k, v in seen)
    left = read_all(b, topic)
    assert len(left) < len(written)  # compacted
    assert {k: v for _, k, v in left} == {keys[i % 5]: b"r3-%d" % i for i in range(55, 60)}
