"""``strom bench compaction``: one compaction pass of a fresh local log, as its keys grow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strom.cli.main import main


def test_bench_compaction_reports_one_pass_that_keeps_a_record_per_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "compaction", "--records", "3000", "--keys", "250", "--json"]
    assert main([*argv, "--segment-bytes", "16KiB", "--dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    (result,) = report["results"]
    assert result["name"] == "compaction pass (250 keys, 3,000 -> 250 records)"
    assert result["records"] == 3000 and result["records_per_s"] > 0
    assert result["client_cpu_s"] > 0
    assert report["context"]["mode"] == "compaction" and report["context"]["keys"] == 250
    assert list(tmp_path.iterdir()) == []  # the scratch log is gone
