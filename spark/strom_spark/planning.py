"""Pure planning of what a read covers: offset ranges, pushed-down filters, splitting, and the
per-trigger rate limit of a stream. No I/O here (the lookups are in :mod:`strom_spark.lookup`),
so every rule is unit-tested on its own.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from strom.client.types import TopicPartition


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition."""

    tp: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


# -- pushed-down filters ------------------------------------------------------------------


@dataclass(frozen=True)
class Pushed:
    """The conjunction of the filters a read took over from Spark.

    ``topic`` / ``partition`` / ``offset`` filters are applied exactly (Spark does not check
    them again); a ``timestamp`` lower bound only moves each range's start to the first offset
    at or after it (ListOffsets by time), and Spark still evaluates the timestamp filter on
    the rows, because timestamps need not grow with offsets.
    """

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    partition_lo: int = 0  # inclusive
    partition_hi: int | None = None  # exclusive
    offset_lo: int = 0  # inclusive
    offset_hi: int | None = None  # exclusive
    timestamp_lo_ms: int | None = None  # rows need timestamp >= this (a safe lower bound)
    impossible: bool = False  # e.g. offset = 5 AND offset = 6

    def keeps(self, tp: TopicPartition) -> bool:
        if self.impossible:
            return False
        if self.topics is not None and tp.topic not in self.topics:
            return False
        if self.partitions is not None and tp.partition not in self.partitions:
            return False
        if tp.partition < self.partition_lo:
            return False
        return self.partition_hi is None or tp.partition < self.partition_hi

    def narrow(self, r: OffsetRange) -> OffsetRange:
        start = max(r.start, self.offset_lo)
        end = r.end if self.offset_hi is None else min(r.end, self.offset_hi)
        return replace(r, start=start, end=max(end, start))


def _column(f: Any) -> str | None:
    attr = getattr(f, "attribute", None)
    if isinstance(attr, tuple) and len(attr) == 1 and isinstance(attr[0], str):
        return attr[0].lower()
    return None


def _int_value(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    return None


def _ms_floor(v: Any) -> int | None:
    """A filter's timestamp value (datetime) in ms since the epoch, rounded down."""
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:  # no zone (a TIMESTAMP_NTZ literal): do not guess, do not narrow
            return None
        delta = v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return micros // 1000
    return None


def push_filters(filters: Iterable[Any]) -> tuple[Pushed, list[Any]]:
    """Split Spark's filters into what the read applies (as :class:`Pushed`) and what Spark
    must still evaluate (returned, the same objects as given)."""
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
    )

    comparisons = (
        EqualTo,
        EqualNullSafe,
        GreaterThan,
        GreaterThanOrEqual,
        LessThan,
        LessThanOrEqual,
    )
    p = Pushed()
    rest: list[Any] = []
    for f in filters:
        col = _column(f)
        value = getattr(f, "value", None)
        taken = False
        if col in ("partition", "offset") and isinstance(f, IsNotNull):
            taken = True  # never null
        elif col == "topic":
            if isinstance(f, IsNotNull):
                taken = True
            elif isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(value, str):
                p = _and_topics(p, {value})
                taken = True
            elif isinstance(f, In) and all(isinstance(v, str) for v in value):
                p = _and_topics(p, set(value))
                taken = True
        elif col == "partition":
            iv = _int_value(value)
            if isinstance(f, (EqualTo, EqualNullSafe)) and iv is not None:
                p = _and_partitions(p, {iv})
                taken = True
            elif isinstance(f, In) and all(_int_value(v) is not None for v in value):
                p = _and_partitions(p, set(value))
                taken = True
            elif iv is not None and isinstance(
                f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
            ):
                lo, hi = _bounds(f, iv)
                p = replace(
                    p,
                    partition_lo=max(p.partition_lo, lo),
                    partition_hi=_min(p.partition_hi, hi),
                )
                taken = True
        elif col == "offset":
            iv = _int_value(value)
            if iv is not None and isinstance(f, comparisons):
                lo, hi = _bounds(f, iv)
                p = replace(p, offset_lo=max(p.offset_lo, lo), offset_hi=_min(p.offset_hi, hi))
                taken = True
        elif col == "timestamp":
            ms = _ms_floor(value)
            lower = isinstance(f, (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual))
            # A bound before 1970 narrows nothing (record timestamps are >= 0), and negative
            # times are ListOffsets' sentinels (-1 latest, -2 earliest): never sent as one.
            if (
                lower
                and ms is not None
                and ms > 0
                and (p.timestamp_lo_ms is None or ms > p.timestamp_lo_ms)
            ):
                p = replace(p, timestamp_lo_ms=ms)
            # never taken: Spark re-checks timestamps on the rows
        if not taken:
            rest.append(f)
    if p.offset_hi is not None and p.offset_hi <= p.offset_lo:
        p = replace(p, impossible=True)
    if p.partition_hi is not None and p.partition_hi <= p.partition_lo:
        p = replace(p, impossible=True)
    return p, rest


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _bounds(f: Any, v: int) -> tuple[int, int | None]:
    """[lo, hi) of an integer comparison ``col <op> v``."""
    name = type(f).__name__
    if name in ("EqualTo", "EqualNullSafe"):
        return v, v + 1
    if name == "GreaterThan":
        return v + 1, None
    if name == "GreaterThanOrEqual":
        return v, None
    if name == "LessThan":
        return 0, v
    return 0, v + 1  # LessThanOrEqual


