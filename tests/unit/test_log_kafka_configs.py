"""Kafka 4's topic config names (issue 9, item 4): every name is either applied by strom, with
Kafka's type, range and default, or refused with a message that names it and says why it
does not apply. Before the fix, ``min.cleanable.dirty.ratio`` and the rest were refused as
"unknown config"."""

from __future__ import annotations

import pytest

from strom.api import controller_pb2 as pb
from strom.controller.configs import apply_config_ops, describe_topic_configs
from strom.errors import InvalidConfigError
from strom.grpc_options import MAX_BATCH_BYTES
from strom.log import CONFIG_KEYS, ConfigError, LogConfig, validate_configs
from strom.log.config import NOT_APPLICABLE, parse_value
from strom.storage.assignment import log_config

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1

#: Kafka 4's topic configs (storage LogConfig, non-internal) with their Kafka defaults, as
#: listed by ``kafka-configs --describe --all`` on a 4.x broker. Later 4.x releases added the
#: last three.
KAFKA_4_TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "delete",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.type": "producer",
    "compression.zstd.level": "3",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000",
    "flush.messages": str(LONG_MAX),
    "flush.ms": str(LONG_MAX),
    "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "4096",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": str(LONG_MAX),
    "max.message.bytes": "1048588",
    "message.downconversion.enable": "true",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": str(LONG_MAX),
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": "1073741824",
    "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0",
    "segment.ms": "604800000",
    "unclean.leader.election.enable": "false",
    "remote.copy.lag.ms": "-1",
    "remote.copy.lag.bytes": "-1",
    "errors.deadletterqueue.group.enable": "false",
}
#: Names removed in Kafka 4.0 that 3.x users still set.
REMOVED_IN_KAFKA_4 = ["message.format.version", "message.timestamp.difference.max.ms"]

#: What strom applies (the issue's list and the ones strom had before).
APPLIED = {
    "cleanup.policy",
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "compression.type",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "index.interval.bytes",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "min.insync.replicas",
    "preallocate",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "unclean.leader.election.enable",
}
#: strom's defaults that differ from Kafka's, on purpose (docs/topic-configs.md says why).
STROM_DEFAULTS = {"max.message.bytes": "16777216", "flush.messages": "-1", "flush.ms": "-1"}


def test_every_kafka_4_name_is_applied_or_refused_with_a_reason() -> None:
    known = set(CONFIG_KEYS) | set(NOT_APPLICABLE)
    missing = set(KAFKA_4_TOPIC_CONFIGS) - known
    assert not missing, f"Kafka 4 topic configs strom does not know: {sorted(missing)}"
    assert set(KAFKA_4_TOPIC_CONFIGS) & set(CONFIG_KEYS) == APPLIED
    assert not set(CONFIG_KEYS) & set(NOT_APPLICABLE)


@pytest.mark.parametrize("name", sorted(APPLIED))
def test_applied_names_take_kafkas_default_value(name: str) -> None:
    raw = STROM_DEFAULTS.get(name, KAFKA_4_TOPIC_CONFIGS[name])
    assert validate_configs({name: raw}) == {name: raw}
    assert parse_value(name, raw) == CONFIG_KEYS[name].default


