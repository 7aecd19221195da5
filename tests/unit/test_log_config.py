"""Unit tests for topic/log configuration (DESIGN §1, §5): defaults, parsing, validation."""

from __future__ import annotations

import pytest

from strom.log import CONFIG_KEYS, ConfigError, LogConfig, validate_configs
from strom.log.config import DAY_MS, parse_value


def test_defaults_match_the_design() -> None:
    cfg = LogConfig.from_dict()
    assert cfg == LogConfig() == LogConfig.from_dict({}) == LogConfig.from_dict(None)
    assert cfg.segment_bytes == 1 << 30
    assert cfg.segment_ms == 7 * DAY_MS
    assert cfg.retention_ms == 7 * DAY_MS
    assert cfg.retention_bytes == -1
    assert cfg.cleanup_policy == "delete"
    assert cfg.delete_retention_ms == DAY_MS
    assert cfg.min_compaction_lag_ms == 0
    assert cfg.index_interval_bytes == 4096
    assert cfg.flush_messages == -1
    assert cfg.flush_ms == -1
    assert cfg.max_message_bytes == 16 * 1024 * 1024
    assert cfg.message_timestamp_type == "CreateTime"
    assert cfg.min_insync_replicas == 1
    assert cfg.unclean_leader_election_enable is False
    assert cfg.compression_type == "producer"
    assert cfg.delete and not cfg.compact and not cfg.log_append_time


def test_every_key_maps_to_a_field() -> None:
    fields = set(LogConfig.__dataclass_fields__)
    for name, key in CONFIG_KEYS.items():
        attr = name.replace(".", "_")
        assert attr in fields, name
        assert getattr(LogConfig(), attr) == key.default
    assert len(fields) == len(CONFIG_KEYS)


def test_parses_strings_ints_and_bools() -> None:
    cfg = LogConfig.from_dict(
        {
            "segment.bytes": "2048",
            "segment.ms": 60_000,
            "retention.ms": " -1 ",
            "retention.bytes": "1000000",
            "cleanup.policy": "compact",
            "unclean.leader.election.enable": "TRUE",
            "message.timestamp.type": "LogAppendTime",
            "compression.type": "zstd",
            "flush.messages": "0",
            "index.interval.bytes": 0,
        }
    )
    assert cfg.segment_bytes == 2048
    assert cfg.segment_ms == 60_000
    assert cfg.retention_ms == -1
    assert cfg.retention_bytes == 1_000_000
    assert cfg.compact and not cfg.delete
    assert cfg.unclean_leader_election_enable is True
    assert cfg.log_append_time
    assert cfg.compression_type == "zstd"
    assert cfg.flush_messages == 0
    assert cfg.index_interval_bytes == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(True, True), (False, False), ("true", True), ("False", False), (" true ", True)],
)
def test_bool_values(raw: object, expected: bool) -> None:
    assert parse_value("unclean.leader.election.enable", raw) is expected


@pytest.mark.parametrize("policy", ["delete,compact", "compact,delete", "compact, delete"])
def test_both_cleanup_policies(policy: str) -> None:
    cfg = LogConfig.from_dict({"cleanup.policy": policy})
    assert cfg.compact and cfg.delete


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("compact,compact", "compact"),
        ("delete, compact,delete", "delete,compact"),
        (" compact , delete ", "compact,delete"),
        ("compact,,delete,", "compact,delete"),
        ("delete,compact", "delete,compact"),
    ],
)
def test_cleanup_policy_is_stored_without_repeats(raw: str, stored: str) -> None:
    """Found from outside: ``cleanup.policy=compact,compact`` was stored as written; the list
    is now kept in one form (trimmed, repeats dropped, first-seen order kept)."""
    assert validate_configs({"cleanup.policy": raw}) == {"cleanup.policy": stored}
    assert LogConfig.from_dict({"cleanup.policy": raw}).cleanup_policy == stored


def test_validate_configs_normalises_to_strings() -> None:
    out = validate_configs(
        {
            "retention.ms": 1000,
            "unclean.leader.election.enable": True,
            "cleanup.policy": " compact ",
            "segment.bytes": "4096",
        }
    )
    assert out == {
        "retention.ms": "1000",
        "unclean.leader.election.enable": "true",
        "cleanup.policy": "compact",
        "segment.bytes": "4096",
    }
    assert validate_configs({}) == {}
    # What validate_configs stores is accepted back by LogConfig with the same meaning.
    assert LogConfig.from_dict(out).segment_bytes == 4096


@pytest.mark.parametrize("fn", [validate_configs, LogConfig.from_dict])
def test_unknown_key_is_named(fn: object) -> None:
    with pytest.raises(ConfigError) as err:
        fn({"retention.msec": "10"})  # type: ignore[operator]
    assert "retention.msec" in str(err.value)
    assert "unknown" in str(err.value)


@pytest.mark.parametrize(
    ("name", "raw", "rule"),
    [
        ("segment.bytes", "10", "[1024, 2^31-1]"),
        ("segment.bytes", str(1 << 31), "[1024, 2^31-1]"),
        ("cleanup.policy", "foo", "'delete', 'compact'"),
        ("cleanup.policy", "", "'delete', 'compact'"),
        ("cleanup.policy", "delete,foo", "'delete', 'compact'"),
        ("retention.ms", "abc", "expected int"),
        ("retention.ms", "-2", "must be >= -1"),
        ("retention.ms", "1.5", "expected int"),
        ("retention.bytes", None, "expected int"),
        ("segment.ms", "0", "must be >= 1"),
        ("index.interval.bytes", "-1", "must be >= 0"),
        ("delete.retention.ms", -1, "must be >= 0"),
        ("min.compaction.lag.ms", "-5", "must be >= 0"),
        ("flush.messages", "-2", "must be >= -1"),
        ("flush.ms", "x", "expected int"),
        ("max.message.bytes", "63", "must be in [64, 267386880]"),
        ("min.insync.replicas", "0", "must be >= 1"),
        ("message.timestamp.type", "bogus", "CreateTime, LogAppendTime"),
        ("message.timestamp.type", "createtime", "CreateTime, LogAppendTime"),
        ("compression.type", "brotli", "producer, none, gzip"),
        ("unclean.leader.election.enable", "yes", "expected bool"),
        ("unclean.leader.election.enable", 1, "expected bool"),
        ("segment.bytes", True, "expected int"),
        # Found from outside: Python's int() took these, Kafka refuses them.
        ("retention.ms", "1_000", "expected int (ASCII digits 0-9"),
        ("retention.ms", "\u0661\u0660\u0660\u0660", "expected int (ASCII digits 0-9"),
        ("segment.bytes", "1048576\n5", "expected int"),
        ("min.cleanable.dirty.ratio", "0_5", "expected a number"),
        ("min.cleanable.dirty.ratio", "\u0660.5", "expected a number"),
    ],
)
def test_bad_values_name_key_and_rule(name: str, raw: object, rule: str) -> None:
    for fn in (validate_configs, LogConfig.from_dict):
        with pytest.raises(ConfigError) as err:
            fn({name: raw})
        msg = str(err.value)
        assert f"'{name}'" in msg, msg
        assert rule in msg, msg


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_configs({"segment.bytes": "1"})


def test_boundaries_accepted() -> None:
    assert validate_configs(
        {
            "segment.bytes": str((1 << 31) - 1),
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "segment.ms": "1",
            "max.message.bytes": "64",
            "delete.retention.ms": "0",
        }
    )["segment.bytes"] == str((1 << 31) - 1)
    assert LogConfig.from_dict({"segment.bytes": 1024}).segment_bytes == 1024
