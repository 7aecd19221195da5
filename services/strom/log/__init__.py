"""The storage engine (DESIGN §5): segments, indexes, partition logs, recovery, retention,
compaction and the data-dir checkpoints. Pure Python and files; no gRPC, no etcd.

The names are loaded on first use (as :mod:`strom`'s are): the controller validates topic
configs with :mod:`strom.log.config` and need not import the segments, the cleaner and
pyarrow with it. Type checkers read the ``TYPE_CHECKING`` imports below, which name the same
modules (tests/unit/test_typing_surface.py keeps the two in step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strom.lazy_names import lazy_names

if TYPE_CHECKING:
    from strom.log.cleaner import (
        CleanableRange,
        CleanerStats,
        cleanable_range,
        compact,
        dirtiest_first,
        measure_logs,
        select_logs,
    )
    from strom.log.config import CONFIG_KEYS, LogConfig, validate_configs
    from strom.log.errors import (
        ConfigError,
        CorruptLogError,
        InvalidAppendError,
        InvalidTimestampError,
        LogError,
        OffsetOutOfRangeError,
        UndecodableBatchError,
    )
    from strom.log.manager import LogManager
    from strom.log.partition_log import AppendInfo, Log, ReadResult
    from strom.log.producer_state import ProducerStateError, ProducerStateManager

#: Each lazily loaded name -> the module it comes from.
_LAZY: dict[str, str] = {
    "CleanableRange": "strom.log.cleaner",
    "CleanerStats": "strom.log.cleaner",
    "cleanable_range": "strom.log.cleaner",
    "compact": "strom.log.cleaner",
    "dirtiest_first": "strom.log.cleaner",
    "measure_logs": "strom.log.cleaner",
    "select_logs": "strom.log.cleaner",
    "CONFIG_KEYS": "strom.log.config",
    "LogConfig": "strom.log.config",
    "validate_configs": "strom.log.config",
    "ConfigError": "strom.log.errors",
    "CorruptLogError": "strom.log.errors",
    "InvalidAppendError": "strom.log.errors",
    "InvalidTimestampError": "strom.log.errors",
    "LogError": "strom.log.errors",
    "OffsetOutOfRangeError": "strom.log.errors",
    "UndecodableBatchError": "strom.log.errors",
    "LogManager": "strom.log.manager",
    "AppendInfo": "strom.log.partition_log",
    "Log": "strom.log.partition_log",
    "ReadResult": "strom.log.partition_log",
    "ProducerStateError": "strom.log.producer_state",
    "ProducerStateManager": "strom.log.producer_state",
}

__all__ = [
    "CONFIG_KEYS",
    "AppendInfo",
    "CleanableRange",
    "CleanerStats",
    "ConfigError",
    "CorruptLogError",
    "InvalidAppendError",
    "InvalidTimestampError",
    "Log",
    "LogConfig",
    "LogError",
    "LogManager",
    "OffsetOutOfRangeError",
    "ProducerStateError",
    "ProducerStateManager",
    "ReadResult",
    "UndecodableBatchError",
    "cleanable_range",
    "compact",
    "dirtiest_first",
    "measure_logs",
    "select_logs",
    "validate_configs",
]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
