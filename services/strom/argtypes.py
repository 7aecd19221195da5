"""argparse types for numbers and times, shared by the services' flags, the ``strom`` CLI and
the clients: a module of its own so the CLI (and the processes the benchmarks spawn through
it) need not import the services' runtime to check a number."""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta


class UsageError(ValueError):
    """Arguments argparse cannot check alone (a flag that needs another, one of two flags, a
    value checked with others): the ``strom`` command prints it as argparse prints its own,
    one line under the subcommand's name (``strom topics alter: error: ...``) and exit 2,
    not as a failure (exit 1) under the parent command's name."""


#: The largest value of a protobuf int32 field (partition counts, replication factors).
INT32_MAX = 2**31 - 1
#: The largest protobuf int64 (offsets, timestamps on the wire).
INT64_MAX = 2**63 - 1
#: The longest wait a client setting in ms that Kafka types as ``long`` (linger.ms,
#: max.block.ms, ...) may ask for: 2**40 ms, ~34.8 years. Such waits become ``threading``
#: timeouts, which overflow at ``threading.TIMEOUT_MAX`` (2**63 ns) and end the waiting
#: thread; 2**40 leaves room for sums with the clock. Here, not in the clients, for the CLI.
LONG_MS_MAX = 2**40


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


def cluster_name(text: str) -> str:
    """An argparse type: a cluster name, the etcd prefix ``/strom/<name>/``: not empty and
    without ``/``, which would put it under another cluster's prefix. Every service and
    ``strom dev up`` check it, so nothing starts (or creates the cluster) before one refuses.
    """
    if not text or "/" in text:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-empty name without '/'")
    return text


def non_empty(what: str) -> Callable[[str], str]:
    """An argparse type for a name (``what``: "topic name", "group id"): an empty or blank one
    is a usage error naming the argument, refused before any connection. No topic name has a
    space (the controller's rule), and a blank group id is as unusable from a shell."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"the {what} must not be empty")
        return text

    parse.__name__ = what.replace(" ", "_")
    return parse


#: The argparse types of topic names and group ids (positional arguments and flags alike).
topic_name = non_empty("topic name")
group_id = non_empty("group id")
transactional_id = non_empty("transactional id")


def number_above(
    minimum: float, *, inclusive: bool = False, maximum: float | None = None
) -> Callable[[str], float]:
    """An argparse type: a finite number above ``minimum`` (or equal, with ``inclusive``), and
    at most ``maximum`` if given."""

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
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, not {text}")
        return value

    parse.__name__ = "number"
    return parse


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def datetime_ms(dt: datetime) -> int:
    """``dt`` in ms since the epoch. Without a timezone it is local time: Python's rule for a
    naive datetime and Kafka's tools', for every command alike. Integer arithmetic, since
    ``timestamp() * 1000`` can land a millisecond early.

    ValueError before 1970: offset lookups read -1 and -2 as "latest" and "earliest", so
    1969-12-31T23:59:59.999Z would mean the end of the log."""
    try:
        ms = (dt.astimezone(UTC) - _EPOCH) // _MS
    except (OverflowError, OSError):  # far outside what the platform's clock can convert
        ms = -1
    if ms < 0:
        raise ValueError(
            f"{dt.isoformat()} is before 1970-01-01T00:00:00Z: times are ms since the epoch"
        )
    return ms


def iso_time_ms(text: str) -> int:
    """An ISO 8601 time (``2024-05-01T12:00:00Z``, ``...+02:00``, or without a timezone:
    local time) in ms since the epoch; ValueError naming the expected form."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO 8601 time, e.g. 2024-05-01T12:00:00Z (UTC) or "
            "2024-05-01T14:00:00 (local time)"
        ) from None
    return datetime_ms(dt)


#: Size suffixes :func:`byte_size` takes (case-insensitive): binary and decimal units.
SIZE_UNITS = {
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "b": 1,
}


def byte_size(text: str) -> int:
    """Parse sizes like ``1048576``, ``64KiB``, ``1MiB``, ``2GiB``, ``1MB`` (a positive
    number of bytes, at most 2^63-1; ``inf`` too is a usage error)."""
    t = text.strip().lower()
    for suffix in sorted(SIZE_UNITS, key=len, reverse=True):
        if t.endswith(suffix):
            num = t[: -len(suffix)].strip()
            break
    else:
        suffix, num = "b", t
    try:
        value = int(float(num) * SIZE_UNITS[suffix])
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1048576 or 1MiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    if value >= 1 << 63:
        raise argparse.ArgumentTypeError(f"size is too large: {text!r} (at most 2^63-1 bytes)")
    return value


#: What a host name may hold (RFC 1123 letters, digits, hyphens and dots; underscores too,
#: which some DNS names carry) — anything else cannot be dialled.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+")
#: ... and an IPv6 address (with or without its brackets, to say which it is).
_HOST_CHARS = re.compile(r"[A-Za-z0-9_.:\[\]%-]+")


def host_problem(host: str) -> str | None:
    """Why ``host`` (of a HOST:PORT) cannot be dialled, or None: a URL scheme, an IPv6
    address without its brackets, separators or spaces: refused up front, since a node would
    register such an address that nobody can dial, and a bootstrap would retry it for a
    minute."""
    if "://" in host or host.startswith("//"):
        return "has a URL scheme: give HOST:PORT only"
    if not _HOST_CHARS.fullmatch(host):
        return "is not a host name or address (one HOST:PORT per entry, comma-separated)"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "has brackets around something that is not an IPv6 address"
        return None
    if ":" in host:
        return "is an IPv6 address without brackets: write [ADDRESS]:PORT, e.g. [::1]:9092"
    if not _HOST_NAME.fullmatch(host):
        return "is not a host name or address (one HOST:PORT per entry, comma-separated)"
    return None
