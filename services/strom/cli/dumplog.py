"""``strom dump-log FILE...``: what a partition's files on disk hold (Kafka's
``kafka-dump-log.sh``), read-only and without a cluster.

An operator looking into a replica (did compaction run, which transactions left markers,
where is a torn batch after a crash) had no tool but a Python session. For a segment
(``<base offset>.log``) it prints one line per batch from the 61-byte header alone: offsets,
record count, producer id / epoch / sequence, the transactional and control bits, codec,
timestamps, position, size and whether the CRC matches; ``--records`` also decodes each
batch's records (and a control batch's marker). Offset indexes (``.index``), time indexes
(``.timeindex``) and the partition's ``aborted-transactions`` index print their entries, a
producer snapshot (``<offset>.snapshot``) its producers. The segment is mapped, not read
into memory, so a 1 GiB segment costs no 1 GiB of RAM.

``--json`` prints JSON Lines instead, for scripts (kafka-dump-log users script against its
output): one object per line, each with its ``type`` and ``file``: ``file`` (one per file
dumped), ``batch``, ``record`` and ``marker`` (with ``--records``), ``records_not_decoded``,
``end_of_data``, ``summary``, ``index_entry``, ``timeindex_entry``, ``aborted_transaction``,
``producer``, and ``error``. Keys, values and header values are UTF-8 text, or base64 when
they are not UTF-8 (``key_encoding``: ``utf8`` or ``base64``; null for a null key).

A file that is missing or unreadable, or whose name is no segment or index, is one line on
stderr (and with ``--json`` an ``error`` object on stdout); a segment that stops parsing (torn
or damaged) prints what came before the damage and then one line naming the byte and the
fault, as recovery would cut there, and one whose batches fail their CRC says how many. The
exit code is 1 when any file failed or is damaged, 2 for a file that is not a segment or
index by its name (nothing is dumped then).
"""

from __future__ import annotations

import argparse
import base64
import json
import mmap
import os
import re
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import crc32c

from strom.argtypes import UsageError
from strom.record.errors import InvalidBatchError
from strom.record.header import (
    CRC_START,
    BatchHeader,
    check_header,
    peek_length,
    read_header,
)

#: Segment, index and producer-snapshot file names: the offset in 20 digits and the kind.
_NAME = re.compile(r"^(\d{20})\.(log|index|timeindex|snapshot)$")
#: strom.log.transactions.INDEX_NAME, the partition's aborted transactions.
_ABORTED = "aborted-transactions"
_OFF_ENTRY = struct.Struct(">ii")  # relative offset, position (strom.log.index)
_TIME_ENTRY = struct.Struct(">qi")  # max timestamp so far, relative offset
_ABORTED_ENTRY = struct.Struct(">qqq")  # producer id, first offset, marker offset
#: No batch stored by strom is larger (strom.log.segment.MAX_STORED_BATCH_BYTES).
_MAX_BATCH = 256 << 20
_ZEROS_CHUNK = 1 << 20


class DumpError(Exception):
    """A file that cannot be dumped, or stops being dumpable part of the way."""


@dataclass
class _Out:
    """Where a dump goes: text lines as kafka-dump-log prints them, or (``--json``) one JSON
    object per line, so that every part of the dump says once what it is, in both forms."""

    stream: TextIO
    json: bool
    #: The file being dumped (every JSON object names it).
    file: str = ""

    def emit(self, what: str, text: str | None, /, **fields: Any) -> None:
        """One part of the dump: ``text`` (None: nothing in text form) or a ``what`` object."""
        if self.json:
            obj = {"type": what, "file": self.file, **fields}
            print(json.dumps(obj), file=self.stream)
        elif text is not None:
            print(text, file=self.stream)

    def text(self, line: str) -> None:
        """A line of the text form only (what a JSON object says in a field already)."""
        if not self.json:
            print(line, file=self.stream)


def _bytes_fields(name: str, data: bytes | None) -> dict[str, Any]:
    """``data`` as JSON: UTF-8 text when it is, else base64, said by ``<name>_encoding``."""
    if data is None:
        return {name: None, f"{name}_encoding": None}
    try:
        return {name: data.decode("utf-8"), f"{name}_encoding": "utf8"}
    except UnicodeDecodeError:
        return {name: base64.b64encode(data).decode("ascii"), f"{name}_encoding": "base64"}


