"""``strom bench produce|consume|e2e``: the client-level benchmarks (Kafka's perf tools).

- produce: ``Producer.send`` per record (``--api send``, the default) or ``send_batch``
  (``--api batch``); latency is sampled from the acknowledgement of every Nth record.
- consume: ``Consumer.poll`` iteration (``--api poll``) or ``poll_arrow`` (``--api arrow``)
  from the earliest offset until ``--records`` were read.
- e2e: see :mod:`strom.bench.e2e` (latency with every record accounted for).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from strom.bench import cpu
from strom.bench.stats import Result
from strom.cli import counted
from strom.client.admin import Admin
from strom.client.types import TopicPartition
from strom.errors import UnknownTopicOrPartitionError


class Progress:
    """A one-line progress bar on stderr (only on a terminal, or when forced)."""

    def __init__(self, total: int, label: str, *, enabled: bool | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.perf_counter()
        self._last = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.25 and done < self.total:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        rate = done / max(now - self.start, 1e-9)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%} {done:,} records {rate:,.0f}/s")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def ensure_topic(
    bootstrap: str | None,
    topic: str,
    partitions: int | None,
    rf: int = 1,
    *,
    create: bool = True,
) -> None:
    """Create the topic if it does not exist (what perf tools' users expect), with
    ``partitions`` (default 1). An existing topic is used as it is: a ``partitions`` given
    that differs from its count is named on stderr, since the run measures the topic's
    count, not the one asked for (it was silently ignored). With ``create=False`` (a bench
    that only reads) a missing topic is an error: creating it made an empty topic and a
    report of 0 records/s."""
    with Admin(bootstrap) as admin:
        listing = admin.list_topics().get(topic)
        if listing is None:
            if not create:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} does not exist (fill it first, e.g. with "
                    f"`strom bench produce --topic {topic}`)"
                )
            admin.create_topic(topic, partitions=partitions or 1, replication_factor=rf)
        elif partitions is not None and listing.partitions != partitions:
            print(
                f"strom bench: topic {topic!r} already exists with "
                f"{counted(listing.partitions, 'partition')}: --partitions {partitions} "
                "applies to a new topic only; measuring the topic as it is",
                file=sys.stderr,
            )


def records_held(bootstrap: str | None, topic: str) -> int:
    """How many offsets the topic's partitions hold (high watermark minus log start, summed):
    at least the records a consumer from the earliest offset can read (transaction markers
    take offsets too)."""
    with Admin(bootstrap) as admin:
        tps = [TopicPartition(topic, p.partition) for p in admin.describe_topic(topic).partitions]
        start = admin.list_offsets(dict.fromkeys(tps, "earliest"))
        end = admin.list_offsets(dict.fromkeys(tps, "latest"))
    return sum(e.offset - s.offset for tp in tps if (s := start[tp]) and (e := end[tp]))


def _pace(rate: float | None, start: float, sent: int) -> None:
    if rate:
        ahead = sent / rate - (time.perf_counter() - start)
        if ahead > 0:
            time.sleep(ahead)


def bench_produce(
    bootstrap: str | None,
    topic: str,
    *,
    records: int,
    record_size: int,
    api: str = "send",
    rate: float | None = None,
    keys: int | None = None,
    progress: bool | None = None,
    **producer_options: Any,
) -> Result:
    """Produce ``records`` values of ``record_size`` bytes; with ``keys``, each record has one
    of that many distinct keys (made beforehand, as an application would have them)."""
    from strom.client.producer import Producer

    value = b"x" * record_size
    key_list = [b"key-%d" % k for k in range(keys)] if keys else None
    latencies: list[float] = []
    sample_every = max(records // 20_000, 1)
    bar = Progress(records, "produce", enabled=progress)
    caller_s: float | None = None
    with Producer(bootstrap, **producer_options) as p:
        p.send(topic, value).result(30)  # metadata and connections warm
        meter = cpu.start()
        start = time.perf_counter()
        if api == "batch":
            chunk = 100_000
            futures = []
            values = [value] * chunk
            chunk_keys = None
            if key_list:
                chunk_keys = [key_list[i % len(key_list)] for i in range(chunk)]
            sent = 0
            while sent < records:
                n = min(chunk, records - sent)
                t0 = time.perf_counter()
                ks = chunk_keys if chunk_keys is None or n == chunk else chunk_keys[:n]
                f = p.send_batch(topic, values if n == chunk else values[:n], ks)
                f.add_done_callback(lambda _f, t0=t0: latencies.append(time.perf_counter() - t0))
                futures.append(f)
                sent += n
                bar.update(sent)
                _pace(rate, start, sent)
            for f in futures:
                f.result()
        else:
            send = p.send
            nkeys = len(key_list) if key_list else 0
            key = None
            caller = time.thread_time()
            for i in range(records):
                if nkeys:
                    key = key_list[i % nkeys]  # type: ignore[index]
                if i % sample_every == 0:
                    t0 = time.perf_counter()
                    send(topic, value, key).add_done_callback(
                        lambda _f, t0=t0: latencies.append(time.perf_counter() - t0)
                    )
                    if i % 10_000 == 0:
                        bar.update(i)
                        _pace(rate, start, i)
                else:
                    send(topic, value, key)
            caller_s = time.thread_time() - caller
            p.flush()
        seconds = time.perf_counter() - start
        usage = meter.stop()
    bar.update(records)
    bar.finish()
    name = f"produce ({api})"
    # The producer's own batching decides the batches: not known here, so not made up.
    result = Result(name, None, records, records * record_size, seconds, latencies, usage)
    result.caller_cpu_s = caller_s
    return result


def bench_consume(
    bootstrap: str | None,
    topic: str,
    *,
    records: int,
    api: str = "poll",
    poll_records: int = 10_000,
    group: str | None = None,
    commit: str = "none",
    progress: bool | None = None,
    **consumer_options: Any,
) -> list[Result]:
    """Consume ``records`` from the earliest offset, ``poll_records`` at most per poll. With
    ``group``, as a member of that (new) group, committing the position after every poll
    (``commit`` sync or async): the second result is the commits, one latency each (a
    synchronous commit's call; an asynchronous one's time to its callback)."""
    from strom.client.consumer import Consumer

    bar = Progress(records, "consume", enabled=progress)
    with Admin(bootstrap) as admin:
        parts = admin.describe_topic(topic).partitions
    tps = [TopicPartition(topic, p.partition) for p in parts]
    got = 0
    nbytes = 0
    latencies: list[float] = []
    commits: list[float] = []
    failed: list[BaseException] = []

    def committed(t0: float) -> Any:
        def callback(_offsets: Any, err: BaseException | None) -> None:
            if err is not None:
                failed.append(err)
            commits.append(time.perf_counter() - t0)

        return callback

    options = dict(consumer_options)
    if group:
        options.update(group_id=group, enable_auto_commit=False)
    with Consumer(bootstrap, auto_offset_reset="earliest", **options) as c:
        if group:
            c.subscribe([topic])
        else:
            c.assign(tps)
        meter = cpu.start()
        start = time.perf_counter()
        caller = time.thread_time()  # the application's thread: poll() and its own loop
        idle_since = None
        while got < records:
            t0 = time.perf_counter()
            want = min(records - got, poll_records)
            if api == "arrow":
                table = c.poll_arrow(timeout_ms=1000, max_records=want)
                n = table.num_rows
                if n:
                    nbytes += table.column("value").nbytes
            else:
                batch = c.poll(timeout_ms=1000, max_records=want)
                n = 0
                for rec in batch:
                    n += 1
                    nbytes += len(rec.value or b"")
            if n:
                latencies.append(time.perf_counter() - t0)
                got += n
                idle_since = None
                bar.update(got)
                if group and commit == "sync":
                    t1 = time.perf_counter()
                    c.commit()
                    commits.append(time.perf_counter() - t1)
                elif group and commit == "async":
                    c.commit_async(callback=committed(time.perf_counter()))
            elif idle_since is None:
                idle_since = time.perf_counter()
            elif time.perf_counter() - idle_since > 10:
                break  # the topic holds fewer records than asked for
        if group and commit == "async":
            c.commit()  # the last position, after every asynchronous one
        caller_s = time.thread_time() - caller
        seconds = time.perf_counter() - start
        usage = meter.stop()
    bar.finish()
    if failed:
        raise RuntimeError(f"{len(failed)} commits failed, the first: {failed[0]}")
    results = [Result(f"consume ({api})", len(latencies), got, nbytes, seconds, latencies, usage)]
    results[0].caller_cpu_s = caller_s
    if group and commit != "none":
        results.append(Result(f"commit ({commit})", len(commits), 0, 0, seconds, commits))
    return results
