"""``strom coordinator --help`` says how the retention of empty groups is counted.

The count runs in the serving coordinator's memory (``strom.coordinator.timers``) from when
it first saw the group empty: a restart or a shard move starts it over (docs/design.md §7).
The help used to promise Kafka's KIP-211 rule, "counted from when the group became empty",
which strom does not keep across a restart (found from outside).
"""

from __future__ import annotations

import argparse

from strom.coordinator import cli


def _help(option: str) -> str:
    """The help of one option, on one line."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    (action,) = [a for a in parser._actions if option in a.option_strings]
    return " ".join(str(action.help).split())


def test_offsets_retention_help_says_a_restart_or_move_starts_the_count_over() -> None:
    text = _help("--offsets-retention-ms")
    assert "counted from when the group became empty" not in text
    assert "first saw the group empty" in text
    assert "restart or a shard move starts the count over" in text