def add_dump_log_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``strom dump-log``."""
    p = sub.add_parser(
        "dump-log",
        help="print the batches of segment files (<offset>.log) and index entries on disk",
        description="Print what a partition's files on disk hold, one batch per line (Kafka's "
        "kafka-dump-log.sh): a segment's batches from their headers, with --records each "
        "record too; the entries of an .index, .timeindex or aborted-transactions file; the "
        "producers of a producer snapshot. Read-only; needs no cluster.",
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="<offset>.log, .index, .timeindex or .snapshot, or aborted-transactions",
    )
    p.add_argument(
        "--records",
        "--print-data-log",
        action="store_true",
        help="also decode and print each record (key, value, headers) and each marker "
        "(--print-data-log is kafka-dump-log's name for it)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON Lines: one object per batch (and per record and marker with --records), "
        'index entry or producer, each with its "type" and "file"; keys and values as '
        'UTF-8 text, or base64 when they are not ("key_encoding", "value_encoding"); a '
        'file that fails is also an "error" object',
    )


def run_dump_log(args: argparse.Namespace, out: TextIO) -> int:
    """Dump every file of ``args.files``; 1 when any failed (the others are still dumped)."""
    paths = [Path(f) for f in args.files]
    for path in paths:
        if _kind(path) is None:
            raise UsageError(
                f"{path}: not a segment or index file (expected a name like "
                "00000000000000000000.log, .index, .timeindex or .snapshot, or "
                f"{_ABORTED})"
            )
    failed = False
    sink = _Out(out, args.json)
    for path in paths:
        sink.file = str(path)
        try:
            _dump(path, args.records, sink)
        except DumpError as exc:
            sink.emit("error", None, message=str(exc))
            out.flush()
            print(f"strom dump-log: error: {exc}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def _kind(path: Path) -> tuple[int, str] | None:
    """The offset in the file's name and its kind, or None when it is none of ours."""
    if path.name == _ABORTED:
        return 0, "aborted"
    m = _NAME.match(path.name)
    return None if m is None else (int(m.group(1)), m.group(2))


def _dump(path: Path, records: bool, out: _Out) -> None:
    kind_of = _kind(path)
    assert kind_of is not None
    base, kind = kind_of
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        raise DumpError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DumpError(f"{path}: a directory, not a file") from None
    except OSError as exc:
        raise DumpError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            out.emit("file", f"Dumping {path}", kind=kind, size=size)
            if size == 0:
                out.emit("summary", "(empty)", empty=True)
                return
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
                view = memoryview(mm)
                try:
                    if kind == "log":
                        _dump_segment(path, view, base, records, out)
                    elif kind == "snapshot":
                        _dump_snapshot(path, bytes(view), out)
                    else:
                        _dump_index(path, view, base, kind, out)
                finally:
                    view.release()
        except OSError as exc:
            raise DumpError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _dump_segment(path: Path, view: memoryview, base: int, records: bool, out: _Out) -> None:
    """One line per batch; raises :class:`DumpError` at the first batch that does not parse."""
    count = batches = bad = 0
    first = last = -1
    expected = base
    for h in _batches(path, view, out):
        crc_ok = crc32c.crc32c(view[h.position + CRC_START : h.position + h.size]) == h.crc
        # Segments tile their offsets (compaction keeps emptied batches): recovery cuts the
        # log at a batch that does not follow the one before it.
        tiles = h.base_offset == expected
        out.emit(
            "batch",
            _batch_line(h, crc_ok),
            **_batch_fields(h, crc_ok),
            expected_base_offset=expected,
            offsets_tile=tiles,
        )
        if not tiles:
            out.text(f"  (expected base offset {expected}: the offsets do not tile)")
        expected = h.next_offset
        if records:
            _print_records(h, view, crc_ok, out)
        batches += 1
        bad += not crc_ok
        count += h.record_count
        first = h.base_offset if first < 0 else first
        last = h.last_offset
    text = f"{batches} batches, offsets {first}..{last}, {count} records" if batches else None
    out.emit(
        "summary",
        text or "no batches",
        batches=batches,
        first_offset=first if batches else None,
        last_offset=last if batches else None,
        records=count,
        bad_crc_batches=bad,
    )
    if bad:
        raise DumpError(f"{path}: {bad} of {batches} batches fail their CRC (damaged)")


