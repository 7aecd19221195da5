"""``strom demo`` (``make demo``): the main job, a Spark pipeline over a local strom cluster.

1. Start a local cluster of real processes (etcd, a controller, three storage nodes).
2. Create a ``page-views`` topic (6 partitions, 2 replicas) and a ``page-view-counts`` topic.
3. A Python service produces page views: keyed by user, JSON values, a ``source`` header,
   event timestamps; a first load, then a steady stream while Spark works.
4. Spark (local[2]) reads the topic as a batch: one task per partition, top pages.
5. A streaming query counts views per page in micro-batches, printing one progress line per
   trigger (rows, rows/s, lag behind the topic), and writes the counts to ``page-view-counts``.
6. The counts are read back from that topic and printed, and checked against a batch recount.
7. Everything is shut down.

It takes about two minutes on 2 cores, most of it Spark starting and planning micro-batches.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

EVENTS = "page-views"
COUNTS = "page-view-counts"
PAGES = [
    "/",
    "/search",
    "/cart",
    "/checkout",
    "/account",
    "/help",
    *(f"/products/{name}" for name in ("kettle", "lamp", "chair", "desk", "mug", "rug", "clock")),
    *(f"/blog/{n}" for n in range(1, 14)),
]
COUNTRIES = ["DE", "US", "FR", "IN", "BR", "JP", "NL", "PL"]
USERS = 5000
VALUE_SCHEMA = "user STRING, page STRING, country STRING, ms INT"


def page_views(n: int, rng: np.random.Generator, now_ms: int) -> pa.Table:
    """``n`` page views as an Arrow table (key, value, headers, timestamp), built column by
    column: the service never loops over events in Python."""
    weights = 1.0 / np.arange(1, len(PAGES) + 1) ** 1.1  # a few pages get most views
    page = pc.take(pa.array(PAGES), pa.array(rng.choice(len(PAGES), n, p=weights / weights.sum())))
    user = pc.take(
        pa.array([f"user-{i:04d}" for i in range(USERS)]), pa.array(rng.integers(0, USERS, n))
    )
    country = pc.take(pa.array(COUNTRIES), pa.array(rng.integers(0, len(COUNTRIES), n)))
    ms = pc.cast(pa.array(rng.gamma(2.0, 60.0, n).astype(np.int64)), pa.string())
    value = pc.binary_join_element_wise(
        '{"user":"', user, '","page":"', page, '","country":"', country, '","ms":', ms, "}", ""
    )
    source = pc.take(pa.array([b"web", b"app"], pa.binary()), pa.array(rng.integers(0, 2, n)))
    header = pa.StructArray.from_arrays(
        [pa.repeat(pa.scalar("source"), n), source],
        fields=[pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())],
    )
    headers = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), header)
    stamps = now_ms - rng.integers(0, 1000, n)
    return pa.table(
        {
            "key": user.cast(pa.binary()),
            "value": value.cast(pa.binary()),
            "headers": headers,
            "timestamp": pa.array(stamps, pa.int64()),
        }
    )


class PageViewService(threading.Thread):
    """The 'Python service': produces about ``rate`` page views per second until stopped."""

    def __init__(self, bootstrap: str, rate: int, seed: int = 7) -> None:
        super().__init__(name="page-view-service", daemon=True)
        self.bootstrap = bootstrap
        self.rate = rate
        self.rng = np.random.default_rng(seed)
        self.sent = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        from strom.client.producer import Producer

        try:
            with Producer(self.bootstrap, acks="all", linger_ms=20) as producer:
                tick = 0.1
                per_tick = max(int(self.rate * tick), 1)
                next_at = time.monotonic()
                while not self._stop_event.is_set():
                    table = page_views(per_tick, self.rng, int(time.time() * 1000))
                    producer.send_batch(EVENTS, table).result(60)
                    self.sent += per_tick
                    next_at += tick
                    self._stop_event.wait(max(next_at - time.monotonic(), 0))
        except BaseException as exc:  # reported by the demo
            self.error = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


def _stop_half_started_spark() -> None:
    """Interrupted while Spark started: stop its context or its JVM, whichever exists."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return
    with contextlib.suppress(Exception):
        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
            return
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.kill()
        return
    # Interrupted before PySpark kept a handle: the JVM is still our child process.
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if stat.rsplit(")", 1)[1].split()[1] == me and b"java" in cmd:
                os.kill(int(pid), signal.SIGKILL)


