"""Executor side of a read: one task streams one partition's offset range from its leader.

Why not the :class:`strom.Consumer`: a task knows exactly which offsets it wants, and the
consumer's prefetching would read past the end of the range (a pushed-down filter must read
only what it needs). This loop keeps exactly one Fetch ahead: as soon as an answer's batch
headers say where it ends, the request for what follows is sent, and the answer is turned into
an Arrow batch (:mod:`strom_spark.arrow`) and handed to Spark while the next one travels.

It follows the partition's leader (``current_leader`` hints in answers, else a Metadata
refresh), retries whatever strom marks retriable and unreachable nodes (with backoff), and
gives up only when the range has made no progress for ``kafkaConsumer.pollTimeoutMs``. A Fetch
still unanswered ``OVERDUE_GRACE_S`` past its long-poll wait has the partition's leader looked
up again every ``OVERDUE_RECHECK_S`` (its node asked last: it may be hung), and is given up for
the new leader once the leader moved, as the consumer does (design §8, ``RangeReader._wait``).
A leader that answers at once but only empty for ``QUIET_RECHECK_S`` (cut off from etcd, it
leads in its own view) has the leader looked up with that node left out, as the consumer does
(``RangeReader._check_leader``).
Records the range needs that retention has already deleted are data loss: an error naming the
partition and the offsets with ``failOnDataLoss=true`` (the default), skipped otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa

from strom.api import storage_pb2
from strom.client.cluster import ClusterClient
from strom.client.fetcher import (
    FETCH_METHOD,
    OVERDUE_GRACE_S,
    OVERDUE_RECHECK_S,
    QUIET_RECHECK_S,
    FetchWireError,
    aborted_batches,
    parse_fetch_response,
)
from strom.client.memory import keep_freed_buffers
from strom.client.metadata import MetadataCache, PartitionLeader
from strom.client.offsets import TRANSPORT_RETRY
from strom.client.types import TopicPartition
from strom.errors import FETCH_LEADER_CODES, ErrorCode, error_for, is_retriable
from strom.record import RecordBatch, decode_batches
from strom_spark.arrow import Constants, to_spark_batch
from strom_spark.errors import DataLossError, StromSparkError
from strom_spark.options import ReadOptions

log = logging.getLogger(__name__)

#: Errors after which the partition's leader is looked up again.
_LEADER_ERRORS = FETCH_LEADER_CODES
#: The smallest partition_max_bytes asked for (the node returns at least one whole batch).
MIN_FETCH_BYTES = 64 * 1024
#: Record size assumed for a range's first request, before any answer showed the real one.
ASSUMED_RECORD_BYTES = 1024
BACKOFF_S = 0.05
BACKOFF_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class RangeTask:
    """What one Spark task reads: ``[start, end)`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(slots=True)
class _InFlight:
    """One Fetch sent: its future (None: not sent, ``address`` says why), the node asked, the
    offset asked for, the leader epoch it was sent with and when it was sent (monotonic)."""

    fut: Any
    address: str
    pos: int
    epoch: int = -1
    sent: float = 0.0


class _Retry(Exception):
    """An answer that says: try again (after a backoff, perhaps elsewhere)."""

    def __init__(self, reason: str, *, refresh: bool = False) -> None:
        super().__init__(reason)
        self.refresh = refresh


# Python workers are reused across tasks; so are their connections to the cluster.
_clients: dict[tuple[tuple[str, ...], str, float], ClusterClient] = {}
_clients_lock = threading.Lock()


def cluster_for(opts: ReadOptions) -> tuple[ClusterClient, MetadataCache]:
    """This process's client and metadata cache for ``opts``' cluster (shared by its tasks)."""
    key = (opts.bootstrap, opts.client_id, opts.request_timeout_ms / 1000.0, opts.security)
    with _clients_lock:
        found = _clients.get(key)
        # One made before this process was forked (a Python worker forked from one that had
        # read) refuses every call: gRPC connections do not survive a fork (strom.client.forks).
        if found is None or found._forked_from:
            found = _clients[key] = ClusterClient(
                list(opts.bootstrap),
                timeout_s=opts.request_timeout_ms / 1000.0,
                retry_s=opts.metadata_retry_s,
                client_id=opts.client_id,
                security=opts.security.channel(),
            )
        return found, found.cache


class RangeReader:
    """Reads :class:`RangeTask` s as Spark Arrow batches (see the module docstring)."""

    def __init__(
        self, opts: ReadOptions, client: ClusterClient | None = None, leaders: Any = None
    ) -> None:
        self.opts = opts
        keep_freed_buffers()  # answers of up to maxBytesPerFetch: see strom.client.memory
        if client is None:
            client, leaders = cluster_for(opts)
        self.client = client
        self.leaders: MetadataCache = leaders or client.cache
        self._constants = Constants()
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._rpc_timeout_s = opts.fetch_max_wait_ms / 1000.0 + opts.request_timeout_ms / 1000.0
        self._isolation = (
            storage_pb2.ISOLATION_LEVEL_READ_COMMITTED
            if opts.read_committed
            else storage_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED
        )
        #: Fetch requests sent and record bytes received, for tests and progress logs.
        self.requests = 0
        self.bytes = 0

    # -- the loop ----------------------------------------------------------------------------

    def read(self, task: RangeTask) -> Iterator[pa.RecordBatch]:
        """Yield the range's records in offset order, each Arrow batch one Fetch answer."""
        tp = task.tp
        pos, end = task.start, task.end
        if pos >= end:
            return
        timeout_s = self.opts.poll_timeout_ms / 1000.0
        deadline = time.monotonic() + timeout_s
        failures = 0
        last_problem = "no answer yet"
        avg_record = 0.0  # record bytes per offset seen so far (sizes the next request)
        inflight: _InFlight | None = None
        #: Since when the answers have come back empty in a row (None: the last one had
        #: records), or when the leader was last checked meanwhile (see _check_leader).
        quiet_since: float | None = None
        try:
            while pos < end:
                if inflight is None:
                    inflight = self._send(tp, pos, end, avg_record)
                sent, inflight = inflight, None
                try:
                    if sent.fut is None:
                        raise _Retry(sent.address, refresh=True)  # no leader: address = why
                    batches, hw, aborted = self._receive(sent, tp)
                except _Retry as retry:
                    last_problem = str(retry)
                    if time.monotonic() >= deadline:
                        raise StromSparkError(
                            f"strom: reading {tp.topic}-{tp.partition} made no progress at "
                            f"offset {pos} for {timeout_s:.0f} s (kafkaConsumer.pollTimeoutMs); "
                            f"last problem: {last_problem}"
                        ) from None
                    if retry.refresh:
                        self._refresh(tp)
                    time.sleep(min(BACKOFF_S * (2 ** min(failures, 6)), BACKOFF_MAX_S))
                    failures += 1
                    continue
                except _DataLoss as loss:
                    pos = self._data_lost(tp, pos, end, loss.log_start)
                    deadline = time.monotonic() + timeout_s
                    continue
                failures = 0
                if batches:
                    quiet_since = None
                if not batches:
                    # Nothing at pos yet: a new leader whose high watermark still lags (the
                    # long poll has waited fetch.max.wait.ms already), or a range past it.
                    last_problem = f"no records at offset {pos} (high watermark {hw})"
                    now = time.monotonic()
                    if quiet_since is None:
                        quiet_since = now
                    elif now - quiet_since >= QUIET_RECHECK_S:
                        quiet_since = now
                        self._check_leader(tp, sent.address)
                    if now >= deadline:
                        raise StromSparkError(
                            f"strom: {tp.topic}-{tp.partition} has no records at offset {pos} "
                            f"after {timeout_s:.0f} s (high watermark {hw}, range ends at "
                            f"{end}); were they deleted, or the topic re-created?"
                        )
                    continue
                new_pos = batches[-1].header.next_offset
                if new_pos <= pos:  # cannot happen with a sane node; never spin on it
                    raise StromSparkError(
                        f"strom: {tp.topic}-{tp.partition} answered offset {pos} with batches "
                        f"ending at {new_pos}"
                    )
                got = sum(len(b.raw) for b in batches)
                span = new_pos - max(pos, batches[0].header.base_offset)
                if span > 0:
                    avg_record = got / span
                if new_pos < end:
                    inflight = self._send(tp, new_pos, end, avg_record)
                visible = batches
                if aborted:
                    visible = [b for i, b in enumerate(batches) if i not in aborted]
                rb = to_spark_batch(
                    visible,
                    tp.topic,
                    tp.partition,
                    pos,
                    end,
                    include_headers=self.opts.include_headers,
                    constants=self._constants,
                )
                pos = new_pos
                deadline = time.monotonic() + timeout_s
                if rb is not None:
                    yield rb
        finally:
            if inflight is not None and inflight.fut is not None:
                inflight.fut.cancel()

    # -- one request -------------------------------------------------------------------------

    def _call(self, address: str) -> grpc.UnaryUnaryMultiCallable:
        call = self._calls.get(address)
        if call is None:
            # Raw bytes back: parse_fetch_response keeps the record bytes uncopied.
            call = self.client.channel(address).unary_unary(
                FETCH_METHOD, request_serializer=storage_pb2.FetchRequest.SerializeToString
            )
            self._calls[address] = call
        return call

    def _send(self, tp: TopicPartition, pos: int, end: int, avg_record: float) -> _InFlight:
        """Start a Fetch for ``pos`` on the leader (``fut`` None when none is known: then
        ``address`` says why)."""
        leader = self.leaders.get(tp)
        if leader is None:
            try:
                self.leaders.refresh([tp.topic])
            except Exception as exc:  # the cluster is unreachable right now: retry later
                return _InFlight(None, f"metadata: {exc}", pos)
            leader = self.leaders.get(tp)
        if leader is None or leader.address is None:
            return _InFlight(None, f"{tp.topic}-{tp.partition} has no live leader", pos)
        # Ask for what the rest of the range needs (plus a margin), not a full fetch: a short
        # range (a pushed-down filter) must not pull megabytes it will throw away.
        per_record = avg_record * 1.1 if avg_record > 0 else ASSUMED_RECORD_BYTES
        limit = min(
            self.opts.max_partition_fetch_bytes,
            max(MIN_FETCH_BYTES, int((end - pos) * per_record)),
        )
        req = storage_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=self.opts.fetch_max_wait_ms,
            min_bytes=1,
            max_bytes=limit,
            isolation_level=self._isolation,
            topics=[
                storage_pb2.FetchTopic(
                    topic=tp.topic,
                    partitions=[
                        storage_pb2.FetchPartition(
                            partition=tp.partition,
                            fetch_offset=pos,
                            current_leader_epoch=leader.epoch,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=limit,
                        )
                    ],
                )
            ],
        )
        self.requests += 1
        fut = self._call(leader.address).future(
            req,
            timeout=self._rpc_timeout_s,
            metadata=(("strom-client-id", self.opts.client_id),),
        )
        return _InFlight(fut, leader.address, pos, leader.epoch, time.monotonic())

    def _wait(self, sent: _InFlight, tp: TopicPartition) -> bytes:
        """The Fetch's answer, waited for in steps: one unanswered ``OVERDUE_GRACE_S`` past
        its long-poll wait (counted from when it was sent: it may have travelled while Spark
        took the previous batch) has the partition's leader looked up again, every
        ``OVERDUE_RECHECK_S`` while it stays unanswered, its node asked last from then on
        (``ClusterClient.demote``: a hung node must not hold up each lookup). Once the leader
        is another node or has a higher epoch the call is cancelled and _Retry sends the
        same offset to the new leader (nothing skipped or read twice; the cancelled call's
        answer is never looked at). A leader that did not move is waited for up to the
        call's deadline: a big answer may just be slow.

        Why: a hung leader (SIGSTOP, a GC pause, a network partition) answers nothing, so
        only the call's deadline (``fetch.max.wait.ms`` + ``request.timeout.ms``, 30.5 s)
        ended it, while the controller had moved the partition in 2-3 s (found from
        outside: a batch read with one node paused took 20-22 s). On the normal path the
        first wait costs what ``result()`` did (gRPC waits in 0.1 s steps either way)."""
        fut = sent.fut
        due = sent.sent + self.opts.fetch_max_wait_ms / 1000.0 + OVERDUE_GRACE_S
        checked = False
        while True:
            try:
                return fut.result(timeout=max(due - time.monotonic(), 0.0))
            except grpc.FutureTimeoutError:
                pass
            if not checked:  # (debug: a big answer may just be slow)
                log.debug(
                    "no Fetch answer from %s for %s-%d within %.1f s; looking its leader up again",
                    sent.address,
                    tp.topic,
                    tp.partition,
                    time.monotonic() - sent.sent,
                )
                checked = True
            self.client.demote(sent.address)
            self._refresh(tp)
            due = time.monotonic() + OVERDUE_RECHECK_S
            leader = self.leaders.get(tp)
            if leader is not None and _moved(leader, sent) and fut.cancel():
                log.info(
                    "no Fetch answer from %s for %s-%d after %.1f s, whose leader is now %s "
                    "(epoch %d): fetching there",
                    sent.address,
                    tp.topic,
                    tp.partition,
                    time.monotonic() - sent.sent,
                    leader.address,
                    leader.epoch,
                )
                raise _Retry(
                    f"no Fetch answer from {sent.address}; {tp.topic}-{tp.partition}'s leader moved"
                )
            # (cancel() is False only for a call that finished meanwhile: its answer is used)

    def _receive(
        self, sent: _InFlight, tp: TopicPartition
    ) -> tuple[list[RecordBatch], int, frozenset[int]]:
        """The answer's batches at or after ``sent.pos`` (whole batches; the converter cuts
        the rows), the high watermark, and the indexes of the batches that belong to aborted
        transactions (read_committed); raises _Retry / _DataLoss / errors."""
        address, pos = sent.address, sent.pos
        try:
            raw = self._wait(sent, tp)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in TRANSPORT_RETRY:
                raise _Retry(f"Fetch from {address}: {code.name}", refresh=True) from None
            raise StromSparkError(
                f"strom: Fetch of {tp.topic}-{tp.partition} from {address} failed: "
                f"{code.name} {exc.details() or ''}".strip()
            ) from None
        except grpc.FutureCancelledError:
            raise _Retry(f"Fetch from {address} cancelled", refresh=True) from None
        try:
            answers, nodes = parse_fetch_response(raw)
        except FetchWireError as exc:
            raise StromSparkError(f"strom: Fetch from {address}: {exc}") from None
        answer = next(
            (a for a in answers if a.topic == tp.topic and a.info.partition == tp.partition), None
        )
        if answer is None:
            raise _Retry(f"Fetch from {address} did not answer for {tp.topic}-{tp.partition}")
        info = answer.info
        code = info.error_code
        if code == ErrorCode.NONE:
            self.bytes += len(answer.records)
            batches = decode_batches(answer.records) if len(answer.records) else []
            keep = [b for b in batches if b.header.next_offset > pos]
            # read_committed: whole batches of aborted transactions are passed over (their
            # offsets still count, so the position moves past them).
            aborted = (
                aborted_batches(keep, info.aborted_transactions)
                if keep and info.aborted_transactions
                else frozenset()
            )
            return keep, info.high_watermark, aborted
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if 0 <= pos < info.log_start_offset:
                raise _DataLoss(info.log_start_offset)
            raise _Retry(
                f"offset {pos} is beyond {tp.topic}-{tp.partition}'s log on {address} "
                f"(high watermark {info.high_watermark})"
            )
        if code in _LEADER_ERRORS or code == ErrorCode.UNKNOWN_LEADER_EPOCH:
            hint = info.current_leader if info.HasField("current_leader") else None
            if hint is not None:
                endpoints = {n.node_id: f"{n.host}:{n.port}" for n in nodes}
                if self.leaders.learn(
                    tp, hint.leader_id, hint.leader_epoch, endpoints.get(hint.leader_id)
                ):
                    raise _Retry(f"leader of {tp.topic}-{tp.partition} moved")
            raise _Retry(
                f"{tp.topic}-{tp.partition} on {address}: {ErrorCode.Name(code)}",
                refresh=code != ErrorCode.UNKNOWN_LEADER_EPOCH,
            )
        if is_retriable(code):
            raise _Retry(f"{tp.topic}-{tp.partition} on {address}: {ErrorCode.Name(code)}")
        raise error_for(code, f"{tp.topic}-{tp.partition}: {info.error_message}")

    def _check_leader(self, tp: TopicPartition, address: str) -> None:
        """The leader at ``address`` has answered nothing but empty Fetches for
        ``QUIET_RECHECK_S``: look its leader up with that node left out, as the consumer
        does (a leader cut off from etcd answers at once, empty, and names itself in its own
        Metadata answer). A newer epoch elsewhere is fetched from the next request on."""
        try:
            self.leaders.refresh([tp.topic], avoid={address})
        except Exception as exc:  # checked again a QUIET_RECHECK_S later
            log.info("strom: leader check of %s without %s failed: %s", tp.topic, address, exc)

    def _refresh(self, tp: TopicPartition) -> None:
        try:
            self.leaders.refresh([tp.topic])
        except Exception as exc:  # retried on the next round
            log.info("strom: metadata refresh for %s failed: %s", tp.topic, exc)

    def _data_lost(self, tp: TopicPartition, pos: int, end: int, log_start: int) -> int:
        """Offsets ``pos..log_start-1`` are gone: fail (failOnDataLoss) or skip them."""
        lost_to = min(log_start, end)
        message = (
            f"strom: data loss in {tp.topic}-{tp.partition}: offsets {pos} to {lost_to - 1} "
            f"were deleted (retention or DeleteRecords; the log now starts at {log_start}) "
            "before this query read them"
        )
        if self.opts.fail_on_data_loss:
            raise DataLossError(
                message + ". Set failOnDataLoss=false to skip lost records and go on."
            )
        log.warning("%s; skipped (failOnDataLoss=false)", message)
        return lost_to


def _moved(leader: PartitionLeader, sent: _InFlight) -> bool:
    """Whether ``leader`` (just looked up) is not the one ``sent`` went to: another node, or
    the same one with a higher epoch (a request with the old epoch will be refused). A
    leader not registered (address None) is not a move: the request may still be answered."""
    if leader.address is None:
        return False
    return leader.address != sent.address or leader.epoch > sent.epoch


class _DataLoss(Exception):
    def __init__(self, log_start: int) -> None:
        super().__init__(log_start)
        self.log_start = log_start