@pytest.mark.parametrize(
    "name",
    sorted(set(KAFKA_4_TOPIC_CONFIGS) - APPLIED) + REMOVED_IN_KAFKA_4,
)
def test_refused_names_say_why(name: str) -> None:
    raw = KAFKA_4_TOPIC_CONFIGS.get(name, "3.0")
    for fn in (validate_configs, LogConfig.from_dict):
        with pytest.raises(ConfigError) as err:
            fn({name: raw})  # type: ignore[operator]
        msg = str(err.value)
        assert f"'{name}'" in msg and "not supported by strom" in msg, msg
        assert "unknown" not in msg
        assert msg.endswith(NOT_APPLICABLE[name])
    # The controller's AlterConfigs path refuses them the same way (INVALID_CONFIG).
    with pytest.raises(InvalidConfigError, match=f"'{name}' is not supported by strom"):
        apply_config_ops({}, [(name, pb.ALTER_CONFIG_OP_SET, raw)])


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("remote.storage.enable", "tiered"),
        ("local.retention.ms", "tiered"),
        ("compression.zstd.level", "never recompresses"),
        ("message.format.version", "removed in Kafka 4.0"),
        ("message.timestamp.difference.max.ms", "message.timestamp.before.max.ms"),
    ],
)
def test_reasons_are_specific(name: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        validate_configs({name: "1"})


def test_a_name_kafka_does_not_have_is_still_unknown() -> None:
    with pytest.raises(ConfigError, match=r"unknown config 'min\.cleanable\.ratio'"):
        validate_configs({"min.cleanable.ratio": "0.5"})
    with pytest.raises(InvalidConfigError, match="unknown config"):
        apply_config_ops({}, [("no.such", pb.ALTER_CONFIG_OP_SET, "1")])


def test_the_issues_configs_are_accepted_and_parsed() -> None:
    """Regression: min.cleanable.dirty.ratio was refused as an unknown config."""
    overrides = {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.1",
        "max.compaction.lag.ms": "600000",
        "segment.jitter.ms": "1000",
        "segment.index.bytes": "4096",
        "message.timestamp.before.max.ms": "86400000",
        "message.timestamp.after.max.ms": "60000",
        "file.delete.delay.ms": "0",
        "preallocate": "true",
        "max.message.bytes": "1000000",
    }
    assert validate_configs(overrides) == overrides
    cfg = LogConfig.from_dict(overrides)
    assert cfg.min_cleanable_dirty_ratio == 0.1
    assert cfg.max_compaction_lag_ms == 600_000
    assert cfg.segment_jitter_ms == 1000
    assert (cfg.segment_index_bytes, cfg.max_index_entries, cfg.max_time_index_entries) == (
        4096,
        512,
        341,
    )
    assert cfg.message_timestamp_before_max_ms == 86_400_000
    assert cfg.message_timestamp_after_max_ms == 60_000
    assert cfg.file_delete_delay_ms == 0
    assert cfg.preallocate is True
    assert cfg.max_message_bytes == 1_000_000
    # A compacted log's active segment rolls by max.compaction.lag.ms (Kafka's maxSegmentMs).
    assert cfg.max_segment_ms == 600_000
    assert LogConfig.from_dict({"max.compaction.lag.ms": "600000"}).max_segment_ms == 7 * 86400000


@pytest.mark.parametrize(
    ("name", "raw", "rule"),
    [
        ("min.cleanable.dirty.ratio", "1.01", "must be in [0, 1]"),
        ("min.cleanable.dirty.ratio", "-0.1", "must be in [0, 1]"),
        ("min.cleanable.dirty.ratio", "half", "expected a number"),
        ("min.cleanable.dirty.ratio", "nan", "expected a number"),
        ("min.cleanable.dirty.ratio", True, "expected a number"),
        ("max.compaction.lag.ms", "0", "must be >= 1"),
        ("max.compaction.lag.ms", str(LONG_MAX + 1), "LONG"),
        ("segment.jitter.ms", "-1", "must be >= 0"),
        ("segment.index.bytes", "3", "must be >= 4"),
        ("segment.index.bytes", str(INT_MAX + 1), "INT"),
        ("message.timestamp.before.max.ms", "-1", "must be >= 0"),
        ("message.timestamp.after.max.ms", "1h", "expected int"),
        ("file.delete.delay.ms", "-1", "must be >= 0"),
        ("preallocate", "yes", "expected bool"),
        ("max.message.bytes", str(INT_MAX + 1), "must be in [64, 267386880]"),
        # (above this no Fetch answer can carry the batch; it was accepted up to INT_MAX)
        ("max.message.bytes", str(267386881), "largest batch a Fetch answer can carry"),
        ("max.message.bytes", "63", "must be in [64, 267386880]"),
        ("compression.type", "brotli", "uncompressed"),
    ],
)
def test_kafka_rules_for_the_new_configs(name: str, raw: object, rule: str) -> None:
    for fn in (validate_configs, LogConfig.from_dict):
        with pytest.raises(ConfigError) as err:
            fn({name: raw})  # type: ignore[operator]
        assert f"'{name}'" in str(err.value) and rule in str(err.value), str(err.value)


def test_boundaries_of_the_new_configs_are_accepted() -> None:
    assert (
        validate_configs(
            {
                "min.cleanable.dirty.ratio": "0",
                "max.compaction.lag.ms": "1",
                "segment.jitter.ms": "0",
                "segment.index.bytes": "4",
                "message.timestamp.before.max.ms": "0",
                "message.timestamp.after.max.ms": str(LONG_MAX),
                "file.delete.delay.ms": "0",
                "compression.type": "uncompressed",
            }
        )["min.cleanable.dirty.ratio"]
        == "0.0"
    )
    assert validate_configs({"min.cleanable.dirty.ratio": 1})["min.cleanable.dirty.ratio"] == "1.0"
    assert LogConfig.from_dict({"segment.index.bytes": "4"}).max_index_entries == 1


def test_min_compaction_lag_may_not_exceed_max_compaction_lag() -> None:
    """Kafka's LogConfig.validateValues rule, against defaults for the one not given."""
    validate_configs({"min.compaction.lag.ms": "1000", "max.compaction.lag.ms": "1000"})
    with pytest.raises(ConfigError, match=r"'min\.compaction\.lag\.ms' \(1001\).*'max\.comp"):
        validate_configs({"min.compaction.lag.ms": "1001", "max.compaction.lag.ms": "1000"})
    with pytest.raises(ConfigError, match=r"max\.compaction\.lag\.ms"):
        validate_configs({"min.compaction.lag.ms": str(LONG_MAX), "max.compaction.lag.ms": "5"})
    # AlterConfigs validates the overrides as a whole: lowering max under the stored min fails.
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms"):
        apply_config_ops(
            {"min.compaction.lag.ms": "5000"},
            [("max.compaction.lag.ms", pb.ALTER_CONFIG_OP_SET, "1000")],
        )


def test_describe_lists_every_applied_config_with_its_source() -> None:
    entries = {e.name: e for e in describe_topic_configs({"min.cleanable.dirty.ratio": "0.1"})}
    assert set(entries) == set(CONFIG_KEYS)
    assert entries["min.cleanable.dirty.ratio"].value == "0.1"
    assert entries["min.cleanable.dirty.ratio"].source == pb.CONFIG_SOURCE_TOPIC
    for name in APPLIED - {"min.cleanable.dirty.ratio"}:
        assert entries[name].source == pb.CONFIG_SOURCE_DEFAULT, name
        assert entries[name].value == STROM_DEFAULTS.get(name, KAFKA_4_TOPIC_CONFIGS[name])


def test_a_stored_max_message_bytes_above_the_bound_is_applied_as_the_bound() -> None:
    """A value stored before the bound existed is applied as the bound by the nodes, not
    dropped for the 16 MiB default (which would refuse what the topic's producers send)."""
    assert log_config({"max.message.bytes": str(1 << 30)}).max_message_bytes == MAX_BATCH_BYTES
    assert log_config({"max.message.bytes": "1000"}).max_message_bytes == 1000
