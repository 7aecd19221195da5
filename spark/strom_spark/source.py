"""The ``strom`` data source: batch and streaming reads and writes for PySpark 4.

How the Python Data Source API runs it (DESIGN §9): ``partitions()`` and the streaming
offset calls run on the driver (in a Python process Spark starts for planning), so that is
where topics are resolved, offsets looked up, options and data loss checked, and errors
raised; each :class:`RangePartition` becomes one Spark task whose ``read()`` runs in an
executor's Python worker and streams its range from the partition leader
(:mod:`strom_spark.fetch`). Reader objects travel to executors by pickle, so they hold only
options until a driver-side method opens a connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from strom.client.transactions import PreparedTxnState
from strom.client.types import TopicPartition
from strom_spark import txn
from strom_spark.errors import DataLossError, OptionError, StromSparkError, user_facing
from strom_spark.fetch import RangeReader, RangeTask
from strom_spark.lookup import ClusterView, check_ranges
from strom_spark.options import (
    ReadOptions,
    WriteOptions,
    offsets_from_json,
    offsets_json,
    parse_read_options,
    parse_write_options,
)
from strom_spark.planning import (
    OffsetRange,
    Pushed,
    pending,
    push_filters,
    rate_limit,
    split_ranges,
)
from strom_spark.schema import spark_schema
from strom_spark.write import TaskWriter, check_schema, check_topics

log = logging.getLogger(__name__)


class RangePartition(InputPartition):
    """One Spark task: ``value`` is the :class:`RangeTask` (topic, partition, start, end)."""

    def __init__(self, task: RangeTask) -> None:
        super().__init__(task)


def _tasks(ranges: Sequence[OffsetRange], opts: ReadOptions) -> list[InputPartition]:
    pieces = split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
    return [RangePartition(RangeTask(r.tp.topic, r.tp.partition, r.start, r.end)) for r in pieces]


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    task = partition.value
    if not isinstance(task, RangeTask):  # Spark's placeholder when a plan has no range
        return iter(())
    return RangeReader(opts).read(task)


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise StromSparkError(
            "strom: a topic is an append-only log and cannot be overwritten; write with "
            'mode("append")'
        )


class StromDataSource(DataSource):
    """``spark.read.format("strom")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "strom"

    @user_facing
    def schema(self) -> StructType:
        raw = str(self.options.get("includeHeaders", "false")).strip().lower()
        if raw not in ("true", "false"):
            raise OptionError(f"option includeHeaders must be true or false, got {raw!r}")
        self._check_read_options()
        return spark_schema(raw == "true")

    def _check_read_options(self) -> None:
        """A read's options are checked at ``load()``, as Spark's Kafka source checks them,
        not only when a streaming query starts: ``streamReader`` runs then, and PySpark
        buried its clear message in a 21-line StreamingQueryException ending in its own
        UnboundLocalError. ``load()`` does not say whether the read
        is a batch or a stream, so options valid in either pass here; the mode's own rules
        (``endingOffsets`` in a stream, ``startingOffsets=latest`` in a batch) are still
        checked when the reader is made."""
        keys = {str(k).lower() for k in self.options}
        if not keys & {"subscribe", "subscribepattern", "assign"}:
            return  # a write's options (or none): the writer checks those
        try:
            parse_read_options(self.options, streaming=False)
        except OptionError:
            parse_read_options(self.options, streaming=True)  # raises when neither mode fits

    @user_facing
    def reader(self, schema: StructType) -> DataSourceReader:
        self._fixed_schema(schema)
        return StromBatchReader(parse_read_options(self.options, streaming=False))

    @user_facing
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._fixed_schema(schema)
        return StromStreamReader(parse_read_options(self.options, streaming=True))

    def _fixed_schema(self, schema: StructType) -> None:
        """A schema given with ``.schema(...)`` must be the source's own (as Spark's Kafka
        source refuses one): else every task would fail on Spark's own row check."""
        own = self.schema()
        if schema != own:
            raise OptionError(
                "strom: the source's schema is fixed; do not set one with .schema(...) "
                f"(got {schema.simpleString()}, the source reads {own.simpleString()}; "
                "select or cast columns after load(), and use includeHeaders=true for "
                "the headers column)"
            )

    @user_facing
    def writer(self, schema: StructType, overwrite: bool) -> StromBatchWriter:
        _append_only(overwrite)
        opts = parse_write_options(self.options)
        check_schema(schema, opts)
        counts = check_topics(opts, [opts.topic] if opts.topic else [])
        return StromBatchWriter(opts, counts)

    @user_facing
    def streamWriter(self, schema: StructType, overwrite: bool) -> StromStreamWriter:
        # Complete output mode arrives as overwrite=True: every trigger appends the whole
        # result again, which readers resolve by keeping the latest record per key.
        opts = parse_write_options(self.options)
        check_schema(schema, opts)
        counts = check_topics(opts, [opts.topic] if opts.topic else [])
        return StromStreamWriter(opts, counts)


