"""Appends the disk refused: which errors they are, their metric and their log lines.

A full disk (ENOSPC, EDQUOT) or a failing one (EIO, EROFS) refuses every append to the
partitions on it, as leader (Produce, transaction markers) and as follower (replication),
many times a second. Each is counted (``strom_storage_append_failures_total``) and logged
at most once a minute per partition, with the number of failures since the last line: a
follower on a full disk used to log a full traceback about once a second per partition,
which buried everything else. A leader whose append failed so hands
its leadership over (:class:`strom.storage.isr.IsrManager`).
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from pathlib import Path

from strom.storage import metrics

log = logging.getLogger("strom.storage")

#: The errors that say the disk, not the request, is at fault: full (or over quota), or
#: failing. Anything else an append raises (a bad batch, a producer-state refusal) is the
#: request's.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})

#: Free bytes a full disk must have again before a follower fetches for it again.
RESUME_FREE_BYTES = 1 << 20
#: Seconds a follower waits before it tries again on a disk that failed otherwise (EIO).
RETRY_AFTER_S = 10.0

#: Seconds between two log lines about the same partition's failing appends.
LOG_INTERVAL_S = 60.0
#: (topic, partition) -> (when its last line was logged, failures since not logged).
_logged: dict[tuple[str, int], tuple[float, int]] = {}


def is_disk_error(exc: BaseException) -> bool:
    """True for an OSError that says the disk cannot take writes (:data:`DISK_ERRNOS`)."""
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


def note_append_failure(what: str, topic: str, partition: int, exc: OSError) -> None:
    """Count a disk error of an append (by partition and errno) and log it in one line, at
    most once a minute per partition (``what``: "producing", "replicating from node 2" ...)."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    metrics.count_append_failure(topic, partition, name)
    now = time.monotonic()
    last, suppressed = _logged.get((topic, partition), (-LOG_INTERVAL_S, 0))
    if now - last < LOG_INTERVAL_S:
        _logged[(topic, partition)] = (last, suppressed + 1)
        return
    _logged[(topic, partition)] = (now, 0)
    more = f" ({suppressed} more failures since the last report)" if suppressed else ""
    log.error("%s-%d: %s: the disk refused an append: %s%s", topic, partition, what, exc, more)


def may_take_writes(directory: Path, exc: OSError, failed_at: float, now: float) -> bool:
    """Whether a replica whose append failed with ``exc`` at ``failed_at`` should try again:
    a full disk once it has :data:`RESUME_FREE_BYTES` free, a failing one after
    :data:`RETRY_AFTER_S`. A follower that fetched regardless was caught up whenever the
    partition took no writes, rejoined the ISR and was made leader again (the preferred
    replica) only to fail its next append and resign again."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            return shutil.disk_usage(directory).free >= RESUME_FREE_BYTES
        except OSError:
            return False
    return now - failed_at >= RETRY_AFTER_S
