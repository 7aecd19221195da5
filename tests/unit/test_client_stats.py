"""The clients' metric engine (strom.client.stats): windows, rates, averages and the
snapshots ``Producer.metrics()`` / ``Consumer.metrics()`` are made of, driven with explicit
clock readings (no cluster, no sleeps)."""

from __future__ import annotations

import math
import time

from strom.client.stats import (
    SAMPLE_WINDOW_S,
    SAMPLES,
    FetchStats,
    GroupStats,
    PollStats,
    ProducerStats,
    Windowed,
    tagged,
)


def test_an_empty_window_has_nan_averages_and_maxima_and_a_zero_rate() -> None:
    w = Windowed()
    assert math.isnan(w.avg(100.0)) and math.isnan(w.max(100.0))
    assert w.rate(100.0, born=0.0) == 0.0
    assert (w.count_total, w.sum_total) == (0, 0.0)


def test_average_and_maximum_cover_the_last_samples_only() -> None:
    w = Windowed()
    w.record(10.0, now=0.0)
    w.record(30.0, now=1.0)
    assert w.avg(2.0) == 20.0 and w.max(2.0) == 30.0
    # A second sample starts a window later; the first still counts...
    w.record(2.0, now=SAMPLE_WINDOW_S + 1)
    assert w.avg(SAMPLE_WINDOW_S + 2) == 14.0 and w.max(SAMPLE_WINDOW_S + 2) == 30.0
    # ... until it is older than SAMPLES windows: then only the newer one does.
    later = SAMPLES * SAMPLE_WINDOW_S + 0.5
    assert w.avg(later) == 2.0 and w.max(later) == 2.0
    # The totals are for all time.
    assert (w.count_total, w.sum_total) == (3, 42.0)


def test_a_rate_in_the_first_window_is_over_the_client_s_age() -> None:
    """Kafka divides by at least (samples - 1) windows (a sixth of the true rate 5 s in);
    strom's clients divide by their age while that is shorter."""
    w = Windowed()
    for t in range(5):
        w.record(100.0, now=10.0 + t)
    assert w.rate(15.0, born=10.0) == 100.0  # 500 in 5 s
    # Past the first window, over the samples' span (at least one window).
    assert w.rate(10.0 + SAMPLE_WINDOW_S, born=0.0) == 500.0 / SAMPLE_WINDOW_S


def test_count_rate_counts_events_not_values() -> None:
    w = Windowed()
    w.record(1000.0, now=0.0)
    w.record(1000.0, now=1.0)
    assert w.count_rate(2.0, born=0.0) == 1.0  # 2 events in 2 s
    assert w.rate(2.0, born=0.0) == 1000.0


def test_tagged_names_are_flat_and_keep_the_tag_order() -> None:
    assert tagged("records-lag", topic="t", partition=3) == "records-lag{topic=t,partition=3}"


def test_producer_stats_count_records_per_batch_and_per_topic() -> None:
    s = ProducerStats()
    s.request_sent([("a", 10, 500, 1000, 0.0), ("b", 5, 300, 300, None)], compressed=True)
    s.answered(0.004, 0)
    s.retried("a", 10)
    s.failed("b", 5)
    s.waited_for_buffer(0.25)
    m = s.snapshot(in_flight=2, buffer_total=100, buffer_available=40)
    assert m["record-send-total"] == 15
    assert m["record-send-total{topic=a}"] == 10 and m["record-send-total{topic=b}"] == 5
    assert m["byte-total"] == 800 and m["byte-total{topic=a}"] == 500
    assert m["batch-size-avg"] == 400 and m["batch-size-max"] == 500
    # gzip'd batch at half its size, an uncompressed one at 1 (Kafka's ratio when off).
    assert m["compression-rate-avg"] == 0.75
    # Records of 100 and 60 bytes (the batches' sizes over their counts): the average is
    # per record, the maximum the largest batch's average.
    assert math.isclose(m["record-size-avg"], 1300 / 15) and m["record-size-max"] == 100
    assert m["records-per-request-avg"] == 15 and m["request-total"] == 1
    assert math.isclose(m["request-latency-avg"], 4.0) and math.isclose(
        m["request-latency-max"], 4.0
    )
    assert m["produce-throttle-time-avg"] == 0
    assert m["record-retry-total"] == 10 and m["record-retry-total{topic=a}"] == 10
    assert m["record-error-total"] == 5 and m["record-error-total{topic=b}"] == 5
    assert m["bufferpool-wait-time-ns-total"] == 250_000_000
    assert m["bufferpool-wait-time-total"] == m["bufferpool-wait-time-ns-total"]
    assert (m["requests-in-flight"], m["buffer-total-bytes"], m["buffer-available-bytes"]) == (
        2,
        100,
        40,
    )
    assert m["record-send-rate"] > 0


def test_consumer_side_stats_before_anything_happened() -> None:
    m = {**PollStats().snapshot(), **FetchStats().snapshot(), **GroupStats().snapshot()}
    for name in ("records-consumed-total", "bytes-consumed-total", "fetch-total", "commit-total"):
        assert m[name] == 0, name
    for name in (
        "fetch-latency-avg",
        "commit-latency-max",
        "last-poll-seconds-ago",
        "last-rebalance-seconds-ago",
    ):
        assert math.isnan(m[name]), name


