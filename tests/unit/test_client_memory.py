"""strom.client.memory: a consumer's big answers come from the heap, unless the user chose.

Each case runs in a fresh interpreter: malloc's thresholds are process-wide and set once.
Where a block came from is read from glibc's ``mallinfo2()`` (bytes in mmapped blocks).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

# skip is justified: the malloc tuning under test exists only on glibc; CI (Debian) is glibc.
pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="malloc tuning is for glibc; elsewhere keep_freed_buffers() does nothing",
)

SERVICES = str(Path(__file__).resolve().parents[2] / "services")

#: glibc's mallinfo2(), for the probes below.
MALLINFO = """
import ctypes

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
"""

PROBE = (
    MALLINFO
    + """
import json, sys
from strom.client.memory import keep_freed_buffers

tuned = [keep_freed_buffers(), keep_freed_buffers()] if sys.argv[1] == "call" else []
before = libc.mallinfo2().hblkhd
block = bytes(24 << 20)  # a 16 MiB Fetch answer and then some
mapped = libc.mallinfo2().hblkhd - before
print(json.dumps({"tuned": tuned, "mapped": mapped}))
"""
)


def probe(call: bool, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    environ.pop("STROM_MALLOC_TUNING", None)
    environ.update(env, PYTHONPATH=SERVICES)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "call" if call else "none"],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_a_big_block_comes_from_the_heap_once_tuned() -> None:
    untouched = probe(call=False)
    assert untouched["mapped"] >= 24 << 20  # glibc's own rule: a fresh mapping
    tuned = probe(call=True)
    assert tuned["tuned"] == [True, True]  # the second call finds it done
    assert tuned["mapped"] == 0


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "1048576"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
        {"STROM_MALLOC_TUNING": "0"},
    ],
)
def test_the_users_own_malloc_settings_are_left_alone(env: dict[str, str]) -> None:
    got = probe(call=True, **env)
    assert got["tuned"] == [False, False]
    assert got["mapped"] >= 24 << 20  # malloc's thresholds (or the user's), not strom's


NODE_PROBE = (
    MALLINFO
    + """
import json
from strom.client import memory
from strom.storage.node import tune_malloc

tuned = tune_malloc()
memory.leave_alone()  # as the storage node's start does
consumer_tuned = memory.keep_freed_buffers()  # a Subscribe stream's consumer
before = libc.mallinfo2().hblkhd
block = bytes(48 << 20)  # above a client's 32 MiB threshold, below the node's 64 MiB
mapped = libc.mallinfo2().hblkhd - before
print(json.dumps({"tuned": tuned, "consumer_tuned": consumer_tuned, "mapped": mapped}))
"""
)


def test_a_consumer_inside_a_storage_node_keeps_the_nodes_malloc_settings() -> None:
    """Found from outside (a soak): the first RecordService Subscribe's consumer replaced
    the node's malloc thresholds with a client's. The node's own stay in force."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    environ.pop("STROM_MALLOC_TUNING", None)
    environ["PYTHONPATH"] = SERVICES
    out = subprocess.run(
        [sys.executable, "-c", NODE_PROBE],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    got = json.loads(out.stdout)
    assert got["tuned"] is True
    assert got["consumer_tuned"] is False
    assert got["mapped"] == 0  # the node's 64 MiB threshold, not the consumer's 32 MiB
