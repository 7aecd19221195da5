"""Replaying a coordinator shard's partition: what every shard kind shares.

A shard (of ``__consumer_offsets`` or ``__transaction_state``) is rebuilt by applying its
records in offset order, the latest per key winning (which is also what compaction keeps).
Besides the records, a new owner needs three facts from the batch headers: the producer id
the previous owners wrote with, the highest epoch it reached (the new owner bumps past it to
fence them), and where the partition ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from strom.record import decode_batches


class ReplayState:
    """Header facts of a replay; subclasses apply the records (:meth:`apply`).

    Attributes:
        producer_id: the producer id of the last idempotent batch replayed (-1 if none).
        producer_epoch: the highest producer epoch replayed for that producer id (-1 if none);
            a new owner writes with a higher one, which fences the previous owner.
        next_offset: the offset after the last batch replayed (where the owner's writes go).
        skipped: records skipped because their key was missing or of an unknown kind.
        undecodable: records skipped because their key or value did not decode (a record
            no coordinator wrote, or a damaged one); ``first_undecodable`` says which and why.
    """

    def __init__(self) -> None:
        self.producer_id: int = -1
        self.producer_epoch: int = -1
        self.next_offset: int = 0
        self.skipped: int = 0
        self.undecodable: int = 0
        self.first_undecodable: str | None = None
        #: The max timestamp of the batch whose records :meth:`apply` is applying (-1
        #: outside :meth:`apply_batches`): the writer's wall clock when it wrote them.
        self.batch_timestamp: int = -1

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Apply one record (``value`` None = tombstone)."""
        raise NotImplementedError

    def apply_records(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Apply (key, value) records in order."""
        for key, value in records:
            self.apply(key, value)

    def apply_batches(self, buf: Any, *, verify_crc: bool = True) -> int:
        """Apply every record of a buffer of concatenated batches; returns records applied.

        Control batches carry no shard state and are skipped; producer id/epoch and
        :attr:`next_offset` are tracked from the headers. A record whose key or value does
        not decode is skipped and counted (:attr:`undecodable`): one such record must not
        fail every load of its shard for good. Applying a record changes nothing until it
        has decoded, so a skipped one leaves no trace.

        Raises:
            strom.record.InvalidBatchError: a batch is corrupt.
        """
        applied = 0
        for batch in decode_batches(buf, verify_crc=verify_crc):
            h = batch.header
            self.next_offset = max(self.next_offset, h.next_offset)
            if h.producer_id >= 0:
                if h.producer_id != self.producer_id:
                    self.producer_id = h.producer_id
                    self.producer_epoch = h.producer_epoch
                else:
                    self.producer_epoch = max(self.producer_epoch, h.producer_epoch)
            if h.is_control:
                continue
            self.batch_timestamp = h.max_timestamp
            for rec in batch.records():
                try:
                    self.apply(rec.key, rec.value)
                except Exception as exc:
                    self.undecodable += 1
                    if self.first_undecodable is None:
                        self.first_undecodable = f"offset {rec.offset}: {type(exc).__name__}: {exc}"
                    continue
                applied += 1
        self.batch_timestamp = -1
        return applied