def _and_topics(p: Pushed, topics: set[str]) -> Pushed:
    new = frozenset(topics) if p.topics is None else p.topics & frozenset(topics)
    return replace(p, topics=new, impossible=p.impossible or not new)


def _and_partitions(p: Pushed, parts: set[int]) -> Pushed:
    new = frozenset(parts) if p.partitions is None else p.partitions & frozenset(parts)
    return replace(p, partitions=new, impossible=p.impossible or not new)


# -- splitting ----------------------------------------------------------------------------


def _split_even(r: OffsetRange, parts: int) -> list[OffsetRange]:
    if parts <= 1 or r.size <= 1:
        return [r]
    parts = min(parts, r.size)
    bounds = [r.start + (r.size * i) // parts for i in range(parts + 1)]
    return [OffsetRange(r.tp, bounds[i], bounds[i + 1]) for i in range(parts)]


def split_ranges(
    ranges: Sequence[OffsetRange],
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[OffsetRange]:
    """Spark tasks for ``ranges``, as Spark's Kafka source plans them.

    One task per non-empty range by default. ``maxRecordsPerPartition`` first cuts every range
    into pieces of at most that many offsets. Then, if there are fewer pieces than
    ``minPartitions``, each piece is split in proportion to its share of all offsets (at least
    one part each), so big partitions get more tasks than small ones.
    """
    pieces = [r for r in ranges if r.size > 0]
    if max_records is not None:
        pieces = [x for r in pieces for x in _split_even(r, math.ceil(r.size / max_records))]
    if min_partitions is not None and len(pieces) < min_partitions:
        total = sum(r.size for r in pieces)
        out: list[OffsetRange] = []
        for r in pieces:
            share = r.size / total * min_partitions
            out.extend(_split_even(r, max(round(share), 1)))
        pieces = out
    return pieces


# -- streaming ----------------------------------------------------------------------------


def rate_limit(
    limit: int, start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """End offsets that admit about ``limit`` offsets in total, shared between partitions in
    proportion to what each has waiting (Spark's Kafka source's rule: a share below one offset
    is rounded up, others down, so no partition with data starves). Partitions missing from
    ``start`` (new ones) start at 0."""
    sizes = {tp: max(end - start.get(tp, 0), 0) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= limit:
        return dict(latest)
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, 0)
        size = sizes[tp]
        if size == 0:
            out[tp] = end
            continue
        share = limit * (size / total)
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, begin + take)
    return out


def pending(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> int:
    """Offsets waiting between ``start`` and ``latest`` (partitions new to ``start`` count
    from 0)."""
    return sum(max(end - start.get(tp, 0), 0) for tp, end in latest.items())