def _batches(path: Path, view: memoryview, out: _Out) -> Iterator[BatchHeader]:
    """The batches of segment data ``view``; a preallocated file's zero tail ends them."""
    pos = 0
    while pos < len(view):
        if len(view) - pos >= 12 and peek_length(view, pos) == (0, 0) and _zeros(view, pos):
            zeros = len(view) - pos
            text = f"end of data at byte {pos} ({zeros} bytes of zeros follow)"
            out.emit("end_of_data", text, position=pos, zero_bytes=zeros)
            return
        try:
            h = read_header(view, pos)
            check_header(h, view, verify_crc=False, max_batch_bytes=_MAX_BATCH)
        except InvalidBatchError as exc:
            what = "not a strom segment" if pos == 0 else "damaged or torn"
            raise DumpError(f"{path}: {what}: {exc}") from None
        yield h
        pos += h.size


def _zeros(view: memoryview, pos: int) -> bool:
    """Whether ``view`` holds only zero bytes from ``pos`` (checked a chunk at a time)."""
    zero = bytes(_ZEROS_CHUNK)
    while pos < len(view):
        chunk = view[pos : pos + _ZEROS_CHUNK]
        if chunk != zero[: len(chunk)]:
            return False
        pos += len(chunk)
    return True


def _batch_line(h: BatchHeader, crc_ok: bool) -> str:
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
        f"position: {h.position} size: {h.size} leaderEpoch: {h.partition_leader_epoch} "
        f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
        f"baseSequence: {h.base_sequence} isTransactional: {str(h.is_transactional).lower()} "
        f"isControl: {str(h.is_control).lower()} compression: {h.compression} "
        f"timestampType: {'LogAppendTime' if h.timestamp_type else 'CreateTime'} "
        f"baseTimestamp: {h.base_timestamp} maxTimestamp: {h.max_timestamp} "
        f"crc: {h.crc:#010x} isValid: {str(crc_ok).lower()}"
    )


def _batch_fields(h: BatchHeader, crc_ok: bool) -> dict[str, Any]:
    """A batch's header as its ``--json`` object holds it (the text line's fields)."""
    return {
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "count": h.record_count,
        "position": h.position,
        "size": h.size,
        "leader_epoch": h.partition_leader_epoch,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "is_transactional": h.is_transactional,
        "is_control": h.is_control,
        "compression": str(h.compression),
        "timestamp_type": "LogAppendTime" if h.timestamp_type else "CreateTime",
        "base_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp,
        "crc": h.crc,
        "is_valid": crc_ok,
    }


def _print_records(h: BatchHeader, view: memoryview, crc_ok: bool, out: _Out) -> None:
    """Each record of the batch at ``h`` (the only per-record work, asked for)."""
    from strom.record.batch import decode_batches

    if not crc_ok:
        reason = "the CRC does not match"
        text = f"  | records not decoded: {reason}"
        out.emit("records_not_decoded", text, base_offset=h.base_offset, reason=reason)
        return
    raw = view[h.position : h.position + h.size]
    try:
        (batch,) = decode_batches(raw, max_batch_bytes=_MAX_BATCH)
        if h.is_control:
            from strom.log.transactions import decode_marker

            marker = decode_marker(raw)
            kind = "COMMIT" if marker.committed else "ABORT"
            out.emit(
                "marker",
                f"  | offset: {h.base_offset} endTxnMarker: {kind} "
                f"coordinatorEpoch: {marker.coordinator_epoch}",
                offset=h.base_offset,
                marker=kind,
                coordinator_epoch=marker.coordinator_epoch,
            )
            return
        for r in batch.records():
            _emit_record(r, out)
    except (InvalidBatchError, ValueError) as exc:
        text = f"  | records not decoded: {exc}"
        out.emit("records_not_decoded", text, base_offset=h.base_offset, reason=str(exc))


