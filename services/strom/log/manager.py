"""All partition logs of one data directory, with the directory-level checkpoints.

The data dir holds one folder per replica (``<topic>-<partition>``), the
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and
``cleaner-offset-checkpoint`` (each log's first dirty offset, see strom.log.cleaner) files, and a
``.strom-clean-shutdown`` marker written by :meth:`LogManager.close`. A start that finds the
marker skips recovery scans; a start without it recovers every log from its recovery point.

A replica being deleted is renamed ``<topic>-<partition>.<unique id>.deleted`` first, one set
aside ``<topic>-<partition><suffix>``; both names keep within a file name's 255 bytes however
long the topic name (:func:`renamed_dir_name`).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from strom.log import checkpoint
from strom.log.config import LogConfig
from strom.log.errors import disk_full_hint
from strom.log.partition_log import Log, now_ms

RECOVERY_POINTS = "recovery-point-offset-checkpoint"
LOG_START_OFFSETS = "log-start-offset-checkpoint"
CLEANER_OFFSETS = "cleaner-offset-checkpoint"
CLEAN_SHUTDOWN = ".strom-clean-shutdown"
#: The file recording a log's topic id (written by the storage node, strom.storage.manager).
PARTITION_METADATA = "partition.metadata"
DELETED_SUFFIX = ".deleted"
#: The longest file name most file systems (ext4, XFS, tmpfs) take, in bytes.
MAX_NAME_BYTES = 255
_DIR_RE = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")

_log = logging.getLogger("strom.log.manager")

TopicPartition = tuple[str, int]


def log_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_log_dir_name(name: str) -> TopicPartition | None:
    m = _DIR_RE.match(name)
    if not m:
        return None
    return m.group("topic"), int(m.group("partition"))


def renamed_dir_name(topic: str, partition: int, suffix: str) -> str:
    """``<topic>-<partition><suffix>`` (a replica's folder renamed for deletion or set aside)
    when it fits in a file name; otherwise the topic is cut to fit and ``~`` plus a hash of
    the whole name follows what is left, so two long topics that share a prefix still get
    different names.

    The rename appended the suffix to the folder's name, so a
    legal topic name of 246+ characters (249 is allowed, as in Kafka) made a name over 255
    bytes; the rename failed with ENAMETOOLONG, the delete was only logged, the data stayed
    and a topic re-created under that name started with the deleted records. Kafka cuts
    the topic part of its ``-delete`` and ``-stray`` names the same way.
    """
    name = f"{topic}-{partition}{suffix}"
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    tail = f"~{hashlib.sha256(topic.encode()).hexdigest()[:12]}-{partition}{suffix}"
    room = MAX_NAME_BYTES - len(tail.encode())
    if room < 1:
        raise ValueError(f"suffix {suffix!r} leaves no room for the topic in a file name")
    return topic.encode()[:room].decode(errors="ignore") + tail


def _remove_in_place(directory: Path) -> None:
    """Delete a closed replica's folder without renaming it first. ``partition.metadata``
    goes last: a crash half way leaves a folder that still names its (old) topic id, which
    the storage node never adopts for a topic with another id (without the file, a topic
    re-created under the name would take the rest as its own)."""
    last = []
    for p in directory.iterdir():
        if p.name == PARTITION_METADATA:
            last.append(p)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for p in last:
        p.unlink()
    directory.rmdir()


class LogManager:
    """Opens, creates, deletes and checkpoints the logs in ``data_dir``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = True,
        clock: Callable[[], int] = now_ms,
        configs: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.clock = clock
        self._configs = configs or (lambda topic: {})
        self.lock = threading.RLock()
        #: One checkpoint write at a time: the node writes them from several threads (the
        #: periodic task, replica truncation, deletes), and two writers of one file race on
        #: its temporary name (one rename fails, or a half-written file is renamed in).
        self._checkpoint_lock = threading.Lock()
        self.logs: dict[TopicPartition, Log] = {}
        #: Seconds each log took to open (and recover, after an unclean shutdown), and all
        #: of them: what the node's start-up line reports.
        self.open_seconds: dict[TopicPartition, float] = {}
        self.opened_in_s = 0.0
        started = time.monotonic()
        marker = self.data_dir / CLEAN_SHUTDOWN
        self.clean_shutdown = marker.exists()
        recovery = checkpoint.read_offsets(self.data_dir / RECOVERY_POINTS)
        starts = checkpoint.read_offsets(self.data_dir / LOG_START_OFFSETS)
        dirty = checkpoint.read_offsets(self.data_dir / CLEANER_OFFSETS)
        for p in sorted(self.data_dir.iterdir()):
            if not p.is_dir():
                if p.name.endswith(".tmp"):  # a checkpoint write a crash interrupted
                    p.unlink(missing_ok=True)
                continue
            if p.name.endswith(DELETED_SUFFIX):  # old and new (capped, unique) names alike
                shutil.rmtree(p, ignore_errors=True)
                continue
            tp = parse_log_dir_name(p.name)
            if tp is None:
                continue
            opening = time.monotonic()
            self.logs[tp] = Log(
                p,
                LogConfig.from_dict(self._configs(tp[0])),
                recovery_point=recovery.get(p.name, 0),
                log_start_offset=starts.get(p.name, 0),
                clean_shutdown=self.clean_shutdown,
                fsync=fsync,
                clock=clock,
                first_dirty_offset=dirty.get(p.name),
            )
            self.open_seconds[tp] = time.monotonic() - opening
        self.opened_in_s = time.monotonic() - started
        # From here on a crash must trigger recovery: the marker goes away until close().
        marker.unlink(missing_ok=True)
        if self.clean_shutdown and fsync:
            checkpoint.fsync_dir(self.data_dir)

    def __iter__(self) -> Iterator[tuple[TopicPartition, Log]]:
        return iter(list(self.logs.items()))

    def get(self, topic: str, partition: int) -> Log | None:
        return self.logs.get((topic, partition))

    def get_or_create(
        self, topic: str, partition: int, config: Mapping[str, Any] | None = None
    ) -> Log:
        with self.lock:
            log = self.logs.get((topic, partition))
            if log is None:
                cfg = LogConfig.from_dict(config if config is not None else self._configs(topic))
                log = Log(
                    self.data_dir / log_dir_name(topic, partition),
                    cfg,
                    fsync=self.fsync,
                    clock=self.clock,
                )
                self.logs[(topic, partition)] = log
            return log

    def delete(self, topic: str, partition: int) -> bool:
        """Remove a replica, open or only on disk: rename its folder away first
        (:func:`renamed_dir_name`, with a unique id so an older leftover of the same name is
        no obstacle) so a crash mid-delete finishes the job on the next start instead of
        resurrecting half a log. False when there was nothing to remove.

        When the rename failed (a name too long), the log was
        already dropped from :attr:`logs` while its folder and records stayed, and the next
        ``get_or_create`` of that partition opened them again. A failed rename now deletes
        the files in place; an error there is raised with the log out of service and its
        folder left as it is, which the storage node never adopts for another topic id."""
        with self.lock:
            log = self.logs.pop((topic, partition), None)
            if log is not None:
                log.close()
                directory = log.directory
            else:
                directory = self.data_dir / log_dir_name(topic, partition)
                if not directory.is_dir():
                    return False
            suffix = f".{uuid.uuid4().hex[:12]}{DELETED_SUFFIX}"
            gone = directory.with_name(renamed_dir_name(topic, partition, suffix))
            try:
                directory.rename(gone)
            except OSError as exc:
                _log.warning("could not rename %s (%s); deleting its files in place", gone, exc)
                _remove_in_place(directory)
        shutil.rmtree(gone, ignore_errors=True)  # nothing there after a removal in place
        # Outside the lock: checkpoint() takes its own lock first, then this one; taking them
        # the other way round here deadlocked the node against its periodic checkpoint
        # (a topic deleted while the node was busy froze its manager).
        self.checkpoint()
        return True

    def set_aside(self, topic: str, partition: int, suffix: str) -> Path | None:
        """Stop hosting a replica but keep its files: rename its folder (open, or only on
        disk) to its name plus ``suffix`` (the topic cut for a name that would not fit,
        :func:`renamed_dir_name`), which must leave a name no start opens as a log (not ending
        in digits). The storage node does this to strays and to folders recording another
        topic id, whose deletion cannot be undone if the cluster view, the node's identity or
        the file was wrong; an operator removes them. None when there was no such folder."""
        with self.lock:
            log = self.logs.pop((topic, partition), None)
            directory = self.data_dir / log_dir_name(topic, partition)
            if log is not None:
                directory = log.directory
            elif not directory.is_dir():
                return None
            aside = directory.with_name(renamed_dir_name(topic, partition, suffix))
            if parse_log_dir_name(aside.name) is not None:
                if log is not None:
                    self.logs[(topic, partition)] = log
                raise ValueError(f"{aside.name} would be opened as a log")
            if log is not None:
                log.close()
            try:
                directory.rename(aside)
            except OSError:
                # Back in service, its files being where they were: the node must not forget
                # a log it still has on disk under its live name (a later pass tries again).
                if log is not None:
                    self.logs[(topic, partition)] = self._reopen(log)
                raise
        if self.fsync:
            checkpoint.fsync_dir(self.data_dir)
        self.checkpoint()  # outside the lock, as in delete()
        return aside

    def _reopen(self, closed: Log) -> Log:
        """``closed`` opened again as it was (it was closed cleanly a moment ago)."""
        return Log(
            closed.directory,
            closed.config,
            recovery_point=closed.recovery_point,
            log_start_offset=closed.log_start_offset,
            clean_shutdown=True,
            fsync=self.fsync,
            clock=self.clock,
            first_dirty_offset=closed.first_dirty_offset,
        )

    def checkpoint(self) -> None:
        """Write the recovery-point and log-start-offset checkpoints of every log."""
        with self._checkpoint_lock:
            self._write_checkpoints()

    def _write_checkpoints(self) -> None:
        """(With ``_checkpoint_lock`` held; lock order: ``_checkpoint_lock``, then ``lock``.)"""
        with self.lock:
            items = list(self.logs.items())
        recovery = {log_dir_name(*tp): log.recovery_point for tp, log in items}
        starts = {log_dir_name(*tp): log.log_start_offset for tp, log in items}
        dirty = {log_dir_name(*tp): log.first_dirty_offset for tp, log in items}
        fsync = self.fsync
        checkpoint.write_offsets(self.data_dir / RECOVERY_POINTS, recovery, fsync=fsync)
        checkpoint.write_offsets(self.data_dir / LOG_START_OFFSETS, starts, fsync=fsync)
        checkpoint.write_offsets(self.data_dir / CLEANER_OFFSETS, dirty, fsync=fsync)

    def flush_all(self) -> None:
        for _, log in self:
            log.flush()
        self.checkpoint()

    def close(self) -> None:
        """Flush, checkpoint, close every log and leave the clean-shutdown marker.

        On a full disk the first failed write (a checkpoint, an
        index) ended the shutdown with ``[Errno 28] No space left on device``: no file
        named, the logs never closed. Now every step is tried and every log closed; the
        marker is written only when all succeeded (without it the next start re-checks the
        logs, the safe side), and the first failure is raised naming the file, what was
        being written, and, for a full disk, how to free space."""
        failures: list[OSError] = []

        def attempt(step: Callable[[], None]) -> None:
            try:
                step()
            except OSError as exc:
                failures.append(exc)

        with self._checkpoint_lock, self.lock:  # the order checkpoint() takes them in
            for _, log in self:
                attempt(log.flush)
            attempt(self._write_checkpoints)
            for _, log in self:
                attempt(log.close)
            if not failures:
                marker = self.data_dir / CLEAN_SHUTDOWN
                attempt(lambda: checkpoint.write_atomic(marker, b"", fsync=self.fsync))
        if failures:
            first = failures[0]
            more = f" ({len(failures) - 1} more writes failed)" if len(failures) > 1 else ""
            raise type(first)(
                first.errno,
                f"closing the logs in {self.data_dir} failed: {first.strerror}{more}; no "
                f"clean-shutdown marker was written, so the next start re-checks the logs"
                f"{disk_full_hint(first)}",
            ) from first
