"""``strom demo --dir D``: a directory a previous run left is refused before anything starts.

Found from outside: a second ``strom demo --dir D`` started the cluster and Spark, and only
after 19 s failed with ``TOPIC_ALREADY_EXISTS: topic 'page-views' already exists``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from strom.cli.parser import _fresh_demo_dir


@pytest.mark.parametrize("mode", ["", "--cluster", "--engine"])
def test_a_directory_with_a_previous_run_is_refused_at_once(tmp_path: Path, mode: str) -> None:
    previous = tmp_path / "demo"
    (previous / "cluster").mkdir(parents=True)
    (previous / "spark.log").write_text("a previous run's log\n")
    argv = [sys.executable, "-m", "strom.cli.main", "demo", *filter(None, [mode])]
    demo = subprocess.Popen(
        [*argv, "--dir", str(previous)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = demo.communicate(timeout=60)  # the parser's answer: no cluster
    except subprocess.TimeoutExpired:
        demo.terminate()  # SIGTERM: the demo stops what it started
        demo.communicate(timeout=120)
        pytest.fail("strom demo started on a directory holding a previous run")
    assert demo.returncode == 2, stderr
    assert stdout == ""
    (line,) = stderr.strip().splitlines()[-1:]
    assert line.startswith("strom demo: error: argument --dir: ")
    assert f"{previous} holds a previous run" in line
    assert "give another --dir, or remove it first: rm -r" in line
    assert sorted(p.name for p in previous.iterdir()) == ["cluster", "spark.log"]  # untouched


def test_a_new_or_empty_directory_is_taken(tmp_path: Path) -> None:
    assert _fresh_demo_dir(str(tmp_path / "new")) == str(tmp_path / "new")
    assert _fresh_demo_dir(str(tmp_path)) == str(tmp_path)


def test_other_content_and_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(argparse.ArgumentTypeError, match="is not empty"):
        _fresh_demo_dir(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="is a file, not a directory"):
        _fresh_demo_dir(str(tmp_path / "notes.txt"))
