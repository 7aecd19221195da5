"""``strom dump-log`` on segment and index files (Kafka's kafka-dump-log.sh): one line per
batch from its header, records with ``--records``, and one-line errors with exit 1 or 2 for
files that are missing, damaged, torn or not segments. Real node data dirs are dumped in
tests/integration/test_compaction_transactions.py."""

from __future__ import annotations

import shutil
from pathlib import Path

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