# -- batch read -----------------------------------------------------------------------------


class StromBatchReader(DataSourceReader):
    """Plans one task per partition range; filters on topic/partition/offset/timestamp
    narrow the ranges (see :class:`strom_spark.planning.Pushed`)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.pushed = Pushed()

    def pushFilters(self, filters: list[Any]) -> list[Any]:
        self.pushed, rest = push_filters(filters)
        return rest

    @user_facing
    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        with ClusterView(opts) as view:
            tps = view.partitions(opts.subscription)
            # Only the partitions the pushed-down filters keep are looked up: one the query
            # filters out must not fail it (its leader may be down).
            kept = [tp for tp in tps if self.pushed.keeps(tp)]
            if not kept:
                return []
            earliest = view.earliest(kept)
            latest = view.latest(kept)
            bounds = {"earliest": earliest, "latest": latest, "covered": tps}
            starts = view.resolve(opts.starting, kept, start=True, **bounds)
            ends = view.resolve(opts.ending, kept, start=False, **bounds)
            ranges = check_ranges(opts, starts, ends, earliest, latest)
            ranges = [self.pushed.narrow(r) for r in ranges]
            ranges = [r for r in ranges if r.size > 0]
            if self.pushed.timestamp_lo_ms is not None and ranges:
                found = view.for_times({r.tp: self.pushed.timestamp_lo_ms for r in ranges})
                # No record that new in a partition (None): nothing of it matches.
                firsts = {r.tp: r.end if found[r.tp] is None else found[r.tp] for r in ranges}
                ranges = [OffsetRange(r.tp, max(r.start, firsts[r.tp]), r.end) for r in ranges]
        return _tasks(ranges, opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


# -- streaming read -------------------------------------------------------------------------


class StromStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offset ranges. Offsets are Kafka's JSON (``{"t": {"0": 42}}``),
    checkpointed by Spark; a replayed batch reads exactly the same ranges. New partitions (and,
    with subscribePattern, new topics) join from offset 0."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._view: ClusterView | None = None
        self._latest: dict[TopicPartition, int] | None = None
        self._target: dict[TopicPartition, int] | None = None
        #: When a trigger last read (or found the delay passed): None until the first one,
        #: which never waits (Kafka's lastTriggerMillis starts at 0: a
        #: query started or restarted with a backlog sat out all of maxTriggerDelay, 15
        #: minutes by default, before reading it).
        self._last_trigger: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_view"] = None  # connections stay on the driver
        return state

    @property
    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self.opts)
        return self._view

    @user_facing
    def initialOffset(self) -> dict:
        view = self.view
        tps = view.partitions(self.opts.subscription)
        earliest = view.earliest(tps)
        latest = view.latest(tps)
        starts = view.resolve(self.opts.starting, tps, start=True, earliest=earliest, latest=latest)
        for tp in sorted(starts):
            if starts[tp] <= latest[tp]:
                continue
            # As Spark's Kafka source: an offset past the end is reported like lost data
            # (a checkpoint of an older incarnation of the topic, a typo), not waited for.
            message = (
                f"strom: startingOffsets asks for offset {starts[tp]} of {tp.topic}-"
                f"{tp.partition}, which ends at {latest[tp]}"
            )
            if self.opts.fail_on_data_loss:
                raise DataLossError(
                    f"{message}. Set failOnDataLoss=false to start at its end instead."
                )
            log.warning("%s; starting at its end (failOnDataLoss=false)", message)
            starts[tp] = latest[tp]
        return offsets_json(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    @user_facing
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        view = self.view
        begin = offsets_from_json(start)
        tps = self._partitions_checked(begin)
        # Partitions without a leader right now (just created, mid-election) sit this
        # trigger out: new ones join later, known ones keep their offsets until then.
        latest = self._latest_checked(begin, view.latest(view.ready(tps)))
        self._latest = dict(latest)
        end = dict(latest)
        if self._target is not None:  # Trigger.AvailableNow: nothing newer than the target
            end = {tp: min(off, self._target[tp]) for tp, off in end.items() if tp in self._target}
        present = set(tps)
        for tp, off in begin.items():
            # A partition without a leader now keeps its offset; one whose log shrank below
            # what was read goes on from its new end (reported by _latest_checked), as Spark's
            # Kafka source does. One gone from the cluster is dropped (_partitions_checked).
            if tp in present:
                end.setdefault(tp, off)
        if not isinstance(limit, ReadAllAvailable):
            minimum = self.opts.min_offsets_per_trigger
            if minimum is not None and self._target is None:
                now = time.monotonic()
                last = self._last_trigger
                if last is None or (now - last) * 1000.0 >= self.opts.max_trigger_delay_ms:
                    self._last_trigger = now  # as Kafka's delayBatch: due, whatever is there
                elif pending(begin, end) < minimum:
                    return offsets_json(begin)
            maximum = self.opts.max_offsets_per_trigger
            if isinstance(limit, ReadMaxRows):
                maximum = limit.max_rows if maximum is None else min(maximum, limit.max_rows)
            if maximum is not None:
                end = rate_limit(maximum, begin, end)
        if end != begin:
            self._last_trigger = time.monotonic()
        return offsets_json(end)

    def _partitions_checked(self, begin: dict[TopicPartition, int]) -> list[TopicPartition]:
        """The partitions the subscription covers now. Ones the query has read that are gone
        (their topic was deleted, or no longer subscribed) are dropped from its offsets, as
        Spark's Kafka source does: kept, every later batch would look them up and fail, the
        checkpoint included. Metadata is asked again first (a node may not know a topic for a
        moment); then a DataLossError, or with failOnDataLoss=false a warning."""
        opts = self.opts
        tps = self.view.partitions(opts.subscription, missing_ok=True)
        for _ in range(opts.offset_retries):
            if set(begin) <= set(tps):
                return tps
            time.sleep(opts.offset_retry_interval_ms / 1000.0)
            tps = self.view.partitions(opts.subscription, missing_ok=True)
        gone = sorted(set(begin) - set(tps))
        if not gone:
            return tps
        names = ", ".join(f"{tp.topic}-{tp.partition} (read up to {begin[tp]})" for tp in gone)
        message = (
            f"strom: data loss: {names} {'is' if len(gone) == 1 else 'are'} gone from the "
            "cluster (the topic was deleted) or from the subscription: records written there "
            "since may have been missed"
        )
        if opts.fail_on_data_loss:
            raise DataLossError(f"{message}. Set failOnDataLoss=false to go on without them.")
        log.warning("%s; going on without them (failOnDataLoss=false)", message)
        return tps

    def _latest_checked(
        self, begin: dict[TopicPartition, int], latest: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """``latest``, after making sure no partition ends below what the query has read.

        A log end that falls below a checkpointed offset means records were lost to the
        query: the topic was deleted and re-created, or an unclean leader election cut the
        log. Asked again first (``fetchOffset.numRetries`` times, ``retryIntervalMs`` apart,
        as Spark's Kafka source does): a watermark may lag for a moment after a leader
        change. Then a DataLossError, or with failOnDataLoss=false a warning, and the
        partition goes on from its new end."""
        opts = self.opts
        for _ in range(opts.offset_retries):
            shrunk = [tp for tp, off in latest.items() if tp in begin and off < begin[tp]]
            if not shrunk:
                return latest
            time.sleep(opts.offset_retry_interval_ms / 1000.0)
            latest.update(self.view.latest(shrunk))
        for tp, off in sorted(latest.items()):
            if tp not in begin or off >= begin[tp]:
                continue
            message = (
                f"strom: data loss in {tp.topic}-{tp.partition}: the query has read it up to "
                f"offset {begin[tp]}, but it ends at {off} now (the topic was deleted and "
                "re-created, or its log was truncated): records written there since may be "
                "missed"
            )
            if opts.fail_on_data_loss:
                raise DataLossError(
                    f"{message}. Set failOnDataLoss=false to go on from offset {off}."
                )
            log.warning("%s; going on from offset %d (failOnDataLoss=false)", message, off)
        return latest

    def reportLatestOffset(self) -> dict | None:
        """The partitions' high watermarks at the last latestOffset call: Spark puts them in
        the query progress as the source's ``latestOffset``, next to ``endOffset``, so lag is
        their difference (:func:`strom_spark.progress.lag`)."""
        return offsets_json(self._latest) if self._latest is not None else None

    @user_facing
    def prepareForTriggerAvailableNow(self) -> None:
        """The run's target: every partition's end now. A partition without a leader is
        waited for within the lookup budget, then the run fails naming it (as Kafka's
        endOffsets lookup would): it was left out, and the run reported
        success without reading it."""
        view = self.view
        tps = view.partitions(self.opts.subscription, missing_ok=True)
        self._target = view.latest(tps)

    @user_facing
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        opts = self.opts
        # Only partitions with something to read are looked up: one whose leader is down or
        # whose topic is gone sits at its offset in a planned batch (latestOffset), and must
        # not fail it, nor every restart that replays it from the checkpoint.
        wanted = [tp for tp in sorted(stop) if stop[tp] > begin.get(tp, 0)]
        present = set(self.view.known(wanted)) if wanted else set()
        earliest = self.view.earliest([tp for tp in wanted if tp in present])
        ranges: list[OffsetRange] = []
        for tp in wanted:
            s, e = begin.get(tp, 0), stop[tp]
            if tp not in present:
                message = (
                    f"strom: data loss in {tp.topic}-{tp.partition}: the query needs offsets "
                    f"{s} to {e - 1}, but the partition is gone from the cluster (its topic "
                    "was deleted)"
                )
                if opts.fail_on_data_loss:
                    raise DataLossError(
                        message + ". Set failOnDataLoss=false to skip lost records and go on."
                    )
                log.warning("%s; skipped (failOnDataLoss=false)", message)
                continue
            first = earliest[tp]
            if s < first:
                what = "is new and starts" if tp not in begin else "starts"
                message = (
                    f"strom: data loss in {tp.topic}-{tp.partition}: the query needs offsets "
                    f"from {s}, but the partition {what} at {first} now (offsets {s} to "
                    f"{first - 1} were deleted by retention or DeleteRecords)"
                )
                if opts.fail_on_data_loss:
                    raise DataLossError(
                        message + ". Set failOnDataLoss=false to skip lost records and go on."
                    )
                log.warning("%s; skipped (failOnDataLoss=false)", message)
                s = min(first, e)
            if e > s:
                ranges.append(OffsetRange(tp, s, e))
        return _tasks(ranges, opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets (no consumer group)."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


# -- writes ---------------------------------------------------------------------------------


@dataclass
class StromCommitMessage(WriterCommitMessage):
    """What one write task sent: its row count (the driver logs the total), and, for an
    exactly-once task, its prepared transaction (the driver commits it) or whether it found its
    micro-batch already committed and sent nothing."""

    rows: int
    skipped: bool = False
    prepared: PreparedTxnState | None = None


def _write_task(
    opts: WriteOptions,
    counts: dict[str, int],
    batches: Iterator[pa.RecordBatch],
    write_id: str | None = None,
) -> StromCommitMessage:
    if opts.exactly_once:
        done = txn.write_task(opts, counts, batches, write_id)
        return StromCommitMessage(
            rows=done.result.rows, skipped=done.skipped, prepared=done.prepared
        )
    writer = TaskWriter(opts, counts)
    try:
        for batch in batches:
            writer.write(batch)
        result = writer.close()
    except BaseException:
        writer.abort()
        raise
    return StromCommitMessage(rows=result.rows)


def _summary(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, StromCommitMessage)]
    return sum(m.rows for m in done), sum(1 for m in done if m.skipped)


def _prepared(messages: list[WriterCommitMessage | None]) -> list[PreparedTxnState]:
    return [
        m.prepared for m in messages if isinstance(m, StromCommitMessage) and m.prepared is not None
    ]


class StromBatchWriter(DataSourceArrowWriter):
    """``df.write.format("strom")``: at least once, or one transaction per task with
    ``exactlyOnce`` (see :mod:`strom_spark.txn`)."""

    def __init__(self, opts: WriteOptions, counts: dict[str, int]) -> None:
        self.opts = opts
        self.counts = counts
        #: The run id of this write's transactional ids (drawn here, on the driver, so that a
        #: task Spark retries finds what its earlier attempt committed).
        self.write_id = txn.new_write_id() if opts.exactly_once else None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StromCommitMessage:
        return _write_task(self.opts, self.counts, iterator, self.write_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        txn.complete(self.opts, _prepared(messages), commit=True)
        rows, skipped = _summary(messages)
        log.info("strom: wrote %d rows (%d task retries found their rows committed)", rows, skipped)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, _ = _summary(messages)
        if self.opts.exactly_once:
            txn.complete(self.opts, _prepared(messages), commit=False)
            # A task that failed or that Spark killed sent no message, but may have left its
            # transaction open: read_committed readers would wait at it until its timeout.
            # No later attempt reuses this write's ids, so fence them here.
            assert self.write_id is not None
            txn.fence_slots(
                self.opts, self.write_id, [i for i, m in enumerate(messages) if m is None]
            )
            log.warning(
                "strom: write aborted; the transactions of its tasks (%d rows) were aborted",
                rows,
            )
            return
        # (a failed task sends no message: its error says how many of its rows stay written)
        log.warning(
            "strom: write aborted; %d rows of finished tasks stay written, and failed tasks' "
            "rows acknowledged before they failed too, as their errors say (no transactions)",
            rows,
        )


class StromStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("strom")``: each micro-batch at least once, or exactly once with
    ``exactlyOnce`` (see :mod:`strom_spark.txn`)."""

    def __init__(self, opts: WriteOptions, counts: dict[str, int]) -> None:
        self.opts = opts
        self.counts = counts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StromCommitMessage:
        return _write_task(self.opts, self.counts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        txn.complete(self.opts, _prepared(messages), commit=True)
        rows, skipped = _summary(messages)
        if skipped:
            log.warning(
                "strom: micro-batch %d was run again: %d task(s) found their rows already "
                "committed and sent nothing",
                batchId,
                skipped,
            )
        log.info("strom: micro-batch %d wrote %d rows", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.exactly_once:
            txn.complete(self.opts, _prepared(messages), commit=False)
            log.warning(
                "strom: micro-batch %d aborted; its tasks' transactions were aborted (the "
                "micro-batch runs again after a restart)",
                batchId,
            )
            return
        log.warning(
            "strom: micro-batch %d aborted; rows already sent stay written (no transactions)",
            batchId,
        )
