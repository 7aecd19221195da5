"""Small text checkpoint files, written atomically (write temp, fsync, rename, fsync dir).

Formats follow Kafka's so operators recognise them: a version line, a count line, then one
entry per line. A torn or unreadable checkpoint is treated as absent (the log then recovers
more conservatively), never as a reason to refuse to start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from strom.log.errors import naming

VERSION = 0


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half."""
    # A name of its own per writer: two threads replacing one file must not share a temp.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        # The old file stays whole; the half-written temp goes (on a full disk it holds
        # space), and the error names the file (a write's own error names none).
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise naming(exc, "writing", path) from exc
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so renames and creations inside it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_lines(path: Path, lines: Iterable[str], count: int, fsync: bool) -> None:
    body = "".join(f"{line}\n" for line in lines)
    write_atomic(path, f"{VERSION}\n{count}\n{body}".encode(), fsync=fsync)


def _read_lines(path: Path) -> list[str] | None:
    try:
        text = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        return None
    try:
        count = int(lines[1])
    except ValueError:
        return None
    entries = lines[2:]
    if len(entries) != count:
        return None
    return entries


def write_offsets(path: Path, offsets: Mapping[str, int], *, fsync: bool = True) -> None:
    """Write ``{"topic-partition dir name": offset}`` as ``name offset`` lines."""
    items = sorted(offsets.items())
    _write_lines(path, (f"{name} {off}" for name, off in items), len(items), fsync)


def read_offsets(path: Path) -> dict[str, int]:
    """Read an offsets checkpoint; a missing or damaged file reads as empty."""
    lines = _read_lines(path)
    if lines is None:
        return {}
    out: dict[str, int] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2:
            return {}
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            return {}
    return out


def write_epochs(path: Path, entries: list[tuple[int, int]], *, fsync: bool = True) -> None:
    """Write leader-epoch entries as ``epoch start_offset`` lines."""
    _write_lines(path, (f"{e} {o}" for e, o in entries), len(entries), fsync)


def read_epochs(path: Path) -> list[tuple[int, int]] | None:
    """Read leader-epoch entries; None when the file is missing or damaged."""
    lines = _read_lines(path)
    if lines is None:
        return None
    out: list[tuple[int, int]] = []
    for line in lines:
        parts = line.split()
        if len(parts) != 2:
            return None
        try:
            out.append((int(parts[0]), int(parts[1])))
        except ValueError:
            return None
    return out
