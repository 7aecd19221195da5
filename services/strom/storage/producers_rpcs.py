"""DescribeProducers: what a partition's leader knows of its producers (Kafka's API of that
name). Operators use it to find a hanging transaction — one open in a partition that no
transaction coordinator will ever end (its producer wrote transactional batches the
coordinator never heard of, or its marker was lost with an uncleanly elected leader): it
holds every read_committed reader of the partition at its first offset. `strom transactions
abort` then ends it with an abort marker (Kafka's KIP-664)."""

from __future__ import annotations

import asyncio

import grpc

from strom.api import storage_pb2
from strom.log import Log
from strom.storage.request_quota import counted_request
from strom.storage.rpc_base import StorageCore, _fail_partition, _timed

pb = storage_pb2


class ProducerRpcs(StorageCore):
    """DescribeProducers."""

    @_timed("DescribeProducers")
    @counted_request
    async def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeProducersResponse:
        resp = pb.DescribeProducersResponse()
        hints: set[int] = set()
        for rt in request.topics:
            tr = resp.topics.add(topic=rt.topic)
            for index in rt.partitions:
                pr = tr.partitions.add(partition=index)
                try:
                    part = self._leader(rt.topic, index, -1, hints)
                    # In a thread: the log's lock may be held by an append being written.
                    entries = await asyncio.to_thread(_producers_of, part.log)
                except Exception as exc:
                    _fail_partition(pr, "describe the producers of", rt.topic, index, exc)
                    continue
                for pid, epoch, seq, seen, coordinator_epoch, txn_start in sorted(entries):
                    pr.producers.add(
                        producer_id=pid,
                        producer_epoch=epoch,
                        last_sequence=seq,
                        last_timestamp_ms=seen,
                        coordinator_epoch=coordinator_epoch,
                        current_txn_start_offset=txn_start,
                    )
        return resp


def _producers_of(lg: Log) -> list[tuple[int, int, int, int, int, int]]:
    """The log's producer entries, copied under its lock (appends change them)."""
    with lg.lock:
        return [
            (
                e.producer_id,
                e.epoch,
                e.last_seq,
                e.last_timestamp_ms,
                e.coordinator_epoch,
                e.txn_first_offset,
            )
            for e in lg.producers
        ]
