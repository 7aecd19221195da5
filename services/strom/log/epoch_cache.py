"""Leader-epoch history of one partition: which epoch started writing at which offset.

It answers OffsetForLeaderEpoch (the end offset of an epoch) for follower truncation
(DESIGN §6), and lets every read check that a batch carries the epoch its offset belongs to,
which catches corruption of the one header field the CRC does not cover. The checkpoint is
rewritten (fsynced) whenever a new epoch is assigned, before the first batch of that epoch is
written, so the file always knows every epoch present in the log.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from strom.log import checkpoint
from strom.log.errors import InvalidAppendError

FILE_NAME = "leader-epoch-checkpoint"


class LeaderEpochCache:
    """Ordered (epoch, start_offset) entries, both strictly increasing."""

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.path = directory / FILE_NAME
        self._fsync = fsync
        read = checkpoint.read_epochs(self.path)
        # Remember whether an existing file was unreadable or inconsistent. The Log must
        # then rebuild the history from the batches: trusting an empty/partial history would
        # make every epoch check fail (reads raise, recovery truncates good data).
        self.damaged = read is None and self.path.exists()
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in read or []:
            if self._epochs and (epoch <= self._epochs[-1] or start < self._starts[-1]):
                self.damaged = True
                break  # a damaged tail: keep the consistent prefix
            self._epochs.append(epoch)
            self._starts.append(start)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else -1

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the history changed."""
        if epoch < 0:
            return False
        if self._epochs:
            last = self._epochs[-1]
            if epoch == last:
                return False
            if epoch < last:
                raise InvalidAppendError(
                    f"leader epoch {epoch} is older than the latest epoch {last} in the log"
                )
            if start_offset < self._starts[-1]:
                raise InvalidAppendError(
                    f"epoch {epoch} cannot start at {start_offset}, before epoch {last} "
                    f"(which starts at {self._starts[-1]})"
                )
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self._save()
        return True

    def epoch_for(self, offset: int) -> int:
        """The epoch a batch at ``offset`` must carry (-1 if no epoch covers it)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else -1

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= ``epoch``, its end offset).

        The end offset is the start of the next higher epoch, or the LEO for the latest. An
        epoch older than all history answers (-1, -1), as Kafka does (UNDEFINED).
        """
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if i < 0:
            return -1, -1
        if i == len(self._epochs) - 1:
            return self._epochs[i], log_end_offset
        return self._epochs[i], self._starts[i + 1]

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        i = bisect.bisect_left(self._starts, end_offset)
        if i < len(self._starts):
            del self._epochs[i:]
            del self._starts[i:]
            self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly below ``start_offset``; the one covering it starts there."""
        i = bisect.bisect_right(self._starts, start_offset) - 1
        if i <= 0 and (i < 0 or self._starts[0] >= start_offset):
            return
        del self._epochs[:i]
        del self._starts[:i]
        self._starts[0] = start_offset
        self._save()

    def clear(self) -> None:
        if not self._epochs:
            # Nothing held is nothing on disk (the cache is what was loaded, or written since):
            # no checkpoint to rewrite. Start-up clears every untrusted cache, and two fsyncs
            # per empty partition made a node's start-up ~20 ms per partition.
            return
        self._epochs.clear()
        self._starts.clear()
        self._save()

    def _save(self) -> None:
        checkpoint.write_epochs(self.path, self.entries(), fsync=self._fsync)
