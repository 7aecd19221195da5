"""Exactly-once writes (``exactlyOnce=true``): one strom transaction per Spark write task,
prepared by the task and committed by the driver (a two-phase commit).

Spark runs a write task again when it fails (a retry, or the re-run of a whole micro-batch after
a restart from the checkpoint), and a driver that dies after the tasks committed but before
Spark's own commit log was written re-runs a micro-batch whose rows are already in the topic.
Per task (its *slot* is the Spark partition id), this module:

1. opens a transactional :class:`strom.Producer` with the transactional id
   ``<prefix>-<run>-<slot>``, where *run* is the streaming query's id (kept in the checkpoint,
   so it is the same after a restart) or, for a batch write, an id drawn once per write on the
   driver. ``init_transactions()`` fences an older attempt of the same slot (a zombie) and
   aborts, or completes, the transaction it left;
2. reads the slot's bookkeeping: the offset the group ``<prefix>-<run>-<slot>`` committed (with
   require_stable: a transaction still completing is waited for) is the last micro-batch id the
   slot committed, its metadata the row count;
3. if that batch is this one (or later), the rows are already in the topic: the task sends
   nothing (it checks that it got as many rows as the committed attempt, see below);
4. else it sends its rows in one transaction together with the bookkeeping offset
   (``send_offsets_to_transaction``) and *prepares* it (``Producer.prepare_transaction()``:
   flushed, undecided) instead of committing: its commit message carries the prepared state.
   A failure before that aborts the transaction (read_committed readers never see the rows).
5. the driver commits every task's prepared transaction (:func:`complete`) when Spark commits
   the write or micro-batch, and aborts them when Spark aborts it: the rows and "slot done for
   batch B" become visible atomically, and only for task attempts Spark accepted. Why not
   commit in the task: when Spark fails a task because its input failed, the Python writer
   may see a normal end of a cut-short input and would commit part of the slot's rows.

The bookkeeping offset needs a partition the coordinator knows: the write's ``topic`` option,
partition 0, else ``__consumer_offsets`` partition 0 (the offset's value is the batch id; it
names no position in that topic).

What this relies on: a re-run of micro-batch B gives every slot the same rows as before. Spark
re-runs a micro-batch from its offset log (the strom source plans the same ranges, in the same
order, for the same offsets) with the checkpoint's ``spark.sql.shuffle.partitions``, so this
holds unless the query or its options were changed between the attempts (``minPartitions``,
``maxRecordsPerPartition``, a ``repartition``) or retention deleted some of its records in
between (``failOnDataLoss=false``). A slot whose committed row count differs from
what the re-run gives it fails the task with an error that says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pyarrow as pa

from strom.api import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from strom.client.admin import Admin
from strom.client.cluster import ClusterClient
from strom.client.transactions import (
    GroupMetadata,
    PreparedTxnState,
    complete_prepared_transaction,
)
from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import COORDINATOR_REFRESH_CODES, ErrorCode, StromError, error_for
from strom_spark.errors import StromSparkError
from strom_spark.options import WriteOptions
from strom_spark.write import TaskWriter, WriteResult

#: The prefix of transactional ids and bookkeeping groups when no transactionalIdPrefix is set.
DEFAULT_PREFIX = "strom-spark-sink"
#: The partition keyed when the write has no topic option.
FALLBACK_KEY = TopicPartition("__consumer_offsets", 0)
#: Spark's task-local properties of a streaming micro-batch (StreamExecution sets them).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: How long a task waits for the bookkeeping offset to become stable or readable.
LOOKUP_TIMEOUT_S = 60.0
#: How long a failing task tries to abort its transaction (else the next attempt's fencing,
#: or the transaction timeout, aborts it).
ABORT_TIMEOUT_S = 10.0

E = ErrorCode
log = logging.getLogger(__name__)
_TRANSPORT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def new_write_id() -> str:
    """The *run* of one batch write (drawn on the driver, shared by its tasks' retries)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Slot:
    """One task's transactional id, bookkeeping group and the partition its offset is kept
    under."""

    transactional_id: str
    group: str
    key: TopicPartition

    @classmethod
    def make(cls, opts: WriteOptions, run: str, partition_id: int) -> Slot:
        prefix = opts.transactional_id_prefix or DEFAULT_PREFIX
        name = f"{prefix}-{run}-{partition_id}"
        key = TopicPartition(opts.topic, 0) if opts.topic else FALLBACK_KEY
        return cls(transactional_id=name, group=name, key=key)


@dataclass(frozen=True)
class Committed:
    """What a slot's bookkeeping says: the last batch it committed and that batch's rows."""

    batch: int
    rows: int


@dataclass
class TxnWriteResult:
    """One exactly-once task: what it wrote and its prepared transaction (for the driver to
    commit), or that it found its batch already committed."""

    result: WriteResult
    batch: int
    skipped: bool = False
    prepared: PreparedTxnState | None = None


def task_identity(write_id: str | None) -> tuple[str, int, int]:
    """(run, batch id, slot) of the running task: the query id and micro-batch id Spark sets as
    task-local properties for a stream; ``write_id`` and batch 0 for a batch write."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise StromSparkError("strom: exactlyOnce writes run inside Spark tasks only")
    if write_id is not None:
        return write_id, 0, ctx.partitionId()
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if not query or batch is None:
        raise StromSparkError(
            "strom: exactlyOnce: Spark did not tell the task its streaming query and "
            f"micro-batch ({QUERY_ID_PROPERTY}={query!r}, {BATCH_ID_PROPERTY}={batch!r})"
        )
    return query, int(batch), ctx.partitionId()


def committed_batch(client: ClusterClient, slot: Slot, timeout_s: float) -> Committed | None:
    """The slot's last committed batch (None: never committed). OffsetFetch with
    require_stable: while a transaction of the slot is completing, wait for its outcome."""
    req = coordinator_pb2.OffsetFetchRequest(
        group_id=slot.group,
        member_epoch=-1,
        topics=[common_pb2.TopicPartitions(topic=slot.key.topic, partitions=[slot.key.partition])],
        require_stable=True,
    )
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    coordinator: str | None = None
    while time.monotonic() < deadline:
        try:
            if coordinator is None:
                coordinator = client.find_coordinator(slot.group)
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(client.channel(coordinator))
            resp = stub.OffsetFetch(req, timeout=min(client.timeout_s, 10.0))
        except grpc.RpcError as exc:
            if exc.code() not in _TRANSPORT:
                raise StromSparkError(
                    f"strom: reading the sink's bookkeeping (group {slot.group!r}) failed: "
                    f"{exc.code().name} {exc.details() or ''}"
                ) from None
            coordinator, last = None, exc.code().name
        except StromError as exc:
            if not exc.retriable:
                raise
            coordinator, last = None, str(exc)
        else:
            code = resp.error_code
            if code == E.NONE:
                parts = [p for t in resp.topics for p in t.partitions]
                unstable = [p for p in parts if p.error_code == E.UNSTABLE_OFFSET_COMMIT]
                if not unstable:
                    for p in parts:
                        if p.error_code != E.NONE:
                            raise error_for(p.error_code, p.error_message)
                        if p.committed_offset >= 0:
                            return Committed(p.committed_offset, _rows(p.metadata))
                    return None
                last = "a transaction of this slot is still completing"
            elif code in COORDINATOR_REFRESH_CODES or code == E.COORDINATOR_LOAD_IN_PROGRESS:
                coordinator, last = None, f"{E.Name(code)} {resp.error_message}"
            else:
                raise error_for(code, resp.error_message)
        time.sleep(0.05)
    raise StromSparkError(
        f"strom: the sink's bookkeeping (group {slot.group!r}) could not be read within "
        f"{timeout_s:.0f} s: {last}"
    )


def _rows(metadata: str) -> int:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return int(json.loads(metadata)["rows"])
    return -1


def write_task(
    opts: WriteOptions,
    counts: dict[str, int],
    batches: Iterator[pa.RecordBatch],
    write_id: str | None,
) -> TxnWriteResult:
    """Run one write task exactly once (see the module docstring)."""
    run, batch_id, partition_id = task_identity(write_id)
    it = iter(batches)
    first = next((b for b in it if b.num_rows), None)
    if first is None:  # nothing to write, nothing that could be written twice
        return TxnWriteResult(WriteResult(), batch_id)
    slot = Slot.make(opts, run, partition_id)
    writer = TaskWriter(opts, counts, transactional_id=slot.transactional_id)
    producer = writer.producer
    try:
        producer.init_transactions()
        with ClusterClient(
            list(opts.bootstrap), client_id=opts.client_id, security=opts.security.channel()
        ) as client:
            done = committed_batch(client, slot, LOOKUP_TIMEOUT_S)
        if done is not None and done.batch >= batch_id:
            rows = first.num_rows + sum(b.num_rows for b in it)
            if done.batch == batch_id and done.rows >= 0 and done.rows != rows:
                raise StromSparkError(
                    f"strom: exactlyOnce: micro-batch {batch_id} is being run again, and task "
                    f"slot {partition_id} committed {done.rows} rows for it before but gets "
                    f"{rows} rows now: the rows were spread over the tasks differently (were "
                    "the query or its options, e.g. minPartitions or a repartition, changed "
                    "before the restart?). Rows cannot be matched to what was committed; "
                    "restore the query as it was to finish this micro-batch"
                )
            writer.close()
            return TxnWriteResult(WriteResult(), batch_id, skipped=True)
        producer.begin_transaction()
        writer.write(first)
        for b in it:
            writer.write(b)
        result = writer.drain()
        meta = json.dumps({"batch": batch_id, "rows": result.rows}, separators=(",", ":"))
        producer.send_offsets_to_transaction(
            {slot.key: OffsetAndMetadata(batch_id, meta)}, GroupMetadata(slot.group)
        )
        prepared = producer.prepare_transaction()
    except BaseException:
        writer.abort(ABORT_TIMEOUT_S)
        raise
    writer.close()  # the prepared transaction stays open for the driver
    return TxnWriteResult(result, batch_id, prepared=prepared)


def complete(opts: WriteOptions, prepared: list[PreparedTxnState], commit: bool) -> None:
    """The driver's side: commit (or abort) every task's prepared transaction. Spark calls the
    writer's commit only when every task of the write (or micro-batch) succeeded, so a task
    attempt that failed, or that Spark discarded, never becomes visible. Raises
    :class:`StromSparkError` naming the slots whose transaction could not be committed."""
    if not prepared:
        return
    failed: list[str] = []
    with ClusterClient(
        list(opts.bootstrap), client_id=opts.client_id, security=opts.security.channel()
    ) as client:
        for state in prepared:
            try:
                complete_prepared_transaction(client, state, commit, timeout_s=LOOKUP_TIMEOUT_S)
            except StromError as exc:
                failed.append(f"{state.transactional_id}: {exc}")
    if failed and commit:
        raise StromSparkError(
            f"strom: exactlyOnce: {len(failed)} of {len(prepared)} task transactions could not "
            "be committed (a transaction left open longer than kafka.transaction.timeout.ms is "
            "aborted by the coordinator: raise it for long writes): " + "; ".join(failed[:5])
        )
    for f in failed:
        log.warning("strom: aborting a task transaction failed (its timeout aborts it): %s", f)


def fence_slots(opts: WriteOptions, run: str, slots: list[int]) -> None:
    """The driver's side of an aborted batch write: fence the transactional ids of the tasks
    that sent no commit message (failed, or killed by Spark mid-write), which aborts any
    transaction they left open (:meth:`strom.Admin.fence_producers`). Best effort: what
    cannot be fenced is aborted by its transaction timeout, and a warning says so."""
    if not slots:
        return
    ids = [Slot.make(opts, run, i).transactional_id for i in slots]
    try:
        with Admin(
            list(opts.bootstrap), client_id=opts.client_id, **opts.security.client_kwargs()
        ) as admin:
            admin.fence_producers(ids, timeout=LOOKUP_TIMEOUT_S)
    except StromError as exc:
        log.warning(
            "strom: fencing the transactions of failed tasks failed (their timeout, "
            "kafka.transaction.timeout.ms, aborts them): %s",
            exc,
        )
