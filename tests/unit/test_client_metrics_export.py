"""The Prometheus collector (strom.client.metrics) over clients' ``metrics()``: what a scrape
looks like to Prometheus. The clients here are stand-ins whose ``metrics()`` is a snapshot of
the real stats engines (strom.client.stats) fed known values; the collector reads nothing
else. The exposition must pass ``promtool check metrics`` without a warning, and a sum over
any one name's series must be a meaningful total (never a client's total plus its parts)."""

from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from strom.client.metrics import register
from strom.client.stats import FetchStats, GroupStats, PollStats, ProducerStats, tagged


class StandInProducer:
    """A producer as the collector sees it: a client_id and metrics() (from ProducerStats)."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.stats = ProducerStats()
        self.stats.request_sent(
            [("t1", 300, 6000, 6000, 0.0), ("t2", 100, 2000, 2000, 0.0)], compressed=False
        )
        self.stats.answered(0.004, 0)
        self.stats.failed("t2", 7)
        self.stats.waited_for_buffer(0.5)

    def metrics(self) -> dict[str, float]:
        return self.stats.snapshot(in_flight=0, buffer_total=1000, buffer_available=1000)


class StandInConsumer:
    """A consumer as the collector sees it: a client_id and metrics() (the consumer's stats
    engines plus per-partition lag and lead, as Consumer.metrics() adds them)."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.poll = PollStats()
        self.fetch = FetchStats()
        self.group = GroupStats()
        self.poll.polled(0, started=time.monotonic() - 1.0)
        self.poll.polled(40)
        self.fetch.fetched(0.1, 4000, 0)
        self.group.committed(0.002)
        self.group.heartbeat(0.003)
        self.group.rebalanced(0.05)

    def metrics(self) -> dict[str, float]:
        out = {**self.poll.snapshot(), **self.fetch.snapshot(), **self.group.snapshot()}
        out["records-lag-max"] = 60.0
        out[tagged("records-lag", topic="t1", partition=0)] = 60.0
        out[tagged("records-lag", topic="t1", partition=1)] = 5.0
        out["records-lead-min"] = 100.0
        out[tagged("records-lead", topic="t1", partition=0)] = 100.0
        return out


def _scrape() -> tuple[str, dict[str, dict[tuple[tuple[str, str], ...], float]]]:
    registry = CollectorRegistry()
    register(StandInProducer("p1"), registry)
    register(StandInConsumer("c1"), registry)
    text = generate_latest(registry).decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return text, samples


def test_the_exposition_passes_promtool_without_warnings() -> None:
    text, _ = _scrape()
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


def test_per_topic_and_per_partition_values_have_names_of_their_own() -> None:
    _, samples = _scrape()
    totals = samples["strom_client_producer_record_send_total"]
    assert totals == {(("client_id", "p1"),): 400.0}  # no topic series under this name
    per_topic = samples["strom_client_producer_topic_record_send_total"]
    assert per_topic == {
        (("client_id", "p1"), ("topic", "t1")): 300.0,
        (("client_id", "p1"), ("topic", "t2")): 100.0,
    }
    # A sum over a name's series is the client's total.
    assert sum(per_topic.values()) == sum(totals.values())
    assert sum(samples["strom_client_producer_topic_record_error_total"].values()) == 7
    assert sum(samples["strom_client_producer_record_error_total"].values()) == 7
    lag = samples["strom_client_consumer_partition_records_lag"]
    assert sorted(lag.values()) == [5.0, 60.0]
    assert samples["strom_client_consumer_records_lag_max"] == {(("client_id", "c1"),): 60.0}
    assert set(samples["strom_client_consumer_partition_records_lead"].values()) == {100.0}


def test_times_are_exported_in_seconds() -> None:
    _, samples = _scrape()
    latency = samples["strom_client_producer_request_latency_avg_seconds"]
    assert latency[(("client_id", "p1"),)] == pytest.approx(0.004)
    waited = samples["strom_client_producer_bufferpool_wait_time_seconds_total"]
    assert waited[(("client_id", "p1"),)] == pytest.approx(0.5)
    assert samples["strom_client_consumer_commit_latency_avg_seconds"][
        (("client_id", "c1"),)
    ] == pytest.approx(0.002)
    between = samples["strom_client_consumer_time_between_poll_avg_seconds"]
    assert 0.9 < between[(("client_id", "c1"),)] < 30
    assert "strom_client_consumer_fetch_throttle_time_max_seconds" in samples
    names = set(samples)
    assert not [n for n in names if n.endswith(("_ms", "_ns")) or "_ns_" in n or "_ms_" in n]
    # Kafka's older name of the buffer wait is the same count: exported once.
    assert "strom_client_producer_bufferpool_wait_time_total" not in names
