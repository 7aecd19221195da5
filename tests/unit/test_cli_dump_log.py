"""``strom dump-log`` on segment and index files (Kafka's kafka-dump-log.sh): one line per
batch from its header, records with ``--records``, and one-line errors with exit 1 or 2 for
files that are missing, damaged, torn or not segments. Real node data dirs are dumped in
tests/integration/test_compaction_transactions.py."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from strom.cli.main import main as cli_main
from strom.record import encode_batch
from tests.unit.test_log import T0, make_log

SEG = "00000000000000000000.log"


def _segment(tmp_path: Path) -> Path:
    """A log of two plain batches, a transactional batch and its abort marker, closed."""
    log = make_log(tmp_path / "t-0")
    log.append(encode_batch([b"v0", b"v1"], keys=[b"a", None], timestamps=[T0, T0 + 1]))
    log.append(encode_batch([b"v2"], keys=[b"b"], timestamps=[T0 + 2], compression="zstd"))
    log.append(
        encode_batch(
            [b"t"],
            keys=[b"k"],
            timestamps=[T0 + 3],
            producer_id=7,
            producer_epoch=1,
            base_sequence=0,
            transactional=True,
        )
    )
    log.append_marker(7, 1, committed=False, coordinator_epoch=4)
    log.close()
    return tmp_path / "t-0"


def test_batches_records_and_indexes_are_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _segment(tmp_path)
    assert cli_main(["dump-log", str(d / SEG)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("baseOffset")]
    assert len(lines) == 4 and all("isValid: true" in ln for ln in lines)
    assert lines[0].startswith("baseOffset: 0 lastOffset: 1 count: 2 position: 0 ")
    assert "compression: zstd" in lines[1]
    assert "producerId: 7 producerEpoch: 1 baseSequence: 0 isTransactional: true" in lines[2]
    assert "isTransactional: true isControl: true" in lines[3]
    assert "4 batches, offsets 0..4, 5 records" in out
    assert "| offset" not in out  # records only when asked
    rc = cli_main(["dump-log", "--records", str(d / SEG), str(d / "00000000000000000000.index")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| offset: 0 timestamp: 1700000000000 keySize: 1 valueSize: 2 key: b'a'" in out
    assert "| offset: 1 timestamp: 1700000000001 keySize: -1 valueSize: 2 key: None" in out
    assert "| offset: 4 endTxnMarker: ABORT coordinatorEpoch: 4" in out
    assert "offset: 0 position: 0" in out


def test_a_damaged_or_torn_segment_says_where_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _segment(tmp_path)
    data = (d / SEG).read_bytes()
    bad = tmp_path / "bad"
    bad.mkdir()
    flipped = bytearray(data)
    flipped[len(data) - 3] ^= 0x5A  # inside the last batch's body: its CRC fails
    (bad / SEG).write_bytes(bytes(flipped))
    assert cli_main(["dump-log", "--records", str(bad / SEG)]) == 1
    cap = capsys.readouterr()
    assert cap.out.count("isValid: true") == 3 and cap.out.count("isValid: false") == 1
    assert "records not decoded: the CRC does not match" in cap.out
    assert cap.err.strip().endswith("1 of 4 batches fail their CRC (damaged)")
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / SEG).write_bytes(data[:-10])
    assert cli_main(["dump-log", str(torn / SEG)]) == 1
    cap = capsys.readouterr()
    assert cap.out.count("baseOffset") == 3
    assert "damaged or torn: batch at byte" in cap.err and "truncated" in cap.err
    assert len(cap.err.strip().splitlines()) == 1 and "Traceback" not in cap.err


def test_files_that_are_missing_or_not_segments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / SEG
    text.write_text("hello, not a segment at all; long enough for a header " * 3)
    assert cli_main(["dump-log", str(text)]) == 1
    assert "not a strom segment" in capsys.readouterr().err
    assert cli_main(["dump-log", str(tmp_path / "00000000000000000042.log")]) == 1
    assert "00000000000000000042.log: no such file" in capsys.readouterr().err
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert cli_main(["dump-log", str(other)]) == 2
    err = capsys.readouterr().err
    assert "not a segment or index file" in err and len(err.strip().splitlines()) == 1
    d = tmp_path / "dir"
    (d / SEG).mkdir(parents=True)
    assert cli_main(["dump-log", str(d / SEG)]) == 1
    assert "a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / SEG).write_bytes(b"")
    assert cli_main(["dump-log", str(empty / SEG)]) == 0
    assert "(empty)" in capsys.readouterr().out


def test_a_preallocated_segments_zero_tail_ends_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _segment(tmp_path)
    pre = tmp_path / "pre"
    shutil.copytree(d, pre)
    with open(pre / SEG, "ab") as f:
        f.write(bytes(5000))
    assert cli_main(["dump-log", str(pre / SEG)]) == 0
    out = capsys.readouterr().out
    assert "bytes of zeros follow" in out and "4 batches" in out


def test_the_aborted_index_and_producer_snapshots_are_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The files behind read_committed answers and producer state: each abort (producer,
    first offset, marker offset) and each producer of a snapshot; a damaged snapshot is one
    line and exit 1."""
    d = _segment(tmp_path)
    snapshot = d / "00000000000000000005.snapshot"
    assert cli_main(["dump-log", str(d / "aborted-transactions"), str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "producerId: 7 firstOffset: 3 lastOffset: 4" in out and "1 entries" in out
    assert "producerId: 7 producerEpoch: 1 lastSequence: 0 lastTimestamp: " in out
    assert "currentTxnStartOffset: -1 batches: [0..0@3..3]" in out
    assert "1 producers as of offset 5" in out
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 1
    snapshot.write_bytes(bytes(data))
    assert cli_main(["dump-log", str(snapshot)]) == 1
    err = capsys.readouterr().err
    assert "not a usable producer snapshot: producer snapshot CRC mismatch" in err


def _json_lines(out: str) -> list[dict[str, Any]]:
    """Every line of a ``--json`` dump, each one JSON object (JSON Lines)."""
    return [json.loads(line) for line in out.splitlines()]


def test_json_prints_one_object_per_batch_record_and_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found from outside: no --json, so scripts (kafka-dump-log users have them) had to parse
    the text. JSON Lines: one object per batch, per record and marker with --records (or
    Kafka's --print-data-log), per index entry and producer, each naming its type and file;
    bytes as UTF-8 text, or base64 when they are not."""
    d = _segment(tmp_path)
    seg = str(d / SEG)
    assert cli_main(["dump-log", "--json", seg]) == 0
    objs = _json_lines(capsys.readouterr().out)
    assert [o["type"] for o in objs] == ["file", "batch", "batch", "batch", "batch", "summary"]
    assert all(o["file"] == seg for o in objs)
    first, _, txn, marker = objs[1:5]
    assert (first["base_offset"], first["last_offset"], first["count"]) == (0, 1, 2)
    assert first["is_valid"] is True and first["offsets_tile"] is True
    assert (txn["producer_id"], txn["is_transactional"], txn["is_control"]) == (7, True, False)
    assert marker["is_control"] is True and objs[2]["compression"] == "zstd"
    assert objs[-1] | {"file": ""} == {
        "type": "summary",
        "file": "",
        "batches": 4,
        "first_offset": 0,
        "last_offset": 4,
        "records": 5,
        "bad_crc_batches": 0,
    }

    binary = tmp_path / "bin"
    log = make_log(binary)
    log.append(
        encode_batch([b"\xff\xfe"], keys=[b"k"], timestamps=[T0], headers=[[("h", b"\x00\xff")]])
    )
    log.close()
    argv = ["dump-log", "--print-data-log", "--json", seg, str(binary / SEG)]
    assert cli_main(argv) == 0
    objs = _json_lines(capsys.readouterr().out)
    records = [o for o in objs if o["type"] == "record"]
    assert [(r["offset"], r["key"], r["value"]) for r in records[:3]] == [
        (0, "a", "v0"),
        (1, None, "v1"),
        (2, "b", "v2"),
    ]
    assert records[1]["key_size"] == -1 and records[1]["key_encoding"] is None
    (m,) = [o for o in objs if o["type"] == "marker"]
    assert (m["offset"], m["marker"], m["coordinator_epoch"]) == (4, "ABORT", 4)
    last = records[-1]
    assert last["file"] == str(binary / SEG)
    assert (last["key"], last["key_encoding"], last["value_encoding"]) == ("k", "utf8", "base64")
    assert base64.b64decode(last["value"]) == b"\xff\xfe"
    assert last["headers"] == [
        {"key": "h", "value": base64.b64encode(b"\x00\xff").decode(), "value_encoding": "base64"}
    ]

    argv = [
        "dump-log",
        "--json",
        str(d / "00000000000000000000.index"),
        str(d / "aborted-transactions"),
    ]
    assert cli_main(argv) == 0
    objs = _json_lines(capsys.readouterr().out)
    assert {"type": "index_entry", "offset": 0, "position": 0}.items() <= objs[1].items()
    (aborted,) = [o for o in objs if o["type"] == "aborted_transaction"]
    assert (aborted["producer_id"], aborted["first_offset"], aborted["last_offset"]) == (7, 3, 4)
    snapshot = str(d / "00000000000000000005.snapshot")
    assert cli_main(["dump-log", "--json", snapshot]) == 0
    (producer,) = [o for o in _json_lines(capsys.readouterr().out) if o["type"] == "producer"]
    assert producer["batches"] == [
        {"first_sequence": 0, "last_sequence": 0, "base_offset": 3, "last_offset": 3}
    ]


def test_json_names_a_damaged_file_in_an_error_object_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure is on stdout as an ``error`` object too (a script reading only stdout must
    not take a torn segment's dump for a whole one), beside the stderr line and exit 1."""
    d = _segment(tmp_path)
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / SEG).write_bytes((d / SEG).read_bytes()[:-10])
    missing = str(tmp_path / "00000000000000000042.log")
    assert cli_main(["dump-log", "--json", str(torn / SEG), missing]) == 1
    cap = capsys.readouterr()
    objs = _json_lines(cap.out)
    assert [o["type"] for o in objs] == ["file", "batch", "batch", "batch", "error", "error"]
    assert "damaged or torn" in objs[4]["message"] and objs[4]["file"] == str(torn / SEG)
    assert objs[5]["file"] == missing and "no such file" in objs[5]["message"]
    assert len(cap.err.strip().splitlines()) == 2


def test_dump_log_help_documents_json() -> None:
    got = subprocess.run(
        [sys.executable, "-m", "strom.cli.main", "dump-log", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0 and "--json" in got.stdout and "--print-data-log" in got.stdout
