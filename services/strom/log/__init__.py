"""The storage engine (DESIGN §5): segments, indexes, partition logs, recovery, retention,
compaction and the data-dir checkpoints. Pure Python and files; no gRPC, no etcd."""

from strom.log.cleaner import CleanerStats, compact
from strom.log.config import CONFIG_KEYS, LogConfig, validate_configs
from strom.log.errors import (
    ConfigError,
    CorruptLogError,
    InvalidAppendError,
    LogError,
    OffsetOutOfRangeError,
)
from strom.log.manager import LogManager
from strom.log.partition_log import AppendInfo, Log, ReadResult
from strom.log.producer_state import ProducerStateError, ProducerStateManager

__all__ = [
    "CONFIG_KEYS",
    "AppendInfo",
    "CleanerStats",
    "ConfigError",
    "CorruptLogError",
    "InvalidAppendError",
    "Log",
    "LogConfig",
    "LogError",
    "LogManager",
    "OffsetOutOfRangeError",
    "ProducerStateError",
    "ProducerStateManager",
    "ReadResult",
    "compact",
    "validate_configs",
]