class _Interrupt:
    """Ctrl-C (SIGINT) and SIGTERM while the demo runs: stop what it started, quietly.

    Before Spark is up the handler raises KeyboardInterrupt at once. Once it is up, raising
    inside a Py4J call (the main thread waits in one for every Spark job) makes Py4J log ~45
    lines of tracebacks, and PySpark's own SIGINT handler, which replaces any earlier one when
    the SparkContext starts, calls the JVM from inside such a call ("reentrant call inside
    <_io.BufferedReader>"). So then the handler only notes the
    signal and cancels Spark's jobs and streaming queries from another thread; the call the
    main thread waits in returns with an error, and :meth:`check` (or the demo's ``except``)
    turns that into KeyboardInterrupt."""

    #: How often the cancelling thread stops queries and cancels jobs again.
    CANCEL_EVERY_S = 0.2

    def __init__(self) -> None:
        self.signum: int | None = None
        self.spark: Any = None
        self._closed = threading.Event()
        self._canceller: threading.Thread | None = None

    def handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and self.spark is not None:
            return  # already stopping: a second Ctrl-C must not cut the clean-up short
        self.signum = signum
        if self.spark is None:
            raise KeyboardInterrupt(f"signal {signum}")
        self._canceller = threading.Thread(target=self._cancel, name="demo-interrupt", daemon=True)
        self._canceller.start()

    def _cancel(self) -> None:
        """Stop the streaming queries and cancel Spark's jobs, again and again until
        :meth:`close`: a job the main thread starts after the signal (it was between two
        steps) is cancelled too. Found under load: a Ctrl-C just before the batch read's job
        began cancelled nothing, and the batch read and the top-pages query ran for four
        more minutes before the streaming loop noticed."""
        while True:
            with contextlib.suppress(Exception):
                for query in self.spark.streams.active:
                    query.stop()
            with contextlib.suppress(Exception):
                self.spark.sparkContext.cancelAllJobs()
            if self._closed.wait(self.CANCEL_EVERY_S):
                return

    def close(self) -> None:
        """Stop cancelling (before Spark itself is stopped): the demo is shutting down."""
        self._closed.set()
        if self._canceller is not None:
            self._canceller.join(10)

    @property
    def interrupted(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Raise KeyboardInterrupt once a signal came (the demo's loops call it)."""
        if self.signum is not None:
            raise KeyboardInterrupt(f"signal {self.signum}")

    def describe(self) -> str:
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum or 0).name

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again: PySpark took SIGINT when its context started)."""
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)


@contextlib.contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` while the JVM starts, so Spark's start-up
    chatter and later log lines go to a file (the JVM keeps the descriptors it inherited)
    while the demo's own lines stay on the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


class _Say:
    """Prints the demo's lines with the time since it began."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.perf_counter()
        self._later: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:5.1f}s] {text}", file=self.out, flush=True)

    def later(self, text: str) -> None:
        """Note a line now, print it with :meth:`flush` (while stdout points elsewhere)."""
        with self._lock:
            self._later.append((time.perf_counter() - self.t0, text))

    def flush(self) -> None:
        with self._lock:
            lines, self._later = sorted(self._later), []
        for at, text in lines:
            print(f"[{at:5.1f}s] {text}", file=self.out, flush=True)

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        cells = [[str(c) for c in header]] + [
            [f"{c:,}" if isinstance(c, int) else str(c) for c in r] for r in rows
        ]
        widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
        for r in cells:
            line = "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            print(f"{'':9}{line}", file=self.out)


