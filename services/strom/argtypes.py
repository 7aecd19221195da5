"""argparse types for numbers, shared by the services' flags and the ``strom`` CLI: a module
of its own so the CLI (and the processes the benchmarks spawn through it) need not import the
services' runtime to check a number."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

#: The largest value of a protobuf int32 field (partition counts, replication factors).
INT32_MAX = 2**31 - 1


def int_at_least(minimum: int, why: str = "", maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, not {value}")
        return value

    parse.__name__ = "int"
    return parse


def number_above(minimum: float, *, inclusive: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number above ``minimum`` (or equal, with ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
        if value < minimum or (value == minimum and not inclusive):
            bound = "at least" if inclusive else "more than"
            raise argparse.ArgumentTypeError(f"must be {bound} {minimum:g}, not {text}")
        return value

    parse.__name__ = "number"
    return parse
