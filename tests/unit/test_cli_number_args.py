"""Numbers on the command line: a rate, a length of time or a size that makes no sense is
refused by the parser with one line naming the flag, before anything starts (before, `strom
bench commits --seconds -1` started two clusters and reported nothing)."""

from __future__ import annotations

import argparse

import pytest

from strom.argtypes import number_above
from strom.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench", "commits", "--seconds", "-1"],
            "argument --seconds: must be more than 0, not -1",
        ),
        (["bench", "e2e", "--rate", "0"], "argument --rate: must be more than 0, not 0"),
        (["bench", "e2e", "--rate", "nan"], "argument --rate: must be a finite number, not 'nan'"),
        (["bench", "e2e", "--duration", "-5"], "argument --duration: must be more than 0"),
        (["bench", "tls", "--linger-ms", "-1"], "argument --linger-ms: must be at least 0, not -1"),
        (["bench", "rebalance", "--rate", "fast"], "argument --rate: not a number: 'fast'"),
        (["bench", "scale", "--interval-ms", "0"], "argument --interval-ms: must be more than 0"),
        (["bench", "startup", "--gib", "-0.5"], "argument --gib: must be more than 0"),
        (["demo", "--seconds", "inf"], "argument --seconds: must be a finite number"),
        # -1 used to mean "the default" here while -5 was refused (found from outside)
        (
            ["topics", "create", "t", "--partitions", "-1"],
            "argument --partitions: must be at least 1, not -1",
        ),
        (
            ["topics", "create", "t", "--replication-factor", "0"],
            "argument --replication-factor: must be at least 1, not 0",
        ),
        (
            ["topics", "add-partitions", "t", "--partitions", "99999999999999999999"],
            "argument --partitions: must be at most 2147483647",
        ),
    ],
)
def test_bad_numbers_are_one_line_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_number_above() -> None:
    positive, non_negative = number_above(0.0), number_above(0.0, inclusive=True)
    assert positive("2.5") == 2.5 and positive("1e3") == 1000.0
    assert non_negative("0") == 0.0
    for bad in ("0", "-1", "x", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        non_negative("-0.1")