def run_spark_demo(
    data_dir: str | None = None,
    events: int = 100_000,
    stream_seconds: float = 10.0,
    rate: int = 10_000,
    per_trigger: int = 40_000,
    out: TextIO | None = None,
) -> int:
    """The whole pipeline; returns 0 when the streaming counts equal a batch recount."""
    out = out or sys.stdout
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from strom.client.admin import Admin
    from strom.client.producer import Producer
    from strom.devcluster.cluster import LocalCluster

    say = _Say(out)
    # Ctrl-C and SIGTERM (a timeout, `kill`) must still stop the cluster: its processes run in
    # their own sessions and would outlive the demo.
    interrupt = _Interrupt()
    previous: tuple[Any, Any] | None = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        interrupt.install()
    root = Path(data_dir or tempfile.mkdtemp(prefix="strom-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    say(f"strom demo: a Spark pipeline on a local strom cluster (data in {root})")
    cluster = LocalCluster(root / "cluster", nodes=3, controllers=1, coordinators=0)
    spark = None
    service: PageViewService | None = None
    passed = False
    try:
        # The cluster and Spark start side by side (Spark's JVM takes the longest); the
        # cluster's lines are printed once Spark is up, with the times they happened at.
        prep_error: list[BaseException] = []

        def prepare() -> None:
            try:
                cluster.start()
                say.later(
                    f"cluster up: etcd, a controller and 3 storage nodes at {cluster.bootstrap}"
                )
                with Admin(cluster.bootstrap) as admin:
                    admin.create_topic(EVENTS, partitions=6, replication_factor=2)
                    admin.create_topic(COUNTS, partitions=3, replication_factor=2)
                say.later(
                    f"created topics {EVENTS} (6 partitions, 2 replicas) and {COUNTS} "
                    "(3 partitions, 2 replicas)"
                )
                t = time.perf_counter()
                rng = np.random.default_rng(1)
                table = page_views(events, rng, int(time.time() * 1000))
                with Producer(cluster.bootstrap, acks="all") as producer:
                    producer.send_batch(EVENTS, table).result(120)
                say.later(
                    f"a Python service produced {events:,} page views (key = user, JSON value, "
                    f"a 'source' header) in {time.perf_counter() - t:.1f}s"
                )
            except BaseException as exc:
                prep_error.append(exc)

        say("starting a local strom cluster and Spark (local[2]) side by side")
        prep = threading.Thread(target=prepare, name="demo-prepare", daemon=True)
        prep.start()

        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from strom_spark import register, total_lag
        from strom_spark.progress import end_offsets

        spark_log = root / "spark.log"
        with jvm_output_to(spark_log):
            spark = (
                SparkSession.builder.master("local[2]")
                .appName("strom-demo")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.sql.session.timeZone", "UTC")
                .getOrCreate()
            )
        if previous is not None:
            interrupt.install()
        interrupt.spark = spark
        interrupt.check()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        kept = "" if data_dir else ", kept only if the run fails"
        say.later(
            f"Spark {spark.version} started (its own log goes to {spark_log}{kept}); strom "
            "registered as a data source"
        )
        prep.join()
        say.flush()
        if prep_error:
            raise prep_error[0]
        interrupt.check()  # a Ctrl-C while the cluster was still starting
        bootstrap = cluster.bootstrap

        def events_df() -> Any:
            return (
                spark.read.format("strom")
                .option("bootstrap", bootstrap)
                .option("subscribe", EVENTS)
                .option("includeHeaders", "true")
                .load()
            )

        # -- batch -----------------------------------------------------------------------
        t = time.perf_counter()
        df = events_df()
        n = df.count()
        dt = time.perf_counter() - t
        say(
            f"batch read: {n:,} page views in {df.rdd.getNumPartitions()} Spark tasks (one "
            f"per partition) in {dt:.1f}s"
        )
        views = events_df().select(
            F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v"),
            F.expr("filter(headers, h -> h.key = 'source')[0].value").cast("string").alias("src"),
        )
        top = (
            views.groupBy("v.page")
            .agg(
                F.count("*").alias("views"),
                F.round(F.avg("v.ms")).cast("int").alias("avg_ms"),
                F.round(100 * F.avg(F.expr("IF(src = 'app', 1, 0)"))).cast("int").alias("app"),
            )
            .orderBy(F.desc("views"))
            .limit(5)
            .collect()
        )
        say("top pages so far (the 'source' header says web or app):")
        say.table(
            ["page", "views", "avg ms", "% app"],
            [[r["page"], r["views"], r["avg_ms"], r["app"]] for r in top],
        )

        # -- streaming ---------------------------------------------------------------------
        say(
            f"a streaming query counts views per page (at most {per_trigger:,} records per "
            f"micro-batch) and writes the counts to {COUNTS}:"
        )
        counts = (
            spark.readStream.format("strom")
            .option("bootstrap", bootstrap)
            .option("subscribe", EVENTS)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(per_trigger))
            .load()
            .select(F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v"))
            .groupBy("v.page")
            .count()
            .select(
                F.col("page").alias("key"),
                F.to_json(F.struct("page", F.col("count").alias("views"))).alias("value"),
            )
        )
        # Python sinks take append and complete output modes; complete rewrites every page's
        # count each trigger (a few dozen rows), and readers keep the latest per key.
        query = (
            counts.writeStream.format("strom")
            .option("bootstrap", bootstrap)
            .option("topic", COUNTS)
            .option("checkpointLocation", str(root / "checkpoint"))
            .outputMode("complete")
            .trigger(processingTime="1 second")
            .start()
        )
        printed = -1

        def report_progress() -> Any:
            nonlocal printed
            last = None
            for p in query.recentProgress:
                if p["batchId"] > printed and p["numInputRows"] > 0:
                    printed = p["batchId"]
                    say(
                        f"  micro-batch {p['batchId']:>2}: {p['numInputRows']:>6,} rows, "
                        f"{p['processedRowsPerSecond']:>8,.0f} rows/s, lag "
                        f"{total_lag(p):>7,} records"
                    )
                last = p
            return last

        def check_alive() -> None:
            interrupt.check()
            if not query.isActive:
                raise RuntimeError(f"the streaming query stopped: {query.exception()}")

        while printed < 0:
            check_alive()
            report_progress()
            time.sleep(0.1)
        service = PageViewService(bootstrap, rate)
        service.start()
        say(f"  ... and the service keeps producing about {rate:,} page views/s meanwhile")
        deadline = time.monotonic() + stream_seconds
        while time.monotonic() < deadline:
            check_alive()
            report_progress()
            time.sleep(0.1)
        service.stop()
        if service.error is not None:
            raise service.error
        total = events + service.sent
        say(f"  service stopped after {service.sent:,} more page views; the query catches up")
        caught_up_by = time.monotonic() + 300
        while True:
            check_alive()
            last = report_progress()
            done = sum(end_offsets(last).values()) if last is not None else 0
            if done >= total:
                break
            if time.monotonic() > caught_up_by:
                raise RuntimeError(f"the streaming query did not catch up ({done} of {total})")
            time.sleep(0.1)
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        query.stop()

        # -- read the result back ------------------------------------------------------------
        result = (
            spark.read.format("strom")
            .option("bootstrap", bootstrap)
            .option("subscribe", COUNTS)
            .load()
        )
        latest = (
            result.groupBy("key")
            .agg(F.max_by("value", "offset").alias("value"), F.count("*").alias("updates"))
            .select(
                F.from_json(F.col("value").cast("string"), "page STRING, views BIGINT").alias("c"),
                "updates",
            )
            .select("c.page", "c.views", "updates")
            .collect()
        )
        streamed = {r["page"]: r["views"] for r in latest}
        updates = sum(r["updates"] for r in latest)
        say(
            f"read {COUNTS} back: {updates:,} count updates for {len(streamed)} pages; the "
            "latest per page:"
        )
        ranked = sorted(latest, key=lambda r: -r["views"])
        say.table(["page", "views"], [[r["page"], r["views"]] for r in ranked[:10]])
        recount = {
            r["page"]: r["count"]
            for r in events_df()
            .select(F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v"))
            .groupBy("v.page")
            .count()
            .collect()
        }
        ok = recount == streamed and sum(recount.values()) == total
        say(
            f"check: the streamed counts {'equal' if ok else 'DIFFER FROM'} a batch recount of "
            f"all {sum(recount.values()):,} page views"
        )
        interrupt.check()
        passed = ok
        return 0 if ok else 1
    except Exception:
        # A Spark call cut short by the interruption fails with Spark's error: the
        # interruption is what happened.
        interrupt.check()
        raise
    finally:
        # Lines noted while stdout pointed at Spark's log come first, in their time order.
        say.flush()
        interrupt.close()
        _stop_all(say, service, spark, cluster, quiet=interrupt.interrupted)
        where = f"its data and logs are kept in {root}" if data_dir is None else f"data in {root}"
        if interrupt.interrupted:
            say(f"interrupted ({interrupt.describe()}): stopped Spark and the cluster; {where}")
        elif data_dir is None and not passed:
            # A failed run keeps its logs (Spark's, the services'): the first line named them
            # (they were deleted even when the run failed).
            say(f"the run did not pass: {where}")
        if data_dir is None and passed:
            shutil.rmtree(root, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])


def _stop_all(
    say: _Say,
    service: PageViewService | None,
    spark: Any,
    cluster: Any,
    *,
    quiet: bool,
) -> None:
    """Stop the service, Spark and the cluster, in that order; a line for each unless
    ``quiet`` (an interrupted run says it all in one line)."""
    if service is not None and service.is_alive():
        service.stop()
    if spark is not None:
        spark.stop()
        if not quiet:
            say("stopped Spark")
    else:
        _stop_half_started_spark()
    cluster.stop()
    if not quiet:
        say("stopped the cluster (each node handed its partitions over first)")
