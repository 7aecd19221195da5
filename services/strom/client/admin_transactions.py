"""The Admin client's transaction calls (Kafka's fenceProducers, describeProducers and
abortTransaction), mixed into :class:`strom.client.admin.Admin` as :class:`TransactionsAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from strom.api import common_pb2, storage_pb2
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import by_topic, raise_first, tp_list
from strom.client.admin_types import ProducerState
from strom.client.transactions import TransactionManager
from strom.client.types import TopicPartition
from strom.errors import InvalidRequestError, StromError

#: The transaction timeout a fenced id keeps until its next producer sets its own.
FENCE_TRANSACTION_TIMEOUT_MS = 60_000


class TransactionsAdmin(AdminCalls):
    """Transactional ids and producers (Kafka's fenceProducers, describeProducers,
    abortTransaction)."""

    def fence_producers(
        self, transactional_ids: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """Fence the producers of ``transactional_ids``, as Kafka's ``Admin.fenceProducers``.

        Each id's epoch is bumped (InitProducerId, what a new producer instance with that id
        does): a transaction it left open is aborted, so read_committed readers stop waiting
        at it, and a producer still running with the old epoch is refused from then on. For
        a transaction left by a killed process (a Spark task, a crashed service) that would
        otherwise hold the last stable offset back until ``transaction_timeout_ms`` passes.
        Returns ``{id: (producer id, new epoch)}``; raises the first failure (the other ids
        are fenced anyway).
        """
        self._ensure_open()
        ids = list(dict.fromkeys(transactional_ids))
        for tid in ids:
            if not isinstance(tid, str) or not tid:
                raise InvalidRequestError(f"a transactional id must be a non-empty string: {tid!r}")
        timeout_s = self.default_api_timeout_ms / 1000 if timeout is None else timeout

        def fence(tid: str) -> tuple[int, int]:
            mgr = TransactionManager(
                self._client,
                tid,
                FENCE_TRANSACTION_TIMEOUT_MS,
                request_timeout_s=min(self.request_timeout_ms / 1000, timeout_s),
                retry_backoff_s=0.05,
            )
            return mgr.init(timeout_s)

        out: dict[str, tuple[int, int]] = {}
        failures: list[tuple[str, StromError]] = []
        with ThreadPoolExecutor(max(1, min(8, len(ids))), "strom-admin-fence") as pool:
            for tid, future in [(tid, pool.submit(fence, tid)) for tid in ids]:
                try:
                    out[tid] = future.result()
                except StromError as exc:
                    failures.append((tid, exc))
        raise_first(failures)
        return out

    def describe_producers(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition's leader keeps state for, by producer id (Kafka's
        ``Admin.describeProducers``): a producer with ``current_transaction_start_offset``
        set has a transaction open there, holding read_committed readers at that offset."""
        wanted = {tp: 0 for tp in tp_list(partitions, "describe_producers")}

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.DescribeProducersRequest:
            return storage_pb2.DescribeProducersRequest(
                topics=[
                    common_pb2.TopicPartitions(topic=t, partitions=[p for p, _ in parts])
                    for t, parts in by_topic(group).items()
                ]
            )

        def results(
            resp: storage_pb2.DescribeProducersResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, list[ProducerState]]]:
            for t in resp.topics:
                for p in t.partitions:
                    states = [
                        ProducerState(
                            e.producer_id,
                            e.producer_epoch,
                            e.last_sequence,
                            e.last_timestamp_ms,
                            e.coordinator_epoch,
                            None if e.current_txn_start_offset < 0 else e.current_txn_start_offset,
                        )
                        for e in p.producers
                    ]
                    yield (
                        TopicPartition(t.topic, p.partition),
                        p.error_code,
                        p.error_message,
                        states,
                    )

        return self._per_leader(wanted, "DescribeProducers", request, results)

    def abort_transaction(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> None:
        """Write an abort marker for ``producer_id`` to ``tp`` (Kafka's
        ``Admin.abortTransaction``, KIP-664): ends a hanging transaction — one no transaction
        coordinator will end — that holds every read_committed reader of the partition. Take
        the producer's epoch and coordinator epoch from :meth:`describe_producers`; aborting a
        transaction its coordinator still tracks makes it fail at commit. Needs the
        cluster-action permission when ACLs are on (it is the coordinator's own call)."""
        (tp,) = tp_list([tp], "abort_transaction")
        for name, value in (("producer_id", producer_id), ("producer_epoch", producer_epoch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequestError(f"abort_transaction: {name} must be an int >= 0")

        def request(group: Mapping[TopicPartition, int]) -> storage_pb2.WriteTxnMarkersRequest:
            req = storage_pb2.WriteTxnMarkersRequest(timeout_ms=self._server_wait_ms)
            req.markers.add(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                committed=False,
                coordinator_epoch=max(coordinator_epoch, 0),
                topics=[
                    common_pb2.TopicPartitions(topic=t, partitions=[p for p, _ in parts])
                    for t, parts in by_topic(group).items()
                ],
            )
            return req

        def results(
            resp: storage_pb2.WriteTxnMarkersResponse,
        ) -> Iterable[tuple[TopicPartition, int, str, None]]:
            for m in resp.markers:
                for t in m.topics:
                    for p in t.partitions:
                        yield (
                            TopicPartition(t.topic, p.partition),
                            p.error_code,
                            p.error_message,
                            None,
                        )

        self._per_leader({tp: 0}, "WriteTxnMarkers", request, results)
