"""The ``strom`` command is split by what each module holds (strom.cli.main: running a command
and its errors; parser: the arguments; bench_commands: the benchmarks' runs; admin and, for
``strom topics`` / ``strom cluster``, admin_parser, topic_listing, partition_commands and
configs). What users and scripts see must not follow the split: the console script,
``build_parser``'s and strom.cli.admin's import paths, and a benchmark's one-line errors."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from strom.cli import admin, admin_parser, bench_commands, parser, topic_listing
from strom.cli.main import SERVICES, build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_the_entry_point_and_the_parser_keep_their_import_paths() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["strom"] == "strom.cli.main:main"
    assert build_parser is parser.build_parser
    assert SERVICES is parser.SERVICES
    assert build_parser().prog == "strom"


def test_a_bench_runs_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "record", "--records", "200", "--batch-records", "100", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["context"]["mode"] == "record"
    assert report["context"]["records"] == 200


def test_a_benchs_bad_argument_is_one_line_of_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """run_bench raises (its ValueError); main, in another module, turns it into the error."""
    assert bench_commands.run_bench.__module__ == "strom.cli.bench_commands"
    assert main(["bench", "scale", "--connections", "-1"]) == 1
    err = capsys.readouterr().err
    assert err == "strom bench: error: --connections must be >= 0, not -1\n"


def test_the_admin_commands_names_keep_their_import_path() -> None:
    """``strom.cli.admin`` keeps the names others import from it (parser.py's and the other
    commands' modules', tests'), though the parsers and the describe filters live apart."""
    for name in admin.__all__:
        assert getattr(admin, name) is not None
    assert admin.add_topics_parser is admin_parser.add_topics_parser
    assert admin.add_cluster_parser is admin_parser.add_cluster_parser
    assert admin.PartitionCondition is topic_listing.PartitionCondition
    assert admin.MinIsr is topic_listing.MinIsr
