"""The storage engine (DESIGN §5): segments, indexes, partition logs, recovery, retention,
compaction and the data-dir checkpoints. Pure Python and files; no gRPC, no etcd."""

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
