"""Per-partition lag of a streaming query, from Spark's own progress reports.

What the Python Data Source API allows (checked on PySpark 4.3): a Python stream reader cannot
report custom source metrics (the JVM side, ``PythonMicroBatchStream``, does not implement
``ReportsSourceMetrics``, so ``sources[].metrics`` stays empty). It can report the latest
offsets it saw (``reportLatestOffset``), which Spark records in every progress as the source's
``latestOffset`` beside ``endOffset`` (what the micro-batch read up to). The lag of each
partition is their difference; :func:`lag` computes it from a progress (``query.lastProgress``,
a listener event's ``progress``, or its JSON as a dict).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from strom.client.types import TopicPartition


def _offsets(value: Any) -> dict[TopicPartition, int]:
    if value is None:
        return {}
    if isinstance(value, str):
        if value in ("", "null"):
            return {}
        value = json.loads(value)
    if not isinstance(value, Mapping):
        return {}
    out: dict[TopicPartition, int] = {}
    for topic, parts in value.items():
        if isinstance(parts, Mapping):
            for p, off in parts.items():
                out[TopicPartition(str(topic), int(p))] = int(off)
    return out


def lag(progress: Any, source: int = 0) -> dict[TopicPartition, int]:
    """Latest offset minus processed offset, per partition, for the ``source``-th source of a
    streaming progress (empty before the first micro-batch, when ``query.lastProgress`` is
    still None: the README's example raised AttributeError there)."""
    if progress is None:
        return {}
    sources = progress["sources"] if isinstance(progress, Mapping) else progress.sources
    if len(sources) <= source:
        return {}
    src = sources[source]
    get = src.get if isinstance(src, Mapping) else lambda k: getattr(src, k, None)
    latest = _offsets(get("latestOffset"))
    done = _offsets(get("endOffset"))
    return {tp: max(off - done.get(tp, 0), 0) for tp, off in sorted(latest.items())}


def end_offsets(progress: Any, source: int = 0) -> dict[TopicPartition, int]:
    """The offsets the progress' micro-batch read up to (its ``endOffset``), per partition
    (empty for no progress yet)."""
    if progress is None:
        return {}
    sources = progress["sources"] if isinstance(progress, Mapping) else progress.sources
    if len(sources) <= source:
        return {}
    src = sources[source]
    return _offsets(src.get("endOffset") if isinstance(src, Mapping) else src.endOffset)


def total_lag(progress: Any, source: int = 0) -> int:
    """The sum of :func:`lag` over partitions."""
    return sum(lag(progress, source).values())
