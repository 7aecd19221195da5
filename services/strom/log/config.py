"""Topic-level log configuration with Kafka's dotted names (DESIGN §1, §5).

One table describes every key: its type, default and rule. The controller validates topic
configs with :func:`validate_configs` and storage nodes build :class:`LogConfig` from the same
table, so a config accepted at topic creation always means the same thing on every node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strom.log.errors import ConfigError

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class ConfigKey:
    """Definition of one topic config key."""

    name: str
    kind: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] = lambda v: None
    choices: tuple[str, ...] = ()


def _at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be >= {n}"


def _cleanup_policy(v: str) -> str | None:
    parts = [p.strip() for p in v.split(",") if p.strip()]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        return "must be 'delete', 'compact' or 'delete,compact'"
    return None


CONFIG_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in [
        ConfigKey(
            "cleanup.policy",
            str,
            "delete",
            "delete old segments, compact by key, or both",
            _cleanup_policy,
        ),
        ConfigKey(
            "retention.ms",
            int,
            7 * DAY_MS,
            "delete segments whose newest record is older than this (-1: never)",
            _at_least(-1),
        ),
        ConfigKey(
            "retention.bytes",
            int,
            -1,
            "delete oldest segments while the log is larger than this (-1: no limit)",
            _at_least(-1),
        ),
        ConfigKey(
            "segment.bytes",
            int,
            1 << 30,
            "roll a new segment at this size",
            lambda v: None if 1024 <= v <= (1 << 31) - 1 else "must be in [1024, 2^31-1]",
        ),
        ConfigKey("segment.ms", int, 7 * DAY_MS, "roll a new segment after this age", _at_least(1)),
        ConfigKey(
            "index.interval.bytes",
            int,
            4096,
            "bytes of log between offset-index entries",
            _at_least(0),
        ),
        ConfigKey(
            "delete.retention.ms",
            int,
            DAY_MS,
            "how long tombstones stay readable on compacted topics",
            _at_least(0),
        ),
        ConfigKey(
            "min.compaction.lag.ms",
            int,
            0,
            "records younger than this are never compacted",
            _at_least(0),
        ),
        ConfigKey(
            "flush.messages",
            int,
            -1,
            "fsync after this many records (-1: leave it to the OS and replication)",
            _at_least(-1),
        ),
        ConfigKey(
            "flush.ms", int, -1, "fsync at least this often (-1: never forced)", _at_least(-1)
        ),
        ConfigKey(
            "max.message.bytes", int, 16 * 1024 * 1024, "largest batch accepted", _at_least(64)
        ),
        ConfigKey(
            "message.timestamp.type",
            str,
            "CreateTime",
            "CreateTime keeps the producer's time, LogAppendTime stamps the broker's",
            choices=("CreateTime", "LogAppendTime"),
        ),
        ConfigKey(
            "min.insync.replicas",
            int,
            1,
            "replicas that must have a batch before acks=all succeeds",
            _at_least(1),
        ),
        ConfigKey(
            "unclean.leader.election.enable",
            bool,
            False,
            "allow an out-of-sync replica to lead (may lose data)",
        ),
        ConfigKey(
            "producer.id.expiration.ms",
            int,
            DAY_MS,
            "forget an idempotent producer's sequence state after it has been idle this long",
            _at_least(1),
        ),
        ConfigKey(
            "compression.type",
            str,
            "producer",
            "accepted for compatibility; strom stores batches as the producer sent them",
            choices=("producer", "none", "gzip", "snappy", "lz4", "zstd"),
        ),
    ]
}


def parse_value(name: str, raw: Any) -> Any:
    """Parse and check one config value; raise :class:`ConfigError` naming the key."""
    key = CONFIG_KEYS.get(name)
    if key is None:
        raise ConfigError(f"unknown config '{name}' (known: {', '.join(sorted(CONFIG_KEYS))})")
    value: Any
    try:
        if key.kind is bool:
            if isinstance(raw, bool):
                value = raw
            elif str(raw).strip().lower() in ("true", "false"):
                value = str(raw).strip().lower() == "true"
            else:
                raise ValueError
        elif key.kind is int:
            if isinstance(raw, bool):
                raise ValueError
            value = int(str(raw).strip())
        else:
            value = str(raw).strip()
    except ValueError:
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: expected {key.kind.__name__}"
        ) from None
    if key.choices and value not in key.choices:
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: must be one of {', '.join(key.choices)}"
        )
    problem = key.check(value)
    if problem:
        raise ConfigError(f"config '{name}' has invalid value {raw!r}: {problem}")
    return value


def validate_configs(configs: Mapping[str, Any]) -> dict[str, str]:
    """Validate a topic's config overrides; return them normalised as strings (as stored)."""
    out: dict[str, str] = {}
    for name, raw in configs.items():
        v = parse_value(name, raw)
        out[name] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


@dataclass(frozen=True)
class LogConfig:
    """The effective settings of one partition log (defaults overlaid with topic overrides)."""

    segment_bytes: int = CONFIG_KEYS["segment.bytes"].default
    segment_ms: int = CONFIG_KEYS["segment.ms"].default
    retention_ms: int = CONFIG_KEYS["retention.ms"].default
    retention_bytes: int = CONFIG_KEYS["retention.bytes"].default
    cleanup_policy: str = CONFIG_KEYS["cleanup.policy"].default
    delete_retention_ms: int = CONFIG_KEYS["delete.retention.ms"].default
    min_compaction_lag_ms: int = CONFIG_KEYS["min.compaction.lag.ms"].default
    index_interval_bytes: int = CONFIG_KEYS["index.interval.bytes"].default
    flush_messages: int = CONFIG_KEYS["flush.messages"].default
    flush_ms: int = CONFIG_KEYS["flush.ms"].default
    max_message_bytes: int = CONFIG_KEYS["max.message.bytes"].default
    message_timestamp_type: str = CONFIG_KEYS["message.timestamp.type"].default
    min_insync_replicas: int = CONFIG_KEYS["min.insync.replicas"].default
    unclean_leader_election_enable: bool = CONFIG_KEYS["unclean.leader.election.enable"].default
    compression_type: str = CONFIG_KEYS["compression.type"].default
    producer_id_expiration_ms: int = CONFIG_KEYS["producer.id.expiration.ms"].default

    @classmethod
    def from_dict(cls, configs: Mapping[str, Any] | None = None) -> LogConfig:
        """Build from dotted-name overrides (``{"retention.ms": "1000"}``)."""
        kwargs = {
            name.replace(".", "_"): parse_value(name, raw) for name, raw in (configs or {}).items()
        }
        return cls(**kwargs)

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"
