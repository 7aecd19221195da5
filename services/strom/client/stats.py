"""The clients' own metrics: what ``Producer.metrics()`` and ``Consumer.metrics()`` return.

Kafka's clients let an application watch them from inside (``metrics()``, JMX, librdkafka's
``stats_cb``); these are strom's, with Kafka's names where the meaning is the same
(docs/client-metrics.md lists them). Why a module of its own: the producer's sender thread,
the consumer's fetch threads, its poll and its group member each count their part, and a
reader on any thread takes a consistent snapshot, so the counting is small objects behind
one lock each, fed per request, per batch or per poll, never per record (``send()`` and the
drain of a poll are the clients' measured hot paths and do not change).

Windowed values follow Kafka's defaults (``metrics.num.samples=2``,
``metrics.sample.window.ms=30000``): a rate, an average or a maximum covers the samples of
the last 30 to 60 s. One difference: a rate in a client's first 30 s is over the time since
the client was made (Kafka divides by at least 30 s then, and reports a sixth of a steady
rate 5 s after start). An average or maximum with nothing recorded in the window is NaN, as
Kafka's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

#: Kafka's ``metrics.sample.window.ms`` and ``metrics.num.samples`` defaults.
SAMPLE_WINDOW_S = 30.0
SAMPLES = 2

NAN = math.nan


def tagged(name: str, **tags: object) -> str:
    """A per-topic or per-partition metric's key: ``name{topic=t,partition=0}`` (tags in the
    order given). Flat, so ``metrics()`` stays one ``dict[str, float]``; Kafka keeps such
    tags beside the name (a MetricName's tags), and the Prometheus collector
    (:mod:`strom.client.metrics`) turns them back into labels."""
    inner = ",".join(f"{k}={v}" for k, v in tags.items())
    return f"{name}{{{inner}}}"


class Windowed:
    """Count, sum, maximum and minimum of recorded values over the last ``SAMPLES`` samples of
    ``SAMPLE_WINDOW_S`` (Kafka's SampledStat), plus the all-time count and sum.

    Not locked: its owner (a stats object) holds its own lock around every call."""

    __slots__ = ("_samples", "count_total", "sum_total")

    def __init__(self) -> None:
        #: [start, count, sum, max, min] per sample, oldest first.
        self._samples: list[list[float]] = []
        self.count_total = 0
        self.sum_total = 0.0

    def record(self, value: float, now: float, count: int = 1) -> None:
        """Add ``value`` (``count`` events whose values sum to ``value``; the maximum and
        minimum then count their mean)."""
        self.count_total += count
        self.sum_total += value
        samples = self._samples
        if not samples or now - samples[-1][0] >= SAMPLE_WINDOW_S:
            samples.append([now, 0.0, 0.0, -math.inf, math.inf])
            if len(samples) > SAMPLES:
                del samples[0]
        s = samples[-1]
        s[1] += count
        s[2] += value
        mean = value / count if count else value
        s[3] = max(s[3], mean)
        s[4] = min(s[4], mean)

    def _live(self, now: float) -> list[list[float]]:
        """The samples still inside the window (Kafka purges older ones on read)."""
        return [s for s in self._samples if now - s[0] < SAMPLES * SAMPLE_WINDOW_S]

    def avg(self, now: float) -> float:
        live = self._live(now)
        count = sum(s[1] for s in live)
        return sum(s[2] for s in live) / count if count else NAN

    def max(self, now: float) -> float:
        live = [s for s in self._live(now) if s[1]]
        return max(s[3] for s in live) if live else NAN

    def min(self, now: float) -> float:
        live = [s for s in self._live(now) if s[1]]
        return min(s[4] for s in live) if live else NAN

    def rate(self, now: float, born: float) -> float:
        """Values per second over the window (Kafka's Rate: the samples' sum over the time
        they span, at least ``(SAMPLES - 1) * SAMPLE_WINDOW_S``, or the client's age when
        that is less)."""
        live = self._live(now)
        return _per_second(sum(s[2] for s in live), live, now, born)

    def count_rate(self, now: float, born: float) -> float:
        """Events recorded per second over the window (as :meth:`rate`)."""
        live = self._live(now)
        return _per_second(sum(s[1] for s in live), live, now, born)


def _with_current(pick: Callable[..., float], seen: float, now_values: Iterable[int]) -> float:
    """``pick`` (min or max) of a windowed extreme (``seen``, NaN for an empty window) and
    the values now; NaN with neither."""
    values = [float(v) for v in now_values]
    if not math.isnan(seen):
        values.append(seen)
    return pick(values) if values else NAN


def _per_second(total: float, live: list[list[float]], now: float, born: float) -> float:
    if not live:
        return 0.0
    elapsed = now - live[0][0]
    least = (SAMPLES - 1) * SAMPLE_WINDOW_S
    if elapsed < least:
        elapsed = min(least, now - born)
    return total / elapsed if elapsed > 0 else 0.0


class ProducerStats:
    """What a producer's sender thread counts, per request and per batch (never per record:
    ``send()`` is untouched; records are counted when their batch goes out or ends)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.born = time.monotonic()
        self.records_sent = Windowed()  # per batch sent: its record count
        self.bytes_sent = Windowed()  # per batch sent: its encoded bytes
        self.batch_bytes = Windowed()  # one value per batch: its encoded bytes
        self.compression = Windowed()  # one value per batch: encoded / uncompressed
        self.record_size = Windowed()  # per batch sent: its uncompressed bytes, its records
        self.records_per_request = Windowed()  # one value per request
        self.requests = Windowed()  # one value per request: 1
        self.latency_ms = Windowed()  # one value per answered request
        self.throttle_ms = Windowed()  # one value per answer
        self.queue_ms = Windowed()  # one value per batch's first send: time since it opened
        self.retries = Windowed()  # per retried batch: its record count
        self.errors = Windowed()  # per failed batch: its record count
        self.buffer_wait_ns = 0
        self.topic_sent: dict[str, int] = {}
        self.topic_bytes: dict[str, int] = {}
        self.topic_retries: dict[str, int] = {}
        self.topic_errors: dict[str, int] = {}

    def request_sent(
        self, batches: list[tuple[str, int, int, int, float | None]], *, compressed: bool
    ) -> None:
        """One Produce request went out with ``batches``: (topic, records, encoded bytes,
        uncompressed bytes as the producer counts them, created time on a first attempt else
        None) per batch. Without compression the ratio is 1 exactly, as Kafka's (the encoded
        batch has a frame the uncompressed count has not)."""
        now = time.monotonic()
        with self.lock:
            records = 0
            for topic, count, encoded, raw, created in batches:
                records += count
                self.records_sent.record(count, now, count)
                self.bytes_sent.record(encoded, now)
                self.batch_bytes.record(encoded, now)
                self.compression.record(encoded / raw if compressed and raw else 1.0, now)
                # A record's average size, from what the batch knows: its maximum is the
                # largest of the batches' averages (a per-record maximum would cost send()).
                self.record_size.record(raw, now, count)
                if created is not None:
                    self.queue_ms.record((now - created) * 1000.0, now)
                self.topic_sent[topic] = self.topic_sent.get(topic, 0) + count
                self.topic_bytes[topic] = self.topic_bytes.get(topic, 0) + encoded
            self.records_per_request.record(records, now)
            self.requests.record(1, now)

    def answered(self, latency_s: float, throttle_ms: int) -> None:
        """A Produce answer came ``latency_s`` after its request went out."""
        now = time.monotonic()
        with self.lock:
            self.latency_ms.record(latency_s * 1000.0, now)
            self.throttle_ms.record(throttle_ms, now)

    def retried(self, topic: str, records: int) -> None:
        now = time.monotonic()
        with self.lock:
            self.retries.record(records, now, records)
            self.topic_retries[topic] = self.topic_retries.get(topic, 0) + records

    def failed(self, topic: str, records: int) -> None:
        now = time.monotonic()
        with self.lock:
            self.errors.record(records, now, records)
            self.topic_errors[topic] = self.topic_errors.get(topic, 0) + records

    def waited_for_buffer(self, seconds: float) -> None:
        with self.lock:
            self.buffer_wait_ns += int(seconds * 1e9)

    def snapshot(
        self, *, in_flight: int, buffer_total: int, buffer_available: int
    ) -> dict[str, float]:
        """The metrics, with the gauges the producer reads from its own state."""
        now = time.monotonic()
        born = self.born
        with self.lock:
            out: dict[str, float] = {
                "record-send-total": float(self.records_sent.count_total),
                "record-send-rate": self.records_sent.rate(now, born),
                "record-retry-total": float(self.retries.count_total),
                "record-retry-rate": self.retries.rate(now, born),
                "record-error-total": float(self.errors.count_total),
                "record-error-rate": self.errors.rate(now, born),
                "record-size-avg": self.record_size.avg(now),
                "record-size-max": self.record_size.max(now),
                "byte-total": self.bytes_sent.sum_total,
                "byte-rate": self.bytes_sent.rate(now, born),
                "batch-size-avg": self.batch_bytes.avg(now),
                "batch-size-max": self.batch_bytes.max(now),
                "compression-rate-avg": self.compression.avg(now),
                "records-per-request-avg": self.records_per_request.avg(now),
                "record-queue-time-avg": self.queue_ms.avg(now),
                "record-queue-time-max": self.queue_ms.max(now),
                "request-total": float(self.requests.count_total),
                "request-rate": self.requests.count_rate(now, born),
                "request-latency-avg": self.latency_ms.avg(now),
                "request-latency-max": self.latency_ms.max(now),
                "produce-throttle-time-avg": self.throttle_ms.avg(now),
                "produce-throttle-time-max": self.throttle_ms.max(now),
                "requests-in-flight": float(in_flight),
                "buffer-total-bytes": float(buffer_total),
                "buffer-available-bytes": float(buffer_available),
                "bufferpool-wait-time-ns-total": float(self.buffer_wait_ns),
                # Kafka's older name for the same count, also in nanoseconds (KIP-773).
                "bufferpool-wait-time-total": float(self.buffer_wait_ns),
            }
            for name, per_topic in (
                ("record-send-total", self.topic_sent),
                ("byte-total", self.topic_bytes),
                ("record-retry-total", self.topic_retries),
                ("record-error-total", self.topic_errors),
            ):
                for topic, value in per_topic.items():
                    out[tagged(name, topic=topic)] = float(value)
        return out


class FetchStats:
    """What a consumer's fetch threads count: one entry per Fetch answer (or failure)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.born = time.monotonic()
        self.latency_ms = Windowed()
        self.bytes = Windowed()
        self.throttle_ms = Windowed()  # one value per answer (not per failed Fetch)
        #: One value per poll that drained records: the largest lag it left on a partition
        #: it drained (Kafka records each partition's lag as a poll takes its records).
        self.lag = Windowed()
        #: The same poll's smallest lead (position over the log start) on a partition it
        #: drained.
        self.lead = Windowed()

    def fetched(self, latency_s: float, nbytes: int, throttle_ms: int | None = None) -> None:
        """A Fetch answer (or a failed Fetch) came ``latency_s`` after the consumer began
        waiting for it, with ``nbytes`` of record batches; an answer's ``throttle_time_ms``
        (None for a failed Fetch, which has none)."""
        now = time.monotonic()
        with self.lock:
            self.latency_ms.record(latency_s * 1000.0, now)
            self.bytes.record(nbytes, now)
            if throttle_ms is not None:
                self.throttle_ms.record(throttle_ms, now)

    def lag_observed(self, lag: int, lead: int = -1, now: float | None = None) -> None:
        """A poll left ``lag`` records after its position on the partition it drained that
        lags most, and ``lead`` (-1: unknown) records between the log start and its
        position on the one that leads least (one call per poll, not per partition or
        record)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            if lag >= 0:
                self.lag.record(lag, now)
            if lead >= 0:
                self.lead.record(lead, now)

    def records_lead_min(self, leads_now: Iterable[int], now: float | None = None) -> float:
        """``records-lead-min``: the smallest lead the polls of the last 30-60 s left
        (Kafka's, a windowed minimum: a consumer that came near the retention's edge and
        got away still shows it), and at most the smallest lead now; NaN with neither."""
        now = time.monotonic() if now is None else now
        with self.lock:
            seen = self.lead.min(now)
        return _with_current(min, seen, leads_now)

    def records_lag_max(self, lags_now: Iterable[int], now: float | None = None) -> float:
        """``records-lag-max``: the largest lag the polls of the last 30-60 s left (Kafka's,
        a windowed maximum, so a lag that came and went between two reads of ``metrics()``
        still shows), and at least the largest lag now (``lags_now``, one per assigned
        partition): a consumer that stopped polling would else read NaN, as Kafka's does,
        exactly when its lag matters. NaN with neither."""
        now = time.monotonic() if now is None else now
        with self.lock:
            seen = self.lag.max(now)
        return _with_current(max, seen, lags_now)

    def snapshot(self) -> dict[str, float]:
        now = time.monotonic()
        with self.lock:
            return {
                "fetch-total": float(self.latency_ms.count_total),
                "fetch-rate": self.latency_ms.count_rate(now, self.born),
                "fetch-latency-avg": self.latency_ms.avg(now),
                "fetch-latency-max": self.latency_ms.max(now),
                "bytes-consumed-total": self.bytes.sum_total,
                "bytes-consumed-rate": self.bytes.rate(now, self.born),
                "fetch-size-avg": self.bytes.avg(now),
                "fetch-size-max": self.bytes.max(now),
                "fetch-throttle-time-avg": self.throttle_ms.avg(now),
                "fetch-throttle-time-max": self.throttle_ms.max(now),
            }


class PollStats:
    """What a consumer's polls count: one entry per ``poll()``/``poll_arrow()`` call.

    Also Kafka's two measures of ``max_poll_interval_ms`` trouble: the time between the
    starts of successive polls (``time-between-poll``), and a poll's time over itself plus
    that time (``poll-idle-ratio-avg``, KafkaConsumerMetrics' formula: near 1, the
    application waits for records; near 0, the time goes to its own work between polls).
    Neither is recorded for a first poll (Kafka records 0 and 1 then)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.born = time.monotonic()
        self.records = Windowed()
        self.between_ms = Windowed()  # one value per poll after the first
        self.idle_ratio = Windowed()  # one value per poll after the first
        self.last_poll: float | None = None
        self.last_start: float | None = None

    def polled(self, records: int, started: float | None = None) -> None:
        """A poll that began at ``started`` (monotonic; now if not given) returned
        ``records`` records (0 included: it still counts as a poll)."""
        now = time.monotonic()
        if started is None:
            started = now
        with self.lock:
            self.last_poll = now
            self.records.record(records, now, 1)
            if self.last_start is not None:
                between = started - self.last_start
                self.between_ms.record(between * 1000.0, now)
                took = now - started
                if took + between > 0:  # Kafka's: poll time / (poll time + time between)
                    self.idle_ratio.record(took / (took + between), now)
            self.last_start = started

    def snapshot(self) -> dict[str, float]:
        now = time.monotonic()
        with self.lock:
            return {
                "records-consumed-total": self.records.sum_total,
                "records-consumed-rate": self.records.rate(now, self.born),
                "records-per-poll-avg": self.records.avg(now),
                "poll-total": float(self.records.count_total),
                "time-between-poll-avg": self.between_ms.avg(now),
                "time-between-poll-max": self.between_ms.max(now),
                "poll-idle-ratio-avg": self.idle_ratio.avg(now),
                "last-poll-seconds-ago": (NAN if self.last_poll is None else now - self.last_poll),
            }


class GroupStats:
    """What a consumer's group member counts: commits, rebalances, heartbeats."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.born = time.monotonic()
        self.commit_ms = Windowed()
        self.rebalance_ms = Windowed()
        self.heartbeat_ms = Windowed()
        self.last_rebalance: float | None = None
        self.last_heartbeat: float | None = None

    def committed(self, latency_s: float) -> None:
        now = time.monotonic()
        with self.lock:
            self.commit_ms.record(latency_s * 1000.0, now)

    def rebalanced(self, latency_s: float) -> None:
        now = time.monotonic()
        with self.lock:
            self.rebalance_ms.record(latency_s * 1000.0, now)
            self.last_rebalance = now

    def heartbeat(self, latency_s: float) -> None:
        now = time.monotonic()
        with self.lock:
            self.heartbeat_ms.record(latency_s * 1000.0, now)
            self.last_heartbeat = now

    def snapshot(self) -> dict[str, float]:
        now = time.monotonic()
        with self.lock:
            return {
                "commit-total": float(self.commit_ms.count_total),
                "commit-rate": self.commit_ms.count_rate(now, self.born),
                "commit-latency-avg": self.commit_ms.avg(now),
                "commit-latency-max": self.commit_ms.max(now),
                "rebalance-total": float(self.rebalance_ms.count_total),
                "rebalance-latency-avg": self.rebalance_ms.avg(now),
                "rebalance-latency-max": self.rebalance_ms.max(now),
                "last-rebalance-seconds-ago": (
                    NAN if self.last_rebalance is None else now - self.last_rebalance
                ),
                "heartbeat-total": float(self.heartbeat_ms.count_total),
                "heartbeat-rate": self.heartbeat_ms.count_rate(now, self.born),
                "heartbeat-response-time-max": self.heartbeat_ms.max(now),
                "last-heartbeat-seconds-ago": (
                    NAN if self.last_heartbeat is None else now - self.last_heartbeat
                ),
            }