def _emit_record(r: Any, out: _Out) -> None:
    """One record of a batch, as a text line or a ``record`` object."""
    text = None
    if not out.json:
        headers = ", ".join(f"{k}={v!r}" for k, v in r.headers)
        text = (
            f"  | offset: {r.offset} timestamp: {r.timestamp} "
            f"keySize: {-1 if r.key is None else len(r.key)} "
            f"valueSize: {-1 if r.value is None else len(r.value)} "
            f"key: {r.key!r} value: {r.value!r} headers: [{headers}]"
        )
    out.emit(
        "record",
        text,
        offset=r.offset,
        timestamp=r.timestamp,
        key_size=-1 if r.key is None else len(r.key),
        value_size=-1 if r.value is None else len(r.value),
        **_bytes_fields("key", r.key),
        **_bytes_fields("value", r.value),
        headers=[{"key": k, **_bytes_fields("value", v)} for k, v in r.headers],
    )


def _dump_index(path: Path, view: memoryview, base: int, kind: str, out: _Out) -> None:
    """An offset index's (offset, position), a time index's (timestamp, offset) or the
    aborted-transactions index's (producer id, first offset, marker offset) entries."""
    entry = {"index": _OFF_ENTRY, "timeindex": _TIME_ENTRY}.get(kind, _ABORTED_ENTRY)
    whole = len(view) - len(view) % entry.size
    n = 0
    for pos in range(0, whole, entry.size):
        fields = entry.unpack_from(view, pos)
        if kind == "index":
            offset, position = base + fields[0], fields[1]
            text = f"offset: {offset} position: {position}"
            out.emit("index_entry", text, offset=offset, position=position)
        elif kind == "timeindex":
            timestamp, offset = fields[0], base + fields[1]
            text = f"timestamp: {timestamp} offset: {offset}"
            out.emit("timeindex_entry", text, timestamp=timestamp, offset=offset)
        else:
            out.emit(
                "aborted_transaction",
                f"producerId: {fields[0]} firstOffset: {fields[1]} lastOffset: {fields[2]}",
                producer_id=fields[0],
                first_offset=fields[1],
                last_offset=fields[2],
            )
        n += 1
    out.emit("summary", f"{n} entries", entries=n)
    if whole != len(view):
        raise DumpError(
            f"{path}: {len(view) - whole} stray bytes after the last whole entry "
            f"(entries are {entry.size} bytes)"
        )


def _dump_snapshot(path: Path, data: bytes, out: _Out) -> None:
    """A producer-state snapshot: the state as of its offset, one producer a line."""
    from strom.log.producer_state import ProducerStateManager

    try:
        offset, state = ProducerStateManager.from_bytes(data)
    except ValueError as exc:
        raise DumpError(f"{path}: not a usable producer snapshot: {exc}") from None
    for e in sorted(state, key=lambda e: e.producer_id):
        kept = " ".join(
            f"{b.first_seq}..{b.last_seq}@{b.base_offset}..{b.last_offset}" for b in e.batches
        )
        out.emit(
            "producer",
            f"producerId: {e.producer_id} producerEpoch: {e.epoch} "
            f"lastSequence: {e.last_seq} lastTimestamp: {e.last_timestamp_ms} "
            f"coordinatorEpoch: {e.coordinator_epoch} "
            f"currentTxnStartOffset: {e.txn_first_offset} batches: [{kept}]",
            producer_id=e.producer_id,
            producer_epoch=e.epoch,
            last_sequence=e.last_seq,
            last_timestamp=e.last_timestamp_ms,
            coordinator_epoch=e.coordinator_epoch,
            current_txn_start_offset=e.txn_first_offset,
            batches=[
                {
                    "first_sequence": b.first_seq,
                    "last_sequence": b.last_seq,
                    "base_offset": b.base_offset,
                    "last_offset": b.last_offset,
                }
                for b in e.batches
            ],
        )
    out.emit(
        "summary",
        f"{len(state)} producers as of offset {offset}",
        producers=len(state),
        offset=offset,
    )
