"""Keeps a consumer's big receive buffers in the process's heap instead of fresh mappings.

Why: a lagging consumer receives answers of up to ``fetch_max_bytes`` (4 partitions of
4 MiB: 16 MiB) that gRPC copies into new Python ``bytes`` and frees a moment later. glibc's
malloc serves blocks that big from a fresh ``mmap`` (its threshold starts at 128 KiB and
moves up only after such a block is freed) and gives freed heap tops back to the kernel
beyond twice that; with the fetch thread's own arena in the game, a large share of the
answers landed in memory the kernel had to fault in page by page: 390,000-550,000 minor
faults for 30 M records read with ``poll_arrow()`` (3 GB), ~2 s of system CPU against ~3.6 s
of user CPU (docs/benchmarks.md, "A consumer's page faults").

:func:`keep_freed_buffers` fixes malloc's two thresholds for the process, as one
would with ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment:
blocks up to :data:`MMAP_THRESHOLD` come from the heap, and up to :data:`TRIM_THRESHOLD`
of free heap top stays mapped for the next answer. Faults fell to ~60,000 for the same
read. The cost: a process keeps up to that much freed memory instead of returning it,
as a buffer pool would. It is process-wide, so it is left alone wherever the user
chose: when any of those variables or ``GLIBC_TUNABLES`` is set, or with
``STROM_MALLOC_TUNING=0``; and off glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

#: Blocks up to this size come from the heap (glibc's ceiling on 64-bit: HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 << 20
#: Free memory at a heap's top kept mapped (glibc's default is twice the mmap threshold).
TRIM_THRESHOLD = 64 << 20

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_lock = threading.Lock()
_done: bool | None = None


def keep_freed_buffers() -> bool:
    """Set malloc's thresholds for this process once (see the module docstring); returns
    whether they are strom's now. Safe to call from every consumer: only the first call acts."""
    global _done
    with _lock:
        if _done is None:
            _done = _tune()
        return _done


def leave_alone() -> None:
    """This process sets malloc's thresholds itself (a storage node: its own, larger ones,
    :func:`strom.storage.node.tune_malloc`): consumers created in it (a RecordService
    Subscribe runs one per stream) must not change them."""
    global _done
    with _lock:
        if _done is None:
            _done = False


def _tune() -> bool:
    if os.environ.get("STROM_MALLOC_TUNING", "1") == "0":
        return False
    if any(name in os.environ for name in _USER_SETTINGS):
        return False  # the user's own choice
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # The mmap threshold first: if glibc refuses it, malloc keeps its moving thresholds
    # (setting either one fixes both).
    if not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