def test_poll_stats_count_records_per_poll() -> None:
    s = PollStats()
    s.polled(40)
    s.polled(0)
    m = s.snapshot()
    assert m["records-consumed-total"] == 40 and m["poll-total"] == 2
    assert m["records-per-poll-avg"] == 20
    assert 0 <= m["last-poll-seconds-ago"] < 60


def test_without_compression_the_ratio_is_one_and_record_sizes_still_count() -> None:
    s = ProducerStats()
    s.request_sent([("a", 4, 520, 400, 0.0)], compressed=False)
    m = s.snapshot(in_flight=0, buffer_total=1, buffer_available=1)
    assert m["compression-rate-avg"] == 1.0
    assert m["record-size-avg"] == m["record-size-max"] == 100


def test_time_between_polls_and_the_poll_idle_ratio() -> None:
    """Kafka's definitions: the time between the starts of successive polls, and a poll's
    time over itself plus that time (here a poll of ~2 s, 8 s after the last one began:
    2 / 10)."""
    s = PollStats()
    now = time.monotonic()
    s.polled(0, started=now - 10.0)
    first = s.snapshot()
    assert math.isnan(first["time-between-poll-avg"]) and math.isnan(first["poll-idle-ratio-avg"])
    s.polled(5, started=now - 2.0)
    m = s.snapshot()
    assert math.isclose(m["time-between-poll-avg"], 8000.0, rel_tol=1e-6)
    assert m["time-between-poll-max"] == m["time-between-poll-avg"]
    assert 0.19 <= m["poll-idle-ratio-avg"] <= 0.25


def test_fetch_throttle_times_come_from_answers_only() -> None:
    s = FetchStats()
    s.fetched(0.01, 100, 0)
    s.fetched(0.01, 100, 40)
    s.fetched(0.5, 0, None)  # a failed Fetch: no answer, no throttle time
    m = s.snapshot()
    assert m["fetch-throttle-time-avg"] == 20 and m["fetch-throttle-time-max"] == 40
    assert m["fetch-total"] == 3


def test_commit_and_heartbeat_rates() -> None:
    s = GroupStats()
    assert s.snapshot()["commit-rate"] == 0 and s.snapshot()["heartbeat-rate"] == 0
    s.committed(0.001)
    s.heartbeat(0.002)
    s.heartbeat(0.002)
    m = s.snapshot()
    assert m["commit-rate"] > 0 and m["heartbeat-rate"] > m["commit-rate"]


def test_records_lag_max_is_the_largest_lag_polls_left_over_the_window() -> None:
    """Kafka's records-lag-max is a windowed maximum (30 s samples, 2 of them), not the lag
    now: a lag that came and went between two reads of metrics() still shows. strom's is
    never below the largest lag now either (a consumer that stopped polling)."""
    stats = FetchStats()
    assert math.isnan(stats.records_lag_max([], now=0.0))  # nothing observed, nothing now
    assert stats.records_lag_max([7, 3], now=0.0) == 7.0  # nothing observed yet: the lag now
    stats.lag_observed(100, now=0.0)
    stats.lag_observed(20, now=1.0)
    stats.lag_observed(5, now=SAMPLE_WINDOW_S + 1)  # a second sample
    # Caught up now (lag 0), but 100 was seen in the window.
    assert stats.records_lag_max([0, 0], now=SAMPLE_WINDOW_S + 2) == 100.0
    assert stats.records_lag_max([], now=SAMPLE_WINDOW_S + 2) == 100.0
    # The first sample ages out after SAMPLES windows: the second's 5 remains ...
    later = SAMPLES * SAMPLE_WINDOW_S + 0.5
    assert stats.records_lag_max([0], now=later) == 5.0
    assert stats.records_lag_max([9], now=later) == 9.0  # ... unless the lag now is larger
    # ... and then nothing: the lag now alone, or NaN.
    empty = (SAMPLES + 1) * SAMPLE_WINDOW_S + 2
    assert stats.records_lag_max([2], now=empty) == 2.0
    assert math.isnan(stats.records_lag_max([], now=empty))


def test_records_lag_max_keeps_bounded_memory() -> None:
    """One value per poll, in at most SAMPLES samples however many polls there are."""
    stats = FetchStats()
    for i in range(10_000):
        stats.lag_observed(i % 1000, now=i * 0.01)
    assert len(stats.lag._samples) <= SAMPLES
    assert stats.records_lag_max([], now=100.0) == 999.0


def test_records_lead_min_is_the_smallest_lead_polls_left_over_the_window() -> None:
    """Kafka's records-lead-min is a windowed minimum: a consumer that came within 3 records
    of the retention's edge shows 3 until the window passes, whatever its lead now."""
    stats = FetchStats()
    assert math.isnan(stats.records_lead_min([], now=0.0))
    assert stats.records_lead_min([40, 9], now=0.0) == 9.0  # nothing observed: the lead now
    stats.lag_observed(-1, 3, now=0.0)  # no lag known, lead 3
    stats.lag_observed(10, 50, now=1.0)
    assert stats.records_lead_min([500], now=2.0) == 3.0
    assert stats.records_lead_min([1], now=2.0) == 1.0  # ... never above the lead now
    later = SAMPLES * SAMPLE_WINDOW_S + 2
    assert stats.records_lead_min([500], now=later) == 500.0  # aged out
    assert stats.records_lag_max([], now=2.0) == 10.0  # the lag of the same polls
