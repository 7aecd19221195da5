"""Arguments a subcommand does not know: one line under the subcommand's name, saying what it
takes. Found from outside: ``strom topics alter clicks --config retention.ms=1000`` said
``strom: error: unrecognized arguments: --config retention.ms=1000``, naming neither the
subcommand nor its ``--set``; ``--config`` (as ``topics create`` and Kafka's tools take it) is
now the same as ``--set`` there."""

from __future__ import annotations

import pytest

from strom.cli.main import build_parser, main


def test_alter_takes_config_as_set() -> None:
    args = build_parser().parse_args(
        ["topics", "alter", "clicks", "--config", "retention.ms=1000", "--set", "a.b=1"]
    )
    assert args.set == ["retention.ms=1000", "a.b=1"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["topics", "alter", "clicks", "--add-config", "retention.ms=1000"],
            "strom topics alter: error: unrecognized arguments: --add-config retention.ms=1000 "
            "(it takes --set KEY=VALUE or --config KEY=VALUE, --delete KEY and --partitions N)",
        ),
        (
            ["topics", "list", "--bogus"],
            "strom topics list: error: unrecognized arguments: --bogus "
            "(see `strom topics list --help`)",
        ),
    ],
)
def test_unknown_arguments_are_one_line_under_the_subcommand(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and captured.out == ""
